//! Review 6: an adversarial review of `GraphExec::launcher` / `Launcher` (the marks made once,
//! when the launcher is made, stand for every launch through it) and of what it relies on:
//! `Fence::hold_plain`, `Launches::mark`, the capture handshake, and the fallback to
//! `GraphExec::launch`. GPU-only (each test SKIPs without a GPU). Each test checks data or the
//! exact refusal, and fails if the suspicion it names holds.
//!
//! Five tests race another thread's work against captures that take its stream: capture
//! begins on that stream, or a capture on another stream joining it. To make the race likely,
//! the racing thread shares one CPU with a spinning thread, so it is preempted at arbitrary
//! points (between its capture check and its runtime call, too). These tests can only fail on a
//! run where the race is actually hit.
//!
//! Suspicions that are compile errors rather than tests (checked with rustc, E0502 / E0499 /
//! E0277): a `resources()` borrow taken before `exec.launcher(&s)` and used after it;
//! `exec.launch`, `exec.resources()`, `resources_mut()` or a second `launcher` while a
//! launcher lives; moving a `Launcher` to another thread (`!Send`); a `&mut` resource of the
//! graph used anywhere while a launcher lives. A `&` resource can be read meanwhile (host reads
//! and other streams' reads), and nothing can write it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cuda_mem::interop::cudarc::cudarc_stream;
use cuda_mem::{
    copy_async, CaptureMode, DeviceBuffer, DevicePtrMut as _, GraphExec, HostAllocFlags, MemPool,
    Misuse, PinnedBuffer, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{gpu_or_skip, still_pending};

use crate::{pattern, SPIN};

/// 256 KiB of `u32`.
const N: usize = 1 << 16;
/// The words the racing tests' graphs bump: one block, so launches are cheap on the GPU too.
const NB: usize = 256;

/// `e` is `Misuse::InvalidArgument` with a reason that starts with `start`.
fn assert_refused(e: &cuda_mem::Error, start: &str) {
    match e.misuse() {
        Some(Misuse::InvalidArgument { reason, .. }) => {
            assert!(reason.starts_with(start), "unexpected reason: {reason}")
        }
        _ => panic!("not the expected misuse: {e}"),
    }
}

/// The number of nodes in the graph `g`.
fn node_count(g: cuda_mem::sys::cudaGraph_t) -> usize {
    let mut n = 0usize;
    // SAFETY: a live graph (its owner outlives the call); a null node array asks for the count.
    let code = unsafe { cuda_mem::sys::cudaGraphGetNodes(g, std::ptr::null_mut(), &mut n) };
    assert_eq!(code, cuda_mem::sys::cudaError::cudaSuccess);
    n
}

/// An executable graph that adds 1 to every word of `a` at each launch (`cm_bump`).
fn bumper<'a>(
    probes: &Probes,
    s: &Stream,
    a: &'a mut DeviceBuffer<u32>,
) -> GraphExec<&'a mut DeviceBuffer<u32>> {
    s.capture(CaptureMode::ThreadLocal, a, |cap, a| {
        let w = a.device_ptr_mut(cap.stream())?;
        // SAFETY: the guard's words, alive across the launch (the graph keeps `a` borrowed).
        unsafe { probes.bump(w.as_mut_ptr(), w.len() as u32, cap.stream()) }
    })
    .unwrap()
    .instantiate()
    .unwrap()
}

/// A stream lent to cudarc *after* the launcher was made (the launcher was made fast): a
/// launch while cudarc has a capture open on the stream must be refused with the exact misuse,
/// not queued into cudarc's graph, where no fence records it. Launches before and after (on the
/// checked path, the stream being lent) run: the buffer is bumped exactly 3 times.
#[test]
fn review6_a_launcher_whose_stream_is_lent_later_refuses_a_foreign_capture() {
    let _dev = gpu_or_skip!();
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let mut a = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut exec = bumper(&probes, &s, &mut a);
    let mut foreign_nodes = 0usize;
    {
        let mut run = exec.launcher(&s).unwrap();
        assert!(
            run.is_fast(),
            "no capture open, an owned stream: the short path"
        );
        run.launch().unwrap(); // 1
        let cs = cudarc_stream(&s).unwrap(); // lent from here on
        run.launch().unwrap(); // 2
        cs.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .unwrap();
        let during = run.launch();
        let g = cs.end_capture(CUgraphInstantiate_flags(0)).unwrap();
        if let Some(g) = &g {
            foreign_nodes = node_count(g.cu_graph().cast());
        }
        drop(g); // never launched
        match during {
            Ok(()) => panic!(
                "a launch through a launcher whose stream was lent later was queued into \
                 cudarc's capture ({foreign_nodes} nodes): no fence records it"
            ),
            Err(e) => assert_refused(&e, "the stream is being captured by another library"),
        }
        run.launch().unwrap(); // 3
    }
    assert_eq!(
        foreign_nodes, 0,
        "the refused launch left a node in cudarc's graph"
    );
    assert_eq!(
        exec.into_resources().unwrap().to_vec().unwrap(),
        vec![3u32; N],
        "not exactly the three launches that were not refused ran"
    );
}

