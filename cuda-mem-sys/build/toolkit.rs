//! Finding the CUDA toolkit.
//!
//! Pure logic over an environment lookup and the file system, so that the
//! integration tests of `cuda-mem-sys` can drive it over temporary folders
//! (`tests/discovery.rs` includes this file with `#[path]`).

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variables consulted, in order. Each one is registered with
/// `cargo:rerun-if-env-changed` by the caller's lookup function.
pub const ENV_VARS: [&str; 4] = [
    "CUDA_PATH",
    "CUDA_HOME",
    "CUDA_ROOT",
    "CUDA_TOOLKIT_ROOT_DIR",
];

/// Folders, below a candidate root, that may hold cudart.
pub const LIB_DIRS: [&str; 3] = ["lib64", "lib", "lib/x86_64-linux-gnu"];

/// Subfolders of a Python `site-packages` folder where NVIDIA's wheels put the runtime:
/// `nvidia/cu13` (CUDA 13 wheels) and `nvidia/cuda_runtime` (CUDA 12 wheels).
pub const WHEEL_DIRS: [&str; 2] = ["nvidia/cu13", "nvidia/cuda_runtime"];

/// Wheel folders that may hold the `crt/` headers that `cuda_runtime_api.h` includes, for
/// the CUDA 12 layout where they ship in the compiler's wheel.
pub const WHEEL_CRT_DIRS: [&str; 2] = ["nvidia/cuda_nvcc/include", "nvidia/cuda_crt/include"];

/// A toolkit that has the runtime API header and cudart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolkit {
    /// The root folder (the one with `include/`).
    pub root: PathBuf,
    /// Header folders to pass to the compiler, `root/include` first.
    pub include_dirs: Vec<PathBuf>,
    /// The folder that holds cudart.
    pub lib_dir: PathBuf,
    /// How the toolkit was found, for messages.
    pub found_by: String,
}

impl Toolkit {
    /// The first include folder, the one with `cuda_runtime_api.h`.
    pub fn include_dir(&self) -> &Path {
        &self.include_dirs[0]
    }
}

/// What was tried when no toolkit was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    /// One line per candidate: where, and why it did not count.
    pub tried: Vec<String>,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "cuda-mem-sys: no CUDA toolkit found.")?;
        writeln!(f)?;
        writeln!(
            f,
            "A toolkit counts when it has include/cuda_runtime_api.h and cudart \
             (libcudart_static.a or libcudart.so) in lib64/, lib/ or lib/x86_64-linux-gnu/ \
             (or both in {TARGET_SUBDIR}/). CUDA 12.0 or newer is supported."
        )?;
        writeln!(f, "Tried, in order:")?;
        for t in &self.tried {
            writeln!(f, "  - {t}")?;
        }
        writeln!(f)?;
        writeln!(f, "Install one of these, then build again:")?;
        writeln!(
            f,
            "  - Debian/Ubuntu packages:  sudo apt-get install nvidia-cuda-toolkit"
        )?;
        writeln!(
            f,
            "  - NVIDIA's installer or repository: https://developer.nvidia.com/cuda-downloads \
             (installs /usr/local/cuda)"
        )?;
        writeln!(
            f,
            "  - the runtime wheels (no GPU needed to build):  python3 -m pip install \
             nvidia-cuda-runtime nvidia-cuda-crt   (CUDA 13.x; for 12.x: \
             nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12)"
        )?;
        writeln!(
            f,
            "    or, in this repository, scripts/setup.sh (puts CUDA 13.0 in .cuda/13.0; \
             CUDA_MEM_CUDA=12.4 scripts/setup.sh for another version)"
        )?;
        writeln!(
            f,
            "  - conda:  conda install -c nvidia cuda-cudart-dev cuda-nvcc   \
             (in the active environment: $CONDA_PREFIX)"
        )?;
        writeln!(f)?;
        write!(
            f,
            "Or point CUDA_PATH (or CUDA_HOME) at a toolkit root. To build documentation only, set \
             CUDA_MEM_SYS_FALLBACK_BINDINGS=1 (uses the committed bindings, links nothing)."
        )
    }
}

/// Where to look, gathered from the outside world by the caller.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// Value of each of [`ENV_VARS`], in order (`None` when unset).
    pub env: Vec<(String, Option<OsString>)>,
    /// The `PATH` variable.
    pub path: Option<OsString>,
    /// `$CONDA_PREFIX`, the active conda environment (toolkit in `targets/x86_64-linux`).
    pub conda_prefix: Option<OsString>,
    /// Toolkits installed by NVIDIA's installer or repository: `/usr/local/cuda`, then
    /// `/usr/local/cuda-X.Y` newest first, then `/opt/cuda` by default.
    pub system_dirs: Vec<PathBuf>,
    /// Python `site-packages` folders (for the wheel layout).
    pub site_packages: Vec<PathBuf>,
    /// Distribution packages, searched last: `/usr` by default (headers in `/usr/include`,
    /// cudart in `/usr/lib/x86_64-linux-gnu`).
    pub distro_dirs: Vec<PathBuf>,
}

impl Inputs {
    /// The default toolkit folders of NVIDIA's installer, in search order.
    pub fn default_system_dirs() -> Vec<PathBuf> {
        let mut dirs = vec![PathBuf::from("/usr/local/cuda")];
        dirs.extend(versioned_dirs(Path::new("/usr/local")));
        dirs.push(PathBuf::from("/opt/cuda"));
        dirs
    }

