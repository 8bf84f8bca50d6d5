//! CUDA graphs by stream capture (issue 22): every memory kind captured and replayed with
//! refilled data, a fork and join across two streams inside a capture, pool allocations as
//! graph memory, launches that host reads, later work and drops wait for, the exact refusals
//! (none of which invalidates the capture), an invalidated capture, and a cudarc kernel
//! captured with cuda-mem guards.

use cuda_mem::interop::cudarc::{stream as cudarc_stream, CudarcPtrMut as _};
use cuda_mem::{
    copy, copy_async, CaptureMode, DeviceBuffer, HostAllocFlags, ManagedBuffer, MappedBuffer,
    MemPool, Misuse, PinnedBuffer, Stream,
};
use cuda_mem::{Attach, DevicePtrMut as _, GraphExec, HostRegisterFlags, RegisteredVec};
use cuda_mem_probes::{Probes, PROBE_PTX};
use cuda_mem_tests::gpu_or_skip;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::{first_not_written, pattern, SPIN};

const N: usize = 1 << 16;
const MODES: [CaptureMode; 3] = [
    CaptureMode::Global,
    CaptureMode::ThreadLocal,
    CaptureMode::Relaxed,
];

/// `e` is `Misuse::InvalidArgument` with a reason that starts with `start`.
fn assert_refused(e: &cuda_mem::Error, start: &str) {
    match e.misuse() {
        Some(Misuse::InvalidArgument { reason, .. }) => {
            assert!(reason.starts_with(start), "unexpected reason: {reason}")
        }
        _ => panic!("not the expected misuse: {e}"),
    }
}

/// Pinned → device → mapped, managed, a pooled device buffer → pinned, and a registered `Vec`
/// → device, captured once per mode and replayed three times, the sources refilled through
/// the graph's resources before each launch. Data checked on every kind after each replay: a
/// launch not ordered after the refill, or a host read not waiting for the launch, shows the
/// previous round's data.
#[test]
fn every_kind_is_captured_and_replayed_with_refilled_data() {
    let dev = gpu_or_skip!();
    let pool = MemPool::new(dev).unwrap();
    for mode in MODES {
        let s = Stream::non_blocking().unwrap();
        let launch_s = Stream::non_blocking().unwrap();
        let mut h = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
        let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap(); // a legacy memset, pending
        let mut m = MappedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
        let mut g = ManagedBuffer::<u32>::zeroed(N, Attach::Global).unwrap();
        let mut p = DeviceBuffer::<u32>::from_pool(&pool, N, &s).unwrap();
        let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
        let mut r = RegisteredVec::register(vec![0u32; N], HostRegisterFlags::DEFAULT).unwrap();
        let mut d2 = DeviceBuffer::<u32>::zeroed(N).unwrap();
        let graph = s
            .capture(
                mode,
                (
                    &mut h, &mut d, &mut m, &mut g, &mut p, &mut out, &mut r, &mut d2,
                ),
                |cap, (h, d, m, g, p, out, r, d2)| {
                    let cs = cap.stream();
                    copy_async(&mut **d, &**h, cs)?;
                    copy_async(&mut **m, &**d, cs)?;
                    copy_async(&mut **g, &**d, cs)?;
                    copy_async(&mut **p, &**d, cs)?;
                    copy_async(&mut **out, &**p, cs)?;
                    copy_async(&mut **d2, &**r, cs)
                },
            )
            .unwrap();
        let mut exec = graph.instantiate().unwrap();
        for round in 0..3u32 {
            let data = pattern(N, round + 10 * mode as u32);
            let rdata = pattern(N, round + 100);
            {
                let res = exec.resources_mut();
                res.0.as_mut_slice().unwrap().copy_from_slice(&data);
                res.6.as_mut_slice().unwrap().copy_from_slice(&rdata);
            }
            exec.launch(&launch_s).unwrap();
            let res = exec.resources();
            assert!(
                res.5.as_slice().unwrap() == data,
                "{mode:?} {round}: pinned"
            );
            assert!(
                res.2.as_slice().unwrap() == data,
                "{mode:?} {round}: mapped"
            );
            assert!(
                res.3.as_slice().unwrap() == data,
                "{mode:?} {round}: managed"
            );
            assert!(res.1.to_vec().unwrap() == data, "{mode:?} {round}: device");
            assert!(res.4.to_vec().unwrap() == data, "{mode:?} {round}: pool");
            assert!(
                res.7.to_vec().unwrap() == rdata,
                "{mode:?} {round}: registered"
            );
        }
    }
}

