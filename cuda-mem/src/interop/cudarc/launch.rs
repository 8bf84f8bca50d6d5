//! The checked kernel launch: one stream, given once; every buffer argument's guard taken for
//! it.

use std::os::raw::c_void;
use std::sync::Arc;

use ::cudarc::driver::{result as dresult, CudaFunction, CudaStream, DeviceRepr, LaunchConfig};
use bytemuck::Pod;

use super::{driver_error, shared_context, stream as cuda_mem_stream};
use crate::error::{Error, Result};
use crate::handles::stream::Stream;
use crate::ops::access::{DevicePtr, DevicePtrMut, DeviceRead, DeviceWrite};

/// A kernel launch on one stream, with cuda-mem memory as arguments: the stream is given once,
/// to [`Launch::on`], and every buffer argument's guard is taken for that stream, so a launch
/// can no longer go to another stream than the one its guards ordered.
///
/// - [`arg_in`](Self::arg_in) takes memory the kernel reads ([`DevicePtr::device_ptr`]: the
///   stream waits for pending writes to it from other streams);
/// - [`arg_out`](Self::arg_out) takes memory the kernel writes, and may read
///   ([`DevicePtrMut::device_ptr_mut`]: the stream waits for all pending work on it from other
///   streams); it borrows the memory mutably, so the same buffer cannot be passed twice
///   where one of them writes;
/// - [`arg`](Self::arg) takes a value (`u32`, `f32`, `u64`, ... : cudarc's `DeviceRepr`).
///
/// Each argument is pushed in order, as the kernel's parameter (a buffer as its device
/// address). The guards live in the `Launch` and end when it drops, after the launch: the
/// work is marked on every buffer for the launch stream, so host access, drops and work on
/// other streams wait for the kernel.
///
/// Launching ([`launch`](Self::launch)) is `unsafe`, as cudarc's is, but what its caller
/// promises is down to the kernel itself: its parameter list matches the arguments pushed
/// (types, order, count), it stays within the memory it is given, and it writes only what was
/// passed through `arg_out` (and `arg_in` memory it only reads). The stream, the ordering and
/// the lifetimes are the `Launch`'s business.
///
/// The stream is a cuda-mem [`Stream`] (any of them: blocking, non-blocking, the legacy or
/// this thread's per-thread default stream) or a cudarc stream (`Arc<CudaStream>`, of a
/// primary context; see [`stream`](super::stream)). cudarc memory is an argument through its
/// view ([`CudarcView::with`](super::CudarcView::with) /
/// [`CudarcViewMut::with`](super::CudarcViewMut::with), whose stream is the launch's).
///
/// ```no_run
/// use cudarc::driver::LaunchConfig;
/// use cudarc::nvrtc::Ptx;
/// use cuda_mem::interop::cudarc::{context, Launch};
/// use cuda_mem::{copy_async, Device, DeviceBuffer, HostAllocFlags, PinnedBuffer, Stream};
/// # const PTX: &str = "";
/// # fn main() -> cuda_mem::Result<()> {
/// let ctx = context(Device::get(0)?)?;
/// let f = ctx.load_module(Ptx::from_src(PTX))?.load_function("double")?;
/// let s = Stream::new()?;                                   // a blocking cuda-mem stream
/// let host = PinnedBuffer::from_slice(&[1u32, 2, 3], HostAllocFlags::DEFAULT)?;
/// let mut x = DeviceBuffer::<u32>::uninit(3)?;
/// copy_async(&mut x, &host, &s)?;
/// let mut y = DeviceBuffer::<u32>::zeroed(3)?;
/// // SAFETY: `double(const u32* x, u32* y, u32 n)` writes y[i] = 2 * x[i] for i < n.
/// unsafe {
///     Launch::on(&s, &f, LaunchConfig::for_num_elems(3))?
///         .arg_in(&x)
///         .arg_out(&mut y)
///         .arg(&3u32)
///         .launch()?;
/// }
/// assert_eq!(y.to_vec()?, [2, 4, 6]); // waits for the kernel
/// # Ok(()) }
/// ```
///
/// The same buffer cannot be written through two arguments:
///
/// ```compile_fail,E0499
/// # use cudarc::driver::{CudaFunction, LaunchConfig};
/// # use cuda_mem::interop::cudarc::Launch;
/// # use cuda_mem::{DeviceBuffer, Stream};
/// # fn demo(s: &Stream, f: &CudaFunction) -> cuda_mem::Result<()> {
/// let mut y = DeviceBuffer::<u32>::zeroed(3)?;
/// let mut l = Launch::on(s, f, LaunchConfig::for_num_elems(3))?;
/// l.arg_out(&mut y).arg_out(&mut y); // error: cannot borrow `y` as mutable more than once
/// # unsafe { l.launch() } }
/// ```
///
/// nor be read through one argument while another writes it:
///
/// ```compile_fail,E0502
/// # use cudarc::driver::{CudaFunction, LaunchConfig};
/// # use cuda_mem::interop::cudarc::Launch;
/// # use cuda_mem::{DeviceBuffer, Stream};
/// # fn demo(s: &Stream, f: &CudaFunction) -> cuda_mem::Result<()> {
/// let mut y = DeviceBuffer::<u32>::zeroed(3)?;
/// let mut l = Launch::on(s, f, LaunchConfig::for_num_elems(3))?;
/// l.arg_in(&y).arg_out(&mut y); // error: cannot borrow `y` as mutable because it is also borrowed as immutable
/// # unsafe { l.launch() } }
/// ```
///
/// nor be touched by the host until the launch is done with it:
///
/// ```compile_fail,E0502
/// # use cudarc::driver::{CudaFunction, LaunchConfig};
/// # use cuda_mem::interop::cudarc::Launch;
/// # use cuda_mem::{DeviceBuffer, Stream};
/// # fn demo(s: &Stream, f: &CudaFunction) -> cuda_mem::Result<()> {
/// let mut y = DeviceBuffer::<u32>::zeroed(3)?;
/// let mut l = Launch::on(s, f, LaunchConfig::for_num_elems(3))?;
/// l.arg_out(&mut y);
/// let v = y.to_vec()?; // error: cannot borrow `y` as immutable because it is also borrowed as mutable
/// # unsafe { l.launch() } }
/// ```
#[must_use = "nothing is launched until `launch` is called"]
pub struct Launch<'a> {
    stream: On<'a>,
    func: &'a CudaFunction,
    cfg: LaunchConfig,
    /// The kernel's parameters, in order.
    params: Vec<Param>,
    /// The device addresses of the buffer arguments (`Param::Addr` indexes here): the
    /// parameter list points into this vector only once it no longer grows, at the launch.
    addrs: Vec<u64>,
    /// The guards of the buffer arguments, ending (with the `Launch`) after the launch.
    guards: Vec<Box<dyn Held + 'a>>,
    /// The first argument that failed: reported by `launch`, which then launches nothing.
    error: Option<Error>,
}