/// This thread begins a capture on the launcher's own stream and launches through the launcher
/// inside it. The graph's only resource, `&b`, is given to the capture too (so `b`'s fence lets
/// the work through), yet the launch must be refused, with the reason that names it (a graph
/// launched into a capture), before anything is queued: not captured as a child-graph node. The
/// capture stays valid (only its memset, which replays), and the launcher launches after it.
#[test]
fn review6_a_launch_into_a_capture_of_its_own_stream_is_refused_and_the_capture_stays_valid() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let b = DeviceBuffer::from_slice(&pattern(N, 61)).unwrap();
    let mut scratch = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut exec = s
        .capture(CaptureMode::ThreadLocal, (&b,), |cap, _| {
            probes.spin(1000, cap.stream())
        })
        .unwrap()
        .instantiate()
        .unwrap();
    let graph = {
        let mut run = exec.launcher(&s).unwrap();
        assert!(run.is_fast());
        run.launch().unwrap();
        let graph = s
            .capture(
                CaptureMode::ThreadLocal,
                (&b, &mut scratch),
                |cap, (_, x)| {
                    let e = run
                        .launch()
                        .expect_err("a launch into a capture of its own stream was queued");
                    assert_refused(&e, "the stream is capturing: a graph launched there");
                    x.memset_async(1, cap.stream())
                },
            )
            .unwrap();
        run.launch().unwrap();
        graph
    };
    assert_eq!(
        node_count(graph.as_raw()),
        1,
        "the capture holds more than its memset (the graph launch as a child node?)"
    );
    let replay = graph.instantiate().unwrap();
    replay.launch(&s).unwrap();
    let (_, scratch) = replay.into_resources().unwrap();
    assert!(scratch.to_vec().unwrap().iter().all(|&v| v == 0x0101_0101));
    exec.synchronize().unwrap();
}

/// A launcher on the legacy default stream takes the checked path at every launch: while a
/// capture is open (here on another stream, on this thread) its launch is refused with the
/// legacy-stream misuse, as `GraphExec::launch` refuses it, instead of queueing work on the
/// legacy stream that the capture bookkeeping does not note. The two other launches run.
#[test]
fn review6_a_launcher_on_the_legacy_stream_is_refused_while_a_capture_is_open() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let legacy = Stream::legacy_default();
    let other = Stream::non_blocking().unwrap();
    let mut a = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut scratch = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut exec = bumper(&probes, &s, &mut a);
    {
        let mut run = exec.launcher(&legacy).unwrap();
        assert!(
            !run.is_fast(),
            "a launcher on the legacy stream took the short path"
        );
        run.launch().unwrap();
        let g = other
            .capture(CaptureMode::ThreadLocal, &mut scratch, |cap, x| {
                let e = run
                    .launch()
                    .expect_err("a legacy-stream launch during a capture was not refused");
                assert_refused(&e, "a stream capture is open: the legacy default stream");
                x.memset_async(1, cap.stream())
            })
            .unwrap();
        drop(g);
        run.launch().unwrap();
    }
    assert_eq!(
        exec.into_resources().unwrap().to_vec().unwrap(),
        vec![2u32; N]
    );
}

