//! The program generator: random operations over every memory kind and stream kind, mixed with
//! *motifs*, short operation sequences that compose a known-dangerous pattern (pending work
//! held behind a slow kernel, then the access that must wait for it) so that each of issue
//! 19's holes has a fair chance in every program.
//!
//! The generator tracks only the shape of each slot (kind, device, length); the contents are
//! the executor's model. Ownership is decided per phase before the threads' operations:
//! a thread's operations name only slots it owns, or shared slots for reading.

use crate::program::{
    Init, Kind, Op, OverKind, Owner, Phase, Program, Range, ReadHow, SlotId, StreamSel, Via,
    WriteHow,
};
use crate::rng::Rng;

/// The most threads a program runs (and the executor has stream sets for).
pub const MAX_THREADS: usize = 8;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenConfig {
    /// Operations per program (at least; nested ones count).
    pub ops: usize,
    /// Threads per program, at most (1 to [`MAX_THREADS`]).
    pub max_threads: usize,
    /// Devices the program may use (1, or 2 for device-1 buffers and peer copies).
    pub devices: usize,
}

/// What the generator knows of a live slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    kind: Kind,
    dev: u8,
    len: u32,
}

/// Whether one operation may use both buffers: device memory of two devices only meets in peer
/// copies, and managed memory (device 0's) not with device 1's streams.
fn compatible(a: Shape, b: Shape) -> bool {
    if a.kind.is_device() && b.kind.is_device() && a.dev != b.dev {
        return false;
    }
    let on1 = |s: Shape| s.kind.is_device() && s.dev == 1;
    !((a.kind == Kind::Managed && on1(b)) || (b.kind == Kind::Managed && on1(a)))
}

/// Whether work through guards (device addresses) may use both buffers: as [`compatible`],
/// and host memory only with device 0 (its device address on device 1 is not promised).
fn guard_compatible(a: Shape, b: Shape) -> bool {
    let on1 = |s: Shape| s.kind.is_device() && s.dev == 1;
    compatible(a, b) && !((on1(a) && b.kind.is_host()) || (on1(b) && a.kind.is_host()))
}

/// The program of `seed`: the same for the same seed and configuration.
pub fn generate(seed: u64, cfg: &GenConfig) -> Program {
    let mut rng = Rng::new(seed);
    let max = cfg.max_threads.clamp(1, MAX_THREADS);
    let threads = if max == 1 || rng.chance(15) {
        1
    } else {
        rng.range(2, max as u64) as usize
    };
    let slots = (threads * 3 + 5).min(40);
    let devices = cfg.devices.clamp(1, 2);
    let per_phase = rng.range(20, 60) as usize;
    let nphases = (cfg.ops / per_phase).clamp(1, 16);
    let mut shapes: Vec<Option<Shape>> = vec![None; slots];
    let mut handoffs: Vec<(SlotId, usize)> = Vec::new();
    let mut phases = Vec::with_capacity(nphases);
    let mut total = 0;
    for p in 0..nphases {
        let owners = assign(&mut rng, threads, &shapes, &handoffs);
        let left = cfg.ops.saturating_sub(total);
        let budget = left.div_ceil(nphases - p).max(1);
        let weights: Vec<usize> = (0..threads).map(|_| rng.range(1, 4) as usize).collect();
        let wsum: usize = weights.iter().sum();
        let mut next_handoffs = Vec::new();
        let mut lists = Vec::with_capacity(threads);
        for (t, w) in weights.iter().enumerate() {
            let owned: Vec<SlotId> = (0..slots)
                .filter(|&s| owners[s] == Owner::Thread(t as u8))
                .map(|s| s as SlotId)
                .collect();
            let shared: Vec<SlotId> = (0..slots)
                .filter(|&s| owners[s] == Owner::Shared && shapes[s].is_some())
                .map(|s| s as SlotId)
                .collect();
            let mut g = TGen {
                rng: &mut rng,
                shapes: &mut shapes,
                owned,
                shared,
                ops: Vec::new(),
                count: 0,
                devices,
            };
            for &(x, _) in &handoffs {
                if g.owned.contains(&x) || g.shared.contains(&x) {
                    let _ = g.handoff_read(x);
                }
            }
            let mine = (budget * w).div_ceil(wsum).max(1);
            while g.count < mine {
                g.step();
            }
            if p + 1 < nphases && g.rng.chance(40) {
                if let Some(x) = g.handoff_write() {
                    next_handoffs.push((x, t));
                }
            }
            total += g.count;
            lists.push(g.ops);
        }
        handoffs = next_handoffs;
        phases.push(Phase {
            owners,
            threads: lists,
        });
    }
    Program {
        seed,
        threads,
        devices,
        slots,
        phases,
    }
}

/// Who owns which slot in the next phase: every thread at least three slots, some live slots
/// shared read-only, and each slot written at the end of the last phase for a hand-off owned
/// by another thread (or shared), so that it is read on another thread's streams.
fn assign(
    rng: &mut Rng,
    threads: usize,
    shapes: &[Option<Shape>],
    handoffs: &[(SlotId, usize)],
) -> Vec<Owner> {
    let n = shapes.len();
    let mut order: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut order);
    let mut owners = vec![Owner::Thread(0); n];
    for (k, &i) in order.iter().enumerate() {
        owners[i] = if k < threads * 3 {
            Owner::Thread((k % threads) as u8)
        } else if shapes[i].is_some() && rng.chance(15) {
            Owner::Shared
        } else {
            Owner::Thread(rng.below(threads as u64) as u8)
        };
    }
    for &(x, from) in handoffs {
        if shapes[x as usize].is_none() {
            continue;
        }
        owners[x as usize] = if rng.chance(25) {
            Owner::Shared
        } else if threads > 1 {
            let other = (from + 1 + rng.below(threads as u64 - 1) as usize) % threads;
            Owner::Thread(other as u8)
        } else {
            Owner::Thread(0)
        };
    }
    owners
}

/// The primitive operations, for the weighted choice.
#[derive(Debug, Clone, Copy)]
enum Prim {
    Alloc,
    Free,
    HostRead,
    HostWrite,
    CopyAsync,
    CopySync,
    CopyWithin,
    Memset,
    KernelWrite,
    SplitWrite,
    Xor,
    GuardCopy,
    Spin,
    Sync,
    Atomic,
    FailRecords,
    Scope,
    Peer,
    Prefetch,
    OverAligned,
    HoldRead,
}

/// The motifs (see the module docs and the report in `main.rs`).
#[derive(Debug, Clone, Copy)]
enum Motif {
    AtomicAfterDma,
    FallbackGuard,
    PoolReuseRead,
    PoolReuseWrite,
    Forget,
    SyncAfterAsync,
    ScopeBehindSpin,
}

