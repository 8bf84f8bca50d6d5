//! Errors: every `cudaError_t` the runtime returns, and misuse the runtime never sees.
//!
//! A runtime failure keeps its raw code (also one this header does not know), so that a newer
//! driver's new code is reported by number instead of being lost, plus the call that failed
//! with its key arguments, as the C++ `CUDA_SAFECALL` idiom prints it:
//!
//! ```text
//! cudaHostAlloc(268435456 bytes, MAPPED) failed: cudaErrorMemoryAllocation: out of memory
//! ```

use std::borrow::Cow;
use std::ffi::CStr;
use std::fmt;

use cuda_mem_sys as sys;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// [`Misuse::InvalidArgument`] of `op` for `reason`, as an [`Error`].
pub(crate) fn invalid_argument(op: &'static str, reason: impl Into<String>) -> Error {
    Misuse::InvalidArgument {
        op,
        reason: reason.into(),
    }
    .into()
}

/// A raw `cudaError_t` value. Any `u32` is valid: codes this crate's header does not know keep
/// their number, and [`ErrorCode::name`] then says so.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    /// `cudaSuccess`.
    pub const SUCCESS: ErrorCode = ErrorCode(sys::cudaError::cudaSuccess.0);
    /// `cudaErrorInvalidValue`.
    pub const INVALID_VALUE: ErrorCode = ErrorCode(sys::cudaError::cudaErrorInvalidValue.0);
    /// `cudaErrorMemoryAllocation`: out of memory (device or pinned host).
    pub const MEMORY_ALLOCATION: ErrorCode = ErrorCode(sys::cudaError::cudaErrorMemoryAllocation.0);
    /// `cudaErrorCudartUnloading`: the runtime is shutting down (process exit).
    pub const CUDART_UNLOADING: ErrorCode = ErrorCode(sys::cudaError::cudaErrorCudartUnloading.0);
    /// `cudaErrorInsufficientDriver`: no driver, or one older than the runtime.
    pub const INSUFFICIENT_DRIVER: ErrorCode =
        ErrorCode(sys::cudaError::cudaErrorInsufficientDriver.0);
    /// `cudaErrorNoDevice`: a driver but no CUDA device.
    pub const NO_DEVICE: ErrorCode = ErrorCode(sys::cudaError::cudaErrorNoDevice.0);
    /// `cudaErrorInvalidDevice`.
    pub const INVALID_DEVICE: ErrorCode = ErrorCode(sys::cudaError::cudaErrorInvalidDevice.0);
    /// `cudaErrorHostMemoryAlreadyRegistered`.
    pub const HOST_MEMORY_ALREADY_REGISTERED: ErrorCode =
        ErrorCode(sys::cudaError::cudaErrorHostMemoryAlreadyRegistered.0);
    /// `cudaErrorIllegalAddress`: a kernel accessed an invalid address (sticky).
    pub const ILLEGAL_ADDRESS: ErrorCode = ErrorCode(sys::cudaError::cudaErrorIllegalAddress.0);
    /// `cudaErrorNotReady`: asynchronous work has not completed yet (not a failure).
    pub const NOT_READY: ErrorCode = ErrorCode(sys::cudaError::cudaErrorNotReady.0);

    /// The codes that `driver_types.h` documents with "the process must be terminated and
    /// relaunched": after one, every later call in the process fails. Kept as numbers (they
    /// are ABI) so that the list is the same whichever header the crate was built against:
    /// `cudaErrorContained` and `cudaErrorTensorMemoryLeak` are newer than CUDA 12.0.
    const STICKY: [u32; 13] = [
        226, // cudaErrorContained
        700, // cudaErrorIllegalAddress
        702, // cudaErrorLaunchTimeout
        710, // cudaErrorAssert
        714, // cudaErrorHardwareStackError
        715, // cudaErrorIllegalInstruction
        716, // cudaErrorMisalignedAddress
        717, // cudaErrorInvalidAddressSpace
        718, // cudaErrorInvalidPc
        719, // cudaErrorLaunchFailure
        721, // cudaErrorTensorMemoryLeak
        810, // cudaErrorMpsClientTerminated
        911, // cudaErrorExternalDevice
    ];

    /// The sticky codes (see [`ErrorCode::is_sticky`]).
    pub fn sticky_codes() -> impl Iterator<Item = ErrorCode> {
        Self::STICKY.into_iter().map(ErrorCode)
    }

    /// The symbolic name, e.g. `cudaErrorMemoryAllocation` (`cudaGetErrorName`). Unknown codes
    /// give the runtime's own answer for them (`cudaErrorUnknown`-style text), never a panic.
    pub fn name(self) -> Cow<'static, str> {
        // SAFETY: cudaGetErrorName accepts any value and returns a pointer to a static,
        // NUL-terminated string (or null, handled by `static_str`).
        static_str(unsafe { sys::cudaGetErrorName(sys::cudaError(self.0)) })
    }

    /// The description, e.g. `out of memory` (`cudaGetErrorString`).
    pub fn description(self) -> Cow<'static, str> {
        // SAFETY: as for `name`: any value is accepted; the result is static or null.
        static_str(unsafe { sys::cudaGetErrorString(sys::cudaError(self.0)) })
    }

    /// Whether the linked runtime has a name for this code.
    pub fn is_known(self) -> bool {
        let name = self.name();
        name.starts_with("cudaError") || name == "cudaSuccess"
    }

    /// Out of memory: `cudaErrorMemoryAllocation`.
    pub fn is_out_of_memory(self) -> bool {
        self == Self::MEMORY_ALLOCATION
    }

    /// Whether the error corrupts the CUDA context (e.g. an illegal address in a kernel): every
    /// later runtime call in this process then fails, and only a new process recovers. These
    /// are exactly the codes the runtime header documents as "must be terminated and
    /// relaunched" (`cudaErrorUnknown` is not among them).
    pub fn is_sticky(self) -> bool {
        Self::STICKY.contains(&self.0)
    }

    /// No usable driver or device: `cudaErrorInsufficientDriver` or `cudaErrorNoDevice`.
    pub fn is_no_device(self) -> bool {
        self == Self::INSUFFICIENT_DRIVER || self == Self::NO_DEVICE
    }
}

