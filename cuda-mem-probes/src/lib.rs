//! The harness that the cuda-mem tests, examples and benchmark share: a few small kernels,
//! embedded as PTX and loaded at run time, so that nothing needs `nvcc` at build time.
//!
//! Not published and not part of `cuda-mem`'s API: [`Probes::fault`] corrupts the CUDA
//! context on purpose, and the kernels exist to test and measure memory, not to be reused.

use std::ffi::{CStr, CString};
use std::os::raw::c_void;

// (`sys` is named here only where the runtime's library API is declared: CUDA 12.5+.)
#[cfg(cudart_library)]
use cuda_mem::sys;
use cuda_mem::{check, Device, DeviceBuffer, DevicePtr, DevicePtrMut as _, Misuse, Result, Stream};

/// The probes work on whole 16-byte words: anything else is refused, not silently truncated.
fn whole_words(op: &'static str, bytes: usize) -> Result<u64> {
    if bytes == 0 || bytes % 16 != 0 {
        return Err(Misuse::InvalidArgument {
            op,
            reason: format!("{bytes} bytes is not a non-zero multiple of 16"),
        }
        .into());
    }
    Ok((bytes / 16) as u64)
}

/// A kernel handle: a `cudaKernel_t` where the headers declare the runtime's library API
/// (CUDA 12.5+, feature `library`), else a driver-API `CUfunction`.
#[cfg(cudart_library)]
type RawKernel = sys::cudaKernel_t;
/// A kernel handle: a `cudaKernel_t` where the headers declare the runtime's library API
/// (CUDA 12.5+, feature `library`), else a driver-API `CUfunction`.
#[cfg(not(cudart_library))]
type RawKernel = driver::CUfunction;

/// A loaded module, unloaded on drop: a `cudaLibrary_t` where the headers declare the runtime's
/// library API, else a driver-API `CUmodule` in the runtime's primary context (CUDA 12.0 to
/// 12.4 have no runtime call that loads PTX).
#[derive(Debug)]
pub struct Library {
    #[cfg(cudart_library)]
    raw: sys::cudaLibrary_t,
    #[cfg(not(cudart_library))]
    raw: driver::Module,
}

// SAFETY: a cudaLibrary_t, or a CUmodule with its context, is a handle that the thread-safe
// runtime and driver let any thread use.
unsafe impl Send for Library {}
// SAFETY: only `&self` methods that pass the handle to thread-safe runtime or driver calls.
unsafe impl Sync for Library {}

/// A kernel of a [`Library`], borrowed from it.
#[derive(Debug, Clone, Copy)]
pub struct Kernel<'lib> {
    raw: RawKernel,
    lib: &'lib Library,
}

fn kernel_name(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| {
        Misuse::InvalidArgument {
            op: "Library::kernel",
            reason: format!("kernel name {name:?} contains a NUL byte"),
        }
        .into()
    })
}

impl Library {
    /// Loads a PTX image (NUL-terminated text); the driver compiles it for the current device.
    pub fn load_ptx(image: &CStr) -> Result<Self> {
        Self::load_data(image.to_bytes_with_nul())
    }

    /// Loads an image from bytes: a cubin, a fatbin, or PTX text (which need not end with a
    /// NUL: one is appended to a copy). The driver rejects anything else with its own error
    /// (`cudaErrorInvalidKernelImage` or the like), which is returned as it is.
    pub fn load_image(image: &[u8]) -> Result<Self> {
        let mut owned = Vec::with_capacity(image.len() + 1);
        owned.extend_from_slice(image);
        owned.push(0);
        Self::load_data(&owned)
    }
}

