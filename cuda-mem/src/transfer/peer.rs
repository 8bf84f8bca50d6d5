//! Several GPUs: peer access, copies between the device buffers of two GPUs, and a copy between
//! GPUs staged through pinned host memory in pipelined chunks, for pairs without peer access.
//!
//! | C++ | here |
//! |---|---|
//! | `cudaDeviceCanAccessPeer` | [`Device::can_access_peer`] |
//! | `cudaDeviceEnablePeerAccess` / `cudaDeviceDisablePeerAccess` | [`Device::enable_peer_access`] / [`Device::disable_peer_access`] |
//! | `cudaMemcpyPeer` / `cudaMemcpyPeerAsync` | [`copy_peer`] / [`copy_peer_async`] |
//! | D2H on one GPU, then H2D on the other | [`StagedCopy`] (both at once, chunk by chunk) |
//!
//! Every call here makes the device it needs current only for the call and restores the
//! caller's current device afterwards, on any thread.
//!
//! Peer copies work with or without peer access: without it the driver stages them through host
//! memory itself (tens of GB/s); with it they go over NVLink or PCIe peer-to-peer directly.
//! Both buffers' fences order the copy after conflicting pending work of other streams, on
//! either device, exactly as [`copy_async`](crate::copy_async) does on one device.

use std::mem::ManuallyDrop;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::contract::memory::sealed::Async;
use crate::contract::size::{self, fmt_bytes};
use crate::error::{check, Misuse, Result};
use crate::fence::{Access, Fence};
use crate::handles::devices::Device;
use crate::handles::event::Event;
use crate::handles::flags::HostAllocFlags;
use crate::handles::stream::Stream;
use crate::kinds::device::DeviceBuffer;
use crate::kinds::pinned::PinnedBuffer;
use crate::ops::copy::Plan;

impl Device {
    /// Whether this device can access memory of `peer` directly, once enabled
    /// (`cudaDeviceCanAccessPeer`). A device and itself is [`Misuse::InvalidArgument`].
    pub fn can_access_peer(self, peer: Device) -> Result<bool> {
        check_pair("Device::can_access_peer", self, peer)?;
        let mut can = 0;
        // SAFETY: valid out-pointer; both ordinals come from checked `Device` values.
        let code =
            unsafe { sys::cudaDeviceCanAccessPeer(&mut can, self.ordinal(), peer.ordinal()) };
        check(code, || {
            format!(
                "cudaDeviceCanAccessPeer(device {}, peer {})",
                self.ordinal(),
                peer.ordinal()
            )
        })?;
        Ok(can != 0)
    }

    /// Lets kernels and copies on this device access memory of `peer`
    /// (`cudaDeviceEnablePeerAccess`, with this device current for the call). Enabling access
    /// that is already enabled is not an error here: the runtime's
    /// `cudaErrorPeerAccessAlreadyEnabled` is answered `Ok` and cleared from the thread's
    /// last-error state. Access goes one way: enable it on both devices for both directions.
    pub fn enable_peer_access(self, peer: Device) -> Result<()> {
        self.set_peer_access(
            peer,
            "Device::enable_peer_access",
            "cudaDeviceEnablePeerAccess",
            sys::cudaError::cudaErrorPeerAccessAlreadyEnabled,
            // SAFETY: plain value arguments; flags must be 0.
            |p| unsafe { sys::cudaDeviceEnablePeerAccess(p, 0) },
        )
    }

    /// Revokes the access [`enable_peer_access`](Self::enable_peer_access) gave
    /// (`cudaDeviceDisablePeerAccess`). Disabling access that is not enabled is not an error
    /// (`cudaErrorPeerAccessNotEnabled` is answered `Ok` and cleared).
    ///
    /// Work already queued that relies on the access must have completed: copies through this
    /// crate do not rely on it (the driver stages them without it), kernels that dereference
    /// the peer's memory do.
    pub fn disable_peer_access(self, peer: Device) -> Result<()> {
        self.set_peer_access(
            peer,
            "Device::disable_peer_access",
            "cudaDeviceDisablePeerAccess",
            sys::cudaError::cudaErrorPeerAccessNotEnabled,
            // SAFETY: plain value argument.
            |p| unsafe { sys::cudaDeviceDisablePeerAccess(p) },
        )
    }

