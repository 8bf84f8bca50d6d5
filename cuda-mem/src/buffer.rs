//! What the owned buffer kinds (device, pinned, managed) have in common, generated once.

/// For a buffer type `$ty<T>` with fields `ptr: NonNull<T>`, `len: usize`, `fence: Fence` and
/// a method `fn release(&self) -> Result<()>` that waits for the fence and frees the memory,
/// generates: the sealed copy traits (on side `$side`), `len`, `is_empty`, `byte_len`,
/// `as_ptr` (documented by `$addr`), `as_mut_ptr`, `record_use`, `synchronize`, the fallible
/// `free`, and a `Drop` that never panics.
macro_rules! impl_buffer {
    ($ty:ident, $side:expr, $addr:literal) => {
        impl<T: bytemuck::Pod> $crate::copy::sealed::Raw<T> for $ty<T> {
            fn raw_ptr(&self) -> *const T {
                self.ptr.as_ptr()
            }
            fn raw_len(&self) -> usize {
                self.len
            }
            fn side(&self) -> $crate::copy::Side {
                $side
            }
            fn fence(&self) -> Option<&$crate::fence::Fence> {
                Some(&self.fence)
            }
        }

        impl<T: bytemuck::Pod> $crate::copy::sealed::RawMut<T> for $ty<T> {
            fn raw_mut_ptr(&mut self) -> *mut T {
                self.ptr.as_ptr()
            }
        }

        impl<T: bytemuck::Pod> $crate::copy::AsyncMemory<T> for $ty<T> {}

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
            pub fn as_ptr(&self) -> *const T {
                self.ptr.as_ptr()
            }

            /// The same address, writable. Writing through it while GPU work on the buffer is
            /// pending is the caller's responsibility.
            pub fn as_mut_ptr(&mut self) -> *mut T {
                self.ptr.as_ptr()
            }

            /// Records that work the caller queued on `stream` (e.g. a kernel given this
            /// buffer's address) uses the buffer: host access, synchronous copies and drop then
            /// wait for it. It is ordered after work already recorded from other streams.
            pub fn record_use(&self, stream: &$crate::Stream) -> $crate::Result<()> {
                self.fence.before(stream)?;
                self.fence.record(stream)
            }

            /// Waits for all pending work recorded on this buffer.
            pub fn synchronize(&self) -> $crate::Result<()> {
                self.fence.wait()
            }

            /// Frees the memory now and reports failure, which drop ignores. On failure the
            /// buffer comes back with the error.
            pub fn free(self) -> Result<(), (Self, $crate::Error)> {
                match self.release() {
                    Ok(()) => {
                        let mut me = std::mem::ManuallyDrop::new(self);
                        // SAFETY: `me` is never used again and the memory is freed; only the
                        // fence (an event) is left to drop.
                        unsafe { std::ptr::drop_in_place(&mut me.fence) };
                        Ok(())
                    }
                    Err(e) => Err((self, e)),
                }
            }
        }

        impl<T: bytemuck::Pod> Drop for $ty<T> {
            fn drop(&mut self) {
                // Errors are ignored: cudaErrorCudartUnloading at exit, or a sticky context
                // error after which the memory is gone with the context anyway. Drop never
                // panics.
                let _ = self.release();
            }
        }
    };
}
pub(crate) use impl_buffer;
