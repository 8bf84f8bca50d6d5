//! One staged copy's chunk pipeline: the [`Job`] the workers share, and each worker's part
//! of it, run through a [`Lane`] (a stream and an event per staging slot on one device).
//!
//! A part's chunks are `w`, `w + parts`, ...; its `i`-th chunk uses staging slot `i % depth`
//! (a slice of one pinned block from the pool) and that slot's event. To the device: wait
//! until the slot's previous copy is done, fill it on the CPU, queue its copy. To the host:
//! queue the first `depth` chunks, then for each: wait for it, copy it out on the CPU, and
//! queue the chunk `depth` later into the same slot.

use std::collections::HashMap;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use cuda_mem_sys as sys;

use super::memcpy::host_copy;
use super::{lock, Dir};
use crate::alloc::pinned_pool::PinnedPool;
use crate::error::{check, Error, Result};
use crate::handles::devices::Device;
use crate::handles::event::Event;
use crate::handles::flags::HostAllocFlags;
use crate::handles::stream::Stream;

/// What one staged copy does: the caller's addresses and how the copy is cut and run.
#[derive(Debug, Clone, Copy)]
pub(super) struct JobParams {
    pub(super) dir: Dir,
    pub(super) device: i32,
    /// Device address and host address of byte 0, and the length.
    pub(super) dev: usize,
    pub(super) host: usize,
    pub(super) bytes: usize,
    /// Bytes per chunk (at most `slot`).
    pub(super) chunk: usize,
    /// Workers taking part: worker `w` copies chunks `w`, `w + parts`, ...
    pub(super) parts: usize,
    /// Staging slots per part, and bytes per slot (the block each part takes from the pool
    /// is `depth * slot` bytes, whatever the chunk, so that one cached block serves every
    /// chunk size up to `slot`).
    pub(super) depth: usize,
    pub(super) slot: usize,
    /// Non-temporal stores for the CPU's copy of each chunk.
    pub(super) nt: bool,
}

/// One staged copy, shared by the workers that take part.
pub(super) struct Job {
    pub(super) p: JobParams,
    /// A forced failure at this chunk (the `testing` feature).
    #[cfg(feature = "testing")]
    pub(super) fail_at: Option<usize>,
    pub(super) abort: AtomicBool,
    pub(super) error: Mutex<Option<Error>>,
    pub(super) left: Mutex<usize>,
    pub(super) done: Condvar,
}

impl Job {
    pub(super) fn new(p: JobParams) -> Job {
        Job {
            p,
            #[cfg(feature = "testing")]
            fail_at: None,
            abort: AtomicBool::new(false),
            error: Mutex::new(None),
            left: Mutex::new(p.parts),
            done: Condvar::new(),
        }
    }

    pub(super) fn chunks(&self) -> usize {
        self.p.bytes.div_ceil(self.p.chunk)
    }

    /// How many chunks part `w` (< `parts`) copies.
    pub(super) fn part_len(&self, w: usize) -> usize {
        (self.chunks() - w).div_ceil(self.p.parts)
    }

    /// The chunk that is the `i`-th of part `w`.
    pub(super) fn part_chunk(&self, w: usize, i: usize) -> usize {
        w + i * self.p.parts
    }

    /// Byte offset and length of chunk `c`.
    pub(super) fn span(&self, c: usize) -> (usize, usize) {
        let off = c * self.p.chunk;
        (off, self.p.chunk.min(self.p.bytes - off))
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

    pub(super) fn fail(&self, e: Error) {
        self.abort.store(true, Ordering::Relaxed);
        let mut slot = lock(&self.error);
        slot.get_or_insert(e);
    }

    /// Blocks until every part has finished; the first error of any part.
    pub(super) fn wait(&self) -> Result<()> {
        let mut left = lock(&self.left);
        while *left > 0 {
            left = self.done.wait(left).unwrap_or_else(|p| p.into_inner());
        }
        drop(left);
        let err = lock(&self.error).take();
        err.map_or(Ok(()), Err)
    }
}

/// Marks a worker's part of a job as finished, also when the worker unwinds: then the host
/// memory or the device memory might still be in use by its copies, and the caller's borrow
/// must not end: the process aborts instead.
pub(super) struct PartDone<'a>(pub(super) &'a Job);

