//! The fence's bookkeeping, generic over the four GPU calls it makes ([`Backend`]), so that the
//! same code runs against the CUDA runtime in the crate and against a model under loom in the
//! workspace's `cuda-mem-loom` test crate (which includes this file by path).
//!
//! # The rule
//!
//! A buffer's fence keeps one `Entry` per stream that queued work on the buffer, with the byte
//! ranges that work reads and writes. Nothing is recorded when work is queued: an entry only
//! says "stream S has used these ranges". An event is recorded on S *lazily*, the first time
//! somebody needs to wait for that work (host access, drop, or work on another stream that
//! conflicts), and it covers everything S had queued by then (PyTorch's caching allocator
//! records its stream events the same way, at free time). So queueing work costs two mutex
//! operations and no runtime call, or none in the steady state of one stream (see the
//! lock-free path below); work on the same stream never waits (stream order already
//! implies it); work on disjoint ranges never waits; readers never wait for readers.
//!
//! # Marking before the enqueue, and work in flight
//!
//! [`Tracker::begin`] orders a stream after conflicting work and marks the new work, under one
//! lock, *before* the caller queues it; [`Tracker::end`], after the caller queued, only
//! decrements an atomic count of work in flight. Nobody can need to wait for the new work
//! meanwhile: waiting is needed only by a conflicting access (a write against anything, or
//! anything against a write), and Rust's borrows forbid one while the queueing call holds `&`
//! (reads) or `&mut` (writes) to the buffer. Host reads (`&self`) wait only for entries with
//! writes, host writes and drop (`&mut self`, `self`) for all of them.
//!
//! What the count guards is the bookkeeping: a non-conflicting waiter (a host read, a reader
//! on another stream) may record an entry's event while marked work is still being queued.
//! Such an event does not cover that work, so while anything is in flight a recorded event
//! never marks its entry as covered: the marks stay, and the next wait records again.
//!
//! A guard that safe code leaks with `mem::forget` never calls `end`, and its count would
//! stay for good, each later wait then recording anew. Every `begin`'s guard borrows the
//! tracker shared, though, so an exclusive borrow proves that none is still queueing:
//! [`Tracker::exclusive`], called by the owner's exclusive accesses (host writes, drop, a
//! pooled free, handing memory back to a cache), drops a leaked count.
//!
//! Two calls skip the lock because nobody else can hold it: [`Tracker::marked`] builds a new
//! tracker that marks work queued already (a stream-ordered allocation, before the buffer
//! exists for anyone), and [`Tracker::order_origin_mut`] orders through an exclusive borrow (a
//! pooled buffer's free, queued on its allocation stream after every entry's work). Their
//! state and waits are those of [`Tracker::mark`] on a new tracker and of [`Tracker::order`].
//! The mark of `marked` is entered lazily, by the first call that looks at the state: a
//! buffer freed on its own stream with no other use never makes an entry.
//!
//! # The lock-free path
//!
//! A locked `begin` *publishes* its stream's entry (in `Hot`, beside the count of work in
//! flight): the stream's [`Backend::id`], and a range `[lo, hi)` of its marks since the last
//! record, write marks (which subsume any access by that stream) or read marks (which subsume
//! its reads), provided that no other stream's entry would order a `begin` inside that range
//! in that mode: every other entry either has no conflicting marks there, or was waited for
//! by this stream as it stands (the `waited` record `order_locked` skips a wait on, which is
//! kept only for a wait that covered every mark). A `begin` on that stream inside the range
//! then only raises the count: the marks already stand for its work (the locked path would
//! re-add them and bump the clock), and there is nothing to order it after (the locked path
//! would wait for nothing). A buffer used by one stream is the common case; a buffer another
//! stream read once (and the publishing stream waited for) is the second. The publication is
//! guarded by a seal, `seq << 2 | mode`, that every change bumps (a seqlock generation: no
//! A-B-A); the fast path reads the seal, the fields (acquire; the publisher stores them with
//! release after withdrawing the last publication), raises the count, and reads the seal again.
//!
//! Soundness rests on three points.
//! - *Withdrawal before the count is read.* Every holder of the lock (and every exclusive
//!   borrow) withdraws the publication before it changes the state or reads the count, and
//!   reads the count by a read-modify-write (release and acquire). In the count's modification
//!   order the holder's read comes either after a fast `begin`'s increment (it sees the work
//!   in flight: its records leave the marks pending, as for a locked `begin` in flight), or
//!   before it (its release synchronizes with the increment's acquire, and the begin's second
//!   read of the seal sees the withdrawal: it undoes its increment and takes the lock). So no
//!   record made while a fast `begin`'s work may still be queueing clears the marks that stand
//!   for it, and none sets the entry's last covering record to its current clock.
//! - *No one waits for the fast work meanwhile*, as for any work in flight (see above): work
//!   that conflicts with it needs a borrow Rust forbids while its guard lives. Work on other
//!   ranges (views), host reads and readers on other streams may record the entry's event
//!   meanwhile; it covers what they need, the earlier work, not the fast work, which is on
//!   other bytes or only reads. Any change to another stream's entry (its marks, its
//!   records) is made by a holder, which withdraws the publication first: the next `begin` is
//!   ordered under the lock, and publishes again only if the new state allows. A `waited`
//!   record that matches the publishing entry's clock cannot be made while the publication
//!   stands (its maker withdraws it, and the entry's next publication follows a new mark,
//!   which moves the clock), so no other stream skips a wait for the fast work. (Marks past
//!   `Ranges::MAX` pieces become their hull, which may cover bytes the stream never used and
//!   another stream wrote: the other entries are checked against the whole published range.)
//! - *The stream is the entry's.* The published id is that of the entry's own handle, which
//!   the entry keeps alive until a holder removes it, after withdrawing; a caller's handle with
//!   the same id while the seal holds is therefore the same stream object.
//!
//! The fence takes this path only outside stream captures ([`begin_slow`](Tracker::begin_slow)
//! otherwise). The loom model (`cuda-mem-loom`) checks it against host waits, records, other
//! streams' begins, exclusive accesses and republication; it fails with the increment or the
//! holder's read of the count relaxed to a plain access, with the withdrawal removed, with the
//! validation removed or made before the increment, with a publication beside another
//! stream's conflicting entry that was not waited for, with read marks that let writes
//! through, or with a seal that is not bumped.
//!
//! # Failures
//!
//! A failure never leaves queued work unseen: marking cannot fail; when recording an event
//! fails, the fence falls back to synchronizing the whole stream, and when that fails too it
//! returns the error *before* the caller queues anything (in `begin`) or refuses host access
//! (in `host_wait`), and the owner then leaks the memory rather than free it.

