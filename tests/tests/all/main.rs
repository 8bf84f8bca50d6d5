//! Integration tests of cuda-mem against the installed toolkit: one executable, one module per
//! area. GPU tests skip with a visible `SKIP` line when no device is present, and fail instead
//! when `CUDA_MEM_REQUIRE_GPU=1`.
//!
//! Run them one at a time on a GPU (`--test-threads=1`): the leak and out-of-memory tests read
//! device-wide free memory.

mod alignment;
mod concurrency;
mod copies;
mod device;
mod differential;
mod errors;
mod faults;
mod graph;
mod holes;
mod host_speed;
mod hot;
mod interop;
mod ipc;
mod launch;
mod leaks;
mod managed;
mod mapped;
mod misuse;
mod multi_gpu;
mod pinned;
mod pool;
mod pool_threads;
mod readme;
mod readme_snippets;
mod registered;
mod review;
mod review3;
mod review4;
mod review5;
mod review6;
mod review7;
mod soundness;
mod staged;
mod views;

use std::time::Duration;

/// How long a slow kernel (`cm_spin`) holds a stream, in ns: work queued behind it is certainly
/// still pending at the test's next step (and well above the 100 ms that issue 11 asks a
/// pooled drop not to wait for).
pub const SPIN: u64 = 300_000_000;
/// A call that returns within this did not wait for a stream held for [`SPIN`].
pub const QUICK: Duration = Duration::from_millis(50);

/// `K` non-blocking streams (panics, as a test does, where one cannot be made).
pub fn streams<const K: usize>() -> [cuda_mem::Stream; K] {
    std::array::from_fn(|_| cuda_mem::Stream::non_blocking().unwrap())
}

/// A pattern that differs per element and per `seed`, so stale data never matches.
pub fn pattern(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
        .collect()
}

/// The first element that is not what `cm_write` (`cuda_mem_probes::Probes::write`) writes:
/// `i / 4` in `u32` element `i`.
pub fn first_not_written(got: &[u32]) -> Option<(usize, u32)> {
    got.iter()
        .enumerate()
        .find(|&(i, &v)| v != (i / 4) as u32)
        .map(|(i, &v)| (i, v))
}
