//! Streams: ordered queues of asynchronous GPU work, each bound to one device.

use std::fmt;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, ThreadId};

use cuda_mem_sys as sys;

use crate::error::{check, check_call, clear_not_ready, Misuse, Result};
use crate::handles::devices::{Device, DeviceGuard};

/// `cudaStreamLegacy`: the legacy default stream of the current device, by name (also in
/// programs built with per-thread default streams, where the null handle means the
/// per-thread one; this crate's runtime calls are the legacy ones, so null is legacy here).
const LEGACY_HANDLE: usize = 1;
/// `cudaStreamPerThread`: the calling thread's per-thread default stream of the current
/// device: a different stream on every thread.
const PER_THREAD_HANDLE: usize = 2;

/// The shared part of a [`Stream`]: fences keep a clone, so that a stream whose buffers still
/// have work recorded on them is destroyed only once that bookkeeping is gone.
///
/// Aligned to a cache line, the fields every queued operation reads first (`repr(C)`): they
/// are one line, apart from the `Arc`'s counts (which only clones and drops touch).
#[repr(C, align(64))]
pub(crate) struct StreamInner {
    raw: sys::cudaStream_t,
    /// For a per-thread default stream (`cudaStreamPerThread`), the thread whose stream it
    /// is: the same handle names another stream on every other thread.
    thread: Option<ThreadId>,
    device: i32,
    /// Whether another library holds the stream too (a cudarc stream wrapped, or this stream
    /// lent to cudarc), so that it may begin a stream capture the crate does not know of: the
    /// fence then asks the runtime before queueing (`fence::Fence::check_queue`).
    lent: AtomicBool,
    /// Set once [`check_current`](Self::check_current) learnt that the process has one device
    /// (which stays so: see `sole_device`): the check then reads no other line.
    sole: AtomicBool,
    owned: bool,
    /// What keeps a borrowed handle valid, where this crate can hold it: another library's
    /// stream object (cudarc's `Arc<CudaStream>`), released with the last clone.
    _keeper: Option<Box<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: a cudaStream_t is a handle the runtime allows to be used from any thread, and
// concurrently from several (the runtime API is thread-safe); nothing here is thread-bound
// (the keeper is `Send + Sync` by its type).
unsafe impl Send for StreamInner {}
// SAFETY: only read after construction, and passed to thread-safe runtime calls.
unsafe impl Sync for StreamInner {}

impl StreamInner {
    /// A stream's shared part: `raw` on `device`, destroyed with the last clone when `owned`;
    /// `thread` for a per-thread default stream; `keeper` keeps a borrowed handle valid.
    fn new(
        raw: sys::cudaStream_t,
        owned: bool,
        device: i32,
        thread: Option<ThreadId>,
        keeper: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Arc<StreamInner> {
        Arc::new(StreamInner {
            raw,
            thread,
            device,
            lent: AtomicBool::new(keeper.is_some()),
            sole: AtomicBool::new(false),
            owned,
            _keeper: keeper,
        })
    }

    /// Bytes from the start to the end of the fields every queued operation reads (the
    /// layout test of `fence`).
    #[cfg(test)]
    pub(crate) fn hot_end() -> usize {
        use std::mem::{offset_of, size_of_val};
        let s = StreamInner::new(ptr::null_mut(), false, 0, None, None);
        [
            offset_of!(StreamInner, raw) + size_of_val(&s.raw),
            offset_of!(StreamInner, thread) + size_of_val(&s.thread),
            offset_of!(StreamInner, device) + size_of_val(&s.device),
            offset_of!(StreamInner, lent) + size_of_val(&s.lent),
            offset_of!(StreamInner, sole) + size_of_val(&s.sole),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }

    /// Notes that another library holds the stream too (see the field).
    #[cfg_attr(not(feature = "cudarc-unpinned"), allow(dead_code))]
    pub(crate) fn mark_lent(&self) {
        self.lent.store(true, Ordering::Relaxed);
    }

    /// Whether another library holds the stream too.
    #[inline]
    pub(crate) fn is_lent(&self) -> bool {
        self.lent.load(Ordering::Relaxed)
    }

    /// The handle to pass to the runtime on the calling thread. A per-thread default stream
    /// seen from another thread than its own cannot be named there (the handle would name that
    /// thread's stream): the legacy default stream of its device stands in, for the fence's
    /// records and a pooled buffer's free, which may run on any thread. The legacy stream
    /// waits for all earlier work of the device's blocking streams, every thread's per-thread
    /// stream included, so an event recorded there covers the per-thread stream's work, and
    /// work queued there comes after it. Queueing the caller's own work on another thread's
    /// per-thread stream is refused ([`check_current`](Self::check_current)).
    #[inline]
    pub(crate) fn raw(&self) -> sys::cudaStream_t {
        if self.is_foreign_per_thread() {
            LEGACY_HANDLE as sys::cudaStream_t
        } else {
            self.raw
        }
    }

    /// Whether this is a per-thread default stream of another thread than the calling one.
    #[inline]
    pub(crate) fn is_foreign_per_thread(&self) -> bool {
        self.thread.is_some_and(|t| t != current_thread())
    }

    pub(crate) fn device(&self) -> i32 {
        self.device
    }

    /// Whether this crate made the stream and destroys it with the last clone (not a borrowed
    /// handle, nor a default stream): only then can holding a clone keep the handle valid.
    #[cfg(feature = "cudarc-unpinned")]
    pub(crate) fn is_owned(&self) -> bool {
        self.owned
    }

    /// What keeps a borrowed handle valid (another library's stream object), if anything.
    #[cfg(feature = "cudarc-unpinned")]
    pub(crate) fn keeper(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        self._keeper.as_deref()
    }

    /// Whether this is a stream of its own, not the null, legacy or per-thread default
    /// stream's handle.
    #[inline]
    pub(crate) fn is_own(&self) -> bool {
        (self.raw as usize) > PER_THREAD_HANDLE
    }

    /// Makes the stream's device current for a runtime call, where the handle alone does not
    /// say which device it means: the null handle is the legacy default stream of whichever
    /// device is current. Owned streams carry their context, so they need nothing.
    #[inline]
    pub(crate) fn enter(&self) -> Result<Option<DeviceGuard>> {
        // The null, legacy and per-thread handles (0, 1, 2) all mean a stream of the current
        // device.
        if (self.raw as usize) <= PER_THREAD_HANDLE {
            self.enter_legacy()
        } else {
            Ok(None)
        }
    }

    /// `enter` for the legacy stream, out of line: the owned streams' path stays a test.
    #[inline(never)]
    fn enter_legacy(&self) -> Result<Option<DeviceGuard>> {
        // (The guard switches only when another device is current.)
        Device::from_ordinal_unchecked(self.device)
            .guard()
            .map(Some)
    }

    /// Refuses work queued on a legacy or per-thread default stream of another device than
    /// the current one (the runtime would queue it on the current device's stream instead),
    /// and work queued on a per-thread default stream from another thread than its own (the
    /// handle would name that thread's stream).
    ///
    /// On the hot path of every queued operation: a test for streams this crate made or
    /// borrowed (only the default streams have a thread, see `per_thread_on`), and for the
    /// default streams no runtime call where the process has one device (see
    /// [`current_ordinal`](crate::handles::devices::current_ordinal)), nor any read beyond
    /// this stream's line once that is known here.
    #[inline]
    pub(crate) fn check_current(&self, op: &'static str) -> Result<()> {
        if (self.raw as usize) <= PER_THREAD_HANDLE {
            let current = if self.sole.load(Ordering::Relaxed) {
                0
            } else {
                self.current_ordinal()
            };
            if current != self.device || self.is_foreign_per_thread() {
                return self.refuse(op, current);
            }
        }
        Ok(())
    }

    /// The current device, as [`check_current`](Self::check_current) asks it until it knows
    /// the process has one device; then notes that in `sole` (one device stays one device,
    /// and device 0 is then every thread's current device).
    #[inline(never)]
    fn current_ordinal(&self) -> i32 {
        let current = crate::handles::devices::current_ordinal();
        if crate::handles::devices::sole_device() {
            self.sole.store(true, Ordering::Relaxed);
        }
        current
    }

    /// [`check_current`](Self::check_current)'s refusal, out of line.
    #[cold]
    #[inline(never)]
    fn refuse(&self, op: &'static str, current: i32) -> Result<()> {
        crate::handles::devices::require_same(op, self.device, current)?;
        Err(Misuse::InvalidArgument {
            op,
            reason: "the stream is another thread's per-thread default stream \
                     (cudaStreamPerThread names a different stream on every thread): \
                     queue work on it from the thread that made it"
                .to_string(),
        }
        .into())
    }

    /// Whether two handles name the same stream: the same handle on the same device (the
    /// legacy default stream is one per device) and, for per-thread default streams, of the
    /// same thread.
    pub(crate) fn same(a: &StreamInner, b: &StreamInner) -> bool {
        a.raw == b.raw && a.device == b.device && a.thread == b.thread
    }
}

impl fmt::Debug for StreamInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {:p} on device {}", self.raw, self.device)?;
        match self.thread {
            Some(t) => write!(f, " (per-thread default stream of {t:?})"),
            None => Ok(()),
        }
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we own the handle and destroy it once, when the last clone goes. Errors
            // (cudaErrorCudartUnloading at exit, a sticky context error) are ignored: drop
            // must not panic.
            unsafe { sys::cudaStreamDestroy(self.raw) };
        }
    }
}

