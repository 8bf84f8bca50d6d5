//! The driver's copies and memsets between every kind of memory, typed and length-checked
//! (the operations layer; [`copy`](crate::copy), which may stage large pageable copies
//! instead, is the transfer policy in `transfer/`).
//!
//! [`copy`](crate::copy) works between any two kinds, ordinary host slices included. [`copy_async`]
//! queues the copy on a stream and returns at once; it accepts only memory that tracks its
//! pending work (device, pinned, mapped, registered `Vec`, managed), never a plain slice or
//! `Vec`, whose owner could free or change it while the copy runs.
//!
//! The `cudaMemcpyKind` follows from the two sides: host and device memory give
//! `cudaMemcpyHostToDevice`, `DeviceToHost`, `DeviceToDevice` or `HostToHost`; managed memory
//! (which lives on either side) gives `cudaMemcpyDefault`, resolved by unified addressing.
//!
//! What "synchronous" means for [`copy`](crate::copy) is on its docs.

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::contract::memory::{sealed, AsyncMemory, Loc, Memory, MemoryMut};
use crate::contract::size;
use crate::error::{check, Result};
use crate::fence::{Access, Fence};
use crate::handles::devices::current_ordinal;
use crate::handles::pointer::is_unregistered_host;
use crate::handles::stream::{sync_stream, Stream};
use crate::kinds::device::DeviceBuffer;

/// [`copy_range`](crate::copy_range) by the driver's path alone (`cudaMemcpy`), never staged, of the copy that
/// `plan` ([`Plan::new`] of these `dst` and `src`) checked already.
pub(crate) fn copy_planned<T, D, S>(dst: &mut D, src: &S, plan: Plan<T>) -> Result<()>
where
    T: Pod,
    D: MemoryMut<T> + ?Sized,
    S: Memory<T> + ?Sized,
{
    if plan.bytes == 0 {
        return Ok(());
    }
    dst.check_device_writable("copy")?;
    let Plan {
        d,
        s,
        bytes,
        kind,
        dr,
        sr,
    } = plan;
    // The runtime queues the copy on the legacy stream of the current device; run it on the
    // device of the device-memory side (so that the recorded work is the work queued), and
    // give the caller back whatever device was current.
    let device = match (dst.loc(), src.loc()) {
        (Loc::Device, _) => dst.device_ordinal(),
        (_, Loc::Device) => src.device_ordinal(),
        _ => None,
    };
    let legacy = Stream::legacy_on(device.unwrap_or_else(current_ordinal));
    // (Without a device side, the legacy stream is the current device's: nothing to enter.)
    let _guard = match device {
        Some(_) => legacy.inner().enter()?,
        None => None,
    };
    prepare_sync(src.fence(), src.loc(), &legacy, sr, Access::Read)?;
    prepare_sync(dst.fence(), dst.loc(), &legacy, dr, Access::Write)?;
    // Between pageable memory and the device, `cudaMemcpyAsync` on the same legacy stream:
    // it gives the same guarantees at return (a pageable source has been staged, a pageable
    // destination written: the runtime's "API synchronization behavior"), but does not first
    // wait for the stream as `cudaMemcpy` does, so back-to-back small copies overlap their
    // transfers with the next call's staging (as cudarc's and C++'s async copies from
    // pageable memory do). Every other pair keeps `cudaMemcpy`.
    //
    // A plain slice is `Loc::Pageable` whatever it points to, and for memory the driver knows
    // (a slice of a pinned, mapped, registered or managed buffer) `cudaMemcpyAsync` is fully
    // asynchronous: it would return before the copy read or wrote the slice, with nothing
    // tracking it. So the host pointer is asked first (`cudaPointerGetAttributes`, a fraction
    // of the copy's cost) and only truly pageable memory takes this path.
    let pageable = match (src.loc(), dst.loc()) {
        (Loc::Pageable, Loc::Device) => is_unregistered_host(s),
        (Loc::Device, Loc::Pageable) => is_unregistered_host(d),
        _ => false,
    };
    // SAFETY: `Plan::new` checked that both ranges lie inside live allocations; `dst` is
    // borrowed mutably so nothing else reads or writes it, and pending GPU work on both is
    // ordered before the copy on the device. `T: Pod` makes any bytes written valid. If the
    // copy outlives this call, it is recorded or completed below before the borrows end
    // (queued on `legacy`, the stream the marks below name).
    let code = unsafe {
        if pageable {
            sys::cudaMemcpyAsync(d.cast(), s.cast(), bytes, kind, legacy.as_raw())
        } else {
            sys::cudaMemcpy(d.cast(), s.cast(), bytes, kind)
        }
    };
    let result = check(code, || {
        format!(
            "{}({d:p}, {s:p}, {bytes} bytes, {})",
            if pageable {
                "cudaMemcpyAsync"
            } else {
                "cudaMemcpy"
            },
            Loc::kind_name(kind)
        )
    });
    if let Some(src_may_run) = Loc::sync_copy_may_run_on(src.loc(), dst.loc()) {
        let src_fence = src.fence().filter(|_| src_may_run);
        match dst.fence() {
            Some(df) if !src_may_run || src_fence.is_some() => {
                df.mark(&legacy, dr, Access::Write);
                if let Some(sf) = src_fence {
                    sf.mark(&legacy, sr, Access::Read);
                }
            }
            // A side without a fence: finish the copy before its borrow ends. (Should that
            // fail, the context is lost with a sticky error, and with it the copy.)
            _ => sync_stream(legacy.inner())?,
        }
    }
    result
}

