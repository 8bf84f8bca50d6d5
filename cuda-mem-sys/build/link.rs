//! How executables reach cudart: linked statically where the toolkit has `libcudart_static.a`,
//! else loaded at run time (`dlopen`), so that a program starts without `LD_LIBRARY_PATH`.
//!
//! Pure logic over the toolkit's file list, so that the tests of `cuda-mem-sys` drive it over
//! temporary folders (`tests/link_plan.rs` includes this file with `#[path]`).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::toolkit::Toolkit;

/// How cudart is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `libcudart_static.a` is linked in: executables need only the driver.
    Static,
    /// `libcudart.so` is a `NEEDED` entry of every executable: the system's loader must find it
    /// at start (asked for: `CUDA_MEM_SYS_LINK=dynamic` or the `dynamic-link` feature).
    Dynamic,
    /// Nothing is linked: `src/loader.rs` opens cudart at the first call.
    Load,
}

/// What the build script decided, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub mode: Mode,
    /// A few words for the build's summary line: the mode and, unless it is the usual static
    /// linking, why.
    pub summary: String,
    /// One sentence: why this mode (for the build's message).
    pub why: String,
    /// [`Mode::Load`]: the shared library to open first (an absolute path, baked into the
    /// crate); `None` when the toolkit has none (then only `soname` through the search path).
    pub library: Option<PathBuf>,
    /// The runtime's `SONAME` for this major version, e.g. `libcudart.so.12`: the name opened
    /// through the loader's search path when `library` cannot be opened.
    pub soname: String,
    /// Something the user should know (printed as a `cargo:warning`).
    pub warning: Option<String>,
}

/// Which values of `CUDA_MEM_SYS_LINK` mean what.
pub fn requested(link_env: Option<&OsStr>, dynamic_feature: bool) -> Result<Option<Mode>, String> {
    let Some(v) = link_env.filter(|v| !v.is_empty()) else {
        return Ok(dynamic_feature.then_some(Mode::Dynamic));
    };
    let v = v.to_string_lossy().to_ascii_lowercase();
    match v.as_str() {
        "static" => Ok(Some(Mode::Static)),
        "dynamic" => Ok(Some(Mode::Dynamic)),
        "load" | "runtime" | "dlopen" => Ok(Some(Mode::Load)),
        _ => Err(format!(
            "cuda-mem-sys: CUDA_MEM_SYS_LINK={v}: expected `static` (libcudart_static.a), \
             `load` (open libcudart.so at run time) or `dynamic` (link libcudart.so; the \
             loader must find it when the program starts)"
        )),
    }
}

/// Decides how to link the toolkit's cudart of CUDA major version `major`.
pub fn plan(tk: &Toolkit, major: u32, requested: Option<Mode>) -> Result<Plan, String> {
    let dir = &tk.lib_dir;
    let soname = format!("libcudart.so.{major}");
    let has_static = dir.join("libcudart_static.a").is_file();
    let shared = shared_library(dir, &soname);
    let mode = match requested {
        Some(Mode::Static) if !has_static => {
            return Err(format!(
                "cuda-mem-sys: CUDA_MEM_SYS_LINK=static, but {} has no libcudart_static.a \
                 (the CUDA 12.0, 12.4 and 12.6 runtime wheels, for example, ship none). Unset it: cudart is then \
                 opened at run time.",
                dir.display()
            ))
        }
        Some(m) => m,
        None if has_static => Mode::Static,
        None => Mode::Load,
    };
    let (why, warning) = match (mode, requested) {
        (Mode::Static, None) => (format!("{} has libcudart_static.a", dir.display()), None),
        (Mode::Static, Some(_)) => ("CUDA_MEM_SYS_LINK=static".to_string(), None),
        (Mode::Load, None) => (
            format!(
                "{} has no libcudart_static.a; set CUDA_MEM_CUDART to open another file",
                dir.display()
            ),
            shared.is_none().then(|| {
                format!(
                    "cuda-mem-sys: {} has neither libcudart_static.a nor {soname}: programs \
                     will open {soname} through the loader's search path (LD_LIBRARY_PATH, \
                     ld.so.conf) or the file named by CUDA_MEM_CUDART",
                    dir.display()
                )
            }),
        ),
        (Mode::Load, Some(_)) => (
            "CUDA_MEM_SYS_LINK=load; set CUDA_MEM_CUDART to open another file".to_string(),
            shared.is_none().then(|| {
                format!(
                    "cuda-mem-sys: CUDA_MEM_SYS_LINK=load, but {} has no {soname}: programs \
                     will look for it through the loader's search path",
                    dir.display()
                )
            }),
        ),
        (Mode::Dynamic, _) => (
            "CUDA_MEM_SYS_LINK=dynamic or the dynamic-link feature".to_string(),
            Some(format!(
                "cuda-mem-sys: cudart is linked dynamically, as asked: programs stop before \
                 `main` unless the loader finds {soname}: run them with \
                 LD_LIBRARY_PATH={} (or add that folder to /etc/ld.so.conf.d/). Unset \
                 CUDA_MEM_SYS_LINK (and the dynamic-link feature) to have it opened at run \
                 time instead, with no variable to set",
                dir.display()
            )),
        ),
    };
    let summary = match (mode, requested) {
        (Mode::Static, None) => "cudart linked statically".to_string(),
        (Mode::Static, Some(_)) => "cudart linked statically, as CUDA_MEM_SYS_LINK asks".into(),
        (Mode::Load, None) => "cudart opened at run time: no libcudart_static.a".into(),
        (Mode::Load, Some(_)) => "cudart opened at run time, as CUDA_MEM_SYS_LINK asks".into(),
        (Mode::Dynamic, _) => "cudart linked dynamically, as asked".into(),
    };
    Ok(Plan {
        mode,
        summary,
        why,
        library: shared,
        soname,
        warning,
    })
}

