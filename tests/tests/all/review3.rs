//! Review 3 (issues 20-23 merge): demonstrations of findings. Every test here is GPU-only
//! (it SKIPs on a machine without one) and asserts the *sound* behaviour, so it fails while
//! the finding stands. None of them runs the use-after-free it describes: each stops at the
//! first observable symptom (a fence that does not know the work, a graph that captured a
//! node it should not have).

use cuda_mem::interop::cudarc::cudarc_stream;
use cuda_mem::{copy_async, CaptureMode, DeviceBuffer, HostAllocFlags, PinnedBuffer, Stream};
use cuda_mem_probes::Probes;
use cuda_mem_tests::gpu_or_skip;

use crate::{pattern, SPIN};

const N: usize = 1 << 16;

/// F1: `GraphExec::resources_mut` hands out `&mut R`, so safe code can replace a resource
/// reference (`res.0 = &mut y`). The executable still writes the buffer it captured (`x`), but
/// each launch is marked on `y`'s fence only. `mem::forget(exec)` then ends `x`'s borrow with
/// no fence knowing the launch: the host reads `x` (or drops it, handing the pinned block back
/// to the pool / `cudaFreeHost`) while the graph's copy is still queued to write it.
/// Expected (fixed): the launch is refused (`Misuse`), or `x`'s fence holds the launch.
#[test]
fn review3_a_resource_swapped_through_resources_mut_cannot_hide_a_launch() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let l = Stream::non_blocking().unwrap();
    let data = pattern(N, 31);
    let d = DeviceBuffer::from_slice(&data).unwrap();
    let mut x = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut y = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let launched = {
        let mut exec = s
            .capture(CaptureMode::ThreadLocal, (&mut x, &d), |cap, (x, d)| {
                probes.spin(SPIN, cap.stream())?;
                copy_async(&mut **x, &**d, cap.stream())
            })
            .unwrap()
            .instantiate()
            .unwrap();
        exec.resources_mut().0 = &mut y; // safe code; the graph's node still writes `x`
        let launched = exec.launch(&l);
        std::mem::forget(exec); // safe; the crate promises this is sound
        launched
    };
    match launched {
        Err(e) => assert!(e.misuse().is_some(), "not a Misuse: {e}"),
        Ok(()) => {
            cuda_mem_tests::still_pending(!l.is_idle().unwrap(), "the replay ended early");
            // `x` is no longer borrowed: its fence must hold the launch.
            assert!(
                x.as_slice().unwrap() == data,
                "the host read of `x` did not wait for the graph's copy into it"
            );
        }
    }
    drop(y);
}

/// F1b: the same through a replacement *in place*: `*exec.resources_mut().0 = other` keeps
/// the resource's address (the `&mut` points where it did) while the buffer behind it is a
/// new one, and the old one is dropped (its memory freed). A check that compared only where
/// the buffers' fences live passed, and the graph's copy then wrote the freed memory.
/// Expected (fixed): the launch is refused with the exact `Misuse` naming the change, and
/// nothing is queued.
#[test]
fn review3_a_resource_replaced_in_place_is_refused_at_launch() {
    let _dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let l = Stream::non_blocking().unwrap();
    let data = pattern(N, 37);
    let d = DeviceBuffer::from_slice(&data).unwrap();
    let mut x = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut exec = s
        .capture(CaptureMode::ThreadLocal, (&mut x, &d), |cap, (x, d)| {
            copy_async(&mut **x, &**d, cap.stream())
        })
        .unwrap()
        .instantiate()
        .unwrap();
    // The first launch runs: the resources are the captured ones.
    exec.launch(&l).unwrap();
    exec.synchronize().unwrap();
    assert_eq!(exec.resources().0.as_slice().unwrap(), &data[..]);
    // Safe code: the old `x` is dropped here, the new buffer sits where it was.
    *exec.resources_mut().0 = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let err = exec.launch(&l).unwrap_err();
    match err.misuse() {
        Some(cuda_mem::Misuse::InvalidArgument { reason, .. }) => assert!(
            reason.starts_with("the resources no longer name the buffers the graph captured"),
            "{reason}"
        ),
        other => panic!("not the exact refusal: {other:?} ({err})"),
    }
    assert!(l.is_idle().unwrap(), "the refused launch queued work");
    assert!(
        exec.resources()
            .0
            .as_slice()
            .unwrap()
            .iter()
            .all(|&v| v == 0),
        "the new buffer was written"
    );
}