/// A CUDA stream on one device, destroyed on drop. The legacy default (null) stream
/// ([`Stream::legacy_default`]) is never destroyed.
///
/// A stream knows its device: the fence events that track work on it are created there. Work
/// queued on a stream may touch memory of another device only where CUDA allows it (peer
/// access); the runtime reports what it refuses.
///
/// Destroying a stream with work still queued is allowed: the runtime releases it once that
/// work completes, so dropping never blocks on it. Buffers that have work recorded on the stream
/// keep the handle alive until they no longer need it.
// `repr(transparent)`: a fence's stream handle (an `Arc<StreamInner>`) is lent out as a
// `&Stream` (`from_inner_ref`).
#[repr(transparent)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({:?})", self.inner)
    }
}

impl Stream {
    /// A new stream on the current device that synchronizes with the legacy default stream
    /// (`cudaStreamCreateWithFlags(cudaStreamDefault)`).
    pub fn new() -> Result<Self> {
        Self::with_flags(sys::cudaStreamDefault, "cudaStreamCreate(DEFAULT)")
    }

    /// A new stream on the current device that does not synchronize with the legacy default
    /// stream (`cudaStreamNonBlocking`).
    pub fn non_blocking() -> Result<Self> {
        Self::with_flags(sys::cudaStreamNonBlocking, "cudaStreamCreate(NON_BLOCKING)")
    }

