//! The importing side: [`ImportedBuffer`] (a [`Buffer`] over [`ImportedMemory`]), another
//! process's device memory mapped here, and [`Importer`], which holds it under the channel's
//! protocol.

use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Duration;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use super::channel::Channel;
use super::wire::{HandleKind, IpcHandle, Message};
use super::{
    device_by_bus_id, note, process_tag, refuse, refuse_capturing, unexpected, DROP_TIMEOUT,
    IMPORT_INTO_CAPTURE, PASS_INTO_CAPTURE, TAKE_BACK_INTO_CAPTURE,
};
use crate::alloc::pool::{MemPool, PoolAccess};
use crate::contract::buffer::sealed::Alloc;
use crate::contract::buffer::Buffer;
use crate::contract::layout::Layout;
use crate::contract::memory::Loc;
use crate::contract::size;
use crate::error::{check, Result};
use crate::fence::capture::Relaxed;
use crate::fence::{Access, Fence};
use crate::handles::devices::{require_same, Device};
use crate::handles::event::{Event, IPC_EVENT_HANDLE_LEN};
use crate::handles::stream::Stream;
use crate::ops::view::{Slice, ViewMut};

/// Device memory of another process, mapped into this one: `len` elements of `T`. It is a
/// [`Buffer`] like [`DeviceBuffer`](crate::DeviceBuffer), with its accessors
/// ([`len`](Buffer::len), [`as_ptr`](Buffer::as_ptr), [`synchronize`](Buffer::synchronize),
/// ...) and its fence: copies, views, memsets, graphs and kernel guards
/// ([`DevicePtr`](crate::DevicePtr)) take it like any other buffer.
///
/// Dropped (or [`free`](Buffer::free)d, which reports the error drop ignores), it waits for
/// the work recorded on it and unmaps the memory: `cudaIpcCloseMemHandle` for a
/// [`HandleKind::Legacy`] handle, `cudaFree` of the imported pointer (then the imported pool's
/// handle goes) for a [`HandleKind::Pool`] one; when that wait fails the mapping is leaked
/// instead, never unmapped under running work.
///
/// [`into_raw`](Buffer::into_raw) waits for that work too, and hands the mapping over
/// instead of closing it: the caller closes it with the call named above, on the buffer's
/// [`device`](Self::device). The imported pool's handle is let go; the runtime keeps a pool
/// alive while pointers from it are outstanding, as for
/// [`DeviceBuffer::from_pool`](crate::DeviceBuffer::from_pool)'s `into_raw`. The exporter
/// learns nothing from any of these: opened alone ([`open`](Self::open)), from a handle that
/// came through any channel, telling it is the caller's part. An [`Importer`] never hands its
/// buffer out (only `&ImportedBuffer` and views of it): the buffer ends in the importer's
/// [`close`](Importer::close) or drop, which send `Closed` after the unmap; a forgotten
/// `Importer` keeps its mapping and sends nothing, and the exporter leaks the memory after
/// its bound.
pub type ImportedBuffer<T> = Buffer<T, ImportedMemory>;

/// How an [`ImportedBuffer`]'s memory was mapped into this process, on which device, and how
/// the mapping is undone: `cudaIpcOpenMemHandle` → `cudaIpcCloseMemHandle`, or
/// `cudaMemPoolImportPointer` → `cudaFree` (the imported pool kept until then).
#[derive(Debug)]
pub struct ImportedMemory {
    /// The device the memory is mapped on (the importing stream's).
    device: Device,
    source: Source,
}

/// How an imported mapping is undone.
#[derive(Debug)]
enum Source {
    /// `cudaIpcCloseMemHandle`.
    Legacy,
    /// `cudaFree` of the imported pointer; the imported pool is kept alive until then.
    Pool {
        /// Kept alive while its pointer is mapped, never read.
        _pool: MemPool,
    },
}

impl ImportedMemory {
    fn kind(&self) -> HandleKind {
        match self.source {
            Source::Legacy => HandleKind::Legacy,
            Source::Pool { .. } => HandleKind::Pool,
        }
    }

    /// Undoes the mapping at `ptr`. Callers make sure no work uses it any more and never use
    /// the address again, whatever the outcome.
    fn unmap(&self, ptr: NonNull<u8>) -> Result<()> {
        let _g = self.device.guard().ok();
        let p = ptr.as_ptr().cast::<std::os::raw::c_void>();
        match &self.source {
            // SAFETY: a mapping of `cudaIpcOpenMemHandle`, unmapped once (the callers' rule),
            // after all work on it; the address is never used again.
            Source::Legacy => check(unsafe { sys::cudaIpcCloseMemHandle(p) }, || {
                format!("cudaIpcCloseMemHandle({p:p})")
            }),
            // SAFETY: an imported pool pointer, freed once, after all work on it (the runtime
            // documents `cudaFree` for imported pointers); its pool is alive (`self`).
            Source::Pool { .. } => check(unsafe { sys::cudaFree(p) }, || {
                format!("cudaFree({p:p}) of an imported pool pointer")
            }),
        }
    }
}

