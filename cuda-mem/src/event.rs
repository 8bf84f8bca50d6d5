//! Events: markers in a stream, for waiting and timing.

use std::ptr;

use cuda_mem_sys as sys;

use crate::error::{check, check_call, Result};
use crate::stream::Stream;

/// A CUDA event, destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: sys::cudaEvent_t,
}

// SAFETY: a cudaEvent_t is a handle the runtime allows to be used from any thread and
// concurrently (the runtime API is thread-safe); `Event` holds no thread-bound state.
unsafe impl Send for Event {}
// SAFETY: all methods take `&self` and only pass the handle to thread-safe runtime calls.
unsafe impl Sync for Event {}

impl Event {
    /// An event that records timing (`cudaEventDefault`), for [`Event::elapsed_ms`].
    pub fn timing() -> Result<Self> {
        Self::with_flags(sys::cudaEventDefault, "cudaEventCreate(DEFAULT)")
    }

    /// An event without timing (`cudaEventDisableTiming`): the cheapest kind, for waiting.
    pub fn new() -> Result<Self> {
        Self::with_flags(
            sys::cudaEventDisableTiming,
            "cudaEventCreate(DISABLE_TIMING)",
        )
    }

    fn with_flags(flags: u32, call: &'static str) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer and flags are documented values.
        let code = unsafe { sys::cudaEventCreateWithFlags(&mut raw, flags) };
        check_call(code, call)?;
        Ok(Event { raw })
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live.
        let code = unsafe { sys::cudaEventRecord(self.raw, stream.as_raw()) };
        check(code, || {
            format!(
                "cudaEventRecord({:p}, stream {:p})",
                self.raw,
                stream.as_raw()
            )
        })
    }

    /// Waits on the host until the work before the last record has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live.
        check(unsafe { sys::cudaEventSynchronize(self.raw) }, || {
            format!("cudaEventSynchronize({:p})", self.raw)
        })
    }

    /// Whether the work before the last record has completed, without waiting.
    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: the handle is live.
        let code = unsafe { sys::cudaEventQuery(self.raw) };
        if code == sys::cudaError::cudaErrorNotReady {
            return Ok(false);
        }
        check(code, || format!("cudaEventQuery({:p})", self.raw)).map(|()| true)
    }

    /// Makes later work on `stream` wait until this event completes (`cudaStreamWaitEvent`).
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live.
        let code = unsafe { sys::cudaStreamWaitEvent(stream.as_raw(), self.raw, 0) };
        check(code, || {
            format!(
                "cudaStreamWaitEvent(stream {:p}, {:p})",
                stream.as_raw(),
                self.raw
            )
        })
    }

    /// Milliseconds between two recorded timing events (`cudaEventElapsedTime`).
    pub fn elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid out-pointer; both handles are live.
        let code = unsafe { sys::cudaEventElapsedTime(&mut ms, start.raw, end.raw) };
        check(code, || "cudaEventElapsedTime".to_string())?;
        Ok(ms)
    }

    /// The raw handle. Stays owned by `self`.
    pub fn as_raw(&self) -> sys::cudaEvent_t {
        self.raw
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: we own the handle and destroy it once; errors are ignored (drop never panics).
        unsafe { sys::cudaEventDestroy(self.raw) };
    }
}