#[cfg(cudart_library)]
impl Library {
    /// `image`: a cubin, a fatbin, or PTX text ending with a NUL.
    fn load_data(image: &[u8]) -> Result<Self> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `image` is a whole image (a NUL-terminated text where it is PTX, which the
        // callers guarantee), read only during the call; no JIT or library options.
        let code = unsafe {
            sys::cudaLibraryLoadData(
                &mut raw,
                image.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        check(code, || {
            format!("cudaLibraryLoadData({} bytes)", image.len())
        })?;
        Ok(Library { raw })
    }

    /// The kernel named `name` (its `.entry` name).
    pub fn kernel(&self, name: &str) -> Result<Kernel<'_>> {
        let cname = kernel_name(name)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer, live library, NUL-terminated name.
        let code = unsafe { sys::cudaLibraryGetKernel(&mut raw, self.raw, cname.as_ptr()) };
        check(code, || format!("cudaLibraryGetKernel({name})"))?;
        Ok(Kernel { raw, lib: self })
    }
}

#[cfg(cudart_library)]
impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: we own the handle; errors are ignored (drop never panics).
        unsafe { sys::cudaLibraryUnload(self.raw) };
    }
}

#[cfg(not(cudart_library))]
impl Library {
    /// `image`: a cubin, a fatbin, or PTX text ending with a NUL.
    fn load_data(image: &[u8]) -> Result<Self> {
        Ok(Library {
            raw: driver::Module::load(image)?,
        })
    }

    /// The kernel named `name` (its `.entry` name).
    pub fn kernel(&self, name: &str) -> Result<Kernel<'_>> {
        let cname = kernel_name(name)?;
        Ok(Kernel {
            raw: self.raw.function(&cname)?,
            lib: self,
        })
    }
}

impl Kernel<'_> {
    /// Launches the kernel with a 1-D grid (`cudaLaunchKernel`, or `cuLaunchKernel` for a
    /// driver-API module).
    ///
    /// # Safety
    /// `args` must hold one pointer per kernel parameter, each to a value of that parameter's
    /// type and size, and every memory address passed must be valid for what the kernel does
    /// with it until the work completes (take it from a cuda-mem access guard on `stream`).
    pub unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        shared_bytes: usize,
        stream: &Stream,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        #[cfg(cudart_library)]
        {
            let _ = self.lib;
            let g = sys::dim3 {
                x: grid,
                y: 1,
                z: 1,
            };
            let b = sys::dim3 {
                x: block,
                y: 1,
                z: 1,
            };
            // SAFETY: the caller guarantees the arguments; a cudaKernel_t may be passed as the
            // function pointer of cudaLaunchKernel (documented by the runtime since CUDA 12.0).
            let code = unsafe {
                sys::cudaLaunchKernel(
                    self.raw as *const c_void,
                    g,
                    b,
                    args.as_mut_ptr(),
                    shared_bytes,
                    stream.as_raw(),
                )
            };
            check(code, || {
                format!("cudaLaunchKernel(grid {grid}, block {block}, {shared_bytes} bytes shared)")
            })
        }
        #[cfg(not(cudart_library))]
        // SAFETY: the caller guarantees the arguments; `raw` is a function of `lib`'s module.
        unsafe {
            self.lib
                .raw
                .launch(self.raw, grid, block, shared_bytes, stream, args)
        }
    }
}

/// The driver API, for toolkits whose runtime cannot load PTX (no `cudaLibrary*` before CUDA
/// 12.5). `libcuda.so.1` is opened at run time (the driver is never linked), the module is
/// loaded into the runtime's primary context of the current device, and every call is made
/// with that context current. Driver and runtime share the numbering of the error codes
/// these calls return (`CUDA_ERROR_ILLEGAL_ADDRESS` = `cudaErrorIllegalAddress` = 700, ...).
#[cfg(not(cudart_library))]
mod driver {
    use std::ffi::{c_char, c_int, c_uint, CStr};
    use std::os::raw::c_void;
    use std::sync::OnceLock;

    use cuda_mem::{sys, Error, ErrorCode, Result, Stream};

