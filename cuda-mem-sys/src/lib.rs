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

/// The one way to build and read a [`cudaMemLocation`], whichever layout the header has: CUDA
/// 12.x to 13.4 declare `{ type, id }`, CUDA 13.5 moved `id` into an anonymous union (feature
/// `mem_location_union`).
impl cudaMemLocation {
    /// A location of kind `type_` with identifier `id` (a device ordinal, a host NUMA node;
    /// ignored for `cudaMemLocationTypeHost`).
    pub fn new(type_: cudaMemLocationType, id: ::std::os::raw::c_int) -> Self {
        #[cfg(not(cudart_mem_location_union))]
        let loc = cudaMemLocation { type_, id };
        #[cfg(cudart_mem_location_union)]
        let loc = cudaMemLocation {
            type_,
            __bindgen_anon_1: cudaMemLocation__bindgen_ty_1 { id },
        };
        loc
    }

    /// The identifier (`id`) of the location.
    pub fn id(&self) -> ::std::os::raw::c_int {
        #[cfg(not(cudart_mem_location_union))]
        let id = self.id;
        // SAFETY: every member of the union is plain integer data and `id` spans all of it
        // (4 bytes); a location comes from `new` (which writes `id`), from zeroed memory or from
        // the runtime, so all of its bytes are initialised.
        #[cfg(cudart_mem_location_union)]
        let id = unsafe { self.__bindgen_anon_1.id };
        id
    }
}
