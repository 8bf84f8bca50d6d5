//! Safe, RAII CUDA memory management over the CUDA runtime API.
//!
//! One type per kind of memory a C++ CUDA program uses, each in its own module:
//!
//! | kind | type | C++ |
//! |---|---|---|
//! | device | [`DeviceBuffer`] | `cudaMalloc` / `cudaMemset` / `cudaMemcpy` / `cudaFree` |
//! | pinned host | [`PinnedBuffer`] | `cudaHostAlloc` (flags [`HostAllocFlags`]), `cudaMallocHost` / `cudaFreeHost` |
//! | zero-copy mapped | [`MappedBuffer`], [`alloc_mapped`], [`alloc_mapped_uva`] | `cudaHostAlloc(Mapped)` + `cudaHostGetDevicePointer` |
//! | managed (unified) | [`ManagedBuffer`] | `cudaMallocManaged`, `cudaMemPrefetchAsync`, `cudaMemAdvise` |
//! | registered host | [`RegisteredSlice::register`] (a borrowed slice, for the length of a closure), [`RegisteredVec`] | `cudaHostRegister` / `cudaHostUnregister` |
//! | stream-ordered (pooled) | [`MemPool`], [`DeviceBuffer::from_pool`], [`PinnedBuffer::from_pool`] | `cudaMemPoolCreate`, `cudaMallocFromPoolAsync` / `cudaFreeAsync` |
//! | cached pinned host | [`PinnedPool`] (and [`PinStrategy`] for fast cold pinning) | `cudaHostAlloc` behind a cache, or `mmap` + `cudaHostRegister` |
//!
//! Copies between any two kinds go through [`copy`] (synchronous; large copies from or to
//! ordinary host memory are staged by worker threads, see [`Stager`]) and [`copy_async`]
//! (queued on a [`Stream`]); [`pointer_info`] classifies any address. Between the device
//! buffers of two GPUs, [`copy_peer`] / [`copy_peer_async`] (`cudaMemcpyPeer[Async]`) and
//! [`StagedCopy`] (through pinned host memory, pipelined) copy, and [`Device::enable_peer_access`]
//! opens the direct path. Every runtime failure is
//! an [`Error`] that keeps the raw code and the failed call; misuse the runtime never sees
//! (zero lengths, overflowing sizes, mismatched copies, missing device features) is
//! [`Error::Misuse`]. Nothing panics on bad input, and drop never panics.
//!
//! # Soundness of asynchronous work
//!
//! Every buffer carries a fence that knows which streams have queued work on which of its
//! byte ranges, reading or writing. Host reads wait for pending GPU writes, host writes and
//! drop for all pending work; asynchronous work on one stream is ordered (on the device) after
//! conflicting work of other streams, while work on the same stream, on disjoint ranges, or
//! reads beside reads never wait. Kernels get device addresses through guards
//! ([`DevicePtr::device_ptr`], [`DevicePtrMut::device_ptr_mut`]) that order the stream first
//! and record the launch after it (see [`DevicePtr`] for the aliasing rule).
//! Events are recorded lazily, when somebody needs to wait, so queueing work costs no runtime
//! call beyond the work itself. Plain slices and `Vec`s cannot take part in asynchronous work
//! at all; the traits that carry these promises are sealed. Element types are
//! [`bytemuck::Pod`], valid for every bit pattern the GPU may write.
//!
//! # Other libraries in the process
//!
//! [`Stream::from_raw`] and [`Event::from_raw`] borrow another library's streams and events,
//! `from_raw` / `into_raw` move memory across, and [`DevicePtr`] guards give its kernels
//! ordered addresses ([`interop`]). With the `cudarc` feature, `interop::cudarc` makes
//! cuda-mem memory arguments of cudarc launches and copies, and cudarc memory part of cuda-mem's
//! copies, each side's ordering honoured. [`profiler`] starts and stops profiler capture.
#![warn(missing_docs)]

mod alloc;
mod contract;
mod error;
mod fence;
mod handles;
pub mod interop;
pub mod ipc;
mod kinds;
#[cfg(feature = "measure")]
pub mod measure;
mod ops;
pub mod profiler;
#[cfg(feature = "testing")]
pub mod testing;
mod transfer;

pub use bytemuck::Pod;
pub use cuda_mem_sys as sys;

pub use alloc::pinned_pool::{PinnedPool, PinnedPoolConfig, PinnedPoolStats};
pub use alloc::pinning::{default_pin_threads, PinStrategy, AUTO_MAP_REGISTER_FROM};
pub use alloc::pool::{MemPool, PoolAccess, PoolLocation, PoolStats};
pub use contract::buffer::{Allocation, Buffer, HostAllocation};
pub use contract::host::{HostMemory, HostMemoryMut};
pub use contract::memory::{AsyncMemory, Memory, MemoryMut};
pub use error::{check, Error, ErrorCode, Misuse, Result};
pub use handles::devices::{
    driver_version, format_version, runtime_version, Device, DeviceFlags, DeviceGuard,
    MemoryCapabilities, BUILT_CUDART_VERSION,
};
pub use handles::event::{Event, EventFlags};
pub use handles::flags::HostAllocFlags;
pub use handles::pointer::{pointer_info, PointerInfo, PointerKind};
pub use handles::stream::Stream;
pub use kinds::device::{DeviceBuffer, DeviceMemory};
pub use kinds::managed::{Advice, Attach, Location, ManagedBuffer, ManagedMemory, CPU_DEVICE_ID};
pub use kinds::mapped::{
    alloc_mapped, alloc_mapped_uva, AtomicElement, MappedBuffer, MappedMemory,
};
pub use kinds::pinned::{PinnedBuffer, PinnedMemory};
pub use kinds::registered::{HostRegisterFlags, RegisteredSlice, RegisteredVec};
pub use ops::access::{DevicePtr, DevicePtrMut, DeviceRead, DeviceWrite};
pub use ops::copy::{copy_async, copy_range_async, memset_async};
pub use ops::graph::{Capture, CaptureMode, Graph, GraphExec, GraphResources, Launcher};
pub use ops::scope::{scope, Borrowed, BorrowedMut, Scope};
pub use ops::view::{Slice, View, ViewMut};
pub use transfer::peer::{
    copy_peer, copy_peer_async, copy_peer_range, copy_peer_range_async, StagedCopy,
};
pub use transfer::staged::{
    copy_staged, set_auto_staging, set_staged_config, staged_config, Calibration, CalibrationPoint,
    ConfigSource, DirectionConfig, StagedSetup, Stager, StagingConfig,
};
pub use transfer::{copy, copy_range};
