//! Test seams, compiled only with the `testing` feature, which cuda-mem's own test crates
//! enable: they force failure paths that a healthy GPU never takes. Not for use elsewhere.
//!
//! Every seam is per thread (it affects only calls made on the thread that set it), so that
//! tests running in parallel do not see each other's failures.

use std::cell::Cell;
use std::os::raw::c_void;

use bytemuck::Pod;

use crate::error::{Error, ErrorCode, Result};
use crate::mapped::MappedBuffer;
use crate::pinned::HostAllocFlags;

thread_local! {
    static FAIL_RECORDS: Cell<u32> = const { Cell::new(0) };
    static FAIL_SYNCS: Cell<u32> = const { Cell::new(0) };
    static NO_CONCURRENT_MANAGED: Cell<bool> = const { Cell::new(false) };
    static FAIL_STAGED_CHUNK: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Makes the next staged copy started on this thread fail at chunk `chunk` (its
/// `cudaMemcpyAsync` is queued, then reported failed), as a failure midway would.
pub fn fail_next_staged_copy_at(chunk: usize) {
    FAIL_STAGED_CHUNK.with(|c| c.set(Some(chunk)));
}

pub(crate) fn take_staged_failure() -> Option<usize> {
    FAIL_STAGED_CHUNK.with(Cell::take)
}

/// Makes the next `n` event records that fences make on this thread fail with
/// `cudaErrorInvalidResourceHandle`, before any runtime call.
pub fn fail_next_fence_records(n: u32) {
    FAIL_RECORDS.with(|c| c.set(n));
}

/// How many forced record failures are still pending on this thread.
pub fn pending_fence_record_failures() -> u32 {
    FAIL_RECORDS.with(Cell::get)
}

/// Makes the next `n` host waits (event or stream synchronizations) that fences make on this
/// thread fail with `cudaErrorLaunchFailure`, before any runtime call. Reset with `0`.
pub fn fail_next_fence_syncs(n: u32) {
    FAIL_SYNCS.with(|c| c.set(n));
}

fn take(cell: &'static std::thread::LocalKey<Cell<u32>>) -> bool {
    cell.with(|c| match c.get() {
        0 => false,
        n => {
            c.set(n - 1);
            true
        }
    })
}

fn forced(code: crate::sys::cudaError, call: &str) -> Error {
    Error::Cuda {
        code: ErrorCode(code.0),
        call: format!("{call} (forced by cuda_mem::testing)"),
    }
}

pub(crate) fn maybe_fail_record() -> Result<()> {
    if take(&FAIL_RECORDS) {
        return Err(forced(
            crate::sys::cudaError::cudaErrorInvalidResourceHandle,
            "cudaEventRecord",
        ));
    }
    Ok(())
}

pub(crate) fn maybe_fail_sync() -> Result<()> {
    if take(&FAIL_SYNCS) {
        return Err(forced(
            crate::sys::cudaError::cudaErrorLaunchFailure,
            "cudaEventSynchronize",
        ));
    }
    Ok(())
}

/// Managed buffers allocated on this thread from now on behave as on a device without
/// `cudaDevAttrConcurrentManagedAccess` (Windows, pre-Pascal GPUs, some Jetsons), whatever
/// the device says.
pub fn assume_no_concurrent_managed_access(on: bool) {
    NO_CONCURRENT_MANAGED.with(|c| c.set(on));
}

pub(crate) fn no_concurrent_managed_access() -> bool {
    NO_CONCURRENT_MANAGED.with(Cell::get)
}

/// Two fences alone, for measuring what the bookkeeping of one asynchronous copy costs on a
/// machine, beside the runtime call it accompanies (`cuda-mem bench`'s ablation rows).
#[derive(Debug, Default)]
pub struct FencePair {
    src: crate::fence::Fence,
    dst: crate::fence::Fence,
}

impl FencePair {
    /// New, idle fences.
    pub fn new() -> Self {
        Self::default()
    }

    /// What `copy_async` does to its two fences around the runtime call `queue`.
    pub fn around<R>(
        &self,
        stream: &crate::Stream,
        bytes: usize,
        queue: impl FnOnce() -> R,
    ) -> Result<R> {
        use crate::fence::Access;
        let _s = self.src.begin(stream, (0, bytes), Access::Read)?;
        let _d = self.dst.begin(stream, (0, bytes), Access::Write)?;
        Ok(queue())
    }
}

/// The host bookkeeping of one pooled allocation and its free
/// ([`DeviceBuffer::from_pool`](crate::DeviceBuffer::from_pool) and its drop: the pool handle
/// the buffer keeps, its fence with the allocation stream and the allocation's mark, the free
/// ordered after it) around raw calls that the caller makes, for `cuda-mem bench`'s ablation row: its
/// overhead over the raw calls alone is the bookkeeping's share of the pooled buffer's.
#[derive(Debug)]
pub struct PoolPair {
    pool: crate::MemPool,
    stream: crate::Stream,
}

impl PoolPair {
    /// Bookkeeping for allocations from `pool` on `stream`.
    pub fn new(pool: &crate::MemPool, stream: &crate::Stream) -> Self {
        PoolPair {
            pool: pool.clone(),
            stream: crate::Stream::from_inner(stream.inner().clone()),
        }
    }

    /// One pair: `alloc` (the caller's `cudaMallocFromPoolAsync` on the pool and stream) with
    /// our allocation bookkeeping, then `free` of its pointer (the caller's `cudaFreeAsync` on
    /// the stream) with our free bookkeeping, as a pooled buffer does them.
    pub fn around(
        &self,
        bytes: usize,
        alloc: impl Fn() -> Result<*mut c_void>,
        free: impl FnOnce(*mut c_void) -> Result<()>,
    ) -> Result<()> {
        let (ptr, pooled, mut fence) =
            crate::pool::alloc_with(&self.pool, bytes, &self.stream, "PoolPair", alloc)?;
        let freed = crate::pool::Pooled::free_with(ptr.as_ptr(), bytes, &mut fence, |p, _| free(p));
        drop(fence);
        drop(pooled);
        freed
    }
}

/// Runs `pairs` allocation + free pairs of [`PoolPair`] bookkeeping with stand-in runtime
/// calls, on a stand-in pool and stream whose handles never reach the runtime (one stream
/// only: its fence never records an event), and returns the time they took. Needs no GPU: it
/// times the host bookkeeping of pooled buffers alone, on any machine.
pub fn detached_pool_pairs(pairs: u32, bytes: usize) -> Result<std::time::Duration> {
    // SAFETY: the dangling handle never reaches the runtime: it is not the legacy stream's
    // (so `enter` makes no call), the fences of the pairs below only ever hold this one stream
    // (nothing is recorded or waited for), and the stand-in calls cannot fail (so the pool is
    // never trimmed). Not owned: never destroyed.
    let stream = unsafe {
        crate::Stream::from_raw(
            std::ptr::NonNull::dangling().as_ptr(),
            crate::Device::from_ordinal_unchecked(0),
        )
    };
    let pair = PoolPair {
        pool: crate::MemPool::detached(),
        stream,
    };
    let fake: *mut c_void = std::ptr::NonNull::<u64>::dangling().as_ptr().cast();
    let t = std::time::Instant::now();
    for _ in 0..pairs {
        pair.around(
            std::hint::black_box(bytes),
            || Ok(std::hint::black_box(fake)),
            |p| {
                std::hint::black_box(p);
                Ok(())
            },
        )?;
    }
    Ok(t.elapsed())
}

/// [`alloc_mapped_uva`](crate::alloc_mapped_uva) with the device-pointer lookup replaced, so
/// that tests can force its failure paths (a lookup error, a pointer mismatch) and check that
/// the host allocation was freed.
pub fn alloc_mapped_uva_with<T: Pod>(
    len: usize,
    resolve: impl FnOnce(*mut std::os::raw::c_void) -> Result<*mut std::os::raw::c_void>,
) -> Result<MappedBuffer<T>> {
    MappedBuffer::with_resolver(
        len,
        HostAllocFlags::DEFAULT,
        true,
        resolve,
        "alloc_mapped_uva",
    )
}

/// The host copy a staged copy uses for its chunks (non-temporal stores with `nt`, where the
/// CPU has AVX2), for `cuda-mem bench` to measure the host memcpy ceiling with it.
/// `dst` and `src` must have the same length (the shorter one bounds the copy).
pub fn host_copy(dst: &mut [u8], src: &[u8], nt: bool) {
    let len = dst.len().min(src.len());
    // SAFETY: both ranges are `len` bytes of distinct slices (a `&mut` cannot alias a `&`).
    unsafe { crate::staged::host_copy(dst.as_mut_ptr(), src.as_ptr(), len, nt) };
}

/// How mapped-and-registered pinning ([`PinStrategy::MapRegister`](crate::PinStrategy))
/// faults pages in: 0 one write per page (the library's way), 1
/// `madvise(MADV_POPULATE_WRITE)`, 2 `MAP_POPULATE` (one thread, in the kernel).
/// Process-wide, for `cuda-mem bench`.
pub fn set_populate_mode(mode: u8) {
    crate::pinning::POPULATE.store(mode.min(2), std::sync::atomic::Ordering::Relaxed);
}

/// Map, populate and register time of this thread's last mapped-and-registered block.
pub fn last_pin_phases() -> [std::time::Duration; 3] {
    crate::pinning::last_phases()
}

#[cfg(test)]
mod tests {
    /// The stand-in pairs run on any machine: their bookkeeping makes no runtime call (one
    /// would fail here without a driver, or be refused for the stand-in handles with one).
    #[test]
    fn detached_pool_pairs_need_no_runtime() {
        super::detached_pool_pairs(100, 4096).unwrap();
    }
}