    /// Enable or disable: `call(peer)` on this device (made current for it), where the
    /// `already` answer means the access is already as asked, which is `Ok` here (and cleared
    /// from the thread's last-error state).
    fn set_peer_access(
        self,
        peer: Device,
        op: &'static str,
        name: &'static str,
        already: sys::cudaError_t,
        call: impl FnOnce(i32) -> sys::cudaError_t,
    ) -> Result<()> {
        check_pair(op, self, peer)?;
        let _g = self.guard()?;
        let code = call(peer.ordinal());
        if code == already {
            // SAFETY: no arguments; only resets the thread's last-error state.
            unsafe { sys::cudaGetLastError() };
            return Ok(());
        }
        check(code, || {
            format!(
                "{name}(peer {}) on device {}",
                peer.ordinal(),
                self.ordinal()
            )
        })
    }
}

/// Peer access is a relation between two different devices.
fn check_pair(op: &'static str, a: Device, b: Device) -> Result<()> {
    if a == b {
        return Err(Misuse::InvalidArgument {
            op,
            reason: format!(
                "device {} and its peer are the same device: peer access needs two",
                a.ordinal()
            ),
        }
        .into());
    }
    Ok(())
}

/// Copies all of `src` into `dst`, device buffers that may live on different devices
/// (`cudaMemcpyPeerAsync` on the legacy default stream of the source's device).
///
/// Like [`copy`](crate::copy) between two device buffers, this may return before the copy is
/// done, and is then recorded on both buffers' fences: host access, drops and asynchronous
/// work through this crate on any stream of either device wait for it. Lengths must match
/// ([`Misuse::LengthMismatch`]).
pub fn copy_peer<T: Pod>(dst: &mut DeviceBuffer<T>, src: &DeviceBuffer<T>) -> Result<()> {
    size::same_len(dst.len(), src.len())?;
    copy_peer_range(dst, 0, src, 0, src.len())
}

/// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]`; see [`copy_peer`].
pub fn copy_peer_range<T: Pod>(
    dst: &mut DeviceBuffer<T>,
    dst_offset: usize,
    src: &DeviceBuffer<T>,
    src_offset: usize,
    count: usize,
) -> Result<()> {
    // The source device's legacy stream: `copy_peer_range_async` makes that device current.
    let legacy = Stream::legacy_on(src.device().ordinal());
    copy_peer_range_async(dst, dst_offset, src, src_offset, count, &legacy)
}

/// Queues a copy of all of `src` into `dst`, device buffers that may live on different
/// devices, on `stream` (`cudaMemcpyPeerAsync`), and returns at once.
///
/// The stream may belong to either device (the source's is usual: its copy engine pulls or
/// pushes). Both buffers record the copy; conflicting pending work on either, from any stream
/// of either device, is ordered before it on the device, as for
/// [`copy_async`](crate::copy_async). A legacy default stream is used on its own device, made
/// current for the call.
pub fn copy_peer_async<T: Pod>(
    dst: &mut DeviceBuffer<T>,
    src: &DeviceBuffer<T>,
    stream: &Stream,
) -> Result<()> {
    size::same_len(dst.len(), src.len())?;
    copy_peer_range_async(dst, 0, src, 0, src.len(), stream)
}

