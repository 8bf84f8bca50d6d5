//! Error conversion: raw codes, names, messages, helpers, and the no-driver path.

use cuda_mem::{
    alloc_mapped, alloc_mapped_uva, Attach, Device, DeviceBuffer, Error, ErrorCode, Event,
    HostAllocFlags, HostRegisterFlags, ManagedBuffer, PinnedBuffer, RegisteredSlice, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::has_gpu;

#[test]
fn unknown_codes_keep_their_number() {
    let code = ErrorCode(12_345);
    assert!(!code.is_known());
    let e = Error::Cuda {
        code,
        call: "cudaSomething(1)".into(),
    };
    assert_eq!(e.code(), Some(ErrorCode(12_345)));
    let msg = e.to_string();
    assert!(
        msg.starts_with("cudaSomething(1) failed: cudaError_t 12345 (unknown to this runtime): "),
        "{msg}"
    );
    assert!(!e.is_sticky() && !e.is_out_of_memory() && !e.is_no_device());
}

#[test]
fn known_codes_have_names_and_descriptions() {
    let oom = ErrorCode::MEMORY_ALLOCATION;
    assert_eq!(oom.0, 2);
    assert_eq!(oom.name(), "cudaErrorMemoryAllocation");
    assert_eq!(oom.description(), "out of memory");
    assert_eq!(oom.to_string(), "cudaErrorMemoryAllocation: out of memory");
    assert!(oom.is_out_of_memory() && !oom.is_sticky());
    assert!(ErrorCode::ILLEGAL_ADDRESS.is_sticky());
    assert!(
        ErrorCode(719).is_sticky(),
        "cudaErrorLaunchFailure is sticky"
    );
    assert!(!ErrorCode::INVALID_VALUE.is_sticky());
    assert!(ErrorCode::INSUFFICIENT_DRIVER.is_no_device() && ErrorCode::NO_DEVICE.is_no_device());
}

#[test]
fn error_is_send_sync_static_and_converts_to_anyhow() {
    fn assert_traits<E: std::error::Error + Send + Sync + 'static>() {}
    assert_traits::<Error>();
    fn fails() -> anyhow::Result<()> {
        Err(Error::Cuda {
            code: ErrorCode::MEMORY_ALLOCATION,
            call: "cudaMalloc(8 bytes)".into(),
        })?;
        Ok(())
    }
    let e = fails().unwrap_err();
    assert_eq!(
        e.to_string(),
        "cudaMalloc(8 bytes) failed: cudaErrorMemoryAllocation: out of memory"
    );
    // The raw code is the error's source.
    let src = std::error::Error::source(e.downcast_ref::<Error>().unwrap()).unwrap();
    assert_eq!(
        src.downcast_ref::<ErrorCode>(),
        Some(&ErrorCode::MEMORY_ALLOCATION)
    );
}

#[test]
fn message_names_the_call_and_its_arguments() {
    // Without a driver the allocation itself fails; with one, a request far beyond any host's
    // memory does. Either way the message has the CUDA_SAFECALL shape.
    let (len, expect_code) = if has_gpu() {
        (1usize << 50, ErrorCode::MEMORY_ALLOCATION)
    } else {
        (268_435_456, ErrorCode::INSUFFICIENT_DRIVER)
    };
    let e = PinnedBuffer::<u8>::zeroed(len, HostAllocFlags::MAPPED).unwrap_err();
    assert_eq!(e.code(), Some(expect_code));
    assert_eq!(
        e.to_string(),
        format!(
            "cudaHostAlloc({len} bytes, MAPPED) failed: {}: {}",
            expect_code.name(),
            expect_code.description()
        )
    );
    let e = PinnedBuffer::<u8>::zeroed(
        16,
        HostAllocFlags::PORTABLE | HostAllocFlags::WRITE_COMBINED,
    );
    if let Err(e) = e {
        assert!(e
            .to_string()
            .starts_with("cudaHostAlloc(16 bytes, PORTABLE|WRITE_COMBINED) failed: "));
    }
}

/// Every constructor, without a driver, returns exactly the no-driver error.
#[test]
fn every_constructor_reports_the_missing_driver() {
    if has_gpu() {
        cuda_mem_tests::skip("every_constructor_reports_the_missing_driver: a GPU is present");
        return;
    }
    fn is_no_driver<T: std::fmt::Debug>(what: &str, r: cuda_mem::Result<T>) {
        let e = r.expect_err(what);
        let code = e
            .code()
            .unwrap_or_else(|| panic!("{what}: not a runtime error: {e}"));
        assert!(
            code == ErrorCode::INSUFFICIENT_DRIVER || code == ErrorCode::NO_DEVICE,
            "{what}: {e}"
        );
        assert!(e.is_no_device(), "{what}");
    }
    is_no_driver("Device::count", Device::count());
    is_no_driver("Device::get", Device::get(0));
    is_no_driver("Device::current", Device::current());
    is_no_driver("DeviceBuffer::zeroed", DeviceBuffer::<u32>::zeroed(16));
    is_no_driver(
        "DeviceBuffer::from_slice",
        DeviceBuffer::from_slice(&[1u8, 2]),
    );
    is_no_driver(
        "PinnedBuffer::zeroed",
        PinnedBuffer::<u8>::zeroed(16, HostAllocFlags::DEFAULT),
    );
    is_no_driver(
        "PinnedBuffer::malloc_host",
        PinnedBuffer::<u8>::malloc_host(16),
    );
    is_no_driver("alloc_mapped", alloc_mapped::<u8>(16));
    is_no_driver("alloc_mapped_uva", alloc_mapped_uva::<u8>(16));
    is_no_driver(
        "ManagedBuffer::zeroed",
        ManagedBuffer::<u8>::zeroed(16, Attach::Global),
    );
    let mut v = vec![0u8; 16];
    is_no_driver(
        "RegisteredSlice::register",
        RegisteredSlice::register(
            &mut v,
            HostRegisterFlags::DEFAULT,
            |_| -> cuda_mem::Result<()> { panic!("the closure of a failed registration ran") },
        ),
    );
    is_no_driver("Stream::new", Stream::new());
    is_no_driver("Event::new", Event::new());
    is_no_driver("Probes::load", Probes::load());
    is_no_driver("mem_info", Device::get(0).and_then(|d| d.mem_info()));
    is_no_driver("profiler::start", cuda_mem::profiler::start());
    is_no_driver("profiler::stop", cuda_mem::profiler::stop());
    is_no_driver("profiler::capture", cuda_mem::profiler::capture());
}
