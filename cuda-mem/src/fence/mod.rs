//! The pending-work fence every buffer carries, and its runtime calls.
//!
//! Host access to a buffer, synchronous copies that touch it, and the free on drop wait on the
//! fence; asynchronous work on a stream is ordered after conflicting work of other streams on
//! the device, without blocking the host. The bookkeeping, and why it is sound under threads,
//! is in [`tracker`]; this module gives it the CUDA runtime calls.

pub(crate) mod capture;
pub(crate) mod handshake;
pub(crate) mod tracker;

/// The synchronisation primitives [`tracker`] uses (loom's, in the model test crate).
mod sync {
    pub use std::sync::{atomic, Arc, Mutex, MutexGuard};
}

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use self::capture::{any_open, capture_of, is_legacy, InOp, Relaxed, FOREIGN_GRAPH, GRAPH_MEMORY};
pub(crate) use self::tracker::Access;
pub(crate) use self::tracker::Backend;
use self::tracker::Tracker;
use crate::error::invalid_argument;
use crate::error::{Error, Result};
use crate::handles::devices::Device;
use crate::handles::event::Event;
use crate::handles::stream::{sync_stream, Stream, StreamInner};

/// The CUDA runtime behind the fence.
pub(crate) struct Cuda;

/// An event as the fence keeps it: recorded outside any capture, recorded into the open
/// capture `capture` (a captured event: it orders streams of that capture only, and is never
/// queried or synchronized), or none at all for work known complete without a call (legacy
/// work drained when a capture began, see [`capture`]).
pub(crate) struct FenceEvent {
    event: Option<Arc<Event>>,
    capture: u64,
}

thread_local! {
    /// The capture whose streams a wait may join the waiting stream into: set by the fence
    /// around its tracker call, for work on a buffer given to that capture, queued by the
    /// capturing thread (a fork inside the capture).
    static JOIN: Cell<u64> = const { Cell::new(0) };
}

/// [`JOIN`] set while this lives.
struct JoinPermit(u64);

impl JoinPermit {
    fn new(token: u64) -> JoinPermit {
        JoinPermit(JOIN.with(|j| j.replace(token)))
    }
}

impl Drop for JoinPermit {
    fn drop(&mut self) {
        JOIN.with(|j| j.set(self.0));
    }
}

impl Backend for Cuda {
    type Stream = Arc<StreamInner>;
    type Event = FenceEvent;
    type Error = Error;

    fn same(a: &Self::Stream, b: &Self::Stream) -> bool {
        // The same `Stream` object most of the time: no need to read through the pointers.
        Arc::ptr_eq(a, b) || StreamInner::same(a, b)
    }

    fn id(s: &Self::Stream) -> usize {
        // The shared part's address: two live handles with one address share it.
        Arc::as_ptr(s) as usize
    }

    fn record(stream: &Self::Stream, reuse: Option<FenceEvent>) -> Result<FenceEvent> {
        let mut capture = 0;
        // A record is queued work too: a capture begin on `stream` waits for it, or it sees the
        // capture (registered before it begins) and the event counts as captured.
        let (_op, open) = InOp::enter(stream);
        let _relaxed = if open {
            if is_legacy(stream) {
                // No call on the legacy stream while a capture is open.
                return if capture::legacy_done(stream.device()) {
                    Ok(FenceEvent {
                        event: None,
                        capture: 0,
                    })
                } else {
                    Err(invalid_argument("fence", capture::LEGACY_PENDING))
                };
            }
            capture = capture_of(stream).unwrap_or(0);
            Some(Relaxed::new())
        } else {
            None
        };
        // The event must be created on the stream's device (CUDA: "event and stream must be on
        // the same CUDA context").
        let event = match reuse
            .and_then(|r| r.event)
            .and_then(|e| Arc::try_unwrap(e).ok())
        {
            Some(e) => e,
            // (The guard inside `on` switches devices only where needed.)
            None => Event::on(Device::from_ordinal_unchecked(stream.device()))?,
        };
        event.record_inner(stream)?;
        Ok(FenceEvent {
            event: Some(Arc::new(event)),
            capture,
        })
    }

    fn wait(stream: &Self::Stream, event: &FenceEvent) -> Result<()> {
        let Some(e) = &event.event else {
            return Ok(());
        };
        if any_open() {
            let mine = capture_of(stream);
            match (event.capture, mine) {
                // Both in the same capture: a captured dependency.
                (c, Some(m)) if c == m => {}
                // A fork: the capturing thread's work on a buffer given to the capture joins
                // its stream into the capture.
                (c, None) if c != 0 && JOIN.with(Cell::get) == c && capture::owns(c) => {
                    // Noted (and other threads' work on the stream settled) first, joined
                    // after (see `capture::join`).
                    let newly = capture::join(c, stream)?;
                    if let Err(err) = e.wait_on_inner(stream) {
                        if newly {
                            capture::unjoin(c, stream);
                        }
                        return Err(err);
                    }
                    return Ok(());
                }
                (c, _) if c != 0 => {
                    return Err(invalid_argument("fence", capture::OUTSIDE_CAPTURE))
                }
                // A captured stream never waits for work outside its capture (`skip`).
                (_, Some(_)) => return Err(invalid_argument("fence", capture::OUTSIDE_CAPTURE)),
                _ => {}
            }
            if is_legacy(stream) {
                return Err(invalid_argument("fence", capture::LEGACY_DURING_CAPTURE));
            }
        }
        e.wait_on_inner(stream)
    }

    fn query(event: &FenceEvent) -> Result<bool> {
        match &event.event {
            None => Ok(true),
            Some(_) if event.capture != 0 => Ok(false),
            Some(e) => {
                let _relaxed = Relaxed::new();
                e.is_complete()
            }
        }
    }

    fn sync_event(event: &FenceEvent) -> Result<()> {
        match &event.event {
            None => Ok(()),
            Some(_) if event.capture != 0 => {
                Err(invalid_argument("host wait", capture::HOST_DURING_CAPTURE))
            }
            Some(e) => {
                let _relaxed = Relaxed::new();
                e.synchronize()
            }
        }
    }

