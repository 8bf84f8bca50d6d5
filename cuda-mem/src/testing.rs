//! Test seams, compiled only with the `testing` feature, which cuda-mem's own test crates
//! enable: they force failure paths that a healthy GPU never takes. Not for use elsewhere: a
//! program that measures the library (`cuda-mem bench`) uses the `measure` feature's module
//! `measure` instead, and leaves these seams out.
//!
//! Every seam is per thread (it affects only calls made on the thread that set it), so that
//! tests running in parallel do not see each other's failures.

use std::cell::Cell;

use bytemuck::Pod;

use crate::error::{Error, ErrorCode, Result};
use crate::fence::Backend;
use crate::handles::flags::HostAllocFlags;
use crate::kinds::mapped::MappedBuffer;

thread_local! {
    static FAIL_RECORDS: Cell<u32> = const { Cell::new(0) };
    static FAIL_SYNCS: Cell<u32> = const { Cell::new(0) };
    static NO_CONCURRENT_MANAGED: Cell<bool> = const { Cell::new(false) };
    static FAIL_STAGED_CHUNK: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Whether graph launches on the crate's own streams call the driver's `cuGraphLaunch` straight
/// (the runtime gave its entry point), as on a real driver they should.
pub fn graph_launches_through_driver() -> bool {
    crate::handles::driver::launches_through_driver()
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
/// thread fail with `cudaErrorUnknown` (not a sticky code: nothing stopped), before any runtime call.
/// Reset with `0`.
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

/// A fence backend that injects the forced failures above into `B`'s calls: the fences'
/// backend in builds with this feature (chosen in `fence`), so that the runtime backend itself
/// carries no test seam.
pub(crate) struct Faulty<B>(std::marker::PhantomData<B>);

impl<B: Backend<Error = Error>> Backend for Faulty<B> {
    type Stream = B::Stream;
    type Event = B::Event;
    type Error = Error;

    fn same(a: &B::Stream, b: &B::Stream) -> bool {
        B::same(a, b)
    }
    fn id(s: &B::Stream) -> usize {
        B::id(s)
    }
    fn record(stream: &B::Stream, reuse: Option<B::Event>) -> Result<B::Event> {
        maybe_fail_record()?;
        B::record(stream, reuse)
    }
    fn wait(stream: &B::Stream, event: &B::Event) -> Result<()> {
        B::wait(stream, event)
    }
    fn query(event: &B::Event) -> Result<bool> {
        B::query(event)
    }
    fn sync_event(event: &B::Event) -> Result<()> {
        maybe_fail_sync()?;
        B::sync_event(event)
    }
    fn sync_stream(stream: &B::Stream) -> Result<()> {
        maybe_fail_sync()?;
        B::sync_stream(stream)
    }
    fn may_still_run(error: &Error) -> bool {
        B::may_still_run(error)
    }
    fn skip(entry: &B::Stream, stream: &B::Stream) -> bool {
        B::skip(entry, stream)
    }
    fn current(event: &B::Event) -> bool {
        B::current(event)
    }
    fn durable(event: &B::Event) -> bool {
        B::durable(event)
    }
}

fn maybe_fail_record() -> Result<()> {
    if take(&FAIL_RECORDS) {
        return Err(forced(
            crate::sys::cudaError::cudaErrorInvalidResourceHandle,
            "cudaEventRecord",
        ));
    }
    Ok(())
}

fn maybe_fail_sync() -> Result<()> {
    if take(&FAIL_SYNCS) {
        // Not a sticky code: a forced failure stops no work, so it must not read as a lost
        // context (which callers trust to have ended the work on the memory).
        return Err(forced(
            crate::sys::cudaError::cudaErrorUnknown,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Review finding (h-review2): the forced host-wait failure was `cudaErrorLaunchFailure`,
    /// a *sticky* code. `scope` and `RegisteredSlice::register` read a sticky wait error as
    /// "the context is gone, no work can still use the memory" and hand the memory back
    /// instead of aborting; a forced failure stops nothing on a healthy GPU, so with this
    /// (public, unifiable) feature safe code can free memory under running DMA:
    /// `register(&mut v, .., |r| { copy_async(r, &dev, &s)?; fail_next_fence_syncs(1); Ok(()) })`
    /// then `drop(v)`. The forced code is a non-sticky one.
    #[test]
    fn a_forced_wait_failure_is_not_taken_for_a_dead_context() {
        fail_next_fence_syncs(1);
        let e = maybe_fail_sync().unwrap_err();
        assert!(
            !e.is_sticky(),
            "{e}: a forced failure claims the context is gone"
        );
    }
}
