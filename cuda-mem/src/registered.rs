//! Registered host memory: an existing slice or `Vec` pinned in place (`cudaHostRegister`),
//! unregistered on drop (`cudaHostUnregister`).
//!
//! Registration locks the pages the memory already has, which avoids a copy into a separate
//! pinned buffer; it still costs milliseconds per hundred MiB, so register long-lived buffers.
//!
//! # Registrations made elsewhere
//!
//! A registration moves between this crate and other code together with the memory it covers,
//! as a `Vec`'s raw parts: [`RegisteredVec::into_raw`] hands both over (still registered), and
//! [`RegisteredVec::from_raw`] adopts a `Vec` that other code registered, unregistering it on
//! drop as if it had been registered here. Only an owned `Vec` can be adopted: adopting a
//! registration means ending it, which is only sound for memory whose life this crate
//! controls. Memory registered by code that stays its owner (an `mmap`ed region, a C++
//! buffer) is not adopted; lend a slice of it to a [`scope`](crate::scope) for asynchronous
//! work, or register a slice of your own with [`RegisteredSlice`]: the registration stays
//! its owner's business.

use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::copy::{sealed, Loc};
use crate::error::{check, Misuse, Result};
use crate::fence::{Access, Fence};
use crate::flags::flag_set;
use crate::pinned::host_device_pointer;
use crate::size::{self, fmt_bytes};

flag_set! {
    /// Flags of `cudaHostRegister`, OR-able with `|`.
    HostRegisterFlags {
        /// `cudaHostRegisterDefault`.
        DEFAULT = sys::cudaHostRegisterDefault;
        /// `cudaHostRegisterPortable`: pinned for every CUDA context.
        PORTABLE = sys::cudaHostRegisterPortable;
        /// `cudaHostRegisterMapped`: mapped into the device address space.
        MAPPED = sys::cudaHostRegisterMapped;
        /// `cudaHostRegisterReadOnly`: the device only reads the memory.
        READ_ONLY = sys::cudaHostRegisterReadOnly;
    }
}

/// A registered range: the shared core of [`RegisteredSlice`] and [`RegisteredVec`].
struct Registration<T> {
    ptr: NonNull<T>,
    len: usize,
    flags: HostRegisterFlags,
}

impl<T: Pod> Registration<T> {
    fn new(slice: &mut [T], flags: HostRegisterFlags, op: &'static str) -> Result<Self> {
        let bytes = size::alloc_bytes::<T>(slice.len(), op)?;
        let p = slice.as_mut_ptr();
        // SAFETY: `p` covers `bytes` bytes of memory the caller keeps alive and unaliased for
        // the registration's life; flags are known bits.
        let code = unsafe { sys::cudaHostRegister(p.cast(), bytes, flags.bits()) };
        check(code, || {
            format!("cudaHostRegister({p:p}, {}, {flags:?})", fmt_bytes(bytes))
        })?;
        Ok(Registration {
            // A slice's pointer is never null.
            ptr: NonNull::from(slice).cast(),
            len: bytes / std::mem::size_of::<T>(),
            flags,
        })
    }

    /// A registration made elsewhere, of `len` elements from `ptr` with `flags`.
    fn adopt(ptr: NonNull<T>, len: usize, flags: HostRegisterFlags) -> Self {
        Registration { ptr, len, flags }
    }

    /// `cudaHostUnregister`. Callers make sure no queued work still uses the range.
    fn unregister(&self) -> Result<()> {
        let p = self.ptr.as_ptr();
        // SAFETY: `p` is the start of a range we registered; callers stop treating it as
        // registered afterwards, whatever the outcome.
        check(unsafe { sys::cudaHostUnregister(p.cast()) }, || {
            format!("cudaHostUnregister({p:p})")
        })
    }

    /// Refuses device writes to a `READ_ONLY` registration.
    fn check_device_writable(&self, op: &'static str) -> Result<()> {
        if self.flags.contains(HostRegisterFlags::READ_ONLY) {
            Err(Misuse::ReadOnlyDestination { op }.into())
        } else {
            Ok(())
        }
    }

