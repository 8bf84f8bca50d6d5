//! `cuda-mem bench`: copy bandwidth, kernel bandwidth and allocation latency of every kind of
//! memory, through the safe API and through raw `cuda-mem-sys` calls.
//!
//! Method, as NVIDIA's nvbandwidth: one untimed warm-up, then N timed samples, the median
//! reported; each sample is timed with CUDA events on the legacy default stream, and for
//! asynchronous work a spin kernel holds the stream while the sample is queued (released right
//! after the end event is queued), so that host-side call overhead is not what is timed.
//! Copies too small to time alone are repeated within a sample. Ours and raw samples are
//! interleaved so that drift does not bias their ratio. GB = 1e9 bytes. The data of every
//! path is verified after its timed runs.

mod alloc;
mod bidir;
mod calls;
mod copies;
mod graphs;
mod host;
mod ipc;
mod kernels;
mod multi;
mod peers;
mod pools;
mod raw;
mod shmoo;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use cuda_mem::{alloc_mapped, Device, DevicePtr as _, Event, MappedBuffer, Misuse, Result, Stream};
use cuda_mem_probes::Probes;

use crate::args::{BenchArgs, Output};
use crate::diagnose::require_device;
use crate::info;
use crate::report::{self, compare, json, progress as bar, svg, table};
use crate::results::{BenchResults, KindError, Method};
use crate::units::{median, KIB, MIB};

/// What to measure, from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `--quick`.
    pub quick: bool,
    /// Timed samples per measurement.
    pub samples: u32,
    /// Copy sizes, bytes, ascending.
    pub sizes: Vec<u64>,
    /// Bytes per probe kernel.
    pub kernel_bytes: u64,
    /// Allocation sizes and the alloc + free cycles timed at each.
    pub alloc_plan: Vec<(u64, u32)>,
}

impl Config {
    /// Defaults: powers of two from 4 KiB to 1 GiB, 15 samples, 256 MiB kernels; `--quick`:
    /// 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB, 5 samples, 64 MiB kernels.
    pub fn from_args(a: &BenchArgs) -> Config {
        let quick = a.quick;
        let sizes = a.sizes.clone().map(|s| s.0).unwrap_or_else(|| {
            if quick {
                vec![4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB]
            } else {
                (12..=30).map(|p| 1u64 << p).collect()
            }
        });
        Config {
            quick,
            samples: a.samples.unwrap_or(if quick { 5 } else { 15 }),
            sizes,
            kernel_bytes: if quick { 64 * MIB } else { 256 * MIB },
            alloc_plan: if quick {
                vec![(4 * KIB, 11), (MIB, 7), (256 * MIB, 3)]
            } else {
                vec![(4 * KIB, 51), (MIB, 21), (256 * MIB, 5)]
            },
        }
    }
}

/// Copies per timed sample: enough that one sample moves 512 MiB, at most 256. A 4 KiB copy
/// takes about 2 µs and a 16 MiB device-to-device copy under 10 µs: timed one or sixteen at a
/// time, event resolution and launch jitter made the ours/raw ratio of identical calls swing
/// by 5%. The cap keeps the copies queued behind the spin kernel well inside a stream's queue.
pub fn reps_for(bytes: u64) -> u32 {
    (512 * MIB / bytes.max(1)).clamp(1, 256) as u32
}

/// Holds a stream with the spin kernel until released (nvbandwidth's blocking kernel).
struct Gate {
    probes: Probes,
    flag: MappedBuffer<u32>,
}

/// A held stream; dropping it releases the spin kernel.
struct Held<'a>(&'a Gate);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.flag().store(1, Ordering::SeqCst);
    }
}

impl Gate {
    fn new() -> Result<Gate> {
        let flag = alloc_mapped::<u32>(1)?;
        let probes = Probes::load()?;
        Ok(Gate { probes, flag })
    }

    fn flag(&self) -> &AtomicU32 {
        // SAFETY: the pointer is the live, 4-byte aligned pinned allocation of `self.flag`,
        // which outlives the returned borrow; the host touches it only through this atomic
        // (never through `as_slice`), the GPU only reads it (volatile loads).
        unsafe { AtomicU32::from_ptr(self.flag.as_ptr().cast_mut()) }
    }

