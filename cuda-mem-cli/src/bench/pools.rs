//! Stream-ordered allocation (issue 11): allocation + free from memory pools, host wall clock,
//! ours and raw interleaved on the same pool in the same run, and copy bandwidth of host-pool
//! pinned memory.
//!
//! Rows (allocation kinds; the `device` row of [`super::alloc`] is `cudaMalloc` + `cudaFree`):
//!
//! - `pool_default_sync`: the device's default pool as CUDA ships it (release threshold 0,
//!   left untouched), each pair followed by a stream synchronize; raw: `cudaMallocAsync` +
//!   `cudaFreeAsync` + `cudaStreamSynchronize`.
//! - `pool_sync`: our pool ([`MemPool::new`], threshold at the maximum), synchronized per pair;
//!   raw: `cudaMallocFromPoolAsync` + `cudaFreeAsync` + synchronize on the same pool.
//! - `pool`: our pool without a synchronize: the cost of a pair on the host, timed in batches of
//!   [`BATCH`] pairs (the stream is synchronized between batches, untimed).
//! - `pool_bookkeeping_only`: ablation of `pool`: the raw pair with our host bookkeeping around
//!   it ([`cuda_mem::measure::PoolPair`]: the pool handle a pooled buffer keeps, its fence
//!   with the allocation stream and the allocation's mark, the free ordered after it), against
//!   the raw pair alone, batched as `pool`. Its overhead is the bookkeeping's share of `pool`'s; the rest is
//!   the buffer type around it.
//! - `host_pool`: pinned memory from a host-location pool, synchronized per pair; raw: the same
//!   calls on the same pool. Compare with the `pinned` row (`cudaHostAlloc` +
//!   `cudaFreeHost`) and with the host section's `host_pool_vs_pinned_pool` row (the
//!   [`cuda_mem::PinnedPool`]).
//!
//! Copy rows of kind `host_pool`: `copy_async` from and to host-pool memory; their "raw"
//! column is the same `copy_async` with `cudaHostAlloc` memory, so the ratio is host pool /
//! `cudaHostAlloc` bandwidth.
//!
//! The pinned pool's scaling with threads ([`pinned_pool_threads`], called by the host
//! section, whose rows they are): `pool_threads`, a cached [`PinnedPool`] allocation + free,
//! µs per pair per thread at 1, 2, 4, 8 and 16 threads allocating at once (issue 21 target:
//! ≤ 0.3 µs up to 16 threads), for a pool of its own and for the global pool.

use std::os::raw::c_void;
use std::sync::Barrier;
use std::time::Instant;

use cuda_mem::{copy_async, copy_range, sys, DeviceBuffer, HostAllocFlags, MemPool, PinnedBuffer};
use cuda_mem::{PinnedPool, Result, Stream};

use super::alloc::record;
use super::{attempt, copies, progress, raw, reps_for, sample_pairs, Config, Ctx, Order, Paired};
use crate::results::{BenchResults, HostRow};
use crate::units::{fmt_size, median, MIB};

/// The allocation kinds measured here.
pub const KINDS: [&str; 5] = [
    "pool_default_sync",
    "pool_sync",
    "pool",
    "pool_bookkeeping_only",
    "host_pool",
];

/// Pairs per timed sample of the unsynchronized `pool` row.
pub const BATCH: u32 = 200;

/// Host copy sizes are capped here: host-pool and `cudaHostAlloc` buffers of this size each.
const MAX_COPY: u64 = 256 * MIB;

