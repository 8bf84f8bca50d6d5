//! cuda-mem × cudarc 0.19 (issue 21, section 4): the same operations through cudarc, the crate
//! a Rust user would otherwise pick, in the same run, ours and cudarc's interleaved (which
//! goes first alternating from pair to pair). `ratio` is the speed of ours over cudarc's
//! (cudarc's time / ours; > 1: ours is faster). Each side uses its own API the way its
//! documentation shows, on its own non-blocking streams, in the device's primary context
//! (cudarc's through `interop::cudarc::context`):
//!
//! - `copy_async_call`: host time of one 4 KiB asynchronous copy, pinned host memory, while
//!   the stream is held by the spin kernel (so only the host side is timed): `copy_async`
//!   against `CudaStream::memcpy_htod` / `memcpy_dtoh` (which also wait for and record
//!   cudarc's events on the slice and the pinned buffer). Measured last, 16 calls per sample:
//!   a side whose calls block behind the held stream is reported not measured.
//! - `copy_pinned`, `copy_pageable`: bandwidth at 4 KiB, 1 MiB and 256 MiB, both ways; each
//!   sample is a loop of copies followed by a stream synchronize, wall clock. Pinned: ours
//!   `copy_async` from a `PinnedBuffer`, cudarc's from `alloc_pinned_with_flags(.., 0)` (plain
//!   page-locked memory: cudarc's `alloc_pinned` is write-combined). Pageable: ours `copy`
//!   (staged through pinned chunks from 4 MiB up), cudarc's `memcpy_htod` / `memcpy_dtoh`
//!   from a `Vec` (the driver's path).
//! - `stream_alloc_free`: stream-ordered device allocation + free, host time per pair in
//!   batches (synchronized between batches, untimed): ours `DeviceBuffer::from_pool` from a
//!   [`MemPool`] + drop, cudarc's `CudaStream::alloc` (`cuMemAllocAsync` on the device's
//!   current pool, and its two events) + drop.
//! - `pinned_alloc_free`: ours from the [`PinnedPool`] (cached), cudarc's `alloc_pinned_with_flags`
//!   (`cuMemHostAlloc` + `cuMemFreeHost` each time: cudarc has no cache).
//! - `handoff`: a 4 KiB write on one stream read on another (`copy_async` host to device on A,
//!   device to host on B), host time per pair in loops of [`HANDOFF_PAIRS`]: ours orders B
//!   after A through the buffer's fence, cudarc through the slice's events.
//!
//! - `graph_replay`: 25 × (4 KiB copy from pinned memory, 4 KiB memset, 4 KiB device copy)
//!   captured once on a non-blocking stream and replayed: host time of one replay and its end
//!   to end time (replay and synchronize), medians over interleaved rounds. Ours
//!   `Stream::capture` → `GraphExec::launch`, cudarc's `begin_capture` / `end_capture` →
//!   `CudaGraph::launch`. Measured last, in its own attempt: where cudarc's capture of its
//!   event-tracked copies fails, the row is reported not measured, with cudarc's error.

use std::sync::Arc;
use std::time::Instant;

use cuda_mem::interop::cudarc::{context, stream as cuda_mem_stream};
use cuda_mem::{
    copy, copy_async, copy_range, CaptureMode, DeviceBuffer, Error, HostAllocFlags, MemPool,
    PinnedBuffer, PinnedPool, Result, Stream,
};
use cudarc::driver::{sys as dsys, CudaContext, CudaSlice, CudaStream, PinnedHostSlice};

use super::{progress, reps_for, sample_pairs, Config, Ctx, Gate, Order, Paired};
use crate::results::{BenchResults, Check, HostRow};
use crate::units::{fmt_size, gbps, median, KIB, MIB};

/// Copy sizes.
pub const COPY_SIZES: [u64; 3] = [4 * KIB, MIB, 256 * MIB];
/// Sizes of the allocation rows.
pub const ALLOC_SIZES: [u64; 2] = [4 * KIB, MIB];
/// Calls per sample of the per-call row, queued while the spin kernel holds the stream: well
/// inside a stream's queue for both sides. (cudarc queues an event wait and record per side
/// of each copy besides the copy: 256 calls filled the queue on the H200, and its enqueue then
/// blocked the host until the spin kernel's timeout.)
const CALLS: u32 = 16;
/// Longest host time of one sample of the per-call row: beyond it, the side's calls waited for
/// the held stream (the row would measure the spin kernel), and the row stops with an error.
const CALL_SAMPLE_LIMIT_S: f64 = 0.5;
/// Pairs per sample of the stream-ordered allocation row.
const ALLOC_BATCH: u32 = 200;
/// Pinned allocations + frees per sample.
const PINNED_PAIRS: u32 = 20;
/// Write/read pairs per sample of the hand-off row.
pub const HANDOFF_PAIRS: u32 = 200;

