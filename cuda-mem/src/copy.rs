//! Copies between every kind of memory, typed and length-checked.
//!
//! [`copy`] works between any two kinds, ordinary host slices included. [`copy_async`]
//! queues the copy on a stream and returns at once; it accepts only memory that tracks its
//! pending work (device, pinned, mapped, registered `Vec`, managed), never a plain slice or
//! `Vec`, whose owner could free or change it while the copy runs.
//!
//! The `cudaMemcpyKind` follows from the two sides: host and device memory give
//! `cudaMemcpyHostToDevice`, `DeviceToHost`, `DeviceToDevice` or `HostToHost`; managed memory
//! (which lives on either side) gives `cudaMemcpyDefault`, resolved by unified addressing.
//!
//! # What "synchronous" means here
//!
//! `cudaMemcpy` may return before the copy is done: device-to-device copies, copies from
//! host memory to the device (once the source is staged: pageable memory, and pinned memory
//! not pinned for the current device's context), and copies that involve managed memory. [`copy`] keeps the C++ cost of those (no extra wait), and makes the result safe to
//! rely on instead: the copy is **recorded** on the fences of the buffers it may still touch,
//! as work of the legacy default stream, so that host access to them, their drop, and any
//! asynchronous work through this crate on any stream (non-blocking ones included) are ordered
//! after it. Where a side has no fence (a plain slice or `Vec`) the copy is **completed**
//! instead (`cudaStreamSynchronize` on the legacy stream) before `copy` returns. Every other
//! copy is complete when `cudaMemcpy` returns.

use std::mem::size_of;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::devices::current_ordinal;
use crate::error::{check, Result};
use crate::fence::{Access, Fence};
use crate::size;
use crate::stream::{sync_stream, Stream};

/// Where a kind of memory lives, which picks the `cudaMemcpyKind` of a copy and whether
/// `cudaMemcpy` may return before it is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// Ordinary host memory (`Vec`, slices): the driver stages copies through its own buffer.
    Pageable,
    /// Page-locked host memory: pinned, mapped, registered.
    Pinned,
    /// Device memory.
    Device,
    /// Managed memory, which migrates between host and device.
    Managed,
}

impl Loc {
    fn is_host(self) -> bool {
        matches!(self, Loc::Pageable | Loc::Pinned)
    }

    /// The copy kind for a copy from `src` to `dst`.
    pub(crate) fn copy_kind(src: Loc, dst: Loc) -> sys::cudaMemcpyKind {
        use sys::cudaMemcpyKind as K;
        match (src, dst) {
            (Loc::Managed, _) | (_, Loc::Managed) => K::cudaMemcpyDefault,
            (s, d) if s.is_host() && d.is_host() => K::cudaMemcpyHostToHost,
            (s, Loc::Device) if s.is_host() => K::cudaMemcpyHostToDevice,
            (Loc::Device, d) if d.is_host() => K::cudaMemcpyDeviceToHost,
            _ => K::cudaMemcpyDeviceToDevice,
        }
    }

    /// The kind's name as the C API spells it, for messages.
    fn kind_name(kind: sys::cudaMemcpyKind) -> &'static str {
        use sys::cudaMemcpyKind as K;
        match kind {
            K::cudaMemcpyHostToHost => "HostToHost",
            K::cudaMemcpyHostToDevice => "HostToDevice",
            K::cudaMemcpyDeviceToHost => "DeviceToHost",
            K::cudaMemcpyDeviceToDevice => "DeviceToDevice",
            _ => "Default",
        }
    }

    /// Whether `cudaMemcpy` from `src` to `dst` may return before the copy is done (the
    /// runtime's "API synchronization behavior"), and whether the source may still be read
    /// then (a pageable source is staged before the call returns).
    fn sync_copy_may_run_on(src: Loc, dst: Loc) -> Option<bool> {
        match (src, dst) {
            (Loc::Managed, _) | (_, Loc::Managed) => Some(true),
            (Loc::Device, Loc::Device) => Some(true),
            // Pageable sources are staged before the call returns; pinned ones too when the
            // memory is not pinned for this device's context (registered without PORTABLE,
            // used from another device), so the destination may still be written.
            (Loc::Pageable | Loc::Pinned, Loc::Device) => Some(false),
            _ => None,
        }
    }
}

pub(crate) mod sealed {
    use super::Loc;
    use crate::error::Result;
    use crate::fence::Fence;
    use crate::stream::Stream;

