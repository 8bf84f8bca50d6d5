//! Registered host memory on the GPU: pinned in place, pointer kinds, double registration,
//! mapped registrations, asynchronous work on a registered slice inside its closure and on
//! an owned `Vec`, and registrations that end with their closure whatever it does.

use std::panic::{catch_unwind, AssertUnwindSafe};

use cuda_mem::{
    copy, copy_async, pointer_info, sys, DeviceBuffer, ErrorCode, HostRegisterFlags, Misuse,
    PointerKind, RegisteredSlice, RegisteredVec, Result, Stream,
};
use cuda_mem::{DevicePtr as _, DevicePtrMut as _};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{gpu_or_skip, still_pending};

use crate::{first_not_written, pattern, SPIN};

fn kind<T>(p: *const T) -> PointerKind {
    pointer_info(p).unwrap_or_else(|e| panic!("{e}")).kind
}

#[test]
fn registered_slice_copies_and_is_pinned_only_while_registered() {
    gpu_or_skip!();
    let mut data = pattern(1 << 20, 40);
    let expect = data.clone();
    let p = data.as_ptr();
    assert_eq!(kind(p), PointerKind::UnregisteredHost);
    let mut dev = DeviceBuffer::<u32>::zeroed(data.len()).unwrap();
    RegisteredSlice::register(&mut data, HostRegisterFlags::DEFAULT, |reg| {
        assert_eq!(kind(p), PointerKind::PinnedHost);
        copy(&mut dev, reg)?;
        reg.as_mut_slice()?.fill(0);
        copy(reg, &dev)?;
        assert!(reg.as_slice()? == &expect[..]);
        Ok(())
    })
    .unwrap();
    assert_eq!(kind(p), PointerKind::UnregisteredHost);
    assert_eq!(data, expect);
}

/// The runtime refuses to register memory twice: through a raw call, and through a nested
/// `register` of a part of a registered slice (whose closure then never runs).
#[test]
fn double_registration_is_the_runtime_error() {
    gpu_or_skip!();
    let mut a = vec![1u8; 1 << 16];
    RegisteredSlice::register(&mut a, HostRegisterFlags::PORTABLE, |reg| {
        // Register the same memory a second time, through the raw pointer (safe code cannot
        // borrow it twice).
        let slice = reg.as_mut_slice()?;
        // SAFETY: the pointer covers the slice; the runtime refuses without touching the
        // memory.
        let code = unsafe { sys::cudaHostRegister(slice.as_mut_ptr().cast(), slice.len(), 0) };
        assert_eq!(
            ErrorCode::from(code),
            ErrorCode::HOST_MEMORY_ALREADY_REGISTERED
        );
        // SAFETY: no arguments; clears the error just returned.
        unsafe { sys::cudaGetLastError() };
        let e = RegisteredSlice::register(
            &mut reg.as_mut_slice()?[4096..],
            HostRegisterFlags::DEFAULT,
            |_| -> Result<()> { panic!("the closure of a refused registration ran") },
        )
        .unwrap_err();
        assert_eq!(
            e.code(),
            Some(ErrorCode::HOST_MEMORY_ALREADY_REGISTERED),
            "{e}"
        );
        // SAFETY: as above.
        unsafe { sys::cudaGetLastError() };
        Ok(())
    })
    .unwrap();
    assert_eq!(kind(a.as_ptr()), PointerKind::UnregisteredHost);
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
    // The address is looked up once per registration: every guard hands out the same one.
    let again = reg.device_ptr(&stream).unwrap().addr();
    assert_eq!(again as usize, host);
}

