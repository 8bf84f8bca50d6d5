//! Views: part of a buffer, handed to copies (sync and async), memsets of device memory and
//! kernels (through [`DevicePtr`](crate::DevicePtr)) like the buffer itself.
//!
//! A view shares its buffer's fence, with its own byte range: work on disjoint views runs
//! concurrently (two streams filling the two halves of one buffer never wait for each other),
//! while work on overlapping ranges is ordered as on the whole buffer. Views borrow the buffer,
//! so the buffer outlives them and host access to it waits until they are gone.
//!
//! ```no_run
//! # fn main() -> cuda_mem::Result<()> {
//! use cuda_mem::{copy_async, DeviceBuffer, HostAllocFlags, PinnedBuffer, Slice, Stream};
//! let (s1, s2) = (Stream::non_blocking()?, Stream::non_blocking()?);
//! let host = PinnedBuffer::<f32>::zeroed(1 << 20, HostAllocFlags::DEFAULT)?;
//! let (lo_src, hi_src) = (host.slice(..1 << 19)?, host.slice(1 << 19..)?);
//! let mut dev = DeviceBuffer::<f32>::zeroed(1 << 20)?;
//! let (mut lo, mut hi) = dev.split_at_mut(1 << 19)?;
//! copy_async(&mut lo, &lo_src, &s1)?; // the two halves overlap on two streams
//! copy_async(&mut hi, &hi_src, &s2)?;
//! # Ok(()) }
//! ```

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use crate::contract::memory::{sealed, Loc};
use crate::error::{Misuse, Result};
use crate::fence::Fence;
use crate::handles::stream::Stream;

/// A read-only view of elements `start..start + len` of a buffer `M`.
pub struct View<'a, T, M: ?Sized> {
    parent: &'a M,
    start: usize,
    len: usize,
    _elem: PhantomData<T>,
}

/// A writable view of elements `start..start + len` of a buffer `M`: no other view or borrow
/// of those elements exists while it lives.
pub struct ViewMut<'a, T, M: ?Sized> {
    parent: &'a M,
    /// The parent's writable address of the first element of the view.
    ptr: *mut T,
    start: usize,
    len: usize,
    _exclusive: PhantomData<&'a mut M>,
}

// SAFETY: a `View` is a shared borrow of `M` plus numbers; sending or sharing it is sending or
// sharing `&M`, sound when `M: Sync`.
unsafe impl<T, M: ?Sized + Sync> Send for View<'_, T, M> {}
// SAFETY: as above.
unsafe impl<T, M: ?Sized + Sync> Sync for View<'_, T, M> {}
// SAFETY: a `ViewMut` stands for `&mut` access to its range of `M` (the raw pointer is the
// parent's address of that range, used only through `&mut self` by copies); sending it sends
// that exclusive access and a `&M`, sound when `M: Send + Sync` and `T: Send`.
unsafe impl<T: Send, M: ?Sized + Send + Sync> Send for ViewMut<'_, T, M> {}
// SAFETY: shared access to a `ViewMut` only reads its numbers and the parent through `&M`.
unsafe impl<T: Sync, M: ?Sized + Sync> Sync for ViewMut<'_, T, M> {}

impl<T, M: ?Sized> std::fmt::Debug for View<'_, T, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "View({}..{})", self.start, self.start + self.len)
    }
}

impl<T, M: ?Sized> std::fmt::Debug for ViewMut<'_, T, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ViewMut({}..{})", self.start, self.start + self.len)
    }
}

/// `range` of `len` elements as `start..end`, or [`Misuse::OutOfBounds`].
fn bounds(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(Misuse::OutOfBounds {
            offset: start,
            len: end.saturating_sub(start),
            buffer_len: len,
        }
        .into());
    }
    Ok((start, end))
}