/// A launcher on this thread's per-thread default stream: its replay, held by a spin, is
/// waited for by a host read made on *another* thread (which names that stream through the
/// legacy stream), and a launcher on it made from that other thread is refused (the handle
/// would name the other thread's own per-thread stream there).
#[test]
fn review6_a_launcher_on_the_per_thread_stream_is_waited_for_and_refused_elsewhere() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let pt = Stream::per_thread().unwrap();
    let data = pattern(N, 62);
    let h = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut exec = crate::graph::spin_then_copy(&probes, &s, &h, &mut out);
    {
        let mut run = exec.launcher(&pt).unwrap();
        run.launch().unwrap();
    }
    // (On the H200 a graph launch on the per-thread stream returns once the graph has run:
    // graph::a_graph_replays_on_the_per_thread_stream_through_launch_and_a_launcher. The read
    // below then finds it done; elsewhere it must wait.)
    if pt.is_idle().unwrap() {
        eprintln!("NOTE: the per-thread replay had ended before the other thread's read");
    }
    let (refusal, read) = std::thread::scope(|sc| {
        sc.spawn(|| {
            let refusal = exec.launcher(&pt).map(|_| ());
            let read = exec.resources().1.as_slice().unwrap() == data;
            (refusal, read)
        })
        .join()
        .unwrap()
    });
    let e = refusal.expect_err("a launcher on another thread's per-thread stream was made");
    assert_refused(
        &e,
        "the stream is another thread's per-thread default stream",
    );
    assert!(
        read,
        "a host read on another thread did not wait for the per-thread replay"
    );
}

/// The marks a launcher makes order its stream after work pending at that moment: here writes
/// on another stream, held by a spin, to a `&` resource and to a `&mut` resource, queued before
/// the capture (which does not wait for them; nothing can write either buffer once the graph
/// holds it). The replay must read the written data, not the zeros from before.
#[test]
fn review6_a_launcher_is_ordered_after_writes_pending_at_its_making() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let [s, w, l] = crate::streams();
    let (db, da) = (pattern(N, 63), pattern(N, 64));
    let hb = PinnedBuffer::from_slice(&db, HostAllocFlags::DEFAULT).unwrap();
    let ha = PinnedBuffer::from_slice(&da, HostAllocFlags::DEFAULT).unwrap();
    let mut b = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut a = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut ob = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut oa = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    probes.spin(SPIN, &w).unwrap();
    copy_async(&mut b, &hb, &w).unwrap();
    copy_async(&mut a, &ha, &w).unwrap();
    let mut exec = s
        .capture(
            CaptureMode::ThreadLocal,
            (&b, &mut a, &mut ob, &mut oa),
            |cap, (b, a, ob, oa)| {
                copy_async(&mut **ob, &**b, cap.stream())?;
                copy_async(&mut **oa, &**a, cap.stream())
            },
        )
        .unwrap()
        .instantiate()
        .unwrap();
    still_pending(
        !w.is_idle().unwrap(),
        "the writes ended before the launcher was made",
    );
    {
        let mut run = exec.launcher(&l).unwrap();
        run.launch().unwrap();
    }
    let res = exec.resources();
    let got_b = res.2.as_slice().unwrap() == db;
    let got_a = res.3.as_slice().unwrap() == da;
    assert!(
        got_b,
        "the replay read the `&` resource before the write pending at the launcher's making"
    );
    assert!(
        got_a,
        "the replay read the `&mut` resource before the write pending at the launcher's making"
    );
}

/// Resources with a buffer given twice (`&b, &b`), an array and a `Vec`: the launcher marks
/// (and orders after pending work on) every one of them. Another stream's pending write to `b`
/// (read by the graph) and to `y` (written by the graph, the last buffer, inside the `Vec`):
/// the replay must read `b`'s new data, and its own write to `y` must land after the other
/// stream's, not be overwritten by it.
#[test]
fn review6_a_launcher_orders_every_buffer_of_duplicated_and_nested_resources() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let [s, w, l] = crate::streams();
    let (data, junk) = (pattern(N, 65), pattern(N, 66));
    let hd = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let hj = PinnedBuffer::from_slice(&junk, HostAllocFlags::DEFAULT).unwrap();
    let mut b = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut x = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut y = DeviceBuffer::<u32>::zeroed(N).unwrap();
    probes.spin(SPIN, &w).unwrap();
    copy_async(&mut b, &hd, &w).unwrap();
    copy_async(&mut y, &hj, &w).unwrap();
    let mut exec = s
        .capture(
            CaptureMode::ThreadLocal,
            (&b, &b, [&mut x], vec![&mut y]),
            |cap, r| {
                copy_async(&mut *r.2[0], r.0, cap.stream())?;
                copy_async(&mut *r.3[0], r.1, cap.stream())
            },
        )
        .unwrap()
        .instantiate()
        .unwrap();
    still_pending(
        !w.is_idle().unwrap(),
        "the writes ended before the launcher was made",
    );
    {
        let mut run = exec.launcher(&l).unwrap();
        run.launch().unwrap();
    }
    let (_, _, [x], ys) = exec.into_resources().unwrap();
    assert!(x.to_vec().unwrap() == data, "the array's buffer");
    assert!(
        ys[0].to_vec().unwrap() == data,
        "the Vec's buffer: the replay's write was not ordered after the other stream's"
    );
}