    fn sync_stream(stream: &Self::Stream) -> Result<()> {
        if any_open() {
            if is_legacy(stream) {
                return if capture::legacy_done(stream.device()) {
                    Ok(())
                } else {
                    Err(invalid_argument("host wait", capture::LEGACY_PENDING))
                };
            }
            if capture_of(stream).is_some() {
                return Err(invalid_argument("host wait", capture::STREAM_CAPTURING));
            }
        }
        let _relaxed = Relaxed::new();
        sync_stream(stream)
    }

    fn may_still_run(error: &Error) -> bool {
        // A sticky error ends all work of the context (the device) it came from.
        !error.is_sticky()
    }

    fn skip(entry: &Self::Stream, stream: &Self::Stream) -> bool {
        // Captured work is ordered after work outside its capture by the graph's launches.
        any_open() && capture_of(stream).is_some_and(|c| capture_of(entry) != Some(c))
    }

    fn current(event: &FenceEvent) -> bool {
        event.capture == 0 || capture::is_open(event.capture)
    }

    fn durable(event: &FenceEvent) -> bool {
        event.capture == 0
    }
}

/// The backend of every fence: the runtime; in the crate's own test builds (feature
/// `testing`), the runtime behind the test seams' fault injection, a wrapper the runtime
/// backend knows nothing of.
#[cfg(not(feature = "testing"))]
type Gpu = Cuda;
/// The backend of every fence: the runtime; in the crate's own test builds (feature
/// `testing`), the runtime behind the test seams' fault injection, a wrapper the runtime
/// backend knows nothing of.
#[cfg(feature = "testing")]
type Gpu = crate::testing::Faulty<Cuda>;

/// Pending GPU work on one buffer. Not nameable outside the crate.
///
/// `repr(C)`: the words every queued operation reads, `capture` and then the tracker's hot
/// part (its count of work in flight and fast-path publication, `Tracker` being `repr(C)`
/// with those first), are 48 contiguous bytes at the start, so that an owner that aligns
/// the fence (or the 16 bytes before it, as `Buffer` does) has them in one cache line: the
/// runtime call before an operation's next one evicts whatever it touched, and each line
/// is a miss then.
#[derive(Default)]
#[repr(C)]
pub struct Fence {
    /// The open capture the buffer is given to (its token), or for graph memory, the capture
    /// that allocated it with [`GRAPH_MEMORY`] set; 0 for none. See [`capture`].
    capture: AtomicU64,
    core: Tracker<Gpu>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("idle", &self.core.is_idle())
            .field("origin", &self.core.origin())
            .finish()
    }
}

