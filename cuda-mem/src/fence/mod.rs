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
    /// Set by a wait under [`JOIN`] that found it had to join its stream into the capture, not
    /// noted there yet: the wait refused ([`capture::JOIN_DEFERRED`]) with nothing queued, so
    /// that the fence joins the stream outside the tracker's lock ([`JoinPermit::run`]) and
    /// tries again. (No destructor, as none of these: a fence may be used from another
    /// thread-local's destructor.)
    static JOIN_WANTED: Cell<bool> = const { Cell::new(false) };
    /// Set by a wait under [`JOIN`] that waited on an event captured into that capture: the
    /// waiting stream is joined into it (on the runtime's side too).
    static JOIN_MADE: Cell<bool> = const { Cell::new(false) };
}

/// [`JOIN`] set while this lives.
struct JoinPermit {
    token: u64,
    /// [`JOIN`]'s value before (permits nest only through re-entry, but restore anyway).
    before: u64,
}

impl JoinPermit {
    fn new(token: u64) -> JoinPermit {
        JoinPermit {
            token,
            before: JOIN.with(|j| j.replace(token)),
        }
    }

    /// Runs `f`, a tracker call ordering work of the capturing thread on a stream that is not
    /// in its capture (yet), and joins that stream into the capture where an ordering needs
    /// it. The join's note and its handshake ([`capture::join`]) wait for other threads'
    /// operations in flight on the stream, and such an operation may be waiting for this very
    /// buffer's tracker lock (another thread's work on another part of the buffer): they must
    /// not run under that lock, where the two threads would wait for each other until the
    /// handshake gave up ([`capture::OPS_HELD`], after 10 s). So the wait under the lock that
    /// finds a join needed refuses with nothing queued ([`capture::JOIN_DEFERRED`]); the join
    /// is noted and settled here, with no lock held, and `f` runs again, its captured wait on
    /// the noted stream being the join itself (note, handshake, event wait: that order). A
    /// note whose event wait was not made is taken back.
    ///
    /// `stream`: the stream `f` orders (every wait it makes is on it).
    fn run<R>(self, stream: &Arc<StreamInner>, mut f: impl FnMut() -> Result<R>) -> Result<R> {
        JOIN_WANTED.with(|w| w.set(false));
        let first = f();
        if !JOIN_WANTED.with(|w| w.replace(false)) {
            return first;
        }
        let newly = capture::join(self.token, stream)?;
        JOIN_MADE.with(|m| m.set(false));
        let again = f();
        // (Not wanted again: the stream is noted now, and its waits are captured ones.)
        JOIN_WANTED.with(|w| w.set(false));
        if newly && !JOIN_MADE.with(Cell::get) {
            capture::unjoin(self.token, stream);
        }
        again
    }
}

impl Drop for JoinPermit {
    fn drop(&mut self) {
        JOIN.with(|j| j.set(self.before));
    }
}

/// The capture `stream` captures into, as this thread's work on it is to see it: a stream the
/// capturing thread is joining into its capture (noted, the join not yet made) is in it for
/// that thread's join only. Other work that gets this far on it passed its capture check
/// before the note, so the join's handshake waits for it, and it is queued outside the
/// capture (work that checks after the note is refused: [`capture::JOINING`],
/// [`capture::NOT_GIVEN`]); ordering it as captured work would skip its waits for work outside
/// the capture, and its waits on captured events would join the stream from this thread.
fn capture_seen(stream: &StreamInner) -> Option<u64> {
    match capture::capture_and_joining(stream)? {
        (c, _, true) if !(JOIN.with(Cell::get) == c && capture::owns(c)) => None,
        (c, _, _) => Some(c),
    }
}