fn static_str(p: *const std::os::raw::c_char) -> Cow<'static, str> {
    if p.is_null() {
        return Cow::Borrowed("(no text)");
    }
    // SAFETY: the runtime returns pointers to static NUL-terminated strings that live for the
    // whole process; `p` is non-null.
    let s = unsafe { CStr::from_ptr(p) };
    match s.to_str() {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(s.to_string_lossy().into_owned()),
    }
}

impl fmt::Debug for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ErrorCode({} = {})", self.0, self.name())
    }
}

impl fmt::Display for ErrorCode {
    /// `cudaErrorMemoryAllocation: out of memory`; a code the runtime does not know keeps its
    /// number: `cudaError_t 12345 (unknown to this runtime): unrecognized error code`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_known() {
            write!(f, "{}: {}", self.name(), self.description())
        } else {
            write!(
                f,
                "cudaError_t {} (unknown to this runtime): {}",
                self.0,
                self.description()
            )
        }
    }
}

impl std::error::Error for ErrorCode {}

impl From<sys::cudaError> for ErrorCode {
    fn from(e: sys::cudaError) -> Self {
        ErrorCode(e.0)
    }
}

/// Misuse caught before the runtime is called: bad sizes, mismatched lengths, missing device
/// features. Each variant names what was wrong and with which values.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Misuse {
    /// A length of zero where the call needs at least one element.
    ZeroLength {
        /// The operation, e.g. `DeviceBuffer::zeroed`.
        op: &'static str,
    },
    /// `len * size_of::<T>()` does not fit in `usize`.
    SizeOverflow {
        /// Number of elements asked for.
        len: usize,
        /// Size of one element in bytes.
        elem_size: usize,
    },
    /// A copy between buffers of different lengths (in elements).
    LengthMismatch {
        /// Elements in the destination.
        dst: usize,
        /// Elements in the source.
        src: usize,
    },
    /// A range outside a buffer.
    OutOfBounds {
        /// Start of the range, in elements.
        offset: usize,
        /// Length of the range, in elements.
        len: usize,
        /// Length of the buffer, in elements.
        buffer_len: usize,
    },
    /// The device lacks a feature the operation needs.
    Unsupported {
        /// The device ordinal.
        device: i32,
        /// What is missing, e.g. `cudaDevAttrCanMapHostMemory`.
        feature: &'static str,
    },
    /// Under unified virtual addressing the host and device pointers of mapped memory must be
    /// equal; they were not.
    UvaPointerMismatch {
        /// The host pointer.
        host: usize,
        /// The device pointer `cudaHostGetDevicePointer` returned.
        device: usize,
    },
    /// A null pointer where an allocation was expected (`from_raw`).
    NullPointer {
        /// The operation.
        op: &'static str,
    },
    /// A pointer not aligned for the element type.
    Misaligned {
        /// The pointer's address.
        addr: usize,
        /// The alignment the element type needs.
        align: usize,
    },
    /// An allocation for an element type aligned to more than CUDA's allocators guarantee
    /// (256 bytes): refused before anything is allocated.
    AlignmentUnsupported {
        /// The alignment the element type needs (`align_of::<T>()`).
        align: usize,
        /// The largest alignment an allocation accepts.
        max: usize,
    },
    /// Flag bits this operation does not accept.
    InvalidFlags {
        /// The operation.
        op: &'static str,
        /// The bits given.
        flags: u32,
    },
    /// A device ordinal outside `0..count`.
    DeviceOutOfRange {
        /// The ordinal asked for.
        ordinal: i32,
        /// The number of devices.
        count: i32,
    },
    /// A managed allocation larger than the device's free memory: refused, because
    /// oversubscribing managed memory can stall the whole GPU.
    ManagedExceedsFree {
        /// Bytes asked for.
        bytes: usize,
        /// Bytes free on the device (`cudaMemGetInfo`).
        free: usize,
    },
    /// Two things that CUDA requires on one device are on different devices (an event and the
    /// stream it is recorded on).
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// The device required.
        expected: i32,
        /// The device found.
        found: i32,
    },
    /// A copy or kernel would write memory registered `READ_ONLY`, which the device promised
    /// only to read.
    ReadOnlyDestination {
        /// The operation.
        op: &'static str,
    },
    /// An argument the operation cannot take, with the reason.
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong with the argument.
        reason: String,
    },
}

