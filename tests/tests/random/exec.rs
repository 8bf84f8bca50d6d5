//! Runs a program on the GPU and checks every observation against the host model.
//!
//! Each slot's buffer travels with its model (`Vec<u32>`, what the buffer must hold if every
//! promise of cuda-mem holds). A phase hands each thread the slots it owns by value and the
//! shared ones by reference; the threads run at once, each applying its operations to the
//! real buffers and to their models, and checking each host read, each kernel checksum and
//! each atomic load on the spot. Since a thread only writes what it owns, the model is exact
//! however the threads interleave; the ordering that makes it so on the GPU (across streams,
//! threads, phase boundaries, drops and reallocations) is cuda-mem's job, and any slip shows
//! as a mismatch.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use cuda_mem::{
    copy, copy_async, copy_peer_range, copy_peer_range_async, copy_range, copy_range_async,
    copy_staged, memset_async, sys, testing, Attach, Device, DeviceBuffer, DeviceGuard, DevicePtr,
    DevicePtrMut, ErrorCode, HostAllocFlags as F, HostRegisterFlags, Location, ManagedBuffer,
    MappedBuffer, MemPool, Memory, PinnedBuffer, PinnedPool, PinnedPoolConfig, Pod, PoolAccess,
    RegisteredVec, Slice, Stream,
};
use cuda_mem_probes::Probes;

use crate::gen::MAX_THREADS;
use crate::model::{clamp, clamp2, compare, pattern, splat, split_point, written, xor};
use crate::program::{
    Init, Kind, Op, OverKind, Owner, Program, Range, ReadHow, SlotId, StreamSel, Via, WriteHow,
};
use crate::watch::{self, Doing, Progress, Stage};

type R = Result<(), String>;

/// A runtime result as this module's error: the call that failed and why.
trait OrFail<T> {
    fn or_fail(self, what: &str) -> Result<T, String>;
}

impl<T> OrFail<T> for cuda_mem::Result<T> {
    fn or_fail(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: unexpected error: {e}"))
    }
}

/// The one per-thread stream operation of the executor: the calling thread's per-thread
/// default stream on the current device.
fn per_thread_stream() -> cuda_mem::Result<Stream> {
    Stream::per_thread()
}

/// Bytes of spare capacity after every registered `Vec`'s elements: `cudaHostRegister` pins
/// whole pages and refuses a second registration of a page, so no two registrations may
/// share one. With this much unregistered capacity after each, none does (the next
/// allocation starts at least a page past the end of the registered range).
const REGISTER_SLACK: usize = 4096;

/// One device's share of the run: its kernels, device pool and streams.
struct DevEnv {
    dev: Device,
    probes: Probes,
    pool: MemPool,
    legacy: Stream,
    /// Streams of each thread (by thread number).
    sets: Vec<StreamSet>,
    /// A non-blocking stream every thread uses.
    shared: Stream,
    /// cudarc's context of the device (its streams keep it alive too).
    _cudarc: Arc<cudarc::driver::CudaContext>,
}

/// One thread's own streams on one device.
struct StreamSet {
    blocking: [Stream; 2],
    non_blocking: [Stream; 2],
    /// A cudarc stream, as a cuda-mem `Stream` (`interop::cudarc::stream`).
    cudarc: Stream,
}

/// What every program of a run shares: devices, pools, streams.
pub struct Env {
    devs: Vec<DevEnv>,
    private_pool: PinnedPool,
    /// Whether each device's pool gave the other device access (peer copies of pooled
    /// buffers need it).
    pools_shared: bool,
}

impl Env {
    /// Sets up `devices` devices (1 or 2).
    pub fn new(devices: usize) -> Result<Env, String> {
        let mut devs = Vec::new();
        for d in 0..devices {
            let dev = Device::get(d as i32).or_fail("Device::get")?;
            let _g = dev.guard().or_fail("Device::guard")?;
            let probes = Probes::load().or_fail("Probes::load")?;
            let pool = MemPool::new(dev).or_fail("MemPool::new")?;
            let ctx = cudarc::driver::CudaContext::new(d)
                .map_err(|e| format!("cudarc CudaContext::new({d}): {e:?}"))?;
            let mut sets = Vec::new();
            for _ in 0..MAX_THREADS {
                let cs = ctx
                    .new_stream()
                    .map_err(|e| format!("cudarc new_stream: {e:?}"))?;
                sets.push(StreamSet {
                    blocking: [
                        Stream::new().or_fail("Stream::new")?,
                        Stream::new().or_fail("Stream::new")?,
                    ],
                    non_blocking: [
                        Stream::non_blocking().or_fail("Stream::non_blocking")?,
                        Stream::non_blocking().or_fail("Stream::non_blocking")?,
                    ],
                    cudarc: cuda_mem::interop::cudarc::stream(&cs)
                        .or_fail("interop::cudarc::stream")?,
                });
            }
            devs.push(DevEnv {
                dev,
                probes,
                pool,
                legacy: Stream::legacy_default(),
                sets,
                shared: Stream::non_blocking().or_fail("Stream::non_blocking")?,
                _cudarc: ctx,
            });
        }
        let mut pools_shared = false;
        if devices > 1 {
            let (a, b) = (devs[0].dev, devs[1].dev);
            // The direct path where there is one (NVLink, PCIe P2P); copies work either way.
            if a.can_access_peer(b).unwrap_or(false) && b.can_access_peer(a).unwrap_or(false) {
                let _ = a.enable_peer_access(b);
                let _ = b.enable_peer_access(a);
                pools_shared = devs[0].pool.set_access(b, PoolAccess::READ_WRITE).is_ok()
                    && devs[1].pool.set_access(a, PoolAccess::READ_WRITE).is_ok();
            }
        }
        Ok(Env {
            devs,
            private_pool: PinnedPool::new(PinnedPoolConfig::default()),
            pools_shared,
        })
    }

    pub fn devices(&self) -> usize {
        self.devs.len()
    }
}

/// A live buffer of any kind.
enum Buf {
    Device(DeviceBuffer<u32>),
    Pinned(PinnedBuffer<u32>),
    Mapped(MappedBuffer<u32>),
    Managed(ManagedBuffer<u32>),
    Registered(RegisteredVec<u32>),
}

/// `$body` with `$b` bound to the buffer inside `$buf` (a `&Buf` or `&mut Buf`), whatever
/// its kind: the generic code is written once and instantiated per kind.
macro_rules! each {
    ($buf:expr, $b:ident => $body:expr) => {
        match $buf {
            Buf::Device($b) => $body,
            Buf::Pinned($b) => $body,
            Buf::Mapped($b) => $body,
            Buf::Managed($b) => $body,
            Buf::Registered($b) => $body,
        }
    };
}

/// The host view of a buffer, where the host may read it in place.
fn host_slice(buf: &Buf) -> Option<cuda_mem::Result<&[u32]>> {
    match buf {
        Buf::Device(_) => None,
        Buf::Pinned(b) => Some(b.as_slice()),
        Buf::Mapped(b) => Some(b.as_slice()),
        Buf::Managed(b) => b.has_concurrent_access().then(|| b.as_slice()),
        Buf::Registered(b) => Some(b.as_slice()),
    }
}

