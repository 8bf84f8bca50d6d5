//! The SVG plot of copy bandwidth against transfer size (plotters' SVG backend): both axes
//! log-scaled, one colour per memory kind and direction, cuda-mem solid and the raw
//! cuda-mem-sys path dashed in the same colour; the bidirectional aggregate as one more line.
//! Drawn from the saved JSON, so `cuda-mem plot` redraws it from any `bench --json` file.

use plotters::prelude::*;

use crate::report::json::BenchJson;
use crate::results::COPY_KINDS;
use crate::units::fmt_size;

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 720;
const LEGEND_W: u32 = 250;

/// Colours that stay apart from each other on white (Tableau 10, then darker tones).
const COLORS: [RGBColor; 14] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(0, 80, 140),
    RGBColor(160, 80, 0),
    RGBColor(0, 110, 60),
];

/// One kind and direction: (bytes, GB/s) of ours and of raw, sorted by bytes.
struct Series {
    label: String,
    ours: Vec<(f64, f64)>,
    raw: Vec<(f64, f64)>,
}

/// The plottable points of `v` (positive size and bandwidth), as (bytes, GB/s) sorted by bytes.
fn points(v: impl Iterator<Item = (u64, f64)>) -> Vec<(f64, f64)> {
    let mut p: Vec<(f64, f64)> = v
        .map(|(b, g)| (b as f64, g))
        .filter(|&(b, g)| b > 0.0 && g.is_finite() && g > 0.0)
        .collect();
    p.sort_by(|a, b| a.0.total_cmp(&b.0));
    p
}

fn series(r: &BenchJson) -> Vec<Series> {
    let mut out = Vec::new();
    let mut kinds: Vec<&str> = COPY_KINDS.to_vec();
    for c in &r.copies {
        if !kinds.contains(&c.kind.as_str()) {
            kinds.push(&c.kind);
        }
    }
    for kind in kinds {
        for dir in ["h2d", "d2h", "d2d"] {
            let rows: Vec<_> = r
                .copies
                .iter()
                .filter(|c| c.kind == kind && c.direction == dir)
                .collect();
            let ours = points(rows.iter().map(|c| (c.bytes, c.gbps)));
            let raw = points(rows.iter().map(|c| (c.bytes, c.raw_gbps)));
            if !ours.is_empty() || !raw.is_empty() {
                out.push(Series {
                    label: format!("{kind} {dir}"),
                    ours,
                    raw,
                });
            }
        }
    }
    let bidir = &r.bidirectional;
    let ours = points(bidir.iter().map(|b| (b.bytes, b.gbps)));
    if !ours.is_empty() {
        out.push(Series {
            label: "pinned h2d+d2h (sum)".into(),
            ours,
            raw: points(bidir.iter().map(|b| (b.bytes, b.raw_gbps))),
        });
    }
    out
}

