//! The SVG plot of copy bandwidth against transfer size: log2 x axis (bytes), linear y axis
//! (GB/s), one line per memory kind and direction. Device-to-device copies are an order of
//! magnitude faster than the host ones, so they get a panel of their own below.

use std::fmt::Write;

use crate::results::{BenchResults, CopyRow, COPY_KINDS};
use crate::units::fmt_size;

const WIDTH: f64 = 960.0;
const PANEL_H: f64 = 300.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 50.0;
const GAP: f64 = 80.0;

const COLORS: [&str; 11] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#000000",
];

/// One line: label, (bytes, GB/s) points sorted by bytes.
struct Series {
    label: String,
    points: Vec<(u64, f64)>,
    dashed: bool,
}

fn series(copies: &[CopyRow], dirs: &[&str]) -> Vec<Series> {
    let mut out = Vec::new();
    for kind in COPY_KINDS {
        for dir in dirs {
            let mut points: Vec<(u64, f64)> = copies
                .iter()
                .filter(|c| c.kind == kind && c.direction == *dir && c.gbps.is_finite())
                .map(|c| (c.bytes, c.gbps))
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by_key(|p| p.0);
            out.push(Series {
                label: format!("{kind} {dir}"),
                points,
                dashed: *dir == "d2h",
            });
        }
    }
    out
}

/// The smallest round number (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten) that is
/// at least `x` (1 for `x <= 0`), so that five grid steps have short labels.
fn nice_ceil(x: f64) -> f64 {
    if x <= 0.0 || !x.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|v| *v >= x * 0.999_999)
        .unwrap_or(10.0 * p)
}

/// An axis label: no decimals when whole, else as few as needed (0.3, 0.25).
fn fmt_tick(v: f64) -> String {
    if v == v.round() {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Draws one panel with its axes, grid, lines and legend; `y0` is its top.
fn panel(out: &mut String, y0: f64, title: &str, lines: &[Series], xr: (f64, f64), color0: usize) {
    let (x_lo, x_hi) = xr;
    let plot_w = WIDTH - LEFT - RIGHT;
    let ymax = nice_ceil(
        lines
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max),
    );
    let px = |bytes: u64| LEFT + ((bytes as f64).log2() - x_lo) / (x_hi - x_lo) * plot_w;
    let py = |gbps: f64| y0 + PANEL_H - gbps / ymax * PANEL_H;
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{:.1}" font-size="14" font-weight="bold">{}</text>"#,
        y0 - 10.0,
        esc(title)
    );
    // Y grid and labels: five steps.
    for i in 0..=5 {
        let v = ymax * i as f64 / 5.0;
        let y = py(v);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            fmt_tick(v)
        );
    }
    // X grid and labels: every power of two, or every other one when crowded.
    let (lo, hi) = (x_lo.ceil() as i32, x_hi.floor() as i32);
    let step = if hi - lo > 12 { 2 } else { 1 };
    for p in (lo..=hi).step_by(step as usize) {
        let x = px(1u64 << p);
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
            y0 + PANEL_H,
            y0 + PANEL_H + 16.0,
            fmt_size(1u64 << p)
        );
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{y0:.1}" width="{plot_w:.1}" height="{PANEL_H:.1}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">transfer size (bytes, log2 scale)</text>"#,
        LEFT + plot_w / 2.0,
        y0 + PANEL_H + 34.0
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate(16,{:.1}) rotate(-90)" font-size="12" text-anchor="middle">GB/s (1 GB = 1e9 bytes)</text>"#,
        y0 + PANEL_H / 2.0
    );
    for (i, s) in lines.iter().enumerate() {
        let color = COLORS[(color0 + i) % COLORS.len()];
        let pts: Vec<String> = s
            .points
            .iter()
            .map(|&(b, g)| format!("{:.1},{:.1}", px(b), py(g)))
            .collect();
        let dash = if s.dashed {
            r#" stroke-dasharray="6,3""#
        } else {
            ""
        };
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"><title>{}</title></polyline>"#,
            pts.join(" "),
            esc(&s.label)
        );
        for &(b, g) in &s.points {
            let _ = writeln!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#,
                px(b),
                py(g)
            );
        }
        let ly = y0 + 10.0 + 18.0 * i as f64;
        let lx = WIDTH - RIGHT + 16.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            esc(&s.label)
        );
    }
}

