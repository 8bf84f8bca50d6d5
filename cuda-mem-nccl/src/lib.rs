//! NCCL collectives (all-reduce, all-gather, broadcast) over cuda-mem device buffers.
//!
//! `libnccl.so.2` is loaded at run time ([`nccl`]), so nothing links against NCCL and a
//! machine without it gets an error, not a failure to start. The binding is a dozen
//! hand-written function types over NCCL's C API, whose ABI is stable across NCCL 2.x.
//!
//! Two ways to use it, as with NCCL itself:
//!
//! * one process drives several GPUs: [`Comm::init_all`], then collectives inside a
//!   [`Group`] (NCCL requires a group when one thread issues a collective for several ranks);
//! * one process (or thread) per GPU, possibly on different hosts: rank 0 makes a
//!   [`UniqueId`], hands it to the others (a shared file here: [`UniqueId::write_file`],
//!   [`UniqueId::read_file`]; MPI or a TCP store elsewhere), and each calls
//!   [`Comm::init_rank`]; collectives are then plain calls on the [`Comm`].
//!
//! Buffers take part through cuda-mem's device-pointer guards: a collective on a stream is
//! ordered after conflicting pending work on its buffers from other streams, and recorded on
//! them, so host access and drops wait for it. In a [`Group`] the guards are held until
//! `ncclGroupEnd`, when NCCL actually queues the work. For that reason one thread has at most
//! one open [`Group`], and the direct collectives ([`Comm::all_reduce`] and the others) are
//! refused while it is open: NCCL would only queue them at `ncclGroupEnd`, after their buffers'
//! borrows had ended (and the buffers perhaps been freed).
//!
//! NVLink multicast (NVLS) stays off: [`nccl`] refuses to load unless the launcher exported
//! `NCCL_NVLS_ENABLE=0`, so NCCL never creates multicast objects (`cuMulticastCreate`). This
//! crate never sets the variable itself: changing the environment of a running process races
//! with C code (NCCL's, CUDA's) reading it on other threads.
#![warn(missing_docs)]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::io::Write as _;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytemuck::Pod;
use cuda_mem::{Device, DeviceBuffer, DevicePtr, DevicePtrMut, DeviceRead, DeviceWrite, Stream};

/// Errors of this crate.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// `libnccl` could not be loaded, or lacks a function this crate needs.
    Load(String),
    /// An NCCL call failed.
    Nccl {
        /// The call, e.g. `ncclAllReduce`.
        call: String,
        /// The `ncclResult_t`.
        code: i32,
        /// NCCL's text for the code, and its last error message where it has one.
        message: String,
    },
    /// A cuda-mem call failed.
    Cuda(cuda_mem::Error),
    /// Misuse NCCL never saw: mismatched devices or lengths, a bad rank, a bad id file, a
    /// direct collective while a [`Group`] is open on the thread.
    Misuse(String),
    /// The loaded NCCL lacks an optional feature: [`Comm::register`] on NCCL older than 2.19
    /// (no `ncclCommRegister`). Nothing was done; the caller may go on without the feature.
    Unsupported(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Load(why) => write!(f, "cannot load NCCL: {why}"),
            Error::Nccl {
                call,
                code,
                message,
            } => write!(f, "{call} failed: ncclResult {code}: {message}"),
            Error::Cuda(e) => e.fmt(f),
            Error::Misuse(why) => f.write_str(why),
            Error::Unsupported(why) => write!(f, "not supported: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Cuda(e) => Some(e),
            _ => None,
        }
    }
}

impl From<cuda_mem::Error> for Error {
    fn from(e: cuda_mem::Error) -> Self {
        Error::Cuda(e)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

type Comm_ = *mut c_void;
type Res = c_int;

/// The NCCL functions this crate calls, resolved once.
struct Fns {
    get_version: unsafe extern "C" fn(*mut c_int) -> Res,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Res,
    comm_init_rank: unsafe extern "C" fn(*mut Comm_, c_int, UniqueId, c_int) -> Res,
    comm_init_all: unsafe extern "C" fn(*mut Comm_, c_int, *const c_int) -> Res,
    comm_destroy: unsafe extern "C" fn(Comm_) -> Res,
    get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    /// NCCL 2.13 and newer.
    get_last_error: Option<unsafe extern "C" fn(Comm_) -> *const c_char>,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm_,
        *mut c_void,
    ) -> Res,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm_,
        *mut c_void,
    ) -> Res,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm_, *mut c_void) -> Res,
    group_start: unsafe extern "C" fn() -> Res,
    group_end: unsafe extern "C" fn() -> Res,
    /// NCCL 2.19 and newer.
    comm_register: Option<unsafe extern "C" fn(Comm_, *mut c_void, usize, *mut *mut c_void) -> Res>,
    comm_deregister: Option<unsafe extern "C" fn(Comm_, *mut c_void) -> Res>,
}

/// A loaded `libnccl`.
pub struct Nccl {
    fns: Fns,
    version: i32,
    path: String,
    /// Keeps the function pointers in `fns` valid; never unloaded.
    _lib: libloading::Library,
}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nccl({} from {})", self.version_string(), self.path)
    }
}

/// The library names tried, after `$CUDA_MEM_NCCL_LIBRARY` (a path) when set: the runtime
/// name the distribution packages and the `nvidia-nccl-cu*` wheels install, then the
/// development link name.
pub const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// The environment variable that must be `0` ([`nccl`]).
pub const NVLS_VARIABLE: &str = "NCCL_NVLS_ENABLE";

/// Loads `libnccl` once per process and returns it, or why it could not be loaded.
///
/// Refuses (an [`Error::Load`] naming the variable) unless `NCCL_NVLS_ENABLE` is exactly `0`
/// in the environment, set by whoever launched the process (`NCCL_NVLS_ENABLE=0 my-job`):
/// NVLink multicast must stay off on the shared machines this crate runs on, and NCCL reads
/// the variable at communicator creation. The variable is never set here: changing the
/// environment of a running process races with C code reading it on other threads. The answer
/// is kept for the life of the process. The collectives call this themselves.
pub fn nccl() -> Result<&'static Nccl> {
    static NCCL: OnceLock<Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(load)
        .as_ref()
        .map_err(|e| Error::Load(e.clone()))
}

