//! cudart opened at run time, for toolkits without `libcudart_static.a` (the build chose
//! `CUDA_MEM_SYS_LINK=load`; see the crate docs).
//!
//! Every function of the header is a public `unsafe extern "C" fn` with bindgen's signature
//! (`cudart_fn!`, one per function, written by `build/loader.rs`), so callers see the same API
//! as a linked build, and is also exported under the C name (`cudaMalloc`), so that C or C++
//! code linked into the same program that calls cudart (the tests crate's references) reaches
//! it as it would reach a linked cudart. Each has a slot, an `AtomicPtr` that holds the
//! function to call:
//!
//! - at first a resolver (`__resolve`), which opens cudart once for the whole process
//!   ([`library`]), looks the symbol up, stores its address in the slot and calls it;
//! - then the symbol itself: a call is one load of the slot and an indirect call, no lock and
//!   no branch (the same work as a call through the PLT of a linked `libcudart.so`: a load
//!   from the GOT and an indirect jump);
//! - or, when cudart could not be opened or lacks the symbol, a stand-in (`__unavailable`)
//!   that returns [`LOAD_FAILED`] or [`SYMBOL_MISSING`] (for the few functions that return
//!   no `cudaError_t`: a null pointer or a zeroed struct; `cudaGetErrorName` and
//!   `cudaGetErrorString` answer from the header's names and the load error).
//!
//! The exported C symbols cannot capture cudart's own calls: libcudart is linked with
//! `DT_SYMBOLIC` and binds its internal calls to itself, and an executable does not put these
//! symbols in its dynamic symbol table. (A `cdylib` does export them; they forward to the same
//! runtime.)
//!
//! The slot is read with `Acquire` and written with `Release`: the thread that opened cudart
//! wrote its relocations before storing the address, and a thread that calls through that
//! address must see them.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::{cudaError, cudaError_t, CUDART_VERSION};

/// What every call returns when cudart could not be opened: `cudaErrorSharedObjectInitFailed`
/// ("initialization of a shared object failed"); [`crate::runtime_load_error`] says why.
pub(crate) const LOAD_FAILED: cudaError = cudaError::cudaErrorSharedObjectInitFailed;

/// What a call returns when the cudart that was opened lacks its symbol (a runtime older than
/// the headers the program was built with): `cudaErrorSharedObjectSymbolNotFound`.
pub(crate) const SYMBOL_MISSING: cudaError = cudaError::cudaErrorSharedObjectSymbolNotFound;

/// The environment variable that names the cudart to open, instead of the one found at build
/// time.
pub(crate) const OVERRIDE_VAR: &str = "CUDA_MEM_CUDART";

/// The file the build script found (may be empty), and the `SONAME` of its major version.
const BUILT_PATH: &str = env!("CUDA_MEM_SYS_CUDART_PATH");
const SONAME: &str = env!("CUDA_MEM_SYS_CUDART_SONAME");

/// A `dlopen` handle.
struct Handle(*mut c_void);

// SAFETY: a dlopen handle is an opaque token of the process's loader, valid on every thread;
// dlsym is thread-safe. It is never closed.
unsafe impl Send for Handle {}
// SAFETY: as for Send: only dlsym reads it, which may run on several threads at once.
unsafe impl Sync for Handle {}

/// The opened cudart.
pub(crate) struct Library {
    handle: Handle,
    /// The file that was opened (from `dladdr`, else the name given to `dlopen`).
    pub(crate) path: String,
}

/// cudart, opened at the first call of any of its functions; `Err` says why it could not be.
pub(crate) fn library() -> &'static Result<Library, String> {
    static LIBRARY: OnceLock<Result<Library, String>> = OnceLock::new();
    LIBRARY.get_or_init(open)
}

/// Tries `$CUDA_MEM_CUDART` alone when it is set; else a cudart of this major version that is
/// already in the process (loaded by another library, e.g. PyTorch's: one runtime, not two),
/// then the file found at build time, then the `SONAME` through the loader's search path
/// (`LD_LIBRARY_PATH`, the executable's run path, `ld.so.cache`).
fn open() -> Result<Library, String> {
    // (name given to dlopen, where it comes from)
    let mut candidates: Vec<(String, &str)> = Vec::new();
    match std::env::var_os(OVERRIDE_VAR) {
        Some(v) if !v.is_empty() => {
            candidates.push((v.to_string_lossy().into_owned(), OVERRIDE_VAR));
        }
        _ => {
            if let Some(lib) = already_loaded() {
                return Ok(lib);
            }
            if !BUILT_PATH.is_empty() {
                candidates.push((BUILT_PATH.to_string(), "the file found at build time"));
            }
            candidates.push((SONAME.to_string(), "the loader's search path"));
        }
    }
    let mut tried = Vec::new();
    for (name, what) in &candidates {
        match open_one(name) {
            Ok(lib) => return Ok(lib),
            Err(why) => tried.push(format!("{what} ({name}: {why})")),
        }
    }
    Err(format!(
        "cuda-mem-sys could not open the CUDA runtime library, tried {}. Set {OVERRIDE_VAR} to \
         the path of a {SONAME} (CUDA {}.x)",
        tried.join(", then "),
        CUDART_VERSION / 1000
    ))
}