/// A replay held behind a slow kernel: a host read of its output waits for it, work on
/// another stream after the graph is gone is ordered after it, and dropping the executable
/// graph waits for it. Without the launch's marks on the fences, the read and the copy see
/// the zeros from before.
#[test]
fn a_pending_replay_is_waited_for_by_host_reads_later_work_and_drop() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let l = Stream::non_blocking().unwrap();
    let data = pattern(N, 7);
    let mut h = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::uninit(N).unwrap();
    let mut exec = s
        .capture(
            CaptureMode::ThreadLocal,
            (&mut h, &mut d, &mut out),
            |cap, (h, d, out)| {
                probes.spin(SPIN, cap.stream())?;
                copy_async(&mut **d, &**h, cap.stream())?;
                copy_async(&mut **out, &**d, cap.stream())
            },
        )
        .unwrap()
        .instantiate()
        .unwrap();
    exec.launch(&l).unwrap();
    cuda_mem_tests::still_pending(!l.is_idle().unwrap(), "the replay ended before the read");
    assert!(exec.resources().2.as_slice().unwrap() == data, "host read");
    // Zero the output (waits), replay, then take the resources back and copy the output
    // on another stream while the replay is held.
    exec.resources_mut().2.as_mut_slice().unwrap().fill(0);
    exec.launch(&l).unwrap();
    let (_, _, out) = exec.into_resources().unwrap();
    let mut again = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let other = Stream::non_blocking().unwrap();
    copy_async(&mut again, &*out, &other).unwrap();
    assert!(again.to_vec().unwrap() == data, "work after the graph");
    // Dropping a buffer of a replay that is still held waits for it.
    let mut h2 = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d2 = DeviceBuffer::<u32>::uninit(N).unwrap();
    let exec = s
        .capture(CaptureMode::Global, (&mut h2, &mut d2), |cap, (h, d)| {
            probes.spin(SPIN, cap.stream())?;
            copy_async(&mut **d, &**h, cap.stream())
        })
        .unwrap()
        .instantiate()
        .unwrap();
    exec.launch(&l).unwrap();
    std::mem::forget(exec); // sound: the launch is on the buffers' fences
    cuda_mem_tests::still_pending(!l.is_idle().unwrap(), "the replay ended before the drop");
    drop(h2); // waits for the replay's read
    assert!(l.is_idle().unwrap(), "the drop did not wait for the replay");
    assert!(d2.to_vec().unwrap() == data);
}

/// Inside a capture on `s1`, a copy on `s2` of a buffer that `s1`'s captured work wrote is
/// ordered after it by the fence: an event recorded into the capture and waited for on `s2`,
/// which joins `s2` into the capture; the capture joins it back before it ends. Replayed on a
/// third stream, the data goes through both.
#[test]
fn two_streams_fork_and_join_inside_a_capture() {
    let _dev = gpu_or_skip!();
    let (s1, s2, l) = (
        Stream::non_blocking().unwrap(),
        Stream::non_blocking().unwrap(),
        Stream::non_blocking().unwrap(),
    );
    for mode in MODES {
        let data = pattern(N, 21);
        let mut h = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
        let mut d = DeviceBuffer::<u32>::uninit(N).unwrap();
        let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
        let exec = s1
            .capture(mode, (&mut h, &mut d, &mut out), |cap, (h, d, out)| {
                copy_async(&mut **d, &**h, cap.stream())?;
                assert_eq!(s2.is_capturing()?, Some(false));
                copy_async(&mut **out, &**d, &s2)?;
                assert_eq!(s2.is_capturing()?, Some(true), "s2 was not joined");
                Ok(())
            })
            .unwrap()
            .instantiate()
            .unwrap();
        assert_eq!(
            s2.is_capturing().unwrap(),
            Some(false),
            "s2 still capturing"
        );
        exec.launch(&l).unwrap();
        assert!(exec.resources().2.as_slice().unwrap() == data, "{mode:?}");
    }
}

