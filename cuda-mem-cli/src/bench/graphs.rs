//! CUDA graphs against eager launches, the two sequences of `shared/refbench/graphs.cu`, on
//! non-blocking streams: 100 tiny kernels, and 25 × (4 KiB copy from pinned memory, 4 KiB
//! memset, 4 KiB device copy, tiny kernel). The tiny kernel is graphs.cu's `bump` (the probes'
//! `cm_bump`: one thread per word, blocks of 256, `p[i] += 1` over 1024 words), so the
//! end-to-end figures are comparable with graphs.cu's.
//!
//! Each sequence is issued eagerly and captured once and replayed, by three sides whose
//! rounds are interleaved (the order rotating from round to round):
//!
//! - cuda-mem: the crate's calls (`copy_async`, `memset_async`, the kernel through a write
//!   guard), captured with `Stream::capture` (the buffers the sequence uses given as its
//!   resources: the kernels-only graph keeps the one buffer it writes) and replayed with
//!   `GraphExec::launch`;
//! - cudarc 0.19: `memcpy_htod`, `memset_zeros`, `memcpy_dtod` and the same PTX function
//!   through cudarc's launch builder, on a stream of its context (`new_stream`; the device
//!   slices made with cudarc's event tracking off, its advice for graphs: its event waits
//!   invalidate a capture), captured with `begin_capture` / `end_capture` (copies from a plain
//!   view of the pinned slice) and replayed with `CudaGraph::launch`;
//! - raw: the cuda-mem executable graph launched by the runtime's `cudaGraphLaunch` itself,
//!   without the crate's bookkeeping (graph rows only), as graphs.cu launches. (The crate's
//!   launches call the driver's `cuGraphLaunch`, as cudarc does, so they may take less.)
//!
//! Every side's graphs replay on the same memory (cudarc's on untracked views of cuda-mem's
//! buffers, its mixed graph's copies from cuda-mem's pinned words; its eager rounds use its own
//! slices): the end-to-end time depends on where the buffers lie, by up to a quarter on the
//! H200 for the kernels-only sequence, which is replayed over [`PLACEMENTS`] buffers.
//!
//! Host time (the enqueue) and end-to-end time (enqueue and completion, a stream synchronize),
//! medians of 200 rounds after 20 warm-up rounds, as graphs.cu measures them; rows in the
//! `peers` table (reference: cudarc; `× cudarc` is cudarc's time over ours), and progress
//! lines with graph ÷ eager per side and cuda-mem ÷ raw. The lead sets them beside graphs.cu's
//! output from the same machine. Every side's data is checked after its rounds.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cuda_mem::interop::cudarc::context;
use cuda_mem::{
    copy_async, sys, CaptureMode, Device, DeviceBuffer, DevicePtrMut as _, Error, Event, Graph,
    GraphExec, GraphResources, HostAllocFlags, PinnedBuffer, Result, Stream,
};
use cuda_mem_probes::{bump_grid, Kernel, Library, Probes, BUMP_BLOCK, PROBE_PTX};
use cudarc::driver::{
    sys as dsys, CudaFunction, CudaGraph, CudaSlice, CudaStream, HostSlice, LaunchConfig,
    PinnedHostSlice, PushKernelArg as _,
};

use super::peers::cu;

pub mod procs;
use super::{progress, Paired};
use crate::results::{BenchResults, Check, HostRow};
use crate::units::median;

/// `u32` elements per buffer: 4 KiB.
const N: usize = 1024;
const ROUNDS: usize = 200;
const WARMUP: usize = 20;
/// Rounds each side runs, warm-up included.
const ALL: usize = ROUNDS + WARMUP;
/// Buffers the kernels-only graphs are replayed over, in blocks of rounds, every side on the
/// same memory: a chain of tiny kernels takes from 86 to 116 us on the H200 depending on where
/// its 4 KiB lie (scripts/diag/placed.cu, and the bench's own raw reference), so one buffer per
/// side would compare placements, not launches.
const PLACEMENTS: usize = 8;

/// The bench's own refusal, for a failed setup step or a missing graph.
fn refused(reason: String) -> Error {
    Error::Misuse(cuda_mem::Misuse::InvalidArgument {
        op: "bench graphs",
        reason,
    })
}

/// The `--kernel-image` file's bytes, where one was given.
fn read_image(image: Option<&Path>) -> Result<Option<Vec<u8>>> {
    image
        .map(|p| {
            std::fs::read(p).map_err(|e| {
                refused(format!(
                    "--kernel-image {}: cannot be read: {e}",
                    p.display()
                ))
            })
        })
        .transpose()
}

/// The loaded kernels: the probes, and the `--kernel-image` library where one was given.
struct Loaded {
    probes: Probes,
    lib: Option<Library>,
}

impl Loaded {
    fn load(image: Option<&[u8]>) -> Result<Loaded> {
        Ok(Loaded {
            probes: Probes::load()?,
            lib: image.map(Library::load_image).transpose()?,
        })
    }