    /// A new stream on `device` (made current for the call only); `non_blocking` as
    /// [`Stream::non_blocking`].
    pub fn on(device: Device, non_blocking: bool) -> Result<Self> {
        let _g = device.guard()?;
        if non_blocking {
            Self::non_blocking()
        } else {
            Self::new()
        }
    }

    fn with_flags(flags: u32, call: &'static str) -> Result<Self> {
        let device = Device::current()?.ordinal();
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; flags are one of the two documented values.
        let code = unsafe { sys::cudaStreamCreateWithFlags(&mut raw, flags) };
        check_call(code, call)?;
        Ok(Stream {
            inner: StreamInner::new(raw, true, device, None, None),
        })
    }

    /// Borrows a stream that another library owns (PyTorch, cuBLAS, cudarc, C++ code), for use
    /// wherever a `Stream` goes; it is never destroyed here. `device` is the device it belongs
    /// to. The null handle and `cudaStreamLegacy` (`0x1`) are that device's legacy default
    /// stream ([`legacy_default`](Self::legacy_default)); `cudaStreamPerThread` (`0x2`) is the
    /// *calling thread's* per-thread default stream on `device`
    /// ([`per_thread`](Self::per_thread)): each thread's is a stream of its own. For cudarc's
    /// streams, the `cudarc` feature's `interop::cudarc::stream` does the same safely, keeping
    /// cudarc's handle alive as long as needed.
    ///
    /// # Safety
    /// `raw` must be a valid stream of `device` until the returned value *and every buffer
    /// that queued work on it through this crate* are dropped or synchronized (`synchronize`,
    /// or a host access that waits for that work): buffers record events on their streams
    /// lazily, when someone waits, so they may still use the handle after its last use here.
    pub unsafe fn from_raw(raw: sys::cudaStream_t, device: Device) -> Self {
        match raw as usize {
            0 | LEGACY_HANDLE => return Self::legacy_on(device.ordinal()),
            PER_THREAD_HANDLE => return Self::per_thread_on(device.ordinal()),
            _ => {}
        }
        Stream {
            inner: StreamInner::new(raw, false, device.ordinal(), None, None),
        }
    }