/// One raw pair on `stream`: `cudaMallocAsync` (default pool) or `cudaMallocFromPoolAsync`,
/// then `cudaFreeAsync`, then a synchronize when `sync`.
fn raw_pair(pool: Option<&MemPool>, bytes: usize, stream: &Stream, sync: bool) -> Result<()> {
    let mut p: *mut c_void = std::ptr::null_mut();
    let code = match pool {
        // SAFETY: valid out-pointer; live pool and stream handles.
        Some(pl) => unsafe {
            sys::cudaMallocFromPoolAsync(&mut p, bytes, pl.as_raw(), stream.as_raw())
        },
        // SAFETY: valid out-pointer; a live stream handle.
        None => unsafe { sys::cudaMallocAsync(&mut p, bytes, stream.as_raw()) },
    };
    raw::check(code, || format!("cudaMallocAsync({bytes})"))?;
    // SAFETY: `p` was just allocated on `stream` and is used by nothing; freed once.
    let code = unsafe { sys::cudaFreeAsync(p, stream.as_raw()) };
    raw::check(code, || "cudaFreeAsync".into())?;
    if sync {
        stream.synchronize()?;
    }
    Ok(())
}

/// One raw pair (no synchronize) with our bookkeeping around it.
fn bookkeeping_pair(
    pair: &cuda_mem::measure::PoolPair,
    pool: &MemPool,
    bytes: usize,
    stream: &Stream,
) -> Result<()> {
    pair.around(
        bytes,
        || {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid out-pointer; live pool and stream handles.
            let code = unsafe {
                sys::cudaMallocFromPoolAsync(&mut p, bytes, pool.as_raw(), stream.as_raw())
            };
            raw::check(code, || format!("cudaMallocFromPoolAsync({bytes})")).map(|()| p)
        },
        |p| {
            // SAFETY: `p` was just allocated on `stream` and is used by nothing; freed once.
            let code = unsafe { sys::cudaFreeAsync(p, stream.as_raw()) };
            raw::check(code, || "cudaFreeAsync".into())
        },
    )
}

/// One pair through our API.
fn ours_pair(pool: &MemPool, host: bool, bytes: usize, stream: &Stream, sync: bool) -> Result<()> {
    let len = bytes / 8;
    if host {
        // SAFETY: the uninitialised memory is never read; it is freed at once.
        unsafe { PinnedBuffer::<u64>::uninit_from_pool(pool, len, stream)? }.free()?;
    } else {
        DeviceBuffer::<u64>::from_pool(pool, len, stream)?.free()?;
    }
    if sync {
        stream.synchronize()?;
    }
    Ok(())
}

/// Interleaved samples of `batch` pairs each, µs per pair.
fn measure(
    samples: u32,
    batch: u32,
    stream: &Stream,
    ours: &mut dyn FnMut() -> Result<()>,
    raw: &mut dyn FnMut() -> Result<()>,
) -> Result<Paired> {
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let t = Instant::now();
        for _ in 0..batch {
            f()?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(batch);
        stream.synchronize()?;
        Ok(us)
    };
    let (a, b) = sample_pairs(samples, Order::OursFirst, |o| {
        time(if o { &mut *ours } else { &mut *raw })
    })?;
    Ok(Paired::new(&a, &b))
}