    /// The tiny kernel: the image's `bump` where one was given, else the probes' `cm_bump`.
    fn tiny(&self) -> Result<Tiny<'_>> {
        Ok(match &self.lib {
            Some(lib) => Tiny::Image(lib.kernel("bump")?),
            None => Tiny::Probes(&self.probes),
        })
    }
}

/// The tiny kernel: the probes' `cm_bump` (PTX, compiled by the driver), or `bump` from the
/// image given with `--kernel-image` (the machine code graphs.cu runs).
#[derive(Clone, Copy)]
enum Tiny<'a> {
    Probes(&'a Probes),
    Image(Kernel<'a>),
}

impl Tiny<'_> {
    /// The kernel's name in its image.
    fn name(self) -> &'static str {
        match self {
            Tiny::Probes(_) => "cm_bump",
            Tiny::Image(_) => "bump",
        }
    }

    /// Queues the kernel over the N words at `p`, in graphs.cu's grid.
    ///
    /// # Safety
    /// `p`: N writable words of device memory, alive until the kernel completes.
    unsafe fn launch(self, p: *mut u32, s: &Stream) -> Result<()> {
        match self {
            // SAFETY: as the caller guarantees.
            Tiny::Probes(probes) => unsafe { probes.bump(p, N as u32, s) },
            Tiny::Image(k) => {
                let mut p = p;
                let mut n = N as i32;
                let mut args = [
                    (&mut p as *mut *mut u32).cast(),
                    (&mut n as *mut i32).cast(),
                ];
                // SAFETY: `bump(unsigned*, int)` (the option's documented signature) with
                // its two arguments; the memory as the caller guarantees.
                unsafe { k.launch(bump_grid(N as u32), BUMP_BLOCK, 0, s, &mut args) }
            }
        }
    }
}

/// The tiny kernel on `e`, through a write guard.
fn bump(k: Tiny<'_>, e: &mut DeviceBuffer<u32>, s: &Stream) -> Result<()> {
    let w = e.device_ptr_mut(s)?;
    // SAFETY: the guard's N words of device memory, taken for `s`, alive across the launch,
    // which the guard records when it drops.
    unsafe { k.launch(w.as_mut_ptr(), s) }
}

/// 100 tiny kernels on `e`.
fn ours_kernels(tiny: Tiny<'_>, e: &mut DeviceBuffer<u32>, s: &Stream) -> Result<()> {
    for _ in 0..100 {
        bump(tiny, e, s)?;
    }
    Ok(())
}

/// 25 × (copy `h` → `d`, zero `e`, copy `d` → `e`, bump `e`).
fn ours_mixed(
    tiny: Tiny<'_>,
    h: &PinnedBuffer<u32>,
    d: &mut DeviceBuffer<u32>,
    e: &mut DeviceBuffer<u32>,
    s: &Stream,
) -> Result<()> {
    for _ in 0..25 {
        copy_async(&mut *d, h, s)?;
        e.memset_async(0, s)?;
        copy_async(&mut *e, &*d, s)?;
        bump(tiny, e, s)?;
    }
    Ok(())
}

/// cudarc's side: its stream, the kernel, and its buffers.
struct Cu {
    cs: Arc<CudaStream>,
    f: CudaFunction,
    h: PinnedHostSlice<u32>,
    d: CudaSlice<u32>,
    e: CudaSlice<u32>,
}

impl Cu {
    /// `image`: the `--kernel-image` file's bytes, else the probes' PTX is loaded; `name`:
    /// the kernel's name there ([`Tiny::name`]).
    fn new(device: Device, init: &[u32], image: Option<&[u8]>, name: &str) -> Result<Cu> {
        let ctx = context(device)?;
        let cs = cu(ctx.new_stream(), "new_stream")?;
        let ptx = match image {
            // cuModuleLoadData reads a cubin or fatbin as it is, PTX up to its NUL.
            Some(bytes) => {
                let mut data = bytes.to_vec();
                data.push(0);
                cudarc::nvrtc::Ptx::from_binary(data)
            }
            None => {
                let src = PROBE_PTX
                    .to_str()
                    .map_err(|e| refused(format!("the probes' PTX is not UTF-8: {e}")))?;
                cudarc::nvrtc::Ptx::from_src(src)
            }
        };
        let module = cu(ctx.load_module(ptx), "load_module")?;
        let f = cu(module.load_function(name), "load_function")?;
        // SAFETY: plain page-locked memory (flags 0), written below before anything reads it.
        let mut h = cu(
            unsafe { ctx.alloc_pinned_with_flags::<u32>(N, 0) },
            "alloc_pinned_with_flags",
        )?;
        cu(h.as_mut_slice(), "PinnedHostSlice::as_mut_slice")?.copy_from_slice(init);
        // The device slices are made with cudarc's event tracking off, its own advice for
        // graphs: with it on, each use waits on the slice's events, and a capture that waits
        // on an event recorded before it (by the eager rounds) is invalidated (seen on the
        // H200). So the eager rows, too, measure cudarc without its per-slice events.
        // SAFETY: cudarc's condition for untracked slices: their only stream is `cs`, which
        // is synchronized before they are read anywhere else (the data checks) and dropped.
        unsafe { ctx.disable_event_tracking() };
        let made = (|| {
            let d = cs.alloc_zeros::<u32>(N)?;
            let e = cs.alloc_zeros::<u32>(N)?;
            Ok((d, e))
        })();
        // SAFETY: as above; slices made from here on are tracked again.
        unsafe { ctx.enable_event_tracking() };
        let (d, e) = cu(made, "alloc_zeros")?;
        cu(cs.synchronize(), "synchronize")?;
        Ok(Cu { cs, f, h, d, e })
    }

