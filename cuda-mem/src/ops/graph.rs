//! CUDA graphs through stream capture: [`Stream::capture`] records the work a closure queues
//! into a [`Graph`], [`Graph::instantiate`] makes it a [`GraphExec`] that replays it with one
//! launch (`cudaStreamBeginCapture` / `cudaStreamEndCapture`, `cudaGraphInstantiate`,
//! `cudaGraphLaunch`, `cudaGraphExecUpdate`).
//!
//! The buffers a graph's nodes use are given to the capture as its *resources* (references
//! to buffers, or tuples, arrays and `Vec`s of them), and the graph keeps them: borrowed for
//! as long as the graph or its executable lives, so no safe code can drop, free or move them
//! meanwhile. Each launch orders itself after pending work on them and marks their fences, as
//! a copy would, so host access through [`GraphExec::resources_mut`], refills between
//! replays, and the buffers' drop once the graph is gone wait for the launches. Captured work
//! on a buffer that was not given to the capture is refused (`Misuse::InvalidArgument`), as is
//! host access to a given buffer while the capture is open; neither invalidates the capture.
//! The rules, and what was taken from PyTorch and cudarc: `docs/graphs.md`.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::Arc;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::contract::buffer::{Allocation, Buffer as OwnedBuffer};
use crate::contract::memory::sealed::Async;
use crate::error::invalid_argument;
use crate::error::{check, Result};
use crate::fence::capture::{self, Relaxed};
use crate::fence::{Access, Fence, Hold, Use};
use crate::handles::devices::{Device, DeviceGuard};
use crate::handles::driver;
use crate::handles::event::Event;
use crate::handles::stream::{Stream, StreamInner};
use crate::kinds::registered::RegisteredVec;

/// How a capture interacts with other runtime calls (`cudaStreamCaptureMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureMode {
    /// `cudaStreamCaptureModeGlobal`: "potentially unsafe" calls (a `cudaMalloc`, a
    /// synchronization) on any thread in global mode, and on this one, fail and invalidate
    /// the capture.
    Global,
    /// `cudaStreamCaptureModeThreadLocal`: only this thread's unsafe calls are refused.
    ThreadLocal,
    /// `cudaStreamCaptureModeRelaxed`: unsafe calls are not refused (calls that necessarily
    /// conflict with the capture still are).
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> sys::cudaStreamCaptureMode {
        use sys::cudaStreamCaptureMode as M;
        match self {
            CaptureMode::Global => M::cudaStreamCaptureModeGlobal,
            CaptureMode::ThreadLocal => M::cudaStreamCaptureModeThreadLocal,
            CaptureMode::Relaxed => M::cudaStreamCaptureModeRelaxed,
        }
    }
}

pub(crate) mod sealed {
    use crate::error::Result;
    use crate::fence::{Access, Fence};
    use crate::handles::stream::Stream;

    /// A buffer a graph can keep: its fence, byte range and memory.
    pub trait Kept {
        /// The fence, the buffer's byte range in it, and the address of its memory.
        fn entry(&self) -> (&Fence, (usize, usize), usize);
    }

    /// What a graph keeps: each buffer's fence, range, memory address and how the graph may
    /// use it (write through `&mut`, read through `&`).
    pub trait Visit {
        /// Calls `f` for every buffer.
        fn visit<'s, F>(&'s self, f: &mut F)
        where
            F: FnMut(&'s Fence, (usize, usize), Access, usize);

        /// Runs `f` (which queues a launch on `stream`) with the work marked on every buffer's
        /// fence (`Fence::begin_checked`, after the caller's `Fence::check_queue` for
        /// `stream`), the marks held until `f` returns. On a mark's error `f` does not run.
        ///
        /// Buffers and tuples hold their marks in their own stack frames, nested (no
        /// allocation, no walk through a closure: the launch's hot path); `Vec`s and arrays,
        /// of any length, collect them into a `Vec` (this default).
        fn marked<F: FnOnce() -> Result<()>>(&self, stream: &Stream, f: F) -> Result<()> {
            let mut uses = Vec::new();
            let mut failed = Ok(());
            self.visit(&mut |fence, range, access, _| {
                if failed.is_ok() {
                    match fence.begin_checked(stream, range, access) {
                        Ok(u) => uses.push(u),
                        Err(e) => failed = Err(e),
                    }
                }
            });
            failed?;
            f()
        }
    }
}

use sealed::{Kept, Visit};

/// What a graph's nodes use and the graph keeps borrowed: `&mut` buffers (which its nodes may
/// write) and `&` buffers (read only) of the kinds asynchronous work may use (device, pinned,
/// mapped, managed, registered `Vec`), and tuples (up to 8), arrays and `Vec`s of them, or
/// `()`. Sealed.
pub trait GraphResources: Visit {}
impl<R: Visit + ?Sized> GraphResources for R {}

fn entry_of<T: Pod, M: Async<T>>(m: &M) -> (&Fence, (usize, usize), usize) {
    let base = m.fence_base();
    (
        m.async_fence(),
        (base, base + m.raw_len() * std::mem::size_of::<T>()),
        m.raw_ptr() as usize,
    )
}

impl<T: Pod, A: Allocation> Kept for OwnedBuffer<T, A> {
    fn entry(&self) -> (&Fence, (usize, usize), usize) {
        entry_of(self)
    }
}
impl<T: Pod> Kept for RegisteredVec<T> {
    fn entry(&self) -> (&Fence, (usize, usize), usize) {
        entry_of(self)
    }
}

