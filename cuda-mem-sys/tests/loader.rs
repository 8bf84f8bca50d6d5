//! cudart opened at run time (toolkits without `libcudart_static.a`): what is opened, and what
//! every call returns when it cannot be.
//!
//! cudart is opened once per process, at the first call, so each case runs in a child process
//! (this test executable again, filtered to one test) with its own environment. With a toolkit
//! that has `libcudart_static.a` the same cases check that the static build ignores
//! `CUDA_MEM_CUDART` and reports no load error.

use cuda_mem_sys::*;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set in the child processes.
const CHILD: &str = "CUDA_MEM_SYS_LOADER_CHILD";

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Runs the test `name` of this executable in a child process with `env` set (a `None` value
/// removes the variable), and fails unless that one test ran and passed.
fn run_child(name: &str, env: &[(&str, Option<&str>)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child `{name}` failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

fn name(e: cudaError_t) -> String {
    // SAFETY: cudaGetErrorName accepts any value and returns a static C string.
    unsafe { CStr::from_ptr(cudaGetErrorName(e)) }
        .to_string_lossy()
        .into_owned()
}

fn description(e: cudaError_t) -> String {
    // SAFETY: as for cudaGetErrorName.
    unsafe { CStr::from_ptr(cudaGetErrorString(e)) }
        .to_string_lossy()
        .into_owned()
}

fn runtime_version() -> (cudaError_t, i32) {
    let mut v = 0;
    // SAFETY: a valid out-pointer.
    let e = unsafe { cudaRuntimeGetVersion(&mut v) };
    (e, v)
}

/// A `SKIP` line that the test harness does not capture.
fn skip_linked() {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIP cudart is linked ({CUDART_LINKAGE:?}): nothing is opened at run time"
    );
}

fn loaded() -> bool {
    CUDART_LINKAGE == CudartLinkage::Loaded
}

/// A fresh folder for this process.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir()
        .join(format!("cuda-mem-sys-loader-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A stand-in `libcudart.so.N` (also its `SONAME`) built with the C compiler that links Rust
/// programs: it exports `cudaRuntimeGetVersion` (reporting `version`) and `cudaGetDeviceCount`
/// (7 devices), and no other function.
fn fake_runtime(dir: &Path, version: u32) -> PathBuf {
    let src = dir.join("fake.c");
    std::fs::write(
        &src,
        format!(
            "int cudaRuntimeGetVersion(int *v) {{ *v = {version}; return 0; }}\n\
             int cudaGetDeviceCount(int *n) {{ *n = 7; return 0; }}\n"
        ),
    )
    .unwrap();
    let soname = format!("libcudart.so.{}", CUDART_VERSION / 1000);
    let lib = dir.join(&soname);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("{cc} (the C compiler Rust links with): {e}"));
    assert!(status.success(), "{cc} failed to build {}", lib.display());
    lib
}

#[test]
fn the_file_found_at_build_time_opens_with_no_variable_set() {
    if !is_child() {
        return run_child(
            "the_file_found_at_build_time_opens_with_no_variable_set",
            &[("CUDA_MEM_CUDART", None), ("LD_LIBRARY_PATH", None)],
        );
    }
    // The first calls race on every slot: each thread must get the real function.
    let threads: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(runtime_version))
        .collect();
    for t in threads {
        let (e, v) = t.join().unwrap();
        assert_eq!(e, cudaError::cudaSuccess, "{}", name(e));
        assert_eq!(v, CUDART_VERSION as i32);
    }
    assert_eq!(runtime_load_error(), None);
    if loaded() {
        let path = runtime_library().expect("cudart was opened");
        // The build script's find, baked in (set for this package's tests too).
        let Some(built) = option_env!("CUDA_MEM_SYS_CUDART_PATH") else {
            panic!("the build script sets CUDA_MEM_SYS_CUDART_PATH in a load build");
        };
        if built.is_empty() || !std::path::Path::new(built).exists() {
            // No file found at build time, or the program runs on another machine than it
            // was built on (a bundle carried to the GPU machine): the loader's search path
            // (step 4: here the executable's run path) is what opens it.
            assert!(path.contains("libcudart.so"), "opened {path}");
        } else {
            assert_eq!(path, built, "the file found at build time is opened first");
        }
        // The real runtime answers for codes it knows.
        assert_eq!(name(cudaError::cudaErrorNoDevice), "cudaErrorNoDevice");
    } else {
        assert_eq!(runtime_library(), None);
    }
}

#[test]
fn a_bad_override_fails_every_call_with_shared_object_init_failed_and_names_the_file() {
    const BAD: &str = "/nonexistent/cuda-mem-sys-test/libcudart.so.12";
    if !is_child() {
        return run_child(
            "a_bad_override_fails_every_call_with_shared_object_init_failed_and_names_the_file",
            &[("CUDA_MEM_CUDART", Some(BAD))],
        );
    }
    let (e, _) = runtime_version();
    if !loaded() {
        // A linked cudart never reads CUDA_MEM_CUDART.
        assert_eq!(e, cudaError::cudaSuccess, "{}", name(e));
        assert_eq!(runtime_load_error(), None);
        return;
    }
    assert_eq!(e, cudaError::cudaErrorSharedObjectInitFailed);
    let mut n = -1;
    // SAFETY: a valid out-pointer.
    let e = unsafe { cudaGetDeviceCount(&mut n) };
    assert_eq!(e, cudaError::cudaErrorSharedObjectInitFailed);
    assert_eq!(n, -1, "nothing was written");
    let mut p = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the call cannot reach a runtime.
    let e = unsafe { cudaMalloc(&mut p, 1024) };
    assert_eq!(e, cudaError::cudaErrorSharedObjectInitFailed);
    assert!(p.is_null());

    let why = runtime_load_error().expect("a load error");
    assert!(
        why.contains(&format!(
            "tried CUDA_MEM_CUDART ({BAD}: cannot open shared object file: No such file"
        )),
        "the file and dlerror's text: {why}"
    );
    // Only the override is tried: not the file found at build time, nor the search path.
    assert!(
        !why.contains("found at build time") && !why.contains("search path"),
        "{why}"
    );
    assert_eq!(runtime_library(), None);
    // The error's name and text still come out, the text with the reason.
    assert_eq!(
        name(cudaError::cudaErrorSharedObjectInitFailed),
        "cudaErrorSharedObjectInitFailed"
    );
    assert_eq!(
        name(cudaError::cudaErrorMemoryAllocation),
        "cudaErrorMemoryAllocation"
    );
    assert_eq!(name(cudaError(987_654)), "unrecognized error code");
    assert_eq!(description(cudaError::cudaErrorSharedObjectInitFailed), why);
}

#[test]
fn a_runtime_without_a_function_gives_symbol_not_found_and_names_it() {
    if !is_child() {
        if !loaded() {
            skip_linked();
            return;
        }
        let lib = fake_runtime(&scratch("missing"), CUDART_VERSION);
        return run_child(
            "a_runtime_without_a_function_gives_symbol_not_found_and_names_it",
            &[("CUDA_MEM_CUDART", Some(lib.to_str().unwrap()))],
        );
    }
    let lib = std::env::var("CUDA_MEM_CUDART").unwrap();
    // The calls reach the file that was named: the stand-in reports 7 devices.
    let mut n = 0;
    // SAFETY: a valid out-pointer.
    let e = unsafe { cudaGetDeviceCount(&mut n) };
    assert_eq!((e, n), (cudaError::cudaSuccess, 7));
    assert_eq!(runtime_library(), Some(lib.as_str()));
    assert_eq!(runtime_load_error(), None, "nothing missing was called yet");
    for _ in 0..2 {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the stand-in has no cudaMalloc.
        let e = unsafe { cudaMalloc(&mut p, 1024) };
        assert_eq!(e, cudaError::cudaErrorSharedObjectSymbolNotFound);
        assert!(p.is_null());
    }
    let why = runtime_load_error().expect("the missing function is reported");
    assert!(
        why.contains(&lib) && why.contains("lacks cudaMalloc ("),
        "{why}"
    );
    // cudaGetErrorName is missing too: the header's names answer.
    assert_eq!(
        name(cudaError::cudaErrorSharedObjectSymbolNotFound),
        "cudaErrorSharedObjectSymbolNotFound"
    );
    assert!(runtime_load_error()
        .unwrap()
        .contains("cudaMalloc, cudaGetErrorName ("));
}

#[test]
fn a_runtime_of_another_major_version_is_refused() {
    if !is_child() {
        if !loaded() {
            skip_linked();
            return;
        }
        let other = (CUDART_VERSION / 1000 + 1) * 1000;
        let lib = fake_runtime(&scratch("major"), other);
        return run_child(
            "a_runtime_of_another_major_version_is_refused",
            &[("CUDA_MEM_CUDART", Some(lib.to_str().unwrap()))],
        );
    }
    let mut n = 0;
    // SAFETY: a valid out-pointer.
    let e = unsafe { cudaGetDeviceCount(&mut n) };
    assert_eq!(
        e,
        cudaError::cudaErrorSharedObjectInitFailed,
        "the stand-in is not called"
    );
    assert_eq!(n, 0);
    let why = runtime_load_error().unwrap();
    let major = CUDART_VERSION / 1000;
    assert!(
        why.contains(&format!("it is the CUDA {}.0 runtime", major + 1))
            && why.contains(&format!("needs a CUDA {major}.x runtime")),
        "{why}"
    );
}

#[test]
fn a_library_that_is_not_cudart_is_refused() {
    if !is_child() {
        return run_child(
            "a_library_that_is_not_cudart_is_refused",
            &[("CUDA_MEM_CUDART", Some("libm.so.6"))],
        );
    }
    let (e, _) = runtime_version();
    if !loaded() {
        assert_eq!(e, cudaError::cudaSuccess, "{}", name(e));
        return;
    }
    assert_eq!(e, cudaError::cudaErrorSharedObjectInitFailed);
    let why = runtime_load_error().unwrap();
    assert!(
        why.contains("CUDA_MEM_CUDART (libm.so.6: not a CUDA runtime library"),
        "{why}"
    );
}

#[test]
fn a_runtime_already_in_the_process_is_used_instead_of_a_second_one() {
    if !is_child() {
        if !loaded() {
            skip_linked();
            return;
        }
        // Loaded before `main`, as a library that links libcudart.so.N (PyTorch's) would.
        let lib = fake_runtime(&scratch("preloaded"), CUDART_VERSION);
        return run_child(
            "a_runtime_already_in_the_process_is_used_instead_of_a_second_one",
            &[
                ("CUDA_MEM_CUDART", None),
                ("LD_PRELOAD", Some(lib.to_str().unwrap())),
                ("CUDA_MEM_SYS_TEST_PRELOADED", Some(lib.to_str().unwrap())),
            ],
        );
    }
    let lib = std::env::var("CUDA_MEM_SYS_TEST_PRELOADED").unwrap();
    let mut n = 0;
    // SAFETY: a valid out-pointer.
    let e = unsafe { cudaGetDeviceCount(&mut n) };
    assert_eq!(
        (e, n),
        (cudaError::cudaSuccess, 7),
        "the preloaded stand-in answers, not the file found at build time"
    );
    assert_eq!(runtime_library(), Some(lib.as_str()));
}

#[test]
fn c_code_that_calls_cudart_by_name_reaches_the_same_runtime() {
    // What C or C++ code compiled against the headers links to (the tests crate's references
    // do): the C symbol, which a load build defines as its forwarding function.
    extern "C" {
        #[link_name = "cudaRuntimeGetVersion"]
        fn c_cudaRuntimeGetVersion(v: *mut std::os::raw::c_int) -> cudaError_t;
    }
    const BAD: &str = "/nonexistent/cuda-mem-sys-test-c/libcudart.so.12";
    if !is_child() {
        let mut v = 0;
        // SAFETY: a valid out-pointer; the call needs no driver.
        let e = unsafe { c_cudaRuntimeGetVersion(&mut v) };
        assert_eq!((e, v), (cudaError::cudaSuccess, CUDART_VERSION as i32));
        return run_child(
            "c_code_that_calls_cudart_by_name_reaches_the_same_runtime",
            &[("CUDA_MEM_CUDART", Some(BAD))],
        );
    }
    let mut v = 0;
    // SAFETY: a valid out-pointer.
    let e = unsafe { c_cudaRuntimeGetVersion(&mut v) };
    if loaded() {
        assert_eq!(
            e,
            cudaError::cudaErrorSharedObjectInitFailed,
            "the forwarder answers"
        );
        assert!(runtime_load_error().unwrap().contains(BAD));
    } else {
        assert_eq!((e, v), (cudaError::cudaSuccess, CUDART_VERSION as i32));
    }
}
