//! graphs.cu's protocol, process by process: each side runs the whole of
//! `shared/refbench/graphs.cu`'s `main` in a fresh process of its own (its buffers allocated in
//! graphs.cu's order, a non-blocking stream, 220 eager rounds, then one capture, instantiated,
//! uploaded and replayed 220 times; medians of the last 200 rounds), and prints graphs.cu's
//! lines. The bench spawns them in rotating order, [`rounds`](run) times per sequence:
//!
//! - `graphs.cu` itself, where `--graphs-reference PATH` names its executable;
//! - `raw`: the same calls made through `cuda-mem-sys` from Rust (the floor of a Rust process);
//! - `cuda-mem launch`: the crate's calls, `Stream::capture`, `GraphExec::launch`;
//! - `cuda-mem launcher`: the same, replayed through a `Launcher`;
//! - `cudarc`: cudarc 0.19's calls on its own slices, `CudaGraph::launch`.
//!
//! Why processes: in one process the GPU time of the 100-kernel graph moves by up to a quarter
//! with where its 4 KiB lie and with the work the process did before (the third round's
//! diagnostics, `docs/results/round3-issue-22/`); a fresh process that allocates as graphs.cu
//! does and does the same work before the replays is the like-for-like comparison with it.
//!
//! The child is this executable (`bench`, with [`CHILD`] set to `SIDE:SEQUENCE`); rows go to
//! the `processes` table: each side's medians over its processes beside the reference's
//! (graphs.cu where given, else the raw Rust process).
//!
//! Every process, graphs.cu's too, runs on the same few CPUs (the last [`CPUS`] this one may
//! use, through the affinity the children inherit), and ratios are paired by round: the host
//! time of one `cudaGraphLaunch` moved from 1.2 to 2.8 µs from process to process on the H200,
//! whichever the side, in slow stretches of minutes, far more than the launches differ.

use std::path::Path;
use std::process::Command;

use cuda_mem::{
    check, sys, CaptureMode, Device, DeviceBuffer, Graph, GraphExec, GraphResources,
    HostAllocFlags, PinnedBuffer, Result, Stream,
};

use super::{
    cu, first_wrong, names, ours_kernels, ours_mixed, read_image, refused, Cu, Loaded, RawExec,
    Times, ALL, N,
};
use crate::bench::progress;
use crate::results::{BenchResults, Check, HostRow, KindError};
use crate::units::median;

/// The environment variable that makes `bench` a child of this part: `SIDE:k` (100 tiny
/// kernels) or `SIDE:m` (the mixed sequence).
pub const CHILD: &str = "CUDA_MEM_GRAPHS_BENCH_CHILD";

/// A side of the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Cpp,
    Raw,
    Launch,
    Launcher,
    Cudarc,
}

impl Side {
    const RUST: [Side; 4] = [Side::Raw, Side::Launch, Side::Launcher, Side::Cudarc];

    fn name(self) -> &'static str {
        match self {
            Side::Cpp => "graphs.cu",
            Side::Raw => "raw",
            Side::Launch => "cuda-mem launch",
            Side::Launcher => "cuda-mem launcher",
            Side::Cudarc => "cudarc",
        }
    }

    /// The child's name of the side (none for graphs.cu).
    fn spec(self) -> Option<&'static str> {
        match self {
            Side::Cpp => None,
            Side::Raw => Some("raw"),
            Side::Launch => Some("launch"),
            Side::Launcher => Some("launcher"),
            Side::Cudarc => Some("cudarc"),
        }
    }

    fn from_spec(s: &str) -> Option<Side> {
        Side::RUST.into_iter().find(|side| side.spec() == Some(s))
    }
}

/// One process's medians, µs, as graphs.cu prints them, and its data check.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Figures {
    eager_host: f64,
    eager_end: f64,
    graph_host: f64,
    graph_end: f64,
    correct: bool,
}

