//! The part of `cuda-mem`'s build script that `cuda-mem-probes` shares (included by path):
//! turns the API features that `cuda-mem-sys` detected in the installed headers
//! (`DEP_CUDART_FEATURES`) into `cfg(cudart_<feature>)`.

/// An environment variable, registered with `rerun-if-env-changed`; empty when unset.
pub fn var(name: &str) -> String {
    println!("cargo:rerun-if-env-changed={name}");
    std::env::var(name).unwrap_or_default()
}

/// Emits `cargo:rustc-cfg=cudart_<feature>` for each detected feature, and declares every
/// feature `cuda-mem-sys` knows (`rustc-check-cfg`) so that code gated on an absent one
/// builds without warnings.
pub fn emit() {
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
