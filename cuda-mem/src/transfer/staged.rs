//! Staged copies between ordinary (pageable) host memory and device memory: [`Stager`],
//! [`copy_staged`].
//!
//! The driver copies pageable memory through a small pinned buffer of its own, one chunk at a
//! time, on one CPU thread: a fraction of the speed of a copy from pinned memory. The bound of
//! a staged copy is host memory bandwidth (memcpy on all cores), not the link (measured
//! figures: `docs/results/` in the repository). A [`Stager`] keeps a
//! set of worker threads alive between copies; each copy is cut into chunks, and each worker
//! runs its own pipeline over its share: it copies a chunk of the source into one of its
//! pinned staging buffers (from a [`PinnedPool`], so cached across copies) while the copy
//! engine moves the previous one, on a stream of its own. Host-to-device chunks are written
//! with non-temporal stores where the CPU has them (the staging buffer is read next by the
//! DMA engine, not by the CPU, so there is no point in caching it).
//!
//! The copy is synchronous: it waits for pending GPU work on the device side first (as a
//! host access would), and returns once every chunk has arrived. Any chunk's error is the
//! call's error; the other workers stop at their next chunk, and every staging buffer goes
//! back to the pool once its stream is idle.
//!
//! Below [`StagingConfig::min_bytes`], for host slices that CUDA knows (`as_slice()` of a
//! pinned or managed buffer), and for other kinds of memory, the driver's path is taken: for small
//! copies its single call is cheaper than waking the workers, and pinned memory is copied by
//! DMA directly.

use std::collections::{HashMap, VecDeque};
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::alloc::pinned_pool::PinnedPool;
use crate::contract::memory::{sealed, Loc, Memory, MemoryMut};
use crate::contract::size;
use crate::error::{check, Error, Misuse, Result};
use crate::fence::Access;
use crate::handles::devices::current_ordinal;
use crate::handles::flags::HostAllocFlags;
use crate::ops::copy::{self, Plan};

/// How a [`Stager`] cuts and runs copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingConfig {
    /// Worker threads, each with its own stream and staging buffers per device.
    pub threads: usize,
    /// Largest chunk (and staging buffer), bytes. A copy is cut into about
    /// `threads * chunks_per_thread` chunks, each between `min_chunk_bytes` and this.
    pub chunk_bytes: usize,
    /// Smallest chunk, bytes.
    pub min_chunk_bytes: usize,
    /// Chunks each worker should get per copy: enough for its pipeline to fill.
    pub chunks_per_thread: usize,
    /// Staging buffers per worker (2: one filled by the CPU while the other is copied).
    pub depth: usize,
    /// Copies smaller than this take the driver's path.
    pub min_bytes: usize,
    /// Write chunks with non-temporal stores (x86-64 with AVX2): into the staging buffer on
    /// the way to the device, into the destination on the way back.
    pub nt_stores: bool,
}

impl Default for StagingConfig {
    /// The values chosen from the H200 measurements (`docs/guide.md`, "Staged pageable
    /// copies"; the figures: `docs/results/`, "Measured design choices"): as many workers as
    /// the host has cores (more threads were faster at every size); about four chunks per
    /// worker, between 256 KiB and 4 MiB; two staging buffers per worker; staged from 4 MiB
    /// up (below, the driver's single call was as fast or faster, or the gain within the
    /// run-to-run spread; from 4 MiB both directions gained on both hosts measured);
    /// non-temporal stores on.
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        StagingConfig {
            threads: cores.clamp(1, 64),
            chunk_bytes: 4 << 20,
            min_chunk_bytes: 256 << 10,
            chunks_per_thread: 4,
            depth: 2,
            min_bytes: 4 << 20,
            nt_stores: true,
        }
    }
}