/// Why NCCL must not be loaded with `NCCL_NVLS_ENABLE` at `value`, if it must not.
fn nvls_refusal(value: Option<&std::ffi::OsStr>) -> Option<String> {
    const WHY: &str = "NVLink multicast must stay off on this shared machine, and cuda-mem-nccl \
                       never changes the environment of a running process (that races with \
                       C code reading it); export NCCL_NVLS_ENABLE=0 before starting the process";
    match value.map(|v| v.to_str()) {
        None => Some(format!("{NVLS_VARIABLE} is not set: {WHY}")),
        Some(Some("0")) => None,
        Some(Some(v)) => Some(format!("{NVLS_VARIABLE}={v:?}: {WHY}")),
        Some(None) => Some(format!("{NVLS_VARIABLE} is not UTF-8: {WHY}")),
    }
}

fn load() -> Result<Nccl, String> {
    if let Some(why) = nvls_refusal(std::env::var_os(NVLS_VARIABLE).as_deref()) {
        return Err(why);
    }
    let mut names: Vec<String> = Vec::new();
    if let Ok(p) = std::env::var("CUDA_MEM_NCCL_LIBRARY") {
        names.push(p);
    }
    names.extend(LIBRARY_NAMES.iter().map(|s| s.to_string()));
    let mut tried = Vec::new();
    for name in &names {
        // SAFETY: loading a shared library runs its initialisers; libnccl's only set up its
        // own state. The library is kept for the life of the process (never unloaded).
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return resolve(lib, name.clone()),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "none of {names:?} could be loaded ({}); install NCCL 2 or set CUDA_MEM_NCCL_LIBRARY \
         to the path of libnccl.so.2",
        tried.join("; ")
    ))
}

fn resolve(lib: libloading::Library, path: String) -> Result<Nccl, String> {
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is NCCL's C function of that name, and the field it is stored
            // in has the C signature of `nccl.h` (NCCL 2.x keeps these stable).
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{path} lacks {}: {e}", $name))?;
            *s
        }};
    }
    macro_rules! opt_sym {
        ($name:literal) => {{
            // SAFETY: as for `sym!`.
            unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .ok()
                .map(|s| *s)
        }};
    }
    let fns = Fns {
        get_version: sym!("ncclGetVersion"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        comm_init_all: sym!("ncclCommInitAll"),
        comm_destroy: sym!("ncclCommDestroy"),
        get_error_string: sym!("ncclGetErrorString"),
        get_last_error: opt_sym!("ncclGetLastError"),
        all_reduce: sym!("ncclAllReduce"),
        broadcast: sym!("ncclBroadcast"),
        all_gather: sym!("ncclAllGather"),
        group_start: sym!("ncclGroupStart"),
        group_end: sym!("ncclGroupEnd"),
        comm_register: opt_sym!("ncclCommRegister"),
        comm_deregister: opt_sym!("ncclCommDeregister"),
    };
    let mut version = 0;
    // SAFETY: valid out-pointer.
    let code = unsafe { (fns.get_version)(&mut version) };
    if code != 0 {
        return Err(format!("ncclGetVersion failed with ncclResult {code}"));
    }
    Ok(Nccl {
        fns,
        version,
        path,
        _lib: lib,
    })
}

impl Nccl {
    /// `ncclGetVersion`, e.g. `22803` for 2.28.3.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The version as `major.minor.patch`.
    pub fn version_string(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100)
    }

    /// The library name or path that was loaded.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether `ncclCommRegister` is available (NCCL 2.19 and newer).
    pub fn can_register(&self) -> bool {
        self.fns.comm_register.is_some() && self.fns.comm_deregister.is_some()
    }

    fn check(&self, code: Res, comm: Comm_, call: impl FnOnce() -> String) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: returns a static string for any code.
        let text = unsafe { CStr::from_ptr((self.fns.get_error_string)(code)) }
            .to_string_lossy()
            .into_owned();
        let last = match self.fns.get_last_error {
            // SAFETY: accepts a null communicator (the last error of the process); returns a
            // NUL-terminated string owned by NCCL.
            Some(get_last_error) => unsafe { get_last_error(comm) },
            None => std::ptr::null(),
        };
        let last = if last.is_null() {
            String::new()
        } else {
            // SAFETY: non-null, NUL-terminated (above).
            unsafe { CStr::from_ptr(last) }
                .to_string_lossy()
                .into_owned()
        };
        let message = if last.is_empty() {
            text
        } else {
            format!("{text} ({last})")
        };
        Err(Error::Nccl {
            call: call(),
            code,
            message,
        })
    }
}

/// Runs `f` and gives the calling thread back the device that was current before, whatever
/// `f` (NCCL) made current.
fn restoring<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    let before = Device::current()?;
    let r = f();
    if Device::current()? != before {
        before.set_current()?;
    }
    r
}

/// The 128-byte id all ranks of one communicator share (`ncclUniqueId`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    internal: [c_char; 128],
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

impl UniqueId {
    /// The size of an id in bytes.
    pub const BYTES: usize = 128;

    /// A new id (`ncclGetUniqueId`), made once by rank 0 and sent to every other rank.
    pub fn new() -> Result<Self> {
        let n = nccl()?;
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer of the C layout.
        let code = unsafe { (n.fns.get_unique_id)(&mut id) };
        n.check(code, std::ptr::null_mut(), || "ncclGetUniqueId".into())?;
        Ok(id)
    }

