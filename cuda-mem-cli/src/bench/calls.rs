//! The per-call cost of asynchronous copies, where the fence's bookkeeping could show: small
//! copies issued one call per copy in a loop (as NVIDIA's bandwidthTest does), the host time
//! of one call while the stream is held, and four streams copying disjoint quarters of one
//! buffer against one stream doing all four. Ours (`copy_range_async`) against raw
//! `cudaMemcpyAsync` with the same pointers, interleaved, timed with the wall clock from the
//! first call until the streams are synchronized.
//!
//! Then the host overhead of each asynchronous entry point over its raw call (rows
//! `overhead_*`, issue 21's target: at most +0.05 µs): `copy_async` host to device and device
//! to host (4 KiB, pinned), `memset_async` (4 KiB), and taking a guard (`device_ptr`,
//! `device_ptr_mut`, each followed by the raw call it guards, against that raw call alone).
//! Host time per call while the stream is held by the spin kernel, ours and raw interleaved;
//! on the legacy default stream and on a non-blocking stream (`legacy/...`,
//! `non-blocking/...`), for buffers used by that stream alone (`.../one`) and by two (`.../two`:
//! before each sample, another non-blocking stream reads every buffer involved and is
//! synchronized, so that the buffers' fences hold a second stream's marks).

use std::os::raw::c_void;
use std::time::Instant;