/// A registered slice may be copied to the device but not written by it when registered
/// READ_ONLY (by a copy or through a write guard).
#[test]
fn read_only_registration_where_supported() {
    let dev = gpu_or_skip!();
    let supported = dev
        .attribute(sys::cudaDeviceAttr::cudaDevAttrHostRegisterReadOnlySupported)
        .unwrap()
        != 0;
    let stream = Stream::new().unwrap();
    let mut v = pattern(1 << 16, 9);
    let r = RegisteredSlice::register(&mut v, HostRegisterFlags::READ_ONLY, |reg| {
        let mut dev_buf = DeviceBuffer::<u32>::zeroed(1 << 16)?;
        copy(&mut dev_buf, reg)?;
        let by_copy = copy(reg, &dev_buf).unwrap_err();
        let by_guard = reg.device_ptr_mut(&stream).map(drop).unwrap_err();
        Ok((dev_buf.to_vec()?, by_copy, by_guard))
    });
    if supported {
        let (back, by_copy, by_guard) = r.unwrap();
        assert_eq!(back, pattern(1 << 16, 9));
        assert_eq!(
            by_copy.misuse(),
            Some(&Misuse::ReadOnlyDestination { op: "copy" })
        );
        assert_eq!(
            by_guard.misuse(),
            Some(&Misuse::ReadOnlyDestination {
                op: "device_ptr_mut"
            })
        );
    } else {
        assert!(r.is_err());
    }
}