impl StagingConfig {
    /// The chunk size for a copy of `bytes`: about `threads * chunks_per_thread` chunks, a
    /// multiple of 64 KiB, clamped to `min_chunk_bytes..=chunk_bytes`.
    pub fn chunk_for(&self, bytes: usize) -> usize {
        let want = bytes / self.threads.saturating_mul(self.chunks_per_thread).max(1);
        // (`max` then `min` rather than `clamp`: no panic for a config with min > max.)
        want.checked_next_multiple_of(64 << 10)
            .unwrap_or(usize::MAX)
            .max(self.min_chunk_bytes)
            .min(self.chunk_bytes)
            .max(4096)
    }

    fn check(&self) -> Result<()> {
        let bad = |reason: &str| {
            Err(Misuse::InvalidArgument {
                op: "Stager::new",
                reason: reason.into(),
            }
            .into())
        };
        if self.threads == 0 || self.threads > 1024 {
            return bad("threads must be between 1 and 1024");
        }
        if self.min_chunk_bytes < 4096 || self.chunk_bytes < self.min_chunk_bytes {
            return bad("chunk sizes must be at least 4096, min_chunk_bytes <= chunk_bytes");
        }
        if self.chunks_per_thread == 0 || self.chunks_per_thread > 1024 {
            return bad("chunks_per_thread must be between 1 and 1024");
        }
        if self.depth == 0 || self.depth > 16 {
            return bad("depth must be between 1 and 16");
        }
        Ok(())
    }
}

/// Which way a job copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
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
}

/// One staged copy, shared by the workers that take part.
struct Job {
    dir: Dir,
    device: i32,
    /// Device address and host address of byte 0, and the length.
    dev: usize,
    host: usize,
    bytes: usize,
    chunk: usize,
    /// Workers taking part: worker `w` copies chunks `w`, `w + parts`, ...
    parts: usize,
    /// A forced failure at this chunk (the `testing` feature).
    #[cfg(feature = "testing")]
    fail_at: Option<usize>,
    abort: AtomicBool,
    error: Mutex<Option<Error>>,
    left: Mutex<usize>,
    done: Condvar,
}

impl Job {
    fn chunks(&self) -> usize {
        self.bytes.div_ceil(self.chunk)
    }

    /// How many chunks part `w` (< `parts`) copies.
    fn part_len(&self, w: usize) -> usize {
        (self.chunks() - w).div_ceil(self.parts)
    }

    /// The chunk that is the `i`-th of part `w`.
    fn part_chunk(&self, w: usize, i: usize) -> usize {
        w + i * self.parts
    }

    /// Byte offset and length of chunk `c`.
    fn span(&self, c: usize) -> (usize, usize) {
        let off = c * self.chunk;
        (off, self.chunk.min(self.bytes - off))
    }

    /// The result of chunk `c`'s `cudaMemcpyAsync` (of kind `kind`), with the forced failure
    /// of the `testing` feature.
    fn check_chunk(&self, c: usize, code: sys::cudaError_t, kind: &str) -> Result<()> {
        #[cfg(feature = "testing")]
        if self.fail_at == Some(c) {
            return Err(Error::Cuda {
                code: crate::ErrorCode(sys::cudaError::cudaErrorLaunchFailure.0),
                call: format!("cudaMemcpyAsync({kind}) (chunk {c}, forced by cuda_mem::testing)"),
            });
        }
        check(code, || {
            format!("cudaMemcpyAsync({kind}) (chunk {c} of a staged copy)")
        })
    }

    fn fail(&self, e: Error) {
        self.abort.store(true, Ordering::Relaxed);
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(e);
    }
}

/// Marks a worker's part of a job as finished, also when the worker unwinds: then the host
/// memory or the device memory might still be in use by its copies, and the caller's borrow
/// must not end: the process aborts instead.
struct PartDone<'a>(&'a Job);

impl Drop for PartDone<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::process::abort();
        }
        let mut left = self.0.left.lock().unwrap_or_else(|p| p.into_inner());
        *left -= 1;
        if *left == 0 {
            self.0.done.notify_all();
        }
    }
}

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
    config: StagingConfig,
    pool: PinnedPool,
    /// The worker the next job starts at, so that small concurrent copies spread out.
    next: std::sync::atomic::AtomicUsize,
}

