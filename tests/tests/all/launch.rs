//! The checked kernel launch (`interop::cudarc::Launch`) and cuda-mem streams lent to cudarc
//! (`interop::cudarc::cudarc_stream`).
//!
//! Each ordering test holds the launch's stream with a slow kernel (`Probes::spin`), queues
//! the launch behind it, then reads the buffer from the host or from *another* stream that
//! does not synchronize with the first by itself: the read sees the kernel's data only if the
//! guards the launch took were for the launch's stream and lived until it was queued.

use std::sync::Arc;

use cuda_mem::interop::cudarc::{context, cudarc_stream, CudarcViewMut, Launch};
use cuda_mem::{copy_async, Device, DeviceBuffer, HostAllocFlags, Misuse, PinnedBuffer, Stream};
use cuda_mem_probes::{Probes, PROBE_PTX};
use cuda_mem_tests::gpu_or_skip;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use cudarc::nvrtc::Ptx;

use crate::{first_not_written, pattern, SPIN};

/// Elements per buffer: 16 MiB of `u32`.
const N: usize = 4 << 20;
/// `cm_write`'s count: 16-byte words of an [`N`]-element `u32` buffer.
const WORDS: u64 = (N / 4) as u64;

/// The probe kernel `name`, loaded through cudarc in the device's shared context.
fn kernel(dev: Device, name: &str) -> CudaFunction {
    let ctx = context(dev).unwrap();
    let module = ctx
        .load_module(Ptx::from_src(PROBE_PTX.to_str().unwrap()))
        .unwrap();
    module.load_function(name).unwrap()
}

fn grid() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (256, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Queues `cm_write` over all of `d` on `s` through the checked launch, behind a slow kernel
/// on `s`, and checks that it is still pending on return.
fn slow_write<S: cuda_mem::interop::cudarc::LaunchStream + ?Sized>(
    probes: &Probes,
    spin_on: &Stream,
    s: &S,
    write: &CudaFunction,
    d: &mut DeviceBuffer<u32>,
) {
    probes.spin(SPIN, spin_on).unwrap();
    // SAFETY: cm_write(uint4* p, u64 n) writes n 16-byte words: all of `d`.
    unsafe {
        Launch::on(s, write, grid())
            .unwrap()
            .arg_out(d)
            .arg(&WORDS)
            .launch()
            .unwrap();
    }
    cuda_mem_tests::still_pending(
        !spin_on.is_idle().unwrap(),
        "the launch's stream was idle after the launch: nothing was tested",
    );
}

/// A launch through `Launch` writes a cuda-mem buffer, behind a slow kernel on its stream;
/// the host's read of the buffer waits for it (the guard was for that stream and recorded
/// the kernel).
#[test]
fn a_checked_launch_writes_what_the_host_reads_back() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let write = kernel(dev, "cm_write");
    let s = Stream::non_blocking().unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    slow_write(&probes, &s, &s, &write, &mut d);
    assert_eq!(first_not_written(&d.to_vec().unwrap()), None);
}

/// Launched on a *blocking* cuda-mem stream (which cudarc cannot make), behind a slow kernel;
/// a cuda-mem copy of the buffer on a non-blocking stream, which does not wait for the
/// blocking one by itself, sees the kernel's data.
#[test]
fn a_checked_launch_on_a_blocking_stream_is_ordered_before_a_copy_on_another_stream() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let write = kernel(dev, "cm_write");
    let (s, other) = (Stream::new().unwrap(), Stream::non_blocking().unwrap());
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    slow_write(&probes, &s, &s, &write, &mut d);
    let mut back = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    copy_async(&mut back, &d, &other).unwrap();
    other.synchronize().unwrap();
    assert_eq!(first_not_written(back.as_slice().unwrap()), None);
}

/// The same on the legacy default stream, which non-blocking streams do not wait for either.
#[test]
fn a_checked_launch_on_the_legacy_stream_is_ordered_before_a_copy_on_another_stream() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let write = kernel(dev, "cm_write");
    let (s, other) = (Stream::legacy_default(), Stream::non_blocking().unwrap());
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    slow_write(&probes, &s, &s, &write, &mut d);
    let mut back = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    copy_async(&mut back, &d, &other).unwrap();
    other.synchronize().unwrap();
    assert_eq!(first_not_written(back.as_slice().unwrap()), None);
}

/// On a cudarc stream: the launch's write (behind a slow kernel on that stream) is seen by a
/// cuda-mem copy on a non-blocking cuda-mem stream; then a launch that *reads* the buffer
/// (`arg_in`) on the cudarc stream, behind a slow cuda-mem copy into it on another stream,
/// checksums the copied data.
#[test]
fn a_checked_launch_on_a_cudarc_stream_is_ordered_both_ways() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let (write, xor) = (kernel(dev, "cm_write"), kernel(dev, "cm_xor"));
    let cs = context(dev).unwrap().new_stream().unwrap();
    let on_cs = cuda_mem::interop::cudarc::stream(&cs).unwrap();
    let other = Stream::non_blocking().unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    slow_write(&probes, &on_cs, &cs, &write, &mut d);
    let mut back = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    copy_async(&mut back, &d, &other).unwrap();
    other.synchronize().unwrap();
    assert_eq!(first_not_written(back.as_slice().unwrap()), None);

    let data = pattern(N, 21);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    probes.spin(SPIN, &other).unwrap();
    copy_async(&mut d, &src, &other).unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(1).unwrap();
    let n = N as u64;
    // SAFETY: cm_xor(const u32* p, u64 n, u32* out) reads n u32 of `d` and xors them into
    // the one element of `out`.
    unsafe {
        Launch::on(&cs, &xor, grid())
            .unwrap()
            .arg_in(&d)
            .arg(&n)
            .arg_out(&mut out)
            .launch()
            .unwrap();
    }
    cuda_mem_tests::still_pending(
        !other.is_idle().unwrap(),
        "the copy into the buffer was done before the kernel was queued: nothing was tested",
    );
    assert_eq!(
        out.to_vec().unwrap(),
        vec![data.iter().fold(0, |x, &v| x ^ v)]
    );
}