    /// The raw view of a memory kind that copies need. Sealed: implemented in this crate only.
    pub trait Raw<T> {
        /// Address of the first element, as the copy engine sees it.
        fn raw_ptr(&self) -> *const T;
        /// Length in elements.
        fn raw_len(&self) -> usize;
        /// Where the memory lives.
        fn loc(&self) -> Loc;
        /// The pending-work fence, for kinds that track it.
        fn fence(&self) -> Option<&Fence>;
        /// Where this memory starts in its fence's byte ranges: 0 for a buffer, the view's
        /// byte offset for a view.
        fn fence_base(&self) -> usize {
            0
        }
        /// The device that device memory lives on (`None` for other kinds).
        fn device_ordinal(&self) -> Option<i32> {
            None
        }
        /// Refuses work on `stream` that the memory's state forbids (managed memory attached
        /// to another stream on a device without concurrent managed access).
        fn check_stream(&self, _stream: &Stream, _op: &'static str) -> Result<()> {
            Ok(())
        }
    }

    /// Writable memory.
    pub trait RawMut<T>: Raw<T> {
        /// Writable address of the first element.
        fn raw_mut_ptr(&mut self) -> *mut T;
        /// Refuses device writes the memory does not allow (`READ_ONLY` registrations).
        fn check_device_writable(&self, _op: &'static str) -> Result<()> {
            Ok(())
        }
    }

    /// Memory whose host address ([`Raw::raw_ptr`]) the host may use once the fence allows:
    /// pinned, mapped, managed and registered memory, and views of them. Implemented in this
    /// crate only: an impl promises that `raw_ptr()` points to `raw_len()` initialised
    /// elements that the host can access, alive while `self` is, and that host access needs
    /// nothing but the fence's wait and [`check_host`](Host::check_host).
    pub trait Host<T>: Async<T> {
        /// Refuses host access the memory's state forbids (managed memory on a device without
        /// concurrent managed access).
        fn check_host(&self) -> Result<()> {
            Ok(())
        }
    }

    /// Memory whose owner waits for recorded work before host access or free, and which no
    /// safe code can free while that work runs. Implemented in this crate only: an impl
    /// carries that promise.
    pub trait Async<T>: Raw<T> {
        /// The address kernels use, for [`DevicePtr`](crate::DevicePtr).
        fn device_addr(&self) -> Result<*const T>;
        /// The fence (every such kind has one).
        fn async_fence(&self) -> &Fence;
    }
}

/// Memory a copy can read: any buffer of this crate, or a host slice (`[T]`, `Vec<T>`).
pub trait Memory<T>: sealed::Raw<T> {}
impl<T, M: sealed::Raw<T> + ?Sized> Memory<T> for M {}

/// Memory a copy can write.
pub trait MemoryMut<T>: Memory<T> + sealed::RawMut<T> {}
impl<T, M: sealed::RawMut<T> + ?Sized> MemoryMut<T> for M {}

/// Memory that asynchronous work may use: it tracks pending work and waits for it before host
/// access or free, and cannot be freed by safe code while that work runs. Ordinary slices and
/// `Vec`s are not: use a pinned buffer or a [`RegisteredVec`](crate::RegisteredVec).
///
/// The trait is sealed, because an implementation carries that promise:
///
/// ```compile_fail,E0277
/// #[derive(Clone, Copy)]
/// #[repr(transparent)]
/// struct W(u32);
/// // SAFETY: a `u32` wrapper: any bit pattern is valid, all zero too.
/// unsafe impl bytemuck::Zeroable for W {}
/// // SAFETY: as above.
/// unsafe impl bytemuck::Pod for W {}
/// impl cuda_mem::AsyncMemory<W> for Vec<W> {} // error: `Vec<W>: Async<W>` is not satisfied
/// ```
pub trait AsyncMemory<T>: Memory<T> + sealed::Async<T> {}
impl<T, M: sealed::Async<T> + ?Sized> AsyncMemory<T> for M {}

