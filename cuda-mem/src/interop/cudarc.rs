//! [cudarc](https://docs.rs/cudarc) 0.19 and cuda-mem in one program (feature `cudarc`):
//! cuda-mem memory as arguments of cudarc kernel launches and cudarc copies, and cudarc memory
//! (`CudaSlice`, `CudaView`, `CudaViewMut`) in cuda-mem copies, memsets and kernels.
//!
//! # Setup
//!
//! ```toml
//! [dependencies]
//! cuda-mem = { version = "0.1", features = ["cudarc"] }
//! # `nvrtc`: `CudaContext::load_module` and `Ptx` (PTX text needs no libnvrtc at run time).
//! cudarc = { version = "0.19.10", default-features = false, features = ["std", "driver", "nvrtc"] }
//! ```
//!
//! cuda-mem's `cudarc` feature turns on what it needs of cudarc: `driver`, loading libcuda at
//! run time (`fallback-dynamic-loading`), the CUDA 12.0 bindings (`cuda-12000`) and `nvrtc`;
//! the application's own line above names the crate so that it can use its types.
//!
//! The entry points that start from cuda-mem values ([`context`], [`cudarc_stream`],
//! [`Launch::on`]) check for the driver first and return an [`Error`] where cudarc would
//! panic for want of libcuda; the others take cudarc objects, which only a loaded libcuda can
//! have made. cudarc's `DriverError` converts into [`Error`] (`?`).
//!
//! # Launching kernels: [`Launch`]
//!
//! One stream, given once; one guard per buffer argument, taken for that stream; the launch
//! on it. The guards end after the launch, so every buffer records the kernel; the only
//! promise left to the `unsafe` launch is the kernel's own (parameters that match, accesses in
//! bounds, writes only to `arg_out` memory):
//!
//! ```no_run
//! use cudarc::driver::LaunchConfig;
//! use cudarc::nvrtc::Ptx;
//! use cuda_mem::interop::cudarc::{context, Launch};
//! use cuda_mem::{Device, DeviceBuffer, Stream};
//! # const PTX: &str = "";
//! # fn main() -> cuda_mem::Result<()> {
//! let f = context(Device::get(0)?)?.load_module(Ptx::from_src(PTX))?.load_function("double")?;
//! let s = Stream::legacy_default();                        // any cuda-mem stream, or cudarc's
//! let x = DeviceBuffer::from_slice(&[1u32, 2, 3])?;
//! let mut y = DeviceBuffer::<u32>::zeroed(3)?;
//! // SAFETY: `double(const u32* x, u32* y, u32 n)` writes y[i] = 2 * x[i] for i < n.
//! unsafe { Launch::on(&s, &f, LaunchConfig::for_num_elems(3))?.arg_in(&x).arg_out(&mut y).arg(&3u32).launch()? };
//! assert_eq!(y.to_vec()?, [2, 4, 6]);
//! # Ok(()) }
//! ```
//!
//! [`cudarc_stream`] lends cudarc any cuda-mem stream (blocking ones and the legacy default
//! stream included, which cudarc cannot make), kept alive while cudarc holds it;
//! [`stream`] goes the other way.
//!
//! # Two fences, both honoured
//!
//! Each side keeps its own record of the work pending on its memory. cuda-mem's buffers carry a
//! fence that orders a stream after conflicting work and records the work queued while a
//! [`DevicePtr`] guard lives; a cudarc `CudaSlice` carries a read and a write event, which
//! cudarc's `DevicePtr::device_ptr` makes a stream wait for and whose `SyncOnDrop` records
//! after the work. Crossing over keeps both:
//!
//! - **cuda-mem memory in cudarc work**: [`CudarcPtr::cudarc_ptr`] and
//!   [`CudarcPtrMut::cudarc_ptr_mut`] are cuda-mem's guards for a cudarc stream
//!   ([`CudarcRead`], [`CudarcWrite`]): they order that stream after the buffer's conflicting
//!   work, record the work on the buffer when they drop, and go wherever cudarc takes memory:
//!   as kernel arguments (`builder.arg(&guard)`) and through cudarc's own `DevicePtr` /
//!   `DevicePtrMut` traits (`stream.memcpy_dtod(&guard, &mut slice)`). The plain guards of
//!   [`DevicePtr`] / [`DevicePtrMut`] taken on a [`stream`] of cudarc's are kernel arguments
//!   too.
//! - **cudarc memory in cuda-mem work**: [`CudarcView::with`] and [`CudarcViewMut::with`]
//!   take cudarc memory for one cudarc stream through cudarc's own `device_ptr` /
//!   `device_ptr_mut` (so the stream waits for cudarc's pending writes, or reads and writes),
//!   and lend a closure a view of it that is cuda-mem memory: [`copy_async`](crate::copy_async),
//!   [`copy`](crate::copy), [`memset_async`](crate::memset_async), views, guards. When the
//!   closure is done (returned, failed or panicked), everything queued through the view is
//!   behind the end of that stream, where cudarc's `SyncOnDrop` records its event and where
//!   the memory's own stream (which frees it) waits. The views are scoped (like
//!   `std::thread::scope`), not values with a destructor, because that end is what keeps cudarc
//!   from reusing or freeing memory that cuda-mem work still reads or writes, and a value may
//!   be passed to `mem::forget`.
//!
//! ```no_run
//! use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
//! use cudarc::nvrtc::Ptx;
//! use cuda_mem::interop::cudarc::{context, CudarcPtr, CudarcView};
//! use cuda_mem::{copy_async, Device, DeviceBuffer, HostAllocFlags, PinnedBuffer};
//! # const PTX: &str = "";
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = context(Device::get(0)?)?;                     // cudarc's CudaContext::new(0)
//! let cs = ctx.new_stream()?;                              // a cudarc stream
//! let f = ctx.load_module(Ptx::from_src(PTX))?.load_function("double")?;
//! let x = DeviceBuffer::from_slice(&[1u32, 2, 3])?;        // cuda-mem memory
//! let mut y: CudaSlice<u32> = cs.alloc_zeros(3)?;          // cudarc memory
//! {
//!     let xr = x.cudarc_ptr(&cs)?;                         // orders `cs` after writes to x
//!     let mut launch = cs.launch_builder(&f);
//!     launch.arg(&xr).arg(&mut y).arg(&3u32);              // y: cudarc orders and records it
//!     // SAFETY: `double(const u32*, u32*, u32)` reads and writes 3 elements, on `cs`.
//!     unsafe { launch.launch(LaunchConfig::for_num_elems(3))? };
//! }                                                        // xr records the launch on x
//! let mut host = PinnedBuffer::<u32>::zeroed(3, HostAllocFlags::DEFAULT)?;
//! CudarcView::with(&y, &cs, |view| {                       // waits for cudarc's write of y
//!     copy_async(&mut host, view, view.stream())
//! })?;                                                     // y's read event covers the copy
//! assert_eq!(host.as_slice()?, &[2, 4, 6]);                // waits for the copy
//! # Ok(()) }
//! ```
//!
//! # Rules
//!
//! - cudarc's context must be its device's **primary context** (`CudaContext::new`, or
//!   [`context`], which returns an error where cudarc would panic for want of a driver): the
//!   CUDA runtime, and so cuda-mem, works in primary contexts. Others are refused
//!   ([`Misuse::InvalidArgument`]).
//! - Launching through cudarc's builder is `unsafe` (`LaunchArgs::launch`), and its caller
//!   promises what cuda-mem's guards require: the launch is on the guard's stream, while the
//!   guard lives (see [`DevicePtr`]). [`Launch`] keeps that promise itself. cudarc's `DevicePtr::device_ptr` on a guard *does* check the stream it is
//!   given: on another stream, that stream first waits for the guard's, and the returned
//!   `SyncOnDrop` synchronizes it, so the work is complete before the guard records.
//! - A view is bound to its stream: work through it on another stream is refused
//!   ([`Misuse::InvalidArgument`]), except the synchronous copies ([`copy`](crate::copy)),
//!   which are ordered after the stream and before the view's end like any other work.
//! - The cuda-mem [`Stream`] over a cudarc stream ([`stream`]) keeps cudarc's `Arc<CudaStream>`
//!   alive for as long as any buffer's fence may still record on it.
//! - No ordering here rests on a destructor that `mem::forget` could skip. A view ends in its
//!   `with` call, which the closure cannot prevent; work queued through a view's guards is on
//!   the view's stream, before that end. A guard ([`CudarcRead`], [`CudarcWrite`], or one
//!   taken from a view) marks its work on the memory when it is taken, before the work is
//!   queued, on the guard's stream: whoever waits later waits for that stream, so a forgotten
//!   guard leaves its work ordered (it may cost the fence bookkeeping, never a wait).
//!   cudarc's own calls that take a guard on another stream synchronize that stream before
//!   they return. The [`Stream`] of [`stream`] keeps cudarc's stream alive: forgotten, it
//!   leaks the stream. The other way, a cuda-mem stream lent by [`cudarc_stream`] stays alive
//!   until cudarc's last handle to the wrapper is gone (noticed at the next call): a forgotten
//!   handle leaks the stream, never frees it under cudarc. A [`Launch`] holds guards like any
//!   other: forgotten, its buffers' work was marked when each argument was pushed, so later
//!   waits still cover a kernel it launched (and one it never launched costs a needless wait
//!   at most).
//!
//! # Features
//!
//! `cudarc` pins cudarc's CUDA API version to 12.0 (`cudarc/cuda-12000`) and loads libcuda at
//! run time (`fallback-dynamic-loading`), so nothing is linked and any driver that runs a
//! CUDA 12 or 13 runtime serves. An application that selects another of cudarc's `cuda-*`
//! features enables `cudarc-unpinned` instead (cudarc accepts exactly one).

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use ::cudarc::driver::{
    result as dresult, sys as dsys, CudaContext, CudaStream, DevicePtr as CudarcDevicePtr,
    DevicePtrMut as CudarcDevicePtrMut, DeviceSlice, DriverError, LaunchArgs, PushKernelArg,
    SyncOnDrop,
};
use bytemuck::Pod;

