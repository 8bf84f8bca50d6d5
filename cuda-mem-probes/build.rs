//! Turns the API features that `cuda-mem-sys` detected in the installed headers
//! (`DEP_CUDART_FEATURES`) into `cfg(cudart_<feature>)`, as `cuda-mem`'s build script does:
//! `cudart_library` selects how the probe kernels are loaded.
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
}
