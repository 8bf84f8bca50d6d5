//! Unified (managed) memory, as the classic C++ tutorial does it:
//!
//! ```c++
//! float* x; cudaMallocManaged(&x, bytes);          // one pointer for CPU and GPU
//! for (int i = 0; i < n; i++) x[i] = 1.0f;          // the CPU touches it first
//! cudaMemPrefetchAsync(x, bytes, device, stream);   // migrate before the kernel, not on faults
//! kernel<<<g, b, 0, stream>>>(x, n);
//! cudaMemPrefetchAsync(x, bytes, cudaCpuDeviceId, stream);
//! cudaStreamSynchronize(stream);                    // before the CPU reads it
//! use(x);
//! cudaFree(x);
//! ```
//!
//! plus `cudaMemAdvise`, `cudaStreamAttachMemAsync` and copies to and from managed memory.
//! Allocations stay small (4 MiB): oversubscribed managed memory can stall a GPU.
//!
//! Run: `cargo run -p cuda-mem --example managed`

mod common;

use anyhow::ensure;
use cuda_mem::DevicePtrMut as _;
use cuda_mem::{
    copy, pointer_info, Advice, Attach, DeviceBuffer, Location, ManagedBuffer, PointerKind, Stream,
};
use cuda_mem_probes::Probes;

/// Elements per buffer: 4 MiB of `u32`.
const N: usize = 1 << 20;

fn main() -> anyhow::Result<()> {
    let Some(dev) = common::device_or_skip("managed")? else {
        return Ok(());
    };
    let caps = dev.memory_capabilities()?;
    println!(
        "cudaDevAttrManagedMemory = {}, cudaDevAttrConcurrentManagedAccess = {}",
        caps.managed_memory, caps.concurrent_managed_access
    );
    if !caps.managed_memory {
        println!("cuda-mem example managed: the device has no managed memory; nothing to do");
        return Ok(());
    }
    let here = Location::Device(dev);
    let probes = Probes::load()?;
    let stream = Stream::new()?;

    // cudaMallocManaged(cudaMemAttachGlobal); the CPU initialises it in place.
    let mut m = ManagedBuffer::<u32>::zeroed(N, Attach::Global)?;
    m.as_mut_slice()?.fill(7);
    let info = pointer_info(m.as_ptr())?;
    ensure!(
        info.kind == PointerKind::Managed,
        "managed buffer classified as {:?}",
        info.kind
    );
    println!(
        "cudaMallocManaged: {} bytes, initialised by the CPU",
        m.byte_len()
    );

    // Prefetching and advice need concurrent managed access (not on Windows or pre-Pascal);
    // without it the pages still migrate, on demand, when the kernel runs.
    let prefetch = caps.concurrent_managed_access;
    if prefetch {
        m.advise(Advice::SetPreferredLocation(here))?;
        ensure!(
            m.preferred_location()? == Some(here),
            "preferred location not recorded"
        );
        m.advise(Advice::SetAccessedBy(Location::Host))?;
        println!("cudaMemAdvise: preferred location {here:?}, accessed by the host");
        m.prefetch(here, &stream)?; // cudaMemPrefetchAsync(device)
        ensure!(
            m.last_prefetch_location()? == Some(here),
            "prefetch to the device not recorded"
        );
    }

    // A kernel writes through the same pointer.
    let bytes = m.byte_len();
    {
        let out = m.device_ptr_mut(&stream)?;
        // SAFETY: `out` is `m`'s managed allocation of `bytes` bytes (a multiple of 16, and
        // cudaMallocManaged aligns to 256 bytes), used on the guard's stream while it lives;
        // the guard makes host access and the free of `m` wait for the kernel.
        unsafe { probes.write(out.as_mut_ptr().cast(), bytes, &stream)? };
    }
    if prefetch {
        m.prefetch(Location::Host, &stream)?; // cudaMemPrefetchAsync(cudaCpuDeviceId)
        ensure!(
            m.last_prefetch_location()? == Some(Location::Host),
            "prefetch to the host not recorded"
        );
        println!("cudaMemPrefetchAsync: to {here:?} before the kernel, to the host after it");
    }
    common::check_cm_write("managed memory, read by the CPU", m.as_slice()?)?; // waits first
    println!("kernel cm_write through the managed pointer; the CPU read the results");
    if prefetch {
        m.advise(Advice::UnsetPreferredLocation)?;
        m.advise(Advice::UnsetAccessedBy(Location::Host))?;
        m.advise(Advice::SetReadMostly)?;
        ensure!(m.is_read_mostly()?, "read-mostly advice not recorded");
        m.advise(Advice::UnsetReadMostly)?;
        ensure!(!m.is_read_mostly()?, "read-mostly advice not removed");
        println!("cudaMemAdvise: read-mostly set and unset");
    }

    // cudaMemsetAsync on managed memory; host access waits for it.
    m.memset_async(0xab, &stream)?;
    ensure!(
        m.as_slice()?.iter().all(|&v| v == 0xabab_abab),
        "cudaMemsetAsync not seen"
    );
    println!("cudaMemsetAsync: seen by the CPU after the wait");

    // Copies to and from device memory (cudaMemcpyDefault: unified addressing picks the way).
    let mut d = DeviceBuffer::<u32>::uninit(N)?;
    copy(&mut d, &m)?;
    m.as_mut_slice()?.fill(0);
    copy(&mut m, &d)?;
    ensure!(
        m.as_slice()?.iter().all(|&v| v == 0xabab_abab),
        "copy through device memory"
    );
    println!("cudaMemcpy(Default): managed -> device -> managed checked");

    // cudaMallocManaged(cudaMemAttachHost) + cudaStreamAttachMemAsync(stream, Single): the
    // memory belongs to one stream, so the CPU may use it while other streams run kernels.
    let mut single = ManagedBuffer::<u32>::zeroed(N, Attach::Host)?;
    single.attach(&stream, Attach::Single)?;
    let bytes = single.byte_len();
    {
        let out = single.device_ptr_mut(&stream)?;
        // SAFETY: as above, for `single`'s allocation, attached to `stream` where the kernel
        // runs.
        unsafe { probes.write(out.as_mut_ptr().cast(), bytes, &stream)? };
    }
    common::check_cm_write("stream-attached managed memory", single.as_slice()?)?;
    println!("cudaStreamAttachMemAsync(Single): kernel output on the attached stream checked");

    // cudaFree, reporting failure (drop frees too).
    m.free()?;
    single.free()?;
    println!("cuda-mem example managed: OK");
    Ok(())
}