/// One kernel parameter.
enum Param {
    /// The device address `addrs[i]` of a buffer argument.
    Addr(usize),
    /// A value argument, borrowed for the `Launch`'s lifetime.
    Value(*mut c_void),
}

/// A guard held until the launch is queued: its drop ends the work's time in flight on the
/// buffer's fence.
trait Held {}
impl<T> Held for DeviceRead<'_, T> {}
impl<T> Held for DeviceWrite<'_, T> {}

mod private {
    use crate::handles::stream::Stream;

    /// Seals [`LaunchStream`](super::LaunchStream).
    pub trait Sealed {
        /// The stream, as the launch holds it.
        fn launch_stream(&self) -> crate::error::Result<On<'_>>;
    }

    /// The stream of a launch.
    pub enum On<'a> {
        /// A cuda-mem stream, borrowed.
        Ours(&'a Stream),
        /// The cuda-mem stream over a cudarc stream ([`stream`](super::super::stream)), which
        /// keeps it alive.
        Cudarc(Stream),
    }

    impl On<'_> {
        pub(super) fn get(&self) -> &Stream {
            match self {
                On::Ours(s) => s,
                On::Cudarc(s) => s,
            }
        }
    }
}
use private::On;

/// What a [`Launch`] runs on: a cuda-mem [`Stream`] or a cudarc `Arc<CudaStream>`. Sealed.
pub trait LaunchStream: private::Sealed {}

