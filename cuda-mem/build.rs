//! Turns the API features that `cuda-mem-sys` detected in the installed headers
//! (`DEP_CUDART_FEATURES`, see its build script) into `cfg(cudart_<feature>)`, e.g.
//! `cudart_prefetch_location` when `cudaMemPrefetchAsync` takes a `cudaMemLocation`. Code is
//! gated on features, never on version numbers. Also passes `CUDART_VERSION` on as
//! `CUDA_MEM_CUDART_VERSION` (`BUILT_CUDART_VERSION`).
fn main() {
    let var = |name: &str| {
        println!("cargo:rerun-if-env-changed={name}");
        std::env::var(name).unwrap_or_default()
    };
    let list = |s: String| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(String::from)
            .collect()
    };
    let found = list(var("DEP_CUDART_FEATURES"));
    for name in list(var("DEP_CUDART_KNOWN_FEATURES")).iter().chain(&found) {
        println!("cargo:rustc-check-cfg=cfg(cudart_{name})");
    }
    for name in &found {
        println!("cargo:rustc-cfg=cudart_{name}");
    }
    let version: u32 = var("DEP_CUDART_VERSION").parse().unwrap_or(13000);
    println!("cargo:rustc-env=CUDA_MEM_CUDART_VERSION={version}");
}