/// The text of the last `dl*` failure on this thread.
fn dlerror_text() -> String {
    // SAFETY: dlerror has no preconditions; it returns null or a NUL-terminated string that
    // stays valid until the next dl* call on this thread, and is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The cudart with this major version's `SONAME` that the process has loaded already, if any
/// (and if it is a usable CUDA runtime).
fn already_loaded() -> Option<Library> {
    let soname = CString::new(SONAME).ok()?;
    // SAFETY: a NUL-terminated name; with RTLD_NOLOAD, dlopen loads nothing: it returns a
    // handle (one more reference) to an object already loaded under that name, or null.
    let handle = unsafe {
        libc::dlopen(
            soname.as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NOLOAD,
        )
    };
    if handle.is_null() {
        // Not loaded: the dlerror text of that is no news.
        let _ = dlerror_text();
        return None;
    }
    check(handle, SONAME).ok()
}

/// Opens `name` and checks that it is a CUDA runtime of the major version of the headers.
fn open_one(name: &str) -> Result<Library, String> {
    let cname = CString::new(name).map_err(|_| "the name contains a NUL byte".to_string())?;
    // SAFETY: a NUL-terminated name. dlopen runs the library's initialisers: cudart's own,
    // which never call back into this crate.
    let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // dlerror's text starts with the name, which the caller shows already.
        let e = dlerror_text();
        return Err(e
            .strip_prefix(&format!("{name}: "))
            .unwrap_or(&e)
            .to_string());
    }
    check(handle, name)
}

/// Checks that the library of `handle` (opened as `name`) is a CUDA runtime of the major
/// version of the headers.
fn check(handle: *mut c_void, name: &str) -> Result<Library, String> {
    // A handle that turns out not to be usable stays open: closing a library whose
    // initialisers ran is not safe in general, and this happens at most once per candidate.
    // SAFETY: a live handle and a NUL-terminated name.
    let sym = unsafe { libc::dlsym(handle, c"cudaRuntimeGetVersion".as_ptr()) };
    if sym.is_null() {
        return Err("not a CUDA runtime library: it has no cudaRuntimeGetVersion".to_string());
    }
    // SAFETY: `cudaRuntimeGetVersion` has this signature in every CUDA runtime.
    let get_version: unsafe extern "C" fn(*mut c_int) -> cudaError_t =
        unsafe { std::mem::transmute::<*mut c_void, _>(sym) };
    let mut version = 0;
    // SAFETY: a valid out-pointer; the call needs no driver and no device.
    let e = unsafe { get_version(&mut version) };
    if e != cudaError::cudaSuccess {
        return Err(format!(
            "cudaRuntimeGetVersion failed with cudaError_t {}",
            e.0
        ));
    }
    let want = CUDART_VERSION as c_int / 1000;
    if version / 1000 != want {
        return Err(format!(
            "it is the CUDA {}.{} runtime; this program was built against the CUDA {}.{} \
             headers and needs a CUDA {want}.x runtime",
            version / 1000,
            version % 1000 / 10,
            CUDART_VERSION / 1000,
            CUDART_VERSION % 1000 / 10
        ));
    }
    // SAFETY: Dl_info is plain data, valid zeroed; dladdr fills it for an address inside a
    // loaded object (`sym`), and its `dli_fname` then lives as long as the object, which is
    // never closed; it is copied at once.
    let path = unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(sym, &mut info) != 0 && !info.dli_fname.is_null() {
            CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned()
        } else {
            name.to_string()
        }
    };
    Ok(Library {
        handle: Handle(handle),
        path,
    })
}

/// The symbols the opened cudart lacks, in the order they were first called.
fn missing() -> &'static Mutex<Vec<&'static str>> {
    static MISSING: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    &MISSING
}

/// First call of a function: opens cudart if needed, looks `name` (NUL-terminated) up, and
/// stores in `slot` what later calls call: the symbol, or `unavailable` when cudart or the
/// symbol is missing. Returns the same pointer.
pub(crate) fn resolve(slot: &AtomicPtr<()>, name: &'static str, unavailable: *mut ()) -> *mut () {
    let f = match library() {
        Ok(lib) => {
            debug_assert!(name.ends_with('\0'));
            // SAFETY: a live handle (never closed) and a NUL-terminated name.
            let sym = unsafe { libc::dlsym(lib.handle.0, name.as_ptr().cast::<c_char>()) };
            if sym.is_null() {
                let name = name.trim_end_matches('\0');
                let mut m = missing().lock().unwrap_or_else(|p| p.into_inner());
                if !m.contains(&name) {
                    m.push(name);
                }
                unavailable
            } else {
                sym.cast::<()>()
            }
        }
        Err(_) => unavailable,
    };
    // Release: pairs with the Acquire load in `cudart_fn!`, so that a thread that calls
    // through this address sees the library as the dynamic loader set it up.
    slot.store(f, Ordering::Release);
    f
}

