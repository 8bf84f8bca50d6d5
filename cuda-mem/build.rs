//! Turns the toolkit version published by `cuda-mem-sys` (`DEP_CUDART_VERSION`) into cfgs:
//!
//! - `cuda_13`: CUDA 13.0 or newer (`cudaMemPrefetchAsync`/`cudaMemAdvise` take a
//!   `cudaMemLocation`);
//! - `cuda_12`: CUDA 12.x (they take an `int` device).
fn main() {
    println!("cargo:rustc-check-cfg=cfg(cuda_12)");
    println!("cargo:rustc-check-cfg=cfg(cuda_13)");
    println!("cargo:rerun-if-env-changed=DEP_CUDART_VERSION");
    let version: u32 = std::env::var("DEP_CUDART_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(13000);
    if version >= 13000 {
        println!("cargo:rustc-cfg=cuda_13");
    } else {
        println!("cargo:rustc-cfg=cuda_12");
    }
    println!("cargo:rustc-env=CUDA_MEM_CUDART_VERSION={version}");
}
