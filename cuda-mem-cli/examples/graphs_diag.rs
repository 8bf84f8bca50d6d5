//! Where the 100-tiny-kernel graph's end-to-end time goes in a Rust process (a diagnostic run
//! beside `scripts/diag/kdiag.cu`, which found the kernel image not to matter): the same 100
//! `cm_bump` launches captured raw (`cudaStreamBeginCapture` on a plain stream, a `cudaMalloc`
//! buffer) and through `Stream::capture`, replayed raw and through `GraphExec::launch`, each
//! alone for 200 rounds after 20 of warm-up, synchronized raw or through `Stream::synchronize`,
//! before and after cudarc's context is made; and each graph printed with
//! `cudaGraphDebugDotPrint` (verbose) into the directory given as the first argument.
//!
//!     graphs_diag OUT_DIR

use std::ffi::CString;
use std::time::Instant;

use cuda_mem::interop::cudarc::context;
use cuda_mem::{
    check, sys, CaptureMode, Device, DeviceBuffer, DevicePtrMut as _, GraphExec, Result, Stream,
};
use cuda_mem_probes::{bump_grid, Probes, BUMP_BLOCK, PROBE_PTX};
use cudarc::driver::{sys as dsys, LaunchConfig, PushKernelArg as _};

const N: u32 = 1024;
const ROUNDS: usize = 200;
const WARMUP: usize = 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Host and end-to-end medians (µs) of `ROUNDS` replays of `launch`, each waited by `wait`.
fn time(
    mut launch: impl FnMut() -> Result<()>,
    mut wait: impl FnMut() -> Result<()>,
) -> Result<(f64, f64)> {
    let (mut h, mut e) = (Vec::new(), Vec::new());
    for r in 0..ROUNDS + WARMUP {
        let t0 = Instant::now();
        launch()?;
        let t1 = Instant::now();
        wait()?;
        let t2 = Instant::now();
        if r >= WARMUP {
            h.push((t1 - t0).as_secs_f64() * 1e6);
            e.push((t2 - t0).as_secs_f64() * 1e6);
        }
    }
    Ok((median(h), median(e)))
}

fn raw_launch(exec: sys::cudaGraphExec_t, s: sys::cudaStream_t) -> Result<()> {
    // SAFETY: a live executable graph and stream; every replay is waited for before the next.
    check(unsafe { sys::cudaGraphLaunch(exec, s) }, || {
        "cudaGraphLaunch".into()
    })
}

fn raw_sync(s: sys::cudaStream_t) -> Result<()> {
    // SAFETY: a live stream.
    check(unsafe { sys::cudaStreamSynchronize(s) }, || {
        "cudaStreamSynchronize".into()
    })
}

fn dot(graph: sys::cudaGraph_t, dir: &str, name: &str) {
    let path = CString::new(format!("{dir}/{name}.dot")).unwrap_or_default();
    // SAFETY: a live graph; a NUL-terminated path.
    let code = unsafe { sys::cudaGraphDebugDotPrint(graph, path.as_ptr(), 1 << 0) };
    println!("dot {name}: {code:?}");
}

fn row(name: &str, t: (f64, f64)) {
    println!("{name:<62} host {:6.2} us  end {:6.1} us", t.0, t.1);
}

