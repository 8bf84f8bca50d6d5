//! Allocation + free latency of each kind at a few sizes: host wall clock, the median of
//! several cycles, ours and raw interleaved.

use std::time::Instant;

use cuda_mem::{
    Attach, DeviceBuffer, HostAllocFlags, HostRegisterFlags, ManagedBuffer, MappedBuffer, Misuse,
    PinnedBuffer, RegisteredSlice, Result,
};

use super::{attempt, progress, raw, sample_pairs, Config, Ctx, Order, Paired};
use crate::results::{AllocRow, BenchResults, ALLOC_KINDS};
use crate::units::fmt_size;

/// What our constructor does beyond the raw calls.
fn note(kind: &str) -> Option<&'static str> {
    match kind {
        "mapped" => Some("cuda-mem checks the device attributes first"),
        "managed" => Some("cuda-mem checks the attributes and free memory first"),
        _ => None,
    }
}

/// One alloc + free through our API.
fn ours(kind: &str, bytes: usize, host: &mut [u8]) -> Result<()> {
    let len = bytes / 8;
    match kind {
        "device" => DeviceBuffer::<u64>::uninit(len)?.free(),
        "pinned" | "write_combined" => {
            let flags = if kind == "pinned" {
                HostAllocFlags::DEFAULT
            } else {
                HostAllocFlags::WRITE_COMBINED
            };
            // SAFETY: the uninitialised memory is never read; it is freed at once.
            let buf = unsafe { PinnedBuffer::<u64>::uninit(len, flags)? };
            buf.free()
        }
        "mapped" => {
            // SAFETY: the uninitialised memory is never read; it is freed at once.
            let buf = unsafe { MappedBuffer::<u64>::uninit(len, HostAllocFlags::DEFAULT)? };
            buf.free()
        }
        "managed" => {
            // SAFETY: as above.
            let buf = unsafe { ManagedBuffer::<u64>::uninit(len, Attach::Global)? };
            buf.free()
        }
        _ => RegisteredSlice::register(host, HostRegisterFlags::DEFAULT, |_| Ok(())),
    }
}

/// One alloc + free through raw calls.
fn raw_path(kind: &str, bytes: usize, host: &mut [u8]) -> Result<()> {
    match kind {
        "registered" => raw::register_unregister(host),
        _ => raw::alloc_free(kind, bytes),
    }
}

fn measure(kind: &str, bytes: usize, reps: u32) -> Result<Paired> {
    // Registration pins memory that is already touched: `vec![1; n]` writes every page.
    let mut host = if kind == "registered" {
        vec![1u8; bytes]
    } else {
        Vec::new()
    };
    let mut time = |f: fn(&str, usize, &mut [u8]) -> Result<()>| -> Result<f64> {
        let t = Instant::now();
        f(kind, bytes, &mut host)?;
        Ok(t.elapsed().as_secs_f64() * 1e6)
    };
    let (a, b) = sample_pairs(reps, Order::OursFirst, |o| {
        time(if o { ours } else { raw_path })
    })?;
    Ok(Paired::new(&a, &b))
}

/// Records `r`, the alloc + free figure of `kind` at `bytes` over `reps` pairs: a row, or the
/// kind's error entry.
pub(super) fn record(
    res: &mut BenchResults,
    kind: &'static str,
    bytes: u64,
    reps: u32,
    note: Option<&'static str>,
    r: Result<Paired>,
) -> Result<()> {
    if let Some(t) = attempt(res, &[kind], "alloc", r)? {
        res.allocs.push(AllocRow {
            kind,
            bytes,
            reps,
            us: t.ours,
            raw_us: t.raw,
            ratio: t.ratio,
            spread: t.ours_q,
            note,
        });
    }
    Ok(())
}

/// Runs the allocation measurements.
pub fn run(ctx: &Ctx, cfg: &Config, res: &mut BenchResults) -> Result<()> {
    let (free, _) = ctx.device.mem_info()?;
    for &(bytes, reps) in &cfg.alloc_plan {
        progress(&format!("alloc + free: {} x {reps}", fmt_size(bytes)));
        // The pool rows are measured by `bench::pools`.
        for kind in ALLOC_KINDS
            .into_iter()
            .filter(|k| !super::pools::KINDS.contains(k))
        {
            let r = if kind == "managed" && bytes > free as u64 / 4 {
                // Never more managed memory than a quarter of the free device memory.
                Err(Misuse::ManagedExceedsFree {
                    bytes: bytes as usize,
                    free,
                }
                .into())
            } else {
                measure(kind, bytes as usize, reps)
            };
            record(res, kind, bytes, reps, note(kind), r)?;
        }
    }
    Ok(())
}