/// Interleaved samples of ours (`sample(true)`) and cudarc's (`sample(false)`), each a time.
fn paired(samples: u32, sample: impl FnMut(bool) -> Result<f64>) -> Result<Paired> {
    let (a, b) = sample_pairs(samples.max(2), Order::Alternate, sample)?;
    Ok(Paired::new(&a, &b))
}

/// A row of times (`unit` "us": microseconds per operation) or of bandwidth (`moved` bytes per
/// timed operation, `unit` "GB/s"), from interleaved times in seconds.
fn row(test: &'static str, config: String, bytes: u64, moved: Option<u64>, t: Paired) -> HostRow {
    let (unit, ours, reference) = match moved {
        Some(m) => ("GB/s", gbps(m, t.ours), gbps(m, t.raw)),
        None => ("us", t.ours * 1e6, t.raw * 1e6),
    };
    let r = HostRow {
        test,
        config,
        bytes,
        unit,
        ours,
        reference,
        // Speed of ours over cudarc's: the inverse of the time ratio.
        ratio: 1.0 / t.ratio,
    };
    progress(&format!(
        "  {} {} {}: {:.3} {unit}, cudarc {:.3} {unit}: {:.2}x cudarc",
        r.test,
        r.config,
        fmt_size(bytes),
        r.ours,
        r.reference,
        r.ratio
    ));
    r
}

/// cudarc's error as ours, naming what failed (also the graphs section's).
pub(super) fn cu<T>(
    r: std::result::Result<T, cudarc::driver::DriverError>,
    what: &str,
) -> Result<T> {
    r.map_err(|e| Error::Cuda {
        code: cuda_mem::ErrorCode(e.0 as u32),
        call: format!("cudarc {what}"),
    })
}

/// Plain page-locked host memory from cudarc, filled with `byte`.
fn cudarc_pinned(ctx: &Arc<CudaContext>, n: usize, byte: u8) -> Result<PinnedHostSlice<u8>> {
    // SAFETY: the memory is written below before anything reads it.
    let mut p = cu(
        unsafe { ctx.alloc_pinned_with_flags::<u8>(n, 0) },
        "alloc_pinned_with_flags",
    )?;
    cu(p.as_mut_slice(), "PinnedHostSlice::as_mut_slice")?.fill(byte);
    Ok(p)
}

/// Both sides' streams and the spin kernel's gate.
struct Sides<'a> {
    gate: Option<&'a Gate>,
    /// Ours.
    s: Stream,
    /// cudarc's, and the cuda-mem stream over it (for the gate).
    cs: Arc<CudaStream>,
    cs_held: Stream,
    ctx: Arc<CudaContext>,
}

/// Runs every row.
pub fn run(ctx: &Ctx, cfg: &Config, res: &mut BenchResults) -> Result<()> {
    let cctx = context(ctx.device)?;
    let cs = cu(cctx.new_stream(), "new_stream")?;
    let sides = Sides {
        gate: ctx.gate.as_ref(),
        s: Stream::on(ctx.device, true)?,
        cs_held: cuda_mem_stream(&cs)?,
        cs,
        ctx: cctx,
    };
    let samples = (cfg.samples * 2).max(10);
    progress("peers: pinned and pageable copies");
    copies(&sides, cfg, res)?;
    progress("peers: stream-ordered and pinned allocation + free");
    allocs(&sides, ctx, samples, res)?;
    progress("peers: cross-stream hand-off");
    handoff(&sides, samples, res)?;
    progress("peers: graph replay");
    let r = graph_replay(&sides, res);
    super::attempt(res, &["cudarc"], "peers graph_replay", r)?;
    // Last, in its own attempt: a side whose calls block the host behind the held stream
    // (seen on the H200 with cudarc's event waits and records) costs the spin kernel's
    // timeout once and is reported not measured, instead of stalling the rows after it.
    // cudarc records errors it cannot return (in drops) and hands them to the next call that
    // checks: one left by an earlier row's teardown would fail this row's first allocation.
    // Reported here, and taken, so that it is seen and not blamed on the row.
    if let Err(e) = sides.ctx.check_err() {
        progress(&format!(
            "  cudarc had recorded an error in an earlier row's teardown (taken): {e:?}"
        ));
    }
    if let Some(gate) = sides.gate {
        progress("peers: one 4 KiB async copy, host time, stream held");
        let r = per_call(&sides, gate, samples, res);
        super::attempt(res, &["cudarc"], "peers copy_async_call", r)?;
    }
    Ok(())
}

