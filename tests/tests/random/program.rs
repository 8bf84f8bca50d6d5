//! What a random program is: phases of per-thread operation lists over numbered buffer slots,
//! printable, countable, and filterable by operation (for the shrinker).
//!
//! Every operation is meaningful whatever came before it: one that names an empty slot, a slot
//! of a kind it does not apply to, or a range past the buffer's end is clamped or skipped, the
//! same way by the executor and its model. So any subset of a program's operations is itself
//! a valid program, which is what lets the shrinker delete operations freely.

use std::fmt;

/// A buffer slot: holds at most one live buffer at a time.
pub type SlotId = u8;

/// How a slot's buffer was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `cudaMalloc` (`DeviceBuffer::zeroed` / `from_slice` / `uninit`).
    Device,
    /// `DeviceBuffer::from_pool` of the run's `MemPool` (stream-ordered).
    DevicePool,
    /// `cudaHostAlloc` (`PinnedBuffer::zeroed` / `from_slice`).
    Pinned,
    /// `PinnedPool::global().alloc`: blocks reused across the whole process.
    PinnedGlobalPool,
    /// A private `PinnedPool` of the run.
    PinnedPrivatePool,
    /// `MappedBuffer` (zero-copy, with host atomics).
    Mapped,
    /// `ManagedBuffer` (attached globally).
    Managed,
    /// `RegisteredVec` (a `Vec` pinned in place).
    Registered,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Device,
        Kind::DevicePool,
        Kind::Pinned,
        Kind::PinnedGlobalPool,
        Kind::PinnedPrivatePool,
        Kind::Mapped,
        Kind::Managed,
        Kind::Registered,
    ];

    /// Device memory (no host view; may live on device 1).
    pub fn is_device(self) -> bool {
        matches!(self, Kind::Device | Kind::DevicePool)
    }

    /// Memory the host reads in place (`as_slice`).
    pub fn is_host(self) -> bool {
        !self.is_device()
    }

    /// Memory `cudaMemsetAsync` fills (device and managed).
    pub fn memsets(self) -> bool {
        matches!(self, Kind::Device | Kind::DevicePool | Kind::Managed)
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Device => "device",
            Kind::DevicePool => "device-pool",
            Kind::Pinned => "pinned",
            Kind::PinnedGlobalPool => "pinned-global-pool",
            Kind::PinnedPrivatePool => "pinned-private-pool",
            Kind::Mapped => "mapped",
            Kind::Managed => "managed",
            Kind::Registered => "registered",
        }
    }
}

/// A new buffer's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Init {
    Zero,
    /// Every byte this value.
    Byte(u8),
    /// [`crate::model::pattern`] of this seed.
    Pattern(u32),
}

/// The stream an operation queues on, resolved by the executor for the operation's device and
/// the thread that runs it: each thread has its own blocking, non-blocking and cudarc streams
/// (and its per-thread default stream); the legacy default stream and one non-blocking stream
/// are shared by all threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamSel {
    Legacy,
    Blocking(u8),
    NonBlocking(u8),
    Cudarc,
    PerThread,
    Shared,
}

/// A range of elements, clamped to the buffer when the operation runs
/// ([`crate::model::clamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub off: u32,
    pub len: u32,
}

/// How the host reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadHow {
    /// `as_slice` (host kinds; device memory falls back to `CopyToVec`).
    AsSlice,
    /// `DeviceBuffer::to_vec` (device kinds; host kinds fall back to `CopyToVec`).
    ToVec,
    /// `copy_range` into a `Vec`.
    CopyToVec,
    /// `copy_staged` of a view into a `Vec`.
    Staged,
}

/// How the host writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteHow {
    /// `as_mut_slice` (host kinds; device memory falls back to `CopyFromVec`).
    AsMutSlice,
    /// `copy_range` from a `Vec`.
    CopyFromVec,
    /// `copy_staged` from a `Vec` into a view.
    Staged,
}

/// How a copy names its ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `copy_range[_async]` with offsets.
    Range,
    /// `copy[_async]` of `slice_mut` / `slice` views.
    Views,
    /// `copy[_async]` of the whole buffers (when their lengths differ: `Range`).
    Whole,
}

/// Where an over-aligned allocation is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverKind {
    Pinned,
    PinnedGlobalPool,
    PinnedPrivatePool,
    Mapped,
    Managed,
    Registered,
}