use super::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use super::sync::{Arc, Mutex, MutexGuard};

/// The GPU calls the fence makes.
pub trait Backend {
    /// A stream handle that keeps the stream alive (the fence may record on it later).
    type Stream: Clone;
    /// An event.
    type Event;
    /// The error of a failed call.
    type Error;
    /// Whether two handles name the same stream.
    fn same(a: &Self::Stream, b: &Self::Stream) -> bool;
    /// A number that identifies the stream *object* behind `s` (its address, for a shared
    /// handle): two handles alive at the same time with the same id must be [`same`](Self::same).
    /// (Two handles to the same stream may have different ids: the fast path of
    /// [`Tracker::begin`] then only falls back to the lock.)
    fn id(s: &Self::Stream) -> usize;
    /// Records `reuse` (or a new event) at the current end of `stream`.
    fn record(
        stream: &Self::Stream,
        reuse: Option<Self::Event>,
    ) -> Result<Self::Event, Self::Error>;
    /// Makes later work on `stream` wait for `event` (device side).
    fn wait(stream: &Self::Stream, event: &Self::Event) -> Result<(), Self::Error>;
    /// Whether `event` has completed, without blocking.
    fn query(event: &Self::Event) -> Result<bool, Self::Error>;
    /// Blocks the host until `event` has completed.
    fn sync_event(event: &Self::Event) -> Result<(), Self::Error>;
    /// Blocks the host until all work queued on `stream` so far has completed.
    fn sync_stream(stream: &Self::Stream) -> Result<(), Self::Error>;
    /// Whether work may still be running after `error` (a failed wait): true unless the error
    /// ends all work it could concern (a lost context). Of several failed waits, one of those
    /// is reported first, so that a caller who trusts a lost context to have stopped its work
    /// never does so while other work may run. The default assumes the worst.
    fn may_still_run(_error: &Self::Error) -> bool {
        true
    }
    /// Whether new work on `stream` need not be ordered after the work of `entry` at all: work
    /// captured into a graph against work outside the capture (the graph's launches are
    /// ordered after that work instead). Skipped entries are not noted as waited for. The
    /// default orders everything.
    fn skip(_entry: &Self::Stream, _stream: &Self::Stream) -> bool {
        false
    }
    /// Whether `event` still stands for the work it was recorded after (an event recorded
    /// into a stream capture stops doing so when the capture ends): an entry whose covering
    /// event is not current records anew. The default: always.
    fn current(_event: &Self::Event) -> bool {
        true
    }
    /// Whether a device-side wait for `event` orders the waiting stream's later work for good
    /// (a wait inside a stream capture orders only captured work): only such waits let a later
    /// conflict with the same, unchanged entry skip its wait. The default: always.
    fn durable(_event: &Self::Event) -> bool {
        true
    }
}

/// How queued work or the host uses a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads only.
    Read,
    /// Writes (and may read).
    Write,
}

/// Half-open byte ranges, stored inline (a fence is touched on every queued copy, right after
/// the runtime call has evicted much of the cache: no heap pointers to chase); past
/// `Ranges::MAX` pieces they are merged into their hull, which can only add waits, never lose
/// one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ranges {
    len: usize,
    r: [(usize, usize); Ranges::MAX],
}

impl Ranges {
    const MAX: usize = 4;

    fn as_slice(&self) -> &[(usize, usize)] {
        &self.r[..self.len]
    }

    /// Adds `[start, end)`.
    pub fn add(&mut self, (start, end): (usize, usize)) {
        if start >= end {
            return;
        }
        let len = self.len;
        if let Some(r) = self.r[..len]
            .iter_mut()
            .find(|r| r.0 <= end && start <= r.1)
        {
            // Touching or overlapping: widen in place.
            *r = (r.0.min(start), r.1.max(end));
            return;
        }
        if len < Self::MAX {
            self.r[len] = (start, end);
            self.len += 1;
            return;
        }
        let lo = self.as_slice().iter().map(|r| r.0).fold(start, usize::min);
        let hi = self.as_slice().iter().map(|r| r.1).fold(end, usize::max);
        self.r[0] = (lo, hi);
        self.len = 1;
    }

