//! Build script of `cuda-mem-sys`: find the CUDA toolkit, generate the runtime API
//! bindings with bindgen, and link cudart.
//!
//! # Metadata for dependants (`links = "cudart"`)
//!
//! Crates that depend on `cuda-mem-sys` directly receive, in their own build scripts:
//!
//! | variable | value |
//! |---|---|
//! | `DEP_CUDART_ROOT` | the toolkit root that was found (empty with fallback bindings) |
//! | `DEP_CUDART_INCLUDE` | its header folders, joined like `PATH` (`std::env::split_paths`) |
//! | `DEP_CUDART_VERSION` | `CUDART_VERSION` from the header, e.g. `13000` for CUDA 13.0 |
//! | `DEP_CUDART_FALLBACK` | `1` when the committed bindings were used, else `0` |
//!
//! # Environment
//!
//! - `CUDA_PATH`, `CUDA_HOME`, `CUDA_ROOT`, `CUDA_TOOLKIT_ROOT_DIR`: a toolkit root, tried
//!   in that order before `nvcc` on `PATH`, `/usr/local/cuda`, `/opt/cuda`, `/usr` and the
//!   pip wheel layout (`site-packages/nvidia/cu13`, `nvidia/cuda_runtime`).
//! - `CUDA_MEM_SYS_LINK=dynamic` (or the `dynamic-link` feature): link `libcudart.so`
//!   instead of `libcudart_static.a`.
//! - `CUDA_MEM_SYS_FALLBACK_BINDINGS=1`, or `DOCS_RS`: use the committed bindings in
//!   `src/bindings/` and link nothing (documentation builds).

mod bindings;
mod link;
mod toolkit;

use std::env;
use std::ffi::OsString;
use std::path::PathBuf;

/// Reads an environment variable and tells cargo to rerun when it changes.
fn env_var(name: &str) -> Option<OsString> {
    println!("cargo:rerun-if-env-changed={name}");
    env::var_os(name)
}

fn fail(msg: &str) -> ! {
    // One readable message, not a panic backtrace: cargo prints stderr of a failed build script.
    eprintln!("\n{msg}\n");
    std::process::exit(1);
}

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build");
    println!("cargo:rerun-if-changed=src/bindings");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let fallback = env_var("DOCS_RS").is_some()
        || env_var("CUDA_MEM_SYS_FALLBACK_BINDINGS").is_some_and(|v| v != "0" && !v.is_empty());
    if fallback {
        println!("cargo:rustc-cfg=cuda_mem_sys_fallback");
        println!("cargo:rustc-check-cfg=cfg(cuda_mem_sys_fallback)");
        println!("cargo:root=");
        println!("cargo:include=");
        println!("cargo:version={}", bindings::FALLBACK_VERSION);
        println!("cargo:fallback=1");
        return;
    }
    println!("cargo:rustc-check-cfg=cfg(cuda_mem_sys_fallback)");

    let inputs = toolkit::Inputs {
        env: toolkit::ENV_VARS
            .iter()
            .map(|n| (n.to_string(), env_var(n)))
            .collect(),
        path: env_var("PATH"),
        system_dirs: toolkit::Inputs::default_system_dirs(),
        site_packages: python_site_packages(),
    };
    let tk = match toolkit::find(&inputs) {
        Ok(tk) => tk,
        Err(not_found) => fail(&not_found.to_string()),
    };
    let header = tk.include_dir().join("cuda_runtime_api.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let text = std::fs::read_to_string(&header).unwrap_or_else(|e| {
        fail(&format!(
            "cuda-mem-sys: cannot read {}: {e}",
            header.display()
        ))
    });
    let version = toolkit::parse_cudart_version(&text).unwrap_or_else(|| {
        fail(&format!(
            "cuda-mem-sys: {} has no `#define CUDART_VERSION`; is it a CUDA runtime header?",
            header.display()
        ))
    });

    if let Err(msg) = bindings::generate(&tk, &out_dir.join("bindings.rs")) {
        fail(&msg);
    }
    link::emit(&tk, env_var("CUDA_MEM_SYS_LINK"));

    let includes = env::join_paths(&tk.include_dirs).unwrap_or_default();
    println!("cargo:root={}", tk.root.display());
    println!("cargo:include={}", includes.to_string_lossy());
    println!("cargo:version={version}");
    println!("cargo:fallback=0");
    println!(
        "cargo:warning=cuda-mem-sys: CUDA {}.{} at {} (found by {})",
        version / 1000,
        version % 1000 / 10,
        tk.root.display(),
        tk.found_by
    );
}

/// Python's site-packages folders, for toolkits installed as pip wheels. Empty when there is
/// no `python3`: that search step is simply skipped.
fn python_site_packages() -> Vec<PathBuf> {
    let python = env_var("PYTHON").unwrap_or_else(|| "python3".into());
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import site,sys;print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]+sys.path))",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(PathBuf::from)
            .filter(|p| p.join("nvidia").is_dir())
            .collect(),
        _ => Vec::new(),
    }
}
