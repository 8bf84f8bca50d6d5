//! Differential tests against C++ references compiled with `cc` against the same toolkit
//! headers: the two `cudaAllocMapped` shapes, and the layout of the structs we pass.

use cuda_mem::{alloc_mapped, alloc_mapped_uva, sys, Error, Misuse};
use std::os::raw::{c_int, c_void};

extern "C" {
    fn ref_alloc_mapped_pair(size: usize, cpu: *mut *mut c_void, gpu: *mut *mut c_void) -> c_int;
    fn ref_alloc_mapped_single(size: usize, ptr: *mut *mut c_void) -> c_int;
    fn ref_free_host(p: *mut c_void) -> c_int;
    fn ref_get_last_error() -> c_int;
    fn layout_value(what: c_int) -> usize;
    fn layout_device_location(id: c_int) -> sys::cudaMemLocation;
}

/// One outcome, comparable between the two sides.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    /// Refused before CUDA was called (size 0).
    Refused,
    /// The pointers differed (shape 2).
    Mismatch,
    /// A runtime error code.
    Cuda(u32),
}

fn rust_outcome<T>(r: cuda_mem::Result<T>) -> Outcome {
    match r {
        Ok(_) => Outcome::Ok,
        Err(Error::Misuse(Misuse::ZeroLength { .. })) => Outcome::Refused,
        Err(Error::Misuse(Misuse::UvaPointerMismatch { .. })) => Outcome::Mismatch,
        Err(e) => Outcome::Cuda(e.code().expect("runtime error").0),
    }
}

fn cpp_outcome(code: c_int) -> Outcome {
    match code {
        0 => Outcome::Ok,
        -1 => Outcome::Refused,
        -2 => Outcome::Mismatch,
        c => Outcome::Cuda(c as u32),
    }
}

/// Valid sizes, zero, and a request too large for any host.
const SIZES: [usize; 4] = [4096, 3 << 20, 0, 1 << 50];

#[test]
fn pair_shape_matches_the_cpp_helper() {
    for size in SIZES {
        let (mut cpu, mut gpu) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers; the reference only calls the runtime.
        let code = unsafe { ref_alloc_mapped_pair(size, &mut cpu, &mut gpu) };
        let cpp = cpp_outcome(code);
        if cpp == Outcome::Ok {
            assert_eq!(cpu, gpu, "C++: UVA pointers");
            // SAFETY: `cpu` came from cudaHostAlloc in the reference.
            let code = unsafe { ref_free_host(cpu) };
            assert_eq!(code, 0);
        }
        // SAFETY: no arguments; the reference leaves the error set, the Rust side clears it.
        unsafe { ref_get_last_error() };
        let rust = rust_outcome(alloc_mapped::<u8>(size).map(|b| {
            assert_eq!(b.as_ptr() as usize, b.device_address() as usize);
            assert!(b.as_slice().unwrap().iter().all(|&x| x == 0));
        }));
        assert_eq!(rust, cpp, "size {size}");
    }
}

#[test]
fn single_pointer_shape_matches_the_cpp_helper() {
    for size in SIZES {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let code = unsafe { ref_alloc_mapped_single(size, &mut p) };
        let cpp = cpp_outcome(code);
        if cpp == Outcome::Ok {
            // SAFETY: `p` is the host (= device) pointer of a cudaHostAlloc allocation.
            let code = unsafe { ref_free_host(p) };
            assert_eq!(code, 0);
        }
        // SAFETY: no arguments.
        unsafe { ref_get_last_error() };
        let rust = rust_outcome(alloc_mapped_uva::<u8>(size));
        assert_eq!(rust, cpp, "size {size}");
    }
}

#[test]
fn struct_layouts_match_the_cpp_compiler() {
    use std::mem::{offset_of, size_of};
    // SAFETY: a pure function of its argument.
    let c = |what| unsafe { layout_value(what) };
    assert_eq!(size_of::<sys::cudaPointerAttributes>(), c(0));
    assert_eq!(offset_of!(sys::cudaPointerAttributes, devicePointer), c(1));
    assert_eq!(offset_of!(sys::cudaPointerAttributes, hostPointer), c(2));
    assert_eq!(size_of::<sys::cudaDeviceProp>(), c(3));
    assert_eq!(offset_of!(sys::cudaDeviceProp, totalGlobalMem), c(4));
    assert_eq!(size_of::<sys::dim3>(), c(5));
    assert_eq!(size_of::<sys::cudaMemLocation>(), c(6));
    assert_eq!(size_of::<sys::cudaError_t>(), c(7));
    assert_eq!(size_of::<sys::cudaMemcpyKind>(), c(8));
    assert_eq!(offset_of!(sys::cudaDeviceProp, pciBusID), c(9));
}

/// `cudaMemLocation::new`/`id` (the one accessor of a field that moved into a union in CUDA
/// 13.5) agree with the C++ compiler's layout on every toolkit.
#[test]
fn mem_location_accessor_matches_the_cpp_compiler() {
    use sys::cudaMemLocationType as T;
    let id: c_int = 0x0102_0304;
    let loc = sys::cudaMemLocation::new(T::cudaMemLocationTypeDevice, id);
    assert_eq!(loc.id(), id);
    assert_eq!(loc.type_, T::cudaMemLocationTypeDevice);
    // SAFETY: reads the bytes of a fully initialised plain C struct.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&loc as *const sys::cudaMemLocation).cast::<u8>(),
            std::mem::size_of::<sys::cudaMemLocation>(),
        )
    };
    // SAFETY: a pure function of its argument.
    let offset = unsafe { layout_value(10) };
    assert_eq!(&bytes[offset..offset + 4], &id.to_ne_bytes());
    // SAFETY: returns a plain C struct by value.
    let from_cpp = unsafe { layout_device_location(-7) };
    assert_eq!(from_cpp.id(), -7);
    assert_eq!(from_cpp.type_, T::cudaMemLocationTypeDevice);
}

/// A call that needs a newer driver says so in words, with both versions.
#[test]
fn newer_driver_error_is_explained() {
    let e = Error::Cuda {
        code: cuda_mem::ErrorCode(sys::cudaError::cudaErrorCallRequiresNewerDriver.0),
        call: "cudaMemPrefetchAsync(...)".into(),
    };
    let text = e.to_string();
    assert!(text.starts_with("cudaMemPrefetchAsync(...) failed: cudaErrorCallRequiresNewerDriver"));
    assert!(text.contains("needs a newer driver"), "{text}");
    let v = cuda_mem::BUILT_CUDART_VERSION;
    assert!(
        text.contains(&format!("CUDA {}.{}", v / 1000, v % 1000 / 10)),
        "{text}"
    );
    let plain = Error::Cuda {
        code: cuda_mem::ErrorCode(sys::cudaError::cudaErrorMemoryAllocation.0),
        call: "x".into(),
    };
    assert!(!plain.to_string().contains("driver"));
}