impl<B: Kept + ?Sized> Visit for &mut B {
    fn visit<'s, F>(&'s self, f: &mut F)
    where
        F: FnMut(&'s Fence, (usize, usize), Access, usize),
    {
        let (fence, range, addr) = (**self).entry();
        f(fence, range, Access::Write, addr);
    }
    #[inline]
    fn marked<F: FnOnce() -> Result<()>>(&self, stream: &Stream, f: F) -> Result<()> {
        let (fence, range, _) = (**self).entry();
        let _use = fence.begin_checked(stream, range, Access::Write)?;
        f()
    }
}
impl<B: Kept + ?Sized> Visit for &B {
    fn visit<'s, F>(&'s self, f: &mut F)
    where
        F: FnMut(&'s Fence, (usize, usize), Access, usize),
    {
        let (fence, range, addr) = (**self).entry();
        f(fence, range, Access::Read, addr);
    }
    #[inline]
    fn marked<F: FnOnce() -> Result<()>>(&self, stream: &Stream, f: F) -> Result<()> {
        let (fence, range, _) = (**self).entry();
        let _use = fence.begin_checked(stream, range, Access::Read)?;
        f()
    }
}
impl Visit for () {
    fn visit<'s, F>(&'s self, _: &mut F)
    where
        F: FnMut(&'s Fence, (usize, usize), Access, usize),
    {
    }
    #[inline]
    fn marked<F: FnOnce() -> Result<()>>(&self, _: &Stream, f: F) -> Result<()> {
        f()
    }
}
impl<V: Visit> Visit for Vec<V> {
    fn visit<'s, F>(&'s self, f: &mut F)
    where
        F: FnMut(&'s Fence, (usize, usize), Access, usize),
    {
        self.iter().for_each(|v| v.visit(f));
    }
}
impl<V: Visit, const N: usize> Visit for [V; N] {
    fn visit<'s, F>(&'s self, f: &mut F)
    where
        F: FnMut(&'s Fence, (usize, usize), Access, usize),
    {
        self.iter().for_each(|v| v.visit(f));
    }
}

/// `Visit` for tuples: each member in turn (one trait, its impls for the arities); marked
/// nested, the first member's marks outermost.
macro_rules! visit_tuple {
    ($($n:ident . $i:tt),+) => {
        impl<$($n: Visit),+> Visit for ($($n,)+) {
            fn visit<'s, FN>(&'s self, f: &mut FN)
            where
                FN: FnMut(&'s Fence, (usize, usize), Access, usize),
            {
                $(self.$i.visit(f);)+
            }
            #[inline]
            fn marked<FN: FnOnce() -> Result<()>>(&self, stream: &Stream, f: FN) -> Result<()> {
                visit_tuple!(@nest self, stream, f; $($i)+)
            }
        }
    };
    (@nest $s:ident, $stream:ident, $f:ident; $i:tt $($rest:tt)*) => {
        $s.$i.marked($stream, || visit_tuple!(@nest $s, $stream, $f; $($rest)*))
    };
    (@nest $s:ident, $stream:ident, $f:ident;) => {
        $f()
    };
}
visit_tuple!(A.0);
visit_tuple!(A.0, B.1);
visit_tuple!(A.0, B.1, C.2);
visit_tuple!(A.0, B.1, C.2, D.3);
visit_tuple!(A.0, B.1, C.2, D.3, E.4);
visit_tuple!(A.0, B.1, C.2, D.3, E.4, F.5);
visit_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6);
visit_tuple!(A.0, B.1, C.2, D.3, E.4, F.5, G.6, H.7);

/// What identifies a buffer of the resources: its fence's address, its memory's address and
/// its byte range. (The fence alone is not enough: a buffer replaced in place through a `&mut`
/// resource, `*res.0 = other`, has a new fence at the old one's address, and other memory.)
type Identity = (usize, usize, (usize, usize));

/// The identities of the buffers of `r`, in visit order (plain addresses, for comparison
/// only, never dereferenced).
fn addresses<R: Visit + ?Sized>(r: &R) -> Vec<Identity> {
    let mut v = Vec::new();
    r.visit(&mut |f, range, _, addr| v.push((f as *const Fence as usize, addr, range)));
    v
}

/// Whether `r` still names exactly the buffers whose identities are `captured`, in order
/// (no allocation).
fn names_captured<R: Visit + ?Sized>(r: &R, captured: &[Identity]) -> bool {
    let mut i = 0;
    let mut same = true;
    r.visit(&mut |f, range, _, addr| {
        same &= captured.get(i) == Some(&(f as *const Fence as usize, addr, range));
        i += 1;
    });
    same && i == captured.len()
}

/// The fences of `r`, by address (stable while `r`'s borrows live).
fn fences<R: Visit + ?Sized>(r: &R) -> Vec<*const Fence> {
    let mut v = Vec::new();
    r.visit(&mut |f, _, _, _| v.push(f as *const Fence));
    v
}

/// The launches (and uploads) of an executable graph, as work on a one-byte "buffer", which
/// `synchronize`, `recapture`, `into_resources` and drop wait on.
///
/// (`repr(C)`, `marked_on` first: a launch in the steady state reads only that, beside the
/// other fields at the start of `GraphExec`.)
#[derive(Default)]
#[repr(C)]
struct Launches {
    /// The stream of the last launch marked on `fence` with no record on `fence` since, kept
    /// alive here (so that no other stream can have its address).
    marked_on: RefCell<Option<Arc<StreamInner>>>,
    fence: Fence,
}

