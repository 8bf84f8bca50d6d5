//! Randomized model test of cuda-mem (issue 19: "build the test that would have found
//! them"): generated programs over every kind of memory, stream and thread layout, each run on
//! the GPU and checked against a host model, failures shrunk to a minimal program.
//!
//! # What a program is
//!
//! Buffer slots and a list of *phases*. In each phase every slot is owned by one thread (which
//! may do anything with it) or shared read-only by all; the threads (1 to 8) run their
//! operation lists at once and are joined at the end of the phase, so work queued on one
//! thread's streams is used by another thread on other streams in the next phase. Operations
//! (see `program::Op`): allocation of every kind (device by `cudaMalloc` and from a
//! `MemPool`, pinned by `cudaHostAlloc`, from the global and a private `PinnedPool`, mapped,
//! managed, registered `Vec`s; device memory on device 1 too when there are two GPUs), drops and
//! `free()`, host reads and writes (`as_slice`, `to_vec`, `copy_range` with `Vec`s,
//! `copy_staged`), synchronous and asynchronous copies (whole, ranges, views), copies between
//! the two halves of `split_at_mut`, memsets (`memset_async` of views, `DeviceBuffer::memset`),
//! kernels through guards (`cm_write` through `device_ptr_mut`, `xor_checksum` through
//! `device_ptr`, copies between guards' addresses), guards leaked with `mem::forget`, read
//! guards held while other operations run, slow kernels (`cm_spin`, 50 to 500 us) that keep
//! later work pending, host atomics of mapped memory, `cuda_mem::scope` borrowed `Vec`s, peer
//! copies, prefetches, forced fence record failures (`testing::fail_next_fence_records`), and
//! over-aligned element types (`align(512)`, `align(4096)`: refused with `Error::Misuse`, or
//! `Ok` and aligned). Streams: legacy default, blocking, non-blocking, per-thread default,
//! cudarc's (`interop::cudarc::stream`), and one non-blocking stream shared by all threads.
//!
//! Every host read, kernel checksum and atomic load is checked against the model at once, and
//! every buffer's final state at the end.
//!
//! # Motifs
//!
//! Mixed among the random operations, short sequences that compose a known-dangerous pattern,
//! so that each issue 19 hole has many chances per program:
//!
//! - *atomic after DMA* (item 1): a copy or kernel into a mapped buffer held behind a spin,
//!   then `atomic(i).store(x)` on an element it covers, then `as_slice()[i] == x`;
//! - *over-aligned* (item 2): `align(512)`/`align(4096)` elements in pinned, pooled pinned,
//!   mapped, managed and registered memory, after a pad allocation that shifts sub-allocators;
//! - *per-thread hand-off* (item 5): the last operation of a thread in a phase writes a slot on
//!   its per-thread default stream behind a spin; the first of the slot's next owner (another
//!   thread, or all threads when shared) reads it on its own per-thread stream;
//! - *fallback guard* (item 6): a pinned-pool buffer with a pending write on stream S; a read
//!   guard on S held while records are forced to fail and the host reads the buffer; a launch
//!   through the guard behind another spin; the buffer dropped and its size allocated again
//!   and overwritten: the launch must still read the old contents;
//! - *pool reuse* (read and write): a pooled buffer used behind a spin, dropped, allocated again
//!   at the same size from the same pool;
//! - *forget*: kernels and guard copies whose guards are leaked, then host access;
//! - *sync after async*: work held on a non-default stream, then synchronous copies and
//!   memsets (legacy default stream) of the same buffer;
//! - *scope behind spin*: a scope-borrowed `Vec` copied behind a spin.
//!
//! # Running
//!
//! The default run (in the normal suite) is small; environment variables select more:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `CUDA_MEM_RANDOM_PROGRAMS` | 20 | programs to run |
//! | `CUDA_MEM_RANDOM_OPS` | 100 | operations per program |
//! | `CUDA_MEM_RANDOM_THREADS` | 8 | most threads per program |
//! | `CUDA_MEM_RANDOM_SEED` | | run only the program of this seed (replay) |
//! | `CUDA_MEM_RANDOM_BASE` | from the clock | base seed of the programs' seeds |
//! | `CUDA_MEM_RANDOM_DEVICES` | GPUs, at most 2 | devices programs use |
//! | `CUDA_MEM_RANDOM_SHRINK` | 1 | shrink the first failing program (0: print it whole) |
//! | `CUDA_MEM_RANDOM_SHRINK_SECS` | 180 | time limit of shrinking |
//! | `CUDA_MEM_RANDOM_SHRINK_RUNS` | 3 | runs per candidate (it fails if any run fails) |
//! | `CUDA_MEM_RANDOM_PRINT` | 0 | print every program before running it, and a line after it |
//! | `CUDA_MEM_RANDOM_PROGRAM_SECS` | 30 | time limit of one program run (shrink candidates too) |
//! | `CUDA_MEM_RANDOM_TIME_SECS` | | start no program after this many seconds |
//! | `CUDA_MEM_RANDOM_FIRST_FAILURE` | 0 | stop at the first failing program |
//!
//! The big run: `CUDA_MEM_RANDOM_PROGRAMS=1000 CUDA_MEM_RANDOM_OPS=200 <this test executable>
//! --nocapture` (in a bundle: `tests/tests-random`). It ends with `random: N programs, M ops,
//! K mismatches (seed ...)`; a failure prints its seed, the line that replays it, and the
//! shrunk program. Every tenth program prints a progress line (`random: program k/N seed ...
//! ok in X ms`). A program still running at its time limit is a hang: the watchdog (see
//! `watch`) writes its seed, the replay line and the operation every thread is executing to
//! stderr and aborts the process.