    pub type CUfunction = *mut c_void;
    type CUmodule = *mut c_void;
    type CUcontext = *mut c_void;
    type CUresult = c_int;

    type ModuleLoadData = unsafe extern "C" fn(*mut CUmodule, *const c_void) -> CUresult;
    type ModuleGetFunction =
        unsafe extern "C" fn(*mut CUfunction, CUmodule, *const c_char) -> CUresult;
    type ModuleUnload = unsafe extern "C" fn(CUmodule) -> CUresult;
    type LaunchKernel = unsafe extern "C" fn(
        CUfunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        sys::cudaStream_t,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CUresult;
    type CtxGetCurrent = unsafe extern "C" fn(*mut CUcontext) -> CUresult;
    type CtxPushCurrent = unsafe extern "C" fn(CUcontext) -> CUresult;

    /// The driver entry points the probes use, resolved once.
    struct Api {
        module_load_data: ModuleLoadData,
        module_get_function: ModuleGetFunction,
        module_unload: ModuleUnload,
        launch_kernel: LaunchKernel,
        ctx_get_current: CtxGetCurrent,
        ctx_push_current: CtxPushCurrent,
        ctx_pop_current: CtxGetCurrent,
    }

    /// `cudaErrorInsufficientDriver`: what the runtime itself answers without a driver.
    fn no_driver(call: String) -> Error {
        Error::Cuda {
            code: ErrorCode(sys::cudaError::cudaErrorInsufficientDriver.0),
            call,
        }
    }

    fn api() -> Result<&'static Api> {
        static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
        API.get_or_init(|| {
            // SAFETY: a NUL-terminated name; dlopen has no other preconditions.
            let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
            if lib.is_null() {
                return Err("dlopen(libcuda.so.1)".to_string());
            }
            let sym = |name: &CStr| {
                // SAFETY: `lib` is a live handle (never closed); `name` is NUL-terminated.
                let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
                if p.is_null() {
                    Err(format!("dlsym({})", name.to_string_lossy()))
                } else {
                    Ok(p)
                }
            };
            // Each symbol becomes the function pointer type of its C signature in cuda.h.
            macro_rules! driver_fn {
                ($name:literal as $ty:ty) => {{
                    let p = sym($name)?;
                    // SAFETY: `p` is the driver's function of that name, whose C signature
                    // (cuda.h) is `$ty`.
                    unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
                }};
            }
            Ok(Api {
                module_load_data: driver_fn!(c"cuModuleLoadData" as ModuleLoadData),
                module_get_function: driver_fn!(c"cuModuleGetFunction" as ModuleGetFunction),
                module_unload: driver_fn!(c"cuModuleUnload" as ModuleUnload),
                launch_kernel: driver_fn!(c"cuLaunchKernel" as LaunchKernel),
                ctx_get_current: driver_fn!(c"cuCtxGetCurrent" as CtxGetCurrent),
                ctx_push_current: driver_fn!(c"cuCtxPushCurrent_v2" as CtxPushCurrent),
                ctx_pop_current: driver_fn!(c"cuCtxPopCurrent_v2" as CtxGetCurrent),
            })
        })
        .as_ref()
        .map_err(|call| no_driver(call.clone()))
    }

