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
//! | `DEP_CUDART_LINK` | how cudart is reached: `static`, `load` (opened at run time), `dynamic`, or `none` (fallback bindings) |
//! | `DEP_CUDART_FEATURES` | the API features the headers declare, comma-separated (below) |
//! | `DEP_CUDART_KNOWN_FEATURES` | every feature name this version of the build script knows |
//!
//! Gate code on `DEP_CUDART_FEATURES`, never on the version number: the features are detected
//! from what the headers declare (functions, their parameter types, enum values, struct
//! shapes), so a toolkit that lacks something simply lacks the feature. A dependant's build
//! script turns each into a `cfg` (`cuda-mem` uses `cudart_<feature>`), declaring all of
//! `DEP_CUDART_KNOWN_FEATURES` with `cargo:rustc-check-cfg`. This crate itself is built with
//! the same `cudart_<feature>` cfgs.
//!
//! | feature | present when |
//! |---|---|
//! | `library` | `cudaLibrary_t`, `cudaKernel_t`, `cudaLibraryLoadData`, `cudaLibraryGetKernel` (12.5+) |
//! | `prefetch_location` | `cudaMemPrefetchAsync` takes a `cudaMemLocation` and flags (13.0+); else an `int` device |
//! | `prefetch_v2` | `cudaMemPrefetchAsync_v2` exists (12.2 to 12.9) |
//! | `advise_location` | `cudaMemAdvise` takes a `cudaMemLocation` (13.0+); else an `int` device |
//! | `advise_v2` | `cudaMemAdvise_v2` exists (12.2 to 12.9) |
//! | `mem_location_union` | `cudaMemLocation::id` sits in an anonymous union (13.5+): use `cudaMemLocation::new` and `cudaMemLocation::id`, which work on every layout |
//! | `device_properties_v2` | the current `cudaDeviceProp` is filled by `cudaGetDeviceProperties_v2` (12.x) |
//! | `error_call_requires_newer_driver`, `error_contained`, `error_tensor_memory_leak` | that `cudaError_t` value is declared |
//!
//! The committed fallback bindings publish the features detected from them, so documentation
//! builds see the same API as a build against CUDA 13.0.
//!
//! # Environment
//!
//! - `CUDA_PATH`, `CUDA_HOME`, `CUDA_ROOT`, `CUDA_TOOLKIT_ROOT_DIR`: a toolkit root, tried
//!   in that order before `nvcc` on `PATH`, the conda environment (`CONDA_PREFIX`, toolkit in
//!   `targets/x86_64-linux`), `/usr/local/cuda`, `/usr/local/cuda-X.Y` (newest first),
//!   `/opt/cuda`, NVIDIA's wheels in the active Python environment
//!   (`site-packages/nvidia/cu13`, `nvidia/cuda_runtime` + `nvidia/cuda_nvcc`) and last the
//!   distribution's packages (`/usr/include`, `/usr/lib/x86_64-linux-gnu`). Every root may
//!   also keep its files in `targets/x86_64-linux/`.
//! - `CUDA_MEM_SYS_LINK`: how executables reach cudart (`DEP_CUDART_LINK` tells dependants):
//!   - unset: `static` where the toolkit has `libcudart_static.a`, else `load`;
//!   - `static`: link `libcudart_static.a` (executables need only the driver);
//!   - `load`: link nothing; `src/loader.rs` opens cudart at the first call: the file found
//!     now (its absolute path is baked in), else its `SONAME` (`libcudart.so.12`) through the
//!     loader's search path, or only the file named by `CUDA_MEM_CUDART` at run time;
//!   - `dynamic` (or the `dynamic-link` feature): link `libcudart.so` as a `NEEDED` library
//!     (the system's loader must find it when the program starts: `LD_LIBRARY_PATH`).
//! - `CUDA_MEM_SYS_FALLBACK_BINDINGS=1`, or `DOCS_RS`: use the committed bindings in
//!   `src/bindings/` and link nothing (documentation builds).