mod launch;
pub use self::launch::{Launch, LaunchStream};

use crate::contract::memory::{sealed, Loc};
use crate::error::{Error, ErrorCode, Misuse, Result};
use crate::fence::{Access, Fence};
use crate::handles::devices::Device;
use crate::handles::stream::{Stream, StreamInner};
use crate::ops::access::{DevicePtr, DevicePtrMut, DeviceRead, DeviceWrite};

/// A cudarc driver error as this crate's [`Error`]: driver and runtime number the errors they
/// share alike (`CUDA_ERROR_ILLEGAL_ADDRESS` = `cudaErrorIllegalAddress` = 700, ...).
fn driver_error(e: DriverError, call: impl Into<String>) -> Error {
    Error::Cuda {
        code: ErrorCode(e.0 as u32),
        call: call.into(),
    }
}

/// A cudarc error as this crate's [`Error::Cuda`], so that `?` takes cudarc's results where
/// this crate's [`Result`] is returned: in the closures of [`CudarcView::with`] and
/// [`CudarcViewMut::with`], for one. cudarc's error carries the driver's code only, not the
/// call that failed: `call` says "a cudarc driver call".
impl From<DriverError> for Error {
    fn from(e: DriverError) -> Self {
        driver_error(e, "a cudarc driver call")
    }
}

/// cudarc's handle to a stream, held by the cuda-mem [`Stream`] over it (and so by every fence
/// that may record on that stream), released with the last clone.
struct Keeper(Option<Arc<CudaStream>>);

impl Drop for Keeper {
    fn drop(&mut self) {
        // Releasing cudarc's last handle to a stream it owns binds the stream's context to this
        // thread first (cudarc's `bind_to_thread`), which would change the runtime's current
        // device under whoever dropped a buffer here: give the thread back its context.
        let before = dresult::ctx::get_current();
        drop(self.0.take());
        if let Ok(before) = before {
            if dresult::ctx::get_current().ok() != Some(before) {
                // SAFETY: `before` was the thread's current context a moment ago (or none:
                // null unbinds); what was dropped belongs to cudarc's context, a primary
                // context that the runtime keeps alive. Errors are ignored (drop never panics).
                let _ =
                    unsafe { dresult::ctx::set_current(before.unwrap_or(std::ptr::null_mut())) };
            }
        }
    }
}