/// One thread's operations in one phase.
struct TGen<'a> {
    rng: &'a mut Rng,
    shapes: &'a mut Vec<Option<Shape>>,
    /// Slots this thread owns (live or not).
    owned: Vec<SlotId>,
    /// Live slots it may only read.
    shared: Vec<SlotId>,
    ops: Vec<Op>,
    count: usize,
    devices: usize,
}

impl TGen<'_> {
    fn emit(&mut self, op: Op) {
        match &op {
            Op::Alloc {
                slot,
                kind,
                dev,
                len,
                ..
            } => {
                self.shapes[*slot as usize] = Some(Shape {
                    kind: *kind,
                    dev: *dev,
                    len: *len,
                })
            }
            Op::Free { slot, .. } => self.shapes[*slot as usize] = None,
            _ => {}
        }
        self.count += 1;
        self.ops.push(op);
    }

    fn shape(&self, s: SlotId) -> Shape {
        self.shapes[s as usize].expect("a live slot")
    }

    fn owned_live(&self, pred: impl Fn(Shape) -> bool) -> Vec<SlotId> {
        self.owned
            .iter()
            .copied()
            .filter(|&s| self.shapes[s as usize].is_some_and(&pred))
            .collect()
    }

    fn readable(&self, pred: impl Fn(Shape) -> bool) -> Vec<SlotId> {
        let mut v = self.owned_live(&pred);
        v.extend(
            self.shared
                .iter()
                .copied()
                .filter(|&s| self.shapes[s as usize].is_some_and(&pred)),
        );
        v
    }

    fn pick(&mut self, v: &[SlotId]) -> Option<SlotId> {
        (!v.is_empty()).then(|| self.rng.pick(v))
    }

    fn pick_owned(&mut self, pred: impl Fn(Shape) -> bool) -> Option<SlotId> {
        let v = self.owned_live(pred);
        self.pick(&v)
    }

    fn pick_readable(&mut self, pred: impl Fn(Shape) -> bool) -> Option<SlotId> {
        let v = self.readable(pred);
        self.pick(&v)
    }

    /// The device of an operation on these slots: device 1 if one is device memory there.
    fn dev(&self, slots: &[SlotId]) -> u8 {
        let on1 = slots
            .iter()
            .any(|&s| self.shapes[s as usize].is_some_and(|sh| sh.kind.is_device() && sh.dev == 1));
        u8::from(on1)
    }

    fn stream(&mut self) -> StreamSel {
        let i = self.rng.below(2) as u8;
        self.rng.weighted(&[
            (12, StreamSel::Legacy),
            (18, StreamSel::Blocking(i)),
            (28, StreamSel::NonBlocking(i)),
            (10, StreamSel::Cudarc),
            (24, StreamSel::PerThread),
            (8, StreamSel::Shared),
        ])
    }

    fn kind(&mut self) -> Kind {
        self.rng.weighted(&[
            (8, Kind::Device),
            (16, Kind::DevicePool),
            (8, Kind::Pinned),
            (16, Kind::PinnedGlobalPool),
            (10, Kind::PinnedPrivatePool),
            (14, Kind::Mapped),
            (10, Kind::Managed),
            (10, Kind::Registered),
        ])
    }

    /// Elements of a new buffer, a multiple of four: mostly 4 KiB to 1 MiB, some smaller,
    /// a few up to 4 MiB, rarely up to 64 MiB.
    fn len(&mut self) -> u32 {
        let r = self.rng.below(1000);
        let n = if r < 50 {
            self.rng.range(4, 1024)
        } else if r < 600 {
            self.rng.range(1024, 16 << 10)
        } else if r < 900 {
            self.rng.range(16 << 10, 256 << 10)
        } else if r < 995 {
            self.rng.range(256 << 10, 1 << 20)
        } else {
            self.rng.range(4 << 20, 16 << 20)
        };
        ((n as u32) & !3).max(4)
    }

    fn range(&mut self, len: u32) -> Range {
        if self.rng.chance(35) {
            return Range { off: 0, len };
        }
        let cap = if self.rng.chance(50) {
            len.min(64)
        } else {
            len
        };
        let n = self.rng.range(1, u64::from(cap)) as u32;
        let off = self.rng.below(u64::from(len - n + 1)) as u32;
        Range { off, len: n }
    }

    /// A range of whole 16-byte words.
    fn aligned_range(&mut self, len: u32) -> Range {
        let words = len / 4;
        if words <= 1 || self.rng.chance(40) {
            return Range { off: 0, len };
        }
        let n = self.rng.range(1, u64::from(words)) as u32;
        let off = self.rng.below(u64::from(words - n + 1)) as u32;
        Range {
            off: off * 4,
            len: n * 4,
        }
    }

    fn count_of(&mut self, max: u32) -> u32 {
        if self.rng.chance(50) {
            max
        } else {
            self.rng.range(1, u64::from(max)) as u32
        }
    }

    fn spin_us(&mut self) -> u32 {
        self.rng.range(50, 500) as u32
    }

    fn init(&mut self) -> Init {
        match self.rng.below(3) {
            0 => Init::Zero,
            1 => Init::Byte(self.rng.next_u32() as u8),
            _ => Init::Pattern(self.rng.next_u32()),
        }
    }

    /// Allocates `kind` into `slot` (`len` elements, or a random length; on `dev` for device
    /// memory, or a random device).
    fn alloc(&mut self, slot: SlotId, kind: Kind, len: Option<u32>, dev: Option<u8>) {
        let dev = match dev {
            Some(d) => d,
            None => u8::from(kind.is_device() && self.devices > 1 && self.rng.chance(30)),
        };
        let len = len.unwrap_or_else(|| self.len());
        let init = self.init();
        let stream = self.stream();
        self.emit(Op::Alloc {
            slot,
            kind,
            dev: if kind.is_device() { dev } else { 0 },
            len,
            init,
            stream,
        });
    }

    /// An owned slot for a new buffer, not in `exclude`: an empty one if there is one.
    fn free_slot(&mut self, exclude: &[SlotId]) -> Option<SlotId> {
        let cands: Vec<SlotId> = self
            .owned
            .iter()
            .copied()
            .filter(|s| !exclude.contains(s))
            .collect();
        let empty: Vec<SlotId> = cands
            .iter()
            .copied()
            .filter(|&s| self.shapes[s as usize].is_none())
            .collect();
        if !empty.is_empty() && self.rng.chance(80) {
            return self.pick(&empty);
        }
        self.pick(&cands)
    }

    /// One of the slots `v` that is not in `exclude`, picked at random.
    fn pick_excluding(&mut self, v: Vec<SlotId>, exclude: &[SlotId]) -> Option<SlotId> {
        let v: Vec<SlotId> = v.into_iter().filter(|s| !exclude.contains(s)).collect();
        self.pick(&v)
    }

    /// An owned live slot matching `pred`, not in `exclude`; else a new `make` buffer (device
    /// memory on `dev`) in an owned slot.
    fn ensure_owned(
        &mut self,
        pred: impl Fn(Shape) -> bool,
        make: Kind,
        dev: u8,
        exclude: &[SlotId],
    ) -> Option<SlotId> {
        let v = self.owned_live(&pred);
        if let Some(s) = self.pick_excluding(v, exclude) {
            return Some(s);
        }
        let s = self.free_slot(exclude)?;
        self.alloc(s, make, None, Some(dev));
        Some(s)
    }

    /// A readable live slot matching `pred`, not in `exclude`; else as [`Self::ensure_owned`].
    fn ensure_readable(
        &mut self,
        pred: impl Fn(Shape) -> bool,
        make: Kind,
        dev: u8,
        exclude: &[SlotId],
    ) -> Option<SlotId> {
        let v = self.readable(&pred);
        if let Some(s) = self.pick_excluding(v, exclude) {
            return Some(s);
        }
        self.ensure_owned(pred, make, dev, exclude)
    }

    fn step(&mut self) {
        if self.rng.chance(9) && self.motif().is_some() {
            return;
        }
        let peer = if self.devices > 1 { 3 } else { 0 };
        let choice = self.rng.weighted(&[
            (8, Prim::Alloc),
            (4, Prim::Free),
            (10, Prim::HostRead),
            (8, Prim::HostWrite),
            (18, Prim::CopyAsync),
            (6, Prim::CopySync),
            (3, Prim::CopyWithin),
            (5, Prim::Memset),
            (8, Prim::KernelWrite),
            (2, Prim::SplitWrite),
            (3, Prim::Xor),
            (5, Prim::GuardCopy),
            (10, Prim::Spin),
            (1, Prim::Sync),
            (3, Prim::Atomic),
            (3, Prim::FailRecords),
            (4, Prim::Scope),
            (peer, Prim::Peer),
            (1, Prim::Prefetch),
            (1, Prim::OverAligned),
            (3, Prim::HoldRead),
        ]);
        let done = match choice {
            Prim::Alloc => self.g_alloc(),
            Prim::Free => self.g_free(),
            Prim::HostRead => self.g_host_read(None),
            Prim::HostWrite => self.g_host_write(),
            Prim::CopyAsync => self.g_copy(true, None),
            Prim::CopySync => self.g_copy(false, None),
            Prim::CopyWithin => self.g_copy_within(),
            Prim::Memset => self.g_memset(),
            Prim::KernelWrite => self.g_kernel_write(),
            Prim::SplitWrite => self.g_split_write(),
            Prim::Xor => self.g_xor(None),
            Prim::GuardCopy => self.g_guard_copy(),
            Prim::Spin => self.g_spin(),
            Prim::Sync => self.g_sync(),
            Prim::Atomic => self.g_atomic(),
            Prim::FailRecords => self.g_fail_records(),
            Prim::Scope => self.g_scope(),
            Prim::Peer => self.g_peer(),
            Prim::Prefetch => self.g_prefetch(),
            Prim::OverAligned => self.g_over_aligned(),
            Prim::HoldRead => self.g_hold_read(),
        };
        if done.is_none() {
            // Nothing fit (no live slot of the kind): allocate instead, or hold a stream.
            if self.g_alloc().is_none() {
                let _ = self.g_spin();
            }
        }
    }

    /// A new buffer; in place of a live one, often of the same kind and size (the allocator
    /// likely hands back the memory just dropped).
    fn g_alloc(&mut self) -> Option<()> {
        let s = self.free_slot(&[])?;
        match self.shapes[s as usize] {
            Some(old) if self.rng.chance(50) => {
                self.alloc(s, old.kind, Some(old.len), Some(old.dev))
            }
            _ => {
                let kind = self.kind();
                self.alloc(s, kind, None, None);
            }
        }
        Some(())
    }

    fn g_free(&mut self) -> Option<()> {
        let slot = self.pick_owned(|_| true)?;
        let explicit = self.rng.chance(40);
        self.emit(Op::Free { slot, explicit });
        Some(())
    }

    fn read_how(&mut self) -> ReadHow {
        self.rng.weighted(&[
            (4, ReadHow::AsSlice),
            (2, ReadHow::ToVec),
            (3, ReadHow::CopyToVec),
            (2, ReadHow::Staged),
        ])
    }

    fn g_host_read(&mut self, slot: Option<SlotId>) -> Option<()> {
        let slot = match slot {
            Some(s) => s,
            None => self.pick_readable(|_| true)?,
        };
        let range = self.range(self.shape(slot).len);
        let how = self.read_how();
        self.emit(Op::HostRead { slot, range, how });
        Some(())
    }

    fn g_host_write(&mut self) -> Option<()> {
        let slot = self.pick_owned(|_| true)?;
        let range = self.range(self.shape(slot).len);
        let how = self.rng.weighted(&[
            (4, WriteHow::AsMutSlice),
            (3, WriteHow::CopyFromVec),
            (2, WriteHow::Staged),
        ]);
        let seed = self.rng.next_u32();
        self.emit(Op::HostWrite {
            slot,
            range,
            how,
            seed,
        });
        Some(())
    }

    fn via(&mut self) -> Via {
        self.rng
            .weighted(&[(5, Via::Range), (4, Via::Views), (2, Via::Whole)])
    }

    /// A copy into an owned slot from a readable one (`src` if given).
    fn g_copy(&mut self, asynchronous: bool, src: Option<SlotId>) -> Option<()> {
        let src = match src {
            Some(s) => s,
            None => self.pick_readable(|_| true)?,
        };
        let ss = self.shape(src);
        let dst = {
            let v: Vec<SlotId> = self
                .owned_live(|d| compatible(d, ss))
                .into_iter()
                .filter(|&d| d != src)
                .collect();
            self.pick(&v)?
        };
        let ds = self.shape(dst);
        let n = self.count_of(ds.len.min(ss.len));
        let dst_off = self.rng.below(u64::from(ds.len - n + 1)) as u32;
        let src_off = self.rng.below(u64::from(ss.len - n + 1)) as u32;
        let via = self.via();
        let op = if asynchronous {
            let stream = self.stream();
            Op::CopyAsync {
                dst,
                src,
                dst_off,
                src_off,
                len: n,
                stream,
                via,
            }
        } else {
            Op::CopySync {
                dst,
                src,
                dst_off,
                src_off,
                len: n,
                via,
            }
        };
        self.emit(op);
        Some(())
    }

    fn g_copy_within(&mut self) -> Option<()> {
        let slot = self.pick_owned(|s| s.len >= 8)?;
        let mid = self.rng.next_u32();
        let up = self.rng.chance(50);
        let stream = self.stream();
        self.emit(Op::CopyWithin {
            slot,
            mid,
            up,
            stream,
        });
        Some(())
    }

    fn g_memset(&mut self) -> Option<()> {
        let slot = self.pick_owned(|s| s.kind.memsets())?;
        let sh = self.shape(slot);
        let byte = self.rng.next_u32() as u8;
        let (range, stream) = if sh.kind.is_device() && self.rng.chance(25) {
            (
                Range {
                    off: 0,
                    len: sh.len,
                },
                None,
            )
        } else {
            (self.range(sh.len), Some(self.stream()))
        };
        self.emit(Op::Memset {
            slot,
            range,
            byte,
            stream,
        });
        Some(())
    }

    fn g_kernel_write(&mut self) -> Option<()> {
        let slot = self.pick_owned(|_| true)?;
        let range = self.aligned_range(self.shape(slot).len);
        let stream = self.stream();
        let forget = self.rng.chance(20);
        self.emit(Op::KernelWrite {
            slot,
            range,
            stream,
            forget,
        });
        Some(())
    }

    fn g_split_write(&mut self) -> Option<()> {
        let slot = self.pick_owned(|s| s.len >= 8)?;
        let mid = self.rng.next_u32();
        let (s1, s2) = (self.stream(), self.stream());
        self.emit(Op::SplitWrite { slot, mid, s1, s2 });
        Some(())
    }

    fn g_xor(&mut self, slot: Option<SlotId>) -> Option<()> {
        let slot = match slot {
            Some(s) => s,
            None => self.pick_readable(|_| true)?,
        };
        let range = self.range(self.shape(slot).len);
        let stream = self.stream();
        self.emit(Op::Xor {
            slot,
            range,
            stream,
        });
        Some(())
    }

    fn g_guard_copy(&mut self) -> Option<()> {
        let dst = self.pick_owned(|_| true)?;
        let ds = self.shape(dst);
        let v: Vec<SlotId> = self
            .readable(|s| guard_compatible(s, ds))
            .into_iter()
            .filter(|&s| s != dst)
            .collect();
        let src = self.pick(&v)?;
        let len = self.count_of(ds.len.min(self.shape(src).len));
        let stream = self.stream();
        let forget = self.rng.chance(25);
        self.emit(Op::GuardCopy {
            dst,
            src,
            len,
            stream,
            forget,
        });
        Some(())
    }

    fn g_spin(&mut self) -> Option<()> {
        let stream = self.stream();
        let dev = u8::from(self.devices > 1 && self.rng.chance(30));
        let us = self.spin_us();
        self.emit(Op::Spin { stream, dev, us });
        Some(())
    }

    fn g_sync(&mut self) -> Option<()> {
        let stream = self.stream();
        let dev = u8::from(self.devices > 1 && self.rng.chance(30));
        self.emit(Op::Sync { stream, dev });
        Some(())
    }

    /// A host atomic load (stores come only in the motif, after a write: a store may race
    /// with GPU reads of the buffer still pending, by design, since `atomic` does not wait
    /// for reads; a write queued on the buffer is ordered after them, and the store after it).
    fn g_atomic(&mut self) -> Option<()> {
        let slot = self.pick_owned(|s| s.kind == Kind::Mapped)?;
        let len = self.shape(slot).len;
        let index = if self.rng.chance(50) {
            len - 1
        } else {
            self.rng.below(u64::from(len)) as u32
        };
        self.emit(Op::Atomic {
            slot,
            index,
            value: None,
        });
        Some(())
    }

    fn g_fail_records(&mut self) -> Option<()> {
        let n = if self.rng.chance(20) {
            0
        } else {
            self.rng.range(1, 3) as u8
        };
        self.emit(Op::FailRecords { n });
        Some(())
    }

    fn g_scope(&mut self) -> Option<()> {
        let to_buf = self.rng.chance(50);
        let slot = if to_buf {
            self.pick_owned(|_| true)?
        } else {
            self.pick_readable(|_| true)?
        };
        let range = self.range(self.shape(slot).len);
        let stream = self.stream();
        let seed = self.rng.next_u32();
        self.emit(Op::Scope {
            slot,
            range,
            stream,
            to_buf,
            seed,
        });
        Some(())
    }

    fn g_peer(&mut self) -> Option<()> {
        let dst = self.pick_owned(|s| s.kind.is_device())?;
        let ds = self.shape(dst);
        let src = self.pick_readable(|s| s.kind.is_device() && s.dev != ds.dev)?;
        let len = self.count_of(ds.len.min(self.shape(src).len));
        let stream = self.rng.chance(70).then(|| self.stream());
        self.emit(Op::Peer {
            dst,
            src,
            len,
            stream,
        });
        Some(())
    }

    fn g_prefetch(&mut self) -> Option<()> {
        let slot = self.pick_owned(|s| s.kind == Kind::Managed)?;
        let to_host = self.rng.chance(50);
        let stream = self.stream();
        self.emit(Op::Prefetch {
            slot,
            to_host,
            stream,
        });
        Some(())
    }

    fn g_over_aligned(&mut self) -> Option<()> {
        let kind = self.rng.pick(&[
            OverKind::Pinned,
            OverKind::PinnedGlobalPool,
            OverKind::PinnedPrivatePool,
            OverKind::Mapped,
            OverKind::Managed,
            OverKind::Registered,
        ]);
        let align4096 = self.rng.chance(40);
        let len = if align4096 {
            self.rng.range(1, 4)
        } else {
            self.rng.range(1, 16)
        } as u32;
        let pad = match self.rng.below(3) {
            0 => 0,
            1 => self.rng.range(1, 600) as u32,
            _ => self.rng.range(1, 8192) as u32,
        };
        self.emit(Op::OverAligned {
            kind,
            align4096,
            len,
            pad,
        });
        Some(())
    }

    /// Holds a read guard of `slot` on `stream` while `body` generates (the slot read-only
    /// there), then a launch into `into`.
    fn hold(
        &mut self,
        slot: SlotId,
        stream: StreamSel,
        into: Option<SlotId>,
        forget: bool,
        body: impl FnOnce(&mut Self),
    ) {
        let outer = std::mem::take(&mut self.ops);
        let pos = self.owned.iter().position(|&s| s == slot);
        if let Some(p) = pos {
            self.owned.remove(p);
        }
        self.shared.push(slot);
        body(self);
        self.shared.pop();
        if let Some(p) = pos {
            self.owned.insert(p, slot);
        }
        let body = std::mem::replace(&mut self.ops, outer);
        self.count += 1;
        self.ops.push(Op::HoldRead {
            slot,
            stream,
            body,
            into,
            forget,
        });
    }

    fn g_hold_read(&mut self) -> Option<()> {
        let slot = self.pick_owned(|_| true)?;
        let sh = self.shape(slot);
        let stream = self.stream();
        let into = if self.rng.chance(70) {
            let v: Vec<SlotId> = self
                .owned_live(|d| guard_compatible(d, sh))
                .into_iter()
                .filter(|&d| d != slot)
                .collect();
            self.pick(&v)
        } else {
            None
        };
        let forget = self.rng.chance(25);
        let n = self.rng.range(1, 4);
        self.hold(slot, stream, into, forget, |g| {
            for _ in 0..n {
                let _ = match g.rng.below(7) {
                    0 | 1 => g.g_host_read(Some(slot)),
                    2 => g.g_copy(true, Some(slot)),
                    3 => g.g_xor(Some(slot)),
                    4 => g.g_spin(),
                    5 => g.g_fail_records(),
                    _ => g.g_copy(false, Some(slot)),
                };
            }
        });
        Some(())
    }

    fn motif(&mut self) -> Option<()> {
        match self.rng.weighted(&[
            (3, Motif::AtomicAfterDma),
            (3, Motif::FallbackGuard),
            (2, Motif::PoolReuseRead),
            (2, Motif::PoolReuseWrite),
            (2, Motif::Forget),
            (2, Motif::SyncAfterAsync),
            (1, Motif::ScopeBehindSpin),
        ]) {
            Motif::AtomicAfterDma => self.m_atomic_after_dma(),
            Motif::FallbackGuard => self.m_fallback_guard(),
            Motif::PoolReuseRead => self.m_pool_reuse(false),
            Motif::PoolReuseWrite => self.m_pool_reuse(true),
            Motif::Forget => self.m_forget(),
            Motif::SyncAfterAsync => self.m_sync_after_async(),
            Motif::ScopeBehindSpin => self.m_scope_behind_spin(),
        }
    }

    /// Issue 19 item 1: DMA (or a kernel) into a mapped buffer held pending behind a spin,
    /// then a host atomic store to an element it covers: the store must land after the DMA,
    /// and the host must read it back. (The write is ordered after every earlier GPU read of
    /// the buffer, so once `atomic` has waited for it no read is left to see the store early.)
    fn m_atomic_after_dma(&mut self) -> Option<()> {
        let m = self.ensure_owned(|s| s.kind == Kind::Mapped, Kind::Mapped, 0, &[])?;
        let ml = self.shape(m).len;
        let src = self.ensure_readable(|_| true, Kind::DevicePool, 0, &[m])?;
        let n = ml.min(self.shape(src).len);
        let stream = self.stream();
        let by_copy = self.rng.chance(70);
        // The spin holds the stream (on the device) that the write is queued on.
        let dev = if by_copy { self.dev(&[m, src]) } else { 0 };
        let us = self.rng.range(100, 500) as u32;
        self.emit(Op::Spin { stream, dev, us });
        let covered = if by_copy {
            let via = self.via();
            self.emit(Op::CopyAsync {
                dst: m,
                src,
                dst_off: 0,
                src_off: 0,
                len: n,
                stream,
                via,
            });
            n
        } else {
            let forget = self.rng.chance(30);
            self.emit(Op::KernelWrite {
                slot: m,
                range: Range { off: 0, len: ml },
                stream,
                forget,
            });
            ml
        };
        let index = if self.rng.chance(70) {
            covered - 1
        } else {
            self.rng.below(u64::from(covered)) as u32
        };
        let value = self.rng.next_u32();
        self.emit(Op::Atomic {
            slot: m,
            index,
            value: Some(value),
        });
        if self.rng.chance(40) {
            self.emit(Op::Atomic {
                slot: m,
                index,
                value: None,
            });
        }
        self.emit(Op::HostRead {
            slot: m,
            range: Range { off: index, len: 1 },
            how: ReadHow::AsSlice,
        });
        Some(())
    }

    /// Issue 19 item 6: a pinned-pool buffer with a pending write on stream S; a read guard on
    /// S in flight while fence records are forced to fail and the host reads the buffer (the
    /// fallback synchronizes S); a launch through the guard behind another spin; then the
    /// buffer is dropped and its size allocated again (likely the same block) and overwritten:
    /// the launched copy must still read the old contents.
    fn m_fallback_guard(&mut self) -> Option<()> {
        let pk = self
            .rng
            .pick(&[Kind::PinnedGlobalPool, Kind::PinnedPrivatePool]);
        let p = self.ensure_owned(|s| s.kind == pk, pk, 0, &[])?;
        let dev0 = |s: Shape| !(s.kind.is_device() && s.dev == 1);
        let d = self.ensure_owned(dev0, Kind::DevicePool, 0, &[p])?;
        let kind2 = self.kind();
        let d2 = self.ensure_owned(dev0, kind2, 0, &[p, d])?;
        let pl = self.shape(p).len;
        let n = pl.min(self.shape(d).len);
        let stream = self.stream();
        let us = self.rng.range(100, 500) as u32;
        self.emit(Op::Spin { stream, dev: 0, us });
        self.emit(Op::CopyAsync {
            dst: p,
            src: d,
            dst_off: 0,
            src_off: 0,
            len: n,
            stream,
            via: Via::Range,
        });
        let forget = self.rng.chance(30);
        let fails = self.rng.range(1, 3) as u8;
        let range = self.range(pl);
        let us2 = self.rng.range(100, 500) as u32;
        self.hold(p, stream, Some(d2), forget, |g| {
            g.emit(Op::FailRecords { n: fails });
            g.emit(Op::HostRead {
                slot: p,
                range,
                how: ReadHow::AsSlice,
            });
            g.emit(Op::Spin {
                stream,
                dev: 0,
                us: us2,
            });
        });
        let more = if self.rng.chance(50) {
            self.rng.range(1, 2) as u8
        } else {
            0
        };
        self.emit(Op::FailRecords { n: more });
        let explicit = self.rng.chance(30);
        self.emit(Op::Free { slot: p, explicit });
        let seed = self.rng.next_u32();
        let s2 = self.stream();
        self.emit(Op::Alloc {
            slot: p,
            kind: pk,
            dev: 0,
            len: pl,
            init: Init::Pattern(seed),
            stream: s2,
        });
        self.emit(Op::FailRecords { n: 0 });
        let n2 = pl.min(self.shape(d2).len);
        let how = self.read_how();
        self.emit(Op::HostRead {
            slot: d2,
            range: Range { off: 0, len: n2 },
            how,
        });
        Some(())
    }

    /// A pooled buffer read (`write`: written) by work held behind a spin, dropped, and its
    /// size allocated again from the same pool: the reader sees the old contents (the new
    /// buffer its own), whatever the pool hands out.
    fn m_pool_reuse(&mut self, write: bool) -> Option<()> {
        let pk = self.rng.weighted(&[
            (2, Kind::DevicePool),
            (2, Kind::PinnedGlobalPool),
            (1, Kind::PinnedPrivatePool),
        ]);
        let p = self.ensure_owned(|s| s.kind == pk, pk, 0, &[])?;
        let ps = self.shape(p);
        let x = {
            let v: Vec<SlotId> = self
                .owned_live(|d| compatible(d, ps))
                .into_iter()
                .filter(|&d| d != p)
                .collect();
            match self.pick(&v) {
                Some(x) => x,
                None => self.ensure_owned(|_| false, Kind::Pinned, 0, &[p])?,
            }
        };
        let n = ps.len.min(self.shape(x).len);
        let stream = self.stream();
        let dev = self.dev(&[p, x]);
        let us = self.rng.range(100, 500) as u32;
        self.emit(Op::Spin { stream, dev, us });
        let (dst, src) = if write { (p, x) } else { (x, p) };
        match self.rng.below(3) {
            0 if guard_compatible(ps, self.shape(x)) => {
                let forget = self.rng.chance(25);
                self.emit(Op::GuardCopy {
                    dst,
                    src,
                    len: n,
                    stream,
                    forget,
                })
            }
            _ => {
                let via = self.via();
                self.emit(Op::CopyAsync {
                    dst,
                    src,
                    dst_off: 0,
                    src_off: 0,
                    len: n,
                    stream,
                    via,
                })
            }
        }
        let explicit = self.rng.chance(30);
        self.emit(Op::Free { slot: p, explicit });
        let init = self.init();
        let s2 = self.stream();
        self.emit(Op::Alloc {
            slot: p,
            kind: pk,
            dev: ps.dev,
            len: ps.len,
            init,
            stream: s2,
        });
        if pk.is_host() && self.rng.chance(50) {
            let seed = self.rng.next_u32();
            self.emit(Op::HostWrite {
                slot: p,
                range: Range {
                    off: 0,
                    len: ps.len,
                },
                how: WriteHow::AsMutSlice,
                seed,
            });
        }
        let how = self.read_how();
        self.emit(Op::HostRead {
            slot: if write { p } else { x },
            range: Range { off: 0, len: n },
            how,
        });
        Some(())
    }

    /// Guards leaked with `mem::forget` after their launch: host access afterwards still waits
    /// for the launched work.
    fn m_forget(&mut self) -> Option<()> {
        let x = self.ensure_owned(|_| true, Kind::PinnedGlobalPool, 0, &[])?;
        let xs = self.shape(x);
        let dv = if xs.kind.is_device() { xs.dev } else { 0 };
        let stream = self.stream();
        let dev = self.dev(&[x]);
        let us = self.rng.range(100, 500) as u32;
        self.emit(Op::Spin { stream, dev, us });
        match self.rng.below(3) {
            0 => {
                self.emit(Op::KernelWrite {
                    slot: x,
                    range: Range {
                        off: 0,
                        len: xs.len,
                    },
                    stream,
                    forget: true,
                });
                if self.rng.chance(50) {
                    let seed = self.rng.next_u32();
                    let range = self.range(xs.len);
                    self.emit(Op::HostWrite {
                        slot: x,
                        range,
                        how: WriteHow::AsMutSlice,
                        seed,
                    });
                }
                self.g_host_read(Some(x))
            }
            1 => {
                let src =
                    self.ensure_readable(|s| guard_compatible(s, xs), Kind::DevicePool, dv, &[x])?;
                let len = xs.len.min(self.shape(src).len);
                self.emit(Op::GuardCopy {
                    dst: x,
                    src,
                    len,
                    stream,
                    forget: true,
                });
                self.g_host_read(Some(x))
            }
            _ => {
                let y =
                    self.ensure_owned(|s| guard_compatible(s, xs), Kind::DevicePool, dv, &[x])?;
                self.hold(x, stream, Some(y), true, |g| {
                    let _ = g.g_host_read(Some(x));
                });
                let seed = self.rng.next_u32();
                self.emit(Op::HostWrite {
                    slot: x,
                    range: Range {
                        off: 0,
                        len: xs.len,
                    },
                    how: WriteHow::AsMutSlice,
                    seed,
                });
                self.g_host_read(Some(y))
            }
        }
    }

    /// Asynchronous work held on a non-default stream, then synchronous work (which runs on
    /// the legacy default stream) on the same buffer, then an asynchronous read.
    fn m_sync_after_async(&mut self) -> Option<()> {
        let d = self.ensure_owned(|s| s.kind.is_device(), Kind::DevicePool, 0, &[])?;
        let ds = self.shape(d);
        let src = self.ensure_readable(|s| compatible(s, ds), Kind::PinnedGlobalPool, 0, &[d])?;
        let n = ds.len.min(self.shape(src).len);
        let i = self.rng.below(2) as u8;
        let stream = self.rng.pick(&[
            StreamSel::NonBlocking(i),
            StreamSel::PerThread,
            StreamSel::Cudarc,
            StreamSel::Shared,
        ]);
        let dev = ds.dev;
        let us = self.rng.range(100, 500) as u32;
        self.emit(Op::Spin { stream, dev, us });
        self.emit(Op::CopyAsync {
            dst: d,
            src,
            dst_off: 0,
            src_off: 0,
            len: n,
            stream,
            via: Via::Range,
        });
        match self.rng.below(3) {
            0 => {
                let byte = self.rng.next_u32() as u8;
                self.emit(Op::Memset {
                    slot: d,
                    range: Range {
                        off: 0,
                        len: ds.len,
                    },
                    byte,
                    stream: None,
                });
                let q = self.ensure_owned(|s| compatible(s, ds), Kind::Pinned, 0, &[d])?;
                let len = ds.len.min(self.shape(q).len);
                let s2 = self.stream();
                self.emit(Op::CopyAsync {
                    dst: q,
                    src: d,
                    dst_off: 0,
                    src_off: 0,
                    len,
                    stream: s2,
                    via: Via::Range,
                });
                self.g_host_read(Some(q))
            }
            1 => {
                let q =
                    self.ensure_owned(|s| compatible(s, ds), Kind::Device, ds.dev, &[d, src])?;
                let len = ds.len.min(self.shape(q).len);
                self.emit(Op::CopySync {
                    dst: q,
                    src: d,
                    dst_off: 0,
                    src_off: 0,
                    len,
                    via: Via::Range,
                });
                self.g_host_read(Some(q))
            }
            _ => self.g_host_read(Some(d)),
        }
    }

    /// A copy between a buffer and a `Vec` lent to a scope, behind a spin on its stream.
    fn m_scope_behind_spin(&mut self) -> Option<()> {
        let slot = self.ensure_owned(|_| true, Kind::DevicePool, 0, &[])?;
        let sh = self.shape(slot);
        let stream = self.stream();
        let us = self.rng.range(100, 500) as u32;
        self.emit(Op::Spin {
            stream,
            dev: sh.dev,
            us,
        });
        let range = self.range(sh.len);
        let seed = self.rng.next_u32();
        let to_buf = self.rng.chance(50);
        self.emit(Op::Scope {
            slot,
            range,
            stream,
            to_buf,
            seed,
        });
        self.g_host_read(Some(slot))
    }

    /// The last operations of a thread in a phase: a write queued on its per-thread default
    /// stream behind a spin, still pending when the phase ends. Returns the slot.
    fn handoff_write(&mut self) -> Option<SlotId> {
        let x = self.pick_owned(|_| true)?;
        let xs = self.shape(x);
        let stream = StreamSel::PerThread;
        let us = self.rng.range(200, 500) as u32;
        let src = {
            let v: Vec<SlotId> = self
                .readable(|s| compatible(s, xs))
                .into_iter()
                .filter(|&s| s != x)
                .collect();
            self.pick(&v)
        };
        let whole = Range {
            off: 0,
            len: xs.len,
        };
        match (self.rng.below(3), src) {
            (0, Some(src)) => {
                let dev = self.dev(&[x, src]);
                self.emit(Op::Spin { stream, dev, us });
                let len = xs.len.min(self.shape(src).len);
                self.emit(Op::CopyAsync {
                    dst: x,
                    src,
                    dst_off: 0,
                    src_off: 0,
                    len,
                    stream,
                    via: Via::Range,
                })
            }
            (1, _) if xs.kind.memsets() => {
                let dev = self.dev(&[x]);
                self.emit(Op::Spin { stream, dev, us });
                let byte = self.rng.next_u32() as u8;
                self.emit(Op::Memset {
                    slot: x,
                    range: whole,
                    byte,
                    stream: Some(stream),
                })
            }
            _ => {
                let dev = self.dev(&[x]);
                self.emit(Op::Spin { stream, dev, us });
                let forget = self.rng.chance(20);
                self.emit(Op::KernelWrite {
                    slot: x,
                    range: whole,
                    stream,
                    forget,
                })
            }
        }
        Some(x)
    }

    /// The first operations of a thread that now owns (or shares) a slot written at the end
    /// of the last phase by another thread's per-thread stream: read it, on this thread's.
    fn handoff_read(&mut self, x: SlotId) -> Option<()> {
        let xs = self.shape(x);
        let stream = StreamSel::PerThread;
        match self.rng.below(4) {
            0 => self.g_host_read(Some(x)),
            1 => {
                let range = Range {
                    off: 0,
                    len: xs.len,
                };
                self.emit(Op::Xor {
                    slot: x,
                    range,
                    stream,
                });
                Some(())
            }
            r => {
                let v: Vec<SlotId> = self
                    .owned_live(|d| compatible(d, xs))
                    .into_iter()
                    .filter(|&d| d != x)
                    .collect();
                let Some(z) = self.pick(&v) else {
                    return self.g_host_read(Some(x));
                };
                let len = xs.len.min(self.shape(z).len);
                if r == 2 || !guard_compatible(xs, self.shape(z)) {
                    self.emit(Op::CopyAsync {
                        dst: z,
                        src: x,
                        dst_off: 0,
                        src_off: 0,
                        len,
                        stream,
                        via: Via::Range,
                    });
                } else {
                    self.emit(Op::GuardCopy {
                        dst: z,
                        src: x,
                        len,
                        stream,
                        forget: false,
                    });
                }
                self.g_host_read(Some(z))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ops(p: &Program) -> Vec<(usize, usize, Op)> {
        fn walk(ops: &[Op], ph: usize, t: usize, out: &mut Vec<(usize, usize, Op)>) {
            for op in ops {
                out.push((ph, t, op.clone()));
                walk(op.body(), ph, t, out);
            }
        }
        let mut out = Vec::new();
        for (ph, phase) in p.phases.iter().enumerate() {
            for (t, ops) in phase.threads.iter().enumerate() {
                walk(ops, ph, t, &mut out);
            }
        }
        out
    }

    const CFG: GenConfig = GenConfig {
        ops: 200,
        max_threads: 8,
        devices: 2,
    };

    /// The same seed gives the same program; another seed another one.
    #[test]
    fn the_same_seed_gives_the_same_program() {
        for seed in [0u64, 1, 0xdead_beef, u64::MAX] {
            let a = generate(seed, &CFG);
            let b = generate(seed, &CFG);
            assert_eq!(a, b, "seed {seed:#x}");
            assert_eq!(a.to_string(), b.to_string());
            assert_ne!(a, generate(seed ^ 1, &CFG));
        }
    }

    /// Programs have at least the operations asked for, threads within the bound, and every
    /// operation of a thread names slots that thread owns, or shared slots it only reads.
    #[test]
    fn programs_meet_the_budget_and_respect_ownership() {
        for seed in 0..200u64 {
            let cfg = GenConfig {
                ops: 50 + (seed as usize % 4) * 100,
                max_threads: 1 + seed as usize % 8,
                devices: 1 + seed as usize % 2,
            };
            let p = generate(seed, &cfg);
            assert!(p.count() >= cfg.ops, "seed {seed}: {} ops", p.count());
            assert!(p.count() <= cfg.ops + 40 * p.phases.len() * p.threads);
            assert!((1..=cfg.max_threads).contains(&p.threads));
            for (ph, t, op) in all_ops(&p) {
                let owners = &p.phases[ph].owners;
                let mine = |s: SlotId| owners[s as usize] == Owner::Thread(t as u8);
                let readable = |s: SlotId| mine(s) || owners[s as usize] == Owner::Shared;
                let (writes, reads): (Vec<SlotId>, Vec<SlotId>) = match &op {
                    Op::Alloc { slot, .. }
                    | Op::Free { slot, .. }
                    | Op::HostWrite { slot, .. }
                    | Op::CopyWithin { slot, .. }
                    | Op::Memset { slot, .. }
                    | Op::KernelWrite { slot, .. }
                    | Op::SplitWrite { slot, .. }
                    | Op::Atomic { slot, .. }
                    | Op::Prefetch { slot, .. }
                    | Op::HoldRead { slot, .. } => (vec![*slot], vec![]),
                    Op::Scope { slot, to_buf, .. } => {
                        if *to_buf {
                            (vec![*slot], vec![])
                        } else {
                            (vec![], vec![*slot])
                        }
                    }
                    Op::HostRead { slot, .. } | Op::Xor { slot, .. } => (vec![], vec![*slot]),
                    Op::CopyAsync { dst, src, .. }
                    | Op::CopySync { dst, src, .. }
                    | Op::GuardCopy { dst, src, .. }
                    | Op::Peer { dst, src, .. } => (vec![*dst], vec![*src]),
                    Op::Spin { .. }
                    | Op::Sync { .. }
                    | Op::FailRecords { .. }
                    | Op::OverAligned { .. } => (vec![], vec![]),
                };
                for s in writes {
                    assert!(mine(s), "seed {seed}: thread {t} writes s{s}: {op}");
                }
                for s in reads {
                    assert!(readable(s), "seed {seed}: thread {t} reads s{s}: {op}");
                }
                if let Op::Peer { .. } = op {
                    assert_eq!(p.devices, 2);
                }
            }
        }
    }

    /// Every generated operation finds what it needs when it runs (the executor skips what
    /// does not fit, which would waste the operation): live slots of the right kinds, buffers
    /// that one operation may use together, atomic stores right after a write that covers the
    /// element (see `g_atomic`).
    #[test]
    fn generated_operations_fit_their_slots() {
        fn check(ops: &[Op], shapes: &mut [Option<Shape>], devices: usize, seed: u64) {
            let live = |shapes: &[Option<Shape>], s: SlotId| {
                shapes[s as usize].unwrap_or_else(|| panic!("seed {seed}: s{s} is empty"))
            };
            let mut prev: Option<&Op> = None;
            for op in ops {
                match op {
                    Op::Alloc {
                        slot,
                        kind,
                        dev,
                        len,
                        ..
                    } => {
                        assert!((*dev as usize) < devices && len % 4 == 0 && *len > 0);
                        shapes[*slot as usize] = Some(Shape {
                            kind: *kind,
                            dev: *dev,
                            len: *len,
                        });
                    }
                    Op::Free { slot, .. } => {
                        live(shapes, *slot);
                        shapes[*slot as usize] = None;
                    }
                    Op::HostRead { slot, .. }
                    | Op::HostWrite { slot, .. }
                    | Op::Xor { slot, .. }
                    | Op::Scope { slot, .. }
                    | Op::KernelWrite { slot, .. } => {
                        live(shapes, *slot);
                    }
                    Op::CopyWithin { slot, .. } | Op::SplitWrite { slot, .. } => {
                        assert!(live(shapes, *slot).len >= 8);
                    }
                    Op::CopyAsync { dst, src, .. } | Op::CopySync { dst, src, .. } => {
                        assert_ne!(dst, src);
                        assert!(compatible(live(shapes, *dst), live(shapes, *src)), "{op}");
                    }
                    Op::GuardCopy { dst, src, .. } => {
                        assert!(
                            guard_compatible(live(shapes, *dst), live(shapes, *src)),
                            "seed {seed}: {op}"
                        );
                    }
                    Op::Peer { dst, src, .. } => {
                        let (d, s) = (live(shapes, *dst), live(shapes, *src));
                        assert!(d.kind.is_device() && s.kind.is_device() && d.dev != s.dev);
                    }
                    Op::Memset { slot, stream, .. } => {
                        let k = live(shapes, *slot).kind;
                        assert!(k.memsets() && (stream.is_some() || k.is_device()), "{op}");
                    }
                    Op::Atomic { slot, index, value } => {
                        assert_eq!(live(shapes, *slot).kind, Kind::Mapped);
                        if value.is_some() {
                            let covered = match prev {
                                Some(Op::CopyAsync {
                                    dst, dst_off, len, ..
                                }) => *dst == *slot && *dst_off == 0 && index < len,
                                Some(Op::KernelWrite { slot: s, range, .. }) => {
                                    s == slot && range.off == 0 && *index < range.len
                                }
                                _ => false,
                            };
                            assert!(covered, "seed {seed}: {op} after {prev:?}");
                        }
                    }
                    Op::Prefetch { slot, .. } => {
                        assert_eq!(live(shapes, *slot).kind, Kind::Managed);
                    }
                    Op::Spin { dev, .. } | Op::Sync { dev, .. } => {
                        assert!((*dev as usize) < devices);
                    }
                    Op::HoldRead {
                        slot, body, into, ..
                    } => {
                        let h = live(shapes, *slot);
                        check(body, shapes, devices, seed);
                        if let Some(x) = into {
                            assert_ne!(x, slot);
                            assert!(guard_compatible(h, live(shapes, *x)), "{op}");
                        }
                    }
                    Op::FailRecords { .. } | Op::OverAligned { .. } => {}
                }
                prev = Some(op);
            }
        }
        for seed in 0..300u64 {
            let cfg = GenConfig {
                ops: 200,
                max_threads: 1 + seed as usize % 8,
                devices: 1 + seed as usize % 2,
            };
            let p = generate(seed, &cfg);
            let mut shapes = vec![None; p.slots];
            for phase in &p.phases {
                // Threads own disjoint slots: their effects do not interfere.
                for ops in &phase.threads {
                    check(ops, &mut shapes, cfg.devices, seed);
                }
            }
        }
    }

    /// Every motif and every primitive operation shows up in a few hundred programs (the
    /// mixes give each issue's pattern its chance).
    #[test]
    fn every_operation_kind_is_generated() {
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..300u64 {
            for (_, _, op) in all_ops(&generate(seed, &CFG)) {
                let name = format!("{op:?}");
                let name = name
                    .split(|c: char| !c.is_alphanumeric())
                    .next()
                    .unwrap()
                    .to_string();
                seen.insert(name);
                if let Op::Alloc { kind, .. } = op {
                    seen.insert(format!("{kind:?}"));
                }
                if let Op::HoldRead { forget: true, .. } = op {
                    seen.insert("HoldForget".into());
                }
                if let Op::Spin {
                    stream: StreamSel::PerThread,
                    ..
                } = op
                {
                    seen.insert("SpinPerThread".into());
                }
            }
        }
        for want in [
            "Alloc",
            "Free",
            "HostRead",
            "HostWrite",
            "CopyAsync",
            "CopySync",
            "CopyWithin",
            "Memset",
            "KernelWrite",
            "SplitWrite",
            "Xor",
            "GuardCopy",
            "Spin",
            "Sync",
            "Atomic",
            "FailRecords",
            "Scope",
            "Peer",
            "Prefetch",
            "OverAligned",
            "HoldRead",
            "HoldForget",
            "SpinPerThread",
        ] {
            assert!(seen.contains(want), "{want} never generated");
        }
        for k in Kind::ALL {
            assert!(seen.contains(&format!("{k:?}")), "{k:?} never allocated");
        }
    }
}