    /// The id's bytes, to send to other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.internal.map(|c| c as u8)
    }

    /// An id from bytes received from rank 0 (exactly [`UniqueId::BYTES`] of them).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let b: &[u8; 128] = bytes.try_into().map_err(|_| {
            Error::Misuse(format!(
                "an NCCL unique id has 128 bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(UniqueId {
            internal: b.map(|c| c as c_char),
        })
    }

    /// Writes the id to `path` atomically, so that a reader polling for the file never sees
    /// part of it: the bytes go to a new temporary file of a unique name in the same directory
    /// (`.<name>.<pid>.<nonce>.tmp`, created exclusively), which is then renamed onto `path`.
    ///
    /// The file is the whole handshake, so a file left by an earlier job would be read as
    /// this job's id by [`read_file`](Self::read_file): callers must remove it before the
    /// ranks start (and after the job), or put a per-job tag (a job id) in the file name.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        static NONCE: AtomicU64 = AtomicU64::new(0);
        let io = |e: std::io::Error| Error::Misuse(format!("writing {}: {e}", path.display()));
        let name = path.file_name().ok_or_else(|| {
            Error::Misuse(format!(
                "UniqueId::write_file: {} names no file",
                path.display()
            ))
        })?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(
            ".{}.{nanos}-{}.tmp",
            std::process::id(),
            NONCE.fetch_add(1, Ordering::Relaxed)
        ));
        let tmp = path.with_file_name(tmp_name);
        let written = (|| {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(&self.to_bytes())?;
            f.sync_all()
        })();
        let r = written.and_then(|()| std::fs::rename(&tmp, path));
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r.map_err(io)
    }

    /// Waits up to `timeout` for `path` to hold an id (exactly [`UniqueId::BYTES`] bytes),
    /// then reads it; a missing file or one of another length is retried until the timeout.
    ///
    /// A file left by an earlier job is read as if it were this job's id: see
    /// [`write_file`](Self::write_file).
    pub fn read_file(path: &Path, timeout: Duration) -> Result<Self> {
        let start = Instant::now();
        loop {
            let why = match std::fs::read(path) {
                Ok(bytes) if bytes.len() == Self::BYTES => return Self::from_bytes(&bytes),
                Ok(bytes) => format!("it has {} bytes, not {}", bytes.len(), Self::BYTES),
                Err(e) => e.to_string(),
            };
            if start.elapsed() >= timeout {
                return Err(Error::Misuse(format!(
                    "no NCCL unique id in {} after {timeout:?}: {why}",
                    path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Element types NCCL reduces (`ncclDataType_t`). Sealed.
pub trait NcclType: Pod + sealed::Sealed {
    /// The `ncclDataType_t` value.
    const DATATYPE: c_int;
}

mod sealed {
    pub trait Sealed {}

    /// Proof of being this crate: only it can make one, so only it can call
    /// [`BufferMut::buffer_mut`](super::BufferMut::buffer_mut).
    pub struct Token(pub(crate) ());
}

/// A buffer a collective writes: a [`DeviceBuffer`], or a [`Registered`] one. Sealed.
///
/// A [`Registered`] buffer gives safe code no `&mut DeviceBuffer` (which would let it swap out,
/// and free, the allocation NCCL has registered): only the collectives reach it, through this
/// trait, whose method only this crate can call.
pub trait BufferMut<T: NcclType>: sealed::Sealed {
    /// The buffer. Callable only from this crate (the token).
    #[doc(hidden)]
    fn buffer_mut(&mut self, token: sealed::Token) -> &mut DeviceBuffer<T>;
}

impl<T: NcclType> sealed::Sealed for DeviceBuffer<T> {}
impl<T: NcclType> BufferMut<T> for DeviceBuffer<T> {
    fn buffer_mut(&mut self, _: sealed::Token) -> &mut DeviceBuffer<T> {
        self
    }
}

impl<T: NcclType> sealed::Sealed for Registered<'_, T> {}
impl<T: NcclType> BufferMut<T> for Registered<'_, T> {
    fn buffer_mut(&mut self, _: sealed::Token) -> &mut DeviceBuffer<T> {
        &mut self.buf
    }
}

fn mut_of<T: NcclType, B: BufferMut<T> + ?Sized>(b: &mut B) -> &mut DeviceBuffer<T> {
    b.buffer_mut(sealed::Token(()))
}

macro_rules! nccl_types {
    ($($t:ty => $v:expr),+) => {$(
        impl sealed::Sealed for $t {}
        impl NcclType for $t {
            const DATATYPE: c_int = $v;
        }
    )+};
}
nccl_types!(i8 => 0, u8 => 1, i32 => 2, u32 => 3, i64 => 4, u64 => 5, f32 => 7, f64 => 8);

/// A reduction (`ncclRedOp_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg` (floating-point types).
    Avg,
}

impl ReduceOp {
    fn raw(self) -> c_int {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
            ReduceOp::Avg => 4,
        }
    }
}

/// One rank of an NCCL communicator, on one device; destroyed on drop (`ncclCommDestroy`).
pub struct Comm {
    raw: Comm_,
    device: Device,
    rank: i32,
    nranks: i32,
    nccl: &'static Nccl,
    /// Made by [`Comm::init_all`]: its collectives go through a [`Group`].
    grouped_only: bool,
}

// SAFETY: an `ncclComm_t` may be used from any thread, one thread at a time (NCCL's rule);
// `Comm` is not `Sync`, so safe code cannot use it from two threads at once.
unsafe impl Send for Comm {}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Comm(rank {}/{} on device {})",
            self.rank,
            self.nranks,
            self.device.ordinal()
        )
    }
}