/// Queues a copy of `count` elements from `src[src_offset..]` to `dst[dst_offset..]` on
/// `stream`; see [`copy_peer_async`].
pub fn copy_peer_range_async<T: Pod>(
    dst: &mut DeviceBuffer<T>,
    dst_offset: usize,
    src: &DeviceBuffer<T>,
    src_offset: usize,
    count: usize,
    stream: &Stream,
) -> Result<()> {
    let Plan {
        d,
        s,
        bytes,
        dr,
        sr,
        ..
    } = Plan::new(dst, dst_offset, src, src_offset, count)?;
    if bytes == 0 {
        return Ok(());
    }
    let (dd, sd) = (dst.device().ordinal(), src.device().ordinal());
    // The null handle means the legacy stream of the current device: make the stream's own
    // device current (owned streams carry their context and need nothing).
    let _g = stream.inner().enter()?;
    // Marked when these drop, after the copy is queued below.
    Fence::check_queue(stream)?;
    let _src_use = src.async_fence().begin_checked(stream, sr, Access::Read)?;
    let _dst_use = dst.async_fence().begin_checked(stream, dr, Access::Write)?;
    // SAFETY: both ranges lie inside live device allocations of the devices named
    // (`Plan::new`); `dst` is borrowed mutably. The copy outlives this call, which is sound
    // because both buffers wait for the uses marked above before host access or free, and
    // pending conflicting work was ordered before it by `begin`.
    let code =
        unsafe { sys::cudaMemcpyPeerAsync(d.cast(), dd, s.cast(), sd, bytes, stream.as_raw()) };
    check(code, || {
        format!(
            "cudaMemcpyPeerAsync({d:p} on device {dd}, {s:p} on device {sd}, {}, stream {:p})",
            fmt_bytes(bytes),
            stream.as_raw()
        )
    })
}

/// A copy between the device buffers of two GPUs through pinned host memory, for GPUs without
/// peer access: the source GPU copies a chunk to host memory while the destination GPU copies
/// the previous one in, so the two links work at once instead of one after the other.
///
/// It owns a ring of `slots` chunks of PORTABLE pinned memory (pinned for every device), a
/// non-blocking stream on each device, and one event per slot and device: the source stream
/// waits until the destination has read a slot before filling it again, the destination until
/// the source has filled it. The host only queues; [`copy`](Self::copy) returns at once, and
/// both buffers record the work (host access, drops and later work on them wait for it).
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{Device, DeviceBuffer, StagedCopy};
/// let (d0, d1) = (Device::get(0)?, Device::get(1)?);
/// let src = { let _g = d0.guard()?; DeviceBuffer::<u32>::from_slice(&[7; 1 << 20])? };
/// let mut dst = DeviceBuffer::<u32>::uninit_on(d1, 1 << 20)?;
/// let mut staged = StagedCopy::new(d0, d1, 8 << 20, 4)?;
/// staged.copy(&mut dst, &src)?;
/// assert_eq!(dst.to_vec()?[0], 7); // waits for the copy
/// # Ok(()) }
/// ```
pub struct StagedCopy {
    src_device: Device,
    dst_device: Device,
    chunk: usize,
    /// Freed in `drop`, only after both streams are idle (leaked if that cannot be known).
    staging: ManuallyDrop<PinnedBuffer<u8>>,
    /// Device-to-host copies, on the source device.
    d2h: Stream,
    /// Host-to-device copies, on the destination device.
    h2d: Stream,
    /// Per slot: the D2H that filled it (source device).
    filled: Vec<Event>,
    /// Per slot: the H2D that read it (destination device).
    drained: Vec<Event>,
    /// The slot the next chunk uses.
    next: usize,
    /// A copy failed midway and the streams could not be synchronized: the slots' events may
    /// not describe what was queued, so no further copy is accepted.
    poisoned: bool,
}

impl std::fmt::Debug for StagedCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedCopy")
            .field("src_device", &self.src_device.ordinal())
            .field("dst_device", &self.dst_device.ordinal())
            .field("chunk", &self.chunk)
            .field("slots", &self.filled.len())
            .finish()
    }
}

impl StagedCopy {
    /// Chunk size of [`StagedCopy::with_defaults`]: large enough that the per-chunk cost (four
    /// runtime calls, two cross-device waits) is noise, small enough to fill the pipe early.
    pub const DEFAULT_CHUNK: usize = 8 << 20;
    /// Slot count of [`StagedCopy::with_defaults`].
    pub const DEFAULT_SLOTS: usize = 4;

