//! Stream captures opened through the crate ([`Stream::capture`](crate::Stream::capture)), as
//! the fence sees them: which streams are capturing into which capture, which thread owns each,
//! and what the fence may still call while any capture is open.
//!
//! While a capture is open, CUDA forbids on the capturing streams every host synchronization
//! and event query (they would invalidate the capture), and in global and thread-local mode
//! "potentially unsafe" calls (event queries and synchronizations among them, as PyTorch's
//! caching allocator notes) on the threads the mode covers. The legacy default stream
//! encompasses every blocking stream, so it is off limits too while a blocking stream captures.
//! The rules the fence keeps, with a capture open anywhere in the process:
//!
//! - Host-blocking calls on streams and events that are not capturing run with the calling
//!   thread switched to relaxed mode ([`Relaxed`]), which CUDA allows them in.
//! - Nothing is recorded on, waited on or synchronized with the legacy default stream. Pending
//!   legacy work (a synchronous copy or memset, `zeroed`) is known complete when the legacy
//!   stream was drained at the last capture begin and no legacy work was marked since
//!   ([`legacy_done`]); otherwise the fence refuses with a `Misuse`.
//! - An event recorded on a capturing stream is a captured event: it orders other streams of
//!   the same capture (joining them into it, as CUDA defines cross-stream capture), is never
//!   queried or synchronized, and stops standing for anything once its capture has ended.
//!
//! The bookkeeping is a short list behind a mutex, consulted only while [`any_open`] says a
//! capture is open: outside captures the fence makes no extra call and takes no extra lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, ThreadId};

use cuda_mem_sys as sys;

use crate::error::{check, invalid_argument, Result};
use crate::handles::stream::StreamInner;

/// Captures open through the crate, in the whole process.
static OPEN: AtomicUsize = AtomicUsize::new(0);
/// The next capture's token (tokens start at 1: 0 is "no capture" in a fence's binding).
static NEXT: AtomicU64 = AtomicU64::new(1);
/// Serializes capture begins (the legacy drain and the begin itself).
static BEGIN: Mutex<()> = Mutex::new(());
/// The open captures.
static REGISTRY: Mutex<Vec<Open>> = Mutex::new(Vec::new());

/// The value of [`legacy_marked`] that the last drain of the legacy stream covered, per device
/// (the first 64).
static LEGACY_DRAINED: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// Counts of legacy-stream work marked on fences, per device (the first 64): one set per
/// thread that noted any ([`note_legacy`], on every legacy `begin`, so on the hot path of
/// bandwidthTest-style loops: a count of its own costs a thread a load and a store, where one
/// shared count cost an atomic read-modify-write on a line every such thread writes). Only
/// its owner writes a set; [`legacy_marked`] sums them all.
struct Counts([AtomicU64; 64]);

/// Every set of counts ever made (never freed: a thread's counts must stay in the sums after
/// it exits), and those that no live thread owns (handed to the next thread that needs one:
/// there are never more sets than threads noting at once).
struct Registry {
    all: Vec<&'static Counts>,
    free: Vec<&'static Counts>,
}

static COUNTS: Mutex<Registry> = Mutex::new(Registry {
    all: Vec::new(),
    free: Vec::new(),
});
/// Legacy work noted by a thread whose thread-local storage is already gone (noted while it
/// exits, from another thread-local's destructor).
static LATE_MARKED: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

fn counts_registry() -> MutexGuard<'static, Registry> {
    // Nothing panics while holding it; recover the lists anyway.
    COUNTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// This thread's set of counts, taken at its first note and handed back when it exits.
struct MyCounts(std::cell::Cell<Option<&'static Counts>>);

impl MyCounts {
    fn get(&self) -> &'static Counts {
        if let Some(c) = self.0.get() {
            return c;
        }
        let mut r = counts_registry();
        let c = match r.free.pop() {
            Some(c) => c,
            None => {
                let c: &'static Counts =
                    Box::leak(Box::new(Counts([const { AtomicU64::new(0) }; 64])));
                r.all.push(c);
                c
            }
        };
        self.0.set(Some(c));
        c
    }
}