    fn hold(&self, stream: &Stream) -> Result<Held<'_>> {
        // The previous spin kernel has finished (it is recorded on the flag's fence) before
        // the flag is armed again.
        self.flag.synchronize()?;
        self.flag().store(0, Ordering::SeqCst);
        let flag = self.flag.device_ptr(stream)?;
        // SAFETY: `flag` is the device address of mapped memory that lives as long as `self`,
        // used on the guard's stream while it lives; the guard records the launch on the
        // flag's fence, so it is not freed while the kernel runs.
        unsafe { self.probes.wait(flag.as_ptr(), 10_000_000_000, stream)? };
        drop(flag);
        Ok(Held(self))
    }
}

/// The device, stream, timing events and spin kernel shared by all measurements.
pub struct Ctx {
    /// The device measured.
    pub device: Device,
    /// The legacy default stream.
    pub stream: Stream,
    start: Event,
    end: Event,
    gate: Option<Gate>,
}

impl Ctx {
    fn new(device: Device) -> Result<Ctx> {
        Ok(Ctx {
            device,
            stream: Stream::legacy_default(),
            start: Event::timing()?,
            end: Event::timing()?,
            gate: Gate::new().ok(),
        })
    }

    /// Times one sample: `op` queued `reps` times between two events, with the stream held
    /// by the spin kernel meanwhile when `hold` (never for work that blocks the host).
    /// Returns seconds. Whether it succeeds or fails, all work it queued has completed when
    /// it returns (unless the context itself is lost), which is what lets the callers pass
    /// raw pointers of live buffers to that work.
    pub fn time(&self, reps: u32, hold: bool, op: &mut impl FnMut() -> Result<()>) -> Result<f64> {
        let r = self.time_inner(reps, hold, op);
        if r.is_err() {
            let _ = self.stream.synchronize();
        }
        r
    }

    fn time_inner(
        &self,
        reps: u32,
        hold: bool,
        op: &mut impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        let held = match (&self.gate, hold) {
            (Some(g), true) => Some(g.hold(&self.stream)?),
            _ => None,
        };
        self.start.record(&self.stream)?;
        for _ in 0..reps {
            op()?;
        }
        self.end.record(&self.stream)?;
        drop(held);
        self.end.synchronize()?;
        Ok(f64::from(Event::elapsed_ms(&self.start, &self.end)?) / 1e3)
    }

    /// One untimed warm-up of `sample`, then the median of `samples` runs of it.
    pub fn median_of(&self, samples: u32, mut sample: impl FnMut() -> Result<f64>) -> Result<f64> {
        sample()?;
        let mut t = Vec::with_capacity(samples as usize);
        for _ in 0..samples {
            t.push(sample()?);
        }
        Ok(median(&t))
    }

    /// Ours and raw, one warm-up each, then `samples` interleaved samples of each (see
    /// [`Paired`]).
    pub fn pair(
        &self,
        samples: u32,
        reps: u32,
        hold: bool,
        ours: &mut impl FnMut() -> Result<()>,
        raw: &mut impl FnMut() -> Result<()>,
    ) -> Result<Paired> {
        self.time(1, hold, ours)?;
        self.time(1, hold, raw)?;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..samples {
            a.push(self.time(reps, hold, ours)? / f64::from(reps));
            b.push(self.time(reps, hold, raw)? / f64::from(reps));
        }
        Ok(Paired::new(&a, &b))
    }
}

/// Interleaved ours / raw samples, summarised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Paired {
    /// Median of ours (seconds, or whatever unit the samples are in).
    pub ours: f64,
    /// Median of raw.
    pub raw: f64,
    /// Interquartile mean over the pairs of `ours[i] / raw[i]`: each pair ran back to back, so
    /// a slow stretch of the machine shifts both and cancels out.
    pub ratio: f64,
    /// First and third quartile of ours: the run-to-run spread a baseline comparison
    /// measures a change against.
    pub ours_q: (f64, f64),
}

impl Paired {
    /// Summarises `ours[i]`, `raw[i]` taken in turn.
    pub fn new(ours: &[f64], raw: &[f64]) -> Paired {
        let ratios: Vec<f64> = ours.iter().zip(raw).map(|(o, r)| o / r).collect();
        Paired {
            ours: median(ours),
            raw: median(raw),
            ratio: interquartile_mean(&ratios),
            ours_q: quartiles(ours),
        }
    }
}

/// Which of ours and raw is sampled first in each pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Ours, then raw.
    OursFirst,
    /// Alternating from pair to pair, so that an advantage of going first or second cancels
    /// out.
    Alternate,
}

