//! Host access as traits, for code generic over the memory kinds: [`HostMemory`] is every
//! buffer the host can read (pinned, mapped, managed and registered memory) and every view of
//! one, [`HostMemoryMut`] every one it can also write. (Device-side access is
//! [`DevicePtr`](crate::DevicePtr) / [`DevicePtrMut`](crate::DevicePtrMut).)
//!
//! A view waits only for the GPU work on its own elements: the host can fill one half of a
//! buffer while the GPU still works on the other half.
//!
//! ```no_run
//! # fn main() -> cuda_mem::Result<()> {
//! use cuda_mem::{HostMemory, HostMemoryMut, HostAllocFlags, PinnedBuffer, Slice};
//! fn total<M: HostMemory<u32> + ?Sized>(m: &M) -> cuda_mem::Result<u64> {
//!     Ok(m.as_slice()?.iter().map(|&x| u64::from(x)).sum())
//! }
//! let mut host = PinnedBuffer::<u32>::zeroed(1024, HostAllocFlags::DEFAULT)?;
//! let (mut lo, hi) = host.split_at_mut(512)?;
//! lo.as_mut_slice()?.fill(1);          // waits for work on the first half only
//! assert_eq!(total(&lo)? + total(&hi)?, 512);
//! # Ok(()) }
//! ```
//!
//! The traits are implemented for this crate's kinds only (their promise, that the host may
//! use the memory once the fence allows, is sealed), and downstream code bounds on them.
//! Device memory, and views of it, have no host access:
//!
//! ```compile_fail,E0599
//! # fn main() -> cuda_mem::Result<()> {
//! use cuda_mem::{DeviceBuffer, HostMemory, Slice};
//! let dev = DeviceBuffer::<u32>::zeroed(16)?;
//! let v = dev.slice(..8)?;
//! let _ = v.as_slice(); // error: `as_slice` exists for `View<'_, u32, DeviceBuffer<u32>>`, but its bounds are not met
//! # Ok(()) }
//! ```

use bytemuck::Pod;

use crate::contract::memory::{sealed, AsyncMemory};
use crate::error::Result;
use crate::fence::Access;

/// The byte range of `m` in its fence.
fn fence_range<T, M: sealed::Raw<T> + ?Sized>(m: &M) -> (usize, usize) {
    let base = m.fence_base();
    (base, base + m.raw_len() * std::mem::size_of::<T>())
}

/// Memory the host can read, after waiting for pending GPU writes to it. Sealed.
pub trait HostMemory<T: Pod>: AsyncMemory<T> + sealed::Host<T> {
    /// Number of elements.
    fn len(&self) -> usize {
        self.raw_len()
    }

    /// Whether there is no element (only views can be empty).
    fn is_empty(&self) -> bool {
        self.raw_len() == 0
    }

    /// The host address of the first element.
    fn as_ptr(&self) -> *const T {
        self.raw_ptr()
    }

    /// The contents, after waiting for pending GPU work that writes them (for a view, its own
    /// elements only).
    fn as_slice(&self) -> Result<&[T]> {
        self.check_host()?;
        self.async_fence()
            .host_wait_range(fence_range(self), Access::Read)?;
        // SAFETY: the `Host` impl promises `raw_len()` initialised, host-accessible elements
        // at `raw_ptr()`, alive while `self` is (`T: Pod`: any bits are valid). GPU work that
        // may write them was waited for, and safe code can queue new writes to them only
        // through an exclusive borrow of this memory (or of a view covering them), impossible
        // while this shared borrow lives; writes through other views touch other elements.
        Ok(unsafe { std::slice::from_raw_parts(self.raw_ptr(), self.raw_len()) })
    }
}
impl<T: Pod, M: sealed::Host<T> + ?Sized> HostMemory<T> for M {}

/// Memory the host can also write, after waiting for all pending GPU work on it. Sealed.
pub trait HostMemoryMut<T: Pod>: HostMemory<T> + sealed::RawMut<T> {
    /// The contents, writable, after waiting for all pending GPU work on them (for a view,
    /// its own elements only).
    fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.check_host()?;
        self.async_fence()
            .host_wait_range(fence_range(self), Access::Write)?;
        let (p, len) = (self.raw_mut_ptr(), self.raw_len());
        // SAFETY: as for `as_slice`; all GPU work on these elements was waited for, and the
        // exclusive borrow of `self` excludes every other host or GPU use of them through
        // safe code while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }
}
impl<T: Pod, M: sealed::Host<T> + sealed::RawMut<T> + ?Sized> HostMemoryMut<T> for M {}
