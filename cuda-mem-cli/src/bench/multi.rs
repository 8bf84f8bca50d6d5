//! Two GPUs (devices 0 and 1), in the same run and with the method of `refbench/peer.cu` and
//! `nccl_peer.py`:
//!
//! - `peer_copy`: `copy_peer_async` against raw `cudaMemcpyPeerAsync` with peer access
//!   enabled, both directions, on a non-blocking stream of the source device, CUDA-event
//!   timed (GB/s, median of 11 interleaved pairs; ratio = speed of ours / raw);
//! - `peer_latency`: one 4-byte copy until the stream is synchronized, host wall clock (µs,
//!   median of 200; ratio = raw time / ours);
//! - `nopeer_copy`: the same as `peer_copy` with peer access disabled (the driver stages);
//! - `staged`: [`StagedCopy`] (pipelined through pinned host memory) against the two serial
//!   copies of `peer.cu` (D2H on the source, then H2D on the destination, through PORTABLE
//!   pinned memory), host wall clock (GB/s; ratio = serial time / staged time);
//! - `nccl_all_reduce`: NCCL all-reduce (sum, in place, `f32`) on cuda-mem buffers, one
//!   process driving both GPUs, timed as `nccl_peer.py` does (5 warm-ups, then the median of
//!   20 calls each between two synchronizations); bus bandwidth as nccl-tests reports it.
//!   Raw is empty: `scripts/gpu-session.sh multi` runs `nccl_peer.py` in the same session and
//!   compares.

use std::fmt::Display;
use std::os::raw::c_void;
use std::time::Instant;

use cuda_mem::sys;
use cuda_mem::{
    copy_async, copy_peer_async, Device, DeviceBuffer, Event, HostAllocFlags, PinnedBuffer, Result,
    StagedCopy, Stream,
};
use cuda_mem_nccl::{bus_bandwidth, Collective, Comm, Group, ReduceOp};

use super::{interquartile_mean, progress, raw, sample_pairs, Order};
use crate::results::{BenchResults, Check, MultiRow, NO_SPREAD};
use crate::units::{gbps, median};

const SAMPLES: u32 = 11;

/// Runs the two-GPU measurements when there are two devices; a progress line otherwise.
pub fn run(res: &mut BenchResults) -> anyhow::Result<()> {
    let n = Device::count()?;
    if n < 2 {
        progress(&format!("two GPUs: skipped ({n} device)"));
        return Ok(());
    }
    // 256 MiB always, as refbench's peer.cu and nccl_peer.py, whatever `--quick` says: the
    // targets compare with them, and the whole section takes seconds.
    let bytes = 256 << 20;
    let (d0, d1) = (Device::get(0)?, Device::get(1)?);
    progress(&format!(
        "two GPUs: peer copies, staged copies and NCCL all-reduce, {} MiB",
        bytes >> 20
    ));
    let r = copies(d0, d1, bytes, res);
    super::attempt(res, &["multi_gpu"], "multi_gpu", r)?;
    let r = nccl_all_reduce(d0, d1, bytes, res);
    if let Err(e) = r {
        progress(&format!("  nccl all-reduce: failed: {e}"));
        res.errors.push(crate::results::KindError {
            kind: "nccl_all_reduce".into(),
            stage: "multi_gpu",
            message: format!("failed: {e}"),
        });
    }
    d0.set_current()?;
    Ok(())
}

/// Seconds of `op` on `s`, between two events recorded on it.
fn event_time(s: &Stream, op: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let _g = s.device().guard()?;
    let (a, b) = (Event::timing()?, Event::timing()?);
    a.record(s)?;
    op()?;
    b.record(s)?;
    b.synchronize()?;
    Ok(f64::from(Event::elapsed_ms(&a, &b)?) * 1e-3)
}

/// Samples of ours and raw in alternating pairs: (median ours, median raw, IQM of raw/ours).
fn paired(
    samples: u32,
    ours: &mut dyn FnMut() -> Result<f64>,
    raw: &mut dyn FnMut() -> Result<f64>,
) -> Result<(f64, f64, f64)> {
    let (o, r) = sample_pairs(
        samples,
        Order::Alternate,
        |o| if o { ours() } else { raw() },
    )?;
    let ratios: Vec<f64> = r.iter().zip(&o).map(|(r, o)| r / o).collect();
    Ok((median(&o), median(&r), interquartile_mean(&ratios)))
}

fn pattern(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
        .collect()
}

fn check<T: PartialEq + Display>(res: &mut BenchResults, what: String, got: &[T], want: &[T]) {
    let bad = got.iter().zip(want).position(|(a, b)| a != b);
    let ok = bad.is_none() && got.len() == want.len();
    res.checks.push(Check {
        what,
        bytes: std::mem::size_of_val(want) as u64,
        ok,
        detail: bad.map(|i| format!("element {i}: {} != {}", got[i], want[i])),
    });
}