impl Alloc for ImportedMemory {
    const LOC: Loc = Loc::Device;
    const KIND: &'static str = "ImportedBuffer";

    fn located_on(&self) -> Option<Device> {
        Some(self.device)
    }

    fn release(&mut self, ptr: NonNull<u8>, _bytes: usize, fence: &mut Fence) -> Result<()> {
        // A failed wait leaks the mapping: the work may still use it.
        fence.host_wait_mut(Access::Write)?;
        self.unmap(ptr)
    }
}

impl<T: Pod> ImportedBuffer<T> {
    /// Maps the buffer `handle` names into this process, on `stream`'s device, and makes
    /// `stream` wait (on the device) for the exporter's event in the handle, recording that
    /// wait as a write on the new buffer's fence: everything done with the buffer comes after
    /// the exporter's work before it exported. A pool handle needs the pool's descriptor
    /// (`pool_fd`), which came beside it.
    ///
    /// Checked before CUDA sees anything, each a [`Misuse::InvalidArgument`] naming it: first
    /// a `stream` that is capturing (an import cannot be recorded into a graph: import on a
    /// stream that is not capturing, and let the capture use the buffer; so the capture stays
    /// valid and nothing is mapped), or the legacy default stream while a capture is open;
    /// then the element size against `T`; a handle this process exported (CUDA maps IPC memory
    /// into other processes only); the exporter's device not visible here; another device
    /// without peer access to it; a pool handle without its descriptor. CUDA refuses the rest (a
    /// forged handle, one of freed memory, a sandbox without IPC) with its own error code,
    /// kept. An address CUDA maps that is not aligned for `T` is unmapped and refused with
    /// [`Misuse::Misaligned`].
    ///
    /// # Safety
    /// Outside the [`Exporter`](super::Exporter) / [`Importer`] protocol nothing keeps the
    /// exporter from freeing or writing the memory while this mapping is used: the caller
    /// promises that the exporting process keeps it allocated until this buffer is dropped
    /// (or freed; after [`into_raw`](Buffer::into_raw), until the caller closes the mapping),
    /// and writes it only when this process's work on it is done (as the exporter's
    /// `Closed`/`Pass` messages guarantee to an [`Importer`]).
    ///
    /// [`Misuse::InvalidArgument`]: crate::Misuse::InvalidArgument
    /// [`Misuse::Misaligned`]: crate::Misuse::Misaligned
    pub unsafe fn open(
        handle: &IpcHandle,
        pool_fd: Option<OwnedFd>,
        stream: &Stream,
    ) -> Result<Self> {
        Self::open_with_event(handle, pool_fd, stream).map(|(b, _)| b)
    }