    /// The default folders of distribution packages.
    pub fn default_distro_dirs() -> Vec<PathBuf> {
        vec![PathBuf::from("/usr")]
    }
}

/// The `cuda-X.Y` folders in `parent`, newest version first (`cuda-12.10` after `cuda-13.0`,
/// before `cuda-12.9`).
pub fn versioned_dirs(parent: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut found: Vec<(Vec<u32>, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version: Option<Vec<u32>> = name
                .strip_prefix("cuda-")?
                .split('.')
                .map(|n| n.parse().ok())
                .collect();
            Some((version?, e.path()))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found.into_iter().map(|(_, p)| p).collect()
}

/// The folder among [`LIB_DIRS`] below `root` that holds cudart, if any.
pub fn cudart_dir(root: &Path) -> Option<PathBuf> {
    LIB_DIRS
        .iter()
        .map(|l| root.join(l))
        .find(|d| has_cudart(d))
}

fn has_cudart(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name == "libcudart_static.a" || name.starts_with("libcudart.so")
    })
}

/// Where a toolkit root keeps the x86-64 Linux headers and libraries when they are not in
/// `include/` and `lib64/` directly (conda, NVIDIA's cross-platform layout).
pub const TARGET_SUBDIR: &str = "targets/x86_64-linux";

/// Checks one candidate root (or its [`TARGET_SUBDIR`]); `Err` says why it does not count.
pub fn check_root(root: &Path, found_by: &str) -> Result<Toolkit, String> {
    let target = root.join(TARGET_SUBDIR);
    let root = if !root.join("include/cuda_runtime_api.h").is_file()
        && target.join("include/cuda_runtime_api.h").is_file()
    {
        target.as_path()
    } else {
        root
    };
    let include = root.join("include");
    if !include.join("cuda_runtime_api.h").is_file() {
        return Err(format!(
            "{found_by}: {} has no include/cuda_runtime_api.h (nor {TARGET_SUBDIR}/include/)",
            root.display()
        ));
    }
    let Some(lib_dir) = cudart_dir(root) else {
        return Err(format!(
            "{found_by}: {} has the headers but no cudart in lib64/, lib/ or lib/x86_64-linux-gnu/",
            root.display()
        ));
    };
    Ok(Toolkit {
        root: root.to_path_buf(),
        include_dirs: vec![include],
        lib_dir,
        found_by: found_by.to_string(),
    })
}

/// Searches in the documented order and returns the first toolkit that counts.
pub fn find(inputs: &Inputs) -> Result<Toolkit, NotFound> {
    let mut tried = Vec::new();
    let attempt = |root: &Path, by: &str, tried: &mut Vec<String>| match check_root(root, by) {
        Ok(t) => Some(t),
        Err(why) => {
            tried.push(why);
            None
        }
    };

    for (name, value) in &inputs.env {
        match value {
            Some(v) if !v.is_empty() => {
                if let Some(t) = attempt(Path::new(v), &format!("${name}"), &mut tried) {
                    return Ok(t);
                }
            }
            _ => tried.push(format!("${name}: not set")),
        }
    }

    let mut nvcc_seen = false;
    if let Some(path) = &inputs.path {
        for dir in std::env::split_paths(path) {
            if dir.join("nvcc").is_file() {
                nvcc_seen = true;
                if let Some(root) = dir.parent() {
                    if let Some(t) = attempt(root, "nvcc on PATH", &mut tried) {
                        return Ok(t);
                    }
                }
            }
        }
    }
    if !nvcc_seen {
        tried.push("nvcc on PATH: not found".to_string());
    }

    match &inputs.conda_prefix {
        Some(prefix) if !prefix.is_empty() => {
            if let Some(t) = attempt(Path::new(prefix), "$CONDA_PREFIX (conda)", &mut tried) {
                return Ok(t);
            }
        }
        _ => tried.push("$CONDA_PREFIX (conda): not set".to_string()),
    }

    for dir in &inputs.system_dirs {
        if let Some(t) = attempt(dir, &dir.display().to_string(), &mut tried) {
            return Ok(t);
        }
    }

    for site in &inputs.site_packages {
        for sub in WHEEL_DIRS {
            let root = site.join(sub);
            if !root.is_dir() {
                continue;
            }
            if let Some(mut t) = attempt(&root, "pip wheel", &mut tried) {
                for crt in WHEEL_CRT_DIRS {
                    let extra = site.join(crt);
                    if extra.join("crt").is_dir() {
                        t.include_dirs.push(extra);
                    }
                }
                return Ok(t);
            }
        }
    }
    if inputs.site_packages.is_empty() {
        tried.push(
            "pip wheels (nvidia/cu13, nvidia/cuda_runtime): none in the active Python \
                   environment ($PYTHON, else python3 on PATH)"
                .into(),
        );
    } else {
        tried.push(format!(
            "pip wheels: no nvidia/cu13 or nvidia/cuda_runtime with cudart in {}",
            inputs
                .site_packages
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }

    for dir in &inputs.distro_dirs {
        let by = format!("{} (distribution packages)", dir.display());
        if let Some(t) = attempt(dir, &by, &mut tried) {
            return Ok(t);
        }
    }

    Err(NotFound { tried })
}

/// Reads `#define CUDART_VERSION <n>` from `cuda_runtime_api.h` (e.g. 13000 for 13.0).
pub fn parse_cudart_version(header: &str) -> Option<u32> {
    header.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next()? != "#define" || words.next()? != "CUDART_VERSION" {
            return None;
        }
        words.next()?.parse().ok()
    })
}
