//! The host overhead of the hot path over the raw runtime call, per call: `copy_async` (4 KiB,
//! pinned to device and back), `memset_async`, the guards `device_ptr` / `device_ptr_mut`
//! (each followed by the raw call it guards), on the legacy default stream and on a
//! non-blocking stream, for buffers used by that stream alone (`one`) and by two (`two`: before
//! each sample another stream reads them and is synchronized), each configuration starting
//! from idle fences; the fence bookkeeping alone
//! around the raw copy (`fence_only`); a pooled `DeviceBuffer` allocated and freed against the
//! raw `cudaMallocFromPoolAsync` + `cudaFreeAsync`; and the pooled pair's bookkeeping with
//! stand-in handles (`pool_bookkeeping`, as the example of that name). The rows are those of
//! `cuda-mem bench --sections calls` (`overhead_*`), made without the spin kernel that holds
//! the stream there.
//!
//! Made to run on the CPU against the fake runtime of `scripts/fakecudart` (whose calls return
//! at once, so only the host side is timed), where `perf` can see where the cycles go:
//! `scripts/fakecudart/run.sh` builds both and runs this. It runs on a GPU as well (the raw
//! and our calls then queue real work, and each sample ends with a synchronize).
//!
//! The graph rows launch an executable graph of one buffer (a captured memset) and of three
//! (a copy in, a memset, a device copy) through `GraphExec::launch` and through a raw
//! `cudaGraphLaunch`, each launch timed alone and followed by a stream synchronize, as
//! `cuda-mem bench --sections graphs` replays them.
//!
//! Against the fake runtime, each row also says which runtime calls ours made besides the raw
//! one, per call in the steady state (the column `extra calls`: the fake counts every call by
//! name, `fake_counts`), and with `FAKE_EVICT_KIB=n` every call of the fake that stands for
//! real work (queueing, waiting) touches `n` KiB of its own memory, so that the library's data
//! is cold at its next call, as after a real runtime call.
//!
//! Run: `cargo run --release -p cuda-mem --features measure --example hot_path [samples]
//! [calls per sample]` (defaults 21 and 256); `HOT_PATH_ONLY=text` runs only the rows whose
//! "row config" contains `text` (and then stops before the pool rows unless they match).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, CStr};
use std::os::raw::c_void;
use std::time::Instant;

use cuda_mem::sys::cudaMemcpyKind as K;
use cuda_mem::{
    check, copy_async, memset_async, sys, CaptureMode, DeviceBuffer, DevicePtr as _,
    DevicePtrMut as _, GraphExec, HostAllocFlags, MemPool, PinnedBuffer, Result, Stream,
};

/// Bytes of each call.
const SMALL: usize = 4096;

/// The rows of each stream configuration, in order.
const OPS: [&str; 6] = [
    "copy_h2d",
    "copy_d2h",
    "memset",
    "device_ptr",
    "device_ptr_mut",
    "fence_only",
];

/// The buffers (4 KiB each) and the fence-only ablation's two fences.
struct Small {
    host: PinnedBuffer<u8>,
    dev: DeviceBuffer<u8>,
    other_host: PinnedBuffer<u8>,
    other_dev: DeviceBuffer<u8>,
    fences: cuda_mem::measure::FencePair,
}

/// Raw `cudaMemcpyAsync`.
///
/// # Safety
/// As the runtime's: `dst` and `src` valid for `SMALL` bytes of the copy `kind`, untouched by
/// the host until the stream has passed the copy.
unsafe fn raw_copy(dst: *mut c_void, src: *const c_void, kind: K, s: &Stream) -> Result<()> {
    // SAFETY: the caller's promise.
    let code = unsafe { sys::cudaMemcpyAsync(dst, src, SMALL, kind, s.as_raw()) };
    check(code, || "cudaMemcpyAsync".into())
}

/// Raw `cudaMemsetAsync` of `SMALL` bytes to zero.
///
/// # Safety
/// `d` is device memory of `SMALL` bytes, untouched by the host until the stream has passed
/// the fill.
unsafe fn raw_memset(d: *mut c_void, s: &Stream) -> Result<()> {
    // SAFETY: the caller's promise.
    let code = unsafe { sys::cudaMemsetAsync(d, 0, SMALL, s.as_raw()) };
    check(code, || "cudaMemsetAsync".into())
}