    fn slice(&self) -> &[T] {
        // SAFETY: the range is memory the owner keeps alive and initialised (`T: Pod`); callers
        // have waited for GPU work that may write it, and new writes need `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn slice_mut(&mut self) -> &mut [T] {
        // SAFETY: as `slice`; callers have waited for all GPU work, and `&mut self` makes the
        // borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> fmt::Debug for Registration<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("flags", &self.flags)
            .finish()
    }
}

/// A borrowed host slice pinned in place for as long as this value lives.
///
/// The mutable borrow keeps the memory from being freed, reallocated (a `Vec` cannot grow) or
/// touched behind the registration's back. Copies to and from it are synchronous only, and
/// complete before they return: if an asynchronous copy could be pending, `std::mem::forget`
/// on this value would end the borrow while DMA still runs. For asynchronous copies, move the
/// `Vec` into a [`RegisteredVec`].
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{copy, DeviceBuffer, HostRegisterFlags, RegisteredSlice};
/// let mut data = vec![3u16; 1 << 20];
/// let mut dev = DeviceBuffer::<u16>::uninit(data.len())?;
/// let reg = RegisteredSlice::register(&mut data, HostRegisterFlags::DEFAULT)?;
/// copy(&mut dev, &reg)?;   // DMA straight from the Vec's pages
/// drop(reg);               // cudaHostUnregister
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RegisteredSlice<'a, T: Pod> {
    reg: Registration<T>,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: the value stands for a `&'a mut [T]`, which is `Send` when `T: Send`.
unsafe impl<T: Pod + Send> Send for RegisteredSlice<'_, T> {}
// SAFETY: shared access yields `&[T]`, like `&&mut [T]`, sound when `T: Sync`.
unsafe impl<T: Pod + Sync> Sync for RegisteredSlice<'_, T> {}

impl<'a, T: Pod> RegisteredSlice<'a, T> {
    /// Pins `slice` in place with `cudaHostRegister(flags)`.
    ///
    /// Errors: an empty slice is [`Misuse::ZeroLength`]; memory registered already gives the
    /// runtime's
    /// `cudaErrorHostMemoryAlreadyRegistered`.
    pub fn register(slice: &'a mut [T], flags: HostRegisterFlags) -> Result<Self> {
        Ok(RegisteredSlice {
            reg: Registration::new(slice, flags, "RegisteredSlice::register")?,
            _borrow: std::marker::PhantomData,
        })
    }

    /// No fence: copies with a registered slice complete before they return.
    fn fence_opt(&self) -> Option<&Fence> {
        None
    }

    /// Unregisters now and reports failure, which drop ignores. The borrow ends either way.
    pub fn unregister(self) -> Result<()> {
        let me = std::mem::ManuallyDrop::new(self);
        me.reg.unregister()
    }

    /// The contents. No GPU work can be pending (copies with a registered slice complete
    /// before they return), so this never waits; the `Result` matches the other kinds.
    pub fn as_slice(&self) -> Result<&[T]> {
        Ok(self.reg.slice())
    }

    /// The contents, writable.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        Ok(self.reg.slice_mut())
    }
}

impl<T: Pod> Drop for RegisteredSlice<'_, T> {
    fn drop(&mut self) {
        // Drop never panics; errors (exit-time unloading, sticky errors) are ignored. No work
        // can be pending (synchronous copies only).
        let _ = self.reg.unregister();
    }
}

/// A `Vec` moved in and pinned in place; asynchronous copies and kernels may use it.
///
/// Owning the `Vec` makes asynchronous use sound: the memory cannot be freed before this value
/// drops (which waits for pending work, then unregisters, then frees the `Vec`), and leaking it
/// leaks the memory instead of freeing it under running DMA. When the wait or the unregistration
/// fails, drop leaks the `Vec` rather than free memory the device may still use.
#[derive(Debug)]
pub struct RegisteredVec<T: Pod> {
    reg: Registration<T>,
    fence: Fence,
    vec: ManuallyDrop<Vec<T>>,
}

// SAFETY: owns a `Vec<T>` plus a registration of its heap buffer, which moving does not move.
unsafe impl<T: Pod + Send> Send for RegisteredVec<T> {}
// SAFETY: shared access yields `&[T]` after the mutex-protected fence wait.
unsafe impl<T: Pod + Sync> Sync for RegisteredVec<T> {}

