//! The watchdog: a program that runs past its time limit is a hang, and a hang is a failure.
//!
//! The executor notes in a [`Progress`] where the main thread is (which phase, the final check
//! of which slot, the drops) and, per phase thread, the operation it is executing right now
//! (its path: the index in the thread's list, then the index in a `HoldRead` body, ...). When
//! a program is still running at its limit, the watchdog writes the seed, the replay line and
//! every thread's current operation straight to file descriptor 2 (past the test harness's
//! output capture, which an abort would lose) and aborts the process: a blocked thread cannot
//! be unwound, and the runner counts the nonzero status as a failure.

use std::io::Write;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::program::{Op, Program};

/// What the main thread of a program run is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Not started yet.
    Starting,
    /// Running phase `.0` (its threads, then joining them).
    Phase(usize),
    /// Checking the final state of slot `.0`.
    FinalCheck(usize),
    /// Dropping the program's last buffers.
    Dropping,
}

/// What one phase thread is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Doing {
    /// Not started in this phase (or not spawned yet).
    Waiting,
    /// Making its per-thread streams.
    Setup,
    /// Executing the operation at this path: the index in the thread's list of the phase, then
    /// in the body of that operation (a `HoldRead`), and so on.
    Op(Vec<usize>),
    /// Past its last operation (returning its slots).
    Finished,
}