    /// A staged copier from `src` to `dst` with a ring of `slots` chunks of `chunk_bytes`
    /// bytes each (`slots >= 2`, `chunk_bytes > 0`: [`Misuse::InvalidArgument`] otherwise).
    pub fn new(src: Device, dst: Device, chunk_bytes: usize, slots: usize) -> Result<Self> {
        if chunk_bytes == 0 || slots < 2 {
            return Err(Misuse::InvalidArgument {
                op: "StagedCopy::new",
                reason: format!(
                    "needs chunk_bytes > 0 and at least 2 slots, got {chunk_bytes} bytes x \
                     {slots} slots"
                ),
            }
            .into());
        }
        let total = chunk_bytes.checked_mul(slots).ok_or(Misuse::SizeOverflow {
            len: slots,
            elem_size: chunk_bytes,
        })?;
        let staging = PinnedBuffer::<u8>::zeroed(total, HostAllocFlags::PORTABLE)?;
        let d2h = Stream::on(src, true)?;
        let h2d = Stream::on(dst, true)?;
        let filled = (0..slots)
            .map(|_| Event::on(src))
            .collect::<Result<Vec<_>>>()?;
        let drained = (0..slots)
            .map(|_| Event::on(dst))
            .collect::<Result<Vec<_>>>()?;
        Ok(StagedCopy {
            src_device: src,
            dst_device: dst,
            chunk: chunk_bytes,
            staging: ManuallyDrop::new(staging),
            d2h,
            h2d,
            filled,
            drained,
            next: 0,
            poisoned: false,
        })
    }

    /// [`StagedCopy::new`] with [`DEFAULT_CHUNK`](Self::DEFAULT_CHUNK) and
    /// [`DEFAULT_SLOTS`](Self::DEFAULT_SLOTS).
    pub fn with_defaults(src: Device, dst: Device) -> Result<Self> {
        Self::new(src, dst, Self::DEFAULT_CHUNK, Self::DEFAULT_SLOTS)
    }

    /// Queues a copy of all of `src` (on the source device) into `dst` (on the destination
    /// device) and returns at once. Lengths must match ([`Misuse::LengthMismatch`]), devices
    /// too ([`Misuse::DeviceMismatch`]).
    pub fn copy<T: Pod>(&mut self, dst: &mut DeviceBuffer<T>, src: &DeviceBuffer<T>) -> Result<()> {
        size::same_len(dst.len(), src.len())?;
        self.copy_range(dst, 0, src, 0, src.len())
    }

    /// Queues a copy of `count` elements from `src[src_offset..]` to `dst[dst_offset..]`;
    /// see [`copy`](Self::copy).
    pub fn copy_range<T: Pod>(
        &mut self,
        dst: &mut DeviceBuffer<T>,
        dst_offset: usize,
        src: &DeviceBuffer<T>,
        src_offset: usize,
        count: usize,
    ) -> Result<()> {
        if self.poisoned {
            return Err(Misuse::InvalidArgument {
                op: "StagedCopy::copy",
                reason: "an earlier copy failed midway and its streams could not be \
                         synchronized; make a new StagedCopy"
                    .into(),
            }
            .into());
        }
        for (op, expected, found) in [
            (
                "StagedCopy: source buffer",
                self.src_device.ordinal(),
                src.device().ordinal(),
            ),
            (
                "StagedCopy: destination buffer",
                self.dst_device.ordinal(),
                dst.device().ordinal(),
            ),
        ] {
            crate::handles::devices::require_same(op, expected, found)?;
        }
        let Plan {
            d,
            s,
            bytes,
            dr,
            sr,
            ..
        } = Plan::new(dst, dst_offset, src, src_offset, count)?;
        if bytes == 0 {
            return Ok(());
        }
        let base = self.staging.as_mut_ptr();
        let _src_use = src.async_fence().begin(&self.d2h, sr, Access::Read)?;
        let _dst_use = dst.async_fence().begin(&self.h2d, dr, Access::Write)?;
        let ring = Ring {
            base,
            chunk: self.chunk,
            d2h: &self.d2h,
            h2d: &self.h2d,
            filled: &self.filled,
            drained: &self.drained,
        };
        let result = ring.queue(&mut self.next, d.cast(), s.cast(), bytes);
        if result.is_err() {
            // A slot's events may not describe what was queued: let everything queued finish
            // so that no later chunk can overwrite a slot still being read; if that cannot be
            // known, refuse every later copy.
            let a = self.d2h.synchronize();
            let b = self.h2d.synchronize();
            self.poisoned = a.is_err() || b.is_err();
        }
        result
    }