/// `copy_async_call`: host time per 4 KiB async copy, stream held, both ways.
fn per_call(sides: &Sides, gate: &Gate, samples: u32, res: &mut BenchResults) -> Result<()> {
    let n = 4096usize;
    let mut host = PinnedBuffer::<u8>::zeroed(n, HostAllocFlags::DEFAULT)?;
    let mut dev = DeviceBuffer::<u8>::zeroed(n)?;
    let mut chost = cudarc_pinned(&sides.ctx, n, 0)?;
    let mut cdev: CudaSlice<u8> = cu(sides.cs.alloc_zeros(n), "alloc_zeros")?;
    for (dir, h2d) in [("h2d", true), ("d2h", false)] {
        let t = paired(samples, |ours| {
            // cudarc's stream is held through the cuda-mem stream over it.
            let s = if ours { &sides.s } else { &sides.cs_held };
            let held = gate.hold(s)?;
            let t0 = Instant::now();
            for _ in 0..CALLS {
                match (ours, h2d) {
                    (true, true) => copy_async(&mut dev, &host, s)?,
                    (true, false) => copy_async(&mut host, &dev, s)?,
                    (false, true) => cu(sides.cs.memcpy_htod(&chost, &mut cdev), "memcpy_htod")?,
                    (false, false) => cu(sides.cs.memcpy_dtoh(&cdev, &mut chost), "memcpy_dtoh")?,
                }
            }
            let elapsed = t0.elapsed().as_secs_f64();
            drop(held);
            s.synchronize()?;
            if elapsed > CALL_SAMPLE_LIMIT_S {
                return Err(Error::Misuse(cuda_mem::Misuse::InvalidArgument {
                    op: "peers copy_async_call",
                    reason: format!(
                        "{} calls of the {} side took {elapsed:.1} s: its calls waited for the \
                         held stream, so the host time per call cannot be measured this way",
                        CALLS,
                        if ours { "cuda-mem" } else { "cudarc" }
                    ),
                }));
            }
            Ok(elapsed / f64::from(CALLS))
        })?;
        res.peers.push(row(
            "copy_async_call",
            format!("{dir}, pinned, host time per call"),
            n as u64,
            None,
            t,
        ));
    }
    Ok(())
}