impl Small {
    /// One call of `op` on `s`: ours (`ours`) or the raw call alone.
    fn call(&mut self, op: &str, ours: bool, s: &Stream) -> Result<()> {
        let h: *mut c_void = self.host.as_mut_ptr().cast();
        let d: *mut c_void = self.dev.as_mut_ptr().cast();
        // Every raw call below: the pointers are the 4 KiB buffers of `self`, which outlive
        // the calls; every sample synchronizes the stream before they are used otherwise or
        // freed, and the host never touches them meanwhile.
        match (op, ours) {
            ("copy_h2d", true) => copy_async(&mut self.dev, &self.host, s),
            // SAFETY: as above.
            ("copy_h2d", false) => unsafe { raw_copy(d, h, K::cudaMemcpyHostToDevice, s) },
            ("copy_d2h", true) => copy_async(&mut self.host, &self.dev, s),
            // SAFETY: as above.
            ("copy_d2h", false) => unsafe { raw_copy(h, d, K::cudaMemcpyDeviceToHost, s) },
            ("memset", true) => memset_async(&mut self.dev, 0, s),
            // SAFETY: as above.
            ("memset", false) => unsafe { raw_memset(d, s) },
            ("device_ptr", true) => {
                let g = self.dev.device_ptr(s)?;
                // SAFETY: as above; the guard ordered `s` and records the copy.
                unsafe { raw_copy(h, g.as_ptr().cast(), K::cudaMemcpyDeviceToHost, s) }
            }
            // SAFETY: as above.
            ("device_ptr", false) => unsafe { raw_copy(h, d, K::cudaMemcpyDeviceToHost, s) },
            ("device_ptr_mut", true) => {
                let g = self.dev.device_ptr_mut(s)?;
                // SAFETY: as above; the guard ordered `s` and records the fill.
                unsafe { raw_memset(g.as_mut_ptr().cast(), s) }
            }
            // SAFETY: as above.
            ("device_ptr_mut", false) => unsafe { raw_memset(d, s) },
            // SAFETY: as above (fences that no buffer owns: the raw copy's host pointer is
            // never read while it may run).
            ("fence_only", true) => self.fences.around(s, SMALL, || unsafe {
                raw_copy(d, h, K::cudaMemcpyHostToDevice, s)
            })?,
            // SAFETY: as above.
            _ => unsafe { raw_copy(d, h, K::cudaMemcpyHostToDevice, s) },
        }
    }

    /// Another stream's use of the buffers (the `two` rows): it reads both, then is
    /// synchronized.
    fn use_on(&mut self, other: &Stream) -> Result<()> {
        copy_async(&mut self.other_host, &self.dev, other)?;
        copy_async(&mut self.other_dev, &self.host, other)?;
        other.synchronize()
    }
}

/// The fake runtime's call counters (`fake_counts`, `fake_counts_reset` of
/// `scripts/fakecudart/fake.c`), where the runtime opened is the fake.
struct Counters {
    counts: unsafe extern "C" fn(*mut *const c_char, *mut u64, usize) -> usize,
    reset: unsafe extern "C" fn(),
    /// `fake_callgrind_mark`: under callgrind, a dump of the counts since the last mark.
    mark: unsafe extern "C" fn(*const c_char),
}

