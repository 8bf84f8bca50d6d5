//! The per-call cost of asynchronous copies, where the fence's bookkeeping could show: small
//! copies issued one call per copy in a loop (as NVIDIA's bandwidthTest does), the host time
//! of one call while the stream is held, and four streams copying disjoint quarters of one
//! buffer against one stream doing all four. Ours (`copy_range_async`) against raw
//! `cudaMemcpyAsync` with the same pointers, interleaved, timed with the wall clock from the
//! first call until the streams are synchronized.

use std::os::raw::c_void;
use std::time::Instant;

use cuda_mem::sys::cudaMemcpyKind as K;
use cuda_mem::{copy_range_async, DeviceBuffer, HostAllocFlags, PinnedBuffer, Result, Stream};

use super::{progress, raw, sample_pairs, Config, Ctx, Gate, Order, Paired};
use crate::results::{BenchResults, CallRow, Check};

/// Copy sizes of the loop: 1 to 20 KB.
pub const LOOP_SIZES: [u64; 5] = [1_000, 4_096, 8_192, 16_384, 20_000];
/// Calls per loop sample: long enough (a few ms) that the clock and the final synchronize
/// do not matter.
const LOOP_CALLS: u32 = 2_000;
/// Calls per held-stream sample: well inside a stream's queue.
const HELD_CALLS: u32 = 256;
/// Bytes of each of the four quarters.
const QUARTER: usize = 16 << 20;

/// One direction's pointers and our copy of `bytes` bytes at `offset` on `s`.
struct Pair<'a> {
    host: &'a mut PinnedBuffer<u8>,
    dev: &'a mut DeviceBuffer<u8>,
    h2d: bool,
}

impl Pair<'_> {
    fn ours(&mut self, offset: usize, bytes: usize, s: &Stream) -> Result<()> {
        if self.h2d {
            copy_range_async(self.dev, offset, &*self.host, offset, bytes, s)
        } else {
            copy_range_async(self.host, offset, &*self.dev, offset, bytes, s)
        }
    }

    /// The raw call with the same pointers.
    ///
    /// # Safety
    /// `offset + bytes` lies inside both buffers, and the caller synchronizes the stream
    /// before the buffers are used otherwise or freed.
    unsafe fn raw(&mut self, offset: usize, bytes: usize, s: &Stream) -> Result<()> {
        let h: *mut c_void = self.host.as_mut_ptr().wrapping_add(offset).cast();
        let d: *mut c_void = self.dev.as_mut_ptr().wrapping_add(offset).cast();
        let (dst, src, kind) = if self.h2d {
            (d, h.cast_const(), K::cudaMemcpyHostToDevice)
        } else {
            (h, d.cast_const(), K::cudaMemcpyDeviceToHost)
        };
        // SAFETY: the caller guarantees the range and the synchronization.
        unsafe { raw::memcpy(dst, src, bytes, kind, Some(s)) }
    }
}

/// `samples` (at least 2) pairs of `sample(true)` (ours) and `sample(false)` (raw), after one
/// warm-up of each, in alternating order.
fn paired(samples: u32, sample: impl FnMut(bool) -> Result<f64>) -> Result<Paired> {
    let (a, b) = sample_pairs(samples.max(2), Order::Alternate, sample)?;
    Ok(Paired::new(&a, &b))
}

/// Host seconds per call of `call`, made `HELD_CALLS` times while the gate's spin kernel holds
/// `s` (so the device does nothing and only the host side is timed); then releases the stream
/// and synchronizes it.
fn held_calls(gate: &Gate, s: &Stream, mut call: impl FnMut() -> Result<()>) -> Result<f64> {
    let held = gate.hold(s)?;
    let t0 = Instant::now();
    for _ in 0..HELD_CALLS {
        call()?;
    }
    let host = t0.elapsed().as_secs_f64() / f64::from(HELD_CALLS);
    drop(held);
    s.synchronize()?;
    Ok(host)
}

fn row(test: &'static str, dir: &'static str, bytes: u64, calls: u32, t: Paired) -> CallRow {
    CallRow {
        test,
        direction: dir,
        bytes,
        calls,
        us: t.ours * 1e6,
        raw_us: t.raw * 1e6,
        // Speed relative to raw: the inverse of the time ratio.
        ratio: 1.0 / t.ratio,
        spread: (t.ours_q.0 * 1e6, t.ours_q.1 * 1e6),
    }
}

