//! Device memory shared between processes, ordered by the fence, freed only once every
//! importer has closed it.
//!
//! Two ways CUDA shares memory, both here:
//! - `cudaMalloc` memory ([`DeviceBuffer::uninit`](crate::DeviceBuffer::uninit) and friends)
//!   through legacy IPC handles (`cudaIpcGetMemHandle` / `cudaIpcOpenMemHandle`);
//! - memory from a [`shareable`](crate::MemPool::shareable) pool
//!   ([`DeviceBuffer::from_pool`](crate::DeviceBuffer::from_pool)), the pool sent as a file
//!   descriptor over the socket (`SCM_RIGHTS`), the buffer as `cudaMemPoolExportPointer` data.
//!
//! The exporter hands its buffer to an [`Exporter`], which owns it from then on, over a
//! [`Channel`] (a Unix socket); the other process's [`Importer`] opens it as an
//! [`ImportedBuffer`], a [`Buffer`](crate::Buffer) over [`ImportedMemory`] that copies, views,
//! memsets and kernel guards ([`DevicePtr`](crate::DevicePtr)) take like any other, and that
//! is unmapped when the importer closes it.
//!
//! **Ordering.** The buffer is held by one side at a time, and passes with a message
//! ([`Exporter::pass`], [`Importer::pass`]) that carries an interprocess event recorded after
//! every piece of work the sender's fence knows on the buffer, and a generation number. The
//! receiver's [`take_back`](Importer::take_back) makes its stream wait for that event on the
//! device (`cudaStreamWaitEvent`, the host does not block) and records the wait on its own
//! fence as a write, so everything it does with the buffer afterwards, on any stream or on
//! the host, comes after the sender's writes. While a side does not hold the buffer it cannot
//! reach it: [`Exporter::buffer`] and [`Importer::buffer`] refuse with
//! [`Misuse::InvalidArgument`]. So "read before written"
//! cannot be said through this API.
//!
//! **Lifetime.** The exporter frees the memory only after the importer has said, over the
//! channel, that it closed its mapping after all its work on it completed
//! ([`Importer::close`], or its drop), or that it never opened it. [`Exporter::close`] waits for
//! that message with a bound and hands the buffer back; without it (time out, the importer's
//! process gone without a word, a broken message) the buffer is leaked, never freed under a
//! process that may still map it, and the error says so. Drop does the same and never panics;
//! `mem::forget` of either side leaks, which is sound. The protocol, and how it differs from
//! PyTorch's reference counting of shared CUDA blocks: `docs/ipc.md`.
//!
//! ```no_run
//! # fn main() -> cuda_mem::Result<()> {
//! use std::time::Duration;
//! use cuda_mem::ipc::{Channel, Exporter};
//! use cuda_mem::{memset_async, DeviceBuffer, Stream};
//! let (mine, theirs) = Channel::pair()?; // hand `theirs.into_fd()` to the child process
//! # drop(theirs);
//! let stream = Stream::non_blocking()?;
//! let mut buf = DeviceBuffer::<u32>::uninit(1 << 20)?;
//! memset_async(&mut buf, 0x5a, &stream)?;                   // pending when offered
//! let mut shared = Exporter::offer(buf, mine, &stream)?;   // the child holds it now
//! shared.take_back(&stream, Duration::from_secs(60))?;     // ordered after its writes
//! let data = shared.buffer()?.to_vec()?;
//! let buf = shared.close(Duration::from_secs(60))?;        // the child has closed it
//! # let _ = (data, buf); Ok(()) }
//! ```

mod channel;
mod export;
mod import;
mod wire;

pub use channel::{Channel, Listener};
pub use export::{Back, Exporter};
pub use import::{ImportedBuffer, ImportedMemory, Importer};
pub use wire::{HandleKind, IpcHandle};

use std::time::Duration;

use crate::error::{Error, Misuse, Result};
use crate::fence::capture;
use crate::handles::devices::Device;
use crate::handles::stream::Stream;

use crate::error::invalid_argument as refuse;

/// How long [`Exporter`]'s drop waits for the importer's close, and [`Importer`]'s drop for
/// sending it.
pub const DROP_TIMEOUT: Duration = Duration::from_secs(10);

/// The refusal of an import ([`ImportedBuffer::open`], [`Importer::accept`]) on a stream that
/// is capturing.
pub(crate) const IMPORT_INTO_CAPTURE: &str =
    "the stream is capturing: an import cannot be recorded into a graph (the wait for the \
     exporter's event would be a node that runs only at launch, and the mapping would count as \
     graph memory the capture keeps); import on a stream that is not capturing, and let the \
     capture use the imported buffer";
