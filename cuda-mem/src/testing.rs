//! Test seams, compiled only with the `testing` feature, which cuda-mem's own test crates
//! enable: they force failure paths that a healthy GPU never takes. Not for use elsewhere.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use bytemuck::Pod;

use crate::error::{Error, ErrorCode, Result};
use crate::mapped::MappedBuffer;
use crate::pinned::HostAllocFlags;

static FAIL_RECORDS: AtomicU32 = AtomicU32::new(0);
static NO_CONCURRENT_MANAGED: AtomicBool = AtomicBool::new(false);

/// Makes the next `n` event records of the fences (in any thread) fail with
/// `cudaErrorInvalidResourceHandle`, before any runtime call.
pub fn fail_next_fence_records(n: u32) {
    FAIL_RECORDS.store(n, Ordering::SeqCst);
}

/// How many forced failures are still pending.
pub fn pending_fence_record_failures() -> u32 {
    FAIL_RECORDS.load(Ordering::SeqCst)
}

pub(crate) fn maybe_fail_record() -> Result<()> {
    let took = FAIL_RECORDS
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if took {
        return Err(Error::Cuda {
            code: ErrorCode(crate::sys::cudaError::cudaErrorInvalidResourceHandle.0),
            call: "cudaEventRecord (forced by cuda_mem::testing)".into(),
        });
    }
    Ok(())
}

/// From now on, managed buffers allocated in this process behave as on a device without
/// `cudaDevAttrConcurrentManagedAccess` (Windows, pre-Pascal GPUs, some Jetsons), whatever
/// the device says.
pub fn assume_no_concurrent_managed_access(on: bool) {
    NO_CONCURRENT_MANAGED.store(on, Ordering::SeqCst);
}

pub(crate) fn no_concurrent_managed_access() -> bool {
    NO_CONCURRENT_MANAGED.load(Ordering::SeqCst)
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