/// `copy_pinned` and `copy_pageable` at [`COPY_SIZES`], both ways, with a data check of each
/// side's last copies.
fn copies(sides: &Sides, cfg: &Config, res: &mut BenchResults) -> Result<()> {
    let samples = cfg.samples.max(5);
    for bytes in COPY_SIZES {
        let n = bytes as usize;
        let reps = reps_for(bytes).min(64);
        let mut dev = DeviceBuffer::<u8>::zeroed(n)?;
        let mut cdev: CudaSlice<u8> = cu(sides.cs.alloc_zeros(n), "alloc_zeros")?;
        // Pinned.
        let mut host = PinnedBuffer::<u8>::zeroed(n, HostAllocFlags::DEFAULT)?;
        host.as_mut_slice()?.fill(0x5a);
        let mut chost = cudarc_pinned(&sides.ctx, n, 0x5a)?;
        for (dir, h2d) in [("h2d", true), ("d2h", false)] {
            let t = paired(samples, |ours| {
                let t0 = Instant::now();
                for _ in 0..reps {
                    match (ours, h2d) {
                        (true, true) => copy_async(&mut dev, &host, &sides.s)?,
                        (true, false) => copy_async(&mut host, &dev, &sides.s)?,
                        (false, true) => {
                            cu(sides.cs.memcpy_htod(&chost, &mut cdev), "memcpy_htod")?
                        }
                        (false, false) => {
                            cu(sides.cs.memcpy_dtoh(&cdev, &mut chost), "memcpy_dtoh")?
                        }
                    }
                }
                if ours {
                    sides.s.synchronize()?;
                } else {
                    cu(sides.cs.synchronize(), "synchronize")?;
                }
                Ok(t0.elapsed().as_secs_f64() / f64::from(reps))
            })?;
            res.peers
                .push(row("copy_pinned", dir.to_string(), bytes, Some(bytes), t));
        }
        // Pageable.
        let mut vec = vec![0x3cu8; n];
        for (dir, h2d) in [("h2d", true), ("d2h", false)] {
            let t = paired(samples, |ours| {
                let t0 = Instant::now();
                for _ in 0..reps {
                    match (ours, h2d) {
                        (true, true) => copy(&mut dev, &vec)?,
                        (true, false) => copy(&mut vec, &dev)?,
                        (false, true) => cu(sides.cs.memcpy_htod(&vec, &mut cdev), "memcpy_htod")?,
                        (false, false) => cu(sides.cs.memcpy_dtoh(&cdev, &mut vec), "memcpy_dtoh")?,
                    }
                }
                if !ours {
                    cu(sides.cs.synchronize(), "synchronize")?;
                }
                Ok(t0.elapsed().as_secs_f64() / f64::from(reps))
            })?;
            res.peers
                .push(row("copy_pageable", dir.to_string(), bytes, Some(bytes), t));
        }
        // The last copies of both sides moved the data: a pattern through each.
        let pattern = |i: usize| (i as u8).wrapping_mul(29) ^ 0x96;
        let src: Vec<u8> = (0..n).map(pattern).collect();
        copy(&mut dev, &src)?;
        let mut back = vec![0u8; n];
        copy_range(&mut back, 0, &dev, 0, n)?;
        cu(sides.cs.memcpy_htod(&src, &mut cdev), "memcpy_htod")?;
        let cback = cu(sides.cs.clone_dtoh(&cdev), "clone_dtoh")?;
        for (side, got) in [("cuda-mem", &back), ("cudarc", &cback)] {
            let bad = got.iter().enumerate().find(|&(i, &x)| x != pattern(i));
            res.checks.push(Check {
                what: format!("peers: {side} copies of {}", fmt_size(bytes)),
                bytes,
                ok: bad.is_none(),
                detail: bad
                    .map(|(i, &x)| format!("byte {i}: got {x:#04x}, expected {:#04x}", pattern(i))),
            });
        }
    }
    Ok(())
}

/// `stream_alloc_free` and `pinned_alloc_free` at [`ALLOC_SIZES`].
fn allocs(sides: &Sides, ctx: &Ctx, samples: u32, res: &mut BenchResults) -> Result<()> {
    let pool = MemPool::new(ctx.device)?;
    let pinned = PinnedPool::global();
    for bytes in ALLOC_SIZES {
        let n = bytes as usize;
        let t = paired(samples, |ours| {
            let t0 = Instant::now();
            for _ in 0..ALLOC_BATCH {
                if ours {
                    drop(DeviceBuffer::<u8>::from_pool(&pool, n, &sides.s)?);
                } else {
                    // SAFETY: the uninitialised memory is never read; it is freed at once.
                    drop(cu(unsafe { sides.cs.alloc::<u8>(n) }, "CudaStream::alloc")?);
                }
            }
            let t = t0.elapsed().as_secs_f64() / f64::from(ALLOC_BATCH);
            if ours {
                sides.s.synchronize()?;
            } else {
                cu(sides.cs.synchronize(), "synchronize")?;
            }
            Ok(t)
        })?;
        res.peers.push(row(
            "stream_alloc_free",
            format!("MemPool::new / cudarc alloc, batches of {ALLOC_BATCH}"),
            bytes,
            None,
            t,
        ));

        let t = paired(samples, |ours| {
            let t0 = Instant::now();
            for _ in 0..PINNED_PAIRS {
                if ours {
                    drop(pinned.alloc::<u8>(n, HostAllocFlags::DEFAULT)?);
                } else {
                    // SAFETY: the uninitialised memory is never read; it is freed at once.
                    let p = unsafe { sides.ctx.alloc_pinned_with_flags::<u8>(n, 0) };
                    drop(cu(p, "alloc_pinned_with_flags")?);
                }
            }
            Ok(t0.elapsed().as_secs_f64() / f64::from(PINNED_PAIRS))
        })?;
        res.peers.push(row(
            "pinned_alloc_free",
            "PinnedPool::global / cudarc alloc_pinned".into(),
            bytes,
            None,
            t,
        ));
    }
    Ok(())
}