/// A pool allocation on the capturing stream is a graph memory node and its drop inside the
/// closure a free node: replayed with new data, the data goes through it. Graph memory kept
/// past the capture is refused, and refuses every later use (leaked, never freed).
#[test]
fn pool_allocations_inside_the_graph_are_graph_memory() {
    let dev = gpu_or_skip!();
    let pool = MemPool::new(dev).unwrap();
    let s = Stream::non_blocking().unwrap();
    let mut h = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut exec = s
        .capture(CaptureMode::Global, (&mut h, &mut out), |cap, (h, out)| {
            let mut tmp = DeviceBuffer::<u32>::from_pool(&pool, N, cap.stream())?;
            copy_async(&mut tmp, &**h, cap.stream())?;
            copy_async(&mut **out, &tmp, cap.stream())?;
            tmp.free()
        })
        .unwrap()
        .instantiate()
        .unwrap();
    for round in 0..3 {
        let data = pattern(N, 40 + round);
        exec.resources_mut()
            .0
            .as_mut_slice()
            .unwrap()
            .copy_from_slice(&data);
        exec.launch(&s).unwrap();
        assert!(
            exec.resources().1.as_slice().unwrap() == data,
            "round {round}"
        );
    }
    drop(exec);

    let mut kept = None;
    let e = s
        .capture(CaptureMode::ThreadLocal, (&mut h,), |cap, (h,)| {
            let mut tmp = DeviceBuffer::<u32>::from_pool(&pool, N, cap.stream())?;
            copy_async(&mut tmp, &**h, cap.stream())?;
            kept = Some(tmp);
            Ok(())
        })
        .unwrap_err();
    assert_refused(&e, "buffers allocated inside the capture outlive it");
    let mut kept = kept.unwrap();
    let e = copy_async(&mut kept, &h, &s).unwrap_err();
    assert_refused(
        &e,
        "the buffer was allocated inside a stream capture that has ended",
    );
    let e = kept.free().unwrap_err();
    assert_refused(
        &e,
        "the buffer was allocated inside a stream capture that has ended",
    );
    // The stream works as before.
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    copy_async(&mut d, &h, &s).unwrap();
    assert!(d.to_vec().unwrap() == h.as_slice().unwrap());
}

/// The refusals inside a capture, each exact and none invalidating it: captured work on a
/// buffer not given to the capture, host access to a given one, a synchronous copy; then the
/// capture still ends with a graph that replays correctly.
#[test]
fn refusals_inside_a_capture_leave_it_valid() {
    let _dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let data = pattern(N, 5);
    let mut h = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::uninit(N).unwrap();
    let mut stray = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let exec = s
        .capture(CaptureMode::Global, (&mut h, &mut d), |cap, (h, d)| {
            copy_async(&mut **d, &**h, cap.stream())?;
            let e = copy_async(&mut stray, &**h, cap.stream()).unwrap_err();
            assert_refused(&e, "the buffer was not given to this capture");
            let e = h.as_slice().unwrap_err();
            assert_refused(&e, "the buffer is used by an open stream capture");
            let e = copy(&mut stray, &data[..]).unwrap_err();
            assert_refused(&e, "a stream capture is open: the legacy default stream");
            Ok(())
        })
        .unwrap()
        .instantiate()
        .unwrap();
    exec.launch(&s).unwrap();
    assert!(exec.resources().1.to_vec().unwrap() == data);
    drop(exec);
    // The stray buffer was never touched by the capture.
    assert!(stray.to_vec().unwrap().iter().all(|&x| x == 0));
}

