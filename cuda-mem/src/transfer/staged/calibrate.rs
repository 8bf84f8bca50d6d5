//! Measuring the process-wide stager's configuration on this machine, once, at first use.
//!
//! Constants tuned on one host do not carry: on the 16-core H200 host staging paid from
//! 2 MiB, on the 32-core one device-to-host copies of 2–3 MiB ran at 0.75–1.1 of the driver;
//! non-temporal stores won one way and lost the other depending on the host. So the first
//! staged copy of the process measures, on scratch memory of its own (16 MiB of device and of
//! pageable host memory), in this order, each step with the choices of the steps before:
//!
//! 1. **Non-temporal stores**, per direction: staged copies of 16 MiB with and without;
//!    off only where that is at least 3% faster (the fallback is on).
//! 2. **Chunk size**: four or two chunks per worker (which sets the chunk size of copies
//!    between the smallest chunk's and the largest's: 256 KiB or 512 KiB at 16 MiB on 16
//!    workers, 1 or 2 MiB at 64 MiB), both directions summed; two only where at least 3%
//!    faster. Copies too small for that keep the smallest chunk, so the threshold's copies
//!    (step 4) are not cut coarser. All chunks are slices of one staging block per worker,
//!    so trying sizes makes no new pinned memory.
//! 3. **Workers**: all cores, or half of them (the driver serializes some of each chunk's
//!    calls, which costs more with many threads); half only where at least 5% faster.
//! 4. **Threshold**, per direction: the driver's pageable copy against the staged one at 2,
//!    4 and 8 MiB, interleaved, five pairs each; staged from the smallest size from which
//!    the staged copy is at least 1.1× the driver's (the median of the pairs' ratios) at every
//!    size measured; 16 MiB if at none. The search stops after two sizes in a row that win.
//!
//! Each figure is the median of its interleaved samples. The whole takes some tens of
//! milliseconds ([`Calibration::took`]); the fields the environment sets are not measured.
//! The smallest and largest chunk and the staging slots keep their fallback values (the
//! largest chunk matters for copies of hundreds of MiB, which take too long to measure at
//! first use; the bench's `staged_sweep` rows measure them).

use std::os::raw::c_void;
use std::time::{Duration, Instant};

use cuda_mem_sys as sys;

use super::config::{Fixed, StagingConfig};
use super::memcpy::nt_available;
use super::pipeline::Job;
use super::workers::Stager;
use super::Dir;
use crate::contract::size::fmt_bytes;
use crate::error::{check, Result};
use crate::handles::devices::Device;
use crate::handles::stream::Stream;

/// What calibration measured, and how long it took.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Calibration {
    /// Wall time of the whole calibration, the scratch memory and the workers' first staging
    /// blocks included.
    pub took: Duration,
    /// Every figure it compared, in order.
    pub points: Vec<CalibrationPoint>,
}

/// One figure of a [`Calibration`].
#[derive(Debug, Clone, PartialEq)]
pub struct CalibrationPoint {
    /// What was measured, e.g. `staged h2d nt=false` or `driver d2h`.
    pub what: String,
    /// Bytes per copy.
    pub bytes: usize,
    /// Median seconds per copy.
    pub seconds: f64,
}

impl CalibrationPoint {
    /// GB/s (1e9 bytes per second).
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }
}

impl std::fmt::Display for Calibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "calibrated in {:.1} ms:", self.took.as_secs_f64() * 1e3)?;
        for p in &self.points {
            write!(
                f,
                " {} {} {:.1} GB/s;",
                p.what,
                fmt_bytes(p.bytes),
                p.gbps()
            )?;
        }
        Ok(())
    }
}

/// Scratch memory of calibration: `bytes` of device memory (freed on drop) and of pageable
/// host memory.
struct Scratch {
    dev: *mut c_void,
    host: Vec<u8>,
    device: i32,
    /// Calibration's own stream (non-blocking).
    stream: Stream,
    /// Allocated in `stream`'s order (freed there), else by `cudaMalloc`.
    ordered: bool,
}