    /// Adds every range of `other`.
    pub fn merge(&mut self, other: &Ranges) {
        for &r in other.as_slice() {
            self.add(r);
        }
    }

    /// Whether any range overlaps `[start, end)`.
    pub fn overlaps(&self, (start, end): (usize, usize)) -> bool {
        self.as_slice().iter().any(|r| r.0 < end && start < r.1)
    }

    /// The range that contains all of `[start, end)`, if one does.
    fn containing(&self, (start, end): (usize, usize)) -> Option<(usize, usize)> {
        self.as_slice()
            .iter()
            .copied()
            .find(|r| r.0 <= start && end <= r.1)
    }

    /// Whether there is no range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn clear(&mut self) {
        self.len = 0;
    }
}

/// The work one stream queued on the buffer.
struct Entry<B: Backend> {
    stream: B::Stream,
    /// Ranges marked since the last record.
    reads: Ranges,
    writes: Ranges,
    /// The fence clock at the last mark.
    marked: u64,
    /// The last record and the waits this stream made: absent until the entry's work is first
    /// waited for or its stream first waits (each a runtime call, beside which this allocation
    /// is small). Out of line so that the entry of a buffer used from one stream alone (every
    /// stream-ordered allocation) stays small: making one at twice the size, zeroed and copied
    /// through the C library, cost half of such an allocation's bookkeeping.
    rec: Option<Box<Recorded<B>>>,
}

/// What an entry's last event covers, and the waits its stream made.
struct Recorded<B: Backend> {
    /// Ranges covered by `event`.
    reads: Ranges,
    writes: Ranges,
    /// The last event recorded for this entry.
    event: Option<Arc<B::Event>>,
    /// The entry's `marked` at the last record that covered every mark.
    at: u64,
    /// For each other stream this stream has waited on: that entry's `marked` at the time.
    /// A later conflict with the same, unchanged entry needs no second wait.
    waited: Vec<(B::Stream, u64)>,
}

impl<B: Backend> Recorded<B> {
    /// Whether this stream has waited for the entry `t` as it is now (its stream, at its
    /// current `marked`): a conflict with it needs no second wait. The one test of
    /// `order_locked` and of the publication beside waited entries (`publish`), which must
    /// agree for the lock-free path to be sound.
    fn has_waited_for(&self, t: &Entry<B>) -> bool {
        self.waited
            .iter()
            .any(|(s, m)| B::same(s, &t.stream) && *m == t.marked)
    }
}

impl<B: Backend> Default for Recorded<B> {
    fn default() -> Self {
        Recorded {
            reads: Ranges::default(),
            writes: Ranges::default(),
            event: None,
            at: 0,
            waited: Vec::new(),
        }
    }
}

impl<B: Backend> Entry<B> {
    fn new(stream: B::Stream) -> Self {
        Entry {
            stream,
            reads: Ranges::default(),
            writes: Ranges::default(),
            marked: 0,
            rec: None,
        }
    }

    /// Adds work accessing `range` as `access`, marked at fence clock `clock`.
    fn mark(&mut self, clock: u64, range: (usize, usize), access: Access) {
        match access {
            Access::Read => self.reads.add(range),
            Access::Write => self.writes.add(range),
        }
        self.marked = clock;
    }

    fn rec_mut(&mut self) -> &mut Recorded<B> {
        self.rec.get_or_insert_with(Box::default)
    }

    /// Whether an event covers every mark: the entry's work is complete once it is.
    fn covering_event(&self) -> Option<&Arc<B::Event>> {
        let r = self.rec.as_deref()?;
        r.event
            .as_ref()
            .filter(|e| r.at == self.marked && B::current(e))
    }

    fn has_writes(&self) -> bool {
        !self.writes.is_empty() || self.rec.as_ref().is_some_and(|r| !r.writes.is_empty())
    }

    fn is_idle(&self) -> bool {
        self.reads.is_empty()
            && self.writes.is_empty()
            && self
                .rec
                .as_ref()
                .is_none_or(|r| r.reads.is_empty() && r.writes.is_empty())
    }

    /// Whether work that accesses `range` as `access` must be ordered after this entry.
    fn conflicts(&self, range: (usize, usize), access: Access) -> bool {
        let rec = self.rec.as_deref();
        let w = self.writes.overlaps(range) || rec.is_some_and(|r| r.writes.overlaps(range));
        match access {
            Access::Read => w,
            Access::Write => {
                w || self.reads.overlaps(range) || rec.is_some_and(|r| r.reads.overlaps(range))
            }
        }
    }

    /// Records an event that covers everything marked so far (once per batch of marks). With
    /// work in flight (`full` false) the event covers only what was queued, so the marks stay
    /// pending: they are copied to the record's ranges (this event is waited for) and kept in
    /// `reads` / `writes` (a later record must cover them again).
    fn materialize(&mut self, full: bool) -> Result<Arc<B::Event>, B::Error> {
        if let Some(e) = self.covering_event() {
            return Ok(e.clone());
        }
        let rec = self.rec.get_or_insert_with(Box::default);
        // Re-record the old event when nobody else holds it (a host wait may be syncing it).
        let reuse = match rec.event.take() {
            Some(e) if Arc::strong_count(&e) == 1 => Arc::try_unwrap(e).ok(),
            _ => None,
        };
        let event = Arc::new(B::record(&self.stream, reuse)?);
        rec.reads.merge(&self.reads);
        rec.writes.merge(&self.writes);
        if full {
            self.reads.clear();
            self.writes.clear();
            rec.at = self.marked;
        }
        rec.event = Some(event.clone());
        Ok(event)
    }

