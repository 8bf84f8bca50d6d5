//! Bad input, table-driven: every constructor and copy with zero lengths, `usize::MAX`,
//! overflowing byte sizes, mismatched lengths, bad device ordinals, rejected flags and null
//! pointers. Each gives its exact error; none panics or leaks. These checks run before the
//! runtime is called, so most of them hold on a machine without a GPU too.

use cuda_mem::{
    alloc_mapped, alloc_mapped_uva, copy, copy_range, Attach, Device, DeviceBuffer, Error,
    HostAllocFlags, HostRegisterFlags, ManagedBuffer, MappedBuffer, Misuse, PinnedBuffer,
    RegisteredSlice, RegisteredVec,
};
use cuda_mem_tests::has_gpu;

fn misuse<T: std::fmt::Debug>(r: cuda_mem::Result<T>) -> Misuse {
    match r {
        Err(Error::Misuse(m)) => m,
        other => panic!("expected a misuse error, got {other:?}"),
    }
}

type Ctor = fn(usize) -> cuda_mem::Result<()>;

/// Every allocating constructor, over `u64` elements, dropping what it made.
fn constructors() -> Vec<(&'static str, &'static str, Ctor)> {
    vec![
        ("DeviceBuffer::uninit", "DeviceBuffer::uninit", |n| {
            DeviceBuffer::<u64>::uninit(n).map(drop)
        }),
        ("DeviceBuffer::zeroed", "DeviceBuffer::zeroed", |n| {
            DeviceBuffer::<u64>::zeroed(n).map(drop)
        }),
        ("PinnedBuffer::zeroed", "PinnedBuffer::zeroed", |n| {
            PinnedBuffer::<u64>::zeroed(n, HostAllocFlags::DEFAULT).map(drop)
        }),
        (
            "PinnedBuffer::zeroed(WC|PORTABLE)",
            "PinnedBuffer::zeroed",
            |n| {
                PinnedBuffer::<u64>::zeroed(
                    n,
                    HostAllocFlags::WRITE_COMBINED | HostAllocFlags::PORTABLE,
                )
                .map(drop)
            },
        ),
        (
            "PinnedBuffer::malloc_host",
            "PinnedBuffer::malloc_host",
            |n| PinnedBuffer::<u64>::malloc_host(n).map(drop),
        ),
        ("MappedBuffer::zeroed", "MappedBuffer::zeroed", |n| {
            MappedBuffer::<u64>::zeroed(n, HostAllocFlags::PORTABLE).map(drop)
        }),
        ("alloc_mapped", "alloc_mapped", |n| {
            alloc_mapped::<u64>(n).map(drop)
        }),
        ("alloc_mapped_uva", "alloc_mapped_uva", |n| {
            alloc_mapped_uva::<u64>(n).map(drop)
        }),
        ("ManagedBuffer::zeroed", "ManagedBuffer::zeroed", |n| {
            ManagedBuffer::<u64>::zeroed(n, Attach::Global).map(drop)
        }),
        (
            "ManagedBuffer::zeroed(Host)",
            "ManagedBuffer::zeroed",
            |n| ManagedBuffer::<u64>::zeroed(n, Attach::Host).map(drop),
        ),
    ]
}

#[test]
fn zero_length_is_refused_by_every_constructor() {
    for (name, op, ctor) in constructors() {
        assert_eq!(misuse(ctor(0)), Misuse::ZeroLength { op }, "{name}");
    }
    let mut empty: Vec<u64> = Vec::new();
    assert_eq!(
        misuse(RegisteredSlice::register(
            &mut empty,
            HostRegisterFlags::DEFAULT,
            |_| -> cuda_mem::Result<()> { panic!("the closure of a refused registration ran") }
        )),
        Misuse::ZeroLength {
            op: "RegisteredSlice::register"
        }
    );
    assert_eq!(
        misuse(RegisteredVec::register(
            Vec::<u64>::new(),
            HostRegisterFlags::MAPPED
        )),
        Misuse::ZeroLength {
            op: "RegisteredVec::register"
        }
    );
    assert_eq!(
        misuse(DeviceBuffer::<u8>::from_slice(&[])),
        Misuse::ZeroLength {
            op: "DeviceBuffer::from_slice"
        }
    );
    assert_eq!(
        misuse(PinnedBuffer::<u8>::from_slice(&[], HostAllocFlags::DEFAULT)),
        Misuse::ZeroLength {
            op: "PinnedBuffer::from_slice"
        }
    );
}