fn main() -> Result<()> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| ".".into());
    let probes = Probes::load()?;
    let s = Stream::non_blocking()?;
    let rs = s.as_raw();

    // The raw graph: a plain cudaMalloc buffer, captured with the runtime's calls only.
    let mut e: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; 4 KiB.
    check(unsafe { sys::cudaMalloc(&mut e, N as usize * 4) }, || {
        "cudaMalloc".into()
    })?;
    // SAFETY: the buffer just allocated, N words.
    check(unsafe { sys::cudaMemset(e, 0, N as usize * 4) }, || {
        "cudaMemset".into()
    })?;
    raw_sync(std::ptr::null_mut())?;
    let mut raw_graph = std::ptr::null_mut();
    let mode = sys::cudaStreamCaptureMode::cudaStreamCaptureModeThreadLocal;
    // SAFETY: a live stream; thread-local mode.
    let code = unsafe { sys::cudaStreamBeginCapture(rs, mode) };
    check(code, || "cudaStreamBeginCapture".into())?;
    for _ in 0..100 {
        // SAFETY: the N words allocated above, alive for the whole run.
        unsafe { probes.bump(e.cast(), N, &s)? };
    }
    // SAFETY: the capture begun above; a valid out-pointer.
    let code = unsafe { sys::cudaStreamEndCapture(rs, &mut raw_graph) };
    check(code, || "cudaStreamEndCapture".into())?;
    let mut raw_exec = std::ptr::null_mut();
    // SAFETY: a live graph; a valid out-pointer.
    let code = unsafe { sys::cudaGraphInstantiate(&mut raw_exec, raw_graph, 0) };
    check(code, || "cudaGraphInstantiate".into())?;
    // SAFETY: live handles.
    check(unsafe { sys::cudaGraphUpload(raw_exec, rs) }, || {
        "cudaGraphUpload".into()
    })?;
    raw_sync(rs)?;
    dot(raw_graph, &dir, "raw");

    // Ours: Stream::capture over a DeviceBuffer.
    let mut buf = DeviceBuffer::<u32>::zeroed(N as usize)?;
    let graph = s.capture(CaptureMode::ThreadLocal, &mut buf, |cap, b| {
        for _ in 0..100 {
            let w = b.device_ptr_mut(cap.stream())?;
            // SAFETY: the guard's N words, alive across the launch.
            unsafe { probes.bump(w.as_mut_ptr(), N, cap.stream())? };
        }
        Ok(())
    })?;
    dot(graph.as_raw(), &dir, "ours");
    let exec = graph.instantiate()?;
    exec.upload(&s)?;
    s.synchronize()?;

    for pass in ["before cudarc", "after cudarc's context"] {
        println!("== {pass}");
        row(
            "raw graph, raw launch, raw sync",
            time(|| raw_launch(raw_exec, rs), || raw_sync(rs))?,
        );
        row(
            "raw graph, raw launch, Stream::synchronize",
            time(|| raw_launch(raw_exec, rs), || s.synchronize())?,
        );
        row(
            "ours, raw launch, raw sync",
            time(|| raw_launch(exec.as_raw(), rs), || raw_sync(rs))?,
        );
        row(
            "ours, GraphExec::launch, Stream::synchronize",
            time(|| exec.launch(&s), || s.synchronize())?,
        );
        row(
            "raw graph, raw launch, raw sync (again)",
            time(|| raw_launch(raw_exec, rs), || raw_sync(rs))?,
        );
        if pass == "before cudarc" {
            let _ctx = context(Device::current()?)?;
        }
    }
    cudarc_side(&dir, &exec, &s, raw_exec)?;
    // Eager rounds first (as the bench runs them before its replays), then the raw graph alone.
    let (mut hs, mut es) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS + WARMUP {
        let t0 = Instant::now();
        for _ in 0..100 {
            // SAFETY: the N words allocated above, alive for the whole run.
            unsafe { probes.bump(e.cast(), N, &s)? };
        }
        let t1 = Instant::now();
        raw_sync(rs)?;
        hs.push((t1 - t0).as_secs_f64() * 1e6);
        es.push(Instant::now().duration_since(t0).as_secs_f64() * 1e6);
    }
    row(
        "eager rounds (100 launches on the raw buffer)",
        (median(hs), median(es)),
    );
    row(
        "raw graph, raw launch, raw sync (after raw eager rounds)",
        time(|| raw_launch(raw_exec, rs), || raw_sync(rs))?,
    );
    // The crate's eager rounds, as the bench runs them (100 guarded launches on a buffer).
    let mut g = DeviceBuffer::<u32>::zeroed(N as usize)?;
    for _ in 0..ROUNDS + WARMUP {
        for _ in 0..100 {
            let w = g.device_ptr_mut(&s)?;
            // SAFETY: the guard's N words, alive across the launch.
            unsafe { probes.bump(w.as_mut_ptr(), N, &s)? };
        }
        s.synchronize()?;
    }
    row(
        "raw graph, raw launch, raw sync (after the crate's eager rounds)",
        time(|| raw_launch(raw_exec, rs), || raw_sync(rs))?,
    );
    // What `cuda-mem bench` makes before its sections (its `Ctx`: two timing events, a mapped
    // flag and the probes loaded again), then the same raw graph on the same buffer.
    let _events = (cuda_mem::Event::timing()?, cuda_mem::Event::timing()?);
    let _flag = cuda_mem::alloc_mapped::<u32>(1)?;
    let _again = Probes::load()?;
    row(
        "raw graph, raw launch, raw sync (after the bench's Ctx)",
        time(|| raw_launch(raw_exec, rs), || raw_sync(rs))?,
    );
    // A graph on a buffer of a 2 MiB allocation of its own, then on buffers allocated after
    // 64 others of 4 KiB: placement, in this process.
    let mut spread = Vec::new();
    for n in [0usize, 64] {
        let _filler = (0..n)
            .map(|_| DeviceBuffer::<u32>::zeroed(N as usize))
            .collect::<Result<Vec<_>>>()?;
        let mut b = DeviceBuffer::<u32>::zeroed(if n == 0 { 1 << 19 } else { N as usize })?;
        let g = s
            .capture(CaptureMode::ThreadLocal, &mut b, |cap, b| {
                for _ in 0..100 {
                    let w = b.device_ptr_mut(cap.stream())?;
                    // SAFETY: the guard's first N words, alive across the launch.
                    unsafe { probes.bump(w.as_mut_ptr(), N, cap.stream())? };
                }
                Ok(())
            })?
            .instantiate()?;
        g.upload(&s)?;
        let t = time(|| g.launch(&s), || s.synchronize())?;
        spread.push((n, t));
        g.into_resources()?;
    }
    for (n, t) in spread {
        row(
            &format!("ours on a fresh buffer after {n} others of 4 KiB"),
            t,
        );
    }
    let _ = exec.into_resources()?;
    // SAFETY: every launch was waited for; never used again.
    unsafe {
        sys::cudaGraphExecDestroy(raw_exec);
        sys::cudaGraphDestroy(raw_graph);
        sys::cudaFree(e);
    }
    Ok(())
}

