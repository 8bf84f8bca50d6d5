//! Running bindgen over `wrapper.h`.

use std::path::Path;

use crate::toolkit::Toolkit;

/// `CUDART_VERSION` of the toolkit that `src/bindings/fallback.rs` was generated from
/// (`scripts/regen-bindings.sh`).
pub const FALLBACK_VERSION: u32 = 13000;

/// Generates the bindings into `out`; `Err` carries a message that says what to install.
pub fn generate(tk: &Toolkit, out: &Path) -> Result<(), String> {
    let mut builder = builder();
    for dir in &tk.include_dirs {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    // bindgen panics when it cannot load libclang: turn that into the install hint.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    let bindings = match result {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            return Err(format!(
                "cuda-mem-sys: bindgen could not parse {}/cuda_runtime_api.h: {e}\n\
                 Is the toolkit complete (crt/host_defines.h and the other crt/ headers)?",
                tk.include_dir().display()
            ))
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            return Err(format!(
                "cuda-mem-sys: bindgen failed: {what}\n\n\
                 bindgen needs libclang. Install it, then build again:\n\
                 \x20 - Debian/Ubuntu:  sudo apt-get install libclang-dev\n\
                 \x20 - Fedora:         sudo dnf install clang-devel\n\
                 \x20 - or set LIBCLANG_PATH to the folder that holds libclang.so\n\
                 (scripts/setup.sh in this repository installs it for you.)"
            ));
        }
    };
    bindings
        .write_to_file(out)
        .map_err(|e| format!("cuda-mem-sys: cannot write {}: {e}", out.display()))
}

/// The bindgen configuration, shared with `scripts/regen-bindings.sh` (which runs the build
/// script with `CUDA_MEM_SYS_WRITE_FALLBACK` set).
fn builder() -> bindgen::Builder {
    bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("cuda.*")
        .allowlist_type("cuda.*|CU.*")
        .allowlist_var("cuda.*|CUDA.*|CUDART_VERSION")
        // Every C enum becomes a `#[repr(transparent)]` newtype with associated constants, never
        // a Rust enum: a newer driver may return a value this header does not know (e.g. a new
        // cudaError_t), which would be undefined behaviour in a Rust enum.
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(true)
        .generate_comments(false)
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
}