mod bindings;
mod features;
mod link;
mod loader;
mod toolkit;

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

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
    println!("cargo:rustc-check-cfg=cfg(cuda_mem_sys_fallback)");
    println!("cargo:rustc-check-cfg=cfg(cuda_mem_sys_load)");
    println!("cargo:rustc-check-cfg=cfg(cuda_mem_sys_dynamic)");
    if fallback {
        println!("cargo:rustc-cfg=cuda_mem_sys_fallback");
        let committed = Path::new(&env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"))
            .join("src/bindings/fallback.rs");
        publish_features(&committed);
        println!("cargo:root=");
        println!("cargo:include=");
        println!("cargo:version={}", bindings::FALLBACK_VERSION);
        println!("cargo:fallback=1");
        println!("cargo:link=none");
        return;
    }

    let inputs = toolkit::Inputs {
        env: toolkit::ENV_VARS
            .iter()
            .map(|n| (n.to_string(), env_var(n)))
            .collect(),
        path: env_var("PATH"),
        conda_prefix: env_var("CONDA_PREFIX"),
        system_dirs: toolkit::Inputs::default_system_dirs(),
        site_packages: python_site_packages(),
        distro_dirs: toolkit::Inputs::default_distro_dirs(),
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

    let generated = out_dir.join("bindings.rs");
    if let Err(msg) = bindings::generate(&tk, &generated) {
        fail(&msg);
    }
    let found = publish_features(&generated);

    let requested = link::requested(
        env_var("CUDA_MEM_SYS_LINK").as_deref(),
        cfg!(feature = "dynamic-link"),
    )
    .unwrap_or_else(|msg| fail(&msg));
    let plan = link::plan(&tk, version / 1000, requested).unwrap_or_else(|msg| fail(&msg));
    if plan.mode == link::Mode::Load {
        let text = std::fs::read_to_string(&generated).unwrap_or_else(|e| {
            fail(&format!(
                "cuda-mem-sys: cannot read {}: {e}",
                generated.display()
            ))
        });
        let fns = loader::generate(&text).unwrap_or_else(|msg| fail(&msg));
        let out = out_dir.join("cudart_fns.rs");
        std::fs::write(&out, fns).unwrap_or_else(|e| {
            fail(&format!(
                "cuda-mem-sys: cannot write {}: {e}",
                out.display()
            ))
        });
    }
    link::emit(&tk, &plan);
    let how = match (plan.mode, &plan.library) {
        (link::Mode::Static, _) => "linked statically".to_string(),
        (link::Mode::Dynamic, _) => format!("linked dynamically ({})", plan.soname),
        (link::Mode::Load, Some(p)) => format!(
            "opened at run time: {}, else {} through the loader's search path",
            p.display(),
            plan.soname
        ),
        (link::Mode::Load, None) => format!(
            "opened at run time: {} through the loader's search path",
            plan.soname
        ),
    };
    // Seen with `cargo build -vv` (and in the build script's output file); the summary below
    // is a warning, so that it shows in every build of this workspace.
    println!("cuda-mem-sys: cudart {how}, because {}", plan.why);
    if let Some(w) = &plan.warning {
        println!("cargo:warning={w}");
    }

    let includes = env::join_paths(&tk.include_dirs).unwrap_or_default();
    println!("cargo:root={}", tk.root.display());
    println!("cargo:include={}", includes.to_string_lossy());
    println!("cargo:version={version}");
    println!("cargo:fallback=0");
    println!("cargo:link={}", plan.mode.word());
    println!(
        "cargo:warning=cuda-mem-sys: CUDA {}.{} at {} (found by {}; {}; features: {})",
        version / 1000,
        version % 1000 / 10,
        tk.root.display(),
        tk.found_by,
        plan.summary,
        found.join(" ")
    );
}

/// Detects the features the bindings in `file` declare, sets `cudart_<feature>` cfgs on this
/// crate and publishes them to dependants (`DEP_CUDART_FEATURES`).
fn publish_features(file: &Path) -> Vec<&'static str> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| {
        fail(&format!(
            "cuda-mem-sys: cannot read {}: {e}",
            file.display()
        ))
    });
    let found = features::detect(&text);
    for (name, _) in features::ALL {
        println!("cargo:rustc-check-cfg=cfg(cudart_{name})");
    }
    for name in &found {
        println!("cargo:rustc-cfg=cudart_{name}");
    }
    let known: Vec<&str> = features::ALL.iter().map(|(n, _)| *n).collect();
    println!("cargo:known_features={}", known.join(","));
    println!("cargo:features={}", found.join(","));
    found
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