impl<T: Pod> RegisteredVec<T> {
    /// Pins the `Vec`'s elements in place with `cudaHostRegister(flags)`.
    pub fn register(mut vec: Vec<T>, flags: HostRegisterFlags) -> Result<Self> {
        let reg = Registration::new(&mut vec, flags, "RegisteredVec::register")?;
        Ok(RegisteredVec {
            reg,
            fence: Fence::default(),
            vec: ManuallyDrop::new(vec),
        })
    }

    /// Adopts a `Vec` whose elements other code registered with `cudaHostRegister(flags)`,
    /// from its raw parts (as `Vec::from_raw_parts` takes them): unregistered on drop
    /// (or by [`into_vec`](Self::into_vec)), then freed, like a `Vec` registered by
    /// [`register`](Self::register). [`into_raw`](Self::into_raw) gives such parts.
    ///
    /// Checked before anything is adopted, so on error the memory and its registration stay
    /// the caller's: [`Misuse::NullPointer`], [`Misuse::ZeroLength`],
    /// [`Misuse::SizeOverflow`], [`Misuse::Misaligned`];
    /// [`Misuse::InvalidArgument`] when `capacity < len`, or when the runtime does not know
    /// the first or the last element as page-locked host memory
    /// (`cudaPointerGetAttributes`: not registered).
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use cuda_mem::{HostRegisterFlags, RegisteredVec};
    /// let rv = RegisteredVec::register(vec![7u32; 1 << 20], HostRegisterFlags::PORTABLE)?;
    /// let (p, len, cap) = rv.into_raw()?;   // still registered, e.g. handed to C++ code
    /// // SAFETY: the raw parts of a Vec<u32> registered PORTABLE, from `into_raw` above.
    /// let rv = unsafe { RegisteredVec::from_raw(p, len, cap, HostRegisterFlags::PORTABLE)? };
    /// assert_eq!(rv.into_vec()?[0], 7);     // unregistered, the Vec back
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// `ptr`, `len` and `capacity` must be valid for `Vec::<T>::from_raw_parts` (memory of a
    /// `Vec<T>` with that capacity, from the global allocator, `len` initialised elements),
    /// owned by nothing else; elements `0..len` must have been registered by one
    /// `cudaHostRegister(ptr, len * size_of::<T>(), flags)` (unregistering takes that start
    /// address), not unregistered since; and no GPU work may be pending on them.
    pub unsafe fn from_raw(
        ptr: *mut T,
        len: usize,
        capacity: usize,
        flags: HostRegisterFlags,
    ) -> Result<Self> {
        let op = "RegisteredVec::from_raw";
        let p = size::raw_parts(ptr, len, op)?;
        if capacity < len {
            return Err(Misuse::InvalidArgument {
                op,
                reason: format!("capacity {capacity} is less than the length {len}"),
            }
            .into());
        }
        crate::pointer::require_pinned(p.as_ptr(), len, op)?;
        // SAFETY: the caller vouches for the raw parts (see above); the Vec is owned from here.
        let vec = unsafe { Vec::from_raw_parts(p.as_ptr(), len, capacity) };
        Ok(RegisteredVec {
            reg: Registration::adopt(p, len, flags),
            fence: Fence::default(),
            vec: ManuallyDrop::new(vec),
        })
    }

    /// Gives up the `Vec` *with its registration*, as raw parts `(ptr, len, capacity)`, for
    /// other code (or [`from_raw`](Self::from_raw)) to take over. To end it yourself:
    /// `cudaHostUnregister(ptr)`, then `Vec::from_raw_parts(ptr, len, capacity)`. Pending
    /// work recorded on the buffer is waited for first; if that wait fails, the `Vec` is
    /// leaked (still registered) and the error returned.
    pub fn into_raw(self) -> Result<(*mut T, usize, usize)> {
        let mut me = ManuallyDrop::new(self);
        let waited = me.fence.host_wait(Access::Write);
        // SAFETY: `me` is never used or dropped again. Only the fence is dropped, once; the
        // Vec and the registration pass to the caller (or are leaked, on error).
        unsafe { std::ptr::drop_in_place(&mut me.fence) };
        waited?;
        let v = &mut me.vec;
        Ok((v.as_mut_ptr(), v.len(), v.capacity()))
    }

