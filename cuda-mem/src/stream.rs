//! Streams: ordered queues of asynchronous GPU work, each bound to one device.

use std::fmt;
use std::ptr;
use std::sync::{Arc, OnceLock};

use cuda_mem_sys as sys;

use crate::devices::{Device, DeviceGuard};
use crate::error::{check, check_call, clear_not_ready, Result};

/// The shared part of a [`Stream`]: fences keep a clone, so that a stream whose buffers still
/// have work recorded on them is destroyed only once that bookkeeping is gone.
pub(crate) struct StreamInner {
    raw: sys::cudaStream_t,
    owned: bool,
    device: i32,
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
    pub(crate) fn raw(&self) -> sys::cudaStream_t {
        self.raw
    }

    pub(crate) fn device(&self) -> i32 {
        self.device
    }

    /// Makes the stream's device current for a runtime call, where the handle alone does not
    /// say which device it means: the null handle is the legacy default stream of whichever
    /// device is current. Owned streams carry their context, so they need nothing.
    #[inline]
    pub(crate) fn enter(&self) -> Result<Option<DeviceGuard>> {
        if self.raw.is_null() {
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

    /// Refuses work queued on a legacy default stream of another device than the current one:
    /// the runtime would queue it on the current device's legacy stream instead.
    pub(crate) fn check_current(&self, op: &'static str) -> Result<()> {
        if self.raw.is_null() {
            crate::devices::require_same(op, self.device, crate::devices::current_ordinal())?;
        }
        Ok(())
    }

    /// Whether two handles name the same stream: the same handle on the same device (the
    /// legacy default stream is one per device).
    pub(crate) fn same(a: &StreamInner, b: &StreamInner) -> bool {
        a.raw == b.raw && a.device == b.device
    }
}

impl fmt::Debug for StreamInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {:p} on device {}", self.raw, self.device)
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
            inner: Arc::new(StreamInner {
                raw,
                owned: true,
                device,
                _keeper: None,
            }),
        })
    }

    /// Borrows a stream that another library owns (PyTorch, cuBLAS, cudarc, C++ code), for use
    /// wherever a `Stream` goes; it is never destroyed here. `device` is the device it belongs
    /// to (a null handle is that device's legacy default stream). For cudarc's streams, the
    /// `cudarc` feature's `interop::cudarc::stream` does the same safely, keeping cudarc's
    /// handle alive as long as needed.
    ///
    /// # Safety
    /// `raw` must be a valid stream of `device` until the returned value *and every buffer
    /// that queued work on it through this crate* are dropped or synchronized (`synchronize`,
    /// or a host access that waits for that work): buffers record events on their streams
    /// lazily, when someone waits, so they may still use the handle after its last use here.
    pub unsafe fn from_raw(raw: sys::cudaStream_t, device: Device) -> Self {
        Stream {
            inner: Arc::new(StreamInner {
                raw,
                owned: false,
                device: device.ordinal(),
                _keeper: None,
            }),
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
            inner: Arc::new(StreamInner {
                raw,
                owned: false,
                device: device.ordinal(),
                _keeper: Some(keeper),
            }),
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
        Self::legacy_on(crate::devices::current_ordinal())
    }

    /// The legacy default stream of device `device` (the caller knows it exists). One shared
    /// handle per device (for the first 64): synchronous copies and memsets make one every
    /// call, and fences then recognise it by pointer.
    pub(crate) fn legacy_on(device: i32) -> Self {
        static LEGACY: [OnceLock<Arc<StreamInner>>; 64] = [const { OnceLock::new() }; 64];
        let make = || {
            Arc::new(StreamInner {
                raw: ptr::null_mut(),
                owned: false,
                device,
                _keeper: None,
            })
        };
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
        let _g = self.inner.enter()?;
        // SAFETY: `raw` is a live stream handle (or the null stream, of the device made
        // current above).
        let code = unsafe { sys::cudaStreamQuery(self.inner.raw) };
        if clear_not_ready(code) {
            return Ok(false);
        }
        check(code, || format!("cudaStreamQuery({:p})", self.inner.raw)).map(|()| true)
    }

    /// The raw handle, for calls this crate does not wrap. Stays owned by `self`.
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

/// `cudaStreamSynchronize`.
pub(crate) fn sync_stream(s: &StreamInner) -> Result<()> {
    let _g = s.enter()?;
    // SAFETY: `raw` is a live stream handle (kept alive by the caller's borrow), or null (of
    // the device made current above).
    check(unsafe { sys::cudaStreamSynchronize(s.raw) }, || {
        format!("cudaStreamSynchronize({:p})", s.raw)
    })
}