/// A bandwidth row of copies of `bytes` bytes from `paired`'s times.
fn bandwidth_row(
    test: &'static str,
    direction: &'static str,
    bytes: usize,
    (ours, raw, ratio): (f64, f64, f64),
) -> MultiRow {
    let bytes = bytes as u64;
    MultiRow {
        test,
        direction,
        bytes,
        unit: "GB/s",
        ours: gbps(bytes, ours),
        raw: gbps(bytes, raw),
        ratio,
        spread: NO_SPREAD,
    }
}

/// The raw peer copy of `bytes` bytes.
///
/// # Safety
/// Both pointers cover `bytes` bytes of live device memory of the devices named, and the
/// caller synchronizes `s` before they are used otherwise or freed.
unsafe fn raw_peer(
    dst: *mut c_void,
    dd: i32,
    src: *const c_void,
    sd: i32,
    bytes: usize,
    s: &Stream,
) -> Result<()> {
    // SAFETY: the caller's promise.
    let code = unsafe { sys::cudaMemcpyPeerAsync(dst, dd, src, sd, bytes, s.as_raw()) };
    raw::check(code, || "cudaMemcpyPeerAsync".into())
}

fn copies(d0: Device, d1: Device, bytes: usize, res: &mut BenchResults) -> Result<()> {
    let n = bytes / 4;
    let mut bufs = [
        DeviceBuffer::<u32>::uninit_on(d0, n)?,
        DeviceBuffer::<u32>::uninit_on(d1, n)?,
    ];
    let mut outs = [
        DeviceBuffer::<u32>::uninit_on(d0, n)?,
        DeviceBuffer::<u32>::uninit_on(d1, n)?,
    ];
    for (i, (b, d)) in bufs.iter_mut().zip([d0, d1]).enumerate() {
        let _g = d.guard()?;
        b.copy_from(&pattern(n, i as u32)[..])?;
    }
    let peer = d0.can_access_peer(d1)? && d1.can_access_peer(d0)?;
    for access in [true, false] {
        if access && !peer {
            progress("  no peer access between devices 0 and 1: peer_copy rows skipped");
            continue;
        }
        if access {
            d0.enable_peer_access(d1)?;
            d1.enable_peer_access(d0)?;
        } else {
            d0.disable_peer_access(d1)?;
            d1.disable_peer_access(d0)?;
        }
        for (a, b) in [(0usize, 1usize), (1, 0)] {
            let (da, db) = ([d0, d1][a], [d0, d1][b]);
            let s = Stream::on(da, true)?;
            let dir = if a == 0 { "0to1" } else { "1to0" };
            let src = &bufs[a];
            let dst = &mut outs[b];
            let (dp, sp) = (
                dst.as_mut_ptr().cast::<c_void>(),
                src.as_ptr().cast::<c_void>(),
            );
            let test = if access { "peer_copy" } else { "nopeer_copy" };
            let t = paired(
                SAMPLES,
                &mut || event_time(&s, &mut || copy_peer_async(dst, src, &s)),
                &mut || {
                    event_time(&s, &mut || {
                        // SAFETY: both buffers hold `bytes` bytes; `event_time` synchronizes.
                        unsafe { raw_peer(dp, db.ordinal(), sp, da.ordinal(), bytes, &s) }
                    })
                },
            )?;
            let row = bandwidth_row(test, dir, bytes, t);
            progress(&format!(
                "  {test} {dir}: {:.1} GB/s, raw cudaMemcpyPeerAsync {:.1} GB/s (ratio {:.3})",
                row.ours, row.raw, row.ratio
            ));
            res.multi.push(row);
            copy_peer_async(dst, src, &s)?;
            check(
                res,
                format!("{test} {dir}"),
                &dst.to_vec()?,
                &pattern(n, a as u32),
            );
            if access {
                // Latency: one 4-byte copy until synchronized.
                let host = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
                    let t = Instant::now();
                    f()?;
                    s.synchronize()?;
                    Ok(t.elapsed().as_secs_f64())
                };
                let (mut o, mut r, mut q) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..200 {
                    let to = host(&mut || cuda_mem::copy_peer_range_async(dst, 0, src, 0, 1, &s))?;
                    // SAFETY: 4 bytes inside both buffers; `host` synchronizes.
                    let tr = host(&mut || unsafe {
                        raw_peer(dp, db.ordinal(), sp, da.ordinal(), 4, &s)
                    })?;
                    o.push(to);
                    r.push(tr);
                    q.push(tr / to);
                }
                let row = MultiRow {
                    test: "peer_latency",
                    direction: dir,
                    bytes: 4,
                    unit: "us",
                    ours: median(&o) * 1e6,
                    raw: median(&r) * 1e6,
                    ratio: interquartile_mean(&q),
                    spread: {
                        let (q1, q3) = super::quartiles(&o);
                        (q1 * 1e6, q3 * 1e6)
                    },
                };
                progress(&format!(
                    "  peer_latency {dir}: {:.2} us, raw {:.2} us",
                    row.ours, row.raw
                ));
                res.multi.push(row);
            }
        }
    }
    // Through pinned host memory: pipelined (ours) against two serial copies (peer.cu).
    let mut host = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::PORTABLE)?;
    for (a, b) in [(0usize, 1usize), (1, 0)] {
        let (da, db) = ([d0, d1][a], [d0, d1][b]);
        let dir = if a == 0 { "0to1" } else { "1to0" };
        let mut staged = StagedCopy::with_defaults(da, db)?;
        let src = &bufs[a];
        let dst = &mut outs[b];
        let (dp, sp) = (
            dst.as_mut_ptr().cast::<c_void>(),
            src.as_ptr().cast::<c_void>(),
        );
        let hp = host.as_mut_ptr().cast::<c_void>();
        let wall = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            let t = Instant::now();
            f()?;
            Ok(t.elapsed().as_secs_f64())
        };
        let t = paired(
            7,
            &mut || {
                wall(&mut || {
                    staged.copy(dst, src)?;
                    staged.synchronize()
                })
            },
            &mut || {
                wall(&mut || {
                    // SAFETY: `hp` holds `bytes` bytes of PORTABLE pinned memory and the two
                    // device pointers `bytes` each; both copies are complete on return
                    // (synchronized below); nothing else uses the memory meanwhile.
                    unsafe {
                        let _g = da.guard()?;
                        raw::memcpy(
                            hp,
                            sp,
                            bytes,
                            sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
                            None,
                        )?;
                        let _h = db.guard()?;
                        raw::memcpy(
                            dp,
                            hp,
                            bytes,
                            sys::cudaMemcpyKind::cudaMemcpyHostToDevice,
                            None,
                        )?;
                        db.synchronize()
                    }
                })
            },
        )?;
        let row = bandwidth_row("staged", dir, bytes, t);
        progress(&format!(
            "  staged {dir}: {:.1} GB/s pipelined ({} x {} MiB), two serial copies {:.1} GB/s \
             (x{:.2})",
            row.ours,
            staged.slots(),
            staged.chunk_bytes() >> 20,
            row.raw,
            row.ratio
        ));
        res.multi.push(row);
        outs[b].copy_from(&pattern(n, 77)[..])?;
        staged.copy(&mut outs[b], &bufs[a])?;
        check(
            res,
            format!("staged {dir}"),
            &outs[b].to_vec()?,
            &pattern(n, a as u32),
        );
    }
    drop(host);
    Ok(())
}

