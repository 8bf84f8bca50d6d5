//! A run against a saved one (`bench --baseline`, `compare`), the way criterion reports
//! change: a figure has changed when it moved beyond its run-to-run spread and by more than
//! the noise threshold; then it improved or regressed, as its unit says (GB/s up is better,
//! µs down is better).
//!
//! The spread of a figure is the interquartile range of its samples (schema 2's `_q1`/`_q3`).
//! A figure changed when the new median lies outside the baseline's range and the baseline's
//! median outside the new range; where only one run has a range (a schema-1 baseline), that
//! one is used; where neither has one (e.g. the two-GPU bandwidth rows), the noise threshold
//! alone decides. Only the cuda-mem figures are compared (the raw path is the reference).

use std::fmt::Write as _;

use crate::args::Thresholds;
use crate::report::json::BenchJson;
use crate::report::table::grid;
use crate::units::fmt_size;

/// What happened to one figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the spread of the runs.
    Unchanged,
    /// Beyond the spread, but less than the noise threshold.
    Noise,
    /// Better beyond spread and threshold.
    Improved,
    /// Worse beyond spread and threshold.
    Regressed,
}

/// One figure in both runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// `copies`, `bidirectional`, `kernels`, `alloc`, `calls`, `multi_gpu`.
    pub section: &'static str,
    /// The figure, e.g. `pinned h2d 256MiB`.
    pub what: String,
    /// `GB/s` or `us`.
    pub unit: String,
    /// Whether a larger value is better.
    pub higher_is_better: bool,
    /// The baseline's median.
    pub old: f64,
    /// This run's median.
    pub new: f64,
    /// Relative change, `new / old - 1`.
    pub change: f64,
    /// Whether either run had a spread for this figure.
    pub had_spread: bool,
    /// The verdict.
    pub verdict: Verdict,
}

/// One figure of one run: median and spread.
#[derive(Debug, Clone, Copy)]
struct Fig {
    median: f64,
    q: Option<(f64, f64)>,
}

