//! cuda-mem and cudarc in one program: a cudarc kernel launched on cuda-mem memory (a
//! `DeviceBuffer` filled by an asynchronous copy from pinned memory, and a view of it) through
//! the checked launch (`interop::cudarc::Launch`: one stream, every buffer's guard taken for
//! it), on a cudarc stream and on a blocking cuda-mem stream that cudarc cannot make, and
//! cudarc memory (`CudaSlice`) read and written by cuda-mem copies and kernels, on several
//! streams. Each result is checked bit for bit against the same computation on the CPU.
//!
//! The kernel, `y[i] = a * x[i] + y[i]` on `u32` (wrapping), is PTX text loaded with
//! `Ptx::from_src`: no nvcc, no nvrtc.
//!
//! Run: `cargo run -p cuda-mem --features cudarc --example cudarc_kernel`. Without a GPU it
//! says so and exits 0 (non-zero with `CUDA_MEM_REQUIRE_GPU=1`); a wrong result exits non-zero.

mod common;

use anyhow::bail;
use cuda_mem::interop::cudarc::{
    context, cudarc_stream, stream, CudarcPtr as _, CudarcView, CudarcViewMut, Launch,
};
use cuda_mem::{copy_async, DeviceBuffer, HostAllocFlags, PinnedBuffer, Slice as _, Stream};
use cudarc::driver::{CudaSlice, LaunchConfig};
use cudarc::nvrtc::Ptx;

/// Elements per buffer: 4 MiB of `u32`.
const N: usize = 1 << 20;
/// The multiplier `a`.
const A: u32 = 2_654_435_761;

/// `axpy_u32(const u32* x, u32* y, u32 a, u64 n)`: `y[i] = a * x[i] + y[i]` for `i < n`, one
/// thread per element.
const PTX: &str = "
.version 7.0
.target sm_70
.address_size 64

.visible .entry axpy_u32(.param .u64 axpy_x, .param .u64 axpy_y, .param .u32 axpy_a,
                         .param .u64 axpy_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<10>;
    ld.param.u64 %rd1, [axpy_x];
    ld.param.u64 %rd2, [axpy_y];
    ld.param.u32 %r1, [axpy_a];
    ld.param.u64 %rd3, [axpy_n];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mul.wide.u32 %rd4, %r2, %r3;
    cvt.u64.u32 %rd5, %r4;
    add.u64 %rd4, %rd4, %rd5;
    setp.ge.u64 %p1, %rd4, %rd3;
    @%p1 bra AXPY_DONE;
    shl.b64 %rd6, %rd4, 2;
    add.u64 %rd7, %rd1, %rd6;
    add.u64 %rd8, %rd2, %rd6;
    ld.global.u32 %r5, [%rd7];
    ld.global.u32 %r6, [%rd8];
    mad.lo.u32 %r7, %r1, %r5, %r6;
    st.global.u32 [%rd8], %r7;
AXPY_DONE:
    ret;
}
";

/// A pattern that differs per element and per `seed`.
fn pattern(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| {
            let v = i.wrapping_mul(2_246_822_519).wrapping_add(seed);
            v.rotate_left(v % 31)
        })
        .collect()
}

/// The CPU's `y[i] = a * x[i] + y[i]`, in place.
fn axpy(x: &[u32], y: &mut [u32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = A.wrapping_mul(x).wrapping_add(*y);
    }
}