/// Where cudarc would panic, an error: cudarc loads libcuda at its first call and panics when
/// it cannot (no driver installed). The runtime, linked into this crate, loads the same
/// library (`libcuda.so.1`, one of the names cudarc tries) and says so with an error
/// (`cudaErrorInsufficientDriver`, or `cudaErrorNoDevice` where it finds no device), which
/// [`Error::is_no_device`] recognizes. Asked once per process while it succeeds.
fn require_driver() -> Result<()> {
    static FOUND: AtomicBool = AtomicBool::new(false);
    if FOUND.load(Ordering::Relaxed) {
        return Ok(());
    }
    Device::count()?;
    FOUND.store(true, Ordering::Relaxed);
    Ok(())
}

/// The devices (the first 64) whose shared context [`shared_context`] has made.
static CONTEXTS: [OnceLock<Arc<CudaContext>>; 64] = [const { OnceLock::new() }; 64];

/// cudarc's context object of `device`'s primary context, one per device for the whole
/// process (past the 64th device, a new one every call), made by `CudaContext::new` the
/// first time. Not bound to the calling thread here.
fn shared_context(device: Device) -> Result<Arc<CudaContext>> {
    require_driver()?;
    let ordinal = device.ordinal();
    let index = usize::try_from(ordinal).map_err(|_| Misuse::InvalidArgument {
        op: "interop::cudarc::context",
        reason: format!("device ordinal {ordinal} out of range"),
    })?;
    let slot = CONTEXTS.get(index);
    if let Some(ctx) = slot.and_then(OnceLock::get) {
        return Ok(ctx.clone());
    }
    // `CudaContext::new` binds the context to this thread: give the thread its own back.
    let before = dresult::ctx::get_current()
        .map_err(|e| driver_error(e, "cuCtxGetCurrent (interop::cudarc::context)"))?;
    let ctx = CudaContext::new(index)
        .map_err(|e| driver_error(e, format!("CudaContext::new({ordinal})")))?;
    if before != Some(ctx.cu_ctx()) {
        // SAFETY: `before` was the thread's current context a moment ago (or none: null
        // unbinds); the runtime keeps primary contexts alive, and others are the caller's.
        unsafe { dresult::ctx::set_current(before.unwrap_or(std::ptr::null_mut())) }
            .map_err(|e| driver_error(e, "cuCtxSetCurrent (interop::cudarc::context)"))?;
    }
    Ok(match slot {
        Some(slot) => slot.get_or_init(|| ctx).clone(),
        None => ctx,
    })
}

/// cudarc's context of `device`: its primary context, the one the CUDA runtime and so
/// cuda-mem work in, bound to the calling thread as `CudaContext::new` does.
///
/// The way in that cannot panic: cudarc panics when it cannot load libcuda (no driver
/// installed), at its first call; this returns the runtime's error instead
/// (`cudaErrorInsufficientDriver` or `cudaErrorNoDevice`, which [`Error::is_no_device`]
/// recognizes). So do every other entry point of this module that starts from cuda-mem
/// values ([`cudarc_stream`], [`Launch::on`]); those that take cudarc objects need no check,
/// since only a loaded libcuda can have made them.
///
/// Every call for one device returns the same context object (`Arc::ptr_eq`), so that
/// cudarc's settings that live in the object (its event tracking, whether it manages several
/// streams) are one for all of the program's cudarc work, the streams of [`cudarc_stream`]
/// included. (Two `CudaContext::new` objects of one device track their slices' events each
/// for itself: a slice of one used on a stream of the other, both in one-stream mode, is not
/// ordered. Take cudarc's context from here.)
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{interop::cudarc::context, Device};
/// let ctx = context(Device::get(0)?)?; // without a driver: Device::get's error
/// let cs = ctx.new_stream()?;
/// # Ok(()) }
/// ```
///
/// Errors: no driver or device (as above); the driver's (as [`Error::Cuda`]).
pub fn context(device: Device) -> Result<Arc<CudaContext>> {
    let ctx = shared_context(device)?;
    ctx.bind_to_thread()
        .map_err(|e| driver_error(e, "CudaContext::bind_to_thread"))?;
    Ok(ctx)
}

/// The cuda-mem streams lent to cudarc by [`cudarc_stream`]: each kept alive (through a clone
/// of its shared part) while cudarc still has a handle to the wrapper over it. Entries whose
/// wrapper is gone are released at the next call.
static LENT: Mutex<Vec<(Weak<CudaStream>, Arc<StreamInner>)>> = Mutex::new(Vec::new());

/// The device's stream that keeps its shared context in cudarc's several-streams mode (see
/// [`cudarc_stream`]), made once and never released.
static SEVERAL: [OnceLock<Arc<CudaStream>>; 64] = [const { OnceLock::new() }; 64];

