//! Registered host memory: an existing slice or `Vec` pinned in place (`cudaHostRegister`),
//! unregistered (`cudaHostUnregister`) when the closure that uses a slice returns
//! ([`RegisteredSlice::register`]), or when a [`RegisteredVec`] drops.
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
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::OnceLock;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::contract::layout::Layout;
use crate::contract::memory::{sealed, Loc};
use crate::contract::size::{self, fmt_bytes};
use crate::error::{check, Misuse, Result};
use crate::fence::{Access, Fence};
use crate::handles::flags::flag_set;
use crate::kinds::pinned::host_device_pointer;

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
    /// The device address (`cudaHostGetDevicePointer`), looked up on first use and kept for
    /// the registration's life, as C++ code looks it up once per buffer. Only a success is
    /// kept: memory registered without MAPPED may have no device address on some systems,
    /// and that error comes back at every use.
    device: OnceLock<usize>,
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
            device: OnceLock::new(),
        })
    }

    /// A registration made elsewhere, of `len` elements from `ptr` with `flags`.
    fn adopt(ptr: NonNull<T>, len: usize, flags: HostRegisterFlags) -> Self {
        Registration {
            ptr,
            len,
            flags,
            device: OnceLock::new(),
        }
    }

    /// The device address of the range, for kernels: looked up once (see `device`), on the
    /// device current at the first use. Under unified addressing (every 64-bit platform
    /// current CUDA supports) a mapped host range has one address in every context it is
    /// mapped into, so one lookup serves every stream.
    fn device_addr(&self) -> Result<*const T> {
        if let Some(&addr) = self.device.get() {
            return Ok(addr as *const T);
        }
        let addr = host_device_pointer(self.ptr.as_ptr())? as usize;
        // Another thread may have looked it up meanwhile: the same address.
        Ok(*self.device.get_or_init(|| addr) as *const T)
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
            .field("device", &self.device.get().map(|&a| a as *const T))
            .finish()
    }
}

/// A borrowed host slice pinned in place for the duration of a closure: see
/// [`register`](Self::register). Asynchronous copies, memsets, views and kernels (through
/// [`DevicePtr`](crate::DevicePtr) / [`DevicePtrMut`](crate::DevicePtrMut)) may use it, like
/// any buffer of this crate; host access waits for them.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{copy_async, DeviceBuffer, HostRegisterFlags, RegisteredSlice, Stream};
/// let stream = Stream::new()?;
/// let mut data = vec![3u16; 1 << 20];
/// let mut dev = DeviceBuffer::<u16>::uninit(data.len())?;
/// RegisteredSlice::register(&mut data, HostRegisterFlags::DEFAULT, |reg| {
///     copy_async(&mut dev, reg, &stream)?;  // DMA straight from the Vec's pages
///     // ... kernels on `dev` ...
///     copy_async(reg, &dev, &stream)         // and back
/// })?;                                       // waits for both copies, cudaHostUnregister
/// assert_eq!(data[0], 3);
/// # Ok(()) }
/// ```
///
/// The closure gets only a reference, which cannot leave it: the registration cannot be
/// forgotten, moved out or kept past its end.
///
/// ```compile_fail,E0521
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{HostRegisterFlags, RegisteredSlice};
/// let mut data = vec![0u32; 1024];
/// let mut kept = None;
/// RegisteredSlice::register(&mut data, HostRegisterFlags::DEFAULT, |reg| {
///     kept = Some(reg); // error: borrowed data escapes the closure
///     Ok(())
/// })?;
/// # drop(kept); Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{HostRegisterFlags, RegisteredSlice};
/// let mut data = vec![0u32; 1024];
/// // error: lifetime may not live long enough (the result cannot name the registration)
/// let reg = RegisteredSlice::register(&mut data, HostRegisterFlags::DEFAULT, |reg| Ok(reg))?;
/// # Ok(()) }
/// ```
///
/// Each registration's type has a lifetime of its own (its brand), so two of them, from
/// nested closures, cannot be swapped (which would end each one with the other's memory):
///
/// ```compile_fail,E0521
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{HostRegisterFlags, RegisteredSlice};
/// let (mut a, mut b) = (vec![0u32; 1024], vec![0u32; 1024]);
/// RegisteredSlice::register(&mut a, HostRegisterFlags::DEFAULT, |ra| {
///     RegisteredSlice::register(&mut b, HostRegisterFlags::DEFAULT, |rb| {
///         std::mem::swap(ra, rb); // error: borrowed data escapes outside of closure
///         Ok(())
///     })
/// })?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RegisteredSlice<'r, T: Pod> {
    reg: Registration<T>,
    fence: Fence,
    /// The brand: `'r` is the lifetime the closure of one [`register`](Self::register) call is
    /// generic over, invariant, so that no other registration's type is this one's.
    _brand: PhantomData<fn(&'r ()) -> &'r ()>,
}

// SAFETY: the value stands for a `&mut [T]` (the borrow `register` holds) and a fence whose
// state is behind a mutex: `Send` when `T: Send`.
unsafe impl<T: Pod + Send> Send for RegisteredSlice<'_, T> {}
// SAFETY: shared access yields `&[T]` after the mutex-protected fence wait, and read-only
// work; like `&&mut [T]`, sound when `T: Sync`.
unsafe impl<T: Pod + Sync> Sync for RegisteredSlice<'_, T> {}