/// A capture that CUDA invalidates (a query of the capturing stream) ends with the exact
/// code, `cudaErrorStreamCaptureInvalidated` from `cudaStreamEndCapture`; the stream is no
/// longer capturing and works as before.
#[test]
fn an_invalidated_capture_gives_the_exact_code_and_the_stream_works_again() {
    let _dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let data = pattern(N, 9);
    let mut h = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::uninit(N).unwrap();
    let e = s
        .capture(CaptureMode::Global, (&mut h, &mut d), |cap, (h, d)| {
            copy_async(&mut **d, &**h, cap.stream())?;
            let _ = cap.stream().is_idle(); // invalidates the capture
            Ok(())
        })
        .unwrap_err();
    assert_eq!(
        e.code().map(|c| c.0),
        Some(cuda_mem::sys::cudaError::cudaErrorStreamCaptureInvalidated.0),
        "{e}"
    );
    assert!(e.to_string().contains("cudaStreamEndCapture"), "{e}");
    assert_eq!(s.is_capturing().unwrap(), Some(false));
    copy_async(&mut d, &h, &s).unwrap();
    assert!(d.to_vec().unwrap() == data);
}

/// The closure's own error ends the capture and is returned; the stream is usable again.
#[test]
fn a_closure_error_ends_the_capture() {
    let _dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let e = s
        .capture(CaptureMode::ThreadLocal, (&mut d,), |_, _| {
            Err(Misuse::ZeroLength { op: "test" }.into())
        })
        .unwrap_err();
    assert_eq!(e.misuse(), Some(&Misuse::ZeroLength { op: "test" }));
    assert_eq!(s.is_capturing().unwrap(), Some(false));
    d.memset_async(1, &s).unwrap();
    assert!(d.to_vec().unwrap().iter().all(|&x| x == 0x0101_0101));
}

/// Capturing the same work again updates the executable graph in place
/// (`cudaGraphExecUpdate`); a different topology instantiates it anew. Both replay right.
#[test]
fn recapture_updates_in_place_where_the_topology_is_unchanged() {
    let _dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let data = pattern(N, 77);
    let mut h = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::uninit(N).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let body = |cap: &cuda_mem::Capture<'_>,
                (h, d, out): &mut (
        &mut PinnedBuffer<u32>,
        &mut DeviceBuffer<u32>,
        &mut PinnedBuffer<u32>,
    )| {
        copy_async(&mut **d, &**h, cap.stream())?;
        copy_async(&mut **out, &**d, cap.stream())
    };
    let mut exec = s
        .capture(CaptureMode::Global, (&mut h, &mut d, &mut out), body)
        .unwrap()
        .instantiate()
        .unwrap();
    exec.launch(&s).unwrap();
    assert!(exec.recapture(&s, CaptureMode::Global, body).unwrap());
    exec.resources_mut().2.as_mut_slice().unwrap().fill(0);
    exec.launch(&s).unwrap();
    assert!(exec.resources().2.as_slice().unwrap() == data);
    let updated = exec
        .recapture(&s, CaptureMode::Global, |cap, (h, d, out)| {
            copy_async(&mut **d, &**h, cap.stream())?;
            d.memset_async(0, cap.stream())?;
            copy_async(&mut **out, &**d, cap.stream())
        })
        .unwrap();
    assert!(!updated, "a new topology was updated in place");
    exec.launch(&s).unwrap();
    assert!(exec
        .resources()
        .2
        .as_slice()
        .unwrap()
        .iter()
        .all(|&x| x == 0));
}