/// `handoff`: a 4 KiB write on stream A read on stream B, host time per pair.
fn handoff(sides: &Sides, samples: u32, res: &mut BenchResults) -> Result<()> {
    let n = 4096usize;
    let b = Stream::on(sides.s.device(), true)?;
    let cb = cu(sides.ctx.new_stream(), "new_stream")?;
    let src = PinnedBuffer::<u8>::from_slice(&[0x11; 4096], HostAllocFlags::DEFAULT)?;
    let mut dst = PinnedBuffer::<u8>::zeroed(n, HostAllocFlags::DEFAULT)?;
    let mut dev = DeviceBuffer::<u8>::zeroed(n)?;
    let csrc = cudarc_pinned(&sides.ctx, n, 0x11)?;
    let mut cdst = cudarc_pinned(&sides.ctx, n, 0)?;
    let mut cdev: CudaSlice<u8> = cu(sides.cs.alloc_zeros(n), "alloc_zeros")?;
    let t = paired(samples, |ours| {
        let t0 = Instant::now();
        for _ in 0..HANDOFF_PAIRS {
            if ours {
                copy_async(&mut dev, &src, &sides.s)?;
                copy_async(&mut dst, &dev, &b)?;
            } else {
                cu(sides.cs.memcpy_htod(&csrc, &mut cdev), "memcpy_htod")?;
                cu(cb.memcpy_dtoh(&cdev, &mut cdst), "memcpy_dtoh")?;
            }
        }
        let t = t0.elapsed().as_secs_f64() / f64::from(HANDOFF_PAIRS);
        if ours {
            sides.s.synchronize()?;
            b.synchronize()?;
        } else {
            cu(sides.cs.synchronize(), "synchronize")?;
            cu(cb.synchronize(), "synchronize")?;
        }
        Ok(t)
    })?;
    res.peers.push(row(
        "handoff",
        "write on A, read on B, host time per pair".into(),
        n as u64,
        None,
        t,
    ));
    let ok = dst.as_slice()?.iter().all(|&x| x == 0x11)
        && cu(cdst.as_slice(), "PinnedHostSlice::as_slice")?
            .iter()
            .all(|&x| x == 0x11);
    res.checks.push(Check {
        what: "peers: hand-off reads saw the writes (both sides)".into(),
        bytes: 2 * n as u64,
        ok,
        detail: (!ok).then(|| "a read on stream B missed the write on stream A".into()),
    });
    Ok(())
}

/// Steps of the graph row, each three operations.
const GRAPH_STEPS: usize = 25;
/// Replays per side of the graph row, after [`GRAPH_WARMUP`].
const GRAPH_ROUNDS: usize = 200;
const GRAPH_WARMUP: usize = 20;

