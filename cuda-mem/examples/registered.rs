//! Registered host memory: memory the program already has, pinned in place, as the classic
//! C++ tutorial does it:
//!
//! ```c++
//! float* h = (float*)malloc(bytes);
//! cudaHostRegister(h, bytes, cudaHostRegisterDefault);     // pin the existing pages
//! cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s); // DMA straight from them
//! cudaStreamSynchronize(s);
//! cudaHostUnregister(h);
//! free(h);
//! ```
//!
//! A borrowed slice is registered for the length of a closure ([`RegisteredSlice::register`]),
//! which ends the registration itself: it waits for the work queued on it, then unregisters.
//! A `Vec` moved into a [`RegisteredVec`] stays registered until it drops. Both allow
//! asynchronous copies and kernels (with `cudaHostRegisterMapped`, through
//! `cudaHostGetDevicePointer`).
//!
//! Run: `cargo run -p cuda-mem --example registered`

mod common;

use anyhow::ensure;
use cuda_mem::DevicePtrMut as _;
use cuda_mem::{
    copy, copy_async, pointer_info, DeviceBuffer, HostRegisterFlags, PointerKind, RegisteredSlice,
    RegisteredVec, Stream,
};
use cuda_mem_probes::Probes;

/// Elements per buffer: 4 MiB of `u32`.
const N: usize = 1 << 20;

fn main() -> anyhow::Result<()> {
    if common::device_or_skip("registered")?.is_none() {
        return Ok(());
    }
    let stream = Stream::new()?;
    let mut dev = DeviceBuffer::<u32>::uninit(N)?;

    // A borrowed Vec, registered while the closure runs: the C++ tutorial above.
    let mut data: Vec<u32> = (0..N as u32).map(|i| i.rotate_left(7)).collect();
    let expected = data.clone();
    let data_ptr = data.as_ptr();
    let kind = RegisteredSlice::register(&mut data, HostRegisterFlags::DEFAULT, |reg| {
        let kind = pointer_info(data_ptr)?.kind;
        // cudaMemcpyAsync HostToDevice, DMA from the Vec's own pages
        copy_async(&mut dev, reg, &stream)?;
        Ok(kind)
    })?; // waits for the copy (the cudaStreamSynchronize), then cudaHostUnregister
    ensure!(
        kind == PointerKind::PinnedHost,
        "registered Vec classified as {kind:?}"
    );
    let kind = pointer_info(data_ptr)?.kind;
    ensure!(
        kind == PointerKind::UnregisteredHost,
        "unregistered Vec classified as {kind:?}"
    );
    ensure!(
        dev.to_vec()? == expected,
        "copy from the registered slice changed the data"
    );
    println!("cudaHostRegister(Default) + cudaMemcpyAsync + cudaHostUnregister: {N} u32 checked");

    // A Vec moved in: asynchronous copies are sound, since it cannot be freed or touched
    // while they run (host access waits for them).
    let mut owned = RegisteredVec::register(vec![0u32; N], HostRegisterFlags::PORTABLE)?;
    copy_async(&mut owned, &dev, &stream)?; // cudaMemcpyAsync DeviceToHost
    ensure!(
        owned.as_slice()? == expected.as_slice(),
        "asynchronous copy changed the data"
    );
    owned.as_mut_slice()?.fill(1);
    copy_async(&mut dev, &owned, &stream)?; // cudaMemcpyAsync HostToDevice
    ensure!(
        dev.to_vec()?.iter().all(|&v| v == 1),
        "asynchronous copy back changed the data"
    );
    let mut back = owned.into_vec()?; // waits, unregisters, returns the Vec
    ensure!(
        back.iter().all(|&v| v == 1),
        "the returned Vec lost its contents"
    );
    println!("RegisteredVec(Portable) + cudaMemcpyAsync both ways: checked");

    // A synchronous copy into a registered slice: DMA straight into the Vec's pages.
    copy(&mut dev, &expected)?;
    RegisteredSlice::register(&mut back, HostRegisterFlags::DEFAULT, |reg| copy(reg, &dev))?;
    ensure!(
        back == expected,
        "synchronous copy into the registered slice"
    );
    println!("cudaHostRegister(Default) + cudaMemcpy DeviceToHost: checked");

    // cudaHostRegisterMapped: a kernel writes the Vec in place through its device pointer.
    let mut mapped = RegisteredVec::register(vec![0u32; N], HostRegisterFlags::MAPPED)?;
    let out = mapped.device_ptr_mut(&stream)?; // cudaHostGetDevicePointer, for `stream`
    let gpu = out.as_mut_ptr();
    // The kernel stores 16-byte words; malloc (Rust's system allocator) aligns large blocks
    // to 16 bytes on 64-bit Linux, but check rather than assume.
    ensure!(
        gpu as usize % 16 == 0,
        "device pointer {gpu:p} is not 16-byte aligned"
    );
    let probes = Probes::load()?;
    // SAFETY: `gpu` maps the registered Vec's N * 4 bytes (a multiple of 16, aligned as
    // checked), used on the guard's stream while it lives; the guard makes host access,
    // unregistering and the free wait for the kernel.
    unsafe { probes.write(gpu.cast(), N * 4, &stream)? };
    drop(out);
    common::check_cm_write("registered mapped Vec", mapped.as_slice()?)?;
    println!("cudaHostRegister(Mapped): kernel wrote the Vec through {gpu:p}; checked in place");
    drop(mapped); // waits for pending work, cudaHostUnregister, then frees the Vec

    println!("cuda-mem example registered: OK");
    Ok(())
}
