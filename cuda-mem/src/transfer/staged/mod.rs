//! Staged copies between ordinary (pageable) host memory and device memory: [`Stager`],
//! [`copy_staged`].
//!
//! The driver copies pageable memory through a small pinned buffer of its own, one chunk at a
//! time, on one CPU thread: a fraction of the speed of a copy from pinned memory. The bound of
//! a staged copy is host memory bandwidth (memcpy on all cores), not the link (measured
//! figures: `docs/results/` in the repository). A [`Stager`] keeps a set of worker threads
//! alive between copies (`workers.rs`); each copy is cut into chunks, and each worker runs its
//! own pipeline over its share (`pipeline.rs`): it copies a chunk of the source into one of
//! its pinned staging slots (slices of one block from a [`PinnedPool`], cached across copies
//! in the worker's own cache of the pool) while the copy engine moves the previous one, on a
//! stream of its own. Chunks can be written with non-temporal stores (`memcpy.rs`), per
//! direction.
//!
//! The copy is synchronous: it waits for pending GPU work on the device side first (as a
//! host access would), and returns once every chunk has arrived. Any chunk's error is the
//! call's error; the other workers stop at their next chunk, and every staging block goes
//! back to the pool once its stream is idle.
//!
//! Below the direction's [`DirectionConfig::min_bytes`], for host slices that CUDA knows
//! (`as_slice()` of a pinned or managed buffer), and for other kinds of memory, the driver's
//! path is taken: for small copies its single call is cheaper than waking the workers, and
//! pinned memory is copied by DMA directly.
//!
//! # The process-wide stager's configuration
//!
//! [`Stager::global`] (which [`copy`](crate::copy) and [`copy_staged`] use) does not trust
//! constants tuned on one machine: the first time it is needed it measures, on scratch memory
//! of its own and in some tens of milliseconds, the threshold of each direction, the chunk
//! size, the worker count and the store kind of each direction (`calibrate.rs`); the store
//! kind of copies from 64 MiB up, which copies of 16 MiB do not predict, it tries on the first
//! such copies (`tune.rs`). What it chose, and why, is [`staged_config`]. Overrides, strongest first:
//! [`set_staged_config`] (any time), then the `CUDA_MEM_STAGED_*` environment variables read
//! at start (`THREADS`, `CHUNK`, `MIN_CHUNK`, `DEPTH`, `MIN_BYTES`, `MIN_BYTES_H2D`,
//! `MIN_BYTES_D2H`, `NT`, `NT_H2D`, `NT_D2H`; `CALIBRATE=0` measures nothing and keeps
//! [`StagingConfig::default`]); the fields they set are not measured. An invalid value is
//! reported by [`staged_config`] and [`copy_staged`] as [`Misuse::InvalidArgument`] naming
//! the variable; [`copy`](crate::copy) then takes the driver's path.
//! `CUDA_MEM_STAGED_COPIES=0` turns staging by `copy` off altogether.
//!
//! [`Misuse::InvalidArgument`]: crate::Misuse::InvalidArgument

mod calibrate;
mod config;
mod memcpy;
mod pipeline;
mod tune;
mod workers;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use bytemuck::Pod;

pub use self::calibrate::{Calibration, CalibrationPoint};
pub use self::config::{DirectionConfig, StagingConfig};
pub use self::tune::LargeCopyChoice;
pub use self::workers::Stager;
#[cfg(feature = "measure")]
pub(crate) use memcpy::host_copy;

use self::config::{apply_env, cores};
use crate::alloc::pinned_pool::PinnedPool;
use crate::contract::memory::{Loc, Memory, MemoryMut};
use crate::error::{Error, Result};
use crate::handles::devices::current_ordinal;

/// Which way a job copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dir {
    ToDevice,
    ToHost,
}

impl Dir {
    /// The direction of a copy from `src` to `dst`, where it is one a stager makes.
    fn of(src: Loc, dst: Loc) -> Option<Dir> {
        match (src, dst) {
            (Loc::Pageable, Loc::Device) => Some(Dir::ToDevice),
            (Loc::Device, Loc::Pageable) => Some(Dir::ToHost),
            _ => None,
        }
    }

