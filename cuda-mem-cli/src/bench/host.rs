//! Host-side speed (issue 10), each figure beside its reference measured in the same run:
//!
//! - `memcpy`: host memcpy bandwidth (256 MiB) on 1, 2, 4, ... threads and on every core,
//!   with ordinary and with non-temporal stores: the physical ceiling of any staged copy.
//! - `staged_calibration`: what the process-wide stager measured at first use, and how long
//!   it took (reference: the 50 ms budget); the chosen configuration is the row's name.
//! - `staged`: pageable `Vec` to device and back through the process-wide [`Stager`] (its
//!   measured configuration) and, below 64 MiB, through one forced to stage at every size,
//!   against the driver's path (`cudaMemcpy` from the same `Vec`), at every copy size;
//!   ratio = driver time / ours.
//! - `staged_vs_{driver,pinned,memcpy}`: at 2 MiB, 64 MiB, 256 MiB and 1 GiB, the process-wide
//!   stager against the driver's pageable copy and against a pinned buffer's copy, interleaved
//!   in one loop, and against the all-core memcpy ceiling (issue 21's targets).
//! - `staged_large_store_kind`: the store kind the process-wide stager chose for each size
//!   class of large copies by trying both on the first ones (reference: the other kind).
//! - `staged_sweep`: staged copies of 16 MiB to 1 GiB over threads × largest chunk × chunks
//!   per thread × store kind × depth, against the driver.
//! - `pool`: [`PinnedPool`] allocation + free (cached), median and p99 on one thread;
//!   reference `cudaHostAlloc` + `cudaFreeHost`. `pool_threads`: the per-pair time per thread
//!   with 1–16 threads at once ([`super::pools::pinned_pool_threads`]).
//! - `host_pool`: pinned memory from a host-location `MemPool` (issue 11), alloc + free +
//!   synchronize, for comparison with the pinned pool.
//! - `cold_pin`: making a pinned buffer of 256 MiB and 1 GiB: `cudaHostAlloc` (reference)
//!   against mmap + threaded populate + `cudaHostRegister` at 1–16 threads, with and without
//!   huge pages; the free is reported separately. `cold_pin_copy`: copy bandwidth from such a
//!   buffer against `cudaHostAlloc` memory.
//!
//! Times are host wall clock. GB = 1e9 bytes.

use std::os::raw::c_void;
use std::time::Instant;

use cuda_mem::{
    copy, copy_async, set_auto_staging, sys, DeviceBuffer, HostAllocFlags, MemPool, PinStrategy,
    PinnedBuffer, PinnedPool, PinnedPoolConfig, Result, Slice as _, Stager, StagingConfig, Stream,
};

use super::{attempt, progress, raw, Config, Ctx};
use crate::results::{BenchResults, Check, HostRow};
use crate::units::{fmt_size, gbps, median, GIB, MIB};

fn row(
    res: &mut BenchResults,
    test: &'static str,
    config: String,
    bytes: u64,
    unit: &'static str,
    [ours, reference, ratio]: [f64; 3],
) {
    progress(&format!(
        "  {test} {config} {}: {ours:.3} {unit} (reference {reference:.3}, ratio {ratio:.3})",
        fmt_size(bytes)
    ));
    res.host.push(HostRow {
        test,
        config,
        bytes,
        unit,
        ours,
        reference,
        ratio,
    });
}

/// Runs the section.
pub fn run(ctx: &Ctx, cfg: &Config, res: &mut BenchResults) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    memcpy_ceiling(res, cores);
    let r = pool(res, cfg);
    attempt(res, &["pinned_pool"], "host", r)?;
    let r = host_pool(ctx, res, cfg);
    attempt(res, &["host_pool"], "host", r)?;
    let r = staged(res, cfg, cores);
    attempt(res, &["staged"], "host", r)?;
    let r = cold_pin(res, cfg);
    attempt(res, &["cold_pin"], "host", r)?;
    Ok(())
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() - 1) as f64 * p).round() as usize]
}

