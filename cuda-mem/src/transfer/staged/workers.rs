//! The staging workers: [`Stager`], a set of threads kept alive between copies, each with a
//! queue of parts of jobs to run.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use bytemuck::Pod;

use super::config::StagingConfig;
use super::pipeline::{run_part, Job, JobParams, Lanes, PartDone};
use super::tune::{LargeCopyChoice, Tuner};
use super::{lock, Dir};
use crate::alloc::pinned_pool::PinnedPool;
use crate::contract::memory::{sealed, Memory, MemoryMut};
use crate::contract::size;
use crate::error::{Error, Misuse, Result};
use crate::fence::Access;
use crate::handles::devices::current_ordinal;
use crate::handles::pointer::is_unregistered_host;
use crate::ops::copy::{self, Plan};

/// A job and the index of the part of it a worker takes.
type Queued = (Arc<Job>, usize);

/// A worker's queue.
struct Slot {
    /// Parts to run, and the stop flag.
    jobs: Mutex<(VecDeque<Queued>, bool)>,
    ready: Condvar,
}

struct Shared {
    slots: Vec<Slot>,
    /// The configuration copies use now (set at start, changed by `set_config`).
    config: Mutex<StagingConfig>,
    pool: PinnedPool,
    /// The worker the next job starts at, so that small concurrent copies spread out.
    next: AtomicUsize,
    /// The store kind of large copies, tried on the first ones (the process-wide stager).
    tune: OnceLock<Tuner>,
}

/// Staging workers kept alive between copies. Each copy between pageable host memory and
/// device memory is cut into chunks; each worker copies its chunks on the CPU into pinned
/// staging slots (one block from the pool per worker, cached across copies) while the copy
/// engine moves the previous ones, on a stream of its own. The copy waits for pending GPU work
/// on either side first and returns once every chunk has arrived; any chunk's error is the
/// call's error. Dropping the stager stops and joins its workers.
///
/// [`Stager::global`] is the process-wide stager that [`copy`](crate::copy) and
/// [`copy_staged`](crate::copy_staged) use; its configuration is measured on the machine at
/// first use ([`staged_config`](crate::staged_config)).
pub struct Stager {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("workers", &self.workers.len())
            .field("config", &self.config())
            .finish()
    }
}

impl Stager {
    /// Starts `config.threads` workers, whose staging buffers come from `pool`.
    ///
    /// Errors: [`Misuse::InvalidArgument`] for a configuration out of range; the OS refusing
    /// a thread, as [`Error::Os`].
    pub fn new(config: StagingConfig, pool: PinnedPool) -> Result<Stager> {
        Stager::with_workers(config, config.threads, pool)
    }