/// The refusal of an offer or a pass ([`Exporter::offer`], [`Exporter::pass`],
/// [`Importer::pass`]) on a stream that is capturing.
pub(crate) const PASS_INTO_CAPTURE: &str =
    "the stream is capturing: the event the other process waits for would be recorded into the \
     graph (a node, not a record), so it would wait for nothing; offer or pass the buffer on a \
     stream that is not capturing";
/// The refusal of a take-back ([`Exporter::take_back`], [`Importer::take_back`]) on a stream
/// that is capturing.
pub(crate) const TAKE_BACK_INTO_CAPTURE: &str =
    "the stream is capturing: the wait for the other process's pass would be a node of the \
     graph, run only at launch, and work on the buffer after the capture would not wait for \
     that process's writes; take the buffer back on a stream that is not capturing";

/// Refuses an IPC step (`op`), with `reason`, on a stream that is capturing: a capture begun
/// through the crate ([`Stream::capture`]; the registry, no runtime call), or one another
/// library began on a stream lent to it (`cudaStreamIsCapturing`, lent streams only). The
/// legacy default stream, while a capture is open anywhere, is refused as the fence refuses it
/// (work there would join or invalidate the capture). Made before any runtime call and any
/// message of the step, so nothing is mapped, recorded, waited for or read, and the capture
/// stays valid.
///
/// A capture that another thread begins on `stream` after this check is met by the step's own
/// handshake with capture begins (the fence's), which waits for it or refuses it.
pub(crate) fn refuse_capturing(
    stream: &Stream,
    op: &'static str,
    reason: &'static str,
) -> Result<()> {
    let inner = stream.inner();
    if capture::any_open() {
        if capture::is_legacy(inner) {
            return Err(refuse(op, capture::LEGACY_DURING_CAPTURE));
        }
        if capture::capture_of(inner).is_some() {
            return Err(refuse(op, reason));
        }
    }
    if inner.is_lent() {
        if let Err(e) = capture::refuse_foreign_capture(inner) {
            // The refusal (a foreign capture is open), or the query's own error, kept.
            return Err(if e.misuse().is_some() {
                refuse(op, reason)
            } else {
                e
            });
        }
    }
    Ok(())
}

/// A number that differs between processes (random, drawn once), which handles carry so that
/// a process never opens its own handle: CUDA maps IPC memory into *other* processes only.
pub(crate) fn process_tag() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static TAG: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TAG.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    })
}

/// The PCI bus id of `device`, NUL-padded, for a handle.
pub(crate) fn bus_id_of(device: Device) -> Result<[u8; wire::BUS_ID_LEN]> {
    let s = device.pci_bus_id()?;
    let mut out = [0u8; wire::BUS_ID_LEN];
    let n = s.len().min(wire::BUS_ID_LEN - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    Ok(out)
}

/// The local device with PCI bus id `bus_id` (`cudaDeviceGetByPCIBusId`), or a misuse saying
/// that this process does not see it.
pub(crate) fn device_by_bus_id(bus_id: &str, op: &'static str) -> Result<Device> {
    for d in Device::all()? {
        if d.pci_bus_id()?.eq_ignore_ascii_case(bus_id) {
            return Ok(d);
        }
    }
    Err(Misuse::InvalidArgument {
        op,
        reason: format!(
            "the exporter's device (PCI bus id {bus_id}) is not visible in this process \
             (CUDA_VISIBLE_DEVICES?)"
        ),
    }
    .into())
}

/// `e` with a note that the buffer of `bytes` bytes was leaked rather than freed.
pub(crate) fn leaked(e: Error, bytes: usize) -> Error {
    let note = format!(
        "; the shared buffer ({bytes} bytes) is leaked, not freed, because the importer may \
         still map it"
    );
    match e {
        Error::Os { call, errno } => Error::Os {
            call: call + &note,
            errno,
        },
        Error::Cuda { code, call } => Error::Cuda {
            code,
            call: call + &note,
        },
        Error::Misuse(Misuse::InvalidArgument { op, reason }) => {
            Error::Misuse(Misuse::InvalidArgument {
                op,
                reason: reason + &note,
            })
        }
        e => e,
    }
}

/// A protocol violation by the peer: a message that is not the one this side waits for.
pub(crate) fn unexpected(op: &'static str, got: &str, want: &str) -> Error {
    Misuse::InvalidArgument {
        op,
        reason: format!("the peer sent {got} where {want} was expected"),
    }
    .into()
}

/// Writes a line to stderr from a drop, without `eprintln!` (which panics on a closed pipe).
pub(crate) fn note(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}