use cuda_mem::sys::cudaMemcpyKind as K;
use cuda_mem::{
    copy_async, copy_range_async, memset_async, sys, DeviceBuffer, DevicePtr as _,
    DevicePtrMut as _, HostAllocFlags, PinnedBuffer, Result, Stream,
};

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

    if let Some(gate) = &ctx.gate {
        overhead(gate, samples, res)?;
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

/// Bytes of each call of the overhead rows.
const SMALL: usize = 4096;

/// The entry points whose overhead over the raw call is measured, in row order.
const OVERHEAD_OPS: [&str; 5] = [
    "overhead_copy_h2d",
    "overhead_copy_d2h",
    "overhead_memset",
    "overhead_device_ptr",
    "overhead_device_ptr_mut",
];

/// The buffers of the overhead rows: 4 KiB each, pinned and device.
struct Small {
    host: PinnedBuffer<u8>,
    dev: DeviceBuffer<u8>,
    /// What the second stream writes when it reads `host` and `dev` (the `.../two` rows).
    other_host: PinnedBuffer<u8>,
    other_dev: DeviceBuffer<u8>,
}

impl Small {
    /// One call of `op` on `s`: ours (`ours`) or the raw call alone.
    fn call(&mut self, op: &str, ours: bool, s: &Stream) -> Result<()> {
        let h: *mut c_void = self.host.as_mut_ptr().cast();
        let d: *mut c_void = self.dev.as_mut_ptr().cast();
        // Every raw call below: the pointers are the 4 KiB buffers of `self`, which outlive
        // the calls; `held_calls` synchronizes the stream before they are used otherwise or
        // freed, and the host never touches them meanwhile.
        match (op, ours) {
            ("overhead_copy_h2d", true) => copy_async(&mut self.dev, &self.host, s),
            // SAFETY: as above.
            ("overhead_copy_h2d", false) => unsafe {
                raw::memcpy(d, h, SMALL, K::cudaMemcpyHostToDevice, Some(s))
            },
            ("overhead_copy_d2h", true) => copy_async(&mut self.host, &self.dev, s),
            // SAFETY: as above.
            ("overhead_copy_d2h", false) => unsafe {
                raw::memcpy(h, d, SMALL, K::cudaMemcpyDeviceToHost, Some(s))
            },
            ("overhead_memset", true) => memset_async(&mut self.dev, 0, s),
            // SAFETY: as above.
            ("overhead_memset", false) => unsafe { raw_memset(d, s) },
            // The guard, then the raw call it guards: a read of `dev` (into `host`, which the
            // raw call alone writes in both arms).
            ("overhead_device_ptr", true) => {
                let g = self.dev.device_ptr(s)?;
                // SAFETY: as above; the guard ordered `s` and records the copy when it drops.
                unsafe {
                    raw::memcpy(
                        h,
                        g.as_ptr().cast(),
                        SMALL,
                        K::cudaMemcpyDeviceToHost,
                        Some(s),
                    )
                }
            }
            // SAFETY: as above.
            ("overhead_device_ptr", false) => unsafe {
                raw::memcpy(h, d, SMALL, K::cudaMemcpyDeviceToHost, Some(s))
            },
            // The write guard, then the memset it guards.
            ("overhead_device_ptr_mut", true) => {
                let g = self.dev.device_ptr_mut(s)?;
                // SAFETY: as above; the guard ordered `s` and records the memset.
                unsafe { raw_memset(g.as_mut_ptr().cast(), s) }
            }
            // SAFETY: as above (`overhead_device_ptr_mut`'s raw call).
            _ => unsafe { raw_memset(d, s) },
        }
    }

    /// The second stream's use of the buffers (the `.../two` rows): it reads both, then is
    /// synchronized.
    fn use_on(&mut self, other: &Stream) -> Result<()> {
        copy_async(&mut self.other_host, &self.dev, other)?;
        copy_async(&mut self.other_dev, &self.host, other)?;
        other.synchronize()
    }
}

/// Raw `cudaMemsetAsync` of [`SMALL`] bytes at `d` to zero on `s`.
///
/// # Safety
/// `d` is device memory of at least [`SMALL`] bytes, untouched by the host until `s` has
/// passed the memset.
unsafe fn raw_memset(d: *mut c_void, s: &Stream) -> Result<()> {
    // SAFETY: the caller guarantees the pointer and its lifetime.
    let code = unsafe { sys::cudaMemsetAsync(d, 0, SMALL, s.as_raw()) };
    raw::check(code, || format!("cudaMemsetAsync({SMALL} bytes)"))
}

/// The overhead rows: every entry point of [`OVERHEAD_OPS`] beside its raw call, on the
/// legacy default stream and on a non-blocking one, for buffers used by one stream and by two.
fn overhead(gate: &Gate, samples: u32, res: &mut BenchResults) -> Result<()> {
    let mut small = Small {
        host: PinnedBuffer::zeroed(SMALL, HostAllocFlags::DEFAULT)?,
        dev: DeviceBuffer::zeroed(SMALL)?,
        other_host: PinnedBuffer::zeroed(SMALL, HostAllocFlags::DEFAULT)?,
        other_dev: DeviceBuffer::zeroed(SMALL)?,
    };
    let (legacy, nb, other) = (
        Stream::legacy_default(),
        Stream::non_blocking()?,
        Stream::non_blocking()?,
    );
    let configs: [(&'static str, &Stream, bool); 4] = [
        ("legacy/one", &legacy, false),
        ("legacy/two", &legacy, true),
        ("non-blocking/one", &nb, false),
        ("non-blocking/two", &nb, true),
    ];
    for (config, s, two) in configs {
        progress(&format!("calls: host overhead over the raw call, {config}"));
        // Each configuration starts from idle fences (a host wait retires what they hold): a
        // buffer that an earlier configuration's stream, or `zeroed`'s legacy memset, used
        // would otherwise be a buffer used by two streams in a `.../one` row.
        small.host.synchronize()?;
        small.other_host.synchronize()?;
        small.dev.synchronize()?;
        small.other_dev.synchronize()?;
        for op in OVERHEAD_OPS {
            let t = paired(samples, |ours| {
                if two {
                    small.use_on(&other)?;
                }
                held_calls(gate, s, || small.call(op, ours, s))
            })?;
            let r = row(op, config, SMALL as u64, HELD_CALLS, t);
            progress(&format!(
                "  {op} {config}: {:.3} µs, raw {:.3} µs: {:+.3} µs over raw",
                r.us,
                r.raw_us,
                r.us - r.raw_us
            ));
            res.calls.push(r);
        }
    }
    // What the timed calls wrote landed where they were meant to: a pattern to the device and
    // back through the same entry points.
    let pattern = |i: usize| (i as u8).wrapping_mul(7) ^ 0xa5;
    for (i, b) in small.host.as_mut_slice()?.iter_mut().enumerate() {
        *b = pattern(i);
    }
    copy_async(&mut small.dev, &small.host, &nb)?;
    memset_async(&mut small.other_dev, 0, &nb)?;
    copy_async(&mut small.other_host, &small.dev, &legacy)?;
    let back = small.other_host.as_slice()?;
    let bad = back.iter().enumerate().find(|&(i, &b)| b != pattern(i));
    res.checks.push(Check {
        what: "4 KiB copies of the overhead rows, across two streams".into(),
        bytes: SMALL as u64,
        ok: bad.is_none(),
        detail: bad.map(|(i, &b)| format!("byte {i}: got {b:#04x}, expected {:#04x}", pattern(i))),
    });
    Ok(())
}