/// Views of any buffer of this crate (and of views): `slice`, `slice_mut`, `split_at_mut`.
/// Sealed; implemented for every kind that asynchronous work may use.
pub trait Slice<T>: sealed::Async<T> {
    /// A view of the elements in `range` (`..`, `a..b`, `a..`, ...), or
    /// [`Misuse::OutOfBounds`]. Empty views are allowed (copies of them do nothing).
    fn slice(&self, range: impl RangeBounds<usize>) -> Result<View<'_, T, Self>> {
        let (start, end) = bounds(range, self.raw_len())?;
        Ok(View {
            parent: self,
            start,
            len: end - start,
            _elem: PhantomData,
        })
    }

    /// A writable view of the elements in `range`.
    fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<ViewMut<'_, T, Self>>
    where
        Self: sealed::RawMut<T>,
    {
        let (start, end) = bounds(range, self.raw_len())?;
        let ptr = self.raw_mut_ptr().wrapping_add(start);
        Ok(ViewMut {
            parent: self,
            ptr,
            start,
            len: end - start,
            _exclusive: PhantomData,
        })
    }

    /// Two writable views, `..mid` and `mid..`, that work may use at once (on two streams,
    /// say) without waiting for each other.
    #[allow(clippy::type_complexity)]
    fn split_at_mut(&mut self, mid: usize) -> Result<(ViewMut<'_, T, Self>, ViewMut<'_, T, Self>)>
    where
        Self: sealed::RawMut<T>,
    {
        let len = self.raw_len();
        bounds(..mid, len)?;
        let base = self.raw_mut_ptr();
        let parent: &Self = self;
        Ok((
            ViewMut {
                parent,
                ptr: base,
                start: 0,
                len: mid,
                _exclusive: PhantomData,
            },
            ViewMut {
                parent,
                ptr: base.wrapping_add(mid),
                start: mid,
                len: len - mid,
                _exclusive: PhantomData,
            },
        ))
    }
}
impl<T, M: sealed::Async<T> + ?Sized> Slice<T> for M {}

/// The shared part of the two view kinds' trait impls.
macro_rules! view_raw {
    ($ty:ident) => {
        impl<T, M: sealed::Async<T> + ?Sized> sealed::Raw<T> for $ty<'_, T, M> {
            fn raw_ptr(&self) -> *const T {
                self.parent.raw_ptr().wrapping_add(self.start)
            }
            fn raw_len(&self) -> usize {
                self.len
            }
            fn loc(&self) -> Loc {
                self.parent.loc()
            }
            fn fence(&self) -> Option<&Fence> {
                self.parent.fence()
            }
            fn fence_base(&self) -> usize {
                self.parent.fence_base() + self.start * std::mem::size_of::<T>()
            }
            fn device_ordinal(&self) -> Option<i32> {
                self.parent.device_ordinal()
            }
            fn check_stream(&self, stream: &Stream, op: &'static str) -> Result<()> {
                self.parent.check_stream(stream, op)
            }
        }

        // A view of host memory is host memory: its elements of the parent's.
        impl<T, M: sealed::Host<T> + ?Sized> sealed::Host<T> for $ty<'_, T, M> {
            fn check_host(&self) -> Result<()> {
                self.parent.check_host()
            }
        }

        impl<T, M: sealed::Async<T> + ?Sized> sealed::Async<T> for $ty<'_, T, M> {
            fn device_addr(&self) -> Result<*const T> {
                Ok(self.parent.device_addr()?.wrapping_add(self.start))
            }
            fn async_fence(&self) -> &Fence {
                self.parent.async_fence()
            }
        }

        impl<T, M: ?Sized> $ty<'_, T, M> {
            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the view is empty.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Where the view starts in its buffer, in elements.
            pub fn offset(&self) -> usize {
                self.start
            }
        }
    };
}
view_raw!(View);
view_raw!(ViewMut);

impl<T, M: sealed::Async<T> + sealed::RawMut<T> + ?Sized> sealed::RawMut<T> for ViewMut<'_, T, M> {
    fn raw_mut_ptr(&mut self) -> *mut T {
        self.ptr
    }
    fn check_device_writable(&self, op: &'static str) -> Result<()> {
        self.parent.check_device_writable(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_accept_every_range_form_and_refuse_what_is_outside() {
        assert_eq!(bounds(.., 10).unwrap(), (0, 10));
        assert_eq!(bounds(2..5, 10).unwrap(), (2, 5));
        assert_eq!(bounds(2..=5, 10).unwrap(), (2, 6));
        assert_eq!(bounds(..3, 10).unwrap(), (0, 3));
        assert_eq!(bounds(7.., 10).unwrap(), (7, 10));
        assert_eq!(bounds(10.., 10).unwrap(), (10, 10));
        assert!(bounds(5..11, 10).is_err());
        assert!(bounds(11.., 10).is_err());
        assert!(bounds(..=usize::MAX, 10).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let e = bounds(6..4, 10).unwrap_err();
        assert_eq!(
            e.misuse(),
            Some(&Misuse::OutOfBounds {
                offset: 6,
                len: 0,
                buffer_len: 10
            })
        );
    }
}
