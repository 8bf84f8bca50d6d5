//! Support for the integration tests: finding the GPU (or skipping visibly), child processes,
//! and the process memory counters the leak tests read.

use cuda_mem::Device;

/// Whether the environment demands a GPU (`CUDA_MEM_REQUIRE_GPU=1`, set by the GPU runner).
pub fn gpu_required() -> bool {
    std::env::var("CUDA_MEM_REQUIRE_GPU").as_deref() == Ok("1")
}

/// Whether the tests run under compute-sanitizer (`CUDA_MEM_SANITIZER=1`, set by the bundle's
/// `run.sh --memcheck`), which serializes and slows kernels: timing preconditions may not hold.
pub fn under_sanitizer() -> bool {
    std::env::var("CUDA_MEM_SANITIZER").as_deref() == Ok("1")
}

/// The precondition of an ordering test: the earlier work was still pending when the later
/// work was queued (else the test exercised nothing). Fails the test when it does not hold,
/// except under compute-sanitizer, where it prints a NOTE (the data checks still run).
pub fn still_pending(pending: bool, what: &str) {
    if pending {
        return;
    }
    if under_sanitizer() {
        eprintln!("NOTE under compute-sanitizer: {what}");
        return;
    }
    panic!("{what}");
}

/// Device 0, or `None` after printing a visible SKIP line when there is none. Panics (fails the
/// test) instead of skipping when [`gpu_required`].
pub fn gpu(test: &str) -> Option<Device> {
    match Device::count() {
        Ok(n) if n > 0 => match Device::get(0) {
            Ok(d) => Some(d),
            Err(e) => panic!("{test}: device 0 unusable: {e}"),
        },
        other => {
            let why = match other {
                Ok(_) => "no CUDA device".to_string(),
                Err(e) => e.to_string(),
            };
            assert!(
                !gpu_required(),
                "{test}: CUDA_MEM_REQUIRE_GPU=1 but no GPU: {why}"
            );
            skip(&format!("{test}: no CUDA device ({why})"));
            None
        }
    }
}

/// Prints a `SKIP` line that the test harness does not capture, so it shows in every run.
pub fn skip(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIP {why}");
}

/// `let dev = gpu_or_skip!();` returns from the test when no GPU is present.
#[macro_export]
macro_rules! gpu_or_skip {
    () => {
        match $crate::gpu(module_path!()) {
            Some(d) => d,
            None => return,
        }
    };
}

/// Polls `done()` every millisecond until it holds or `limit` has passed; returns whether it
/// held (for asserting that queued work finishes, or does not wait, without a time bound on
/// the work itself).
pub fn eventually(limit: std::time::Duration, mut done: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if done() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    done()
}

/// Whether a GPU is present (no message, no failure): for tests of the no-driver paths.
pub fn has_gpu() -> bool {
    matches!(Device::count(), Ok(n) if n > 0)
}

/// A field of `/proc/self/status` in KiB (`VmRSS`, `VmLck`), 0 if absent.
pub fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix(field)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or(0)
}

/// Runs this test executable again with only `test` selected and `env` set, waiting at most
/// `timeout`. Returns (exit success, stdout + stderr), or an error if it hung and was killed.
pub fn run_child(
    test: &str,
    env: &[(&str, &str)],
    timeout: std::time::Duration,
) -> anyhow::Result<(bool, String)> {
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn()?;
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => {
            let out = out?;
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            Ok((out.status.success(), text))
        }
        Err(_) => {
            // SAFETY: plain syscall on the child's pid, which has not been reaped (the waiting
            // thread still holds it), so it cannot name another process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            anyhow::bail!("child {test} hung for more than {timeout:?} and was killed")
        }
    }
}

/// The code blocks of the workspace README, compiled as doctests of this crate (`cargo test
/// --doc -p cuda-mem-tests`): its dependencies (cuda-mem with the `cudarc` feature, cudarc,
/// anyhow) are what the snippets use. Not part of any build but the doctests. The pages of
/// `docs/` follow, one item each.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The code blocks of `docs/guide.md`, as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide.md")]
pub struct GuideDoctests;

/// The code blocks of `docs/porting.md`, as doctests (its tables' code: `readme::` and
/// `tests/tests/all/readme_snippets.rs`).
#[cfg(doctest)]
#[doc = include_str!("../../docs/porting.md")]
pub struct PortingDoctests;

/// The code blocks of `docs/design.md`, as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/design.md")]
pub struct DesignDoctests;

/// The code blocks of `docs/graphs.md`, as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/graphs.md")]
pub struct GraphsDoctests;

/// The code blocks of `docs/toolkits.md`, as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/toolkits.md")]
pub struct ToolkitsDoctests;

/// The code blocks of `docs/multi-gpu.md`, as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/multi-gpu.md")]
pub struct MultiGpuDoctests;

/// The code blocks of `docs/results/README.md` (shell only, today), as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/results/README.md")]
pub struct ResultsDoctests;
