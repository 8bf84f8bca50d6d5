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
//!
//! # How cudart is reached ([`CUDART_LINKAGE`])
//!
//! Where the toolkit has `libcudart_static.a` (the CUDA 13.x wheels, full toolkits) it is
//! linked in, and programs need only the NVIDIA driver. Where it has none (the CUDA 12.x
//! runtime wheels that PyTorch environments carry, some conda packages), nothing is linked:
//! cudart is opened with `dlopen` at the first call of any of its functions, so that programs
//! start without `LD_LIBRARY_PATH`. What is opened, in order:
//!
//! 1. only the file named by the environment variable `CUDA_MEM_CUDART`, when it is set;
//! 2. else a `libcudart.so.N` the process has loaded already (e.g. PyTorch's), so that there
//!    is one runtime, not two;
//! 3. else the `libcudart.so.N` the build script found (its absolute path is baked in);
//! 4. then `libcudart.so.N` (the `SONAME`) through the loader's search path: `LD_LIBRARY_PATH`,
//!    the executable's run path, `ld.so.cache`.
//!
//! A library whose `cudaRuntimeGetVersion` reports another major version than the headers is
//! refused. The functions keep their exact signatures (and are also defined under cudart's C
//! names, for C code linked into the same program); after the first call, a call costs one
//! atomic load and an indirect call (like a call through the PLT of a linked `libcudart.so`).
//! When cudart cannot be opened, every function that returns `cudaError_t` returns
//! `cudaErrorSharedObjectInitFailed`, and `cudaGetErrorString` of that code, like
//! [`runtime_load_error`], says what was tried and why each failed. A function that the
//! opened cudart lacks (a runtime older than the headers) returns
//! `cudaErrorSharedObjectSymbolNotFound`, and [`runtime_load_error`] names it. Neither code is
//! sticky: nothing ran. `cudaGetErrorName` still names every code the header declares.
//! `CUDA_MEM_SYS_LINK=static|load|dynamic` at build time chooses the mode explicitly
//! (`dynamic` links `libcudart.so` as a `NEEDED` library: the loader must then find it when
//! the program starts).
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks)]
#![allow(rustdoc::all)]

#[cfg(not(any(cuda_mem_sys_fallback, cuda_mem_sys_load)))]
include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

#[cfg(cuda_mem_sys_fallback)]
include!("bindings/fallback.rs");

/// bindgen's output: the types and constants are re-exported; its function declarations are
/// never used (nothing is linked), each is shadowed by the forwarding function of the same
/// name and signature below.
#[cfg(cuda_mem_sys_load)]
#[allow(dead_code)]
mod declared {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}
#[cfg(cuda_mem_sys_load)]
pub use declared::*;

#[cfg(cuda_mem_sys_load)]
#[macro_use]
#[warn(clippy::all)]
#[deny(clippy::undocumented_unsafe_blocks)]
mod loader;

#[cfg(cuda_mem_sys_load)]
include!(concat!(env!("OUT_DIR"), "/cudart_fns.rs"));

/// How this build reaches cudart (chosen by the build script; see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudartLinkage {
    /// `libcudart_static.a` is linked in.
    Static,
    /// `libcudart.so` is linked as a `NEEDED` library (`CUDA_MEM_SYS_LINK=dynamic`).
    Dynamic,
    /// cudart is opened at run time ([`runtime_library`], [`runtime_load_error`]).
    Loaded,
    /// Nothing is linked: documentation builds with the committed bindings.
    None,
}

/// How this build reaches cudart.
pub const CUDART_LINKAGE: CudartLinkage = if cfg!(cuda_mem_sys_fallback) {
    CudartLinkage::None
} else if cfg!(cuda_mem_sys_load) {
    CudartLinkage::Loaded
} else if cfg!(cuda_mem_sys_dynamic) {
    CudartLinkage::Dynamic
} else {
    CudartLinkage::Static
};

/// Why cudart, or a function of it, could not be loaded: the files tried with each loader
/// error, or the functions the opened library lacks. `None` when everything called so far was
/// found, and always for a linked cudart ([`CUDART_LINKAGE`] not `Loaded`). Opens cudart first
/// if no call has yet.
pub fn runtime_load_error() -> Option<String> {
    #[cfg(cuda_mem_sys_load)]
    return loader::load_error();
    #[cfg(not(cuda_mem_sys_load))]
    return None;
}

/// The cudart file that was opened at run time (its path, from the loader), or `None` when
/// cudart is linked or could not be opened. Opens cudart first if no call has yet.
pub fn runtime_library() -> Option<&'static str> {
    #[cfg(cuda_mem_sys_load)]
    return loader::library().as_ref().ok().map(|l| l.path.as_str());
    #[cfg(not(cuda_mem_sys_load))]
    return None;
}

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