    /// The calling thread's per-thread default stream of the current device
    /// (`cudaStreamPerThread`, what code built with `--default-stream per-thread` uses for
    /// the null stream): a blocking stream of its own on every thread, which synchronizes with
    /// the legacy default stream but not with other threads' per-thread streams. Never
    /// destroyed here.
    ///
    /// It is this thread's stream: work queued on it from another thread is refused
    /// ([`Misuse::InvalidArgument`]). Buffers that used it may be waited for, dropped and freed
    /// from any thread: the crate then names the stream through the legacy default stream of
    /// its device, which waits for every blocking stream's earlier work. A thread that took
    /// its per-thread stream here drains it when it exits (threads exiting with work queued
    /// there hung in the runtime on the H200).
    pub fn per_thread() -> Result<Self> {
        Ok(Self::per_thread_on(Device::current()?.ordinal()))
    }

    /// The calling thread's per-thread default stream of device `device`.
    fn per_thread_on(device: i32) -> Self {
        DrainAtExit::note(device);
        Stream {
            inner: StreamInner::new(
                PER_THREAD_HANDLE as sys::cudaStream_t,
                false,
                device,
                Some(current_thread()),
                None,
            ),
        }
    }

    /// A borrowed stream whose handle `keeper` keeps valid (another library's stream object):
    /// held by every clone, so also by the fences that may record on the stream later.
    #[cfg(feature = "cudarc-unpinned")]
    pub(crate) fn kept_alive_by(
        raw: sys::cudaStream_t,
        device: Device,
        keeper: Box<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        Stream {
            inner: StreamInner::new(raw, false, device.ordinal(), None, Some(keeper)),
        }
    }

    /// The legacy default (null) stream of the current device (device 0 when the runtime
    /// cannot say). Not destroyed on drop.
    ///
    /// The runtime has one per device, and the null handle means the one of whichever device
    /// is current: work queued through this crate on a legacy stream while another device is
    /// current is refused ([`Misuse::DeviceMismatch`](crate::Misuse::DeviceMismatch)), and the fence's own calls on it make
    /// its device current first.
    pub fn legacy_default() -> Self {
        Self::legacy_on(crate::handles::devices::current_ordinal())
    }