/// `graph_replay`: the same 75 operations captured by each side, replayed in turn.
fn graph_replay(sides: &Sides, res: &mut BenchResults) -> Result<()> {
    let n = 4096usize;
    let pattern = |i: usize| (i as u8).wrapping_mul(53) ^ 0x71;
    let data: Vec<u8> = (0..n).map(pattern).collect();

    // Ours.
    let h = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT)?;
    let mut d = DeviceBuffer::<u8>::zeroed(n)?;
    let mut e = DeviceBuffer::<u8>::zeroed(n)?;
    let s = &sides.s;
    let exec = s
        .capture(
            CaptureMode::ThreadLocal,
            (&h, &mut d, &mut e),
            |cap, (h, d, e)| {
                for _ in 0..GRAPH_STEPS {
                    copy_async(&mut **d, &**h, cap.stream())?;
                    e.memset_async(0, cap.stream())?;
                    copy_async(&mut **e, &**d, cap.stream())?;
                }
                Ok(())
            },
        )?
        .instantiate()?;
    exec.upload(s)?;

    // cudarc's, on a stream of its own (a failed capture must not leave the others capturing).
    // cudarc's event tracking makes each copy wait for the slices' events, recorded before the
    // capture, and CUDA invalidates a capture that waits on an event recorded outside it (seen
    // on the H200): cudarc's own advice for graphs is to turn tracking off, for the slices
    // made while it is off. So the row's slices are made with it off, and it is turned back on
    // for the rows after.
    // SAFETY: cudarc's condition for untracked slices: their only stream is `gs`, which is
    // synchronized before they are used anywhere else (the data check) and before they drop.
    unsafe { sides.ctx.disable_event_tracking() };
    let gs = cu(sides.ctx.new_stream(), "new_stream");
    let made = gs.and_then(|gs| {
        let mut ch = cudarc_pinned(&sides.ctx, n, 0)?;
        cu(ch.as_mut_slice(), "PinnedHostSlice::as_mut_slice")?.copy_from_slice(&data);
        let cd: CudaSlice<u8> = cu(gs.alloc_zeros(n), "alloc_zeros")?;
        let ce: CudaSlice<u8> = cu(gs.alloc_zeros(n), "alloc_zeros")?;
        Ok((gs, ch, cd, ce))
    });
    // SAFETY: as above; slices made from here on are tracked again.
    unsafe { sides.ctx.enable_event_tracking() };
    let (gs, ch, mut cd, mut ce) = made?;
    cu(gs.synchronize(), "synchronize")?;
    cu(
        gs.begin_capture(dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        "begin_capture",
    )?;
    let captured = (|| {
        for _ in 0..GRAPH_STEPS {
            gs.memcpy_htod(&ch, &mut cd)?;
            gs.memset_zeros(&mut ce)?;
            gs.memcpy_dtod(&cd, &mut ce)?;
        }
        Ok(())
    })();
    // Always ended, so that the stream is usable again whatever failed; and cudarc's recorded
    // error (a failed call inside `memcpy_*` that cudarc could not return) taken, so that it
    // does not fail the rows after.
    let graph = gs.end_capture(dsys::CUgraphInstantiate_flags(0));
    let recorded = sides.ctx.check_err();
    let captured = captured.and(recorded);
    let graph = match (captured, graph) {
        (Ok(()), Ok(Some(g))) => g,
        (Err(e), _) | (Ok(()), Err(e)) => return cu(Err(e), "stream capture of the graph row"),
        (Ok(()), Ok(None)) => {
            return Err(Error::Misuse(cuda_mem::Misuse::InvalidArgument {
                op: "peers graph_replay",
                reason: "cudarc's end_capture returned no graph".into(),
            }))
        }
    };
    cu(graph.upload(), "CudaGraph::upload")?;

    // Interleaved rounds: host time of the replay call, and until the stream is idle.
    let (mut host, mut end) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for round in 0..GRAPH_ROUNDS + GRAPH_WARMUP {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for ours in order {
            let t0 = Instant::now();
            if ours {
                exec.launch(s)?;
            } else {
                cu(graph.launch(), "CudaGraph::launch")?;
            }
            let t1 = Instant::now();
            if ours {
                s.synchronize()?;
            } else {
                cu(gs.synchronize(), "synchronize")?;
            }
            let t2 = Instant::now();
            if round >= GRAPH_WARMUP {
                let i = usize::from(!ours);
                host[i].push((t1 - t0).as_secs_f64());
                end[i].push((t2 - t0).as_secs_f64());
            }
        }
    }
    for (what, t) in [
        ("host time per replay", &host),
        ("end to end per replay", &end),
    ] {
        let p = Paired::new(&t[0], &t[1]);
        res.peers.push(row(
            "graph_replay",
            format!("{} ops, {what}", 3 * GRAPH_STEPS),
            n as u64,
            None,
            Paired {
                ours: median(&t[0]),
                raw: median(&t[1]),
                ..p
            },
        ));
    }
    let ours_ok = exec.resources().2.to_vec()? == data;
    let cudarc_ok = cu(gs.clone_dtoh(&ce), "clone_dtoh")? == data;
    res.checks.push(Check {
        what: "peers: graph replays (both sides) copied the data".into(),
        bytes: 2 * n as u64,
        ok: ours_ok && cudarc_ok,
        detail: (!(ours_ok && cudarc_ok))
            .then(|| format!("cuda-mem's replay right: {ours_ok}, cudarc's: {cudarc_ok}")),
    });
    Ok(())
}