/// One operation of one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Drops the slot's buffer (if any), then allocates a new one; `stream` is the allocation
    /// stream of pooled device memory.
    Alloc {
        slot: SlotId,
        kind: Kind,
        dev: u8,
        len: u32,
        init: Init,
        stream: StreamSel,
    },
    /// Drops the buffer, or with `explicit` calls `free()` (`into_vec()` for a registered
    /// `Vec`, whose contents are checked).
    Free { slot: SlotId, explicit: bool },
    HostRead {
        slot: SlotId,
        range: Range,
        how: ReadHow,
    },
    HostWrite {
        slot: SlotId,
        range: Range,
        how: WriteHow,
        seed: u32,
    },
    /// `dst[dst_off..][..len] <- src[src_off..][..len]`, queued on `stream`.
    CopyAsync {
        dst: SlotId,
        src: SlotId,
        dst_off: u32,
        src_off: u32,
        len: u32,
        stream: StreamSel,
        via: Via,
    },
    /// As `CopyAsync`, with the synchronous `copy` / `copy_range`.
    CopySync {
        dst: SlotId,
        src: SlotId,
        dst_off: u32,
        src_off: u32,
        len: u32,
        via: Via,
    },
    /// `split_at_mut(mid)`, then an asynchronous copy from one half into the other.
    CopyWithin {
        slot: SlotId,
        mid: u32,
        up: bool,
        stream: StreamSel,
    },
    /// `memset_async` of a view on `stream`, or with no stream `DeviceBuffer::memset`.
    Memset {
        slot: SlotId,
        range: Range,
        byte: u8,
        stream: Option<StreamSel>,
    },
    /// `cm_write` through a `device_ptr_mut` guard of a view (16-byte aligned): element `e` of
    /// the view becomes `e / 4`. With `forget` the guard is leaked after the launch.
    KernelWrite {
        slot: SlotId,
        range: Range,
        stream: StreamSel,
        forget: bool,
    },
    /// `split_at_mut(mid)`, `cm_write` into each half through its own guard, on two streams.
    SplitWrite {
        slot: SlotId,
        mid: u32,
        s1: StreamSel,
        s2: StreamSel,
    },
    /// `Probes::xor_checksum` of a view (a kernel reading through a `device_ptr` guard).
    Xor {
        slot: SlotId,
        range: Range,
        stream: StreamSel,
    },
    /// `dst[..len] <- src[..len]` by `cudaMemcpyAsync` between the addresses of a read guard
    /// and a write guard (a stand-in for a kernel); with `forget` both guards are leaked.
    GuardCopy {
        dst: SlotId,
        src: SlotId,
        len: u32,
        stream: StreamSel,
        forget: bool,
    },
    /// `cm_spin` for `us` microseconds: work queued behind it on the stream stays pending.
    Spin { stream: StreamSel, dev: u8, us: u32 },
    /// `Stream::synchronize`.
    Sync { stream: StreamSel, dev: u8 },
    /// `MappedBuffer::atomic(index)`: a store of `Some(value)`, or a load checked against the
    /// model.
    Atomic {
        slot: SlotId,
        index: u32,
        value: Option<u32>,
    },
    /// `testing::fail_next_fence_records(n)` on this thread.
    FailRecords { n: u8 },
    /// An asynchronous copy between the buffer and a `Vec` lent to `cuda_mem::scope`: into the
    /// buffer (`to_buf`, the `Vec` holding pattern `seed`) or out of it (checked).
    Scope {
        slot: SlotId,
        range: Range,
        stream: StreamSel,
        to_buf: bool,
        seed: u32,
    },
    /// `copy_peer_range` (no stream) or `copy_peer_range_async` between device buffers of two
    /// devices: `dst[..len] <- src[..len]`.
    Peer {
        dst: SlotId,
        src: SlotId,
        len: u32,
        stream: Option<StreamSel>,
    },
    /// `ManagedBuffer::prefetch` to the host or device 0.
    Prefetch {
        slot: SlotId,
        to_host: bool,
        stream: StreamSel,
    },
    /// Allocates `len` elements of a `#[repr(C, align(512))]` (or `align(4096)`) type after a
    /// `pad`-byte allocation of the same kind: refused with `Error::Misuse`, or `Ok` at an
    /// aligned address holding what is written, never `Ok` and misaligned.
    OverAligned {
        kind: OverKind,
        align4096: bool,
        len: u32,
        pad: u32,
    },
    /// Takes a read guard of the whole buffer on `stream` and holds it while `body` runs (the
    /// slot is read-only there), then launches a copy through it into slot `into`, then drops
    /// (or with `forget` leaks) the guard.
    HoldRead {
        slot: SlotId,
        stream: StreamSel,
        body: Vec<Op>,
        into: Option<SlotId>,
        forget: bool,
    },
}

/// Who may use a slot in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Exclusively one thread, which may do anything with it.
    Thread(u8),
    /// Every thread, read-only (host reads, copies out of it, read guards).
    Shared,
}

