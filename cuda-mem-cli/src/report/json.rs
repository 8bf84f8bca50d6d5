//! The JSON of `info --json` and `bench --json`, as serde types: written from the results,
//! read back by `bench --baseline` and `compare`.
//!
//! `bench --json` writes (schema 2; numbers are JSON numbers, `null` where not measured):
//!
//! ```text
//! {"tool": "cuda-mem bench", "schema": 2, "version": "0.1.0",
//!  "runtime": "13.0", "driver": "13.0", "built_with": "13.0",
//!  "device": {"ordinal", "name", "compute_capability": "9.0", "pci_bus_id",
//!             "memory_free_bytes", "memory_total_bytes", "capabilities": {...},
//!             "memory_pools_supported", "host_memory_pools_supported", "copy_engines",
//!             "pcie_link": {"speed", "width", "max_speed", "max_width"} | null},
//!  "method": {"quick", "warmup", "samples", "statistic": "median", "ratio_statistic",
//!             "spread": "interquartile range", "timer": "cuda_events", "gb_bytes": 1e9,
//!             "stream": "legacy_default", "blocking_kernel", "sizes": [...],
//!             "kernel_bytes", "managed_bytes"},
//!  "copies": [{"kind", "direction", "bytes", "reps", "samples", "gbps", "raw_gbps", "ratio",
//!              "gbps_q1", "gbps_q3"}],
//!  "bidirectional": [{"bytes", "reps", "samples", "h2d_gbps", "d2h_gbps", "gbps",
//!                     "raw_gbps", "ratio", "gbps_q1", "gbps_q3"}],
//!  "kernels": [{"kind", "op", "bytes", "samples", "gbps", "gbps_q1", "gbps_q3"}],
//!  "alloc": [{"kind", "bytes", "reps", "us", "raw_us", "ratio", "note", "us_q1", "us_q3"}],
//!  "calls": [{"test", "direction", "bytes", "calls", "us", "raw_us", "ratio", "us_q1",
//!             "us_q3"}],
//!  "multi_gpu": [{"test", "direction", "bytes", "unit", "ours", "raw", "ratio", "ours_q1",
//!                 "ours_q3"}],
//!  "host": [{"test", "config", "bytes", "unit", "ours", "reference", "ratio"}],
//!  "shmoo": [... as "host"; reference: raw cudaMemcpyAsync],
//!  "peers": [... as "host"; reference: cudarc 0.19],
//!  "processes": [... as "host"; reference: graphs.cu, or raw calls from Rust],
//!  "verified": {"ok", "passed", "failed", "checks": [{"what", "bytes", "ok", "detail"}]},
//!  "errors": [{"kind", "stage", "message"}],
//!  "seconds": 12.3}
//! ```
//!
//! Schema 2 against 1: every field of 1 is kept, with the same meaning; added are the
//! `_q1`/`_q3` fields (first and third quartile of the cuda-mem figure over its samples,
//! its run-to-run spread, which `--baseline` measures changes against; `null` where not
//! measured), the `bidirectional` section, the device's pool, copy-engine and PCIe-link
//! fields and `method.spread`. Schema 1 files still load (the new fields read as absent);
//! so do schema 2 files written before the `host`, `shmoo`, `peers` and `processes` sections.
//!
//! Copy `ratio` is ours / raw bandwidth (1.0 = parity), alloc `ratio` ours / raw time; both
//! are the interquartile mean over interleaved sample pairs, which drift cannot bias, so they
//! may differ slightly from `gbps / raw_gbps` (each the median of its own path).

use serde::{Deserialize, Serialize};

use crate::results::{BenchResults, DeviceInfo, InfoReport};

/// The schema version `bench --json` writes.
pub const SCHEMA: u32 = 2;