impl Counters {
    /// The counters of the runtime already opened (after a first call), if it has them.
    fn of_runtime() -> Option<Counters> {
        let path = std::ffi::CString::new(sys::runtime_library()?).ok()?;
        // SAFETY: a NUL-terminated path; RTLD_NOLOAD opens nothing new (the runtime is
        // loaded already) and the handle is never closed.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if h.is_null() {
            return None;
        }
        // SAFETY: a live handle and NUL-terminated names.
        let (c, r, m) = unsafe {
            (
                libc::dlsym(h, c"fake_counts".as_ptr()),
                libc::dlsym(h, c"fake_counts_reset".as_ptr()),
                libc::dlsym(h, c"fake_callgrind_mark".as_ptr()),
            )
        };
        if c.is_null() || r.is_null() || m.is_null() {
            return None;
        }
        // SAFETY: the fake's functions, of these signatures (fake.c).
        unsafe {
            Some(Counters {
                counts: std::mem::transmute::<
                    *mut c_void,
                    unsafe extern "C" fn(*mut *const c_char, *mut u64, usize) -> usize,
                >(c),
                reset: std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(r),
                mark: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*const c_char)>(m),
            })
        }
    }

    /// The calls `f` makes on this thread, by name; under callgrind, its counts are dumped
    /// as `label` (`CACHE=1 scripts/fakecudart/run.sh` reads them, through `cache.py`).
    fn of(&self, label: &str, f: impl FnOnce() -> Result<()>) -> Result<BTreeMap<String, u64>> {
        let label = std::ffi::CString::new(label).expect("no NUL in labels");
        // SAFETY: the fake's functions: no arguments, and a NUL-terminated name.
        unsafe {
            (self.reset)();
            (self.mark)(c"-".as_ptr());
        }
        f()?;
        // SAFETY: a NUL-terminated name.
        unsafe { (self.mark)(label.as_ptr()) };
        let mut names = [std::ptr::null::<c_char>(); 256];
        let mut counts = [0u64; 256];
        // SAFETY: room for 256 entries, as passed.
        let n = unsafe { (self.counts)(names.as_mut_ptr(), counts.as_mut_ptr(), 256) }.min(256);
        Ok(names[..n]
            .iter()
            .zip(&counts[..n])
            .map(|(&p, &c)| {
                // SAFETY: the fake's `__func__` names: static NUL-terminated strings.
                let name = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
                (name, c)
            })
            .collect())
    }
}

/// The calls per call of `ours` beyond those of `raw`, both counted over `calls` calls (`-`
/// for none): "cudaEventRecord+1 cudaGetDevice+0.5".
fn diff(ours: &BTreeMap<String, u64>, raw: &BTreeMap<String, u64>, calls: u32) -> String {
    let mut out = Vec::new();
    for name in ours.keys().chain(raw.keys()).collect::<BTreeSet<_>>() {
        let d = ours.get(name).copied().unwrap_or(0) as f64
            - raw.get(name).copied().unwrap_or(0) as f64;
        if d != 0.0 {
            out.push(format!("{name}{:+}", d / f64::from(calls)));
        }
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(" ")
    }
}

/// The graph rows' executable graphs: one buffer (a memset), three (a copy in, a memset, a
/// device copy).
struct Graphs<'a> {
    one: GraphExec<&'a mut DeviceBuffer<u8>>,
    three: GraphExec<(
        &'a PinnedBuffer<u8>,
        &'a mut DeviceBuffer<u8>,
        &'a mut DeviceBuffer<u8>,
    )>,
}

/// One launch, ours (`launch`) or the raw `cudaGraphLaunch` of `raw` on `s`, timed alone (ns),
/// then a synchronize of `s`.
fn launch_once(
    ours: bool,
    launch: impl FnOnce() -> Result<()>,
    raw: sys::cudaGraphExec_t,
    s: &Stream,
) -> Result<f64> {
    let t = Instant::now();
    if ours {
        launch()?;
    } else {
        // SAFETY: the executable graph keeps its buffers borrowed, and every launch is waited
        // for (the stream synchronized below) before the next one or any other use of them.
        let code = unsafe { sys::cudaGraphLaunch(raw, s.as_raw()) };
        check(code, || "cudaGraphLaunch".into())?;
    }
    let ns = t.elapsed().as_secs_f64() * 1e9;
    s.synchronize()?;
    Ok(ns)
}

/// ns per launch, ours and raw (`launch(ours)`), `calls` launches a sample, interleaved.
fn launch_row(
    samples: usize,
    calls: u32,
    mut launch: impl FnMut(bool) -> Result<f64>,
) -> Result<(f64, f64)> {
    paired(samples, |ours| {
        let mut sum = 0.0;
        for _ in 0..calls {
            sum += launch(ours)?;
        }
        Ok(sum / f64::from(calls))
    })
}

