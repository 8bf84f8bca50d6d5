//! The exporting side: [`Exporter`] owns the shared buffer and frees it only on the
//! importer's word.

use std::mem::ManuallyDrop;
use std::time::Duration;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use super::channel::Channel;
use super::wire::{HandleKind, IpcHandle, Message, MEM_HANDLE_LEN};
use super::{
    bus_id_of, leaked, note, process_tag, refuse, refuse_capturing, unexpected, DROP_TIMEOUT,
    PASS_INTO_CAPTURE, TAKE_BACK_INTO_CAPTURE,
};
use crate::contract::memory::sealed::Async;
#[cfg(doc)]
use crate::error::Misuse;
use crate::error::{check, Error, ErrorCode, Result};
use crate::fence::capture::Relaxed;
use crate::fence::Access;
use crate::handles::devices::require_same;
use crate::handles::event::{Event, IPC_EVENT_HANDLE_LEN};
use crate::handles::stream::Stream;
use crate::kinds::device::DeviceBuffer;
use crate::ops::view::{Slice, ViewMut};

/// What came back from the importer in [`Exporter::take_back`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Back {
    /// The importer passed the buffer back: its writes come before everything done with the
    /// buffer from now on. It may be passed again.
    Passed,
    /// The importer closed its mapping (all its work on it completed): the buffer is this
    /// side's alone; [`Exporter::close`] returns it at once.
    Closed,
}

/// A device buffer shared with one other process over a [`Channel`]: it owns the buffer (a
/// forgotten `Exporter` leaks it, never frees it), hands it to the importer and back with the
/// ordering of the fence, and frees it, or gives it back ([`close`](Self::close)), only once
/// the importer has closed it. See [the module](super).
pub struct Exporter<T: Pod> {
    /// Freed (or returned) only once the importer has no mapping of it.
    buf: ManuallyDrop<DeviceBuffer<T>>,
    /// Recorded after this side's work at each pass; lives as long as an importer may wait
    /// for it (leaked with the buffer otherwise).
    event: ManuallyDrop<Event>,
    event_handle: [u8; IPC_EVENT_HANDLE_LEN],
    /// The importer's event, as opened here, and its handle bytes.
    peer_event: Option<([u8; IPC_EVENT_HANDLE_LEN], Event)>,
    chan: Channel,
    /// The generation of the last pass, sent or received.
    generation: u64,
    /// Whether this side holds the buffer.
    held: bool,
    /// Whether the importer may have it mapped (offered, neither closed nor refused).
    mapped: bool,
    /// Whether `buf` and `event` are gone (returned by `close`, or leaked).
    done: bool,
    /// How the buffer is shared.
    kind: HandleKind,
}

impl<T: Pod> std::fmt::Debug for Exporter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("kind", &self.kind)
            .field("len", &self.buf.len())
            .field("generation", &self.generation)
            .field("held", &self.held)
            .field("mapped", &self.mapped)
            .finish()
    }
}