/// A number that may be missing: non-finite values are written as `null`, and `null` reads
/// back as NaN.
mod num {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.is_finite() {
            s.serialize_f64(*x)
        } else {
            s.serialize_none()
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

/// `x` rounded to `digits` decimals (keeps the JSON readable; the measurements are not more
/// precise than that). NaN stays NaN.
pub fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

/// `x` rounded, `None` when not finite.
fn opt(x: f64, digits: i32) -> Option<f64> {
    x.is_finite().then(|| round(x, digits))
}

/// Memory capabilities.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapsJson {
    pub can_map_host_memory: bool,
    pub unified_addressing: bool,
    pub managed_memory: bool,
    pub concurrent_managed_access: bool,
    pub pageable_memory_access: bool,
    pub host_native_atomics: bool,
}

/// A PCIe link (sysfs).
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkJson {
    pub speed: String,
    pub width: Option<u32>,
    pub max_speed: Option<String>,
    pub max_width: Option<u32>,
}

/// One device.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceJson {
    pub ordinal: i32,
    pub name: String,
    pub compute_capability: String,
    pub pci_bus_id: String,
    pub memory_free_bytes: u64,
    pub memory_total_bytes: u64,
    pub capabilities: CapsJson,
    #[serde(default)]
    pub memory_pools_supported: Option<bool>,
    #[serde(default)]
    pub host_memory_pools_supported: Option<bool>,
    #[serde(default)]
    pub copy_engines: Option<i32>,
    #[serde(default)]
    pub pcie_link: Option<LinkJson>,
}

/// How `bench` measured.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MethodJson {
    pub quick: bool,
    pub warmup: u32,
    pub samples: u32,
    pub statistic: String,
    pub ratio_statistic: String,
    #[serde(default)]
    pub spread: Option<String>,
    pub timer: String,
    pub gb_bytes: u64,
    pub stream: String,
    pub blocking_kernel: bool,
    pub sizes: Vec<u64>,
    pub kernel_bytes: u64,
    pub managed_bytes: u64,
}

/// A copy row.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyJson {
    pub kind: String,
    pub direction: String,
    pub bytes: u64,
    pub reps: u32,
    pub samples: u32,
    #[serde(with = "num")]
    pub gbps: f64,
    #[serde(with = "num")]
    pub raw_gbps: f64,
    #[serde(with = "num")]
    pub ratio: f64,
    #[serde(default)]
    pub gbps_q1: Option<f64>,
    #[serde(default)]
    pub gbps_q3: Option<f64>,
}

/// A bidirectional row.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BidirJson {
    pub bytes: u64,
    pub reps: u32,
    pub samples: u32,
    #[serde(with = "num")]
    pub h2d_gbps: f64,
    #[serde(with = "num")]
    pub d2h_gbps: f64,
    #[serde(with = "num")]
    pub gbps: f64,
    #[serde(with = "num")]
    pub raw_gbps: f64,
    #[serde(with = "num")]
    pub ratio: f64,
    #[serde(default)]
    pub gbps_q1: Option<f64>,
    #[serde(default)]
    pub gbps_q3: Option<f64>,
}

/// A kernel row.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelJson {
    pub kind: String,
    pub op: String,
    pub bytes: u64,
    pub samples: u32,
    #[serde(with = "num")]
    pub gbps: f64,
    #[serde(default)]
    pub gbps_q1: Option<f64>,
    #[serde(default)]
    pub gbps_q3: Option<f64>,
}

/// An allocation row.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocJson {
    pub kind: String,
    pub bytes: u64,
    pub reps: u32,
    #[serde(with = "num")]
    pub us: f64,
    #[serde(with = "num")]
    pub raw_us: f64,
    #[serde(with = "num")]
    pub ratio: f64,
    pub note: Option<String>,
    #[serde(default)]
    pub us_q1: Option<f64>,
    #[serde(default)]
    pub us_q3: Option<f64>,
}

/// A per-call row.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallJson {
    pub test: String,
    pub direction: String,
    pub bytes: u64,
    pub calls: u32,
    #[serde(with = "num")]
    pub us: f64,
    #[serde(with = "num")]
    pub raw_us: f64,
    #[serde(with = "num")]
    pub ratio: f64,
    #[serde(default)]
    pub us_q1: Option<f64>,
    #[serde(default)]
    pub us_q3: Option<f64>,
}

