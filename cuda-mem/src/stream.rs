//! Streams: ordered queues of asynchronous GPU work.

use std::ptr;

use cuda_mem_sys as sys;

use crate::error::{check, check_call, Result};

/// A CUDA stream, destroyed on drop. The null stream ([`Stream::legacy_default`]) is never
/// destroyed.
///
/// Destroying a stream with work still queued is allowed: the runtime releases it once that
/// work completes, so dropping never blocks on it. Memory that queued work uses is protected by
/// the buffers themselves (each waits on its pending work before host access or free).
#[derive(Debug)]
pub struct Stream {
    raw: sys::cudaStream_t,
    owned: bool,
}

// SAFETY: a cudaStream_t is a handle that the runtime allows to be used from any thread, and
// concurrently from several (the runtime API is thread-safe); `Stream` holds no thread-bound
// state.
unsafe impl Send for Stream {}
// SAFETY: every method takes `&self` and only passes the handle to thread-safe runtime calls.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream that synchronizes with the legacy default stream
    /// (`cudaStreamCreateWithFlags(cudaStreamDefault)`).
    pub fn new() -> Result<Self> {
        Self::with_flags(sys::cudaStreamDefault, "cudaStreamCreate(DEFAULT)")
    }

    /// A new stream that does not synchronize with the legacy default stream
    /// (`cudaStreamNonBlocking`).
    pub fn non_blocking() -> Result<Self> {
        Self::with_flags(sys::cudaStreamNonBlocking, "cudaStreamCreate(NON_BLOCKING)")
    }

    fn with_flags(flags: u32, call: &'static str) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; flags are one of the two documented values.
        let code = unsafe { sys::cudaStreamCreateWithFlags(&mut raw, flags) };
        check_call(code, call)?;
        Ok(Stream { raw, owned: true })
    }

    /// The legacy default (null) stream. Not destroyed on drop.
    pub fn legacy_default() -> Self {
        Stream {
            raw: ptr::null_mut(),
            owned: false,
        }
    }

    /// Waits until all work queued on the stream has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: `raw` is a live stream handle (or the null stream).
        check(unsafe { sys::cudaStreamSynchronize(self.raw) }, || {
            format!("cudaStreamSynchronize({:p})", self.raw)
        })
    }

    /// Whether all queued work has completed, without waiting.
    pub fn is_idle(&self) -> Result<bool> {
        // SAFETY: `raw` is a live stream handle (or the null stream).
        let code = unsafe { sys::cudaStreamQuery(self.raw) };
        if code == sys::cudaError::cudaErrorNotReady {
            return Ok(false);
        }
        check(code, || format!("cudaStreamQuery({:p})", self.raw)).map(|()| true)
    }

    /// The raw handle, for calls this crate does not wrap. Stays owned by `self`.
    pub fn as_raw(&self) -> sys::cudaStream_t {
        self.raw
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we own the handle and destroy it once. Errors (e.g. cudaErrorCudartUnloading
            // at exit, or a sticky context error) are ignored: drop must not panic.
            unsafe { sys::cudaStreamDestroy(self.raw) };
        }
    }
}