/// Threads that run at once, each on its own slots, joined at the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    /// One per slot.
    pub owners: Vec<Owner>,
    /// One operation list per thread.
    pub threads: Vec<Vec<Op>>,
}

/// A whole program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    pub seed: u64,
    pub threads: usize,
    pub devices: usize,
    pub slots: usize,
    pub phases: Vec<Phase>,
}

impl Op {
    /// Operations nested in this one.
    pub fn body(&self) -> &[Op] {
        match self {
            Op::HoldRead { body, .. } => body,
            _ => &[],
        }
    }

    /// This operation and the ones nested in it.
    pub fn count(&self) -> usize {
        1 + self.body().iter().map(Op::count).sum::<usize>()
    }
}

impl Program {
    /// Number of operations, nested ones included.
    pub fn count(&self) -> usize {
        self.phases
            .iter()
            .flat_map(|p| p.threads.iter().flatten())
            .map(Op::count)
            .sum()
    }

    /// Every operation's number in pre-order (phase, thread, operation, nested operations),
    /// grouped by phase and then by thread: `[phase][thread] -> numbers`.
    pub fn numbering(&self) -> Vec<Vec<Vec<usize>>> {
        let mut next = 0;
        self.phases
            .iter()
            .map(|p| {
                p.threads
                    .iter()
                    .map(|ops| {
                        let start = next;
                        next += ops.iter().map(Op::count).sum::<usize>();
                        (start..next).collect()
                    })
                    .collect()
            })
            .collect()
    }

    /// The program with only the operations whose pre-order number `keep` accepts (an
    /// operation that is dropped takes its nested operations with it).
    pub fn retain(&self, keep: &dyn Fn(usize) -> bool) -> Program {
        fn filter(ops: &[Op], next: &mut usize, keep: &dyn Fn(usize) -> bool) -> Vec<Op> {
            let mut out = Vec::new();
            for op in ops {
                let me = *next;
                *next += 1;
                let body = filter(op.body(), next, keep);
                if keep(me) {
                    let mut op = op.clone();
                    if let Op::HoldRead { body: b, .. } = &mut op {
                        *b = body;
                    }
                    out.push(op);
                }
            }
            out
        }
        let mut next = 0;
        let phases = self
            .phases
            .iter()
            .map(|p| Phase {
                owners: p.owners.clone(),
                threads: p
                    .threads
                    .iter()
                    .map(|ops| filter(ops, &mut next, keep))
                    .collect(),
            })
            .collect();
        Program {
            phases,
            ..self.clone()
        }
    }

    /// The program without its phases that have no operation.
    pub fn without_empty_phases(&self) -> Program {
        Program {
            phases: self
                .phases
                .iter()
                .filter(|p| p.threads.iter().any(|t| !t.is_empty()))
                .cloned()
                .collect(),
            ..self.clone()
        }
    }
}

impl fmt::Display for StreamSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamSel::Legacy => write!(f, "legacy"),
            StreamSel::Blocking(i) => write!(f, "blocking{i}"),
            StreamSel::NonBlocking(i) => write!(f, "non-blocking{i}"),
            StreamSel::Cudarc => write!(f, "cudarc"),
            StreamSel::PerThread => write!(f, "per-thread"),
            StreamSel::Shared => write!(f, "shared-non-blocking"),
        }
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}..+{}]", self.off, self.len)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Init {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Init::Zero => write!(f, "zeros"),
            Init::Byte(b) => write!(f, "bytes {b:#04x}"),
            Init::Pattern(s) => write!(f, "pattern {s:#x}"),
        }
    }
}

fn on(stream: &Option<StreamSel>) -> String {
    match stream {
        Some(s) => format!("on {s}"),
        None => "synchronous".into(),
    }
}