impl Fence {
    /// Orders `stream` after conflicting pending work on `bytes` (a byte range of the
    /// buffer) and marks the work the caller queues next; the [`Use`] it hands back is to be
    /// dropped once that work is queued. On error nothing may be queued.
    pub(crate) fn begin<'a>(
        &'a self,
        stream: &Stream,
        bytes: (usize, usize),
        access: Access,
    ) -> Result<Use<'a>> {
        Fence::check_queue(stream)?;
        self.begin_checked(stream, bytes, access)
    }

    /// Refuses queueing work on `stream` from this thread where the runtime would queue it
    /// elsewhere (see `StreamInner::check_current`): [`begin`](Self::begin)'s check, made once
    /// by an operation that begins on several fences ([`begin_checked`](Self::begin_checked)).
    /// On a stream another library holds too (cudarc's, or one lent to cudarc), also refuses
    /// queueing while that library has a capture open on it that the crate does not know of:
    /// the work would become a node of a graph whose launches no fence records.
    #[inline]
    pub(crate) fn check_queue(stream: &Stream) -> Result<()> {
        let inner = stream.inner();
        inner.check_current("queueing work on a default stream (legacy or per-thread)")?;
        if inner.is_lent() {
            capture::refuse_foreign_capture(inner)?;
        }
        Ok(())
    }

    /// [`begin`](Self::begin) for a caller that made [`check_queue`](Self::check_queue) for
    /// `stream` on this thread already. Outside stream captures the tracker may take its
    /// lock-free path ([`Tracker::begin`]); while one is open anywhere, or while the buffer is
    /// bound to one, every begin takes the lock (and publishes nothing), after the capture
    /// checks.
    #[inline]
    pub(crate) fn begin_checked<'a>(
        &'a self,
        stream: &Stream,
        bytes: (usize, usize),
        access: Access,
    ) -> Result<Use<'a>> {
        let inner = stream.inner();
        // The handshake with capture begins: in flight from here until the `Use` drops.
        let (op, open) = InOp::enter(inner);
        let legacy = is_legacy(inner).then(|| inner.device());
        if open || self.capture.load(Ordering::Relaxed) != 0 {
            self.begin_under_capture(inner, bytes, access)?;
        } else {
            self.core.begin(inner, bytes, access)?;
        }
        Ok(Use {
            fence: self,
            legacy,
            lent: inner.is_lent().then(|| inner.clone()),
            _op: op,
        })
    }

    /// [`begin_checked`](Self::begin_checked) while a capture is open anywhere or the buffer
    /// is bound to one: the capture checks, then the tracker's locked path. Out of line, so
    /// that the common path inlines into the operations.
    #[cold]
    #[inline(never)]
    fn begin_under_capture(
        &self,
        inner: &Arc<StreamInner>,
        bytes: (usize, usize),
        access: Access,
    ) -> Result<()> {
        let _join = self.capture_gate(inner)?;
        self.core.begin_slow(inner, bytes, access)
    }

    /// Orders `stream` after conflicting pending work on `bytes`, for work that the caller
    /// marks itself (or that completes before the borrow ends).
    pub(crate) fn order(
        &self,
        stream: &Stream,
        bytes: (usize, usize),
        access: Access,
    ) -> Result<()> {
        // The waits it queues are in flight until it returns (the caller's own work after it
        // is not covered: see docs/graphs.md).
        let (_op, open) = InOp::enter(stream.inner());
        let _join = if open || self.capture.load(Ordering::Relaxed) != 0 {
            self.capture_gate(stream.inner())?
        } else {
            None
        };
        self.core.order(stream.inner(), bytes, access)
    }

    /// What an open capture allows of work on `stream` with this buffer: refused on the
    /// legacy stream, refused into a capture the buffer was not given to, refused for graph
    /// memory of a capture that has ended; a fork (a join permit) for the capturing thread's
    /// work on a buffer given to its capture.
    fn capture_gate(&self, stream: &StreamInner) -> Result<Option<JoinPermit>> {
        const OP: &str = "queueing work during a stream capture";
        let bound = self.capture.load(Ordering::Acquire);
        if bound & FOREIGN_GRAPH != 0 {
            return Err(invalid_argument("queueing work", capture::FOREIGN_CAPTURED));
        }
        let token = bound & !GRAPH_MEMORY;
        if bound & GRAPH_MEMORY != 0 && !capture::is_open(token) {
            return Err(invalid_argument(
                "queueing work",
                capture::GRAPH_MEMORY_ESCAPED,
            ));
        }
        if !any_open() {
            return Ok(None);
        }
        if is_legacy(stream) {
            return Err(invalid_argument(OP, capture::LEGACY_DURING_CAPTURE));
        }
        match capture_of(stream) {
            Some(c) if c == token => Ok(None),
            Some(_) => Err(invalid_argument(OP, capture::NOT_GIVEN)),
            None if token != 0 && capture::owns(token) => Ok(Some(JoinPermit::new(token))),
            None => Ok(None),
        }
    }

    /// Refuses a host wait on a buffer given to an open capture, or on graph memory whose
    /// capture has ended, before any call.
    fn host_gate(&self) -> Result<()> {
        let bound = self.capture.load(Ordering::Acquire);
        if bound == 0 {
            return Ok(());
        }
        if bound & FOREIGN_GRAPH != 0 {
            return Err(invalid_argument("host wait", capture::FOREIGN_CAPTURED));
        }
        let token = bound & !GRAPH_MEMORY;
        if capture::is_open(token) {
            return Err(invalid_argument("host wait", capture::HOST_DURING_CAPTURE));
        }
        if bound & GRAPH_MEMORY != 0 {
            return Err(invalid_argument("host wait", capture::GRAPH_MEMORY_ESCAPED));
        }
        Ok(())
    }

    /// Gives the buffer to the open capture `token` (its captured work is allowed, and host
    /// waits refused, until [`unbind`](Self::unbind)).
    pub(crate) fn bind(&self, token: u64) -> Result<()> {
        match self
            .capture
            .compare_exchange(0, token, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(t) if t == token => Ok(()),
            Err(t) if t & FOREIGN_GRAPH != 0 => Err(invalid_argument(
                "Stream::capture",
                capture::FOREIGN_CAPTURED,
            )),
            Err(_) => Err(invalid_argument("Stream::capture", capture::GIVEN_TWICE)),
        }
    }

    /// Takes the buffer back from the capture `token` (after it ended).
    pub(crate) fn unbind(&self, token: u64) {
        let _ = self
            .capture
            .compare_exchange(token, 0, Ordering::AcqRel, Ordering::Acquire);
    }

    /// [`order`](Self::order) on the fence's [`origin`](Self::origin) stream, borrowed
    /// exclusively (a pooled buffer's free): no lock. Hands the stream back for the caller's
    /// work, in flight for capture begins until the [`OnOrigin`] drops (after the free is
    /// queued); `None`, ordering nothing, for a fence without origin. Graph memory is freed
    /// only inside its capture (a free node of the graph); afterwards it is refused (the
    /// memory belongs to the graph, and is leaked here), as is memory whose work may be in
    /// another library's graph ([`FOREIGN_GRAPH`]).
    #[inline]
    pub(crate) fn order_origin_mut(
        &mut self,
        bytes: (usize, usize),
        access: Access,
    ) -> Result<Option<OnOrigin<'_>>> {
        let bound = *self.capture.get_mut();
        if bound & FOREIGN_GRAPH != 0 {
            return Err(invalid_argument("free", capture::FOREIGN_CAPTURED));
        }
        let Some(origin) = self.core.origin() else {
            return Ok(None);
        };
        let (op, open) = InOp::enter(origin);
        // (A join permit, where the gate gives one, lasts until the free is ordered.)
        let mut _join = None;
        if bound & GRAPH_MEMORY != 0 {
            let token = bound & !GRAPH_MEMORY;
            let origin_in = capture_of(origin) == Some(token);
            if !origin_in || !capture::note_free(token) {
                return Err(invalid_argument("free", capture::GRAPH_MEMORY_ESCAPED));
            }
        } else if open {
            if is_legacy(origin) {
                return Err(invalid_argument("free", capture::LEGACY_DURING_CAPTURE));
            }
            _join = self.capture_gate(origin)?;
        }
        let s = self.core.order_origin_mut(bytes, access)?;
        Ok(s.map(|s| OnOrigin {
            stream: Stream::from_inner_ref(s),
            _op: op,
        }))
    }

    /// The handshake's side of a stream-ordered allocation on `stream`, entered before the
    /// allocation call: a capture begin on `stream` waits until [`AllocEntry::marked`] (after
    /// the call), or the capture is seen here. Refused while another thread captures on
    /// `stream`, or is beginning to (the allocation could land in the graph or outside it).
    pub(crate) fn queue_alloc(stream: &Stream) -> Result<AllocEntry<'_>> {
        let (op, open) = InOp::enter(stream.inner());
        let capture = match open.then(|| capture::capture_state_of(stream.inner())) {
            // Graph memory, allocated by the capturing thread (inside the closure).
            Some(Some((token, true))) if capture::owns(token) => token,
            Some(Some(_)) => {
                return Err(invalid_argument(
                    "stream-ordered allocation",
                    capture::CAPTURE_ELSEWHERE,
                ))
            }
            _ => 0,
        };
        Ok(AllocEntry {
            stream,
            capture,
            _op: op,
        })
    }

    /// The stream a [`marked`](Self::marked) fence was made with: a pooled buffer's
    /// allocation stream, where its free is queued.
    pub(crate) fn origin(&self) -> Option<&Stream> {
        self.core.origin().map(Stream::from_inner_ref)
    }

    /// Blocks until pending work that conflicts with a host `access` has completed. On error
    /// the work may still be running: do not touch or free the memory.
    pub(crate) fn host_wait(&self, access: Access) -> Result<()> {
        self.host_gate()?;
        self.core.host_wait(access)
    }

    /// [`host_wait`](Self::host_wait) for host access to the bytes `bytes` only (a view):
    /// work on other ranges of the buffer goes on.
    pub(crate) fn host_wait_range(&self, bytes: (usize, usize), access: Access) -> Result<()> {
        self.host_gate()?;
        self.core.host_wait_range(Some(bytes), access)
    }

    /// [`host_wait`](Self::host_wait) through the owner's exclusive borrow (a host write, a
    /// free): no guard can still be queueing work, so the count of guards leaked with
    /// `mem::forget` is dropped first ([`Tracker::exclusive`]) and the wait covers every mark.
    pub(crate) fn host_wait_mut(&mut self, access: Access) -> Result<()> {
        self.host_gate()?;
        self.core.exclusive();
        self.core.host_wait(access)
    }

    /// Marks work already queued on `stream` that accesses `bytes` (a synchronous copy or
    /// memset, on the legacy default stream, that may return before it is done).
    pub(crate) fn mark(&self, stream: &Stream, bytes: (usize, usize), access: Access) {
        if is_legacy(stream.inner()) {
            capture::note_legacy(stream.inner().device());
        }
        self.core.mark(stream.inner(), bytes, access);
    }
}