/// A kernel launched through cudarc inside a capture, on cudarc's stream, with a cuda-mem
/// write guard: captured, and each replay writes the buffer again (zeroed between replays).
#[test]
fn a_cudarc_kernel_is_captured_with_cuda_mem_guards() {
    let dev = gpu_or_skip!();
    let ctx = cuda_mem::interop::cudarc::context(dev).unwrap();
    let module = ctx
        .load_module(Ptx::from_src(PROBE_PTX.to_str().unwrap()))
        .unwrap();
    let write = module.load_function("cm_write").unwrap();
    let a = ctx.new_stream().unwrap();
    let s = cudarc_stream(&a).unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut exec = s
        .capture(
            CaptureMode::ThreadLocal,
            (&mut d, &mut out),
            |cap, (d, out)| {
                {
                    let w = d.cudarc_ptr_mut(&a)?;
                    let words = (N / 4) as u64;
                    let mut l = a.launch_builder(&write);
                    l.arg(&w).arg(&words);
                    let cfg = LaunchConfig {
                        grid_dim: (64, 1, 1),
                        block_dim: (256, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: cm_write(uint4* p, u64 n) writes n 16-byte words: all of `d`,
                    // through the write guard taken for `a`, alive across the launch.
                    unsafe { l.launch(cfg) }.map_err(cuda_mem::Error::from)?;
                }
                copy_async(&mut **out, &**d, cap.stream())
            },
        )
        .unwrap()
        .instantiate()
        .unwrap();
    for _ in 0..2 {
        exec.resources_mut()
            .1
            .as_mut_slice()
            .unwrap()
            .fill(u32::MAX);
        exec.launch(&s).unwrap();
        assert_eq!(
            first_not_written(exec.resources().1.as_slice().unwrap()),
            None
        );
    }
}

/// Capturing the legacy default stream is refused before any runtime call (no GPU needed).
#[test]
fn capturing_the_legacy_default_stream_is_refused() {
    let legacy = Stream::legacy_default();
    let e = legacy
        .capture(CaptureMode::Global, (), |_, _| Ok(()))
        .unwrap_err();
    match e.misuse() {
        Some(Misuse::InvalidArgument { op, reason }) => {
            assert_eq!(*op, "Stream::capture");
            assert_eq!(
                reason,
                "the legacy default stream cannot be captured: capture on a stream of your own"
            );
        }
        _ => panic!("unexpected error: {e}"),
    }
}

/// `Library::load_image` (the bench's `--kernel-image`): PTX given without its NUL loads and
/// runs (every word of the buffer bumped once, read back on the host), and bytes that are no
/// image are refused with the driver's error for an image it cannot read (invalid PTX, or an
/// invalid kernel image), at the load or, under lazy loading, at the first lookup.
#[test]
fn a_kernel_image_from_bytes_loads_and_runs_and_garbage_is_refused() {
    let _dev = gpu_or_skip!();
    let ptx = PROBE_PTX.to_bytes();
    let lib = cuda_mem_probes::Library::load_image(ptx).unwrap();
    let k = lib.kernel("cm_bump").unwrap();
    let s = Stream::non_blocking().unwrap();
    let mut d = DeviceBuffer::from_slice(&[7u32, 8, 9]).unwrap();
    {
        let w = d.device_ptr_mut(&s).unwrap();
        let mut p = w.as_mut_ptr();
        let mut n = 3u32;
        let mut args = [
            (&mut p as *mut *mut u32).cast(),
            (&mut n as *mut u32).cast(),
        ];
        // SAFETY: `cm_bump(u32*, u32)` over the guard's 3 words, alive across the launch.
        unsafe { k.launch(1, 256, 0, &s, &mut args) }.unwrap();
    }
    assert_eq!(d.to_vec().unwrap(), vec![8, 9, 10]);
    // Under lazy loading (the default since CUDA 12.2) the driver reads the image only at the
    // first lookup: the error comes from the load or from the lookup, whichever parses it.
    let e = match cuda_mem_probes::Library::load_image(b"not an image") {
        Err(e) => e,
        Ok(lib) => lib.kernel("cm_bump").map(drop).unwrap_err(),
    };
    let code = e.code().map(|c| c.0);
    eprintln!("garbage image refused with {e}");
    assert!(
        code == Some(cuda_mem::sys::cudaError::cudaErrorInvalidPtx.0)
            || code == Some(cuda_mem::sys::cudaError::cudaErrorInvalidKernelImage.0),
        "{e}"
    );
}

/// A launcher replays the graph with its bookkeeping made once: a spin then a copy in, a device
/// copy and a copy out, launched three times; a host read after the launcher drops waits for
/// the last replay (the spin keeps it pending) and sees the data; a launcher on a second stream
/// is ordered after the first's launches; one forgotten with `mem::forget` leaves the buffers
/// waitable (the host read waits, `into_resources` gives them back).
#[test]
fn a_launcher_replays_and_host_access_after_it_waits_even_when_it_was_forgotten() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let l = Stream::non_blocking().unwrap();
    let data = pattern(N, 9);
    let h = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut exec = s
        .capture(
            CaptureMode::ThreadLocal,
            (&h, &mut d, &mut out),
            |cap, (h, d, out)| {
                probes.spin(SPIN, cap.stream())?;
                copy_async(&mut **d, &**h, cap.stream())?;
                copy_async(&mut **out, &**d, cap.stream())
            },
        )
        .unwrap()
        .instantiate()
        .unwrap();
    {
        let mut run = exec.launcher(&l).unwrap();
        assert!(run.is_fast(), "no capture is open: the short path");
        for _ in 0..3 {
            run.launch().unwrap();
        }
    }
    cuda_mem_tests::still_pending(!l.is_idle().unwrap(), "the replays ended before the read");
    assert!(
        exec.resources().2.as_slice().unwrap() == data,
        "host read after the launcher"
    );
    // Refilled (waits), then replayed from another stream: ordered after the first stream's
    // launches by the fences, and read after it.
    exec.resources_mut().2.as_mut_slice().unwrap().fill(0);
    let other = Stream::non_blocking().unwrap();
    exec.launcher(&other).unwrap().launch().unwrap();
    assert!(
        exec.resources().2.as_slice().unwrap() == data,
        "after the second stream"
    );
    // Forgotten: its marks stay in flight; the host read records anew and still waits.
    exec.resources_mut().2.as_mut_slice().unwrap().fill(0);
    let mut run = exec.launcher(&l).unwrap();
    run.launch().unwrap();
    std::mem::forget(run); // safe: the marks stay; waits never block on them
    cuda_mem_tests::still_pending(!l.is_idle().unwrap(), "the replay ended before the read");
    assert!(
        exec.resources().2.as_slice().unwrap() == data,
        "after a forgotten launcher"
    );
    let (_, d, out) = exec.into_resources().unwrap();
    assert!(d.to_vec().unwrap() == data);
    assert!(out.as_slice().unwrap() == data);
}

/// While a capture is open (here on another stream, on this thread), a launcher's launches take
/// the checked path, and still run: a kernel graph launched 4 times through a launcher made
/// before the capture, 2 of them while it is open, bumps every word 4 times.
#[test]
fn a_launcher_takes_the_checked_path_while_a_capture_is_open() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let mut e = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut exec = s
        .capture(CaptureMode::ThreadLocal, &mut e, |cap, e| {
            let w = e.device_ptr_mut(cap.stream())?;
            // SAFETY: the guard's N words, alive across the launch.
            unsafe { probes.bump(w.as_mut_ptr(), N as u32, cap.stream()) }
        })
        .unwrap()
        .instantiate()
        .unwrap();
    let other = Stream::non_blocking().unwrap();
    let mut scratch = DeviceBuffer::<u32>::zeroed(N).unwrap();
    {
        let mut run = exec.launcher(&s).unwrap();
        assert!(run.is_fast());
        run.launch().unwrap();
        let graph = other
            .capture(CaptureMode::ThreadLocal, &mut scratch, |cap, x| {
                run.launch()?;
                run.launch()?;
                x.memset_async(1, cap.stream())
            })
            .unwrap();
        drop(graph);
        run.launch().unwrap();
    }
    assert_eq!(
        exec.into_resources().unwrap().to_vec().unwrap(),
        vec![4u32; N]
    );
}