    fn index(self) -> usize {
        match self {
            Dir::ToDevice => 0,
            Dir::ToHost => 1,
        }
    }
}

/// Where the process-wide stager's configuration came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// Measured on this machine at first use (fields set by the environment excepted).
    Calibrated,
    /// [`StagingConfig::default`] with the environment's settings, measuring nothing: the
    /// reason (calibration turned off, or failed with this error).
    Fallback(String),
    /// Set by [`set_staged_config`].
    Override,
}

/// What the process-wide stager runs with: [`staged_config`].
#[derive(Debug, Clone, PartialEq)]
pub struct StagedSetup {
    /// The configuration copies use now.
    pub config: StagingConfig,
    /// Where it came from.
    pub source: ConfigSource,
    /// The `CUDA_MEM_STAGED_*` settings applied at start, as `NAME=value`.
    pub env: Vec<String>,
    /// Worker threads started (a configuration may use fewer).
    pub workers: usize,
    /// The measurements, where calibration ran (kept after an override).
    pub calibration: Option<Calibration>,
    /// The store kinds chosen so far for copies from 64 MiB up, tried on the first ones of
    /// each size class where calibration chose the store kinds (not after an override, nor
    /// for a direction whose store kind the environment sets).
    pub large_copies: Vec<LargeCopyChoice>,
}

impl std::fmt::Display for StagedSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::contract::size::fmt_bytes;
        let c = &self.config;
        write!(
            f,
            "{} of {} workers, chunks {}..{} ({} per worker), depth {}, \
             host to device from {} (nt {}), device to host from {} (nt {}); {}",
            c.threads,
            self.workers,
            fmt_bytes(c.min_chunk_bytes),
            fmt_bytes(c.chunk_bytes),
            c.chunks_per_thread,
            c.depth,
            fmt_bytes(c.to_device.min_bytes),
            c.to_device.nt_stores,
            fmt_bytes(c.to_host.min_bytes),
            c.to_host.nt_stores,
            match &self.source {
                ConfigSource::Calibrated => "calibrated".to_string(),
                ConfigSource::Fallback(why) => format!("fallback values ({why})"),
                ConfigSource::Override => "set by set_staged_config".to_string(),
            }
        )?;
        if !self.env.is_empty() {
            write!(f, "; environment: {}", self.env.join(" "))?;
        }
        for c in &self.large_copies {
            write!(
                f,
                "; {} from {}: nt {} ({:.1} GB/s nt, {:.1} plain)",
                if c.to_device { "h2d" } else { "d2h" },
                fmt_bytes(c.from_bytes),
                c.nt_stores,
                c.gbps_nt,
                c.gbps_plain
            )?;
        }
        Ok(())
    }
}

/// The process-wide stager and its setup.
pub(super) struct Global {
    pub(super) stager: Stager,
    setup: Mutex<StagedSetup>,
}

static GLOBAL: OnceLock<Result<Global>> = OnceLock::new();

/// A configuration set by [`set_staged_config`] before the process-wide stager started, and
/// whether [`start`] has read it already (under this lock: a setting made after that read
/// waits for the start and is applied to the running stager, never left unread).
static OVERRIDE: Mutex<(Option<StagingConfig>, bool)> = Mutex::new((None, false));

/// The smallest copy of each direction [`copy`](crate::copy) hands to the process-wide
/// stager: its thresholds once it runs; before, the smallest that calibration or a setting
/// can choose, so that small copies never start it.
static THRESHOLD: [AtomicUsize; 2] = [AtomicUsize::new(1 << 20), AtomicUsize::new(1 << 20)];

/// The process-wide stager, started (and its configuration measured) on first use; an error
/// where the environment's settings are invalid or the threads could not be started.
pub(super) fn global() -> Result<&'static Global> {
    GLOBAL.get_or_init(start).as_ref().map_err(Error::clone)
}