/// Checks `got` against `want`, naming the first wrong element.
fn check(what: &str, got: &[u32], want: &[u32]) -> anyhow::Result<()> {
    if got.len() != want.len() {
        bail!("{what}: {} elements, expected {}", got.len(), want.len());
    }
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        bail!(
            "{what}: element {i} is {:#010x}, the CPU computed {:#010x}",
            got[i],
            want[i]
        );
    }
    println!("{what}: {} elements match the CPU bit for bit", got.len());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // Before any cudarc call: cudarc panics where it cannot load libcuda (no driver), while
    // cuda-mem says so with an error, and `context` takes the device that proves a driver.
    let Some(dev) = common::device_or_skip("cudarc_kernel")? else {
        return Ok(());
    };
    let ctx = context(dev)?; // cudarc's CudaContext: the device's primary context
    let cs = ctx.new_stream()?; // cudarc streams, non-blocking
    let cs2 = ctx.new_stream()?;
    let s = stream(&cs)?; // the same stream, for cuda-mem's copies
    let f = ctx
        .load_module(Ptx::from_src(PTX))?
        .load_function("axpy_u32")?;

    let x_h = pattern(N, 1);
    let y_h = pattern(N, 2);
    let (a, n) = (A, N as u64);
    let cfg = LaunchConfig::for_num_elems(N as u32);

    // 1. cuda-mem memory, filled asynchronously from pinned memory, then the kernel on it,
    //    on cudarc's stream `cs`: `Launch` takes each buffer's guard for `cs` (ordering it
    //    after the copy, here on the same stream) and keeps them until the kernel is queued,
    //    so that the host read below waits for it.
    let x_pin = PinnedBuffer::from_slice(&x_h, HostAllocFlags::DEFAULT)?;
    let mut x = DeviceBuffer::<u32>::uninit(N)?;
    copy_async(&mut x, &x_pin, &s)?;
    let mut y = DeviceBuffer::from_slice(&y_h)?;
    // SAFETY: axpy_u32(const u32* x, u32* y, u32 a, u64 n) with x and y of N u32 each; it
    // writes y only.
    unsafe {
        Launch::on(&cs, &f, cfg)?
            .arg_in(&x)
            .arg_out(&mut y)
            .arg(&a)
            .arg(&n)
            .launch()?;
    }
    let mut want_y = y_h.clone();
    axpy(&x_h, &mut want_y);
    check(
        "kernel on DeviceBuffer, on a cudarc stream",
        &y.to_vec()?,
        &want_y,
    )?;

    // 2. The same kernel on views, on a *blocking* cuda-mem stream (which cudarc cannot make):
    //    the upper half of `y` once more. The guards order `blocking` after the work of `cs`.
    let blocking = Stream::new()?;
    {
        let x_hi = x.slice(N / 2..)?;
        let mut y_hi = y.slice_mut(N / 2..)?;
        let half = (N / 2) as u64;
        // SAFETY: as above, with views of N / 2 u32.
        unsafe {
            Launch::on(&blocking, &f, LaunchConfig::for_num_elems((N / 2) as u32))?
                .arg_in(&x_hi)
                .arg_out(&mut y_hi)
                .arg(&a)
                .arg(&half)
                .launch()?;
        }
    }
    axpy(&x_h[N / 2..], &mut want_y[N / 2..]);
    check(
        "kernel on a view of DeviceBuffer, on a blocking cuda-mem stream",
        &y.to_vec()?,
        &want_y,
    )?;

    // 3. cudarc memory written by a cuda-mem copy (on `cs`), updated by the kernel with a
    //    cuda-mem input (on `cs`, through the view of the CudaSlice), then read by a cuda-mem
    //    copy on the *other* stream `cs2`: the views make their stream wait for cudarc's
    //    events (and for z's own stream, `cs`), and record z's events when their closure is
    //    done.
    let mut z: CudaSlice<u32> = cs.alloc_zeros(N)?;
    let y_pin = PinnedBuffer::from_slice(&y_h, HostAllocFlags::DEFAULT)?;
    CudarcViewMut::with(&mut z, &cs, |zv| copy_async(zv, &y_pin, &s))?; // `s` is `cs` too
    CudarcViewMut::with(&mut z, &cs, |zv| {
        // SAFETY: as above: x and the view of z hold N u32 each.
        unsafe {
            Launch::on(&cs, &f, cfg)? // the view's stream
                .arg_in(&x)
                .arg_out(zv)
                .arg(&a)
                .arg(&n)
                .launch()
        }
    })?;
    let mut back = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT)?;
    CudarcView::with(&z, &cs2, |zv| copy_async(&mut back, zv, zv.stream()))?;
    let mut want_z = y_h.clone();
    axpy(&x_h, &mut want_z);
    check(
        "kernel on a CudaSlice, read by cuda-mem on another stream",
        back.as_slice()?,
        &want_z,
    )?;

    // 4. cudarc's own work on the blocking cuda-mem stream: a copy of x into cudarc memory,
    //    queued on `blocking` (cudarc_stream keeps the stream alive as long as cudarc needs
    //    it), read back by cudarc.
    let cb = cudarc_stream(&blocking)?;
    let mut w: CudaSlice<u32> = cb.alloc_zeros(N)?;
    cb.memcpy_dtod(&x.cudarc_ptr(&cb)?, &mut w)?;
    drop(blocking);
    check(
        "cudarc's copy on a cuda-mem stream",
        &cb.clone_dtoh(&w)?,
        &x_h,
    )?;

    // 5. cudarc's own copy of the same memory agrees.
    let from_cudarc = cs.clone_dtoh(&z)?;
    check("the same CudaSlice, read by cudarc", &from_cudarc, &want_z)?;
    println!("cuda-mem example cudarc_kernel: all results match");
    Ok(())
}
