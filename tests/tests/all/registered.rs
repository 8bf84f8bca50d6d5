//! Registered host memory on the GPU: pinned in place, pointer kinds, double registration,
//! mapped registrations and asynchronous copies from an owned `Vec`.

use cuda_mem::DevicePtrMut as _;
use cuda_mem::{
    copy, copy_async, pointer_info, sys, DeviceBuffer, ErrorCode, HostRegisterFlags, Misuse,
    PointerKind, RegisteredSlice, RegisteredVec, Stream,
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

/// A registered `Vec` leaves with its registration (`into_raw`) and is adopted back
/// (`from_raw`) with its data; the adopted registration ends on drop like one made here, and
/// unregistered memory is refused and stays the caller's.
#[test]
fn registered_vec_moves_out_and_back_with_its_registration() {
    gpu_or_skip!();
    let stream = Stream::new().unwrap();
    let data = pattern(1 << 20, 42);
    let mut rv = RegisteredVec::register(vec![0u32; 1 << 20], HostRegisterFlags::PORTABLE).unwrap();
    let mut dev = DeviceBuffer::from_slice(&data).unwrap();
    copy_async(&mut rv, &dev, &stream).unwrap();
    let (p, len, cap) = rv.into_raw().unwrap(); // waits for the copy
    assert_eq!(len, 1 << 20);
    assert!(cap >= len);
    assert_eq!(
        pointer_info(p).unwrap().kind,
        PointerKind::PinnedHost,
        "still registered"
    );
    // SAFETY: the raw parts of a Vec<u32> registered PORTABLE, from `into_raw` above.
    let mut rv =
        unsafe { RegisteredVec::from_raw(p, len, cap, HostRegisterFlags::PORTABLE) }.unwrap();
    assert_eq!(rv.flags(), HostRegisterFlags::PORTABLE);
    assert!(rv.as_slice().unwrap() == &data[..]);
    // Adopted memory takes part in asynchronous work like any registered Vec.
    dev.memset(0).unwrap();
    copy_async(&mut dev, &rv, &stream).unwrap();
    assert!(dev.to_vec().unwrap() == data);
    rv.as_mut_slice().unwrap().fill(5);
    let back = rv.into_vec().unwrap();
    assert_eq!(
        pointer_info(back.as_ptr()).unwrap().kind,
        PointerKind::UnregisteredHost
    );
    assert!(back.iter().all(|&v| v == 5));

    // A Vec registered by a raw call (other code), adopted, unregistered on drop.
    let mut v = std::mem::ManuallyDrop::new(pattern(4096, 43));
    // SAFETY: the Vec's 16 KiB, registered once here and unregistered by the adopter's drop.
    let code = unsafe { sys::cudaHostRegister(v.as_mut_ptr().cast(), 4096 * 4, 0) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    let (p, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
    // SAFETY: the raw parts of that Vec (never dropped as such: ManuallyDrop), registered with
    // flags 0 = DEFAULT over exactly its `len` elements, with no GPU work pending.
    let adopted =
        unsafe { RegisteredVec::from_raw(p, len, cap, HostRegisterFlags::DEFAULT) }.unwrap();
    assert!(adopted.as_slice().unwrap() == &pattern(4096, 43)[..]);
    drop(adopted);
    assert_eq!(
        pointer_info(p.cast_const())
            .unwrap_or_else(|e| panic!("{e}"))
            .kind,
        PointerKind::UnregisteredHost
    );

    // Memory that is not registered is refused before anything is adopted.
    let mut plain = vec![1u32; 4096];
    // SAFETY: refused (not registered): the Vec stays ours.
    let e = unsafe {
        RegisteredVec::from_raw(
            plain.as_mut_ptr(),
            plain.len(),
            plain.capacity(),
            HostRegisterFlags::DEFAULT,
        )
    }
    .unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::InvalidArgument { op: "RegisteredVec::from_raw", reason })
            if reason.contains("first element") && reason.contains("UnregisteredHost")),
        "{e}"
    );
    plain[0] = 2; // still ours
}