impl Launches {
    /// Marks a launch about to be queued on `stream` (the caller made `Fence::check_queue`
    /// for it). `None` where the fence holds an unrecorded mark on this very stream already,
    /// which the next wait's record covers together with this launch: the last marked launch
    /// was on `stream` (the same stream object, kept alive by `marked_on`), no capture is
    /// open (so the capture checks of `begin_checked` are never skipped) and it is not the
    /// legacy stream (whose work each `Use` notes for the captures).
    ///
    /// Sound because only the owning `GraphExec`'s methods reach `fence`, one thread at a time
    /// (`GraphExec` is not `Sync`), and every call that may record on it clears `marked_on`
    /// first: the host waits below, and a marked launch on another stream (whose order after
    /// this stream's launches records here). So since that mark nothing was recorded on
    /// `fence`, and the event that the next wait records on `stream` comes after this launch
    /// is queued, and covers it as it covers the marked one.
    ///
    /// `open`: what the caller's handshake with capture begins ([`capture::InOp`], entered
    /// for `stream` and held until the launch is queued) read of the open-capture count: with
    /// no mark of its own (`None`), only that handshake keeps a capture begin on `stream` from
    /// taking the launch unseen.
    fn mark(&self, stream: &Stream, open: bool) -> Result<Option<Use<'_>>> {
        let inner = stream.inner();
        let plain = !open && !capture::is_legacy(inner);
        if plain
            && self
                .marked_on
                .borrow()
                .as_ref()
                .is_some_and(|m| Arc::ptr_eq(m, inner))
        {
            return Ok(None);
        }
        self.unmark();
        let u = self.fence.begin_checked(stream, (0, 1), Access::Write)?;
        if plain {
            *self.marked_on.borrow_mut() = Some(inner.clone());
        }
        Ok(Some(u))
    }

    /// Forgets the stream of the last unrecorded mark: the next mark is made on the fence. For
    /// every step that may record on the fence, or marks it otherwise (a launcher's hold).
    fn unmark(&self) {
        self.marked_on.borrow_mut().take();
    }

    /// Waits for every launch.
    fn host_wait(&self) -> Result<()> {
        self.unmark();
        self.fence.host_wait(Access::Write)
    }

    /// Waits for every launch, through the owner's exclusive borrow.
    fn host_wait_mut(&mut self) -> Result<()> {
        self.marked_on.get_mut().take();
        self.fence.host_wait_mut(Access::Write)
    }
}

/// Launches of a [`GraphExec`] on one stream, made by [`GraphExec::launcher`]: the
/// bookkeeping of a launch done once for all of them. Not `Send` (its stream's checks were made
/// on this thread).
pub struct Launcher<'e, R: GraphResources> {
    exec: &'e GraphExec<R>,
    stream: &'e Stream,
    /// The marks standing for every launch (the graph's own fence, then each buffer's); empty
    /// where launches take the checked path (see `GraphExec::launcher`).
    holds: Vec<Hold<'e>>,
    _not_send: PhantomData<*const ()>,
}

impl<R: GraphResources> std::fmt::Debug for Launcher<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Launcher({:?} on {:?})", self.exec, self.stream)
    }
}

impl<R: GraphResources> Launcher<'_, R> {
    /// Launches the graph on the launcher's stream (`cuGraphLaunch`, see
    /// [`GraphExec::launch`]). Returns at once.
    ///
    /// The host cost beyond the launch call, with no capture open: the handshake with
    /// capture begins (a store to this thread's slot and a load of the open-capture count),
    /// and nothing else. Otherwise [`GraphExec::launch`], with all its checks.
    pub fn launch(&mut self) -> Result<()> {
        let inner = self.stream.inner();
        if self.holds.is_empty() || inner.is_lent() {
            return self.exec.launch(self.stream);
        }
        let _g = inner.enter()?;
        let (op, open) = capture::InOp::enter(inner);
        if open {
            // A capture may take this launch: the checked path decides (after this handshake
            // ends; nothing was queued under it).
            drop(op);
            return self.exec.launch(self.stream);
        }
        // SAFETY: the resources' fences hold marks on this stream, made after ordering it
        // behind their pending work, in flight until the launcher (which borrows the graph
        // exclusively) drops; the handshake is held and read no capture open.
        let launched = unsafe { self.exec.raw_launch(self.stream) };
        drop(op);
        launched
    }

    /// Whether launches take the short path: when it was made no capture was open and no
    /// buffer was bound to one, on a stream of the crate's own that is not a legacy default
    /// stream.
    pub fn is_fast(&self) -> bool {
        !self.holds.is_empty()
    }
}

/// An open capture, as the closure of [`Stream::capture`] sees it.
pub struct Capture<'s> {
    stream: &'s Stream,
    mode: CaptureMode,
    /// Ended on the thread that began it.
    _not_send: PhantomData<*const ()>,
}

impl Capture<'_> {
    /// The capturing stream: queue the work to capture here (or on streams that the fence
    /// joins into the capture, by work on a buffer this stream's captured work used).
    pub fn stream(&self) -> &Stream {
        self.stream
    }

    /// The capture's mode.
    pub fn mode(&self) -> CaptureMode {
        self.mode
    }
}

impl std::fmt::Debug for Capture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Capture({:?}, {:?})", self.stream, self.mode)
    }
}

/// A `cudaGraph_t`, destroyed on drop.
struct RawGraph(sys::cudaGraph_t);

impl Drop for RawGraph {
    fn drop(&mut self) {
        // SAFETY: we own the handle and destroy it once; errors are ignored (drop). A graph
        // may be destroyed while executables made from it live.
        unsafe { sys::cudaGraphDestroy(self.0) };
    }
}

/// The misuse of capturing on the legacy default stream (CUDA refuses it).
pub(crate) const LEGACY_CAPTURE: &str =
    "the legacy default stream cannot be captured: capture on a stream of your own";
/// The misuse of keeping graph memory past the capture.
pub(crate) const GRAPH_MEMORY_KEPT: &str =
    "buffers allocated inside the capture outlive it: free them inside the closure (graph \
     memory is only valid inside its graph)";
