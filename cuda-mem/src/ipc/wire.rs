//! The bytes that travel between processes: the [`IpcHandle`] of a shared buffer, and the
//! channel's messages (a length-prefixed, versioned frame each). Everything read here is
//! checked (magic, version, lengths, kinds) before any value reaches the runtime.

use std::fmt;

#[cfg(any(doc, test))]
use crate::error::Misuse;
use crate::error::{invalid_argument as bad, Result};
use crate::handles::event::IPC_EVENT_HANDLE_LEN;

/// The size of a `cudaIpcMemHandle_t` and of a `cudaMemPoolPtrExportData`.
pub(crate) const MEM_HANDLE_LEN: usize = 64;
/// Room for a PCI bus id (`cudaDeviceGetPCIBusId`: `dddddddd:bb:dd.f` and a NUL).
pub(crate) const BUS_ID_LEN: usize = 32;

const HANDLE_MAGIC: [u8; 4] = *b"CMIH";
const FRAME_MAGIC: [u8; 4] = *b"CMIP";
/// The version of both the handle layout and the message frames.
pub(crate) const VERSION: u16 = 1;
/// Bytes of a frame header: magic, version, kind, body length.
pub(crate) const HEADER_LEN: usize = 12;
/// The largest body a frame may announce; longer ones are refused before they are read.
pub(crate) const MAX_BODY: usize = 1024;

/// How the memory behind a handle is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HandleKind {
    /// `cudaMalloc` memory through `cudaIpcGetMemHandle` / `cudaIpcOpenMemHandle`.
    Legacy,
    /// Memory from a [`shareable`](crate::MemPool::shareable) pool, through
    /// `cudaMemPoolExportPointer` / `cudaMemPoolImportPointer`; the pool itself travels as a
    /// file descriptor beside the handle.
    Pool,
}

/// The handle of a device buffer shared with other processes: plain bytes
/// ([`to_bytes`](Self::to_bytes), [`from_bytes`](Self::from_bytes)) that any channel can carry.
/// It names the memory (a `cudaIpcMemHandle_t`, or a pool pointer's export data), the
/// interprocess event that the exporter recorded after its pending writes, the element size
/// and count, the exporter's device (by PCI bus id, which every process sees alike) and the
/// exporting process.
///
/// [`from_bytes`](Self::from_bytes) checks the magic, the version, the length and every field
/// it can before anything reaches CUDA; CUDA checks the rest when the handle is opened
/// ([`ImportedBuffer::open`](crate::ipc::ImportedBuffer::open)), and its error code is kept.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcHandle {
    pub(crate) kind: HandleKind,
    pub(crate) pid: u32,
    pub(crate) process: u64,
    pub(crate) elem_size: u32,
    pub(crate) len: u64,
    pub(crate) generation: u64,
    pub(crate) bus_id: [u8; BUS_ID_LEN],
    pub(crate) mem: [u8; MEM_HANDLE_LEN],
    pub(crate) event: [u8; IPC_EVENT_HANDLE_LEN],
}

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcHandle")
            .field("kind", &self.kind)
            .field("len", &self.len)
            .field("elem_size", &self.elem_size)
            .field("device", &self.bus_id_str())
            .field("pid", &self.pid)
            .field("generation", &self.generation)
            .finish()
    }
}

/// A little-endian writer into a fixed buffer.
struct Put<'a>(&'a mut Vec<u8>);

impl Put<'_> {
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
}

/// A little-endian reader over bytes whose length was checked first.
struct Get<'a>(&'a [u8]);

impl Get<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        let mut out = [0; N];
        out.copy_from_slice(head);
        out
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

impl IpcHandle {
    /// The size of a handle in bytes.
    pub const LEN: usize =
        4 + 2 + 1 + 1 + 4 + 8 + 4 + 4 + 8 + 8 + BUS_ID_LEN + MEM_HANDLE_LEN + IPC_EVENT_HANDLE_LEN;

