//! What the installed headers declare: API features detected from the generated bindings.
//!
//! Dependants gate code on these features (published as `DEP_CUDART_FEATURES`), never on
//! `CUDART_VERSION`: a feature is present exactly when the header declares it, whatever the
//! version number says. Pure text logic over bindgen's output, so that the tests of
//! `cuda-mem-sys` drive it over snippets (`tests/features.rs` includes this file with `#[path]`).

/// Every feature this build script may report, with what it means. A dependant that turns
/// them into `cfg`s declares them all with `cargo:rustc-check-cfg`.
pub const ALL: [(&str, &str); 12] = [
    (
        "library",
        "cudaLibrary_t, cudaKernel_t, cudaLibraryLoadData, cudaLibraryGetKernel (12.5+)",
    ),
    (
        "prefetch_location",
        "cudaMemPrefetchAsync takes a cudaMemLocation and flags (13.0+); else an int device",
    ),
    (
        "prefetch_v2",
        "cudaMemPrefetchAsync_v2 with a cudaMemLocation exists (12.2 to 12.9)",
    ),
    (
        "advise_location",
        "cudaMemAdvise takes a cudaMemLocation (13.0+); else an int device",
    ),
    (
        "advise_v2",
        "cudaMemAdvise_v2 with a cudaMemLocation exists (12.2 to 12.9)",
    ),
    (
        "mem_location_union",
        "cudaMemLocation's id sits in an anonymous union (13.5+); use cudaMemLocation::id()",
    ),
    (
        "device_properties_v2",
        "the current cudaDeviceProp is filled by cudaGetDeviceProperties_v2 (12.x)",
    ),
    (
        "error_call_requires_newer_driver",
        "cudaErrorCallRequiresNewerDriver is a known cudaError_t value",
    ),
    (
        "error_contained",
        "cudaErrorContained is a known cudaError_t value (12.9 and 13.x have it, 12.0 and 12.4 not)",
    ),
    (
        "error_tensor_memory_leak",
        "cudaErrorTensorMemoryLeak is a known cudaError_t value (12.9 and 13.x have it, 12.0 and 12.4 not)",
    ),
    (
        "mem_pool_host",
        "cudaMemLocationTypeHost exists, so cudaMemPoolCreate can be asked for a pool of pinned \
         host memory (12.2+ headers; drivers of CUDA 12.6+ create one)",
    ),
    (
        "mem_pool_max_size",
        "cudaMemPoolProps has maxSize, a cap on the pool's memory (12.2+)",
    ),
];

/// The features that `bindings` (bindgen's output) declares, in the order of [`ALL`].
pub fn detect(bindings: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    let mut add = |name: &'static str, present: bool| {
        if present {
            found.push(name);
        }
    };
    add(
        "library",
        has_type(bindings, "cudaLibrary_t")
            && has_type(bindings, "cudaKernel_t")
            && has_fn(bindings, "cudaLibraryLoadData")
            && has_fn(bindings, "cudaLibraryGetKernel")
            && has_fn(bindings, "cudaLibraryUnload"),
    );
    add(
        "prefetch_location",
        fn_params(bindings, "cudaMemPrefetchAsync").is_some_and(|p| p.contains("cudaMemLocation")),
    );
    add(
        "prefetch_v2",
        fn_params(bindings, "cudaMemPrefetchAsync_v2")
            .is_some_and(|p| p.contains("cudaMemLocation")),
    );
    add(
        "advise_location",
        fn_params(bindings, "cudaMemAdvise").is_some_and(|p| p.contains("cudaMemLocation")),
    );
    add(
        "advise_v2",
        fn_params(bindings, "cudaMemAdvise_v2").is_some_and(|p| p.contains("cudaMemLocation")),
    );
    add(
        "mem_location_union",
        struct_body(bindings, "cudaMemLocation").is_some_and(|b| !has_field(b, "id")),
    );
    add(
        "device_properties_v2",
        has_fn(bindings, "cudaGetDeviceProperties_v2"),
    );
    add(
        "error_call_requires_newer_driver",
        has_const(bindings, "cudaErrorCallRequiresNewerDriver"),
    );
    add("error_contained", has_const(bindings, "cudaErrorContained"));
    add(
        "error_tensor_memory_leak",
        has_const(bindings, "cudaErrorTensorMemoryLeak"),
    );
    add(
        "mem_pool_host",
        has_const(bindings, "cudaMemLocationTypeHost") && has_fn(bindings, "cudaMemPoolCreate"),
    );
    add(
        "mem_pool_max_size",
        struct_body(bindings, "cudaMemPoolProps").is_some_and(|b| has_field(b, "maxSize")),
    );
    found
}

/// Position just after `needle` where it is followed by a character that cannot continue an
/// identifier (so that `cudaMemAdvise` does not match `cudaMemAdvise_v2`).
fn find_word(text: &str, needle: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(needle) {
        let end = from + i + needle.len();
        let next = text[end..].chars().next();
        if !next.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return Some(end);
        }
        from = end;
    }
    None
}

fn has_fn(text: &str, name: &str) -> bool {
    find_word(text, &format!("pub fn {name}")).is_some()
}

fn has_type(text: &str, name: &str) -> bool {
    find_word(text, &format!("pub type {name}")).is_some()
}

fn has_const(text: &str, name: &str) -> bool {
    find_word(text, &format!("pub const {name}")).is_some()
}

/// The parameter list of `pub fn name(...)`, without the parentheses.
fn fn_params<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = find_word(text, &format!("pub fn {name}"))?;
    let rest = text[start..].strip_prefix('(')?;
    Some(&rest[..rest.find(')')?])
}

/// The body of `pub struct name { ... }` (bindgen never nests braces in a struct body).
fn struct_body<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = find_word(text, &format!("pub struct {name}"))?;
    let rest = text[start..].trim_start().strip_prefix('{')?;
    Some(&rest[..rest.find('}')?])
}

fn has_field(body: &str, field: &str) -> bool {
    body.split(',').any(|f| {
        f.trim()
            .strip_prefix("pub ")
            .is_some_and(|f| f.starts_with(&format!("{field}:")))
    })
}