/// The shared cudart in `dir` to open at run time: the `SONAME` file (`libcudart.so.12`), else
/// the newest `libcudart.so.12.*`, else `libcudart.so` (a development symlink).
pub fn shared_library(dir: &Path, soname: &str) -> Option<PathBuf> {
    let exact = dir.join(soname);
    if exact.is_file() {
        return Some(exact);
    }
    let prefix = format!("{soname}.");
    let mut versioned: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let v: Option<Vec<u32>> = name
                .strip_prefix(&prefix)?
                .split('.')
                .map(|n| n.parse().ok())
                .collect();
            Some((v?, e.path()))
        })
        .filter(|(_, p)| p.is_file())
        .collect();
    versioned.sort();
    if let Some((_, p)) = versioned.pop() {
        return Some(p);
    }
    let dev = dir.join("libcudart.so");
    dev.is_file().then_some(dev)
}

/// Prints the link directives (and the variables `src/loader.rs` reads) for `plan`.
pub fn emit(tk: &Toolkit, plan: &Plan) {
    match plan.mode {
        Mode::Static => {
            println!("cargo:rustc-link-search=native={}", tk.lib_dir.display());
            println!("cargo:rustc-link-lib=static=cudart_static");
            // libcudart_static.a loads the driver with dlopen and uses POSIX threads and clocks.
            for lib in ["dl", "rt", "pthread"] {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
        }
        Mode::Dynamic => {
            println!("cargo:rustc-cfg=cuda_mem_sys_dynamic");
            println!("cargo:rustc-link-search=native={}", tk.lib_dir.display());
            match plan.library.as_ref().and_then(|p| p.file_name()) {
                // Wheels ship only the versioned name (libcudart.so.12): link it by file name.
                Some(name) if name != "libcudart.so" => println!(
                    "cargo:rustc-link-lib=dylib:+verbatim={}",
                    name.to_string_lossy()
                ),
                _ => println!("cargo:rustc-link-lib=dylib=cudart"),
            }
        }
        Mode::Load => {
            println!("cargo:rustc-cfg=cuda_mem_sys_load");
            // dlopen lives in libdl on glibc before 2.34.
            println!("cargo:rustc-link-lib=dylib=dl");
            let library = plan
                .library
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            println!("cargo:rustc-env=CUDA_MEM_SYS_CUDART_PATH={library}");
            println!("cargo:rustc-env=CUDA_MEM_SYS_CUDART_SONAME={}", plan.soname);
        }
    }
}

impl Mode {
    /// The word used in messages and in `DEP_CUDART_LINK`.
    pub fn word(self) -> &'static str {
        match self {
            Mode::Static => "static",
            Mode::Dynamic => "dynamic",
            Mode::Load => "load",
        }
    }
}