    /// [`open`](Self::open), also returning the exporter's event as opened here.
    pub(crate) fn open_with_event(
        handle: &IpcHandle,
        pool_fd: Option<OwnedFd>,
        stream: &Stream,
    ) -> Result<(Self, Event)> {
        const OP: &str = "ImportedBuffer::open";
        // Before any runtime call: an import inside a capture would map the memory as graph
        // memory of the capture (refused at its end, the mapping then leaked) and capture the
        // wait for the exporter's event as a node.
        refuse_capturing(stream, OP, IMPORT_INTO_CAPTURE)?;
        let size = std::mem::size_of::<T>();
        if handle.elem_size() != size {
            return Err(refuse(
                OP,
                format!(
                    "the handle holds elements of {} bytes; the element type has {size}",
                    handle.elem_size()
                ),
            ));
        }
        let len = handle.len();
        size::alloc_bytes::<T>(len, OP)?;
        if handle.process == process_tag() {
            return Err(refuse(
                OP,
                "the handle was exported by this process: CUDA maps IPC memory into other \
                 processes only (use the buffer itself)",
            ));
        }
        stream.inner().check_current(OP)?;
        let here = Device::from_ordinal_unchecked(stream.inner().device());
        let bus = handle
            .bus_id()
            .ok_or_else(|| refuse(OP, "the handle's device id is not a PCI bus id"))?;
        let owner = device_by_bus_id(bus, OP)?;
        if owner != here && !here.can_access_peer(owner)? {
            return Err(refuse(
                OP,
                format!(
                    "the memory lives on device {} (PCI bus id {bus}), which device {} cannot \
                     access (no peer access)",
                    owner.ordinal(),
                    here.ordinal()
                ),
            ));
        }
        let _g = here.guard()?;
        let mut raw: *mut std::os::raw::c_void = std::ptr::null_mut();
        let source = match handle.kind() {
            HandleKind::Legacy => {
                if pool_fd.is_some() {
                    return Err(refuse(OP, "a file descriptor came with a legacy handle"));
                }
                let h = sys::cudaIpcMemHandle_t {
                    reserved: handle.mem.map(|b| b as std::os::raw::c_char),
                };
                // SAFETY: valid out-pointer; the handle is plain bytes that the runtime
                // validates (a forged or stale one is an error code); the importing device is
                // current.
                let code = unsafe {
                    sys::cudaIpcOpenMemHandle(&mut raw, h, sys::cudaIpcMemLazyEnablePeerAccess)
                };
                check(code, || {
                    format!("cudaIpcOpenMemHandle(device {}, {bus})", here.ordinal())
                })?;
                Source::Legacy
            }
            HandleKind::Pool => {
                let Some(fd) = pool_fd else {
                    return Err(refuse(
                        OP,
                        "a pool handle came without the pool's file descriptor",
                    ));
                };
                let pool = MemPool::import_fd(fd.as_fd(), owner)?;
                drop(fd);
                if owner != here {
                    pool.set_access(here, PoolAccess::READ_WRITE)?;
                }
                let mut data = sys::cudaMemPoolPtrExportData {
                    reserved: handle.mem,
                };
                // SAFETY: valid out-pointers; the pool is live; the export data are plain
                // bytes the runtime validates.
                let code =
                    unsafe { sys::cudaMemPoolImportPointer(&mut raw, pool.as_raw(), &mut data) };
                check(code, || {
                    format!("cudaMemPoolImportPointer({pool:?}, {bus})")
                })?;
                Source::Pool { _pool: pool }
            }
        };
        let alloc = ImportedMemory {
            device: here,
            source,
        };
        // Memory made elsewhere: any alignment its address has is accepted (`adopt`).
        let ptr = match Layout::adopt(raw.cast::<T>(), len, OP) {
            Ok(ptr) => ptr,
            Err(e) => {
                // Unmapped at once (nothing was queued on it); a null address mapped nothing.
                if let Some(p) = NonNull::new(raw.cast::<u8>()) {
                    let _ = alloc.unmap(p);
                }
                return Err(e);
            }
        };
        let mut buf = Buffer::from_parts(ptr, len, Fence::default(), alloc);
        // From here on an error drops `buf`, which unmaps it (its fence is idle).
        let event = Event::open_ipc(&handle.event, owner)?;
        let _s = stream.inner().enter()?;
        // The wait is queued work: in flight for capture begins until the fence holds it (a
        // capture begun meanwhile on `stream` by another thread would otherwise make the
        // mapping count as its graph memory).
        let queued = Fence::queue_alloc(stream)?;
        event.wait_on(stream)?;
        buf.fence = queued.marked((0, buf.byte_len()), Access::Write);
        Ok((buf, event))
    }

    /// The device the memory is mapped on (the opening stream's), which its copies run on.
    pub fn device(&self) -> Device {
        self.alloc.device
    }

    /// How the memory was shared.
    pub fn kind(&self) -> HandleKind {
        self.alloc.kind()
    }

    /// Copies the buffer to a new `Vec`, after the work it must follow.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.len()];
        crate::transfer::copy(&mut v, self)?;
        Ok(v)
    }
}

/// The other side of an [`Exporter`](super::Exporter): another process's buffer, held under
/// the channel's protocol. It opens the offered buffer ([`accept`](Self::accept)), passes it
/// back and takes it again with the fence's ordering, and tells the exporter when it has
/// closed it ([`close`](Self::close), or drop), which is what lets the exporter free it.
pub struct Importer<T: Pod> {
    /// `None` once closed.
    buf: Option<ImportedBuffer<T>>,
    /// The exporter's event as opened here, and its handle bytes.
    peer_event: Option<([u8; IPC_EVENT_HANDLE_LEN], Event)>,
    /// This side's interprocess event (made at the first pass) and its handle bytes.
    event: Option<([u8; IPC_EVENT_HANDLE_LEN], Event)>,
    chan: Channel,
    generation: u64,
    held: bool,
    handle: IpcHandle,
}