fn host_slice_mut(buf: &mut Buf) -> Option<cuda_mem::Result<&mut [u32]>> {
    match buf {
        Buf::Device(_) => None,
        Buf::Pinned(b) => Some(b.as_mut_slice()),
        Buf::Mapped(b) => Some(b.as_mut_slice()),
        Buf::Managed(b) => {
            if b.has_concurrent_access() {
                Some(b.as_mut_slice())
            } else {
                None
            }
        }
        Buf::Registered(b) => Some(b.as_mut_slice()),
    }
}

/// A slot's buffer and what it must hold.
pub struct Slot {
    buf: Buf,
    model: Vec<u32>,
    kind: Kind,
    dev: usize,
    /// Element ranges of a mapped buffer that queued GPU work reads and that no later write
    /// has been ordered after: a host atomic store there races with the read by design
    /// (`atomic` waits for no reader: a kernel polling a flag must go on), so it is skipped.
    reads: Mutex<Vec<(usize, usize)>>,
}

impl Slot {
    fn new(buf: Buf, model: Vec<u32>, kind: Kind, dev: usize) -> Slot {
        Slot {
            buf,
            model,
            kind,
            dev,
            reads: Mutex::new(Vec::new()),
        }
    }

    fn len(&self) -> usize {
        self.model.len()
    }

    /// Notes GPU work queued that reads elements `off..off + n` and may still run.
    fn reading(&self, off: usize, n: usize) {
        if self.kind != Kind::Mapped {
            return;
        }
        let mut r = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        r.push((off, off + n));
        if r.len() > 64 {
            // Their hull: only more stores are skipped.
            let lo = r.iter().map(|x| x.0).min().unwrap_or(0);
            let hi = r.iter().map(|x| x.1).max().unwrap_or(0);
            *r = vec![(lo, hi)];
        }
    }

    /// Elements `off..` become `vals`: a write, which the fence orders after every pending
    /// GPU read that overlaps it (or the host waited for them all).
    fn write(&mut self, off: usize, vals: &[u32]) {
        let end = off + vals.len();
        self.model[off..end].copy_from_slice(vals);
        self.reads
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&(a, b)| !(a < end && off < b));
    }

    /// Whether a GPU read of element `i` may still be pending (see `reads`).
    fn read_pending(&self, i: usize) -> bool {
        let r = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        r.iter().any(|&(a, b)| a <= i && i < b)
    }
}

/// The device of an operation on these slots (that of their device memory; 0 without), or
/// `None` when it may not run: device memory of two devices, or managed memory with device
/// 1's (the generator avoids both; a shrunk program may not).
fn op_dev(slots: &[&Slot]) -> Option<usize> {
    let mut dev = None;
    for s in slots.iter().filter(|s| s.kind.is_device()) {
        match dev {
            None => dev = Some(s.dev),
            Some(d) if d != s.dev => return None,
            _ => {}
        }
    }
    let dev = dev.unwrap_or(0);
    if dev != 0 && slots.iter().any(|s| s.kind == Kind::Managed) {
        return None;
    }
    Some(dev)
}

/// The device of work through guards (device addresses) on these slots: as [`op_dev`], but
/// never device 1 with host memory, which was pinned in device 0's context (its device
/// address there is not promised; copies by host address are, and are made elsewhere).
fn guard_dev(slots: &[&Slot]) -> Option<usize> {
    let dev = op_dev(slots)?;
    (dev == 0 || slots.iter().all(|s| s.kind.is_device())).then_some(dev)
}

/// `cudaMemcpyAsync` of `n` elements between two guards' addresses on `st`: the stand-in for
/// a kernel that reads one buffer and writes another.
fn memcpy_async(dst: *mut u32, src: *const u32, n: usize, st: &Stream) -> R {
    // SAFETY: both addresses come from guards taken on `st` for at least `n` elements, which
    // the callers keep alive (or leak, which keeps the fences' marks) until this copy is
    // queued; cudaMemcpyDefault resolves host and device addresses under unified addressing.
    let code = unsafe {
        sys::cudaMemcpyAsync(
            dst.cast(),
            src.cast(),
            n * 4,
            sys::cudaMemcpyKind::cudaMemcpyDefault,
            st.as_raw(),
        )
    };
    if code == sys::cudaError::cudaSuccess {
        return Ok(());
    }
    // SAFETY: no arguments; clears the error just returned.
    unsafe { sys::cudaGetLastError() };
    Err(format!(
        "cudaMemcpyAsync through guards: unexpected error: {}",
        ErrorCode(code.0)
    ))
}

/// `cm_write` through a write guard of `m` (whole 16-byte words), dropped after the launch,
/// or leaked with `forget`.
fn write_through<M: DevicePtrMut<u32> + ?Sized>(
    probes: &Probes,
    m: &mut M,
    n: usize,
    st: &Stream,
    forget: bool,
) -> R {
    let w = m.device_ptr_mut(st).or_fail("device_ptr_mut")?;
    // SAFETY: the guard covers `n` elements, `4 * n` bytes in whole 16-byte words at a 16-byte
    // aligned address (every buffer starts so aligned and views start at multiples of four
    // elements); the kernel is queued on the guard's stream while the guard lives.
    unsafe { probes.write(w.as_mut_ptr().cast(), n * 4, st) }.or_fail("Probes::write")?;
    if forget {
        std::mem::forget(w);
    }
    Ok(())
}

/// A slot lent read-only to the operations nested in a `HoldRead`.
type Held<'h> = Option<(SlotId, &'h Slot)>;

/// The per-thread default streams of the running thread, one per device.
struct Local {
    per_thread: Vec<Stream>,
}

impl Local {
    fn new(env: &Env) -> Result<Local, String> {
        let mut per_thread = Vec::new();
        for d in &env.devs {
            let _g = d.dev.guard().or_fail("Device::guard")?;
            per_thread.push(per_thread_stream().or_fail("per-thread stream")?);
        }
        Ok(Local { per_thread })
    }
}

/// One thread's state in one phase.
struct Cx<'c> {
    env: &'c Env,
    /// The thread's number (its stream set).
    t: usize,
    owned: BTreeMap<SlotId, Option<Slot>>,
    shared: &'c BTreeMap<SlotId, Slot>,
    local: &'c Local,
    executed: usize,
    /// Where the watchdog reads which operation this thread is executing.
    watch: Option<&'c Mutex<Doing>>,
    /// Nesting depth of the operation list being executed (0: the thread's own).
    depth: usize,
}

