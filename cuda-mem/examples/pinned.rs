//! Pinned (page-locked) host memory, as the classic C++ tutorial does it:
//!
//! ```c++
//! float* h_pageable = (float*)malloc(bytes);
//! float* h_pinned;  cudaMallocHost(&h_pinned, bytes);      // or cudaHostAlloc(.., flags)
//! cudaEventRecord(start); cudaMemcpy(d, h_pageable, bytes, cudaMemcpyHostToDevice); ...
//! cudaEventRecord(start); cudaMemcpy(d, h_pinned,   bytes, cudaMemcpyHostToDevice); ...
//! cudaMemcpyAsync(d, h_pinned, bytes, cudaMemcpyHostToDevice, stream);
//! cudaFreeHost(h_pinned);
//! ```
//!
//! It times pageable against pinned copies, round-trips data through every `cudaHostAlloc`
//! flag and combination, and overlaps asynchronous copies with host work safely.
//!
//! Run: `cargo run -p cuda-mem --example pinned --release` (timings are more telling in release).

mod common;

use anyhow::ensure;
use cuda_mem::{
    copy, copy_async, pointer_info, DeviceBuffer, Event, HostAllocFlags, PinnedBuffer, PointerKind,
    Stream,
};

/// Elements of the timed copies: 64 MiB of `u32`.
const TIMED: usize = 16 << 20;
/// Elements of the per-flag round trips: 1 MiB of `u32`.
const SMALL: usize = 1 << 18;

/// Milliseconds of the copies `f` makes, bracketed by timing events on the legacy default
/// stream, where synchronous `cudaMemcpy` runs.
fn time_copy(f: impl FnOnce() -> cuda_mem::Result<()>) -> anyhow::Result<f32> {
    let stream = Stream::legacy_default();
    let (start, end) = (Event::timing()?, Event::timing()?);
    start.record(&stream)?;
    f()?;
    end.record(&stream)?;
    end.synchronize()?;
    Ok(Event::elapsed_ms(&start, &end)?)
}

fn gb_per_s(bytes: usize, ms: f32) -> f64 {
    bytes as f64 / (f64::from(ms) * 1e6)
}

fn main() -> anyhow::Result<()> {
    if common::device_or_skip("pinned")?.is_none() {
        return Ok(());
    }
    let data: Vec<u32> = (0..TIMED as u32).map(|i| i ^ 0x5a5a_5a5a).collect();
    let bytes = TIMED * 4;
    let mut dev = DeviceBuffer::<u32>::uninit(TIMED)?;

    // Pageable against pinned (cudaMallocHost), each direction, as the tutorial measures.
    let mut pageable_back = vec![0u32; TIMED];
    let mut pinned = PinnedBuffer::<u32>::malloc_host(TIMED)?;
    pinned.as_mut_slice()?.copy_from_slice(&data);
    let mut pinned_back = PinnedBuffer::<u32>::malloc_host(TIMED)?;
    // Warm up: the first copy pays for context and staging-buffer setup.
    copy(&mut dev, &data)?;
    let h2d_pageable = time_copy(|| copy(&mut dev, &data))?;
    let d2h_pageable = time_copy(|| copy(&mut pageable_back, &dev))?;
    let h2d_pinned = time_copy(|| copy(&mut dev, &pinned))?;
    let d2h_pinned = time_copy(|| copy(&mut pinned_back, &dev))?;
    ensure!(
        pageable_back == data,
        "pageable round trip changed the data"
    );
    ensure!(
        pinned_back.as_slice()? == data.as_slice(),
        "pinned round trip changed the data"
    );
    println!(
        "{} MiB, host to device: pageable {:.1} GB/s, pinned {:.1} GB/s",
        bytes >> 20,
        gb_per_s(bytes, h2d_pageable),
        gb_per_s(bytes, h2d_pinned)
    );
    println!(
        "{} MiB, device to host: pageable {:.1} GB/s, pinned {:.1} GB/s",
        bytes >> 20,
        gb_per_s(bytes, d2h_pageable),
        gb_per_s(bytes, d2h_pinned)
    );
    let info = pointer_info(pinned.as_ptr())?;
    ensure!(
        info.kind == PointerKind::PinnedHost,
        "pinned buffer classified as {:?}",
        info.kind
    );
    // cudaFreeHost, reporting failure (drop frees too, ignoring errors).
    pinned.free()?;
    pinned_back.free()?;
    drop(dev);

    // cudaHostAlloc with each flag and combination: host -> device -> host.
    use HostAllocFlags as F;
    let combos = [
        F::DEFAULT,
        F::PORTABLE,
        F::WRITE_COMBINED,
        F::MAPPED,
        F::PORTABLE | F::MAPPED,
        F::PORTABLE | F::WRITE_COMBINED,
        F::WRITE_COMBINED | F::MAPPED,
        F::PORTABLE | F::WRITE_COMBINED | F::MAPPED,
    ];
    let small = &data[..SMALL];
    let mut dev = DeviceBuffer::<u32>::uninit(SMALL)?;
    let mut check = PinnedBuffer::<u32>::zeroed(SMALL, F::DEFAULT)?;
    for flags in combos {
        // The host only writes the buffer: right for write-combined memory, which is uncached
        // and very slow for the CPU to read.
        let src = PinnedBuffer::from_slice(small, flags)?;
        ensure!(
            src.flags() == flags,
            "flags {} came back as {}",
            flags,
            src.flags()
        );
        // cudaHostGetFlags reports what the driver made of the request, which need not be
        // the bits asked for: under unified addressing all pinned memory is portable and
        // mapped, and the driver may report MAPPED for DEFAULT and drop PORTABLE.
        let runtime = src.runtime_flags()?;
        if flags.contains(F::MAPPED) {
            ensure!(
                runtime & F::MAPPED.bits() != 0,
                "cudaHostGetFlags = {runtime:#x} lacks MAPPED"
            );
        }
        let ms = time_copy(|| copy(&mut dev, &src))?;
        check.as_mut_slice()?.fill(0);
        copy(&mut check, &dev)?;
        ensure!(
            check.as_slice()? == small,
            "round trip through {flags} changed the data"
        );
        println!(
            "cudaHostAlloc({flags}): cudaHostGetFlags = {runtime:#x}, host to device {:.1} GB/s, \
             round trip checked",
            gb_per_s(SMALL * 4, ms)
        );
    }

    // Asynchronous copies on a stream: they return at once; host access waits for them.
    let stream = Stream::new()?;
    let mut src = PinnedBuffer::from_slice(small, F::DEFAULT)?;
    let mut dst = PinnedBuffer::<u32>::zeroed(SMALL, F::DEFAULT)?;
    copy_async(&mut dev, &src, &stream)?; // cudaMemcpyAsync HostToDevice
    copy_async(&mut dst, &dev, &stream)?; // cudaMemcpyAsync DeviceToHost
                                          // Overwriting the source waits for the first copy to finish reading it: no race.
    src.as_mut_slice()?.fill(0);
    ensure!(
        dst.as_slice()? == small,
        "asynchronous round trip changed the data"
    );
    println!("cudaMemcpyAsync: host -> device -> host on one stream, checked after the waits");
    println!("cuda-mem example pinned: OK");
    Ok(())
}
