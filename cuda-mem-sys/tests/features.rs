//! The feature detection of the build script, over snippets of bindgen output shaped like
//! each supported toolkit's, and over the committed fallback bindings (the build script's
//! module is included as is).

#[path = "../build/features.rs"]
mod features;

use features::{detect, ALL};

/// bindgen's output for the parts of CUDA 12.0's headers that the features look at.
const CUDA_12_0: &str = "
pub const cudaErrorCallRequiresNewerDriver: cudaError = cudaError(36);
pub const cudaMemLocationTypeDevice: cudaMemLocationType = cudaMemLocationType(1);
pub struct cudaMemPoolProps {
    pub allocType: cudaMemAllocationType,
    pub handleTypes: cudaMemAllocationHandleType,
    pub location: cudaMemLocation,
    pub win32SecurityAttributes: *mut ::std::os::raw::c_void,
    pub reserved: [::std::os::raw::c_uchar; 64usize],
}
pub struct cudaMemLocation {
    pub type_: cudaMemLocationType,
    pub id: ::std::os::raw::c_int,
}
unsafe extern \"C\" {
    pub fn cudaGetDeviceProperties_v2(prop: *mut cudaDeviceProp, device: ::std::os::raw::c_int) -> cudaError_t;
    pub fn cudaMemPrefetchAsync(
        devPtr: *const ::std::os::raw::c_void,
        count: usize,
        dstDevice: ::std::os::raw::c_int,
        stream: cudaStream_t,
    ) -> cudaError_t;
    pub fn cudaMemAdvise(devPtr: *const ::std::os::raw::c_void, count: usize, advice: cudaMemoryAdvise, device: ::std::os::raw::c_int) -> cudaError_t;
    pub fn cudaMemPoolCreate(memPool: *mut cudaMemPool_t, poolProps: *const cudaMemPoolProps) -> cudaError_t;
}
";

/// CUDA 13.5: cudaLibrary*, location-taking prefetch/advise, `id` in an anonymous union.
const CUDA_13_5: &str = "
pub const cudaErrorCallRequiresNewerDriver: cudaError = cudaError(36);
pub const cudaErrorContained: cudaError = cudaError(226);
pub const cudaErrorTensorMemoryLeak: cudaError = cudaError(721);
pub type cudaLibrary_t = *mut CUlib_st;
pub type cudaKernel_t = *mut CUkern_st;
pub const cudaMemLocationTypeHost: cudaMemLocationType = cudaMemLocationType(2);
pub const cudaMemLocationTypeHostNuma: cudaMemLocationType = cudaMemLocationType(3);
pub struct cudaMemPoolProps {
    pub allocType: cudaMemAllocationType,
    pub handleTypes: cudaMemAllocationHandleType,
    pub location: cudaMemLocation,
    pub win32SecurityAttributes: *mut ::std::os::raw::c_void,
    pub maxSize: usize,
    pub usage: ::std::os::raw::c_ushort,
    pub reserved: [::std::os::raw::c_uchar; 53usize],
    pub reserved1: ::std::os::raw::c_uchar,
}
pub struct cudaMemLocation {
    pub type_: cudaMemLocationType,
    pub __bindgen_anon_1: cudaMemLocation__bindgen_ty_1,
}
pub union cudaMemLocation__bindgen_ty_1 {
    pub id: ::std::os::raw::c_int,
    pub localized: cudaMemLocation__bindgen_ty_1__bindgen_ty_1,
}
unsafe extern \"C\" {
    pub fn cudaGetDeviceProperties(prop: *mut cudaDeviceProp, device: ::std::os::raw::c_int) -> cudaError_t;
    pub fn cudaMemPrefetchAsync(devPtr: *const ::std::os::raw::c_void, count: usize, location: cudaMemLocation, flags: ::std::os::raw::c_uint, stream: cudaStream_t) -> cudaError_t;
    pub fn cudaMemAdvise(devPtr: *const ::std::os::raw::c_void, count: usize, advice: cudaMemoryAdvise, location: cudaMemLocation) -> cudaError_t;
    pub fn cudaLibraryLoadData(library: *mut cudaLibrary_t) -> cudaError_t;
    pub fn cudaLibraryGetKernel(pKernel: *mut cudaKernel_t) -> cudaError_t;
    pub fn cudaLibraryUnload(library: cudaLibrary_t) -> cudaError_t;
    pub fn cudaMemPoolCreate(memPool: *mut cudaMemPool_t, poolProps: *const cudaMemPoolProps) -> cudaError_t;
}
";