/// `m` locked, a poisoned lock taken as it is (as every lock of the stager is).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn start() -> Result<Global> {
    let (from_env, fixed, no_calibration, env) =
        apply_env(StagingConfig::default(), |k| std::env::var(k).ok())?;
    let over = {
        let mut o = lock(&OVERRIDE);
        o.1 = true;
        o.0
    };
    let workers = cores()
        .max(from_env.threads)
        .max(over.map_or(0, |c| c.threads));
    let stager = Stager::with_workers(
        over.unwrap_or(from_env),
        workers,
        PinnedPool::global().clone(),
    )?;
    let (config, source, calibration) = if let Some(c) = over {
        (c, ConfigSource::Override, None)
    } else if no_calibration {
        let why = "CUDA_MEM_STAGED_CALIBRATE=0".to_string();
        (from_env, ConfigSource::Fallback(why), None)
    } else {
        match calibrate::calibrate(&stager, from_env, fixed, current_ordinal()) {
            Ok((c, cal)) => (c, ConfigSource::Calibrated, Some(cal)),
            Err(e) => {
                let why = format!("calibration failed: {e}");
                (from_env, ConfigSource::Fallback(why), None)
            }
        }
    };
    stager.set_config(config)?;
    if source == ConfigSource::Calibrated {
        stager.tune_large_copies(fixed.nt);
    }
    publish_thresholds(&config);
    Ok(Global {
        setup: Mutex::new(StagedSetup {
            config,
            source,
            env,
            workers: stager.workers(),
            calibration,
            large_copies: Vec::new(),
        }),
        stager,
    })
}

fn publish_thresholds(c: &StagingConfig) {
    THRESHOLD[0].store(c.to_device.min_bytes, Ordering::Relaxed);
    THRESHOLD[1].store(c.to_host.min_bytes, Ordering::Relaxed);
}

/// The configuration of the process-wide stager ([`Stager::global`]): what it chose and
/// why, with the calibration's measurements. Starts the stager (and so measures) if no copy
/// did yet.
///
/// Errors: [`Misuse::InvalidArgument`](crate::Misuse::InvalidArgument) naming a
/// `CUDA_MEM_STAGED_*` variable whose value is invalid; [`Error::Os`] where the worker
/// threads could not be started.
pub fn staged_config() -> Result<StagedSetup> {
    let g = global()?;
    let mut s = lock(&g.setup).clone();
    s.large_copies = g.stager.large_copy_choices();
    Ok(s)
}

/// Makes the process-wide stager use `config` instead of what it measured (or will): at
/// once where it runs (copies running go on with the configuration they started with),
/// else from its start, which then measures nothing. Stronger than the environment's
/// settings.
///
/// Errors: [`Misuse::InvalidArgument`](crate::Misuse::InvalidArgument) for a configuration
/// out of range, or with more threads than the running stager started
/// ([`StagedSetup::workers`]).
pub fn set_staged_config(config: StagingConfig) -> Result<()> {
    config.check("set_staged_config")?;
    {
        let mut o = lock(&OVERRIDE);
        if !o.1 {
            // Not started: the start reads it (under the same lock).
            o.0 = Some(config);
            publish_thresholds(&config);
            return Ok(());
        }
    }
    // Started, or starting (then this waits for it): applied to the running stager. A start
    // that failed has nothing to apply it to, as before.
    if let Ok(g) = GLOBAL.get_or_init(start) {
        g.stager.set_config(config)?;
        let mut s = lock(&g.setup);
        s.config = config;
        s.source = ConfigSource::Override;
    }
    publish_thresholds(&config);
    Ok(())
}