impl Comm {
    /// One communicator per device of `devices`, all in this process (`ncclCommInitAll`);
    /// rank `i` is on `devices[i]`. Collectives on them must be issued inside a [`Group`]
    /// (with more than one device, the direct collectives refuse them: one thread issuing
    /// a collective for one rank alone would wait forever for the others).
    ///
    /// Should `ncclCommInitAll` succeed and giving the thread back its current device then
    /// fail (a CUDA error), the communicators are leaked (never destroyed) and the error
    /// returned.
    pub fn init_all(devices: &[Device]) -> Result<Vec<Comm>> {
        let n = nccl()?;
        refuse_in_group("Comm::init_all")?;
        if devices.is_empty() {
            return Err(Error::Misuse("Comm::init_all: no devices".into()));
        }
        let list: Vec<c_int> = devices.iter().map(|d| d.ordinal()).collect();
        let mut raw: Vec<Comm_> = vec![std::ptr::null_mut(); devices.len()];
        let nranks = devices.len() as c_int;
        restoring(|| {
            // SAFETY: `raw` holds `nranks` out-slots and `list` `nranks` device ordinals.
            let code = unsafe { (n.fns.comm_init_all)(raw.as_mut_ptr(), nranks, list.as_ptr()) };
            n.check(code, std::ptr::null_mut(), || {
                format!("ncclCommInitAll({list:?})")
            })
        })?;
        Ok(raw
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (raw, &device))| Comm {
                raw,
                device,
                rank: rank as i32,
                nranks,
                nccl: n,
                grouped_only: true,
            })
            .collect())
    }

    /// Rank `rank` of `nranks` on `device` (`ncclCommInitRank`, with `device` current for the
    /// call). Blocks until every rank has joined with the same `id`; ranks may be other
    /// processes, on other hosts. Refused while a [`Group`] is open on this thread.
    ///
    /// Should `ncclCommInitRank` succeed and giving the thread back its current device then
    /// fail (a CUDA error), the communicator is leaked (never destroyed) and the error
    /// returned.
    pub fn init_rank(device: Device, nranks: i32, rank: i32, id: &UniqueId) -> Result<Comm> {
        let n = nccl()?;
        refuse_in_group("Comm::init_rank")?;
        if nranks < 1 || rank < 0 || rank >= nranks {
            return Err(Error::Misuse(format!(
                "Comm::init_rank: rank {rank} is not in 0..{nranks}"
            )));
        }
        let mut raw: Comm_ = std::ptr::null_mut();
        restoring(|| {
            let _g = device.guard()?;
            // SAFETY: valid out-pointer; the id is passed by value, as the C API takes it.
            let code = unsafe { (n.fns.comm_init_rank)(&mut raw, nranks, *id, rank) };
            n.check(code, std::ptr::null_mut(), || {
                format!("ncclCommInitRank(nranks {nranks}, rank {rank})")
            })
        })?;
        Ok(Comm {
            raw,
            device,
            rank,
            nranks,
            nccl: n,
            grouped_only: false,
        })
    }

    /// The device of this rank.
    pub fn device(&self) -> Device {
        self.device
    }

    /// This rank.
    pub fn rank(&self) -> i32 {
        self.rank
    }

    /// The number of ranks.
    pub fn nranks(&self) -> i32 {
        self.nranks
    }

    /// The raw `ncclComm_t`, for NCCL calls this crate does not wrap. Stays owned by `self`.
    pub fn as_raw(&self) -> *mut c_void {
        self.raw
    }

    fn check_device(&self, op: &str, what: &str, found: cuda_mem::Device) -> Result<()> {
        if found != self.device {
            return Err(Error::Misuse(format!(
                "{op}: the {what} is on device {}, the communicator's rank {} on device {}",
                found.ordinal(),
                self.rank,
                self.device.ordinal()
            )));
        }
        Ok(())
    }

    fn check_stream(&self, op: &str, stream: &Stream) -> Result<()> {
        self.check_device(op, "stream", stream.device())
    }

    /// A direct (ungrouped) collective, `op` for errors: refused where NCCL would not run it at
    /// once (while a [`Group`] is open on this thread, or on one of several communicators of
    /// [`Comm::init_all`]), else [`launch`](Self::launch)ed, its guards dropped after the call.
    fn direct<'a, T: NcclType>(
        &self,
        op: &str,
        call: Call<'a, T>,
        recv: &'a mut DeviceBuffer<T>,
        stream: &Stream,
    ) -> Result<()> {
        refuse_direct(op, self.grouped_only, self.nranks)?;
        restoring(|| self.launch(call, recv, stream).map(drop))
    }

    /// Sums (or `op`s) `send` across all ranks into `recv` on every rank (`ncclAllReduce`).
    ///
    /// The direct collectives are for one rank per process or thread ([`Comm::init_rank`]):
    /// they are refused while a [`Group`] is open on this thread (NCCL would only queue them
    /// at `ncclGroupEnd`, after their borrows of the buffers end), and on communicators of
    /// [`Comm::init_all`] (use [`Group::all_reduce`] and the others).
    pub fn all_reduce<T: NcclType>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut impl BufferMut<T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.direct(
            "Comm::all_reduce",
            Call::AllReduce {
                send: Some(send),
                op,
            },
            mut_of(recv),
            stream,
        )
    }

    /// [`all_reduce`](Self::all_reduce) with `buf` as both input and output.
    pub fn all_reduce_in_place<T: NcclType>(
        &self,
        buf: &mut impl BufferMut<T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.direct(
            "Comm::all_reduce_in_place",
            Call::AllReduce { send: None, op },
            mut_of(buf),
            stream,
        )
    }

    /// Gathers every rank's `send` into `recv` on every rank, rank `r`'s at
    /// `recv[r * send.len()..]` (`ncclAllGather`); `recv` holds `nranks * send.len()`.
    /// Refused where [`all_reduce`](Self::all_reduce) is.
    pub fn all_gather<T: NcclType>(
        &self,
        send: &DeviceBuffer<T>,
        recv: &mut impl BufferMut<T>,
        stream: &Stream,
    ) -> Result<()> {
        self.direct(
            "Comm::all_gather",
            Call::AllGather { send },
            mut_of(recv),
            stream,
        )
    }

    /// Copies rank `root`'s `buf` into `buf` on every rank (`ncclBroadcast`, in place).
    /// Refused where [`all_reduce`](Self::all_reduce) is.
    pub fn broadcast_in_place<T: NcclType>(
        &self,
        buf: &mut impl BufferMut<T>,
        root: i32,
        stream: &Stream,
    ) -> Result<()> {
        self.direct(
            "Comm::broadcast_in_place",
            Call::BroadcastInPlace { root },
            mut_of(buf),
            stream,
        )
    }

    /// Issues `call` on `stream`, writing `recv`: checks that the stream and the buffers are on
    /// this rank's device and that the lengths (or the root) fit the call, takes the buffers'
    /// device-pointer guards and makes the NCCL call. The guards are returned: dropping them
    /// records the work on the buffers, so a [`Group`] keeps them until `ncclGroupEnd`.
    fn launch<'a, T: NcclType>(
        &self,
        call: Call<'a, T>,
        recv: &'a mut DeviceBuffer<T>,
        stream: &Stream,
    ) -> Result<Guards<'a, T>> {
        let (op, send) = match call {
            Call::AllReduce {
                send: Some(send), ..
            } => ("ncclAllReduce", Some(send)),
            Call::AllReduce { send: None, .. } => ("ncclAllReduce (in place)", None),
            Call::AllGather { send } => ("ncclAllGather", Some(send)),
            Call::BroadcastInPlace { .. } => ("ncclBroadcast (in place)", None),
        };
        self.check_stream(op, stream)?;
        match send {
            Some(send) => {
                self.check_device(op, "send buffer", send.device())?;
                self.check_device(op, "receive buffer", recv.device())?;
            }
            None => self.check_device(op, "buffer", recv.device())?,
        }
        let misfit = match call {
            Call::AllReduce {
                send: Some(send), ..
            } if send.len() != recv.len() => Some(format!(
                "send has {} elements, receive {}",
                send.len(),
                recv.len()
            )),
            Call::AllGather { send }
                if send.len().checked_mul(self.nranks as usize) != Some(recv.len()) =>
            {
                Some(format!(
                    "the receive buffer needs {} ranks x {} elements, has {}",
                    self.nranks,
                    send.len(),
                    recv.len()
                ))
            }
            Call::BroadcastInPlace { root } if root < 0 || root >= self.nranks => {
                Some(format!("root {root} is not in 0..{}", self.nranks))
            }
            _ => None,
        };
        if let Some(why) = misfit {
            return Err(Error::Misuse(format!("{op}: {why}")));
        }
        let s = send.map(|s| s.device_ptr(stream)).transpose()?;
        let r = recv.device_ptr_mut(stream)?;
        let rp = r.as_mut_ptr().cast::<c_void>();
        // In place, NCCL reads the buffer it writes.
        let (sp, count) = match &s {
            Some(s) => (s.as_ptr().cast::<c_void>(), s.len()),
            None => (rp.cast_const(), r.len()),
        };
        let (fns, comm, st) = (&self.nccl.fns, self.raw, stream.as_raw().cast());
        // SAFETY: `sp` and `rp` are the addresses of the guards above, of live buffers on the
        // comm's device (checked above). `sp` covers `count` elements; `rp` covers `count` too
        // (all-reduce: lengths checked equal; in place: the same buffer), or `nranks * count`
        // for the all-gather (checked above). NCCL allows send == recv (in place) for
        // all-reduce and broadcast. The guards order `stream` after conflicting work and record
        // the collective when they drop (after the call, or after `ncclGroupEnd` in a group).
        let code = unsafe {
            match call {
                Call::AllReduce { op, .. } => {
                    (fns.all_reduce)(sp, rp, count, T::DATATYPE, op.raw(), comm, st)
                }
                Call::AllGather { .. } => (fns.all_gather)(sp, rp, count, T::DATATYPE, comm, st),
                Call::BroadcastInPlace { root } => {
                    (fns.broadcast)(sp, rp, count, T::DATATYPE, root, comm, st)
                }
            }
        };
        self.nccl.check(code, comm, || match call {
            Call::AllReduce { op: red, .. } => format!("{op}({count} elements, {red:?})"),
            Call::AllGather { .. } => format!("{op}({count} elements per rank)"),
            Call::BroadcastInPlace { root } => format!("{op}({count} elements, root {root})"),
        })?;
        Ok(Guards { _send: s, _recv: r })
    }

    /// Registers `buf` with this communicator (`ncclCommRegister`, NCCL 2.19+), which lets
    /// NCCL use it without staging for some algorithms (NVLS, CollNet, zero-copy peer-to-peer
    /// and network paths). Registration costs a few milliseconds: it pays for buffers reused
    /// by many collectives. Deregistered when the returned value drops.
    ///
    /// [`Error::Unsupported`] (the buffer dropped, nothing else done) where the loaded NCCL has
    /// no `ncclCommRegister` (older than 2.19). Should registration succeed and giving the
    /// thread back its current device then fail, the buffer is leaked (never freed, as NCCL
    /// keeps it registered) and the error returned.
    pub fn register<T: NcclType>(&self, buf: DeviceBuffer<T>) -> Result<Registered<'_, T>> {
        let (Some(reg), Some(_)) = (self.nccl.fns.comm_register, self.nccl.fns.comm_deregister)
        else {
            return Err(Error::Unsupported(format!(
                "NCCL {} has no ncclCommRegister (2.19 or newer needed)",
                self.nccl.version_string()
            )));
        };
        self.check_device("ncclCommRegister", "buffer", buf.device())?;
        let mut handle = std::ptr::null_mut();
        let mut registered = false;
        let (p, bytes) = (buf.as_ptr().cast_mut().cast::<c_void>(), buf.byte_len());
        let r = restoring(|| {
            let _g = self.device.guard()?;
            // SAFETY: `p` covers `bytes` bytes of a live allocation that the `Registered`
            // value owns (or that is leaked below), so it outlives the registration; valid
            // out-pointer.
            let code = unsafe { reg(self.raw, p, bytes, &mut handle) };
            registered = code == 0;
            self.nccl.check(code, self.raw, || {
                format!("ncclCommRegister({bytes} bytes)")
            })
        });
        match r {
            Ok(()) => Ok(Registered {
                buf: ManuallyDrop::new(buf),
                handle,
                comm: self,
            }),
            Err(e) => {
                if registered {
                    // NCCL holds the buffer registered: never free it.
                    std::mem::forget(buf);
                }
                Err(e)
            }
        }
    }
}

