//! Profiler control: `cudaProfilerStart` / `cudaProfilerStop`, which limit what a profiler
//! captures to the work between them.
//!
//! Nsight Systems honours them with `nsys profile --capture-range=cudaProfilerApi`, Nsight
//! Compute with `ncu --profile-from-start off`; without a profiler attached they do nothing
//! (and succeed). Both act on every device of the process.
//!
//! ```no_run
//! # fn main() -> cuda_mem::Result<()> {
//! # fn warm_up() {} fn measured_work() {}
//! warm_up();                                   // not captured
//! {
//!     let _capture = cuda_mem::profiler::capture()?;   // cudaProfilerStart
//!     measured_work();                         // captured
//! }                                            // cudaProfilerStop
//! # Ok(()) }
//! ```
//!
//! The two functions are declared by `cuda_profiler_api.h`, which the CUDA runtime wheels on
//! PyPI do not ship; `cuda-mem-sys` declares them itself then (every `libcudart` exports them).

use cuda_mem_sys as sys;

use crate::error::{check_call, Result};

/// Starts profiler capture (`cudaProfilerStart`). Calling it while capture is on is allowed
/// and does nothing.
pub fn start() -> Result<()> {
    // SAFETY: takes no arguments; the runtime initialises its context if needed.
    check_call(unsafe { sys::cudaProfilerStart() }, "cudaProfilerStart")
}

/// Stops profiler capture (`cudaProfilerStop`), flushing what was captured. Calling it while
/// capture is off is allowed and does nothing.
pub fn stop() -> Result<()> {
    // SAFETY: takes no arguments.
    check_call(unsafe { sys::cudaProfilerStop() }, "cudaProfilerStop")
}

/// Starts capture and returns a guard that stops it when dropped: the capture covers the
/// guard's scope, also when it is left by `?` or a panic.
pub fn capture() -> Result<Capture> {
    start()?;
    Ok(Capture { _private: () })
}

/// Profiler capture in progress, from [`capture`]; stopped on drop (errors ignored: drop
/// never panics) or by [`Capture::stop`], which reports them.
#[derive(Debug)]
#[must_use = "capture stops when the guard drops: bind it to a variable (`let _c = ...`)"]
pub struct Capture {
    _private: (),
}

impl Capture {
    /// Stops capture now and reports failure.
    pub fn stop(self) -> Result<()> {
        std::mem::forget(self);
        stop()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = stop();
    }
}