    /// The legacy default stream of device `device` (the caller knows it exists). One shared
    /// handle per device (for the first 64): synchronous copies and memsets make one every
    /// call, and fences then recognise it by pointer.
    pub(crate) fn legacy_on(device: i32) -> Self {
        static LEGACY: [OnceLock<Arc<StreamInner>>; 64] = [const { OnceLock::new() }; 64];
        let make = || StreamInner::new(ptr::null_mut(), false, device, None, None);
        let inner = match usize::try_from(device).ok().and_then(|d| LEGACY.get(d)) {
            Some(slot) => slot.get_or_init(make).clone(),
            None => make(),
        };
        Stream { inner }
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> Device {
        Device::from_ordinal_unchecked(self.inner.device)
    }

    /// Waits until all work queued on the stream has completed.
    pub fn synchronize(&self) -> Result<()> {
        sync_stream(&self.inner)
    }

    /// Whether all queued work has completed, without waiting. A not-ready answer leaves the
    /// runtime's last-error state clean (`cudaSuccess`).
    pub fn is_idle(&self) -> Result<bool> {
        self.inner
            .check_current("Stream::is_idle (of a per-thread default stream)")?;
        let _g = self.inner.enter()?;
        // SAFETY: `raw` is a live stream handle (or the null stream, of the device made
        // current above).
        let code = unsafe { sys::cudaStreamQuery(self.inner.raw) };
        if clear_not_ready(code) {
            return Ok(false);
        }
        check(code, || format!("cudaStreamQuery({:p})", self.inner.raw)).map(|()| true)
    }

    /// The raw handle, for calls this crate does not wrap. Stays owned by `self`. (For a
    /// per-thread default stream, `cudaStreamPerThread`: it names this stream on its own
    /// thread only.)
    pub fn as_raw(&self) -> sys::cudaStream_t {
        self.inner.raw
    }

    pub(crate) fn inner(&self) -> &Arc<StreamInner> {
        &self.inner
    }

    /// Another handle to the same stream (`measure::PoolPair` keeps one, as a pooled buffer's
    /// fence does).
    #[cfg(feature = "measure")]
    pub(crate) fn from_inner(inner: Arc<StreamInner>) -> Stream {
        Stream { inner }
    }

    /// A stream handle held as its shared part (a pooled buffer's allocation stream, which its
    /// fence keeps), seen as a `Stream`.
    pub(crate) fn from_inner_ref(inner: &Arc<StreamInner>) -> &Stream {
        // SAFETY: `Stream` is `repr(transparent)` over its one field, an `Arc<StreamInner>`,
        // so the two have the same layout and validity; the reference keeps `inner`'s
        // lifetime, and a `&Stream` allows nothing a `&Arc<StreamInner>` does not (dropping
        // needs ownership).
        unsafe { &*(inner as *const Arc<StreamInner>).cast::<Stream>() }
    }
}

/// The devices (the first 64) whose per-thread default stream this thread took through
/// [`Stream::per_thread`] (or `from_raw(cudaStreamPerThread, ..)`): drained when the thread
/// exits, before the runtime's own thread-exit handling runs. On the H200 (driver 580), two
/// threads that exited at once with work still queued on their per-thread streams hung in
/// that handling (the randomized model test, `tests/tests/random`); threads that had
/// synchronized their per-thread streams first did not. Rust's thread-local destructors run
/// before those of the C runtime's thread-specific data, where the CUDA runtime keeps its
/// per-thread state.
struct DrainAtExit(std::cell::Cell<u64>);

thread_local! {
    static DRAIN_AT_EXIT: DrainAtExit = const { DrainAtExit(std::cell::Cell::new(0)) };
}

impl DrainAtExit {
    /// Notes that this thread uses its per-thread stream of `device`.
    fn note(device: i32) {
        if let Ok(d) = u32::try_from(device) {
            if d < 64 {
                // (Fails only while the thread is exiting: then it drains what it noted.)
                let _ = DRAIN_AT_EXIT.try_with(|m| m.0.set(m.0.get() | 1 << d));
            }
        }
    }
}

impl Drop for DrainAtExit {
    fn drop(&mut self) {
        let mask = self.0.get();
        if mask == 0 {
            return;
        }
        // Errors are ignored (drop never panics): at process exit the runtime may be unloading
        // already, and then there is nothing left to drain. The thread's current device is
        // given back afterwards, for thread-local destructors that run after this one.
        let mut before = 0;
        // SAFETY: a valid out-pointer.
        let known = unsafe { sys::cudaGetDevice(&mut before) } == sys::cudaError::cudaSuccess;
        for d in (0..64).filter(|d| mask & 1 << d != 0) {
            // SAFETY: plain runtime calls with a device ordinal this thread used and the
            // per-thread stream's handle, on this (still running) thread.
            unsafe {
                if sys::cudaSetDevice(d) == sys::cudaError::cudaSuccess {
                    sys::cudaStreamSynchronize(PER_THREAD_HANDLE as sys::cudaStream_t);
                }
            }
        }
        if known {
            // SAFETY: a device ordinal the runtime reported current on this thread.
            unsafe { sys::cudaSetDevice(before) };
        }
    }
}

/// The calling thread's id, kept per thread: `thread::current()` takes a reference to the
/// thread's handle (an atomic increment and decrement on threads that Rust did not start
/// first), on every runtime call naming a per-thread default stream (`StreamInner::raw`).
fn current_thread() -> ThreadId {
    thread_local! {
        static ME: std::cell::Cell<Option<ThreadId>> = const { std::cell::Cell::new(None) };
    }
    // (While the thread's locals are being destroyed: asked anew.)
    ME.try_with(|me| match me.get() {
        Some(id) => id,
        None => {
            let id = thread::current().id();
            me.set(Some(id));
            id
        }
    })
    .unwrap_or_else(|_| thread::current().id())
}

/// `cudaStreamSynchronize`; for another thread's per-thread default stream, which cannot be
/// named here, `cudaDeviceSynchronize` of its device (the rare fallback of a fence whose event
/// record failed, or `Stream::synchronize` from another thread).
pub(crate) fn sync_stream(s: &StreamInner) -> Result<()> {
    let _g = s.enter()?;
    if s.is_foreign_per_thread() {
        // SAFETY: no arguments; the stream's device was made current above.
        return check(unsafe { sys::cudaDeviceSynchronize() }, || {
            format!("cudaDeviceSynchronize (for {s:?})")
        });
    }
    // SAFETY: `raw` is a live stream handle (kept alive by the caller's borrow), or null (of
    // the device made current above).
    check(unsafe { sys::cudaStreamSynchronize(s.raw()) }, || {
        format!("cudaStreamSynchronize({:p})", s.raw)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    /// A per-thread default stream is its own thread's only: queueing on it from another
    /// thread is refused with the exact misuse, before any runtime call that could queue (the
    /// thread's id is kept per thread: a cache shared by threads would let the other thread
    /// through, or refuse the owner).
    #[test]
    #[cfg_attr(miri, ignore = "calls the CUDA runtime, which Miri cannot run")]
    fn another_threads_per_thread_stream_is_refused_and_the_owners_is_not() {
        let s = Stream::per_thread_on(0);
        let op = "queueing work";
        assert!(!s.inner().is_foreign_per_thread());
        if Device::count().is_err() {
            // Without a driver the current device reads as 0: the device check passes.
            assert_eq!(s.inner().check_current(op), Ok(()));
        }
        let inner = s.inner().clone();
        let (foreign, refused) = thread::spawn(move || {
            let foreign = inner.is_foreign_per_thread();
            (foreign, inner.check_current(op))
        })
        .join()
        .unwrap();
        assert!(
            foreign,
            "another thread's per-thread stream was seen as its own"
        );
        match refused {
            Err(Error::Misuse(Misuse::InvalidArgument { op: o, reason })) => {
                assert_eq!(o, op);
                assert!(reason.contains("another thread's per-thread default stream"));
            }
            // With several devices the other thread's current device may differ first.
            Err(Error::Misuse(Misuse::DeviceMismatch { .. })) if Device::count().is_ok() => {}
            r => panic!("not refused as another thread's stream: {r:?}"),
        }
        assert!(
            !s.inner().is_foreign_per_thread(),
            "the owner lost its stream"
        );
    }
}