impl Drop for Comm {
    /// `ncclCommDestroy`, with the thread's current device given back afterwards. Errors are
    /// ignored (drop never panics); should the current device not be readable before the
    /// call (a CUDA error), the communicator is leaked rather than destroyed.
    fn drop(&mut self) {
        let (n, raw) = (self.nccl, self.raw);
        // SAFETY: we own the communicator and destroy it once. Errors are ignored (drop never
        // panics); the current device is restored whatever NCCL left current.
        let _ = restoring(|| Ok(unsafe { (n.fns.comm_destroy)(raw) }));
    }
}

/// A device buffer registered with a communicator ([`Comm::register`]).
///
/// It derefs to `&DeviceBuffer` (reads, copies out, a send buffer), and the collectives take
/// it as a buffer they write ([`BufferMut`]); it never gives out `&mut DeviceBuffer`, which
/// would let safe code swap the registered allocation out and free it:
///
/// ```compile_fail
/// fn swap_out(r: &mut cuda_mem_nccl::Registered<'_, f32>, o: &mut cuda_mem::DeviceBuffer<f32>) {
///     std::mem::swap(&mut **r, o); // no DerefMut
/// }
/// ```
///
/// On drop it waits for the buffer's pending work, deregisters it (`ncclCommDeregister`) and
/// frees it; should the wait or the deregistration fail, the buffer is leaked rather than
/// freed while NCCL may still hold it.
pub struct Registered<'c, T: NcclType> {
    /// Dropped (freed) only after a successful deregistration.
    buf: ManuallyDrop<DeviceBuffer<T>>,
    handle: *mut c_void,
    comm: &'c Comm,
}