/// A launcher forgotten with `mem::forget`, then its graph forgotten too, then a pooled
/// resource the replay writes is dropped while the replay is held by a spin: the free must be
/// queued after the replay (the forgotten marks stay on the fence). The pool hands the block
/// back to the next allocation on the same stream; that buffer's data must survive the replay.
#[test]
fn review6_a_pooled_resource_freed_after_a_forgotten_launcher_is_not_reused_under_its_replay() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let pool = MemPool::new(dev).unwrap();
    let [s, sa, l] = crate::streams();
    let (data, fresh) = (pattern(N, 67), pattern(N, 68));
    let h = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let hf = PinnedBuffer::from_slice(&fresh, HostAllocFlags::DEFAULT).unwrap();
    let mut p = DeviceBuffer::<u32>::from_pool(&pool, N, &sa).unwrap();
    let addr = p.as_ptr() as usize;
    let mut exec = s
        .capture(CaptureMode::ThreadLocal, (&h, &mut p), |cap, (h, p)| {
            probes.spin(SPIN, cap.stream())?;
            copy_async(&mut **p, &**h, cap.stream())
        })
        .unwrap()
        .instantiate()
        .unwrap();
    let mut run = exec.launcher(&l).unwrap();
    run.launch().unwrap();
    std::mem::forget(run);
    std::mem::forget(exec); // sound: the launch is on the buffers' fences
    still_pending(!l.is_idle().unwrap(), "the replay ended before the free");
    drop(p); // queued on `sa`, which must wait for the replay first
    let mut q = DeviceBuffer::<u32>::from_pool(&pool, N, &sa).unwrap();
    copy_async(&mut q, &hf, &sa).unwrap();
    l.synchronize().unwrap(); // the replay's write has landed, wherever it went
    let reused = q.as_ptr() as usize == addr;
    let got = q.to_vec().unwrap() == fresh;
    if !reused {
        eprintln!("NOTE the pool did not hand the freed block back: the check is vacuous");
    }
    assert!(
        got,
        "the replay of a forgotten launcher wrote into memory freed and reallocated under it"
    );
}

/// Graph memory (a pool allocation inside the capture, freed inside it) replayed through
/// launchers, the input refilled between them: each round's output is that round's input (the
/// replays ordered after the refill, the host read after the replays).
#[test]
fn review6_graph_memory_replays_through_launchers() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let pool = MemPool::new(dev).unwrap();
    let [s, l] = crate::streams();
    let mut h = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut exec = s
        .capture(CaptureMode::Global, (&mut h, &mut out), |cap, (h, out)| {
            probes.spin(SPIN / 4, cap.stream())?;
            let mut tmp = DeviceBuffer::<u32>::from_pool(&pool, N, cap.stream())?;
            copy_async(&mut tmp, &**h, cap.stream())?;
            copy_async(&mut **out, &tmp, cap.stream())?;
            tmp.free()
        })
        .unwrap()
        .instantiate()
        .unwrap();
    for round in 0..3 {
        let data = pattern(N, 70 + round);
        exec.resources_mut()
            .0
            .as_mut_slice()
            .unwrap()
            .copy_from_slice(&data);
        {
            let mut run = exec.launcher(&l).unwrap();
            run.launch().unwrap();
            run.launch().unwrap();
        }
        still_pending(!l.is_idle().unwrap(), "the replays ended before the read");
        assert!(
            exec.resources().1.as_slice().unwrap() == data,
            "round {round}"
        );
    }
}