/// Host memcpy of `bytes` split over `threads` threads (wall clock, median of `samples`).
fn memcpy_gbps(src: &[u8], dst: &mut [u8], threads: usize, nt: bool, samples: u32) -> f64 {
    let bytes = src.len();
    let per = bytes.div_ceil(threads);
    let mut t = Vec::new();
    for _ in 0..=samples {
        let start = Instant::now();
        std::thread::scope(|s| {
            for (d, sr) in dst.chunks_mut(per).zip(src.chunks(per)) {
                s.spawn(move || {
                    if nt {
                        cuda_mem::measure::host_copy(d, sr, true);
                    } else {
                        d.copy_from_slice(sr);
                    }
                });
            }
        });
        t.push(start.elapsed().as_secs_f64());
    }
    gbps(bytes as u64, median(&t[1..]))
}

fn memcpy_ceiling(res: &mut BenchResults, cores: usize) {
    progress("host memcpy ceiling");
    let bytes = 256 * MIB as usize;
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    // 1, 2, 4, ... threads and every core, ordinary and non-temporal stores; the first, one
    // thread with ordinary stores, is every row's reference.
    let mut counts: Vec<usize> = (0..)
        .map(|k| 1usize << k)
        .take_while(|&t| t < cores)
        .collect();
    counts.push(cores);
    let mut one = f64::NAN;
    for (threads, nt) in counts.iter().flat_map(|&t| [(t, false), (t, true)]) {
        let g = memcpy_gbps(&src, &mut dst, threads, nt, 5);
        if one.is_nan() {
            one = g;
        }
        let cfg = format!("threads={threads} {}", if nt { "nt" } else { "std" });
        row(res, "memcpy", cfg, bytes as u64, "GB/s", [g, one, g / one]);
    }
}

fn pool(res: &mut BenchResults, cfg: &Config) -> Result<()> {
    progress("pinned pool: cached alloc + free");
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let sizes: &[u64] = if cfg.quick {
        &[4096, MIB]
    } else {
        &[4096, 64 * 1024, MIB, 16 * MIB]
    };
    for &bytes in sizes {
        let b = bytes as usize;
        drop(pool.alloc::<u8>(b, HostAllocFlags::DEFAULT)?); // the miss
        let n = 20_000;
        let mut t = Vec::with_capacity(n);
        for _ in 0..n {
            let s = Instant::now();
            let buf = pool.alloc::<u8>(b, HostAllocFlags::DEFAULT)?;
            drop(buf);
            t.push(s.elapsed().as_secs_f64() * 1e6);
        }
        // Reference: cudaHostAlloc + cudaFreeHost (few pairs: each is slow).
        let reps = if bytes >= 16 * MIB { 3 } else { 21 };
        let mut r = Vec::new();
        for _ in 0..reps {
            let s = Instant::now();
            raw::alloc_free("pinned", b)?;
            r.push(s.elapsed().as_secs_f64() * 1e6);
        }
        let (med, p99, rmed) = (median(&t), percentile(&t, 0.99), median(&r));
        row(
            res,
            "pool",
            "threads=1 median".into(),
            bytes,
            "us",
            [med, rmed, rmed / med],
        );
        row(
            res,
            "pool",
            "threads=1 p99".into(),
            bytes,
            "us",
            [p99, rmed, rmed / p99],
        );
    }
    let st = pool.stats();
    progress(&format!(
        "  pool stats: {st} ({:?} in the driver)",
        st.driver_time
    ));
    super::pools::pinned_pool_threads(res, cfg.quick)
}

