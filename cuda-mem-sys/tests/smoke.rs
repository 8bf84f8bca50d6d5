//! Smoke test of the raw bindings against the linked cudart.
//!
//! Without a driver (CI): the runtime still reports its version, and `cudaGetDeviceCount` fails
//! with exactly `cudaErrorInsufficientDriver` or `cudaErrorNoDevice`. With a GPU: at least one
//! device, mapped pinned memory has equal host and device pointers (UVA), and a `cudaMemset`
//! through the device pointer is read back on the CPU.
//!
//! GPU parts skip with a message when no device is present, and fail instead when
//! `CUDA_MEM_REQUIRE_GPU=1`.

use cuda_mem_sys::*;
use std::ffi::CStr;
use std::os::raw::c_void;

fn header_version() -> i32 {
    // The bindings carry the header's `#define CUDART_VERSION`.
    CUDART_VERSION as i32
}

fn name(e: cudaError_t) -> String {
    // SAFETY: cudaGetErrorName accepts any value and returns a static C string.
    unsafe { CStr::from_ptr(cudaGetErrorName(e)) }
        .to_string_lossy()
        .into_owned()
}

/// The device count, or `None` (after printing why) when no device is present and the GPU is
/// not required.
fn device_count() -> Option<i32> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer.
    let e = unsafe { cudaGetDeviceCount(&mut n) };
    let require = std::env::var("CUDA_MEM_REQUIRE_GPU").as_deref() == Ok("1");
    if e == cudaError::cudaSuccess && n > 0 {
        return Some(n);
    }
    assert!(
        e == cudaError::cudaErrorInsufficientDriver || e == cudaError::cudaErrorNoDevice,
        "cudaGetDeviceCount without a device must fail with InsufficientDriver or NoDevice, got {} ({})",
        e.0,
        name(e)
    );
    assert!(
        !require,
        "CUDA_MEM_REQUIRE_GPU=1 but cudaGetDeviceCount gave {}",
        name(e)
    );
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIP: no CUDA device ({}); GPU checks skipped",
        name(e)
    );
    None
}

#[test]
fn runtime_version_matches_header() {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer; this call needs no driver.
    let e = unsafe { cudaRuntimeGetVersion(&mut v) };
    assert_eq!(e, cudaError::cudaSuccess, "{}", name(e));
    assert_eq!(v, header_version());
}

#[test]
fn device_count_is_exact_error_or_a_device() {
    if let Some(n) = device_count() {
        assert!(n >= 1);
    }
}

#[test]
fn error_names_are_known_for_the_driverless_codes() {
    assert_eq!(
        name(cudaError::cudaErrorInsufficientDriver),
        "cudaErrorInsufficientDriver"
    );
    assert_eq!(name(cudaError::cudaErrorNoDevice), "cudaErrorNoDevice");
    // An unknown code is a valid value of the newtype, and the runtime answers for it.
    let unknown = cudaError(987_654);
    assert_eq!(unknown.0, 987_654);
    assert!(!name(unknown).is_empty());
}

#[test]
fn mapped_memory_pointers_match_and_memset_is_seen_on_host() {
    if device_count().is_none() {
        return;
    }
    const N: usize = 1 << 20;
    let mut host: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer, non-zero size, documented flag.
    let e = unsafe { cudaHostAlloc(&mut host, N, cudaHostAllocMapped) };
    assert_eq!(e, cudaError::cudaSuccess, "cudaHostAlloc: {}", name(e));
    let mut dev: *mut c_void = std::ptr::null_mut();
    // SAFETY: `host` is a live mapped allocation.
    let e = unsafe { cudaHostGetDevicePointer(&mut dev, host, 0) };
    assert_eq!(e, cudaError::cudaSuccess, "{}", name(e));
    assert_eq!(host, dev, "UVA: host and device pointers of mapped memory");
    // SAFETY: `dev` covers N bytes; the memset is followed by a device synchronize before the
    // host reads.
    let e = unsafe { cudaMemset(dev, 0x5a, N) };
    assert_eq!(e, cudaError::cudaSuccess, "{}", name(e));
    // SAFETY: no arguments.
    let e = unsafe { cudaDeviceSynchronize() };
    assert_eq!(e, cudaError::cudaSuccess, "{}", name(e));
    // SAFETY: `host` covers N bytes written by the completed memset.
    let bytes = unsafe { std::slice::from_raw_parts(host as *const u8, N) };
    assert!(bytes.iter().all(|&b| b == 0x5a));
    // SAFETY: `host` came from cudaHostAlloc and is freed once.
    let e = unsafe { cudaFreeHost(host) };
    assert_eq!(e, cudaError::cudaSuccess, "{}", name(e));
}
