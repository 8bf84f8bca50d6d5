//! Raw FFI bindings to the CUDA runtime API (cudart).
//!
//! The bindings are generated at build time by bindgen from the `cuda_runtime_api.h` of the
//! toolkit that the build script finds (see the crate README for the search order), so they
//! always match the installed toolkit, CUDA 12.x or 13.x. [`CUDART_VERSION`] tells which.
//!
//! Every C enum is a `#[repr(transparent)]` newtype over its integer, with the known values as
//! associated constants (e.g. [`cudaError::cudaErrorMemoryAllocation`]): a value the header
//! does not know, returned by a newer driver, is still a valid value of the type.
//!
//! Everything here is `unsafe` to call and follows the C API exactly; the `cuda-mem` crate is
//! the safe layer.
//!
//! Documentation builds without a toolkit (`DOCS_RS`, or `CUDA_MEM_SYS_FALLBACK_BINDINGS=1`)
//! use bindings committed from CUDA 13.0 and link nothing.
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks)]
#![allow(rustdoc::all)]

#[cfg(not(cuda_mem_sys_fallback))]
include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

#[cfg(cuda_mem_sys_fallback)]
include!("bindings/fallback.rs");
