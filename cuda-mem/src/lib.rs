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
//! | registered host | [`RegisteredSlice`], [`RegisteredVec`] | `cudaHostRegister` / `cudaHostUnregister` |
//!
//! Copies between any two kinds go through [`copy`] (synchronous) and [`copy_async`]
//! (queued on a [`Stream`]); [`pointer_info`] classifies any address. Every runtime failure is
//! an [`Error`] that keeps the raw code and the failed call; misuse the runtime never sees
//! (zero lengths, overflowing sizes, mismatched copies, missing device features) is
//! [`Error::Misuse`]. Nothing panics on bad input, and drop never panics.
//!
//! # Soundness of asynchronous work
//!
//! Every buffer carries a fence: asynchronous operations record an event on it, and host
//! access (`as_slice`, `as_mut_slice`), synchronous copies and drop wait for that event first.
//! Plain slices and `Vec`s cannot take part in asynchronous copies at all. Element types are
//! [`bytemuck::Pod`], valid for every bit pattern the GPU may write.
#![warn(missing_docs)]

mod buffer;
mod copy;
mod device;
mod devices;
mod error;
mod event;
mod fence;
mod flags;
mod managed;
mod mapped;
mod pinned;
mod pointer;
mod registered;
mod size;
mod stream;

pub use bytemuck::Pod;
pub use cuda_mem_sys as sys;

pub use copy::{
    copy, copy_async, copy_range, copy_range_async, AsyncMemory, Memory, MemoryMut, Side,
};
pub use device::DeviceBuffer;
pub use devices::{
    driver_version, format_version, runtime_version, Device, DeviceGuard, MemoryCapabilities,
    BUILT_CUDART_VERSION,
};
pub use error::{Error, ErrorCode, Misuse, Result};
pub use event::Event;
pub use managed::{Advice, Attach, Location, ManagedBuffer, CPU_DEVICE_ID};
#[doc(hidden)]
pub use mapped::__alloc_mapped_uva_with;
pub use mapped::{alloc_mapped, alloc_mapped_uva, MappedBuffer};
pub use pinned::{HostAllocFlags, PinnedBuffer};
pub use pointer::{pointer_info, PointerInfo, PointerKind};
pub use registered::{HostRegisterFlags, RegisteredSlice, RegisteredVec};
pub use stream::Stream;