/// An executable graph, captured on `s`, that spins for [`SPIN`] then copies `h` into `out`.
pub(crate) fn spin_then_copy<'a>(
    probes: &Probes,
    s: &Stream,
    h: &'a PinnedBuffer<u32>,
    out: &'a mut PinnedBuffer<u32>,
) -> GraphExec<(&'a PinnedBuffer<u32>, &'a mut PinnedBuffer<u32>)> {
    s.capture(CaptureMode::ThreadLocal, (h, out), |cap, (h, out)| {
        probes.spin(SPIN, cap.stream())?;
        copy_async(&mut **out, &**h, cap.stream())
    })
    .unwrap()
    .instantiate()
    .unwrap()
}

/// A graph replayed on the calling thread's per-thread default stream, raw, through `launch`
/// and through a launcher: each replay's copy is read after it (the data checked). On the
/// H200 (driver 580) a `cudaGraphLaunch` on the per-thread stream returns only once the graph
/// has run (the stream is idle right after, the call takes the graph's 300 ms spin): what the
/// runtime does, which the crate's launches do alike, printed here (not asserted: another
/// driver may queue it).
#[test]
fn a_graph_replays_on_the_per_thread_stream_through_launch_and_a_launcher() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let pt = Stream::per_thread().unwrap();
    let data = pattern(N, 63);
    let h = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut exec = spin_then_copy(&probes, &s, &h, &mut out);
    let timed = |f: &mut dyn FnMut()| {
        let t = std::time::Instant::now();
        f();
        (t.elapsed().as_secs_f64() * 1e3, !pt.is_idle().unwrap())
    };
    // Raw: the executable graph keeps its buffers borrowed, and the launch is waited for (the
    // stream synchronized) before the buffers are touched.
    let raw = exec.as_raw();
    let r = timed(&mut || {
        // SAFETY: a live executable graph and stream; synchronized below before any use.
        let code = unsafe { cuda_mem::sys::cudaGraphLaunch(raw, pt.as_raw()) };
        cuda_mem::check(code, || "cudaGraphLaunch".into()).unwrap();
    });
    pt.synchronize().unwrap();
    assert!(
        exec.resources().1.as_slice().unwrap() == data,
        "after the raw launch"
    );
    exec.resources_mut().1.as_mut_slice().unwrap().fill(0);
    let l = timed(&mut || exec.launch(&pt).unwrap());
    assert!(
        exec.resources().1.as_slice().unwrap() == data,
        "after launch"
    );
    exec.resources_mut().1.as_mut_slice().unwrap().fill(0);
    let (lr, fast) = {
        let mut run = exec.launcher(&pt).unwrap();
        let fast = run.is_fast();
        (timed(&mut || run.launch().unwrap()), fast)
    };
    assert!(
        exec.resources().1.as_slice().unwrap() == data,
        "after the launcher"
    );
    eprintln!(
        "per-thread stream, ms in the call / busy after it: raw cudaGraphLaunch {:.1} / {}; \
         launch {:.1} / {}; a launcher's launch {:.1} / {} (short path: {fast})",
        r.0, r.1, l.0, l.1, lr.0, lr.1
    );
}