impl<T: Pod> Exporter<T> {
    /// Shares `buf` with the process at the other end of `chan`: makes its handle (legacy IPC
    /// for `cudaMalloc` memory; the pool's file descriptor and the pointer's export data for a
    /// buffer from a [`shareable`](crate::MemPool::shareable) pool), records an interprocess
    /// event on `stream` after every piece of work pending on the buffer, and sends both. The
    /// importer holds the buffer first (generation 1); take it back with
    /// [`take_back`](Self::take_back).
    ///
    /// `stream` must belong to the buffer's device. When anything fails before the offer is
    /// sent, the buffer was shared with nobody and is freed as by drop.
    ///
    /// Errors: [`Misuse::InvalidArgument`] for a `stream` that is capturing (the event
    /// would be recorded into the graph, and the importer would wait for nothing; checked
    /// before any runtime call, so the capture stays valid) and for a buffer from a pool that
    /// is not shareable (including a device's default pool); [`Misuse::DeviceMismatch`]; the
    /// runtime's error where it refuses to export (sandboxes without CUDA IPC), with its code.
    pub fn offer(buf: DeviceBuffer<T>, chan: Channel, stream: &Stream) -> Result<Exporter<T>> {
        const OP: &str = "Exporter::offer";
        let device = buf.device();
        require_same(OP, buf.device().ordinal(), stream.inner().device())?;
        stream.inner().check_current(OP)?;
        refuse_capturing(stream, OP, PASS_INTO_CAPTURE)?;
        let _g = device.guard()?;
        let ptr = buf.as_ptr() as *mut std::os::raw::c_void;
        let (kind, mem, fd) = match buf.pool() {
            Some(pool) if !pool.is_shareable() => {
                return Err(refuse(
                    OP,
                    format!(
                        "the buffer comes from {pool:?}, which is not shareable: allocate it \
                         from MemPool::shareable, or with cudaMalloc (DeviceBuffer::uninit)"
                    ),
                ))
            }
            Some(pool) => {
                let fd = pool.export_fd()?;
                let mut data = sys::cudaMemPoolPtrExportData {
                    reserved: [0; MEM_HANDLE_LEN],
                };
                // SAFETY: valid out-pointer; `ptr` is the start of a live allocation of the
                // (shareable) pool, owned by `buf`.
                let code = unsafe { sys::cudaMemPoolExportPointer(&mut data, ptr) };
                check(code, || format!("cudaMemPoolExportPointer({ptr:p})"))?;
                (HandleKind::Pool, data.reserved, Some(fd))
            }
            None => {
                let mut h = sys::cudaIpcMemHandle_t {
                    reserved: [0; MEM_HANDLE_LEN],
                };
                // SAFETY: valid out-pointer; `ptr` is the start of a live `cudaMalloc`
                // allocation owned by `buf`, its device current.
                let code = unsafe { sys::cudaIpcGetMemHandle(&mut h, ptr) };
                check(code, || format!("cudaIpcGetMemHandle({ptr:p})"))?;
                (HandleKind::Legacy, h.reserved.map(|b| b as u8), None)
            }
        };
        let event = Event::interprocess(device)?;
        let event_handle = event.ipc_handle()?;
        let handle = IpcHandle {
            kind,
            pid: std::process::id(),
            process: process_tag(),
            elem_size: std::mem::size_of::<T>() as u32,
            len: buf.len() as u64,
            generation: 1,
            bus_id: bus_id_of(device)?,
            mem,
            event: event_handle,
        };
        let mut me = Exporter {
            buf: ManuallyDrop::new(buf),
            event: ManuallyDrop::new(event),
            event_handle,
            peer_event: None,
            chan,
            generation: 0,
            held: true,
            mapped: false,
            done: false,
            kind,
        };
        me.record(stream, OP)?;
        me.chan.send(
            &Message::Offer(handle),
            fd.as_ref().map(std::os::fd::AsFd::as_fd),
            DROP_TIMEOUT,
        )?;
        // (A failed send sent no whole frame: the importer refuses a cut one, maps nothing,
        // and drop frees the buffer.)
        me.generation = 1;
        me.held = false;
        me.mapped = true;
        Ok(me)
    }

    /// Orders `stream` after every piece of work pending on the buffer and records the event
    /// there.
    fn record(&self, stream: &Stream, op: &'static str) -> Result<()> {
        require_same(op, self.buf.device().ordinal(), stream.inner().device())?;
        stream.inner().check_current(op)?;
        let _g = stream.inner().enter()?;
        let bytes = self.buf.byte_len();
        // `begin`, not `order`: the record is in flight for capture begins until it has
        // returned (the handshake), so a capture that another thread begins on `stream`
        // meanwhile either waits for it or is seen here and refused. After `order` alone, the
        // record could land in that capture: the event would stand for nothing outside it, and
        // the importer would wait on it for nothing.
        let _queued = self
            .buf
            .async_fence()
            .begin(stream, (0, bytes), Access::Write)?;
        self.event.record(stream)
    }

