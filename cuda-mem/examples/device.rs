//! Device memory, as the classic C++ tutorial does it:
//!
//! ```c++
//! int* h = (int*)malloc(bytes);                     // pageable host memory
//! int* d; cudaMalloc(&d, bytes);
//! cudaMemset(d, 0, bytes);
//! cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
//! kernel<<<grid, block>>>(d, n);
//! cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
//! cudaFree(d);
//! ```
//!
//! plus the other two copy kinds (device to device, host to host), a partial copy, a pointer
//! query, and the errors the runtime and the crate report.
//!
//! Run: `cargo run -p cuda-mem --example device`

mod common;

use anyhow::ensure;
use cuda_mem::DevicePtrMut as _;
use cuda_mem::{copy, copy_range, pointer_info, DeviceBuffer, Misuse, PointerKind, Stream};
use cuda_mem_probes::Probes;

/// Elements per buffer: 4 MiB of `u32`.
const N: usize = 1 << 20;

fn main() -> anyhow::Result<()> {
    let Some(dev) = common::device_or_skip("device")? else {
        return Ok(());
    };
    let (free_before, _) = dev.mem_info()?;

    // Pageable host data: ordinary `Vec`s play the part of `malloc`.
    let host: Vec<u32> = (0..N as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();

    // cudaMalloc + cudaMemset(0), then read it back (cudaMemcpyDeviceToHost).
    let mut d_a = DeviceBuffer::<u32>::uninit(N)?;
    d_a.memset(0)?;
    ensure!(
        d_a.to_vec()?.iter().all(|&v| v == 0),
        "cudaMemset(0) left non-zero bytes"
    );
    println!("cudaMalloc + cudaMemset: {} bytes zeroed", d_a.byte_len());

    let (free_after, _) = dev.mem_info()?;
    println!(
        "cudaMemGetInfo: {} MiB free before the allocation, {} MiB after",
        free_before >> 20,
        free_after >> 20
    );

    // cudaMemcpyHostToDevice, DeviceToDevice, DeviceToHost.
    copy(&mut d_a, &host)?;
    let mut d_b = DeviceBuffer::<u32>::uninit(N)?;
    copy(&mut d_b, &d_a)?;
    let mut back = vec![0u32; N];
    copy(&mut back, &d_b)?;
    ensure!(
        back == host,
        "host -> device -> device -> host round trip changed the data"
    );
    println!("cudaMemcpy HostToDevice, DeviceToDevice, DeviceToHost: {N} u32 round-tripped");

    // cudaMemcpyHostToHost: both sides ordinary host memory.
    let mut host_copy = vec![0u32; N];
    copy(&mut host_copy, &host)?;
    ensure!(host_copy == host, "cudaMemcpyHostToHost changed the data");
    println!("cudaMemcpy HostToHost: {N} u32 copied");

    // A partial copy: cudaMemcpy(h + 10, d + 100, 5 * sizeof(u32), DeviceToHost).
    let mut part = vec![0u32; 16];
    copy_range(&mut part, 10, &d_a, 100, 5)?;
    ensure!(
        part[10..15] == host[100..105],
        "partial copy read the wrong elements"
    );
    ensure!(
        part[..10].iter().chain(&part[15..]).all(|&v| v == 0),
        "partial copy overran"
    );
    println!("copy_range: elements 100..105 of the device buffer landed at 10..15");

    // A kernel writes the device buffer; the host reads it back after the stream's work.
    let probes = Probes::load()?;
    let stream = Stream::new()?;
    let bytes = d_b.byte_len();
    {
        // Orders `stream` after pending work on `d_b`, and hands out its address for work
        // queued on `stream` while the guard lives; the guard records the kernel on drop.
        let out = d_b.device_ptr_mut(&stream)?;
        // SAFETY: `out` is `d_b`'s device allocation of `bytes` bytes (a multiple of 16, and
        // cudaMalloc aligns to 256 bytes), used by a kernel on the guard's stream while the
        // guard lives. Every later host access, copy and the free of `d_b` wait for it.
        unsafe { probes.write(out.as_mut_ptr().cast(), bytes, &stream)? };
    }
    let written = d_b.to_vec()?; // waits for the kernel, then cudaMemcpyDeviceToHost
    common::check_cm_write("kernel output", &written)?;
    println!("kernel cm_write over {bytes} bytes of device memory: values checked on the host");

    // cudaPointerGetAttributes.
    let info = pointer_info(d_a.as_ptr())?;
    ensure!(
        info.kind == PointerKind::Device,
        "device buffer classified as {:?}",
        info.kind
    );
    ensure!(
        info.device == dev.ordinal(),
        "device buffer on device {}",
        info.device
    );
    let info = pointer_info(host.as_ptr())?;
    ensure!(
        info.kind == PointerKind::UnregisteredHost,
        "Vec classified as {:?}",
        info.kind
    );
    println!("cudaPointerGetAttributes: DeviceBuffer is Device memory, Vec is unregistered host");

    // Errors: what the runtime refuses, with the call that failed, and misuse it never sees.
    let (_, total) = dev.mem_info()?;
    match DeviceBuffer::<u8>::uninit(total.saturating_mul(2)) {
        Err(e) if e.is_out_of_memory() => println!("expected error: {e}"),
        Err(e) => anyhow::bail!("cudaMalloc of twice the device's memory: unexpected error {e}"),
        Ok(_) => anyhow::bail!("cudaMalloc of twice the device's memory succeeded"),
    }
    match copy(&mut part, &d_a) {
        Err(e) if e.misuse() == Some(&Misuse::LengthMismatch { dst: 16, src: N }) => {
            println!("expected error: {e}")
        }
        other => anyhow::bail!("a copy of {N} elements into 16: {other:?}"),
    }

    // cudaFree, reporting failure (dropping a buffer frees it too, ignoring errors).
    d_a.free()?;
    d_b.free()?;
    println!("cudaFree: both device buffers freed");
    println!("cuda-mem example device: OK");
    Ok(())
}
