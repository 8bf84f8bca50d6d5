//! The toolkit discovery of the build script, driven over temporary folders that mimic each
//! layout it accepts (the build script's module is included as is).

#[path = "../build/toolkit.rs"]
#[allow(dead_code)]
mod toolkit;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use toolkit::{find, parse_cudart_version, versioned_dirs, Inputs};

/// A fresh empty folder under the target's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("cuda-mem-discovery-{}", std::process::id()))
        .join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn touch(path: &Path) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, b"").unwrap();
}

/// Makes `root` look like a toolkit with cudart in `lib`.
fn fake_toolkit(root: &Path, lib: &str, cudart: &str) {
    fs::create_dir_all(root.join("include")).unwrap();
    fs::write(
        root.join("include/cuda_runtime_api.h"),
        "/* fake */\n#define CUDART_VERSION 12090\n",
    )
    .unwrap();
    touch(&root.join(lib).join(cudart));
}

fn no_env() -> Vec<(String, Option<OsString>)> {
    toolkit::ENV_VARS
        .iter()
        .map(|n| (n.to_string(), None))
        .collect()
}

fn inputs() -> Inputs {
    Inputs {
        env: no_env(),
        path: None,
        conda_prefix: None,
        system_dirs: vec![],
        site_packages: vec![],
        distro_dirs: vec![],
    }
}

#[test]
fn env_vars_are_tried_in_order() {
    let base = scratch("env");
    let a = base.join("a");
    let b = base.join("b");
    fake_toolkit(&a, "lib64", "libcudart_static.a");
    fake_toolkit(&b, "lib64", "libcudart_static.a");
    let mut inp = inputs();
    // CUDA_HOME (second) is set to b, CUDA_ROOT (third) to a: CUDA_HOME wins.
    inp.env[1].1 = Some(b.clone().into());
    inp.env[2].1 = Some(a.clone().into());
    let tk = find(&inp).unwrap();
    assert_eq!(tk.root, b);
    assert_eq!(tk.found_by, "$CUDA_HOME");
    assert_eq!(tk.lib_dir, b.join("lib64"));
    // CUDA_PATH (first) pointing at a folder that is not a toolkit is skipped, and said so.
    inp.env[0].1 = Some(base.join("missing").into());
    let tk = find(&inp).unwrap();
    assert_eq!(tk.root, b);
}

#[test]
fn nvcc_on_path_gives_its_parent() {
    let base = scratch("nvcc");
    let root = base.join("cuda-12.9");
    fake_toolkit(&root, "lib64", "libcudart.so");
    touch(&root.join("bin/nvcc"));
    let mut inp = inputs();
    inp.path = Some(std::env::join_paths([base.join("elsewhere"), root.join("bin")]).unwrap());
    let tk = find(&inp).unwrap();
    assert_eq!(tk.root, root);
    assert_eq!(tk.found_by, "nvcc on PATH");
}

#[test]
fn system_dirs_and_debian_multiarch_layout() {
    let base = scratch("system");
    let usr_local = base.join("usr/local/cuda");
    let usr = base.join("usr");
    // /usr/local/cuda has headers but no cudart: it does not count.
    fs::create_dir_all(usr_local.join("include")).unwrap();
    fs::write(usr_local.join("include/cuda_runtime_api.h"), "").unwrap();
    // Ubuntu's/Debian's nvidia-cuda-toolkit: /usr/include and /usr/lib/x86_64-linux-gnu.
    fake_toolkit(&usr, "lib/x86_64-linux-gnu", "libcudart.so.12");
    let mut inp = inputs();
    inp.system_dirs = vec![usr_local.clone()];
    inp.distro_dirs = vec![usr.clone()];
    let tk = find(&inp).unwrap();
    assert_eq!(tk.root, usr);
    assert_eq!(tk.include_dirs, vec![usr.join("include")]);
    assert_eq!(tk.lib_dir, usr.join("lib/x86_64-linux-gnu"));
    assert!(
        tk.found_by.contains("distribution packages"),
        "{}",
        tk.found_by
    );
}

#[test]
fn versioned_installs_newest_first() {
    let base = scratch("versioned");
    for v in [
        "cuda-12.9",
        "cuda-13.0",
        "cuda-12.10",
        "cuda",
        "cudnn-9.1",
        "cuda-x",
    ] {
        fs::create_dir_all(base.join(v)).unwrap();
    }
    assert_eq!(
        versioned_dirs(&base),
        vec![
            base.join("cuda-13.0"),
            base.join("cuda-12.10"),
            base.join("cuda-12.9")
        ]
    );
    // Only 12.9 is a complete toolkit: it is the one found, after the others were tried.
    fake_toolkit(&base.join("cuda-12.9"), "lib64", "libcudart_static.a");
    let mut inp = inputs();
    inp.system_dirs = versioned_dirs(&base);
    let tk = find(&inp).unwrap();
    assert_eq!(tk.root, base.join("cuda-12.9"));
}

