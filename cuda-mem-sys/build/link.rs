//! Linking cudart: static by default, so that executables need only the driver at run time.

use std::ffi::OsString;

use crate::toolkit::Toolkit;

/// Prints the link directives for the toolkit's cudart.
pub fn emit(tk: &Toolkit, link_env: Option<OsString>) {
    let dynamic = cfg!(feature = "dynamic-link")
        || link_env.is_some_and(|v| v.eq_ignore_ascii_case("dynamic"));
    println!("cargo:rustc-link-search=native={}", tk.lib_dir.display());
    if !dynamic && tk.lib_dir.join("libcudart_static.a").is_file() {
        println!("cargo:rustc-link-lib=static=cudart_static");
        // libcudart_static.a loads the driver with dlopen and uses POSIX threads and clocks.
        for lib in ["dl", "rt", "pthread"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
        return;
    }
    if !dynamic {
        println!(
            "cargo:warning=cuda-mem-sys: no libcudart_static.a in {}; linking libcudart.so",
            tk.lib_dir.display()
        );
    }
    if tk.lib_dir.join("libcudart.so").exists() {
        println!("cargo:rustc-link-lib=dylib=cudart");
    } else {
        // Wheels ship only the versioned name (libcudart.so.13): link it by file name.
        let versioned = std::fs::read_dir(&tk.lib_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("libcudart.so."));
        match versioned {
            Some(name) => println!("cargo:rustc-link-lib=dylib:+verbatim={name}"),
            None => println!("cargo:rustc-link-lib=dylib=cudart"),
        }
    }
    // The loader must find it at run time: LD_LIBRARY_PATH or the system's ld.so.conf.
}