impl<'c> Cx<'c> {
    fn stream(&self, sel: StreamSel, dev: usize) -> &'c Stream {
        let d = &self.env.devs[dev];
        let set = &d.sets[self.t % MAX_THREADS];
        match sel {
            StreamSel::Legacy => &d.legacy,
            StreamSel::Blocking(i) => &set.blocking[usize::from(i) % 2],
            StreamSel::NonBlocking(i) => &set.non_blocking[usize::from(i) % 2],
            StreamSel::Cudarc => &set.cudarc,
            StreamSel::PerThread => &self.local.per_thread[dev],
            StreamSel::Shared => &d.shared,
        }
    }

    fn enter(&self, dev: usize) -> Result<DeviceGuard, String> {
        self.env.devs[dev].dev.guard().or_fail("Device::guard")
    }

    fn probes(&self, dev: usize) -> &'c Probes {
        &self.env.devs[dev].probes
    }

    /// A slot this thread may read: its own, a shared one, or the one lent by a `HoldRead`.
    fn get<'s>(&'s self, id: SlotId, held: Held<'s>) -> Option<&'s Slot> {
        if let Some((h, s)) = held {
            if h == id {
                return Some(s);
            }
        }
        match self.owned.get(&id) {
            Some(s) => s.as_ref(),
            None => self.shared.get(&id),
        }
    }

    /// Takes an owned slot's buffer out to write it (put it back with `put`).
    fn take(&mut self, id: SlotId) -> Option<Slot> {
        self.owned.get_mut(&id)?.take()
    }

    fn put(&mut self, id: SlotId, s: Slot) {
        self.owned.insert(id, Some(s));
    }

    /// Runs `f` on owned slot `id` (nothing when the thread does not own a live one).
    fn on_dst(&mut self, id: SlotId, f: impl FnOnce(&Self, &mut Slot) -> R) -> R {
        let Some(mut d) = self.take(id) else {
            return Ok(());
        };
        let r = f(self, &mut d);
        self.put(id, d);
        r
    }

    fn op(&mut self, op: &Op, held: Held<'_>) -> R {
        self.executed += 1;
        match *op {
            Op::Alloc {
                slot,
                kind,
                dev,
                len,
                init,
                stream,
            } => self.alloc(slot, kind, dev, len, init, stream),
            Op::Free { slot, explicit } => self.free(slot, explicit),
            Op::HostRead { slot, range, how } => self.host_read(slot, range, how, held),
            Op::HostWrite {
                slot,
                range,
                how,
                seed,
            } => self.on_dst(slot, |cx, d| cx.host_write(d, range, how, seed)),
            Op::CopyAsync {
                dst,
                src,
                dst_off,
                src_off,
                len,
                stream,
                via,
            } => self.on_dst(dst, |cx, d| {
                let Some(s) = cx.get(src, held) else {
                    return Ok(());
                };
                cx.copy(d, s, (dst_off, src_off, len), Some(stream), via)
            }),
            Op::CopySync {
                dst,
                src,
                dst_off,
                src_off,
                len,
                via,
            } => self.on_dst(dst, |cx, d| {
                let Some(s) = cx.get(src, held) else {
                    return Ok(());
                };
                cx.copy(d, s, (dst_off, src_off, len), None, via)
            }),
            Op::CopyWithin {
                slot,
                mid,
                up,
                stream,
            } => self.on_dst(slot, |cx, d| cx.copy_within(d, mid, up, stream)),
            Op::Memset {
                slot,
                range,
                byte,
                stream,
            } => self.on_dst(slot, |cx, d| cx.memset(d, range, byte, stream)),
            Op::KernelWrite {
                slot,
                range,
                stream,
                forget,
            } => self.on_dst(slot, |cx, d| cx.kernel_write(d, range, stream, forget)),
            Op::SplitWrite { slot, mid, s1, s2 } => {
                self.on_dst(slot, |cx, d| cx.split_write(d, mid, s1, s2))
            }
            Op::Xor {
                slot,
                range,
                stream,
            } => self.xor(slot, range, stream, held),
            Op::GuardCopy {
                dst,
                src,
                len,
                stream,
                forget,
            } => self.on_dst(dst, |cx, d| {
                let Some(s) = cx.get(src, held) else {
                    return Ok(());
                };
                cx.guard_copy(d, s, len, stream, forget)
            }),
            Op::Spin { stream, dev, us } => {
                let dev = usize::from(dev).min(self.env.devs.len() - 1);
                let _g = self.enter(dev)?;
                self.probes(dev)
                    .spin(u64::from(us) * 1000, self.stream(stream, dev))
                    .or_fail("Probes::spin")
            }
            Op::Sync { stream, dev } => {
                let dev = usize::from(dev).min(self.env.devs.len() - 1);
                let _g = self.enter(dev)?;
                self.stream(stream, dev)
                    .synchronize()
                    .or_fail("Stream::synchronize")
            }
            Op::Atomic { slot, index, value } => {
                self.on_dst(slot, |_, d| atomic(d, slot, index, value))
            }
            Op::FailRecords { n } => {
                testing::fail_next_fence_records(u32::from(n));
                Ok(())
            }
            Op::Scope {
                slot,
                range,
                stream,
                to_buf,
                seed,
            } => {
                if to_buf {
                    self.on_dst(slot, |cx, d| cx.scope_into(d, range, stream, seed))
                } else {
                    self.scope_out(slot, range, stream, held)
                }
            }
            Op::Peer {
                dst,
                src,
                len,
                stream,
            } => self.on_dst(dst, |cx, d| {
                let Some(s) = cx.get(src, held) else {
                    return Ok(());
                };
                cx.peer(d, s, len, stream)
            }),
            Op::Prefetch {
                slot,
                to_host,
                stream,
            } => self.on_dst(slot, |cx, d| {
                let Buf::Managed(m) = &mut d.buf else {
                    return Ok(());
                };
                let _g = cx.enter(0)?;
                let to = if to_host {
                    Location::Host
                } else {
                    Location::Device(Device::get(0).or_fail("Device::get")?)
                };
                m.prefetch(to, cx.stream(stream, 0))
                    .or_fail("ManagedBuffer::prefetch")
            }),
            Op::OverAligned {
                kind,
                align4096,
                len,
                pad,
            } => {
                let _g = self.enter(0)?;
                let (len, pad) = (len.max(1) as usize, pad as usize);
                if align4096 {
                    over_aligned::<A4096>(self.env, kind, len, pad)
                } else {
                    over_aligned::<A512>(self.env, kind, len, pad)
                }
            }
            Op::HoldRead {
                slot,
                stream,
                ref body,
                into,
                forget,
            } => {
                let Some(h) = self.take(slot) else {
                    return Ok(());
                };
                let r = self.hold_read(&h, slot, stream, body, into, forget);
                self.put(slot, h);
                r
            }
        }
    }

    fn alloc(
        &mut self,
        slot: SlotId,
        kind: Kind,
        dev: u8,
        len: u32,
        init: Init,
        stream: StreamSel,
    ) -> R {
        if !self.owned.contains_key(&slot) {
            return Ok(());
        }
        // The old buffer goes first: its memory may be what the allocator hands out next.
        self.owned.insert(slot, None);
        let env = self.env;
        let len = (len as usize & !3).max(4);
        let dev = if kind.is_device() && usize::from(dev) < env.devs.len() {
            usize::from(dev)
        } else {
            0
        };
        let model = init.fill(len);
        let _g = self.enter(dev)?;
        let st = self.stream(stream, dev);
        let pool = &env.devs[dev].pool;
        let what = format!("allocating {kind}[{len}]");
        let fail = |e: cuda_mem::Error| format!("{what}: unexpected error: {e}");
        let buf = match kind {
            Kind::Device => Buf::Device(match init {
                Init::Zero => DeviceBuffer::zeroed(len).map_err(fail)?,
                Init::Pattern(_) => DeviceBuffer::from_slice(&model).map_err(fail)?,
                Init::Byte(b) => {
                    let mut d = DeviceBuffer::uninit(len).map_err(fail)?;
                    d.memset(b).map_err(fail)?;
                    d
                }
            }),
            Kind::DevicePool => Buf::Device(match init {
                Init::Zero => DeviceBuffer::zeroed_from_pool(pool, len, st).map_err(fail)?,
                Init::Byte(b) => {
                    let mut d = DeviceBuffer::from_pool(pool, len, st).map_err(fail)?;
                    d.memset_async(b, st).map_err(fail)?;
                    d
                }
                Init::Pattern(_) => {
                    let mut d = DeviceBuffer::from_pool(pool, len, st).map_err(fail)?;
                    copy(&mut d, &model).map_err(fail)?;
                    d
                }
            }),
            Kind::Pinned => Buf::Pinned(match init {
                Init::Pattern(_) => PinnedBuffer::from_slice(&model, F::DEFAULT).map_err(fail)?,
                _ => {
                    let mut p = PinnedBuffer::zeroed(len, F::DEFAULT).map_err(fail)?;
                    if init != Init::Zero {
                        p.as_mut_slice().map_err(fail)?.copy_from_slice(&model);
                    }
                    p
                }
            }),
            Kind::PinnedGlobalPool | Kind::PinnedPrivatePool => {
                let pool = if kind == Kind::PinnedGlobalPool {
                    PinnedPool::global()
                } else {
                    &env.private_pool
                };
                Buf::Pinned(match init {
                    Init::Zero => pool.alloc_zeroed(len, F::DEFAULT).map_err(fail)?,
                    Init::Pattern(_) => pool.from_slice(&model, F::DEFAULT).map_err(fail)?,
                    Init::Byte(_) => {
                        let mut p = pool.alloc(len, F::DEFAULT).map_err(fail)?;
                        p.as_mut_slice().map_err(fail)?.copy_from_slice(&model);
                        p
                    }
                })
            }
            Kind::Mapped => {
                let mut m = MappedBuffer::zeroed(len, F::DEFAULT).map_err(fail)?;
                if init != Init::Zero {
                    m.as_mut_slice().map_err(fail)?.copy_from_slice(&model);
                }
                Buf::Mapped(m)
            }
            Kind::Managed => {
                let mut m = ManagedBuffer::zeroed(len, Attach::Global).map_err(fail)?;
                if init != Init::Zero {
                    if m.has_concurrent_access() {
                        m.as_mut_slice().map_err(fail)?.copy_from_slice(&model);
                    } else {
                        copy(&mut m, &model).map_err(fail)?;
                    }
                }
                Buf::Managed(m)
            }
            Kind::Registered => {
                let mut v = Vec::with_capacity(len + REGISTER_SLACK / 4);
                v.extend_from_slice(&model);
                Buf::Registered(
                    RegisteredVec::register(v, HostRegisterFlags::DEFAULT).map_err(fail)?,
                )
            }
        };
        self.put(slot, Slot::new(buf, model, kind, dev));
        Ok(())
    }

    fn free(&mut self, slot: SlotId, explicit: bool) -> R {
        let Some(s) = self.take(slot) else {
            return Ok(());
        };
        let _g = self.enter(s.dev)?;
        if !explicit {
            drop(s);
            return Ok(());
        }
        let what = format!("s{slot} ({}) free", s.kind);
        match s.buf {
            Buf::Device(b) => b.free().or_fail(&what),
            Buf::Pinned(b) => b.free().or_fail(&what),
            Buf::Mapped(b) => b.free().or_fail(&what),
            Buf::Managed(b) => b.free().or_fail(&what),
            Buf::Registered(b) => {
                let v = b.into_vec().or_fail(&what)?;
                compare(&format!("s{slot} (registered) into_vec"), 0, &v, &s.model)
            }
        }
    }

    fn host_read(&self, slot: SlotId, range: Range, how: ReadHow, held: Held<'_>) -> R {
        let Some(s) = self.get(slot, held) else {
            return Ok(());
        };
        let Some((off, n)) = clamp(s.len(), range.off, range.len, false) else {
            return Ok(());
        };
        let _g = self.enter(s.dev)?;
        let want = &s.model[off..off + n];
        let what = |m: &str| format!("s{slot} ({}) host read {m}", s.kind);
        if how == ReadHow::AsSlice {
            if let Some(r) = host_slice(&s.buf) {
                let got = r.or_fail(&what("as_slice"))?;
                return compare(&what("as_slice"), off, &got[off..off + n], want);
            }
        }
        if how == ReadHow::ToVec {
            if let Buf::Device(b) = &s.buf {
                let got = b.to_vec().or_fail(&what("to_vec"))?;
                return compare(&what("to_vec"), off, &got[off..off + n], want);
            }
        }
        let mut got = vec![0u32; n];
        if how == ReadHow::Staged {
            each!(&s.buf, b => {
                let v = b.slice(off..off + n).or_fail("slice")?;
                copy_staged(&mut got[..], &v)
            })
            .or_fail(&what("copy_staged"))?;
            return compare(&what("copy_staged"), off, &got, want);
        }
        each!(&s.buf, b => copy_range(&mut got, 0, b, off, n)).or_fail(&what("copy_range"))?;
        compare(&what("copy_range"), off, &got, want)
    }

    fn host_write(&self, d: &mut Slot, range: Range, how: WriteHow, seed: u32) -> R {
        let Some((off, n)) = clamp(d.len(), range.off, range.len, false) else {
            return Ok(());
        };
        let _g = self.enter(d.dev)?;
        let data = pattern(seed, n);
        let what = format!("{} host write {how:?}", d.kind);
        let in_place = how == WriteHow::AsMutSlice;
        match host_slice_mut(&mut d.buf).filter(|_| in_place) {
            Some(r) => r.or_fail(&what)?[off..off + n].copy_from_slice(&data),
            None if how == WriteHow::Staged => each!(&mut d.buf, b => {
                let mut v = b.slice_mut(off..off + n).or_fail("slice_mut")?;
                copy_staged(&mut v, &data[..])
            })
            .or_fail(&what)?,
            None => each!(&mut d.buf, b => copy_range(b, off, &data, 0, n)).or_fail(&what)?,
        }
        d.write(off, &data);
        Ok(())
    }

    /// `d[dst_off..][..len] <- s[src_off..][..len]`, asynchronously on `stream`, or
    /// synchronously without one.
    fn copy(
        &self,
        d: &mut Slot,
        s: &Slot,
        (dst_off, src_off, len): (u32, u32, u32),
        stream: Option<StreamSel>,
        via: Via,
    ) -> R {
        let Some(dev) = op_dev(&[d, s]) else {
            return Ok(());
        };
        let whole = via == Via::Whole && d.len() == s.len();
        let (doff, soff, n) = if whole {
            (0, 0, d.len())
        } else {
            match clamp2(d.len(), s.len(), dst_off, src_off, len) {
                Some(r) => r,
                None => return Ok(()),
            }
        };
        let _g = self.enter(dev)?;
        let what = format!(
            "{} {} <- {} ({via:?})",
            if stream.is_some() {
                "copy_async"
            } else {
                "copy"
            },
            d.kind,
            s.kind
        );
        match stream {
            Some(sel) => {
                let st = self.stream(sel, dev);
                if whole {
                    each!(&mut d.buf, db => each!(&s.buf, sb => copy_async(db, sb, st)))
                } else if via == Via::Views {
                    each!(&mut d.buf, db => {
                        let mut dv = db.slice_mut(doff..doff + n).or_fail("slice_mut")?;
                        each!(&s.buf, sb => {
                            let sv = sb.slice(soff..soff + n).or_fail("slice")?;
                            copy_async(&mut dv, &sv, st)
                        })
                    })
                } else {
                    each!(&mut d.buf, db => each!(&s.buf, sb => copy_range_async(db, doff, sb, soff, n, st)))
                }
            }
            None => {
                if whole {
                    each!(&mut d.buf, db => each!(&s.buf, sb => copy(db, sb)))
                } else if via == Via::Views {
                    each!(&mut d.buf, db => {
                        let mut dv = db.slice_mut(doff..doff + n).or_fail("slice_mut")?;
                        each!(&s.buf, sb => {
                            let sv = sb.slice(soff..soff + n).or_fail("slice")?;
                            copy(&mut dv, &sv)
                        })
                    })
                } else {
                    each!(&mut d.buf, db => each!(&s.buf, sb => copy_range(db, doff, sb, soff, n)))
                }
            }
        }
        .or_fail(&what)?;
        // (A synchronous copy into managed memory may also still read its source.)
        s.reading(soff, n);
        d.write(doff, &s.model[soff..soff + n]);
        Ok(())
    }

    fn copy_within(&self, d: &mut Slot, mid: u32, up: bool, stream: StreamSel) -> R {
        let len = d.len();
        let Some(mid) = split_point(len, mid) else {
            return Ok(());
        };
        let c = mid.min(len - mid);
        let dev = op_dev(&[d]).unwrap_or(0);
        let _g = self.enter(dev)?;
        let st = self.stream(stream, dev);
        each!(&mut d.buf, b => {
            let (mut lo, mut hi) = b.split_at_mut(mid).or_fail("split_at_mut")?;
            if up {
                copy_range_async(&mut hi, 0, &lo, 0, c, st)
            } else {
                copy_range_async(&mut lo, 0, &hi, 0, c, st)
            }
        })
        .or_fail(&format!("{} copy_range_async between halves", d.kind))?;
        let (from, to) = if up { (0, mid) } else { (mid, 0) };
        d.reading(from, c);
        let vals = d.model[from..from + c].to_vec();
        d.write(to, &vals);
        Ok(())
    }

    fn memset(&self, d: &mut Slot, range: Range, byte: u8, stream: Option<StreamSel>) -> R {
        if !d.kind.memsets() {
            return Ok(());
        }
        let dev = op_dev(&[d]).unwrap_or(0);
        let _g = self.enter(dev)?;
        let what = format!("{} memset", d.kind);
        let Some(sel) = stream else {
            let Buf::Device(b) = &mut d.buf else {
                return Ok(());
            };
            b.memset(byte).or_fail(&what)?;
            let len = d.len();
            d.write(0, &vec![splat(byte); len]);
            return Ok(());
        };
        let Some((off, n)) = clamp(d.len(), range.off, range.len, false) else {
            return Ok(());
        };
        let st = self.stream(sel, dev);
        match &mut d.buf {
            Buf::Device(b) => memset_async(
                &mut b.slice_mut(off..off + n).or_fail("slice_mut")?,
                byte,
                st,
            ),
            Buf::Managed(b) => memset_async(
                &mut b.slice_mut(off..off + n).or_fail("slice_mut")?,
                byte,
                st,
            ),
            _ => return Ok(()),
        }
        .or_fail(&what)?;
        d.write(off, &vec![splat(byte); n]);
        Ok(())
    }

    fn kernel_write(&self, d: &mut Slot, range: Range, stream: StreamSel, forget: bool) -> R {
        let Some((off, n)) = clamp(d.len(), range.off, range.len, true) else {
            return Ok(());
        };
        let dev = op_dev(&[d]).unwrap_or(0);
        let _g = self.enter(dev)?;
        let st = self.stream(stream, dev);
        let probes = self.probes(dev);
        each!(&mut d.buf, b => {
            let mut v = b.slice_mut(off..off + n).or_fail("slice_mut")?;
            write_through(probes, &mut v, n, st, forget)
        })
        .map_err(|e| format!("{} kernel write: {e}", d.kind))?;
        d.write(off, &written(n));
        Ok(())
    }

    fn split_write(&self, d: &mut Slot, mid: u32, s1: StreamSel, s2: StreamSel) -> R {
        let len = d.len();
        let Some(mid) = split_point(len, mid) else {
            return Ok(());
        };
        let dev = op_dev(&[d]).unwrap_or(0);
        let _g = self.enter(dev)?;
        let (st1, st2) = (self.stream(s1, dev), self.stream(s2, dev));
        let probes = self.probes(dev);
        each!(&mut d.buf, b => {
            let (mut lo, mut hi) = b.split_at_mut(mid).or_fail("split_at_mut")?;
            write_through(probes, &mut lo, mid, st1, false)?;
            write_through(probes, &mut hi, len - mid, st2, false)
        })
        .map_err(|e| format!("{} kernel write into halves: {e}", d.kind))?;
        d.write(0, &written(mid));
        d.write(mid, &written(len - mid));
        Ok(())
    }

    fn xor(&self, slot: SlotId, range: Range, stream: StreamSel, held: Held<'_>) -> R {
        let Some(s) = self.get(slot, held) else {
            return Ok(());
        };
        let Some((off, n)) = clamp(s.len(), range.off, range.len, false) else {
            return Ok(());
        };
        let dev = op_dev(&[s]).unwrap_or(0);
        let _g = self.enter(dev)?;
        let st = self.stream(stream, dev);
        let probes = self.probes(dev);
        let what = format!("s{slot} ({}) xor_checksum [{off}..{}]", s.kind, off + n);
        let got = each!(&s.buf, b => {
            let v = b.slice(off..off + n).or_fail("slice")?;
            probes.xor_checksum(&v, st)
        })
        .or_fail(&what)?;
        let want = xor(&s.model[off..off + n]);
        if got != want {
            return Err(format!(
                "{what}: MISMATCH got {got:#010x} expected {want:#010x}"
            ));
        }
        Ok(())
    }

    fn guard_copy(&self, d: &mut Slot, s: &Slot, len: u32, stream: StreamSel, forget: bool) -> R {
        let Some(dev) = guard_dev(&[d, s]) else {
            return Ok(());
        };
        let n = (len as usize).min(d.len()).min(s.len());
        if n == 0 {
            return Ok(());
        }
        let _g = self.enter(dev)?;
        let st = self.stream(stream, dev);
        let what = format!("guard copy {} <- {}", d.kind, s.kind);
        let r = each!(&s.buf, b => b.device_ptr(st)).or_fail(&what)?;
        let w = each!(&mut d.buf, b => b.device_ptr_mut(st)).or_fail(&what)?;
        memcpy_async(w.as_mut_ptr(), r.as_ptr(), n, st)?;
        if forget {
            std::mem::forget(r);
            std::mem::forget(w);
        } else {
            drop(w);
            drop(r);
        }
        s.reading(0, n);
        d.write(0, &s.model[..n]);
        Ok(())
    }

    fn scope_into(&self, d: &mut Slot, range: Range, stream: StreamSel, seed: u32) -> R {
        let Some((off, n)) = clamp(d.len(), range.off, range.len, false) else {
            return Ok(());
        };
        let dev = op_dev(&[d]).unwrap_or(0);
        let _g = self.enter(dev)?;
        let st = self.stream(stream, dev);
        let data = pattern(seed, n);
        let buf = &mut d.buf;
        cuda_mem::scope(|sc| {
            let b = sc.borrow(&data);
            each!(buf, db => copy_range_async(db, off, &b, 0, n, st))
        })
        .or_fail(&format!("{} copy_async from a scope-borrowed Vec", d.kind))?;
        d.write(off, &data);
        Ok(())
    }

    fn scope_out(&self, slot: SlotId, range: Range, stream: StreamSel, held: Held<'_>) -> R {
        let Some(s) = self.get(slot, held) else {
            return Ok(());
        };
        let Some((off, n)) = clamp(s.len(), range.off, range.len, false) else {
            return Ok(());
        };
        let dev = op_dev(&[s]).unwrap_or(0);
        let _g = self.enter(dev)?;
        let st = self.stream(stream, dev);
        let mut out = vec![0u32; n];
        let what = format!("s{slot} ({}) copy_async into a scope-borrowed Vec", s.kind);
        cuda_mem::scope(|sc| {
            let mut b = sc.borrow_mut(&mut out);
            each!(&s.buf, sb => copy_range_async(&mut b, 0, sb, off, n, st))
        })
        .or_fail(&what)?;
        compare(&what, off, &out, &s.model[off..off + n])
    }

    fn peer(&self, d: &mut Slot, s: &Slot, len: u32, stream: Option<StreamSel>) -> R {
        if d.dev == s.dev {
            return Ok(());
        }
        let pooled = d.kind == Kind::DevicePool || s.kind == Kind::DevicePool;
        if pooled && !self.env.pools_shared {
            return Ok(());
        }
        let (Buf::Device(db), Buf::Device(sb)) = (&mut d.buf, &s.buf) else {
            return Ok(());
        };
        let n = (len as usize).min(db.len()).min(sb.len());
        if n == 0 {
            return Ok(());
        }
        match stream {
            None => copy_peer_range(db, 0, sb, 0, n).or_fail("copy_peer_range")?,
            Some(sel) => {
                let _g = self.enter(s.dev)?;
                copy_peer_range_async(db, 0, sb, 0, n, self.stream(sel, s.dev))
                    .or_fail("copy_peer_range_async")?
            }
        }
        d.write(0, &s.model[..n]);
        Ok(())
    }

    fn hold_read(
        &mut self,
        h: &Slot,
        slot: SlotId,
        stream: StreamSel,
        body: &[Op],
        into: Option<SlotId>,
        forget: bool,
    ) -> R {
        let dev = op_dev(&[h]).unwrap_or(0);
        let _g = self.enter(dev)?;
        let st = self.stream(stream, dev);
        let g = each!(&h.buf, b => b.device_ptr(st))
            .or_fail(&format!("{} device_ptr (held)", h.kind))?;
        self.depth += 1;
        let depth = self.depth;
        let mut nested = Ok(());
        for (j, op) in body.iter().enumerate() {
            watch::enter_op(self.watch, depth, j);
            nested = self.op(op, Some((slot, h))).map_err(|e| {
                format!(
                    "while holding a read guard of s{slot}, nested operation {j} `{}`: {e}",
                    op.to_string().trim()
                )
            });
            if nested.is_err() {
                break;
            }
        }
        watch::leave_list(self.watch, depth);
        self.depth -= 1;
        nested?;
        if let Some(x) = into.filter(|&x| x != slot) {
            self.on_dst(x, |_, d| {
                if guard_dev(&[h, d]) != Some(dev) {
                    return Ok(());
                }
                let n = h.len().min(d.len());
                let w = each!(&mut d.buf, b => b.device_ptr_mut(st))
                    .or_fail(&format!("{} device_ptr_mut", d.kind))?;
                memcpy_async(w.as_mut_ptr(), g.as_ptr(), n, st)?;
                drop(w);
                h.reading(0, n);
                d.write(0, &h.model[..n]);
                Ok(())
            })?;
        }
        if forget {
            std::mem::forget(g);
        }
        Ok(())
    }
}

