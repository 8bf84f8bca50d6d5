//! NVIDIA bandwidthTest's shmoo (`--mode=shmoo --memory=pinned`), ours beside raw: at each of
//! its 80 sizes from 1 kB to 64 MB (decimal steps: 1 kB up to 20 kB, 2 kB up to 50 kB, 10 kB
//! up to 100 kB, 100 kB up to 1 MB, 1 MB up to 16 MB, 2 MB up to 32 MB, 4 MB up to 64 MB), a
//! loop of 100 asynchronous copies of pinned memory on the legacy default stream between two
//! events, host to device, device to host and device to device, as bandwidthTest times them:
//! no blocking kernel, so small copies are bound by how fast the host enqueues, and every
//! 0.1 µs of a call shows. Ours is `copy_range_async`, raw `cudaMemcpyAsync` with the same
//! pointers. Device to device counts each byte twice (read and write), as bandwidthTest does.
//!
//! Method: one untimed pass over every size, then `rounds` rounds; in each, every size of
//! every direction is timed once through each path, back to back, which path first
//! alternating from round to round. Per size: the median GB/s of each path and the speed ratio
//! (interquartile mean over the rounds' pairs of raw time / our time). Per band (1-20 kB,
//! 22 kB-1 MB, 2-64 MB): the geometric means of the sizes' GB/s and ratios. And the lowest
//! ratio of any one size. Issue 21's targets: at least 0.98 per band, 0.95 at every size.

use std::os::raw::c_void;

use cuda_mem::sys::cudaMemcpyKind as K;
use cuda_mem::{copy_range, copy_range_async, DeviceBuffer, HostAllocFlags, PinnedBuffer, Result};

use super::{progress, raw, Ctx, Paired};
use crate::results::{BenchResults, Check, HostRow};
use crate::units::gbps;

/// Copies per timed loop (bandwidthTest's `MEMCOPY_ITERATIONS`).
pub const COPIES: u32 = 100;

/// The bands a summary row is made for: name, first and last size (bytes, inclusive).
pub const BANDS: [(&str, u64, u64); 3] = [
    ("1-20 kB", 1_000, 20_000),
    ("22 kB-1 MB", 22_000, 1_000_000),
    ("2-64 MB", 2_000_000, 64_000_000),
];

/// bandwidthTest's shmoo sizes, ascending (its loop's 81st size, 68 MB, past its own 64 MB
/// maximum, is left out).
pub fn sizes() -> Vec<u64> {
    let mut v = Vec::new();
    let mut size = 0u64;
    while size < 64_000_000 {
        size += match size {
            s if s < 20_000 => 1_000,
            s if s < 50_000 => 2_000,
            s if s < 100_000 => 10_000,
            s if s < 1_000_000 => 100_000,
            s if s < 16_000_000 => 1_000_000,
            s if s < 32_000_000 => 2_000_000,
            _ => 4_000_000,
        };
        v.push(size);
    }
    v
}

/// Rounds of a full run and of a quick one.
pub fn rounds(quick: bool) -> u32 {
    if quick {
        3
    } else {
        6
    }
}

/// One direction's name and copy kind.
const DIRECTIONS: [(&str, K); 3] = [
    ("shmoo_h2d", K::cudaMemcpyHostToDevice),
    ("shmoo_d2h", K::cudaMemcpyDeviceToHost),
    ("shmoo_d2d", K::cudaMemcpyDeviceToDevice),
];

/// The buffers: pinned host, and two device buffers, of the largest size.
struct Buffers {
    host: PinnedBuffer<u8>,
    dev: DeviceBuffer<u8>,
    dev2: DeviceBuffer<u8>,
}