impl Fence {
    /// Events covering all pending work, recorded without blocking, for memory handed back to
    /// a cache that polls them before reusing it; see [`Tracker::retire`]. On error the memory
    /// may still be in use: leak it. Work captured into an open capture, or work that cannot
    /// be waited for during one, is such an error.
    pub(crate) fn retire(&mut self) -> Result<Vec<Arc<Event>>> {
        self.host_gate()?;
        let events = self.core.retire()?;
        let mut out = Vec::with_capacity(events.len());
        for e in events {
            if e.capture != 0 {
                return Err(invalid_argument("retire", capture::HOST_DURING_CAPTURE));
            }
            if let Some(ev) = &e.event {
                out.push(ev.clone());
            }
        }
        Ok(out)
    }
}

/// Work being queued on a fenced buffer, marked by [`Fence::begin`]; dropping this, after the
/// caller queued the work (or failed to), ends its time in flight.
#[must_use]
pub(crate) struct Use<'a> {
    fence: &'a Fence,
    /// The device of the legacy stream the work is queued on, if it is (see
    /// [`capture::note_legacy`]: noted once queued).
    legacy: Option<i32>,
    /// The stream, where another library holds it too: checked again once the work is queued
    /// (a capture it began meanwhile may hold the work; see [`capture::foreign_capture_now`]).
    lent: Option<Arc<StreamInner>>,
    /// In flight for capture begins (dropped after the fields above are dealt with).
    _op: InOp,
}

impl Use<'_> {
    /// Asks the CPU for the cache lines this use's end touches (the fence's hot line, the
    /// thread's handshake slot). After a runtime call has evicted them, their misses then
    /// overlap, instead of coming one after another behind the end's atomic operations. A
    /// hint: it changes nothing the end does. An operation with several uses calls it for
    /// all of them right after its runtime call.
    #[inline(always)]
    pub(crate) fn prefetch(&self) {
        capture::prefetch_line(std::ptr::from_ref(self.fence).cast());
        self._op.prefetch();
    }
}

impl Drop for Use<'_> {
    fn drop(&mut self) {
        self.prefetch();
        if let Some(d) = self.legacy {
            capture::note_legacy(d);
        }
        if let Some(s) = &self.lent {
            if capture::foreign_capture_now(s) {
                // The work may be a node of a graph no fence knows of: the buffer is never
                // touched, waited for or freed again.
                self.fence.capture.fetch_or(FOREIGN_GRAPH, Ordering::AcqRel);
            }
        }
        self.fence.core.end();
    }
}

/// Work marked in flight on a fence's tracker without the capture handshake
/// ([`Fence::hold_plain`]): ended (the tracker's count lowered) when it drops. Leaked with
/// `mem::forget`, the count stays raised, as for a leaked [`Use`]: waits record anew (never
/// block on it) until the memory's owner next borrows it exclusively.
pub(crate) struct Hold<'a> {
    fence: &'a Fence,
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.fence.core.end();
    }
}

impl Fence {
    /// Marks work that the caller queues on `stream`, accessing `bytes` as `access`, in flight
    /// until the [`Hold`] drops, for a caller that queues such work again and again there
    /// while it keeps the memory borrowed (exclusively, or shared for reads only), each time
    /// under a handshake ([`InOp`]) that found no capture open: `GraphExec::launcher`. The
    /// marks made now stand for all that work (stream order puts it after them, and a wait
    /// records only once the hold has ended, or records anew while it lives).
    ///
    /// `_op`: the caller's handshake, entered for `stream`, which read no capture open (the
    /// tracker's plain path is the one `begin_checked` takes then). `None`, marking nothing,
    /// where the buffer is bound to a capture: the caller takes the checked path.
    pub(crate) fn hold_plain<'a>(
        &'a self,
        _op: &InOp,
        stream: &Stream,
        bytes: (usize, usize),
        access: Access,
    ) -> Result<Option<Hold<'a>>> {
        if self.capture.load(Ordering::Relaxed) != 0 {
            return Ok(None);
        }
        self.core.begin(stream.inner(), bytes, access)?;
        Ok(Some(Hold { fence: self }))
    }
}