impl fmt::Display for Misuse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Misuse::ZeroLength { op } => write!(f, "{op}: a length of zero is not allowed"),
            Misuse::SizeOverflow { len, elem_size } => write!(
                f,
                "{len} elements of {elem_size} bytes overflow usize"
            ),
            Misuse::LengthMismatch { dst, src } => write!(
                f,
                "copy between buffers of different lengths: destination {dst} elements, source {src}"
            ),
            Misuse::OutOfBounds {
                offset,
                len,
                buffer_len,
            } => write!(
                f,
                "range {offset}..{offset}+{len} is outside a buffer of {buffer_len} elements"
            ),
            Misuse::Unsupported { device, feature } => {
                write!(f, "device {device} does not support {feature}")
            }
            Misuse::UvaPointerMismatch { host, device } => write!(
                f,
                "host pointer {host:#x} and device pointer {device:#x} of mapped memory differ: \
                 unified virtual addressing was required"
            ),
            Misuse::NullPointer { op } => write!(f, "{op}: null pointer"),
            Misuse::Misaligned { addr, align } => {
                write!(f, "pointer {addr:#x} is not aligned to {align} bytes")
            }
            Misuse::AlignmentUnsupported { align, max } => write!(
                f,
                "cannot allocate elements aligned to {align} bytes: CUDA allocators guarantee \
                 {max}-byte alignment, so element types may be aligned to {max} bytes at most"
            ),
            Misuse::InvalidFlags { op, flags } => write!(f, "{op}: invalid flags {flags:#x}"),
            Misuse::DeviceOutOfRange { ordinal, count } => write!(
                f,
                "device ordinal {ordinal} is out of range: {count} device(s) present"
            ),
            Misuse::ManagedExceedsFree { bytes, free } => write!(
                f,
                "managed allocation of {bytes} bytes refused: only {free} bytes free on the device"
            ),
            Misuse::DeviceMismatch {
                op,
                expected,
                found,
            } => write!(
                f,
                "{op}: expected device {expected}, found device {found} (CUDA requires the same device)"
            ),
            Misuse::ReadOnlyDestination { op } => write!(
                f,
                "{op}: the destination was registered READ_ONLY, so the device may not write it"
            ),
            Misuse::InvalidArgument { op, reason } => write!(f, "{op}: {reason}"),
        }
    }
}