impl Buffers {
    /// One copy of `n` bytes in direction `kind` on the legacy stream of `ctx`, ours or raw.
    fn copy(&mut self, ctx: &Ctx, kind: K, n: usize, ours: bool) -> Result<()> {
        let s = &ctx.stream;
        if ours {
            return match kind {
                K::cudaMemcpyHostToDevice => {
                    copy_range_async(&mut self.dev, 0, &self.host, 0, n, s)
                }
                K::cudaMemcpyDeviceToHost => {
                    copy_range_async(&mut self.host, 0, &self.dev, 0, n, s)
                }
                _ => copy_range_async(&mut self.dev2, 0, &self.dev, 0, n, s),
            };
        }
        let h: *mut c_void = self.host.as_mut_ptr().cast();
        let d: *mut c_void = self.dev.as_mut_ptr().cast();
        let d2: *mut c_void = self.dev2.as_mut_ptr().cast();
        let (dst, src) = match kind {
            K::cudaMemcpyHostToDevice => (d, h),
            K::cudaMemcpyDeviceToHost => (h, d),
            _ => (d2, d),
        };
        // SAFETY: `n` bytes lie in every buffer (all hold the largest size); every timed loop
        // waits for its copies (`Ctx::time`) before the buffers are used otherwise or freed.
        unsafe { raw::memcpy(dst, src.cast_const(), n, kind, Some(s)) }
    }
}

/// Runs the shmoo in the three directions.
pub fn run(ctx: &Ctx, quick: bool, res: &mut BenchResults) -> Result<()> {
    let sizes = sizes();
    let max = sizes.iter().copied().max().unwrap_or(0) as usize;
    let mut b = Buffers {
        host: PinnedBuffer::zeroed(max, HostAllocFlags::DEFAULT)?,
        dev: DeviceBuffer::zeroed(max)?,
        dev2: DeviceBuffer::zeroed(max)?,
    };
    let rounds = rounds(quick);
    // times[direction][size] = (ours, raw): seconds per loop of COPIES copies.
    let mut times = vec![vec![(Vec::new(), Vec::new()); sizes.len()]; DIRECTIONS.len()];
    for round in 0..=rounds {
        progress(&if round == 0 {
            format!(
                "shmoo: warm-up, {} sizes, {COPIES} copies each",
                sizes.len()
            )
        } else {
            format!("shmoo: round {round} of {rounds}")
        });
        for (d, &(_, kind)) in DIRECTIONS.iter().enumerate() {
            for (i, &bytes) in sizes.iter().enumerate() {
                let n = bytes as usize;
                let order = if round % 2 == 0 {
                    [true, false]
                } else {
                    [false, true]
                };
                for ours in order {
                    let t = ctx.time(COPIES, false, &mut || b.copy(ctx, kind, n, ours))?;
                    if round > 0 {
                        let (o, r) = &mut times[d][i];
                        if ours { o } else { r }.push(t);
                    }
                }
            }
        }
    }
    for (d, &(test, _)) in DIRECTIONS.iter().enumerate() {
        let factor = if test == "shmoo_d2d" { 2 } else { 1 };
        let rows: Vec<HostRow> = sizes
            .iter()
            .zip(&times[d])
            .map(|(&bytes, (o, r))| {
                let p = Paired::new(o, r);
                let moved = factor * bytes * u64::from(COPIES);
                HostRow {
                    test,
                    config: String::new(),
                    bytes,
                    unit: "GB/s",
                    ours: gbps(moved, p.ours),
                    reference: gbps(moved, p.raw),
                    ratio: 1.0 / p.ratio,
                }
            })
            .collect();
        let summary = summarize(test, &rows);
        for r in &summary {
            progress(&format!(
                "  {test} {}: {:.2} GB/s, raw {:.2} GB/s, ratio {:.3}",
                r.config, r.ours, r.reference, r.ratio
            ));
        }
        res.shmoo.extend(rows);
        res.shmoo.extend(summary);
    }

    // The copies land: a pattern host -> device -> device -> host through our path.
    let pattern = |i: usize| (i as u8).wrapping_mul(13) ^ 0x3c;
    for (i, x) in b.host.as_mut_slice()?.iter_mut().enumerate() {
        *x = pattern(i);
    }
    let s = &ctx.stream;
    copy_range_async(&mut b.dev, 0, &b.host, 0, max, s)?;
    copy_range_async(&mut b.dev2, 0, &b.dev, 0, max, s)?;
    b.dev.memset(0)?;
    let mut back = vec![0u8; max];
    copy_range(&mut back, 0, &b.dev2, 0, max)?;
    let bad = back.iter().enumerate().find(|&(i, &x)| x != pattern(i));
    res.checks.push(Check {
        what: "shmoo copies (h2d, d2d, read back)".into(),
        bytes: max as u64,
        ok: bad.is_none(),
        detail: bad.map(|(i, &x)| format!("byte {i}: got {x:#04x}, expected {:#04x}", pattern(i))),
    });
    Ok(())
}