impl private::Sealed for Stream {
    fn launch_stream(&self) -> Result<On<'_>> {
        Ok(On::Ours(self))
    }
}
impl LaunchStream for Stream {}

impl private::Sealed for Arc<CudaStream> {
    fn launch_stream(&self) -> Result<On<'_>> {
        Ok(On::Cudarc(cuda_mem_stream(self)?))
    }
}
impl LaunchStream for Arc<CudaStream> {}

impl<'a> Launch<'a> {
    /// A launch of `func` with `cfg` (grid, block, dynamic shared memory) on `stream`, with
    /// no arguments yet.
    ///
    /// Errors: no driver or device (see [`context`](super::context)); for a cudarc stream,
    /// those of [`stream`](super::stream).
    pub fn on<S: LaunchStream + ?Sized>(
        stream: &'a S,
        func: &'a CudaFunction,
        cfg: LaunchConfig,
    ) -> Result<Launch<'a>> {
        super::require_driver()?;
        Ok(Launch {
            stream: stream.launch_stream()?,
            func,
            cfg,
            params: Vec::new(),
            addrs: Vec::new(),
            guards: Vec::new(),
            error: None,
        })
    }

    /// The launch's stream, as a cuda-mem [`Stream`].
    pub fn stream(&self) -> &Stream {
        self.stream.get()
    }

    /// Pushes a buffer argument from the guard `take` makes for the launch's stream; once an
    /// argument failed, pushes nothing more (the launch reports that first error).
    fn push_guard<G: Held + 'a>(
        &mut self,
        take: impl FnOnce(&Stream) -> Result<G>,
        addr: impl FnOnce(&G) -> u64,
    ) -> &mut Self {
        if self.error.is_some() {
            return self;
        }
        match take(self.stream.get()) {
            Ok(g) => {
                self.params.push(Param::Addr(self.addrs.len()));
                self.addrs.push(addr(&g));
                self.guards.push(Box::new(g));
            }
            Err(e) => self.error = Some(e),
        }
        self
    }

    /// Pushes memory the kernel reads, as its device address (a `const T*` parameter): the
    /// launch's stream first waits for pending writes to it from other streams
    /// ([`DevicePtr::device_ptr`]). An error (refused stream, another device's legacy stream)
    /// is kept for [`launch`](Self::launch) to report.
    pub fn arg_in<T: Pod, M: DevicePtr<T> + ?Sized>(&mut self, mem: &'a M) -> &mut Self {
        self.push_guard(|s| mem.device_ptr(s), DeviceRead::addr)
    }

    /// Pushes memory the kernel writes (and may read), as its device address (a `T*`
    /// parameter): the launch's stream first waits for all pending work on it from other
    /// streams ([`DevicePtrMut::device_ptr_mut`]). Memory registered read-only is refused (at
    /// the launch, as every argument's error).
    pub fn arg_out<T: Pod, M: DevicePtrMut<T> + ?Sized>(&mut self, mem: &'a mut M) -> &mut Self {
        self.push_guard(|s| mem.device_ptr_mut(s), |g: &DeviceWrite<'a, T>| g.addr())
    }

    /// Pushes a value parameter (cudarc's `DeviceRepr` types: integers, floats, `bool`, and
    /// the user's own `unsafe impl`s), read by the driver at the launch.
    pub fn arg<T: DeviceRepr>(&mut self, value: &'a T) -> &mut Self {
        let p: *const T = value;
        self.params.push(Param::Value(p.cast_mut().cast()));
        self
    }

    /// Queues the kernel on the launch's stream (`cuLaunchKernel`), in the primary context of
    /// the stream's device (bound for the call, the thread's own given back after it). Every
    /// buffer argument's guard was taken for this stream when it was pushed, and ends when the
    /// `Launch` drops, after the kernel is queued. Launching again queues the kernel again,
    /// with the same arguments.
    ///
    /// # Safety
    ///
    /// The kernel `func` must take exactly the parameters pushed, in order (a buffer as a
    /// pointer to its element type, a value as its own type), must access only the elements
    /// of the memory it is given, and must write only memory pushed with
    /// [`arg_out`](Self::arg_out) (memory pushed with [`arg_in`](Self::arg_in) is shared with
    /// other readers, host and device, while the kernel runs). `func` must belong to the
    /// primary context of the stream's device (a module loaded through
    /// [`context`](super::context)'s context, or `CudaContext::new`'s of that device);
    /// otherwise the driver refuses the launch.
    ///
    /// Errors: the first argument's error, if any (then nothing is launched); a legacy or
    /// per-thread default stream of another device than the current one
    /// ([`Misuse::DeviceMismatch`](crate::Misuse::DeviceMismatch)); the driver's.
    pub unsafe fn launch(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let stream = self.stream.get();
        let op = "interop::cudarc::Launch::launch";
        stream.inner().check_current(op)?;
        let ctx = shared_context(stream.device())?;
        let _bound = Bind::to(ctx.cu_ctx())?;
        // The parameter list: pointers to the values, and into `addrs`, which no longer
        // changes while `self` is borrowed here.
        let mut params: Vec<*mut c_void> = self
            .params
            .iter()
            .map(|p| match *p {
                Param::Addr(i) => {
                    let a: *const u64 = &self.addrs[i];
                    a.cast_mut().cast()
                }
                Param::Value(v) => v,
            })
            .collect();
        let cfg = self.cfg;
        // SAFETY: every pointer in `params` is valid for the duration of the call: values are
        // borrowed for 'a, addresses live in `self.addrs`; the driver copies them. The
        // stream is live (borrowed, or kept alive by `On::Cudarc`), of the device whose
        // primary context is bound. That the kernel's parameters match and that it stays in
        // bounds is the caller's promise; the memory it touches is ordered on this stream by
        // the guards held in `self`.
        unsafe {
            dresult::launch_kernel(
                self.func.cu_function(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                stream.as_raw().cast(),
                &mut params,
            )
        }
        .map_err(|e| {
            driver_error(
                e,
                format!(
                    "cuLaunchKernel(grid {:?}, block {:?}, {} bytes shared, {} parameters, \
                     stream {:p})",
                    cfg.grid_dim,
                    cfg.block_dim,
                    cfg.shared_mem_bytes,
                    params.len(),
                    stream.as_raw()
                ),
            )
        })
    }
}

impl std::fmt::Debug for Launch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("stream", self.stream.get())
            .field("cfg", &self.cfg)
            .field("params", &self.params.len())
            .field("buffers", &self.guards.len())
            .field("error", &self.error)
            .finish()
    }
}

/// A context bound to the calling thread for one call, the thread's own given back after it.
struct Bind {
    /// The context to give back; `None` when it was already bound.
    before: Option<::cudarc::driver::sys::CUcontext>,
}

impl Bind {
    fn to(ctx: ::cudarc::driver::sys::CUcontext) -> Result<Bind> {
        let now = dresult::ctx::get_current().map_err(|e| driver_error(e, "cuCtxGetCurrent"))?;
        if now == Some(ctx) {
            return Ok(Bind { before: None });
        }
        // SAFETY: `ctx` is a primary context that the shared cudarc context retains for the
        // whole process.
        unsafe { dresult::ctx::set_current(ctx) }
            .map_err(|e| driver_error(e, "cuCtxSetCurrent"))?;
        Ok(Bind {
            before: Some(now.unwrap_or(std::ptr::null_mut())),
        })
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        if let Some(before) = self.before {
            // SAFETY: the thread's context of a moment ago (or null, which unbinds). Errors are
            // ignored: drop never panics.
            let _ = unsafe { dresult::ctx::set_current(before) };
        }
    }
}
