//! A small JSON value and its writer (no external crates), and the JSON shapes of `info` and
//! `bench`.
//!
//! `bench --json` writes (schema 1; numbers are JSON numbers, `null` where not measured):
//!
//! ```text
//! {"tool": "cuda-mem bench", "schema": 1, "version": "0.1.0",
//!  "runtime": "13.0", "driver": "13.0", "built_with": "13.0",
//!  "device": {"ordinal", "name", "compute_capability": "9.0", "pci_bus_id",
//!             "memory_free_bytes", "memory_total_bytes", "capabilities": {...}},
//!  "method": {"quick", "warmup", "samples", "statistic": "median", "timer": "cuda_events",
//!             "gb_bytes": 1e9, "stream": "legacy_default", "blocking_kernel", "sizes": [...],
//!             "kernel_bytes", "managed_bytes"},
//!  "copies": [{"kind", "direction", "bytes", "reps", "samples", "gbps", "raw_gbps", "ratio"}],
//!  "kernels": [{"kind", "op", "bytes", "samples", "gbps"}],
//!  "alloc": [{"kind", "bytes", "reps", "us", "raw_us", "ratio", "note"}],
//!  "calls": [{"test", "direction", "bytes", "calls", "us", "raw_us", "ratio"}],
//!  "multi_gpu": [{"test", "direction", "bytes", "unit", "ours", "raw", "ratio"}],
//!  "verified": {"ok", "passed", "failed", "checks": [{"what", "bytes", "ok", "detail"}]},
//!  "errors": [{"kind", "stage", "message"}],
//!  "seconds": 12.3}
//! ```
//!
//! Copy `ratio` is ours / raw bandwidth (1.0 = parity), alloc `ratio` ours / raw time; both
//! are the interquartile mean over interleaved sample pairs, which drift cannot bias, so they
//! may differ slightly from `gbps / raw_gbps` (each the median of its own path).

use crate::results::{BenchResults, DeviceInfo, InfoReport};

/// A JSON value. Objects keep their key order.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A number; non-finite values are written as `null`.
    Num(f64),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object.
    Obj(Vec<(String, Json)>),
}

impl From<bool> for Json {
    fn from(v: bool) -> Self {
        Json::Bool(v)
    }
}
impl From<i32> for Json {
    fn from(v: i32) -> Self {
        Json::Int(v.into())
    }
}
impl From<u32> for Json {
    fn from(v: u32) -> Self {
        Json::Int(v.into())
    }
}
impl From<u64> for Json {
    fn from(v: u64) -> Self {
        i64::try_from(v).map_or(Json::Num(v as f64), Json::Int)
    }
}
impl From<f64> for Json {
    fn from(v: f64) -> Self {
        Json::Num(v)
    }
}
impl From<&str> for Json {
    fn from(v: &str) -> Self {
        Json::Str(v.to_string())
    }
}
impl From<String> for Json {
    fn from(v: String) -> Self {
        Json::Str(v)
    }
}
impl<T: Into<Json>> From<Option<T>> for Json {
    fn from(v: Option<T>) -> Self {
        v.map_or(Json::Null, Into::into)
    }
}

/// Builds an object from `(key, value)` pairs.
pub fn obj<const N: usize>(pairs: [(&str, Json); N]) -> Json {
    Json::Obj(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// `x` rounded to `digits` decimals (keeps the JSON readable; the measurements are not more
/// precise than that).
pub fn round(x: f64, digits: i32) -> Json {
    let m = 10f64.powi(digits);
    Json::Num((x * m).round() / m)
}

impl Json {
    /// The member `key` of an object.
    #[cfg(test)]
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn is_scalar(&self) -> bool {
        !matches!(self, Json::Arr(_) | Json::Obj(_))
    }

    /// Pretty text: objects and arrays of scalars on one line, others indented by two spaces;
    /// ends with a newline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out.push('\n');
        out
    }

    fn write(&self, out: &mut String, indent: usize) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(i) => out.push_str(&i.to_string()),
            Json::Num(x) if x.is_finite() => out.push_str(&format_num(*x)),
            Json::Num(_) => out.push_str("null"),
            Json::Str(s) => write_str(out, s),
            Json::Arr(items) => {
                let flat = items.iter().all(Json::is_scalar);
                write_seq(out, indent, '[', ']', flat, items.iter(), |out, v, ind| {
                    v.write(out, ind)
                });
            }
            Json::Obj(members) => {
                let flat = members.iter().all(|(_, v)| v.is_scalar());
                write_seq(
                    out,
                    indent,
                    '{',
                    '}',
                    flat,
                    members.iter(),
                    |out, (k, v), ind| {
                        write_str(out, k);
                        out.push_str(": ");
                        v.write(out, ind);
                    },
                );
            }
        }
    }
}

fn write_seq<I: ExactSizeIterator>(
    out: &mut String,
    indent: usize,
    open: char,
    close: char,
    flat: bool,
    items: I,
    mut each: impl FnMut(&mut String, I::Item, usize),
) {
    out.push(open);
    if items.len() == 0 {
        out.push(close);
        return;
    }
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(',');
            if flat {
                out.push(' ');
            }
        }
        if !flat {
            out.push('\n');
            out.push_str(&" ".repeat(indent + 2));
        }
        each(out, item, indent + 2);
    }
    if !flat {
        out.push('\n');
        out.push_str(&" ".repeat(indent));
    }
    out.push(close);
}