impl<T: Pod> RegisteredSlice<'_, T> {
    /// Pins `slice` in place with `cudaHostRegister(flags)`, runs `f` with the registration,
    /// then ends it, on every way out of `f` (its result, an error, a panic): waits for all
    /// work recorded on the registration, then `cudaHostUnregister`.
    ///
    /// `f` may queue asynchronous work on the registration (it is [`AsyncMemory`]); nothing
    /// it does can keep that work, or the registration, from ending before `register`
    /// returns: `f` gets a reference that cannot leave it (`mem::forget` of a reference, or
    /// of a [`DeviceWrite`] guard, changes nothing: the end waits for the work recorded on
    /// the memory, not for the guards).
    ///
    /// Errors: an empty slice is [`Misuse::ZeroLength`]; memory registered already gives the
    /// runtime's `cudaErrorHostMemoryAlreadyRegistered` (`f` does not run). Then `f`'s error;
    /// when `f` succeeded, the error of the final wait (a sticky one: see below) or of
    /// `cudaHostUnregister`.
    ///
    /// If the final wait fails with an error after which the device may still be running
    /// the work (not a sticky error, which ends all work with the context), the process is
    /// aborted, as [`scope`](crate::scope) does: the memory is about to go back to its owner,
    /// who may free it, and nothing can make that safe.
    ///
    /// [`AsyncMemory`]: crate::AsyncMemory
    /// [`DeviceWrite`]: crate::DeviceWrite
    pub fn register<R>(
        slice: &mut [T],
        flags: HostRegisterFlags,
        f: impl for<'r> FnOnce(&mut RegisteredSlice<'r, T>) -> Result<R>,
    ) -> Result<R> {
        let reg = Registration::new(slice, flags, "RegisteredSlice::register")?;
        let mut ended = Ok(());
        let result = {
            let mut end = End {
                slice: RegisteredSlice {
                    reg,
                    fence: Fence::default(),
                    _brand: PhantomData,
                },
                ended: &mut ended,
            };
            // `f` gets a reference into `end`, which ends the registration when it drops:
            // right after `f` returns, or while a panic unwinds out of it.
            f(&mut end.slice)
        };
        let value = result?;
        ended?;
        Ok(value)
    }
}

/// The end of a [`RegisteredSlice::register`] call's registration, on its drop: after the
/// closure returned, or while a panic unwinds out of it. Only the crate holds one; the closure
/// gets a reference to the registration inside, so this drop cannot be skipped.
struct End<'e, 'r, T: Pod> {
    slice: RegisteredSlice<'r, T>,
    /// Where the outcome goes, for `register` to return.
    ended: &'e mut Result<()>,
}

impl<T: Pod> Drop for End<'_, '_, T> {
    fn drop(&mut self) {
        let s = &mut self.slice;
        // Exclusive: the closure is over, so no guard can still be queueing (the count of
        // any it leaked with `mem::forget` is dropped, and the wait covers every mark).
        let waited = s.fence.host_wait_mut(Access::Write);
        // A failure that leaves the work possibly running, on memory about to go back to its
        // owner (the borrow ends with `register`), has no safe way on, and a borrowed slice
        // cannot be leaked: abort, as `scope` does, rather than let DMA hit freed memory.
        crate::error::abort_if_still_in_use(
            "cuda_mem::RegisteredSlice::register",
            "the registered memory",
            &waited,
        );
        // No work can use the range any more (waited, or the context is gone).
        let unregistered = s.reg.unregister();
        *self.ended = waited.and(unregistered);
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
        let p = Layout::adopt(ptr, len, op)?;
        if capacity < len {
            return Err(Misuse::InvalidArgument {
                op,
                reason: format!("capacity {capacity} is less than the length {len}"),
            }
            .into());
        }
        crate::handles::pointer::require_pinned(p.as_ptr(), len, op)?;
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
        let waited = me.fence.host_wait_mut(Access::Write);
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
            .host_wait_mut(Access::Write)
            .and_then(|()| me.reg.unregister());
        // SAFETY: `me` is never used or dropped again. The fence is dropped once, here; the
        // Vec is moved out only when its memory is unused and unregistered (else leaked).
        unsafe {
            std::ptr::drop_in_place(&mut me.fence);
            result.map(|()| ManuallyDrop::take(&mut me.vec))
        }
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
        if self.fence.host_wait_mut(Access::Write).is_ok() && self.reg.unregister().is_ok() {
            // SAFETY: dropped once, here; the memory is no longer registered or used.
            unsafe { ManuallyDrop::drop(&mut self.vec) };
        }
    }
}

/// For the two registered kinds: the accessors that delegate to their [`Registration`], and
/// the sealed copy traits (both kinds have a fence, and no safe code can end either
/// registration, or free its memory, while recorded work runs: hence `Async`).
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

            /// Waits for all pending work recorded on the registered memory.
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
                self.fence.host_wait_mut(Access::Write)?;
                Ok(self.reg.slice_mut())
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
                Some(&self.fence)
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
        impl<$($gen)*> sealed::Async<T> for $ty {
            fn device_addr(&self) -> Result<*const T> {
                self.reg.device_addr()
            }
            fn async_fence(&self) -> &Fence {
                &self.fence
            }
        }
        // The registered range is the owner's host memory, alive while `self` is.
        impl<$($gen)*> sealed::Host<T> for $ty {}
    };
}
impl_registered_memory!(RegisteredSlice<'_, T>, T: Pod);
impl_registered_memory!(RegisteredVec<T>, T: Pod);