/// The stream [`Fence::order_origin_mut`] hands back, with the work about to be queued there
/// in flight for capture begins.
pub(crate) struct OnOrigin<'a> {
    stream: &'a Stream,
    _op: InOp,
}

impl std::ops::Deref for OnOrigin<'_> {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        self.stream
    }
}

/// A stream-ordered allocation in flight ([`Fence::queue_alloc`]).
pub(crate) struct AllocEntry<'s> {
    stream: &'s Stream,
    /// The capture the allocation lands in (it had begun before the call), or 0.
    capture: u64,
    _op: InOp,
}

impl AllocEntry<'_> {
    /// The fence of the allocation, queued now (marked by a write on its stream), graph memory of the capture
    /// seen at [`Fence::queue_alloc`] (and no other: a capture seen only now began after the
    /// call).
    pub(crate) fn marked(self, bytes: (usize, usize), access: Access) -> Fence {
        let mut capture = 0;
        if self.capture != 0 {
            capture::note_alloc(self.capture);
            capture = self.capture | GRAPH_MEMORY;
        }
        Fence {
            core: Tracker::marked(self.stream.inner().clone(), bytes, access),
            capture: AtomicU64::new(capture),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::sync::Arc;

    use super::tracker::{Access, Backend, Tracker};

    thread_local! {
        static CALLS: Cell<u32> = const { Cell::new(0) };
        /// Records to fail before the next one succeeds.
        static FAIL_RECORDS: Cell<u32> = const { Cell::new(0) };
        /// Event synchronizations to fail before the next one succeeds.
        static FAIL_EVENT_SYNCS: Cell<u32> = const { Cell::new(0) };
        /// Event synchronizations attempted (failed ones included).
        static EVENT_SYNCS: Cell<u32> = const { Cell::new(0) };
        /// Stream synchronizations to fail before the next one succeeds.
        static FAIL_STREAM_SYNCS: Cell<u32> = const { Cell::new(0) };
    }

    /// A backend that only counts its calls (per thread: tests run in parallel), and whose
    /// records fail while `FAIL_RECORDS` counts down.
    struct Counting;

    fn call() -> Result<(), ()> {
        CALLS.with(|c| c.set(c.get() + 1));
        Ok(())
    }

    /// A failure while `countdown` is above zero (counting it down), else a counted call.
    fn fail_or_call(countdown: &'static std::thread::LocalKey<Cell<u32>>) -> Result<(), ()> {
        let fail = countdown.with(|f| {
            let n = f.get();
            f.set(n.saturating_sub(1));
            n > 0
        });
        if fail {
            Err(())
        } else {
            call()
        }
    }

    impl Backend for Counting {
        type Stream = Arc<u32>;
        type Event = ();
        type Error = ();
        fn same(a: &Arc<u32>, b: &Arc<u32>) -> bool {
            a == b
        }
        fn id(s: &Arc<u32>) -> usize {
            Arc::as_ptr(s) as usize
        }
        fn record(_: &Arc<u32>, _: Option<()>) -> Result<(), ()> {
            fail_or_call(&FAIL_RECORDS)
        }
        fn wait(_: &Arc<u32>, _: &()) -> Result<(), ()> {
            call()
        }
        fn query(_: &()) -> Result<bool, ()> {
            call().map(|()| false)
        }
        fn sync_event(_: &()) -> Result<(), ()> {
            EVENT_SYNCS.with(|c| c.set(c.get() + 1));
            fail_or_call(&FAIL_EVENT_SYNCS)
        }
        fn sync_stream(_: &Arc<u32>) -> Result<(), ()> {
            fail_or_call(&FAIL_STREAM_SYNCS)
        }
    }

    /// A pooled buffer's life on one stream: the fence is born marked, and the free's
    /// ordering on the same stream makes no call and no entry (no allocation at all). A fence
    /// that is looked at has its one entry, with room for that one alone (a small allocation
    /// the allocator's thread cache serves). Another stream is ordered after the allocation
    /// (an event recorded and waited for), and the free after that stream's read.
    #[test]
    fn a_pooled_allocation_and_its_free_on_one_stream_make_no_call() {
        let (s, other) = (Arc::new(0), Arc::new(1));
        let mut t = Tracker::<Counting>::marked(s.clone(), (0, 64), Access::Write);
        let origin = t.order_origin_mut((0, 64), Access::Write).unwrap();
        assert!(origin.is_some_and(|o| Arc::ptr_eq(o, &s)));
        assert_eq!(CALLS.with(Cell::get), 0, "same-stream ordering made a call");
        assert!(!t.has_entry_room(), "the free made an entry");

        let t = Tracker::<Counting>::marked(s.clone(), (0, 64), Access::Write);
        assert!(!t.is_idle(), "the allocation's mark is lost");
        assert_eq!(t.entry_capacity(), 1);

        let mut t = Tracker::<Counting>::marked(s.clone(), (0, 64), Access::Write);
        t.order(&other, (0, 8), Access::Read).unwrap();
        assert_eq!(CALLS.with(Cell::get), 2, "record + wait for the allocation");
        t.mark(&other, (0, 8), Access::Read);
        // The waiting stream's entry made room for more.
        assert!(t.entry_capacity() >= 2);
        t.order_origin_mut((0, 64), Access::Write).unwrap();
        assert_eq!(
            CALLS.with(Cell::get),
            4,
            "record + wait for the other stream's read"
        );
    }

    /// A buffer handed back to a cache (`retire`) after a `begin` whose `end` never came (its
    /// guard leaked with `mem::forget`, which safe code may do) still yields the event of its
    /// work, and does not panic (it is called from drop).
    #[test]
    fn retire_after_a_leaked_guard_records_and_does_not_panic() {
        let s = Arc::new(0);
        let mut t = Tracker::<Counting>::default();
        t.begin(&s, (0, 64), Access::Write).unwrap();
        // No `end`: the guard was leaked.
        let events = t.retire().unwrap();
        assert_eq!(events.len(), 1, "the queued work's event");
        assert_eq!(CALLS.with(Cell::get), 1, "one record");
        assert!(t.is_idle(), "the tracker is empty afterwards");
    }

    /// Issue 19.7: a guard leaked with `mem::forget` never ends its `begin`. Before
    /// `exclusive`, its count stayed for good: every later host read recorded and synchronized
    /// a new event (the marks could never be found covered). The owner's next exclusive access
    /// drops the leaked count: one wait that covers everything, then host reads make no call.
    #[test]
    fn a_leaked_guard_slows_waits_only_until_the_next_exclusive_access() {
        let s = Arc::new(0);
        let mut t = Tracker::<Counting>::default();
        t.mark(&s, (0, 64), Access::Write);
        t.begin(&s, (0, 64), Access::Read).unwrap(); // the guard is leaked: no `end`
        let calls = || CALLS.with(Cell::get);
        t.host_wait(Access::Read).unwrap();
        let first = calls();
        t.host_wait(Access::Read).unwrap();
        assert!(
            calls() > first,
            "with a guard maybe in flight, a read waits anew"
        );
        t.exclusive();
        t.host_wait(Access::Write).unwrap();
        let settled = calls();
        for _ in 0..3 {
            t.host_wait(Access::Read).unwrap();
            t.host_wait(Access::Write).unwrap();
        }
        assert_eq!(
            calls(),
            settled,
            "waits after the exclusive access made calls"
        );
        assert!(t.is_idle());
    }

    /// Issue 19.6: a host read whose event record fails synchronizes the stream instead; it
    /// must not forget the read a guard on the same stream is still queueing (begun, not
    /// ended): the buffer's release afterwards still has that read's event to wait for. (The
    /// old fallback removed the entry, and a pinned-pool block was handed out again under
    /// the read.) Likewise for a record that fails while ordering another stream.
    #[test]
    fn a_failed_record_keeps_the_marks_of_work_in_flight_on_the_same_stream() {
        let (s, other) = (Arc::new(0), Arc::new(1));
        let mut t = Tracker::<Counting>::default();
        t.mark(&s, (0, 64), Access::Write); // a copy into the buffer, queued
        t.begin(&s, (0, 64), Access::Read).unwrap(); // a read guard, its kernel not yet queued
        FAIL_RECORDS.with(|f| f.set(1));
        t.host_wait(Access::Read).unwrap(); // falls back to synchronizing `s`
        t.end(); // the guard's kernel is queued now, then the guard drops
        let events = t.retire().unwrap();
        assert_eq!(events.len(), 1, "the in-flight read was forgotten");

        let t = Tracker::<Counting>::default();
        t.mark(&s, (0, 64), Access::Write);
        t.begin(&s, (0, 32), Access::Read).unwrap();
        FAIL_RECORDS.with(|f| f.set(1));
        t.order(&other, (0, 64), Access::Read).unwrap(); // falls back to synchronizing `s`
        t.end();
        let mut t = t;
        assert_eq!(
            t.retire().unwrap().len(),
            1,
            "the in-flight read was forgotten"
        );
    }

    /// Review finding (h-review2): a host wait stops at the first event synchronization that
    /// fails, leaving the events of the other streams unwaited. `RegisteredSlice::register`'s
    /// end and `scope`'s finish then hand the memory back when that first error is *sticky*
    /// ("the context is gone, nothing runs"), but a sticky error ends the work of one device's
    /// context only: work of another device's stream on the same memory (PORTABLE
    /// registration) may still be running. Every stream's event should at least be waited for
    /// (and a non-sticky failure among them reported in preference to a sticky one:
    /// `Backend::may_still_run`).
    #[test]
    fn a_failed_event_sync_still_waits_for_the_other_streams() {
        let (dev0, dev1) = (Arc::new(0), Arc::new(1));
        let t = Tracker::<Counting>::default();
        t.mark(&dev0, (0, 64), Access::Write); // e.g. a kernel on device 0 that faults
        t.mark(&dev1, (0, 64), Access::Write); // a copy on device 1, still running
        FAIL_EVENT_SYNCS.with(|f| f.set(1));
        EVENT_SYNCS.with(|c| c.set(0));
        assert!(t.host_wait(Access::Write).is_err());
        assert_eq!(
            EVENT_SYNCS.with(Cell::get),
            2,
            "the second stream's event was never waited for after the first one failed"
        );
    }

    /// A locked `begin` raises the count of work in flight in the same read-modify-write that
    /// reads it; when its ordering then fails (no record, no wait, no stream synchronization),
    /// nothing was marked and nothing may stay counted in flight: a count left behind would
    /// keep every later record from covering the marks (each host wait recording anew, as
    /// after a leaked guard), until the owner's next exclusive access.
    #[test]
    fn a_begin_whose_ordering_fails_leaves_nothing_in_flight() {
        let (s, other) = (Arc::new(0), Arc::new(1));
        let t = Tracker::<Counting>::default();
        t.mark(&other, (0, 64), Access::Write);
        FAIL_RECORDS.with(|f| f.set(1));
        FAIL_STREAM_SYNCS.with(|f| f.set(1));
        assert!(t.begin(&s, (0, 64), Access::Write).is_err());
        assert_eq!(
            FAIL_STREAM_SYNCS.with(Cell::get),
            0,
            "the fallback was not tried"
        );
        let calls = || CALLS.with(Cell::get);
        t.host_wait(Access::Write).unwrap();
        let settled = calls();
        t.host_wait(Access::Write).unwrap();
        assert_eq!(
            calls(),
            settled,
            "the failed begin stayed in flight: the covering record was not trusted"
        );
        assert!(t.is_idle());
    }

    /// Issue 21 (the H200's overhead over the fake runtime's): the real runtime call between
    /// two operations evicts the library's data, so each line an operation touches is a
    /// miss. A buffer's address, length, capture word and tracker hot part are its first 64
    /// bytes, one line; a stream's hot fields are one line too.
    #[test]
    fn what_an_operation_reads_of_a_buffer_and_a_stream_is_one_line_each() {
        use std::mem::{align_of, offset_of};
        type B = crate::DeviceBuffer<u8>;
        assert_eq!(align_of::<B>(), 64);
        assert_eq!(
            (offset_of!(B, ptr), offset_of!(B, len), offset_of!(B, fence)),
            (0, 8, 16)
        );
        assert_eq!(offset_of!(super::Fence, capture), 0);
        let hot_end = offset_of!(super::Fence, core) + super::tracker::hot_end::<super::Gpu>();
        assert!(
            16 + hot_end <= 64,
            "the fence's hot words end at byte {}",
            16 + hot_end
        );
        assert_eq!(align_of::<crate::PinnedBuffer<u8>>(), 64);
        assert_eq!(offset_of!(crate::PinnedBuffer<u8>, fence), 16);
        let s = crate::handles::stream::StreamInner::hot_end();
        assert!(s <= 64, "a stream's hot fields end at byte {s}");
        assert_eq!(align_of::<crate::handles::stream::StreamInner>(), 64);
    }

    /// This thread's lock acquisitions by trackers since the last call.
    fn locks_since() -> usize {
        super::tracker::tests_hook::LOCKS.with(|c| c.replace(0))
    }

    /// Issue 21.1: one stream that keeps queueing work on a buffer, inside the range its last
    /// locked `begin` marked, takes no lock and makes no call (the lock-free path), reads and
    /// writes alike under a write's marks; and a host write afterwards still waits for it
    /// (records and synchronizes an event).
    #[test]
    fn one_stream_queueing_inside_its_marks_takes_no_lock() {
        let s = Arc::new(0);
        let t = Tracker::<Counting>::default();
        t.begin(&s, (0, 64), Access::Write).unwrap();
        t.end();
        locks_since();
        for _ in 0..10 {
            t.begin(&s, (0, 64), Access::Write).unwrap();
            t.end();
            t.begin(&s, (16, 32), Access::Read).unwrap();
            t.end();
        }
        assert_eq!(locks_since(), 0, "the steady state took the lock");
        assert_eq!(CALLS.with(Cell::get), 0);
        EVENT_SYNCS.with(|c| c.set(0));
        t.host_wait(Access::Write).unwrap();
        assert_eq!(
            (CALLS.with(Cell::get), EVENT_SYNCS.with(Cell::get)),
            (2, 1),
            "the host write did not wait for the fast begins' work (record + sync)"
        );
        assert!(t.is_idle());
    }

    /// The lock-free path is taken only while the publication stands for the state: after a
    /// record that covers the marks, beside another stream's conflicting entry not waited for
    /// as it stands, for another stream, for a write under read marks, outside the marked
    /// range, for another handle to the stream, and after `begin_slow`, `begin` takes the lock
    /// (and publishes again where it can). (Issue 21: beside an entry the stream waited for,
    /// or one on other bytes, it is taken: a buffer another stream used once no longer costs
    /// the lock on every call.)
    #[test]
    fn the_lock_free_path_stops_where_its_publication_does() {
        let (s, other) = (Arc::new(0), Arc::new(1));
        let step = |t: &Tracker<Counting>, st: &Arc<u32>, r: (usize, usize), a: Access| {
            locks_since();
            t.begin(st, r, a).unwrap();
            t.end();
            locks_since()
        };
        let w = Access::Write;
        let r = Access::Read;

        // A host wait records and covers the marks: the next begin marks anew under the lock.
        let t = Tracker::<Counting>::default();
        assert_eq!(step(&t, &s, (0, 64), w), 1);
        t.host_wait(Access::Read).unwrap();
        assert_eq!(step(&t, &s, (0, 64), r), 1, "fast after a covering record");
        assert_eq!(step(&t, &s, (0, 64), r), 0, "republished");
        // Read marks let reads through, not writes.
        assert_eq!(step(&t, &s, (0, 64), w), 1, "a write under read marks");
        assert_eq!(step(&t, &s, (0, 64), w), 0);

        // Another stream's conflicting entry: nothing is published beside it until the stream
        // has waited for it as it stands; then the stream goes fast beside it, until the
        // other stream marks anew.
        let t = Tracker::<Counting>::default();
        assert_eq!(step(&t, &s, (0, 64), w), 1);
        assert_eq!(step(&t, &other, (0, 8), r), 1, "another stream went fast");
        assert_eq!(
            step(&t, &s, (0, 64), w),
            1,
            "fast beside an entry not waited for"
        );
        assert_eq!(
            step(&t, &s, (0, 64), w),
            0,
            "the wait for the other entry not trusted"
        );
        assert_eq!(step(&t, &other, (0, 8), r), 1);
        assert_eq!(
            step(&t, &s, (0, 64), w),
            1,
            "fast past the other stream's new mark"
        );
        assert_eq!(step(&t, &s, (0, 64), w), 0);
        // An entry on other bytes does not stop it.
        let t = Tracker::<Counting>::default();
        assert_eq!(step(&t, &s, (0, 32), w), 1);
        assert_eq!(step(&t, &other, (32, 64), w), 1);
        assert_eq!(
            step(&t, &s, (0, 32), w),
            1,
            "the publication outlived a holder"
        );
        assert_eq!(step(&t, &s, (0, 32), w), 0, "not fast beside disjoint work");
        assert_eq!(
            step(&t, &s, (0, 64), w),
            1,
            "fast into the other stream's bytes"
        );

        // Outside the marked range; then the merged range is published.
        let t = Tracker::<Counting>::default();
        assert_eq!(step(&t, &s, (0, 32), w), 1);
        assert_eq!(step(&t, &s, (32, 64), w), 1, "fast outside the marks");
        assert_eq!(step(&t, &s, (0, 64), w), 0, "the merged marks");

        // Another handle to the same stream (ids differ): the lock, never a wrong answer.
        let same = Arc::new(0);
        assert_eq!(step(&t, &same, (0, 64), w), 1);

        // `begin_slow` (capture paths) withdraws and publishes nothing.
        let t = Tracker::<Counting>::default();
        t.begin_slow(&s, (0, 64), w).unwrap();
        t.end();
        assert_eq!(step(&t, &s, (0, 64), w), 1, "begin_slow published");
        t.begin_slow(&s, (0, 64), w).unwrap();
        t.end();
        assert_eq!(step(&t, &s, (0, 64), w), 1, "begin_slow left a publication");
    }

    /// A host read beside a fast `begin` still queueing (its guard alive): the read's record
    /// does not cover that work, so the marks stay pending and the next host wait records
    /// again. (If the fast begin were not counted in flight, the first record would clear the
    /// marks and the second wait would make no call: a host write would then not wait for
    /// the work queued after the first record.)
    #[test]
    fn a_host_wait_beside_a_fast_begin_keeps_its_marks_pending() {
        let s = Arc::new(0);
        let t = Tracker::<Counting>::default();
        t.begin(&s, (0, 64), Access::Write).unwrap();
        t.end();
        locks_since();
        t.begin(&s, (0, 32), Access::Read).unwrap(); // fast; its work not yet queued
        assert_eq!(locks_since(), 0);
        EVENT_SYNCS.with(|c| c.set(0));
        t.host_wait(Access::Read).unwrap(); // a host read on another thread, meanwhile
        t.end(); // the read is queued now
        t.host_wait(Access::Write).unwrap();
        assert_eq!(
            EVENT_SYNCS.with(Cell::get),
            2,
            "the write waited on the event recorded before the fast begin's work"
        );
        assert!(t.is_idle());
    }

    /// At the fence: a buffer bound to a stream capture takes the lock on every begin (the
    /// capture checks run first), and goes back to the lock-free path once unbound.
    #[test]
    fn a_fence_bound_to_a_capture_takes_the_lock() {
        // SAFETY: a stand-in handle that never reaches the runtime: not a default stream (no
        // device check), and its fence holds this one stream only (nothing is recorded).
        let s = unsafe {
            crate::Stream::from_raw(
                std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
                crate::Device::from_ordinal_unchecked(0),
            )
        };
        let f = super::Fence::default();
        let step = |f: &super::Fence| {
            locks_since();
            drop(f.begin(&s, (0, 64), Access::Write).unwrap());
            locks_since()
        };
        assert_eq!(step(&f), 1);
        assert_eq!(step(&f), 0);
        f.bind(7).unwrap();
        assert_eq!(step(&f), 1, "fast while bound to a capture");
        assert_eq!(step(&f), 1, "fast while bound to a capture");
        f.unbind(7);
        assert_eq!(step(&f), 1);
        assert_eq!(step(&f), 0);
    }

    thread_local! {
        static CAPT_CALLS: Cell<u32> = const { Cell::new(0) };
    }

    /// A backend whose streams from 100 on capture into one graph: its events say whether
    /// they were recorded into the capture.
    struct Capt;

    impl Backend for Capt {
        type Stream = Arc<u32>;
        type Event = bool;
        type Error = ();
        fn same(a: &Arc<u32>, b: &Arc<u32>) -> bool {
            a == b
        }
        fn id(s: &Arc<u32>) -> usize {
            Arc::as_ptr(s) as usize
        }
        fn record(s: &Arc<u32>, _: Option<bool>) -> Result<bool, ()> {
            CAPT_CALLS.with(|c| c.set(c.get() + 1));
            Ok(**s >= 100)
        }
        fn wait(_: &Arc<u32>, _: &bool) -> Result<(), ()> {
            CAPT_CALLS.with(|c| c.set(c.get() + 1));
            Ok(())
        }
        fn query(_: &bool) -> Result<bool, ()> {
            Ok(false)
        }
        fn sync_event(_: &bool) -> Result<(), ()> {
            Ok(())
        }
        fn sync_stream(_: &Arc<u32>) -> Result<(), ()> {
            Ok(())
        }
        fn skip(entry: &Arc<u32>, stream: &Arc<u32>) -> bool {
            **stream >= 100 && **entry < 100
        }
        fn durable(captured: &bool) -> bool {
            !captured
        }
    }

    /// Issue 22: captured work is not ordered after work outside its capture (no call: the
    /// launch is), and a wait inside a capture is never remembered as done, so the same
    /// stream's work after the capture still waits (a remembered captured wait would let it
    /// skip a wait it needs: a race with the entry's real work).
    #[test]
    fn captured_waits_skip_outside_work_and_are_not_remembered() {
        let calls = || CAPT_CALLS.with(Cell::get);
        let (real, cap_a, cap_b) = (Arc::new(1), Arc::new(100), Arc::new(101));
        let t = Tracker::<Capt>::default();
        t.mark(&real, (0, 64), Access::Write);
        t.order(&cap_a, (0, 64), Access::Read).unwrap();
        assert_eq!(
            calls(),
            0,
            "captured work waited for work outside the capture"
        );

        let t = Tracker::<Capt>::default();
        t.mark(&cap_a, (0, 64), Access::Write);
        t.order(&cap_b, (0, 64), Access::Read).unwrap();
        assert_eq!(calls(), 2, "record + wait inside the capture");
        t.order(&cap_b, (0, 64), Access::Read).unwrap();
        assert!(
            calls() > 2,
            "the captured wait was remembered as a durable one"
        );

        // An ordinary wait is still remembered.
        let t = Tracker::<Capt>::default();
        t.mark(&real, (0, 64), Access::Write);
        let other = Arc::new(2);
        t.order(&other, (0, 64), Access::Read).unwrap();
        let after = calls();
        t.order(&other, (0, 64), Access::Read).unwrap();
        assert_eq!(calls(), after, "an unchanged entry was waited for twice");
    }
}