/// Staging workers kept alive between copies; see the module docs. Dropping it stops and
/// joins them.
pub struct Stager {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Stager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("config", &self.shared.config)
            .finish()
    }
}

impl Stager {
    /// Starts `config.threads` workers, whose staging buffers come from `pool`.
    ///
    /// Errors: [`Misuse::InvalidArgument`] for a configuration out of range; the OS refusing
    /// a thread, as [`Misuse::InvalidArgument`] with its reason.
    pub fn new(config: StagingConfig, pool: PinnedPool) -> Result<Stager> {
        config.check()?;
        let shared = Arc::new(Shared {
            slots: (0..config.threads)
                .map(|_| Slot {
                    jobs: Mutex::new((VecDeque::new(), false)),
                    ready: Condvar::new(),
                })
                .collect(),
            config,
            pool,
            next: std::sync::atomic::AtomicUsize::new(0),
        });
        let mut stager = Stager {
            shared: shared.clone(),
            workers: Vec::new(),
        };
        for w in 0..config.threads {
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

    /// The process-wide stager with the default configuration and the global pinned pool,
    /// started on first use; `None` where its threads could not be started.
    pub fn global() -> Option<&'static Stager> {
        static GLOBAL: OnceLock<Option<Stager>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                Stager::new(StagingConfig::default(), PinnedPool::global().clone()).ok()
            })
            .as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> StagingConfig {
        self.shared.config
    }

