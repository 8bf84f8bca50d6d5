//! Turns the API features that `cuda-mem-sys` detected in the installed headers
//! (`DEP_CUDART_FEATURES`) into `cfg(cudart_<feature>)`, with `cuda-mem`'s own build code:
//! `cudart_library` selects how the probe kernels are loaded.
#[path = "../cuda-mem/build/cudart_cfg.rs"]
mod cudart_cfg;

fn main() {
    cudart_cfg::emit();
}