/// The error type of this crate: a runtime failure, or misuse caught before the runtime.
///
/// `Send + Sync + 'static`, so it converts into `anyhow::Error` with `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA runtime call returned an error.
    Cuda {
        /// The raw code.
        code: ErrorCode,
        /// The call and its key arguments, e.g. `cudaMalloc(4096 bytes)`.
        call: String,
    },
    /// Misuse the runtime never saw.
    Misuse(Misuse),
    /// The operating system refused what the crate asked of it: a memory mapping (fast
    /// pinning), a worker thread (staged copies).
    Os {
        /// What was asked, e.g. `mmap(268435456 bytes) for pinned memory`.
        call: String,
        /// The OS error number (`errno`); `ENOMEM` counts as out of memory
        /// ([`is_out_of_memory`](Error::is_out_of_memory)).
        errno: i32,
    },
}

impl Error {
    /// The runtime error code, if this is a runtime failure.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Cuda { code, .. } => Some(*code),
            Error::Misuse(_) | Error::Os { .. } => None,
        }
    }

    /// An OS error of `call` (`errno` from `err`, `EIO` where it has none).
    pub(crate) fn os(call: impl Into<String>, err: &std::io::Error) -> Error {
        Error::Os {
            call: call.into(),
            errno: err.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    /// The misuse, if this is one.
    pub fn misuse(&self) -> Option<&Misuse> {
        match self {
            Error::Misuse(m) => Some(m),
            Error::Cuda { .. } | Error::Os { .. } => None,
        }
    }

    /// The failed call with its arguments, for runtime and OS failures.
    pub fn call(&self) -> Option<&str> {
        match self {
            Error::Cuda { call, .. } | Error::Os { call, .. } => Some(call),
            Error::Misuse(_) => None,
        }
    }

    /// Out of memory (`cudaErrorMemoryAllocation`, or the OS's `ENOMEM`).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::Os { errno, .. } => *errno == libc::ENOMEM,
            _ => self.code().is_some_and(ErrorCode::is_out_of_memory),
        }
    }

    /// The context is corrupted (see [`ErrorCode::is_sticky`]).
    pub fn is_sticky(&self) -> bool {
        self.code().is_some_and(ErrorCode::is_sticky)
    }

    /// No driver or no device (see [`ErrorCode::is_no_device`]).
    pub fn is_no_device(&self) -> bool {
        self.code().is_some_and(ErrorCode::is_no_device)
    }
}