/// What a function that returns `cudaError_t` returns when it cannot be called.
pub(crate) fn unavailable() -> cudaError_t {
    match library() {
        Ok(_) => SYMBOL_MISSING,
        Err(_) => LOAD_FAILED,
    }
}

/// `cudaGetErrorName` without the runtime's function: the header's name of `error`, or the
/// runtime's text for a code it does not know.
pub(crate) fn error_name(error: cudaError_t) -> *const c_char {
    crate::CUDART_ERROR_NAMES
        .iter()
        .find(|(code, _)| *code == error)
        .map_or("unrecognized error code\0", |(_, name)| *name)
        .as_ptr()
        .cast()
}

/// `cudaGetErrorString` without the runtime's function: for [`LOAD_FAILED`] the reason cudart
/// could not be opened, else a fixed text.
pub(crate) fn error_string(error: cudaError_t) -> *const c_char {
    static LOAD_ERROR: OnceLock<CString> = OnceLock::new();
    if let (true, Err(why)) = (error == LOAD_FAILED, library()) {
        let text = LOAD_ERROR.get_or_init(|| {
            CString::new(why.replace('\0', " ")).unwrap_or_else(|_| CString::default())
        });
        return text.as_ptr();
    }
    if error == SYMBOL_MISSING {
        return c"a function is missing from the CUDA runtime library that was opened \
                 (cuda_mem_sys::runtime_load_error names it)"
            .as_ptr();
    }
    c"no description: the CUDA runtime library is not loaded (see cuda_mem_sys::runtime_load_error)"
        .as_ptr()
}

/// See [`crate::runtime_load_error`].
pub(crate) fn load_error() -> Option<String> {
    match library() {
        Err(why) => Some(why.clone()),
        Ok(lib) => {
            let m = missing().lock().unwrap_or_else(|p| p.into_inner());
            (!m.is_empty()).then(|| {
                format!(
                    "{} lacks {} (it is older than the CUDA {}.{} headers this program was \
                     built against); such calls return cudaErrorSharedObjectSymbolNotFound",
                    lib.path,
                    m.join(", "),
                    CUDART_VERSION / 1000,
                    CUDART_VERSION % 1000 / 10
                )
            })
        }
    }
}

/// One public function of the runtime API, forwarded through its slot (see the module docs).
/// `$unavailable` is what the call returns when cudart or the symbol is missing; it may read
/// the arguments.
macro_rules! cudart_fn {
    (fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $unavailable:expr) => {
        #[inline]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            type __Fn = unsafe extern "C" fn($($ty),*) -> $ret;
            /// cudart's own symbol name, for C and C++ code in the same program compiled
            /// against the headers (`DEP_CUDART_INCLUDE`): it links to this as it would to a
            /// linked cudart. (A separate function, so that `$name` itself stays inlinable:
            /// `#[inline]` is ignored on an exported function.)
            #[export_name = stringify!($name)]
            unsafe extern "C" fn __c_symbol($($arg: $ty),*) -> $ret {
                // SAFETY: the C caller upholds the C function's contract.
                unsafe { $name($($arg),*) }
            }
            /// The slot's first value: opens and looks up, then calls what it found.
            unsafe extern "C" fn __resolve($($arg: $ty),*) -> $ret {
                let f = $crate::loader::resolve(
                    &__SLOT,
                    concat!(stringify!($name), "\0"),
                    __unavailable as *mut (),
                );
                // SAFETY: `resolve` returns the address of the symbol `$name` of cudart, which
                // the header that bindgen read declares with exactly this signature, or
                // `__unavailable`, which has it.
                let f = unsafe { ::core::mem::transmute::<*mut (), __Fn>(f) };
                // SAFETY: the caller of `$name` upholds the C function's contract.
                unsafe { f($($arg),*) }
            }
            /// What the call returns when cudart or the symbol is missing.
            #[allow(unused_variables)]
            unsafe extern "C" fn __unavailable($($arg: $ty),*) -> $ret {
                $unavailable
            }
            static __SLOT: ::core::sync::atomic::AtomicPtr<()> =
                ::core::sync::atomic::AtomicPtr::new(__resolve as *mut ());
            // SAFETY: the slot only ever holds `__resolve`, `__unavailable` or the address
            // of the symbol `$name` (stored by `resolve`), all functions of type `__Fn`.
            // Acquire pairs with the Release store in `resolve`.
            let f = unsafe {
                ::core::mem::transmute::<*mut (), __Fn>(
                    __SLOT.load(::core::sync::atomic::Ordering::Acquire),
                )
            };
            // SAFETY: the caller of `$name` upholds the C function's contract.
            unsafe { f($($arg),*) }
        }
    };
}
