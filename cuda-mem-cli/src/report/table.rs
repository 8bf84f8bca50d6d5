//! The text writers: the `info` listing and the `bench` tables (one row per memory kind).

use comfy_table::{presets, ContentArrangement, Table};

use crate::results::{BenchResults, HostRow, InfoReport, ALLOC_KINDS, COPY_KINDS, KERNEL_KINDS};
use crate::units::{fmt_size, GIB, KIB, MIB};

/// Sizes always shown in the copy table when measured (besides the smallest and largest).
const KEY_SIZES: [u64; 4] = [4 * KIB, MIB, 16 * MIB, 256 * MIB];

/// The cells of `HostRow`s for [`against_table`].
fn host_rows<'a, I: Iterator<Item = &'a HostRow> + 'a>(
    rows: I,
) -> impl Iterator<Item = (&'static str, String, u64, &'static str, [f64; 3])> + 'a {
    rows.map(|h| {
        let nums = [h.ours, h.reference, h.ratio];
        (h.test, h.config.clone(), h.bytes, h.unit, nums)
    })
}

/// A table of figures against a reference: test, `names[0]` (what was measured), size, unit,
/// ours (`names[1]`), the reference (`names[2]`) and the ratio; NaN prints as `-`.
fn against_table(
    names: [&str; 3],
    rows: impl Iterator<Item = (&'static str, String, u64, &'static str, [f64; 3])>,
) -> String {
    let num = |x: f64| {
        if x.is_finite() {
            format!("{x:.3}")
        } else {
            "-".into()
        }
    };
    let mut out = vec![vec![
        "test".to_string(),
        names[0].into(),
        "size".into(),
        "unit".into(),
        names[1].into(),
        names[2].into(),
        "ratio".into(),
    ]];
    for (test, what, bytes, unit, [a, b, ratio]) in rows {
        out.push(vec![
            test.to_string(),
            what,
            fmt_size(bytes),
            unit.to_string(),
            num(a),
            num(b),
            num(ratio),
        ]);
    }
    grid(&out)
}

/// A table in Markdown's shape (readable as text, and pastes into an issue or a README):
/// the first row is the header. A short row (a kind with an error message) is padded with
/// empty cells.
pub fn grid(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut t = Table::new();
    t.load_preset(presets::ASCII_MARKDOWN)
        .set_content_arrangement(ContentArrangement::Disabled);
    let pad = |r: &Vec<String>| {
        let mut r = r.clone();
        r.resize(cols, String::new());
        r
    };
    if let Some((head, body)) = rows.split_first() {
        t.set_header(pad(head));
        for r in body {
            t.add_row(pad(r));
        }
    }
    let mut out: String = t
        .lines()
        .map(|l| l.trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    out.push('\n');
    out
}

/// Two columns without a header: `key  value` lines, indented by two spaces.
fn pairs(rows: &[(&str, String)]) -> String {
    let w = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("  {k:<w$}  {v}\n"))
        .collect()
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn fmt_gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB as f64)
}

