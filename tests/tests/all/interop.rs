//! cuda-mem with cudarc in the process (`cuda_mem::interop::cudarc`): cudarc's streams,
//! kernels and memory.
//!
//! Each ordering test holds one stream with a slow kernel (`cm_spin`, loaded through cudarc
//! or cuda-mem's probes), queues a write behind it, then reads from *another* stream: the read
//! sees the write only if the ordering that the test is about does its job, and the test checks
//! that the write was indeed still pending when the read was queued.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cuda_mem::interop::cudarc::{
    context, stream, CudarcPtr as _, CudarcPtrMut as _, CudarcView, CudarcViewMut,
};
use cuda_mem::{
    copy, copy_async, Device, DeviceBuffer, DevicePtr as _, DevicePtrMut as _, HostAllocFlags,
    MemPool, Misuse, PinnedBuffer, Stream,
};
use cuda_mem_probes::{Probes, PROBE_PTX};
use cuda_mem_tests::gpu_or_skip;
use cudarc::driver::{
    result as dresult, CudaContext, CudaModule, CudaSlice, CudaStream, DevicePtr as _,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::{first_not_written, pattern, SPIN};

/// Elements per buffer: 16 MiB of `u32`.
const N: usize = 4 << 20;

/// cudarc's primary context of `dev`, with the probe kernels loaded through cudarc.
fn cudarc_setup(dev: Device) -> (Arc<CudaContext>, Arc<CudaModule>) {
    let ctx = context(dev).unwrap();
    let ptx = PROBE_PTX.to_str().unwrap();
    let module = ctx.load_module(Ptx::from_src(ptx)).unwrap();
    (ctx, module)
}

fn one_thread() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn grid() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (256, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Holds `s` for [`SPIN`] ns with `cm_spin`, launched through cudarc.
fn cudarc_spin(s: &Arc<CudaStream>, m: &Arc<CudaModule>) {
    let f = m.load_function("cm_spin").unwrap();
    let mut l = s.launch_builder(&f);
    l.arg(&SPIN);
    // SAFETY: cm_spin takes one u64 and touches no memory.
    unsafe { l.launch(one_thread()) }.unwrap();
}

/// A zeroed `CudaSlice` of [`N`] `u32` that belongs to stream `b`, then written whole by
/// `cm_write` through cudarc on stream `a`, behind [`cudarc_spin`]: the write is still pending
/// on return, and only cudarc's write event (recorded by the launch) orders other streams,
/// `b` included, after it.
fn cudarc_slow_write(
    a: &Arc<CudaStream>,
    b: &Arc<CudaStream>,
    m: &Arc<CudaModule>,
) -> CudaSlice<u32> {
    let mut z: CudaSlice<u32> = b.alloc_zeros(N).unwrap();
    b.synchronize().unwrap();
    cudarc_spin(a, m);
    let write = m.load_function("cm_write").unwrap();
    let words = (N / 4) as u64;
    let mut l = a.launch_builder(&write);
    l.arg(&mut z).arg(&words);
    // SAFETY: cm_write(uint4* p, u64 n) writes n 16-byte words: all of `z`; cudarc records
    // the launch on z's write event.
    unsafe { l.launch(grid()) }.unwrap();
    drop(l);
    z
}

/// cudarc's fence honoured by cuda-mem: a cudarc kernel writes a `CudaSlice` on stream A
/// behind a slow kernel; a cuda-mem copy of it on stream B, through a `CudarcView`, sees the
/// finished write. The slice belongs to B, so only cudarc's write event orders B after A.
#[test]
fn a_cuda_mem_copy_on_another_stream_waits_for_a_long_cudarc_write() {
    let dev = gpu_or_skip!();
    let (ctx, m) = cudarc_setup(dev);
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let z = cudarc_slow_write(&a, &b, &m);
    let mut back = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    CudarcView::with(&z, &b, |view| {
        assert_eq!(view.len(), N);
        assert_eq!(view.stream().as_raw() as usize, b.cu_stream() as usize);
        copy_async(&mut back, view, view.stream())
    })
    .unwrap();
    cuda_mem_tests::still_pending(
        !stream(&a).unwrap().is_idle().unwrap(),
        "the cudarc write was done before the copy was queued: nothing was tested",
    );
    assert_eq!(first_not_written(back.as_slice().unwrap()), None);
}

/// cuda-mem's fence honoured by cudarc: a cuda-mem copy writes a `DeviceBuffer` on stream A
/// behind a slow kernel; a cudarc kernel on stream B reads it through `cudarc_ptr`, which
/// orders B after the copy, and checksums it into cudarc memory.
#[test]
fn a_cudarc_kernel_on_another_stream_waits_for_a_long_cuda_mem_write() {
    let dev = gpu_or_skip!();
    let (ctx, m) = cudarc_setup(dev);
    let probes = Probes::load().unwrap();
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let sa = stream(&a).unwrap();
    let data = pattern(N, 3);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    probes.spin(SPIN, &sa).unwrap();
    copy_async(&mut d, &src, &sa).unwrap();
    let xor = m.load_function("cm_xor").unwrap();
    let mut out: CudaSlice<u32> = b.alloc_zeros(1).unwrap();
    {
        let dr = d.cudarc_ptr(&b).unwrap();
        let n = N as u64;
        let mut l = b.launch_builder(&xor);
        l.arg(&dr).arg(&n).arg(&mut out);
        // SAFETY: cm_xor(const u32* p, u64 n, u32* out): the guard's N u32, taken for `b`,
        // and cudarc's one-element slice; the guard records the launch on `d` when it drops.
        unsafe { l.launch(grid()) }.unwrap();
    }
    cuda_mem_tests::still_pending(
        !sa.is_idle().unwrap(),
        "the cuda-mem write was done before the kernel was queued: nothing was tested",
    );
    let got = b.clone_dtoh(&out).unwrap();
    assert_eq!(got, vec![data.iter().fold(0, |x, &v| x ^ v)]);
    // The kernel's read was recorded on `d`: a write to it from the host side waits for it.
    d.memset(0).unwrap();
    assert!(d.to_vec().unwrap().iter().all(|&v| v == 0));
}

/// A synchronous `copy` out of a view runs on the legacy default stream, which does not wait
/// for cudarc's non-blocking streams by itself: it still sees cudarc's pending write.
#[test]
fn a_synchronous_copy_from_a_cudarc_view_waits_for_the_cudarc_write() {
    let dev = gpu_or_skip!();
    let (ctx, m) = cudarc_setup(dev);
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let z = cudarc_slow_write(&a, &b, &m);
    let mut back = vec![0u32; N];
    CudarcView::with(&z, &b, |view| {
        cuda_mem_tests::still_pending(
            !stream(&a).unwrap().is_idle().unwrap(),
            "nothing was tested",
        );
        copy(&mut back, view)
    })
    .unwrap();
    assert_eq!(first_not_written(&back), None);
}

/// cuda-mem writes cudarc memory (a copy through a `CudarcViewMut`, behind a slow kernel on
/// its stream B); cudarc reads it on a third stream C: the view's end records cudarc's write
/// event, which cudarc makes C wait for.
#[test]
fn cudarc_work_on_another_stream_waits_for_a_cuda_mem_write_of_cudarc_memory() {
    let dev = gpu_or_skip!();
    let (ctx, _m) = cudarc_setup(dev);
    let probes = Probes::load().unwrap();
    let (a, b, c) = (
        ctx.new_stream().unwrap(),
        ctx.new_stream().unwrap(),
        ctx.new_stream().unwrap(),
    );
    let mut z: CudaSlice<u32> = a.alloc_zeros(N).unwrap();
    a.synchronize().unwrap();
    let data = pattern(N, 4);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let sb = stream(&b).unwrap();
    probes.spin(SPIN, &sb).unwrap();
    CudarcViewMut::with(&mut z, &b, |v| copy_async(v, &src, &sb)).unwrap();
    cuda_mem_tests::still_pending(!sb.is_idle().unwrap(), "nothing was tested");
    let got = c.clone_dtoh(&z).unwrap();
    assert!(got == data, "cudarc read z before cuda-mem's write landed");
}

/// cudarc's own copies take cuda-mem guards (cudarc's `DevicePtr` / `DevicePtrMut`): on the
/// guard's stream, and on another, which first waits for the guard's stream.
#[test]
fn cudarc_copies_take_cuda_mem_guards_on_any_stream() {
    let dev = gpu_or_skip!();
    let (ctx, _m) = cudarc_setup(dev);
    let probes = Probes::load().unwrap();
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let data = pattern(N, 5);

    // Device to device on the guard's own stream.
    let d = DeviceBuffer::from_slice(&data).unwrap();
    let mut z: CudaSlice<u32> = a.alloc_zeros(N).unwrap();
    {
        let g = d.cudarc_ptr(&a).unwrap();
        a.memcpy_dtod(&g, &mut z).unwrap();
    }
    assert!(a.clone_dtoh(&z).unwrap() == data);

    // A guard for A, used by a cudarc copy on B while a cuda-mem write to the buffer is
    // pending on A: B waits for A.
    let sa = stream(&a).unwrap();
    let src = PinnedBuffer::from_slice(&pattern(N, 6), HostAllocFlags::DEFAULT).unwrap();
    let mut d2 = DeviceBuffer::<u32>::zeroed(N).unwrap();
    probes.spin(SPIN, &sa).unwrap();
    copy_async(&mut d2, &src, &sa).unwrap();
    let mut z2: CudaSlice<u32> = b.alloc_zeros(N).unwrap();
    {
        let g = d2.cudarc_ptr(&a).unwrap();
        cuda_mem_tests::still_pending(!sa.is_idle().unwrap(), "nothing was tested");
        b.memcpy_dtod(&g, &mut z2).unwrap();
    }
    assert!(b.clone_dtoh(&z2).unwrap() == src.as_slice().unwrap());

    // Host to device through a write guard, then read by cuda-mem.
    let mut e = DeviceBuffer::<u32>::zeroed(N).unwrap();
    {
        let mut g = e.cudarc_ptr_mut(&b).unwrap();
        b.memcpy_htod(&data[..], &mut g).unwrap();
    }
    assert!(e.to_vec().unwrap() == data);
}

/// `context` is cudarc's primary context of a cuda-mem device, the one `CudaContext::new`
/// gives (so `stream` takes its streams). Without a driver the way to it is the runtime's
/// no-device error, where cudarc's `CudaContext::new` panics (it cannot load libcuda).
#[test]
fn context_is_the_primary_context_of_a_device_or_the_no_device_error() {
    if cuda_mem::driver_version().unwrap() == 0 {
        let e = Device::get(0).and_then(context).unwrap_err();
        assert!(e.is_no_device(), "{e}");
        return;
    }
    let dev = gpu_or_skip!();
    let ctx = context(dev).unwrap();
    assert!(ctx.is_primary());
    assert_eq!(ctx.ordinal(), dev.ordinal() as usize);
    let theirs = CudaContext::new(dev.ordinal() as usize).unwrap();
    assert_eq!(ctx.cu_ctx(), theirs.cu_ctx());
    let s = stream(&ctx.new_stream().unwrap()).unwrap();
    assert_eq!(s.device(), dev);
}

/// The address cudarc's memory has now (to tell whether an allocation reused a freed one).
fn cudarc_addr(z: &CudaSlice<u32>, s: &Arc<CudaStream>) -> u64 {
    z.device_ptr(s).0
}

/// Issue 19 (item 3), as close as the scoped API lets safe code come: cuda-mem copies into
/// cudarc memory through a `CudarcViewMut`, behind a slow kernel on the view's stream B, and
/// the closure passes to `mem::forget` what it can (guards taken from the view); cudarc then
/// reads the slice on a third stream C and must see the copy, and the slice dropped with
/// another such copy pending must not be reused by cudarc's next allocation before that copy.
///
/// With the old API (up to bec4614) the same program forgot the view itself, and failed
/// (all N elements stale, 5 runs of 5 on an H200):
///
/// ```text
/// let mut v = CudarcViewMut::new(&mut z, &b).unwrap();
/// copy_async(&mut v, &src, &sb).unwrap();
/// std::mem::forget(v);                      // no Drop: no write event, no join of z's stream
/// let got = c.clone_dtoh(&z).unwrap();      // did not wait for the copy
/// assert!(got == data);                     // failed
/// ```
#[test]
fn cudarc_reads_a_cuda_mem_copy_into_a_view_whose_guards_were_forgotten() {
    let dev = gpu_or_skip!();
    let (ctx, _m) = cudarc_setup(dev);
    let probes = Probes::load().unwrap();
    let (a, b, c) = (
        ctx.new_stream().unwrap(),
        ctx.new_stream().unwrap(),
        ctx.new_stream().unwrap(),
    );
    let sb = stream(&b).unwrap();
    let mut z: CudaSlice<u32> = a.alloc_zeros(N).unwrap();
    a.synchronize().unwrap();
    let data = pattern(N, 8);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    probes.spin(SPIN, &sb).unwrap();
    CudarcViewMut::with(&mut z, &b, |v| {
        copy_async(&mut *v, &src, &sb)?;
        // All that the closure owns and could forget: guards of the view.
        std::mem::forget(v.cudarc_ptr_mut(&b)?);
        std::mem::forget(v.device_ptr_mut(&sb)?);
        Ok(())
    })
    .unwrap();
    cuda_mem_tests::still_pending(!sb.is_idle().unwrap(), "nothing was tested");
    let got = c.clone_dtoh(&z).unwrap();
    assert!(got == data, "cudarc read z before cuda-mem's copy landed");

    // Dropped with a copy into it pending on B: cudarc frees it on its stream A, after the
    // copy; an allocation on A that reuses the memory and is written there keeps its data.
    let data2 = pattern(N, 9);
    let src2 = PinnedBuffer::from_slice(&data2, HostAllocFlags::DEFAULT).unwrap();
    let z_addr = cudarc_addr(&z, &a);
    probes.spin(SPIN, &sb).unwrap();
    CudarcViewMut::with(&mut z, &b, |v| {
        copy_async(&mut *v, &src2, &sb)?;
        std::mem::forget(v.cudarc_ptr_mut(&b)?);
        Ok(())
    })
    .unwrap();
    cuda_mem_tests::still_pending(!sb.is_idle().unwrap(), "nothing was tested");
    drop(z);
    let mut z2: CudaSlice<u32> = a.alloc_zeros(N).unwrap();
    let reused = cudarc_addr(&z2, &a) == z_addr;
    let data3 = pattern(N, 10);
    a.memcpy_htod(&data3[..], &mut z2).unwrap();
    b.synchronize().unwrap();
    assert!(
        a.clone_dtoh(&z2).unwrap() == data3,
        "cuda-mem's copy into a dropped CudaSlice landed in its next allocation \
         (address reused: {reused})"
    );
    if !reused {
        eprintln!("NOTE cudarc's pool did not hand the freed address back: drop not exercised");
    }
}

/// The same for a `CudarcView`: a cuda-mem copy out of cudarc memory, and a cudarc kernel
/// through a guard of the view, both behind a slow kernel on B, the guards forgotten; cudarc
/// then zeroes the slice on C, which waits for both reads (they see the old data). With the
/// old API, `mem::forget(view)` after `copy_async(&mut back, &view, view.stream())` let the
/// zeroing land first.
#[test]
fn cudarc_writes_after_cuda_mem_reads_of_a_view_whose_guards_were_forgotten() {
    let dev = gpu_or_skip!();
    let (ctx, m) = cudarc_setup(dev);
    let probes = Probes::load().unwrap();
    let (a, b, c) = (
        ctx.new_stream().unwrap(),
        ctx.new_stream().unwrap(),
        ctx.new_stream().unwrap(),
    );
    let sb = stream(&b).unwrap();
    let data = pattern(N, 11);
    let mut z: CudaSlice<u32> = a.alloc_zeros(N).unwrap();
    a.memcpy_htod(&data[..], &mut z).unwrap();
    a.synchronize().unwrap();
    let xor = m.load_function("cm_xor").unwrap();
    let mut out: CudaSlice<u32> = b.alloc_zeros(1).unwrap();
    b.synchronize().unwrap();
    let mut back = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    probes.spin(SPIN, &sb).unwrap();
    CudarcView::with(&z, &b, |v| {
        copy_async(&mut back, v, v.stream())?;
        let g = v.cudarc_ptr(&b)?;
        let n = N as u64;
        let mut l = b.launch_builder(&xor);
        l.arg(&g).arg(&n).arg(&mut out);
        // SAFETY: cm_xor(const u32* p, u64 n, u32* out): the guard's N u32, taken for `b`
        // where the kernel runs, and cudarc's one-element slice.
        unsafe { l.launch(grid()) }?;
        drop(l);
        std::mem::forget(g);
        std::mem::forget(v.device_ptr(v.stream())?);
        Ok(())
    })
    .unwrap();
    cuda_mem_tests::still_pending(!sb.is_idle().unwrap(), "nothing was tested");
    c.memset_zeros(&mut z).unwrap();
    assert!(
        back.as_slice().unwrap() == data,
        "cudarc overwrote z before cuda-mem's copy read it"
    );
    let got = b.clone_dtoh(&out).unwrap();
    assert_eq!(got, vec![data.iter().fold(0, |x, &v| x ^ v)]);
    assert!(c.clone_dtoh(&z).unwrap().iter().all(|&v| v == 0));
}

/// A view ends on every way out of its closure: an error of the closure comes back unchanged
/// and a panic unwinds through `with`; either way cudarc then reads what cuda-mem had queued
/// into the view (behind a slow kernel), not stale data.
#[test]
fn a_cudarc_view_ends_when_its_closure_fails_or_panics() {
    let dev = gpu_or_skip!();
    let (ctx, _m) = cudarc_setup(dev);
    let probes = Probes::load().unwrap();
    let (a, b, c) = (
        ctx.new_stream().unwrap(),
        ctx.new_stream().unwrap(),
        ctx.new_stream().unwrap(),
    );
    let (sb, sc) = (stream(&b).unwrap(), stream(&c).unwrap());
    let mut z: CudaSlice<u32> = a.alloc_zeros(N).unwrap();
    a.synchronize().unwrap();

    let data = pattern(N, 12);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    probes.spin(SPIN, &sb).unwrap();
    let e = CudarcViewMut::with(&mut z, &b, |v| {
        copy_async(&mut *v, &src, &sb)?;
        copy_async(v, &src, &sc) // the view's stream is B: refused
    })
    .unwrap_err();
    assert!(
        matches!(
            e.misuse(),
            Some(Misuse::InvalidArgument {
                op: "copy_async",
                ..
            })
        ),
        "{e}"
    );
    cuda_mem_tests::still_pending(!sb.is_idle().unwrap(), "nothing was tested");
    assert!(
        c.clone_dtoh(&z).unwrap() == data,
        "cudarc read z before the copy of a failed closure landed"
    );

    let data2 = pattern(N, 13);
    let src2 = PinnedBuffer::from_slice(&data2, HostAllocFlags::DEFAULT).unwrap();
    probes.spin(SPIN, &sb).unwrap();
    let r = catch_unwind(AssertUnwindSafe(|| {
        CudarcViewMut::with(&mut z, &b, |v| -> cuda_mem::Result<()> {
            copy_async(v, &src2, &sb)?;
            panic!("the closure panics with a copy into the view pending");
        })
    }));
    assert!(r.is_err());
    cuda_mem_tests::still_pending(!sb.is_idle().unwrap(), "nothing was tested");
    assert!(
        c.clone_dtoh(&z).unwrap() == data2,
        "cudarc read z before the copy of a panicked closure landed"
    );
}

/// A cuda-mem `CudarcWrite` guard passed to `mem::forget` after a cudarc kernel wrote through
/// it (behind a slow kernel on A) still orders what comes next after that write: the host's
/// read of the buffer, and a cudarc copy out of it on stream B (through a `CudarcRead`).
#[test]
fn a_forgotten_cudarc_write_guard_still_orders_host_and_cudarc_reads() {
    let dev = gpu_or_skip!();
    let (ctx, m) = cudarc_setup(dev);
    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let sa = stream(&a).unwrap();
    let write = m.load_function("cm_write").unwrap();
    let words = (N / 4) as u64;
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let slow_write = |d: &mut DeviceBuffer<u32>| {
        cudarc_spin(&a, &m);
        let mut g = d.cudarc_ptr_mut(&a).unwrap();
        let mut l = a.launch_builder(&write);
        l.arg(&mut g).arg(&words);
        // SAFETY: cm_write(uint4* p, u64 n) writes n 16-byte words: the guard's N u32, taken
        // for `a`, where the kernel runs.
        unsafe { l.launch(grid()) }.unwrap();
        drop(l);
        std::mem::forget(g);
        cuda_mem_tests::still_pending(!sa.is_idle().unwrap(), "nothing was tested");
    };

    slow_write(&mut d);
    assert_eq!(first_not_written(&d.to_vec().unwrap()), None);

    d.memset(0).unwrap();
    slow_write(&mut d);
    let r = d.cudarc_ptr(&b).unwrap();
    let got = b.clone_dtoh(&r).unwrap();
    std::mem::forget(r);
    assert_eq!(first_not_written(&got), None);
}

/// A cuda-mem `CudarcRead` guard passed to `mem::forget` after a cudarc kernel read through it
/// (behind a slow kernel on B) still orders the buffer's free after the read: the pooled
/// buffer, dropped at once, is freed on its own stream after the read, and the pool's next
/// allocation there, written at once, does not change what the read sees.
#[test]
fn a_forgotten_cudarc_read_guard_still_orders_the_free_after_the_read() {
    let dev = gpu_or_skip!();
    let (ctx, m) = cudarc_setup(dev);
    let pool = MemPool::new(dev).unwrap();
    let s = Stream::non_blocking().unwrap();
    let b = ctx.new_stream().unwrap();
    let data = pattern(N, 14);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::from_pool(&pool, N, &s).unwrap();
    copy_async(&mut d, &src, &s).unwrap();
    let xor = m.load_function("cm_xor").unwrap();
    let mut out: CudaSlice<u32> = b.alloc_zeros(1).unwrap();
    cudarc_spin(&b, &m);
    let r = d.cudarc_ptr(&b).unwrap();
    let n = N as u64;
    let mut l = b.launch_builder(&xor);
    l.arg(&r).arg(&n).arg(&mut out);
    // SAFETY: cm_xor(const u32* p, u64 n, u32* out): the guard's N u32, taken for `b` where
    // the kernel runs, and cudarc's one-element slice.
    unsafe { l.launch(grid()) }.unwrap();
    drop(l);
    std::mem::forget(r);
    cuda_mem_tests::still_pending(
        !stream(&b).unwrap().is_idle().unwrap(),
        "nothing was tested",
    );
    let d_addr = d.as_ptr() as usize;
    drop(d);
    let mut y = DeviceBuffer::<u32>::from_pool(&pool, N, &s).unwrap();
    let reused = y.as_ptr() as usize == d_addr;
    y.memset_async(0xff, &s).unwrap();
    let got = b.clone_dtoh(&out).unwrap();
    assert_eq!(
        got,
        vec![data.iter().fold(0, |x, &v| x ^ v)],
        "the read saw memory reused by the pool (address reused: {reused})"
    );
    assert!(y.to_vec().unwrap().iter().all(|&v| v == u32::MAX));
    if !reused {
        eprintln!("NOTE pool did not hand the freed address back: ordering not exercised");
    }
}

/// What cannot be ordered is refused, with the exact error: contexts other than the primary
/// one, the per-thread default stream, work through a view on another stream than its own.
/// cudarc's default (null) stream is the legacy default stream.
#[test]
fn streams_and_views_refuse_what_they_cannot_order() {
    let dev = gpu_or_skip!();
    let (ctx, _m) = cudarc_setup(dev);
    let op = "interop::cudarc::stream";

    let e = stream(&ctx.per_thread_stream()).unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::InvalidArgument { op: o, reason })
            if *o == op && reason.contains("per-thread")),
        "{e}"
    );

    let other = CudaContext::new_non_primary(dev.ordinal() as usize, 0).unwrap();
    let e = stream(&other.default_stream()).unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::InvalidArgument { op: o, reason })
            if *o == op && reason.contains("not the primary context")),
        "{e}"
    );
    drop(other);
    ctx.bind_to_thread().unwrap(); // the runtime's context again, for what follows

    let legacy = stream(&ctx.default_stream()).unwrap();
    assert!(legacy.as_raw().is_null());
    assert_eq!(legacy.device(), dev);

    let (a, b) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let z: CudaSlice<u32> = a.alloc_zeros(1024).unwrap();
    let sb = stream(&b).unwrap();
    let mut back = PinnedBuffer::<u32>::zeroed(1024, HostAllocFlags::DEFAULT).unwrap();
    CudarcView::with(&z, &a, |view| {
        let e = copy_async(&mut back, view, &sb).unwrap_err();
        assert!(
            matches!(
                e.misuse(),
                Some(Misuse::InvalidArgument {
                    op: "copy_async",
                    ..
                })
            ),
            "{e}"
        );
        let e = view.device_ptr(&sb).unwrap_err();
        assert!(
            matches!(
                e.misuse(),
                Some(Misuse::InvalidArgument {
                    op: "device_ptr",
                    ..
                })
            ),
            "{e}"
        );
        // Any cuda-mem stream over the view's own cudarc stream is the view's stream.
        copy_async(&mut back, view, &stream(&a).unwrap())
    })
    .unwrap();
    assert!(back.as_slice().unwrap().iter().all(|&v| v == 0));
}