/// One graph row: the launches' timings (`launch(ours)`, ns), and where the fake runtime counts
/// calls, a counted run of each side and the calls ours made besides.
fn graph_row(
    samples: usize,
    calls: u32,
    counters: Option<&Counters>,
    name: &str,
    mut launch: impl FnMut(bool) -> Result<f64>,
) -> Result<()> {
    let t = launch_row(samples, calls, &mut launch)?;
    let extra = match counters {
        Some(c) => {
            let mut run = |ours: bool| -> Result<()> {
                for _ in 0..calls {
                    launch(ours)?;
                }
                Ok(())
            };
            let o = c.of(&format!("{name} non-blocking|ours|{calls}"), || run(true))?;
            let r = c.of(&format!("{name} non-blocking|raw|{calls}"), || run(false))?;
            diff(&o, &r, calls)
        }
        None => String::new(),
    };
    print_row(name, "non-blocking", t, &extra);
    Ok(())
}

/// The graph rows: each graph's launches, ours and raw (ns per launch, each launch timed
/// alone and followed by a synchronize), and the calls ours made besides.
fn graph_rows(
    samples: usize,
    calls: u32,
    counters: Option<&Counters>,
    nb: &Stream,
    graphs: Graphs<'_>,
) -> Result<()> {
    nb.synchronize()?;
    for (name, n) in [("graph_launch 1", 1), ("graph_launch 3", 3)] {
        let launch = |ours: bool| {
            if n == 1 {
                let g = &graphs.one;
                launch_once(ours, || g.launch(nb), g.as_raw(), nb)
            } else {
                let g = &graphs.three;
                launch_once(ours, || g.launch(nb), g.as_raw(), nb)
            }
        };
        graph_row(samples, calls, counters, name, launch)?;
    }
    // The same graphs through a launcher each (`GraphExec::launcher`: the marks made once).
    let Graphs { mut one, mut three } = graphs;
    let (raw1, raw3) = (one.as_raw(), three.as_raw());
    {
        let mut l1 = one.launcher(nb)?;
        let mut l3 = three.launcher(nb)?;
        for (name, n) in [("graph_launcher 1", 1), ("graph_launcher 3", 3)] {
            let mut launch = |ours: bool| {
                if n == 1 {
                    launch_once(ours, || l1.launch(), raw1, nb)
                } else {
                    launch_once(ours, || l3.launch(), raw3, nb)
                }
            };
            graph_row(samples, calls, counters, name, &mut launch)?;
        }
    }
    one.into_resources()?;
    three.into_resources()?;
    Ok(())
}

/// Nanoseconds per call of `calls` calls of `f`.
fn time_ns(calls: u32, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..calls {
        f()?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e9 / f64::from(calls))
}

/// The median, or with `$HOT_PATH_MIN` set the minimum (steadier on a loaded machine: other
/// processes only ever add time).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if std::env::var_os("HOT_PATH_MIN").is_some() {
        return v[0];
    }
    v[v.len() / 2]
}

/// `samples` interleaved samples of ours and raw (`sample(true)`, `sample(false)`, the first
/// of each pair alternating), after one warm-up of each: the medians.
fn paired(samples: usize, mut sample: impl FnMut(bool) -> Result<f64>) -> Result<(f64, f64)> {
    sample(true)?;
    sample(false)?;
    let (mut ours, mut raw) = (Vec::new(), Vec::new());
    for i in 0..samples {
        for o in [i % 2 == 0, i % 2 != 0] {
            let t = sample(o)?;
            if o {
                ours.push(t);
            } else {
                raw.push(t);
            }
        }
    }
    Ok((median(ours), median(raw)))
}

/// Whether the row `name` ("op config") is to run: all of them, or those that contain
/// `$HOT_PATH_ONLY` (for `perf` on one row).
fn only(name: &str) -> bool {
    std::env::var("HOT_PATH_ONLY").map_or(true, |f| name.contains(&f))
}

