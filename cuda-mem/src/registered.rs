//! Registered host memory: an existing slice or `Vec` pinned in place (`cudaHostRegister`),
//! unregistered on drop (`cudaHostUnregister`).
//!
//! Registration locks the pages the memory already has, which avoids a copy into a separate
//! pinned buffer; it still costs milliseconds per hundred MiB, so register long-lived buffers.

use std::fmt;
use std::ptr::NonNull;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::copy::{sealed, AsyncMemory, Side};
use crate::error::{check, Error, Misuse, Result};
use crate::fence::Fence;
use crate::flags::flag_set;
use crate::size::{self, fmt_bytes};
use crate::stream::Stream;

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
    fence: Fence,
}

impl<T: Pod> Registration<T> {
    fn new(slice: &mut [T], flags: HostRegisterFlags, op: &'static str) -> Result<Self> {
        let bytes = size::alloc_bytes::<T>(slice.len(), op)?;
        if HostRegisterFlags::from_bits(flags.bits()).is_none() {
            return Err(Misuse::InvalidFlags {
                op: "cudaHostRegister",
                flags: flags.bits(),
            }
            .into());
        }
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
            fence: Fence::default(),
        })
    }

    fn device_ptr(&self) -> Result<*mut T> {
        let mut dev = std::ptr::null_mut();
        let p = self.ptr.as_ptr();
        // SAFETY: valid out-pointer; `p` is our live registered range; flags must be 0.
        let code = unsafe { sys::cudaHostGetDevicePointer(&mut dev, p.cast(), 0) };
        check(code, || format!("cudaHostGetDevicePointer({p:p})"))?;
        Ok(dev.cast())
    }

    fn as_slice(&self) -> Result<&[T]> {
        self.fence.wait()?;
        // SAFETY: the range is memory the owner keeps alive and initialised; GPU work that may
        // write it was waited for, and new writes need `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.fence.wait()?;
        // SAFETY: as `as_slice`, with `&mut self` making the borrow unique.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    fn release(&self) -> Result<()> {
        self.fence.wait()?;
        let p = self.ptr.as_ptr();
        // SAFETY: `p` is the start of a range we registered; it is not used as registered after.
        check(unsafe { sys::cudaHostUnregister(p.cast()) }, || {
            format!("cudaHostUnregister({p:p})")
        })
    }
}

