//! Kernel read and write bandwidth through device, zero-copy mapped and managed pointers, with
//! the embedded PTX probes of `cuda_mem_probes::Probes` (no nvcc at build time). Managed
//! memory is measured on first touch (the pages live on the host, so the kernel migrates
//! them by page faults), then prefetched to the device (the prefetch itself is timed too),
//! then resident.

use std::os::raw::c_void;

use cuda_mem::{alloc_mapped, Attach, DeviceBuffer, Location, ManagedBuffer, Misuse, Result};
use cuda_mem_probes::Probes;

use super::{attempt, progress, Config, Ctx};
use crate::results::{BenchResults, Check, KernelRow, NO_SPREAD};
use crate::units::{gbps, MIB};

/// What `cm_write` leaves in `u64` word `j`: 16-byte word `i = j / 2` holds four copies of
/// the 32-bit `i`.
fn written(j: usize) -> u64 {
    ((j / 2) as u32 as u64) * 0x1_0000_0001
}

fn check_written(what: &str, words: &[u64]) -> Check {
    let bad = words.iter().enumerate().find(|&(j, &w)| w != written(j));
    Check {
        what: format!("{what} kernel writes"),
        bytes: (words.len() * 8) as u64,
        ok: bad.is_none(),
        detail: bad
            .map(|(j, &w)| format!("word {j}: got {w:#018x}, expected {:#018x}", written(j))),
    }
}

/// The probes and the sink their reads write to.
struct Kit<'a> {
    ctx: &'a Ctx,
    probes: Probes,
    sink: *mut u64,
    samples: u32,
}

impl Kit<'_> {
    /// Median GB/s of one `launch` over `bytes`, `before` run untimed ahead of each sample.
    fn timed(
        &self,
        bytes: u64,
        mut before: impl FnMut() -> Result<()>,
        mut launch: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        let t = self.ctx.median_of(self.samples, || {
            before()?;
            self.ctx.time(1, true, &mut launch)
        })?;
        Ok(gbps(bytes, t))
    }

    /// Median GB/s of `cm_read` over `bytes` at device address `p`.
    fn read(&self, p: *mut c_void, bytes: u64, before: impl FnMut() -> Result<()>) -> Result<f64> {
        self.timed(bytes, before, || {
            // SAFETY: `p` is device-accessible, 16-byte aligned memory of at least `bytes`
            // bytes and `sink` a device `u64`, both alive for the whole sample, which waits
            // for the kernel (`Ctx::time`).
            unsafe {
                self.probes
                    .read(p, bytes as usize, self.sink, &self.ctx.stream)
            }
        })
    }

    /// Median GB/s of `cm_write` over `bytes` at device address `p`.
    fn write(&self, p: *mut c_void, bytes: u64, before: impl FnMut() -> Result<()>) -> Result<f64> {
        self.timed(bytes, before, || {
            // SAFETY: as in `read`; nothing on the host reads or writes the memory while the
            // sample runs.
            unsafe { self.probes.write(p, bytes as usize, &self.ctx.stream) }
        })
    }
}

fn row(kind: &'static str, op: &'static str, bytes: u64, samples: u32, gbps: f64) -> KernelRow {
    KernelRow {
        kind,
        op,
        bytes,
        samples,
        gbps,
        spread: NO_SPREAD,
    }
}

/// Runs the kernel measurements.
pub fn run(ctx: &Ctx, cfg: &Config, res: &mut BenchResults) -> Result<()> {
    const ALL: [&str; 4] = ["device", "mapped", "managed_fault", "managed_prefetched"];
    progress("kernels: loading the probe PTX");
    let Some(probes) = attempt(res, &ALL, "kernels", Probes::load())? else {
        return Ok(());
    };
    let Some(mut sink) = attempt(res, &ALL, "kernels", DeviceBuffer::<u64>::zeroed(1))? else {
        return Ok(());
    };
    let kit = Kit {
        ctx,
        probes,
        sink: sink.as_mut_ptr(),
        samples: cfg.samples,
    };
    let bytes = cfg.kernel_bytes;
    progress("kernels: device");
    let r = device(&kit, bytes, res);
    attempt(res, &["device"], "kernels", r)?;
    progress("kernels: mapped (zero-copy)");
    let r = mapped(&kit, bytes, res);
    attempt(res, &["mapped"], "kernels", r)?;
    progress("kernels: managed (page faults, prefetch, resident)");
    let r = managed(&kit, bytes, res);
    attempt(res, &["managed_fault", "managed_prefetched"], "kernels", r)?;
    drop(kit);
    drop(sink);
    Ok(())
}