    /// Waits until every copy queued so far has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.d2h.synchronize()?;
        self.h2d.synchronize()
    }

    /// The chunk size in bytes.
    pub fn chunk_bytes(&self) -> usize {
        self.chunk
    }

    /// The number of chunks in the ring.
    pub fn slots(&self) -> usize {
        self.filled.len()
    }
}

/// The parts of a [`StagedCopy`] that queueing chunks uses, borrowed beside the fence uses.
struct Ring<'a> {
    base: *mut u8,
    chunk: usize,
    d2h: &'a Stream,
    h2d: &'a Stream,
    filled: &'a [Event],
    drained: &'a [Event],
}

impl Ring<'_> {
    fn queue(&self, next: &mut usize, d: *mut u8, s: *const u8, bytes: usize) -> Result<()> {
        let base = self.base;
        let slots = self.filled.len();
        let mut off = 0;
        while off < bytes {
            let n = self.chunk.min(bytes - off);
            let k = *next;
            // In bounds: `k < slots`, `n <= chunk`, and the ring holds `slots * chunk` bytes.
            let stage = base.wrapping_add(k * self.chunk);
            let (from, to) = (s.wrapping_add(off), d.wrapping_add(off));
            // The slot's previous reader (an H2D of an earlier chunk) must be done.
            self.drained[k].wait_on(self.d2h)?;
            // SAFETY: `from..from+n` lies in the source range and `stage..stage+n` in the ring
            // (see above). The source is recorded on its fence by the caller's use; the ring is
            // touched only by these streams, ordered by the slot events, and freed only after
            // both streams are idle (`Drop`).
            let code = unsafe {
                sys::cudaMemcpyAsync(
                    stage.cast(),
                    from.cast(),
                    n,
                    sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
                    self.d2h.as_raw(),
                )
            };
            check(code, || {
                format!(
                    "cudaMemcpyAsync({stage:p}, {from:p}, {}, DeviceToHost)",
                    fmt_bytes(n)
                )
            })?;
            self.filled[k].record(self.d2h)?;
            self.filled[k].wait_on(self.h2d)?;
            // SAFETY: as above, for the destination range (recorded by the caller's use) and
            // the slot just filled, which the wait above orders before this read.
            let code = unsafe {
                sys::cudaMemcpyAsync(
                    to.cast(),
                    stage.cast_const().cast(),
                    n,
                    sys::cudaMemcpyKind::cudaMemcpyHostToDevice,
                    self.h2d.as_raw(),
                )
            };
            check(code, || {
                format!(
                    "cudaMemcpyAsync({to:p}, {stage:p}, {}, HostToDevice)",
                    fmt_bytes(n)
                )
            })?;
            self.drained[k].record(self.h2d)?;
            *next = (k + 1) % slots;
            off += n;
        }
        Ok(())
    }
}

impl Drop for StagedCopy {
    fn drop(&mut self) {
        // The ring may be in use by queued copies until both streams are idle. If that cannot
        // be known, leak it rather than free memory a copy engine may still write.
        if self.synchronize().is_ok() {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.staging) };
        }
    }
}
