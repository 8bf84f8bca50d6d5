//! Copies between every kind of memory, typed and length-checked.
//!
//! [`copy`] works between any two kinds, ordinary host slices included, and returns when the
//! copy is done. [`copy_async`] queues the copy on a stream and returns at once; it accepts
//! only memory that tracks its pending work (device, pinned, mapped, registered, managed),
//! never a plain slice or `Vec`, whose owner could free or change it while the copy runs.
//!
//! The `cudaMemcpyKind` follows from the two sides: host and device memory give
//! `cudaMemcpyHostToDevice`, `DeviceToHost`, `DeviceToDevice` or `HostToHost`; managed memory
//! (which lives on either side) gives `cudaMemcpyDefault`, resolved by unified addressing.

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::error::{check, Result};
use crate::fence::Fence;
use crate::size;
use crate::stream::Stream;

/// Where a kind of memory lives, which picks the `cudaMemcpyKind` of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Host memory: pageable, pinned, mapped or registered.
    Host,
    /// Device memory.
    Device,
    /// Managed memory, which migrates between host and device.
    Unified,
}

impl Side {
    /// The copy kind for a copy from `src` to `dst`.
    pub fn copy_kind(src: Side, dst: Side) -> sys::cudaMemcpyKind {
        use sys::cudaMemcpyKind as K;
        match (src, dst) {
            (Side::Host, Side::Host) => K::cudaMemcpyHostToHost,
            (Side::Host, Side::Device) => K::cudaMemcpyHostToDevice,
            (Side::Device, Side::Host) => K::cudaMemcpyDeviceToHost,
            (Side::Device, Side::Device) => K::cudaMemcpyDeviceToDevice,
            _ => K::cudaMemcpyDefault,
        }
    }

    /// The kind's name as the C API spells it, for messages.
    pub fn copy_kind_name(kind: sys::cudaMemcpyKind) -> &'static str {
        use sys::cudaMemcpyKind as K;
        match kind {
            K::cudaMemcpyHostToHost => "HostToHost",
            K::cudaMemcpyHostToDevice => "HostToDevice",
            K::cudaMemcpyDeviceToHost => "DeviceToHost",
            K::cudaMemcpyDeviceToDevice => "DeviceToDevice",
            _ => "Default",
        }
    }
}

pub(crate) mod sealed {
    use super::Side;
    use crate::fence::Fence;

    /// The raw view of a memory kind that copies need. Sealed: implemented in this crate only.
    pub trait Raw<T> {
        /// Address of the first element, as the copy engine sees it.
        fn raw_ptr(&self) -> *const T;
        /// Length in elements.
        fn raw_len(&self) -> usize;
        /// Where the memory lives.
        fn side(&self) -> Side;
        /// The pending-work fence, for kinds that track it.
        fn fence(&self) -> Option<&Fence>;
    }

    /// Writable memory.
    pub trait RawMut<T>: Raw<T> {
        /// Writable address of the first element.
        fn raw_mut_ptr(&mut self) -> *mut T;
    }
}

/// Memory a copy can read: any buffer of this crate, or a host slice (`[T]`, `Vec<T>`).
pub trait Memory<T>: sealed::Raw<T> {}
impl<T, M: sealed::Raw<T> + ?Sized> Memory<T> for M {}

/// Memory a copy can write.
pub trait MemoryMut<T>: Memory<T> + sealed::RawMut<T> {}
impl<T, M: sealed::RawMut<T> + ?Sized> MemoryMut<T> for M {}

/// Memory that asynchronous work may use: it tracks pending work and waits for it before host
/// access or free. Ordinary slices are not: use a pinned or registered buffer.
pub trait AsyncMemory<T>: Memory<T> {}

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
            fn side(&self) -> Side {
                Side::Host
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

fn wait_both<T, D, S>(dst: &D, src: &S) -> Result<()>
where
    D: sealed::Raw<T> + ?Sized,
    S: sealed::Raw<T> + ?Sized,
{
    if let Some(f) = src.fence() {
        f.wait()?;
    }
    if let Some(f) = dst.fence() {
        f.wait()?;
    }
    Ok(())
}

/// Copies all of `src` into `dst` and returns when the copy is complete (`cudaMemcpy`).
///
/// Both must have the same length ([`Misuse::LengthMismatch`](crate::Misuse::LengthMismatch)
/// otherwise). Pending asynchronous work on either buffer is waited for first.
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

/// Copies `count` elements from `src[src_offset..]` to `dst[dst_offset..]` and returns when the
/// copy is complete. Ranges outside either buffer are
/// [`Misuse::OutOfBounds`](crate::Misuse::OutOfBounds).
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
    let plan = Plan::new(dst, dst_offset, src, src_offset, count)?;
    if plan.bytes == 0 {
        return Ok(());
    }
    wait_both(dst, src)?;
    let Plan { d, s, bytes, kind } = plan;
    // SAFETY: `Plan::new` checked that both ranges lie inside live allocations; `dst` is
    // borrowed mutably so nothing else reads or writes it, and pending GPU work on both was
    // waited for. `T: Pod` makes any bytes written valid.
    let code = unsafe { sys::cudaMemcpy(d.cast(), s.cast(), bytes, kind) };
    check(code, || {
        format!(
            "cudaMemcpy({d:p}, {s:p}, {bytes} bytes, {})",
            Side::copy_kind_name(kind)
        )
    })
}