    /// All work this entry stands for is known complete.
    fn clear(&mut self) {
        self.reads.clear();
        self.writes.clear();
        if let Some(r) = &mut self.rec {
            r.reads.clear();
            r.writes.clear();
        }
    }
}

/// Appends a new entry for `stream` to `entries`, making room for it alone when they have
/// none: a `Vec`'s first push makes room for four entries, past what the allocator keeps in
/// its per-thread cache (a trip into its core at each allocation and free), while most buffers
/// only ever see one stream.
fn push_entry<B: Backend>(entries: &mut Vec<Entry<B>>, stream: &B::Stream) {
    if entries.capacity() == 0 {
        entries.reserve_exact(1);
    }
    entries.push(Entry::new(stream.clone()));
}

/// Past this many entries, marking first drops the entries whose work has completed (a
/// non-blocking query), so that a long-lived buffer used from ever new streams, and never
/// waited on by the host, keeps a bounded list.
const PRUNE_AT: usize = 8;

struct State<B: Backend> {
    entries: Vec<Entry<B>>,
    /// Bumped at every mark; identifies a state of an entry across removal and re-creation.
    clock: u64,
    /// The mark of a [`marked`](Tracker::marked) tracker's work on its origin stream, not yet
    /// entered in `entries` (see [`Tracker::settle`]). While it is, `entries` is empty.
    origin_mark: Option<((usize, usize), Access)>,
}

/// What the lock-free path of [`Tracker::begin`] reads, and the count it raises: one cache
/// line's worth, kept together (`repr(C)`) so that a fast `begin` touches one line.
#[repr(C)]
struct Hot {
    /// Work marked by `begin` whose `end` has not come yet (see the module docs).
    in_flight: AtomicUsize,
    /// The publication's sequence number and mode: `seq << 2 | mode`, `mode` one of
    /// [`NONE`], [`READ`], [`WRITE`]. Every change bumps `seq` (a seqlock generation), so a
    /// reader that reads the same value before and after reading `stream`, `lo` and `hi`
    /// read one publication, and no invalidation came in between.
    seal: AtomicU64,
    /// [`Backend::id`] of the one entry's stream, while published.
    stream: AtomicUsize,
    /// The published range `[lo, hi)` of that entry's marks since its last record.
    lo: AtomicUsize,
    hi: AtomicUsize,
}

/// Nothing published: every `begin` takes the lock.
const NONE: u64 = 0;
/// Published: the one entry has un-recorded *read* marks over `[lo, hi)`.
const READ: u64 = 1;
/// Published: the one entry has un-recorded *write* marks over `[lo, hi)`.
const WRITE: u64 = 2;
/// The mode bits of [`Hot::seal`].
const MODE: u64 = 3;

impl Hot {
    fn new() -> Self {
        Hot {
            in_flight: AtomicUsize::new(0),
            seal: AtomicU64::new(NONE),
            stream: AtomicUsize::new(0),
            lo: AtomicUsize::new(0),
            hi: AtomicUsize::new(0),
        }
    }
}

/// Pending work on one buffer: see the module docs.
///
/// `repr(C)`, `Hot` first: the owner can place the words its own hot path reads right
/// before it, in the same cache line (`Fence` and `Buffer` do).
#[repr(C)]
pub struct Tracker<B: Backend> {
    /// The count of work in flight and the fast path's publication.
    hot: Hot,
    state: Mutex<State<B>>,
    /// The stream of a [`marked`](Self::marked) tracker's first work (a stream-ordered
    /// allocation's stream, where its free is queued too), kept for its owner.
    origin: Option<B::Stream>,
}

/// Bytes from a tracker's start to the end of its hot part: what [`Tracker::begin`]'s fast
/// path and [`Tracker::end`] read and write (the fence's layout test).
#[cfg(test)]
#[allow(dead_code)]
pub(crate) fn hot_end<B: Backend>() -> usize {
    std::mem::offset_of!(Tracker<B>, hot) + std::mem::size_of::<Hot>()
}

impl<B: Backend> Default for Tracker<B> {
    fn default() -> Self {
        Tracker {
            hot: Hot::new(),
            state: Mutex::new(State {
                entries: Vec::new(),
                clock: 0,
                origin_mark: None,
            }),
            origin: None,
        }
    }
}

