//! Working together with other CUDA libraries in one process, each keeping its own ordering
//! rules.
//!
//! - `cudarc` (feature `cudarc`): cuda-mem memory as arguments of cudarc kernel launches and
//!   copies, cudarc memory (`CudaSlice`, its views) in cuda-mem copies and kernels.
//!
//! Without a feature, the building blocks work with any library that hands out raw handles:
//! [`Stream::from_raw`](crate::Stream::from_raw) and [`Event::from_raw`](crate::Event::from_raw)
//! borrow its streams and events, `from_raw` / `into_raw` move memory across, and
//! [`DevicePtr`](crate::DevicePtr) guards give its kernels ordered device addresses.

#[cfg(feature = "cudarc-unpinned")]
pub mod cudarc;