mod exec;
mod gen;
mod model;
mod program;
mod rng;
mod shrink;
mod watch;

use std::time::{Duration, Instant};

use cuda_mem::Device;
use cuda_mem_tests::gpu_or_skip;

use crate::gen::GenConfig;

/// `name` as a number (decimal, or hexadecimal after `0x`), or `None` when unset.
fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number")))
}

/// The run's settings (see the module docs).
#[derive(Debug, Clone)]
struct Config {
    seed: Option<u64>,
    base: u64,
    programs: usize,
    ops: usize,
    threads: usize,
    devices: Option<usize>,
    shrink: bool,
    shrink_secs: u64,
    shrink_runs: usize,
    print: bool,
    program_secs: u64,
    /// Start no program after this many seconds (the run then reports what it ran).
    time_secs: Option<u64>,
    /// Stop at the first failing program (for runs that only ask whether anything fails).
    first_failure: bool,
}

impl Config {
    fn from_env() -> Config {
        let clock = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Config {
            seed: env_u64("CUDA_MEM_RANDOM_SEED"),
            base: env_u64("CUDA_MEM_RANDOM_BASE").unwrap_or(clock),
            programs: env_u64("CUDA_MEM_RANDOM_PROGRAMS").unwrap_or(20) as usize,
            ops: (env_u64("CUDA_MEM_RANDOM_OPS").unwrap_or(100) as usize).max(1),
            threads: (env_u64("CUDA_MEM_RANDOM_THREADS").unwrap_or(8) as usize)
                .clamp(1, gen::MAX_THREADS),
            devices: env_u64("CUDA_MEM_RANDOM_DEVICES").map(|d| d as usize),
            shrink: env_u64("CUDA_MEM_RANDOM_SHRINK").unwrap_or(1) != 0,
            shrink_secs: env_u64("CUDA_MEM_RANDOM_SHRINK_SECS").unwrap_or(180),
            shrink_runs: (env_u64("CUDA_MEM_RANDOM_SHRINK_RUNS").unwrap_or(3) as usize).max(1),
            print: env_u64("CUDA_MEM_RANDOM_PRINT").unwrap_or(0) != 0,
            program_secs: env_u64("CUDA_MEM_RANDOM_PROGRAM_SECS").unwrap_or(30).max(1),
            time_secs: env_u64("CUDA_MEM_RANDOM_TIME_SECS"),
            first_failure: env_u64("CUDA_MEM_RANDOM_FIRST_FAILURE").unwrap_or(0) != 0,
        }
    }

    /// The environment that regenerates the program of `seed`.
    fn replay(&self, seed: u64, devices: usize) -> String {
        format!(
            "CUDA_MEM_RANDOM_SEED={seed:#x} CUDA_MEM_RANDOM_OPS={} CUDA_MEM_RANDOM_THREADS={} \
             CUDA_MEM_RANDOM_DEVICES={devices} <tests-random> random_programs --nocapture",
            self.ops, self.threads
        )
    }
}

/// Runs `p` under the watchdog (see `watch`): a run past the time limit aborts the process.
/// `candidate`: `p` is a shrink candidate (the hang report prints it whole).
fn run_watched(
    env: &exec::Env,
    cfg: &Config,
    devices: usize,
    p: &program::Program,
    candidate: bool,
) -> Result<usize, exec::Failure> {
    let progress = watch::Progress::new(p.threads);
    let replay = cfg.replay(p.seed, devices);
    watch::watched(
        p,
        &progress,
        &replay,
        Duration::from_secs(cfg.program_secs),
        candidate,
        || exec::run_program(env, p, &progress),
    )
}