impl<T> Drop for Registration<T> {
    fn drop(&mut self) {
        // Drop never panics; errors (exit-time unloading, sticky errors) are ignored. If the
        // fence wait fails the GPU context is gone, so no DMA can still touch the memory.
        let _ = self.fence.wait();
        let p = self.ptr.as_ptr();
        // SAFETY: as in `release`.
        unsafe { sys::cudaHostUnregister(p.cast()) };
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
/// touched behind the registration's back. Copies to and from it are synchronous only: if an
/// asynchronous copy could be pending, `std::mem::forget` on this value would end the borrow
/// while DMA still runs. For asynchronous copies, move the `Vec` into a [`RegisteredVec`].
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
// SAFETY: shared access yields `&[T]` after the mutex-protected fence wait, like `&&mut [T]`.
unsafe impl<T: Pod + Sync> Sync for RegisteredSlice<'_, T> {}

impl<'a, T: Pod> RegisteredSlice<'a, T> {
    /// Pins `slice` in place with `cudaHostRegister(flags)`.
    ///
    /// Errors: an empty slice is [`Misuse::ZeroLength`]; unknown flag bits are
    /// [`Misuse::InvalidFlags`]; memory registered already gives the runtime's
    /// `cudaErrorHostMemoryAlreadyRegistered`.
    pub fn register(slice: &'a mut [T], flags: HostRegisterFlags) -> Result<Self> {
        Ok(RegisteredSlice {
            reg: Registration::new(slice, flags, "RegisteredSlice::register")?,
            _borrow: std::marker::PhantomData,
        })
    }

    /// Unregisters now and reports failure; on failure the registration comes back.
    pub fn unregister(self) -> Result<(), (Self, Error)> {
        match self.reg.release() {
            Ok(()) => {
                let mut me = std::mem::ManuallyDrop::new(self);
                // SAFETY: `me` is never used again; the registration is undone, so only its
                // fence is dropped.
                unsafe { std::ptr::drop_in_place(&mut me.reg.fence) };
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }
}

/// A `Vec` moved in and pinned in place; asynchronous copies may use it.
///
/// Owning the `Vec` makes asynchronous use sound: the memory cannot be freed before this value
/// drops (which waits for pending work, then unregisters, then frees the `Vec`), and leaking it
/// leaks the memory instead of freeing it under running DMA.
#[derive(Debug)]
pub struct RegisteredVec<T: Pod> {
    // Field order matters: the registration (which waits and unregisters) drops first.
    reg: Registration<T>,
    vec: Vec<T>,
}

// SAFETY: owns a `Vec<T>` plus a registration of its heap buffer, which moving does not move.
unsafe impl<T: Pod + Send> Send for RegisteredVec<T> {}
// SAFETY: shared access yields `&[T]` after the mutex-protected fence wait.
unsafe impl<T: Pod + Sync> Sync for RegisteredVec<T> {}

impl<T: Pod> RegisteredVec<T> {
    /// Pins the `Vec`'s elements in place with `cudaHostRegister(flags)`.
    pub fn register(mut vec: Vec<T>, flags: HostRegisterFlags) -> Result<Self> {
        let reg = Registration::new(&mut vec, flags, "RegisteredVec::register")?;
        Ok(RegisteredVec { reg, vec })
    }

    /// Waits for pending work, unregisters, and gives the `Vec` back.
    pub fn into_vec(self) -> Result<Vec<T>, (Self, Error)> {
        if let Err(e) = self.reg.release() {
            return Err((self, e));
        }
        let mut me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again. The Vec is moved out; of the
        // registration, already undone by `release`, only the fence (an event) is dropped.
        unsafe {
            std::ptr::drop_in_place(&mut me.reg.fence);
            Ok(std::ptr::read(&me.vec))
        }
    }

    /// Records that work queued on `stream` uses the memory: host access and drop wait for it.
    pub fn record_use(&self, stream: &Stream) -> Result<()> {
        self.reg.fence.before(stream)?;
        self.reg.fence.record(stream)
    }

    /// Waits for all pending work recorded on this buffer.
    pub fn synchronize(&self) -> Result<()> {
        self.reg.fence.wait()
    }
}

/// For the two registered kinds: the sealed copy traits and the accessors that delegate to
/// their [`Registration`].
macro_rules! impl_registered_memory {
    ($ty:ty, $($gen:tt)*) => {
        impl<$($gen)*> $ty {
            /// The flags of the registration.
            pub fn flags(&self) -> HostRegisterFlags {
                self.reg.flags
            }

            /// The device address of MAPPED registrations (`cudaHostGetDevicePointer`).
            pub fn device_ptr(&self) -> Result<*mut T> {
                self.reg.device_ptr()
            }

            /// The contents, after waiting for recorded GPU work.
            pub fn as_slice(&self) -> Result<&[T]> {
                self.reg.as_slice()
            }

            /// The contents, writable, after waiting for recorded GPU work.
            pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
                self.reg.as_mut_slice()
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
            fn side(&self) -> Side {
                Side::Host
            }
            fn fence(&self) -> Option<&Fence> {
                Some(&self.reg.fence)
            }
        }
        impl<$($gen)*> sealed::RawMut<T> for $ty {
            fn raw_mut_ptr(&mut self) -> *mut T {
                self.reg.ptr.as_ptr()
            }
        }
    };
}
impl_registered_memory!(RegisteredSlice<'_, T>, T: Pod);
impl_registered_memory!(RegisteredVec<T>, T: Pod);
impl<T: Pod> AsyncMemory<T> for RegisteredVec<T> {}