/// The checked pointers, size and kind of one copy.
struct Plan<T> {
    d: *mut T,
    s: *const T,
    bytes: usize,
    kind: sys::cudaMemcpyKind,
}

impl<T: Pod> Plan<T> {
    fn new<D, S>(
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
        let kind = Side::copy_kind(src.side(), dst.side());
        // `wrapping_add` keeps this free of `unsafe`; the offsets are in bounds (checked above),
        // so the results are the in-bounds element addresses.
        Ok(Plan {
            d: dst.raw_mut_ptr().wrapping_add(dst_offset),
            s: src.raw_ptr().wrapping_add(src_offset),
            bytes,
            kind,
        })
    }
}

/// Queues a copy of all of `src` into `dst` on `stream` and returns at once
/// (`cudaMemcpyAsync`).
///
/// Both buffers record the stream's progress: host access to either ([`as_slice`] and friends),
/// a synchronous copy, and their drop all wait for this copy first, so no safe code can see or
/// free the memory while the copy runs. Work already pending on either buffer from another
/// stream is ordered before this copy.
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
    let Plan { d, s, bytes, kind } = Plan::new(dst, dst_offset, src, src_offset, count)?;
    if bytes == 0 {
        return Ok(());
    }
    let fences = [src.fence(), dst.fence()];
    for f in fences.iter().flatten() {
        f.before(stream)?;
    }
    // SAFETY: the ranges lie inside live allocations (`Plan::new`). The copy outlives this call,
    // which is sound because both sides are `AsyncMemory`: each records the stream below, and
    // waits for it before any host access or free.
    let code = unsafe { sys::cudaMemcpyAsync(d.cast(), s.cast(), bytes, kind, stream.as_raw()) };
    check(code, || {
        format!(
            "cudaMemcpyAsync({d:p}, {s:p}, {bytes} bytes, {}, stream {:p})",
            Side::copy_kind_name(kind),
            stream.as_raw()
        )
    })?;
    for f in fences.iter().flatten() {
        f.record(stream)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::cudaMemcpyKind as K;

    #[test]
    fn copy_kind_follows_the_sides() {
        assert_eq!(
            Side::copy_kind(Side::Host, Side::Device),
            K::cudaMemcpyHostToDevice
        );
        assert_eq!(
            Side::copy_kind(Side::Device, Side::Host),
            K::cudaMemcpyDeviceToHost
        );
        assert_eq!(
            Side::copy_kind(Side::Device, Side::Device),
            K::cudaMemcpyDeviceToDevice
        );
        assert_eq!(
            Side::copy_kind(Side::Host, Side::Host),
            K::cudaMemcpyHostToHost
        );
        assert_eq!(
            Side::copy_kind(Side::Unified, Side::Host),
            K::cudaMemcpyDefault
        );
        assert_eq!(
            Side::copy_kind(Side::Device, Side::Unified),
            K::cudaMemcpyDefault
        );
        assert_eq!(Side::copy_kind_name(K::cudaMemcpyDefault), "Default");
    }

    #[test]
    fn plans_check_ranges_before_any_pointer_use() {
        let mut dst = vec![0u32; 4];
        let src = vec![1u32; 8];
        let p = Plan::new(&mut dst, 1, &src, 5, 3).unwrap();
        assert_eq!(p.bytes, 12);
        assert_eq!(p.d as usize, dst.as_ptr() as usize + 4);
        assert_eq!(p.s as usize, src.as_ptr() as usize + 20);
        assert!(Plan::new(&mut dst, 2, &src, 0, 3).is_err());
        assert!(Plan::new(&mut dst, 0, &src, 6, 3).is_err());
        assert!(Plan::new(&mut dst, usize::MAX, &src, 0, 1).is_err());
    }
}