/// The refusal of a launch (or upload) of an executable graph on a stream that is capturing:
/// the launch would become a child-graph node of the capture, whose graph would not keep this
/// graph's buffers (they stay borrowed by this one).
pub(crate) const GRAPH_INTO_CAPTURE: &str =
    "the stream is capturing: a graph launched there would become a node of the capture's graph, \
     which would not keep this graph's buffers; launch it after the capture ends, or capture its \
     work itself";
/// The misuse of swapping the resources (inside the capture's closure, or through
/// `GraphExec::resources_mut` before a launch).
pub(crate) const RESOURCES_CHANGED: &str =
    "the resources no longer name the buffers the graph captured (replaced inside the capture's \
     closure or through resources_mut): a graph must keep the buffers it captured; recapture \
     to use others";

/// A capture begun and not yet ended: ended (and its graph destroyed) on drop, for a closure
/// that panics.
struct Open {
    token: u64,
    origin: Arc<StreamInner>,
    /// The fences of the resources (alive and in place: the caller borrows them).
    fences: Vec<*const Fence>,
    ended: bool,
}

impl Open {
    /// Ends the capture: the fences are taken back, the streams the fence joined into the
    /// capture joined back into its origin, and the capture ended and unregistered. The graph
    /// (or the error that ended it), and the graph allocations left unfreed.
    fn end(&mut self) -> (Result<RawGraph>, usize) {
        self.ended = true;
        for &f in &self.fences {
            // SAFETY: the resources' borrows keep the fences alive and in place (see `fences`).
            unsafe { &*f }.unbind(self.token);
        }
        let mut joined = Ok(());
        let mut events = Vec::new();
        for j in capture::joined(self.token) {
            let r = (|| {
                let _relaxed = Relaxed::new();
                let ev = Event::on(Device::from_ordinal_unchecked(j.device()))?;
                ev.record_inner(&j)?;
                ev.wait_on_inner(&self.origin)?;
                events.push(ev);
                Ok(())
            })();
            joined = joined.and(r);
        }
        let mut g = ptr::null_mut();
        let _g = self.origin.enter();
        // SAFETY: a live stream (the caller borrows it) in capture; `g` a valid out-pointer.
        let code = unsafe { sys::cudaStreamEndCapture(self.origin.raw(), &mut g) };
        let allocs = capture::close(self.token);
        drop(events);
        let graph = (!g.is_null()).then_some(RawGraph(g));
        let r = check(code, || format!("cudaStreamEndCapture({:?})", self.origin))
            .and(joined)
            .and_then(|()| {
                graph
                    .ok_or_else(|| invalid_argument("Stream::capture", "the capture made no graph"))
            });
        (r, allocs)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.end();
        }
    }
}

/// Captures what `f` queues into a new graph, `res` given to the capture.
fn capture_into<R, F>(stream: &Stream, mode: CaptureMode, res: &mut R, f: F) -> Result<RawGraph>
where
    R: GraphResources + ?Sized,
    F: FnOnce(&Capture<'_>, &mut R) -> Result<()>,
{
    const OP: &str = "Stream::capture";
    let inner = stream.inner();
    if capture::is_legacy(inner) {
        return Err(invalid_argument(OP, LEGACY_CAPTURE));
    }
    inner.check_current(OP)?;
    let _g = inner.enter()?;
    let given = fences(res);
    let identities = addresses(res);
    let token = capture::begin(inner, mode.raw())?;
    let mut open = Open {
        token,
        origin: inner.clone(),
        fences: given,
        ended: false,
    };
    for &fence in &open.fences {
        // SAFETY: `res` borrows the buffers for this whole call: the fences live, in place.
        unsafe { &*fence }.bind(token)?;
    }
    let cap = Capture {
        stream,
        mode,
        _not_send: PhantomData,
    };
    let r = f(&cap, res);
    let same = names_captured(res, &identities);
    let (graph, allocs) = open.end();
    r?;
    let graph = graph?;
    if allocs > 0 {
        return Err(invalid_argument(OP, GRAPH_MEMORY_KEPT));
    }
    if !same {
        return Err(invalid_argument(OP, RESOURCES_CHANGED));
    }
    Ok(graph)
}

impl Stream {
    /// Captures the work `f` queues into a [`Graph`] (`cudaStreamBeginCapture` on this stream
    /// in `mode`, `cudaStreamEndCapture` when `f` returns, however it returns).
    ///
    /// `resources` are the buffers the graph's nodes use ([`GraphResources`]): `f` gets them
    /// back to queue work on, and the graph keeps them borrowed. Work on another stream that
    /// uses a buffer the captured work used is joined into the capture (an event recorded and
    /// waited for, as CUDA defines cross-stream capture), and joined back before the capture
    /// ends. Inside the capture:
    ///
    /// - captured work on a buffer not in `resources` is refused
    ///   ([`Misuse::InvalidArgument`](crate::Misuse::InvalidArgument)), as is host access to
    ///   a buffer in `resources`, synchronous copies and memsets, and work on the legacy
    ///   default stream: none of them invalidates the capture;
    /// - pool allocations on the capturing stream ([`DeviceBuffer::from_pool`](crate::DeviceBuffer::from_pool)) are graph
    ///   memory nodes, and their drop inside `f` a free node; graph memory kept past `f` is
    ///   refused when the capture ends, and the buffer refuses every later use (its memory
    ///   belongs to no live graph, and is leaked, never freed);
    /// - pending work on the resources from before the capture is not waited for: each launch
    ///   is ordered after it.
    ///
    /// Errors: `f`'s error (the capture is ended first, and its graph destroyed); a capture
    /// that CUDA invalidated gives `cudaErrorStreamCaptureInvalidated` from
    /// `cudaStreamEndCapture`, the capture ended and the streams usable again.
    pub fn capture<R, F>(&self, mode: CaptureMode, mut resources: R, f: F) -> Result<Graph<R>>
    where
        R: GraphResources,
        F: FnOnce(&Capture<'_>, &mut R) -> Result<()>,
    {
        let raw = capture_into(self, mode, &mut resources, f)?;
        Ok(Graph {
            raw,
            device: self.inner().device(),
            res: resources,
        })
    }

    /// Whether the stream is capturing (`cudaStreamIsCapturing`): `Some(true)` while a capture
    /// is open on it or has joined it, `Some(false)` while not, `None` after a capture that
    /// was invalidated and not yet ended.
    pub fn is_capturing(&self) -> Result<Option<bool>> {
        use sys::cudaStreamCaptureStatus as S;
        let _g = self.inner().enter()?;
        let mut status = S::cudaStreamCaptureStatusNone;
        // SAFETY: a live stream handle; a valid out-pointer.
        let code = unsafe { sys::cudaStreamIsCapturing(self.inner().raw(), &mut status) };
        check(code, || format!("cudaStreamIsCapturing({self:?})"))?;
        Ok(match status {
            S::cudaStreamCaptureStatusActive => Some(true),
            S::cudaStreamCaptureStatusNone => Some(false),
            _ => None,
        })
    }
}

/// A captured graph (`cudaGraph_t`) and the buffers it keeps borrowed; destroyed on drop.
/// [`instantiate`](Self::instantiate) it to launch it. `Send` when its resources are, not
/// `Sync` (CUDA graph objects are not internally synchronized).
pub struct Graph<R: GraphResources> {
    raw: RawGraph,
    device: i32,
    res: R,
}

// SAFETY: a graph handle may be used from any thread, one at a time (CUDA: graph objects are
// not internally synchronized, so `Graph` is not `Sync`); the resources move with it.
unsafe impl<R: GraphResources + Send> Send for Graph<R> {}

impl<R: GraphResources> std::fmt::Debug for Graph<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({:p} on device {})", self.raw.0, self.device)
    }
}