/// Runs the pool measurements.
pub fn run(ctx: &Ctx, cfg: &Config, res: &mut BenchResults) -> Result<()> {
    let stream = Stream::on(ctx.device, true)?;
    let default = MemPool::default_for(ctx.device);
    let ours = MemPool::new(ctx.device);
    let host = MemPool::host(ctx.device);
    for &(bytes, reps) in &cfg.alloc_plan {
        progress(&format!("pools: alloc + free {} x {reps}", fmt_size(bytes)));
        let n = bytes as usize;
        let samples = reps.max(5);
        type Row<'a> = (
            &'static str,
            &'a Result<MemPool>,
            bool,
            bool,
            u32,
            &'static str,
        );
        let rows: [Row; 4] = [
            (
                "pool_default_sync",
                &default,
                false,
                true,
                1,
                "default pool as shipped (release threshold 0), synchronized per pair",
            ),
            (
                "pool_sync",
                &ours,
                false,
                true,
                1,
                "our pool (threshold max), synchronized per pair",
            ),
            (
                "pool",
                &ours,
                false,
                false,
                BATCH,
                "our pool, no synchronize (target <= 1 us, ratio <= 1.10)",
            ),
            (
                "host_pool",
                &host,
                true,
                true,
                1,
                "pinned, host pool, synchronized per pair; against cudaHostAlloc: the pinned row",
            ),
        ];
        for (kind, pool, is_host, sync, batch, note) in rows {
            let r = match pool {
                Ok(pool) => {
                    // The default pool's raw side is plain cudaMallocAsync.
                    let raw_pool = (!pool.is_default()).then_some(pool);
                    measure(
                        samples,
                        batch,
                        &stream,
                        &mut || ours_pair(pool, is_host, n, &stream, sync),
                        &mut || raw_pair(raw_pool, n, &stream, sync),
                    )
                }
                Err(e) => Err(e.clone()),
            };
            record(res, kind, bytes, samples * batch, Some(note), r)?;
            if kind == "pool" {
                // Ablation of this row: the raw pair with only our bookkeeping around it.
                let r = match pool {
                    Ok(pool) => {
                        let pair = cuda_mem::measure::PoolPair::new(pool, &stream);
                        measure(
                            samples,
                            BATCH,
                            &stream,
                            &mut || bookkeeping_pair(&pair, pool, n, &stream),
                            &mut || raw_pair(Some(pool), n, &stream, false),
                        )
                    }
                    Err(e) => Err(e.clone()),
                };
                let note = "ablation of pool: the raw pair with only our bookkeeping around it \
                            (measure::PoolPair); µs - raw µs is its share";
                let kind = "pool_bookkeeping_only";
                record(res, kind, bytes, samples * BATCH, Some(note), r)?;
            }
        }
    }
    if let Ok(p) = &ours {
        p.trim(0)?;
    }
    progress("pools: host-pool copies against cudaHostAlloc");
    let r = match &host {
        Ok(pool) => host_pool_copies(ctx, cfg, res, pool, &stream),
        Err(e) => Err(e.clone()),
    };
    attempt(res, &["host_pool"], "copies", r)?;
    if let Ok(p) = &host {
        stream.synchronize()?;
        p.trim(0)?;
    }
    Ok(())
}

/// H2D and D2H bandwidth of host-pool memory against `cudaHostAlloc` memory, both through
/// `copy_async` on the held legacy stream, then a data check through the host pool.
fn host_pool_copies(
    ctx: &Ctx,
    cfg: &Config,
    res: &mut BenchResults,
    pool: &MemPool,
    stream: &Stream,
) -> Result<()> {
    let sizes: Vec<u64> = cfg
        .sizes
        .iter()
        .copied()
        .filter(|&b| b <= MAX_COPY)
        .collect();
    let Some(&max) = sizes.last() else {
        return Ok(());
    };
    let words = (max / 8) as usize;
    let mut pooled = PinnedBuffer::<u64>::from_pool(pool, words, stream)?;
    let mut alloc = PinnedBuffer::<u64>::zeroed(words, HostAllocFlags::DEFAULT)?;
    // One device buffer per side, so that the two closures borrow different buffers.
    let mut dev = DeviceBuffer::<u64>::zeroed(words)?;
    let mut dev_b = DeviceBuffer::<u64>::zeroed(words)?;
    let s = &ctx.stream;
    for &bytes in &sizes {
        let w = (bytes / 8) as usize;
        let reps = reps_for(bytes);
        let h2d = ctx.pair(
            cfg.samples,
            reps,
            true,
            &mut || cuda_mem::copy_range_async(&mut dev, 0, &pooled, 0, w, s),
            &mut || cuda_mem::copy_range_async(&mut dev_b, 0, &alloc, 0, w, s),
        )?;
        let d2h = ctx.pair(
            cfg.samples,
            reps,
            true,
            &mut || cuda_mem::copy_range_async(&mut pooled, 0, &dev, 0, w, s),
            &mut || cuda_mem::copy_range_async(&mut alloc, 0, &dev_b, 0, w, s),
        )?;
        for (dir, t) in [("h2d", h2d), ("d2h", d2h)] {
            res.copies
                .push(copies::row("host_pool", dir, bytes, cfg.samples, t));
        }
    }
    let last = &res.copies[res.copies.len() - 2..];
    progress(&format!(
        "  host_pool: {} h2d {:.1} GB/s (cudaHostAlloc {:.1}), d2h {:.1} GB/s (cudaHostAlloc {:.1})",
        fmt_size(max),
        last[0].gbps,
        last[0].raw_gbps,
        last[1].gbps,
        last[1].raw_gbps
    ));
    // Data check: a pattern through host pool -> device -> cudaHostAlloc -> device -> host pool.
    copies::fill(pooled.as_mut_slice()?, 0x4F4F);
    copy_async(&mut dev, &pooled, s)?;
    copy_async(&mut alloc, &dev, s)?;
    pooled.as_mut_slice()?.fill(0);
    dev_b.memset_async(0, s)?;
    copy_async(&mut dev_b, &alloc, s)?;
    copy_range(&mut pooled, 0, &dev_b, 0, words)?;
    let got = pooled.as_slice()?;
    res.checks.push(copies::compare(
        "host_pool h2d+d2h copies".into(),
        got,
        0x4F4F,
    ));
    Ok(())
}

