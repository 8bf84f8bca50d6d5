//! Zero-copy mapped memory on the GPU: both `cudaAllocMapped` shapes, device writes seen on the
//! host, and no leak on any error path.

use cuda_mem::DevicePtrMut as _;
use cuda_mem::{
    alloc_mapped, alloc_mapped_uva, pointer_info, sys, Error, ErrorCode, HostAllocFlags,
    MappedBuffer, Misuse, PointerKind, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::gpu_or_skip;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn pair_shape_gives_cpu_and_gpu_pointers_and_device_memset_is_seen() {
    gpu_or_skip!();
    let buf = alloc_mapped::<u8>(1 << 20).unwrap();
    assert_eq!(buf.as_ptr() as usize, buf.device_address() as usize, "UVA");
    assert!(
        buf.as_slice().unwrap().iter().all(|&b| b == 0),
        "zeroed like the C++ helper"
    );
    let flags = buf.runtime_flags().unwrap();
    assert_ne!(flags & sys::cudaHostAllocMapped, 0);
    assert_eq!(
        pointer_info(buf.as_ptr()).unwrap().kind,
        PointerKind::PinnedHost
    );
    // cudaMemset through the device pointer, read on the CPU.
    // SAFETY: the device pointer covers 1 MiB; the device is synchronized before reading.
    let code = unsafe { sys::cudaMemset(buf.device_address().cast_mut().cast(), 0x3c, 1 << 20) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    // SAFETY: no arguments.
    let code = unsafe { sys::cudaDeviceSynchronize() };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    assert!(buf.as_slice().unwrap().iter().all(|&b| b == 0x3c));
}

#[test]
fn kernel_writes_through_the_device_pointer_are_read_on_the_host() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let stream = Stream::non_blocking().unwrap();
    let mut buf = alloc_mapped_uva::<u32>(4 * 65_536).unwrap();
    buf.as_mut_slice().unwrap().fill(0xffff_ffff);
    let bytes = buf.byte_len();
    {
        let out = buf.device_ptr_mut(&stream).unwrap();
        // SAFETY: the device pointer covers the buffer (a multiple of 16 bytes), used on the
        // guard's stream while it lives; the guard records the launch, so host access below
        // waits for it.
        unsafe {
            probes
                .write(out.as_mut_ptr().cast(), bytes, &stream)
                .unwrap()
        };
    }
    let host = buf.as_slice().unwrap();
    for (i, w) in host.chunks(4).enumerate() {
        assert_eq!(w, [i as u32; 4], "word {i}");
    }
}

#[test]
fn extra_flags_are_kept() {
    gpu_or_skip!();
    let buf = MappedBuffer::<u64>::zeroed(
        1000,
        HostAllocFlags::PORTABLE | HostAllocFlags::WRITE_COMBINED,
    )
    .unwrap();
    let want =
        sys::cudaHostAllocMapped | sys::cudaHostAllocPortable | sys::cudaHostAllocWriteCombined;
    assert_eq!(buf.runtime_flags().unwrap() & want, want);
    buf.free().unwrap();
}

/// The C++ helper leaks the host allocation when `cudaHostGetDevicePointer` fails or the
/// pointers differ. Ours frees it: after each failure the address is no longer pinned.
#[test]
fn error_paths_free_the_allocation() {
    gpu_or_skip!();
    static SEEN: AtomicUsize = AtomicUsize::new(0);

    // 1. The device-pointer lookup fails.
    let e = cuda_mem::testing::alloc_mapped_uva_with::<u8>(1 << 20, |host| {
        SEEN.store(host as usize, Ordering::SeqCst);
        Err(Error::Cuda {
            code: ErrorCode::INVALID_VALUE,
            call: "cudaHostGetDevicePointer(injected)".into(),
        })
    })
    .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::INVALID_VALUE));
    let host = SEEN.load(Ordering::SeqCst);
    assert_ne!(host, 0);
    assert_eq!(
        pointer_info(host as *const u8).unwrap().kind,
        PointerKind::UnregisteredHost,
        "freed after the lookup failed"
    );

    // 2. The pointers differ under UVA.
    let e = cuda_mem::testing::alloc_mapped_uva_with::<u8>(1 << 20, |host| {
        SEEN.store(host as usize, Ordering::SeqCst);
        Ok((host as usize + 4096) as *mut std::os::raw::c_void)
    })
    .unwrap_err();
    let host = SEEN.load(Ordering::SeqCst);
    assert_eq!(
        e.misuse(),
        Some(&Misuse::UvaPointerMismatch {
            host,
            device: host + 4096
        })
    );
    assert_eq!(
        pointer_info(host as *const u8).unwrap().kind,
        PointerKind::UnregisteredHost,
        "freed after the pointer mismatch"
    );

    // 3. The lookup returns null.
    let e = cuda_mem::testing::alloc_mapped_uva_with::<u8>(4096, |host| {
        SEEN.store(host as usize, Ordering::SeqCst);
        Ok(std::ptr::null_mut())
    })
    .unwrap_err();
    assert_eq!(
        e.misuse(),
        Some(&Misuse::NullPointer {
            op: "cudaHostGetDevicePointer"
        })
    );
    let host = SEEN.load(Ordering::SeqCst);
    assert_eq!(
        pointer_info(host as *const u8).unwrap().kind,
        PointerKind::UnregisteredHost
    );
}