    fn check(code: CUresult, call: impl FnOnce() -> String) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        Err(Error::Cuda {
            code: ErrorCode(code as u32),
            call: call(),
        })
    }

    /// A `CUmodule` and the context it was loaded into.
    #[derive(Debug)]
    pub struct Module {
        module: CUmodule,
        ctx: CUcontext,
    }

    impl Module {
        /// `image`: a cubin, a fatbin, or PTX text ending with a NUL.
        pub fn load(image: &[u8]) -> Result<Module> {
            // The runtime's primary context of the current device, made current on this
            // thread by the runtime itself (cudaFree(NULL) only initialises it).
            // SAFETY: freeing NULL is a no-op besides context initialisation.
            let code = unsafe { sys::cudaFree(std::ptr::null_mut()) };
            super::check(code, || {
                "cudaFree(NULL) (initialises the runtime's context)".into()
            })?;
            let api = api()?;
            let mut ctx = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            check(unsafe { (api.ctx_get_current)(&mut ctx) }, || {
                "cuCtxGetCurrent".into()
            })?;
            let mut module = std::ptr::null_mut();
            // SAFETY: valid out-pointer; `image` is a whole image (NUL-terminated where it is
            // PTX, as the caller guarantees), read only during the call; `ctx` is current.
            let code = unsafe { (api.module_load_data)(&mut module, image.as_ptr().cast()) };
            check(code, || format!("cuModuleLoadData({} bytes)", image.len()))?;
            Ok(Module { module, ctx })
        }

        /// Runs `f` with the module's context current on this thread (pushed and popped
        /// again when another, or none, is current).
        fn in_context<R>(&self, f: impl FnOnce(&Api) -> Result<R>) -> Result<R> {
            let api = api()?;
            let mut cur = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            check(unsafe { (api.ctx_get_current)(&mut cur) }, || {
                "cuCtxGetCurrent".into()
            })?;
            if cur == self.ctx {
                return f(api);
            }
            // SAFETY: the context the module lives in (the runtime's primary context).
            check(unsafe { (api.ctx_push_current)(self.ctx) }, || {
                "cuCtxPushCurrent".into()
            })?;
            let r = f(api);
            let mut popped = std::ptr::null_mut();
            // SAFETY: pops what was pushed above, restoring the thread's previous context.
            unsafe { (api.ctx_pop_current)(&mut popped) };
            r
        }

        pub fn function(&self, name: &CStr) -> Result<CUfunction> {
            self.in_context(|api| {
                let mut f = std::ptr::null_mut();
                // SAFETY: valid out-pointer, live module, NUL-terminated name.
                let code = unsafe { (api.module_get_function)(&mut f, self.module, name.as_ptr()) };
                check(code, || {
                    format!("cuModuleGetFunction({})", name.to_string_lossy())
                })?;
                Ok(f)
            })
        }

        /// # Safety
        /// As [`Kernel::launch`](super::Kernel::launch); `f` is a function of this module.
        pub unsafe fn launch(
            &self,
            f: CUfunction,
            grid: u32,
            block: u32,
            shared_bytes: usize,
            stream: &Stream,
            args: &mut [*mut c_void],
        ) -> Result<()> {
            let shared = u32::try_from(shared_bytes).unwrap_or(u32::MAX);
            self.in_context(|api| {
                // SAFETY: the caller guarantees the arguments; a runtime stream is a driver
                // CUstream of the same (primary) context.
                let code = unsafe {
                    (api.launch_kernel)(
                        f,
                        grid,
                        1,
                        1,
                        block,
                        1,
                        1,
                        shared,
                        stream.as_raw(),
                        args.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                };
                check(code, || {
                    format!(
                        "cuLaunchKernel(grid {grid}, block {block}, {shared_bytes} bytes shared)"
                    )
                })
            })
        }
    }

    impl Drop for Module {
        fn drop(&mut self) {
            let _ = self.in_context(|api| {
                // SAFETY: we own the module; errors are ignored (drop never panics).
                unsafe { (api.module_unload)(self.module) };
                Ok(())
            });
        }
    }
}