    /// The handle as bytes, for any channel.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut v = Vec::with_capacity(Self::LEN);
        Put(&mut v)
            .bytes(&HANDLE_MAGIC)
            .u16(VERSION)
            .bytes(&[
                match self.kind {
                    HandleKind::Legacy => 1,
                    HandleKind::Pool => 2,
                },
                0,
            ])
            .u32(self.pid)
            .u64(self.process)
            .u32(self.elem_size)
            .u32(0)
            .u64(self.len)
            .u64(self.generation)
            .bytes(&self.bus_id)
            .bytes(&self.mem)
            .bytes(&self.event);
        let mut out = [0; Self::LEN];
        out.copy_from_slice(&v);
        out
    }

    /// Reads a handle from bytes, refusing anything that is not one this build wrote:
    /// [`Misuse::InvalidArgument`] naming what is wrong (length, magic, version, kind, sizes,
    /// device id).
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcHandle> {
        const OP: &str = "IpcHandle::from_bytes";
        if bytes.len() != Self::LEN {
            return Err(bad(
                OP,
                format!("a handle is {} bytes, got {}", Self::LEN, bytes.len()),
            ));
        }
        let mut g = Get(bytes);
        let magic: [u8; 4] = g.take();
        if magic != HANDLE_MAGIC {
            return Err(bad(
                OP,
                format!(
                    "not a cuda-mem IPC handle (magic {magic:02x?}, expected {HANDLE_MAGIC:02x?})"
                ),
            ));
        }
        let version = g.u16();
        if version != VERSION {
            return Err(bad(
                OP,
                format!("handle version {version}; this build reads version {VERSION}"),
            ));
        }
        let [kind, pad]: [u8; 2] = g.take();
        let kind = match (kind, pad) {
            (1, 0) => HandleKind::Legacy,
            (2, 0) => HandleKind::Pool,
            _ => return Err(bad(OP, format!("unknown handle kind {kind} ({pad})"))),
        };
        let pid = g.u32();
        let process = g.u64();
        let elem_size = g.u32();
        let pad = g.u32();
        let len = g.u64();
        let generation = g.u64();
        let bus_id: [u8; BUS_ID_LEN] = g.take();
        let mem = g.take();
        let event = g.take();
        if pad != 0 {
            return Err(bad(OP, format!("reserved field is {pad}, not 0")));
        }
        if elem_size == 0 || len == 0 {
            return Err(bad(
                OP,
                format!("an empty buffer ({len} elements of {elem_size} bytes)"),
            ));
        }
        if len
            .checked_mul(u64::from(elem_size))
            .is_none_or(|b| b > isize::MAX as u64)
        {
            return Err(bad(
                OP,
                format!("{len} elements of {elem_size} bytes overflow the address space"),
            ));
        }
        let h = IpcHandle {
            kind,
            pid,
            process,
            elem_size,
            len,
            generation,
            bus_id,
            mem,
            event,
        };
        if h.bus_id().is_none() {
            return Err(bad(OP, "the device id is not a NUL-terminated PCI bus id"));
        }
        Ok(h)
    }

    /// How the memory is shared.
    pub fn kind(&self) -> HandleKind {
        self.kind
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Always false: handles name at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size of one element in bytes.
    pub fn elem_size(&self) -> usize {
        self.elem_size as usize
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.len() * self.elem_size()
    }

    /// The id of the exporting process (for messages: a process in another PID namespace may
    /// have the same one).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The exporter's device, by PCI bus id (`None` if it is not one).
    pub fn bus_id(&self) -> Option<&str> {
        let end = self.bus_id.iter().position(|&b| b == 0)?;
        let s = std::str::from_utf8(&self.bus_id[..end]).ok()?;
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic())).then_some(s)
    }

    fn bus_id_str(&self) -> &str {
        self.bus_id().unwrap_or("?")
    }
}