fn host_pool(ctx: &Ctx, res: &mut BenchResults, cfg: &Config) -> Result<()> {
    progress("host-location MemPool: alloc + free + synchronize");
    let pool = match MemPool::host(ctx.device) {
        Ok(p) => p,
        Err(e) => {
            progress(&format!("  host pool unavailable: {e}"));
            return Ok(());
        }
    };
    pool.set_release_threshold(u64::MAX)?;
    let pinned = PinnedPool::new(PinnedPoolConfig::default());
    let s = Stream::non_blocking()?;
    let sizes: &[u64] = if cfg.quick {
        &[4096]
    } else {
        &[4096, MIB, 16 * MIB]
    };
    for &bytes in sizes {
        let b = bytes as usize;
        let n = 2000;
        let mut t = Vec::new();
        let mut p = Vec::new();
        drop(pinned.alloc::<u8>(b, HostAllocFlags::DEFAULT)?);
        for _ in 0..n {
            let st = Instant::now();
            // SAFETY: never read: allocated and dropped at once.
            drop(unsafe { PinnedBuffer::<u8>::uninit_from_pool(&pool, b, &s)? });
            s.synchronize()?;
            t.push(st.elapsed().as_secs_f64() * 1e6);
            let st = Instant::now();
            drop(pinned.alloc::<u8>(b, HostAllocFlags::DEFAULT)?);
            p.push(st.elapsed().as_secs_f64() * 1e6);
        }
        let (h, q) = (median(&t), median(&p));
        row(
            res,
            "host_pool_vs_pinned_pool",
            "median".into(),
            bytes,
            "us",
            [h, q, q / h],
        );
    }
    Ok(())
}