/// graphs.cu's output (or a child's, which prints the same lines): `eager: host X us,
/// end-to-end Y us`, `graph: ...` and `graph/eager: ...; data correct|WRONG`. `None` where a
/// line is missing or a figure is not a number.
fn parse(out: &str) -> Option<Figures> {
    fn pair(rest: &str) -> Option<(f64, f64)> {
        let num = |s: &str, key: &str| -> Option<f64> {
            let after = s.split_once(key)?.1;
            after.split_whitespace().next()?.parse().ok()
        };
        Some((num(rest, "host ")?, num(rest, "end-to-end ")?))
    }
    let (mut eager, mut graph, mut correct) = (None, None, None);
    for line in out.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("eager:") {
            eager = pair(rest);
        } else if let Some(rest) = line.strip_prefix("graph/eager:") {
            correct = rest.rsplit_once("data ").map(|(_, v)| v == "correct");
        } else if let Some(rest) = line.strip_prefix("graph:") {
            graph = pair(rest);
        }
    }
    let ((eager_host, eager_end), (graph_host, graph_end)) = (eager?, graph?);
    Some(Figures {
        eager_host,
        eager_end,
        graph_host,
        graph_end,
        correct: correct?,
    })
}

/// `ROUNDS + WARMUP` rounds of `enqueue` then `wait`, timed as graphs.cu times them.
fn phase(
    mut enqueue: impl FnMut() -> Result<()>,
    mut wait: impl FnMut() -> Result<()>,
) -> Result<Times> {
    let mut t = Times::default();
    for r in 0..ALL {
        t.sample(r, &mut enqueue, &mut wait)?;
    }
    Ok(t)
}

/// What a child prints: graphs.cu's lines, to three decimals.
fn print(eager: &Times, graph: &Times, correct: bool) {
    let (eh, ee) = eager.medians_us();
    let (gh, ge) = graph.medians_us();
    println!("eager: host {eh:.3} us, end-to-end {ee:.3} us");
    println!("graph: host {gh:.3} us, end-to-end {ge:.3} us");
    println!(
        "graph/eager: host {:.4}, end-to-end {:.4}; data {}",
        gh / eh,
        ge / ee,
        if correct { "correct" } else { "WRONG" }
    );
}

/// What element `i` of `e` holds after a process's rounds: the kernels-only sequence bumps
/// each (zeroed) word 100 times per round, eager and replayed; the mixed one leaves `i + 1`.
fn want(kernels_only: bool) -> impl Fn(usize) -> u32 {
    move |i| {
        if kernels_only {
            (100 * 2 * ALL) as u32
        } else {
            i as u32 + 1
        }
    }
}

/// The child: `spec` is `SIDE:k` or `SIDE:m`. Prints graphs.cu's lines; fails where the data
/// did not check.
pub fn child(spec: &str, image: Option<&Path>) -> anyhow::Result<()> {
    let (side, seq) = spec
        .split_once(':')
        .and_then(|(a, b)| Some((Side::from_spec(a)?, b)))
        .filter(|(_, b)| *b == "k" || *b == "m")
        .ok_or_else(|| anyhow::anyhow!("{CHILD}={spec}: expected SIDE:k or SIDE:m"))?;
    let kernels_only = seq == "k";
    let image = read_image(image)?;
    let init: Vec<u32> = (0..N as u32).collect();
    let (eager, graph, got) = match side {
        Side::Raw => raw_side(kernels_only, image.as_deref(), &init)?,
        Side::Launch | Side::Launcher => ours_side(
            kernels_only,
            side == Side::Launcher,
            image.as_deref(),
            &init,
        )?,
        Side::Cudarc => cudarc_side(kernels_only, image.as_deref(), &init)?,
        // (`from_spec` names Rust sides only.)
        Side::Cpp => anyhow::bail!("{CHILD}={spec}: graphs.cu is not a child of the bench"),
    };
    let wrong = first_wrong(&got, want(kernels_only));
    print(&eager, &graph, wrong.is_none());
    match wrong {
        None => Ok(()),
        Some(w) => anyhow::bail!("{} {spec}: data WRONG: {w}", side.name()),
    }
}