fn device(kit: &Kit, bytes: u64, res: &mut BenchResults) -> Result<()> {
    let mut buf = DeviceBuffer::<u64>::zeroed((bytes / 8) as usize)?;
    let p = buf.as_mut_ptr().cast();
    let read = kit.read(p, bytes, || Ok(()))?;
    let write = kit.write(p, bytes, || Ok(()))?;
    res.kernels
        .push(row("device", "read", bytes, kit.samples, read));
    res.kernels
        .push(row("device", "write", bytes, kit.samples, write));
    res.checks.push(check_written("device", &buf.to_vec()?));
    Ok(())
}

fn mapped(kit: &Kit, bytes: u64, res: &mut BenchResults) -> Result<()> {
    let buf = alloc_mapped::<u64>((bytes / 8) as usize)?;
    let p = buf.device_address().cast_mut().cast();
    let read = kit.read(p, bytes, || Ok(()))?;
    let write = kit.write(p, bytes, || Ok(()))?;
    res.kernels
        .push(row("mapped", "read", bytes, kit.samples, read));
    res.kernels
        .push(row("mapped", "write", bytes, kit.samples, write));
    res.checks.push(check_written("mapped", buf.as_slice()?));
    Ok(())
}

fn managed(kit: &Kit, bytes: u64, res: &mut BenchResults) -> Result<()> {
    // Never more managed memory than a quarter of what the device has free.
    let (free, _) = kit.ctx.device.mem_info()?;
    let bytes = bytes.min((free as u64 / 4) & !15);
    if bytes < MIB {
        return Err(Misuse::ManagedExceedsFree {
            bytes: MIB as usize,
            free,
        }
        .into());
    }
    res.method.managed_bytes = bytes;
    let mut buf = ManagedBuffer::<u64>::zeroed((bytes / 8) as usize, Attach::Global)?;
    let p = buf.as_mut_ptr().cast();
    let n = kit.samples;
    let ordinal = kit.ctx.device.ordinal();
    // First touch: the host writes every page before each sample, so the kernel faults them in.
    let cell = std::cell::RefCell::new(&mut buf);
    let host_touch = || -> Result<()> {
        cell.borrow_mut().as_mut_slice()?.fill(1);
        Ok(())
    };
    let read = kit.read(p, bytes, host_touch)?;
    let write = kit.write(p, bytes, host_touch)?;
    res.kernels
        .push(row("managed_fault", "read", bytes, n, read));
    res.kernels
        .push(row("managed_fault", "write", bytes, n, write));
    res.checks.push(check_written(
        "managed (page faults)",
        cell.borrow().as_slice()?,
    ));
    // Prefetch to the device, timed, then the kernels on resident pages.
    let ctx = kit.ctx;
    let t = ctx.median_of(n, || {
        host_touch()?;
        ctx.time(1, false, &mut || {
            cell.borrow_mut().prefetch(
                Location::Device(cuda_mem::Device::get(ordinal)?),
                &ctx.stream,
            )
        })
    })?;
    res.kernels.push(row(
        "managed_prefetched",
        "prefetch",
        bytes,
        n,
        gbps(bytes, t),
    ));
    let read = kit.read(p, bytes, || Ok(()))?;
    let write = kit.write(p, bytes, || Ok(()))?;
    res.kernels
        .push(row("managed_prefetched", "read", bytes, n, read));
    res.kernels
        .push(row("managed_prefetched", "write", bytes, n, write));
    res.checks.push(check_written(
        "managed (prefetched)",
        cell.borrow().as_slice()?,
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_pattern() {
        assert_eq!(written(0), 0);
        assert_eq!(written(1), 0);
        assert_eq!(written(2), 0x1_0000_0001);
        assert_eq!(written(7), 3 * 0x1_0000_0001);
        let words: Vec<u64> = (0..64).map(written).collect();
        assert!(check_written("x", &words).ok);
    }
}