/// Copies all of `src` into `dst` through the process-wide [`Stager`] (see
/// [`Stager::copy`]): staged for pageable host memory to or from device memory from the
/// direction's threshold up ([`staged_config`]), the driver's path otherwise.
///
/// Errors: as [`copy`](crate::copy); an invalid `CUDA_MEM_STAGED_*` setting (see
/// [`staged_config`]). Where the stager's threads cannot be started, the driver's path.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{copy_staged, DeviceBuffer};
/// let host = vec![7u8; 256 << 20];              // ordinary memory
/// let mut dev = DeviceBuffer::<u8>::uninit(host.len())?;
/// copy_staged(&mut dev, &host)?;                 // several times the driver's speed
/// let mut back = vec![0u8; host.len()];
/// copy_staged(&mut back, &dev)?;
/// assert_eq!(back, host);
/// # Ok(()) }
/// ```
pub fn copy_staged<T, D, S>(dst: &mut D, src: &S) -> Result<()>
where
    T: Pod,
    D: MemoryMut<T> + ?Sized,
    S: Memory<T> + ?Sized,
{
    match global() {
        Ok(g) => g.stager.copy(dst, src),
        Err(Error::Misuse(m)) => Err(m.into()),
        Err(_) => super::copy(dst, src), // the driver's path (no stager)
    }
}

/// Whether [`copy`](crate::copy) stages large pageable copies (see [`set_auto_staging`]).
static AUTO: AtomicBool = AtomicBool::new(true);

/// Makes [`copy`](crate::copy) and [`copy_range`](crate::copy_range) stage copies between
/// pageable host memory and device memory through the process-wide [`Stager`] (`true`, the
/// default unless the environment variable `CUDA_MEM_STAGED_COPIES` is `0`) or always take
/// the driver's path (`false`).
pub fn set_auto_staging(on: bool) {
    AUTO.store(on, Ordering::Relaxed);
}

/// The stager `copy` hands a copy of `count` elements of `elem` bytes from `src` to `dst` to,
/// if any.
pub(crate) fn auto_stager(
    src: Loc,
    dst: Loc,
    count: usize,
    elem: usize,
) -> Option<&'static Stager> {
    let dir = Dir::of(src, dst)?;
    static ENV_OFF: OnceLock<bool> = OnceLock::new();
    let env_off = *ENV_OFF.get_or_init(|| {
        // The environment's thresholds below the default floor count before the start too.
        if let Ok((c, ..)) = apply_env(StagingConfig::default(), |k| std::env::var(k).ok()) {
            THRESHOLD[0].fetch_min(c.to_device.min_bytes, Ordering::Relaxed);
            THRESHOLD[1].fetch_min(c.to_host.min_bytes, Ordering::Relaxed);
        }
        std::env::var_os("CUDA_MEM_STAGED_COPIES").is_some_and(|v| v == "0")
    });
    if env_off || !AUTO.load(Ordering::Relaxed) {
        return None;
    }
    let bytes = count.checked_mul(elem)?;
    if bytes < THRESHOLD[dir.index()].load(Ordering::Relaxed) {
        return None;
    }
    global().ok().map(|g| &g.stager)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Misuse;

    #[test]
    fn config_out_of_range_is_refused_by_the_stager() {
        let ok = StagingConfig::default();
        for bad in [
            StagingConfig { threads: 0, ..ok },
            StagingConfig {
                chunk_bytes: 100,
                ..ok
            },
            StagingConfig { depth: 0, ..ok },
        ] {
            let e = Stager::new(bad, PinnedPool::default()).unwrap_err();
            assert!(
                matches!(e, Error::Misuse(Misuse::InvalidArgument { .. })),
                "{e}"
            );
            let e = set_staged_config(bad).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Misuse(Misuse::InvalidArgument {
                        op: "set_staged_config",
                        ..
                    })
                ),
                "{e}"
            );
        }
    }

    /// A stager's configuration can change while it runs, within the threads it started.
    #[test]
    fn a_stager_takes_a_new_configuration_within_its_workers() {
        let c = StagingConfig {
            threads: 2,
            ..StagingConfig::default()
        };
        let st = Stager::new(c, PinnedPool::default()).unwrap();
        assert_eq!((st.workers(), st.config()), (2, c));
        let one = StagingConfig { threads: 1, ..c }.with_min_bytes(0);
        st.set_config(one).unwrap();
        assert_eq!(st.config(), one);
        let e = st
            .set_config(StagingConfig { threads: 3, ..c })
            .unwrap_err();
        assert!(e.to_string().contains("started 2"), "{e}");
        assert_eq!(st.config(), one, "a refused configuration changes nothing");
    }
}