/// Where a program run is; written by the executor, read by the watchdog.
pub struct Progress {
    stage: Mutex<Stage>,
    threads: Vec<Mutex<Doing>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Progress {
    /// The progress of a run of `threads` phase threads.
    pub fn new(threads: usize) -> Progress {
        Progress {
            stage: Mutex::new(Stage::Starting),
            threads: (0..threads.max(1))
                .map(|_| Mutex::new(Doing::Waiting))
                .collect(),
        }
    }

    /// The main thread enters `stage`; entering a phase marks every thread `Waiting`.
    pub fn stage(&self, stage: Stage) {
        if let Stage::Phase(_) = stage {
            for t in &self.threads {
                *lock(t) = Doing::Waiting;
            }
        }
        *lock(&self.stage) = stage;
    }

    /// Thread `t`'s record (`None` past the number of threads).
    pub fn thread(&self, t: usize) -> Option<&Mutex<Doing>> {
        self.threads.get(t)
    }
}

/// Thread `t`'s record, where there is one: sets it to `doing`.
pub fn set(rec: Option<&Mutex<Doing>>, doing: Doing) {
    if let Some(r) = rec {
        *lock(r) = doing;
    }
}

/// Thread `t` enters the operation at index `i` of the list it is running at depth `depth`
/// (0: the thread's list, 1: a `HoldRead` body, ...).
pub fn enter_op(rec: Option<&Mutex<Doing>>, depth: usize, i: usize) {
    if let Some(r) = rec {
        let mut d = lock(r);
        let mut path = match std::mem::replace(&mut *d, Doing::Waiting) {
            Doing::Op(p) => p,
            _ => Vec::new(),
        };
        path.truncate(depth);
        path.resize(depth, 0);
        path.push(i);
        *d = Doing::Op(path);
    }
}

/// Thread `t` leaves the list at depth `depth` (back to its operation at `depth - 1`).
pub fn leave_list(rec: Option<&Mutex<Doing>>, depth: usize) {
    if let Some(r) = rec {
        if let Doing::Op(p) = &mut *lock(r) {
            p.truncate(depth);
        }
    }
}

/// One line of text of an operation: its program text's first line.
fn one_line(op: &Op) -> String {
    let text = op.to_string();
    let first = text.trim().lines().next().unwrap_or("").trim().to_string();
    if op.body().is_empty() {
        first
    } else {
        format!("{first} {{ {} nested operations }}", op.body().len())
    }
}

/// The watchdog's message about `p` (whose run `progress` records) still running after
/// `elapsed`, past `limit`; `replay` is the line that replays it, `whole` whether to print the
/// whole program too (a shrink candidate, which the replay line does not regenerate).
pub fn hang_report(
    p: &Program,
    progress: &Progress,
    replay: &str,
    elapsed: Duration,
    limit: Duration,
    whole: bool,
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let stage = *lock(&progress.stage);
    let _ = writeln!(
        s,
        "random: HANG: program seed {:#x} still running after {:.1} s (limit {} s; \
         CUDA_MEM_RANDOM_PROGRAM_SECS), {}",
        p.seed,
        elapsed.as_secs_f64(),
        limit.as_secs(),
        match stage {
            Stage::Starting => "starting".to_string(),
            Stage::Phase(ph) => format!("in phase {ph} of {}", p.phases.len()),
            Stage::FinalCheck(i) => format!("checking the final state of s{i}"),
            Stage::Dropping => "dropping its buffers".to_string(),
        }
    );
    let _ = writeln!(s, "random: replay with {replay}");
    if let Stage::Phase(ph) = stage {
        let phase = p.phases.get(ph);
        for (t, rec) in progress.threads.iter().enumerate() {
            let doing = lock(rec).clone();
            let _ = write!(s, "random:   thread {t}: ");
            match doing {
                Doing::Waiting => {
                    let _ = writeln!(s, "not started");
                }
                Doing::Setup => {
                    let _ = writeln!(s, "making its per-thread streams (Stream::per_thread)");
                }
                Doing::Finished => {
                    let _ = writeln!(s, "past its last operation");
                }
                Doing::Op(path) => {
                    let mut list: &[Op] = phase
                        .and_then(|ph| ph.threads.get(t))
                        .map_or(&[], |l| l.as_slice());
                    let mut innermost = None;
                    for (depth, &i) in path.iter().enumerate() {
                        let Some(op) = list.get(i) else {
                            let _ = write!(s, "operation {i} (out of range) ");
                            break;
                        };
                        if depth == 0 {
                            let _ = write!(s, "operation {i} `{}`", one_line(op));
                        } else {
                            let _ = write!(s, ", nested operation {i} `{}`", one_line(op));
                        }
                        innermost = Some(op);
                        list = op.body();
                    }
                    let _ = writeln!(s);
                    if let Some(op) = innermost {
                        let _ = writeln!(s, "random:     {op:?}");
                    }
                }
            }
        }
    }
    if whole {
        let _ = writeln!(s, "random: the program (a shrink candidate):\n{p}");
    }
    let _ = write!(s, "random: aborting");
    s
}

/// Runs `f` (a run of `p` that records into `progress`); if it has not returned after `limit`,
/// writes [`hang_report`] to stderr and aborts the process.
pub fn watched<T>(
    p: &Program,
    progress: &Progress,
    replay: &str,
    limit: Duration,
    whole: bool,
    f: impl FnOnce() -> T,
) -> T {
    let (done, wait) = mpsc::channel::<()>();
    std::thread::scope(|sc| {
        std::thread::Builder::new()
            .name("random-watchdog".into())
            .spawn_scoped(sc, move || {
                let start = Instant::now();
                if let Err(RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
                    let msg = hang_report(p, progress, replay, start.elapsed(), limit, whole);
                    let _ = std::io::stdout().flush();
                    // Straight to the stream, not `eprintln!`: the harness's capture of a
                    // test's output would be lost in the abort.
                    let mut err = std::io::stderr().lock();
                    let _ = writeln!(err, "{msg}");
                    let _ = err.flush();
                    std::process::abort();
                }
            })
            .expect("spawning the watchdog");
        // Dropped on return or unwind alike: the watchdog ends either way.
        let _done = done;
        f()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{generate, GenConfig};

    #[test]
    fn the_hang_report_names_the_seed_the_replay_line_and_every_threads_operation() {
        let cfg = GenConfig {
            ops: 200,
            max_threads: 8,
            devices: 1,
        };
        // A program of several threads with a `HoldRead` in some thread of some phase.
        let (p, ph, t, i) = (0u64..500)
            .find_map(|seed| {
                let p = generate(seed, &cfg);
                if p.threads < 3 {
                    return None;
                }
                for (ph, phase) in p.phases.iter().enumerate() {
                    for (t, ops) in phase.threads.iter().enumerate() {
                        if let Some(i) = ops.iter().position(|o| !o.body().is_empty()) {
                            return Some((p.clone(), ph, t, i));
                        }
                    }
                }
                None
            })
            .expect("a program with a HoldRead");
        let progress = Progress::new(p.threads);
        progress.stage(Stage::Phase(ph));
        let rec = |t| progress.thread(t);
        enter_op(rec(t), 0, i);
        enter_op(rec(t), 1, 0);
        let other = (t + 1) % p.threads;
        set(rec(other), Doing::Setup);
        let third = (t + 2) % p.threads;
        enter_op(rec(third), 0, 0);
        leave_list(rec(third), 1);
        let replay = "CUDA_MEM_RANDOM_SEED=0x1 <replay>";
        let r = hang_report(
            &p,
            &progress,
            replay,
            Duration::from_millis(31_500),
            Duration::from_secs(30),
            false,
        );
        assert!(r.contains(&format!("program seed {:#x}", p.seed)), "{r}");
        assert!(r.contains("after 31.5 s (limit 30 s"), "{r}");
        assert!(
            r.contains(&format!("in phase {ph} of {}", p.phases.len())),
            "{r}"
        );
        assert!(r.contains(&format!("random: replay with {replay}")), "{r}");
        let hold = &p.phases[ph].threads[t][i];
        let nested = &hold.body()[0];
        assert!(
            r.contains(&format!(
                "thread {t}: operation {i} `{}`, nested operation 0 `{}`",
                one_line(hold),
                one_line(nested)
            )),
            "{r}"
        );
        assert!(r.contains(&format!("{nested:?}")), "{r}");
        assert!(
            r.contains(&format!("thread {other}: making its per-thread streams")),
            "{r}"
        );
        let first = &p.phases[ph].threads[third][0];
        assert!(
            r.contains(&format!(
                "thread {third}: operation 0 `{}`",
                one_line(first)
            )),
            "{r}"
        );
        assert!(!r.contains("a shrink candidate"), "{r}");
        assert!(r.ends_with("random: aborting"), "{r}");
        // Every thread has its line.
        for t in 0..p.threads {
            assert!(r.contains(&format!("random:   thread {t}: ")), "{r}");
        }
        progress.stage(Stage::FinalCheck(3));
        let r = hang_report(&p, &progress, replay, Duration::ZERO, Duration::ZERO, true);
        assert!(r.contains("checking the final state of s3"), "{r}");
        assert!(r.contains("a shrink candidate"), "{r}");
    }

    /// The child process of `a_hang_aborts_the_process_with_the_report` (nothing without its
    /// variable): a phase thread that blocks forever in its first operation.
    #[test]
    fn hanging_child() {
        if std::env::var_os("CUDA_MEM_RANDOM_HANGING_CHILD").is_none() {
            return;
        }
        let p = generate(
            7,
            &GenConfig {
                ops: 20,
                max_threads: 1,
                devices: 1,
            },
        );
        let progress = Progress::new(p.threads);
        watched(
            &p,
            &progress,
            "<replay line>",
            Duration::from_secs(1),
            false,
            || {
                progress.stage(Stage::Phase(0));
                std::thread::scope(|sc| {
                    sc.spawn(|| {
                        enter_op(progress.thread(0), 0, 0);
                        loop {
                            std::thread::park();
                        }
                    });
                });
            },
        );
    }

    #[test]
    fn a_hang_aborts_the_process_with_the_report() {
        let (ok, out) = cuda_mem_tests::run_child(
            "watch::tests::hanging_child",
            &[("CUDA_MEM_RANDOM_HANGING_CHILD", "1")],
            Duration::from_secs(60),
        )
        .expect("the child ended (the watchdog aborted it)");
        assert!(!ok, "the hung child exited successfully:\n{out}");
        let p = generate(
            7,
            &GenConfig {
                ops: 20,
                max_threads: 1,
                devices: 1,
            },
        );
        for want in [
            format!("random: HANG: program seed {:#x}", p.seed),
            "random: replay with <replay line>".to_string(),
            format!(
                "random:   thread 0: operation 0 `{}`",
                one_line(&p.phases[0].threads[0][0])
            ),
            "random: aborting".to_string(),
        ] {
            assert!(out.contains(&want), "no {want:?} in:\n{out}");
        }
    }

    #[test]
    fn a_run_within_its_limit_returns_its_value() {
        let p = generate(
            1,
            &GenConfig {
                ops: 10,
                max_threads: 1,
                devices: 1,
            },
        );
        let progress = Progress::new(p.threads);
        let v = watched(&p, &progress, "", Duration::from_secs(60), false, || 42);
        assert_eq!(v, 42);
    }
}
