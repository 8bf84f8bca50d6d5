//! Zero-copy mapped memory, as the jetson-utils tutorial's `cudaAllocMapped` helper uses it:
//!
//! ```c++
//! float* cpu; float* gpu;
//! cudaAllocMapped((void**)&cpu, (void**)&gpu, bytes);   // cudaHostAlloc(Mapped) +
//!                                                       // cudaHostGetDevicePointer
//! fill(cpu);                  // the CPU writes through its pointer
//! kernel<<<g, b>>>(gpu, n);   // the GPU reads and writes the same memory over PCIe
//! cudaDeviceSynchronize();
//! use(cpu);                   // the CPU reads the results: no cudaMemcpy anywhere
//! cudaFreeHost(cpu);
//! ```
//!
//! Both shapes of the helper: [`alloc_mapped`] (CPU and GPU pointer) and [`alloc_mapped_uva`]
//! (one pointer for both). Unlike the C++ helper, a failure after `cudaHostAlloc` frees the
//! memory instead of leaking it.
//!
//! Run: `cargo run -p cuda-mem --example mapped`

mod common;

use anyhow::ensure;
use cuda_mem::{
    alloc_mapped, alloc_mapped_uva, pointer_info, DeviceBuffer, HostAllocFlags, MappedBuffer,
    PointerKind, Stream,
};
use cuda_mem::{DevicePtr as _, DevicePtrMut as _};
use cuda_mem_probes::Probes;

/// Elements per buffer: 1 MiB of `u32`.
const N: usize = 1 << 18;

/// What `cm_read` looks for: a thread whose words XOR to this bumps the sink once.
const MAGIC: u32 = 0x1234_5678;

fn main() -> anyhow::Result<()> {
    let Some(dev) = common::device_or_skip("mapped")? else {
        return Ok(());
    };
    let caps = dev.memory_capabilities()?;
    println!(
        "cudaDevAttrCanMapHostMemory = {}, cudaDevAttrUnifiedAddressing = {}",
        caps.can_map_host_memory, caps.unified_addressing
    );
    let probes = Probes::load()?;
    let stream = Stream::new()?;

    // Shape 1: cudaAllocMapped(&cpu, &gpu, size).
    let mut buf = alloc_mapped::<u32>(N)?;
    let (cpu, gpu) = (buf.as_ptr(), buf.device_address());
    println!("alloc_mapped: cpu pointer {cpu:p}, gpu pointer {gpu:p}");
    buf.as_mut_slice()?.fill(u32::MAX); // the CPU writes
    {
        let out = buf.device_ptr_mut(&stream)?; // the gpu pointer, for work on `stream`
                                                // SAFETY: `out` is the device address of `buf`'s N * 4 bytes (a multiple of 16, and
                                                // cudaHostAlloc returns page-aligned memory), used on the guard's stream while it
                                                // lives; the guard makes host access and the free of `buf` wait for the kernel.
        unsafe { probes.write(out.as_mut_ptr().cast(), N * 4, &stream)? };
    }
    common::check_cm_write("alloc_mapped, read by the CPU", buf.as_slice()?)?; // waits first
    println!("kernel cm_write through the gpu pointer; the CPU read the results in place");

    // The runtime knows it as pinned host memory mapped at the same address.
    let info = pointer_info(cpu)?;
    ensure!(
        info.kind == PointerKind::PinnedHost,
        "mapped buffer classified as {:?}",
        info.kind
    );
    ensure!(
        info.device_ptr == gpu as usize,
        "cudaPointerGetAttributes: another device pointer"
    );
    ensure!(
        buf.flags().contains(HostAllocFlags::MAPPED),
        "mapped buffer without the MAPPED flag"
    );

    // Shape 2: cudaAllocMapped(&ptr, size), one pointer valid on both sides (UVA).
    let mut uva = alloc_mapped_uva::<u32>(N)?;
    let ptr = uva.device_address();
    ensure!(std::ptr::eq(ptr, uva.as_ptr()), "UVA pointers differ");
    {
        let out = uva.device_ptr_mut(&stream)?;
        // SAFETY: as above, for `uva`'s allocation.
        unsafe { probes.write(out.as_mut_ptr().cast(), N * 4, &stream)? };
    }
    common::check_cm_write("alloc_mapped_uva", uva.as_slice()?)?;
    println!("alloc_mapped_uva: one pointer {ptr:p}; kernel output checked by the CPU");

    // Write-combined mapped memory: the CPU only writes (uncached, so CPU reads would crawl),
    // the GPU reads it directly. `cm_read` bumps its sink once per thread whose words XOR to
    // MAGIC: with a single non-zero word, exactly once, which proves the kernel saw the CPU's
    // write through the mapping.
    let mut wc = MappedBuffer::<u32>::zeroed(N, HostAllocFlags::WRITE_COMBINED)?;
    wc.as_mut_slice()?[4 * 1000] = MAGIC;
    let mut sink = DeviceBuffer::<u64>::zeroed(1)?;
    {
        let input = wc.device_ptr(&stream)?;
        let out = sink.device_ptr_mut(&stream)?;
        // SAFETY: `input` covers `wc`'s N * 4 bytes (page-aligned, a multiple of 16) and `out`
        // one device `u64`, both used on the guards' stream while they live; the guards record
        // the kernel, so neither buffer is freed or read by the host before it completes.
        unsafe { probes.read(input.as_ptr().cast(), N * 4, out.as_mut_ptr(), &stream)? };
    }
    let hits = sink.to_vec()?[0];
    ensure!(
        hits == 1,
        "cm_read over write-combined mapped memory counted {hits}, expected 1"
    );
    println!(
        "MappedBuffer({}): written by the CPU, read by a kernel over PCIe",
        wc.flags()
    );

    // cudaFreeHost, reporting failure (drop frees too).
    buf.free()?;
    uva.free()?;
    wc.free()?;
    println!("cuda-mem example mapped: OK");
    Ok(())
}