fn cold_pin(res: &mut BenchResults, cfg: &Config) -> Result<()> {
    let sizes: &[u64] = if cfg.quick {
        &[256 * MIB]
    } else {
        &[256 * MIB, GIB]
    };
    let s = Stream::non_blocking()?;
    for &bytes in sizes {
        let b = bytes as usize;
        progress(&format!("cold pinning {}", fmt_size(bytes)));
        let reps = 3;
        let mut host_alloc = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            let code = unsafe { sys::cudaHostAlloc(&mut p, b, 0) };
            raw::check(code, || "cudaHostAlloc".into())?;
            host_alloc.push(t.elapsed().as_secs_f64() * 1e3);
            // SAFETY: allocated above, unused.
            raw::check(unsafe { sys::cudaFreeHost(p) }, || "cudaFreeHost".into())?;
        }
        let reference = median(&host_alloc);
        let thread_counts: &[usize] = if cfg.quick { &[8, 16] } else { &[4, 8, 12, 16] };
        // Populate modes: 0 one write per page (the library's), 1
        // madvise(MADV_POPULATE_WRITE), 2 MAP_POPULATE (one thread).
        for mode in [0u8, 1, 2] {
            cuda_mem::measure::set_populate_mode(mode);
            for huge in [false, true] {
                for &threads in thread_counts {
                    if mode == 2 && threads != thread_counts[0] {
                        continue;
                    }
                    let strategy = PinStrategy::MapRegister {
                        threads,
                        huge_pages: huge,
                    };
                    let (mut a, mut f, mut ph) = (Vec::new(), Vec::new(), Vec::new());
                    for _ in 0..reps {
                        let t = Instant::now();
                        let buf = PinnedBuffer::<u8>::with_strategy(
                            b,
                            HostAllocFlags::DEFAULT,
                            strategy,
                        )?;
                        a.push(t.elapsed().as_secs_f64() * 1e3);
                        ph.push(cuda_mem::measure::last_pin_phases());
                        let t = Instant::now();
                        buf.free()?;
                        f.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                    let ours = median(&a);
                    let how = ["touch", "madvise", "map_populate"][mode as usize];
                    let c = format!("threads={threads} huge={huge} populate={how}");
                    row(
                        res,
                        "cold_pin",
                        c.clone(),
                        bytes,
                        "ms",
                        [ours, reference, reference / ours],
                    );
                    let ms = |i: usize| {
                        median(
                            &ph.iter()
                                .map(|p| p[i].as_secs_f64() * 1e3)
                                .collect::<Vec<_>>(),
                        )
                    };
                    progress(&format!(
                        "  phases {c}: map {:.2} ms, populate {:.2} ms, register {:.2} ms",
                        ms(0),
                        ms(1),
                        ms(2)
                    ));
                    row(
                        res,
                        "cold_pin_register",
                        c.clone(),
                        bytes,
                        "ms",
                        [ms(2), f64::NAN, f64::NAN],
                    );
                    row(
                        res,
                        "cold_pin_free",
                        c,
                        bytes,
                        "ms",
                        [median(&f), f64::NAN, f64::NAN],
                    );
                }
            }
        }
        cuda_mem::measure::set_populate_mode(0);
        // Copy bandwidth and data from such a buffer against cudaHostAlloc memory.
        let strategy = PinStrategy::Auto;
        let mut ours = PinnedBuffer::<u8>::with_strategy(b, HostAllocFlags::DEFAULT, strategy)?;
        let mut theirs = PinnedBuffer::<u8>::zeroed(b, HostAllocFlags::DEFAULT)?;
        for (i, x) in ours.as_mut_slice()?.iter_mut().enumerate() {
            *x = (i * 7 + i / 4093) as u8;
        }
        theirs.as_mut_slice()?.fill(3);
        let mut dev = DeviceBuffer::<u8>::uninit(b)?;
        let (mut o, mut r, mut od, mut rd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            let t = Instant::now();
            f()?;
            s.synchronize()?;
            Ok(gbps(bytes, t.elapsed().as_secs_f64()))
        };
        for i in 0..8 {
            let a = time(&mut || copy_async(&mut dev, &ours, &s))?;
            let c = time(&mut || copy_async(&mut dev, &theirs, &s))?;
            let d = time(&mut || copy_async(&mut ours, &dev, &s))?;
            let e = time(&mut || copy_async(&mut theirs, &dev, &s))?;
            if i > 0 {
                o.push(a);
                r.push(c);
                od.push(d);
                rd.push(e);
            }
        }
        let (go, gr) = (median(&o), median(&r));
        row(
            res,
            "cold_pin_copy",
            "h2d auto".into(),
            bytes,
            "GB/s",
            [go, gr, go / gr],
        );
        let (go, gr) = (median(&od), median(&rd));
        row(
            res,
            "cold_pin_copy",
            "d2h auto".into(),
            bytes,
            "GB/s",
            [go, gr, go / gr],
        );
        // The data crosses intact: a pattern from `ours` through the device into `theirs`.
        for (i, x) in ours.as_mut_slice()?.iter_mut().enumerate() {
            *x = (i * 7 + i / 4093) as u8;
        }
        copy_async(&mut dev, &ours, &s)?;
        copy_async(&mut theirs, &dev, &s)?;
        res.checks.push(Check {
            what: format!("mapped-and-registered round trip, {}", fmt_size(bytes)),
            bytes,
            ok: ours.as_slice()? == theirs.as_slice()?,
            detail: None,
        });
    }
    Ok(())
}

/// Wall-clock seconds of one synchronous copy, median of `samples` after one warm-up.
fn time_copy(samples: u32, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    op()?;
    let mut t = Vec::new();
    for _ in 0..samples {
        let s = Instant::now();
        op()?;
        t.push(s.elapsed().as_secs_f64());
    }
    Ok(median(&t))
}

/// Interleaved samples of `N` synchronous copies, `op(k)` running copy `k` (each run `reps`
/// times per sample), after one warm-up of each: per copy, the seconds of every sample.
fn interleaved<const N: usize>(
    samples: u32,
    reps: u32,
    mut op: impl FnMut(usize) -> Result<()>,
) -> Result<[Vec<f64>; N]> {
    let mut t: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    for i in 0..=samples {
        for (k, tk) in t.iter_mut().enumerate() {
            let s = Instant::now();
            for _ in 0..reps {
                op(k)?;
            }
            if i > 0 {
                tk.push(s.elapsed().as_secs_f64() / f64::from(reps));
            }
        }
    }
    Ok(t)
}