#[test]
fn overflowing_lengths_are_refused_by_every_constructor() {
    for len in [usize::MAX, usize::MAX / 8 + 1, usize::MAX / 4] {
        for (name, _, ctor) in constructors() {
            assert_eq!(
                misuse(ctor(len)),
                Misuse::SizeOverflow { len, elem_size: 8 },
                "{name} with {len}"
            );
        }
    }
    // Byte-sized elements: usize::MAX bytes fit in usize but exceed isize::MAX.
    assert_eq!(
        misuse(DeviceBuffer::<u8>::uninit(usize::MAX)),
        Misuse::SizeOverflow {
            len: usize::MAX,
            elem_size: 1
        }
    );
}

#[test]
fn mismatched_and_out_of_range_copies() {
    let mut three = vec![0u32; 3];
    let four = vec![1u32; 4];
    assert_eq!(
        misuse(copy(&mut three, &four)),
        Misuse::LengthMismatch { dst: 3, src: 4 }
    );
    assert_eq!(
        misuse(copy(&mut three[..], &four[..2])),
        Misuse::LengthMismatch { dst: 3, src: 2 }
    );
    assert_eq!(
        misuse(copy_range(&mut three, 2, &four, 0, 2)),
        Misuse::OutOfBounds {
            offset: 2,
            len: 2,
            buffer_len: 3
        }
    );
    assert_eq!(
        misuse(copy_range(&mut three, 0, &four, usize::MAX, 2)),
        Misuse::OutOfBounds {
            offset: usize::MAX,
            len: 2,
            buffer_len: 4
        }
    );
    // Nothing was written by the refused copies.
    assert_eq!(three, vec![0; 3]);
    // A valid host-to-host copy goes to the runtime (cudaMemcpyHostToHost), which needs a
    // driver.
    match copy_range(&mut three, 1, &four, 0, 2) {
        Ok(()) => assert_eq!(three, vec![0, 1, 1]),
        Err(e) => assert!(!has_gpu() && e.is_no_device(), "{e}"),
    }
}

#[test]
fn from_raw_rejects_null_zero_and_misaligned() {
    // SAFETY: each call is refused before the pointer is used or owned.
    unsafe {
        assert_eq!(
            misuse(DeviceBuffer::<u32>::from_raw(std::ptr::null_mut(), 4)),
            Misuse::NullPointer {
                op: "DeviceBuffer::from_raw"
            }
        );
        let fake = 0x1000 as *mut u32;
        assert_eq!(
            misuse(DeviceBuffer::<u32>::from_raw(fake, 0)),
            Misuse::ZeroLength {
                op: "DeviceBuffer::from_raw"
            }
        );
        assert_eq!(
            misuse(DeviceBuffer::<u32>::from_raw(fake, usize::MAX)),
            Misuse::SizeOverflow {
                len: usize::MAX,
                elem_size: 4
            }
        );
        assert_eq!(
            misuse(DeviceBuffer::<u32>::from_raw(0x1002 as *mut u32, 1)),
            Misuse::Misaligned {
                addr: 0x1002,
                align: 4
            }
        );
    }
}

