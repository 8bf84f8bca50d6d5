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
//!
//! Work racing a capture begin on another thread ([`Stream`](crate::Stream) is `Sync`) is
//! held off by the [`handshake`](super::handshake): each operation is in flight in its
//! thread's slot ([`InOp`]) from before it reads [`any_open`] until its runtime call returned;
//! [`begin`] registers the capture, raises the open count, makes its barrier, and waits for the
//! operations in flight on its stream before `cudaStreamBeginCapture`. Either the work sees the
//! capture (and is refused), or the capture waits for it. Streams another library holds too
//! are checked before and after the call ([`refuse_foreign_capture`], [`foreign_capture_now`]):
//! a foreign capture seen after it gives the buffers up ([`FOREIGN_GRAPH`]).

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::{self, ThreadId};

use cuda_mem_sys as sys;

use super::handshake::{self, enter_and_read, Barrier, Slot};
use crate::error::{check, invalid_argument, Error, Result};
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

/// Per-thread objects handed out for good (leaked, never freed), and handed back to be
/// reused by the next thread that needs one: there are never more than threads using them
/// at once.
struct Handout<T: 'static> {
    /// Every one ever made.
    all: Vec<&'static T>,
    /// Those that no live thread owns.
    free: Vec<&'static T>,
}

impl<T> Handout<T> {
    const fn new() -> Self {
        Handout {
            all: Vec::new(),
            free: Vec::new(),
        }
    }

    /// A free one, or a new one (`make`) where none is free.
    fn take(&mut self, make: impl FnOnce() -> T) -> &'static T {
        self.free.pop().unwrap_or_else(|| {
            let t: &'static T = Box::leak(Box::new(make()));
            self.all.push(t);
            t
        })
    }
}

/// Every set of counts ever made (never freed: a thread's counts must stay in the sums after
/// it exits), and those that no live thread owns.
static COUNTS: Mutex<Handout<Counts>> = Mutex::new(Handout::new());
/// Legacy work noted by a thread whose thread-local storage is already gone (noted while it
/// exits, from another thread-local's destructor).
static LATE_MARKED: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

fn counts_registry() -> MutexGuard<'static, Handout<Counts>> {
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
        let c = counts_registry().take(|| Counts([const { AtomicU64::new(0) }; 64]));
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

/// Every handshake slot ever made (never freed: an operation may still hold a pointer to
/// one), and those that no live thread owns.
static SLOTS: Mutex<Handout<Slot>> = Mutex::new(Handout::new());

