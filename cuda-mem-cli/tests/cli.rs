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
        (&["--frobnicate"][..], "unknown option '--frobnicate'"),
        (&[][..], "no command given"),
        (
            &["bench", "--fast"][..],
            "unknown option '--fast' for 'bench'",
        ),
        (&["bench", "--samples", "1"][..], "3 to 1000"),
        (&["bench", "--sizes", "100"][..], "multiple of 16"),
        (
            &["info", "--verbose"][..],
            "unknown option '--verbose' for 'info'",
        ),
    ] {
        let out = cuda_mem(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(err.contains("cuda-mem --help"), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
        assert_no_panic(&err);
    }
}

#[test]
fn help_and_version() {
    let out = cuda_mem(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for word in [
        "cuda-mem info",
        "cuda-mem bench",
        "--quick",
        "--json",
        "--svg",
        "--sizes",
    ] {
        assert!(help.contains(word), "{word} missing from help");
    }
    // `bench --help` prints help, it never starts a run.
    let out = cuda_mem(&["bench", "--quick", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), help);
    let out = cuda_mem(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).starts_with(&format!("cuda-mem {}", env!("CARGO_PKG_VERSION"))));
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
    assert!(json.starts_with("{\n  \"tool\": \"cuda-mem bench\""));
    assert!(
        json.contains("\"verified\": {\n    \"ok\": true,"),
        "{json}"
    );
    assert!(json.contains("\"failed\": 0,"));
    // Every kind has a row in each section, or an error entry of that stage.
    let reported = |stage: &str, next_key: &str, kind: &str| {
        json.contains(&format!("{{\"kind\": \"{kind}\", \"{next_key}\": "))
            || json.contains(&format!("{{\"kind\": \"{kind}\", \"stage\": \"{stage}\""))
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
            reported("copies", "direction", kind),
            "copies: {kind} not reported"
        );
    }
    for kind in ["device", "mapped", "managed_fault", "managed_prefetched"] {
        assert!(
            reported("kernels", "op", kind),
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
            reported("alloc", "bytes", kind),
            "alloc: {kind} not reported"
        );
    }
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