impl<T: NcclType> fmt::Debug for Registered<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Registered({} elements at {:p} with {:?})",
            self.buf.len(),
            self.buf.as_ptr(),
            self.comm
        )
    }
}

impl<T: NcclType> std::ops::Deref for Registered<'_, T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        &self.buf
    }
}

impl<T: NcclType> Drop for Registered<'_, T> {
    fn drop(&mut self) {
        // Collectives still using the buffer must finish before it is deregistered; if that
        // cannot be known, keep the registration and the buffer (a leak, not a free of memory
        // NCCL may still use).
        if self.buf.synchronize().is_err() {
            return;
        }
        let Some(dereg) = self.comm.nccl.fns.comm_deregister else {
            return;
        };
        let (raw, handle, device) = (self.comm.raw, self.handle, self.comm.device);
        let code = restoring(|| {
            let _g = device.guard()?;
            // SAFETY: the handle came from `ncclCommRegister` on this comm, which outlives us
            // (borrowed); deregistered once, here.
            Ok(unsafe { dereg(raw, handle) })
        });
        if matches!(code, Ok(0)) {
            // SAFETY: NCCL no longer holds the buffer; dropped once, here, never used after.
            unsafe { ManuallyDrop::drop(&mut self.buf) }
        }
    }
}

/// [`Comm::direct`]'s refusal, on a communicator's fields (apart, to be tested without NCCL).
fn refuse_direct(op: &str, grouped_only: bool, nranks: i32) -> Result<()> {
    refuse_in_group(op)?;
    if grouped_only && nranks > 1 {
        return Err(Error::Misuse(format!(
            "{op}: this communicator is one of {nranks} made by Comm::init_all in this process; \
             a collective issued for one of them alone waits forever for the other ranks: \
             issue the collectives of all ranks in one Group (Group::start, then Group::{} \
             per rank, then Group::end)",
            op.rsplit("::").next().unwrap_or(op)
        )));
    }
    Ok(())
}

/// A collective as [`Comm::launch`] issues it: the NCCL call, its input where that is not
/// the buffer it writes, and its other arguments.
#[derive(Clone, Copy)]
enum Call<'a, T: NcclType> {
    /// `ncclAllReduce` from `send`, of the same length as the buffer written, or in place.
    AllReduce {
        send: Option<&'a DeviceBuffer<T>>,
        op: ReduceOp,
    },
    /// `ncclAllGather` from `send`; the buffer written holds `nranks * send.len()`.
    AllGather { send: &'a DeviceBuffer<T> },
    /// `ncclBroadcast` in place, from rank `root`'s buffer.
    BroadcastInPlace { root: i32 },
}

/// The device-pointer guards of one collective, kept until NCCL has queued it.
/// Never read: holding the guards is the point, and dropping them records the work.
struct Guards<'a, T> {
    _send: Option<DeviceRead<'a, T>>,
    _recv: DeviceWrite<'a, T>,
}

/// Any value: [`Guards`] type-erased, so that one group can hold guards of several element
/// types.
trait Guard {}
impl<T> Guard for T {}