/// A mapped buffer's host atomic: a store, or a load checked against the model.
fn atomic(d: &mut Slot, slot: SlotId, index: u32, value: Option<u32>) -> R {
    if d.kind != Kind::Mapped {
        return Ok(());
    }
    let i = index as usize % d.len();
    if value.is_some() && d.read_pending(i) {
        // Unpredictable by design (see `Slot::reads`): the generator never makes this; a
        // shrunk program may.
        return Ok(());
    }
    let Buf::Mapped(m) = &mut d.buf else {
        return Ok(());
    };
    let a = m.atomic(i).or_fail("MappedBuffer::atomic")?;
    match value {
        Some(v) => {
            a.store(v, Ordering::SeqCst);
            d.write(i, &[v]);
            Ok(())
        }
        None => {
            let got = a.load(Ordering::SeqCst);
            let want = d.model[i];
            if got != want {
                return Err(format!(
                    "s{slot} (mapped) atomic({i}).load(): MISMATCH got {got:#010x} expected {want:#010x}"
                ));
            }
            Ok(())
        }
    }
}

/// An element type aligned to 512 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(512))]
struct A512([u32; 128]);
// SAFETY: `repr(C)` over an array of `u32` whose size (512) is the alignment: no padding, and
// every bit pattern (all zeros included) is a valid value.
unsafe impl bytemuck::Zeroable for A512 {}
// SAFETY: as above; `Copy` and `'static`.
unsafe impl bytemuck::Pod for A512 {}

