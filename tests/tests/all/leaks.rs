//! Leaks: many allocate/free cycles of each kind; device free memory and the process's locked
//! and resident memory return to their starting level.
//!
//! Cycles: `CUDA_MEM_LEAK_CYCLES` (default 10,000). Tolerances: device free memory within
//! 4 MiB (the driver's own bookkeeping moves by a page or two), locked memory (VmLck) within
//! 1 MiB, resident memory (VmRSS) within 8 MiB. A leak of one 4 KiB host allocation per cycle
//! (zeroed, so resident) would add 39 MiB of RSS; on the H200 every level came back exactly.
//! The NVIDIA driver pins without `mlock`, so VmLck stays 0 there: RSS is what catches a
//! leaked pinned buffer.

use cuda_mem::{
    alloc_mapped, Attach, Device, DeviceBuffer, HostAllocFlags, HostRegisterFlags, ManagedBuffer,
    PinnedBuffer, RegisteredSlice,
};
use cuda_mem_tests::{gpu_or_skip, proc_status_kib};

fn cycles() -> usize {
    std::env::var("CUDA_MEM_LEAK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

struct Level {
    device_free: usize,
    locked_kib: u64,
    rss_kib: u64,
}

fn level(dev: Device) -> Level {
    dev.synchronize().unwrap();
    Level {
        device_free: dev.mem_info().unwrap().0,
        locked_kib: proc_status_kib("VmLck"),
        rss_kib: proc_status_kib("VmRSS"),
    }
}

fn check(kind: &str, dev: Device, before: &Level, n: usize) {
    let after = level(dev);
    let dfree = before.device_free.abs_diff(after.device_free);
    println!(
        "{kind}: {n} cycles; device free {:+} B, VmLck {:+} KiB, VmRSS {:+} KiB",
        after.device_free as i64 - before.device_free as i64,
        after.locked_kib as i64 - before.locked_kib as i64,
        after.rss_kib as i64 - before.rss_kib as i64
    );
    assert!(
        dfree <= 4 << 20,
        "{kind}: device free memory moved by {dfree} bytes"
    );
    assert!(
        after.locked_kib <= before.locked_kib + 1024,
        "{kind}: locked memory grew from {} to {} KiB",
        before.locked_kib,
        after.locked_kib
    );
    assert!(
        after.rss_kib <= before.rss_kib + 8 * 1024,
        "{kind}: resident memory grew from {} to {} KiB",
        before.rss_kib,
        after.rss_kib
    );
}

fn run(kind: &str, dev: Device, mut cycle: impl FnMut()) {
    // Warm up: the first allocations of a kind create the driver's pools.
    for _ in 0..16 {
        cycle();
    }
    let n = cycles();
    let before = level(dev);
    for _ in 0..n {
        cycle();
    }
    check(kind, dev, &before, n);
}

#[test]
fn allocate_free_cycles_return_to_the_starting_level() {
    let dev = gpu_or_skip!();
    run("device 4 KiB", dev, || {
        drop(DeviceBuffer::<u8>::zeroed(4096).unwrap())
    });
    run("pinned 4 KiB", dev, || {
        drop(PinnedBuffer::<u8>::zeroed(4096, HostAllocFlags::DEFAULT).unwrap())
    });
    run("cudaMallocHost 4 KiB", dev, || {
        drop(PinnedBuffer::<u8>::malloc_host(4096).unwrap())
    });
    run("mapped 4 KiB", dev, || {
        drop(alloc_mapped::<u8>(4096).unwrap())
    });
    run("managed 4 KiB", dev, || {
        drop(ManagedBuffer::<u8>::zeroed(4096, Attach::Global).unwrap())
    });
    let mut page = vec![1u8; 4096];
    run("registered 4 KiB", dev, || {
        RegisteredSlice::register(&mut page, HostRegisterFlags::DEFAULT, |_| Ok(())).unwrap()
    });
    // Explicit free takes the same path as drop.
    run("device 1 MiB, explicit free", dev, || {
        DeviceBuffer::<u8>::uninit(1 << 20).unwrap().free().unwrap()
    });
}