/// The crate's side: graphs.cu's allocations in its order (a pinned buffer, then two device
/// buffers), a non-blocking stream, then the kernel.
fn ours_side(
    kernels_only: bool,
    launcher: bool,
    image: Option<&[u8]>,
    init: &[u32],
) -> Result<(Times, Times, Vec<u32>)> {
    let h = PinnedBuffer::from_slice(init, HostAllocFlags::DEFAULT)?;
    let mut d = DeviceBuffer::<u32>::zeroed(N)?;
    let mut e = DeviceBuffer::<u32>::zeroed(N)?;
    let s = Stream::non_blocking()?;
    let loaded = Loaded::load(image)?;
    let tiny = loaded.tiny()?;
    let round = |h: &PinnedBuffer<u32>,
                 d: &mut DeviceBuffer<u32>,
                 e: &mut DeviceBuffer<u32>,
                 s: &Stream| {
        if kernels_only {
            ours_kernels(tiny, e, s)
        } else {
            ours_mixed(tiny, h, d, e, s)
        }
    };
    let eager = phase(|| round(&h, &mut d, &mut e, &s), || s.synchronize())?;
    let graph = s.capture(
        CaptureMode::ThreadLocal,
        (&h, &mut d, &mut e),
        |cap, (h, d, e)| round(h, d, e, cap.stream()),
    )?;
    let replays = replay(graph, &s, launcher)?;
    Ok((eager, replays, e.to_vec()?))
}

/// A graph of ours instantiated, uploaded and replayed, through its launch or a launcher.
fn replay<R: GraphResources>(graph: Graph<R>, s: &Stream, launcher: bool) -> Result<Times> {
    let mut exec: GraphExec<R> = graph.instantiate()?;
    exec.upload(s)?;
    let t = if launcher {
        let mut l = exec.launcher(s)?;
        phase(|| l.launch(), || s.synchronize())?
    } else {
        phase(|| exec.launch(s), || s.synchronize())?
    };
    exec.into_resources()?;
    Ok(t)
}

/// A raw runtime call's status.
fn ck(code: sys::cudaError_t, call: &'static str) -> Result<()> {
    check(code, || call.into())
}

/// graphs.cu's calls from Rust, through `cuda-mem-sys` (the stream and the kernel launch are
/// the crate's thin wrappers of `cudaStreamCreateWithFlags` and the launch).
fn raw_side(
    kernels_only: bool,
    image: Option<&[u8]>,
    init: &[u32],
) -> Result<(Times, Times, Vec<u32>)> {
    let bytes = N * 4;
    let (mut h, mut d, mut e) = (
        std::ptr::null_mut::<std::ffi::c_void>(),
        std::ptr::null_mut::<std::ffi::c_void>(),
        std::ptr::null_mut::<std::ffi::c_void>(),
    );
    // SAFETY: valid out-pointers; what is allocated is freed below (or left to the process's
    // end on an error: the child exits).
    unsafe {
        ck(sys::cudaMallocHost(&mut h, bytes), "cudaMallocHost")?;
        ck(sys::cudaMalloc(&mut d, bytes), "cudaMalloc")?;
        ck(sys::cudaMalloc(&mut e, bytes), "cudaMalloc")?;
        // The words graphs.cu writes (it leaves `e` as it comes: zeroed here for the check).
        std::ptr::copy_nonoverlapping(init.as_ptr(), h.cast::<u32>(), N);
        ck(sys::cudaMemset(e, 0, bytes), "cudaMemset")?;
        ck(sys::cudaDeviceSynchronize(), "cudaDeviceSynchronize")?;
    }
    let s = Stream::non_blocking()?;
    let rs = s.as_raw();
    let loaded = Loaded::load(image)?;
    let tiny = loaded.tiny()?;
    let round = || -> Result<()> {
        use sys::cudaMemcpyKind as K;
        if kernels_only {
            for _ in 0..100 {
                // SAFETY: N live words of device memory, freed only after the stream's work.
                unsafe { tiny.launch(e.cast(), &s)? };
            }
            return Ok(());
        }
        for _ in 0..25 {
            // SAFETY: live buffers of `bytes` each; the stream is synchronized before they are
            // freed or read on the host.
            unsafe {
                ck(
                    sys::cudaMemcpyAsync(d, h, bytes, K::cudaMemcpyHostToDevice, rs),
                    "cudaMemcpyAsync",
                )?;
                ck(sys::cudaMemsetAsync(e, 0, bytes, rs), "cudaMemsetAsync")?;
                ck(
                    sys::cudaMemcpyAsync(e, d, bytes, K::cudaMemcpyDeviceToDevice, rs),
                    "cudaMemcpyAsync",
                )?;
                tiny.launch(e.cast(), &s)?;
            }
        }
        Ok(())
    };
    let sync = || {
        // SAFETY: a live stream of this function's own.
        let code = unsafe { sys::cudaStreamSynchronize(rs) };
        ck(code, "cudaStreamSynchronize")
    };
    let eager = phase(round, sync)?;
    // (The stream is idle, synchronized, and not capturing.)
    let exec = RawExec::capture(rs, round)?;
    exec.upload(rs)?;
    // SAFETY: the buffers are freed below, after every replay was waited for.
    let graph = phase(|| unsafe { exec.launch(rs) }, sync);
    drop(exec);
    let graph = graph?;
    let mut out = vec![0u32; N];
    // SAFETY: N words into `out`; every use of the buffers was waited for, then they are freed.
    unsafe {
        ck(
            sys::cudaMemcpy(
                out.as_mut_ptr().cast(),
                e,
                bytes,
                sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
            ),
            "cudaMemcpy",
        )?;
        sys::cudaFree(e);
        sys::cudaFree(d);
        sys::cudaFreeHost(h);
    }
    Ok((eager, graph, out))
}