/// An element type aligned to a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(4096))]
struct A4096([u32; 1024]);
// SAFETY: as for `A512`, with size and alignment 4096.
unsafe impl bytemuck::Zeroable for A4096 {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for A4096 {}

/// The outcome of an over-aligned allocation: `Ok(Some)` aligned, `Ok(None)` refused as
/// misuse, `Err` for anything else, a misaligned success above all (issue 19 item 2).
fn judge<B>(
    what: &str,
    r: cuda_mem::Result<B>,
    align: usize,
    addr: impl Fn(&B) -> usize,
) -> Result<Option<B>, String> {
    match r {
        Ok(b) => {
            let a = addr(&b);
            if a % align != 0 {
                return Err(format!(
                    "{what}: MISALIGNED: Ok at {a:#x}, which is not a multiple of the element's \
                     alignment {align} (it must be refused with Error::Misuse instead)"
                ));
            }
            Ok(Some(b))
        }
        Err(e) if e.misuse().is_some() => Ok(None),
        Err(e) => Err(format!("{what}: unexpected error: {e}")),
    }
}

/// The contents written through the host, copied out to a `Vec`, and through device memory
/// and back (where device memory of the type is given: it may be refused as misaligned too).
fn roundtrip<A: Pod, M: Memory<A> + ?Sized>(what: &str, m: &M, len: usize, want: &[u32]) -> R {
    let mut back = vec![A::zeroed(); len];
    copy(&mut back, m).or_fail(what)?;
    compare(what, 0, bytemuck::cast_slice(&back), want)?;
    let mut dev = match DeviceBuffer::<A>::zeroed(len) {
        Ok(d) => d,
        Err(e) if e.misuse().is_some() => return Ok(()),
        Err(e) => return Err(format!("{what}: device memory: unexpected error: {e}")),
    };
    copy(&mut dev, m).or_fail(what)?;
    let back = dev.to_vec().or_fail(what)?;
    compare(
        &format!("{what}, through device memory"),
        0,
        bytemuck::cast_slice(&back),
        want,
    )
}

fn fill<A: Pod>(what: &str, host: cuda_mem::Result<&mut [A]>, data: &[u32]) -> R {
    bytemuck::cast_slice_mut::<A, u32>(host.or_fail(what)?).copy_from_slice(data);
    Ok(())
}

/// A pad allocation (kept alive while the over-aligned one is made) that moves where a
/// sub-allocating allocator puts the next block.
fn pad<B>(bytes: usize, f: impl FnOnce(usize) -> cuda_mem::Result<B>) -> Result<Option<B>, String> {
    if bytes == 0 {
        return Ok(None);
    }
    f(bytes).or_fail("pad allocation").map(Some)
}

fn over_aligned<A: Pod>(env: &Env, kind: OverKind, len: usize, pad_bytes: usize) -> R {
    let align = std::mem::align_of::<A>();
    let what = format!(
        "{kind:?} of {len} elements aligned to {align} after a {pad_bytes}-byte allocation"
    );
    let data = pattern(
        align as u32 ^ len as u32,
        len * std::mem::size_of::<A>() / 4,
    );
    let host = |p: *const A| p as usize;
    match kind {
        OverKind::Pinned => {
            let _pad = pad(pad_bytes, |n| PinnedBuffer::<u8>::zeroed(n, F::DEFAULT))?;
            let r = PinnedBuffer::<A>::zeroed(len, F::DEFAULT);
            if let Some(mut b) = judge(&what, r, align, |b| host(b.as_ptr()))? {
                fill(&what, b.as_mut_slice(), &data)?;
                roundtrip(&what, &b, len, &data)?;
            }
        }
        OverKind::PinnedGlobalPool | OverKind::PinnedPrivatePool => {
            let pool = if kind == OverKind::PinnedGlobalPool {
                PinnedPool::global()
            } else {
                &env.private_pool
            };
            let _pad = pad(pad_bytes, |n| pool.alloc::<u8>(n, F::DEFAULT))?;
            let r = pool.alloc_zeroed::<A>(len, F::DEFAULT);
            if let Some(mut b) = judge(&what, r, align, |b| host(b.as_ptr()))? {
                fill(&what, b.as_mut_slice(), &data)?;
                roundtrip(&what, &b, len, &data)?;
            }
        }
        OverKind::Mapped => {
            let _pad = pad(pad_bytes, |n| MappedBuffer::<u8>::zeroed(n, F::DEFAULT))?;
            let r = MappedBuffer::<A>::zeroed(len, F::DEFAULT);
            if let Some(mut b) = judge(&what, r, align, |b| host(b.as_ptr()))? {
                fill(&what, b.as_mut_slice(), &data)?;
                roundtrip(&what, &b, len, &data)?;
            }
        }
        OverKind::Managed => {
            let _pad = pad(pad_bytes, |n| {
                ManagedBuffer::<u8>::zeroed(n, Attach::Global)
            })?;
            let r = ManagedBuffer::<A>::zeroed(len, Attach::Global);
            if let Some(mut b) = judge(&what, r, align, |b| host(b.as_ptr()))? {
                if b.has_concurrent_access() {
                    fill(&what, b.as_mut_slice(), &data)?;
                    roundtrip(&what, &b, len, &data)?;
                }
            }
        }
        OverKind::Registered => {
            let mut v = Vec::with_capacity(len + REGISTER_SLACK.div_ceil(align));
            v.resize(len, A::zeroed());
            bytemuck::cast_slice_mut::<A, u32>(&mut v).copy_from_slice(&data);
            let r = RegisteredVec::register(v, HostRegisterFlags::DEFAULT);
            if let Some(b) = judge(&what, r, align, |b| host(b.as_ptr()))? {
                roundtrip(&what, &b, len, &data)?;
            }
        }
    }
    Ok(())
}

/// Where a program failed.
#[derive(Debug, Clone)]
pub struct Failure {
    pub phase: usize,
    pub thread: Option<usize>,
    pub op: Option<(usize, String)>,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.thread, &self.op) {
            (Some(t), Some((i, text))) => write!(
                f,
                "phase {}, thread {t}, operation {i} `{}`: {}",
                self.phase,
                text.trim(),
                self.message
            ),
            (Some(t), None) => write!(f, "phase {}, thread {t}: {}", self.phase, self.message),
            _ => write!(f, "after phase {}: {}", self.phase, self.message),
        }
    }
}