/// cudarc's graph of the same launches, as the bench makes it: timed, and printed.
fn cudarc_side(
    dir: &str,
    exec: &GraphExec<&mut DeviceBuffer<u32>>,
    s: &Stream,
    raw_exec: sys::cudaGraphExec_t,
) -> Result<()> {
    let fail = |e: cudarc::driver::DriverError| {
        cuda_mem::Error::Misuse(cuda_mem::Misuse::InvalidArgument {
            op: "graphs_diag cudarc",
            reason: format!("{e:?}"),
        })
    };
    let ctx = context(Device::current()?)?;
    let cs = ctx.new_stream().map_err(fail)?;
    let module = ctx
        .load_module(cudarc::nvrtc::Ptx::from_src(
            PROBE_PTX.to_str().unwrap_or_default(),
        ))
        .map_err(fail)?;
    let f = module.load_function("cm_bump").map_err(fail)?;
    // SAFETY: untracked slices used on `cs` only, synchronized before they are dropped.
    unsafe { ctx.disable_event_tracking() };
    let mut e = cs.alloc_zeros::<u32>(N as usize).map_err(fail)?;
    // SAFETY: as above.
    unsafe { ctx.enable_event_tracking() };
    cs.synchronize().map_err(fail)?;
    let cfg = LaunchConfig {
        grid_dim: (bump_grid(N), 1, 1),
        block_dim: (BUMP_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // cudarc's eager rounds, as the bench runs them (220 x 100 launches on its slice), then the
    // raw graph on the raw buffer.
    for _ in 0..ROUNDS + WARMUP {
        for _ in 0..100 {
            // SAFETY: `cm_bump(u32*, u32)` with N words.
            unsafe { cs.launch_builder(&f).arg(&mut e).arg(&N).launch(cfg) }.map_err(fail)?;
        }
        cs.synchronize().map_err(fail)?;
    }
    row(
        "raw graph, raw launch, raw sync (after cudarc's eager rounds)",
        time(|| raw_launch(raw_exec, s.as_raw()), || raw_sync(s.as_raw()))?,
    );
    cs.begin_capture(dsys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(fail)?;
    for _ in 0..100 {
        // SAFETY: `cm_bump(u32*, u32)` with N words.
        unsafe { cs.launch_builder(&f).arg(&mut e).arg(&N).launch(cfg) }.map_err(fail)?;
    }
    let g = cs
        .end_capture(dsys::CUgraphInstantiate_flags(0))
        .map_err(fail)?
        .ok_or_else(|| {
            fail(cudarc::driver::DriverError(
                dsys::cudaError_enum::CUDA_ERROR_UNKNOWN,
            ))
        })?;
    dot(g.cu_graph() as sys::cudaGraph_t, dir, "cudarc");
    g.upload().map_err(fail)?;
    row(
        "cudarc graph, CudaGraph::launch, CudaStream::synchronize",
        time(
            || g.launch().map_err(fail),
            || cs.synchronize().map_err(fail),
        )?,
    );
    let rs = cs.cu_stream() as sys::cudaStream_t;
    row(
        "cudarc graph, raw launch on its stream, raw sync",
        time(|| raw_launch(g.cu_graph_exec() as _, rs), || raw_sync(rs))?,
    );
    // The bench's pattern: ours, the raw launch of ours and cudarc's, rotating every round.
    let mut t = [(); 4].map(|_| (Vec::new(), Vec::new()));
    for r in 0..ROUNDS + WARMUP {
        for side in 0..4 {
            let k = (r + side) % 4;
            let t0 = Instant::now();
            match k {
                0 => exec.launch(s)?,
                1 => raw_launch(exec.as_raw(), s.as_raw())?,
                2 => g.launch().map_err(fail)?,
                _ => raw_launch(raw_exec, s.as_raw())?,
            }
            let t1 = Instant::now();
            if k == 2 {
                cs.synchronize().map_err(fail)?;
            } else {
                s.synchronize()?;
            }
            let t2 = Instant::now();
            if r >= WARMUP {
                t[k].0.push((t1 - t0).as_secs_f64() * 1e6);
                t[k].1.push((t2 - t0).as_secs_f64() * 1e6);
            }
        }
    }
    for (k, name) in [
        "interleaved: ours, GraphExec::launch",
        "interleaved: ours, raw launch",
        "interleaved: cudarc, CudaGraph::launch",
        "interleaved: raw graph, raw launch",
    ]
    .iter()
    .enumerate()
    {
        let (h, e) = std::mem::take(&mut t[k]);
        row(name, (median(h), median(e)));
    }
    Ok(())
}