/// Issue 19 item 4: a registration must not outlive the memory it pins. Once `register`
/// returns, however its closure ended (returning, or after `mem::forget` of everything it
/// can reach: the registration's reference and a guard), the pages are unregistered, so that
/// a new 64 MiB `Vec` (usually mapped at the same address: noted below) is ordinary pageable
/// memory and a device-to-host copy into it delivers the data. With the registration left
/// alive (the old `RegisteredSlice` could be forgotten), the new `Vec` was reported
/// `PinnedHost` and the copy went to the old, orphaned pages.
#[test]
fn a_registration_never_outlives_its_slice() {
    gpu_or_skip!();
    const N: usize = 16 << 20; // 64 MiB of u32
    let stream = Stream::new().unwrap();
    for (round, forget) in [(0u32, false), (1, true)] {
        let data = pattern(N, 50 + round);
        let dev = DeviceBuffer::from_slice(&data).unwrap();
        let mut v = vec![0u32; N];
        let old = v.as_ptr();
        RegisteredSlice::register(&mut v, HostRegisterFlags::MAPPED, |reg| {
            assert_eq!(kind(old), PointerKind::PinnedHost);
            if forget {
                std::mem::forget(reg.device_ptr(&stream)?);
                // All the closure holds of the registration is a reference: forgetting it
                // is what the lint says, nothing (the point of the closure-scoped form).
                #[allow(forgetting_references)]
                std::mem::forget(reg);
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(
            kind(old),
            PointerKind::UnregisteredHost,
            "round {round}: still registered after register returned"
        );
        drop(v);
        assert_eq!(
            kind(old),
            PointerKind::UnregisteredHost,
            "round {round}: the registration outlived the Vec"
        );
        let mut new = vec![0u32; N];
        if new.as_ptr() != old {
            eprintln!(
                "NOTE round {round}: the new Vec is at {:p}, the freed one was at {old:p}",
                new.as_ptr()
            );
        }
        assert_eq!(
            kind(new.as_ptr()),
            PointerKind::UnregisteredHost,
            "round {round}: a new Vec is taken for registered memory"
        );
        copy(&mut new, &dev).unwrap();
        assert!(new == data, "round {round}: the copy did not arrive");
    }
}

/// Zero-copy on a registered *sub-slice* with asynchronous copies (simpleZeroCopy's
/// `--use_generic_memory`, issue 20): both copies queue behind a slow kernel, the closure
/// returns while they are pending, and `register` waits for them before unregistering: the
/// data is there after it, and only in the registered part.
#[test]
fn registered_slice_async_copies_complete_before_register_returns() {
    gpu_or_skip!();
    const N: usize = 1 << 20;
    let stream = Stream::new().unwrap();
    let probes = Probes::load().unwrap();
    let input = pattern(N, 60);
    let output = pattern(N, 61);
    let mut buf = vec![7u32; 4 * N];
    buf[N..2 * N].copy_from_slice(&input);
    let part = buf[N..].as_ptr();
    let mut dev = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let from = DeviceBuffer::from_slice(&output).unwrap();
    RegisteredSlice::register(&mut buf[N..2 * N], HostRegisterFlags::DEFAULT, |reg| {
        probes.spin(SPIN, &stream)?;
        copy_async(&mut dev, reg, &stream)?; // reads the registered part
        copy_async(reg, &from, &stream)?; // then writes it
        still_pending(
            !stream.is_idle()?,
            "the copies ran before the closure returned",
        );
        Ok(())
    })
    .unwrap();
    assert!(buf[N..2 * N] == output[..], "the copy into the slice");
    assert!(buf[..N].iter().chain(&buf[2 * N..]).all(|&w| w == 7));
    assert_eq!(kind(part), PointerKind::UnregisteredHost);
    assert!(dev.to_vec().unwrap() == input, "the copy out of the slice");
}

/// Kernels on a MAPPED registered slice through its device pointer: one reads it
/// (`xor_checksum`, through the public `DevicePtr` trait), one writes it behind a slow
/// kernel, and host access inside the closure waits for the write.
#[test]
fn kernels_use_a_mapped_registered_slice_through_its_device_pointer() {
    gpu_or_skip!();
    const N: usize = 1 << 20;
    let stream = Stream::new().unwrap();
    let probes = Probes::load().unwrap();
    let mut buf = pattern(2 * N, 62);
    let want = buf[N..].iter().fold(0, |a, &w| a ^ w);
    RegisteredSlice::register(&mut buf[N..], HostRegisterFlags::MAPPED, |reg| {
        assert_eq!(probes.xor_checksum(&*reg, &stream)?, want);
        probes.spin(SPIN, &stream)?;
        {
            let out = reg.device_ptr_mut(&stream)?;
            // SAFETY: the guard covers the registered, mapped N words (16-byte aligned: a
            // large Vec's buffer is, and N is a multiple of 4), used on its stream while it
            // lives; it records the kernel, which host access and the closure's end wait for.
            unsafe { probes.write(out.as_mut_ptr().cast(), N * 4, &stream)? };
        }
        still_pending(!stream.is_idle()?, "the kernel ran before host access");
        assert_eq!(first_not_written(reg.as_slice()?), None);
        Ok(())
    })
    .unwrap();
    assert_eq!(first_not_written(&buf[N..]), None);
}

/// A write guard forgotten (`mem::forget`) after its kernel was queued: the closure returns
/// at once, and the end of the registration still waits for the kernel (its work was
/// recorded when the guard was made), so the data is there when `register` returns.
#[test]
fn a_forgotten_write_guard_is_still_waited_for_at_the_closure_end() {
    gpu_or_skip!();
    const N: usize = 1 << 20;
    let stream = Stream::new().unwrap();
    let probes = Probes::load().unwrap();
    let mut v = vec![0u32; N];
    RegisteredSlice::register(&mut v, HostRegisterFlags::MAPPED, |reg| {
        probes.spin(SPIN, &stream)?;
        let out = reg.device_ptr_mut(&stream)?;
        // SAFETY: as in the test above; the guard is then leaked, which safe code may do.
        unsafe { probes.write(out.as_mut_ptr().cast(), N * 4, &stream)? };
        std::mem::forget(out);
        still_pending(
            !stream.is_idle()?,
            "the kernel ran before the closure returned",
        );
        Ok(())
    })
    .unwrap();
    assert_eq!(first_not_written(&v), None);
    assert_eq!(kind(v.as_ptr()), PointerKind::UnregisteredHost);
}

/// A panic in the closure ends the registration as it unwinds: the pending copy is waited
/// for (its data is there) and the memory is unregistered.
#[test]
fn a_panic_in_the_closure_still_unregisters() {
    gpu_or_skip!();
    const N: usize = 1 << 20;
    let stream = Stream::new().unwrap();
    let probes = Probes::load().unwrap();
    let data = pattern(N, 63);
    let from = DeviceBuffer::from_slice(&data).unwrap();
    let mut v = vec![0u32; N];
    let p = v.as_ptr();
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        RegisteredSlice::register(&mut v, HostRegisterFlags::DEFAULT, |reg| -> Result<()> {
            probes.spin(SPIN, &stream)?;
            copy_async(reg, &from, &stream)?;
            still_pending(!stream.is_idle()?, "the copy ran before the panic");
            panic!("a panic in the closure");
        })
    }));
    assert!(unwound.is_err(), "the panic went missing");
    assert_eq!(kind(p), PointerKind::UnregisteredHost);
    assert!(v == data, "the copy was not waited for");
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