/// The range of `v` widened to whole powers of `base` (at least one step), for a log axis.
fn log_range(v: impl Iterator<Item = f64>, base: f64, fallback: (f64, f64)) -> (f64, f64) {
    let (lo, hi) = v
        .filter(|x| x.is_finite() && *x > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
    if !lo.is_finite() || hi <= 0.0 {
        return fallback;
    }
    let lo = base.powf(lo.log(base).floor());
    let mut hi = base.powf(hi.log(base).ceil());
    if hi <= lo {
        hi = lo * base;
    }
    (lo, hi)
}

/// A GB/s tick label: `0.1`, `1`, `10`, `1000`.
fn fmt_tick(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn draw(r: &BenchJson, out: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let lines = series(r);
    let root = SVGBackend::with_string(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "cuda-mem bench: copy bandwidth on {} (CUDA {}), median of {} samples",
        r.device.name, r.runtime, r.method.samples
    );
    let root = root.titled(&title, ("sans-serif", 20))?;
    let (plot, legend) = root.split_horizontally(WIDTH - LEGEND_W);
    if lines.is_empty() {
        plot.draw(&Text::new(
            "no copy was measured",
            (80, 80),
            ("sans-serif", 16),
        ))?;
        root.present()?;
        return Ok(());
    }
    let all = || lines.iter().flat_map(|s| s.ours.iter().chain(&s.raw));
    let (x_lo, x_hi) = log_range(all().map(|p| p.0), 2.0, (4096.0, 8192.0));
    let (y_lo, y_hi) = log_range(all().map(|p| p.1), 10.0, (0.1, 10.0));
    let mut chart = ChartBuilder::on(&plot)
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(64)
        .build_cartesian_2d((x_lo..x_hi).log_scale().base(2.0), (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("transfer size (bytes, log scale)")
        .y_desc("GB/s (1 GB = 1e9 bytes, log scale)")
        .x_label_formatter(&|x| fmt_size(x.round() as u64))
        .y_label_formatter(&|y| fmt_tick(*y))
        .x_labels(12)
        .y_labels(12)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(205, 205, 205))
        .draw()?;
    for (i, s) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart.draw_series(LineSeries::new(
            s.ours.iter().copied(),
            color.stroke_width(2),
        ))?;
        chart.draw_series(s.ours.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        chart.draw_series(DashedLineSeries::new(
            s.raw.iter().copied(),
            6,
            4,
            color.stroke_width(1),
        ))?;
    }
    // The legend beside the plot, where it covers no line.
    let text = ("sans-serif", 14).into_font();
    legend.draw(&Text::new("cuda-mem (solid)", (10, 20), text.clone()))?;
    legend.draw(&Text::new(
        "raw cuda-mem-sys (dashed)",
        (10, 40),
        text.clone(),
    ))?;
    for (i, s) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let y = 72 + 22 * i as i32;
        legend.draw(&PathElement::new(
            vec![(10, y), (40, y)],
            color.stroke_width(2),
        ))?;
        legend.draw(&Circle::new((25, y), 3, color.filled()))?;
        legend.draw(&Text::new(s.label.clone(), (48, y - 7), text.clone()))?;
    }
    root.present()?;
    Ok(())
}

/// The plot as an SVG document.
pub fn copy_plot(r: &BenchJson) -> String {
    let mut out = String::new();
    if let Err(e) = draw(r, &mut out) {
        // Drawing into a string has nothing that can fail; say so in the picture if it did.
        out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"60\"><text x=\"10\" \
             y=\"30\">cannot draw the plot: {}</text></svg>\n",
            e.to_string().replace('&', "&amp;").replace('<', "&lt;")
        );
    }
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::json::bench_json;
    use crate::results::sample;

    #[test]
    fn plot_on_sample_data() {
        let svg = copy_plot(&bench_json(&sample::results()));
        assert!(svg.contains("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        // pageable h2d/d2h, pinned h2d/d2h, device d2d, the aggregate: solid lines, one
        // polyline each (plus the legend's).
        assert!(svg.matches("<polyline").count() >= 6);
        for label in [
            "pinned d2h",
            "device d2d",
            "pinned h2d+d2h (sum)",
            "raw cuda-mem-sys (dashed)",
            "4KiB",
            "64MiB",
            "NVIDIA H200",
        ] {
            assert!(svg.contains(label), "{label} missing");
        }
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        // Debug dumps to look at by eye: CUDA_MEM_SVG_OUT=/tmp/x.svg cargo test plot_on
        if let Some(p) = std::env::var_os("CUDA_MEM_SVG_OUT") {
            std::fs::write(p, &svg).unwrap();
        }
    }

    #[test]
    fn empty_and_single_size() {
        let mut r = bench_json(&sample::results());
        r.copies.clear();
        r.bidirectional.clear();
        assert!(copy_plot(&r).contains("no copy was measured"));
        let mut r = bench_json(&sample::results());
        r.copies.retain(|c| c.bytes == 4096);
        r.copies[0].raw_gbps = f64::NAN;
        let svg = copy_plot(&r);
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn log_ranges() {
        assert_eq!(
            log_range([4096.0, 1e6].into_iter(), 2.0, (1.0, 2.0)),
            (4096.0, 1048576.0)
        );
        assert_eq!(
            log_range([0.58, 2400.0].into_iter(), 10.0, (1.0, 2.0)),
            (0.1, 10000.0)
        );
        assert_eq!(log_range([8.0].into_iter(), 2.0, (1.0, 2.0)), (8.0, 16.0));
        assert_eq!(log_range([].into_iter(), 2.0, (1.0, 2.0)), (1.0, 2.0));
        assert_eq!(fmt_tick(0.1), "0.1");
        assert_eq!(fmt_tick(1000.0), "1000");
    }
}
