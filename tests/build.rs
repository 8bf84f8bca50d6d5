//! Compiles the C++ references (the `cudaAllocMapped` helpers, struct layouts) against the
//! toolkit headers that `cuda-mem-sys` found (`DEP_CUDART_INCLUDE`). They link against the
//! same cudart as the Rust code.
fn main() {
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed=DEP_CUDART_INCLUDE");
    let includes = std::env::var_os("DEP_CUDART_INCLUDE").unwrap_or_default();
    // For the test that reads the header's documented sticky codes.
    println!(
        "cargo:rustc-env=CUDA_MEM_TESTS_INCLUDE={}",
        includes.to_string_lossy()
    );
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/alloc_mapped_ref.cpp")
        .file("csrc/layout.cpp")
        .warnings(true)
        .extra_warnings(true);
    for dir in std::env::split_paths(&includes) {
        if !dir.as_os_str().is_empty() {
            build.include(dir);
        }
    }
    build.compile("cudamem_cref");
}