/// Ordinary (pageable) host memory: slices and `Vec`s, which have no fence and so take part in
/// synchronous copies only.
macro_rules! pageable_memory {
    ($($ty:ty),+) => {$(
        impl<T: Pod> sealed::Raw<T> for $ty {
            fn raw_ptr(&self) -> *const T {
                self.as_ptr()
            }
            fn raw_len(&self) -> usize {
                self.len()
            }
            fn loc(&self) -> Loc {
                Loc::Pageable
            }
            fn fence(&self) -> Option<&Fence> {
                None
            }
        }

        impl<T: Pod> sealed::RawMut<T> for $ty {
            fn raw_mut_ptr(&mut self) -> *mut T {
                self.as_mut_ptr()
            }
        }
    )+};
}
pageable_memory!([T], Vec<T>);

/// Copies all of `src` into `dst` (`cudaMemcpy`); see the module docs for when it returns.
///
/// Both must have the same length ([`Misuse::LengthMismatch`](crate::Misuse::LengthMismatch)
/// otherwise). The copy is ordered after pending asynchronous work on either buffer.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{copy, DeviceBuffer};
/// let host = vec![1u32, 2, 3];
/// let mut dev = DeviceBuffer::<u32>::zeroed(3)?;
/// copy(&mut dev, &host)?;            // cudaMemcpyHostToDevice
/// let mut back = vec![0u32; 3];
/// copy(&mut back, &dev)?;            // cudaMemcpyDeviceToHost
/// assert_eq!(back, host);
/// # Ok(()) }
/// ```
pub fn copy<T, D, S>(dst: &mut D, src: &S) -> Result<()>
where
    T: Pod,
    D: MemoryMut<T> + ?Sized,
    S: Memory<T> + ?Sized,
{
    size::same_len(dst.raw_len(), src.raw_len())?;
    copy_range(dst, 0, src, 0, src.raw_len())
}

/// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]`; see [`copy`].
/// Ranges outside either buffer are [`Misuse::OutOfBounds`](crate::Misuse::OutOfBounds).
pub fn copy_range<T, D, S>(
    dst: &mut D,
    dst_offset: usize,
    src: &S,
    src_offset: usize,
    count: usize,
) -> Result<()>
where
    T: Pod,
    D: MemoryMut<T> + ?Sized,
    S: Memory<T> + ?Sized,
{
    if let Some(stager) = crate::staged::auto_stager(src.loc(), dst.loc(), count, size_of::<T>()) {
        return stager.copy_range(dst, dst_offset, src, src_offset, count);
    }
    let plan = Plan::new(dst, dst_offset, src, src_offset, count)?;
    copy_planned(dst, src, plan)
}

/// [`copy_range`] by the driver's path alone (`cudaMemcpy`), never staged, of the copy that
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
    // SAFETY: `Plan::new` checked that both ranges lie inside live allocations; `dst` is
    // borrowed mutably so nothing else reads or writes it, and pending GPU work on both is
    // ordered before the copy on the device. `T: Pod` makes any bytes written valid. If the
    // copy outlives this call, it is recorded or completed below before the borrows end.
    let code = unsafe { sys::cudaMemcpy(d.cast(), s.cast(), bytes, kind) };
    let result = check(code, || {
        format!(
            "cudaMemcpy({d:p}, {s:p}, {bytes} bytes, {})",
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
    // Marked when these drop, after the copy is queued below.
    let _src_use = src.async_fence().begin(stream, sr, Access::Read)?;
    let _dst_use = dst.async_fence().begin(stream, dr, Access::Write)?;
    // SAFETY: the ranges lie inside live allocations (`Plan::new`). The copy outlives this
    // call, which is sound because both sides are `AsyncMemory`: the uses above mark it on
    // their fences, and the owners wait for it before host access or free (for memory
    // borrowed by a `scope`, the scope waits before it returns); pending conflicting work was
    // ordered before it by `begin`.
    let code = unsafe { sys::cudaMemcpyAsync(d.cast(), s.cast(), bytes, kind, stream.as_raw()) };
    check(code, || {
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
    let guard = crate::access::write_guard(dst, stream, "memset_async")?;
    let p = guard.as_mut_ptr();
    // SAFETY: `p` is the device address of `bytes` bytes of `dst`, borrowed mutably through the
    // guard, which ordered the fill after conflicting work and records it (the owner waits for
    // it before host access or free).
    let code = unsafe { sys::cudaMemsetAsync(p.cast(), byte.into(), bytes, stream.as_raw()) };
    check(code, || {
        format!(
            "cudaMemsetAsync({p:p}, {byte}, {bytes} bytes, stream {:p})",
            stream.as_raw()
        )
    })
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