/// A two-GPU row.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MultiJson {
    pub test: String,
    pub direction: String,
    pub bytes: u64,
    pub unit: String,
    #[serde(with = "num")]
    pub ours: f64,
    #[serde(with = "num")]
    pub raw: f64,
    #[serde(with = "num")]
    pub ratio: f64,
    #[serde(default)]
    pub ours_q1: Option<f64>,
    #[serde(default)]
    pub ours_q3: Option<f64>,
}

/// A host-side row (pinned pool, cold pinning, staged copies).
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostJson {
    pub test: String,
    pub config: String,
    pub bytes: u64,
    pub unit: String,
    #[serde(with = "num")]
    pub ours: f64,
    #[serde(with = "num")]
    pub reference: f64,
    #[serde(with = "num")]
    pub ratio: f64,
}

/// One data check.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckJson {
    pub what: String,
    pub bytes: u64,
    pub ok: bool,
    pub detail: Option<String>,
}

/// The data checks.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifiedJson {
    pub ok: bool,
    pub passed: u64,
    pub failed: u64,
    pub checks: Vec<CheckJson>,
}

/// A kind not measured.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorJson {
    pub kind: String,
    pub stage: String,
    pub message: String,
}

/// `bench --json`: the whole document (shape in the module docs).
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchJson {
    pub tool: String,
    pub schema: u32,
    pub version: String,
    pub runtime: String,
    pub driver: String,
    pub built_with: String,
    pub device: DeviceJson,
    pub method: MethodJson,
    pub copies: Vec<CopyJson>,
    #[serde(default)]
    pub bidirectional: Vec<BidirJson>,
    pub kernels: Vec<KernelJson>,
    pub alloc: Vec<AllocJson>,
    #[serde(default)]
    pub calls: Vec<CallJson>,
    #[serde(default)]
    pub multi_gpu: Vec<MultiJson>,
    #[serde(default)]
    pub host: Vec<HostJson>,
    #[serde(default)]
    pub shmoo: Vec<HostJson>,
    #[serde(default)]
    pub peers: Vec<HostJson>,
    #[serde(default)]
    pub processes: Vec<HostJson>,
    pub verified: VerifiedJson,
    pub errors: Vec<ErrorJson>,
    #[serde(with = "num")]
    pub seconds: f64,
}

/// `info --json`.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InfoJson {
    pub tool: String,
    pub version: String,
    pub runtime: String,
    pub driver: String,
    pub built_with: String,
    pub devices: Vec<DeviceJson>,
}

/// Pretty JSON text, ending with a newline.
fn pretty(doc: &impl Serialize) -> String {
    // Serializing these plain structs cannot fail (string keys, no maps).
    let mut s = serde_json::to_string_pretty(doc).unwrap_or_default();
    s.push('\n');
    s
}

impl BenchJson {
    /// Pretty JSON text, ending with a newline.
    pub fn render(&self) -> String {
        pretty(self)
    }

    /// Reads a saved `bench --json` file (schema 1 or 2).
    pub fn parse(text: &str) -> Result<BenchJson, serde_json::Error> {
        serde_json::from_str(text)
    }
}

impl InfoJson {
    /// Pretty JSON text, ending with a newline.
    pub fn render(&self) -> String {
        pretty(self)
    }
}

fn q(spread: (f64, f64), digits: i32) -> (Option<f64>, Option<f64>) {
    (opt(spread.0, digits), opt(spread.1, digits))
}

/// The JSON of one device.
pub fn device_json(d: &DeviceInfo) -> DeviceJson {
    let c = &d.caps;
    let e = &d.extra;
    DeviceJson {
        ordinal: d.ordinal,
        name: d.name.clone(),
        compute_capability: format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
        pci_bus_id: d.pci_bus_id.clone(),
        memory_free_bytes: d.free_bytes,
        memory_total_bytes: d.total_bytes,
        capabilities: CapsJson {
            can_map_host_memory: c.can_map_host_memory,
            unified_addressing: c.unified_addressing,
            managed_memory: c.managed_memory,
            concurrent_managed_access: c.concurrent_managed_access,
            pageable_memory_access: c.pageable_memory_access,
            host_native_atomics: c.host_native_atomics,
        },
        memory_pools_supported: e.memory_pools,
        host_memory_pools_supported: e.host_memory_pools,
        copy_engines: e.copy_engines,
        pcie_link: e.pcie_link.as_ref().map(|l| LinkJson {
            speed: l.speed.clone(),
            width: l.width,
            max_speed: l.max_speed.clone(),
            max_width: l.max_width,
        }),
    }
}