#[test]
fn conda_targets_layout() {
    // conda's cuda-cudart-dev: $CONDA_PREFIX/targets/x86_64-linux/{include,lib}.
    let prefix = scratch("conda");
    fake_toolkit(
        &prefix.join("targets/x86_64-linux"),
        "lib",
        "libcudart.so.12",
    );
    let mut inp = inputs();
    inp.conda_prefix = Some(prefix.clone().into());
    let tk = find(&inp).unwrap();
    assert_eq!(tk.root, prefix.join("targets/x86_64-linux"));
    assert_eq!(tk.lib_dir, prefix.join("targets/x86_64-linux/lib"));
    assert_eq!(tk.found_by, "$CONDA_PREFIX (conda)");
    // conda's nvcc on PATH ($CONDA_PREFIX/bin/nvcc) finds the same targets folder.
    touch(&prefix.join("bin/nvcc"));
    inp.conda_prefix = None;
    inp.path = Some(prefix.join("bin").into());
    let tk = find(&inp).unwrap();
    assert_eq!(tk.root, prefix.join("targets/x86_64-linux"));
    assert_eq!(tk.found_by, "nvcc on PATH");
}

#[test]
fn pip_wheel_layouts() {
    // CUDA 13 wheels: site-packages/nvidia/cu13/{include,lib}.
    let site13 = scratch("site13");
    fake_toolkit(&site13.join("nvidia/cu13"), "lib", "libcudart.so.13");
    let mut inp = inputs();
    inp.site_packages = vec![site13.clone()];
    let tk = find(&inp).unwrap();
    assert_eq!(tk.root, site13.join("nvidia/cu13"));
    assert_eq!(tk.include_dirs, vec![site13.join("nvidia/cu13/include")]);

    // CUDA 12 wheels: the runtime in nvidia/cuda_runtime, crt/ headers in nvidia/cuda_nvcc.
    let site12 = scratch("site12");
    fake_toolkit(
        &site12.join("nvidia/cuda_runtime"),
        "lib",
        "libcudart_static.a",
    );
    fs::create_dir_all(site12.join("nvidia/cuda_nvcc/include/crt")).unwrap();
    inp.site_packages = vec![site12.clone()];
    let tk = find(&inp).unwrap();
    assert_eq!(tk.root, site12.join("nvidia/cuda_runtime"));
    assert_eq!(
        tk.include_dirs,
        vec![
            site12.join("nvidia/cuda_runtime/include"),
            site12.join("nvidia/cuda_nvcc/include")
        ]
    );
}

#[test]
fn failure_lists_what_was_tried_and_how_to_install() {
    let base = scratch("none");
    let mut inp = inputs();
    inp.env[0].1 = Some(base.join("nope").into());
    inp.system_dirs = vec![base.join("usr/local/cuda")];
    inp.distro_dirs = vec![base.join("usr")];
    let err = find(&inp).unwrap_err();
    let msg = err.to_string();
    // 4 variables, nvcc, conda, one system folder, the wheels, one distribution folder.
    assert_eq!(err.tried.len(), 4 + 1 + 1 + 1 + 1 + 1, "{msg}");
    assert!(msg.contains("$CONDA_PREFIX (conda): not set"), "{msg}");
    assert!(msg.contains("(distribution packages)"), "{msg}");
    assert!(msg.contains("conda install"), "{msg}");
    assert!(msg.contains("CUDA_MEM_CUDA=12.4 scripts/setup.sh"), "{msg}");
    assert!(msg.contains("$CUDA_PATH: "), "{msg}");
    assert!(msg.contains("has no include/cuda_runtime_api.h"), "{msg}");
    assert!(msg.contains("$CUDA_HOME: not set"), "{msg}");
    assert!(msg.contains("nvcc on PATH: not found"), "{msg}");
    assert!(
        msg.contains("sudo apt-get install nvidia-cuda-toolkit"),
        "{msg}"
    );
    assert!(
        msg.contains("pip install nvidia-cuda-runtime nvidia-cuda-crt"),
        "{msg}"
    );
    assert!(msg.contains("cuda-downloads"), "{msg}");
    assert!(msg.contains("CUDA_MEM_SYS_FALLBACK_BINDINGS=1"), "{msg}");
}

#[test]
fn version_is_read_from_the_header() {
    assert_eq!(
        parse_cudart_version("#ifndef X\n#define CUDART_VERSION  13000\n#endif\n"),
        Some(13000)
    );
    assert_eq!(
        parse_cudart_version("#define CUDART_VERSION_MAJOR 1\n"),
        None
    );
    assert_eq!(parse_cudart_version(""), None);
}
