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

mod access;
mod buffer;
mod copy;
mod device;
mod devices;
mod error;
mod event;
mod fence;
mod flags;
mod host;
pub mod interop;
mod layout;
mod managed;
mod mapped;
#[cfg(feature = "measure")]
pub mod measure;
mod memory;
mod peer;
mod pinned;
mod pinned_pool;
mod pinning;
mod pointer;
mod pool;
pub mod profiler;
mod registered;
mod scope;
mod size;
mod staged;
mod stream;
#[cfg(feature = "testing")]
pub mod testing;
mod transfer;
mod view;

pub use bytemuck::Pod;
pub use cuda_mem_sys as sys;

pub use access::{DevicePtr, DevicePtrMut, DeviceRead, DeviceWrite};
pub use copy::{copy_async, copy_range_async, memset_async};
pub use device::DeviceBuffer;
pub use devices::{
    driver_version, format_version, runtime_version, Device, DeviceFlags, DeviceGuard,
    MemoryCapabilities, BUILT_CUDART_VERSION,
};
pub use error::{check, Error, ErrorCode, Misuse, Result};
pub use event::{Event, EventFlags};
pub use flags::HostAllocFlags;
pub use host::{HostMemory, HostMemoryMut};
pub use managed::{Advice, Attach, Location, ManagedBuffer, CPU_DEVICE_ID};
pub use mapped::{alloc_mapped, alloc_mapped_uva, AtomicElement, MappedBuffer};
pub use memory::{AsyncMemory, Memory, MemoryMut};
pub use peer::{copy_peer, copy_peer_async, copy_peer_range, copy_peer_range_async, StagedCopy};
pub use pinned::PinnedBuffer;
pub use pinned_pool::{PinnedPool, PinnedPoolConfig, PinnedPoolStats};
pub use pinning::{default_pin_threads, PinStrategy, AUTO_MAP_REGISTER_FROM};
pub use pointer::{pointer_info, PointerInfo, PointerKind};
pub use pool::{MemPool, PoolAccess, PoolLocation, PoolStats};
pub use registered::{HostRegisterFlags, RegisteredSlice, RegisteredVec};
pub use scope::{scope, Borrowed, BorrowedMut, Scope};
pub use staged::{copy_staged, set_auto_staging, Stager, StagingConfig};
pub use stream::Stream;
pub use transfer::{copy, copy_range};
pub use view::{Slice, View, ViewMut};