/// cudarc's side: its context's stream, module and slices (made as cudarc makes them).
fn cudarc_side(
    kernels_only: bool,
    image: Option<&[u8]>,
    init: &[u32],
) -> Result<(Times, Times, Vec<u32>)> {
    let name = if image.is_some() { "bump" } else { "cm_bump" };
    let mut c = Cu::new(Device::current()?, init, image, name)?;
    let cs = c.cs.clone();
    let eager = phase(
        || cu(c.round(kernels_only), "eager round"),
        || cu(cs.synchronize(), "synchronize"),
    )?;
    let g = c.capture(kernels_only, super::Target::Own)?;
    cu(g.upload(), "CudaGraph::upload")?;
    let graph = phase(
        || cu(g.launch(), "CudaGraph::launch"),
        || cu(cs.synchronize(), "synchronize"),
    )?;
    drop(g);
    let got = cu(cs.clone_dtoh(&c.e), "clone_dtoh")?;
    Ok((eager, graph, got))
}

/// One process of `side` on a sequence: its figures, or why there are none.
fn spawn(
    side: Side,
    kernels_only: bool,
    image: Option<&Path>,
    reference: Option<&Path>,
) -> std::result::Result<Figures, String> {
    let mut cmd = match side.spec() {
        None => {
            let path = reference.ok_or("no --graphs-reference")?;
            let mut c = Command::new(path);
            if kernels_only {
                c.arg("k");
            }
            c
        }
        Some(spec) => {
            let exe = std::env::current_exe().map_err(|e| format!("this executable: {e}"))?;
            let mut c = Command::new(exe);
            c.arg("bench");
            if let Some(p) = image {
                c.arg("--kernel-image").arg(p);
            }
            let seq = if kernels_only { "k" } else { "m" };
            c.env(CHILD, format!("{spec}:{seq}"));
            c
        }
    };
    let out = cmd
        .output()
        .map_err(|e| format!("{} could not be started: {e}", side.name()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match parse(&stdout) {
        Some(f) if out.status.success() || !f.correct => Ok(f),
        _ => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stdout.lines().chain(stderr.lines()).collect();
            let tail = tail[tail.len().saturating_sub(3)..].join(" | ");
            Err(format!("{} ({}): {tail}", side.name(), out.status))
        }
    }
}

/// The median over the rounds of `reference`'s figure over `side`'s in the same round (the
/// speed of the side against the reference): the processes of one round ran one after
/// another, so a slow stretch of the machine, which moved every side's host time from 1.4 to
/// 2.4 µs for minutes on the H200, weighs on both sides of a ratio.
fn paired(reference: &[Figures], side: &[Figures], f: impl Fn(&Figures) -> f64) -> f64 {
    let ratios: Vec<f64> = reference
        .iter()
        .zip(side)
        .map(|(r, s)| f(r) / f(s))
        .collect();
    median(&ratios)
}

/// `f` of the figures.
fn med(fs: &[Figures], f: impl Fn(&Figures) -> f64) -> f64 {
    median(&fs.iter().map(f).collect::<Vec<_>>())
}

/// The lowest and highest of `xs`.
fn range(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// How many CPUs the processes share: with one, the runtime's own threads share the launching
/// thread's CPU; with all of them, the processes land anywhere. (On the H200 neither steadied
/// the host time: stretches of minutes in which every side's launch took 2.0 to 2.9 µs instead
/// of 1.3 to 1.4 came either way, which the pairing by round absorbs.)
const CPUS: usize = 4;

/// This thread's CPU affinity, which the processes it spawns inherit.
struct Pinned {
    before: libc::cpu_set_t,
    cpus: Vec<usize>,
}

impl Pinned {
    /// Pins this thread to the last [`CPUS`] CPUs it may run on; `None` where the affinity
    /// cannot be read or set (the processes then run where the system puts them).
    fn last_cpus() -> Option<Pinned> {
        // SAFETY: `cpu_set_t` is plain data, all zero a valid (empty) set.
        let mut before: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: this thread (0) and a set of `size` bytes to write.
        if unsafe { libc::sched_getaffinity(0, size, &mut before) } != 0 {
            return None;
        }
        let mut cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .rev()
            .filter(|&c| {
                // SAFETY: an index below CPU_SETSIZE into a live set.
                unsafe { libc::CPU_ISSET(c, &before) }
            })
            .take(CPUS)
            .collect();
        cpus.reverse();
        // SAFETY: as above.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in &cpus {
            // SAFETY: `c` < CPU_SETSIZE; a live set.
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        // SAFETY: this thread and a set of `size` bytes holding CPUs it may use.
        let set_ok = !cpus.is_empty() && unsafe { libc::sched_setaffinity(0, size, &set) } == 0;
        set_ok.then_some(Pinned { before, cpus })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: this thread, and the set it had (errors ignored: the bench goes on wherever
        // it runs).
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.before) };
    }
}

/// Both sequences, `rounds` processes per side each, in rotating order; graphs.cu among the
/// sides where `reference` names its executable. A side whose process fails is reported and
/// left out of the sequence's rows.
pub fn run(
    res: &mut BenchResults,
    image: Option<&Path>,
    reference: Option<&Path>,
    rounds: usize,
) -> Result<()> {
    if let Some(p) = reference.filter(|p| !p.is_file()) {
        return Err(refused(format!(
            "--graphs-reference {}: not a file (build it: nvcc -O2 -arch=sm_90 -o graphs \
             graphs.cu, in shared/refbench)",
            p.display()
        )));
    }
    let mut sides: Vec<Side> = Side::RUST.to_vec();
    if reference.is_some() {
        sides.insert(0, Side::Cpp);
    }
    let pinned = Pinned::last_cpus();
    progress(&match &pinned {
        Some(p) => format!("  every process on CPUs {:?} (all sides alike)", p.cpus),
        None => "  the processes unpinned (the CPU affinity could not be set)".into(),
    });
    for kernels_only in [true, false] {
        let (test, name) = names(kernels_only);
        progress(&format!(
            "graphs, process by process: {name}, {rounds} processes per side ({})",
            sides
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let mut got: Vec<Vec<Option<Figures>>> = vec![Vec::new(); sides.len()];
        let mut failed: Vec<Option<String>> = vec![None; sides.len()];
        for r in 0..rounds {
            for i in 0..sides.len() {
                let k = (r + i) % sides.len();
                if failed[k].is_some() {
                    continue;
                }
                match spawn(sides[k], kernels_only, image, reference) {
                    Ok(f) => got[k].push(Some(f)),
                    Err(why) => failed[k] = Some(why),
                }
            }
        }
        for (k, side) in sides.iter().enumerate() {
            if let Some(why) = &failed[k] {
                progress(&format!("  {name} {}: failed: {why}", side.name()));
                res.errors.push(KindError {
                    kind: side.name().into(),
                    stage: "graphs processes",
                    message: format!("failed: {why}"),
                });
                got[k].clear();
            }
        }
        let figs: Vec<Vec<Figures>> = got
            .into_iter()
            .map(|v| v.into_iter().flatten().collect())
            .collect();
        report(res, test, name, &sides, &figs, rounds);
    }
    Ok(())
}

/// The progress lines, checks and rows of one sequence.
fn report(
    res: &mut BenchResults,
    test: &'static str,
    name: &str,
    sides: &[Side],
    figs: &[Vec<Figures>],
    rounds: usize,
) {
    let test = match test {
        "graphs_kernels" => "graphs_processes_kernels",
        _ => "graphs_processes_mixed",
    };
    for (side, fs) in sides.iter().zip(figs) {
        if fs.is_empty() {
            continue;
        }
        let (eh, ee) = (med(fs, |f| f.eager_host), med(fs, |f| f.eager_end));
        let (gh, ge) = (med(fs, |f| f.graph_host), med(fs, |f| f.graph_end));
        let hosts: Vec<f64> = fs.iter().map(|f| f.graph_host).collect();
        let (ghr, ger) = (
            range(&hosts),
            range(&fs.iter().map(|f| f.graph_end).collect::<Vec<_>>()),
        );
        progress(&format!(
            "  {name} {}: eager host {eh:.1} / end {ee:.1} us; graph host {gh:.3} ({:.3}-{:.3}) / \
             end {ge:.2} ({:.2}-{:.2}) us; graph/eager host {:.4}, end-to-end {:.3} (medians of \
             {} processes)",
            side.name(),
            ghr.0,
            ghr.1,
            ger.0,
            ger.1,
            gh / eh,
            ge / ee,
            fs.len()
        ));
        let each: Vec<String> = hosts.iter().map(|h| format!("{h:.3}")).collect();
        progress(&format!(
            "  {name} {}: graph host per process, in order: {} us",
            side.name(),
            each.join(" ")
        ));
        let correct = fs.iter().filter(|f| f.correct).count();
        // graphs.cu checks the mixed sequence only; the Rust sides check both.
        if *side != Side::Cpp || test == "graphs_processes_mixed" {
            res.checks.push(Check {
                what: format!("graphs processes: {}, {name}", side.name()),
                bytes: (N * 4) as u64,
                ok: correct == fs.len() && fs.len() == rounds,
                detail: (correct != fs.len())
                    .then(|| format!("{} of {} processes wrong", fs.len() - correct, fs.len())),
            });
        }
    }
    // The reference: graphs.cu where it ran, else the raw Rust process.
    let ran = |want: Side| {
        sides
            .iter()
            .position(|s| *s == want)
            .filter(|&i| !figs[i].is_empty())
    };
    let Some(r) = ran(Side::Cpp).or_else(|| ran(Side::Raw)) else {
        return;
    };
    let rf = &figs[r];
    for (k, side) in sides.iter().enumerate() {
        let fs = &figs[k];
        if k == r || fs.is_empty() {
            continue;
        }
        type Get = fn(&Figures) -> f64;
        let cols: [(&str, Get); 4] = [
            ("graph, host time", |f| f.graph_host),
            ("graph, end to end", |f| f.graph_end),
            ("eager, host time", |f| f.eager_host),
            ("eager, end to end", |f| f.eager_end),
        ];
        for (what, get) in cols {
            let (ours, reference) = (med(fs, get), med(rf, get));
            res.processes.push(HostRow {
                test,
                config: format!(
                    "{} / {}: {what} per round, medians of {} / {} processes (ratio: paired \
                     by round)",
                    side.name(),
                    sides[r].name(),
                    fs.len(),
                    rf.len()
                ),
                bytes: (N * 4) as u64,
                unit: "us",
                ours,
                reference,
                ratio: paired(rf, fs, get),
            });
        }
        // The gains, against the reference's in the same run.
        let gain = |fs: &[Figures], g: Get, e: Get| med(fs, g) / med(fs, e);
        let (host, end) = (
            gain(fs, |f| f.graph_host, |f| f.eager_host),
            gain(fs, |f| f.graph_end, |f| f.eager_end),
        );
        let (rhost, rend) = (
            gain(rf, |f| f.graph_host, |f| f.eager_host),
            gain(rf, |f| f.graph_end, |f| f.eager_end),
        );
        progress(&format!(
            "  {name} {} / {}: graph host {:.3}, end to end {:.3} (speed, paired by round; > 1: \
             faster); graph \
             / eager host {host:.4} against {rhost:.4}, end to end {end:.3} against {rend:.3}",
            side.name(),
            sides[r].name(),
            paired(rf, fs, |f| f.graph_host),
            paired(rf, fs, |f| f.graph_end),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graphs_cu_output_is_read() {
        // graphs.cu's lines as it prints them.
        let cpp = "100 ops per round (100 tiny kernels), median of 200 rounds\n\
                   eager: host 431.2 us, end-to-end 436.9 us\n\
                   graph: host 1.7 us, end-to-end 97.4 us\n\
                   graph/eager: host 0.004, end-to-end 0.223; data correct\n";
        assert_eq!(
            parse(cpp),
            Some(Figures {
                eager_host: 431.2,
                eager_end: 436.9,
                graph_host: 1.7,
                graph_end: 97.4,
                correct: true
            })
        );
        let wrong = cpp.replace("data correct", "data WRONG");
        assert!(!parse(&wrong).unwrap().correct);
        // A child's, to three decimals.
        let line = "graph: host 1.500 us, end-to-end 90.000 us";
        assert_eq!(
            parse(&cpp.replace("graph: host 1.7 us, end-to-end 97.4 us", line))
                .unwrap()
                .graph_end,
            90.0
        );
    }

    #[test]
    fn incomplete_output_is_none() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("eager: host 1 us, end-to-end 2 us\ngraph: host x us, end-to-end 3 us\ngraph/eager: data correct"), None);
        assert_eq!(
            parse("eager: host 1 us, end-to-end 2 us\ngraph: host 1 us, end-to-end 3 us\n"),
            None
        );
    }

    #[test]
    fn ratios_are_paired_by_round() {
        let f = |graph_host: f64| Figures {
            eager_host: 1.0,
            eager_end: 1.0,
            graph_host,
            graph_end: 1.0,
            correct: true,
        };
        // The machine slows down between rounds for both sides: the side is 10% slower in each
        // round, which the medians of each side alone (1.45 against 2.4: 0.6) do not say.
        let reference = [f(1.0), f(1.45), f(2.2), f(2.4), f(2.5)];
        let side = [f(1.1), f(1.595), f(2.42), f(2.64), f(2.75)];
        let r = paired(&reference, &side, |x| x.graph_host);
        assert!((r - 1.0 / 1.1).abs() < 1e-9, "{r}");
    }

    #[test]
    fn a_reference_that_is_not_a_file_is_refused_before_any_process() {
        let mut res = crate::results::sample::results();
        let rows = res.processes.len();
        let e = run(&mut res, None, Some(Path::new("/nonexistent/graphs")), 1).unwrap_err();
        assert_eq!(
            e.misuse(),
            Some(&cuda_mem::Misuse::InvalidArgument {
                op: "bench graphs",
                reason: "--graphs-reference /nonexistent/graphs: not a file (build it: nvcc -O2 \
                         -arch=sm_90 -o graphs graphs.cu, in shared/refbench)"
                    .into()
            })
        );
        assert_eq!(res.processes.len(), rows, "rows were added");
    }

    #[test]
    fn a_child_spec_that_names_no_side_or_sequence_is_refused() {
        for spec in ["cpp:k", "raw:x", "raw", "launcher:"] {
            let e = child(spec, None).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{CHILD}={spec}: expected SIDE:k or SIDE:m"),
                "{spec}"
            );
        }
    }

    #[test]
    fn sides_round_trip_through_their_spec() {
        for side in Side::RUST {
            assert_eq!(Side::from_spec(side.spec().unwrap()), Some(side));
        }
        assert_eq!(Side::from_spec("cpp"), None);
    }
}
