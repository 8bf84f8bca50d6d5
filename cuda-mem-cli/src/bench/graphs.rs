//! CUDA graphs against eager launches, the two sequences of `shared/refbench/graphs.cu`: 100
//! tiny kernels, and 25 × (4 KiB copy from pinned memory, 4 KiB memset, 4 KiB device copy,
//! tiny kernel), on a non-blocking stream, issued eagerly through cuda-mem or captured once
//! with `Stream::capture` and replayed with `GraphExec::launch`. Host time (the enqueue) and
//! end-to-end time (enqueue and completion), medians of 200 rounds after 20 warm-up rounds,
//! and graph ÷ eager, to set beside graphs.cu's output from the same run. The tiny kernel is
//! the probes' `cm_write` over 4 KiB (graphs.cu's `bump` is not in the probes); its grid
//! fills the device, so end-to-end times run above graphs.cu's.

use std::time::Instant;

use cuda_mem::{
    copy_async, CaptureMode, DeviceBuffer, DevicePtrMut as _, HostAllocFlags, PinnedBuffer, Result,
    Stream,
};
use cuda_mem_probes::Probes;

use super::progress;
use crate::results::{BenchResults, Check};
use crate::units::median;

/// `u32` elements per buffer: 4 KiB.
const N: usize = 1024;
const ROUNDS: usize = 200;
const WARMUP: usize = 20;

/// The buffers of one sequence.
type Bufs<'a> = (
    &'a mut PinnedBuffer<u32>,
    &'a mut DeviceBuffer<u32>,
    &'a mut DeviceBuffer<u32>,
);

/// The tiny kernel on `e`, through a write guard.
fn kernel(probes: &Probes, e: &mut DeviceBuffer<u32>, s: &Stream) -> Result<()> {
    let w = e.device_ptr_mut(s)?;
    // SAFETY: the guard's 4 KiB of device memory, taken for `s`, alive across the launch,
    // which the guard records when it drops.
    unsafe { probes.write(w.as_mut_ptr().cast(), N * 4, s) }
}

/// One round of the sequence on `s`.
fn ops(probes: &Probes, kernels_only: bool, b: &mut Bufs<'_>, s: &Stream) -> Result<()> {
    let (h, d, e) = b;
    if kernels_only {
        for _ in 0..100 {
            kernel(probes, e, s)?;
        }
        return Ok(());
    }
    for _ in 0..25 {
        copy_async(&mut **d, &**h, s)?;
        e.memset_async(0, s)?;
        copy_async(&mut **e, &**d, s)?;
        kernel(probes, e, s)?;
    }
    Ok(())
}

/// Medians (µs) of host and end-to-end time of `round` on `s`.
fn time(s: &Stream, mut round: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    let (mut host, mut end) = (Vec::new(), Vec::new());
    for r in 0..ROUNDS + WARMUP {
        let t0 = Instant::now();
        round()?;
        let t1 = Instant::now();
        s.synchronize()?;
        let t2 = Instant::now();
        if r >= WARMUP {
            host.push((t1 - t0).as_secs_f64() * 1e6);
            end.push((t2 - t0).as_secs_f64() * 1e6);
        }
    }
    Ok((median(&host), median(&end)))
}

/// Both sequences, eager and replayed; a data check per sequence.
pub fn run(res: &mut BenchResults) -> Result<()> {
    let probes = Probes::load()?;
    let s = Stream::non_blocking()?;
    let init: Vec<u32> = (0..N as u32).collect();
    for kernels_only in [true, false] {
        let name = if kernels_only {
            "100 tiny kernels"
        } else {
            "25 x: 4 KiB H2D, memset, D2D, kernel"
        };
        progress(&format!("graphs: {name}"));
        let mut h = PinnedBuffer::from_slice(&init, HostAllocFlags::DEFAULT)?;
        let mut d = DeviceBuffer::<u32>::zeroed(N)?;
        let mut e = DeviceBuffer::<u32>::zeroed(N)?;
        let mut b: Bufs<'_> = (&mut h, &mut d, &mut e);
        let (eh, ee) = time(&s, || ops(&probes, kernels_only, &mut b, &s))?;
        let exec = s
            .capture(CaptureMode::ThreadLocal, b, |cap, b| {
                ops(&probes, kernels_only, b, cap.stream())
            })?
            .instantiate()?;
        exec.upload(&s)?;
        let (gh, ge) = time(&s, || exec.launch(&s))?;
        let got = exec.resources().2.to_vec()?;
        // `cm_write` leaves 16-byte word i holding four copies of i: element j holds j / 4.
        let bad = got.iter().enumerate().find(|&(j, &v)| v != (j / 4) as u32);
        res.checks.push(Check {
            what: format!("graphs: {name}"),
            bytes: (N * 4) as u64,
            ok: bad.is_none(),
            detail: bad.map(|(j, &v)| format!("element {j}: got {v}, expected {}", j / 4)),
        });
        progress(&format!(
            "  graphs {name}: eager host {eh:.1} / end {ee:.1} us; graph host {gh:.1} / end \
             {ge:.1} us; graph/eager host {:.3}, end-to-end {:.3}",
            gh / eh,
            ge / ee
        ));
    }
    Ok(())
}