/// A message of the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    /// The exporter offers a buffer (generation 1: the importer holds it first). For a pool
    /// handle the pool's file descriptor comes with it.
    Offer(IpcHandle),
    /// The sender's writes before `generation` are covered by its event `event`: the
    /// receiver holds the buffer now.
    Pass {
        generation: u64,
        event: [u8; IPC_EVENT_HANDLE_LEN],
    },
    /// The importer has closed its mapping, all its work on it complete: the exporter may
    /// free the memory.
    Closed { generation: u64 },
    /// The importer did not open the offered buffer (`code`: the CUDA error, 0 for a misuse):
    /// nothing is mapped, the exporter may free the memory.
    Refused { code: u32 },
}

impl Message {
    fn kind(&self) -> u16 {
        match self {
            Message::Offer(_) => 1,
            Message::Pass { .. } => 2,
            Message::Closed { .. } => 3,
            Message::Refused { .. } => 4,
        }
    }

    /// The whole frame: header and body.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        match self {
            Message::Offer(h) => {
                body.extend_from_slice(&h.to_bytes());
            }
            Message::Pass { generation, event } => {
                Put(&mut body).u64(*generation).bytes(event);
            }
            Message::Closed { generation } => {
                Put(&mut body).u64(*generation);
            }
            Message::Refused { code } => {
                Put(&mut body).u32(*code);
            }
        }
        let mut frame = Vec::with_capacity(HEADER_LEN + body.len());
        Put(&mut frame)
            .bytes(&FRAME_MAGIC)
            .u16(VERSION)
            .u16(self.kind())
            .u32(body.len() as u32)
            .bytes(&body);
        frame
    }

    /// The kind and body length a header announces, checked.
    pub(crate) fn header(h: &[u8; HEADER_LEN]) -> Result<(u16, usize)> {
        const OP: &str = "ipc::Channel::recv";
        let mut g = Get(h);
        let magic: [u8; 4] = g.take();
        if magic != FRAME_MAGIC {
            return Err(bad(
                OP,
                format!("not a cuda-mem IPC message (magic {magic:02x?})"),
            ));
        }
        let version = g.u16();
        if version != VERSION {
            return Err(bad(
                OP,
                format!("message version {version}; this build speaks version {VERSION}"),
            ));
        }
        let kind = g.u16();
        let len = g.u32() as usize;
        if len > MAX_BODY {
            return Err(bad(
                OP,
                format!("a message body of {len} bytes announced; at most {MAX_BODY} are accepted"),
            ));
        }
        Ok((kind, len))
    }

    /// The message of `kind` with `body`, checked.
    pub(crate) fn decode(kind: u16, body: &[u8]) -> Result<Message> {
        const OP: &str = "ipc::Channel::recv";
        let want = match kind {
            1 => IpcHandle::LEN,
            2 => 8 + IPC_EVENT_HANDLE_LEN,
            3 => 8,
            4 => 4,
            _ => return Err(bad(OP, format!("unknown message kind {kind}"))),
        };
        if body.len() != want {
            return Err(bad(
                OP,
                format!(
                    "message kind {kind} has a body of {want} bytes, {} announced",
                    body.len()
                ),
            ));
        }
        let mut g = Get(body);
        Ok(match kind {
            1 => Message::Offer(IpcHandle::from_bytes(body)?),
            2 => Message::Pass {
                generation: g.u64(),
                event: g.take(),
            },
            3 => Message::Closed {
                generation: g.u64(),
            },
            _ => Message::Refused { code: g.u32() },
        })
    }

    /// The message's name, for errors.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Message::Offer(_) => "Offer",
            Message::Pass { .. } => "Pass",
            Message::Closed { .. } => "Closed",
            Message::Refused { .. } => "Refused",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> IpcHandle {
        let mut bus_id = [0; BUS_ID_LEN];
        bus_id[..12].copy_from_slice(b"0000:19:00.0");
        IpcHandle {
            kind: HandleKind::Pool,
            pid: 1234,
            process: 0xdead_beef,
            elem_size: 4,
            len: 1 << 28,
            generation: 1,
            bus_id,
            mem: [7; MEM_HANDLE_LEN],
            event: [9; IPC_EVENT_HANDLE_LEN],
        }
    }

    fn reason(e: crate::Error) -> String {
        match e {
            crate::Error::Misuse(Misuse::InvalidArgument { reason, .. }) => reason,
            e => panic!("unexpected error {e:?}"),
        }
    }

    #[test]
    fn a_handle_round_trips_through_bytes() {
        let h = sample();
        let b = h.to_bytes();
        assert_eq!(b.len(), IpcHandle::LEN);
        let back = IpcHandle::from_bytes(&b).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.bus_id(), Some("0000:19:00.0"));
        assert_eq!(back.byte_len(), 1 << 30);
    }

    #[test]
    fn forged_and_garbage_handles_are_refused_before_cuda() {
        let good = sample().to_bytes();
        let short = format!("a handle is {} bytes, got 10", IpcHandle::LEN);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..10].to_vec(), &short),
            (vec![0x5a; IpcHandle::LEN], "not a cuda-mem IPC handle"),
            (
                {
                    let mut b = good.to_vec();
                    b[4] = 2;
                    b
                },
                "handle version 2; this build reads version 1",
            ),
            (
                {
                    let mut b = good.to_vec();
                    b[6] = 9;
                    b
                },
                "unknown handle kind 9",
            ),
            (
                {
                    let mut b = good.to_vec();
                    b[28..36].copy_from_slice(&u64::MAX.to_le_bytes());
                    b
                },
                "overflow the address space",
            ),
            (
                {
                    let mut b = good.to_vec();
                    b[28..36].copy_from_slice(&0u64.to_le_bytes());
                    b
                },
                "an empty buffer",
            ),
            (
                {
                    let mut b = good.to_vec();
                    b[44..44 + BUS_ID_LEN].fill(b'x');
                    b
                },
                "the device id is not a NUL-terminated PCI bus id",
            ),
        ];
        for (bytes, want) in cases {
            let r = reason(IpcHandle::from_bytes(&bytes).unwrap_err());
            assert!(r.contains(want), "{r:?} does not say {want:?}");
        }
    }

    #[test]
    fn messages_round_trip_and_bad_frames_are_named() {
        for m in [
            Message::Offer(sample()),
            Message::Pass {
                generation: 7,
                event: [3; IPC_EVENT_HANDLE_LEN],
            },
            Message::Closed { generation: 9 },
            Message::Refused { code: 201 },
        ] {
            let f = m.encode();
            let head: [u8; HEADER_LEN] = f[..HEADER_LEN].try_into().unwrap();
            let (kind, len) = Message::header(&head).unwrap();
            assert_eq!(len, f.len() - HEADER_LEN);
            assert_eq!(Message::decode(kind, &f[HEADER_LEN..]).unwrap(), m);
        }
        let mut head: [u8; HEADER_LEN] = Message::Closed { generation: 1 }.encode()[..HEADER_LEN]
            .try_into()
            .unwrap();
        head[8..12].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        let r = reason(Message::header(&head).unwrap_err());
        assert_eq!(
            r,
            "a message body of 1025 bytes announced; at most 1024 are accepted"
        );
        head[4] = 3;
        let r = reason(Message::header(&head).unwrap_err());
        assert_eq!(r, "message version 3; this build speaks version 1");
        let r = reason(Message::decode(3, &[0; 4]).unwrap_err());
        assert_eq!(r, "message kind 3 has a body of 8 bytes, 4 announced");
        let r = reason(Message::decode(77, &[]).unwrap_err());
        assert_eq!(r, "unknown message kind 77");
    }
}