impl Op {
    fn fmt_indented(&self, f: &mut fmt::Formatter<'_>, indent: usize) -> fmt::Result {
        let pad = " ".repeat(indent);
        write!(f, "{pad}")?;
        match self {
            Op::Alloc {
                slot,
                kind,
                dev,
                len,
                init,
                stream,
            } => {
                write!(f, "s{slot} = {kind}")?;
                if kind.is_device() {
                    write!(f, "@{dev}")?;
                }
                write!(f, "[{len}] {init}")?;
                if *kind == Kind::DevicePool {
                    write!(f, " on {stream}")?;
                }
                Ok(())
            }
            Op::Free { slot, explicit } => {
                write!(f, "{} s{slot}", if *explicit { "free" } else { "drop" })
            }
            Op::HostRead { slot, range, how } => write!(f, "host read s{slot}{range} {how:?}"),
            Op::HostWrite {
                slot,
                range,
                how,
                seed,
            } => write!(f, "host write s{slot}{range} {how:?} pattern {seed:#x}"),
            Op::CopyAsync {
                dst,
                src,
                dst_off,
                src_off,
                len,
                stream,
                via,
            } => write!(
                f,
                "copy_async s{dst}[{dst_off}..] <- s{src}[{src_off}..] {len} elements on {stream} ({via:?})"
            ),
            Op::CopySync {
                dst,
                src,
                dst_off,
                src_off,
                len,
                via,
            } => write!(
                f,
                "copy s{dst}[{dst_off}..] <- s{src}[{src_off}..] {len} elements ({via:?})"
            ),
            Op::CopyWithin {
                slot,
                mid,
                up,
                stream,
            } => write!(
                f,
                "split s{slot} at {mid}, copy_async {} on {stream}",
                if *up { "low half -> high" } else { "high half -> low" }
            ),
            Op::Memset {
                slot,
                range,
                byte,
                stream,
            } => write!(f, "memset s{slot}{range} {byte:#04x} {}", on(stream)),
            Op::KernelWrite {
                slot,
                range,
                stream,
                forget,
            } => write!(
                f,
                "kernel write s{slot}{range} on {stream}{}",
                if *forget { ", guard forgotten" } else { "" }
            ),
            Op::SplitWrite { slot, mid, s1, s2 } => write!(
                f,
                "split s{slot} at {mid}, kernel write low half on {s1}, high half on {s2}"
            ),
            Op::Xor {
                slot,
                range,
                stream,
            } => write!(f, "xor_checksum s{slot}{range} on {stream}"),
            Op::GuardCopy {
                dst,
                src,
                len,
                stream,
                forget,
            } => write!(
                f,
                "guard copy s{dst}[..{len}] <- s{src} on {stream}{}",
                if *forget { ", guards forgotten" } else { "" }
            ),
            Op::Spin { stream, dev, us } => write!(f, "spin {us} us on {stream}@{dev}"),
            Op::Sync { stream, dev } => write!(f, "synchronize {stream}@{dev}"),
            Op::Atomic { slot, index, value } => match value {
                Some(v) => write!(f, "atomic s{slot}[{index}].store({v:#x})"),
                None => write!(f, "atomic s{slot}[{index}].load()"),
            },
            Op::FailRecords { n } => write!(f, "fail_next_fence_records({n})"),
            Op::Scope {
                slot,
                range,
                stream,
                to_buf,
                seed,
            } => {
                if *to_buf {
                    write!(
                        f,
                        "scope: copy_async s{slot}{range} <- borrowed Vec (pattern {seed:#x}) on {stream}"
                    )
                } else {
                    write!(
                        f,
                        "scope: copy_async borrowed Vec <- s{slot}{range} on {stream}"
                    )
                }
            }
            Op::Peer {
                dst,
                src,
                len,
                stream,
            } => write!(f, "copy_peer s{dst}[..{len}] <- s{src} {}", on(stream)),
            Op::Prefetch {
                slot,
                to_host,
                stream,
            } => write!(
                f,
                "prefetch s{slot} to {} on {stream}",
                if *to_host { "host" } else { "device 0" }
            ),
            Op::OverAligned {
                kind,
                align4096,
                len,
                pad,
            } => write!(
                f,
                "over-aligned {kind:?} align({}) x{len} after a {pad}-byte allocation",
                if *align4096 { 4096 } else { 512 }
            ),
            Op::HoldRead {
                slot,
                stream,
                body,
                into,
                forget,
            } => {
                writeln!(f, "hold read guard of s{slot} on {stream} {{")?;
                for op in body {
                    op.fmt_indented(f, indent + 2)?;
                }
                write!(f, "{pad}}} then ")?;
                match into {
                    Some(d) => write!(f, "guard copy s{d} <- s{slot}")?,
                    None => write!(f, "no launch")?,
                }
                write!(f, ", guard {}", if *forget { "forgotten" } else { "dropped" })
            }
        }?;
        writeln!(f)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_indented(f, 0)
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "program seed {:#x}: {} threads, {} device(s), {} slots, {} operations",
            self.seed,
            self.threads,
            self.devices,
            self.slots,
            self.count()
        )?;
        for (i, p) in self.phases.iter().enumerate() {
            let owners: Vec<String> = p
                .owners
                .iter()
                .enumerate()
                .map(|(s, o)| match o {
                    Owner::Thread(t) => format!("s{s}:t{t}"),
                    Owner::Shared => format!("s{s}:shared"),
                })
                .collect();
            writeln!(f, "phase {i} (owners {})", owners.join(" "))?;
            for (t, ops) in p.threads.iter().enumerate() {
                if ops.is_empty() {
                    continue;
                }
                writeln!(f, "  thread {t}:")?;
                for op in ops {
                    op.fmt_indented(f, 4)?;
                }
            }
        }
        Ok(())
    }
}