impl<R: GraphResources> Graph<R> {
    /// The executable graph (`cudaGraphInstantiate`), which keeps the resources.
    pub fn instantiate(self) -> Result<GraphExec<R>> {
        let _g = Device::from_ordinal_unchecked(self.device).guard()?;
        let mut exec = ptr::null_mut();
        // SAFETY: a live graph; a valid out-pointer; no flags.
        let code = unsafe { sys::cudaGraphInstantiate(&mut exec, self.raw.0, 0) };
        check(code, || format!("cudaGraphInstantiate({:p})", self.raw.0))?;
        Ok(GraphExec {
            exec,
            graph: self.raw,
            device: self.device,
            captured: addresses(&self.res),
            checked: Cell::new(true),
            res: self.res,
            launches: Launches::default(),
        })
    }

    /// The resources.
    pub fn resources(&self) -> &R {
        &self.res
    }

    /// The raw handle, for calls this crate does not wrap. Stays owned by `self`.
    pub fn as_raw(&self) -> sys::cudaGraph_t {
        self.raw.0
    }

    /// Destroys the graph and gives the resources back (never launched: nothing to wait for).
    pub fn into_resources(self) -> R {
        self.res
    }
}

/// An executable graph (`cudaGraphExec_t`) and the buffers it keeps borrowed: launch it on
/// any stream, as often as needed. Each launch is ordered after pending work on its buffers
/// and marked on their fences, so host access ([`resources_mut`](Self::resources_mut)) and
/// work through the crate wait for the launches. Dropping it waits for its launches, then
/// destroys it; forgetting it leaks it (its buffers' fences still hold its launches). `Send`
/// when its resources are, not `Sync`.
// `repr(C)` and aligned to a cache line, the fields a launch reads first: with resources of up
// to three references, `exec`, `checked`, `res` and the launches' `marked_on` are one line (a
// launch comes after a runtime call, a synchronize, that evicted them).
#[repr(C, align(64))]
pub struct GraphExec<R: GraphResources> {
    exec: sys::cudaGraphExec_t,
    /// Whether `res` was found to name the `captured` buffers since the last `&mut` access
    /// to it (see `check_resources`).
    checked: Cell<bool>,
    res: R,
    /// The launches.
    launches: Launches,
    graph: RawGraph,
    device: i32,
    /// The identities (fence, memory, range) of the buffers the executable graph's nodes use,
    /// in visit order: a launch is refused once the resources no longer name those buffers
    /// (swapped, or replaced in place, through `resources_mut`), since its uses would be
    /// marked on the wrong fences, and its nodes would use memory no fence here tracks.
    captured: Vec<Identity>,
}

// SAFETY: as for `Graph`: usable from any thread, one at a time.
unsafe impl<R: GraphResources + Send> Send for GraphExec<R> {}

impl<R: GraphResources> std::fmt::Debug for GraphExec<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GraphExec({:p} on device {})", self.exec, self.device)
    }
}