/// One warm-up of `sample(true)` (ours) and of `sample(false)` (raw), then `samples` pairs of
/// them in `order`: the samples of ours and of raw.
pub fn sample_pairs(
    samples: u32,
    order: Order,
    mut sample: impl FnMut(bool) -> Result<f64>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    sample(true)?;
    sample(false)?;
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for i in 0..samples {
        if order == Order::Alternate && i % 2 == 1 {
            raw.push(sample(false)?);
            ours.push(sample(true)?);
        } else {
            ours.push(sample(true)?);
            raw.push(sample(false)?);
        }
    }
    Ok((ours, raw))
}

/// The first and third quartile of `v` (linear interpolation between order statistics, as
/// numpy's default); NaN when `v` holds no finite value.
pub fn quartiles(v: &[f64]) -> (f64, f64) {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| {
        let x = p * (s.len() - 1) as f64;
        let (i, f) = (x.floor() as usize, x.fract());
        let next = s[(i + 1).min(s.len() - 1)];
        s[i] + (next - s[i]) * f
    };
    (at(0.25), at(0.75))
}

/// The mean of the middle half of `v` (sorted): as robust to outliers as the median, and with
/// less spread when most samples are ordinary noise, which is what resolves a 1% difference
/// between two paths that make the same call.
pub fn interquartile_mean(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let q = s.len() / 4;
    let mid = &s[q..s.len() - q];
    mid.iter().sum::<f64>() / mid.len() as f64
}

/// Records a kind that could not be measured and returns `Ok(None)`, unless the error
/// corrupted the CUDA context, which ends the run.
pub fn attempt<T>(
    res: &mut BenchResults,
    kinds: &[&str],
    stage: &'static str,
    r: Result<T>,
) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_sticky() => Err(e),
        Err(e) => {
            let unsupported = matches!(
                e.misuse(),
                Some(Misuse::Unsupported { .. } | Misuse::ManagedExceedsFree { .. })
            );
            let message = if unsupported {
                format!("unsupported: {e}")
            } else {
                format!("failed: {e}")
            };
            progress(&format!("  {} {stage}: {message}", kinds.join("/")));
            for k in kinds {
                res.errors.push(KindError {
                    kind: k.to_string(),
                    stage,
                    message: message.clone(),
                });
            }
            Ok(None)
        }
    }
}

/// Progress on stderr: a line indented by two spaces is a result, kept above the bar on a
/// terminal; any other line starts the next step of the current stage.
pub fn progress(line: &str) {
    if line.starts_with("  ") {
        bar::note(line);
    } else {
        bar::step(line);
    }
}