/// A finite number as JSON: integers without a fraction, others as Rust's shortest form (never
/// an exponent, which JSON would accept anyway).
fn format_num(x: f64) -> String {
    if x == x.trunc() && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn device_json(d: &DeviceInfo) -> Json {
    let c = &d.caps;
    obj([
        ("ordinal", d.ordinal.into()),
        ("name", d.name.as_str().into()),
        (
            "compute_capability",
            format!("{}.{}", d.compute_capability.0, d.compute_capability.1).into(),
        ),
        ("pci_bus_id", d.pci_bus_id.as_str().into()),
        ("memory_free_bytes", d.free_bytes.into()),
        ("memory_total_bytes", d.total_bytes.into()),
        (
            "capabilities",
            obj([
                ("can_map_host_memory", c.can_map_host_memory.into()),
                ("unified_addressing", c.unified_addressing.into()),
                ("managed_memory", c.managed_memory.into()),
                (
                    "concurrent_managed_access",
                    c.concurrent_managed_access.into(),
                ),
                ("pageable_memory_access", c.pageable_memory_access.into()),
                ("host_native_atomics", c.host_native_atomics.into()),
            ]),
        ),
    ])
}

/// The JSON of `info --json`.
pub fn info_json(r: &InfoReport) -> Json {
    obj([
        ("tool", "cuda-mem info".into()),
        ("version", env!("CARGO_PKG_VERSION").into()),
        ("runtime", r.versions.runtime.as_str().into()),
        ("driver", r.versions.driver.as_str().into()),
        ("built_with", r.versions.built_with.as_str().into()),
        (
            "devices",
            Json::Arr(r.devices.iter().map(device_json).collect()),
        ),
    ])
}

/// The JSON of `bench --json` (shape in the module docs).
pub fn bench_json(r: &BenchResults) -> Json {
    let m = &r.method;
    let copies = r.copies.iter().map(|c| {
        obj([
            ("kind", c.kind.into()),
            ("direction", c.direction.into()),
            ("bytes", c.bytes.into()),
            ("reps", c.reps.into()),
            ("samples", c.samples.into()),
            ("gbps", round(c.gbps, 3)),
            ("raw_gbps", round(c.raw_gbps, 3)),
            ("ratio", round(c.ratio, 4)),
        ])
    });
    let kernels = r.kernels.iter().map(|k| {
        obj([
            ("kind", k.kind.into()),
            ("op", k.op.into()),
            ("bytes", k.bytes.into()),
            ("samples", k.samples.into()),
            ("gbps", round(k.gbps, 3)),
        ])
    });
    let allocs = r.allocs.iter().map(|a| {
        obj([
            ("kind", a.kind.into()),
            ("bytes", a.bytes.into()),
            ("reps", a.reps.into()),
            ("us", round(a.us, 3)),
            ("raw_us", round(a.raw_us, 3)),
            ("ratio", round(a.ratio, 4)),
            ("note", a.note.into()),
        ])
    });
    let calls = r.calls.iter().map(|c| {
        obj([
            ("test", c.test.into()),
            ("direction", c.direction.into()),
            ("bytes", c.bytes.into()),
            ("calls", c.calls.into()),
            ("us", round(c.us, 4)),
            ("raw_us", round(c.raw_us, 4)),
            ("ratio", round(c.ratio, 4)),
        ])
    });
    let multi = r.multi.iter().map(|m| {
        obj([
            ("test", m.test.into()),
            ("direction", m.direction.into()),
            ("bytes", m.bytes.into()),
            ("unit", m.unit.into()),
            ("ours", round(m.ours, 4)),
            ("raw", round(m.raw, 4)),
            ("ratio", round(m.ratio, 4)),
        ])
    });
    let checks = r.checks.iter().map(|c| {
        obj([
            ("what", c.what.as_str().into()),
            ("bytes", c.bytes.into()),
            ("ok", c.ok.into()),
            ("detail", c.detail.clone().into()),
        ])
    });
    let failed = r.checks.iter().filter(|c| !c.ok).count() as u64;
    let errors = r.errors.iter().map(|e| {
        obj([
            ("kind", e.kind.as_str().into()),
            ("stage", e.stage.into()),
            ("message", e.message.as_str().into()),
        ])
    });
    obj([
        ("tool", "cuda-mem bench".into()),
        ("schema", 1u32.into()),
        ("version", r.version.as_str().into()),
        ("runtime", r.versions.runtime.as_str().into()),
        ("driver", r.versions.driver.as_str().into()),
        ("built_with", r.versions.built_with.as_str().into()),
        ("device", device_json(&r.device)),
        (
            "method",
            obj([
                ("quick", m.quick.into()),
                ("warmup", m.warmup.into()),
                ("samples", m.samples.into()),
                ("statistic", "median".into()),
                (
                    "ratio_statistic",
                    "interquartile mean of paired ours/raw ratios".into(),
                ),
                ("timer", "cuda_events".into()),
                ("gb_bytes", 1e9.into()),
                ("stream", "legacy_default".into()),
                ("blocking_kernel", m.blocking_kernel.into()),
                (
                    "sizes",
                    Json::Arr(m.sizes.iter().map(|&s| s.into()).collect()),
                ),
                ("kernel_bytes", m.kernel_bytes.into()),
                ("managed_bytes", m.managed_bytes.into()),
            ]),
        ),
        ("copies", Json::Arr(copies.collect())),
        ("kernels", Json::Arr(kernels.collect())),
        ("alloc", Json::Arr(allocs.collect())),
        ("calls", Json::Arr(calls.collect())),
        ("multi_gpu", Json::Arr(multi.collect())),
        (
            "verified",
            obj([
                ("ok", r.all_verified().into()),
                ("passed", (r.checks.len() as u64 - failed).into()),
                ("failed", failed.into()),
                ("checks", Json::Arr(checks.collect())),
            ]),
        ),
        ("errors", Json::Arr(errors.collect())),
        ("seconds", round(r.seconds, 2)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::sample;

    #[test]
    fn writer_escapes_and_formats() {
        let v = obj([
            ("s", "a\"b\\c\nd\u{1}é".into()),
            ("n", Json::Num(f64::NAN)),
            ("x", 2.5.into()),
            ("i", 3.0.into()),
            ("big", u64::MAX.into()),
            ("e", Json::Arr(vec![])),
            ("o", obj([("a", Json::Null), ("b", true.into())])),
        ]);
        let want = r#"{
  "s": "a\"b\\c\nd\u0001é",
  "n": null,
  "x": 2.5,
  "i": 3,
  "big": 18446744073709552000,
  "e": [],
  "o": {"a": null, "b": true}
}
"#;
        assert_eq!(v.render(), want);
    }

    #[test]
    fn bench_shape() {
        let j = bench_json(&sample::results());
        let keys: Vec<&str> = match &j {
            Json::Obj(m) => m.iter().map(|(k, _)| k.as_str()).collect(),
            _ => panic!("not an object"),
        };
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
                "kernels",
                "alloc",
                "calls",
                "multi_gpu",
                "verified",
                "errors",
                "seconds"
            ]
        );
        assert_eq!(j.get("tool"), Some(&Json::Str("cuda-mem bench".into())));
        let Some(Json::Arr(copies)) = j.get("copies") else {
            panic!("copies")
        };
        assert_eq!(copies.len(), 15);
        let c = &copies[0];
        assert_eq!(c.get("kind"), Some(&Json::Str("pageable".into())));
        assert_eq!(c.get("direction"), Some(&Json::Str("h2d".into())));
        assert_eq!(c.get("bytes"), Some(&Json::Int(4096)));
        assert_eq!(c.get("ratio"), Some(&Json::Num(0.99)));
        let dev = j.get("device").unwrap();
        assert_eq!(
            dev.get("compute_capability"),
            Some(&Json::Str("9.0".into()))
        );
        let caps = dev.get("capabilities").unwrap();
        assert_eq!(caps.get("managed_memory"), Some(&Json::Bool(true)));
        let v = j.get("verified").unwrap();
        assert_eq!(v.get("ok"), Some(&Json::Bool(true)));
        assert_eq!(v.get("failed"), Some(&Json::Int(0)));
        let Some(Json::Arr(errors)) = j.get("errors") else {
            panic!("errors")
        };
        assert_eq!(errors[0].get("stage"), Some(&Json::Str("copies".into())));
        let a = &j.get("alloc").unwrap();
        let Json::Arr(a) = a else { panic!("alloc") };
        assert_eq!(a[0].get("ratio"), Some(&Json::Num(1.0417)));
        assert_eq!(a[0].get("note"), Some(&Json::Null));
        // Each copy row is one line, so the text is easy to grep as well as to parse.
        let text = j.render();
        assert!(text.contains(
            "{\"kind\": \"pinned\", \"direction\": \"h2d\", \"bytes\": 4096, \"reps\": 16, \
             \"samples\": 5, \"gbps\": 18.333, \"raw_gbps\": 18.519, \"ratio\": 0.99}"
        ));
        assert!(text
            .contains("\"message\": \"unsupported: device 0 does not support \\\"mapping\\\"\""));
    }

    #[test]
    fn info_shape() {
        let r = sample::results();
        let info = InfoReport {
            versions: r.versions.clone(),
            devices: vec![r.device.clone()],
        };
        let j = info_json(&info);
        assert_eq!(j.get("driver"), Some(&Json::Str("13.0".into())));
        let Some(Json::Arr(devs)) = j.get("devices") else {
            panic!("devices")
        };
        assert_eq!(devs[0].get("name"), Some(&Json::Str("NVIDIA H200".into())));
        assert_eq!(
            devs[0].get("memory_total_bytes"),
            Some(&Json::Int(141 << 30))
        );
        let text = j.render();
        assert!(text.contains("\"can_map_host_memory\": true"));
        assert!(text.contains("\"pageable_memory_access\": false"));
    }
}