/// A cuda-mem [`Stream`] as a cudarc stream (`Arc<CudaStream>`): cudarc's launches, copies,
/// allocations and graphs on a stream cudarc cannot make itself. cudarc makes only
/// non-blocking streams; this lends it cuda-mem's blocking ones ([`Stream::new`]), non-blocking
/// ones, and the legacy default stream ([`Stream::legacy_default`]). The CUDA runtime's
/// `cudaStream_t` and the driver's `CUstream` are one handle, so both libraries queue on the
/// same stream.
///
/// - A stream this crate made ([`Stream::new`], [`Stream::non_blocking`], [`Stream::on`]):
///   cudarc's wrapper over it (`CudaContext::wrap_borrowed_stream`), in [`context`]'s context
///   object. The stream stays alive while cudarc has any handle to the wrapper (a clone, a
///   `CudaSlice` allocated on it, a graph): its last release is noticed, and the stream
///   released, at the next call of this function. The context is switched to cudarc's
///   several-streams mode first (one idle stream of cudarc's own, kept), so that cudarc
///   records its events on every slice: a slice allocated on one cuda-mem stream and used on
///   another through cudarc is ordered by cudarc itself. (Entering that mode, cudarc waits
///   once for the device's pending work, as its own first `new_stream` does.)
/// - The legacy default stream: cudarc's `default_stream()` of that device (the null handle).
/// - A cuda-mem stream over a cudarc stream ([`stream`]): that cudarc stream itself.
///
/// cuda-mem memory goes into cudarc work on the stream through guards
/// ([`CudarcPtr::cudarc_ptr`] and the others), which order the stream and record the work as
/// for any cudarc stream; cudarc's own memory orders itself.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::interop::cudarc::cudarc_stream;
/// use cuda_mem::Stream;
/// let s = Stream::new()?;                  // blocking: ordered with the legacy default stream
/// let cs = cudarc_stream(&s)?;             // the same stream, for cudarc
/// let y = cs.clone_htod(&[1u32, 2, 3])?;   // cudarc's copy, queued on `s`
/// drop(s);                                 // `cs` keeps the stream alive
/// assert_eq!(cs.clone_dtoh(&y)?, [1, 2, 3]);
/// # Ok(()) }
/// ```
///
/// Errors: no driver or device ([`context`]); [`Misuse::InvalidArgument`] for a per-thread
/// default stream ([`Stream::per_thread`]: its handle names a different stream on every
/// thread, and cudarc's streams go to any thread) and for a stream borrowed with
/// [`Stream::from_raw`] (this crate cannot keep it alive: wrap it with cudarc's `unsafe`
/// `wrap_borrowed_stream` under the same promise); the driver's.
pub fn cudarc_stream(s: &Stream) -> Result<Arc<CudaStream>> {
    let op = "interop::cudarc::cudarc_stream";
    let inner = s.inner();
    if let Some(keeper) = inner.keeper().and_then(|k| k.downcast_ref::<Keeper>()) {
        if let Some(cs) = &keeper.0 {
            return Ok(cs.clone());
        }
    }
    let raw = s.as_raw();
    if raw as usize == 2 {
        return Err(Misuse::InvalidArgument {
            op,
            reason: "a per-thread default stream names a different stream on every thread, \
                     and cudarc's streams go to any thread: use a stream of your own"
                .to_string(),
        }
        .into());
    }
    let device = s.device();
    let ctx = shared_context(device)?;
    if raw.is_null() {
        return Ok(ctx.default_stream());
    }
    if !inner.is_owned() {
        return Err(Misuse::InvalidArgument {
            op,
            reason: format!(
                "stream {raw:p} is borrowed (Stream::from_raw): cuda-mem cannot keep it alive \
                 for cudarc; wrap it with cudarc's CudaContext::wrap_borrowed_stream, under \
                 the promise Stream::from_raw was given"
            ),
        }
        .into());
    }
    several_streams(&ctx, device)?;
    // The wrapper must be in the stream's context: the runtime made it in the primary
    // context of its device (the context the runtime works in), which is `ctx`'s.
    let mut its_ctx: dsys::CUcontext = std::ptr::null_mut();
    // SAFETY: `raw` is a live stream handle (`s` owns it); `its_ctx` is a valid out-pointer.
    unsafe { dsys::cuStreamGetCtx(raw.cast(), &mut its_ctx) }
        .result()
        .map_err(|e| driver_error(e, format!("cuStreamGetCtx({raw:p})")))?;
    if its_ctx != ctx.cu_ctx() {
        return Err(Misuse::InvalidArgument {
            op,
            reason: format!(
                "stream {raw:p} belongs to another context than the primary context of \
                 device {} (a context made current through the driver API when the stream \
                 was made)",
                device.ordinal()
            ),
        }
        .into());
    }
    // SAFETY: `raw` is a valid stream of `ctx`'s context (checked just above). Its owner, the
    // stream's shared part, is kept alive in LENT until cudarc holds no handle to the wrapper
    // (released only once the wrapper's `Weak` is dead, when nothing can use the handle
    // through it). Ordering with cuda-mem's work: cuda-mem memory reaches cudarc only through
    // guards, which order the stream after the memory's pending work and record the work on
    // it; cudarc's memory orders itself (the context tracks events, `several_streams`).
    let cs = unsafe { ctx.wrap_borrowed_stream(raw.cast()) };
    // cudarc may now begin a capture on it that the crate does not know of: the fence asks the
    // runtime before queueing on it from now on.
    inner.mark_lent();
    let released = {
        let mut lent = LENT.lock().unwrap_or_else(|e| e.into_inner());
        let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut *lent)
            .into_iter()
            .partition(|(w, _)| w.strong_count() > 0);
        *lent = keep;
        lent.push((Arc::downgrade(&cs), inner.clone()));
        gone
    };
    // Released outside the lock (the last clone of a stream destroys it).
    drop(released);
    Ok(cs)
}

/// Puts `device`'s shared context `ctx` in cudarc's several-streams mode for good, where
/// cudarc records read and write events on every slice made from then on (it does so only
/// once one of its own streams exists): one idle stream of cudarc's, kept.
fn several_streams(ctx: &Arc<CudaContext>, device: Device) -> Result<()> {
    if ctx.is_in_multi_stream_mode() {
        return Ok(());
    }
    let before = dresult::ctx::get_current()
        .map_err(|e| driver_error(e, "cuCtxGetCurrent (interop::cudarc::cudarc_stream)"))?;
    let cs = ctx
        .new_stream()
        .map_err(|e| driver_error(e, "CudaContext::new_stream"));
    if before != Some(ctx.cu_ctx()) {
        // SAFETY: as in `shared_context`: the thread's context of a moment ago (or none).
        let _ = unsafe { dresult::ctx::set_current(before.unwrap_or(std::ptr::null_mut())) };
    }
    let cs = cs?;
    match usize::try_from(device.ordinal())
        .ok()
        .and_then(|i| SEVERAL.get(i))
    {
        Some(slot) => {
            // (Another thread's may have won: then `cs` is dropped, its own is kept.)
            slot.get_or_init(|| cs);
        }
        // Past the 64th device: kept by leaking one handle.
        None => std::mem::forget(cs),
    }
    Ok(())
}

