//! Size arithmetic shared by every memory kind: element counts to byte counts, checked.
//!
//! Pure code with no runtime calls, so Miri can run its tests.

use crate::error::{Misuse, Result};

/// `len * size_of::<T>()`, or [`Misuse::SizeOverflow`]; [`Misuse::ZeroLength`] when `len` is 0
/// (no CUDA allocator accepts zero bytes usefully) or `T` is zero-sized. Alignment is not
/// checked: allocations take their size from [`Layout::of`], which does.
pub(crate) fn alloc_bytes<T>(len: usize, op: &'static str) -> Result<usize> {
    let elem_size = std::mem::size_of::<T>();
    if len == 0 || elem_size == 0 {
        return Err(Misuse::ZeroLength { op }.into());
    }
    byte_len::<T>(len)
}

/// `len * size_of::<T>()`, or [`Misuse::SizeOverflow`]. Zero is allowed.
pub(crate) fn byte_len<T>(len: usize) -> Result<usize> {
    let elem_size = std::mem::size_of::<T>();
    len.checked_mul(elem_size)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Misuse::SizeOverflow { len, elem_size }.into())
}

/// Checks that a copy's two sides have the same length in elements.
pub(crate) fn same_len(dst: usize, src: usize) -> Result<()> {
    if dst == src {
        Ok(())
    } else {
        Err(Misuse::LengthMismatch { dst, src }.into())
    }
}

/// Checks that `offset..offset + len` lies inside `buffer_len` elements.
pub(crate) fn range(offset: usize, len: usize, buffer_len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= buffer_len => Ok(()),
        _ => Err(Misuse::OutOfBounds {
            offset,
            len,
            buffer_len,
        }
        .into()),
    }
}

/// A byte count for messages: `4096 bytes`.
pub(crate) fn fmt_bytes(bytes: usize) -> String {
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn zero_length_is_misuse() {
        let e = alloc_bytes::<u32>(0, "op").unwrap_err();
        assert_eq!(e, Error::Misuse(Misuse::ZeroLength { op: "op" }));
        let e = alloc_bytes::<()>(5, "zst").unwrap_err();
        assert_eq!(e, Error::Misuse(Misuse::ZeroLength { op: "zst" }));
    }

    #[test]
    fn overflow_is_misuse() {
        let e = alloc_bytes::<u64>(usize::MAX / 4, "op").unwrap_err();
        assert_eq!(
            e,
            Error::Misuse(Misuse::SizeOverflow {
                len: usize::MAX / 4,
                elem_size: 8
            })
        );
        // Fits in usize but not in isize: Rust slices cannot be that large.
        assert!(byte_len::<u8>(usize::MAX).is_err());
        assert_eq!(byte_len::<u32>(1000).unwrap(), 4000);
        assert_eq!(alloc_bytes::<[u8; 3]>(7, "op").unwrap(), 21);
    }

    #[test]
    fn length_and_range_checks() {
        assert!(same_len(3, 3).is_ok());
        assert_eq!(
            same_len(3, 4).unwrap_err(),
            Error::Misuse(Misuse::LengthMismatch { dst: 3, src: 4 })
        );
        assert!(range(2, 3, 5).is_ok());
        assert!(range(5, 0, 5).is_ok());
        assert_eq!(
            range(usize::MAX, 2, 5).unwrap_err(),
            Error::Misuse(Misuse::OutOfBounds {
                offset: usize::MAX,
                len: 2,
                buffer_len: 5
            })
        );
        assert!(range(4, 2, 5).is_err());
    }
}