/// The summary rows of one direction's per-size `rows`: per band, the geometric means
/// (`config` "band ..."), then the size with the lowest ratio (`config` "lowest ratio").
pub fn summarize(test: &'static str, rows: &[HostRow]) -> Vec<HostRow> {
    let geomean = |v: &[f64]| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
    let mut out = Vec::new();
    for (name, lo, hi) in BANDS {
        let band: Vec<&HostRow> = rows
            .iter()
            .filter(|r| (lo..=hi).contains(&r.bytes))
            .collect();
        if band.is_empty() {
            continue;
        }
        let pick = |f: fn(&HostRow) -> f64| geomean(&band.iter().map(|r| f(r)).collect::<Vec<_>>());
        out.push(HostRow {
            test,
            config: format!("band {name} (geometric mean of {} sizes)", band.len()),
            bytes: hi,
            unit: "GB/s",
            ours: pick(|r| r.ours),
            reference: pick(|r| r.reference),
            ratio: pick(|r| r.ratio),
        });
    }
    if let Some(low) = rows
        .iter()
        .filter(|r| r.ratio.is_finite())
        .min_by(|a, b| a.ratio.total_cmp(&b.ratio))
    {
        out.push(HostRow {
            config: "lowest ratio of any size".into(),
            ..low.clone()
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_bandwidth_tests() {
        let s = sizes();
        assert_eq!(s.len(), 80);
        assert_eq!(&s[..3], &[1_000, 2_000, 3_000]);
        assert_eq!(s[19], 20_000);
        assert_eq!(s[20], 22_000);
        assert_eq!(s[34], 50_000);
        assert_eq!(s[35], 60_000);
        assert_eq!(s[39], 100_000);
        assert_eq!(s[40], 200_000);
        assert_eq!(s[48], 1_000_000);
        assert_eq!(s[49], 2_000_000);
        assert_eq!(*s.last().unwrap(), 64_000_000);
        // Every size falls in exactly one band.
        for x in &s {
            assert_eq!(
                BANDS
                    .iter()
                    .filter(|(_, lo, hi)| (lo..=hi).contains(&x))
                    .count(),
                1,
                "{x}"
            );
        }
    }

    #[test]
    fn summary_takes_geometric_means_per_band_and_the_lowest_ratio() {
        let row = |bytes, ratio| HostRow {
            test: "shmoo_h2d",
            config: String::new(),
            bytes,
            unit: "GB/s",
            ours: ratio * 10.0,
            reference: 10.0,
            ratio,
        };
        let rows = [
            row(1_000, 0.5),
            row(20_000, 2.0),
            row(22_000, 0.97),
            row(64_000_000, 1.0),
        ];
        let s = summarize("shmoo_h2d", &rows);
        assert_eq!(s.len(), 4);
        assert!((s[0].ratio - 1.0).abs() < 1e-12, "{}", s[0].ratio);
        assert!((s[0].ours - 10.0).abs() < 1e-9);
        assert!(s[0]
            .config
            .starts_with("band 1-20 kB (geometric mean of 2 sizes)"));
        assert!((s[1].ratio - 0.97).abs() < 1e-12);
        assert_eq!(s[2].bytes, 64_000_000);
        assert_eq!(s[3].bytes, 1_000);
        assert_eq!(s[3].ratio, 0.5);
        assert_eq!(s[3].config, "lowest ratio of any size");
    }
}