#[test]
fn cuda_12_0_has_only_the_old_api() {
    assert_eq!(
        detect(CUDA_12_0),
        ["device_properties_v2", "error_call_requires_newer_driver"]
    );
}

#[test]
fn cuda_13_5_has_the_union_layout_and_the_library_api() {
    assert_eq!(
        detect(CUDA_13_5),
        [
            "library",
            "prefetch_location",
            "advise_location",
            "mem_location_union",
            "error_call_requires_newer_driver",
            "error_contained",
            "error_tensor_memory_leak",
            "mem_pool_host",
            "mem_pool_max_size"
        ]
    );
}

#[test]
fn host_pools_need_the_host_location_not_only_its_numa_sibling() {
    // 12.2 to 12.5 headers already name cudaMemLocationTypeHost (prefetch, advice); whether
    // the driver creates a host pool is asked at run time. HostNuma alone does not count.
    let base = "pub fn cudaMemPoolCreate(memPool: *mut cudaMemPool_t) -> cudaError_t;\n";
    let numa =
        "pub const cudaMemLocationTypeHostNuma: cudaMemLocationType = cudaMemLocationType(3);\n";
    let host = "pub const cudaMemLocationTypeHost: cudaMemLocationType = cudaMemLocationType(2);\n";
    assert!(detect(&format!("{base}{numa}")).is_empty());
    assert_eq!(detect(&format!("{base}{host}")), ["mem_pool_host"]);
    assert!(
        detect(host).is_empty(),
        "no pools without cudaMemPoolCreate"
    );
    let capped = "pub struct cudaMemPoolProps {\n    pub location: cudaMemLocation,\n    pub maxSize: usize,\n}\n";
    assert_eq!(detect(capped), ["mem_pool_max_size"]);
}

#[test]
fn v2_functions_are_told_apart_from_their_base_names() {
    // 12.2 to 12.9: both cudaMemPrefetchAsync(int) and cudaMemPrefetchAsync_v2(location).
    let text = "pub fn cudaMemPrefetchAsync(devPtr: *const c_void, count: usize, dstDevice: c_int, stream: cudaStream_t) -> cudaError_t;\n\
                pub fn cudaMemPrefetchAsync_v2(devPtr: *const c_void, count: usize, location: cudaMemLocation, flags: c_uint, stream: cudaStream_t) -> cudaError_t;\n\
                pub fn cudaMemAdvise_v2(devPtr: *const c_void, count: usize, advice: cudaMemoryAdvise, location: cudaMemLocation) -> cudaError_t;\n\
                pub fn cudaMemAdvise(devPtr: *const c_void, count: usize, advice: cudaMemoryAdvise, device: c_int) -> cudaError_t;\n";
    assert_eq!(detect(text), ["prefetch_v2", "advise_v2"]);
    // A name that merely starts like a feature's does not count.
    assert!(detect("pub const cudaErrorContainedX: cudaError = cudaError(1);").is_empty());
    assert!(detect("pub type cudaLibrary_tt = u8;").is_empty());
}

#[test]
fn fallback_bindings_publish_the_cuda_13_0_features() {
    let text = include_str!("../src/bindings/fallback.rs");
    assert_eq!(
        detect(text),
        [
            "library",
            "prefetch_location",
            "advise_location",
            "error_call_requires_newer_driver",
            "error_contained",
            "error_tensor_memory_leak",
            "mem_pool_host",
            "mem_pool_max_size"
        ]
    );
}

#[test]
fn every_detected_feature_is_declared() {
    let names: Vec<&str> = ALL.iter().map(|(n, _)| *n).collect();
    for f in detect(CUDA_13_5).into_iter().chain(detect(CUDA_12_0)) {
        assert!(names.contains(&f), "{f}");
    }
}