impl Drop for MyCounts {
    fn drop(&mut self) {
        // Its values stay (counted in `all`); the next owner counts on from them. The lock
        // orders this thread's last store before the next owner's first load.
        if let Some(c) = self.0.take() {
            counts_registry().free.push(c);
        }
    }
}

thread_local! {
    static MY_COUNTS: MyCounts = const { MyCounts(std::cell::Cell::new(None)) };
}

/// The legacy-stream work on device slot `d` noted so far, by every thread.
fn legacy_marked(d: usize) -> u64 {
    let r = counts_registry();
    r.all
        .iter()
        .map(|c| c.0[d].load(Ordering::Acquire))
        .sum::<u64>()
        + LATE_MARKED[d].load(Ordering::Acquire)
}

/// The bit of a fence's binding that says the buffer is graph memory (allocated inside the
/// capture): the rest of the binding is the capture's token.
pub(crate) const GRAPH_MEMORY: u64 = 1 << 63;

/// One open capture.
struct Open {
    token: u64,
    /// The thread that began it (and will end it).
    thread: ThreadId,
    /// The stream it began on, first, then the streams the fence joined into it.
    streams: Vec<Arc<StreamInner>>,
    /// Graph allocations made in it and not yet freed in it.
    allocs: usize,
}

fn registry() -> MutexGuard<'static, Vec<Open>> {
    // Nothing panics while holding it; recover the list anyway.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a capture is open through the crate anywhere in the process.
#[inline]
pub(crate) fn any_open() -> bool {
    OPEN.load(Ordering::Acquire) != 0
}

/// The token of the open capture `s` captures into, if any.
pub(crate) fn capture_of(s: &StreamInner) -> Option<u64> {
    if !any_open() {
        return None;
    }
    registry()
        .iter()
        .find(|o| o.streams.iter().any(|x| StreamInner::same(x, s)))
        .map(|o| o.token)
}

/// Whether the capture `token` is still open.
pub(crate) fn is_open(token: u64) -> bool {
    any_open() && registry().iter().any(|o| o.token == token)
}

/// Whether the calling thread is the one that began the open capture `token`.
pub(crate) fn owns(token: u64) -> bool {
    let me = thread::current().id();
    any_open()
        && registry()
            .iter()
            .any(|o| o.token == token && o.thread == me)
}

/// Notes that the fence joined `s` into the capture `token` (a wait on one of its events).
pub(crate) fn join(token: u64, s: &Arc<StreamInner>) {
    if let Some(o) = registry().iter_mut().find(|o| o.token == token) {
        if !o.streams.iter().any(|x| StreamInner::same(x, s)) {
            o.streams.push(s.clone());
        }
    }
}

/// Notes a graph allocation made in the capture `token`.
pub(crate) fn note_alloc(token: u64) {
    if let Some(o) = registry().iter_mut().find(|o| o.token == token) {
        o.allocs += 1;
    }
}

/// Notes the free, inside the capture `token`, of one of its graph allocations: false when the
/// capture is no longer open (the free must not be queued).
pub(crate) fn note_free(token: u64) -> bool {
    match registry().iter_mut().find(|o| o.token == token) {
        Some(o) => {
            o.allocs = o.allocs.saturating_sub(1);
            true
        }
        None => false,
    }
}

/// Whether `s` names the legacy default stream (the null handle, `cudaStreamLegacy`, or
/// another thread's per-thread stream, which the crate names through it).
pub(crate) fn is_legacy(s: &StreamInner) -> bool {
    (s.raw() as usize) <= 1
}

fn slot(device: i32) -> Option<usize> {
    usize::try_from(device).ok().filter(|&d| d < 64)
}