impl Scratch {
    /// The scratch memory and a stream of its own, the device side allocated in that
    /// stream's order where the device has memory pools (`cudaMalloc` else) and zeroed on
    /// it: not on the legacy stream, and not freed by `cudaFree`, both of which would wait
    /// for the application's work on the device.
    fn new(device: i32, bytes: usize) -> Result<Scratch> {
        let stream = Stream::on(Device::from_ordinal_unchecked(device), true)?;
        let _g = Device::from_ordinal_unchecked(device).guard()?;
        let mut dev = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; `bytes` is non-zero; the stream is alive.
        let ordered = unsafe { sys::cudaMallocAsync(&mut dev, bytes, stream.as_raw()) };
        let ordered = check(ordered, || "cudaMallocAsync".into()).is_ok();
        if !ordered {
            // SAFETY: as above.
            check(unsafe { sys::cudaMalloc(&mut dev, bytes) }, || {
                format!("cudaMalloc({}) (staged-copy calibration)", fmt_bytes(bytes))
            })?;
        }
        let scratch = Scratch {
            dev,
            host: vec![0x5a; bytes],
            device,
            stream,
            ordered,
        };
        // SAFETY: `dev` holds `bytes` bytes (allocated on this stream, or already); nothing
        // else uses it; the stream is alive.
        let code = unsafe { sys::cudaMemsetAsync(dev, 0, bytes, scratch.stream.as_raw()) };
        check(code, || "cudaMemsetAsync (staged-copy calibration)".into())?;
        scratch.stream.synchronize()?;
        Ok(scratch)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`; every copy and memset of it has completed (each is
        // waited for before the next step), so the free, queued or not, follows them all.
        // Errors are ignored: drop never panics.
        unsafe {
            if self.ordered {
                sys::cudaFreeAsync(self.dev, self.stream.as_raw())
            } else {
                sys::cudaFree(self.dev)
            }
        };
    }
}

/// The measurements of one calibration.
struct Bench<'a> {
    stager: &'a Stager,
    s: Scratch,
    points: Vec<CalibrationPoint>,
}

impl Bench<'_> {
    /// Seconds of one staged copy of `bytes` with `cfg` (the threshold ignored).
    fn staged(&mut self, cfg: &StagingConfig, dir: Dir, bytes: usize) -> Result<f64> {
        let (dev, host) = (self.s.dev as usize, self.s.host.as_mut_ptr() as usize);
        let p = self
            .stager
            .params(cfg, dir, self.s.device, dev, host, bytes);
        let t = Instant::now();
        // The scratch memory is this calibration's alone, and stays valid until `run`
        // returns, which it does once every chunk's copy has completed.
        self.stager.run(Job::new(p))?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// Seconds of the driver's copy of `bytes` of pageable memory (`cudaMemcpyAsync` on a
    /// non-blocking stream of calibration's own, then a synchronize of that stream: the
    /// driver's pageable path, as [`copy`](crate::copy) takes it, without waiting behind other
    /// work on the legacy stream, which would make the driver look slower than it is).
    fn driver(&mut self, dir: Dir, bytes: usize) -> Result<f64> {
        let host = self.s.host.as_mut_ptr().cast::<c_void>();
        let (dst, src, kind) = match dir {
            Dir::ToDevice => (
                self.s.dev,
                host.cast_const(),
                sys::cudaMemcpyKind::cudaMemcpyHostToDevice,
            ),
            Dir::ToHost => (
                host,
                self.s.dev.cast_const(),
                sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
            ),
        };
        let t = Instant::now();
        // SAFETY: both ranges hold `bytes` bytes of this calibration's scratch memory, used
        // by nothing else until the synchronize below; the stream is alive.
        let code = unsafe { sys::cudaMemcpyAsync(dst, src, bytes, kind, self.s.stream.as_raw()) };
        check(code, || "cudaMemcpyAsync (staged-copy calibration)".into())?;
        self.s.stream.synchronize()?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// Median seconds of each candidate configuration for a staged copy of `bytes` in `dir`,
    /// over `reps` rounds that run every candidate once (interleaved, so that drift spreads
    /// over all of them). Each figure is recorded as `label(candidate)`.
    fn compare(
        &mut self,
        cands: &[StagingConfig],
        dir: Dir,
        bytes: usize,
        reps: usize,
        label: impl Fn(&StagingConfig) -> String,
    ) -> Result<Vec<f64>> {
        let mut t = vec![Vec::with_capacity(reps); cands.len()];
        for _ in 0..reps {
            for (i, c) in cands.iter().enumerate() {
                t[i].push(self.staged(c, dir, bytes)?);
            }
        }
        let med: Vec<f64> = t.iter().map(|v| median(v)).collect();
        for (c, &m) in cands.iter().zip(&med) {
            self.points.push(CalibrationPoint {
                what: label(c),
                bytes,
                seconds: m,
            });
        }
        Ok(med)
    }
}

/// The median of `v` (0 for none).
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Bytes of each calibration copy of the configuration steps.
const PROBE: usize = 16 << 20;
/// Rounds of each configuration step.
const REPS: usize = 3;
/// Sizes the threshold is searched among, and the threshold where staging wins at none.
// (Not 1 MiB: on the 16-core H200 host five pairs at 1 MiB chose staging device-to-host,
// which the bench then measured at 0.72 of the driver; from 2 MiB the choice held.)
const THRESHOLDS: [usize; 3] = [2 << 20, 4 << 20, 8 << 20];
const NO_WIN: usize = 16 << 20;
/// Speed-up over the driver a size must show to be staged.
const WIN: f64 = 1.1;

fn dir_name(dir: Dir) -> &'static str {
    match dir {
        Dir::ToDevice => "h2d",
        Dir::ToHost => "d2h",
    }
}

/// Measures the configuration of `stager` (whose workers are started, `base.threads` or
/// more) on device `device`, starting from `base`, leaving the fields `fixed` as they are.
pub(super) fn calibrate(
    stager: &Stager,
    base: StagingConfig,
    fixed: Fixed,
    device: i32,
) -> Result<(StagingConfig, Calibration)> {
    let t0 = Instant::now();
    let mut b = Bench {
        stager,
        s: Scratch::new(device, PROBE)?,
        points: Vec::new(),
    };
    let mut cfg = base;
    let dirs = [Dir::ToDevice, Dir::ToHost];
    // Warm-up: every worker's staging block and lane, and the driver's own staging.
    for dir in dirs {
        b.staged(&cfg, dir, PROBE)?;
        b.driver(dir, 1 << 20)?;
    }

    // 1. Non-temporal stores, per direction.
    for (i, dir) in dirs.into_iter().enumerate() {
        if fixed.nt[i] || !nt_available() {
            continue;
        }
        let mut on = cfg;
        on.dir_mut(dir).nt_stores = true;
        let mut off = on;
        off.dir_mut(dir).nt_stores = false;
        let t = b.compare(&[on, off], dir, PROBE, REPS, |c| {
            format!("staged {} nt={}", dir_name(dir), c.dir(dir).nt_stores)
        })?;
        cfg.dir_mut(dir).nt_stores = t[1] >= 0.97 * t[0];
    }

    // 2. Chunks per worker (the chunk size of copies past the smallest chunk), both
    // directions summed.
    if !fixed.chunk {
        let cands = [4usize, 2].map(|per| StagingConfig {
            chunks_per_thread: per,
            ..cfg
        });
        let mut sum = [0.0; 2];
        for dir in dirs {
            let t = b.compare(&cands, dir, PROBE, REPS, |c| {
                format!(
                    "staged {} chunk={}",
                    dir_name(dir),
                    fmt_bytes(c.chunk_for(PROBE))
                )
            })?;
            sum[0] += t[0];
            sum[1] += t[1];
        }
        cfg = if sum[1] < 0.97 * sum[0] {
            cands[1]
        } else {
            cands[0]
        };
    }

    // 3. Workers: all, or half.
    if !fixed.threads && cfg.threads >= 4 {
        let half = StagingConfig {
            threads: cfg.threads / 2,
            ..cfg
        };
        let cands = [cfg, half];
        let mut sum = [0.0; 2];
        for dir in dirs {
            let t = b.compare(&cands, dir, PROBE, REPS, |c| {
                format!("staged {} threads={}", dir_name(dir), c.threads)
            })?;
            sum[0] += t[0];
            sum[1] += t[1];
        }
        if sum[1] < 0.95 * sum[0] {
            cfg = half;
        }
    }

    // 4. The threshold, per direction.
    for (i, dir) in dirs.into_iter().enumerate() {
        if fixed.min_bytes[i] {
            continue;
        }
        let mut threshold = NO_WIN;
        let mut wins_in_a_row = 0;
        for &size in &THRESHOLDS {
            let (mut d, mut s, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..5 {
                let td = b.driver(dir, size)?;
                let ts = b.staged(&cfg, dir, size)?;
                ratios.push(td / ts);
                d.push(td);
                s.push(ts);
            }
            let n = dir_name(dir);
            b.points.push(CalibrationPoint {
                what: format!("driver {n}"),
                bytes: size,
                seconds: median(&d),
            });
            b.points.push(CalibrationPoint {
                what: format!("staged {n}"),
                bytes: size,
                seconds: median(&s),
            });
            if median(&ratios) >= WIN {
                if wins_in_a_row == 0 {
                    threshold = size;
                }
                wins_in_a_row += 1;
                if wins_in_a_row == 2 {
                    break;
                }
            } else {
                wins_in_a_row = 0;
                threshold = NO_WIN;
            }
        }
        cfg.dir_mut(dir).min_bytes = threshold;
    }
    drop(b.s);
    Ok((
        cfg,
        Calibration {
            took: t0.elapsed(),
            points: b.points,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn medians_of_odd_even_and_no_samples() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