    /// How the buffer is shared.
    pub fn kind(&self) -> HandleKind {
        self.kind
    }

    /// The generation of the last pass, sent or received (1 once offered).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether this side holds the buffer (the importer has passed it back, or closed it).
    pub fn is_held(&self) -> bool {
        self.held && !self.done
    }

    /// Whether the importer may still have the buffer mapped.
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }

    fn check_held(&self, op: &'static str) -> Result<()> {
        if self.done {
            return Err(refuse(op, "the buffer is gone (closed or leaked)"));
        }
        if !self.held {
            return Err(refuse(
                op,
                format!(
                    "the importer holds the buffer (generation {}): take it back first \
                     (Exporter::take_back)",
                    self.generation
                ),
            ));
        }
        Ok(())
    }

    /// The buffer, for reads (copies out, read guards, host reads), while this side holds it.
    pub fn buffer(&self) -> Result<&DeviceBuffer<T>> {
        self.check_held("Exporter::buffer")?;
        Ok(&self.buf)
    }

    /// The whole buffer as a writable view (copies into it, memsets, write guards), while
    /// this side holds it. A view, not `&mut DeviceBuffer`: the shared allocation cannot be
    /// swapped for another.
    pub fn buffer_mut(&mut self) -> Result<ViewMut<'_, T, DeviceBuffer<T>>> {
        self.check_held("Exporter::buffer_mut")?;
        self.buf.slice_mut(..)
    }

    /// Passes the buffer to the importer: records the event on `stream` after every piece of
    /// work pending on the buffer (on any stream) and sends it with the next generation.
    /// Refused on a `stream` that is capturing (the record would be a node of the graph, and
    /// the importer would wait for nothing); this side keeps the buffer.
    pub fn pass(&mut self, stream: &Stream) -> Result<()> {
        const OP: &str = "Exporter::pass";
        self.check_held(OP)?;
        if !self.mapped {
            return Err(refuse(OP, "the importer has closed the buffer"));
        }
        refuse_capturing(stream, OP, PASS_INTO_CAPTURE)?;
        self.record(stream, OP)?;
        // Not held from here on, even if the send fails: the importer may have the message.
        self.held = false;
        self.generation += 1;
        self.chan.send(
            &Message::Pass {
                generation: self.generation,
                event: self.event_handle,
            },
            None,
            DROP_TIMEOUT,
        )
    }

    /// Waits at most `timeout` for the importer to pass the buffer back ([`Back::Passed`]:
    /// `stream`, then everything done with the buffer, waits on the device for the
    /// importer's writes) or to close it ([`Back::Closed`]).
    ///
    /// Errors: the importer refused the offer (its CUDA error code, as `Error::Cuda`; the
    /// buffer is held again, nothing is mapped); the channel's errors (the importer's process
    /// gone: `ECONNRESET`; `ETIMEDOUT`; a truncated or foreign message), after which the
    /// buffer stays lent; a `stream` that is capturing, before anything is read (the wait
    /// would be a node of the graph: take the buffer back on a stream that is not capturing).
    pub fn take_back(&mut self, stream: &Stream, timeout: Duration) -> Result<Back> {
        const OP: &str = "Exporter::take_back";
        if self.done || self.held {
            return Err(refuse(OP, "this side holds the buffer already"));
        }
        require_same(OP, self.buf.device().ordinal(), stream.inner().device())?;
        stream.inner().check_current(OP)?;
        // Before the message is read: refused after it, a pass would be lost.
        refuse_capturing(stream, OP, TAKE_BACK_INTO_CAPTURE)?;
        let (msg, _fd) = self.chan.recv(timeout)?;
        self.on_message(msg, Some(stream), OP)
    }

    /// Applies one message from the importer: with `stream`, a pass is waited for there on
    /// the device; without, on the host.
    fn on_message(
        &mut self,
        msg: Message,
        stream: Option<&Stream>,
        op: &'static str,
    ) -> Result<Back> {
        match msg {
            Message::Pass { generation, event } => {
                if generation != self.generation + 1 {
                    return Err(refuse(
                        op,
                        format!(
                            "the importer passed generation {generation}; {} was next",
                            self.generation + 1
                        ),
                    ));
                }
                let device = self.buf.device();
                if self.peer_event.as_ref().is_none_or(|(h, _)| *h != event) {
                    self.peer_event = Some((event, Event::open_ipc(&event, device)?));
                }
                let Some((_, peer)) = &self.peer_event else {
                    return Err(refuse(op, "the importer's event is not open"));
                };
                match stream {
                    Some(s) => {
                        let _g = s.inner().enter()?;
                        // In flight for capture begins until the wait has returned (as in
                        // `record`): the wait is never captured.
                        let bytes = self.buf.byte_len();
                        let _queued = self.buf.async_fence().begin(s, (0, bytes), Access::Write)?;
                        peer.wait_on(s)?;
                    }
                    None => {
                        // (Never recorded into a capture; relaxed mode lets the host wait
                        // while one is open.)
                        let _relaxed = Relaxed::new();
                        peer.synchronize()?
                    }
                }
                self.generation = generation;
                self.held = true;
                Ok(Back::Passed)
            }
            Message::Closed { .. } => {
                // The importer waited for all its work on the buffer before unmapping it.
                self.mapped = false;
                self.held = true;
                Ok(Back::Closed)
            }
            Message::Refused { code } => {
                self.mapped = false;
                self.held = true;
                Err(if code == 0 {
                    refuse(op, "the importer refused the offer before calling CUDA")
                } else {
                    Error::Cuda {
                        code: ErrorCode(code),
                        call: "the importer's open of the offered buffer".into(),
                    }
                })
            }
            m @ Message::Offer(_) => Err(unexpected(op, m.name(), "Pass or Closed")),
        }
    }

    /// Waits at most `timeout` for the importer to close the buffer (or to have refused it),
    /// then gives the buffer back, its ordering intact. Passes that arrive meanwhile are
    /// waited for on the host.
    ///
    /// On error (the timeout ran out, the importer's process is gone without closing, a
    /// broken message) the buffer is leaked, never freed: the importer may still map it. The
    /// error says so.
    pub fn close(mut self, timeout: Duration) -> Result<DeviceBuffer<T>> {
        self.wait_closed(timeout)?;
        self.done = true;
        // SAFETY: `done` is set, so neither drop nor anything else touches `buf` or `event`
        // again; each is taken once.
        let (buf, event) = unsafe {
            (
                ManuallyDrop::take(&mut self.buf),
                ManuallyDrop::take(&mut self.event),
            )
        };
        // The importer destroyed its handle of the event before it said it closed.
        drop(event);
        Ok(buf)
    }

    /// Until the importer has no mapping; on error, leaks buffer and event (marks `done`).
    fn wait_closed(&mut self, timeout: Duration) -> Result<()> {
        if self.done {
            return Err(refuse("Exporter::close", "the buffer is gone already"));
        }
        let deadline = std::time::Instant::now() + timeout;
        while self.mapped {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let r = self
                .chan
                .recv(left)
                .and_then(|(m, _)| self.on_message(m, None, "Exporter::close"));
            if let Err(e) = r {
                if !self.mapped {
                    // A refusal: nothing is mapped, the buffer may be freed.
                    break;
                }
                self.done = true; // leaked: `buf` and `event` are never dropped
                return Err(leaked(e, self.buf.byte_len()));
            }
        }
        Ok(())
    }
}

impl<T: Pod> Drop for Exporter<T> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        match self.wait_closed(DROP_TIMEOUT) {
            Ok(()) => {
                self.done = true;
                // SAFETY: as in `close`: taken once, never touched again (`done`).
                unsafe {
                    ManuallyDrop::drop(&mut self.buf);
                    ManuallyDrop::drop(&mut self.event);
                }
            }
            Err(e) => note(&format!("cuda-mem ipc: Exporter dropped: {e}")),
        }
    }
}