/// A bandwidth with sensible precision: `4012`, `55.3`, `6.12`.
pub fn fmt_gbps(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The text of `info`.
pub fn info_text(r: &InfoReport) -> String {
    let v = &r.versions;
    let mut out = format!(
        "CUDA runtime {} (built with {}), driver supports CUDA {}\n{} device(s)\n",
        v.runtime,
        v.built_with,
        v.driver,
        r.devices.len()
    );
    for d in &r.devices {
        let c = &d.caps;
        out.push_str(&format!("\nDevice {}: {}\n", d.ordinal, d.name));
        let e = &d.extra;
        let opt_yes_no = |b: Option<bool>| b.map_or("unknown", yes_no).to_string();
        let rows: Vec<(&str, String)> = vec![
            (
                "compute capability",
                format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
            ),
            ("PCI bus id", d.pci_bus_id.clone()),
            (
                "memory",
                format!(
                    "{} free of {}",
                    fmt_gib(d.free_bytes),
                    fmt_gib(d.total_bytes)
                ),
            ),
            ("can map host memory", yes_no(c.can_map_host_memory).into()),
            ("unified addressing", yes_no(c.unified_addressing).into()),
            ("managed memory", yes_no(c.managed_memory).into()),
            (
                "concurrent managed access",
                yes_no(c.concurrent_managed_access).into(),
            ),
            (
                "pageable memory access",
                yes_no(c.pageable_memory_access).into(),
            ),
            ("host native atomics", yes_no(c.host_native_atomics).into()),
            ("memory pools", opt_yes_no(e.memory_pools)),
            ("host memory pools", opt_yes_no(e.host_memory_pools)),
            (
                "copy engines",
                e.copy_engines.map_or("unknown".into(), |n| {
                    format!(
                        "{n}{}",
                        if n >= 2 {
                            " (copies both ways at once)"
                        } else {
                            ""
                        }
                    )
                }),
            ),
            (
                "PCIe link",
                e.pcie_link.as_ref().map_or(
                    "not reported (the CUDA runtime does not give link speed or width; \
                     no sysfs entry)"
                        .into(),
                    |l| {
                        let lanes = |w: Option<u32>| w.map_or(String::new(), |w| format!(" x{w}"));
                        let mut s = format!("{}{}", l.speed, lanes(l.width));
                        if let Some(m) = &l.max_speed {
                            s.push_str(&format!(" (max {m}{})", lanes(l.max_width)));
                        }
                        s
                    },
                ),
            ),
        ];
        out.push_str(&pairs(&rows));
    }
    out
}

/// The copy sizes the table shows: all when few, else the key sizes, the smallest and the
/// largest.
fn table_sizes(sizes: &[u64]) -> Vec<u64> {
    if sizes.len() <= 6 {
        return sizes.to_vec();
    }
    let (min, max) = (sizes[0], sizes[sizes.len() - 1]);
    sizes
        .iter()
        .copied()
        .filter(|s| *s == min || *s == max || KEY_SIZES.contains(s))
        .collect()
}

fn errors_of<'a>(r: &'a BenchResults, kind: &str, stage: &str) -> Option<&'a str> {
    r.errors
        .iter()
        .find(|e| e.kind == kind && e.stage == stage)
        .map(|e| e.message.as_str())
}