/// PTX of the small kernels tests and benchmarks use (any GPU of compute capability 7.0+):
///
/// - `cm_read(const uint4* p, u64 n, u64* sink)`: reads `n` 16-byte words (grid-stride), XORs
///   them, and bumps `*sink` only if the XOR is 0x12345678, so the reads cannot be optimised
///   away;
/// - `cm_write(uint4* p, u64 n)`: writes word `i` as `(i, i, i, i)` (32-bit `i`);
/// - `cm_fault(u32* p)`: stores through `p`; give it an invalid address to raise
///   `cudaErrorIllegalAddress` (a sticky error);
/// - `cm_wait(const volatile u32* flag, u64 timeout_ns)`: spins until `*flag != 0`, or until
///   `timeout_ns` have passed (`%globaltimer`), so that a host that never releases it cannot
///   hang the GPU;
/// - `cm_spin(u64 ns)`: spins for `ns` nanoseconds: a slow kernel that holds a stream;
/// - `cm_xor(const u32* p, u64 n, u32* out)`: XORs `n` words into `*out` (grid-stride, one
///   atomic per thread);
/// - `cm_bump(u32* p, u32 n)`: adds 1 to each of the `n` words at `p`, one thread per word
///   (`i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1`): the tiny kernel of
///   `shared/refbench/graphs.cu`'s `bump`, launched as it is there ([`Probes::bump`]).
pub const PROBE_PTX: &CStr = c"
.version 7.0
.target sm_70
.address_size 64

.visible .entry cm_read(.param .u64 cm_read_p, .param .u64 cm_read_n, .param .u64 cm_read_sink)
{
    .reg .pred %p<3>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<16>;
    ld.param.u64 %rd1, [cm_read_p];
    ld.param.u64 %rd2, [cm_read_n];
    ld.param.u64 %rd3, [cm_read_sink];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
    mov.b32 %r5, 0;
    mov.b32 %r6, 0;
    mov.b32 %r7, 0;
    mov.b32 %r8, 0;
READ_LOOP:
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra READ_DONE;
    shl.b64 %rd7, %rd4, 4;
    add.u64 %rd8, %rd1, %rd7;
    ld.global.v4.u32 {%r9, %r10, %r11, %r12}, [%rd8];
    xor.b32 %r5, %r5, %r9;
    xor.b32 %r6, %r6, %r10;
    xor.b32 %r7, %r7, %r11;
    xor.b32 %r8, %r8, %r12;
    add.u64 %rd4, %rd4, %rd6;
    bra READ_LOOP;
READ_DONE:
    xor.b32 %r13, %r5, %r6;
    xor.b32 %r13, %r13, %r7;
    xor.b32 %r13, %r13, %r8;
    setp.ne.u32 %p2, %r13, 305419896;
    @%p2 bra READ_END;
    cvta.to.global.u64 %rd3, %rd3;
    atom.global.add.u64 %rd9, [%rd3], 1;
READ_END:
    ret;
}

.visible .entry cm_write(.param .u64 cm_write_p, .param .u64 cm_write_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [cm_write_p];
    ld.param.u64 %rd2, [cm_write_n];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
WRITE_LOOP:
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra WRITE_DONE;
    shl.b64 %rd7, %rd4, 4;
    add.u64 %rd8, %rd1, %rd7;
    cvt.u32.u64 %r5, %rd4;
    st.global.v4.u32 [%rd8], {%r5, %r5, %r5, %r5};
    add.u64 %rd4, %rd4, %rd6;
    bra WRITE_LOOP;
WRITE_DONE:
    ret;
}

.visible .entry cm_fault(.param .u64 cm_fault_p)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [cm_fault_p];
    mov.u32 %r1, 3735928559;
    st.global.u32 [%rd1], %r1;
    ret;
}

.visible .entry cm_wait(.param .u64 cm_wait_flag, .param .u64 cm_wait_timeout)
{
    .reg .pred %p<3>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [cm_wait_flag];
    ld.param.u64 %rd2, [cm_wait_timeout];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u64 %rd3, %globaltimer;
WAIT_LOOP:
    ld.volatile.global.u32 %r1, [%rd1];
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra WAIT_DONE;
    mov.u64 %rd4, %globaltimer;
    sub.u64 %rd5, %rd4, %rd3;
    setp.lt.u64 %p2, %rd5, %rd2;
    @%p2 bra WAIT_LOOP;
WAIT_DONE:
    ret;
}