    /// Waits for pending work, unregisters, and gives the `Vec` back.
    ///
    /// On failure the `Vec` is leaked, never handed back: pending work could not be waited
    /// for (it may still use the memory), or the memory could not be unregistered.
    pub fn into_vec(self) -> Result<Vec<T>> {
        let mut me = ManuallyDrop::new(self);
        let result = me
            .fence
            .host_wait(Access::Write)
            .and_then(|()| me.reg.unregister());
        // SAFETY: `me` is never used or dropped again. The fence is dropped once, here; the
        // Vec is moved out only when its memory is unused and unregistered (else leaked).
        unsafe {
            std::ptr::drop_in_place(&mut me.fence);
            result.map(|()| ManuallyDrop::take(&mut me.vec))
        }
    }

    fn fence_opt(&self) -> Option<&Fence> {
        Some(&self.fence)
    }

    /// Waits for all pending work recorded on this buffer.
    pub fn synchronize(&self) -> Result<()> {
        self.fence.host_wait(Access::Write)
    }

    /// The contents, after waiting for recorded GPU work that writes them.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.fence.host_wait(Access::Read)?;
        Ok(self.reg.slice())
    }

    /// The contents, writable, after waiting for all recorded GPU work.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.fence.host_wait(Access::Write)?;
        Ok(self.reg.slice_mut())
    }

    /// The host address, writable. Writing through it while GPU work on the buffer is pending
    /// is the caller's responsibility.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.reg.ptr.as_ptr()
    }
}

impl<T: Pod> Drop for RegisteredVec<T> {
    fn drop(&mut self) {
        // Drop never panics. Leak rather than free when in doubt: if pending work cannot be
        // waited for, or the range cannot be unregistered, the `Vec` is not freed.
        if self.fence.host_wait(Access::Write).is_ok() && self.reg.unregister().is_ok() {
            // SAFETY: dropped once, here; the memory is no longer registered or used.
            unsafe { ManuallyDrop::drop(&mut self.vec) };
        }
    }
}

/// For the two registered kinds: the accessors that delegate to their [`Registration`], and
/// the sealed copy traits.
macro_rules! impl_registered_memory {
    ($ty:ty, $($gen:tt)*) => {
        impl<$($gen)*> $ty {
            /// The flags of the registration.
            pub fn flags(&self) -> HostRegisterFlags {
                self.reg.flags
            }

            /// The host address.
            pub fn as_ptr(&self) -> *const T {
                self.reg.ptr.as_ptr()
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                self.reg.len
            }

            /// Always false: registrations hold at least one element.
            pub fn is_empty(&self) -> bool {
                self.reg.len == 0
            }

            /// Size in bytes.
            pub fn byte_len(&self) -> usize {
                self.reg.len * std::mem::size_of::<T>()
            }
        }

        impl<$($gen)*> sealed::Raw<T> for $ty {
            fn raw_ptr(&self) -> *const T {
                self.reg.ptr.as_ptr()
            }
            fn raw_len(&self) -> usize {
                self.reg.len
            }
            fn loc(&self) -> Loc {
                Loc::Pinned
            }
            fn fence(&self) -> Option<&Fence> {
                self.fence_opt()
            }
        }
        impl<$($gen)*> sealed::RawMut<T> for $ty {
            fn raw_mut_ptr(&mut self) -> *mut T {
                self.reg.ptr.as_ptr()
            }
            fn check_device_writable(&self, op: &'static str) -> Result<()> {
                self.reg.check_device_writable(op)
            }
        }
    };
}
impl_registered_memory!(RegisteredSlice<'_, T>, T: Pod);
impl_registered_memory!(RegisteredVec<T>, T: Pod);

impl<T: Pod> sealed::Async<T> for RegisteredVec<T> {
    fn device_addr(&self) -> Result<*const T> {
        host_device_pointer(self.reg.ptr.as_ptr())
    }
    fn async_fence(&self) -> &Fence {
        &self.fence
    }
}