thread_local! {
    /// Whether this thread has an open [`Group`] (one at most).
    static GROUP_OPEN: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread has an open [`Group`]; `true` where that cannot be known (refusing is
/// the safe answer).
fn group_open() -> bool {
    GROUP_OPEN.try_with(Cell::get).unwrap_or(true)
}

/// Refuses `op` while a [`Group`] is open on this thread.
fn refuse_in_group(op: &str) -> Result<()> {
    if group_open() {
        return Err(Error::Misuse(format!(
            "{op}: a Group is open on this thread; NCCL would only queue the call at \
             ncclGroupEnd, after this call had ended its borrows (its buffers could be freed \
             by then): issue collectives through the open Group, or end it first"
        )));
    }
    Ok(())
}

/// This thread's open group in the accounting above; marks it closed when dropped.
struct OpenGroup {
    /// Per thread, as the mark it clears.
    _not_send: PhantomData<*const ()>,
}

impl OpenGroup {
    /// Marks a group open on this thread, unless one already is.
    fn enter() -> Result<OpenGroup> {
        if group_open() {
            return Err(Error::Misuse(
                "Group::start: a Group is already open on this thread; NCCL would queue a \
                 nested group's collectives only at the outer ncclGroupEnd, after the inner \
                 group had ended its buffers' borrows: issue them in the open Group"
                    .into(),
            ));
        }
        let _ = GROUP_OPEN.try_with(|o| o.set(true));
        Ok(OpenGroup {
            _not_send: PhantomData,
        })
    }
}

impl Drop for OpenGroup {
    fn drop(&mut self) {
        let _ = GROUP_OPEN.try_with(|o| o.set(false));
    }
}

/// Collectives issued together (`ncclGroupStart` ... `ncclGroupEnd`): needed when one thread
/// issues a collective for several ranks ([`Comm::init_all`]), and it fuses calls of one rank.
///
/// NCCL queues the work at `ncclGroupEnd`, so the group keeps every buffer borrowed, and its
/// device-pointer guards alive, until [`end`](Self::end) (or drop, which ends it too). For the
/// same reason a thread has one open group at most ([`Group::start`] refuses a second), and
/// the direct collectives of [`Comm`] are refused while it is open. A group that is leaked
/// (`mem::forget`) stays open for NCCL too, so they stay refused on that thread.
///
/// ```no_run
/// # fn main() -> cuda_mem_nccl::Result<()> {
/// use cuda_mem::{Device, DeviceBuffer, Stream};
/// use cuda_mem_nccl::{Comm, Group, ReduceOp};
/// let devices = Device::all()?;
/// let comms = Comm::init_all(&devices)?;
/// let streams: Vec<Stream> = devices.iter().map(|&d| Stream::on(d, true)).collect::<Result<_, _>>()?;
/// let mut bufs: Vec<DeviceBuffer<f32>> = devices.iter()
///     .map(|&d| DeviceBuffer::uninit_on(d, 1 << 20)).collect::<Result<_, _>>()?;
/// let mut g = Group::start()?;
/// for ((c, b), s) in comms.iter().zip(bufs.iter_mut()).zip(&streams) {
///     g.all_reduce_in_place(c, b, ReduceOp::Sum, s)?;
/// }
/// g.end()?;
/// # Ok(()) }
/// ```
pub struct Group<'a> {
    held: Vec<Box<dyn Guard + 'a>>,
    nccl: &'static Nccl,
    /// `Some` until `ncclGroupEnd` (not `Send`: an NCCL group is per thread, as is the
    /// current device).
    open: Option<OpenGroup>,
}

impl fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Group({} collectives, open: {})",
            self.held.len(),
            self.open.is_some()
        )
    }
}

impl<'a> Group<'a> {
    /// `ncclGroupStart`. Refused ([`Error::Misuse`]) while another `Group` is open on this
    /// thread: nest nothing, issue everything in the open group.
    pub fn start() -> Result<Self> {
        let n = nccl()?;
        let open = OpenGroup::enter()?;
        // SAFETY: no arguments.
        let code = unsafe { (n.fns.group_start)() };
        n.check(code, std::ptr::null_mut(), || "ncclGroupStart".into())?;
        Ok(Group {
            held: Vec::new(),
            nccl: n,
            open: Some(open),
        })
    }

    /// [`Comm::all_reduce`] inside the group.
    pub fn all_reduce<T: NcclType, B: BufferMut<T>>(
        &mut self,
        comm: &'a Comm,
        send: &'a DeviceBuffer<T>,
        recv: &'a mut B,
        op: ReduceOp,
        stream: &'a Stream,
    ) -> Result<()> {
        self.queue(
            comm,
            Call::AllReduce {
                send: Some(send),
                op,
            },
            mut_of(recv),
            stream,
        )
    }

    /// [`Comm::all_reduce_in_place`] inside the group.
    pub fn all_reduce_in_place<T: NcclType, B: BufferMut<T>>(
        &mut self,
        comm: &'a Comm,
        buf: &'a mut B,
        op: ReduceOp,
        stream: &'a Stream,
    ) -> Result<()> {
        self.queue(
            comm,
            Call::AllReduce { send: None, op },
            mut_of(buf),
            stream,
        )
    }

    /// [`Comm::all_gather`] inside the group.
    pub fn all_gather<T: NcclType, B: BufferMut<T>>(
        &mut self,
        comm: &'a Comm,
        send: &'a DeviceBuffer<T>,
        recv: &'a mut B,
        stream: &'a Stream,
    ) -> Result<()> {
        self.queue(comm, Call::AllGather { send }, mut_of(recv), stream)
    }

    /// [`Comm::broadcast_in_place`] inside the group.
    pub fn broadcast_in_place<T: NcclType, B: BufferMut<T>>(
        &mut self,
        comm: &'a Comm,
        buf: &'a mut B,
        root: i32,
        stream: &'a Stream,
    ) -> Result<()> {
        self.queue(comm, Call::BroadcastInPlace { root }, mut_of(buf), stream)
    }

    /// [`Comm::launch`] in the group: its guards are kept until `ncclGroupEnd`.
    fn queue<T: NcclType>(
        &mut self,
        comm: &'a Comm,
        call: Call<'a, T>,
        recv: &'a mut DeviceBuffer<T>,
        stream: &'a Stream,
    ) -> Result<()> {
        let guards = restoring(|| comm.launch(call, recv, stream))?;
        self.held.push(Box::new(guards));
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let n = self.nccl;
        let r = restoring(|| {
            // SAFETY: no arguments; ends the group this value started.
            let code = unsafe { (n.fns.group_end)() };
            n.check(code, std::ptr::null_mut(), || "ncclGroupEnd".into())
        });
        // The guards record the now-queued work on their buffers (on failure too: an extra
        // record only adds waiting).
        self.held.clear();
        // NCCL's group is closed (`ncclGroupEnd` lowers its depth even when it fails).
        drop(open);
        r
    }