impl Drop for PartDone<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::process::abort();
        }
        let mut left = lock(&self.0.left);
        *left -= 1;
        if *left == 0 {
            self.0.done.notify_all();
        }
    }
}

/// A worker's stream and one event per staging slot on one device, made on first use there
/// and kept by the worker thread.
pub(super) struct Lane {
    stream: Stream,
    events: Vec<Event>,
}

impl Lane {
    /// A non-blocking stream on `device`, with no events yet.
    fn new(device: Device) -> Result<Lane> {
        Ok(Lane {
            stream: Stream::on(device, true)?,
            events: Vec::new(),
        })
    }

    /// Makes sure of `depth` events, one per slot.
    fn events(&mut self, depth: usize) -> Result<()> {
        while self.events.len() < depth {
            self.events.push(Event::on(self.stream.device())?);
        }
        Ok(())
    }
}

/// A worker's lanes, one per device it staged copies for.
pub(super) type Lanes = HashMap<i32, Lane>;

/// Runs part `w` of `job` on this worker: its staging block from `pool`, its lane for the
/// job's device. Every queued copy has completed when this returns (or the process aborts).
pub(super) fn run_part(pool: &PinnedPool, job: &Job, w: usize, lanes: &mut Lanes) -> Result<()> {
    if job.abort.load(Ordering::Relaxed) {
        return Ok(());
    }
    let p = job.p;
    // SAFETY: a plain runtime call; the worker thread's current device is its own business.
    check(unsafe { sys::cudaSetDevice(p.device) }, || {
        format!("cudaSetDevice({})", p.device)
    })?;
    let lane = match lanes.entry(p.device) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(Lane::new(Device::from_ordinal_unchecked(p.device))?)
        }
    };
    lane.events(p.depth)?;
    let mut block = pool.alloc::<u8>(p.depth * p.slot, HostAllocFlags::DEFAULT)?;
    let base = block.as_mut_ptr() as usize;
    let slots: Vec<usize> = (0..p.depth).map(|k| base + k * p.slot).collect();
    let part = Part {
        job,
        w,
        lane,
        slots: &slots,
    };
    let result = match p.dir {
        Dir::ToDevice => part.to_device(),
        Dir::ToHost => part.to_host(),
    };
    // Whatever happened, the staging block goes back only once no copy uses it.
    let synced = lane.stream.synchronize();
    if synced.is_err() {
        // A copy may still use the staging block and the caller's device memory. After a
        // sticky error the context is gone, and with it every copy: report it. Otherwise the
        // caller's borrow must not end while a copy may run: abort (as `scope` does).
        crate::error::abort_if_still_in_use(
            "cuda_mem::Stager",
            "a staged copy of the caller's memory",
            &synced,
        );
        // Leak the staging block rather than reuse it.
        std::mem::forget(block);
    }
    result.and(synced)
}