/// One thread's run of one phase: its slots back, and the operations executed or where it
/// failed.
type ThreadResult = (
    BTreeMap<SlotId, Option<Slot>>,
    Result<usize, (Option<usize>, String)>,
);

fn run_thread(
    env: &Env,
    t: usize,
    owned: BTreeMap<SlotId, Option<Slot>>,
    shared: &BTreeMap<SlotId, Slot>,
    ops: &[Op],
    rec: Option<&Mutex<Doing>>,
) -> ThreadResult {
    watch::set(rec, Doing::Setup);
    let local = match Local::new(env) {
        Ok(l) => l,
        Err(e) => return (owned, Err((None, e))),
    };
    let mut cx = Cx {
        env,
        t,
        owned,
        shared,
        local: &local,
        executed: 0,
        watch: rec,
        depth: 0,
    };
    let mut result = Ok(());
    for (i, op) in ops.iter().enumerate() {
        watch::enter_op(rec, 0, i);
        if let Err(e) = cx.op(op, None) {
            result = Err((Some(i), e));
            break;
        }
    }
    watch::set(rec, Doing::Finished);
    testing::fail_next_fence_records(0);
    let executed = cx.executed;
    (cx.owned, result.map(|()| executed))
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}

/// Runs `p`, noting in `progress` where it is (for the watchdog: see `watch`); returns the
/// operations executed, or the first failure. Every buffer is dropped before this returns.
pub fn run_program(env: &Env, p: &Program, progress: &Progress) -> Result<usize, Failure> {
    let mut slots: Vec<Option<Slot>> = (0..p.slots).map(|_| None).collect();
    let r = run_phases(env, p, progress, &mut slots);
    progress.stage(Stage::Dropping);
    drop(slots);
    r
}

