//! The transfer policy of [`copy`] and [`copy_range`]: large copies between ordinary
//! (pageable) host memory and the device go through the staging workers (`staged/`), every
//! other copy through the driver (`ops/copy.rs`).

pub(crate) mod peer;
pub(crate) mod staged;

use std::mem::size_of;

use bytemuck::Pod;

use crate::contract::memory::{Memory, MemoryMut};
use crate::contract::size;
use crate::error::Result;
use crate::kinds::device::DeviceBuffer;
use crate::ops::copy::{copy_planned, Plan};

/// Copies all of `src` into `dst` (`cudaMemcpy`); see below for when it returns.
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
///
/// # When it returns
///
/// `cudaMemcpy` may return before the copy is done: device-to-device copies, copies from
/// host memory to the device (once the source is staged: pageable memory, and pinned memory
/// not pinned for the current device's context), and copies that involve managed memory. [`copy`] keeps the C++ cost of those (no extra wait), and makes the result safe to
/// rely on instead: the copy is **recorded** on the fences of the buffers it may still touch,
/// as work of the legacy default stream, so that host access to them, their drop, and any
/// asynchronous work through this crate on any stream (non-blocking ones included) are ordered
/// after it. Where a side has no fence (a plain slice or `Vec`) the copy is **completed**
/// instead (`cudaStreamSynchronize` on the legacy stream) before `copy` returns. Every other
/// copy is complete when `cudaMemcpy` returns. (Between pageable memory the driver does not
/// know and the device, below the staging threshold, the call is `cudaMemcpyAsync` on the
/// legacy stream: the same guarantees at return, without `cudaMemcpy`'s wait for the stream
/// first.)
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
    if let Some(stager) =
        crate::transfer::staged::auto_stager(src.loc(), dst.loc(), count, size_of::<T>())
    {
        return stager.copy_range(dst, dst_offset, src, src_offset, count);
    }
    let plan = Plan::new(dst, dst_offset, src, src_offset, count)?;
    copy_planned(dst, src, plan)
}

/// The device buffer's copies: [`copy`] (the transfer policy) on it.
impl<T: Pod> DeviceBuffer<T> {
    /// Allocates a buffer holding a copy of `src` (`cudaMalloc` + `cudaMemcpyHostToDevice`).
    pub fn from_slice(src: &[T]) -> Result<Self> {
        let mut buf = Self::malloc(src.len(), "DeviceBuffer::from_slice")?;
        copy(&mut buf, src)?;
        Ok(buf)
    }

    /// Copies the buffer into a new `Vec` (`cudaMemcpyDeviceToHost`).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len()];
        copy(&mut out, self)?;
        Ok(out)
    }

    /// Copies `src` into this buffer; lengths must match.
    pub fn copy_from<S: Memory<T> + ?Sized>(&mut self, src: &S) -> Result<()> {
        copy(self, src)
    }

    /// Copies this buffer into `dst`; lengths must match.
    pub fn copy_to<D: MemoryMut<T> + ?Sized>(&self, dst: &mut D) -> Result<()> {
        copy(dst, self)
    }
}