fn slot_registry() -> MutexGuard<'static, Handout<Slot>> {
    // Nothing panics while holding it; recover the lists anyway.
    SLOTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Operations in flight on threads whose thread-local storage is already gone (queueing from
/// another thread-local's destructor while the thread exits): a capture begin waits until
/// there is none.
static LATE: AtomicUsize = AtomicUsize::new(0);

/// This thread's handshake slot, taken at its first operation and handed back when it exits
/// (its owner, in [`OWNER`]; [`FAST`] names it for the hot path).
struct MySlot(std::cell::Cell<Option<&'static Slot>>);

impl MySlot {
    fn take_one(&self) -> &'static Slot {
        if let Some(s) = self.0.get() {
            return s;
        }
        let s = slot_registry().take(Slot::new);
        self.0.set(Some(s));
        s
    }
}

impl Drop for MySlot {
    fn drop(&mut self) {
        // Operations from later thread-local destructors count in `LATE` instead.
        FAST.with(|f| f.set(None));
        if let Some(s) = self.0.take() {
            if s.is_idle() {
                slot_registry().free.push(s);
            } else {
                // Operations still in it: guards leaked, or kept by a thread-local destroyed
                // later, whose destructor may still queue work through them. The slot holds
                // captures up until its thread has exited ([`orphans`]).
                orphans::left(s);
            }
        }
    }
}

/// Slots whose owner was destroyed with operations still in them. Such an operation is either
/// leaked (`mem::forget` of its guard: it never ends) or kept by a thread-local destroyed
/// after the slot's owner, whose destructor may still queue work through it: the slot keeps
/// holding captures up while its thread lives, and is abandoned ([`Slot::abandon`], never
/// handed out again) once the thread has exited, as a capture begin finds. (Abandoning it when
/// the owner is destroyed let a capture begin run past work still being queued.)
#[cfg(all(target_os = "linux", not(miri)))]
mod orphans {
    use std::sync::{Mutex, MutexGuard};

    use super::Slot;

    /// The orphaned slots and their threads' kernel thread ids.
    static ORPHANS: Mutex<Vec<(&'static Slot, libc::pid_t)>> = Mutex::new(Vec::new());

    fn orphans() -> MutexGuard<'static, Vec<(&'static Slot, libc::pid_t)>> {
        // Nothing panics while holding it; recover the list anyway.
        ORPHANS.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calling thread's slot `s` is left busy by its owner (the thread is exiting).
    pub(super) fn left(s: &'static Slot) {
        // SAFETY: gettid takes no argument and touches no memory.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
        orphans().push((s, tid));
    }

    /// Whether the thread `tid` of this process has exited (or cannot be told apart from one
    /// that has: no `/proc`). A zombie or dead task has exited.
    fn exited(tid: libc::pid_t) -> bool {
        match std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) {
            // The state follows the command name, which is in parentheses.
            Ok(stat) => stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_none_or(|state| matches!(state, 'Z' | 'X' | 'x')),
            Err(_) => true,
        }
    }

    /// Settles the orphans whose threads have exited (all of them, or `only` that one):
    /// abandoned where an operation is still in them, handed back for reuse where not.
    pub(super) fn settle(only: Option<&Slot>) {
        let mut o = orphans();
        if o.is_empty() {
            return;
        }
        o.retain(|&(s, tid)| {
            if only.is_some_and(|m| !std::ptr::eq(m, s)) || !exited(tid) {
                return true;
            }
            if s.is_idle() {
                super::slot_registry().free.push(s);
            } else {
                s.abandon();
            }
            false
        });
    }
}

/// Without a way to tell when a thread has exited (another OS; Miri, which models neither
/// `gettid` nor `/proc`): a slot left busy is abandoned at once.
#[cfg(any(not(target_os = "linux"), miri))]
mod orphans {
    use super::Slot;

    pub(super) fn left(s: &'static Slot) {
        s.abandon();
    }

    pub(super) fn settle(_only: Option<&Slot>) {}
}

thread_local! {
    /// The owner of this thread's slot: gives it back when the thread exits.
    static OWNER: MySlot = const { MySlot(std::cell::Cell::new(None)) };
    /// This thread's slot while [`OWNER`] holds it (no destructor: the hot path reads it
    /// without the state check of a thread-local that has one), and the process's
    /// [`barrier`], decided before the slot was taken and the same ever after: kept here, so
    /// that an operation reads one thread-local line and the slot's, not also `MODE`'s.
    static FAST: std::cell::Cell<Option<(&'static Slot, Barrier)>> =
        const { std::cell::Cell::new(None) };
}

/// This thread's slot and the handshake's [`barrier`]; `None` once its thread-locals are being
/// destroyed.
#[inline]
fn my_slot_and_barrier() -> Option<(&'static Slot, Barrier)> {
    match FAST.with(std::cell::Cell::get) {
        Some(s) => Some(s),
        None => take_slot(),
    }
}

#[cold]
fn take_slot() -> Option<(&'static Slot, Barrier)> {
    // Decided first (once for the process; `barrier` never changes afterwards).
    let b = barrier();
    let s = OWNER.try_with(MySlot::take_one).ok()?;
    FAST.with(|f| f.set(Some((s, b))));
    Some((s, b))
}

/// The barrier of the handshake, decided at the first operation or capture begin: 0 while
/// undecided, then 1 for [`Barrier::Membarrier`], 2 for [`Barrier::Fence`].
static MODE: AtomicU8 = AtomicU8::new(0);

/// The handshake's barrier, the same for every thread of the process.
#[inline]
fn barrier() -> Barrier {
    match MODE.load(Ordering::Relaxed) {
        1 => Barrier::Membarrier,
        2 => Barrier::Fence,
        _ => decide_barrier(),
    }
}

/// Decides the barrier once (every caller gets the same answer): `membarrier` where the
/// process can register for private expedited barriers, a fence on both sides otherwise.
#[cold]
fn decide_barrier() -> Barrier {
    static ONCE: OnceLock<Barrier> = OnceLock::new();
    let b = *ONCE.get_or_init(|| {
        if membarrier::register() {
            Barrier::Membarrier
        } else {
            Barrier::Fence
        }
    });
    MODE.store(
        match b {
            Barrier::Membarrier => 1,
            Barrier::Fence => 2,
        },
        Ordering::Relaxed,
    );
    b
}

#[cfg(target_os = "linux")]
mod membarrier {
    const QUERY: libc::c_long = 0;
    const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    /// Registers the process for private expedited barriers; false where the kernel lacks
    /// them or a filter refuses the call (`ENOSYS`, `EPERM`).
    pub(super) fn register() -> bool {
        // Miri runs no syscall it does not model: the fence on both sides there (the path a
        // seccomp filter takes), which Miri checks like any other.
        if cfg!(miri) {
            return false;
        }
        // SAFETY: membarrier takes two integers (and a cpu id, ignored without the flag) and
        // touches no memory of ours.
        let cmds = unsafe { libc::syscall(libc::SYS_membarrier, QUERY, 0, 0) };
        if cmds < 0 || cmds & PRIVATE_EXPEDITED == 0 {
            return false;
        }
        // SAFETY: as above.
        unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
    }

    /// A full memory barrier on every running thread of the process.
    pub(super) fn run() -> std::io::Result<()> {
        // SAFETY: as in `register`; the process registered before any caller got here.
        match unsafe { libc::syscall(libc::SYS_membarrier, PRIVATE_EXPEDITED, 0, 0) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod membarrier {
    pub(super) fn register() -> bool {
        false
    }

    pub(super) fn run() -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

/// The capture side's barrier, between raising [`OPEN`] and reading the slots.
fn capture_barrier(b: Barrier) -> Result<()> {
    match b {
        Barrier::Membarrier => membarrier::run()
            .map_err(|e| Error::os("membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)", &e)),
        Barrier::Fence => {
            std::sync::atomic::fence(Ordering::SeqCst);
            Ok(())
        }
    }
}

/// The id of `s` in the slots: its handle as the calling thread passes it to the runtime.
#[inline]
fn stream_id(s: &StreamInner) -> usize {
    s.raw() as usize
}

/// An operation that is queueing work (see [`handshake`](super::handshake)): from before it
/// reads [`OPEN`] until its runtime call has returned. Nests: an operation on several
/// buffers holds one per fence. Stays on its thread.
pub(crate) struct InOp {
    /// The thread's slot; `None` for an operation counted in [`LATE`].
    slot: Option<&'static Slot>,
    _thread_bound: std::marker::PhantomData<*const ()>,
}

impl InOp {
    /// Enters the calling thread's slot for work on `s`; true where a capture may be open
    /// (the caller takes the capture-aware path).
    #[inline]
    pub(crate) fn enter(s: &StreamInner) -> (InOp, bool) {
        InOp::enter_id(stream_id(s))
    }

    #[inline]
    fn enter_id(id: usize) -> (InOp, bool) {
        match my_slot_and_barrier() {
            Some((slot, barrier)) => {
                let open = enter_and_read(slot, id, &OPEN, barrier) != 0;
                (
                    InOp {
                        slot: Some(slot),
                        _thread_bound: std::marker::PhantomData,
                    },
                    open,
                )
            }
            None => InOp::enter_late(),
        }
    }

    #[cold]
    fn enter_late() -> (InOp, bool) {
        LATE.fetch_add(1, Ordering::SeqCst);
        let open = OPEN.load(Ordering::SeqCst) != 0;
        (
            InOp {
                slot: None,
                _thread_bound: std::marker::PhantomData,
            },
            open,
        )
    }

    /// Asks for the thread's slot line ahead of its use by the drop ([`prefetch_line`]).
    #[inline(always)]
    pub(crate) fn prefetch(&self) {
        if let Some(s) = self.slot {
            prefetch_line(std::ptr::from_ref(s).cast());
        }
    }
}

/// A hint to the CPU to bring the cache line of `p` in (`prefetcht0`; nothing elsewhere). It
/// reads nothing the program sees and cannot fault: any address will do.
#[inline(always)]
pub(crate) fn prefetch_line(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `prefetcht0` is an SSE instruction (every x86-64 CPU has SSE); a prefetch has no
    // architectural effect and does not fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    let _ = p;
}

impl Drop for InOp {
    #[inline]
    fn drop(&mut self) {
        match self.slot {
            Some(s) => s.exit(),
            None => {
                LATE.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

/// Whether the calling thread is inside an operation (on any stream).
fn in_op() -> bool {
    FAST.with(|f| f.get().is_some_and(|(s, _)| !s.is_idle()))
}

/// The capture side of the handshake for the stream `id`, once the capture is registered
/// (for a begin, and the count raised): the barrier, then the wait for the operations in
/// flight there ([`wait_for_ops`]).
fn hold_off_ops(b: Barrier, id: usize) -> Result<()> {
    capture_barrier(b)?;
    wait_for_ops(id)
}

/// The capture side of the handshake, after [`OPEN`] rose and [`capture_barrier`]: waits
/// until every other thread's operation on the stream `id` (or on several) that was in flight
/// has returned. The calling thread's own slot is skipped ([`begin`] refuses where it is busy
/// on the stream).
///
/// Gives up after [`OPS_WAIT_LIMIT`] with an exact `Misuse` ([`OPS_HELD`]): an operation lasts
/// microseconds, but a device pointer guard lasts as long as its holder keeps it, and a guard
/// leaked with `mem::forget` keeps its thread's slot busy until that thread exits.
fn wait_for_ops(id: usize) -> Result<()> {
    orphans::settle(None);
    let slots = slot_registry().all.clone();
    let me = FAST.with(std::cell::Cell::get).map(|(s, _)| s);
    let others = slots
        .into_iter()
        .filter(|s| !me.is_some_and(|m| std::ptr::eq(m, *s)));
    let deadline = std::time::Instant::now() + OPS_WAIT_LIMIT;
    let mut done = true;
    for slot in others {
        // A slot whose thread is exiting holds the begin up until that thread has exited.
        let mut backoff = |round: u32| {
            if round % 32 == 31 {
                orphans::settle(Some(slot));
            }
            backoff(round, deadline)
        };
        if !handshake::wait_for_ops([slot], id, &mut backoff) {
            done = false;
            break;
        }
    }
    let mut round = 0;
    while done && LATE.load(Ordering::SeqCst) != 0 {
        done = backoff(round, deadline);
        round += 1;
    }
    if done {
        Ok(())
    } else {
        Err(invalid_argument("Stream::capture", OPS_HELD))
    }
}

/// How long a capture begin waits for other threads' operations on its stream (shorter in the
/// unit tests, which reach it on purpose).
const OPS_WAIT_LIMIT: std::time::Duration = if cfg!(test) {
    std::time::Duration::from_millis(300)
} else {
    std::time::Duration::from_secs(10)
};

/// The refusal of a capture begin that waited [`OPS_WAIT_LIMIT`] for other threads' work.
pub(crate) const OPS_HELD: &str =
    "another thread kept queueing work on the stream open for over 10 s (a device pointer \
     guard held, or leaked with mem::forget, on this stream): the capture was not begun, since \
     that work would be captured without its buffers";

/// Waiting for an operation's runtime call (microseconds) or a guard (as long as its holder
/// keeps it): spin, then yield, then sleep; false once `deadline` has passed.
fn backoff(round: u32, deadline: std::time::Instant) -> bool {
    if round < 64 {
        std::hint::spin_loop();
    } else if round < 256 {
        thread::yield_now();
    } else {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        thread::sleep(std::time::Duration::from_micros(50));
    }
    true
}

/// The bit of a fence's binding that says the buffer is graph memory (allocated inside the
/// capture): the rest of the binding is the capture's token.
pub(crate) const GRAPH_MEMORY: u64 = 1 << 63;
/// The bit of a fence's binding that says work on the buffer may be a node of a graph that
/// another library captured ([`foreign_capture_now`]): the buffer is never used, waited for or
/// freed again.
pub(crate) const FOREIGN_GRAPH: u64 = 1 << 62;

/// One open capture.
struct Open {
    token: u64,
    /// The thread that began it (and will end it).
    thread: ThreadId,
    /// The stream it began on, first, then the streams the fence joined into it.
    streams: Vec<Arc<StreamInner>>,
    /// Graph allocations made in it and not yet freed in it.
    allocs: usize,
    /// Whether `cudaStreamBeginCapture` has returned (registered before, see [`begin`]).
    begun: bool,
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
    capture_state_of(s).map(|(token, _)| token)
}

/// The capture `s` captures into, and whether it has begun (else it is beginning: work
/// queued now may or may not land in it).
pub(crate) fn capture_state_of(s: &StreamInner) -> Option<(u64, bool)> {
    if !any_open() {
        return None;
    }
    registry()
        .iter()
        .find(|o| o.streams.iter().any(|x| StreamInner::same(x, s)))
        .map(|o| (o.token, o.begun))
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

/// Before the fence joins `s` into the capture `token` (a wait on one of its events): notes
/// `s` as the capture's, then makes the capture side of the handshake for `s`, as a capture
/// begin does for its origin. From the note on, another thread's work on `s` sees `s` in the
/// capture and is refused (its buffers were not given to it); work already in flight on `s`
/// is waited for, so it is queued before the join, outside the capture. (Noting after the
/// join left a window in which such work passed the checks and was queued into the capture.)
/// `Ok(true)` where `s` is newly noted: undo with [`unjoin`] if the join then fails.
///
/// Waits at most [`OPS_WAIT_LIMIT`] ([`OPS_HELD`]): an operation in flight on `s` that waits
/// for the lock of the buffer whose fence is joining holds this up until then.
pub(crate) fn join(token: u64, s: &Arc<StreamInner>) -> Result<bool> {
    let newly = match registry().iter_mut().find(|o| o.token == token) {
        Some(o) if !o.streams.iter().any(|x| StreamInner::same(x, s)) => {
            o.streams.push(s.clone());
            true
        }
        _ => false,
    };
    if newly {
        if let Err(e) = hold_off_ops(barrier(), stream_id(s)) {
            unjoin(token, s);
            return Err(e);
        }
    }
    Ok(newly)
}

/// Takes back a [`join`] note whose join failed.
pub(crate) fn unjoin(token: u64, s: &Arc<StreamInner>) {
    if let Some(o) = registry().iter_mut().find(|o| o.token == token) {
        o.streams.retain(|x| !StreamInner::same(x, s));
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
#[inline]
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
/// work is queued, is caught after the call instead ([`foreign_capture_now`]).
#[cold]
pub(crate) fn refuse_foreign_capture(s: &StreamInner) -> Result<()> {
    if foreign_status(s)? {
        Err(invalid_argument("queueing work", FOREIGN_CAPTURE))
    } else {
        Ok(())
    }
}

/// Whether a capture that the crate did not begin is open on `s`.
fn foreign_status(s: &StreamInner) -> Result<bool> {
    use sys::cudaStreamCaptureStatus as S;
    if capture_of(s).is_some() {
        return Ok(false);
    }
    let mut status = S::cudaStreamCaptureStatusNone;
    // SAFETY: a live stream handle (the caller borrows its stream); a valid out-pointer.
    let code = unsafe { sys::cudaStreamIsCapturing(s.raw(), &mut status) };
    check(code, || format!("cudaStreamIsCapturing({s:?})"))?;
    Ok(status != S::cudaStreamCaptureStatusNone)
}

/// After work was queued on `s`, a stream another library holds too: whether that library may
/// have captured it, a capture the crate did not begin being open on `s` now (it began after
/// [`refuse_foreign_capture`]'s check, so the work may be one of its nodes), or the question
/// failing. The caller then gives the buffers up for good ([`FOREIGN_GRAPH`]). A foreign
/// capture begun *and ended* while the call was in flight is not seen (docs/graphs.md).
#[cold]
pub(crate) fn foreign_capture_now(s: &StreamInner) -> bool {
    foreign_status(s).unwrap_or(true)
}

/// Begins a capture on `origin` in `mode` and registers it; returns its token. The legacy
/// stream of `origin`'s device is drained first when no other capture is open (its pending
/// work then never needs a call during the capture).
///
/// The capture is registered and [`OPEN`] raised *before* `cudaStreamBeginCapture`, and the
/// begin waits for every other thread's operation in flight on `origin` that may have read
/// [`OPEN`] before it rose (the [`handshake`](super::handshake)): work that other threads
/// queue on `origin` either reaches the runtime before the capture begins, or sees the
/// capture registered and is refused (its buffers were not given to the capture). Refused
/// (`Misuse`) where the calling thread itself is inside an operation (it holds a device
/// pointer guard: work queued through it on `origin` would be captured, and a guard on another
/// stream could hold up a capture begin on another thread that this one waits for).
pub(crate) fn begin(origin: &Arc<StreamInner>, mode: sys::cudaStreamCaptureMode) -> Result<u64> {
    let id = stream_id(origin);
    if in_op() {
        return Err(invalid_argument("Stream::capture", GUARD_DURING_BEGIN));
    }
    let barrier = barrier();
    let _l = BEGIN.lock().unwrap_or_else(|e| e.into_inner());
    if !any_open() {
        drain_legacy(origin.device())?;
    }
    let token = NEXT.fetch_add(1, Ordering::Relaxed);
    registry().push(Open {
        token,
        thread: thread::current().id(),
        streams: vec![origin.clone()],
        allocs: 0,
        begun: false,
    });
    // Registered first, then raised (release: an operation that sees the count sees the
    // entry), then the capture side of the handshake.
    OPEN.fetch_add(1, Ordering::SeqCst);
    let began = hold_off_ops(barrier, id).and_then(|()| {
        // SAFETY: a live stream handle (the caller's borrow keeps it); the mode is a valid
        // value.
        let code = unsafe { sys::cudaStreamBeginCapture(origin.raw(), mode) };
        check(code, || {
            format!("cudaStreamBeginCapture({:?}, {mode:?})", origin)
        })
    });
    let mut r = registry();
    if let Err(e) = began {
        r.retain(|o| o.token != token);
        OPEN.fetch_sub(1, Ordering::AcqRel);
        return Err(e);
    }
    if let Some(o) = r.iter_mut().find(|o| o.token == token) {
        o.begun = true;
    }
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

/// The refusal of a buffer whose work may be in another library's graph.
pub(crate) const FOREIGN_CAPTURED: &str =
    "work on the buffer was queued on a stream that another library began capturing while the \
     work was being queued: it may be a node of that graph, so the buffer is never used, waited \
     for or freed again (it is leaked)";
/// The refusal of a capture begin on a stream the capturing thread is queueing on.
pub(crate) const GUARD_DURING_BEGIN: &str =
    "this thread holds a device pointer guard (device_ptr / device_ptr_mut, cudarc_ptr): work \
     queued through it could be captured into the graph; drop it before the capture begins";
/// The refusal of a stream-ordered allocation on a stream another thread captures on (or is
/// beginning to).
pub(crate) const CAPTURE_ELSEWHERE: &str =
    "another thread is capturing on this stream (or beginning to): the allocation would be \
     graph memory of a capture this thread does not own, or land in it or not by timing; \
     allocate inside the capture's closure";

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
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    /// Issue 22: a capture begin waits for another thread's operation in flight on its stream
    /// (entered before the capture raised `OPEN`) until that operation has returned, and not
    /// for one on another stream. (Fake stream ids: nothing reaches the runtime.)
    #[test]
    fn a_capture_begin_waits_for_an_operation_in_flight_on_its_stream_only() {
        const MINE: usize = 0xabc0;
        const OTHER: usize = 0xdef0;
        for (stream, waits) in [(MINE, true), (OTHER, false)] {
            let done = Arc::new(AtomicBool::new(false));
            let (tx, rx) = mpsc::channel();
            let d = done.clone();
            let t = thread::spawn(move || {
                let (op, _) = InOp::enter_id(stream);
                tx.send(()).unwrap();
                thread::sleep(Duration::from_millis(200));
                d.store(true, Ordering::SeqCst);
                drop(op);
            });
            rx.recv().unwrap();
            wait_for_ops(MINE).unwrap();
            assert_eq!(
                done.load(Ordering::SeqCst),
                waits,
                "an operation on stream {stream:#x}: waited for it {}",
                !waits
            );
            t.join().unwrap();
        }
    }

    /// A thread that queues operations back to back on the capture's stream does not hold a
    /// capture begin up for longer than one operation: the capture waits for the operation it
    /// saw, not for the slot to be found idle.
    #[test]
    fn a_capture_begin_is_not_starved_by_operations_back_to_back() {
        const S: usize = 0xabd0;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let st = stop.clone();
        let t = thread::spawn(move || {
            let mut first = Some(tx);
            while !st.load(Ordering::Relaxed) {
                let (op, _) = InOp::enter_id(S);
                if let Some(tx) = first.take() {
                    tx.send(()).unwrap();
                }
                std::hint::black_box(&op);
                drop(op);
            }
        });
        rx.recv().unwrap();
        let start = Instant::now();
        for _ in 0..100 {
            wait_for_ops(S).unwrap();
        }
        let took = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
        assert!(took < Duration::from_secs(5), "100 waits took {took:?}");
    }

    /// A thread that keeps an operation open on the capture's stream (a guard leaked with
    /// `mem::forget`, its thread still alive) makes the capture begin give up after its limit
    /// with the exact refusal, instead of waiting until that thread exits.
    #[test]
    fn a_capture_begin_gives_up_on_an_operation_kept_open() {
        const S: usize = 0xabf0;
        let (tx, rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let t = thread::spawn(move || {
            let (op, _) = InOp::enter_id(S);
            std::mem::forget(op);
            tx.send(()).unwrap();
            let _ = stop_rx.recv();
        });
        rx.recv().unwrap();
        let start = Instant::now();
        let err = wait_for_ops(S).unwrap_err();
        let took = start.elapsed();
        stop_tx.send(()).unwrap();
        t.join().unwrap();
        assert!(
            matches!(err.misuse(), Some(crate::Misuse::InvalidArgument { op: "Stream::capture", reason }) if reason == OPS_HELD),
            "{err}"
        );
        assert!(took >= OPS_WAIT_LIMIT, "gave up after {took:?}");
        // Another stream is not held up.
        wait_for_ops(S + 0x100).unwrap();
    }

    /// Nested operations keep the slot busy until the outermost ends, and one on a second
    /// stream makes a capture on either stream (or any) wait.
    #[test]
    fn nested_operations_on_two_streams_hold_captures_on_both() {
        let slot = Slot::new();
        let b = barrier();
        slot.enter(0x10, b);
        assert!(slot.busy_on(0x10).is_some());
        assert!(slot.busy_on(0x20).is_none());
        slot.enter(0x10, b);
        slot.exit();
        assert!(
            slot.busy_on(0x10).is_some(),
            "the inner exit freed the slot"
        );
        slot.enter(0x20, b);
        assert!(slot.busy_on(0x10).is_some() && slot.busy_on(0x20).is_some());
        slot.exit();
        slot.exit();
        assert!(slot.busy_on(0x10).is_none() && slot.busy_on(0x20).is_none());
        assert!(slot.is_idle());
    }

    /// A thread that exits with an operation leaked (`mem::forget` of its guard) does not hold
    /// captures up afterwards, and its slot is not handed to another thread.
    #[test]
    fn a_slot_left_busy_by_an_exiting_thread_holds_nothing_up() {
        const S: usize = 0xabe0;
        let leaked = thread::spawn(|| {
            let (op, _) = InOp::enter_id(S);
            std::mem::forget(op);
            FAST.with(|f| f.get().unwrap().0 as *const Slot as usize)
        })
        .join()
        .unwrap();
        let start = Instant::now();
        wait_for_ops(S).unwrap();
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(
            !slot_registry()
                .free
                .iter()
                .any(|s| *s as *const Slot as usize == leaked),
            "an abandoned slot was handed back for reuse"
        );
    }

    /// Review 4: a guard kept by a thread-local that is destroyed *after* the slot's owner
    /// (registered before the thread's first operation, so destroyed later: thread-local
    /// destructors run in reverse order of registration) is still queueing work while its
    /// thread exits. Its operation must still hold a capture begin on its stream up until it
    /// ends; abandoning the slot when the owner is destroyed let the begin through at once
    /// (work queued from that destructor could then land in the capture unseen).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri models neither gettid nor /proc: slots left busy are abandoned at once there"
    )]
    fn an_operation_kept_by_a_later_thread_local_still_holds_captures() {
        use std::cell::RefCell;
        const S: usize = 0xac10;
        type Ends = (mpsc::Sender<()>, mpsc::Receiver<()>);
        struct Keeper(Option<InOp>, Option<Ends>);
        impl Drop for Keeper {
            fn drop(&mut self) {
                if let Some((in_dtor, release)) = self.1.take() {
                    // Still in the operation: the slot's owner is destroyed already.
                    in_dtor.send(()).unwrap();
                    let _ = release.recv();
                }
                drop(self.0.take());
            }
        }
        thread_local! {
            static KEEPER: RefCell<Option<Keeper>> = const { RefCell::new(None) };
        }
        let (in_dtor_tx, in_dtor_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel();
        let t = thread::spawn(move || {
            // Registered first (destroyed last), then the slot's owner, at the operation.
            KEEPER.with(|k| *k.borrow_mut() = Some(Keeper(None, Some((in_dtor_tx, release_rx)))));
            let (op, _) = InOp::enter_id(S);
            KEEPER.with(|k| k.borrow_mut().as_mut().unwrap().0 = Some(op));
        });
        in_dtor_rx.recv().unwrap();
        let released = Arc::new(AtomicBool::new(false));
        let r = released.clone();
        let releaser = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            r.store(true, Ordering::SeqCst);
            release_tx.send(()).unwrap();
        });
        wait_for_ops(S).unwrap();
        assert!(
            released.load(Ordering::SeqCst),
            "the capture began while the exiting thread's operation was still in flight"
        );
        releaser.join().unwrap();
        t.join().unwrap();
    }

    /// The capturing thread's own operation (a device pointer guard alive) refuses the capture
    /// begin with the exact misuse, before any call.
    #[test]
    fn a_capture_begin_inside_an_operation_of_its_thread_is_refused() {
        // SAFETY: a stand-in handle that never reaches the runtime (refused before any call).
        let s = unsafe {
            crate::Stream::from_raw(
                std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
                crate::Device::from_ordinal_unchecked(0),
            )
        };
        let (op, _) = InOp::enter_id(0xabf0);
        let e = begin(
            s.inner(),
            sys::cudaStreamCaptureMode::cudaStreamCaptureModeRelaxed,
        )
        .unwrap_err();
        drop(op);
        match e {
            Error::Misuse(crate::error::Misuse::InvalidArgument { op, reason }) => {
                assert_eq!(op, "Stream::capture");
                assert_eq!(reason, GUARD_DURING_BEGIN);
            }
            e => panic!("unexpected error: {e:?}"),
        }
        assert!(!any_open());
    }

    /// The barrier is decided once: every thread gets the same. Prints which (membarrier is
    /// expected on Linux outside seccomp filters).
    #[test]
    fn the_barrier_is_the_same_for_every_thread() {
        let here = barrier();
        let there = thread::spawn(barrier).join().unwrap();
        assert_eq!(here, there);
        eprintln!("handshake barrier: {here:?}");
    }

    /// Issue 21/22: the operation side's cost (enter the slot, read `OPEN`, exit), per
    /// operation, and nested as `copy_async` does it (two fences). Release build:
    /// `cargo test -p cuda-mem --release --lib op_side_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a timing, not a check: run with --release --ignored --nocapture"]
    fn op_side_cost() {
        const N: u32 = 20_000_000;
        let s = 0x1000usize;
        let _ = barrier();
        for _ in 0..2 {
            let t = Instant::now();
            for _ in 0..N {
                let (op, open) = InOp::enter_id(std::hint::black_box(s));
                std::hint::black_box(open);
                drop(op);
            }
            let one = t.elapsed().as_secs_f64() * 1e9 / f64::from(N);
            let t = Instant::now();
            for _ in 0..N {
                let (a, o1) = InOp::enter_id(std::hint::black_box(s));
                let (b, o2) = InOp::enter_id(std::hint::black_box(s));
                std::hint::black_box((o1, o2));
                drop(b);
                drop(a);
            }
            let two = t.elapsed().as_secs_f64() * 1e9 / f64::from(N);
            let t = Instant::now();
            for _ in 0..N {
                std::hint::black_box(any_open());
            }
            let base = t.elapsed().as_secs_f64() * 1e9 / f64::from(N);
            eprintln!(
                "barrier {:?}: one op {one:.2} ns, two nested {two:.2} ns, the old OPEN read \
                 alone {base:.2} ns",
                barrier()
            );
        }
    }

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