/// Graph launches on the crate's own streams call the driver's `cuGraphLaunch` (found through
/// the runtime), and where the driver refuses, the runtime's `cudaGraphLaunch` launches: with no
/// context current on the thread (cudarc's `cuCtxSetCurrent(NULL)`), both `launch` and a
/// launcher's launch still run the graph (the runtime makes its device's context current), and
/// the data is the graph's.
#[test]
fn graph_launches_go_through_the_driver_and_fall_back_to_the_runtime() {
    let _dev = gpu_or_skip!();
    assert!(
        cuda_mem::testing::graph_launches_through_driver(),
        "the runtime gave no cuGraphLaunch entry point"
    );
    let s = Stream::non_blocking().unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(1 << 16).unwrap();
    let mut exec = s
        .capture(CaptureMode::ThreadLocal, &mut d, |cap, d| {
            d.memset_async(0x5a, cap.stream())
        })
        .unwrap()
        .instantiate()
        .unwrap();
    let unbind = || {
        // SAFETY: no context is current afterwards; the next runtime call binds its device's.
        let r = unsafe { cudarc::driver::sys::cuCtxSetCurrent(std::ptr::null_mut()) };
        assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    };
    for round in 0..2u8 {
        exec.resources_mut().memset(0).unwrap();
        unbind();
        if round == 0 {
            exec.launch(&s).unwrap();
        } else {
            let mut run = exec.launcher(&s).unwrap();
            run.launch().unwrap();
        }
        let got = exec.resources().to_vec().unwrap();
        assert!(
            got.iter().all(|&w| w == 0x5a5a_5a5a),
            "round {round}: {:x}",
            got[0]
        );
    }
    exec.into_resources().unwrap();
}