fn run_phases(
    env: &Env,
    p: &Program,
    progress: &Progress,
    slots: &mut [Option<Slot>],
) -> Result<usize, Failure> {
    // Phase threads stay alive, parked, until the program's final checks are done: a thread
    // that exits drains its per-thread default stream (cuda-mem does so for threads that used
    // it), which would complete every hand-off of that stream to the next phase before it is
    // made, and hide a missing order. `release` lets them go.
    let release = (Mutex::new(false), std::sync::Condvar::new());
    let park = |release: &(Mutex<bool>, std::sync::Condvar)| {
        let (lock, cv) = release;
        let mut done = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !*done {
            done = cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    };
    let let_go = |release: &(Mutex<bool>, std::sync::Condvar)| {
        *release.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        release.1.notify_all();
    };
    std::thread::scope(|sc| {
        // The threads are let go on every way out, a panic here included (the scope would
        // otherwise wait for them for ever).
        struct LetGo<'a, F: Fn(&(Mutex<bool>, std::sync::Condvar))>(
            &'a (Mutex<bool>, std::sync::Condvar),
            F,
        );
        impl<F: Fn(&(Mutex<bool>, std::sync::Condvar))> Drop for LetGo<'_, F> {
            fn drop(&mut self) {
                (self.1)(self.0);
            }
        }
        let _go = LetGo(&release, let_go);
        run_phases_parked(env, p, progress, slots, sc, &release, &park)
    })
}