/// F2: a stream lent to cudarc (`cudarc_stream`, or a cuda-mem `Stream` over a cudarc
/// stream, `interop::cudarc::stream`) can be put into capture by cudarc's *safe*
/// `CudaStream::begin_capture`. The crate's capture registry does not know it, so
/// `copy_async` on the cuda-mem side takes the ordinary (lock-free) path: the copy becomes a
/// node of cudarc's graph, not given to any capture, while the buffers' fences believe it is
/// queued on `s`. A host read then returns at once with data never written, and the buffers
/// can be freed while cudarc's `CudaGraph::launch` (safe) still writes them.
/// Expected (fixed): the copy is refused (`Misuse`) while the stream is capturing.
#[test]
fn review3_work_queued_into_a_foreign_cudarc_capture_is_refused() {
    let _dev = gpu_or_skip!();
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let s = Stream::non_blocking().unwrap();
    let cs = cudarc_stream(&s).unwrap();
    let data = pattern(N, 32);
    let d = DeviceBuffer::from_slice(&data).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    cs.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    let queued = copy_async(&mut out, &d, &s);
    let graph = cs.end_capture(CUgraphInstantiate_flags(0)).unwrap();
    if let Err(e) = queued {
        assert!(e.misuse().is_some(), "not a Misuse: {e}");
        return;
    }
    let seen_written = out.as_slice().unwrap() == data;
    // Not launched: `out` and `d` are about to be freed, and the graph would write/read them.
    drop(graph);
    panic!(
        "copy_async was queued into cudarc's capture unseen (the host read then saw the data \
         written: {seen_written}); dropping the buffers now frees memory the graph's node uses"
    );
}

/// F3: `Stream::capture` takes `&Stream` (and `Stream` is `Sync`): another thread can queue on
/// the same stream while the capture begins. `Fence::begin_checked` read `any_open()` once,
/// before the enqueue, with nothing making the capture begin wait: a copy that passed the
/// check before `OPEN` rose and was enqueued after the begin was captured into the graph, on
/// buffers not given to it (the graph keeps no borrow of them). Fixed by the handshake of
/// `fence/handshake.rs` (docs/graphs.md, "Work racing a capture begin"): the capture begin
/// waits for the copy, or the copy sees the capture and is refused. Timing dependent: many
/// rounds; every graph of an empty closure must have no node.
#[test]
fn review3_a_copy_racing_a_capture_begin_is_never_captured() {
    let _dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let data = pattern(N, 33);
    let d = DeviceBuffer::from_slice(&data).unwrap();
    let mut out = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (captured_nodes, copies) = std::thread::scope(|sc| {
        let copier = sc.spawn(|| {
            let mut copies = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Refused while the capture is seen (the exact misuse), else ordinary work.
                match copy_async(&mut out, &d, &s) {
                    Ok(()) => copies += 1,
                    Err(e) => assert!(e.misuse().is_some(), "not a Misuse: {e}"),
                }
            }
            copies
        });
        let captured_nodes = empty_captures(&s, 2000);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (captured_nodes, copier.join().unwrap())
    });
    s.synchronize().unwrap();
    assert_eq!(
        captured_nodes, 0,
        "copies of a buffer not given to the capture were captured into its graph"
    );
    assert!(copies > 0, "the racing thread queued no copy at all");
    // The copies that ran were ordinary work, recorded on the buffers' fences.
    assert!(
        out.to_vec().unwrap() == data,
        "the copies' data did not arrive"
    );
}