/// Runs `f`, which orders `stream`, under `permit`, if there is one ([`JoinPermit::run`]).
#[inline]
fn joining<R>(
    permit: Option<JoinPermit>,
    stream: &Arc<StreamInner>,
    f: impl FnMut() -> Result<R>,
) -> Result<R> {
    match permit {
        Some(p) => p.run(stream, f),
        None => {
            let mut f = f;
            f()
        }
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
        if event.event.is_none() && event.capture == 0 {
            // Known complete without a call (legacy work drained at a capture begin).
            return Ok(());
        }
        // Whether this wait joins `stream` into the capture of the caller's permit (a wait on
        // a stream noted by `capture::join` for it).
        let mut joins = false;
        if any_open() {
            let mine = capture_seen(stream);
            match (event.capture, mine) {
                // Both in the same capture: a captured dependency.
                (c, Some(m)) if c == m => joins = JOIN.with(Cell::get) == c,
                // A fork: the capturing thread's work on a buffer given to the capture joins
                // its stream into the capture. Not here, under the tracker's lock: the fence
                // notes it and settles other threads' work on it first, with no lock held,
                // then orders again (`JoinPermit::run`).
                (c, None) if c != 0 && JOIN.with(Cell::get) == c && capture::owns(c) => {
                    JOIN_WANTED.with(|w| w.set(true));
                    return Err(invalid_argument("fence", capture::JOIN_DEFERRED));
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
        // (A captured event without an event object is made by the unit tests only.)
        if let Some(e) = &event.event {
            e.wait_on_inner(stream)?;
        }
        if joins {
            // The join itself, where `stream` was noted for this permit: made.
            capture::joined_now(event.capture, stream);
            JOIN_MADE.with(|m| m.set(true));
        }
        Ok(())
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
            if JOIN_WANTED.try_with(Cell::get).unwrap_or(false) {
                // The tracker's fallback after a deferred join (a wait that refused to join
                // under the lock): nothing to synchronize; the fence joins and orders again.
                return Err(invalid_argument("fence", capture::JOIN_DEFERRED));
            }
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
        any_open() && capture_seen(stream).is_some_and(|c| capture_of(entry) != Some(c))
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
        let join = self.capture_gate(inner)?;
        joining(join, inner, || self.core.begin_slow(inner, bytes, access))
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
        let join = if open || self.capture.load(Ordering::Relaxed) != 0 {
            self.capture_gate(stream.inner())?
        } else {
            None
        };
        joining(join, stream.inner(), || {
            self.core.order(stream.inner(), bytes, access)
        })
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
        match capture::capture_and_joining(stream) {
            // The capturing thread is joining the stream (another thread's work, or this
            // one's: its join is made before any other work of its own).
            Some((c, _, true)) if c == token => Err(invalid_argument(OP, capture::JOINING)),
            Some((c, _, _)) if c == token => Ok(None),
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
        let mut join = None;
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
            join = self.capture_gate(origin)?;
        }
        if let Some(permit) = join {
            // A fork's free (cold): the stream cloned, the borrow of the tracker going to the
            // ordering, which may run twice.
            let origin = origin.clone();
            let core = &mut self.core;
            permit.run(&origin, || core.order_origin_mut(bytes, access).map(|_| ()))?;
        } else {
            self.core.order_origin_mut(bytes, access)?;
        }
        // (`order_origin_mut` hands back the origin, which the tracker has.)
        Ok(self.core.origin().map(|s| OnOrigin {
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

    /// Runs the test `name` (this module's) in a child process, where it opens a capture that
    /// the other tests of this process must not see: true in the child, which runs the test;
    /// false in the parent, once the child passed.
    fn in_child(name: &str) -> bool {
        const CHILD: &str = "CUDA_MEM_TEST_CHILD";
        if std::env::var_os(CHILD).is_some() {
            return true;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &format!("fence::tests::{name}"),
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "the child failed:\n{text}");
        assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
        false
    }

    /// What the join race of review 8 gave: the capturing thread's fork (its time), the other
    /// thread's work, and the streams joined into the capture.
    type Raced = (
        crate::Result<std::time::Duration>,
        crate::Result<()>,
        Vec<Arc<crate::handles::stream::StreamInner>>,
    );

    /// Review 8 (join stall), the race: a buffer given to a capture on a stand-in stream S,
    /// its first half written by the capture (a captured event without an event object: no
    /// runtime call is made). Another thread queues a read of the second half on a stand-in
    /// stream T (in flight on T from before its capture check), while the capturing thread
    /// reads the first half on T (a fork: ordered after the captured write, it joins T into
    /// the capture). `other_first`: the other thread's capture check comes before the join's
    /// note (it is let go by the join, which waits up to 1 s for its work to be queued);
    /// otherwise it comes 100 ms after its operation began, after the note.
    fn join_race(other_first: bool) -> Raced {
        use super::capture;
        use std::sync::mpsc;
        use std::time::{Duration, Instant};
        let stand_in = |raw: usize| {
            // SAFETY: a stand-in handle that never reaches the runtime: not a default stream
            // (no device check), not owned (never destroyed), and no call is made on it (the
            // one event is a captured one without an event object).
            unsafe {
                crate::Stream::from_raw(
                    raw as crate::sys::cudaStream_t,
                    crate::Device::from_ordinal_unchecked(0),
                )
            }
        };
        let (s, t) = (stand_in(0x1000), stand_in(0x2000));
        let token = capture::open_for_test(s.inner());
        let f = super::Fence::default();
        f.bind(token).unwrap();
        f.core.mark_recorded(
            s.inner(),
            (0, 32),
            Access::Write,
            super::FenceEvent {
                event: None,
                capture: token,
            },
        );
        let (entered_tx, entered_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        if other_first {
            capture::tests_hook::BEFORE_JOIN.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    go_tx.send(()).unwrap();
                    // Under the buffer's lock (the join inside the tracker's wait), the other
                    // thread blocks on it: given up after 1 s.
                    let _ = done_rx.recv_timeout(Duration::from_secs(1));
                }));
            });
        }
        let (fr, tr) = (&f, &t);
        let (fork, other) = std::thread::scope(|sc| {
            let other = sc.spawn(move || {
                // In flight on T (an operation on several buffers is, from its first).
                let (op, _) = capture::InOp::enter(tr.inner());
                entered_tx.send(()).unwrap();
                if other_first {
                    go_rx.recv().unwrap();
                } else {
                    std::thread::sleep(Duration::from_millis(100));
                }
                let r = fr.begin(tr, (32, 64), Access::Read).map(drop);
                let _ = done_tx.send(());
                drop(op);
                r
            });
            entered_rx.recv().unwrap();
            let start = Instant::now();
            let r = f.begin(&t, (0, 32), Access::Read).map(drop);
            (r.map(|()| start.elapsed()), other.join().unwrap())
        });
        capture::tests_hook::BEFORE_JOIN.with(|h| h.borrow_mut().take());
        let joined = capture::joined(token);
        f.unbind(token);
        capture::close(token);
        (fork, other, joined)
    }

    /// The checks of [`join_race`] that hold whichever thread checks first: the fork succeeds
    /// without waiting for a handshake that cannot end (under 1 s: the other thread's
    /// operation lasts 100 ms at most), and T is joined.
    fn fork_joined(
        fork: crate::Result<std::time::Duration>,
        joined: &[Arc<crate::handles::stream::StreamInner>],
    ) {
        let took = fork.unwrap_or_else(|e| panic!("the fork was refused: {e}"));
        assert!(
            took < std::time::Duration::from_millis(900),
            "the fork waited {took:?} for the other thread's work"
        );
        assert!(
            joined.len() == 1 && joined[0].raw() as usize == 0x2000,
            "T was not joined into the capture: {joined:?}"
        );
    }

    /// Review 8 (join stall): the capturing thread's work on a buffer given to its capture,
    /// queued on a stream T outside the capture, joins T into the capture, and the join waits
    /// for other threads' operations in flight on T (the handshake). Another thread's
    /// operation on T on another part of the same buffer, past its capture check, needs that
    /// buffer's tracker lock: when the join ran inside the tracker's wait, under that lock, the
    /// two threads waited for each other until the handshake gave up (`OPS_HELD`, after 10 s;
    /// 300 ms in the unit tests), and the fork was refused. The join must settle the other
    /// thread's operation with no lock held: both succeed (the other work is queued before
    /// the join, outside the capture: it checked before the note), and T is joined. Run in a
    /// child process.
    #[test]
    #[cfg_attr(miri, ignore = "runs a child process")]
    fn a_join_settles_another_threads_work_on_the_buffer_outside_its_lock() {
        if !in_child("a_join_settles_another_threads_work_on_the_buffer_outside_its_lock") {
            return;
        }
        let (fork, other, joined) = join_race(true);
        other.unwrap_or_else(|e| panic!("the other thread's work was refused: {e}"));
        fork_joined(fork, &joined);
    }

    /// Review 8: the other thread's operation of the join race, in flight on T from before the
    /// join, reaches its capture check after the join's note: it cannot tell whether the
    /// join's handshake saw it (its work could land on either side of the join), so it is
    /// refused at once with the exact `JOINING`, and the fork succeeds without waiting for the
    /// handshake's limit. (Treated as captured work, it skipped its waits for work outside the
    /// capture while being queued before the join, and its own waits on captured events
    /// joined T from its thread.) Run in a child process.
    #[test]
    #[cfg_attr(miri, ignore = "runs a child process")]
    fn work_checked_during_a_join_of_its_stream_is_refused_at_once() {
        if !in_child("work_checked_during_a_join_of_its_stream_is_refused_at_once") {
            return;
        }
        let (fork, other, joined) = join_race(false);
        match other {
            Err(crate::Error::Misuse(crate::Misuse::InvalidArgument { reason, .. }))
                if reason == super::capture::JOINING => {}
            r => panic!("the other thread's work: {r:?}"),
        }
        fork_joined(fork, &joined);
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