.visible .entry cm_spin(.param .u64 cm_spin_ns)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [cm_spin_ns];
    mov.u64 %rd2, %globaltimer;
SPIN_LOOP:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra SPIN_LOOP;
    ret;
}

.visible .entry cm_xor(.param .u64 cm_xor_p, .param .u64 cm_xor_n, .param .u64 cm_xor_out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [cm_xor_p];
    ld.param.u64 %rd2, [cm_xor_n];
    ld.param.u64 %rd3, [cm_xor_out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd3, %rd3;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
    mov.b32 %r5, 0;
XOR_LOOP:
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra XOR_DONE;
    shl.b64 %rd7, %rd4, 2;
    add.u64 %rd8, %rd1, %rd7;
    ld.global.u32 %r6, [%rd8];
    xor.b32 %r5, %r5, %r6;
    add.u64 %rd4, %rd4, %rd6;
    bra XOR_LOOP;
XOR_DONE:
    atom.global.xor.b32 %r7, [%rd3], %r5;
    ret;
}

.visible .entry cm_bump(.param .u64 cm_bump_p, .param .u32 cm_bump_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [cm_bump_p];
    ld.param.u32 %r1, [cm_bump_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra BUMP_DONE;
    cvta.to.global.u64 %rd1, %rd1;
    mul.wide.u32 %rd2, %r5, 4;
    add.u64 %rd3, %rd1, %rd2;
    ld.global.u32 %r6, [%rd3];
    add.u32 %r6, %r6, 1;
    st.global.u32 [%rd3], %r6;
BUMP_DONE:
    ret;
}
";

/// Threads per block of [`Probes::bump`] (graphs.cu's `bump<<<(n + 255) / 256, 256>>>`).
pub const BUMP_BLOCK: u32 = 256;

/// Blocks of [`Probes::bump`] over `n` words: one thread per word, as graphs.cu launches it.
pub fn bump_grid(n: u32) -> u32 {
    n.div_ceil(BUMP_BLOCK)
}

/// The [`PROBE_PTX`] kernels, loaded once and looked up once.
#[derive(Debug)]
pub struct Probes {
    // Field order: the kernel handles are dropped before the library that owns them.
    read: RawKernel,
    write: RawKernel,
    fault: RawKernel,
    wait: RawKernel,
    spin: RawKernel,
    xor: RawKernel,
    bump: RawKernel,
    lib: Library,
    sms: u32,
}

// SAFETY: kernel handles are plain runtime handles, valid on any thread while `lib` lives.
unsafe impl Send for Probes {}
// SAFETY: only `&self` methods that pass the handles to thread-safe runtime calls.
unsafe impl Sync for Probes {}

impl Probes {
    /// Loads [`PROBE_PTX`] for the current device.
    pub fn load() -> Result<Self> {
        let sms = Device::current()?.multiprocessor_count()?.max(1) as u32;
        let lib = Library::load_ptx(PROBE_PTX)?;
        let k = |name| lib.kernel(name).map(|k| k.raw);
        Ok(Probes {
            read: k("cm_read")?,
            write: k("cm_write")?,
            fault: k("cm_fault")?,
            wait: k("cm_wait")?,
            spin: k("cm_spin")?,
            xor: k("cm_xor")?,
            bump: k("cm_bump")?,
            sms,
            lib,
        })
    }

    fn kernel(&self, raw: RawKernel) -> Kernel<'_> {
        Kernel {
            raw,
            lib: &self.lib,
        }
    }

    /// Grid size that fills the device: 8 blocks of 512 threads per multiprocessor.
    fn grid(&self) -> u32 {
        self.sms * 8
    }

    /// Queues `cm_read` over `bytes` bytes at device address `p`. `bytes` must be a non-zero
    /// multiple of 16 ([`Misuse::InvalidArgument`] otherwise).
    ///
    /// # Safety
    /// `p` must be device-accessible memory of at least `bytes` bytes, 16-byte aligned, alive
    /// until the kernel completes; `sink` a device-accessible `u64`.
    pub unsafe fn read(
        &self,
        p: *const c_void,
        bytes: usize,
        sink: *mut u64,
        stream: &Stream,
    ) -> Result<()> {
        let mut p = p;
        let mut n = whole_words("Probes::read", bytes)?;
        let mut sink = sink;
        let mut args = [
            (&mut p as *mut *const c_void).cast(),
            (&mut n as *mut u64).cast(),
            (&mut sink as *mut *mut u64).cast(),
        ];
        // SAFETY: three arguments of the kernel's types; the caller vouches for the memory.
        unsafe {
            self.kernel(self.read)
                .launch(self.grid(), 512, 0, stream, &mut args)
        }
    }

    /// Queues `cm_write` over `bytes` bytes at device address `p`; `bytes` as for
    /// [`read`](Self::read).
    ///
    /// # Safety
    /// `p` must be device-accessible, writable, 16-byte aligned memory of at least `bytes`
    /// bytes, alive and not read by the host until the kernel completes.
    pub unsafe fn write(&self, p: *mut c_void, bytes: usize, stream: &Stream) -> Result<()> {
        let mut p = p;
        let mut n = whole_words("Probes::write", bytes)?;
        let mut args = [
            (&mut p as *mut *mut c_void).cast(),
            (&mut n as *mut u64).cast(),
        ];
        // SAFETY: two arguments of the kernel's types; the caller vouches for the memory.
        unsafe {
            self.kernel(self.write)
                .launch(self.grid(), 512, 0, stream, &mut args)
        }
    }

    /// Queues `cm_bump`: adds 1 to each of the `n` `u32` at device address `p`, one thread per
    /// word in [`bump_grid`]`(n)` blocks of [`BUMP_BLOCK`] (graphs.cu's `bump`, for benchmarks
    /// that set cuda-mem beside it). `n` must be non-zero ([`Misuse::InvalidArgument`]
    /// otherwise: an empty grid is not a launch).
    ///
    /// # Safety
    /// `p` must be device-accessible, writable, 4-byte aligned memory of at least `n` `u32`,
    /// alive and not accessed by the host until the kernel completes.
    pub unsafe fn bump(&self, p: *mut u32, n: u32, stream: &Stream) -> Result<()> {
        if n == 0 {
            return Err(Misuse::InvalidArgument {
                op: "Probes::bump",
                reason: "0 words: an empty grid is not a launch".into(),
            }
            .into());
        }
        let mut p = p;
        let mut n = n;
        let grid = bump_grid(n);
        let mut args = [
            (&mut p as *mut *mut u32).cast(),
            (&mut n as *mut u32).cast(),
        ];
        // SAFETY: two arguments of the kernel's types (a pointer, a u32); the caller vouches
        // for the memory.
        unsafe {
            self.kernel(self.bump)
                .launch(grid, BUMP_BLOCK, 0, stream, &mut args)
        }
    }

    /// Queues `cm_fault`, a single store through `p`.
    ///
    /// # Safety
    /// With an invalid `p` this corrupts the CUDA context of the whole process (a sticky
    /// error): use it only in a process made for it.
    pub unsafe fn fault(&self, p: *mut u32, stream: &Stream) -> Result<()> {
        let mut p = p;
        let mut args = [(&mut p as *mut *mut u32).cast()];
        // SAFETY: one argument of the kernel's type; the caller accepts the consequences.
        unsafe { self.kernel(self.fault).launch(1, 1, 0, stream, &mut args) }
    }

    /// Queues `cm_wait`: one thread spins until the `u32` at `flag` is non-zero, or
    /// `timeout_ns` have passed.
    ///
    /// # Safety
    /// `flag` must be device-accessible memory (mapped host memory, for a host to release it)
    /// that stays alive until the kernel completes.
    pub unsafe fn wait(&self, flag: *const u32, timeout_ns: u64, stream: &Stream) -> Result<()> {
        let mut flag = flag;
        let mut timeout_ns = timeout_ns;
        let mut args = [
            (&mut flag as *mut *const u32).cast(),
            (&mut timeout_ns as *mut u64).cast(),
        ];
        // SAFETY: two arguments of the kernel's types; the caller vouches for the memory.
        unsafe { self.kernel(self.wait).launch(1, 1, 0, stream, &mut args) }
    }

    /// The XOR of every `u32` of `mem`, computed by a kernel on `stream`: **any** memory of
    /// cuda-mem that the device can address (device, pinned, mapped, managed, registered, and
    /// views of them), through nothing but the public API: the read guard orders the kernel
    /// after pending writes and records it, so the result is exact whatever was queued before.
    pub fn xor_checksum<M: DevicePtr<u32> + ?Sized>(
        &self,
        mem: &M,
        stream: &Stream,
    ) -> Result<u32> {
        let mut out = DeviceBuffer::<u32>::zeroed(1)?;
        {
            let input = mem.device_ptr(stream)?;
            let mut n = input.len() as u64;
            if n > 0 {
                let result = out.device_ptr_mut(stream)?;
                let mut p = input.as_ptr();
                let mut o = result.as_mut_ptr();
                let mut args = [
                    (&mut p as *mut *const u32).cast(),
                    (&mut n as *mut u64).cast(),
                    (&mut o as *mut *mut u32).cast(),
                ];
                // SAFETY: three arguments of the kernel's types: the read guard's `n` words and
                // the write guard's one word, both queued on the guards' stream while they live
                // (the guards record the launch on both buffers).
                unsafe {
                    self.kernel(self.xor)
                        .launch(self.grid(), 512, 0, stream, &mut args)?
                };
            }
        }
        Ok(out.to_vec()?[0])
    }

    /// Queues `cm_spin`: one thread that holds `stream` for `ns` nanoseconds and touches no
    /// memory.
    pub fn spin(&self, ns: u64, stream: &Stream) -> Result<()> {
        let mut ns = ns;
        let mut args = [(&mut ns as *mut u64).cast()];
        // SAFETY: one argument of the kernel's type (u64); the kernel touches no memory.
        unsafe { self.kernel(self.spin).launch(1, 1, 0, stream, &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_mem::Error;

    #[test]
    fn probes_take_whole_words_only() {
        assert_eq!(whole_words("t", 16).unwrap(), 1);
        assert_eq!(whole_words("t", 1 << 20).unwrap(), 65_536);
        for bad in [0usize, 20] {
            let e = whole_words("t", bad).unwrap_err();
            assert_eq!(
                e,
                Error::Misuse(Misuse::InvalidArgument {
                    op: "t",
                    reason: format!("{bad} bytes is not a non-zero multiple of 16"),
                })
            );
        }
    }
}

#[cfg(test)]
mod bump_tests {
    /// One thread per word, in whole blocks of 256: graphs.cu's `(n + 255) / 256`.
    #[test]
    fn the_bump_grid_is_graphs_cu_grid() {
        for (n, blocks) in [
            (1, 1),
            (255, 1),
            (256, 1),
            (257, 2),
            (1024, 4),
            (u32::MAX, 16_777_216),
        ] {
            assert_eq!(super::bump_grid(n), blocks, "n = {n}");
        }
    }
}

#[cfg(test)]
mod name_tests {
    #[test]
    fn a_kernel_name_with_a_nul_is_refused_by_name() {
        assert!(super::kernel_name("cm_read").is_ok());
        let e = super::kernel_name("cm\0read").unwrap_err();
        assert_eq!(
            e.to_string(),
            "Library::kernel: kernel name \"cm\\0read\" contains a NUL byte"
        );
    }
}