/// The tables of `bench`.
pub fn bench_table(r: &BenchResults) -> String {
    let d = &r.device;
    let m = &r.method;
    let mut out = format!(
        "cuda-mem bench {}: {} (compute {}.{}, PCI {}), CUDA runtime {}, driver {}\n",
        r.version,
        d.name,
        d.compute_capability.0,
        d.compute_capability.1,
        d.pci_bus_id,
        r.versions.runtime,
        r.versions.driver
    );
    out.push_str(&format!(
        "method: median of {} samples after {} warm-up (pageable, full run: 3x), CUDA events \
         around each sample{},\n        GB = 1e9 bytes; ratio = interquartile mean of paired \
         ours/raw samples{}\n",
        m.samples,
        m.warmup,
        if m.blocking_kernel {
            " (queued behind a blocking kernel)"
        } else {
            ""
        },
        if m.quick { "; quick run" } else { "" }
    ));

    // Copies: one row per kind and direction, one column per size.
    let sizes = table_sizes(&m.sizes);
    out.push_str("\nCopy bandwidth, GB/s through cuda-mem (ratio to raw cuda-mem-sys)\n");
    let mut rows = vec![{
        let mut h = vec!["kind".to_string(), "dir".to_string()];
        h.extend(sizes.iter().map(|&s| fmt_size(s)));
        h
    }];
    for kind in COPY_KINDS {
        if errors_of(r, kind, "copies").is_some() {
            // The reason is listed under "Not measured", where it widens no column.
            rows.push(vec![kind.into(), "-".into(), "not measured".into()]);
            continue;
        }
        for dir in ["h2d", "d2h", "d2d"] {
            let cells: Vec<String> = sizes
                .iter()
                .map(|&s| {
                    r.copies
                        .iter()
                        .find(|c| c.kind == kind && c.direction == dir && c.bytes == s)
                        .map_or("-".into(), |c| {
                            format!("{} ({:.3})", fmt_gbps(c.gbps), c.ratio)
                        })
                })
                .collect();
            if cells.iter().all(|c| c == "-") {
                continue;
            }
            let mut row = vec![kind.to_string(), dir.to_string()];
            row.extend(cells);
            rows.push(row);
        }
    }
    out.push_str(&grid(&rows));

    // Both directions at once.
    if !r.bidir.is_empty() {
        out.push_str(
            "\nBoth directions at once: pinned h2d and d2h on two streams, GB/s (one way alone \
             on the same streams; aggregate = bytes both ways / time)\n",
        );
        let mut rows = vec![vec![
            "size".to_string(),
            "h2d alone".into(),
            "d2h alone".into(),
            "aggregate".into(),
            "raw aggregate".into(),
            "ratio".into(),
        ]];
        for b in &r.bidir {
            rows.push(vec![
                fmt_size(b.bytes),
                fmt_gbps(b.h2d_gbps),
                fmt_gbps(b.d2h_gbps),
                fmt_gbps(b.gbps),
                fmt_gbps(b.raw_gbps),
                format!("{:.3}", b.ratio),
            ]);
        }
        out.push_str(&grid(&rows));
    }

    // Kernels: one row per kind, one column per operation.
    out.push_str(&format!(
        "\nKernel bandwidth, GB/s ({} per kernel; managed: {})\n",
        fmt_size(m.kernel_bytes),
        fmt_size(m.managed_bytes)
    ));
    let ops = ["read", "write", "prefetch"];
    let mut rows = vec![vec![
        "kind".to_string(),
        "read".into(),
        "write".into(),
        "prefetch".into(),
    ]];
    for kind in KERNEL_KINDS {
        if errors_of(r, kind, "kernels").is_some() {
            rows.push(vec![kind.into(), "not measured".into()]);
            continue;
        }
        let mut row = vec![kind.to_string()];
        row.extend(ops.iter().map(|op| {
            r.kernels
                .iter()
                .find(|k| k.kind == kind && k.op == *op)
                .map_or("-".into(), |k| fmt_gbps(k.gbps))
        }));
        if row[1..].iter().any(|c| c != "-") {
            rows.push(row);
        }
    }
    out.push_str(&grid(&rows));

    // Allocation: one row per kind, one column per size.
    let mut alloc_sizes: Vec<u64> = r.allocs.iter().map(|a| a.bytes).collect();
    alloc_sizes.sort_unstable();
    alloc_sizes.dedup();
    out.push_str("\nAllocation + free, µs through cuda-mem (ratio to raw time; >1 is slower)\n");
    let mut rows = vec![{
        let mut h = vec!["kind".to_string()];
        h.extend(alloc_sizes.iter().map(|&s| fmt_size(s)));
        h.push("note".into());
        h
    }];
    for kind in ALLOC_KINDS {
        let mut row = vec![kind.to_string()];
        let mut note = None;
        for &s in &alloc_sizes {
            let cell = match r.allocs.iter().find(|a| a.kind == kind && a.bytes == s) {
                Some(a) => {
                    note = note.or(a.note);
                    // Sub-microsecond rows (pools) differ in the second decimal.
                    if a.us < 10.0 {
                        format!("{:.2} ({:.2})", a.us, a.ratio)
                    } else {
                        format!("{:.1} ({:.2})", a.us, a.ratio)
                    }
                }
                None => "-".into(),
            };
            row.push(cell);
        }
        if let Some(e) = errors_of(r, kind, "alloc") {
            note = Some(e);
        }
        row.push(note.unwrap_or("").into());
        if row[1..].iter().any(|c| c != "-" && !c.is_empty()) {
            rows.push(row);
        }
    }
    out.push_str(&grid(&rows));

    // Per-call cost of asynchronous copies.
    if !r.calls.is_empty() {
        out.push_str(
            "\nAsynchronous calls: µs through cuda-mem / the raw call (cudaMemcpyAsync, \
             cudaMemsetAsync; a guard: the raw call it guards) (speed ratio, 1 = parity)\n  loop: one \
             copy_async per copy until synchronized; enqueue: host time of one 4 KiB call, \
             stream held;\n  overhead_*: host time of one 4 KiB call, stream held, per stream \
             kind and number of users;\n  quarters: four 16 MiB copies into one buffer, on \
             four streams or one\n",
        );
        let mut rows = vec![vec![
            "test".to_string(),
            "dir".into(),
            "size".into(),
            "cuda-mem".into(),
            "raw".into(),
            "ratio".into(),
            "overhead".into(),
        ]];
        for c in &r.calls {
            rows.push(vec![
                c.test.to_string(),
                c.direction.to_string(),
                fmt_size(c.bytes),
                format!("{:.3}", c.us),
                format!("{:.3}", c.raw_us),
                format!("{:.3}", c.ratio),
                format!("{:+.3} µs", c.us - c.raw_us),
            ]);
        }
        out.push_str(&grid(&rows));
    }

    // Two GPUs.
    if !r.multi.is_empty() {
        out.push_str(
            "\nTwo GPUs: cuda-mem / raw (peer_*: cudaMemcpyPeerAsync; staged: pipelined \
             through pinned host memory / two serial copies; ratio = speed of cuda-mem / raw)\n",
        );
        let rows = r.multi.iter().map(|m| {
            let nums = [m.ours, m.raw, m.ratio];
            (m.test, m.direction.to_string(), m.bytes, m.unit, nums)
        });
        out.push_str(&against_table(["dir", "cuda-mem", "raw"], rows));
    }

    // Host side.
    if !r.host.is_empty() {
        out.push_str(
            "\nHost side: pinned pool, cold pinning, staged pageable copies (reference: \
             memcpy on one thread, cudaHostAlloc + cudaFreeHost, cudaHostAlloc, the driver's \
             pageable cudaMemcpy; ratio = speed of ours / reference)\n",
        );
        let rows = host_rows(r.host.iter());
        out.push_str(&against_table(["configuration", "ours", "reference"], rows));
    }

    // bandwidthTest's shmoo: the summaries (every size is in the JSON).
    if r.shmoo.iter().any(|h| !h.config.is_empty()) {
        out.push_str(
            "\nbandwidthTest shmoo: 100 async copies of pinned memory per size on the legacy \
             stream, GB/s through cuda-mem / raw cudaMemcpyAsync (geometric means per band; \
             every size in the JSON; ratio = speed of cuda-mem / raw)\n",
        );
        let rows = host_rows(r.shmoo.iter().filter(|h| !h.config.is_empty()));
        out.push_str(&against_table(["summary", "cuda-mem", "raw"], rows));
    }

    // cudarc beside us.
    if !r.peers.is_empty() {
        out.push_str(
            "\ncuda-mem × cudarc 0.19, the same operations in the same run, interleaved (ratio = \
             speed of cuda-mem / cudarc; > 1: cuda-mem is faster)\n",
        );
        let rows = host_rows(r.peers.iter());
        out.push_str(&against_table(
            ["configuration", "cuda-mem", "cudarc"],
            rows,
        ));
    }

    // graphs.cu's protocol, process by process.
    if !r.processes.is_empty() {
        out.push_str(
            "\nCUDA graphs, graphs.cu's protocol in a fresh process per side and run, sides in \
             rotating order (ratio = speed of the side / the reference's, the median over \
             rounds of the two processes' figures in the same round; > 1: faster)\n",
        );
        let rows = host_rows(r.processes.iter());
        out.push_str(&against_table(
            ["side / reference: figure", "side", "reference"],
            rows,
        ));
    }

    // Checks and errors.
    let passed = r.checks.iter().filter(|c| c.ok).count();
    out.push_str(&format!(
        "\nVerified: {passed}/{} data checks passed{}\n",
        r.checks.len(),
        if r.all_verified() { "" } else { " - FAILED" }
    ));
    for c in r.checks.iter().filter(|c| !c.ok) {
        out.push_str(&format!(
            "  FAILED {}: {}\n",
            c.what,
            c.detail.as_deref().unwrap_or("mismatch")
        ));
    }
    if !r.errors.is_empty() {
        out.push_str("Not measured:\n");
        for e in &r.errors {
            out.push_str(&format!("  {} ({}): {}\n", e.kind, e.stage, e.message));
        }
    }
    out.push_str(&format!("Total time: {:.1} s\n", r.seconds));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::sample;

    #[test]
    fn bench_table_on_sample_data() {
        let t = bench_table(&sample::results());
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("cuda-mem bench 0.1.0: NVIDIA H200 (compute 9.0"));
        let header = lines.iter().position(|l| l.starts_with("| kind ")).unwrap();
        assert_eq!(
            lines[header],
            "| kind     | dir | 4KiB         | 1MiB         | 64MiB        |"
        );
        assert_eq!(
            lines[header + 2],
            "| pageable | h2d | 6.67 (0.990) | 13.3 (0.990) | 20.0 (0.990) |"
        );
        assert!(t.contains("| device   | d2d | 600 (0.990)  | 1200 (0.990) | 1800 (0.990) |"));
        assert!(t.contains("| mapped   | -   | not measured |              |              |"));
        assert!(t.contains("| device             | 4000 | -     | -        |"));
        assert!(t.contains("| managed_prefetched | -    | -     | 40.0     |"));
        assert!(t.contains("| pinned | 12.5 (1.04) |"));
        assert!(
            t.contains("| 256MiB | 55.0      | 55.5      | 91.5      | 91.9          | 0.996 |")
        );
        assert!(t.contains("Verified: 1/1 data checks passed\n"));
        assert!(t.contains("  mapped (copies): unsupported"));
        // No line ends in spaces.
        assert!(t.lines().all(|l| l == l.trim_end()));
    }

    #[test]
    fn shmoo_summaries_and_peers_are_tabled() {
        let t = bench_table(&sample::results());
        // The band's summary is a row; the per-size row is in the JSON only.
        let shmoo: Vec<&str> = t.lines().filter(|l| l.contains("shmoo_h2d")).collect();
        assert_eq!(shmoo.len(), 1, "{shmoo:?}");
        assert!(shmoo[0].contains("band 22 kB-1 MB (geometric mean of 29 sizes)"));
        let cells =
            |l: &str| -> Vec<String> { l.split('|').map(|c| c.trim().to_string()).collect() };
        assert_eq!(cells(shmoo[0])[4..8], ["GB/s", "20.200", "20.400", "0.990"]);
        assert!(t.contains("cuda-mem × cudarc 0.19"));
        assert!(t.contains("graphs.cu's protocol in a fresh process per side"));
        let procs = t
            .lines()
            .find(|l| l.contains("graphs_processes_kernels"))
            .unwrap();
        assert_eq!(cells(procs)[4..8], ["us", "1.520", "1.500", "0.987"]);
        let peer = t.lines().find(|l| l.contains("alloc_free_pinned")).unwrap();
        assert_eq!(
            cells(peer)[3..8],
            ["4KiB", "us", "0.150", "5.900", "39.300"]
        );
    }

    #[test]
    fn sub_microsecond_allocation_rows_keep_two_decimals() {
        let mut r = sample::results();
        let mut row = r.allocs[0].clone();
        (row.kind, row.us, row.raw_us, row.ratio) = ("pool_bookkeeping_only", 0.784, 0.72, 1.089);
        r.allocs.push(row);
        let t = bench_table(&r);
        assert!(t.contains("| pinned                | 12.5 (1.04) |"), "{t}");
        assert!(t.contains("| pool_bookkeeping_only | 0.78 (1.09) |"), "{t}");
    }

    #[test]
    fn failed_checks_are_loud() {
        let mut r = sample::results();
        r.checks[0].ok = false;
        r.checks[0].detail = Some("word 7: 0x1 != 0x2".into());
        let t = bench_table(&r);
        assert!(t.contains("0/1 data checks passed - FAILED"));
        assert!(t.contains("FAILED pinned h2d+d2h copies: word 7: 0x1 != 0x2"));
    }

    #[test]
    fn key_sizes_when_many() {
        let all: Vec<u64> = (12..=30).map(|p| 1u64 << p).collect();
        assert_eq!(
            table_sizes(&all),
            vec![4 * KIB, MIB, 16 * MIB, 256 * MIB, GIB]
        );
        assert_eq!(table_sizes(&[16, 32]), vec![16, 32]);
    }

    #[test]
    fn info_listing() {
        let r = sample::results();
        let t = info_text(&InfoReport {
            versions: r.versions.clone(),
            devices: vec![r.device.clone()],
        });
        assert!(t.starts_with("CUDA runtime 13.0 (built with 13.0), driver supports CUDA 13.0\n"));
        assert!(t.contains("Device 0: NVIDIA H200\n"));
        assert!(t.contains("  compute capability         9.0\n"));
        assert!(t.contains("  memory                     140.0 GiB free of 141.0 GiB\n"));
        assert!(t.contains("  concurrent managed access  yes\n"));
        assert!(t.contains("  host native atomics        no\n"));
        assert!(t.contains("  host memory pools          yes\n"));
        assert!(t.contains("  copy engines               3 (copies both ways at once)\n"));
        assert!(t.contains(
            "  PCIe link                  32.0 GT/s PCIe x16 (max 32.0 GT/s PCIe x16)\n"
        ));
    }
}