    /// `ncclGroupEnd`: NCCL queues the group's collectives on their streams; then the guards
    /// record them on their buffers and the borrows end.
    pub fn end(mut self) -> Result<()> {
        self.finish()
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Bus bandwidth as nccl-tests reports it, from the algorithm bandwidth `algbw` (bytes of the
/// buffer / time) of a collective on `nranks` ranks.
pub fn bus_bandwidth(kind: Collective, algbw: f64, nranks: usize) -> f64 {
    let n = nranks as f64;
    match kind {
        Collective::AllReduce => algbw * 2.0 * (n - 1.0) / n,
        Collective::AllGather => algbw * (n - 1.0) / n,
        Collective::Broadcast => algbw,
    }
}

/// The collectives, for [`bus_bandwidth`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collective {
    /// `ncclAllReduce`: bus factor 2(n-1)/n.
    AllReduce,
    /// `ncclAllGather`: bus factor (n-1)/n (algbw counts the gathered bytes).
    AllGather,
    /// `ncclBroadcast`: bus factor 1.
    Broadcast,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_follows_nccl_tests() {
        assert_eq!(bus_bandwidth(Collective::AllReduce, 100.0, 2), 100.0);
        assert_eq!(bus_bandwidth(Collective::AllReduce, 100.0, 4), 150.0);
        assert_eq!(bus_bandwidth(Collective::AllGather, 100.0, 2), 50.0);
        assert_eq!(bus_bandwidth(Collective::Broadcast, 100.0, 8), 100.0);
    }

    #[test]
    fn unique_ids_round_trip_through_bytes_and_files() {
        let mut bytes = [0u8; 128];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 7 + 200) as u8;
        }
        let id = UniqueId::from_bytes(&bytes).unwrap();
        assert_eq!(id.to_bytes(), bytes);
        assert!(UniqueId::from_bytes(&bytes[..127]).is_err());
        let path = std::env::temp_dir().join(format!("cm-nccl-id-{}", std::process::id()));
        id.write_file(&path).unwrap();
        let back = UniqueId::read_file(&path, Duration::from_secs(1)).unwrap();
        assert_eq!(back.to_bytes(), bytes);
        std::fs::remove_file(&path).unwrap();
        let e = UniqueId::read_file(&path, Duration::from_millis(50)).unwrap_err();
        assert!(e.to_string().contains("no NCCL unique id"), "{e}");
    }

    #[test]
    fn unique_id_files_use_unique_temporaries_and_wait_for_a_whole_id() {
        let dir = std::env::temp_dir().join(format!("cm-nccl-ids-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let (a, b) = (
            UniqueId::from_bytes(&[1; 128]).unwrap(),
            UniqueId::from_bytes(&[2; 128]).unwrap(),
        );
        // A `.tmp` path, and two ids sharing a stem: each file gets its own id, and no
        // temporary is left behind.
        let (p_tmp, p_x, p_y) = (dir.join("id.tmp"), dir.join("id.x"), dir.join("id.y"));
        a.write_file(&p_tmp).unwrap();
        a.write_file(&p_x).unwrap();
        b.write_file(&p_y).unwrap();
        let read = |p: &Path| UniqueId::read_file(p, Duration::from_secs(1)).unwrap();
        assert_eq!(read(&p_tmp).to_bytes(), [1; 128]);
        assert_eq!(read(&p_x).to_bytes(), [1; 128]);
        assert_eq!(read(&p_y).to_bytes(), [2; 128]);
        b.write_file(&p_x).unwrap(); // replaces
        assert_eq!(read(&p_x).to_bytes(), [2; 128]);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            3,
            "temporaries left"
        );
        // A short file is waited on until it holds a whole id, then refused at the timeout.
        let short = dir.join("short");
        std::fs::write(&short, [7; 10]).unwrap();
        let e = UniqueId::read_file(&short, Duration::from_millis(60)).unwrap_err();
        assert!(e.to_string().contains("has 10 bytes"), "{e}");
        let writer = {
            let short = short.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                a.write_file(&short).unwrap();
            })
        };
        let got = UniqueId::read_file(&short, Duration::from_secs(10)).unwrap();
        writer.join().unwrap();
        assert_eq!(got.to_bytes(), [1; 128]);
        assert!(a.write_file(Path::new("/")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nvls_must_be_set_to_zero_by_the_launcher() {
        use std::ffi::OsStr;
        assert_eq!(nvls_refusal(Some(OsStr::new("0"))), None);
        let unset = nvls_refusal(None).unwrap();
        assert!(unset.contains("NCCL_NVLS_ENABLE is not set"), "{unset}");
        assert!(unset.contains("NVLink multicast"), "{unset}");
        for v in ["1", "", " 0", "00", "0 "] {
            let why = nvls_refusal(Some(OsStr::new(v))).unwrap();
            assert!(why.starts_with("NCCL_NVLS_ENABLE="), "{why}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            let why = nvls_refusal(Some(OsStr::from_bytes(b"\xff"))).unwrap();
            assert!(why.contains("not UTF-8"), "{why}");
        }
    }

    #[test]
    fn one_group_per_thread_and_no_direct_collectives_inside_it() {
        refuse_direct("Comm::all_reduce", false, 2).unwrap();
        refuse_direct("Comm::all_reduce", true, 1).unwrap();
        let e = refuse_direct("Comm::all_reduce", true, 2).unwrap_err();
        assert!(
            e.to_string().contains("Comm::init_all") && e.to_string().contains("Group::all_reduce"),
            "{e}"
        );
        let open = OpenGroup::enter().unwrap();
        let nested = OpenGroup::enter().map(drop).unwrap_err();
        assert!(nested.to_string().contains("already open"), "{nested}");
        let e = refuse_direct("Comm::all_reduce_in_place", false, 2).unwrap_err();
        assert!(e.to_string().contains("a Group is open"), "{e}");
        assert!(refuse_in_group("Comm::init_rank").is_err());
        // Per thread: another thread has no group open.
        std::thread::spawn(|| {
            refuse_direct("Comm::all_gather", false, 2).unwrap();
            drop(OpenGroup::enter().unwrap());
        })
        .join()
        .unwrap();
        assert!(group_open(), "the other thread's group is its own");
        drop(open);
        refuse_direct("Comm::broadcast_in_place", false, 2).unwrap();
        drop(OpenGroup::enter().unwrap());
        assert!(!group_open());
    }

    #[test]
    fn datatypes_match_nccl_h() {
        assert_eq!(<f32 as NcclType>::DATATYPE, 7);
        assert_eq!(<u32 as NcclType>::DATATYPE, 3);
        assert_eq!(<f64 as NcclType>::DATATYPE, 8);
        assert_eq!(ReduceOp::Avg.raw(), 4);
    }
}
