//! The built `cuda-mem` binary, end to end.
//!
//! Without a GPU (CPU CI): argument errors, help, version, and the no-driver paragraph. With a
//! GPU: `info` lists the device with the capabilities the library reads, and
//! `bench --quick --json -` completes, verifies its data and reports every kind. GPU tests
//! print `SKIP: no CUDA device: ...` when there is none, and fail instead when
//! `CUDA_MEM_REQUIRE_GPU=1`.

use std::process::{Command, Output};

/// The binary: `CUDA_MEM_BIN` where the GPU bundle's runner sets it (the test executable runs
/// away from the build tree there), else the one cargo built.
fn cuda_mem(args: &[&str]) -> Output {
    let bin =
        std::env::var_os("CUDA_MEM_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_cuda-mem").into());
    Command::new(bin)
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the cuda-mem binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The device count, or why there is no device. Panics (fails the test) when there is none and
/// `CUDA_MEM_REQUIRE_GPU=1`.
fn gpu() -> Result<i32, String> {
    let r = match cuda_mem::Device::count() {
        Ok(n) if n > 0 => Ok(n),
        Ok(_) => Err("no device".to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(why) = &r {
        assert!(
            std::env::var("CUDA_MEM_REQUIRE_GPU").as_deref() != Ok("1"),
            "CUDA_MEM_REQUIRE_GPU=1 but no CUDA device: {why}"
        );
    }
    r
}

fn assert_no_panic(stderr: &str) {
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(!stderr.contains("stack backtrace"), "backtrace: {stderr}");
    assert!(
        !stderr.contains("RUST_BACKTRACE"),
        "backtrace hint: {stderr}"
    );
}

#[test]
fn usage_errors_exit_2() {
    for (args, want) in [
        (&["--frobnicate"][..], "unexpected argument '--frobnicate'"),
        (&["frobnicate"][..], "unrecognized subcommand 'frobnicate'"),
        (&["bench", "--fast"][..], "unexpected argument '--fast'"),
        (&["bench", "--samples", "1"][..], "3 to 1000"),
        (&["bench", "--sizes", "100"][..], "multiple of 16"),
        (
            &["bench", "--json", "-", "--svg", "-"][..],
            "cannot both write to stdout",
        ),
        (&["bench", "--fail-on-regression"][..], "needs --baseline"),
        (
            &["info", "--verbose"][..],
            "unexpected argument '--verbose'",
        ),
        (&["completions", "tcsh"][..], "invalid value 'tcsh'"),
        (
            &["compare", "only-one.json"][..],
            "required arguments were not provided",
        ),
    ] {
        let out = cuda_mem(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(err.contains("--help"), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
        assert_no_panic(&err);
    }
    // No command: the help, on stderr, exit 2.
    let out = cuda_mem(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("Commands:"));
}

#[test]
fn help_version_and_completions() {
    let out = cuda_mem(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for word in [
        "info",
        "bench",
        "compare",
        "plot",
        "completions",
        "--version",
    ] {
        assert!(help.contains(word), "{word} missing from help");
    }
    // `bench --help` prints help, it never starts a run.
    let out = cuda_mem(&["bench", "--quick", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let bench_help = text(&out.stdout);
    for word in [
        "--quick",
        "--json",
        "--svg",
        "--sizes",
        "--baseline",
        "--fail-on-regression",
    ] {
        assert!(bench_help.contains(word), "{word} missing from bench help");
    }
    let out = cuda_mem(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    let version = text(&out.stdout);
    assert!(version.starts_with(&format!("cuda-mem {}", env!("CARGO_PKG_VERSION"))));
    // The library features it was built with (whether the fault seams are in: scripts check
    // the shipped binary's line), `measure` always.
    assert!(version.contains("library features: "), "{version}");
    assert!(version.contains("measure"), "{version}");
    for (shell, marker) in [
        ("bash", "_cuda-mem()"),
        ("zsh", "#compdef cuda-mem"),
        ("fish", "complete -c cuda-mem"),
    ] {
        let out = cuda_mem(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        assert!(script.contains("baseline"), "{shell}");
    }
}

/// A saved run with one copy and one allocation figure, schema 2 when `q` gives spreads.
fn saved(gbps: f64, us: f64, q: Option<(f64, f64)>) -> String {
    let spread = |x: f64| q.map(|(a, b)| (x * a, x * b));
    let (g1, g3) = (spread(gbps).map(|s| s.0), spread(gbps).map(|s| s.1));
    let (u1, u3) = (spread(us).map(|s| s.0), spread(us).map(|s| s.1));
    serde_json::json!({
        "tool": "cuda-mem bench", "schema": 2, "version": "0.1.0",
        "runtime": "13.0", "driver": "13.0", "built_with": "13.0",
        "device": {"ordinal": 0, "name": "NVIDIA H200", "compute_capability": "9.0",
            "pci_bus_id": "0000:18:00.0", "memory_free_bytes": 1, "memory_total_bytes": 2,
            "capabilities": {"can_map_host_memory": true, "unified_addressing": true,
                "managed_memory": true, "concurrent_managed_access": true,
                "pageable_memory_access": false, "host_native_atomics": false}},
        "method": {"quick": true, "warmup": 1, "samples": 5, "statistic": "median",
            "ratio_statistic": "x", "timer": "cuda_events", "gb_bytes": 1000000000u64,
            "stream": "legacy_default", "blocking_kernel": true, "sizes": [268435456u64],
            "kernel_bytes": 1, "managed_bytes": 1},
        "copies": [{"kind": "pinned", "direction": "h2d", "bytes": 268435456u64, "reps": 2,
            "samples": 5, "gbps": gbps, "raw_gbps": 55.0, "ratio": 1.0,
            "gbps_q1": g1, "gbps_q3": g3}],
        "kernels": [],
        "alloc": [{"kind": "device", "bytes": 4096, "reps": 11, "us": us, "raw_us": 60.0,
            "ratio": 1.0, "note": null, "us_q1": u1, "us_q3": u3}],
        "verified": {"ok": true, "passed": 0, "failed": 0, "checks": []},
        "errors": [], "seconds": 1.0
    })
    .to_string()
}

/// `compare` on two saved files: a copy 10% slower beyond its spread regresses (exit 1 with
/// --fail-on-regression), an allocation 2x faster improves; the same file is unchanged.
#[test]
fn compare_two_saved_runs() {
    let dir = std::env::temp_dir().join(format!("cuda-mem-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (old, new) = (dir.join("old.json"), dir.join("new.json"));
    std::fs::write(&old, saved(55.0, 60.0, Some((0.99, 1.01)))).unwrap();
    std::fs::write(&new, saved(49.5, 30.0, Some((0.99, 1.01)))).unwrap();
    let (o, n) = (old.to_str().unwrap(), new.to_str().unwrap());
    let out = cuda_mem(&["compare", n, o]);
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        report.contains("2 figures compared; 1 regressed, 1 improved"),
        "{report}"
    );
    assert!(
        report.contains(
            "| REGRESSED | copies  | pinned h2d 256MiB | GB/s | 55.000   | 49.500 | -10.0% |"
        ),
        "{report}"
    );
    assert!(
        report.contains("| improved  | alloc   | device 4KiB"),
        "{report}"
    );
    let out = cuda_mem(&["compare", n, o, "--fail-on-regression"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("1 figure(s) regressed"));
    // A 1% move beyond the spread is under the 2% noise threshold.
    std::fs::write(&new, saved(54.45, 60.0, Some((0.999, 1.001)))).unwrap();
    let out = cuda_mem(&["compare", n, o, "--fail-on-regression"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    // A file that is not a saved run: exit 1, one clear line.
    std::fs::write(&new, "{\"tool\": 1}").unwrap();
    let out = cuda_mem(&["compare", n, o]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("is not the JSON of `cuda-mem bench --json`"),
        "{err}"
    );
    assert_no_panic(&err);
    // plot draws a saved run.
    let svg = dir.join("plot.svg");
    let out = cuda_mem(&["plot", o, "-o", svg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(std::fs::read_to_string(&svg)
        .unwrap()
        .contains("pinned h2d"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// No driver: one paragraph on stderr, exit 1, no panic. With a GPU: the device and its
/// capabilities.
#[test]
fn info_lists_devices_or_explains() {
    let plain = cuda_mem(&["info"]);
    let json = cuda_mem(&["info", "--json"]);
    match gpu() {
        Err(why) => {
            eprintln!("(no CUDA device: {why}; checking the no-driver message)");
            for out in [&plain, &json] {
                let err = text(&out.stderr);
                assert_eq!(out.status.code(), Some(1), "{err}");
                assert!(out.stdout.is_empty());
                assert!(
                    err.starts_with("cuda-mem: no usable CUDA driver or GPU ("),
                    "{err}"
                );
                assert!(err.contains("nvidia-smi"), "{err}");
                assert_eq!(err.trim_end().lines().count(), 1, "one paragraph: {err}");
                assert_no_panic(&err);
            }
        }
        Ok(n) => {
            assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stderr));
            assert_eq!(json.status.code(), Some(0), "{}", text(&json.stderr));
            let (plain, json) = (text(&plain.stdout), text(&json.stdout));
            assert!(plain.contains(&format!("{n} device(s)")));
            for d in cuda_mem::Device::all().unwrap() {
                let name = d.name().unwrap();
                let (ma, mi) = d.compute_capability().unwrap();
                let caps = d.memory_capabilities().unwrap();
                eprintln!("device {}: {name} {ma}.{mi} {caps:?}", d.ordinal());
                assert!(plain.contains(&format!("Device {}: {name}\n", d.ordinal())));
                assert!(json.contains(&format!("\"name\": \"{name}\"")));
                assert!(json.contains(&format!("\"compute_capability\": \"{ma}.{mi}\"")));
                assert!(json.contains(&format!("\"pci_bus_id\": \"{}\"", d.pci_bus_id().unwrap())));
                for (key, value) in [
                    ("can_map_host_memory", caps.can_map_host_memory),
                    ("unified_addressing", caps.unified_addressing),
                    ("managed_memory", caps.managed_memory),
                    ("concurrent_managed_access", caps.concurrent_managed_access),
                    ("pageable_memory_access", caps.pageable_memory_access),
                    ("host_native_atomics", caps.host_native_atomics),
                ] {
                    assert!(json.contains(&format!("\"{key}\": {value}")), "{key}");
                }
            }
        }
    }
}

/// No driver: the same paragraph from `bench`. With a GPU: a quick run that verifies its data
/// and reports every kind, each measured or with its reason.
#[test]
fn bench_quick() {
    let dir = std::env::temp_dir().join(format!("cuda-mem-cli-test-{}", std::process::id()));
    let dir_s = dir.to_string_lossy().into_owned();
    let out = cuda_mem(&["bench", "--quick", "--json", "-", "--out-dir", &dir_s]);
    let err = text(&out.stderr);
    assert_no_panic(&err);
    if let Err(why) = gpu() {
        eprintln!("SKIP: no CUDA device: {why} (checked the no-driver message instead)");
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.starts_with("cuda-mem: no usable CUDA driver or GPU ("),
            "{err}"
        );
        assert!(out.stdout.is_empty());
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{err}");
    let json = text(&out.stdout);
    eprintln!("{err}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("bench --json is JSON");
    assert_eq!(v["tool"], "cuda-mem bench");
    assert_eq!(v["schema"], 2);
    assert_eq!(v["verified"]["ok"], true, "{json}");
    assert_eq!(v["verified"]["failed"], 0);
    // Every kind has a row in each section, or an error entry of that stage.
    let reported = |section: &str, stage: &str, kind: &str| {
        let rows = v[section].as_array().into_iter().flatten();
        let errors = v["errors"].as_array().into_iter().flatten();
        rows.into_iter().any(|r| r["kind"] == kind)
            || errors
                .into_iter()
                .any(|e| e["kind"] == kind && e["stage"] == stage)
    };
    for kind in [
        "pageable",
        "pinned",
        "write_combined",
        "mapped",
        "registered",
        "device",
    ] {
        assert!(
            reported("copies", "copies", kind),
            "copies: {kind} not reported"
        );
    }
    for kind in ["device", "mapped", "managed_fault", "managed_prefetched"] {
        assert!(
            reported("kernels", "kernels", kind),
            "kernels: {kind} not reported"
        );
    }
    for kind in [
        "device",
        "pinned",
        "write_combined",
        "mapped",
        "managed",
        "registered",
    ] {
        assert!(
            reported("alloc", "alloc", kind),
            "alloc: {kind} not reported"
        );
    }
    // Both directions at once: the aggregate beside each way alone, spreads present.
    let bidir = v["bidirectional"]
        .as_array()
        .expect("bidirectional section");
    assert!(!bidir.is_empty() || reported("bidirectional", "bidirectional", "pinned"));
    for b in bidir {
        assert!(b["gbps"].as_f64().unwrap() > 0.0 && b["h2d_gbps"].as_f64().unwrap() > 0.0);
        assert!(b["gbps_q1"].as_f64().is_some());
    }
    assert!(v["copies"][0]["gbps_q1"].as_f64().is_some());
    // The table went to stderr (stdout is the JSON), the files into --out-dir.
    assert!(err.contains("Copy bandwidth, GB/s"));
    for f in ["bench.txt", "bench.json", "bench.svg"] {
        let body = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        assert!(!body.is_empty(), "{f} missing");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("bench.json")).unwrap(),
        json
    );
    let _ = std::fs::remove_dir_all(&dir);
}