/// What a racing thread saw: its operations that returned `Ok`, and its errors that are not a
/// `Misuse` (a refusal of work during the capture is a `Misuse`; anything else came from the
/// runtime, e.g. a launch into a capturing stream).
struct Raced {
    ok: usize,
    errors: Vec<String>,
}

impl Raced {
    /// Fails the test unless some of the work ran and none failed in the runtime.
    fn check_ran(&self, what: &str) {
        assert!(
            self.errors.is_empty(),
            "{what} failed in the runtime: {:?}",
            &self.errors[..self.errors.len().min(3)]
        );
        assert!(self.ok > 0, "none of the {what} ran");
    }

    /// Fails the test unless some of the work ran, none failed in the runtime, and the words
    /// of `got` were bumped exactly once per `Ok` (work swallowed by a capture returns `Ok` and
    /// never runs). `what`: the work, in the plural.
    fn check(&self, what: &str, got: &[u32]) {
        self.check_ran(what);
        assert!(
            got.iter().all(|&v| v as usize == self.ok),
            "{} {what} returned Ok, but the words were bumped {} times",
            self.ok,
            got[0]
        );
    }
}

/// Runs `op` until `stop`.
fn drive(stop: &AtomicBool, mut op: impl FnMut() -> cuda_mem::Result<()>) -> Raced {
    let mut r = Raced {
        ok: 0,
        errors: Vec::new(),
    };
    while !stop.load(Ordering::Relaxed) {
        match op() {
            Ok(()) => r.ok += 1,
            Err(e) if e.misuse().is_some() => {}
            Err(e) => r.errors.push(e.to_string()),
        }
    }
    r
}

/// The highest CPU this process may run on.
fn last_cpu() -> Option<usize> {
    // SAFETY: a zeroed `cpu_set_t` is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable set of the size given.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if r != 0 {
        return None;
    }
    (0..libc::CPU_SETSIZE as usize).rev().find(|&c| {
        // SAFETY: `set` is a valid set; `c` is below CPU_SETSIZE.
        unsafe { libc::CPU_ISSET(c, &set) }
    })
}

/// Pins the calling thread to `cpu` (best effort: where refused, it stays unpinned).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed `cpu_set_t` is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (it came from `last_cpu`); `set` is valid.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid set of the size given; 0 is the calling thread.
    let _ = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
}

/// What the capturing side saw: captures whose graph did not have the nodes its own work
/// makes (`(nodes, expected)`), and captures that failed (none may: its own work is valid).
struct Captured {
    odd: Vec<(usize, usize)>,
    failed: Vec<String>,
    rounds: usize,
}

impl Captured {
    /// Fails the test where another thread's work landed in a capture or invalidated one.
    fn check(&self, what: &str) {
        assert!(self.rounds > 0, "no capture was made");
        assert!(
            self.failed.is_empty(),
            "{} of {} captures failed (invalidated by {what}?): {:?}",
            self.failed.len(),
            self.rounds,
            &self.failed[..self.failed.len().min(3)]
        );
        assert!(
            self.odd.is_empty(),
            "{} of {} captures held other nodes than their own work ({what} captured into \
             them?): (nodes, expected) {:?}",
            self.odd.len(),
            self.rounds,
            &self.odd[..self.odd.len().min(3)]
        );
    }
}