/// Orders a synchronous copy after pending work on one side. Device memory is touched only
/// by the copy engine, in the legacy default stream's order, so a device-side wait suffices;
/// host and managed memory may be touched by the CPU inside `cudaMemcpy` (host-to-host copies,
/// staging, page migration), so the host waits.
fn prepare_sync(
    fence: Option<&Fence>,
    loc: Loc,
    legacy: &Stream,
    range: (usize, usize),
    access: Access,
) -> Result<()> {
    match fence {
        None => Ok(()),
        Some(f) if loc == Loc::Device => f.order(legacy, range, access),
        Some(f) => f.host_wait(access),
    }
}

/// The fence byte range of `bytes` bytes from element `offset` of memory that starts at byte
/// `base` of its fence.
fn plan_range<T>(base: usize, offset: usize, bytes: usize) -> (usize, usize) {
    // Cannot overflow: `Plan::new` checked that the range lies inside an allocation.
    let start = base + offset * std::mem::size_of::<T>();
    (start, start + bytes)
}

/// The checked pointers, size and kind of one copy, and the byte ranges it covers in the
/// destination's and the source's fences.
pub(crate) struct Plan<T> {
    pub(crate) d: *mut T,
    pub(crate) s: *const T,
    pub(crate) bytes: usize,
    pub(crate) kind: sys::cudaMemcpyKind,
    pub(crate) dr: (usize, usize),
    pub(crate) sr: (usize, usize),
}

impl<T: Pod> Plan<T> {
    pub(crate) fn new<D, S>(
        dst: &mut D,
        dst_offset: usize,
        src: &S,
        src_offset: usize,
        count: usize,
    ) -> Result<Self>
    where
        D: sealed::RawMut<T> + ?Sized,
        S: sealed::Raw<T> + ?Sized,
    {
        size::range(dst_offset, count, dst.raw_len())?;
        size::range(src_offset, count, src.raw_len())?;
        let bytes = size::byte_len::<T>(count)?;
        let kind = Loc::copy_kind(src.loc(), dst.loc());
        // `wrapping_add` keeps this free of `unsafe`; the offsets are in bounds (checked above),
        // so the results are the in-bounds element addresses.
        Ok(Plan {
            d: dst.raw_mut_ptr().wrapping_add(dst_offset),
            s: src.raw_ptr().wrapping_add(src_offset),
            bytes,
            kind,
            dr: plan_range::<T>(dst.fence_base(), dst_offset, bytes),
            sr: plan_range::<T>(src.fence_base(), src_offset, bytes),
        })
    }
}