/// The same race for a stream-ordered allocation (issue 22): `cudaMallocFromPoolAsync` that
/// lands in a capture begun meanwhile is a graph memory node (its address is only valid inside
/// the graph), and its free a free node. Another thread allocates and frees on the stream in a
/// loop while this one captures empty closures on it: every allocation is either ordinary
/// memory (the capture begin waited for it) or refused with a `Misuse` (the capture was seen:
/// an allocation on a capturing stream from another thread than the capturing one is refused);
/// no graph has a node.
#[test]
fn review3_a_pool_allocation_racing_a_capture_begin_is_never_captured() {
    let dev = gpu_or_skip!();
    let pool = cuda_mem::MemPool::new(dev).unwrap();
    let s = Stream::non_blocking().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (captured_nodes, allocs) = std::thread::scope(|sc| {
        let allocator = sc.spawn(|| {
            let mut allocs = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match DeviceBuffer::<u32>::from_pool(&pool, 1024, &s) {
                    // Its free during a capture is refused, and the memory leaked (by design).
                    Ok(b) => {
                        allocs += 1;
                        drop(b);
                    }
                    Err(e) => assert!(e.misuse().is_some(), "not a Misuse: {e}"),
                }
            }
            allocs
        });
        let captured_nodes = empty_captures(&s, 2000);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (captured_nodes, allocator.join().unwrap())
    });
    s.synchronize().unwrap();
    assert_eq!(
        captured_nodes, 0,
        "another thread's pool allocations (or frees) were captured into the graph"
    );
    assert!(allocs > 0, "the racing thread allocated nothing");
}

/// The lent-stream race (issue 22): another library (cudarc) begins a capture on a stream lent
/// to it while a copy through cuda-mem is being queued there, after the check made before
/// queueing. The copy may then be a node of cudarc's graph: the buffers must be given up
/// (host access refused with the exact misuse, and never freed), not waited for through an
/// event that the capture swallowed. Each cudarc capture stays open a while (200 µs), so that
/// the check after the call sees it.
#[test]
fn review3_a_copy_racing_a_foreign_capture_begin_gives_its_buffers_up() {
    let _dev = gpu_or_skip!();
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let s = Stream::non_blocking().unwrap();
    let cs = cudarc_stream(&s).unwrap();
    let data = pattern(N, 34);
    let d = DeviceBuffer::from_slice(&data).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut captured_nodes = 0usize;
    let mut graphs = Vec::new();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = copy_async(&mut out, &d, &s);
            }
        });
        for _ in 0..500 {
            if cs
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                .is_err()
            {
                continue;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
            if let Ok(Some(g)) = cs.end_capture(CUgraphInstantiate_flags(0)) {
                let mut n = 0usize;
                // SAFETY: a live graph (owned by `g`); a null node array asks for the count.
                let code = unsafe {
                    cuda_mem_sys::cudaGraphGetNodes(
                        g.cu_graph().cast(),
                        std::ptr::null_mut(),
                        &mut n,
                    )
                };
                assert_eq!(code, cuda_mem_sys::cudaError::cudaSuccess);
                captured_nodes += n;
                graphs.push(g); // never launched; kept until the buffers' fate is checked
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    if captured_nodes == 0 {
        eprintln!("no copy landed in a foreign capture this run: nothing to check");
        return;
    }
    // A copy is in some cudarc graph: both buffers must refuse host access for good.
    match out.as_slice() {
        Err(e) => assert!(e.misuse().is_some(), "not a Misuse: {e}"),
        Ok(_) => panic!(
            "{captured_nodes} nodes were captured into cudarc's graphs, yet the host reads the \
             buffer they write"
        ),
    }
    drop(graphs);
    // `out` and `d` are leaked on drop (their fences are given up).
}

/// Begins and ends `rounds` empty captures on `s` (relaxed mode, no resources), while another
/// thread races them: the nodes their graphs hold, which only work queued by that thread can
/// have put there. (An invalidated capture has no graph: nothing captured.)
fn empty_captures(s: &Stream, rounds: usize) -> usize {
    let mut nodes = 0;
    for _ in 0..rounds {
        let Ok(g) = s.capture(CaptureMode::Relaxed, (), |_, _| Ok(())) else {
            continue;
        };
        let mut n = 0usize;
        // SAFETY: a live graph (owned by `g`); a null node array asks for the count.
        let code =
            unsafe { cuda_mem_sys::cudaGraphGetNodes(g.as_raw(), std::ptr::null_mut(), &mut n) };
        assert_eq!(code, cuda_mem_sys::cudaError::cudaSuccess);
        nodes += n;
    }
    nodes
}