/// Runs the three measurements in both directions.
pub fn run(ctx: &Ctx, cfg: &Config, res: &mut BenchResults) -> Result<()> {
    // Small per-call differences need more pairs than bandwidth does.
    let samples = (cfg.samples * 2).max(10);
    let mut host = PinnedBuffer::<u8>::zeroed(4 * QUARTER, HostAllocFlags::DEFAULT)?;
    let mut dev = DeviceBuffer::<u8>::zeroed(4 * QUARTER)?;
    let streams: Vec<Stream> = (0..4)
        .map(|_| Stream::non_blocking())
        .collect::<Result<_>>()?;
    let s = &streams[0];
    for (dir, h2d) in [("h2d", true), ("d2h", false)] {
        let mut p = Pair {
            host: &mut host,
            dev: &mut dev,
            h2d,
        };
        progress(&format!("calls: {dir}: one copy_async per copy, 1-20 KB"));
        for bytes in LOOP_SIZES {
            let n = bytes as usize;
            let t = paired(samples, |ours| {
                let t0 = Instant::now();
                for _ in 0..LOOP_CALLS {
                    if ours {
                        p.ours(0, n, s)?;
                    } else {
                        // SAFETY: `n` bytes lie in both buffers; synchronized below.
                        unsafe { p.raw(0, n, s)? };
                    }
                }
                s.synchronize()?;
                Ok(t0.elapsed().as_secs_f64() / f64::from(LOOP_CALLS))
            })?;
            res.calls.push(row("loop", dir, bytes, LOOP_CALLS, t));
        }

        if let Some(gate) = &ctx.gate {
            progress(&format!("calls: {dir}: host time of one call, stream held"));
            let t = paired(samples, |ours| {
                held_calls(gate, s, || {
                    if ours {
                        p.ours(0, 4096, s)
                    } else {
                        // SAFETY: 4 KiB lie in both buffers; `held_calls` synchronizes.
                        unsafe { p.raw(0, 4096, s) }
                    }
                })
            })?;
            res.calls.push(row("enqueue", dir, 4096, HELD_CALLS, t));

            // Ablation: the raw call with our fence bookkeeping around it (two fences that no
            // buffer owns), against the raw call alone. Its overhead is the fence's share of
            // the `enqueue` overhead above; the rest is the rest of our call path.
            let fences = cuda_mem::measure::FencePair::new();
            let t = paired(samples, |with_fences| {
                held_calls(gate, s, || {
                    if with_fences {
                        // SAFETY: 4 KiB lie in both buffers; `held_calls` synchronizes.
                        fences.around(s, 4096, || unsafe { p.raw(0, 4096, s) })?
                    } else {
                        // SAFETY: as above.
                        unsafe { p.raw(0, 4096, s) }
                    }
                })
            })?;
            res.calls
                .push(row("enqueue_fence_only", dir, 4096, HELD_CALLS, t));
        }

        progress(&format!("calls: {dir}: four streams on disjoint quarters"));
        for (test, spread) in [("quarters_4_streams", true), ("quarters_1_stream", false)] {
            let t = paired(samples, |ours| {
                let t0 = Instant::now();
                for (i, st) in streams.iter().enumerate() {
                    let st = if spread { st } else { s };
                    if ours {
                        p.ours(i * QUARTER, QUARTER, st)?;
                    } else {
                        // SAFETY: quarter `i` lies in both buffers; synchronized below.
                        unsafe { p.raw(i * QUARTER, QUARTER, st)? };
                    }
                }
                for st in &streams {
                    st.synchronize()?;
                }
                Ok(t0.elapsed().as_secs_f64())
            })?;
            res.calls.push(row(test, dir, (4 * QUARTER) as u64, 4, t));
        }
    }

    // The quarters landed: h2d of a pattern through four streams, read back.
    let pattern = |i: usize| (i as u8).wrapping_mul(31) ^ 0x5a;
    for (i, b) in host.as_mut_slice()?.iter_mut().enumerate() {
        *b = pattern(i);
    }
    for (i, st) in streams.iter().enumerate() {
        copy_range_async(&mut dev, i * QUARTER, &host, i * QUARTER, QUARTER, st)?;
    }
    let back = dev.to_vec()?;
    let bad = back.iter().enumerate().find(|&(i, &b)| b != pattern(i));
    res.checks.push(Check {
        what: "copies of four quarters on four streams".into(),
        bytes: back.len() as u64,
        ok: bad.is_none(),
        detail: bad.map(|(i, &b)| format!("byte {i}: got {b:#04x}, expected {:#04x}", pattern(i))),
    });
    Ok(())
}
