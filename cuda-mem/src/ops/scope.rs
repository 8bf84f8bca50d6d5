//! Scoped asynchronous work on borrowed memory: like [`std::thread::scope`], the scope waits
//! for everything queued on the memory it borrows before it returns, so ordinary slices
//! (`Vec`, `malloc`ed or `mmap`ed memory, with or without `cudaHostRegister`) may take part in
//! asynchronous copies and kernels without `unsafe`.
//!
//! ```no_run
//! # fn main() -> cuda_mem::Result<()> {
//! use cuda_mem::{copy_async, DeviceBuffer, Stream};
//! let stream = Stream::new()?;
//! let input = vec![1.5f32; 1 << 20];
//! let mut output = vec![0f32; 1 << 20];
//! let mut dev = DeviceBuffer::<f32>::uninit(1 << 20)?;
//! cuda_mem::scope(|s| {
//!     let (input, mut output) = (s.borrow(&input), s.borrow_mut(&mut output));
//!     copy_async(&mut dev, &input, &stream)?;    // cudaMemcpyAsync from a Vec
//!     // ... kernels on `dev` ...
//!     copy_async(&mut output, &dev, &stream)     // and back into one
//! })?;                                           // waits for all of it
//! assert_eq!(output[0], 1.5);
//! # Ok(()) }
//! ```
//!
//! The memory a scope borrows cannot be touched by safe code until the scope returns (`borrow`
//! takes a shared borrow, `borrow_mut` an exclusive one, both for the scope's whole life), and
//! the handles cannot leave the scope's closure. Memory that does not outlive the scope is
//! refused at compile time:
//!
//! ```compile_fail,E0597
//! # fn main() -> cuda_mem::Result<()> {
//! cuda_mem::scope(|s| {
//!     let v = vec![1u32; 4];
//!     let _b = s.borrow(&v); // error: `v` does not live long enough
//!     Ok(())
//! })?;
//! # Ok(()) }
//! ```

use std::marker::PhantomData;
use std::sync::OnceLock;

use bytemuck::Pod;

use crate::contract::memory::{sealed, Loc};
use crate::error::Result;
use crate::fence::{Access, Fence};
use crate::kinds::pinned::host_device_pointer;

/// The handle a [`scope`] closure gets; see the module docs.
pub struct Scope<'scope, 'env: 'scope> {
    /// Tracks the work on every borrowed slice, by address; waited for when the scope ends.
    fence: Fence,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope").field("fence", &self.fence).finish()
    }
}

/// Runs `f` with a [`Scope`] and waits, before returning, for every piece of work queued on
/// memory the scope borrowed (also when `f` returns an error or panics).
///
/// If that wait fails with an error after which the device may still be running the work
/// (not a sticky error, which ends all work with the context), the process is aborted: the
/// borrowed memory is about to be handed back to code that may free it, and nothing can make
/// that safe.
pub fn scope<'env, R>(
    f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<R>,
) -> Result<R> {
    let s = Scope {
        fence: Fence::default(),
        _scope: PhantomData,
        _env: PhantomData,
    };
    // Waits on every exit, unwinding included.
    struct Finish<'a, 'scope, 'env>(&'a Scope<'scope, 'env>);
    impl Drop for Finish<'_, '_, '_> {
        fn drop(&mut self) {
            let waited = self.0.fence.host_wait(Access::Write);
            crate::error::abort_if_still_in_use("cuda_mem::scope", "borrowed memory", &waited);
        }
    }
    let guard = Finish(&s);
    let r = f(&s);
    drop(guard);
    r
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Lends `data` to asynchronous work (as a copy's source, or a kernel's input through
    /// [`DevicePtr`](crate::DevicePtr) where the device can address it: registered or, on
    /// some systems, pageable memory) until the scope ends.
    pub fn borrow<T: Pod>(&'scope self, data: &'env [T]) -> Borrowed<'scope, T> {
        Borrowed {
            ptr: data.as_ptr(),
            len: data.len(),
            fence: &self.fence,
            device_addr: OnceLock::new(),
            _data: PhantomData,
        }
    }

    /// Lends `data` to asynchronous work that may also write it, until the scope ends.
    pub fn borrow_mut<T: Pod>(&'scope self, data: &'env mut [T]) -> BorrowedMut<'scope, T> {
        BorrowedMut {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            fence: &self.fence,
            device_addr: OnceLock::new(),
            _data: PhantomData,
        }
    }
}

/// A slice lent to a [`scope`] for reading: a copy's source, a kernel's input.
pub struct Borrowed<'scope, T> {
    ptr: *const T,
    len: usize,
    fence: &'scope Fence,
    /// The device address, looked up once (`cudaHostGetDevicePointer`).
    device_addr: OnceLock<usize>,
    _data: PhantomData<&'scope [T]>,
}

/// A slice lent to a [`scope`] for reading and writing.
pub struct BorrowedMut<'scope, T> {
    ptr: *mut T,
    len: usize,
    fence: &'scope Fence,
    /// The device address, looked up once (`cudaHostGetDevicePointer`).
    device_addr: OnceLock<usize>,
    _data: PhantomData<&'scope mut [T]>,
}

impl<T> std::fmt::Debug for Borrowed<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Borrowed({:p}, {} elements)", self.ptr, self.len)
    }
}

impl<T> std::fmt::Debug for BorrowedMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BorrowedMut({:p}, {} elements)", self.ptr, self.len)
    }
}

/// The two handles' trait impls: the scope's fence, keyed by address.
macro_rules! borrowed_raw {
    ($ty:ident) => {
        impl<T: Pod> sealed::Raw<T> for $ty<'_, T> {
            fn raw_ptr(&self) -> *const T {
                self.ptr
            }
            fn raw_len(&self) -> usize {
                self.len
            }
            fn loc(&self) -> Loc {
                Loc::Pageable
            }
            fn fence(&self) -> Option<&Fence> {
                Some(self.fence)
            }
            fn fence_base(&self) -> usize {
                self.ptr as usize
            }
        }

        impl<T: Pod> sealed::Async<T> for $ty<'_, T> {
            fn device_addr(&self) -> Result<*const T> {
                if let Some(&addr) = self.device_addr.get() {
                    return Ok(addr as *const T);
                }
                let addr = host_device_pointer(self.ptr as *const T)? as usize;
                Ok(*self.device_addr.get_or_init(|| addr) as *const T)
            }
            fn async_fence(&self) -> &Fence {
                self.fence
            }
        }

        impl<T> $ty<'_, T> {
            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the slice is empty.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }
        }
    };
}
borrowed_raw!(Borrowed);
borrowed_raw!(BorrowedMut);

impl<T: Pod> sealed::RawMut<T> for BorrowedMut<'_, T> {
    fn raw_mut_ptr(&mut self) -> *mut T {
        self.ptr
    }
}
