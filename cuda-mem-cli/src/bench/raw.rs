//! The raw path: the same copies and allocations made directly through `cuda-mem-sys`, as a
//! C++ program would, so that the overhead of the safe API shows as a ratio.

use std::os::raw::c_void;

use cuda_mem::{sys, Error, ErrorCode, Result, Stream};

/// A runtime code as a `Result`, clearing the runtime's last-error state on failure: the
/// library's own check, public for raw calls like these.
pub use cuda_mem::check;

/// `cudaMemcpy`, or `cudaMemcpyAsync` on `stream` when `stream` is given.
///
/// # Safety
/// `dst` and `src` must be valid for `bytes` bytes of the copy `kind` (host or device
/// memory as `kind` says, or memory the runtime can reach under unified addressing), must not
/// overlap, and, for an asynchronous copy, stay valid and untouched by the host until the
/// stream has passed the copy.
pub unsafe fn memcpy(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: sys::cudaMemcpyKind,
    stream: Option<&Stream>,
) -> Result<()> {
    let code = match stream {
        // SAFETY: the caller guarantees the pointers and their lifetime.
        Some(s) => unsafe { sys::cudaMemcpyAsync(dst, src, bytes, kind, s.as_raw()) },
        // SAFETY: as above; the copy is complete when the call returns.
        None => unsafe { sys::cudaMemcpy(dst, src, bytes, kind) },
    };
    check(code, || {
        format!(
            "cudaMemcpy{}({bytes} bytes, kind {})",
            if stream.is_some() { "Async" } else { "" },
            kind.0
        )
    })
}

/// One raw allocation + free of `kind` (see `bench::alloc`): `cudaMalloc`/`cudaFree`,
/// `cudaHostAlloc`/`cudaFreeHost` (default, write-combined, or mapped with
/// `cudaHostGetDevicePointer`), `cudaMallocManaged`/`cudaFree`. The caller keeps managed
/// requests within the device's free memory.
pub fn alloc_free(kind: &str, bytes: usize) -> Result<()> {
    let mut p: *mut c_void = std::ptr::null_mut();
    match kind {
        "device" => {
            // SAFETY: `p` is a valid out-pointer.
            let code = unsafe { sys::cudaMalloc(&mut p, bytes) };
            check(code, || format!("cudaMalloc({bytes})"))?;
            // SAFETY: `p` came from cudaMalloc above and is freed once.
            let code = unsafe { sys::cudaFree(p) };
            check(code, || "cudaFree".into())
        }
        "pinned" | "write_combined" | "mapped" => {
            let flags = match kind {
                "pinned" => sys::cudaHostAllocDefault,
                "write_combined" => sys::cudaHostAllocWriteCombined,
                _ => sys::cudaHostAllocMapped,
            };
            // SAFETY: `p` is a valid out-pointer; the flags are documented values.
            let code = unsafe { sys::cudaHostAlloc(&mut p, bytes, flags) };
            check(code, || format!("cudaHostAlloc({bytes}, {flags:#x})"))?;
            let mut result = Ok(());
            if kind == "mapped" {
                let mut d: *mut c_void = std::ptr::null_mut();
                // SAFETY: valid out-pointer; `p` is a live mapped allocation; flags must be 0.
                let code = unsafe { sys::cudaHostGetDevicePointer(&mut d, p, 0) };
                result = check(code, || "cudaHostGetDevicePointer".into());
            }
            // SAFETY: `p` came from cudaHostAlloc above and is freed once.
            let code = unsafe { sys::cudaFreeHost(p) };
            result.and(check(code, || "cudaFreeHost".into()))
        }
        "managed" => {
            // SAFETY: `p` is a valid out-pointer; cudaMemAttachGlobal is a documented flag.
            let code = unsafe { sys::cudaMallocManaged(&mut p, bytes, sys::cudaMemAttachGlobal) };
            check(code, || format!("cudaMallocManaged({bytes})"))?;
            // SAFETY: `p` came from cudaMallocManaged above and is freed once.
            let code = unsafe { sys::cudaFree(p) };
            check(code, || "cudaFree".into())
        }
        other => Err(Error::Cuda {
            code: ErrorCode::INVALID_VALUE,
            call: format!("raw::alloc_free({other})"),
        }),
    }
}

/// One raw `cudaHostRegister` + `cudaHostUnregister` of `mem`.
pub fn register_unregister(mem: &mut [u8]) -> Result<()> {
    let (p, bytes) = (mem.as_mut_ptr().cast::<c_void>(), mem.len());
    // SAFETY: `p` covers `bytes` bytes that the exclusive borrow keeps alive and unaliased
    // until the unregistration below.
    let code = unsafe { sys::cudaHostRegister(p, bytes, sys::cudaHostRegisterDefault) };
    check(code, || format!("cudaHostRegister({bytes})"))?;
    // SAFETY: `p` was registered above and is unregistered once.
    let code = unsafe { sys::cudaHostUnregister(p) };
    check(code, || "cudaHostUnregister".into())
}
