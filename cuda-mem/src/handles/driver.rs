//! The driver's `cuGraphLaunch`, called straight, as cudarc calls it, for graph launches on
//! the crate's own streams. The runtime's `cudaGraphLaunch` wraps it (the thread's context
//! made current, the stream handle mapped, the last error kept): on the H200 that wrapper was
//! 3–7% of a 100-kernel graph's launch (about 2 µs), cudarc's driver call against the same
//! runtime call from Rust, paired process by process (docs/results/round4-issue-22).
//!
//! Found through the runtime (`cudaGetDriverEntryPoint`, the same function in every toolkit
//! from 12.0 to 13.x), never linked: where the runtime cannot give it (a stand-in runtime,
//! an old driver) every launch takes the runtime's call. A launch the driver refuses is made
//! again through the runtime, which then reports the error as the runtime's code (the driver's
//! `CUresult` never reaches the caller) or, where the driver's refusal was the thread's context
//! (none current: the runtime makes its device's current), launches.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

use cuda_mem_sys as sys;

/// `CUresult cuGraphLaunch(CUgraphExec, CUstream)`: the runtime's handles are the driver's.
type GraphLaunch = unsafe extern "C" fn(sys::cudaGraphExec_t, sys::cudaStream_t) -> c_int;

/// The driver's entry point `name`, where the runtime finds it.
fn entry(name: &CStr) -> Option<*mut c_void> {
    let mut f = std::ptr::null_mut();
    let mut status = sys::cudaDriverEntryPointQueryResult::cudaDriverEntryPointSymbolNotFound;
    // SAFETY: a NUL-terminated name and valid out-pointers; the flags ask for the default
    // stream semantics of the runtime (the launches below are on the crate's own streams).
    let code = unsafe {
        sys::cudaGetDriverEntryPoint(
            name.as_ptr(),
            &mut f,
            u64::from(sys::cudaGetDriverEntryPointFlags::cudaEnableDefault.0),
            &mut status,
        )
    };
    (code == sys::cudaError::cudaSuccess
        && status == sys::cudaDriverEntryPointQueryResult::cudaDriverEntryPointSuccess
        && !f.is_null())
    .then_some(f)
}

/// `cuGraphLaunch`, looked up once.
#[inline]
fn graph_launch_entry() -> Option<GraphLaunch> {
    static ENTRY: OnceLock<Option<GraphLaunch>> = OnceLock::new();
    *ENTRY.get_or_init(|| {
        let f = entry(c"cuGraphLaunch")?;
        // SAFETY: the driver's `cuGraphLaunch`, whose C signature `GraphLaunch` is (two
        // pointer-sized handles in, a 32-bit status out), unchanged since CUDA 10.
        Some(unsafe { std::mem::transmute::<*mut c_void, GraphLaunch>(f) })
    })
}

/// Whether graph launches on the crate's own streams call the driver's `cuGraphLaunch`
/// straight (the runtime gave its entry point): for the bench (`measure`) and the tests
/// (`testing`).
#[cfg(any(feature = "measure", feature = "testing"))]
pub(crate) fn launches_through_driver() -> bool {
    graph_launch_entry().is_some()
}

/// `cudaGraphLaunch(exec, stream)`, through the driver's `cuGraphLaunch` where the runtime gave
/// it and `stream` is a stream of the crate's own (not a legacy or per-thread default stream's
/// handle), with the runtime's call where that fails.
///
/// # Safety
/// As `cudaGraphLaunch`'s: a live executable graph and stream, and the launch's work sound
/// (the caller's ordering of what its nodes use).
#[inline]
pub(crate) unsafe fn graph_launch(
    exec: sys::cudaGraphExec_t,
    stream: sys::cudaStream_t,
    own_stream: bool,
) -> sys::cudaError_t {
    if own_stream {
        if let Some(f) = graph_launch_entry() {
            // SAFETY: as the caller guarantees; the handles are the driver's too.
            if unsafe { f(exec, stream) } == 0 {
                return sys::cudaError::cudaSuccess;
            }
            // Refused, nothing launched: the runtime's call says why, in its code (or makes
            // the context current and launches).
        }
    }
    // SAFETY: as the caller guarantees.
    unsafe { sys::cudaGraphLaunch(exec, stream) }
}