impl<T: Pod> std::fmt::Debug for Importer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Importer")
            .field("buf", &self.buf)
            .field("generation", &self.generation)
            .field("held", &self.held)
            .finish()
    }
}

impl<T: Pod> Importer<T> {
    /// Waits at most `timeout` for the exporter's offer on `chan` and opens it on `stream`'s
    /// device ([`ImportedBuffer::open`]): this side holds the buffer, ordered after the
    /// exporter's writes. When the open fails, the exporter is told (so that it may free the
    /// memory) and the error returned: CUDA's, with its code, or the misuse found first.
    ///
    /// A `stream` that is capturing is refused first, before the offer is read (nothing is
    /// mapped, the capture stays valid): [`Misuse::InvalidArgument`](crate::Misuse::InvalidArgument)
    /// saying that an import cannot be recorded into a graph. The exporter is told as for a
    /// failed open, and may offer again on another channel.
    pub fn accept(chan: Channel, stream: &Stream, timeout: Duration) -> Result<Importer<T>> {
        if let Err(e) = refuse_capturing(stream, "Importer::accept", IMPORT_INTO_CAPTURE) {
            let code = e.code().map_or(0, |c| c.0);
            // The exporter gets its buffer back (it leaks it if it cannot be told).
            let _ = chan.send(&Message::Refused { code }, None, DROP_TIMEOUT);
            return Err(e);
        }
        let (msg, fd) = chan.recv(timeout)?;
        let handle = match msg {
            Message::Offer(h) => h,
            m => return Err(unexpected("Importer::accept", m.name(), "Offer")),
        };
        match ImportedBuffer::open_with_event(&handle, fd, stream) {
            Ok((buf, event)) => Ok(Importer {
                buf: Some(buf),
                peer_event: Some((handle.event, event)),
                event: None,
                chan,
                generation: handle.generation,
                held: true,
                handle,
            }),
            Err(e) => {
                let code = e.code().map_or(0, |c| c.0);
                // The exporter may free the memory now; if it cannot be told, it leaks it.
                let _ = chan.send(&Message::Refused { code }, None, DROP_TIMEOUT);
                Err(e)
            }
        }
    }

    fn check_held(&self, op: &'static str) -> Result<&ImportedBuffer<T>> {
        let Some(buf) = &self.buf else {
            return Err(refuse(op, "the buffer is closed"));
        };
        if !self.held {
            return Err(refuse(
                op,
                format!(
                    "the exporter holds the buffer (generation {}): take it back first \
                     (Importer::take_back)",
                    self.generation
                ),
            ));
        }
        Ok(buf)
    }

    /// The buffer, for reads, while this side holds it.
    pub fn buffer(&self) -> Result<&ImportedBuffer<T>> {
        self.check_held("Importer::buffer")
    }

