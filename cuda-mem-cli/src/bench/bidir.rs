//! Copies both ways at once: host to device on one non-blocking stream and device to host on
//! another, so that two copy engines run together; the aggregate (bytes moved both ways over
//! the time of both) beside each direction alone on the same streams, ours (`copy_range_async`)
//! against raw `cudaMemcpyAsync` with the same pointers.
//!
//! Timed by the wall clock from the first enqueue until both streams are synchronized (CUDA
//! events time one stream), with enough copies per sample (512 MiB each way) that the enqueue
//! cost is noise at the sizes measured (4 MiB and up). Pinned host memory only: the other
//! kinds either stage through the driver or cross the bus by the SMs.

use std::os::raw::c_void;
use std::time::Instant;

use cuda_mem::sys::cudaMemcpyKind as K;
use cuda_mem::{
    copy_range, copy_range_async, DeviceBuffer, HostAllocFlags, PinnedBuffer, Result, Stream,
};

use super::copies::{compare, fill};
use super::{progress, raw, reps_for, Config, Paired};
use crate::results::{BenchResults, BidirRow};
use crate::units::{fmt_size, gbps, median, MIB};

/// The sizes measured: 4 MiB to 1 GiB (64 and 256 MiB with `--quick`).
pub fn sizes(cfg: &Config) -> Vec<u64> {
    if cfg.quick {
        vec![64 * MIB, 256 * MIB]
    } else {
        vec![4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB]
    }
}

/// Which copies a sample queues.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    H2d,
    D2h,
    Both,
}

/// Seconds per repetition of `way`: `reps` times the copies queued (for `Both`, alternating
/// between the two streams), then both streams synchronized. Whatever happens, both streams
/// are synchronized when it returns, so the pointers the copies use stay valid.
fn sample(
    reps: u32,
    way: Way,
    s: [&Stream; 2],
    h2d: &mut dyn FnMut() -> Result<()>,
    d2h: &mut dyn FnMut() -> Result<()>,
) -> Result<f64> {
    let t = Instant::now();
    let mut queue = || -> Result<()> {
        for _ in 0..reps {
            if way != Way::D2h {
                h2d()?;
            }
            if way != Way::H2d {
                d2h()?;
            }
        }
        Ok(())
    };
    let r = queue();
    let synced = s[0].synchronize().and(s[1].synchronize());
    r?;
    synced?;
    Ok(t.elapsed().as_secs_f64() / f64::from(reps))
}

/// Runs the bidirectional copies at each of `plan`'s sizes.
pub fn run(cfg: &Config, plan: &[u64], res: &mut BenchResults) -> Result<()> {
    let max = plan.iter().copied().max().unwrap_or(0) as usize;
    let words = max / 8;
    let mut src = PinnedBuffer::<u64>::zeroed(words, HostAllocFlags::DEFAULT)?;
    let mut dst = PinnedBuffer::<u64>::zeroed(words, HostAllocFlags::DEFAULT)?;
    let mut dev_in = DeviceBuffer::<u64>::zeroed(words)?;
    let mut dev_out = DeviceBuffer::<u64>::zeroed(words)?;
    let (s1, s2) = (Stream::non_blocking()?, Stream::non_blocking()?);
    let streams = [&s1, &s2];
    let src_raw: *const c_void = src.as_mut_ptr().cast_const().cast();
    let dst_raw: *mut c_void = dst.as_mut_ptr().cast();
    let dev_in_raw: *mut c_void = dev_in.as_mut_ptr().cast();
    let dev_out_raw: *const c_void = dev_out.as_ptr().cast();
    for &bytes in plan {
        progress(&format!(
            "both ways: pinned h2d + d2h, {} each",
            fmt_size(bytes)
        ));
        let (w, n) = ((bytes / 8) as usize, bytes as usize);
        let reps = reps_for(bytes);
        let mut ours_h2d = || copy_range_async(&mut dev_in, 0, &src, 0, w, &s1);
        let mut ours_d2h = || copy_range_async(&mut dst, 0, &dev_out, 0, w, &s2);
        // SAFETY: each buffer holds `words` words, at least `n` bytes, and lives past every
        // sample; `sample` synchronizes both streams before it returns, so no copy outlives
        // the call that queued it, and the host does not touch the buffers meanwhile.
        let mut raw_h2d =
            || unsafe { raw::memcpy(dev_in_raw, src_raw, n, K::cudaMemcpyHostToDevice, Some(&s1)) };
        // SAFETY: as above.
        let mut raw_d2h = || unsafe {
            raw::memcpy(
                dst_raw,
                dev_out_raw,
                n,
                K::cudaMemcpyDeviceToHost,
                Some(&s2),
            )
        };
        let mut time = |reps, way, ours: bool| {
            if ours {
                sample(reps, way, streams, &mut ours_h2d, &mut ours_d2h)
            } else {
                sample(reps, way, streams, &mut raw_h2d, &mut raw_d2h)
            }
        };
        // Warm-up, then interleaved samples: ours both ways, raw both ways, each way alone.
        time(1, Way::Both, true)?;
        time(1, Way::Both, false)?;
        let (mut a, mut b, mut h, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..cfg.samples {
            a.push(time(reps, Way::Both, true)?);
            b.push(time(reps, Way::Both, false)?);
            h.push(time(reps, Way::H2d, true)?);
            d.push(time(reps, Way::D2h, true)?);
        }
        let t = Paired::new(&a, &b);
        let row = BidirRow {
            bytes,
            reps,
            samples: cfg.samples,
            h2d_gbps: gbps(bytes, median(&h)),
            d2h_gbps: gbps(bytes, median(&d)),
            gbps: gbps(2 * bytes, t.ours),
            raw_gbps: gbps(2 * bytes, t.raw),
            ratio: 1.0 / t.ratio,
            spread: (gbps(2 * bytes, t.ours_q.1), gbps(2 * bytes, t.ours_q.0)),
        };
        progress(&format!(
            "  both ways {}: {:.1} GB/s aggregate (raw {:.1}); alone h2d {:.1}, d2h {:.1} GB/s",
            fmt_size(bytes),
            row.gbps,
            row.raw_gbps,
            row.h2d_gbps,
            row.d2h_gbps
        ));
        res.bidir.push(row);
    }

    // Verify: one pair of whole-buffer copies at once, each direction its own pattern.
    let (seed_in, seed_out) = (0xB1D1, 0xB1D2);
    fill(src.as_mut_slice()?, seed_in);
    let mut check = vec![0u64; words];
    fill(&mut check, seed_out);
    copy_range(&mut dev_out, 0, &check, 0, words)?;
    copy_range_async(&mut dev_in, 0, &src, 0, words, &s1)?;
    copy_range_async(&mut dst, 0, &dev_out, 0, words, &s2)?;
    check.fill(0);
    copy_range(&mut check, 0, &dev_in, 0, words)?;
    res.checks
        .push(compare("pinned h2d during d2h".into(), &check, seed_in));
    res.checks.push(compare(
        "pinned d2h during h2d".into(),
        dst.as_slice()?,
        seed_out,
    ));
    Ok(())
}
