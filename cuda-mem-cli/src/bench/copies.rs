//! Copy bandwidth: host to device and back from each kind of host memory, and device to
//! device, over every size; ours (`copy_range`, `copy_range_async`) against raw
//! `cudaMemcpy`/`cudaMemcpyAsync` with the same pointers and sizes.

use std::os::raw::c_void;

use cuda_mem::sys::cudaMemcpyKind as K;
use cuda_mem::{
    alloc_mapped, copy_range, copy_range_async, DeviceBuffer, HostAllocFlags, HostRegisterFlags,
    MappedBuffer, PinnedBuffer, RegisteredVec, Result, Stream,
};

use super::{attempt, progress, raw, reps_for, Config, Ctx, Paired};
use crate::results::{BenchResults, Check, CopyRow};
use crate::units::{fmt_size, gbps};

/// One kind of host memory, holding `u64` words.
enum HostMem {
    /// `Vec`: every copy is staged by the driver; synchronous copies only.
    Pageable(Vec<u64>),
    /// `cudaHostAlloc`, default or write-combined.
    Pinned(PinnedBuffer<u64>),
    /// `cudaHostAlloc(Mapped)`, copied through its host address.
    Mapped(MappedBuffer<u64>),
    /// A `Vec` pinned in place with `cudaHostRegister`.
    Registered(RegisteredVec<u64>),
}

impl HostMem {
    fn new(kind: &str, words: usize) -> Result<HostMem> {
        Ok(match kind {
            // `vec![1; n]` writes every page: untouched `vec![0; n]` pages would all map the
            // kernel's shared zero page until first written, and read faster than real data.
            "pageable" => HostMem::Pageable(vec![1; words]),
            "pinned" => HostMem::Pinned(PinnedBuffer::zeroed(words, HostAllocFlags::DEFAULT)?),
            "write_combined" => {
                HostMem::Pinned(PinnedBuffer::zeroed(words, HostAllocFlags::WRITE_COMBINED)?)
            }
            "mapped" => HostMem::Mapped(alloc_mapped(words)?),
            // Touched as well, so registration pins resident pages.
            _ => HostMem::Registered(RegisteredVec::register(
                vec![1; words],
                HostRegisterFlags::DEFAULT,
            )?),
        })
    }

    /// Whether copies are asynchronous (everything but pageable memory).
    fn is_async(&self) -> bool {
        !matches!(self, HostMem::Pageable(_))
    }

    /// The words, writable (never read back on the CPU: write-combined memory reads slowly).
    fn words_mut(&mut self) -> Result<&mut [u64]> {
        match self {
            HostMem::Pageable(v) => Ok(v),
            HostMem::Pinned(b) => b.as_mut_slice(),
            HostMem::Mapped(b) => b.as_mut_slice(),
            HostMem::Registered(b) => b.as_mut_slice(),
        }
    }

    /// The host address, for the raw path.
    fn raw_ptr(&mut self) -> Result<*mut c_void> {
        Ok(match self {
            HostMem::Pageable(v) => v.as_mut_ptr().cast(),
            HostMem::Pinned(b) => b.as_mut_ptr().cast(),
            HostMem::Mapped(b) => b.as_ptr().cast_mut().cast(),
            HostMem::Registered(b) => b.as_mut_slice()?.as_mut_ptr().cast(),
        })
    }

    /// Ours: `words` words host to device.
    fn h2d(&self, dev: &mut DeviceBuffer<u64>, words: usize, s: &Stream) -> Result<()> {
        match self {
            HostMem::Pageable(v) => copy_range(dev, 0, v, 0, words),
            HostMem::Pinned(b) => copy_range_async(dev, 0, b, 0, words, s),
            HostMem::Mapped(b) => copy_range_async(dev, 0, b, 0, words, s),
            HostMem::Registered(b) => copy_range_async(dev, 0, b, 0, words, s),
        }
    }