/// Queues a copy of all of `src` into `dst` on `stream` and returns at once
/// (`cudaMemcpyAsync`).
///
/// Both buffers record that the stream uses them: host access to either ([`as_slice`] and
/// friends), a synchronous copy, and their drop all wait for this copy first, so no safe code
/// can see or free the memory while the copy runs. Conflicting work already pending on either
/// buffer from another stream (a write, or a read before this copy's write) is ordered before
/// this copy on the device; work on the same stream and work on other ranges never waits.
///
/// [`as_slice`]: crate::PinnedBuffer::as_slice
pub fn copy_async<T, D, S>(dst: &mut D, src: &S, stream: &Stream) -> Result<()>
where
    T: Pod,
    D: MemoryMut<T> + AsyncMemory<T> + ?Sized,
    S: AsyncMemory<T> + ?Sized,
{
    size::same_len(dst.raw_len(), src.raw_len())?;
    copy_range_async(dst, 0, src, 0, src.raw_len(), stream)
}

/// Queues a copy of `count` elements from `src[src_offset..]` to `dst[dst_offset..]` on
/// `stream`; see [`copy_async`].
pub fn copy_range_async<T, D, S>(
    dst: &mut D,
    dst_offset: usize,
    src: &S,
    src_offset: usize,
    count: usize,
    stream: &Stream,
) -> Result<()>
where
    T: Pod,
    D: MemoryMut<T> + AsyncMemory<T> + ?Sized,
    S: AsyncMemory<T> + ?Sized,
{
    let Plan {
        d,
        s,
        bytes,
        kind,
        dr,
        sr,
    } = Plan::new(dst, dst_offset, src, src_offset, count)?;
    if bytes == 0 {
        return Ok(());
    }
    dst.check_device_writable("copy_async")?;
    src.check_stream(stream, "copy_async")?;
    dst.check_stream(stream, "copy_async")?;
    // Marked when these drop, after the copy is queued below. (The stream is checked once
    // for both.)
    Fence::check_queue(stream)?;
    let _src_use = src.async_fence().begin_checked(stream, sr, Access::Read)?;
    let _dst_use = dst.async_fence().begin_checked(stream, dr, Access::Write)?;
    // SAFETY: the ranges lie inside live allocations (`Plan::new`). The copy outlives this
    // call, which is sound because both sides are `AsyncMemory`: the uses above mark it on
    // their fences, and the owners wait for it before host access or free (for memory
    // borrowed by a `scope`, the scope waits before it returns); pending conflicting work was
    // ordered before it by `begin`.
    let code = unsafe { sys::cudaMemcpyAsync(d.cast(), s.cast(), bytes, kind, stream.as_raw()) };
    // Both ends' lines at once (the call evicted them).
    _src_use.prefetch();
    _dst_use.prefetch();
    checked(code, || {
        format!(
            "cudaMemcpyAsync({d:p}, {s:p}, {bytes} bytes, {}, stream {:p})",
            Loc::kind_name(kind),
            stream.as_raw()
        )
    })
}

/// Queues a fill of every byte of `dst` with `byte` on `stream` (`cudaMemsetAsync`): any
/// memory asynchronous work may use, views included (`dev.slice_mut(a..b)?`). Ordered and
/// recorded like [`copy_async`]; the runtime refuses memory the device cannot address.
pub fn memset_async<T, D>(dst: &mut D, byte: u8, stream: &Stream) -> Result<()>
where
    T: Pod,
    D: MemoryMut<T> + AsyncMemory<T> + ?Sized,
{
    let bytes = size::byte_len::<T>(dst.raw_len())?;
    if bytes == 0 {
        return Ok(());
    }
    let guard = crate::ops::access::write_guard(dst, stream, "memset_async")?;
    let p = guard.as_mut_ptr();
    // SAFETY: `p` is the device address of `bytes` bytes of `dst`, borrowed mutably through the
    // guard, which ordered the fill after conflicting work and records it (the owner waits for
    // it before host access or free).
    let code = unsafe { sys::cudaMemsetAsync(p.cast(), byte.into(), bytes, stream.as_raw()) };
    checked(code, || {
        format!(
            "cudaMemsetAsync({p:p}, {byte}, {bytes} bytes, stream {:p})",
            stream.as_raw()
        )
    })
}