    /// [`new`](Self::new) with `workers` threads (at least `config.threads`), so that a later
    /// configuration may use more of them.
    pub(super) fn with_workers(
        config: StagingConfig,
        workers: usize,
        pool: PinnedPool,
    ) -> Result<Stager> {
        config.check("Stager::new")?;
        let workers = workers.max(config.threads);
        let shared = Arc::new(Shared {
            slots: (0..workers)
                .map(|_| Slot {
                    jobs: Mutex::new((VecDeque::new(), false)),
                    ready: Condvar::new(),
                })
                .collect(),
            config: Mutex::new(config),
            pool,
            next: AtomicUsize::new(0),
            tune: OnceLock::new(),
        });
        let mut stager = Stager {
            shared: shared.clone(),
            workers: Vec::new(),
        };
        for w in 0..workers {
            let sh = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("cuda-mem-stage-{w}"))
                .spawn(move || worker(&sh, w))
                .map_err(|e| Error::os(format!("Stager::new: starting staging thread {w}"), &e))?;
            // (On error, dropping `stager` stops the workers started so far.)
            stager.workers.push(handle);
        }
        Ok(stager)
    }

    /// The process-wide stager (the global pinned pool's blocks; its configuration
    /// calibrated on this machine, see [`staged_config`](super::staged_config)), started on
    /// first use; `None` where its threads could not be started or the environment's
    /// `CUDA_MEM_STAGED_*` settings are invalid ([`staged_config`](super::staged_config) says
    /// which).
    pub fn global() -> Option<&'static Stager> {
        super::global().ok().map(|g| &g.stager)
    }

    /// The configuration copies use now.
    pub fn config(&self) -> StagingConfig {
        *lock(&self.shared.config)
    }

    /// Worker threads started.
    pub fn workers(&self) -> usize {
        self.shared.slots.len()
    }

    /// Makes copies from now on use `config` (copies running go on with the one they
    /// started with).
    ///
    /// Errors: [`Misuse::InvalidArgument`] for a configuration out of range, or one with more
    /// threads than the stager started ([`workers`](Self::workers)).
    pub fn set_config(&self, config: StagingConfig) -> Result<()> {
        config.check("Stager::set_config")?;
        if config.threads > self.workers() {
            return Err(Misuse::InvalidArgument {
                op: "Stager::set_config",
                reason: format!(
                    "{} threads asked for, but the stager started {}",
                    config.threads,
                    self.workers()
                ),
            }
            .into());
        }
        *lock(&self.shared.config) = config;
        if let Some(t) = self.shared.tune.get() {
            t.off();
        }
        Ok(())
    }

    /// Tries both store kinds on the first large copies, except for the directions `fixed`
    /// (`tune.rs`); until [`set_config`](Self::set_config).
    pub(super) fn tune_large_copies(&self, fixed: [bool; 2]) {
        let _ = self.shared.tune.set(Tuner::new(fixed));
    }

    /// The store kinds chosen for large copies so far.
    pub(super) fn large_copy_choices(&self) -> Vec<LargeCopyChoice> {
        self.shared.tune.get().map_or_else(Vec::new, Tuner::choices)
    }

    /// Copies all of `src` into `dst`, staged where one side is pageable host memory and the
    /// other device memory and the copy is at least the direction's
    /// [`min_bytes`](super::DirectionConfig::min_bytes); by the driver's path
    /// ([`copy`](crate::copy)) otherwise. Lengths must match.
    pub fn copy<T, D, S>(&self, dst: &mut D, src: &S) -> Result<()>
    where
        T: Pod,
        D: MemoryMut<T> + ?Sized,
        S: Memory<T> + ?Sized,
    {
        size::same_len(dst.raw_len(), src.raw_len())?;
        self.copy_range(dst, 0, src, 0, src.raw_len())
    }

    /// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]`; see
    /// [`copy`](Self::copy) and [`copy_range`](crate::copy_range).
    pub fn copy_range<T, D, S>(
        &self,
        dst: &mut D,
        dst_offset: usize,
        src: &S,
        src_offset: usize,
        count: usize,
    ) -> Result<()>
    where
        T: Pod,
        D: MemoryMut<T> + ?Sized,
        S: Memory<T> + ?Sized,
    {
        // Checked once, for either path.
        let plan = Plan::new(dst, dst_offset, src, src_offset, count)?;
        let cfg = self.config();
        let Some(dir) =
            Dir::of(src.loc(), dst.loc()).filter(|&d| plan.bytes >= cfg.dir(d).min_bytes)
        else {
            return copy::copy_planned(dst, src, plan);
        };
        // A slice of pinned memory (`as_slice()` of a pinned, mapped or registered buffer) is
        // copied faster by DMA in one step than through the staging buffers.
        let host = match dir {
            Dir::ToDevice => src.raw_ptr(),
            Dir::ToHost => dst.raw_ptr(),
        };
        // Only ordinary pageable memory is staged (`cudaPointerGetAttributes`: well under a
        // microsecond, against the millisecond or more of a copy large enough to stage):
        // pinned memory is better copied by DMA directly, and the workers must not touch
        // managed memory the GPU may be using.
        if !is_unregistered_host(host) {
            return copy::copy_planned(dst, src, plan);
        }
        self.copy_bytes(dst, src, &plan, dir, &cfg)
    }

    fn copy_bytes<T, D, S>(
        &self,
        dst: &mut D,
        src: &S,
        plan: &Plan<T>,
        dir: Dir,
        cfg: &StagingConfig,
    ) -> Result<()>
    where
        T: Pod,
        D: sealed::RawMut<T> + ?Sized,
        S: sealed::Raw<T> + ?Sized,
    {
        dst.check_device_writable("copy_staged")?;
        // Pending GPU work on either side first, as for host access: the device side, and a
        // host side with a fence (memory borrowed by a `scope`, which async work may use).
        if let Some(f) = src.fence() {
            f.host_wait(Access::Read)?;
        }
        if let Some(f) = dst.fence() {
            f.host_wait(Access::Write)?;
        }
        let device = match dir {
            Dir::ToDevice => dst.device_ordinal(),
            Dir::ToHost => src.device_ordinal(),
        };
        // The addresses `Plan::new` checked.
        let (d, s, bytes) = (plan.d as usize, plan.s as usize, plan.bytes);
        let (dev, host) = match dir {
            Dir::ToDevice => (d, s),
            Dir::ToHost => (s, d),
        };
        let device = device.unwrap_or_else(current_ordinal);
        let mut p = self.params(cfg, dir, device, dev, host, bytes);
        let configured = p.nt;
        let tune = self.shared.tune.get();
        let mut trial = None;
        if let Some(t) = tune {
            (p.nt, trial) = t.choose(dir, bytes, configured);
            t.start(&mut trial);
        }
        #[allow(unused_mut)]
        let mut job = Job::new(p);
        #[cfg(feature = "testing")]
        {
            job.fail_at = crate::testing::take_staged_failure();
        }
        // Every worker's part ends (`PartDone`) only after its copies have completed and it no
        // longer touches either side: the borrows of `dst` and `src` outlive them.
        let t0 = Instant::now();
        let r = self.run(job);
        if let Some(t) = tune {
            t.end(trial, t0.elapsed().as_secs_f64(), r.is_ok(), configured);
        }
        r
    }

    /// How `cfg` cuts a copy of `bytes` in direction `dir` between device address `dev` on
    /// `device` and host address `host`.
    pub(super) fn params(
        &self,
        cfg: &StagingConfig,
        dir: Dir,
        device: i32,
        dev: usize,
        host: usize,
        bytes: usize,
    ) -> JobParams {
        let chunk = cfg.chunk_for(bytes);
        JobParams {
            dir,
            device,
            dev,
            host,
            bytes,
            chunk,
            parts: bytes
                .div_ceil(chunk)
                .min(cfg.threads)
                .min(self.workers())
                .max(1),
            depth: cfg.depth,
            slot: cfg.chunk_bytes.max(chunk),
            nt: cfg.dir(dir).nt_stores,
        }
    }

    /// Hands `job`'s parts to the workers and waits until all are done; the first error of
    /// any part. The job's memory must stay valid and unused by anything else until then.
    pub(super) fn run(&self, job: Job) -> Result<()> {
        if job.p.bytes == 0 {
            return Ok(());
        }
        let job = Arc::new(job);
        let parts = job.p.parts;
        let n = self.shared.slots.len();
        let start = self.shared.next.fetch_add(parts, Ordering::Relaxed);
        for part in 0..parts {
            let slot = &self.shared.slots[(start + part) % n];
            let mut q = lock(&slot.jobs);
            q.0.push_back((job.clone(), part));
            slot.ready.notify_one();
        }
        job.wait()
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        for slot in &self.shared.slots {
            let mut q = lock(&slot.jobs);
            q.1 = true;
            slot.ready.notify_one();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(sh: &Shared, w: usize) {
    let mut lanes = Lanes::new();
    loop {
        let (job, part) = {
            let slot = &sh.slots[w];
            let mut q = lock(&slot.jobs);
            loop {
                if let Some(j) = q.0.pop_front() {
                    break j;
                }
                if q.1 {
                    return;
                }
                q = slot.ready.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        let _done = PartDone(&job);
        if let Err(e) = run_part(&sh.pool, &job, part, &mut lanes) {
            job.fail(e);
        }
    }
}