    /// Copies all of `src` into `dst`, staged where one side is pageable host memory and the
    /// other device memory and the copy is at least [`StagingConfig::min_bytes`]; by the
    /// driver's path ([`copy`](crate::copy)) otherwise. Lengths must match.
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
        let Some(dir) =
            Dir::of(src.loc(), dst.loc()).filter(|_| plan.bytes >= self.shared.config.min_bytes)
        else {
            return copy::copy_planned(dst, src, plan);
        };
        // A slice of pinned memory (`as_slice()` of a pinned, mapped or registered buffer) is
        // copied faster by DMA in one step than through the staging buffers.
        let host = match dir {
            Dir::ToDevice => src.raw_ptr(),
            Dir::ToHost => dst.raw_ptr(),
        };
        if !is_pageable(host) {
            return copy::copy_planned(dst, src, plan);
        }
        self.copy_bytes(dst, src, &plan, dir)
    }

    fn copy_bytes<T, D, S>(&self, dst: &mut D, src: &S, plan: &Plan<T>, dir: Dir) -> Result<()>
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
        let c = self.shared.config;
        let chunk = c.chunk_for(bytes);
        let chunks = bytes.div_ceil(chunk);
        let parts = chunks.min(c.threads);
        let job = Arc::new(Job {
            dir,
            device: device.unwrap_or_else(current_ordinal),
            dev,
            host,
            bytes,
            chunk,
            parts,
            #[cfg(feature = "testing")]
            fail_at: forced_failure(),
            abort: AtomicBool::new(false),
            error: Mutex::new(None),
            left: Mutex::new(parts),
            done: Condvar::new(),
        });
        let n = self.shared.slots.len();
        let start = self.shared.next.fetch_add(parts, Ordering::Relaxed);
        for part in 0..parts {
            let slot = &self.shared.slots[(start + part) % n];
            let mut q = slot.jobs.lock().unwrap_or_else(|p| p.into_inner());
            q.0.push_back((job.clone(), part));
            slot.ready.notify_one();
        }
        // Every worker's part ends (`PartDone`) only after its copies have completed and it no
        // longer touches either side: the borrows of `dst` and `src` outlive them.
        let mut left = job.left.lock().unwrap_or_else(|p| p.into_inner());
        while *left > 0 {
            left = job.done.wait(left).unwrap_or_else(|p| p.into_inner());
        }
        drop(left);
        let err = job.error.lock().unwrap_or_else(|p| p.into_inner()).take();
        err.map_or(Ok(()), Err)
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        for slot in &self.shared.slots {
            let mut q = slot.jobs.lock().unwrap_or_else(|p| p.into_inner());
            q.1 = true;
            slot.ready.notify_one();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Copies all of `src` into `dst` through the process-wide [`Stager`] (see
/// [`Stager::copy`]): staged for pageable host memory to or from device memory of at least
/// [`StagingConfig::min_bytes`], the driver's path otherwise.
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
    match Stager::global() {
        Some(s) => s.copy(dst, src),
        None => super::copy(dst, src), // the driver's path (no stager)
    }
}

/// Whether host memory at `p` is ordinary pageable memory CUDA does not know
/// (`cudaPointerGetAttributes`: well under a microsecond, against the millisecond or more of
/// a copy large enough to stage). Pinned memory is better copied by DMA directly, and the
/// workers must not touch managed memory the GPU may be using. A slice lies in one
/// allocation, so its first element tells for all of it.
fn is_pageable<T>(p: *const T) -> bool {
    crate::handles::pointer::pointer_info(p)
        .is_ok_and(|i| i.kind == crate::PointerKind::UnregisteredHost)
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
    Dir::of(src, dst)?;
    static ENV_OFF: OnceLock<bool> = OnceLock::new();
    let env_off = *ENV_OFF
        .get_or_init(|| std::env::var_os("CUDA_MEM_STAGED_COPIES").is_some_and(|v| v == "0"));
    if env_off || !AUTO.load(Ordering::Relaxed) {
        return None;
    }
    // The threshold of the default configuration, known without starting the workers (and
    // without asking the OS for the core count on every copy).
    static MIN: OnceLock<usize> = OnceLock::new();
    let bytes = count.checked_mul(elem)?;
    if bytes < *MIN.get_or_init(|| StagingConfig::default().min_bytes) {
        return None;
    }
    Stager::global()
}

#[cfg(feature = "testing")]
fn forced_failure() -> Option<usize> {
    crate::testing::take_staged_failure()
}

/// A worker's stream and events on one device (raw handles, owned by the worker thread).
struct Lane {
    stream: sys::cudaStream_t,
    events: Vec<sys::cudaEvent_t>,
}

impl Lane {
    /// A stream and `depth` events on the calling thread's current device.
    fn new(depth: usize) -> Result<Lane> {
        let mut lane = Lane {
            stream: std::ptr::null_mut(),
            events: Vec::with_capacity(depth),
        };
        // SAFETY: plain runtime calls with valid out-pointers; on failure what was created
        // is destroyed by `Lane::drop`.
        unsafe {
            check(
                sys::cudaStreamCreateWithFlags(&mut lane.stream, sys::cudaStreamNonBlocking),
                || "cudaStreamCreateWithFlags(NonBlocking)".into(),
            )?;
            for _ in 0..depth {
                let mut e = std::ptr::null_mut();
                check(
                    sys::cudaEventCreateWithFlags(&mut e, sys::cudaEventDisableTiming),
                    || "cudaEventCreateWithFlags(DisableTiming)".into(),
                )?;
                lane.events.push(e);
            }
        }
        Ok(lane)
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // SAFETY: handles this lane created and nothing else uses; the stream is idle (every
        // job ends with a synchronize). Errors at exit are ignored.
        unsafe {
            for &e in &self.events {
                sys::cudaEventDestroy(e);
            }
            if !self.stream.is_null() {
                sys::cudaStreamDestroy(self.stream);
            }
        }
    }
}

fn worker(sh: &Shared, w: usize) {
    let mut lanes: HashMap<i32, Lane> = HashMap::new();
    loop {
        let (job, part) = {
            let slot = &sh.slots[w];
            let mut q = slot.jobs.lock().unwrap_or_else(|p| p.into_inner());
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
        if let Err(e) = run_part(sh, &job, part, &mut lanes) {
            job.fail(e);
        }
    }
}

fn run_part(sh: &Shared, job: &Job, w: usize, lanes: &mut HashMap<i32, Lane>) -> Result<()> {
    if job.abort.load(Ordering::Relaxed) {
        return Ok(());
    }
    // SAFETY: a plain runtime call; the worker thread's current device is its own business.
    check(unsafe { sys::cudaSetDevice(job.device) }, || {
        format!("cudaSetDevice({})", job.device)
    })?;
    let depth = sh.config.depth;
    let lane = match lanes.entry(job.device) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => v.insert(Lane::new(depth)?),
    };
    let mut bufs = Vec::with_capacity(depth);
    for _ in 0..depth {
        bufs.push(sh.pool.alloc::<u8>(job.chunk, HostAllocFlags::DEFAULT)?);
    }
    let ptrs: Vec<usize> = bufs.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
    let part = Part {
        job,
        w,
        lane,
        bufs: &ptrs,
        nt: sh.config.nt_stores,
    };
    let result = match job.dir {
        Dir::ToDevice => part.to_device(),
        Dir::ToHost => part.to_host(),
    };
    // Whatever happened, the staging buffers go back only once no copy uses them.
    // SAFETY: a live stream of this lane.
    let synced = check(unsafe { sys::cudaStreamSynchronize(lane.stream) }, || {
        "cudaStreamSynchronize(staging stream)".into()
    });
    if synced.is_err() {
        // A copy may still use the staging buffers and the caller's device memory. After a
        // sticky error the context is gone, and with it every copy: report it. Otherwise the
        // caller's borrow must not end while a copy may run: abort (as `scope` does).
        crate::error::abort_if_still_in_use(
            "cuda_mem::Stager",
            "a staged copy of the caller's memory",
            &synced,
        );
        // Leak the staging buffers rather than reuse them.
        bufs.into_iter().for_each(std::mem::forget);
    }
    result.and(synced)
}

/// One worker's part of a job: its chunks are `w`, `w + parts`, ...; its `i`-th chunk uses
/// staging buffer `i % depth` and event `i % depth` of its lane.
struct Part<'a> {
    job: &'a Job,
    w: usize,
    lane: &'a Lane,
    bufs: &'a [usize],
    nt: bool,
}