/// Runs `bench` and writes its outputs; fails when a data check failed.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    // A baseline that cannot be read fails now, not after the run.
    if let Ok(path) = std::env::var(ipc::CHILD) {
        return ipc::child(&path);
    }
    if let Ok(spec) = std::env::var(graphs::procs::CHILD) {
        return graphs::procs::child(&spec, args.kernel_image.as_deref());
    }
    let baseline = match &args.baseline {
        Some(p) => Some((p.display().to_string(), load(p)?)),
        None => None,
    };
    require_device()?;
    let cfg = Config::from_args(args);
    let t0 = Instant::now();
    let device = Device::get(0)?;
    device.set_current()?;
    let dev_info = info::device_info(device)?;
    progress(&format!(
        "{} ({}), {} sizes from {} to {}, {} samples{}",
        dev_info.name,
        dev_info.pci_bus_id,
        cfg.sizes.len(),
        crate::units::fmt_size(cfg.sizes[0]),
        crate::units::fmt_size(cfg.sizes[cfg.sizes.len() - 1]),
        cfg.samples,
        if cfg.quick { " (quick)" } else { "" }
    ));
    let ctx = Ctx::new(device)?;
    if ctx.gate.is_none() {
        progress("no blocking kernel (mapped memory unavailable): host call overhead is timed");
    }
    let mut res = BenchResults {
        version: env!("CARGO_PKG_VERSION").into(),
        versions: info::versions(),
        device: dev_info,
        method: Method {
            quick: cfg.quick,
            warmup: 1,
            samples: cfg.samples,
            sizes: cfg.sizes.clone(),
            blocking_kernel: ctx.gate.is_some(),
            kernel_bytes: cfg.kernel_bytes,
            managed_bytes: 0,
        },
        copies: Vec::new(),
        kernels: Vec::new(),
        allocs: Vec::new(),
        calls: Vec::new(),
        checks: Vec::new(),
        errors: Vec::new(),
        seconds: 0.0,
        multi: Vec::new(),
        bidir: Vec::new(),
        host: Vec::new(),
        shmoo: Vec::new(),
        peers: Vec::new(),
        processes: Vec::new(),
    };
    let on = |name: &str| {
        args.sections
            .as_ref()
            .is_none_or(|v| v.iter().any(|s| s == name))
    };
    if on("copies") {
        bar::stage("copies", 6);
        copies::run(&ctx, &cfg, &mut res)?;
    }
    if on("bidir") {
        let plan = bidir::sizes(&cfg);
        bar::stage("both ways", plan.len() as u64);
        let r = bidir::run(&cfg, &plan, &mut res);
        attempt(&mut res, &["pinned"], "bidirectional", r)?;
    }
    if on("kernels") {
        bar::stage("kernels", 4);
        kernels::run(&ctx, &cfg, &mut res)?;
    }
    if on("alloc") {
        bar::stage("alloc", cfg.alloc_plan.len() as u64);
        alloc::run(&ctx, &cfg, &mut res)?;
    }
    if on("pools") {
        bar::stage("pools", cfg.alloc_plan.len() as u64 + 1);
        pools::run(&ctx, &cfg, &mut res)?;
    }
    if on("calls") {
        bar::stage("calls", 6);
        let r = calls::run(&ctx, &cfg, &mut res);
        attempt(&mut res, &["calls"], "calls", r)?;
    }
    if on("host") {
        bar::stage("host side", 5);
        let r = host::run(&ctx, &cfg, &mut res);
        attempt(&mut res, &["host"], "host", r)?;
    }
    if on("graphs") {
        bar::stage("graphs", 2);
        // Process by process first, while this process has done no graph work.
        let rounds = if args.quick { 3 } else { 15 };
        let image = args.kernel_image.as_deref();
        let r = graphs::procs::run(&mut res, image, args.graphs_reference.as_deref(), rounds);
        attempt(&mut res, &["graphs"], "graphs processes", r)?;
        let r = graphs::run(&mut res, image);
        attempt(&mut res, &["graphs"], "graphs", r)?;
    }
    if on("shmoo") {
        bar::stage("shmoo", u64::from(shmoo::rounds(cfg.quick)) + 1);
        let r = shmoo::run(&ctx, cfg.quick, &mut res);
        attempt(&mut res, &["shmoo"], "shmoo", r)?;
    }
    if on("peers") {
        bar::stage("× cudarc", 5);
        let r = peers::run(&ctx, &cfg, &mut res);
        attempt(&mut res, &["cudarc"], "peers", r)?;
    }
    if on("multi") {
        bar::stage("two GPUs", 1);
        multi::run(&mut res)?;
    }
    // Two processes: only when named (`--sections ipc`).
    if args
        .sections
        .as_ref()
        .is_some_and(|v| v.iter().any(|s| s == "ipc"))
    {
        bar::stage("two processes", 1);
        // The section times only; whether it ran is its check (the bytes that cross are
        // checked by the ipc tests, not here).
        let r = ipc::run(device);
        if let Err(e) = &r {
            progress(&format!("  ipc: failed: {e}"));
        }
        res.checks.push(crate::results::Check {
            what: "two-process rows ran (--sections ipc; bytes checked by the ipc tests)".into(),
            bytes: 0,
            ok: r.is_ok(),
            detail: r.err().map(|e| e.to_string()),
        });
    }
    bar::done();
    res.seconds = t0.elapsed().as_secs_f64();
    progress(&format!("done in {:.1} s", res.seconds));
    let regressed = write_outputs(args, &res, baseline.as_ref())?;
    if !res.all_verified() {
        anyhow::bail!(
            "data verification failed: {}",
            res.checks
                .iter()
                .filter(|c| !c.ok)
                .map(|c| format!("{} ({})", c.what, c.detail.as_deref().unwrap_or("mismatch")))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    compare::check_regressions(&args.thresholds, regressed)
}

/// Reads a saved `bench --json` file.
pub fn load(p: &std::path::Path) -> anyhow::Result<json::BenchJson> {
    let text = std::fs::read_to_string(p)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?;
    json::BenchJson::parse(&text).map_err(|e| {
        anyhow::anyhow!(
            "{} is not the JSON of `cuda-mem bench --json`: {e}",
            p.display()
        )
    })
}

/// Writes the table, JSON and SVG where asked, with the comparison against `baseline` after
/// the table; returns the number of regressions.
fn write_outputs(
    args: &BenchArgs,
    res: &BenchResults,
    baseline: Option<&(String, json::BenchJson)>,
) -> anyhow::Result<usize> {
    let mut text = table::bench_table(res);
    let doc = json::bench_json(res);
    let json_text = doc.render();
    let svg_text = svg::copy_plot(&doc);
    let mut regressed = 0;
    if let Some((name, old)) = baseline {
        let (report, n) = compare::against(&doc, old, name, &args.thresholds);
        text.push_str(&report);
        regressed = n;
    }
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
        for (name, body) in [
            ("bench.txt", &text),
            ("bench.json", &json_text),
            ("bench.svg", &svg_text),
        ] {
            report::emit(&Output::File(dir.join(name)), body)?;
        }
    }
    if let Some(o) = &args.json {
        report::emit(o, &json_text)?;
    }
    if let Some(o) = &args.svg {
        report::emit(o, &svg_text)?;
    }
    if args.json == Some(Output::Stdout) || args.svg == Some(Output::Stdout) {
        report::to_stderr(&text);
    } else {
        report::to_stdout(&text)?;
    }
    Ok(regressed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::GIB;

    #[test]
    fn config_defaults() {
        let full = Config::from_args(&BenchArgs::default());
        assert_eq!(full.sizes.len(), 19);
        assert_eq!(full.sizes[0], 4 * KIB);
        assert_eq!(*full.sizes.last().unwrap(), GIB);
        assert_eq!(full.samples, 15);
        let quick = Config::from_args(&BenchArgs {
            quick: true,
            samples: Some(3),
            ..BenchArgs::default()
        });
        assert_eq!(quick.samples, 3);
        assert_eq!(*quick.sizes.last().unwrap(), 64 * MIB);
        assert!(quick.alloc_plan.iter().any(|&(b, _)| b == 256 * MIB));
    }

    #[test]
    fn paired_ratio_cancels_drift() {
        // The machine slows down 2x for the last three pairs; ours is 1% slower throughout.
        let raw = [1.0, 1.0, 2.0, 2.0, 2.0];
        let ours: Vec<f64> = raw.iter().map(|r| r * 1.01).collect();
        let p = Paired::new(&ours, &raw);
        assert_eq!(p.raw, 2.0);
        assert!((p.ratio - 1.01).abs() < 1e-12);
        assert!((p.ours - 2.02).abs() < 1e-12);
        assert!((p.ours_q.0 - 1.01).abs() < 1e-12 && (p.ours_q.1 - 2.02).abs() < 1e-12);
    }

    #[test]
    fn sample_pairs_order() {
        let calls = |order| {
            let mut seq = String::new();
            let (o, r) = sample_pairs(3, order, |ours| {
                seq.push(if ours { 'o' } else { 'r' });
                Ok(seq.len() as f64)
            })
            .unwrap();
            (seq, o, r)
        };
        let (seq, o, r) = calls(Order::OursFirst);
        assert_eq!(seq, "orororor");
        assert_eq!((o, r), (vec![3.0, 5.0, 7.0], vec![4.0, 6.0, 8.0]));
        let (seq, o, r) = calls(Order::Alternate);
        assert_eq!(seq, "ororroor");
        assert_eq!((o, r), (vec![3.0, 6.0, 7.0], vec![4.0, 5.0, 8.0]));
    }

    #[test]
    fn quartiles_interpolate() {
        assert_eq!(quartiles(&[1.0, 2.0, 3.0, 4.0, 5.0]), (2.0, 4.0));
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0]), (1.75, 3.25));
        assert_eq!(quartiles(&[7.0]), (7.0, 7.0));
        assert!(quartiles(&[f64::NAN]).0.is_nan());
    }

    #[test]
    fn interquartile_mean_drops_the_outer_quarters() {
        assert_eq!(
            interquartile_mean(&[1.0, 2.0, 3.0, 4.0, 100.0, 0.0, 2.5, 3.5]),
            2.75
        );
        assert_eq!(interquartile_mean(&[5.0]), 5.0);
        assert_eq!(interquartile_mean(&[1.0, 3.0]), 2.0);
        assert!(interquartile_mean(&[]).is_nan());
    }

    #[test]
    fn reps() {
        assert_eq!(reps_for(4 * KIB), 256);
        assert_eq!(reps_for(MIB), 256);
        assert_eq!(reps_for(4 * MIB), 128);
        assert_eq!(reps_for(256 * MIB), 2);
        assert_eq!(reps_for(GIB), 1);
        assert_eq!(reps_for(0), 256);
    }
}