    /// The whole buffer as a writable view, while this side holds it.
    pub fn buffer_mut(&mut self) -> Result<ViewMut<'_, T, ImportedBuffer<T>>> {
        self.check_held("Importer::buffer_mut")?;
        match &mut self.buf {
            Some(b) => b.slice_mut(..),
            None => Err(refuse("Importer::buffer_mut", "the buffer is closed")),
        }
    }

    /// The generation of the last pass, sent or received.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The handle that was offered. Opening it again elsewhere is outside the protocol: the
    /// exporter frees the memory on this importer's close alone.
    pub fn handle(&self) -> &IpcHandle {
        &self.handle
    }

    /// Whether this side holds the buffer.
    pub fn is_held(&self) -> bool {
        self.held && self.buf.is_some()
    }

    /// Whether the exporter's last recorded work on the buffer has completed (its event),
    /// without waiting: `false` right after a pass means the exporter's writes were still
    /// running when the pass arrived, and this side's work is ordered after them on the
    /// device.
    pub fn peer_work_done(&self) -> Result<bool> {
        match &self.peer_event {
            Some((_, e)) => e.is_complete(),
            None => Ok(true),
        }
    }

    /// Passes the buffer back to the exporter: records this side's event on `stream` after
    /// every piece of work pending on the buffer, and sends it with the next generation.
    /// Refused on a `stream` that is capturing (the record would be a node of the graph, and
    /// the exporter would wait for nothing); this side keeps the buffer.
    pub fn pass(&mut self, stream: &Stream) -> Result<()> {
        const OP: &str = "Importer::pass";
        let buf = self.check_held(OP)?;
        let device = buf.device();
        require_same(OP, device.ordinal(), stream.inner().device())?;
        stream.inner().check_current(OP)?;
        refuse_capturing(stream, OP, PASS_INTO_CAPTURE)?;
        let _g = stream.inner().enter()?;
        if self.event.is_none() {
            let e = Event::interprocess(device)?;
            self.event = Some((e.ipc_handle()?, e));
        }
        let (Some(buf), Some((handle, event))) = (&self.buf, &self.event) else {
            return Err(refuse(OP, "the buffer is closed"));
        };
        {
            // In flight for capture begins until the record has returned (see
            // `Exporter::record`).
            let _queued = buf
                .fence
                .begin(stream, (0, buf.byte_len()), Access::Write)?;
            event.record(stream)?;
        }
        self.held = false;
        self.generation += 1;
        self.chan.send(
            &Message::Pass {
                generation: self.generation,
                event: *handle,
            },
            None,
            DROP_TIMEOUT,
        )
    }

    /// Waits at most `timeout` for the exporter to pass the buffer back; `stream`, then
    /// everything done with the buffer, waits on the device for the exporter's writes.
    ///
    /// Errors: the channel's (the exporter's process gone: `ECONNRESET`, so nothing is read
    /// from memory it may have freed; `ETIMEDOUT`; a truncated or foreign message); a pass
    /// out of order; a `stream` that is capturing, before the pass is read (the wait would be
    /// a node of the graph: take the buffer back on a stream that is not capturing).
    pub fn take_back(&mut self, stream: &Stream, timeout: Duration) -> Result<()> {
        const OP: &str = "Importer::take_back";
        let Some(buf) = &self.buf else {
            return Err(refuse(OP, "the buffer is closed"));
        };
        if self.held {
            return Err(refuse(OP, "this side holds the buffer already"));
        }
        require_same(OP, buf.device().ordinal(), stream.inner().device())?;
        stream.inner().check_current(OP)?;
        // Before the pass is read: refused after it, the pass would be lost.
        refuse_capturing(stream, OP, TAKE_BACK_INTO_CAPTURE)?;
        let (msg, _fd) = self.chan.recv(timeout)?;
        let Message::Pass { generation, event } = msg else {
            return Err(unexpected(OP, msg.name(), "Pass"));
        };
        if generation != self.generation + 1 {
            return Err(refuse(
                OP,
                format!(
                    "the exporter passed generation {generation}; {} was next",
                    self.generation + 1
                ),
            ));
        }
        if self.peer_event.as_ref().is_none_or(|(h, _)| *h != event) {
            let owner = buf.device();
            self.peer_event = Some((event, Event::open_ipc(&event, owner)?));
        }
        let (Some(buf), Some((_, peer))) = (&self.buf, &self.peer_event) else {
            return Err(refuse(OP, "the buffer is closed"));
        };
        let _g = stream.inner().enter()?;
        {
            // `begin`, not a `mark` after the wait: the wait is in flight for capture begins
            // until it has returned, so a capture that another thread begins on `stream`
            // meanwhile waits for it, or is seen here and refused (the wait must not be
            // captured: see `refuse_capturing`).
            let _queued = buf
                .fence
                .begin(stream, (0, buf.byte_len()), Access::Write)?;
            peer.wait_on(stream)?;
        }
        self.generation = generation;
        self.held = true;
        Ok(())
    }

    /// Unmaps the buffer after all work recorded on it, lets go of the exporter's event, and
    /// tells the exporter, which may then free the memory. When the wait fails the mapping is
    /// leaked and the exporter is not told (it leaks the memory too): nothing is freed under
    /// running work.
    pub fn close(mut self) -> Result<()> {
        self.close_inner()
    }

    fn close_inner(&mut self) -> Result<()> {
        let Some(buf) = self.buf.take() else {
            return Ok(());
        };
        // Waits for all work recorded on the buffer, then unmaps it; on error the mapping is
        // leaked and the exporter is not told (it leaks the memory too).
        buf.free()?;
        // The exporter destroys its event once told; this side's handle of it goes first.
        self.peer_event = None;
        // This side's event may have a wait queued in the exporter: let it complete first.
        // (Never recorded into a capture; relaxed mode lets the host wait while one is open.)
        if let Some((_, e)) = &self.event {
            let _relaxed = Relaxed::new();
            e.synchronize()?;
        }
        self.chan.send(
            &Message::Closed {
                generation: self.generation,
            },
            None,
            DROP_TIMEOUT,
        )
    }
}

impl<T: Pod> Drop for Importer<T> {
    fn drop(&mut self) {
        if let Err(e) = self.close_inner() {
            note(&format!("cuda-mem ipc: Importer dropped: {e}"));
        }
    }
}