/// Thread counts of the `pool_threads` rows.
pub const POOL_THREADS: [usize; 5] = [1, 2, 4, 8, 16];

/// µs per cached allocation + free of `bytes` on each of `threads` threads at once: each
/// thread makes its first block (a miss) and waits for the others, then times `pairs` pairs.
/// Returns the per-thread figures.
fn pairs_per_thread(
    pool: &PinnedPool,
    threads: usize,
    bytes: usize,
    pairs: u32,
) -> Result<Vec<f64>> {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<f64> {
                    let first = pool.alloc::<u8>(bytes, HostAllocFlags::DEFAULT);
                    drop(first);
                    barrier.wait();
                    let t = Instant::now();
                    for _ in 0..pairs {
                        let b = pool.alloc::<u8>(bytes, HostAllocFlags::DEFAULT)?;
                        drop(std::hint::black_box(b));
                    }
                    Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(pairs))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(Ok(f64::NAN)))
            .collect()
    })
}

/// The `pool_threads` rows: a cached 4 KiB allocation + free on 1..16 threads at once, µs per
/// pair per thread (the median over the threads; reference: the one-thread figure of the same
/// pool, measured just before; ratio = reference / ours, 1 = perfect scaling). Issue 21's
/// target is ≤ 0.3 µs at every count.
pub fn pinned_pool_threads(res: &mut BenchResults, quick: bool) -> Result<()> {
    let pairs = if quick { 20_000 } else { 100_000 };
    let own = PinnedPool::new(cuda_mem::PinnedPoolConfig::default());
    for (name, pool) in [("own pool", &own), ("global pool", PinnedPool::global())] {
        progress(&format!("pinned pool: alloc + free per thread, {name}"));
        let mut one = f64::NAN;
        for threads in POOL_THREADS {
            // Three rounds; the median of the per-thread medians.
            let mut rounds = Vec::new();
            let mut worst = 0f64;
            for _ in 0..3 {
                let per = pairs_per_thread(pool, threads, 4096, pairs)?;
                worst = per.iter().copied().fold(worst, f64::max);
                rounds.push(median(&per));
            }
            let us = median(&rounds);
            if threads == 1 {
                one = us;
            }
            let config = format!("threads={threads} {name}");
            progress(&format!(
                "  pool_threads {config}: {us:.3} us per pair per thread (slowest thread \
                 {worst:.3}; target <= 0.3)"
            ));
            res.host.push(HostRow {
                test: "pool_threads",
                config,
                bytes: 4096,
                unit: "us",
                ours: us,
                reference: one,
                ratio: one / us,
            });
        }
        let st = pool.stats();
        progress(&format!("  {name} stats: {st}"));
    }
    Ok(())
}