/// A cuda-mem [`Stream`] over a cudarc stream, for cuda-mem's copies, memsets and guards on
/// it. It keeps cudarc's `Arc<CudaStream>` alive until neither it nor any buffer that queued
/// work on it needs the handle, so unlike [`Stream::from_raw`] it is safe.
///
/// cudarc's `default_stream()` (the null handle) becomes the legacy default stream of its
/// device ([`Stream::legacy_default`]).
///
/// Errors: [`Misuse::InvalidArgument`] for a stream of a context that is not its device's
/// primary context, or for the per-thread default stream (`per_thread_stream()`, which names
/// a stream of whichever device is current); the runtime's error when the device is unknown
/// to it.
pub fn stream(s: &Arc<CudaStream>) -> Result<Stream> {
    let op = "interop::cudarc::stream";
    let ctx = s.context();
    if !ctx.is_primary() {
        return Err(Misuse::InvalidArgument {
            op,
            reason: format!(
                "the stream's context is not the primary context of device {} (cudarc's \
                 CudaContext::new): the CUDA runtime, and so cuda-mem, works in primary contexts",
                ctx.ordinal()
            ),
        }
        .into());
    }
    let raw = s.cu_stream();
    // cudaStreamLegacy (1) and cudaStreamPerThread (2) are not streams but names for one of
    // whichever device is current when a call is made.
    if raw as usize == 1 || raw as usize == 2 {
        return Err(Misuse::InvalidArgument {
            op,
            reason: format!(
                "handle {raw:p} is the per-thread (or legacy) default stream of whichever \
                 device is current: use a stream from new_stream() or default_stream()"
            ),
        }
        .into());
    }
    let ordinal = i32::try_from(ctx.ordinal()).map_err(|_| Misuse::InvalidArgument {
        op,
        reason: format!("device ordinal {} out of range", ctx.ordinal()),
    })?;
    let device = Device::get(ordinal)?;
    Ok(Stream::kept_alive_by(
        raw.cast(),
        device,
        Box::new(Keeper(Some(s.clone()))),
    ))
}

/// The cudarc streams a guard hands out its address on. On the guard's own stream the guard
/// orders and records the work. On another, that stream first waits for the guard's stream
/// (which the guard ordered after the buffer's conflicting work), and the `SyncOnDrop`
/// synchronizes it once the work is queued, so that it is complete before the guard records.
fn follow<'a>(ours: &CudaStream, theirs: &'a CudaStream) -> SyncOnDrop<'a> {
    if ours == theirs {
        return SyncOnDrop::Sync(None);
    }
    join_or_sync(theirs, ours);
    SyncOnDrop::sync_stream(theirs)
}

/// Makes `waiter` wait (device side) for the work queued on `waited` so far; where that fails,
/// finishes `waited` on the host instead. Errors go to cudarc's context error (never a panic).
fn join_or_sync(waiter: &CudaStream, waited: &CudaStream) {
    if let Err(e) = waiter.join(waited) {
        let ctx = waiter.context();
        ctx.record_err::<()>(Err(e));
        ctx.record_err(waited.synchronize());
    }
}

/// A read guard of cuda-mem memory for a cudarc stream ([`CudarcPtr::cudarc_ptr`]): a
/// [`DeviceRead`] (which it dereferences to) that also knows its cudarc stream, so it goes
/// wherever cudarc takes memory: `builder.arg(&guard)`, and cudarc's `DevicePtr` trait
/// (`stream.memcpy_dtod(&guard, &mut slice)`, `stream.memcpy_dtov(&guard)`).
#[must_use = "the guard records the work queued while it lives: keep it until after the launch"]
pub struct CudarcRead<'a, T> {
    guard: DeviceRead<'a, T>,
    stream: Arc<CudaStream>,
}

/// A write guard of cuda-mem memory for a cudarc stream ([`CudarcPtrMut::cudarc_ptr_mut`]):
/// a [`DeviceWrite`] that cudarc takes as a kernel argument and through its `DevicePtr` and
/// `DevicePtrMut` traits (`stream.memcpy_htod(&host, &mut guard)`).
#[must_use = "the guard records the work queued while it lives: keep it until after the launch"]
pub struct CudarcWrite<'a, T> {
    guard: DeviceWrite<'a, T>,
    stream: Arc<CudaStream>,
}

/// The trait impls the two guards share (`Deref` to the cuda-mem guard, `Debug`, and
/// cudarc's `DeviceSlice` and `DevicePtr`): trait-impl boilerplate only.
macro_rules! cudarc_guard {
    ($ty:ident, $inner:ident) => {
        impl<'a, T> std::ops::Deref for $ty<'a, T> {
            type Target = $inner<'a, T>;
            fn deref(&self) -> &$inner<'a, T> {
                &self.guard
            }
        }

        impl<T> fmt::Debug for $ty<'_, T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    concat!(stringify!($ty), "({:?}, stream {:p})"),
                    self.guard,
                    self.stream.cu_stream()
                )
            }
        }

        impl<T> DeviceSlice<T> for $ty<'_, T> {
            fn len(&self) -> usize {
                self.guard.len()
            }
            fn stream(&self) -> &Arc<CudaStream> {
                &self.stream
            }
        }

        impl<T> CudarcDevicePtr<T> for $ty<'_, T> {
            fn device_ptr<'b>(
                &'b self,
                stream: &'b CudaStream,
            ) -> (dsys::CUdeviceptr, SyncOnDrop<'b>) {
                (self.guard.addr(), follow(&self.stream, stream))
            }
        }
    };
}
cudarc_guard!(CudarcRead, DeviceRead);
cudarc_guard!(CudarcWrite, DeviceWrite);

/// cuda-mem memory that cudarc work may read: every kind [`DevicePtr`] covers, views
/// included. Implemented for all of them.
pub trait CudarcPtr<T: Pod>: DevicePtr<T> {
    /// [`DevicePtr::device_ptr`] for work on the cudarc stream `stream` (see [`stream`] for
    /// what is refused).
    fn cudarc_ptr(&self, stream: &Arc<CudaStream>) -> Result<CudarcRead<'_, T>> {
        let s = self::stream(stream)?;
        Ok(CudarcRead {
            guard: self.device_ptr(&s)?,
            stream: stream.clone(),
        })
    }
}
impl<T: Pod, M: DevicePtr<T> + ?Sized> CudarcPtr<T> for M {}