/// An argument that cannot be taken for the launch's stream (a view of cudarc memory, which
/// is bound to its own stream) fails the launch with its exact error, and nothing is launched:
/// the memory stays as it was.
#[test]
fn a_launch_with_a_refused_argument_reports_it_and_launches_nothing() {
    let dev = gpu_or_skip!();
    let write = kernel(dev, "cm_write");
    let a = context(dev).unwrap().new_stream().unwrap();
    let other = Stream::non_blocking().unwrap();
    let mut z: CudaSlice<u32> = a.alloc_zeros(N).unwrap();
    let e = CudarcViewMut::with(&mut z, &a, |v| {
        // SAFETY: cm_write(uint4* p, u64 n) writes n 16-byte words: all of the view.
        unsafe {
            Launch::on(&other, &write, grid())?
                .arg_out(v)
                .arg(&WORDS)
                .launch()
        }
    })
    .unwrap_err();
    assert!(
        matches!(
            e.misuse(),
            Some(Misuse::InvalidArgument {
                op: "device_ptr_mut",
                ..
            })
        ),
        "{e}"
    );
    other.synchronize().unwrap();
    assert!(a.clone_dtoh(&z).unwrap().iter().all(|&v| v == 0));
}

/// A blocking cuda-mem stream lent to cudarc is the same stream (one handle), and cudarc's
/// work on it keeps it alive after the cuda-mem `Stream` is dropped: the stream is
/// synchronized, so without the lender's hold it would be destroyed at the drop and cudarc's
/// next call on it would fail.
#[test]
fn a_blocking_stream_lent_to_cudarc_is_the_same_stream_and_outlives_its_owner() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::new().unwrap();
    let cs = cudarc_stream(&s).unwrap();
    assert_eq!(cs.cu_stream() as usize, s.as_raw() as usize);
    assert!(Arc::ptr_eq(cs.context(), &context(dev).unwrap()));
    assert!(cs.context().is_managing_stream_synchronization());

    // cudarc's allocation and zeroing are queued on `s`, behind the slow kernel there, and
    // cudarc's synchronize waits for `s`.
    probes.spin(SPIN, &s).unwrap();
    let mut y: CudaSlice<u32> = cs.alloc_zeros(N).unwrap();
    cuda_mem_tests::still_pending(!s.is_idle().unwrap(), "nothing was tested");
    cs.synchronize().unwrap();
    assert!(
        s.is_idle().unwrap(),
        "cudarc's synchronize did not wait for `s`"
    );

    let data = pattern(N, 22);
    cs.memcpy_htod(&data[..], &mut y).unwrap();
    s.synchronize().unwrap();
    drop(s);
    let got = cs.clone_dtoh(&y).unwrap();
    assert!(got == data, "cudarc read back other data");
    drop(y);
    cs.synchronize().unwrap();
}

/// The legacy default stream lent to cudarc is cudarc's default stream of the device's shared
/// context; a cuda-mem stream over a cudarc stream goes back to that very stream.
#[test]
fn the_legacy_stream_and_cudarcs_own_streams_lend_as_themselves() {
    let dev = gpu_or_skip!();
    let ctx = context(dev).unwrap();
    let legacy = cudarc_stream(&Stream::legacy_default()).unwrap();
    assert!(legacy.cu_stream().is_null());
    assert!(Arc::ptr_eq(legacy.context(), &ctx));

    let cs = ctx.new_stream().unwrap();
    let back = cudarc_stream(&cuda_mem::interop::cudarc::stream(&cs).unwrap()).unwrap();
    assert!(Arc::ptr_eq(&back, &cs));
}

/// What cudarc could not keep valid is refused, with the exact error: the per-thread default
/// stream (a different stream on every thread) and a stream borrowed with `from_raw`.
#[test]
fn lending_refuses_streams_that_cudarc_could_outlive_or_misname() {
    let dev = gpu_or_skip!();
    let op = "interop::cudarc::cudarc_stream";
    let e = cudarc_stream(&Stream::per_thread().unwrap()).unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::InvalidArgument { op: o, reason })
            if *o == op && reason.contains("per-thread")),
        "{e}"
    );
    let owner = Stream::non_blocking().unwrap();
    // SAFETY: `owner` outlives the borrowed stream and every use of it here.
    let borrowed = unsafe { Stream::from_raw(owner.as_raw(), dev) };
    let e = cudarc_stream(&borrowed).unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::InvalidArgument { op: o, reason })
            if *o == op && reason.contains("borrowed")),
        "{e}"
    );
}

/// Without a driver, the entry points that start from cuda-mem values return the runtime's
/// no-driver error where cudarc would panic (it cannot load libcuda); with one, they work.
/// Runs on every machine.
#[test]
fn cudarc_entry_points_return_the_no_driver_error_instead_of_panicking() {
    let legacy = Stream::legacy_default();
    match Device::count() {
        Ok(n) if n > 0 => {
            assert!(cudarc_stream(&legacy).unwrap().cu_stream().is_null());
        }
        Ok(_) | Err(_) => {
            let e = cudarc_stream(&legacy).unwrap_err();
            assert!(e.is_no_device(), "{e}");
        }
    }
}