impl Part<'_> {
    fn len(&self) -> usize {
        self.job.part_len(self.w)
    }

    fn chunk(&self, i: usize) -> usize {
        self.job.part_chunk(self.w, i)
    }

    fn aborted(&self) -> bool {
        self.job.abort.load(Ordering::Relaxed)
    }

    /// Blocks until the copy queued through staging buffer `k` has completed.
    fn wait(&self, k: usize) -> Result<()> {
        // SAFETY: a live event of this lane.
        check(
            unsafe { sys::cudaEventSynchronize(self.lane.events[k]) },
            || "cudaEventSynchronize(staging buffer)".into(),
        )
    }

    /// Queues the copy of this part's `i`-th chunk between the caller's device memory and
    /// staging buffer `i % depth`, and records that buffer's event after it.
    ///
    /// # Safety
    /// The staging buffer is not touched by the CPU until that event has completed; for a
    /// copy to the device, its chunk is already in the staging buffer.
    unsafe fn queue(&self, i: usize) -> Result<()> {
        let (c, k) = (self.chunk(i), i % self.bufs.len());
        let (off, len) = self.job.span(c);
        let (dev, buf) = (
            (self.job.dev + off) as *mut c_void,
            self.bufs[k] as *mut c_void,
        );
        let (dst, src, kind, call) = match self.job.dir {
            Dir::ToDevice => (
                dev,
                buf,
                sys::cudaMemcpyKind::cudaMemcpyHostToDevice,
                "HostToDevice",
            ),
            Dir::ToHost => (
                buf,
                dev,
                sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
                "DeviceToHost",
            ),
        };
        // SAFETY: the device range lies inside the caller's device memory (borrowed until this
        // part is done, its pending work waited for); the staging buffer holds `chunk >= len`
        // pinned bytes that only this copy uses until its event completes (the caller's
        // promise); the stream is this lane's.
        let code = unsafe { sys::cudaMemcpyAsync(dst, src, len, kind, self.lane.stream) };
        self.job.check_chunk(c, code, call)?;
        // SAFETY: live event and stream of this lane.
        let code = unsafe { sys::cudaEventRecord(self.lane.events[k], self.lane.stream) };
        check(code, || "cudaEventRecord(staging buffer)".into())
    }

    /// Host memory of this part's `i`-th chunk, and its staging buffer.
    fn host_and_buf(&self, i: usize) -> (usize, usize, usize) {
        let (off, len) = self.job.span(self.chunk(i));
        (self.job.host + off, self.bufs[i % self.bufs.len()], len)
    }

    /// Each chunk: wait until its staging buffer is free, fill it on the CPU, queue its copy.
    fn to_device(&self) -> Result<()> {
        let depth = self.bufs.len();
        for i in 0..self.len() {
            if self.aborted() {
                break;
            }
            if i >= depth {
                self.wait(i % depth)?;
            }
            let (host, buf, len) = self.host_and_buf(i);
            // SAFETY: the host range lies inside the caller's source, borrowed until this part
            // is done; the staging buffer holds `chunk >= len` bytes and no copy reads it any
            // more (its previous copy's event completed above, or it was never used).
            unsafe { host_copy(buf as *mut u8, host as *const u8, len, self.nt) };
            // SAFETY: the chunk is in the staging buffer, which the CPU leaves alone until the
            // copy's event has completed (the wait above, `depth` chunks later).
            unsafe { self.queue(i)? };
        }
        Ok(())
    }

    /// The first `depth` chunks queued; then each: wait for it, copy it out on the CPU, and
    /// queue the chunk `depth` later into the same staging buffer.
    fn to_host(&self) -> Result<()> {
        let (n, depth) = (self.len(), self.bufs.len());
        for i in 0..depth.min(n) {
            // SAFETY: the CPU reads staging buffer `i` only after waiting for its event below.
            unsafe { self.queue(i)? };
        }
        for i in 0..n {
            if self.aborted() {
                break;
            }
            self.wait(i % depth)?;
            let (host, buf, len) = self.host_and_buf(i);
            // SAFETY: the staging buffer's copy has completed (event above); the host range
            // lies inside the caller's destination, borrowed mutably until this part is done,
            // and no other worker writes this chunk.
            unsafe { host_copy(host as *mut u8, buf as *const u8, len, self.nt) };
            if i + depth < n {
                // SAFETY: the CPU is done with this staging buffer (the copy just above) and
                // reads it again only after waiting for the new event.
                unsafe { self.queue(i + depth)? };
            }
        }
        Ok(())
    }
}