/// cuda-mem memory that cudarc work may write. Implemented for every writable
/// [`CudarcPtr`] kind.
pub trait CudarcPtrMut<T: Pod>: DevicePtrMut<T> {
    /// [`DevicePtrMut::device_ptr_mut`] for work on the cudarc stream `stream`.
    fn cudarc_ptr_mut(&mut self, stream: &Arc<CudaStream>) -> Result<CudarcWrite<'_, T>> {
        let s = self::stream(stream)?;
        Ok(CudarcWrite {
            guard: self.device_ptr_mut(&s)?,
            stream: stream.clone(),
        })
    }
}
impl<T: Pod, M: DevicePtrMut<T> + ?Sized> CudarcPtrMut<T> for M {}

impl<T> CudarcDevicePtrMut<T> for CudarcWrite<'_, T> {
    fn device_ptr_mut<'b>(
        &'b mut self,
        stream: &'b CudaStream,
    ) -> (dsys::CUdeviceptr, SyncOnDrop<'b>) {
        (self.guard.addr(), follow(&self.stream, stream))
    }
}

/// The guards as kernel arguments of cudarc's launch builder: each pushes a reference to its
/// `CUdeviceptr`, as cudarc does for a `CudaSlice`.
macro_rules! push_guard {
    ($($arg:ty => |$a:ident| $addr:expr;)+) => {$(
        // SAFETY: the builder keeps a pointer to the argument's value until it launches; the
        // value is the guard's `CUdeviceptr` (a `u64`, the kernel's pointer parameter), which
        // lives unmoved behind the `&'b` borrow for as long as the builder (`'b: 'a`). The
        // launch itself is `unsafe`: its caller promises a kernel that uses the memory as the
        // guard allows, on the guard's stream, while the guard lives; the guard ordered that
        // stream and records the launch when it drops.
        unsafe impl<'a, 'b: 'a, 'c, T> PushKernelArg<$arg> for LaunchArgs<'a> {
            #[inline(always)]
            fn arg(&mut self, $a: $arg) -> &mut Self {
                <Self as PushKernelArg<&'b u64>>::arg(self, $addr)
            }
        }
    )+};
}
push_guard! {
    &'b DeviceRead<'c, T> => |g| g.addr_ref();
    &'b DeviceWrite<'c, T> => |g| g.addr_ref();
    &'b mut DeviceWrite<'c, T> => |g| {
        let g: &'b DeviceWrite<'c, T> = g;
        g.addr_ref()
    };
    &'b CudarcRead<'c, T> => |g| g.guard.addr_ref();
    &'b CudarcWrite<'c, T> => |g| g.guard.addr_ref();
    &'b mut CudarcWrite<'c, T> => |g| {
        let g: &'b CudarcWrite<'c, T> = g;
        g.guard.addr_ref()
    };
}

/// What a view of cudarc memory knows of it. Lives in the frame of [`CudarcView::with`] /
/// [`CudarcViewMut::with`] (inside [`End`]), which the view only borrows.
struct Bound {
    addr: u64,
    len: usize,
    bytes: usize,
    /// The device of the memory (its cudarc context's).
    device: i32,
    /// cuda-mem's [`Stream`] over the cudarc stream the view is for.
    stream: Stream,
    /// Work queued through the view: on `stream`, and synchronous copies on the legacy default
    /// stream.
    fence: Fence,
}

impl Bound {
    fn check_stream(&self, stream: &Stream, op: &'static str) -> Result<()> {
        if StreamInner::same(stream.inner(), self.stream.inner()) {
            return Ok(());
        }
        Err(Misuse::InvalidArgument {
            op,
            reason: format!(
                "this view of cudarc memory is for stream {:p} (device {}), not stream {:p} \
                 (device {}): make another view for that stream",
                self.stream.as_raw(),
                self.stream.device().ordinal(),
                stream.as_raw(),
                stream.device().ordinal()
            ),
        }
        .into())
    }
}

impl fmt::Debug for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:#x}, {} elements, device {}, stream {:p}",
            self.addr,
            self.len,
            self.device,
            self.stream.as_raw()
        )
    }
}

/// A view's state with its end: what makes cudarc's record of the access cover the work queued
/// through the view. Only ever a local of [`scoped`], out of reach of the caller's closure, so
/// its drop runs on every way out (return, error, unwinding) and nothing can `mem::forget` it.
struct End<'a> {
    bound: Bound,
    /// The cudarc stream the view is for.
    cstream: &'a Arc<CudaStream>,
    /// The stream the memory belongs to (cudarc allocates and frees it there).
    owner: Arc<CudaStream>,
    /// cudarc's own record of the access, made on `cstream` when this drops: after `End::drop`
    /// has put every piece of work of the view before the end of `cstream`.
    _record: SyncOnDrop<'a>,
}

impl<'a> End<'a> {
    /// The view of `len` elements of `T` that cudarc's `device_ptr` or `device_ptr_mut` (run
    /// by `take`, on `cstream`) hands out, of memory that belongs to the stream `owner`.
    fn begin<T>(
        len: usize,
        owner: Arc<CudaStream>,
        cstream: &'a Arc<CudaStream>,
        take: impl FnOnce(&'a CudaStream) -> (dsys::CUdeviceptr, SyncOnDrop<'a>),
        op: &'static str,
    ) -> Result<Self> {
        let stream = self::stream(cstream)?;
        let ordinal = owner.context().ordinal();
        let device = i32::try_from(ordinal).map_err(|_| Misuse::InvalidArgument {
            op,
            reason: format!("device ordinal {ordinal} out of range"),
        })?;
        // An error cudarc stored earlier (in a drop) is reported, not blamed on the waits below.
        let ctx = cstream.context();
        ctx.check_err()
            .map_err(|e| driver_error(e, "an earlier cudarc call (CudaContext::check_err)"))?;
        if owner != *cstream {
            // Behind all work queued on the memory's own stream (its allocation included),
            // also when cudarc does not track events (one stream only, or tracking disabled).
            cstream
                .join(&owner)
                .map_err(|e| driver_error(e, format!("{op}: CudaStream::join")))?;
        }
        // cudarc's fence: `cstream` waits for the events cudarc recorded on the memory.
        let (addr, record) = take(cstream.as_ref());
        ctx.check_err()
            .map_err(|e| driver_error(e, format!("{op}: cudarc's device_ptr (stream wait)")))?;
        let bytes = len * std::mem::size_of::<T>();
        let fence = Fence::default();
        // Everything cudarc wrote before is behind the current end of `stream`: as writes of
        // `stream` here, so that work on another stream (a synchronous copy on the legacy
        // default stream) waits for it too.
        fence.mark(&stream, (0, bytes), Access::Write);
        Ok(End {
            bound: Bound {
                addr,
                len,
                bytes,
                device,
                stream,
                fence,
            },
            cstream,
            owner,
            _record: record,
        })
    }
}