    /// Ours: `words` words device to host.
    fn d2h(&mut self, dev: &DeviceBuffer<u64>, words: usize, s: &Stream) -> Result<()> {
        match self {
            HostMem::Pageable(v) => copy_range(v, 0, dev, 0, words),
            HostMem::Pinned(b) => copy_range_async(b, 0, dev, 0, words, s),
            HostMem::Mapped(b) => copy_range_async(b, 0, dev, 0, words, s),
            HostMem::Registered(b) => copy_range_async(b, 0, dev, 0, words, s),
        }
    }
}

/// The verification pattern: word `i` of pattern `seed`.
pub fn pattern(i: usize, seed: u64) -> u64 {
    (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed
}

pub(super) fn fill(words: &mut [u64], seed: u64) {
    for (i, w) in words.iter_mut().enumerate() {
        *w = pattern(i, seed);
    }
}

/// Compares `words` with pattern `seed`.
pub(super) fn compare(what: String, words: &[u64], seed: u64) -> Check {
    let bad = words
        .iter()
        .enumerate()
        .find(|&(i, &w)| w != pattern(i, seed));
    Check {
        what,
        bytes: (words.len() * 8) as u64,
        ok: bad.is_none(),
        detail: bad.map(|(i, &w)| {
            format!(
                "word {i}: got {w:#018x}, expected {:#018x}",
                pattern(i, seed)
            )
        }),
    }
}

/// Runs every copy kind.
pub fn run(ctx: &Ctx, cfg: &Config, res: &mut BenchResults) -> Result<()> {
    let max = cfg.sizes.iter().copied().max().unwrap_or(0) as usize;
    let words = max / 8;
    let mut dev = DeviceBuffer::<u64>::zeroed(words)?;
    // Pageable memory the checks read back through.
    let mut check = vec![0u64; words];
    for (seed, kind) in [
        "pageable",
        "pinned",
        "write_combined",
        "mapped",
        "registered",
    ]
    .into_iter()
    .enumerate()
    {
        progress(&format!("copies: {kind} h2d, d2h"));
        let r = host_kind(ctx, cfg, res, kind, &mut dev, &mut check, seed as u64 + 1);
        attempt(res, &[kind], "copies", r)?;
    }
    progress("copies: device d2d");
    let r = device_kind(ctx, cfg, res, &mut dev, &mut check);
    attempt(res, &["device"], "copies", r)?;
    Ok(())
}

pub(super) fn row(
    kind: &'static str,
    dir: &'static str,
    bytes: u64,
    samples: u32,
    t: Paired,
) -> CopyRow {
    CopyRow {
        kind,
        direction: dir,
        bytes,
        reps: reps_for(bytes),
        samples,
        gbps: gbps(bytes, t.ours),
        raw_gbps: gbps(bytes, t.raw),
        // Bandwidth ratio: the inverse of the time ratio.
        ratio: 1.0 / t.ratio,
        // Slower samples are lower bandwidth: the time quartiles swap.
        spread: (gbps(bytes, t.ours_q.1), gbps(bytes, t.ours_q.0)),
    }
}

fn host_kind(
    ctx: &Ctx,
    cfg: &Config,
    res: &mut BenchResults,
    kind: &'static str,
    dev: &mut DeviceBuffer<u64>,
    check: &mut [u64],
    seed: u64,
) -> Result<()> {
    let max_words = check.len();
    let mut host = HostMem::new(kind, max_words)?;
    let s = &ctx.stream;
    let hold = host.is_async();
    let stream = hold.then_some(s);
    // Pageable copies are staged by the driver through its own pinned buffer, synchronously:
    // their sample-to-sample spread is several percent, so a full run gives them three times
    // the samples (a quick run stays quick).
    let samples = if hold || cfg.quick {
        cfg.samples
    } else {
        cfg.samples * 3
    };
    let host_raw = host.raw_ptr()?;
    let dev_raw: *mut c_void = dev.as_mut_ptr().cast();
    let mut rows = Vec::new();
    for &bytes in &cfg.sizes {
        let (w, n) = ((bytes / 8) as usize, bytes as usize);
        let reps = reps_for(bytes);
        let h2d = ctx.pair(
            samples,
            reps,
            hold,
            &mut || host.h2d(dev, w, s),
            // SAFETY: both pointers cover `max_words` words, at least `n` bytes; every sample
            // waits for its copies (`Ctx::time`) before the buffers are used or freed.
            &mut || unsafe { raw::memcpy(dev_raw, host_raw, n, K::cudaMemcpyHostToDevice, stream) },
        )?;
        rows.push(row(kind, "h2d", bytes, samples, h2d));
        let d2h = ctx.pair(
            samples,
            reps,
            hold,
            &mut || host.d2h(dev, w, s),
            // SAFETY: as above.
            &mut || unsafe { raw::memcpy(host_raw, dev_raw, n, K::cudaMemcpyDeviceToHost, stream) },
        )?;
        rows.push(row(kind, "d2h", bytes, samples, d2h));
    }
    progress(&format!(
        "  {kind}: {} h2d {:.1} GB/s, d2h {:.1} GB/s",
        fmt_size(cfg.sizes[cfg.sizes.len() - 1]),
        rows[rows.len() - 2].gbps,
        rows[rows.len() - 1].gbps
    ));
    res.copies.extend(rows);

    // Verify with our API, never reading the host memory on the CPU (write-combined reads
    // are very slow): h2d of pattern A, read back through pageable memory; then d2h of
    // pattern B into the host memory, and h2d of it again over a cleared device buffer.
    fill(&mut host.words_mut()?[..max_words], seed);
    host.h2d(dev, max_words, s)?;
    copy_range(check, 0, dev, 0, max_words)?;
    res.checks
        .push(compare(format!("{kind} h2d copies"), check, seed));
    let seed_b = seed.rotate_left(32) ^ 0xD2D2;
    fill(check, seed_b);
    copy_range(dev, 0, check, 0, max_words)?;
    host.d2h(dev, max_words, s)?;
    dev.memset(0)?;
    host.h2d(dev, max_words, s)?;
    check.fill(0);
    copy_range(check, 0, dev, 0, max_words)?;
    res.checks
        .push(compare(format!("{kind} d2h copies"), check, seed_b));
    Ok(())
}

fn device_kind(
    ctx: &Ctx,
    cfg: &Config,
    res: &mut BenchResults,
    dev: &mut DeviceBuffer<u64>,
    check: &mut [u64],
) -> Result<()> {
    let max_words = check.len();
    let mut dst = DeviceBuffer::<u64>::zeroed(max_words)?;
    let s = &ctx.stream;
    let src_raw: *const c_void = dev.as_ptr().cast();
    let dst_raw: *mut c_void = dst.as_mut_ptr().cast();
    for &bytes in &cfg.sizes {
        let (w, n) = ((bytes / 8) as usize, bytes as usize);
        let t = ctx.pair(
            cfg.samples,
            reps_for(bytes),
            true,
            &mut || copy_range_async(&mut dst, 0, &*dev, 0, w, s),
            // SAFETY: both device buffers hold `max_words` words, at least `n` bytes; every
            // sample waits for its copies before the buffers are used or freed.
            &mut || unsafe {
                raw::memcpy(dst_raw, src_raw, n, K::cudaMemcpyDeviceToDevice, Some(s))
            },
        )?;
        res.copies.push(row("device", "d2d", bytes, cfg.samples, t));
    }
    let seed = 0xDD;
    fill(check, seed);
    copy_range(dev, 0, check, 0, max_words)?;
    copy_range_async(&mut dst, 0, &*dev, 0, max_words, s)?;
    check.fill(0);
    copy_range(check, 0, &dst, 0, max_words)?;
    res.checks
        .push(compare("device d2d copies".into(), check, seed));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_finds_the_first_mismatch() {
        let mut w = vec![0u64; 100];
        fill(&mut w, 7);
        assert!(compare("x".into(), &w, 7).ok);
        w[42] ^= 1;
        let c = compare("x".into(), &w, 7);
        assert!(!c.ok);
        assert_eq!(c.bytes, 800);
        assert!(c.detail.unwrap().starts_with("word 42: got "));
    }
}