/// The plot as an SVG document.
pub fn copy_plot(r: &BenchResults) -> String {
    let host = series(&r.copies, &["h2d", "d2h"]);
    let dev = series(&r.copies, &["d2d"]);
    let sizes: Vec<u64> = r.copies.iter().map(|c| c.bytes).collect();
    let lo = sizes.iter().copied().min().unwrap_or(4096).max(1) as f64;
    let hi = sizes.iter().copied().max().unwrap_or(4096).max(1) as f64;
    let (mut x_lo, mut x_hi) = (lo.log2(), hi.log2());
    if x_hi - x_lo < 1.0 {
        x_lo -= 0.5;
        x_hi += 0.5;
    }
    let panels: Vec<(&str, &Vec<Series>)> = [
        ("Host <-> device copies", &host),
        ("Device -> device copies", &dev),
    ]
    .into_iter()
    .filter(|(_, s)| !s.is_empty())
    .collect();
    let n = panels.len().max(1) as f64;
    let height = TOP + n * (PANEL_H + GAP);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="22" font-size="16">{}</text>"#,
        esc(&format!(
            "cuda-mem bench: copy bandwidth on {} (CUDA {}), median of {} samples; solid h2d, dashed d2h",
            r.device.name, r.versions.runtime, r.method.samples
        ))
    );
    if panels.is_empty() {
        let _ = writeln!(
            out,
            r#"<text x="{LEFT}" y="{:.1}" font-size="14">no copy was measured</text>"#,
            TOP + 40.0
        );
    }
    let mut color0 = 0;
    for (i, (title, s)) in panels.iter().enumerate() {
        let y0 = TOP + 20.0 + i as f64 * (PANEL_H + GAP);
        panel(&mut out, y0, title, s, (x_lo, x_hi), color0);
        color0 += s.len();
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::sample;

    #[test]
    fn plot_on_sample_data() {
        let svg = copy_plot(&sample::results());
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        // pageable h2d/d2h, pinned h2d/d2h, device d2d.
        assert_eq!(svg.matches("<polyline").count(), 5);
        assert_eq!(svg.matches("<circle").count(), 15);
        assert!(svg.contains("<title>pinned d2h</title>"));
        assert!(svg.contains(">Host &lt;-&gt; device copies<"));
        assert!(svg.contains(">Device -&gt; device copies<"));
        assert!(svg.contains(">64MiB<") && svg.contains(">4KiB<"));
        // Host panel's axis tops out at 60 GB/s (pinned peaks at 55); d2d at 2000.
        assert!(svg.contains(">60<") && svg.contains(">12<") && svg.contains(">2000<"));
        // Balanced tags, no stray unescaped ampersands.
        assert_eq!(svg.matches("<svg").count(), svg.matches("</svg>").count());
        assert!(!svg.contains("& "));
    }

    #[test]
    fn empty_and_single_size() {
        let mut r = sample::results();
        r.copies.clear();
        assert!(copy_plot(&r).contains("no copy was measured"));
        let mut r = sample::results();
        r.copies.retain(|c| c.bytes == 4096);
        let svg = copy_plot(&r);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceil(55.0), 60.0);
        assert_eq!(nice_ceil(1800.0), 2000.0);
        assert_eq!(nice_ceil(2140.0), 2500.0);
        assert_eq!(nice_ceil(2.0), 2.0);
        assert_eq!(nice_ceil(0.0), 1.0);
        assert_eq!(nice_ceil(4.3), 5.0);
        assert_eq!(fmt_tick(12.0), "12");
        assert_eq!(fmt_tick(0.25), "0.25");
        assert_eq!(fmt_tick(0.3), "0.3");
    }
}