fn print_row(op: &str, config: &str, (ours, raw): (f64, f64), extra: &str) {
    println!(
        "{op:<18} {config:<18} {ours:>8.1} {raw:>8.1} {:>+8.1}  {extra}",
        ours - raw
    );
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u32>());
    let samples = args.next().transpose()?.unwrap_or(21).max(1) as usize;
    let calls = args.next().transpose()?.unwrap_or(256).max(1);
    println!(
        "cudart: {} (medians of {samples} samples x {calls} calls, ns per call)",
        sys::runtime_library().unwrap_or("linked")
    );
    println!(
        "{:<18} {:<18} {:>8} {:>8} {:>8}  extra calls per call",
        "row", "config", "ours", "raw", "over"
    );
    let mut small = Small {
        host: PinnedBuffer::zeroed(SMALL, HostAllocFlags::DEFAULT)?,
        dev: DeviceBuffer::zeroed(SMALL)?,
        other_host: PinnedBuffer::zeroed(SMALL, HostAllocFlags::DEFAULT)?,
        other_dev: DeviceBuffer::zeroed(SMALL)?,
        fences: cuda_mem::measure::FencePair::new(),
    };
    let (legacy, nb, other) = (
        Stream::legacy_default(),
        Stream::non_blocking()?,
        Stream::non_blocking()?,
    );
    let counters = Counters::of_runtime();
    if let Some(kib) = std::env::var("FAKE_EVICT_KIB")
        .ok()
        .filter(|_| counters.is_some())
    {
        println!("(the fake evicts {kib} KiB per queueing or waiting call)");
    }
    let configs: [(&str, &Stream, bool); 4] = [
        ("legacy/one", &legacy, false),
        ("legacy/two", &legacy, true),
        ("non-blocking/one", &nb, false),
        ("non-blocking/two", &nb, true),
    ];
    for (config, s, two) in configs {
        // Each configuration starts from idle fences: a buffer that an earlier configuration's
        // stream used would otherwise be a buffer used by two streams.
        for b in [&small.host, &small.other_host] {
            b.synchronize()?;
        }
        for b in [&small.dev, &small.other_dev] {
            b.synchronize()?;
        }
        small.fences = cuda_mem::measure::FencePair::new();
        for op in OPS {
            if !only(&format!("{op} {config}")) {
                continue;
            }
            let t = paired(samples, |ours| {
                if two {
                    small.use_on(&other)?;
                }
                let t = time_ns(calls, || small.call(op, ours, s))?;
                s.synchronize()?;
                Ok(t)
            })?;
            let extra = match &counters {
                Some(c) => {
                    let mut counted = |ours: bool| {
                        if two {
                            small.use_on(&other)?;
                        }
                        let side = if ours { "ours" } else { "raw" };
                        let n = c.of(&format!("{op} {config}|{side}|{calls}"), || {
                            for _ in 0..calls {
                                small.call(op, ours, s)?;
                            }
                            Ok(())
                        })?;
                        s.synchronize()?;
                        Ok::<_, cuda_mem::Error>(n)
                    };
                    let o = counted(true)?;
                    let r = counted(false)?;
                    diff(&o, &r, calls)
                }
                None => String::new(),
            };
            print_row(op, config, t, &extra);
        }
    }

    // Graph launches, each followed by a synchronize, on the non-blocking stream.
    if only("graph_launch non-blocking") {
        let mut gh = PinnedBuffer::<u8>::zeroed(SMALL, HostAllocFlags::DEFAULT)?;
        let (mut g1, mut g2, mut g3) = (
            DeviceBuffer::<u8>::zeroed(SMALL)?,
            DeviceBuffer::<u8>::zeroed(SMALL)?,
            DeviceBuffer::<u8>::zeroed(SMALL)?,
        );
        gh.as_mut_slice()?.fill(1);
        graph_rows(
            samples,
            calls,
            counters.as_ref(),
            &nb,
            Graphs {
                one: nb
                    .capture(CaptureMode::ThreadLocal, &mut g1, |cap, d| {
                        memset_async(*d, 7, cap.stream())
                    })?
                    .instantiate()?,
                three: nb
                    .capture(
                        CaptureMode::ThreadLocal,
                        (&gh, &mut g2, &mut g3),
                        |cap, (h, d, e)| {
                            copy_async(*d, *h, cap.stream())?;
                            memset_async(*e, 0, cap.stream())?;
                            copy_async(*e, &**d, cap.stream())
                        },
                    )?
                    .instantiate()?,
            },
        )?;
        // What the launches wrote: the memset's 7s, and the copied 1s.
        if !sys::runtime_library().is_some_and(|p| p.contains("fake")) {
            anyhow::ensure!(g1.to_vec()?.iter().all(|&b| b == 7), "graph 1 wrote no 7s");
            anyhow::ensure!(g3.to_vec()?.iter().all(|&b| b == 1), "graph 3 copied no 1s");
        }
    }

    // A pooled buffer's allocation and free against the raw pair, on the non-blocking stream.
    if !only("pool_alloc_free non-blocking") {
        return Ok(());
    }
    let pool = MemPool::new(nb.device())?;
    // One pair, ours or the raw calls.
    let pair = |ours: bool| -> Result<()> {
        if ours {
            return DeviceBuffer::<u64>::from_pool(&pool, SMALL / 8, &nb)?.free();
        }
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; live pool and stream handles.
        let code =
            unsafe { sys::cudaMallocFromPoolAsync(&mut p, SMALL, pool.as_raw(), nb.as_raw()) };
        check(code, || "cudaMallocFromPoolAsync".into())?;
        // SAFETY: `p` was just allocated on `nb` and is used by nothing; freed once.
        let code = unsafe { sys::cudaFreeAsync(p, nb.as_raw()) };
        check(code, || "cudaFreeAsync".into())
    };
    let t = paired(samples, |ours| {
        let t = time_ns(calls, || pair(ours))?;
        nb.synchronize()?;
        Ok(t)
    })?;
    let extra = match &counters {
        Some(c) => {
            let run = |ours: bool| -> Result<()> {
                for _ in 0..calls {
                    pair(ours)?;
                }
                Ok(())
            };
            let o = c.of(
                &format!("pool_alloc_free non-blocking|ours|{calls}"),
                || run(true),
            )?;
            let r = c.of(&format!("pool_alloc_free non-blocking|raw|{calls}"), || {
                run(false)
            })?;
            nb.synchronize()?;
            diff(&o, &r, calls)
        }
        None => String::new(),
    };
    print_row("pool_alloc_free", "non-blocking", t, &extra);

    // The same pair's bookkeeping alone, with stand-in handles.
    let pairs = calls * 64;
    let mut ns = Vec::with_capacity(samples);
    cuda_mem::measure::detached_pool_pairs(pairs, SMALL)?;
    for _ in 0..samples {
        let t = cuda_mem::measure::detached_pool_pairs(pairs, SMALL)?;
        ns.push(t.as_secs_f64() * 1e9 / f64::from(pairs));
    }
    println!(
        "{:<18} {:<18} {:>8.1}",
        "pool_bookkeeping",
        "stand-in",
        median(ns)
    );

    // What the calls wrote landed (on a GPU; the fake runtime's asynchronous calls do not
    // copy): a pattern to the device and back through the same entry points.
    if sys::runtime_library().is_some_and(|p| p.contains("fake")) {
        return Ok(());
    }
    let pattern = |i: usize| (i as u8).wrapping_mul(7) ^ 0xa5;
    for (i, b) in small.host.as_mut_slice()?.iter_mut().enumerate() {
        *b = pattern(i);
    }
    copy_async(&mut small.dev, &small.host, &nb)?;
    copy_async(&mut small.other_host, &small.dev, &legacy)?;
    let back = small.other_host.as_slice()?;
    if let Some((i, &b)) = back.iter().enumerate().find(|&(i, &b)| b != pattern(i)) {
        anyhow::bail!("byte {i}: got {b:#04x}, expected {:#04x}", pattern(i));
    }
    Ok(())
}