impl fmt::Display for Error {
    /// `cudaErrorCallRequiresNewerDriver` also says, in words, which CUDA version the installed
    /// driver supports and which runtime the program uses (asked of the runtime when printed).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn version(v: i32) -> String {
            format!("{}.{}", v / 1000, v % 1000 / 10)
        }
        match self {
            Error::Cuda { code, call } => {
                write!(f, "{call} failed: {code}")?;
                if code.0 != sys::cudaError::cudaErrorCallRequiresNewerDriver.0 {
                    return Ok(());
                }
                let (mut driver, mut runtime) = (0, 0);
                // SAFETY: valid out-pointers; both calls only report versions (they work
                // without a device and do not touch the last-error state on success).
                let (d, r) = unsafe {
                    (
                        sys::cudaDriverGetVersion(&mut driver),
                        sys::cudaRuntimeGetVersion(&mut runtime),
                    )
                };
                if r != sys::cudaError::cudaSuccess {
                    runtime = crate::BUILT_CUDART_VERSION as i32;
                }
                let have = if d == sys::cudaError::cudaSuccess && driver > 0 {
                    format!(
                        "the installed NVIDIA driver supports CUDA {}",
                        version(driver)
                    )
                } else {
                    "the installed NVIDIA driver's CUDA version is unknown".to_string()
                };
                write!(
                    f,
                    " ({have}; this call needs a newer driver: it is part of the CUDA {} \
                     runtime this program uses; install an NVIDIA driver for CUDA {} or newer)",
                    version(runtime),
                    version(runtime)
                )
            }
            Error::Misuse(m) => m.fmt(f),
            Error::Os { call, errno } => write!(
                f,
                "{call} failed: {} (errno {errno})",
                std::io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

impl std::error::Error for Error {
    /// The raw runtime error, for runtime failures.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Cuda { code, .. } => Some(code),
            Error::Misuse(_) | Error::Os { .. } => None,
        }
    }
}

impl From<Misuse> for Error {
    fn from(m: Misuse) -> Self {
        Error::Misuse(m)
    }
}

/// Turns a runtime return code into a `Result`; `call` describes the call for the message and
/// is only evaluated on failure.
///
/// On failure the runtime's per-thread last-error state is cleared (`cudaGetLastError`), so
/// that the error, now returned here, does not surface again in an unrelated later call. A
/// sticky error cannot be cleared and stays.
///
/// Public for code that makes raw runtime calls beside this crate's (through
/// [`sys`](crate::sys)), so that its failures read like the crate's:
///
/// ```no_run
/// use cuda_mem::{check, sys};
/// # fn main() -> cuda_mem::Result<()> {
/// let mut n = 0;
/// // SAFETY: a valid out-pointer.
/// check(unsafe { sys::cudaGetDeviceCount(&mut n) }, || "cudaGetDeviceCount".into())?;
/// # Ok(()) }
/// ```
pub fn check(code: sys::cudaError_t, call: impl FnOnce() -> String) -> Result<()> {
    if code == sys::cudaError::cudaSuccess {
        return Ok(());
    }
    // SAFETY: cudaGetLastError takes no arguments and only reads and resets thread state.
    unsafe { sys::cudaGetLastError() };
    Err(Error::Cuda {
        code: code.into(),
        call: call(),
    })
}

/// After `waited`, a wait for GPU work on memory about to go back to an owner who may free or
/// reuse it (a borrowed slice: nothing can leak it): ends the process when the wait failed
/// with an error after which the work may still run. A sticky error ends all work with the
/// context, so it returns (the caller reports it). `who` and the error go to stderr first,
/// written without `eprintln!`, which panics when stderr is a closed pipe: a panic here would
/// hand the memory back after all.
pub(crate) fn abort_if_still_in_use(who: &str, what: &str, waited: &Result<()>) {
    let Err(error) = waited else { return };
    if error.is_sticky() {
        return;
    }
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "{who}: cannot wait for asynchronous work on {what} ({error}); aborting rather than \
         hand the memory back while it may be in use"
    );
    std::process::abort()
}

/// For queries (`cudaStreamQuery`, `cudaEventQuery`): whether `code` is `cudaErrorNotReady`,
/// which is an answer, not a failure. The runtime also leaves it as the thread's last error,
/// where C++ code in the same thread would later see a spurious failure: it is cleared here.
pub(crate) fn clear_not_ready(code: sys::cudaError_t) -> bool {
    if code != sys::cudaError::cudaErrorNotReady {
        return false;
    }
    // SAFETY: both take no arguments and only read (and reset) the thread's error state.
    unsafe {
        if sys::cudaPeekAtLastError() == sys::cudaError::cudaErrorNotReady {
            sys::cudaGetLastError();
        }
    }
    true
}