/// The cuda-mem stream over a cudarc stream keeps it alive for the buffers that recorded work
/// on it, after cudarc's last handle is gone; releasing it leaves the thread's context as it
/// was.
#[test]
fn a_cudarc_stream_lives_as_long_as_cuda_mem_needs_it() {
    let dev = gpu_or_skip!();
    let (ctx, _m) = cudarc_setup(dev);
    let probes = Probes::load().unwrap();
    let a = ctx.new_stream().unwrap();
    let s = stream(&a).unwrap();
    let data = pattern(N, 7);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    probes.spin(SPIN, &s).unwrap();
    copy_async(&mut d, &src, &s).unwrap();
    // The buffers' fences hold the last handles; waiting records an event on the stream, so
    // it must still exist.
    drop((s, a));
    assert!(d.to_vec().unwrap() == data);

    let a = ctx.new_stream().unwrap();
    let s = stream(&a).unwrap();
    drop(a);
    // SAFETY: unbinding the thread's context (null is allowed); rebound below.
    unsafe { dresult::ctx::set_current(std::ptr::null_mut()) }.unwrap();
    drop(s); // cudarc binds its context to destroy the stream; the thread gets its own back
    assert_eq!(dresult::ctx::get_current().unwrap(), None);
    ctx.bind_to_thread().unwrap();
}