/// `from_raw` of mapped and registered memory: bad raw parts and flags are refused before the
/// pointer is used or owned (so without a GPU too); the pinned-memory check that follows needs
/// the runtime, and reports its absence exactly.
#[test]
fn from_raw_of_mapped_and_registered_memory_checks_its_parts() {
    let fake = 0x1000 as *mut u32;
    let (m_op, r_op) = ("MappedBuffer::from_raw", "RegisteredVec::from_raw");
    // SAFETY: each call is refused before the pointer is used or owned.
    unsafe {
        assert_eq!(
            misuse(MappedBuffer::<u32>::from_raw(
                std::ptr::null_mut(),
                4,
                HostAllocFlags::MAPPED
            )),
            Misuse::NullPointer { op: m_op }
        );
        assert_eq!(
            misuse(MappedBuffer::<u32>::from_raw(
                fake,
                0,
                HostAllocFlags::MAPPED
            )),
            Misuse::ZeroLength { op: m_op }
        );
        for flags in [
            HostAllocFlags::DEFAULT,
            HostAllocFlags::PORTABLE | HostAllocFlags::WRITE_COMBINED,
        ] {
            assert_eq!(
                misuse(MappedBuffer::<u32>::from_raw(fake, 4, flags)),
                Misuse::InvalidFlags {
                    op: "MappedBuffer::from_raw (MAPPED is required)",
                    flags: flags.bits()
                }
            );
        }
        assert_eq!(
            misuse(RegisteredVec::<u32>::from_raw(
                std::ptr::null_mut(),
                4,
                4,
                HostRegisterFlags::DEFAULT
            )),
            Misuse::NullPointer { op: r_op }
        );
        assert_eq!(
            misuse(RegisteredVec::<u32>::from_raw(
                fake,
                0,
                4,
                HostRegisterFlags::DEFAULT
            )),
            Misuse::ZeroLength { op: r_op }
        );
        assert_eq!(
            misuse(RegisteredVec::<u32>::from_raw(
                0x1002 as *mut u32,
                1,
                1,
                HostRegisterFlags::DEFAULT
            )),
            Misuse::Misaligned {
                addr: 0x1002,
                align: 4
            }
        );
        assert_eq!(
            misuse(RegisteredVec::<u32>::from_raw(
                fake,
                4,
                3,
                HostRegisterFlags::DEFAULT
            )),
            Misuse::InvalidArgument {
                op: r_op,
                reason: "capacity 3 is less than the length 4".into()
            }
        );
    }
    if has_gpu() {
        return; // the pinned-memory check on a GPU: tests/all/registered.rs, mapped.rs
    }
    let mut v = std::mem::ManuallyDrop::new(vec![0u32; 64]);
    let (p, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
    // SAFETY: refused (no driver to ask whether the memory is registered): nothing is adopted.
    let e =
        unsafe { RegisteredVec::from_raw(p, len, cap, HostRegisterFlags::DEFAULT) }.unwrap_err();
    assert!(e.is_no_device(), "{e}");
    // SAFETY: as above; the device check comes first for mapped memory.
    let e = unsafe { MappedBuffer::from_raw(p, len, HostAllocFlags::MAPPED) }.unwrap_err();
    assert!(e.is_no_device(), "{e}");
    // SAFETY: nothing adopted it: the Vec is still ours to drop.
    drop(unsafe { std::mem::ManuallyDrop::take(&mut v) });
}

#[test]
fn flags_the_api_rejects() {
    // cudaMemAttachSingle is only for cudaStreamAttachMemAsync.
    assert!(matches!(
        misuse(ManagedBuffer::<u8>::zeroed(16, Attach::Single)),
        Misuse::InvalidFlags { flags: 4, .. }
    ));
    // Unknown bits cannot even be constructed.
    assert_eq!(HostAllocFlags::from_bits(0x100), None);
    assert_eq!(
        HostRegisterFlags::from_bits(0x4),
        None,
        "IoMemory is not offered"
    );
    assert_eq!(
        HostAllocFlags::from_bits(7),
        Some(HostAllocFlags::PORTABLE | HostAllocFlags::MAPPED | HostAllocFlags::WRITE_COMBINED)
    );
    assert_eq!(
        (HostAllocFlags::PORTABLE | HostAllocFlags::MAPPED).to_string(),
        "PORTABLE|MAPPED"
    );
    assert_eq!(HostAllocFlags::DEFAULT.to_string(), "DEFAULT");
}

#[test]
fn out_of_range_device_ordinals() {
    if !has_gpu() {
        // Without a driver the count itself fails first, with the driver error.
        assert!(Device::get(99).unwrap_err().is_no_device());
        return;
    }
    let count = Device::count().unwrap();
    for ordinal in [-1, count, 99, i32::MAX] {
        assert_eq!(
            misuse(Device::get(ordinal)),
            Misuse::DeviceOutOfRange { ordinal, count }
        );
    }
}
