//! How the build script decides to reach cudart, over temporary folders shaped like each
//! toolkit's library folder (the build script's modules are included as they are).

#[path = "../build/toolkit.rs"]
#[allow(dead_code)]
mod toolkit;

#[path = "../build/link.rs"]
#[allow(dead_code)]
mod link;

use std::ffi::OsStr;
use std::fs;
use std::path::PathBuf;

use link::{plan, requested, shared_library, Mode};
use toolkit::Toolkit;

/// A toolkit whose library folder holds exactly `files` (created empty).
fn toolkit(name: &str, files: &[&str]) -> Toolkit {
    let root = std::env::temp_dir()
        .join(format!("cuda-mem-link-plan-{}", std::process::id()))
        .join(name);
    let _ = fs::remove_dir_all(&root);
    let lib = root.join("lib");
    fs::create_dir_all(&lib).unwrap();
    for f in files {
        fs::write(lib.join(f), b"").unwrap();
    }
    Toolkit {
        root: root.clone(),
        include_dirs: vec![root.join("include")],
        lib_dir: lib,
        found_by: "test".into(),
    }
}

fn lib(tk: &Toolkit, file: &str) -> Option<PathBuf> {
    Some(tk.lib_dir.join(file))
}

#[test]
fn the_static_library_is_linked_where_it_exists() {
    let tk = toolkit(
        "static",
        &["libcudart_static.a", "libcudart.so.13", "libcudart.so"],
    );
    let p = plan(&tk, 13, None).unwrap();
    assert_eq!(p.mode, Mode::Static);
    assert!(p.why.contains("has libcudart_static.a"), "{}", p.why);
    assert_eq!(p.summary, "cudart linked statically");
    assert_eq!(p.warning, None, "nothing is off");
}

#[test]
fn without_the_static_library_the_soname_file_is_opened_at_run_time() {
    // The 12.x wheels: libcudart.so.12 (and the symlink setup.sh adds).
    let tk = toolkit("wheel", &["libcudart.so.12", "libcudart.so"]);
    let p = plan(&tk, 12, None).unwrap();
    assert_eq!(p.mode, Mode::Load);
    assert_eq!(p.library, lib(&tk, "libcudart.so.12"));
    assert_eq!(p.soname, "libcudart.so.12");
    assert!(p.why.contains("no libcudart_static.a"), "{}", p.why);
    assert_eq!(
        p.summary,
        "cudart opened at run time: no libcudart_static.a"
    );
    assert_eq!(p.warning, None, "nothing is off");
}

#[test]
fn the_newest_versioned_file_stands_in_for_a_missing_soname_file() {
    let tk = toolkit(
        "versioned",
        &[
            "libcudart.so.12.4.127",
            "libcudart.so.12.10.1",
            "libcudart.so.12.9.79",
        ],
    );
    assert_eq!(
        shared_library(&tk.lib_dir, "libcudart.so.12"),
        lib(&tk, "libcudart.so.12.10.1")
    );
    // Another major version's file is never taken; the development name is the last choice.
    let tk = toolkit("other-major", &["libcudart.so.13", "libcudart.so"]);
    assert_eq!(
        shared_library(&tk.lib_dir, "libcudart.so.12"),
        lib(&tk, "libcudart.so")
    );
}

#[test]
fn a_toolkit_without_a_shared_library_warns_that_only_the_search_path_is_left() {
    let tk = toolkit("nothing", &[]);
    let p = plan(&tk, 12, None).unwrap();
    assert_eq!((p.mode, p.library), (Mode::Load, None));
    let w = p.warning.expect("a warning");
    assert!(
        w.contains("libcudart.so.12") && w.contains("CUDA_MEM_CUDART"),
        "{w}"
    );
}

#[test]
fn what_is_asked_for_wins_and_dynamic_linking_says_what_to_set() {
    let tk = toolkit("asked", &["libcudart_static.a", "libcudart.so.12"]);
    let p = plan(&tk, 12, Some(Mode::Load)).unwrap();
    assert_eq!(p.mode, Mode::Load);
    assert_eq!(p.library, lib(&tk, "libcudart.so.12"));
    let p = plan(&tk, 12, Some(Mode::Dynamic)).unwrap();
    assert_eq!(p.mode, Mode::Dynamic);
    let w = p.warning.expect("dynamic linking needs the loader's help");
    assert!(
        w.contains(&format!("LD_LIBRARY_PATH={}", tk.lib_dir.display())),
        "{w}"
    );
    // Static linking cannot be had without the static library.
    let tk = toolkit("asked-static", &["libcudart.so.12"]);
    let e = plan(&tk, 12, Some(Mode::Static)).unwrap_err();
    assert!(e.contains(&tk.lib_dir.display().to_string()), "{e}");
}

#[test]
fn the_variable_and_the_feature_are_read_exactly() {
    let os = |s: &str| Some(OsStr::new(s).to_os_string());
    assert_eq!(requested(None, false), Ok(None));
    assert_eq!(requested(os("").as_deref(), false), Ok(None));
    assert_eq!(requested(None, true), Ok(Some(Mode::Dynamic)));
    assert_eq!(
        requested(os("static").as_deref(), true),
        Ok(Some(Mode::Static))
    );
    for v in ["load", "LOAD", "runtime", "dlopen"] {
        assert_eq!(
            requested(os(v).as_deref(), false),
            Ok(Some(Mode::Load)),
            "{v}"
        );
    }
    assert_eq!(
        requested(os("Dynamic").as_deref(), false),
        Ok(Some(Mode::Dynamic))
    );
    let e = requested(os("shared").as_deref(), false).unwrap_err();
    assert!(e.contains("CUDA_MEM_SYS_LINK=shared"), "{e}");
}