impl Drop for End<'_> {
    fn drop(&mut self) {
        // Drop never panics; errors are ignored, each with a stronger fallback. Work queued
        // through guards the closure took from the view (and perhaps leaked with `mem::forget`)
        // is on `cstream`: ordered by stream order, whatever became of the guards.
        let b = &self.bound;
        // 1. Work queued through the view on other streams (synchronous copies) before the end
        //    of `stream`, where cudarc's record is made next.
        if b.fence
            .order(&b.stream, (0, b.bytes), Access::Write)
            .is_err()
        {
            let _ = b.fence.host_wait(Access::Write);
        }
        // 2. The memory's own stream (where cudarc frees it, and where work goes when cudarc
        //    tracks no events) after all of it.
        if self.owner != *self.cstream {
            join_or_sync(&self.owner, self.cstream);
        }
        // 3. `_record` drops next: cudarc records its read or write event on `cstream`.
    }
}

/// Makes the view that `take` hands out (see [`End::begin`]), runs `f` on it, then ends it:
/// on every way out of `f`, unwinding included.
fn scoped<'a, T, R>(
    len: usize,
    owner: Arc<CudaStream>,
    cstream: &'a Arc<CudaStream>,
    take: impl FnOnce(&'a CudaStream) -> (dsys::CUdeviceptr, SyncOnDrop<'a>),
    op: &'static str,
    f: impl FnOnce(&Bound) -> Result<R>,
) -> Result<R> {
    let end = End::begin::<T>(len, owner, cstream, take, op)?;
    let r = f(&end.bound);
    drop(end);
    r
}

/// The brand of one [`CudarcView::with`] / [`CudarcViewMut::with`] call. Each call's closure
/// is generic over `'v` (`for<'v>`, as `std::thread::scope`'s over `'scope`), so the views of
/// two calls have types that never unify, and the marker keeps the type *invariant* in `'v`
/// so that no coercion can make them meet. That is what refuses `mem::swap` of the views of
/// nested calls (the only way for safe code to own, or move, a view: none is ever handed out
/// by value), which would give the outer closure the inner view after the inner call ended,
/// and end the outer view early. Nor can a view, or a borrow of one, be the closure's result
/// or be stored outside it: the result type is chosen outside the call. (A view holds no
/// resource of its own: the state its end needs lives in the call's [`End`].)
type Brand<'v> = PhantomData<&'v mut &'v ()>;

/// cudarc memory (a `CudaSlice`, `CudaView` or `CudaViewMut`) read by cuda-mem work on one
/// cudarc stream: a source for [`copy_async`](crate::copy_async) and [`copy`](crate::copy),
/// and for kernels through [`DevicePtr`]. Only ever lent to the closure of
/// [`CudarcView::with`]; see the [module docs](self).
pub struct CudarcView<'v, T> {
    bound: &'v Bound,
    _brand: Brand<'v>,
    _mem: PhantomData<&'v [T]>,
}

/// cudarc memory (a `CudaSlice` or `CudaViewMut`) read and written by cuda-mem work on one
/// cudarc stream: also a destination for copies and [`memset_async`](crate::memset_async),
/// and writable through [`DevicePtrMut`]. Only ever lent to the closure of
/// [`CudarcViewMut::with`].
pub struct CudarcViewMut<'v, T> {
    bound: &'v Bound,
    _brand: Brand<'v>,
    _mem: PhantomData<&'v mut [T]>,
}

impl<T: Pod> CudarcView<'_, T> {
    /// Runs `f` with a view of `mem` for cuda-mem work on `stream`, and returns its result.
    /// Before `f`, `stream` is ordered after all work queued on the memory's own stream and
    /// after cudarc's pending writes (cudarc's `DevicePtr::device_ptr`). After `f`, on every
    /// way out (its result, an error, a panic), everything queued through the view is behind
    /// the end of `stream`, where cudarc's read event of `mem` is recorded and where the
    /// memory's own stream (which frees it) waits; so cudarc writes and frees `mem` only after
    /// that work. The end never panics; where it cannot order on the device, the host waits.
    ///
    /// ```no_run
    /// # use cudarc::driver::{CudaContext, CudaSlice};
    /// # use cuda_mem::{copy_async, HostAllocFlags, PinnedBuffer};
    /// use cuda_mem::interop::cudarc::CudarcView;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cs = CudaContext::new(0)?.new_stream()?;
    /// let y: CudaSlice<u32> = cs.alloc_zeros(3)?;
    /// let mut host = PinnedBuffer::<u32>::zeroed(3, HostAllocFlags::DEFAULT)?;
    /// CudarcView::with(&y, &cs, |view| copy_async(&mut host, view, view.stream()))?;
    /// # Ok(()) }
    /// ```
    ///
    /// The view is lent to `f` only: it cannot be its result, nor be stored outside it.
    ///
    /// ```compile_fail
    /// # use cudarc::driver::{CudaContext, CudaSlice};
    /// use cuda_mem::interop::cudarc::CudarcView;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cs = CudaContext::new(0)?.new_stream()?;
    /// let y: CudaSlice<u32> = cs.alloc_zeros(3)?;
    /// let view = CudarcView::with(&y, &cs, |view| Ok(view))?; // error: lifetime may not live long enough
    /// # Ok(()) }
    /// ```
    ///
    /// ```compile_fail,E0521
    /// # use cudarc::driver::{CudaContext, CudaSlice};
    /// use cuda_mem::interop::cudarc::CudarcView;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cs = CudaContext::new(0)?.new_stream()?;
    /// let y: CudaSlice<u32> = cs.alloc_zeros(3)?;
    /// let mut kept = None;
    /// CudarcView::with(&y, &cs, |view| {
    ///     kept = Some(view); // error: borrowed data escapes outside of closure
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: those of [`stream`]; the driver's, for a failed wait (then `f` is not run).
    pub fn with<'a, S, R>(
        mem: &'a S,
        stream: &'a Arc<CudaStream>,
        f: impl for<'v> FnOnce(&CudarcView<'v, T>) -> Result<R>,
    ) -> Result<R>
    where
        S: CudarcDevicePtr<T> + ?Sized,
    {
        scoped::<T, R>(
            mem.len(),
            mem.stream().clone(),
            stream,
            move |s| mem.device_ptr(s),
            "CudarcView::with",
            |bound| {
                f(&CudarcView {
                    bound,
                    _brand: PhantomData,
                    _mem: PhantomData,
                })
            },
        )
    }
}