/// Notes legacy-stream work on `device`, queued already, that a fence marks (or is about to).
#[inline]
pub(crate) fn note_legacy(device: i32) {
    if let Some(d) = slot(device) {
        let noted = MY_COUNTS.try_with(|m| {
            // Only this thread writes its counts: a load and a store (release, for the
            // readers of `legacy_marked`), no read-modify-write.
            let c = &m.get().0[d];
            c.store(c.load(Ordering::Relaxed) + 1, Ordering::Release);
        });
        if noted.is_err() {
            LATE_MARKED[d].fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Whether every legacy-stream work of `device` that a fence marked has completed, as far as
/// the last drain knows: no legacy work was marked since the drain.
pub(crate) fn legacy_done(device: i32) -> bool {
    slot(device).is_some_and(|d| LEGACY_DRAINED[d].load(Ordering::Acquire) == legacy_marked(d))
}

/// The calling thread in relaxed capture mode while this lives, where a capture is open: the
/// fence's host waits and event calls on streams that are not capturing are then allowed
/// (CUDA forbids them to threads in global or thread-local mode as "potentially unsafe").
pub(crate) struct Relaxed(Option<sys::cudaStreamCaptureMode>);

impl Relaxed {
    pub(crate) fn new() -> Relaxed {
        if !any_open() {
            return Relaxed(None);
        }
        let mut mode = sys::cudaStreamCaptureMode::cudaStreamCaptureModeRelaxed;
        // SAFETY: a valid in/out pointer to a mode value.
        let code = unsafe { sys::cudaThreadExchangeStreamCaptureMode(&mut mode) };
        Relaxed((code == sys::cudaError::cudaSuccess).then_some(mode))
    }
}

impl Drop for Relaxed {
    fn drop(&mut self) {
        if let Some(mut mode) = self.0.take() {
            // SAFETY: as in `new`; gives the thread its mode back (errors ignored: drop).
            unsafe { sys::cudaThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}

/// The misuse of queueing on a stream another library is capturing.
pub(crate) const FOREIGN_CAPTURE: &str =
    "the stream is being captured by another library (e.g. cudarc's begin_capture on a lent \
     stream): work queued now would become a graph node that no buffer's fence records; \
     capture with Stream::capture instead";

/// Refuses work on `s`, a stream another library holds too, while a capture the crate did not
/// begin is open on it (`cudaStreamIsCapturing`). A capture begun after this check, before the
/// work is queued, is not seen: the same window as another thread's `Stream::capture` (see
/// docs/graphs.md).
#[cold]
pub(crate) fn refuse_foreign_capture(s: &StreamInner) -> Result<()> {
    use sys::cudaStreamCaptureStatus as S;
    if capture_of(s).is_some() {
        return Ok(());
    }
    let mut status = S::cudaStreamCaptureStatusNone;
    // SAFETY: a live stream handle (the caller borrows its stream); a valid out-pointer.
    let code = unsafe { sys::cudaStreamIsCapturing(s.raw(), &mut status) };
    check(code, || format!("cudaStreamIsCapturing({s:?})"))?;
    if status == S::cudaStreamCaptureStatusNone {
        Ok(())
    } else {
        Err(invalid_argument("queueing work", FOREIGN_CAPTURE))
    }
}

/// Begins a capture on `origin` in `mode` and registers it; returns its token. The legacy
/// stream of `origin`'s device is drained first when no other capture is open (its pending
/// work then never needs a call during the capture).
pub(crate) fn begin(origin: &Arc<StreamInner>, mode: sys::cudaStreamCaptureMode) -> Result<u64> {
    let _l = BEGIN.lock().unwrap_or_else(|e| e.into_inner());
    if !any_open() {
        drain_legacy(origin.device())?;
    }
    // Raised before the capture begins, so that work other threads start queueing from now on
    // takes the capture-aware path (which refuses buffers not given to the capture). Work that
    // passed its check just before can still land in the capture: see docs/graphs.md.
    OPEN.fetch_add(1, Ordering::AcqRel);
    // SAFETY: a live stream handle (the caller's borrow keeps it); the mode is a valid value.
    let code = unsafe { sys::cudaStreamBeginCapture(origin.raw(), mode) };
    if let Err(e) = check(code, || {
        format!("cudaStreamBeginCapture({:?}, {mode:?})", origin)
    }) {
        OPEN.fetch_sub(1, Ordering::AcqRel);
        return Err(e);
    }
    let token = NEXT.fetch_add(1, Ordering::Relaxed);
    registry().push(Open {
        token,
        thread: thread::current().id(),
        streams: vec![origin.clone()],
        allocs: 0,
    });
    Ok(token)
}

/// The streams the fence joined into the capture `token` (its origin excluded).
pub(crate) fn joined(token: u64) -> Vec<Arc<StreamInner>> {
    registry()
        .iter()
        .find(|o| o.token == token)
        .map(|o| o.streams[1..].to_vec())
        .unwrap_or_default()
}

/// Unregisters the capture `token` (after its end): the graph allocations it made and did not
/// free.
pub(crate) fn close(token: u64) -> usize {
    let mut r = registry();
    match r.iter().position(|o| o.token == token) {
        Some(i) => {
            let o = r.swap_remove(i);
            OPEN.fetch_sub(1, Ordering::AcqRel);
            o.allocs
        }
        None => 0,
    }
}

/// Waits for the legacy stream of `device` and notes that every legacy work marked before has
/// completed.
fn drain_legacy(device: i32) -> Result<()> {
    let Some(d) = slot(device) else {
        return Ok(());
    };
    let marked = legacy_marked(d);
    let _g = crate::handles::devices::Device::from_ordinal_unchecked(device).guard()?;
    // SAFETY: the null handle is the legacy stream of the device made current above.
    let code = unsafe { sys::cudaStreamSynchronize(std::ptr::null_mut()) };
    check(code, || {
        format!("cudaStreamSynchronize(legacy stream of device {device})")
    })?;
    LEGACY_DRAINED[d].fetch_max(marked, Ordering::AcqRel);
    Ok(())
}

/// The refusal of host access (or a host wait) on a buffer an open capture uses.
pub(crate) const HOST_DURING_CAPTURE: &str =
    "the buffer is used by an open stream capture: its captured work runs only when the graph \
     is launched, so the host cannot wait for it (the capture stays valid)";
/// The refusal of work through the crate on the legacy default stream during a capture.
pub(crate) const LEGACY_DURING_CAPTURE: &str =
    "a stream capture is open: the legacy default stream (synchronous copies and memsets, \
     `zeroed`) would join or invalidate it; use copy_async / memset_async on a stream";
/// The refusal of pending legacy-stream work that the fence cannot wait for during a capture.
pub(crate) const LEGACY_PENDING: &str =
    "the buffer has legacy-stream work (a synchronous copy or memset) queued while a stream \
     capture is open: it cannot be waited for until the capture ends";
/// The refusal of captured work on a buffer the capture was not given.
pub(crate) const NOT_GIVEN: &str =
    "the buffer was not given to this capture (pass it in the capture's resources, which the \
     graph then keeps borrowed)";
/// The refusal of a buffer given to two open captures.
pub(crate) const GIVEN_TWICE: &str = "the buffer is given to another open capture";
/// The refusal of graph memory after its capture.
pub(crate) const GRAPH_MEMORY_ESCAPED: &str =
    "the buffer was allocated inside a stream capture that has ended: graph memory is only \
     valid inside its graph; free it inside the capture";
/// The refusal of work outside an open capture that would wait for its captured work.
pub(crate) const OUTSIDE_CAPTURE: &str =
    "work outside an open stream capture would wait for work captured into it (only the \
     capturing thread joins streams into its capture)";
/// The refusal of a wait on a stream that is capturing.
pub(crate) const STREAM_CAPTURING: &str =
    "the stream is capturing: its work runs only when the graph is launched, so the host \
     cannot wait for it";

#[cfg(test)]
mod tests {
    use super::*;

    /// Legacy work noted on any thread stays counted after the thread exits (its counts are
    /// handed to the next thread, which counts on from them), so that a capture's drain and
    /// `legacy_done` see every note. (Device slot 63: no other test notes there.)
    #[test]
    fn legacy_notes_of_every_thread_stay_counted_after_it_exits() {
        let before = legacy_marked(63);
        note_legacy(63);
        thread::spawn(|| {
            note_legacy(63);
            note_legacy(63);
        })
        .join()
        .unwrap();
        assert_eq!(legacy_marked(63), before + 3);
        thread::spawn(|| note_legacy(63)).join().unwrap();
        assert_eq!(legacy_marked(63), before + 4);
        note_legacy(64); // past the slots: ignored
        assert_eq!(legacy_marked(63), before + 4);
    }
}
