//! Device memory on the GPU: round trips, memset, device-to-device, raw ownership, OOM.

use cuda_mem::{copy, pointer_info, profiler, sys, DeviceBuffer, ErrorCode, PointerKind};
use cuda_mem_tests::gpu_or_skip;

use crate::pattern;

#[test]
fn host_to_device_to_host_round_trip() {
    gpu_or_skip!();
    let data = pattern(1 << 20, 1);
    let dev = DeviceBuffer::from_slice(&data).unwrap();
    assert_eq!(dev.len(), data.len());
    assert_eq!(dev.byte_len(), data.len() * 4);
    assert_eq!(dev.to_vec().unwrap(), data);
}

#[test]
fn memset_is_read_back() {
    gpu_or_skip!();
    let mut dev = DeviceBuffer::from_slice(&pattern(4096, 2)).unwrap();
    dev.memset(0xab).unwrap();
    assert!(dev.to_vec().unwrap().iter().all(|&w| w == 0xabab_abab));
    let zero = DeviceBuffer::<u64>::zeroed(333).unwrap();
    assert_eq!(zero.to_vec().unwrap(), vec![0u64; 333]);
}

#[test]
fn device_to_device_and_host_to_host() {
    gpu_or_skip!();
    let data = pattern(100_000, 3);
    let a = DeviceBuffer::from_slice(&data).unwrap();
    let mut b = DeviceBuffer::<u32>::zeroed(data.len()).unwrap();
    b.copy_from(&a).unwrap(); // cudaMemcpyDeviceToDevice
    let mut back = vec![0u32; data.len()];
    b.copy_to(&mut back).unwrap();
    assert_eq!(back, data);
    let mut other = vec![0u32; data.len()];
    copy(&mut other, &back).unwrap(); // cudaMemcpyHostToHost
    assert_eq!(other, data);
}

#[test]
fn pointer_kind_is_device() {
    let dev = gpu_or_skip!();
    let buf = DeviceBuffer::<u8>::zeroed(4096).unwrap();
    let info = pointer_info(buf.as_ptr()).unwrap();
    assert_eq!(info.kind, PointerKind::Device);
    assert_eq!(info.device, dev.ordinal());
    assert_eq!(info.device_ptr, buf.as_ptr() as usize);
    assert_eq!(buf.device(), dev);
}

#[test]
fn raw_ownership_round_trip_with_c_allocations() {
    gpu_or_skip!();
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid out-pointer; 64 u32s.
    let code = unsafe { sys::cudaMalloc(&mut raw, 256) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    // SAFETY: `raw` came from cudaMalloc on this device, holds 64 u32s and is owned by no one.
    let mut buf = unsafe { DeviceBuffer::<u32>::from_raw(raw.cast(), 64) }.unwrap();
    buf.memset(1).unwrap();
    assert!(buf.to_vec().unwrap().iter().all(|&w| w == 0x0101_0101));
    let (p, len) = buf.into_raw().unwrap();
    assert_eq!((p.cast(), len), (raw, 64));
    // Ownership is back with C: free it the C way.
    // SAFETY: `p` is a live cudaMalloc allocation no one else owns.
    let code = unsafe { sys::cudaFree(p.cast()) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
}

#[test]
fn explicit_free_reports_success() {
    gpu_or_skip!();
    let buf = DeviceBuffer::<u8>::zeroed(1 << 20).unwrap();
    let p = buf.as_ptr();
    buf.free().unwrap();
    // The address is no longer device memory the runtime knows.
    let info = pointer_info(p).unwrap();
    assert_ne!(info.kind, PointerKind::Device);
}

#[test]
fn one_tib_is_out_of_memory_and_the_next_allocation_works() {
    gpu_or_skip!();
    let e = DeviceBuffer::<u8>::uninit(1 << 40).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(e.code(), Some(ErrorCode::MEMORY_ALLOCATION));
    assert_eq!(
        e.to_string(),
        "cudaMalloc(1099511627776 bytes) failed: cudaErrorMemoryAllocation: out of memory"
    );
    // The failure was cleared from the runtime's last-error state...
    // SAFETY: no arguments.
    let code = unsafe { sys::cudaGetLastError() };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    // ...and the next allocation works.
    let ok = DeviceBuffer::from_slice(&[7u32; 1024]).unwrap();
    assert_eq!(ok.to_vec().unwrap(), vec![7u32; 1024]);
}

#[test]
fn host_out_of_memory_is_exact_and_the_process_goes_on() {
    gpu_or_skip!();
    // 1 PiB of pinned memory: far above any host's memory.
    let len = 1usize << 50;
    let e =
        cuda_mem::PinnedBuffer::<u8>::zeroed(len, cuda_mem::HostAllocFlags::DEFAULT).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "cudaHostAlloc({len} bytes, DEFAULT) failed: cudaErrorMemoryAllocation: out of memory"
        )
    );
    let e = cuda_mem::PinnedBuffer::<u8>::malloc_host(len).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    // SAFETY: no arguments.
    let code = unsafe { sys::cudaGetLastError() };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    let mut ok =
        cuda_mem::PinnedBuffer::<u8>::zeroed(1 << 20, cuda_mem::HostAllocFlags::DEFAULT).unwrap();
    ok.as_mut_slice().unwrap().fill(3);
    let dev = DeviceBuffer::from_slice(ok.as_slice().unwrap()).unwrap();
    assert_eq!(dev.to_vec().unwrap(), vec![3u8; 1 << 20]);
}

/// `cudaProfilerStart` / `cudaProfilerStop` (declared by cuda-mem-sys where the toolkit lacks
/// `cuda_profiler_api.h`): without a profiler attached both succeed, also when repeated, and
/// the capture guard stops on drop or on `stop()`.
#[test]
fn profiler_start_and_stop_succeed() {
    gpu_or_skip!();
    profiler::start().unwrap();
    profiler::start().unwrap();
    profiler::stop().unwrap();
    profiler::stop().unwrap();
    {
        let _capture = profiler::capture().unwrap();
        let d = DeviceBuffer::from_slice(&[1u32, 2, 3]).unwrap();
        assert_eq!(d.to_vec().unwrap(), [1, 2, 3]);
    }
    profiler::capture().unwrap().stop().unwrap();
}