impl<R: GraphResources> GraphExec<R> {
    /// Launches the graph on `stream`, after ordering `stream` after conflicting pending work on
    /// the graph's buffers; the launch is marked on their fences. Returns at once. On the
    /// crate's own streams the launch calls the driver's `cuGraphLaunch` straight, as cudarc
    /// does (the runtime's `cudaGraphLaunch` wraps it, and costs more); the runtime's call
    /// where the driver refuses, which reports the error in the runtime's code.
    ///
    /// The host cost beyond the launch call, in the steady state of one stream (the same
    /// stream as the last launch, no other stream's work pending on the buffers, no capture
    /// open): for each buffer, the fence's lock-free path (two atomic read-modify-writes and
    /// no runtime call), and nothing else: no allocation, no lock, no runtime call.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let (_g, _op, open) = self.enter_queue("GraphExec::launch", stream)?;
        self.res.marked(stream, || {
            let _launch = self.launches.mark(stream, open)?;
            // SAFETY: the resources' fences order this launch after their pending work and
            // record it (`marked`: in flight until the launch is queued); the handshake is held.
            unsafe { self.raw_launch(stream) }
        })
    }

    /// What queueing the graph's work on `stream` begins with (`op` names it in refusals): the
    /// resources checked, the stream's device current, the stream checked, and the handshake
    /// with capture begins entered, for the whole call (a graph without resources whose
    /// launches' mark is skipped makes no other), with what it read of the open captures. A
    /// stream that is capturing is refused (`GRAPH_INTO_CAPTURE`).
    fn enter_queue(
        &self,
        op: &'static str,
        stream: &Stream,
    ) -> Result<(Option<DeviceGuard>, capture::InOp, bool)> {
        let (g, in_op, open) = self.enter(op, stream)?;
        if open && capture::capture_of(stream.inner()).is_some() {
            return Err(invalid_argument(op, GRAPH_INTO_CAPTURE));
        }
        Ok((g, in_op, open))
    }

    /// The checks every use of the graph on `stream` begins with (`op` names it in refusals):
    /// the resources, the stream's device made current, the stream, then the handshake with
    /// capture begins entered, with what it read of the open captures.
    fn enter(
        &self,
        op: &'static str,
        stream: &Stream,
    ) -> Result<(Option<DeviceGuard>, capture::InOp, bool)> {
        self.check_resources(op)?;
        let g = stream.inner().enter()?;
        Fence::check_queue(stream)?;
        let (in_op, open) = capture::InOp::enter(stream.inner());
        Ok((g, in_op, open))
    }

    /// The launch call of the graph on `stream`: the driver's `cuGraphLaunch` on the crate's own
    /// streams (where the runtime gave its entry point), else the runtime's `cudaGraphLaunch`,
    /// which also reports every failure (`handles::driver`).
    ///
    /// # Safety
    /// The resources' fences must hold this launch's marks on `stream` (made after ordering
    /// it behind their pending work) until it is queued, and the caller must hold the
    /// handshake with capture begins for `stream` (having read no capture on it). Then the
    /// nodes, which use only the resources (the capture refused other buffers, and graph
    /// memory is freed inside the graph), touch nothing that is freed, touched or waited past
    /// while they run.
    unsafe fn raw_launch(&self, stream: &Stream) -> Result<()> {
        let inner = stream.inner();
        // SAFETY: a live executable graph and stream; the rest as the caller guarantees.
        // (The driver's `cuGraphLaunch` on the crate's own streams, where the runtime gave it.)
        let code = unsafe { driver::graph_launch(self.exec, inner.raw(), inner.is_own()) };
        check(code, || {
            format!("cudaGraphLaunch({:p}, {stream:?})", self.exec)
        })
    }

    /// A [`Launcher`] of this graph on `stream`, for a replay loop: the marks that each
    /// [`launch`](Self::launch) makes on the buffers' fences and on the graph's own are made
    /// once, now, and end when the launcher drops; each [`Launcher::launch`] then checks that
    /// no stream capture is open and makes the launch call, nothing else.
    ///
    /// It borrows the executable graph exclusively: nothing can reach its buffers through it
    /// (host access, [`resources_mut`](Self::resources_mut), other work) while the launcher
    /// lives, and the buffers it keeps `&mut` nothing else can reach at all, so the marks made
    /// now stand for every launch through it. (Buffers kept `&` are only read by the graph;
    /// others may read them meanwhile.) Host access after it has dropped waits for all its
    /// launches.
    ///
    /// Forgetting it (`mem::forget`) is safe: the marks then stay in flight, as a leaked guard's
    /// do, so waits for the buffers record anew each time (they never block on it) until the
    /// buffers' owners next borrow them exclusively.
    ///
    /// On a legacy default stream, a stream lent to another library, or while a capture is
    /// open (at its making or at a launch), or a buffer is bound to one, its launches take
    /// [`launch`](Self::launch)'s path, with all its checks. (A `&` buffer that another
    /// thread's work gives up to a foreign capture meanwhile is still read by its launches:
    /// given-up memory is never freed, so reading it stays sound.)
    pub fn launcher<'e>(&'e mut self, stream: &'e Stream) -> Result<Launcher<'e, R>> {
        let this: &'e GraphExec<R> = self;
        // (A capturing stream is not refused here: its launches take `launch`'s path, which
        // refuses them.)
        let (_g, op, open) = this.enter("GraphExec::launcher", stream)?;
        let inner = stream.inner();
        let mut holds = Vec::new();
        let mut fast = !open && !capture::is_legacy(inner) && !inner.is_lent();
        if fast {
            // Marks made through a hold are recorded like any other; the launches' own fast
            // path must not count on an earlier unrecorded mark.
            this.launches.unmark();
            let mut failed = Ok(());
            let mut hold = |fence: &'e Fence, range, access| {
                if fast && failed.is_ok() {
                    match fence.hold_plain(&op, stream, range, access) {
                        Ok(Some(h)) => holds.push(h),
                        Ok(None) => fast = false,
                        Err(e) => failed = Err(e),
                    }
                }
            };
            hold(&this.launches.fence, (0, 1), Access::Write);
            this.res
                .visit(&mut |fence, range, access, _| hold(fence, range, access));
            // On error the holds made so far end (marks without work only add waiting).
            failed?;
            if !fast {
                holds.clear();
            }
        }
        drop(op);
        Ok(Launcher {
            exec: this,
            stream,
            holds,
            _not_send: PhantomData,
        })
    }

    /// Uploads the graph to the device ahead of its first launch (`cudaGraphUpload`).
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        // (The upload marks no resource: the handshake of `enter_queue` is its only one.)
        let (_g, _op, open) = self.enter_queue("GraphExec::upload", stream)?;
        let _launch = self.launches.mark(stream, open)?;
        // SAFETY: a live executable graph and stream.
        let code = unsafe { sys::cudaGraphUpload(self.exec, stream.inner().raw()) };
        check(code, || format!("cudaGraphUpload({:p})", self.exec))
    }

    /// Refuses a launch once the resources no longer name the buffers the graph captured
    /// (`RESOURCES_CHANGED`). They can change only through `&mut self` (`resources_mut`, which
    /// clears `checked`; `recapture`, which captures them anew), so the comparison is made
    /// once after each such borrow, not at every launch.
    fn check_resources(&self, op: &'static str) -> Result<()> {
        if !self.checked.get() {
            if !names_captured(&self.res, &self.captured) {
                return Err(invalid_argument(op, RESOURCES_CHANGED));
            }
            self.checked.set(true);
        }
        Ok(())
    }

    /// Waits for every launch.
    pub fn synchronize(&self) -> Result<()> {
        self.launches.host_wait()
    }

    /// The resources, for reads (host reads wait for launches that write them).
    pub fn resources(&self) -> &R {
        &self.res
    }

    /// The resources, to refill between launches: host access and work through the crate
    /// wait for (or are ordered after) the launches, and the next launch after them.
    pub fn resources_mut(&mut self) -> &mut R {
        // The next launch compares the resources with the captured buffers again.
        self.checked.set(false);
        &mut self.res
    }

    /// Captures the work of `f` again, with the same resources, and updates the executable
    /// graph in place where the topology is unchanged (`cudaGraphExecUpdate`): `Ok(true)`.
    /// Otherwise the graph is instantiated anew, after the launches so far: `Ok(false)`.
    pub fn recapture<F>(&mut self, stream: &Stream, mode: CaptureMode, f: F) -> Result<bool>
    where
        F: FnOnce(&Capture<'_>, &mut R) -> Result<()>,
    {
        let graph = capture_into(stream, mode, &mut self.res, f)?;
        let _g = Device::from_ordinal_unchecked(self.device).guard()?;
        let mut info = MaybeUninit::<sys::cudaGraphExecUpdateResultInfo>::zeroed();
        // SAFETY: live handles; `info` a valid out-pointer.
        let code = unsafe { sys::cudaGraphExecUpdate(self.exec, graph.0, info.as_mut_ptr()) };
        let updated = check(code, || format!("cudaGraphExecUpdate({:p})", self.exec));
        match updated {
            Ok(()) => {
                self.graph = graph;
                // Updated in place: its nodes now use the buffers just captured.
                self.captured = addresses(&self.res);
                self.checked.set(true);
                Ok(true)
            }
            Err(e)
                if e.code().map(|c| c.0)
                    == Some(sys::cudaError::cudaErrorGraphExecUpdateFailure.0) =>
            {
                let mut exec = ptr::null_mut();
                // SAFETY: a live graph; a valid out-pointer.
                let code = unsafe { sys::cudaGraphInstantiate(&mut exec, graph.0, 0) };
                check(code, || format!("cudaGraphInstantiate({:p})", graph.0))?;
                let old = std::mem::replace(&mut self.exec, exec);
                self.graph = graph;
                self.captured = addresses(&self.res);
                self.checked.set(true);
                if self.launches.host_wait_mut().is_ok() {
                    // SAFETY: the old executable's launches have completed; never used again.
                    unsafe { sys::cudaGraphExecDestroy(old) };
                }
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// The raw handle, for calls this crate does not wrap. Stays owned by `self`.
    pub fn as_raw(&self) -> sys::cudaGraphExec_t {
        self.exec
    }

    /// Waits for the launches, destroys the executable graph and gives the resources back.
    pub fn into_resources(self) -> Result<R> {
        let mut me = std::mem::ManuallyDrop::new(self);
        let waited = me.launches.host_wait_mut();
        if waited.is_ok() {
            // SAFETY: its launches have completed; never used again.
            unsafe { sys::cudaGraphExecDestroy(me.exec) };
        }
        // SAFETY: `me` is never used or dropped again; each remaining field is moved out or
        // dropped once.
        let (res, graph, launches, captured) = unsafe {
            (
                ptr::read(&me.res),
                ptr::read(&me.graph),
                ptr::read(&me.launches),
                ptr::read(&me.captured),
            )
        };
        drop((graph, launches, captured));
        waited.map(|()| res)
    }
}

impl<R: GraphResources> Drop for GraphExec<R> {
    fn drop(&mut self) {
        // Errors are ignored (drop never panics); when the launches cannot be waited for the
        // executable graph is leaked rather than destroyed under them.
        if self.launches.host_wait_mut().is_ok() {
            // SAFETY: we own the handle; its launches have completed.
            unsafe { sys::cudaGraphExecDestroy(self.exec) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::{Kept, Launches, Visit};
    use crate::fence::Fence;
    use crate::Stream;

    /// A stand-in stream handle that never reaches the runtime: not a default stream (no
    /// device check), and every fence here holds this one stream only, so nothing is ever
    /// recorded on it (and nothing waits: the fences are forgotten at the end).
    fn stand_in() -> Stream {
        // SAFETY: see above: the handle is only compared, never passed to the runtime.
        unsafe {
            Stream::from_raw(
                std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
                crate::Device::from_ordinal_unchecked(0),
            )
        }
    }

    /// A buffer as a graph keeps it, without memory.
    #[derive(Default)]
    struct Fake {
        fence: Fence,
    }

    impl Kept for Fake {
        fn entry(&self) -> (&Fence, (usize, usize), usize) {
            (&self.fence, (0, 4096), 0x10000)
        }
    }

    /// This thread's lock acquisitions by trackers since the last call.
    fn locks_since() -> usize {
        crate::fence::tracker::tests_hook::LOCKS.with(|c| c.replace(0))
    }

    /// One launch's bookkeeping, as `GraphExec::launch` makes it around `cudaGraphLaunch`:
    /// whether it marked the launches' fence.
    fn launch<R: Visit>(res: &R, launches: &Launches, s: &Stream) -> bool {
        Fence::check_queue(s).unwrap();
        let (_op, open) = crate::fence::capture::InOp::enter(s.inner());
        let marked = Cell::new(false);
        res.marked(s, || {
            marked.set(launches.mark(s, open)?.is_some());
            Ok(())
        })
        .unwrap();
        marked.get()
    }

    /// What a launch reads of its `GraphExec` in the steady state (the handle, `checked`, the
    /// resources, `marked_on`) is one cache line, for resources of up to three buffers (the
    /// launch comes after a synchronize that evicted it).
    #[test]
    fn a_launch_reads_one_line_of_its_graph_exec() {
        use std::mem::{align_of, offset_of, size_of};
        type Three<'a> = (
            &'a crate::PinnedBuffer<u8>,
            &'a mut crate::DeviceBuffer<u8>,
            &'a mut crate::DeviceBuffer<u8>,
        );
        type G<'a> = super::GraphExec<Three<'a>>;
        assert_eq!(align_of::<G<'_>>(), 64);
        assert_eq!(offset_of!(G<'_>, exec), 0);
        assert!(offset_of!(G<'_>, checked) < 64);
        assert!(offset_of!(G<'_>, res) + size_of::<Three<'_>>() <= 64);
        let marked_on = offset_of!(G<'_>, launches) + offset_of!(Launches, marked_on);
        assert!(marked_on + size_of::<std::cell::RefCell<Option<std::sync::Arc<u8>>>>() <= 64);
    }

    /// The steady state of replays on one stream takes no lock: the resources' fences take
    /// their lock-free path, and the launches' fence is not marked again (a re-mark, or a
    /// mark through `Fence::mark`, would take its lock every time). The first launch marks
    /// every fence, the launches' one included; a wait on the launches makes the next launch
    /// mark it anew (a launch after a wait left unmarked would be missed by the next wait
    /// and by drop). (One stream only: a second would make the fences record on the stand-in
    /// handle.)
    #[test]
    #[cfg_attr(
        miri,
        ignore = "forgets fences marked on a stand-in stream (their drop would call CUDA), which \
                  Miri's leak check reports"
    )]
    fn replays_on_one_stream_take_no_lock_and_mark_the_launches_once() {
        let s = stand_in();
        let (a, mut b, mut c) = (Fake::default(), Fake::default(), Fake::default());
        let res = (&a, &mut b, &mut c);
        let launches = Launches::default();
        assert!(
            launch(&res, &launches, &s),
            "the first launch was not marked"
        );
        assert_eq!(
            locks_since(),
            4,
            "three buffers and the launches, locked once each"
        );
        for _ in 0..100 {
            assert!(
                !launch(&res, &launches, &s),
                "a replay re-marked the launches"
            );
        }
        assert_eq!(locks_since(), 0, "the steady state took a lock");
        // A wait (here, its effect on the cache: the fence itself would record on the
        // stand-in stream) makes the next launch mark again.
        launches.marked_on.borrow_mut().take();
        assert!(
            launch(&res, &launches, &s),
            "a launch after a wait was not marked"
        );
        std::mem::forget((a, b, c, launches));
    }

    /// `Vec`s and arrays (the default `marked`) mark every buffer, of any number, nested in
    /// tuples too.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "forgets fences marked on a stand-in stream (their drop would call CUDA), which \
                  Miri's leak check reports"
    )]
    fn vecs_and_arrays_mark_every_buffer() {
        let s = stand_in();
        let mut many: Vec<Fake> = (0..20).map(|_| Fake::default()).collect();
        let two = [Fake::default(), Fake::default()];
        let res = (many.iter_mut().collect::<Vec<_>>(), [&two[0], &two[1]]);
        let launches = Launches::default();
        locks_since();
        assert!(launch(&res, &launches, &s));
        assert_eq!(locks_since(), 23, "a buffer was not marked");
        assert!(!launch(&res, &launches, &s));
        assert_eq!(locks_since(), 0);
        drop(res);
        std::mem::forget((many, two, launches));
    }

    /// A buffer whose fence refuses the work (here graph memory of an ended capture) fails
    /// the launch with the fence's exact error before anything is queued: the launch's
    /// closure never runs, in a tuple and in a `Vec` alike.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "forgets fences marked on a stand-in stream (their drop would call CUDA), which \
                  Miri's leak check reports"
    )]
    fn a_refused_mark_stops_the_launch_before_it_is_queued() {
        let s = stand_in();
        let (a, bad, c) = (Fake::default(), Fake::default(), Fake::default());
        bad.fence
            .bind(crate::fence::capture::GRAPH_MEMORY | 7)
            .unwrap();
        let expected = crate::error::invalid_argument(
            "queueing work",
            crate::fence::capture::GRAPH_MEMORY_ESCAPED,
        );
        let ran = Cell::new(false);
        let queue = || {
            ran.set(true);
            Ok(())
        };
        let e = (&a, &bad, &c).marked(&s, queue).unwrap_err();
        assert_eq!(e, expected);
        let e = vec![&a, &bad, &c].marked(&s, queue).unwrap_err();
        assert_eq!(e, expected);
        assert!(!ran.get(), "the launch was queued after a refused mark");
        std::mem::forget((a, bad, c));
    }
}