impl<B: Backend> Tracker<B> {
    /// The state, with the origin's mark entered (every path but
    /// [`order_origin_mut`](Self::order_origin_mut) reads the state through here).
    fn lock(&self) -> MutexGuard<'_, State<B>> {
        // A panic while holding the lock leaves at worst extra entries (more waiting), never
        // fewer: recover the state.
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        #[cfg(test)]
        tests_hook::LOCKS.with(|c| c.set(c.get() + 1));
        // Before anything reads the state or the count (`settled`): see `invalidate`.
        self.invalidate();
        Self::settle(&mut st, self.origin.as_ref());
        st
    }

    /// Withdraws the fast path's publication, if there is one: called by every holder of the
    /// lock (and every exclusive borrow) before it changes the state or reads the count of
    /// work in flight ([`settled`](Self::settled), a read-modify-write). Of a fast `begin`
    /// (its increment of the count, also a read-modify-write, then its second read of the
    /// seal) and a holder (this withdrawal, then its read of the count), one comes first in
    /// the count's modification order: either the holder's read sees the begin in flight
    /// (its records then leave the marks pending), or the holder's release synchronizes with
    /// the begin's acquire and the begin's second read sees the withdrawal (it falls back to
    /// the lock). When nothing is published, no fast `begin` can validate until the next
    /// publication, made by a later holder: nothing to store.
    fn invalidate(&self) {
        // Only holders of the lock (or of `&mut self`) write the seal: the load sees the last.
        let v = self.hot.seal.load(Ordering::Relaxed);
        if v & MODE != NONE {
            self.hot
                .seal
                .store(((v >> 2) + 1) << 2 | NONE, Ordering::Release);
        }
    }

    /// Publishes `stream`'s un-recorded marks that cover `range` for the fast path, at the end
    /// of a locked [`begin`](Self::begin) on `stream` that just marked `range` as `access` (so
    /// no event covers those marks, and none will until a holder of the lock, which withdraws
    /// the publication first, records with nothing in flight). Nothing is published while
    /// another stream's entry would order a `begin` inside the publication (its marks conflict
    /// with the published range in its mode, and `stream` has not waited for them as they
    /// stand): the locked path would wait there.
    fn publish(&self, st: &State<B>, stream: &B::Stream, range: (usize, usize), access: Access) {
        let Some(i) = st.entries.iter().position(|e| B::same(&e.stream, stream)) else {
            return;
        };
        let e = &st.entries[i];
        let (mode, (lo, hi)) = match (e.writes.containing(range), access) {
            (Some(piece), _) => (WRITE, piece),
            (None, Access::Read) => match e.reads.containing(range) {
                Some(piece) => (READ, piece),
                None => return,
            },
            // (A write's range is in `writes`, just marked; an empty range is not.)
            (None, Access::Write) => return,
        };
        // Every other entry as `order_locked` would see it for a `begin` inside `[lo, hi)` in
        // this mode: without a conflict, or waited for by `stream` at its current clock (an
        // `already`). Any change to another entry is made by a holder of the lock, which
        // withdraws this publication first.
        let widest = if mode == WRITE {
            Access::Write
        } else {
            Access::Read
        };
        let rec = e.rec.as_deref();
        let clear = st.entries.iter().enumerate().all(|(j, t)| {
            j == i || !t.conflicts((lo, hi), widest) || rec.is_some_and(|r| r.has_waited_for(t))
        });
        if !clear {
            return;
        }
        // Withdrawn by this holder's `lock`: the fields are free to write. Release stores: a
        // fast `begin` that reads one of them (acquire) sees the withdrawal that came before
        // (and so a second seal that differs from its first).
        let v = self.hot.seal.load(Ordering::Relaxed);
        debug_assert_eq!(v & MODE, NONE);
        self.hot.stream.store(B::id(&e.stream), Ordering::Release);
        self.hot.lo.store(lo, Ordering::Release);
        self.hot.hi.store(hi, Ordering::Release);
        self.hot
            .seal
            .store(((v >> 2) + 1) << 2 | mode, Ordering::Release);
    }

    /// The lock-free `begin`: true when the publication covers the work, which is then in
    /// flight (counted once); false, counting nothing, otherwise.
    #[inline]
    fn try_fast(&self, stream: &B::Stream, range: (usize, usize), access: Access) -> bool {
        let v = self.hot.seal.load(Ordering::Acquire);
        let mode = v & MODE;
        if mode == NONE || (mode == READ && access == Access::Write) {
            return false;
        }
        if self.hot.stream.load(Ordering::Acquire) != B::id(stream)
            || range.0 < self.hot.lo.load(Ordering::Acquire)
            || range.1 > self.hot.hi.load(Ordering::Acquire)
        {
            return false;
        }
        // In flight first, then validate (see `invalidate`): the same seal means no holder
        // withdrew the publication in between, and every holder that withdraws it later sees
        // this work in flight.
        self.hot.in_flight.fetch_add(1, Ordering::AcqRel);
        if self.hot.seal.load(Ordering::Acquire) == v {
            return true;
        }
        self.hot.in_flight.fetch_sub(1, Ordering::Release);
        false
    }

    /// Enters the origin's pending mark as the entry [`mark`](Self::mark) would have made on
    /// the new tracker: the first entry, at clock 1. Nothing could look at the state between
    /// the tracker's birth and this (every reader comes through here first), so the lazy mark
    /// is indistinguishable from one made at birth.
    fn settle(st: &mut State<B>, origin: Option<&B::Stream>) {
        // (`origin_mark` is only ever set together with `origin`.)
        if let Some(stream) = origin {
            if let Some((range, access)) = st.origin_mark.take() {
                // With `entries` empty and the clock at 0: the first entry, marked at clock 1.
                Self::mark_locked(st, true, stream, range, access);
            }
        }
    }

    /// A new tracker that marks work on `stream` accessing `range` as `access`, queued already:
    /// the state [`mark`](Self::mark) leaves on a new tracker, made without the lock (nobody
    /// else can see the tracker yet). A stream-ordered allocation starts its fence so, and
    /// keeps `stream` there for its free ([`origin`](Self::origin)).
    ///
    /// The mark is entered lazily, at the tracker's first use: a buffer freed on its own
    /// stream without other use (a pooled buffer's whole life, often) never makes an entry,
    /// whose allocation and stream reference were two thirds of that life's bookkeeping.
    #[inline]
    pub fn marked(stream: B::Stream, range: (usize, usize), access: Access) -> Self {
        Tracker {
            hot: Hot::new(),
            state: Mutex::new(State {
                entries: Vec::new(),
                clock: 0,
                origin_mark: Some((range, access)),
            }),
            origin: Some(stream),
        }
    }

    /// The stream a [`marked`](Self::marked) tracker was made with.
    pub fn origin(&self) -> Option<&B::Stream> {
        self.origin.as_ref()
    }

    /// Before queueing work on `stream` that accesses `range` as `access`: makes `stream` wait
    /// (device side) for conflicting work of other streams, and marks the work as in flight.
    /// Call [`end`](Self::end) once it is queued (or queueing failed). On error nothing was
    /// marked, and the caller must not queue.
    ///
    /// Work that the one stream with marks on the buffer queues inside its marks since their
    /// last record takes the lock-free path (see the module docs); other work takes the lock,
    /// and publishes for that path where it can.
    #[inline]
    pub fn begin(
        &self,
        stream: &B::Stream,
        range: (usize, usize),
        access: Access,
    ) -> Result<(), B::Error> {
        if self.try_fast(stream, range, access) {
            return Ok(());
        }
        self.begin_locked(stream, range, access, true)
    }

    /// [`begin`](Self::begin) under the lock always, publishing nothing: for work that a
    /// stream capture may concern, which the fence checks around the call.
    pub fn begin_slow(
        &self,
        stream: &B::Stream,
        range: (usize, usize),
        access: Access,
    ) -> Result<(), B::Error> {
        self.begin_locked(stream, range, access, false)
    }

    #[inline(never)]
    fn begin_locked(
        &self,
        stream: &B::Stream,
        range: (usize, usize),
        access: Access,
        publish: bool,
    ) -> Result<(), B::Error> {
        let mut st = self.lock();
        // The count raised and read in one read-modify-write: what `settled` reads (the value
        // before this begin's increment, last in the count's modification order, with its
        // release half after the withdrawal in `lock`), and this begin in flight, under the
        // lock, so that every other holder sees it (the order inside the critical section does
        // not matter to them). One atomic operation fewer than `settled` and then the
        // increment.
        let full = self.hot.in_flight.fetch_add(1, Ordering::AcqRel) == 0;
        if let Err(e) = Self::order_locked(&mut st, full, stream, range, access) {
            // Nothing was marked: nothing is in flight.
            self.hot.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(e);
        }
        Self::mark_locked(&mut st, full, stream, range, access);
        if publish {
            self.publish(&st, stream, range, access);
        }
        Ok(())
    }

    /// After the work of a [`begin`](Self::begin) was queued (or queueing failed: the mark only
    /// adds waiting). Cannot fail, takes no lock.
    pub fn end(&self) {
        self.hot.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Through an exclusive borrow of the tracker (its memory's owner, borrowed mutably or
    /// dropping it): no `begin` can still be queueing, since every `begin`'s guard borrows the
    /// tracker shared until its `end`. A count left above zero is then the count of guards
    /// that safe code leaked with `mem::forget` (whose work was queued before the leak, as the
    /// guards' contract requires of the caller): it is dropped, so that a leaked guard slows
    /// waits down only until the owner's next exclusive access, never for good. Without this,
    /// every later wait would record (or synchronize) anew and entries would never be pruned.
    pub fn exclusive(&mut self) {
        // (A plain store: `&mut self` excludes every other access to the count.)
        self.hot.in_flight.store(0, Ordering::Release);
    }

    /// Whether no marked work is still being queued: then an event recorded now covers every
    /// mark. Read under the lock (or an exclusive borrow), after [`invalidate`](Self::invalidate),
    /// so that no `begin` races it.
    fn settled(&self) -> bool {
        // A read-modify-write, not a load: it reads the last value in the count's
        // modification order, and its release half orders the holder's withdrawal of the
        // publication before any fast `begin` that increments after it (see `invalidate`).
        self.hot.in_flight.fetch_add(0, Ordering::AcqRel) == 0
    }

    /// Makes `stream` wait (device side) for conflicting work of other streams, without
    /// marking anything: for work the caller marks with [`mark`](Self::mark) after queueing
    /// it, or that completes before the caller's borrow ends.
    pub fn order(
        &self,
        stream: &B::Stream,
        range: (usize, usize),
        access: Access,
    ) -> Result<(), B::Error> {
        let mut st = self.lock();
        let full = self.settled();
        Self::order_locked(&mut st, full, stream, range, access)
    }

    /// [`order`](Self::order) through an exclusive borrow, which no other thread can hold the
    /// lock against (no locking), on the [`origin`](Self::origin) stream, which it hands back
    /// for the caller's work: a pooled buffer's free, queued where it was allocated. `None`,
    /// ordering nothing, when the tracker has no origin.
    #[inline]
    pub fn order_origin_mut(
        &mut self,
        range: (usize, usize),
        access: Access,
    ) -> Result<Option<&B::Stream>, B::Error> {
        // With `&mut self` no `begin` can still be queueing: a leaked guard's count goes, and
        // nothing is in flight (no read-modify-write of the count is needed to know it: no
        // other thread can touch the tracker while this borrow lives).
        self.exclusive();
        // Entries may change below (the lock is bypassed, not its rule).
        self.invalidate();
        let full = true;
        let Some(origin) = self.origin.as_ref() else {
            return Ok(None);
        };
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        // While the origin's mark is pending nothing else is (`entries` is empty until it is
        // entered), and it is on this very stream: stream order puts the caller's work after
        // it, as `order_locked` skips an entry of the same stream. The entry is never made.
        if st.origin_mark.is_none() {
            Self::order_locked(st, full, origin, range, access)?;
        }
        Ok(Some(origin))
    }

    /// `full`: nothing is in flight (see [`settled`](Self::settled)).
    fn order_locked(
        st: &mut State<B>,
        full: bool,
        stream: &B::Stream,
        range: (usize, usize),
        access: Access,
    ) -> Result<(), B::Error> {
        let mut i = 0;
        while i < st.entries.len() {
            let e = &st.entries[i];
            if B::same(&e.stream, stream)
                || !e.conflicts(range, access)
                || B::skip(&e.stream, stream)
            {
                i += 1;
                continue;
            }
            let already = st
                .entries
                .iter()
                .find(|t| B::same(&t.stream, stream))
                .and_then(|t| t.rec.as_deref())
                .is_some_and(|r| r.has_waited_for(e));
            let key = (e.stream.clone(), e.marked);
            if already {
                i += 1;
                continue;
            }
            // `Some(durable)` once the stream waits on the device.
            let waited = match st.entries[i].materialize(full) {
                Ok(ev) => B::wait(stream, &ev).ok().map(|()| B::durable(&ev)),
                Err(_) => None,
            };
            let Some(durable) = waited else {
                // Could not order on the device: wait on the host instead. Then the entry's
                // queued work is complete; it is forgotten only when nothing is in flight:
                // otherwise its marks may include work of a `begin` on the same stream that
                // is still being queued (after this synchronization), which the entry must
                // keep (a later waiter records, or synchronizes, again).
                B::sync_stream(&st.entries[i].stream)?;
                if full {
                    st.entries.remove(i);
                } else {
                    i += 1;
                }
                continue;
            };
            let t = match st.entries.iter().position(|t| B::same(&t.stream, stream)) {
                Some(t) => t,
                None => {
                    push_entry(&mut st.entries, stream);
                    st.entries.len() - 1
                }
            };
            // Only an event that covers every mark may stand for them in a later skip, and
            // only a wait that orders the stream for good.
            if full && durable {
                let waited = &mut st.entries[t].rec_mut().waited;
                waited.retain(|(s, _)| !B::same(s, &key.0));
                waited.push(key);
            }
            i += 1;
        }
        Ok(())
    }

    /// Marks work on `stream` that accesses `range` as `access` and is queued already (also
    /// when queueing failed: an extra mark only adds waiting). Cannot fail.
    pub fn mark(&self, stream: &B::Stream, range: (usize, usize), access: Access) {
        let mut st = self.lock();
        let full = self.settled();
        Self::mark_locked(&mut st, full, stream, range, access);
    }

    fn mark_locked(
        st: &mut State<B>,
        full: bool,
        stream: &B::Stream,
        range: (usize, usize),
        access: Access,
    ) {
        st.clock += 1;
        let clock = st.clock;
        let e = match st.entries.iter().position(|e| B::same(&e.stream, stream)) {
            Some(i) => &mut st.entries[i],
            None => {
                push_entry(&mut st.entries, stream);
                st.entries.last_mut().expect("just pushed")
            }
        };
        e.mark(clock, range, access);
        if st.entries.len() > PRUNE_AT {
            Self::prune(st, full, stream);
        }
    }

    /// Drops the entries of other streams whose work is known complete. Failures only keep
    /// entries (more waiting later), so they are ignored.
    /// `full`: nothing is in flight; otherwise only entries whose marks an earlier event
    /// covers (an event covers every mark) can be found complete.
    fn prune(st: &mut State<B>, full: bool, current: &B::Stream) {
        for e in st.entries.iter_mut() {
            if B::same(&e.stream, current) || e.is_idle() {
                continue;
            }
            if full {
                let _ = e.materialize(true);
            }
            if e.covering_event()
                .is_some_and(|ev| B::query(ev).unwrap_or(false))
            {
                e.clear();
            }
        }
        st.entries.retain(|e| !e.is_idle());
        let alive: Vec<B::Stream> = st.entries.iter().map(|e| e.stream.clone()).collect();
        for r in st.entries.iter_mut().filter_map(|e| e.rec.as_mut()) {
            r.waited
                .retain(|(s, _)| alive.iter().any(|a| B::same(a, s)));
        }
    }

    /// Blocks the host until the queued work that conflicts with a host `access` has
    /// completed: for a read, work that writes; for a write (and before a free), all work.
    /// On error the work may still run: the caller must not touch or free the memory.
    pub fn host_wait(&self, access: Access) -> Result<(), B::Error> {
        self.host_wait_range(None, access)
    }

    /// [`host_wait`](Self::host_wait) for host access to the bytes `range` only (a view of
    /// the buffer): work on other ranges goes on. `None` is the whole buffer.
    pub fn host_wait_range(
        &self,
        range: Option<(usize, usize)>,
        access: Access,
    ) -> Result<(), B::Error> {
        // One round: the events recorded under the lock cover every mark made before it. Marks
        // made meanwhile by other threads can only be reads beside a host read or a
        // `synchronize(&self)`, or work on other ranges of the buffer (disjoint views, see
        // the module docs), which this wait need not cover.
        let mut targets = Vec::new();
        {
            let mut st = self.lock();
            let full = self.settled();
            let mut i = 0;
            while i < st.entries.len() {
                let e = &mut st.entries[i];
                let needed = match (range, access) {
                    (Some(r), _) => e.conflicts(r, access),
                    (None, Access::Read) => e.has_writes(),
                    (None, Access::Write) => !e.is_idle(),
                };
                if !needed {
                    i += 1;
                    continue;
                }
                match e.materialize(full) {
                    Ok(ev) => targets.push((e.stream.clone(), ev)),
                    Err(_) => {
                        // Cannot record: wait for the whole stream, under the lock (queueing
                        // on this buffer pauses meanwhile; it is the rare path). Its queued
                        // work is then complete. With work in flight the entry's marks may
                        // stand for a `begin` on this same stream whose work is queued only
                        // after this synchronization (a read guard alive beside this host
                        // read): they stay, as after a record that does not cover them.
                        B::sync_stream(&e.stream)?;
                        if full {
                            st.entries.remove(i);
                            continue;
                        }
                    }
                }
                i += 1;
            }
            st.entries.retain(|e| !e.is_idle());
        }
        if targets.is_empty() {
            return Ok(());
        }
        // Every event is waited for, also after one failed (a lost context on one device says
        // nothing of another device's work); a failure after which work may still run is the
        // one reported.
        let mut failed: Option<B::Error> = None;
        let mut synced = Vec::with_capacity(targets.len());
        for (_, ev) in &targets {
            match B::sync_event(ev) {
                Ok(()) => synced.push(true),
                Err(e) => {
                    synced.push(false);
                    let keep = match &failed {
                        None => true,
                        Some(f) => !B::may_still_run(f) && B::may_still_run(&e),
                    };
                    if keep {
                        failed = Some(e);
                    }
                }
            }
        }
        let mut st = self.lock();
        for ((stream, ev), _) in targets.iter().zip(&synced).filter(|(_, ok)| **ok) {
            let done = st
                .entries
                .iter_mut()
                .find(|e| B::same(&e.stream, stream))
                .and_then(|e| e.rec.as_deref_mut())
                .filter(|r| r.event.as_ref().is_some_and(|x| Arc::ptr_eq(x, ev)));
            if let Some(r) = done {
                // Everything recorded by that event is done; marks since stay. (An entry left
                // with neither is idle: dropped below.)
                r.reads.clear();
                r.writes.clear();
            }
        }
        st.entries.retain(|e| !e.is_idle());
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// For memory whose owner hands it back without blocking (a pool that reuses it later):
    /// events that together cover all pending work, recorded now, for the new owner to poll
    /// before anyone touches the memory again. The tracker is empty afterwards. Where an event
    /// cannot be recorded the host waits for that stream instead. On error the work may still
    /// run: the memory must not be reused (the caller leaks it).
    ///
    /// Called by the memory's owner as it lets go (drop), through an exclusive borrow: no
    /// borrow of the memory, hence no work being queued, can be alive, so every event covers
    /// every mark (the count of a `begin` whose guard was leaked is dropped first, see
    /// [`exclusive`](Self::exclusive)). Drop must not panic, so nothing here asserts.
    pub fn retire(&mut self) -> Result<Vec<Arc<B::Event>>, B::Error> {
        self.exclusive();
        let mut st = self.lock();
        let full = self.settled();
        let mut events = Vec::new();
        for e in st.entries.iter_mut().filter(|e| !e.is_idle()) {
            match e.materialize(full) {
                Ok(ev) => events.push(ev),
                Err(_) => B::sync_stream(&e.stream)?,
            }
        }
        st.entries.clear();
        Ok(events)
    }

    /// How many entries the tracker has room for without allocating (for tests).
    #[cfg(test)]
    pub fn entry_capacity(&self) -> usize {
        self.lock().entries.capacity()
    }

    /// Whether the tracker has made room for entries yet, without entering a pending origin
    /// mark (for tests).
    #[cfg(test)]
    pub fn has_entry_room(&mut self) -> bool {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        st.entries.capacity() > 0
    }

    /// Whether no work is known to be pending (for tests and statistics).
    pub fn is_idle(&self) -> bool {
        self.lock().entries.iter().all(Entry::is_idle)
    }
}

/// Counts of what the tracker did, per thread, for the fence's unit tests.
#[cfg(test)]
pub(crate) mod tests_hook {
    std::thread_local! {
        /// Lock acquisitions.
        pub(crate) static LOCKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
}

#[cfg(test)]
mod ranges_tests {
    use super::Ranges;

    #[test]
    fn ranges_merge_touching_pieces_and_fall_back_to_the_hull() {
        let mut r = Ranges::default();
        assert!(r.is_empty());
        r.add((10, 20));
        r.add((20, 30)); // touching: widened
        assert_eq!(r.as_slice(), &[(10, 30)]);
        r.add((5, 5)); // empty: ignored
        for i in 0..3 {
            r.add((100 * (i + 1), 100 * (i + 1) + 10));
        }
        assert_eq!(r.len, 4);
        assert!(r.overlaps((25, 26)) && r.overlaps((305, 400)) && !r.overlaps((30, 100)));
        r.add((1000, 1001)); // a fifth piece: the hull
        assert_eq!(r.as_slice(), &[(10, 1001)]);
        assert!(r.overlaps((30, 100)), "the hull only adds overlaps");
        let mut m = Ranges::default();
        m.add((0, 1));
        m.merge(&r);
        assert_eq!(m.as_slice(), &[(0, 1), (10, 1001)]);
    }
}