/// The JSON of `info --json`.
pub fn info_json(r: &InfoReport) -> InfoJson {
    InfoJson {
        tool: "cuda-mem info".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        runtime: r.versions.runtime.clone(),
        driver: r.versions.driver.clone(),
        built_with: r.versions.built_with.clone(),
        devices: r.devices.iter().map(device_json).collect(),
    }
}

/// One row of `host`, `shmoo` or `peers`.
fn host_json(h: &crate::results::HostRow) -> HostJson {
    HostJson {
        test: h.test.into(),
        config: h.config.clone(),
        bytes: h.bytes,
        unit: h.unit.into(),
        ours: round(h.ours, 4),
        reference: round(h.reference, 4),
        ratio: round(h.ratio, 4),
    }
}

/// The JSON of `bench --json` (shape in the module docs).
pub fn bench_json(r: &BenchResults) -> BenchJson {
    let m = &r.method;
    let failed = r.checks.iter().filter(|c| !c.ok).count() as u64;
    BenchJson {
        tool: "cuda-mem bench".into(),
        schema: SCHEMA,
        version: r.version.clone(),
        runtime: r.versions.runtime.clone(),
        driver: r.versions.driver.clone(),
        built_with: r.versions.built_with.clone(),
        device: device_json(&r.device),
        method: MethodJson {
            quick: m.quick,
            warmup: m.warmup,
            samples: m.samples,
            statistic: "median".into(),
            ratio_statistic: "interquartile mean of paired ours/raw ratios".into(),
            spread: Some("interquartile range (q1, q3) of the cuda-mem samples".into()),
            timer: "cuda_events".into(),
            gb_bytes: 1_000_000_000,
            stream: "legacy_default".into(),
            blocking_kernel: m.blocking_kernel,
            sizes: m.sizes.clone(),
            kernel_bytes: m.kernel_bytes,
            managed_bytes: m.managed_bytes,
        },
        copies: r
            .copies
            .iter()
            .map(|c| {
                let (gbps_q1, gbps_q3) = q(c.spread, 3);
                CopyJson {
                    kind: c.kind.into(),
                    direction: c.direction.into(),
                    bytes: c.bytes,
                    reps: c.reps,
                    samples: c.samples,
                    gbps: round(c.gbps, 3),
                    raw_gbps: round(c.raw_gbps, 3),
                    ratio: round(c.ratio, 4),
                    gbps_q1,
                    gbps_q3,
                }
            })
            .collect(),
        bidirectional: r
            .bidir
            .iter()
            .map(|b| {
                let (gbps_q1, gbps_q3) = q(b.spread, 3);
                BidirJson {
                    bytes: b.bytes,
                    reps: b.reps,
                    samples: b.samples,
                    h2d_gbps: round(b.h2d_gbps, 3),
                    d2h_gbps: round(b.d2h_gbps, 3),
                    gbps: round(b.gbps, 3),
                    raw_gbps: round(b.raw_gbps, 3),
                    ratio: round(b.ratio, 4),
                    gbps_q1,
                    gbps_q3,
                }
            })
            .collect(),
        kernels: r
            .kernels
            .iter()
            .map(|k| {
                let (gbps_q1, gbps_q3) = q(k.spread, 3);
                KernelJson {
                    kind: k.kind.into(),
                    op: k.op.into(),
                    bytes: k.bytes,
                    samples: k.samples,
                    gbps: round(k.gbps, 3),
                    gbps_q1,
                    gbps_q3,
                }
            })
            .collect(),
        alloc: r
            .allocs
            .iter()
            .map(|a| {
                let (us_q1, us_q3) = q(a.spread, 3);
                AllocJson {
                    kind: a.kind.into(),
                    bytes: a.bytes,
                    reps: a.reps,
                    us: round(a.us, 3),
                    raw_us: round(a.raw_us, 3),
                    ratio: round(a.ratio, 4),
                    note: a.note.map(Into::into),
                    us_q1,
                    us_q3,
                }
            })
            .collect(),
        calls: r
            .calls
            .iter()
            .map(|c| {
                let (us_q1, us_q3) = q(c.spread, 4);
                CallJson {
                    test: c.test.into(),
                    direction: c.direction.into(),
                    bytes: c.bytes,
                    calls: c.calls,
                    us: round(c.us, 4),
                    raw_us: round(c.raw_us, 4),
                    ratio: round(c.ratio, 4),
                    us_q1,
                    us_q3,
                }
            })
            .collect(),
        multi_gpu: r
            .multi
            .iter()
            .map(|m| {
                let (ours_q1, ours_q3) = q(m.spread, 4);
                MultiJson {
                    test: m.test.into(),
                    direction: m.direction.into(),
                    bytes: m.bytes,
                    unit: m.unit.into(),
                    ours: round(m.ours, 4),
                    raw: round(m.raw, 4),
                    ratio: round(m.ratio, 4),
                    ours_q1,
                    ours_q3,
                }
            })
            .collect(),
        host: r.host.iter().map(host_json).collect(),
        shmoo: r.shmoo.iter().map(host_json).collect(),
        peers: r.peers.iter().map(host_json).collect(),
        processes: r.processes.iter().map(host_json).collect(),
        verified: VerifiedJson {
            ok: r.all_verified(),
            passed: r.checks.len() as u64 - failed,
            failed,
            checks: r
                .checks
                .iter()
                .map(|c| CheckJson {
                    what: c.what.clone(),
                    bytes: c.bytes,
                    ok: c.ok,
                    detail: c.detail.clone(),
                })
                .collect(),
        },
        errors: r
            .errors
            .iter()
            .map(|e| ErrorJson {
                kind: e.kind.clone(),
                stage: e.stage.into(),
                message: e.message.clone(),
            })
            .collect(),
        seconds: round(r.seconds, 2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::sample;
    use serde_json::Value;

    /// NaN != NaN: compare through the text, where both are `null`.
    fn same(a: &BenchJson, b: &BenchJson) -> bool {
        a.render() == b.render()
    }

    #[test]
    fn bench_json_round_trips() {
        let mut r = sample::results();
        r.multi[0].raw = f64::NAN;
        let j = bench_json(&r);
        let text = j.render();
        let back = BenchJson::parse(&text).unwrap();
        assert!(same(&j, &back));
        assert_eq!(back.copies, j.copies);
        assert_eq!(back.bidirectional, j.bidirectional);
        assert!(back.multi_gpu[0].raw.is_nan());
        // And once more: the text is a fixed point.
        assert_eq!(back.render(), text);
    }

    #[test]
    fn bench_shape() {
        let j = bench_json(&sample::results());
        let text = j.render();
        let v: Value = serde_json::from_str(&text).unwrap();
        // The top-level keys, in the order written (serde_json's map sorts them).
        let keys: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("  \""))
            .filter_map(|l| l.split_once('"').map(|(k, _)| k))
            .collect();
        assert_eq!(
            keys,
            [
                "tool",
                "schema",
                "version",
                "runtime",
                "driver",
                "built_with",
                "device",
                "method",
                "copies",
                "bidirectional",
                "kernels",
                "alloc",
                "calls",
                "multi_gpu",
                "host",
                "shmoo",
                "peers",
                "processes",
                "verified",
                "errors",
                "seconds"
            ]
        );
        assert_eq!(v["host"][0]["test"], "staged_h2d");
        assert_eq!(v["host"][0]["ratio"], 3.67);
        assert_eq!(v["tool"], "cuda-mem bench");
        assert_eq!(v["schema"], 2);
        let c = &v["copies"][0];
        assert_eq!(v["copies"].as_array().unwrap().len(), 15);
        assert_eq!(c["kind"], "pageable");
        assert_eq!(c["direction"], "h2d");
        assert_eq!(c["bytes"], 4096);
        assert_eq!(c["ratio"], 0.99);
        assert_eq!(c["gbps_q1"], 6.533);
        assert_eq!(v["device"]["compute_capability"], "9.0");
        assert_eq!(v["device"]["capabilities"]["managed_memory"], true);
        assert_eq!(v["device"]["copy_engines"], 3);
        assert_eq!(v["device"]["pcie_link"]["width"], 16);
        assert_eq!(v["verified"]["ok"], true);
        assert_eq!(v["verified"]["failed"], 0);
        assert_eq!(v["errors"][0]["stage"], "copies");
        assert_eq!(v["alloc"][0]["ratio"], 1.0417);
        assert_eq!(v["alloc"][0]["note"], Value::Null);
        assert_eq!(v["bidirectional"][0]["gbps"], 91.5);
        assert_eq!(v["kernels"][1]["gbps_q1"], Value::Null);
        assert_eq!(v["method"]["gb_bytes"], 1_000_000_000u64);
        assert_eq!(
            v["errors"][0]["message"],
            "unsupported: device 0 does not support \"mapping\""
        );
    }

    #[test]
    fn schema_1_loads() {
        // A schema-1 document as the H200 run of issue 14 wrote it (trimmed).
        let text = r#"{"tool": "cuda-mem bench", "schema": 1, "version": "0.1.0",
          "runtime": "13.0", "driver": "13.0", "built_with": "13.0",
          "device": {"ordinal": 0, "name": "NVIDIA H200", "compute_capability": "9.0",
            "pci_bus_id": "0000:00:06.0", "memory_free_bytes": 1, "memory_total_bytes": 2,
            "capabilities": {"can_map_host_memory": true, "unified_addressing": true,
              "managed_memory": true, "concurrent_managed_access": true,
              "pageable_memory_access": false, "host_native_atomics": false}},
          "method": {"quick": false, "warmup": 1, "samples": 15, "statistic": "median",
            "ratio_statistic": "interquartile mean of paired ours/raw ratios",
            "timer": "cuda_events", "gb_bytes": 1000000000, "stream": "legacy_default",
            "blocking_kernel": true, "sizes": [4096], "kernel_bytes": 1, "managed_bytes": 1},
          "copies": [{"kind": "pinned", "direction": "h2d", "bytes": 4096, "reps": 256,
            "samples": 15, "gbps": 2.5, "raw_gbps": 2.5, "ratio": 1.0}],
          "kernels": [], "alloc": [], "calls": [],
          "multi_gpu": [{"test": "nccl_all_reduce", "direction": "2 ranks", "bytes": 1,
            "unit": "GB/s busbw", "ours": 300.0, "raw": null, "ratio": null}],
          "verified": {"ok": true, "passed": 1, "failed": 0, "checks": []},
          "errors": [], "seconds": 1.0}"#;
        let j = BenchJson::parse(text).unwrap();
        assert_eq!(j.schema, 1);
        assert_eq!(j.copies[0].gbps_q1, None);
        assert!(j.bidirectional.is_empty());
        assert!(j.multi_gpu[0].raw.is_nan());
        assert_eq!(j.device.copy_engines, None);
    }

    #[test]
    fn info_shape() {
        let r = sample::results();
        let info = InfoReport {
            versions: r.versions.clone(),
            devices: vec![r.device.clone()],
        };
        let j = info_json(&info);
        let v: Value = serde_json::from_str(&j.render()).unwrap();
        assert_eq!(v["driver"], "13.0");
        assert_eq!(v["devices"][0]["name"], "NVIDIA H200");
        assert_eq!(v["devices"][0]["memory_total_bytes"], 141u64 << 30);
        assert_eq!(v["devices"][0]["host_memory_pools_supported"], true);
        assert_eq!(
            v["devices"][0]["capabilities"]["pageable_memory_access"],
            false
        );
    }
}