/// The median over interleaved samples of `r[i] / o[i]` (> 1: `o` is faster).
fn ratio(o: &[f64], r: &[f64]) -> f64 {
    median(&o.iter().zip(r).map(|(o, r)| r / o).collect::<Vec<_>>())
}

fn staged(res: &mut BenchResults, cfg: &Config, cores: usize) -> Result<()> {
    let max = cfg
        .sizes
        .iter()
        .copied()
        .max()
        .unwrap_or(GIB)
        .max(256 * MIB) as usize;
    let src: Vec<u8> = (0..max).map(|i| (i * 13 + i / 4099) as u8).collect();
    let mut back = vec![0u8; max];
    let mut dev = DeviceBuffer::<u8>::uninit(max)?;
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    set_auto_staging(false);

    // What the process-wide stager measured and chose (it starts here if nothing did yet).
    progress("staged copies: the process-wide stager's configuration");
    let t = Instant::now();
    let setup = cuda_mem::staged_config()?;
    let first = t.elapsed().as_secs_f64() * 1e3;
    progress(&format!("  {setup}"));
    if let Some(cal) = &setup.calibration {
        let took = cal.took.as_secs_f64() * 1e3;
        progress(&format!(
            "  calibration: {took:.1} ms ({first:.1} ms for the first call, workers included)"
        ));
        for p in &cal.points {
            progress(&format!(
                "    {} {}: {:.2} GB/s",
                p.what,
                fmt_size(p.bytes as u64),
                p.gbps()
            ));
        }
        // Reference: the 50 ms budget.
        row(
            res,
            "staged_calibration",
            format!("{setup}"),
            0,
            "ms",
            [took, 50.0, 50.0 / took],
        );
    }
    let global = Stager::global().ok_or_else(|| {
        cuda_mem::Error::from(cuda_mem::Misuse::InvalidArgument {
            op: "Stager::global",
            reason: "the process-wide stager did not start".into(),
        })
    })?;

    // The sweep: threads × largest chunk × chunks per thread × store kind × depth.
    progress("staged copies: parameter sweep");
    let mut threads: Vec<usize> = [8, 12, 16].into_iter().filter(|&t| t <= cores).collect();
    if !threads.contains(&cores) {
        threads.push(cores);
    }
    let sweep_sizes: Vec<usize> = [16 * MIB, 64 * MIB, 256 * MIB, GIB]
        .into_iter()
        .map(|b| b as usize)
        .filter(|&b| b <= max && (!cfg.quick || b <= 64 * MIB as usize))
        .collect();
    for &n in &sweep_sizes {
        let samples = 3;
        let d_h2d = time_copy(samples, || copy(&mut dev.slice_mut(..n)?, &src[..n]))?;
        let d_d2h = time_copy(samples, || copy(&mut back[..n], &dev.slice(..n)?))?;
        // (largest chunk, chunks per thread, non-temporal stores, depth)
        let mut variants = Vec::new();
        for max_chunk in [1usize << 20, 2 << 20, 4 << 20, 8 << 20] {
            for nt in [true, false] {
                variants.push((max_chunk, 4, nt, 2));
            }
        }
        for nt in [true, false] {
            variants.push((4 << 20, 8, nt, 2));
            variants.push((4 << 20, 4, nt, 3));
        }
        if cfg.quick {
            variants.retain(|&(max_chunk, per, _, depth)| {
                per == 4 && max_chunk == 4 << 20 && depth == 2
            });
        }
        for &t in &threads {
            for &(max_chunk, per, nt, depth) in &variants {
                let c = StagingConfig {
                    threads: t,
                    chunk_bytes: max_chunk,
                    min_chunk_bytes: (256 << 10).min(max_chunk),
                    chunks_per_thread: per,
                    depth,
                    ..StagingConfig::default()
                }
                .with_min_bytes(0)
                .with_nt_stores(nt);
                let st = Stager::new(c, pool.clone())?;
                let h = time_copy(samples, || st.copy(&mut dev.slice_mut(..n)?, &src[..n]))?;
                let d = time_copy(samples, || st.copy(&mut back[..n], &dev.slice(..n)?))?;
                let name = format!(
                    "threads={t} max_chunk={} per_thread={per} nt={nt} depth={depth} (chunk {})",
                    fmt_size(max_chunk as u64),
                    fmt_size(c.chunk_for(n) as u64)
                );
                let nb = n as u64;
                let h2d = [gbps(nb, h), gbps(nb, d_h2d), d_h2d / h];
                row(res, "staged_sweep_h2d", name.clone(), nb, "GB/s", h2d);
                let d2h = [gbps(nb, d), gbps(nb, d_d2h), d_d2h / d];
                row(res, "staged_sweep_d2h", name, nb, "GB/s", d2h);
            }
        }
    }

    // Every size: the process-wide stager (its measured configuration: the driver's path below
    // its thresholds), and below 64 MiB the same forced to stage at every size, against the
    // driver.
    let forced = Stager::new(setup.config.with_min_bytes(0), pool.clone())?;
    progress("staged copies: the process-wide stager and the driver, every size");
    for &bytes in &cfg.sizes {
        let b = bytes as usize;
        let samples = if bytes >= 256 * MIB {
            5
        } else {
            cfg.samples.max(7)
        };
        let reps = ((64 * MIB) / bytes).clamp(1, 200) as u32;
        let paths = [
            ("staged_h2d", "staged_d2h", global),
            ("staged_forced_h2d", "staged_forced_d2h", &forced),
        ];
        for (th, td, stager) in paths {
            if std::ptr::eq(stager, &forced) && bytes >= 64 * MIB {
                continue; // staged by the measured configuration too
            }
            let [h, hd, d, dd] = interleaved::<4>(samples, reps, |k| match k {
                0 => stager.copy(&mut dev.slice_mut(..b)?, &src[..b]),
                1 => copy(&mut dev.slice_mut(..b)?, &src[..b]),
                2 => stager.copy(&mut back[..b], &dev.slice(..b)?),
                _ => copy(&mut back[..b], &dev.slice(..b)?),
            })?;
            let g = |v: &[f64]| gbps(bytes, median(v));
            let cfgname = if std::ptr::eq(stager, global) {
                "measured configuration"
            } else {
                "forced from 0 B"
            };
            row(
                res,
                th,
                cfgname.into(),
                bytes,
                "GB/s",
                [g(&h), g(&hd), ratio(&h, &hd)],
            );
            row(
                res,
                td,
                cfgname.into(),
                bytes,
                "GB/s",
                [g(&d), g(&dd), ratio(&d, &dd)],
            );
        }
    }

    // The issue 21 rows: staged (the process-wide stager) against the driver and against
    // pinned memory, at 2 MiB, 64 MiB, 256 MiB and 1 GiB, interleaved in one loop; and against
    // the memcpy ceiling measured at the start of the section.
    staged_against_pinned(res, cfg, global, &src, &mut back, &mut dev)?;
    // The store kinds the process-wide stager chose for large copies, trying both on the
    // first ones (ours: the chosen kind's GB/s in its trials; reference: the other kind's).
    for c in cuda_mem::staged_config()?.large_copies {
        let dir = if c.to_device { "h2d" } else { "d2h" };
        let (chosen, other) = if c.nt_stores {
            (c.gbps_nt, c.gbps_plain)
        } else {
            (c.gbps_plain, c.gbps_nt)
        };
        row(
            res,
            "staged_large_store_kind",
            format!("{dir} nt={}", c.nt_stores),
            c.from_bytes as u64,
            "GB/s",
            [chosen, other, chosen / other],
        );
    }

    set_auto_staging(true);
    // Data check of the staged path at the largest size.
    global.copy(&mut dev, &src)?;
    back.fill(0);
    global.copy(&mut back, &dev)?;
    res.checks.push(Check {
        what: format!("staged round trip, {}", fmt_size(max as u64)),
        bytes: max as u64,
        ok: back == src,
        detail: None,
    });
    Ok(())
}