/// [`check`] for the hot path: the success test inline, the failure (the runtime's last error
/// cleared, the message formatted) out of line.
#[inline(always)]
fn checked(code: sys::cudaError_t, call: impl FnOnce() -> String) -> Result<()> {
    if code == sys::cudaError::cudaSuccess {
        Ok(())
    } else {
        failed(code, call)
    }
}

#[cold]
#[inline(never)]
fn failed(code: sys::cudaError_t, call: impl FnOnce() -> String) -> Result<()> {
    check(code, call)
}

/// The device buffer's asynchronous fill: [`memset_async`] on it.
impl<T: Pod> DeviceBuffer<T> {
    /// Queues a byte fill on `stream` (`cudaMemsetAsync`); the buffer records the stream.
    pub fn memset_async(&mut self, byte: u8, stream: &Stream) -> Result<()> {
        memset_async(self, byte, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::cudaMemcpyKind as K;

    #[test]
    fn copy_kind_follows_the_sides() {
        let cases = [
            (Loc::Pinned, Loc::Device, K::cudaMemcpyHostToDevice),
            (Loc::Pageable, Loc::Device, K::cudaMemcpyHostToDevice),
            (Loc::Device, Loc::Pinned, K::cudaMemcpyDeviceToHost),
            (Loc::Device, Loc::Device, K::cudaMemcpyDeviceToDevice),
            (Loc::Pinned, Loc::Pageable, K::cudaMemcpyHostToHost),
            (Loc::Managed, Loc::Pinned, K::cudaMemcpyDefault),
            (Loc::Device, Loc::Managed, K::cudaMemcpyDefault),
        ];
        for (s, d, k) in cases {
            assert_eq!(Loc::copy_kind(s, d), k, "{s:?} -> {d:?}");
        }
        assert_eq!(Loc::kind_name(K::cudaMemcpyDefault), "Default");
    }

    #[test]
    fn the_copies_cudamemcpy_may_leave_running_are_known() {
        // Per the runtime's API synchronization behavior.
        assert_eq!(
            Loc::sync_copy_may_run_on(Loc::Device, Loc::Device),
            Some(true)
        );
        assert_eq!(
            Loc::sync_copy_may_run_on(Loc::Pageable, Loc::Device),
            Some(false)
        );
        assert_eq!(
            Loc::sync_copy_may_run_on(Loc::Managed, Loc::Pinned),
            Some(true)
        );
        assert_eq!(
            Loc::sync_copy_may_run_on(Loc::Pinned, Loc::Device),
            Some(false)
        );
        assert_eq!(Loc::sync_copy_may_run_on(Loc::Device, Loc::Pageable), None);
        assert_eq!(Loc::sync_copy_may_run_on(Loc::Pinned, Loc::Pinned), None);
    }

    #[test]
    fn plans_check_ranges_before_any_pointer_use() {
        let mut dst = vec![0u32; 4];
        let src = vec![1u32; 8];
        let p = Plan::new(&mut dst, 1, &src, 5, 3).unwrap();
        assert_eq!(p.bytes, 12);
        assert_eq!(p.d as usize, dst.as_ptr() as usize + 4);
        assert_eq!(p.s as usize, src.as_ptr() as usize + 20);
        assert_eq!((p.dr, p.sr), ((4, 16), (20, 32)));
        assert!(Plan::new(&mut dst, 2, &src, 0, 3).is_err());
        assert!(Plan::new(&mut dst, 0, &src, 6, 3).is_err());
        assert!(Plan::new(&mut dst, usize::MAX, &src, 0, 1).is_err());
        assert_eq!(plan_range::<u32>(0, 5, 12), (20, 32));
        assert_eq!(plan_range::<u32>(100, 5, 12), (120, 132));
    }
}