/// One worker's part of a job.
struct Part<'a> {
    job: &'a Job,
    w: usize,
    lane: &'a Lane,
    /// The staging slots' addresses.
    slots: &'a [usize],
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

    /// Blocks until the copy queued through staging slot `k` has completed.
    fn wait(&self, k: usize) -> Result<()> {
        self.lane.events[k].synchronize()
    }

    /// Queues the copy of this part's `i`-th chunk between the caller's device memory and
    /// staging slot `i % depth`, and records that slot's event after it.
    ///
    /// # Safety
    /// The staging slot is not touched by the CPU until that event has completed; for a copy
    /// to the device, its chunk is already in the slot.
    unsafe fn queue(&self, i: usize) -> Result<()> {
        let (c, k) = (self.chunk(i), i % self.slots.len());
        let (off, len) = self.job.span(c);
        let (dev, buf) = (
            (self.job.p.dev + off) as *mut c_void,
            self.slots[k] as *mut c_void,
        );
        let (dst, src, kind, call) = match self.job.p.dir {
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
        // part is done, its pending work waited for); the staging slot holds `slot >= len`
        // pinned bytes that only this copy uses until its event completes (the caller's
        // promise); the stream is this lane's, alive while the lane is.
        let code = unsafe { sys::cudaMemcpyAsync(dst, src, len, kind, self.lane.stream.as_raw()) };
        self.job.check_chunk(c, code, call)?;
        self.lane.events[k].record(&self.lane.stream)
    }

    /// Host memory of this part's `i`-th chunk, its staging slot, and its length.
    fn host_and_slot(&self, i: usize) -> (usize, usize, usize) {
        let (off, len) = self.job.span(self.chunk(i));
        (self.job.p.host + off, self.slots[i % self.slots.len()], len)
    }

    /// Each chunk: wait until its staging slot is free, fill it on the CPU, queue its copy.
    fn to_device(&self) -> Result<()> {
        let depth = self.slots.len();
        for i in 0..self.len() {
            if self.aborted() {
                break;
            }
            if i >= depth {
                self.wait(i % depth)?;
            }
            let (host, slot, len) = self.host_and_slot(i);
            // SAFETY: the host range lies inside the caller's source, borrowed until this part
            // is done; the staging slot holds `slot >= len` bytes and no copy reads it any more
            // (its previous copy's event completed above, or it was never used).
            unsafe { host_copy(slot as *mut u8, host as *const u8, len, self.job.p.nt) };
            // SAFETY: the chunk is in the staging slot, which the CPU leaves alone until the
            // copy's event has completed (the wait above, `depth` chunks later).
            unsafe { self.queue(i)? };
        }
        Ok(())
    }

    /// The first `depth` chunks queued; then each: wait for it, copy it out on the CPU, and
    /// queue the chunk `depth` later into the same staging slot.
    fn to_host(&self) -> Result<()> {
        let (n, depth) = (self.len(), self.slots.len());
        for i in 0..depth.min(n) {
            // SAFETY: the CPU reads staging slot `i` only after waiting for its event below.
            unsafe { self.queue(i)? };
        }
        for i in 0..n {
            if self.aborted() {
                break;
            }
            self.wait(i % depth)?;
            let (host, slot, len) = self.host_and_slot(i);
            // SAFETY: the staging slot's copy has completed (event above); the host range lies
            // inside the caller's destination, borrowed mutably until this part is done, and
            // no other worker writes this chunk.
            unsafe { host_copy(host as *mut u8, slot as *const u8, len, self.job.p.nt) };
            if i + depth < n {
                // SAFETY: the CPU is done with this staging slot (the copy just above) and
                // reads it again only after waiting for the new event.
                unsafe { self.queue(i + depth)? };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_copy_once() {
        // Under Miri a tenth of the bytes, still 25 chunks and a short last one.
        let (bytes, chunk) = if cfg!(miri) {
            (10_003, 409)
        } else {
            (100_003, 4096)
        };
        let job = Job::new(JobParams {
            dir: Dir::ToDevice,
            device: 0,
            dev: 0,
            host: 0,
            bytes,
            chunk,
            parts: 3,
            depth: 2,
            slot: chunk,
            nt: false,
        });
        let mut seen = vec![0u8; bytes];
        for w in 0..job.p.parts {
            for i in 0..job.part_len(w) {
                let (off, len) = job.span(job.part_chunk(w, i));
                seen[off..off + len].iter_mut().for_each(|b| *b += 1);
            }
        }
        assert!(seen.iter().all(|&b| b == 1));
    }
}