/// `staged_vs_pinned_{h2d,d2h}` rows (ours: the process-wide stager; reference: pinned
/// memory's `cudaMemcpy` in the same loop; ratio ours / pinned, target ≥ 0.9 from 256 MiB),
/// `staged_vs_driver_*` (reference: the driver's pageable copy; target ≥ 1.2 at 2 MiB where
/// the machine allows, ≥ 0.97 everywhere) and `staged_vs_memcpy_*` (reference: the all-core
/// memcpy ceiling of this run, ordinary stores; target ≥ 0.8).
fn staged_against_pinned(
    res: &mut BenchResults,
    cfg: &Config,
    stager: &Stager,
    src: &[u8],
    back: &mut [u8],
    dev: &mut DeviceBuffer<u8>,
) -> Result<()> {
    let max = src.len();
    let sizes: Vec<usize> = [2 * MIB, 64 * MIB, 256 * MIB, GIB]
        .into_iter()
        .map(|b| b as usize)
        .filter(|&b| b <= max && (!cfg.quick || b <= 256 * MIB as usize))
        .collect();
    let Some(&top) = sizes.last() else {
        return Ok(());
    };
    progress("staged copies against pinned memory and the driver");
    let mut pinned =
        PinnedBuffer::<u8>::with_strategy(top, HostAllocFlags::DEFAULT, PinStrategy::Auto)?;
    pinned.as_mut_slice()?.copy_from_slice(&src[..top]);
    let ceiling = res
        .host
        .iter()
        .filter(|h| h.test == "memcpy" && h.config.ends_with(" std"))
        .map(|h| h.ours)
        .fold(f64::NAN, f64::max);
    let legacy = Stream::legacy_default();
    for &b in &sizes {
        let bytes = b as u64;
        let samples = if b >= 256 << 20 { 5 } else { 9 };
        let reps = ((64 * MIB) / bytes).clamp(1, 20) as u32;
        let [sh, dh, ph, sd, dd, pd] = interleaved::<6>(samples, reps, |k| match k {
            0 => stager.copy(&mut dev.slice_mut(..b)?, &src[..b]),
            1 => copy(&mut dev.slice_mut(..b)?, &src[..b]),
            2 => {
                cuda_mem::copy_range(dev, 0, &pinned, 0, b)?;
                legacy.synchronize()
            }
            3 => stager.copy(&mut back[..b], &dev.slice(..b)?),
            4 => copy(&mut back[..b], &dev.slice(..b)?),
            _ => {
                cuda_mem::copy_range(&mut pinned, 0, &*dev, 0, b)?;
                legacy.synchronize()
            }
        })?;
        let g = |v: &[f64]| gbps(bytes, median(v));
        for (dir, s, d, p) in [("h2d", &sh, &dh, &ph), ("d2h", &sd, &dd, &pd)] {
            let (vs_driver, vs_pinned) = (ratio(s, d), ratio(s, p));
            let name = |what: &str| -> &'static str {
                match (what, dir) {
                    ("driver", "h2d") => "staged_vs_driver_h2d",
                    ("driver", _) => "staged_vs_driver_d2h",
                    ("pinned", "h2d") => "staged_vs_pinned_h2d",
                    ("pinned", _) => "staged_vs_pinned_d2h",
                    (_, "h2d") => "staged_vs_memcpy_h2d",
                    _ => "staged_vs_memcpy_d2h",
                }
            };
            let c = "process-wide stager".to_string();
            row(
                res,
                name("driver"),
                c.clone(),
                bytes,
                "GB/s",
                [g(s), g(d), vs_driver],
            );
            row(
                res,
                name("pinned"),
                c.clone(),
                bytes,
                "GB/s",
                [g(s), g(p), vs_pinned],
            );
            row(
                res,
                name("memcpy"),
                c,
                bytes,
                "GB/s",
                [g(s), ceiling, g(s) / ceiling],
            );
        }
    }
    Ok(())
}