/// The phases of [`run_phases`], on threads of the scope `sc` that park on `release` (with
/// `park`) once their work is handed back.
fn run_phases_parked<'scope, 'env: 'scope>(
    env: &'env Env,
    p: &'env Program,
    progress: &'env Progress,
    slots: &mut [Option<Slot>],
    sc: &'scope std::thread::Scope<'scope, 'env>,
    release: &'env (Mutex<bool>, std::sync::Condvar),
    park: &'env (impl Fn(&(Mutex<bool>, std::sync::Condvar)) + Sync),
) -> Result<usize, Failure> {
    let threads = p.threads.max(1);
    let mut executed = 0;
    for (pi, phase) in p.phases.iter().enumerate() {
        progress.stage(Stage::Phase(pi));
        let mut owned: Vec<BTreeMap<SlotId, Option<Slot>>> =
            (0..threads).map(|_| BTreeMap::new()).collect();
        let mut shared = BTreeMap::new();
        for (i, o) in phase.owners.iter().enumerate().take(slots.len()) {
            let s = slots[i].take();
            match *o {
                Owner::Thread(t) => {
                    owned[usize::from(t) % threads].insert(i as SlotId, s);
                }
                Owner::Shared => {
                    if let Some(s) = s {
                        shared.insert(i as SlotId, s);
                    }
                }
            }
        }
        let shared = Arc::new(shared);
        let (tx, rx) = std::sync::mpsc::channel();
        for (t, own) in owned.into_iter().enumerate() {
            let ops: &'env [Op] = phase.threads.get(t).map_or(&[], |v| v.as_slice());
            let shared = shared.clone();
            let tx = tx.clone();
            let rec = progress.thread(t);
            sc.spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    run_thread(env, t, own, &shared, ops, rec)
                }));
                drop(shared);
                let _ = tx.send((t, r));
                // (The sender goes before parking: the phase waits for every result.)
                drop(tx);
                park(release);
            });
        }
        drop(tx);
        let mut results: Vec<Option<std::thread::Result<ThreadResult>>> =
            (0..threads).map(|_| None).collect();
        for _ in 0..threads {
            let Ok((t, r)) = rx.recv() else { break };
            results[t] = Some(r);
        }
        let mut failure = None;
        for (t, r) in results.into_iter().enumerate() {
            let Some(r) = r else { continue };
            match r {
                Ok((own, res)) => {
                    for (id, s) in own {
                        slots[usize::from(id)] = s;
                    }
                    match res {
                        Ok(n) => executed += n,
                        Err((op, message)) => {
                            failure.get_or_insert(Failure {
                                phase: pi,
                                thread: Some(t),
                                op: op.map(|i| (i, phase.threads[t][i].to_string())),
                                message,
                            });
                        }
                    }
                }
                Err(panic) => {
                    failure.get_or_insert(Failure {
                        phase: pi,
                        thread: Some(t),
                        op: None,
                        message: format!("the thread panicked: {}", panic_message(&*panic)),
                    });
                }
            }
        }
        // Every thread dropped its handle before handing its results back.
        let shared = Arc::try_unwrap(shared).unwrap_or_else(|_| unreachable!("shared slots"));
        for (id, s) in shared {
            slots[usize::from(id)] = Some(s);
        }
        if let Some(f) = failure {
            return Err(f);
        }
    }
    // The final state of every buffer, read the plain way (host slices wait for all writes,
    // copies are ordered after them).
    let last = p.phases.len().saturating_sub(1);
    for (i, s) in slots.iter().enumerate() {
        let Some(s) = s else { continue };
        progress.stage(Stage::FinalCheck(i));
        let check = || -> R {
            let _g = env.devs[s.dev].dev.guard().or_fail("Device::guard")?;
            let what = format!("final state of s{i} ({})", s.kind);
            let got = match host_slice(&s.buf) {
                Some(r) => r.or_fail(&what)?.to_vec(),
                None => {
                    let mut v = vec![0u32; s.len()];
                    each!(&s.buf, b => copy(&mut v, b)).or_fail(&what)?;
                    v
                }
            };
            compare(&what, 0, &got, &s.model)
        };
        check().map_err(|message| Failure {
            phase: last,
            thread: None,
            op: None,
            message,
        })?;
    }
    Ok(executed)
}
