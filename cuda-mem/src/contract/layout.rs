//! The memory contract every allocation passes through: how many bytes `len` elements of `T`
//! take, whether `T`'s alignment can be allocated at all, and whether the address an
//! allocator returned is aligned for `T`, before any `NonNull<T>` (and so any `&[T]`) is made
//! from it.
//!
//! # Alignment
//!
//! The CUDA C++ Programming Guide promises that every address the driver's or the runtime's
//! allocation routines return is aligned to at least 256 bytes, and nothing more: on an H200
//! host `cudaHostAlloc` returned addresses 1536 bytes past a page boundary. So the rule, the
//! same for every kind and allocator (device, pinned, pooled, the pinned pool, mmap pinning,
//! managed, mapped):
//!
//! - **an element type aligned to more than [`MAX_ALIGN`] (256) bytes is refused** before
//!   anything is allocated, with [`Misuse::AlignmentUnsupported`] (deterministic: it depends
//!   on the type only);
//! - the address every allocator returns is checked anyway ([`Layout::place`]): an address
//!   not aligned for `T` (an allocator breaking its promise) is given back to its allocator
//!   and refused with [`Misuse::Misaligned`]; no memory is leaked;
//! - memory made elsewhere and adopted (`from_raw`, [`Layout::adopt`]) is not allocated
//!   here: any alignment is accepted, provided the address has it.
//!
//! Device addresses of pinned host memory (`cudaHostGetDevicePointer`) map the same pages, at
//! the same offset within a page (4 KiB at least, more than [`MAX_ALIGN`]): they are aligned
//! whenever the host address is.
//!
//! Pure code with no runtime calls: Miri runs its tests.

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::contract::size;
use crate::error::{Misuse, Result};

/// The largest element alignment an allocation accepts: the alignment CUDA promises for
/// every allocation.
pub(crate) const MAX_ALIGN: usize = 256;

/// A checked request for `len` elements of `T`: non-zero, its bytes fit in `isize`, and `T`'s
/// alignment is one every CUDA allocator guarantees. Made before allocating
/// ([`of`](Self::of)); the address the allocator returns becomes a `NonNull<T>` only through
/// [`place`](Self::place).
pub(crate) struct Layout<T> {
    len: usize,
    bytes: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T> std::fmt::Debug for Layout<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layout")
            .field("len", &self.len)
            .field("bytes", &self.bytes)
            .field("align", &std::mem::align_of::<T>())
            .finish()
    }
}

impl<T> Clone for Layout<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Layout<T> {}

impl<T> Layout<T> {
    /// The layout of `len` elements of `T` for a new allocation, with `op` naming the public
    /// call in errors. Checked in this order: [`Misuse::ZeroLength`] (`len` is 0 or `T` is
    /// zero-sized), [`Misuse::AlignmentUnsupported`] (`align_of::<T>()` above
    /// [`MAX_ALIGN`]), [`Misuse::SizeOverflow`] (the bytes do not fit in `isize`).
    pub(crate) fn of(len: usize, op: &'static str) -> Result<Self> {
        if len == 0 || std::mem::size_of::<T>() == 0 {
            return Err(Misuse::ZeroLength { op }.into());
        }
        let align = std::mem::align_of::<T>();
        if align > MAX_ALIGN {
            return Err(Misuse::AlignmentUnsupported {
                align,
                max: MAX_ALIGN,
            }
            .into());
        }
        let bytes = size::byte_len::<T>(len)?;
        Ok(Layout {
            len,
            bytes,
            _elem: PhantomData,
        })
    }

    /// Elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes to allocate: `len * size_of::<T>()`, non-zero.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The address `raw` that an allocator returned for this layout, as a `NonNull<T>`:
    /// [`Misuse::NullPointer`] (with `op`, the allocator's call) when it is null (nothing was
    /// allocated); [`Misuse::Misaligned`] when it is not aligned for `T`, after `free` gave the
    /// memory back to its allocator (a failing `free` leaks it: retrying could free twice).
    pub(crate) fn place<U>(
        &self,
        raw: *mut U,
        op: &'static str,
        free: impl FnOnce(NonNull<U>) -> Result<()>,
    ) -> Result<NonNull<T>> {
        self.place_owned(raw, op, (), |p, ()| free(p))
            .map(|(p, ())| p)
    }

    /// [`place`](Self::place) for an allocation that `owner` owns (a pinned pool's block):
    /// returned with the address when it is aligned, else handed
    /// to `free` with it. On a null address the owner is dropped (it owns nothing).
    pub(crate) fn place_owned<U, O>(
        &self,
        raw: *mut U,
        op: &'static str,
        owner: O,
        free: impl FnOnce(NonNull<U>, O) -> Result<()>,
    ) -> Result<(NonNull<T>, O)> {
        let p = NonNull::new(raw).ok_or(Misuse::NullPointer { op })?;
        if let Err(e) = aligned::<T>(raw as usize) {
            // The refusal is the error to report; a failed free only leaks.
            let _ = free(p, owner);
            return Err(e);
        }
        Ok((p.cast(), owner))
    }