/// Mapped memory leaves (`into_raw`) and comes back (`from_raw`) with its data and its device
/// address; memory allocated by a raw `cudaHostAlloc(MAPPED)` is adopted and written by a
/// kernel; memory the runtime does not know as pinned is refused and stays the caller's.
#[test]
fn mapped_memory_moves_out_and_back() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let stream = Stream::new().unwrap();
    let data = crate::pattern(4096, 12);
    let mut m = MappedBuffer::<u32>::zeroed(4096, HostAllocFlags::PORTABLE).unwrap();
    m.as_mut_slice().unwrap().copy_from_slice(&data);
    let device_address = m.device_address();
    let (p, n) = m.into_raw().unwrap();
    assert_eq!(n, 4096);
    assert_eq!(
        pointer_info(p).unwrap().kind,
        PointerKind::PinnedHost,
        "not freed"
    );
    // SAFETY: from `into_raw` of a cudaHostAlloc(PORTABLE | MAPPED) buffer of 4096 u32.
    let m =
        unsafe { MappedBuffer::from_raw(p, n, HostAllocFlags::PORTABLE | HostAllocFlags::MAPPED) }
            .unwrap();
    assert_eq!(m.device_address(), device_address);
    assert!(m.as_slice().unwrap() == &data[..]);
    m.free().unwrap();
    assert_eq!(
        pointer_info(p).unwrap().kind,
        PointerKind::UnregisteredHost,
        "freed"
    );

    let mut raw = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; 64 KiB of mapped pinned memory, adopted below.
    let code = unsafe { sys::cudaHostAlloc(&mut raw, 1 << 16, sys::cudaHostAllocMapped) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    // SAFETY: `raw` holds 64 KiB, written here before it is adopted (and so initialised).
    unsafe { std::ptr::write_bytes(raw.cast::<u8>(), 0xff, 1 << 16) };
    // SAFETY: fresh cudaHostAlloc(MAPPED) memory of 16384 initialised u32, owned by nothing else.
    let mut m =
        unsafe { MappedBuffer::<u32>::from_raw(raw.cast(), 1 << 14, HostAllocFlags::MAPPED) }
            .unwrap();
    {
        let w = m.device_ptr_mut(&stream).unwrap();
        // SAFETY: the guard covers 64 KiB (a multiple of 16 bytes), used on its stream while it
        // lives; host access below waits for the kernel.
        unsafe {
            probes
                .write(w.as_mut_ptr().cast(), 1 << 16, &stream)
                .unwrap()
        };
    }
    assert_eq!(crate::first_not_written(m.as_slice().unwrap()), None);
    drop(m); // cudaFreeHost

    let mut v = vec![0u32; 4096];
    // SAFETY: refused before anything is adopted (the Vec is pageable memory).
    let e = unsafe { MappedBuffer::from_raw(v.as_mut_ptr(), v.len(), HostAllocFlags::MAPPED) }
        .unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::InvalidArgument { op: "MappedBuffer::from_raw", reason })
            if reason.contains("UnregisteredHost")),
        "{e}"
    );
    v[0] = 1; // still ours
}