/// The randomized model test on the GPU (see the module docs).
#[test]
fn random_programs() {
    gpu_or_skip!();
    let cfg = Config::from_env();
    let gpus = Device::count().expect("Device::count").clamp(1, 2) as usize;
    let devices = cfg.devices.unwrap_or(gpus).clamp(1, gpus);
    let env = exec::Env::new(devices).unwrap_or_else(|e| panic!("random: setting up: {e}"));
    let gen_cfg = GenConfig {
        ops: cfg.ops,
        max_threads: cfg.threads,
        devices: env.devices(),
    };
    let seeds: Vec<u64> = match cfg.seed {
        Some(s) => vec![s],
        None => (0..cfg.programs as u64)
            .map(|i| rng::program_seed(cfg.base, i))
            .collect(),
    };
    let seed_text = match cfg.seed {
        Some(s) => format!("program seed {s:#x}"),
        None => format!("base seed {:#x}", cfg.base),
    };
    println!(
        "random: {} programs of {} operations, up to {} threads, {} device(s), {seed_text}",
        seeds.len(),
        cfg.ops,
        cfg.threads,
        devices
    );
    let start = Instant::now();
    let (mut programs, mut ops) = (0usize, 0usize);
    let mut failed: Vec<(u64, String)> = Vec::new();
    for (i, &seed) in seeds.iter().enumerate() {
        if let Some(limit) = cfg.time_secs {
            if start.elapsed() >= Duration::from_secs(limit) {
                println!(
                    "random: time budget of {limit} s reached: {programs} of {} programs run",
                    seeds.len()
                );
                break;
            }
        }
        let p = gen::generate(seed, &gen_cfg);
        if cfg.print {
            println!("{p}");
        }
        programs += 1;
        ops += p.count();
        let t0 = Instant::now();
        let r = run_watched(&env, &cfg, devices, &p, false);
        if r.is_ok() && (cfg.print || (i + 1) % 10 == 0) {
            println!(
                "random: program {}/{} seed {seed:#x} ok in {} ms",
                i + 1,
                seeds.len(),
                t0.elapsed().as_millis()
            );
        }
        if let Err(f) = r {
            println!("random: program {i} (seed {seed:#x}) FAILED: {f}");
            println!("random: replay with {}", cfg.replay(seed, devices));
            if failed.is_empty() && cfg.shrink {
                let budget = shrink::Budget {
                    runs: cfg.shrink_runs,
                    max_tests: 5000,
                    deadline: Some(Instant::now() + Duration::from_secs(cfg.shrink_secs)),
                };
                let t = Instant::now();
                let s = shrink::shrink(&p, budget, &mut |c| {
                    run_watched(&env, &cfg, devices, c, true)
                        .map(|_| ())
                        .map_err(|f| f.to_string())
                });
                println!(
                    "random: shrunk from {} to {} operations in {} candidates, {:.1} s{}; it fails with: {}",
                    p.count(),
                    s.program.count(),
                    s.tests,
                    t.elapsed().as_secs_f64(),
                    if s.exhausted { " (budget exhausted)" } else { "" },
                    s.failure
                );
                println!("{}", s.program);
            } else if !cfg.shrink {
                println!("{p}");
            }
            failed.push((seed, f.to_string()));
            // A sticky error ends every later program too: stop there.
            if let Err(e) = Device::get(0).and_then(|d| d.synchronize()) {
                if e.is_sticky() {
                    println!("random: the CUDA context is lost ({e}): stopping");
                    break;
                }
            }
            if failed.len() >= 5 || cfg.first_failure {
                println!("random: stopping after {} failing programs", failed.len());
                break;
            }
        }
        if (i + 1) % 100 == 0 {
            println!(
                "random: {programs} programs, {ops} ops, {} mismatches, {:.1} s",
                failed.len(),
                start.elapsed().as_secs_f64()
            );
        }
    }
    println!(
        "random: {programs} programs, {ops} ops, {} mismatches ({seed_text}, {:.1} s)",
        failed.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "{} failing programs: {}",
        failed.len(),
        failed
            .iter()
            .map(|(s, f)| format!("seed {s:#x}: {f}"))
            .collect::<Vec<_>>()
            .join("; ")
    );
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn replay_lines_carry_everything_the_program_depends_on() {
        let cfg = Config {
            seed: None,
            base: 1,
            programs: 1,
            ops: 200,
            threads: 4,
            devices: None,
            shrink: true,
            shrink_secs: 1,
            shrink_runs: 1,
            print: false,
            program_secs: 30,
            time_secs: None,
            first_failure: false,
        };
        let line = cfg.replay(0xab, 2);
        for want in [
            "CUDA_MEM_RANDOM_SEED=0xab",
            "CUDA_MEM_RANDOM_OPS=200",
            "CUDA_MEM_RANDOM_THREADS=4",
            "CUDA_MEM_RANDOM_DEVICES=2",
        ] {
            assert!(line.contains(want), "{line}");
        }
        // The seeds of a run are distinct and depend on the base.
        let a: Vec<u64> = (0..100).map(|i| rng::program_seed(1, i)).collect();
        let mut b = a.clone();
        b.sort_unstable();
        b.dedup();
        assert_eq!(b.len(), 100);
        assert_ne!(rng::program_seed(2, 0), a[0]);
    }
}
