//! Turns the API features that `cuda-mem-sys` detected in the installed headers
//! (`DEP_CUDART_FEATURES`, see its build script) into `cfg(cudart_<feature>)`, e.g.
//! `cudart_prefetch_location` when `cudaMemPrefetchAsync` takes a `cudaMemLocation`. Code is
//! gated on features, never on version numbers. Also passes `CUDART_VERSION` on as
//! `CUDA_MEM_CUDART_VERSION` (`BUILT_CUDART_VERSION`).
#[path = "build/cudart_cfg.rs"]
mod cudart_cfg;

fn main() {
    cudart_cfg::emit();
    let version: u32 = cudart_cfg::var("DEP_CUDART_VERSION")
        .parse()
        .unwrap_or(13000);
    println!("cargo:rustc-env=CUDA_MEM_CUDART_VERSION={version}");
}