/// One comparable figure of a run: section, name, unit and its value.
type Figure = (&'static str, String, String, Fig);

fn figure(
    section: &'static str,
    what: String,
    unit: &str,
    median: f64,
    q1: Option<f64>,
    q3: Option<f64>,
) -> Figure {
    let q = q1.zip(q3);
    (section, what, unit.to_string(), Fig { median, q })
}

/// Every comparable figure of `r`, keyed by section, name and unit.
fn figures(r: &BenchJson) -> Vec<Figure> {
    let (gbps, us) = ("GB/s", "us");
    let mut v = Vec::new();
    for c in &r.copies {
        let what = format!("{} {} {}", c.kind, c.direction, fmt_size(c.bytes));
        v.push(figure("copies", what, gbps, c.gbps, c.gbps_q1, c.gbps_q3));
    }
    for b in &r.bidirectional {
        let what = format!("pinned h2d+d2h {}", fmt_size(b.bytes));
        v.push(figure(
            "bidirectional",
            what,
            gbps,
            b.gbps,
            b.gbps_q1,
            b.gbps_q3,
        ));
    }
    for k in &r.kernels {
        let what = format!("{} {} {}", k.kind, k.op, fmt_size(k.bytes));
        v.push(figure("kernels", what, gbps, k.gbps, k.gbps_q1, k.gbps_q3));
    }
    for a in &r.alloc {
        let what = format!("{} {}", a.kind, fmt_size(a.bytes));
        v.push(figure("alloc", what, us, a.us, a.us_q1, a.us_q3));
    }
    for c in &r.calls {
        let what = format!("{} {} {}", c.test, c.direction, fmt_size(c.bytes));
        v.push(figure("calls", what, us, c.us, c.us_q1, c.us_q3));
    }
    for m in &r.multi_gpu {
        let what = format!("{} {} {}", m.test, m.direction, fmt_size(m.bytes));
        v.push(figure(
            "multi_gpu",
            what,
            &m.unit,
            m.ours,
            m.ours_q1,
            m.ours_q3,
        ));
    }
    v
}

/// Whether `x` lies outside the range `q` (never, without a range).
fn outside(x: f64, q: Option<(f64, f64)>) -> Option<bool> {
    q.map(|(lo, hi)| x < lo.min(hi) || x > hi.max(lo))
}

/// Compares each figure of `new` present in `old`; `noise` is a fraction (0.02 = 2%).
pub fn compare(new: &BenchJson, old: &BenchJson, noise: f64) -> Vec<Change> {
    let old_figs = figures(old);
    let mut out = Vec::new();
    for (section, what, unit, n) in figures(new) {
        let Some((_, _, _, o)) = old_figs
            .iter()
            .find(|(s, w, u, _)| *s == section && *w == what && *u == unit)
        else {
            continue;
        };
        // Bandwidths (GB/s, GB/s busbw) up is better, times (us) down.
        let higher = unit != "us";
        if !(n.median.is_finite() && o.median.is_finite() && o.median > 0.0) {
            continue;
        }
        let change = n.median / o.median - 1.0;
        let beyond = match (outside(n.median, o.q), outside(o.median, n.q)) {
            (Some(a), Some(b)) => a && b,
            (Some(a), None) | (None, Some(a)) => a,
            // No spread in either run: the threshold alone decides.
            (None, None) => change.abs() >= noise,
        };
        let verdict = if !beyond {
            Verdict::Unchanged
        } else if change.abs() < noise {
            Verdict::Noise
        } else if (change > 0.0) == higher {
            Verdict::Improved
        } else {
            Verdict::Regressed
        };
        out.push(Change {
            section,
            what,
            unit,
            higher_is_better: higher,
            old: o.median,
            new: n.median,
            change,
            had_spread: o.q.is_some() || n.q.is_some(),
            verdict,
        });
    }
    out
}

/// The number of regressions.
pub fn regressions(changes: &[Change]) -> usize {
    changes
        .iter()
        .filter(|c| c.verdict == Verdict::Regressed)
        .count()
}

/// `new` against the baseline `old` (named `name` in the report), with the noise threshold
/// of `t`: the report and the number of regressions.
pub fn against(new: &BenchJson, old: &BenchJson, name: &str, t: &Thresholds) -> (String, usize) {
    let noise = t.noise_threshold / 100.0;
    let changes = compare(new, old, noise);
    (report(&changes, name, noise), regressions(&changes))
}

/// An error when `--fail-on-regression` is set and a figure regressed.
pub fn check_regressions(t: &Thresholds, regressed: usize) -> anyhow::Result<()> {
    if t.fail_on_regression && regressed > 0 {
        anyhow::bail!(
            "{regressed} figure(s) regressed against the baseline (--fail-on-regression)"
        );
    }
    Ok(())
}

/// The report: a summary line, then the figures that improved or regressed.
pub fn report(changes: &[Change], baseline: &str, noise: f64) -> String {
    let count = |v: Verdict| changes.iter().filter(|c| c.verdict == v).count();
    let no_spread = changes.iter().filter(|c| !c.had_spread).count();
    let mut out = format!(
        "\nAgainst baseline {baseline}: {} figures compared; {} regressed, {} improved, {} \
         unchanged (within the runs' interquartile spread), {} beyond the spread but under \
         the {:.1}% noise threshold",
        changes.len(),
        count(Verdict::Regressed),
        count(Verdict::Improved),
        count(Verdict::Unchanged),
        count(Verdict::Noise),
        noise * 100.0
    );
    if no_spread > 0 {
        let _ = write!(
            out,
            "; {no_spread} without a spread in either run (threshold alone)"
        );
    }
    out.push('\n');
    let mut changed: Vec<&Change> = changes
        .iter()
        .filter(|c| matches!(c.verdict, Verdict::Improved | Verdict::Regressed))
        .collect();
    changed.sort_by(|a, b| {
        (a.verdict != Verdict::Regressed)
            .cmp(&(b.verdict != Verdict::Regressed))
            .then(a.section.cmp(b.section))
    });
    if changed.is_empty() {
        return out;
    }
    let header = ["", "section", "figure", "unit", "baseline", "now", "change"];
    let mut rows = vec![header.map(String::from).to_vec()];
    for c in changed {
        rows.push(vec![
            match c.verdict {
                Verdict::Regressed => "REGRESSED",
                _ => "improved",
            }
            .to_string(),
            c.section.to_string(),
            c.what.clone(),
            c.unit.clone(),
            format!("{:.3}", c.old),
            format!("{:.3}", c.new),
            format!("{:+.1}%", c.change * 100.0),
        ]);
    }
    out.push_str(&grid(&rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::json::bench_json;
    use crate::results::sample;

    fn runs() -> (BenchJson, BenchJson) {
        let old = bench_json(&sample::results());
        (old.clone(), old)
    }

    #[test]
    fn identical_runs_are_unchanged() {
        let (new, old) = runs();
        let c = compare(&new, &old, 0.02);
        assert!(c.len() > 15);
        assert!(c
            .iter()
            .all(|c| matches!(c.verdict, Verdict::Unchanged | Verdict::Noise)));
        assert_eq!(regressions(&c), 0);
    }

    #[test]
    fn moves_beyond_spread_are_flagged_by_direction() {
        let (mut new, old) = runs();
        // pinned h2d 64 MiB: 55 GB/s, spread 53.9..55.55; now 50, spread 49.5..50.5.
        let c = new
            .copies
            .iter_mut()
            .find(|c| c.kind == "pinned" && c.direction == "h2d" && c.bytes == 64 << 20)
            .unwrap();
        c.gbps = 50.0;
        (c.gbps_q1, c.gbps_q3) = (Some(49.5), Some(50.5));
        // Within its spread: 55.3 is inside the baseline's 53.9..55.55.
        let d = new
            .copies
            .iter_mut()
            .find(|c| c.kind == "pinned" && c.direction == "d2h" && c.bytes == 64 << 20)
            .unwrap();
        d.gbps = 55.3;
        // An allocation that got faster: lower µs is better.
        new.alloc[0].us = 10.0;
        (new.alloc[0].us_q1, new.alloc[0].us_q3) = (Some(9.9), Some(10.1));
        // Bandwidth beyond the spread but by 1%: noise.
        new.bidirectional[0].gbps = 92.4;
        (new.bidirectional[0].gbps_q1, new.bidirectional[0].gbps_q3) = (Some(92.3), Some(92.5));
        let ch = compare(&new, &old, 0.02);
        let v = |what: &str| ch.iter().find(|c| c.what == what).unwrap().verdict;
        assert_eq!(v("pinned h2d 64MiB"), Verdict::Regressed);
        assert_eq!(v("pinned d2h 64MiB"), Verdict::Unchanged);
        assert_eq!(v("pinned 4KiB"), Verdict::Improved);
        assert_eq!(v("pinned h2d+d2h 256MiB"), Verdict::Noise);
        assert_eq!(regressions(&ch), 1);
        let text = report(&ch, "old.json", 0.02);
        assert!(text.contains("1 regressed, 1 improved"), "{text}");
        assert!(text.contains("REGRESSED | copies"), "{text}");
        assert!(text.contains("-9.1%"), "{text}");
        assert!(text.lines().all(|l| l == l.trim_end()));
    }

    #[test]
    fn schema_1_baseline_without_spread() {
        let (mut new, mut old) = runs();
        for c in &mut old.copies {
            (c.gbps_q1, c.gbps_q3) = (None, None);
        }
        // The new run's spread alone decides: halved, with a narrow spread around the half.
        let c = &mut new.copies[4];
        assert_eq!(c.kind, "pageable");
        let g = c.gbps * 0.5;
        c.gbps = g;
        (c.gbps_q1, c.gbps_q3) = (Some(g * 0.99), Some(g * 1.01));
        let ch = compare(&new, &old, 0.02);
        assert_eq!(regressions(&ch), 1);
        // Figures missing from the baseline are skipped, not errors.
        old.copies.clear();
        assert!(compare(&new, &old, 0.02)
            .iter()
            .all(|c| c.section != "copies"));
    }
}