/// Copies `len` bytes; with `nt`, large copies use non-temporal stores where the CPU has
/// AVX2.
///
/// # Safety
/// As `copy_nonoverlapping`: both ranges valid for `len` bytes and not overlapping.
pub(crate) unsafe fn host_copy(dst: *mut u8, src: *const u8, len: usize, nt: bool) {
    #[cfg(target_arch = "x86_64")]
    if nt && len >= 64 * 1024 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked); the caller's promise covers the ranges.
        unsafe { nt::copy(dst, src, len) };
        return;
    }
    let _ = nt;
    // SAFETY: the caller's promise.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cfg(target_arch = "x86_64")]
mod nt {
    use std::arch::x86_64::*;

    /// A copy whose destination is written with 32-byte non-temporal stores (no
    /// read-for-ownership of the destination, which is not cached afterwards).
    ///
    /// # Safety
    /// AVX2 present; both ranges valid for `len` bytes and not overlapping.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: every access is inside `dst..dst + len` or `src..src + len` (the caller's
        // promise); the stores are to 32-byte aligned addresses (`head` makes `d` aligned);
        // loads are unaligned loads.
        unsafe {
            let head = dst.align_offset(32).min(len);
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (mut d, mut s, mut n) = (dst.add(head), src.add(head), len - head);
            while n >= 128 {
                let a = _mm256_loadu_si256(s.cast());
                let b = _mm256_loadu_si256(s.add(32).cast());
                let c = _mm256_loadu_si256(s.add(64).cast());
                let e = _mm256_loadu_si256(s.add(96).cast());
                _mm256_stream_si256(d.cast(), a);
                _mm256_stream_si256(d.add(32).cast(), b);
                _mm256_stream_si256(d.add(64).cast(), c);
                _mm256_stream_si256(d.add(96).cast(), e);
                d = d.add(128);
                s = s.add(128);
                n -= 128;
            }
            std::ptr::copy_nonoverlapping(s, d, n);
            // Make the streamed stores visible before the DMA engine (or another thread)
            // reads the buffer.
            _mm_sfence();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "the non-temporal path is inline asm (vmovntdq), which Miri cannot run; \
                  Miri reports no AVX2, leaving a plain copy that takes a minute"
    )]
    fn host_copy_is_exact_at_odd_lengths_and_offsets() {
        // (Sizes just past the 64 KiB non-temporal threshold: Miri runs this too.)
        let src: Vec<u8> = (0..140_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for (so, dof, len) in [
            (0, 0, 140_000 - 1),
            (3, 5, 65_536 + 77),
            (1, 31, 100_001),
            (0, 0, 10),
        ] {
            let mut dst = vec![0u8; 140_064];
            // SAFETY: both ranges lie inside their vectors and do not overlap.
            unsafe { host_copy(dst.as_mut_ptr().add(dof), src.as_ptr().add(so), len, true) };
            assert_eq!(&dst[dof..dof + len], &src[so..so + len]);
            assert!(dst[..dof].iter().all(|&b| b == 0));
            assert!(dst[dof + len..].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn config_out_of_range_is_refused() {
        let ok = StagingConfig::default();
        assert!(ok.check().is_ok());
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
        }
    }

    #[test]
    fn chunks_scale_with_the_copy_within_bounds() {
        let c = StagingConfig {
            threads: 16,
            chunk_bytes: 4 << 20,
            min_chunk_bytes: 256 << 10,
            chunks_per_thread: 8,
            ..StagingConfig::default()
        };
        assert_eq!(c.chunk_for(1 << 20), 256 << 10);
        // Any config, even one `check` refuses, gives a chunk without panicking.
        let odd = StagingConfig {
            threads: usize::MAX,
            chunks_per_thread: usize::MAX,
            min_chunk_bytes: 8 << 20,
            chunk_bytes: 4096,
            ..c
        };
        assert_eq!(odd.chunk_for(usize::MAX), 4096);
        assert_eq!(c.chunk_for(256 << 20), 2 << 20);
        assert_eq!(c.chunk_for(1 << 30), 4 << 20);
        assert_eq!(c.chunk_for((64 << 20) + 1), 512 << 10);
        assert_eq!(
            c.chunk_for(100 << 20),
            (800 << 10) - (800 << 10) % (64 << 10) + (64 << 10)
        );
    }

    #[test]
    fn chunks_cover_the_copy_once() {
        let job = Job {
            dir: Dir::ToDevice,
            device: 0,
            dev: 0,
            host: 0,
            // Under Miri a tenth of the bytes, still 25 chunks and a short last one.
            bytes: if cfg!(miri) { 10_003 } else { 100_003 },
            chunk: if cfg!(miri) { 409 } else { 4096 },
            parts: 3,
            #[cfg(feature = "testing")]
            fail_at: None,
            abort: AtomicBool::new(false),
            error: Mutex::new(None),
            left: Mutex::new(3),
            done: Condvar::new(),
        };
        let mut seen = vec![0u8; job.bytes];
        for w in 0..job.parts {
            for i in 0..job.part_len(w) {
                let (off, len) = job.span(job.part_chunk(w, i));
                seen[off..off + len].iter_mut().for_each(|b| *b += 1);
            }
        }
        assert!(seen.iter().all(|&b| b == 1));
    }
}