    /// One round of the sequence on cudarc's stream, eager.
    fn round(
        &mut self,
        kernels_only: bool,
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        let Cu { cs, f, h, d, e } = self;
        Cu::round_from(cs, f, &*h, d, e, kernels_only)
    }

    /// One round, its copies from `h` (the pinned slice, or inside a capture a plain view of
    /// it: a `PinnedHostSlice` always waits on its own event, recorded by the eager rounds
    /// before the capture, which would invalidate it).
    fn round_from<H: HostSlice<u32> + ?Sized>(
        cs: &Arc<CudaStream>,
        f: &CudaFunction,
        h: &H,
        d: &mut CudaSlice<u32>,
        e: &mut CudaSlice<u32>,
        kernels_only: bool,
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        let n = N as u32;
        let cfg = LaunchConfig {
            grid_dim: (bump_grid(n), 1, 1),
            block_dim: (BUMP_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let kernel = |e: &mut CudaSlice<u32>| {
            // SAFETY: the probes' `cm_bump(u32* p, u32 n)`, or graphs.cu's `bump(unsigned*, int)`
            // from `--kernel-image` (a 32-bit count either way), with cudarc's slice of N `u32`
            // and `n` = N; cudarc orders and records the launch on the slice's events.
            unsafe { cs.launch_builder(f).arg(e).arg(&n).launch(cfg) }.map(drop)
        };
        if kernels_only {
            for _ in 0..100 {
                kernel(e)?;
            }
            return Ok(());
        }
        for _ in 0..25 {
            cs.memcpy_htod(h, &mut *d)?;
            cs.memset_zeros(&mut *e)?;
            cs.memcpy_dtod(&*d, &mut *e)?;
            kernel(e)?;
        }
        Ok(())
    }

    /// The sequence captured on cudarc's stream, instantiated (the capture always ended), on
    /// the memory `on` names: its own slices, or views of cuda-mem's.
    fn capture(&mut self, kernels_only: bool, on: Target<'_>) -> Result<CudaGraph> {
        let Cu { cs, f, h, d, e } = self;
        let (view, d, e): (&[u32], _, _) = match on {
            Target::Own => (
                // (Waits for the pinned slice's event on the host, before the capture begins.)
                cu(h.as_slice(), "PinnedHostSlice::as_slice")?,
                d,
                e,
            ),
            Target::Kernels(e) => (&[], d, e),
            Target::Mixed { h, d, e } => (h, d, e),
        };
        cu(
            cs.begin_capture(dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
            "begin_capture",
        )?;
        let captured = Cu::round_from(cs, f, view, d, e, kernels_only);
        let graph = cs.end_capture(dsys::CUgraphInstantiate_flags(0));
        // cudarc's recorded error (a failed call it could not return) is taken, so that it
        // does not fail the calls after.
        let captured = captured.and(cs.context().check_err());
        match (captured, graph) {
            (Ok(()), Ok(Some(g))) => Ok(g),
            (Err(e), _) | (Ok(()), Err(e)) => cu(Err(e), "stream capture"),
            (Ok(()), Ok(None)) => Err(refused("cudarc's end_capture made no graph".into())),
        }
    }
}

/// The nodes of `graph` by kind ("100 kernel, 1 event record"), to set the graphs of the sides
/// beside each other: an extra node is paid at every replay.
fn node_kinds(graph: sys::cudaGraph_t) -> String {
    let mut n = 0usize;
    // SAFETY: a live graph (the caller's); a null array asks for the count.
    if unsafe { sys::cudaGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }
        != sys::cudaError::cudaSuccess
    {
        return "unknown".into();
    }
    let mut nodes = vec![std::ptr::null_mut(); n];
    // SAFETY: room for `n` nodes; the count is updated to those written.
    if unsafe { sys::cudaGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }
        != sys::cudaError::cudaSuccess
    {
        return "unknown".into();
    }
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for node in &nodes[..n] {
        let mut t = sys::cudaGraphNodeType::cudaGraphNodeTypeCount;
        // SAFETY: a node of the live graph; a valid out-pointer.
        unsafe { sys::cudaGraphNodeGetType(*node, &mut t) };
        use sys::cudaGraphNodeType as T;
        let name = match t {
            T::cudaGraphNodeTypeKernel => "kernel".to_string(),
            T::cudaGraphNodeTypeMemcpy => "memcpy".to_string(),
            T::cudaGraphNodeTypeMemset => "memset".to_string(),
            T::cudaGraphNodeTypeEventRecord => "event record".to_string(),
            T::cudaGraphNodeTypeWaitEvent => "event wait".to_string(),
            T::cudaGraphNodeTypeEmpty => "empty".to_string(),
            T::cudaGraphNodeTypeMemAlloc => "mem alloc".to_string(),
            T::cudaGraphNodeTypeMemFree => "mem free".to_string(),
            other => format!("type {}", other.0),
        };
        match kinds.iter_mut().find(|(k, _)| *k == name) {
            Some((_, c)) => *c += 1,
            None => kinds.push((name, 1)),
        }
    }
    let parts: Vec<String> = kinds.iter().map(|(k, c)| format!("{c} {k}")).collect();
    format!("{n} nodes ({})", parts.join(", "))
}

/// Host and end-to-end samples (seconds) of one side.
#[derive(Default)]
struct Times {
    host: Vec<f64>,
    end: Vec<f64>,
}

impl Times {
    /// Times `enqueue` then `wait`, kept after the warm-up rounds.
    fn sample(
        &mut self,
        round: usize,
        enqueue: impl FnOnce() -> Result<()>,
        wait: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let t0 = Instant::now();
        enqueue()?;
        let t1 = Instant::now();
        wait()?;
        let t2 = Instant::now();
        if round >= WARMUP {
            self.host.push((t1 - t0).as_secs_f64());
            self.end.push((t2 - t0).as_secs_f64());
        }
        Ok(())
    }

    fn medians_us(&self) -> (f64, f64) {
        (median(&self.host) * 1e6, median(&self.end) * 1e6)
    }
}

/// Rows of ours against cudarc's (none where cudarc's side did not run).
fn rows(res: &mut BenchResults, test: &'static str, what: &str, ours: &Times, cudarc: &Times) {
    if cudarc.host.is_empty() {
        return;
    }
    for (kind, o, c) in [
        ("host time", &ours.host, &cudarc.host),
        ("end to end", &ours.end, &cudarc.end),
    ] {
        let p = Paired::new(o, c);
        let r = HostRow {
            test,
            config: format!("{what}, {kind} per round"),
            bytes: (N * 4) as u64,
            unit: "us",
            ours: p.ours * 1e6,
            reference: p.raw * 1e6,
            ratio: 1.0 / p.ratio,
        };
        progress(&format!(
            "  {test} {}: {:.1} us, cudarc {:.1} us: {:.2}x cudarc",
            r.config, r.ours, r.reference, r.ratio
        ));
        res.peers.push(r);
    }
}

/// `ok` as a check named `what`.
fn check(res: &mut BenchResults, what: String, ok: bool, detail: impl FnOnce() -> String) {
    res.checks.push(Check {
        what,
        bytes: (N * 4) as u64,
        ok,
        detail: (!ok).then(detail),
    });
}

/// The first element of `got` that is not `want(i)`, as a check detail.
fn first_wrong(got: &[u32], want: impl Fn(usize) -> u32) -> Option<String> {
    got.iter()
        .enumerate()
        .find(|&(i, &v)| v != want(i))
        .map(|(i, &v)| format!("element {i}: got {v}, expected {}", want(i)))
}

/// The names of a sequence: its rows' test, and its label.
fn names(kernels_only: bool) -> (&'static str, &'static str) {
    if kernels_only {
        ("graphs_kernels", "100 tiny kernels")
    } else {
        ("graphs_mixed", "25 x: 4 KiB H2D, memset, D2D, kernel")
    }
}

/// Eager rounds of ours (`round`) and cudarc's, alternating which goes first.
fn eager(
    kernels_only: bool,
    s: &Stream,
    cudarc: &mut Option<Cu>,
    mut round: impl FnMut() -> Result<()>,
) -> Result<(Times, Times)> {
    let (mut ours, mut theirs) = (Times::default(), Times::default());
    for r in 0..ALL {
        for side in 0..2 {
            if (r + side) % 2 == 0 {
                ours.sample(r, &mut round, || s.synchronize())?;
            } else if let Some(c) = cudarc.as_mut() {
                let cs = c.cs.clone();
                theirs.sample(
                    r,
                    || cu(c.round(kernels_only), "eager round"),
                    || cu(cs.synchronize(), "synchronize"),
                )?;
            }
        }
    }
    Ok((ours, theirs))
}

/// The graph rows' samples: cuda-mem's launch, cudarc's, and the raw launch.
struct Replays {
    ours: Times,
    cudarc: Times,
    raw: Times,
}

/// The memory one of cudarc's captures works on.
enum Target<'a> {
    /// Its own slices.
    Own,
    /// The kernels-only sequence on a view of cuda-mem's buffer.
    Kernels(&'a mut CudaSlice<u32>),
    /// The mixed sequence from cuda-mem's pinned words `h` through views of its `d` and `e`.
    Mixed {
        h: &'a [u32],
        d: &'a mut CudaSlice<u32>,
        e: &'a mut CudaSlice<u32>,
    },
}

/// Where cudarc's graphs of a sequence work, on cuda-mem's memory where its side runs on
/// untracked views of it ([`Views`]).
enum On<'a> {
    /// Its own slices: one graph.
    Own,
    /// The kernels-only sequence: one graph per view (placement).
    Each(&'a mut [CudaSlice<u32>]),
    /// The mixed sequence: one graph, from `h` through the views `[d, e]`.
    Mixed(&'a [u32], &'a mut [CudaSlice<u32>]),
}

/// cudarc's captures of the sequence on the memory `on` names; uploaded. A capture that fails
/// is reported (its rows left out), not fatal: then none.
fn cudarc_graphs(
    res: &mut BenchResults,
    kernels_only: bool,
    cudarc: &mut Option<Cu>,
    on: On<'_>,
) -> Result<Vec<CudaGraph>> {
    let captured: Option<Result<Vec<CudaGraph>>> = cudarc.as_mut().map(|c| match on {
        On::Own => Ok(vec![c.capture(kernels_only, Target::Own)?]),
        On::Each(views) => views
            .iter_mut()
            .map(|v| c.capture(kernels_only, Target::Kernels(v)))
            .collect(),
        On::Mixed(h, views) => match views {
            [d, e] => Ok(vec![c.capture(kernels_only, Target::Mixed { h, d, e })?]),
            _ => Err(refused("the mixed sequence needs views of d and e".into())),
        },
    });
    Ok(match captured {
        None => Vec::new(),
        Some(Ok(gs)) => {
            progress(&format!(
                "  graph nodes, cudarc: {}",
                node_kinds(gs[0].cu_graph() as sys::cudaGraph_t)
            ));
            for g in &gs {
                cu(g.upload(), "CudaGraph::upload")?;
            }
            gs
        }
        Some(Err(e)) => {
            super::attempt(res, &["cudarc"], "graphs cudarc capture", Err::<(), _>(e))?;
            Vec::new()
        }
    })
}

/// Replays in rotating order of three sides: ours (`ours(k)` launches the graph of placement
/// `k`), the raw launch of the same executable graphs (`raws`), and cudarc's `graphs`; the
/// measured rounds go through the placements in blocks of equal length, every side replaying
/// the graphs of the block's placement. Adds the replays per placement, all sides together,
/// to `launched`.
fn replays(
    s: &Stream,
    cudarc: Option<&Cu>,
    raws: &[sys::cudaGraphExec_t],
    ours: &mut dyn FnMut(usize) -> Result<()>,
    graphs: &[CudaGraph],
    launched: &mut [usize],
) -> Result<Replays> {
    let mut t = Replays {
        ours: Times::default(),
        cudarc: Times::default(),
        raw: Times::default(),
    };
    for r in 0..ALL {
        // Placements in blocks of consecutive rounds: each graph replayed again and again, as
        // graphs.cu replays its one (the driver's data of one executable graph stays warm).
        // (The warm-up rounds go round all of them.)
        let p = raws.len();
        let k = if r < WARMUP {
            r % p
        } else {
            (r - WARMUP) * p / ROUNDS
        };
        for side in 0..3 {
            match (r + side) % 3 {
                0 => t.ours.sample(r, || ours(k), || s.synchronize())?,
                1 => t.raw.sample(
                    r,
                    || {
                        // SAFETY: the executable graph keeps its buffers borrowed, and every
                        // round is waited for (the stream synchronized) before the next one or
                        // any other use of them: no fence needs to know this launch.
                        let code = unsafe { sys::cudaGraphLaunch(raws[k], s.as_raw()) };
                        cuda_mem::check(code, || "cudaGraphLaunch (raw)".into())
                    },
                    || s.synchronize(),
                )?,
                _ => {
                    // (cudarc's graphs: none, or one per placement.)
                    let (Some(c), Some(g)) = (cudarc, graphs.get(k)) else {
                        continue;
                    };
                    t.cudarc.sample(
                        r,
                        || cu(g.launch(), "CudaGraph::launch"),
                        || cu(c.cs.synchronize(), "synchronize"),
                    )?;
                }
            }
            launched[k] += 1;
        }
    }
    Ok(t)
}

/// A sequence's graph rows: its nodes, then the replays (ours, raw, cudarc's) of `graphs` (one
/// per placement; cudarc's on `views` of the same memory where given) beside the eager rounds
/// `eager`, twice: ours through `GraphExec::launch`, then through a `Launcher` per graph. The
/// graphs' resources are handed back. Returns the replays per placement.
fn graph_rows<R: GraphResources>(
    res: &mut BenchResults,
    kernels_only: bool,
    s: &Stream,
    cudarc: &mut Option<Cu>,
    graphs: Vec<Graph<R>>,
    on: On<'_>,
    eager: &(Times, Times),
) -> Result<Vec<usize>> {
    if let Some(g) = graphs.first() {
        progress(&format!(
            "  graph nodes, cuda-mem: {}",
            node_kinds(g.as_raw())
        ));
    }
    let mut execs = graphs
        .into_iter()
        .map(Graph::instantiate)
        .collect::<Result<Vec<_>>>()?;
    for exec in &execs {
        exec.upload(s)?;
    }
    s.synchronize()?;
    let theirs = cudarc_graphs(res, kernels_only, cudarc, on)?;
    let raws: Vec<_> = execs.iter().map(GraphExec::as_raw).collect();
    let mut launched = vec![0usize; execs.len()];
    let c = cudarc.as_ref();
    let plain = replays(
        s,
        c,
        &raws,
        &mut |k| execs[k].launch(s),
        &theirs,
        &mut launched,
    )?;
    let looped = {
        let mut ls = execs
            .iter_mut()
            .map(|e| e.launcher(s))
            .collect::<Result<Vec<_>>>()?;
        replays(s, c, &raws, &mut |k| ls[k].launch(), &theirs, &mut launched)?
    };
    drop(theirs);
    for exec in execs {
        exec.into_resources()?;
    }
    report(
        res,
        kernels_only,
        eager,
        &plain,
        "GraphExec::launch",
        "graph",
        true,
    );
    report(
        res,
        kernels_only,
        eager,
        &looped,
        "Launcher::launch",
        "graph (launcher)",
        false,
    );
    Ok(launched)
}

/// The progress lines of one sequence's replays through `how`, and its rows: those of the
/// graph, named `graph`, after the eager ones where `with_eager` (once per sequence).
fn report(
    res: &mut BenchResults,
    kernels_only: bool,
    eager: &(Times, Times),
    g: &Replays,
    how: &str,
    graph: &str,
    with_eager: bool,
) {
    let (test, _) = names(kernels_only);
    let (eh, ee) = eager.0.medians_us();
    let (gh, ge) = g.ours.medians_us();
    let (rh, re) = g.raw.medians_us();
    progress(&format!(
        "  {test} cuda-mem ({how}): eager host {eh:.1} / end {ee:.1} us; graph host {gh:.2} / \
         end {ge:.1} us; graph/eager host {:.3}, end-to-end {:.3}",
        gh / eh,
        ge / ee
    ));
    progress(&format!(
        "  {test} raw cudaGraphLaunch of the same graph: host {rh:.2} / end {re:.1} us; \
         {how} / raw: host {:.3}, end-to-end {:.3}",
        gh / rh,
        ge / re
    ));
    if !g.cudarc.host.is_empty() {
        let (ch, ce) = eager.1.medians_us();
        let (cgh, cge) = g.cudarc.medians_us();
        progress(&format!(
            "  {test} cudarc: eager host {ch:.1} / end {ce:.1} us; graph host {cgh:.2} / end \
             {cge:.1} us; graph/eager host {:.3}, end-to-end {:.3}",
            cgh / ch,
            cge / ce
        ));
    }
    if with_eager {
        rows(res, test, "eager", &eager.0, &eager.1);
    }
    rows(res, test, graph, &g.ours, &g.cudarc);
}

/// Both sequences, and a data check per side and sequence. `image`: `--kernel-image`.
pub fn run(res: &mut BenchResults, image: Option<&Path>) -> Result<()> {
    let bytes = read_image(image)?;
    let loaded = Loaded::load(bytes.as_deref())?;
    let tiny = loaded.tiny()?;
    progress(&format!(
        "graphs: the tiny kernel is {} from {}; cuda-mem launches graphs with {}",
        tiny.name(),
        image.map_or("the probes' PTX".to_string(), |p| p.display().to_string()),
        cuda_mem::measure::graph_launch_call()
    ));
    let s = Stream::non_blocking()?;
    let init: Vec<u32> = (0..N as u32).collect();
    let device = Device::current()?;
    // cudarc's side anew for each sequence: fresh slices, whose events no capture recorded.
    let cudarc_side = |res: &mut BenchResults| {
        let setup = Cu::new(device, &init, bytes.as_deref(), tiny.name());
        super::attempt(res, &["cudarc"], "graphs cudarc setup", setup)
    };

    // 100 tiny kernels, replayed over PLACEMENTS buffers (each graph keeps the one it writes),
    // cudarc's graphs on views of the same buffers. The buffers are the section's first
    // allocations, as graphs.cu's are its first.
    let mut es = (0..PLACEMENTS)
        .map(|_| DeviceBuffer::<u32>::zeroed(N))
        .collect::<Result<Vec<_>>>()?;
    raw_reference(tiny, "at the section's start")?;
    let mut cudarc = cudarc_side(res)?;
    let (_, name) = names(true);
    progress(&format!("graphs: {name}"));
    raw_reference(tiny, "after cudarc's setup")?;
    let ea = eager(true, &s, &mut cudarc, || ours_kernels(tiny, &mut es[0], &s))?;
    raw_reference(tiny, "after the eager rounds")?;
    let mut views = Views::of(cudarc.as_ref(), &es);
    let graphs = es
        .iter_mut()
        .map(|e| {
            s.capture(CaptureMode::ThreadLocal, e, |cap, e| {
                ours_kernels(tiny, e, cap.stream())
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let launched = graph_rows(
        res,
        true,
        &s,
        &mut cudarc,
        graphs,
        On::Each(&mut views.0),
        &ea,
    )?;
    drop(views);
    raw_reference(tiny, "after the replays")?;
    // Each replay (every side's) and each eager round of ours (on the first buffer) bumps
    // each word 100 times; cudarc's own slice had its eager rounds only.
    for (k, e) in es.iter().enumerate() {
        let runs = launched[k] + if k == 0 { ALL } else { 0 };
        let want = (100 * runs) as u32;
        check_ours(res, &format!("{name}, buffer {k}"), e, |_| want)?;
    }
    check_cudarc(res, name, cudarc.as_ref(), |_| (100 * ALL) as u32)?;

    // The mixed sequence: `h` read, `d` and `e` written.
    drop(cudarc);
    let mut cudarc = cudarc_side(res)?;
    let (_, name) = names(false);
    progress(&format!("graphs: {name}"));
    let h = PinnedBuffer::from_slice(&init, HostAllocFlags::DEFAULT)?;
    let mut de = [
        DeviceBuffer::<u32>::zeroed(N)?,
        DeviceBuffer::<u32>::zeroed(N)?,
    ];
    // cudarc's graph on the same memory: views of `d` and `e`, its copies from `h`'s words (a
    // plain slice: read only, by every side).
    let mut views = Views::of(cudarc.as_ref(), &de);
    let [d, e] = &mut de;
    let ea = eager(false, &s, &mut cudarc, || ours_mixed(tiny, &h, d, e, &s))?;
    let graph = s.capture(
        CaptureMode::ThreadLocal,
        (&h, &mut *d, &mut *e),
        |cap, (h, d, e)| ours_mixed(tiny, h, d, e, cap.stream()),
    )?;
    let hv = h.as_slice()?;
    let on = if views.0.is_empty() {
        On::Own
    } else {
        On::Mixed(hv, &mut views.0)
    };
    graph_rows(res, false, &s, &mut cudarc, vec![graph], on, &ea)?;
    drop(views);
    let e = &de[1];
    // Each step zeroes `e`, copies the source in and bumps it: element i ends as i + 1.
    let want = |i: usize| i as u32 + 1;
    check_ours(res, name, e, want)?;
    check_cudarc(res, name, cudarc.as_ref(), want)
}

/// An executable graph made of raw runtime calls only, destroyed on drop (after the caller has
/// waited for its launches).
struct RawExec(sys::cudaGraphExec_t);

impl RawExec {
    /// What `queue` queues on `rs` captured (`cudaStreamBeginCapture`, thread-local mode, on a
    /// stream that is not capturing) and instantiated. The capture always ends, and the graph
    /// is destroyed, whatever failed.
    fn capture(rs: sys::cudaStream_t, queue: impl FnOnce() -> Result<()>) -> Result<RawExec> {
        let mode = sys::cudaStreamCaptureMode::cudaStreamCaptureModeThreadLocal;
        // SAFETY: a live stream, not capturing (the caller's).
        let begun = unsafe { sys::cudaStreamBeginCapture(rs, mode) };
        cuda_mem::check(begun, || "cudaStreamBeginCapture".into())?;
        let queued = queue();
        let mut graph = std::ptr::null_mut();
        // SAFETY: the capture begun above; a valid out-pointer.
        let ended = unsafe { sys::cudaStreamEndCapture(rs, &mut graph) };
        let made = queued
            .and_then(|()| cuda_mem::check(ended, || "cudaStreamEndCapture".into()))
            .and_then(|()| {
                let mut exec = std::ptr::null_mut();
                // SAFETY: the graph the capture made; a valid out-pointer.
                let code = unsafe { sys::cudaGraphInstantiate(&mut exec, graph, 0) };
                cuda_mem::check(code, || "cudaGraphInstantiate".into()).map(|()| RawExec(exec))
            });
        if !graph.is_null() {
            // SAFETY: the captured graph, no longer needed once instantiated (or not).
            unsafe { sys::cudaGraphDestroy(graph) };
        }
        made
    }

    /// `cudaGraphLaunch` of the graph on `rs`.
    ///
    /// # Safety
    /// A live stream; the memory the graph's nodes use alive and untouched by anything else
    /// until the launch completes.
    unsafe fn launch(&self, rs: sys::cudaStream_t) -> Result<()> {
        // SAFETY: a live executable graph; the rest as the caller guarantees.
        let code = unsafe { sys::cudaGraphLaunch(self.0, rs) };
        cuda_mem::check(code, || "cudaGraphLaunch".into())
    }

    /// `cudaGraphUpload` of the graph on `rs` (a live stream).
    fn upload(&self, rs: sys::cudaStream_t) -> Result<()> {
        // SAFETY: a live executable graph; the caller's live stream.
        let code = unsafe { sys::cudaGraphUpload(self.0, rs) };
        cuda_mem::check(code, || "cudaGraphUpload".into())
    }
}

impl Drop for RawExec {
    fn drop(&mut self) {
        // SAFETY: the executable graph this owns, destroyed once; errors ignored (drop).
        unsafe { sys::cudaGraphExecDestroy(self.0) };
    }
}

/// The kernels-only graph made of raw runtime calls only (a `cudaMalloc` buffer, a capture
/// with `cudaStreamBeginCapture` on a plain stream), replayed alone: in-process, what graphs.cu
/// measures. Progress line only, labelled `when`.
fn raw_reference(tiny: Tiny<'_>, when: &str) -> Result<()> {
    let s = Stream::non_blocking()?;
    let rs = s.as_raw();
    let mut e: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; N words.
    cuda_mem::check(unsafe { sys::cudaMalloc(&mut e, N * 4) }, || {
        "cudaMalloc".into()
    })?;
    let run = || -> Result<(f64, f64, f64)> {
        // SAFETY: the N words just allocated.
        cuda_mem::check(unsafe { sys::cudaMemset(e, 0, N * 4) }, || {
            "cudaMemset".into()
        })?;
        // SAFETY: no arguments (waits for the memset above, queued on the legacy stream, before
        // the capture's stream uses the buffer).
        cuda_mem::check(unsafe { sys::cudaDeviceSynchronize() }, || "sync".into())?;
        let exec = RawExec::capture(rs, || {
            for _ in 0..100 {
                // SAFETY: the N words allocated above, freed below after the replays.
                unsafe { tiny.launch(e.cast(), &s)? };
            }
            Ok(())
        })?;
        let mut t = Times::default();
        let mut gpu = Vec::new();
        let (a, b) = (Event::timing()?, Event::timing()?);
        let timed = (|| {
            for r in 0..ALL {
                t.sample(
                    r,
                    || {
                        a.record(&s)?;
                        // SAFETY: each replay is waited for before the next.
                        unsafe { exec.launch(rs)? };
                        b.record(&s)
                    },
                    || s.synchronize(),
                )?;
                if r >= WARMUP {
                    gpu.push(f64::from(Event::elapsed_ms(&a, &b)?) * 1e3);
                }
            }
            Ok(())
        })();
        // (Its launches waited for before it is destroyed.)
        let _ = s.synchronize();
        drop(exec);
        timed.map(|()| {
            let (h, e) = t.medians_us();
            (h, e, median(&gpu))
        })
    };
    let out = run();
    let _ = s.synchronize();
    // SAFETY: allocated above; every use of it was waited for.
    unsafe { sys::cudaFree(e) };
    let (h, t, g) = out?;
    progress(&format!(
        "  raw calls only (cudaMalloc buffer, raw capture, replayed alone), {when}: host {h:.2} \
         / end {t:.1} us (GPU, between events: {g:.1} us)"
    ));
    Ok(())
}

/// cudarc slices over the memory of cuda-mem buffers, untracked (no events), so that cudarc's
/// graphs replay on the very memory ours do: the end-to-end time of a chain of tiny kernels
/// depends on where their buffer lies (scripts/diag/placed.cu). cudarc never frees them: they
/// are leaked (`CudaSlice::leak`, which with tracking off touches nothing) on drop, before the
/// buffers are.
struct Views(Vec<CudaSlice<u32>>);

impl Views {
    /// Views of `es` on cudarc's stream (none without cudarc's side).
    fn of(c: Option<&Cu>, es: &[DeviceBuffer<u32>]) -> Views {
        let Some(c) = c else {
            return Views(Vec::new());
        };
        let ctx = c.cs.context();
        // SAFETY: cudarc's condition for untracked slices: their only stream is `c.cs`, whose
        // work is synchronized after every sample, before any other use of the memory.
        unsafe { ctx.disable_event_tracking() };
        let views = es
            .iter()
            .map(|e| {
                // SAFETY: `e` is N words of live device memory of this context, which outlive
                // the view (leaked on drop, before the buffers go); nothing else uses the
                // memory while cudarc's work on it is pending (each sample is synchronized).
                unsafe { c.cs.upgrade_device_ptr::<u32>(e.as_ptr() as u64, N) }
            })
            .collect();
        // SAFETY: as above; slices made from here on are tracked again.
        unsafe { ctx.enable_event_tracking() };
        Views(views)
    }
}

impl Drop for Views {
    fn drop(&mut self) {
        for v in self.0.drain(..) {
            v.leak();
        }
    }
}

/// The data check of ours in `e`, element `i` expected as `want(i)`.
fn check_ours(
    res: &mut BenchResults,
    name: &str,
    e: &DeviceBuffer<u32>,
    want: impl Fn(usize) -> u32,
) -> Result<()> {
    let wrong = first_wrong(&e.to_vec()?, want);
    check(
        res,
        format!("graphs: cuda-mem, {name}"),
        wrong.is_none(),
        || wrong.unwrap_or_default(),
    );
    Ok(())
}

/// The data check of cudarc's side in its own `e` (where its side ran).
fn check_cudarc(
    res: &mut BenchResults,
    name: &str,
    cudarc: Option<&Cu>,
    want: impl Fn(usize) -> u32,
) -> Result<()> {
    if let Some(c) = cudarc {
        let got = cu(c.cs.clone_dtoh(&c.e), "clone_dtoh")?;
        let wrong = first_wrong(&got, want);
        check(
            res,
            format!("graphs: cudarc, {name}"),
            wrong.is_none(),
            || wrong.unwrap_or_default(),
        );
    }
    Ok(())
}