/// Runs `work` (given a stop flag) on a thread crowded onto one CPU with a spinning thread,
/// while this thread makes captures with `capture` for `dur`, 300 µs apart. `capture` makes one
/// and returns its graph's node count and the count its own work makes. Work racing a capture
/// must either reach the runtime before the capture takes its stream (the begin, or the join,
/// waits for it) or see the capture and be refused; it must never land in the graph (a node)
/// or invalidate the capture (a failed capture).
fn race<W, C>(dur: Duration, work: W, mut capture: C) -> (Captured, Raced)
where
    W: FnOnce(&AtomicBool) -> Raced + Send,
    C: FnMut() -> cuda_mem::Result<(usize, usize)>,
{
    let stop = AtomicBool::new(false);
    let cpu = last_cpu();
    std::thread::scope(|sc| {
        if let Some(c) = cpu {
            let stop = &stop;
            sc.spawn(move || {
                pin_to(c);
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        let racer = sc.spawn(|| {
            if let Some(c) = cpu {
                pin_to(c);
            }
            work(&stop)
        });
        let mut cap = Captured {
            odd: Vec::new(),
            failed: Vec::new(),
            rounds: 0,
        };
        let t = Instant::now();
        while t.elapsed() < dur {
            cap.rounds += 1;
            match capture() {
                Ok((n, expected)) if n != expected => cap.odd.push((n, expected)),
                Ok(_) => {}
                Err(e) => cap.failed.push(e.to_string()),
            }
            std::thread::sleep(Duration::from_micros(300));
        }
        stop.store(true, Ordering::Relaxed);
        (cap, racer.join().unwrap())
    })
}

/// An empty capture on `s`, open for 300 µs: no node of its own.
fn empty_capture(s: &Stream) -> cuda_mem::Result<(usize, usize)> {
    let g = s.capture(CaptureMode::Relaxed, (), |_, _| {
        std::thread::sleep(Duration::from_micros(300));
        Ok(())
    })?;
    Ok((node_count(g.as_raw()), 0))
}

/// A capture on `c` that joins `s` into it (a copy on `s` of what its memset on `c` wrote),
/// then stays open for 300 µs: its graph's nodes, beside `expected` (what the same capture makes
/// with nobody else on `s`).
fn joining_capture(
    c: &Stream,
    s: &Stream,
    x: &mut DeviceBuffer<u32>,
    y: &mut DeviceBuffer<u32>,
) -> cuda_mem::Result<usize> {
    let g = c.capture(CaptureMode::Relaxed, (x, y), |cap, (x, y)| {
        x.memset_async(1, cap.stream())?;
        copy_async(&mut **y, &**x, s)?; // `s` waits for a captured event: joined
        std::thread::sleep(Duration::from_micros(300));
        Ok(())
    })?;
    Ok(node_count(g.as_raw()))
}

/// Launches through a launcher on `s` race capture begins on `s` (the launcher's handshake):
/// no launch lands in a capture, none invalidates one, and exactly the launches that returned
/// `Ok` ran (a launch swallowed by a capture returns `Ok` and never runs).
#[test]
fn review6_launcher_launches_racing_capture_begins_never_land_in_them() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let mut a = DeviceBuffer::<u32>::zeroed(NB).unwrap();
    let mut exec = bumper(&probes, &s, &mut a);
    let (e, sr) = (&mut exec, &s);
    let (cap, raced) = race(
        Duration::from_secs(2),
        move |stop| {
            let mut run = e.launcher(sr).unwrap();
            drive(stop, || run.launch())
        },
        || empty_capture(&s),
    );
    cap.check("a launch");
    raced.check(
        "launches",
        &exec.into_resources().unwrap().to_vec().unwrap(),
    );
}

/// Review finding: `GraphExec::launch` of a graph with no resources (`()`, or an empty `Vec`)
/// holds no handshake at all when `Launches::mark` returns `None` (the last launch was on the
/// same stream): the read of the open-capture count in `mark` is not made inside an `InOp`, and
/// nothing else enters one. A capture begun on the stream by another thread then neither
/// waits for the launch nor is seen by it: the launch can land in the capture (or invalidate
/// it). The graph bumps memory it does not know of (through a raw pointer), so a launch
/// swallowed by a capture returns `Ok` without running. Timing dependent (see the module docs).
#[test]
fn review6_launches_of_a_graph_without_resources_racing_capture_begins_never_land_in_them() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let mut x = DeviceBuffer::<u32>::zeroed(NB).unwrap();
    let px = x.device_ptr_mut(&s).unwrap().as_mut_ptr();
    let mut exec = s
        .capture(CaptureMode::ThreadLocal, (), |cap, _| {
            // SAFETY: `x`'s NB words, alive until after the last launch has completed (`s` is
            // synchronized before `x` is read or dropped); nothing else touches them meanwhile.
            unsafe { probes.bump(px, NB as u32, cap.stream()) }
        })
        .unwrap()
        .instantiate()
        .unwrap();
    let (e, sr) = (&mut exec, &s);
    let (cap, raced) = race(
        Duration::from_secs(2),
        move |stop| drive(stop, || e.launch(sr)),
        || empty_capture(&s),
    );
    s.synchronize().unwrap();
    drop(exec);
    let got = x.to_vec().unwrap();
    cap.check("a launch");
    raced.check("launches", &got);
}

/// Review finding: `GraphExec::upload` holds no handshake when `Launches::mark` returns `None`
/// (the last launch or upload was on the same stream), whatever the resources: it never marks
/// them, so no `InOp` is entered. An upload racing a capture begin on the stream can then be
/// queued into the capture (a node, or an invalidated capture). Timing dependent (see the module
/// docs).
#[test]
fn review6_uploads_racing_capture_begins_never_land_in_them() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let mut a = DeviceBuffer::<u32>::zeroed(NB).unwrap();
    let mut exec = bumper(&probes, &s, &mut a);
    let (e, sr) = (&mut exec, &s);
    let (cap, raced) = race(
        Duration::from_secs(2),
        move |stop| drive(stop, || e.upload(sr)),
        || empty_capture(&s),
    );
    cap.check("an upload");
    raced.check_ran("uploads");
    exec.synchronize().unwrap();
}