/// Like [`check`] for calls whose text has no arguments.
pub(crate) fn check_call(code: sys::cudaError_t, call: &'static str) -> Result<()> {
    check(code, || call.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OS refusals are their own kind (issue 20: they were misuse or a CUDA code), with the
    /// OS's text; `ENOMEM` is out of memory, so the pools' empty-and-retry applies.
    #[test]
    fn os_errors_keep_errno_and_text() {
        let e = Error::os(
            "mmap(4096 bytes) for pinned memory",
            &std::io::Error::from_raw_os_error(libc::ENOMEM),
        );
        assert_eq!(
            e,
            Error::Os {
                call: "mmap(4096 bytes) for pinned memory".into(),
                errno: libc::ENOMEM
            }
        );
        assert!(e.is_out_of_memory());
        assert_eq!(e.code(), None);
        assert_eq!(e.misuse(), None);
        assert_eq!(e.call(), Some("mmap(4096 bytes) for pinned memory"));
        let text = e.to_string();
        assert!(
            text.starts_with("mmap(4096 bytes) for pinned memory failed: ")
                && text.ends_with(&format!("(errno {})", libc::ENOMEM)),
            "{text}"
        );
        let e = Error::os("thread", &std::io::Error::from_raw_os_error(libc::EAGAIN));
        assert!(!e.is_out_of_memory());
    }

    #[test]
    fn misuse_messages() {
        let cases: [(Misuse, &str); 7] = [
            (
                Misuse::ZeroLength {
                    op: "DeviceBuffer::uninit",
                },
                "DeviceBuffer::uninit: a length of zero is not allowed",
            ),
            (
                Misuse::SizeOverflow {
                    len: usize::MAX,
                    elem_size: 8,
                },
                "18446744073709551615 elements of 8 bytes overflow usize",
            ),
            (
                Misuse::LengthMismatch { dst: 3, src: 4 },
                "copy between buffers of different lengths: destination 3 elements, source 4",
            ),
            (
                Misuse::UvaPointerMismatch {
                    host: 0x1000,
                    device: 0x2000,
                },
                "host pointer 0x1000 and device pointer 0x2000 of mapped memory differ: \
                 unified virtual addressing was required",
            ),
            (
                Misuse::DeviceOutOfRange {
                    ordinal: 7,
                    count: 1,
                },
                "device ordinal 7 is out of range: 1 device(s) present",
            ),
            (
                Misuse::Misaligned {
                    addr: 0x1600,
                    align: 4096,
                },
                "pointer 0x1600 is not aligned to 4096 bytes",
            ),
            (
                Misuse::AlignmentUnsupported {
                    align: 512,
                    max: 256,
                },
                "cannot allocate elements aligned to 512 bytes: CUDA allocators guarantee \
                 256-byte alignment, so element types may be aligned to 256 bytes at most",
            ),
        ];
        for (m, text) in cases {
            let e = Error::from(m.clone());
            assert_eq!(e.to_string(), text);
            assert_eq!(e.misuse(), Some(&m));
            assert_eq!(e.code(), None);
            assert!(std::error::Error::source(&e).is_none());
            assert!(!e.is_out_of_memory() && !e.is_sticky() && !e.is_no_device());
        }
    }

    #[test]
    fn sticky_and_oom_classification_needs_no_runtime() {
        assert!(ErrorCode::ILLEGAL_ADDRESS.is_sticky());
        assert!(ErrorCode(sys::cudaError::cudaErrorLaunchFailure.0).is_sticky());
        assert!(!ErrorCode::MEMORY_ALLOCATION.is_sticky());
        assert!(ErrorCode::MEMORY_ALLOCATION.is_out_of_memory());
        assert!(ErrorCode::NO_DEVICE.is_no_device());
        assert!(!ErrorCode(123_456).is_sticky());
        let e = Error::Cuda {
            code: ErrorCode::ILLEGAL_ADDRESS,
            call: "x".into(),
        };
        assert!(e.is_sticky() && e.call() == Some("x"));
    }
}
