//! The handshake between work being queued and a stream capture beginning (issue 22): a
//! capture begun on a stream must never capture work that another thread decided to queue as
//! ordinary work (outside any capture), since that work's buffers were not given to the
//! capture, and its fence records an event that the capture swallows.
//!
//! Every thread has a [`Slot`], and an operation that queues work says in it that it is
//! queueing, and on which stream, *before* it reads whether a capture is open (the `OPEN` count
//! of `fence/capture.rs`), and until its runtime call returned. A capture begin raises
//! `OPEN` first, and then waits for every slot busy on its stream to clear or move on, before
//! `cudaStreamBeginCapture`. That is Dekker's handshake: either the operation sees `OPEN` (and
//! takes the capture-aware path, which finds the capture already registered), or the capture
//! sees the operation's slot busy (and waits until its call has returned). Both sides need a
//! store-to-load barrier between their store and their load; the operation's side is the hot
//! path, so the barrier is asymmetric where the OS allows it ([`Barrier`]).
//!
//! This file is shared with the model test crate `cuda-mem-loom` (included by path, over
//! loom's atomics), which checks the handshake under every interleaving with [`Barrier::Fence`]
//! (loom cannot model `membarrier`).

use super::sync::atomic::{compiler_fence, fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// The stream id of a slot whose thread queues on several streams at once (nested operations
/// on different streams): a capture on any stream waits for it.
pub const ANY: usize = usize::MAX;

/// How the two sides of the handshake order their store before their load, chosen once for
/// the whole process before either side relies on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Barrier {
    /// The operation side makes a compiler barrier only; the capture side makes every thread
    /// of the process run a full memory barrier (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`),
    /// which orders every operation's earlier store before its later load as seen from the
    /// capture.
    Membarrier,
    /// A full fence on both sides (no `membarrier`: another OS, or a seccomp filter).
    Fence,
}

impl Barrier {
    /// The operation side's barrier, between its slot store and its `OPEN` load.
    #[inline(always)]
    pub fn op_side(self) {
        match self {
            Barrier::Membarrier => compiler_fence(Ordering::SeqCst),
            Barrier::Fence => fence(Ordering::SeqCst),
        }
    }
}

/// One thread's word on the work it is queueing. Only its owner thread writes it; capture
/// begins read it. Padded to a cache line of its own (the owner writes it on every operation).
#[repr(align(128))]
#[derive(Default)]
pub struct Slot {
    /// Odd while the owner is inside an operation; every operation moves it on by two, so
    /// that a capture can tell "still the same operation" from "a later one".
    seq: AtomicU64,
    /// The stream (raw handle) the operation queues on, [`ANY`] for several.
    stream: AtomicUsize,
    /// Operations nested inside each other (an operation on several buffers): the slot is
    /// busy until the outermost ends. Owner only.
    depth: AtomicU32,
}

/// A slot's depth once it is given up with operations still in it ([`Slot::abandon`]): never
/// back to zero.
const ABANDONED: u32 = 1 << 30;

impl Slot {
    /// A new, idle slot.
    pub fn new() -> Slot {
        Slot::default()
    }

    /// The owner begins queueing work on `stream`; `barrier` then orders this before the
    /// caller's read of the open count. Pair with [`exit`](Self::exit).
    #[inline]
    pub fn enter(&self, stream: usize, barrier: Barrier) {
        let depth = self.depth.load(Ordering::Relaxed);
        self.depth.store(depth + 1, Ordering::Relaxed);
        if depth == 0 {
            self.stream.store(stream, Ordering::Relaxed);
            let seq = self.seq.load(Ordering::Relaxed);
            // Release: a capture that sees the odd value sees the stream stored above.
            self.seq.store(seq | 1, Ordering::Release);
        } else {
            let current = self.stream.load(Ordering::Relaxed);
            if current == stream || current == ANY {
                // Already published, and ordered before this thread's earlier loads: the
                // barrier made then orders it before this one's too.
                return;
            }
            self.stream.store(ANY, Ordering::Relaxed);
        }
        barrier.op_side();
    }

    /// The owner's work (the innermost operation's) is queued, or was not.
    #[inline]
    pub fn exit(&self) {
        let depth = self.depth.load(Ordering::Relaxed).wrapping_sub(1);
        self.depth.store(depth, Ordering::Relaxed);
        if depth == 0 {
            let seq = self.seq.load(Ordering::Relaxed);
            // Release: the operation's runtime call happens before a capture that sees this.
            self.seq.store(seq + 1, Ordering::Release);
        }
    }

    /// The operation a capture begin on `stream` has to wait for, as the slot's sequence
    /// number: the owner is inside an operation on `stream` (or on several streams).
    pub fn busy_on(&self, stream: usize) -> Option<u64> {
        let seq = self.seq.load(Ordering::Acquire);
        if seq & 1 == 0 {
            return None;
        }
        let s = self.stream.load(Ordering::Relaxed);
        (s == stream || s == ANY).then_some(seq)
    }

    /// Whether the operation [`busy_on`](Self::busy_on) saw as `seq` is still going on.
    pub fn still_in(&self, seq: u64) -> bool {
        self.seq.load(Ordering::Acquire) == seq
    }

    /// Whether no operation is in the slot (it can be handed to another thread). Owner only
    /// (or once the owner is gone).
    pub fn is_idle(&self) -> bool {
        self.depth.load(Ordering::Relaxed) == 0
    }

    /// The owner thread has exited with operations still in the slot (their guards leaked):
    /// the slot stops holding captures up and is never handed out again (a late `exit` must
    /// not make it busy). Not before the thread has exited: a guard kept by a thread-local
    /// destroyed late may still be queueing work.
    pub fn abandon(&self) {
        self.depth.store(ABANDONED, Ordering::Relaxed);
        let seq = self.seq.load(Ordering::Relaxed);
        if seq & 1 == 1 {
            self.seq.store(seq + 1, Ordering::Release);
        }
    }
}

/// The operation side: enters `slot` for `stream`, then reads `open` (the count of open
/// captures). Nonzero: a capture may be beginning; the caller takes the capture-aware path,
/// where the capture is registered already.
#[inline]
pub fn enter_and_read(slot: &Slot, stream: usize, open: &AtomicUsize, barrier: Barrier) -> usize {
    slot.enter(stream, barrier);
    open.load(Ordering::Relaxed)
}

/// The capture side, after it raised `open` and made its barrier (the capture side of
/// [`Barrier`]): waits until no slot of `slots` is in an operation on `stream` that began
/// before the barrier. `backoff` is called between looks at a slot (with the number of looks so
/// far); when it returns false the wait gives up, and so does this (false).
pub fn wait_for_ops<'a>(
    slots: impl IntoIterator<Item = &'a Slot>,
    stream: usize,
    mut backoff: impl FnMut(u32) -> bool,
) -> bool {
    for slot in slots {
        if let Some(seq) = slot.busy_on(stream) {
            let mut round = 0u32;
            while slot.still_in(seq) {
                if !backoff(round) {
                    return false;
                }
                round = round.saturating_add(1);
            }
        }
    }
    true
}