impl<T: Pod> CudarcViewMut<'_, T> {
    /// Runs `f` with a view of `mem` for cuda-mem work on `stream` that may write it, and
    /// returns its result. Before `f`, `stream` is ordered after all work queued on the
    /// memory's own stream and after cudarc's pending reads and writes (cudarc's
    /// `DevicePtrMut::device_ptr_mut`). After `f`, on every way out, everything queued through
    /// the view is behind the end of `stream`, where cudarc's write event of `mem` is recorded
    /// and where the memory's own stream waits, as for [`CudarcView::with`].
    ///
    /// ```no_run
    /// # use cudarc::driver::{CudaContext, CudaSlice};
    /// # use cuda_mem::{copy_async, HostAllocFlags, PinnedBuffer};
    /// use cuda_mem::interop::cudarc::{stream, CudarcViewMut};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cs = CudaContext::new(0)?.new_stream()?;
    /// let s = stream(&cs)?; // the view's stream, for cuda-mem
    /// let mut y: CudaSlice<u32> = cs.alloc_zeros(3)?;
    /// let host = PinnedBuffer::from_slice(&[1u32, 2, 3], HostAllocFlags::DEFAULT)?;
    /// CudarcViewMut::with(&mut y, &cs, |view| copy_async(view, &host, &s))?;
    /// assert_eq!(cs.clone_dtoh(&y)?, [1, 2, 3]); // cudarc waits for the copy
    /// # Ok(()) }
    /// ```
    ///
    /// The views of two calls have distinct types, even nested ones: they cannot be swapped.
    ///
    /// ```compile_fail,E0521
    /// # use cudarc::driver::{CudaContext, CudaSlice};
    /// use cuda_mem::interop::cudarc::CudarcViewMut;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let cs = CudaContext::new(0)?.new_stream()?;
    /// let (mut x, mut y): (CudaSlice<u32>, CudaSlice<u32>) = (cs.alloc_zeros(3)?, cs.alloc_zeros(3)?);
    /// CudarcViewMut::with(&mut x, &cs, |xv| {
    ///     CudarcViewMut::with(&mut y, &cs, |yv| {
    ///         std::mem::swap(xv, yv); // error: borrowed data escapes outside of closure
    ///         Ok(())
    ///     })
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: as for [`CudarcView::with`].
    pub fn with<'a, S, R>(
        mem: &'a mut S,
        stream: &'a Arc<CudaStream>,
        f: impl for<'v> FnOnce(&mut CudarcViewMut<'v, T>) -> Result<R>,
    ) -> Result<R>
    where
        S: CudarcDevicePtrMut<T> + ?Sized,
    {
        let (len, owner) = (mem.len(), mem.stream().clone());
        scoped::<T, R>(
            len,
            owner,
            stream,
            move |s| {
                let mem: &'a mut S = mem;
                mem.device_ptr_mut(s)
            },
            "CudarcViewMut::with",
            |bound| {
                f(&mut CudarcViewMut {
                    bound,
                    _brand: PhantomData,
                    _mem: PhantomData,
                })
            },
        )
    }
}

/// What the two views have in common: accessors and the sealed memory traits.
macro_rules! cudarc_view {
    ($ty:ident) => {
        impl<T> $ty<'_, T> {
            /// Number of elements.
            pub fn len(&self) -> usize {
                self.bound.len
            }

            /// Whether the view is empty (cudarc allows empty slices; work on them does
            /// nothing).
            pub fn is_empty(&self) -> bool {
                self.bound.len == 0
            }

            /// The cuda-mem stream over the view's cudarc stream: the one its work goes on.
            pub fn stream(&self) -> &Stream {
                &self.bound.stream
            }

            /// The device address (`CUdeviceptr`) of the first element.
            pub fn addr(&self) -> u64 {
                self.bound.addr
            }
        }

        impl<T> fmt::Debug for $ty<'_, T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($ty), self.bound)
            }
        }

        impl<T> sealed::Raw<T> for $ty<'_, T> {
            fn raw_ptr(&self) -> *const T {
                self.bound.addr as *const T
            }
            fn raw_len(&self) -> usize {
                self.bound.len
            }
            fn loc(&self) -> Loc {
                Loc::Device
            }
            fn fence(&self) -> Option<&Fence> {
                Some(&self.bound.fence)
            }
            fn device_ordinal(&self) -> Option<i32> {
                Some(self.bound.device)
            }
            fn check_stream(&self, stream: &Stream, op: &'static str) -> Result<()> {
                self.bound.check_stream(stream, op)
            }
        }

        impl<T> sealed::Async<T> for $ty<'_, T> {
            fn device_addr(&self) -> Result<*const T> {
                Ok(self.bound.addr as *const T)
            }
            fn async_fence(&self) -> &Fence {
                &self.bound.fence
            }
        }
    };
}
cudarc_view!(CudarcView);
cudarc_view!(CudarcViewMut);

impl<T> sealed::RawMut<T> for CudarcViewMut<'_, T> {
    fn raw_mut_ptr(&mut self) -> *mut T {
        self.bound.addr as *mut T
    }
}
