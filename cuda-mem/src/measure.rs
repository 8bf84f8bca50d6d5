//! Measurement entry points, compiled only with the `measure` feature, for the `cuda-mem`
//! command line (`cuda-mem bench`) and the `pool_bookkeeping` example: the library's own
//! bookkeeping alone, around raw calls the caller makes ([`FencePair`], [`PoolPair`],
//! [`detached_pool_pairs`]), the host copy of staged copies ([`host_copy`]), and the phases of
//! cold pinning ([`set_populate_mode`], [`last_pin_phases`]).
//!
//! Nothing here forces a failure or changes what the library does: enabling the feature only
//! adds these functions, and of them only [`set_populate_mode`] changes anything when called
//! (how pinning faults pages in, not what it returns). The fault seams are the `testing`
//! feature's, which a measuring program leaves off.

use std::os::raw::c_void;

use crate::error::Result;

/// How graph launches on the crate's own streams are made: `cuGraphLaunch` (the driver's,
/// called straight) where the runtime gave its entry point, else `cudaGraphLaunch`.
pub fn graph_launch_call() -> &'static str {
    if crate::handles::driver::launches_through_driver() {
        "cuGraphLaunch"
    } else {
        "cudaGraphLaunch"
    }
}

/// The cuda-mem features this build of the library was compiled with (of `cudarc`,
/// `cudarc-unpinned`, `measure`, `testing`), for a measuring program to report: a build with
/// `testing` carries the fault seams, and is not what an application links.
pub fn library_features() -> Vec<&'static str> {
    [
        ("cudarc", cfg!(feature = "cudarc")),
        ("cudarc-unpinned", cfg!(feature = "cudarc-unpinned")),
        ("measure", cfg!(feature = "measure")),
        ("testing", cfg!(feature = "testing")),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect()
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
        crate::fence::Fence::check_queue(stream)?;
        let _s = self.src.begin_checked(stream, (0, bytes), Access::Read)?;
        let _d = self.dst.begin_checked(stream, (0, bytes), Access::Write)?;
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
            crate::alloc::pool::alloc_with(&self.pool, bytes, &self.stream, "PoolPair", alloc)?;
        let freed =
            crate::alloc::pool::Pooled::free_with(ptr.as_ptr(), bytes, &mut fence, |p, _| free(p));
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
            // (Not 0, 1 or 2, which name the legacy and per-thread default streams.)
            std::ptr::NonNull::<u64>::dangling().as_ptr().cast(),
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

/// The host copy a staged copy uses for its chunks (non-temporal stores with `nt`, where the
/// CPU has AVX2), for `cuda-mem bench` to measure the host memcpy ceiling with it.
/// `dst` and `src` must have the same length (the shorter one bounds the copy).
pub fn host_copy(dst: &mut [u8], src: &[u8], nt: bool) {
    let len = dst.len().min(src.len());
    // SAFETY: both ranges are `len` bytes of distinct slices (a `&mut` cannot alias a `&`).
    unsafe { crate::transfer::staged::host_copy(dst.as_mut_ptr(), src.as_ptr(), len, nt) };
}

/// How mapped-and-registered pinning ([`PinStrategy::MapRegister`](crate::PinStrategy))
/// faults pages in: 0 one write per page (the library's way), 1
/// `madvise(MADV_POPULATE_WRITE)`, 2 `MAP_POPULATE` (one thread, in the kernel).
/// Process-wide, for `cuda-mem bench`.
pub fn set_populate_mode(mode: u8) {
    crate::alloc::pinning::POPULATE.store(mode.min(2), std::sync::atomic::Ordering::Relaxed);
}

/// Map, populate and register time of this thread's last mapped-and-registered block.
pub fn last_pin_phases() -> [std::time::Duration; 3] {
    crate::alloc::pinning::last_phases()
}

#[cfg(test)]
mod tests {
    /// The stand-in pairs run on any machine: their bookkeeping makes no runtime call (one
    /// would fail here without a driver, or be refused for the stand-in handles with one).
    #[test]
    fn detached_pool_pairs_need_no_runtime() {
        super::detached_pool_pairs(100, 4096).unwrap();
    }

    /// The features reported are the ones compiled: `measure` always (this module exists
    /// only with it), `testing` exactly when its seams are compiled in.
    #[test]
    fn library_features_match_the_build() {
        let f = super::library_features();
        assert!(f.contains(&"measure"));
        assert_eq!(f.contains(&"testing"), cfg!(feature = "testing"));
    }
}
