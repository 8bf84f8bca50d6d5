//! What the owned buffer kinds (device, pinned, managed) have in common.

/// For a buffer type `$ty<T>` with fields `ptr: NonNull<T>`, `len: usize`, `fence: Fence`, and
/// methods `fn release(&mut self) -> Result<()>` (waits for the fence, then frees; returns before
/// freeing when the wait fails), `fn device_addr_impl(&self) -> Result<*const T>` and
/// `fn check_stream_impl(&self, &Stream, &'static str) -> Result<()>`,
/// `fn device_ordinal_impl(&self) -> Option<i32>` and
/// `fn before_into_raw(&mut self) -> Result<()>` (refuses, or prepares, giving the memory up): the sealed copy and
/// device-pointer trait impls (at location `$loc`), and the accessors, `synchronize`, the
/// fallible `free` and a `Drop` that never panics.
///
/// Fields named after the address text (`$extra`) are dropped by `free` too; `Drop` drops
/// every field anyway.
macro_rules! impl_buffer {
    ($ty:ident, $loc:expr, $addr:literal $(, $extra:ident)*) => {
        impl<T: bytemuck::Pod> $crate::contract::memory::sealed::Raw<T> for $ty<T> {
            fn raw_ptr(&self) -> *const T {
                self.ptr.as_ptr()
            }
            fn raw_len(&self) -> usize {
                self.len
            }
            fn loc(&self) -> $crate::contract::memory::Loc {
                $loc
            }
            fn fence(&self) -> Option<&$crate::fence::Fence> {
                Some(&self.fence)
            }
            fn check_stream(
                &self,
                stream: &$crate::Stream,
                op: &'static str,
            ) -> $crate::Result<()> {
                self.check_stream_impl(stream, op)
            }
            fn device_ordinal(&self) -> Option<i32> {
                self.device_ordinal_impl()
            }
        }

        impl<T: bytemuck::Pod> $crate::contract::memory::sealed::RawMut<T> for $ty<T> {
            fn raw_mut_ptr(&mut self) -> *mut T {
                self.ptr.as_ptr()
            }
        }

        impl<T: bytemuck::Pod> $crate::contract::memory::sealed::Async<T> for $ty<T> {
            fn device_addr(&self) -> $crate::Result<*const T> {
                self.device_addr_impl()
            }
            fn async_fence(&self) -> &$crate::fence::Fence {
                &self.fence
            }
        }

        impl<T: bytemuck::Pod> $ty<T> {
            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Always false: buffers hold at least one element.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Size in bytes.
            pub fn byte_len(&self) -> usize {
                self.len * std::mem::size_of::<T>()
            }

            #[doc = $addr]
            ///
            /// A raw address: to hand it to GPU work, take it from
            /// [`device_ptr`](crate::DevicePtr::device_ptr) or
            /// [`device_ptr_mut`](crate::DevicePtrMut::device_ptr_mut) instead, which order
            /// and record that work.
            pub fn as_ptr(&self) -> *const T {
                self.ptr.as_ptr()
            }

            /// The same address, writable. Writing through it while GPU work on the buffer is
            /// pending is the caller's responsibility.
            pub fn as_mut_ptr(&mut self) -> *mut T {
                self.ptr.as_ptr()
            }

            /// Waits for all pending work recorded on this buffer.
            pub fn synchronize(&self) -> $crate::Result<()> {
                self.fence.host_wait($crate::fence::Access::Write)
            }

            /// Frees the memory now and reports failure, which drop ignores.
            ///
            /// On failure the memory is leaked, never handed back: either pending GPU work
            /// could not be waited for (it may still use the memory), or the free itself
            /// failed (a retry could free twice).
            pub fn free(self) -> $crate::Result<()> {
                let mut me = std::mem::ManuallyDrop::new(self);
                let result = me.release();
                // SAFETY: `me` is never used or dropped again; the memory is freed (or leaked
                // on error, see above). Only the fence and the `$extra` fields are left to drop,
                // each once.
                unsafe {
                    std::ptr::drop_in_place(&mut me.fence);
                    $(std::ptr::drop_in_place(&mut me.$extra);)*
                }
                result
            }

            /// Gives up ownership of the memory, for another library or C++ code to free with
            /// the call that matches how it was allocated (`cudaFree` for device and managed
            /// memory, `cudaFreeHost` for pinned memory, `cudaFreeAsync` or `cudaFree` for
            /// memory from a pool). Pending work recorded on the buffer is waited for first; if
            /// that wait fails, the memory is leaked (as by `free`) and the error returned.
            ///
            /// A pinned buffer from a [`PinnedPool`](crate::PinnedPool) leaves the pool (free
            /// it with `cudaFreeHost`); pinned memory made by `mmap` + `cudaHostRegister`
            /// ([`PinStrategy::MapRegister`](crate::PinStrategy), and pool blocks of 4 MiB or
            /// more) cannot be freed by `cudaFreeHost` and is refused with
            /// [`Misuse::InvalidArgument`](crate::Misuse::InvalidArgument): the buffer is then
            /// released as by drop.
            pub fn into_raw(mut self) -> $crate::Result<(*mut T, usize)> {
                self.before_into_raw()?;
                let mut me = std::mem::ManuallyDrop::new(self);
                let waited = me.fence.host_wait_mut($crate::fence::Access::Write);
                // SAFETY: `me` is never used or dropped again; the memory passes to the caller
                // (or is leaked, on error). Only the fence and the `$extra` fields are dropped,
                // each once.
                unsafe {
                    std::ptr::drop_in_place(&mut me.fence);
                    $(std::ptr::drop_in_place(&mut me.$extra);)*
                }
                waited.map(|()| (me.ptr.as_ptr(), me.len))
            }
        }

        impl<T: bytemuck::Pod> Drop for $ty<T> {
            fn drop(&mut self) {
                // Errors are ignored: cudaErrorCudartUnloading at exit, or a sticky context
                // error after which the memory is gone with the context anyway; when the wait
                // fails, `release` leaks rather than frees. Drop never panics.
                let _ = self.release();
            }
        }
    };
}
pub(crate) use impl_buffer;