/// Review finding: a capture on another stream that *joins* the launcher's stream (its
/// capturing thread queues work on that stream on a buffer its captured work used: the fence
/// waits there for a captured event, `Cuda::wait` then `capture::join`) runs no handshake for
/// the joined stream. It neither waits for other threads' operations in flight there, nor
/// registers the join before the wait: between `cudaStreamWaitEvent` and `capture::join`,
/// `capture_of(stream)` is still `None`, so another thread's work on the stream passes the
/// capture checks (`capture_gate` lets unbound buffers through on a stream no capture holds)
/// and is queued into the capture. The launcher falls back to `GraphExec::launch` while the
/// capture is open, whose checks have that gap; its short path has the begin-side gap (a launch
/// that read no capture open, preempted before `cudaGraphLaunch` while the capture begins and
/// joins). A launch swallowed by the capture returns `Ok` and never runs. Timing dependent.
#[test]
fn review6_launches_racing_a_join_of_their_stream_into_a_capture_never_land_in_it() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let [s, c] = crate::streams();
    let mut a = DeviceBuffer::<u32>::zeroed(NB).unwrap();
    let mut x = DeviceBuffer::<u32>::uninit(NB).unwrap();
    let mut y = DeviceBuffer::<u32>::uninit(NB).unwrap();
    // Alone on `s`: what the capture's own work makes (the second time, as every later time).
    joining_capture(&c, &s, &mut x, &mut y).unwrap();
    let expected = joining_capture(&c, &s, &mut x, &mut y).unwrap();
    let mut exec = bumper(&probes, &s, &mut a);
    let (e, sr) = (&mut exec, &s);
    let (cap, raced) = race(
        Duration::from_secs(2),
        move |stop| {
            let mut run = e.launcher(sr).unwrap();
            drive(stop, || run.launch())
        },
        || Ok((joining_capture(&c, &s, &mut x, &mut y)?, expected)),
    );
    cap.check("a launch");
    raced.check(
        "launches",
        &exec.into_resources().unwrap().to_vec().unwrap(),
    );
}

/// The same join race for any work through the crate, not only graph launches: a kernel
/// queued through a device pointer guard (`device_ptr_mut`, which holds the handshake across the
/// launch) on the stream another thread's capture joins. Each `Ok` bump must have run, and no
/// capture may hold another node than its own.
#[test]
fn review6_guarded_kernels_racing_a_join_of_their_stream_into_a_capture_never_land_in_it() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let [s, c] = crate::streams();
    let mut z = DeviceBuffer::<u32>::zeroed(NB).unwrap();
    let mut x = DeviceBuffer::<u32>::uninit(NB).unwrap();
    let mut y = DeviceBuffer::<u32>::uninit(NB).unwrap();
    // Alone on `s`: what the capture's own work makes (the second time, as every later time).
    joining_capture(&c, &s, &mut x, &mut y).unwrap();
    let expected = joining_capture(&c, &s, &mut x, &mut y).unwrap();
    let (zr, sr, pr) = (&mut z, &s, &probes);
    let (cap, raced) = race(
        Duration::from_secs(2),
        move |stop| {
            drive(stop, || {
                let w = zr.device_ptr_mut(sr)?;
                // SAFETY: the guard's NB words, alive across the launch; the guard records it.
                unsafe { pr.bump(w.as_mut_ptr(), NB as u32, sr) }
            })
        },
        || Ok((joining_capture(&c, &s, &mut x, &mut y)?, expected)),
    );
    cap.check("a kernel");
    raced.check("kernels", &z.to_vec().unwrap());
}
