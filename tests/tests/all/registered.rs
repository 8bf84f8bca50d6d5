//! Registered host memory on the GPU: pinned in place, pointer kinds, double registration,
//! mapped registrations and asynchronous copies from an owned `Vec`.

use cuda_mem::DevicePtrMut as _;
use cuda_mem::{
    copy, copy_async, pointer_info, sys, DeviceBuffer, ErrorCode, HostRegisterFlags, PointerKind,
    RegisteredSlice, RegisteredVec, Stream,
};
use cuda_mem_tests::gpu_or_skip;

use crate::pattern;

#[test]
fn registered_slice_copies_and_is_pinned_only_while_registered() {
    gpu_or_skip!();
    let mut data = pattern(1 << 20, 40);
    let expect = data.clone();
    let p = data.as_ptr();
    assert_eq!(pointer_info(p).unwrap().kind, PointerKind::UnregisteredHost);
    let mut dev = DeviceBuffer::<u32>::zeroed(data.len()).unwrap();
    {
        let mut reg = RegisteredSlice::register(&mut data, HostRegisterFlags::DEFAULT).unwrap();
        assert_eq!(pointer_info(p).unwrap().kind, PointerKind::PinnedHost);
        copy(&mut dev, &reg).unwrap();
        reg.as_mut_slice().unwrap().fill(0);
        copy(&mut reg, &dev).unwrap();
        assert!(reg.as_slice().unwrap() == &expect[..]);
    }
    assert_eq!(pointer_info(p).unwrap().kind, PointerKind::UnregisteredHost);
    assert_eq!(data, expect);
}

#[test]
fn double_registration_is_the_runtime_error() {
    gpu_or_skip!();
    let mut a = vec![1u8; 1 << 16];
    let mut reg = RegisteredSlice::register(&mut a, HostRegisterFlags::PORTABLE).unwrap();
    // Register the same memory a second time, through the raw pointer (safe code cannot
    // borrow it twice).
    let slice = reg.as_mut_slice().unwrap();
    // SAFETY: the pointer covers the slice; the runtime refuses without touching the memory.
    let code = unsafe { sys::cudaHostRegister(slice.as_mut_ptr().cast(), slice.len(), 0) };
    assert_eq!(
        ErrorCode::from(code),
        ErrorCode::HOST_MEMORY_ALREADY_REGISTERED
    );
    // SAFETY: no arguments; clears the error just returned.
    unsafe { sys::cudaGetLastError() };
    reg.unregister().unwrap();
}

#[test]
fn mapped_registration_has_a_device_pointer() {
    gpu_or_skip!();
    let mut reg = RegisteredVec::register(
        vec![0u32; 4096],
        HostRegisterFlags::MAPPED | HostRegisterFlags::PORTABLE,
    )
    .unwrap();
    let stream = Stream::new().unwrap();
    let host = reg.as_ptr() as usize;
    {
        let dp = reg.device_ptr_mut(&stream).unwrap();
        assert_eq!(dp.addr() as usize, host, "UVA");
        // SAFETY: `dp` covers 16 KiB of registered memory, used on the guard's stream while
        // it lives; the guard records the memset, and host access below waits for it.
        let code = unsafe {
            sys::cudaMemsetAsync(dp.as_mut_ptr().cast(), 0x11, 4096 * 4, stream.as_raw())
        };
        assert_eq!(code, sys::cudaError::cudaSuccess);
    }
    assert!(reg.as_slice().unwrap().iter().all(|&w| w == 0x1111_1111));
}

#[test]
fn read_only_registration_where_supported() {
    let dev = gpu_or_skip!();
    let supported = dev
        .attribute(sys::cudaDeviceAttr::cudaDevAttrHostRegisterReadOnlySupported)
        .unwrap()
        != 0;
    let mut v = pattern(1 << 16, 9);
    let r = RegisteredSlice::register(&mut v, HostRegisterFlags::READ_ONLY);
    if supported {
        let reg = r.unwrap();
        let mut dev_buf = DeviceBuffer::<u32>::zeroed(1 << 16).unwrap();
        copy(&mut dev_buf, &reg).unwrap();
        assert_eq!(dev_buf.to_vec().unwrap(), pattern(1 << 16, 9));
    } else {
        assert!(r.is_err());
    }
}

#[test]
fn registered_vec_async_round_trip() {
    gpu_or_skip!();
    let stream = Stream::non_blocking().unwrap();
    let data = pattern(4 << 20, 41);
    let src = RegisteredVec::register(data.clone(), HostRegisterFlags::DEFAULT).unwrap();
    let mut dst =
        RegisteredVec::register(vec![0u32; data.len()], HostRegisterFlags::DEFAULT).unwrap();
    let mut dev = DeviceBuffer::<u32>::uninit(data.len()).unwrap();
    copy_async(&mut dev, &src, &stream).unwrap();
    copy_async(&mut dst, &dev, &stream).unwrap();
    // into_vec waits for the copy, unregisters and gives the Vec back.
    let back = dst.into_vec().unwrap();
    assert!(back == data);
    assert_eq!(
        pointer_info(back.as_ptr()).unwrap().kind,
        PointerKind::UnregisteredHost
    );
    drop(src);
}