    /// Checks the parts of memory allocated elsewhere (`from_raw`): [`Misuse::NullPointer`],
    /// then [`Misuse::ZeroLength`] or [`Misuse::SizeOverflow`] for `len`, then
    /// [`Misuse::Misaligned`] when `ptr` is not aligned for `T`. Any alignment of `T` is
    /// accepted here: the memory exists already, only its address matters.
    pub(crate) fn adopt(ptr: *mut T, len: usize, op: &'static str) -> Result<NonNull<T>> {
        let p = NonNull::new(ptr).ok_or(Misuse::NullPointer { op })?;
        size::alloc_bytes::<T>(len, op)?;
        aligned::<T>(ptr as usize)?;
        Ok(p)
    }
}

/// [`Misuse::Misaligned`] unless `addr` is a multiple of `align_of::<T>()`.
fn aligned<T>(addr: usize) -> Result<()> {
    let align = std::mem::align_of::<T>();
    if addr % align == 0 {
        Ok(())
    } else {
        Err(Misuse::Misaligned { addr, align }.into())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::os::raw::c_void;

    use super::*;
    use crate::Error;

    #[repr(C, align(256))]
    #[derive(Clone, Copy)]
    struct A256([u8; 256]);

    #[repr(C, align(512))]
    #[derive(Clone, Copy)]
    struct A512([u8; 512]);

    #[repr(C, align(65536))]
    #[derive(Clone, Copy)]
    struct A64K(u8);

    /// An address for the checks: never dereferenced, so it needs no provenance (an offset
    /// from null, which Miri accepts).
    fn addr<U>(a: usize) -> *mut U {
        std::ptr::null_mut::<u8>().wrapping_add(a).cast()
    }

    #[test]
    fn sizes_are_len_times_size() {
        let l = Layout::<u32>::of(1000, "op").unwrap();
        assert_eq!((l.len(), l.bytes()), (1000, 4000));
        assert_eq!(Layout::<[u8; 3]>::of(7, "op").unwrap().bytes(), 21);
        assert_eq!(Layout::<A256>::of(3, "op").unwrap().bytes(), 768);
        assert_eq!(Layout::<u8>::of(1, "op").unwrap().bytes(), 1);
    }

    #[test]
    fn zero_length_and_zero_sized_types_are_refused() {
        assert_eq!(
            Layout::<u32>::of(0, "op").unwrap_err(),
            Error::Misuse(Misuse::ZeroLength { op: "op" })
        );
        assert_eq!(
            Layout::<()>::of(5, "zst").unwrap_err(),
            Error::Misuse(Misuse::ZeroLength { op: "zst" })
        );
        // Zero length is reported before the alignment: the request is empty either way.
        assert_eq!(
            Layout::<A512>::of(0, "op").unwrap_err(),
            Error::Misuse(Misuse::ZeroLength { op: "op" })
        );
    }

    #[test]
    fn sizes_past_isize_are_refused() {
        assert_eq!(
            Layout::<u64>::of(usize::MAX / 4, "op").unwrap_err(),
            Error::Misuse(Misuse::SizeOverflow {
                len: usize::MAX / 4,
                elem_size: 8
            })
        );
        // Fits in usize but not in isize.
        assert_eq!(
            Layout::<u8>::of(usize::MAX / 2 + 1, "op").unwrap_err(),
            Error::Misuse(Misuse::SizeOverflow {
                len: usize::MAX / 2 + 1,
                elem_size: 1
            })
        );
        assert_eq!(
            Layout::<u8>::of(isize::MAX as usize, "op").unwrap().bytes(),
            isize::MAX as usize
        );
        assert_eq!(
            Layout::<A256>::of(usize::MAX / 256, "op").unwrap_err(),
            Error::Misuse(Misuse::SizeOverflow {
                len: usize::MAX / 256,
                elem_size: 256
            })
        );
    }

    #[test]
    fn alignment_above_256_is_refused_before_allocating() {
        assert!(Layout::<A256>::of(1, "op").is_ok());
        assert_eq!(
            Layout::<A512>::of(1, "op").unwrap_err(),
            Error::Misuse(Misuse::AlignmentUnsupported {
                align: 512,
                max: 256
            })
        );
        assert_eq!(
            Layout::<A64K>::of(3, "op").unwrap_err(),
            Error::Misuse(Misuse::AlignmentUnsupported {
                align: 65536,
                max: 256
            })
        );
        // Refused for the type, whatever the length, even one whose bytes would overflow.
        assert_eq!(
            Layout::<A512>::of(usize::MAX, "op").unwrap_err(),
            Error::Misuse(Misuse::AlignmentUnsupported {
                align: 512,
                max: 256
            })
        );
    }

    #[test]
    fn an_aligned_address_is_placed_and_nothing_freed() {
        let l = Layout::<A256>::of(4, "op").unwrap();
        let freed = Cell::new(0);
        let p = l
            .place(addr::<c_void>(0x7f00_0000_0100), "alloc", |_| {
                freed.set(freed.get() + 1);
                Ok(())
            })
            .unwrap();
        assert_eq!(p.as_ptr() as usize, 0x7f00_0000_0100);
        assert_eq!(freed.get(), 0);
    }

    #[test]
    fn a_misaligned_address_is_freed_then_refused() {
        // The H200 case: an address 1536 bytes into a page, for a 256-aligned type it is
        // aligned; 0x...680 (128 past) is not.
        let l = Layout::<A256>::of(2, "op").unwrap();
        assert!(l
            .place(addr::<u8>(0x7f00_0000_0600), "alloc", |_| Ok(()))
            .is_ok());
        let freed = Cell::new(None);
        let e = l
            .place(addr::<u8>(0x7f00_0000_0680), "alloc", |p| {
                freed.set(Some(p.as_ptr() as usize));
                Ok(())
            })
            .unwrap_err();
        assert_eq!(
            e,
            Error::Misuse(Misuse::Misaligned {
                addr: 0x7f00_0000_0680,
                align: 256
            })
        );
        assert_eq!(freed.get(), Some(0x7f00_0000_0680), "freed exactly once");
        // A failing free does not hide the refusal (the memory is leaked instead).
        let e = Layout::<u64>::of(1, "op")
            .unwrap()
            .place(addr::<c_void>(0x1004), "alloc", |_| {
                Err(Misuse::NullPointer { op: "free" }.into())
            })
            .unwrap_err();
        assert_eq!(
            e,
            Error::Misuse(Misuse::Misaligned {
                addr: 0x1004,
                align: 8
            })
        );
    }

    #[test]
    fn a_null_address_frees_nothing() {
        let l = Layout::<u32>::of(1, "op").unwrap();
        let e = l
            .place(std::ptr::null_mut::<c_void>(), "cudaMalloc", |_| {
                panic!("nothing to free")
            })
            .unwrap_err();
        assert_eq!(e, Error::Misuse(Misuse::NullPointer { op: "cudaMalloc" }));
    }

    #[test]
    fn an_owner_comes_back_with_the_address_or_goes_to_free() {
        let l = Layout::<u64>::of(2, "op").unwrap();
        let (p, owner) = l
            .place_owned(addr::<u8>(0x2000), "pool", String::from("block"), |_, _| {
                panic!("aligned: nothing to free")
            })
            .unwrap();
        assert_eq!((p.as_ptr() as usize, owner.as_str()), (0x2000, "block"));
        let given_back = Cell::new(None);
        let e = l
            .place_owned(addr::<u8>(0x2002), "pool", String::from("block"), |p, o| {
                given_back.set(Some((p.as_ptr() as usize, o)));
                Ok(())
            })
            .unwrap_err();
        assert_eq!(
            e,
            Error::Misuse(Misuse::Misaligned {
                addr: 0x2002,
                align: 8
            })
        );
        assert_eq!(given_back.take(), Some((0x2002, String::from("block"))));
    }

    #[test]
    fn adopted_memory_checks_its_address_not_the_limit() {
        // `from_raw`: any alignment, if the address has it.
        let p = Layout::adopt(addr::<A512>(0x4000), 2, "from_raw").unwrap();
        assert_eq!(p.as_ptr() as usize, 0x4000);
        assert_eq!(
            Layout::adopt(addr::<A512>(0x4100), 2, "from_raw").unwrap_err(),
            Error::Misuse(Misuse::Misaligned {
                addr: 0x4100,
                align: 512
            })
        );
        assert_eq!(
            Layout::adopt(std::ptr::null_mut::<u32>(), 4, "from_raw").unwrap_err(),
            Error::Misuse(Misuse::NullPointer { op: "from_raw" })
        );
        assert_eq!(
            Layout::adopt(addr::<u32>(0x1000), 0, "from_raw").unwrap_err(),
            Error::Misuse(Misuse::ZeroLength { op: "from_raw" })
        );
        assert_eq!(
            Layout::adopt(addr::<u32>(0x1000), usize::MAX, "from_raw").unwrap_err(),
            Error::Misuse(Misuse::SizeOverflow {
                len: usize::MAX,
                elem_size: 4
            })
        );
        // Null first, then the length, then the address (as `from_raw` documents).
        assert_eq!(
            Layout::adopt(addr::<u32>(0x1002), 0, "from_raw").unwrap_err(),
            Error::Misuse(Misuse::ZeroLength { op: "from_raw" })
        );
        assert_eq!(
            Layout::adopt(addr::<u32>(0x1002), 1, "from_raw").unwrap_err(),
            Error::Misuse(Misuse::Misaligned {
                addr: 0x1002,
                align: 4
            })
        );
    }
}