/// The NCCL all-reduce bus bandwidth on cuda-mem buffers, as `nccl_peer.py` measures it.
fn nccl_all_reduce(
    d0: Device,
    d1: Device,
    bytes: usize,
    res: &mut BenchResults,
) -> cuda_mem_nccl::Result<()> {
    let nccl = cuda_mem_nccl::nccl()?;
    let devices = [d0, d1];
    let comms = Comm::init_all(&devices)?;
    let n = bytes / 4;
    let streams = devices
        .iter()
        .map(|&d| Stream::on(d, true))
        .collect::<Result<Vec<_>>>()?;
    let mut init = Vec::new();
    let mut xs = Vec::new();
    for (r, &d) in devices.iter().enumerate() {
        let _g = d.guard()?;
        init.push(DeviceBuffer::from_slice(&vec![(r + 1) as f32; n])?);
        xs.push(DeviceBuffer::<f32>::uninit(n)?);
    }
    let once = |xs: &mut Vec<DeviceBuffer<f32>>| -> cuda_mem_nccl::Result<()> {
        let mut g = Group::start()?;
        for ((c, x), s) in comms.iter().zip(xs.iter_mut()).zip(&streams) {
            g.all_reduce_in_place(c, x, ReduceOp::Sum, s)?;
        }
        g.end()
    };
    let sync =
        |streams: &[Stream]| -> Result<()> { streams.iter().try_for_each(Stream::synchronize) };
    for (x, (i, s)) in xs.iter_mut().zip(init.iter().zip(&streams)) {
        copy_async(x, i, s)?;
    }
    for _ in 0..5 {
        once(&mut xs)?;
    }
    sync(&streams)?;
    let mut times = Vec::new();
    for _ in 0..20 {
        for (x, (i, s)) in xs.iter_mut().zip(init.iter().zip(&streams)) {
            copy_async(x, i, s)?;
        }
        sync(&streams)?;
        let t = Instant::now();
        once(&mut xs)?;
        sync(&streams)?;
        times.push(t.elapsed().as_secs_f64());
    }
    let t = median(&times);
    let algbw = gbps(bytes as u64, t);
    let busbw = bus_bandwidth(Collective::AllReduce, algbw, devices.len());
    let want = vec![3.0f32; n];
    for (r, x) in xs.iter().enumerate() {
        check(
            res,
            format!("nccl all-reduce rank {r}"),
            &x.to_vec()?,
            &want,
        );
    }
    progress(&format!(
        "  nccl_allreduce ranks=2 size={}MiB nccl={} time_us={:.1} algbw_gbps={algbw:.2} \
         busbw_gbps={busbw:.2}",
        bytes >> 20,
        nccl.version_string(),
        t * 1e6
    ));
    res.multi.push(MultiRow {
        test: "nccl_all_reduce",
        direction: "2 ranks",
        bytes: bytes as u64,
        unit: "GB/s busbw",
        ours: busbw,
        raw: f64::NAN,
        ratio: f64::NAN,
        spread: NO_SPREAD,
    });
    Ok(())
}
