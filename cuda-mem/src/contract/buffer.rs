//! The one owned buffer type: [`Buffer`] holds what every owned buffer is (address, length,
//! element type, fence) and an [`Allocation`] value that says how the memory was obtained
//! and how it goes back. `Drop`, [`free`](Buffer::free), [`into_raw`](Buffer::into_raw), the
//! accessors, host access and the sealed copy and device-pointer traits are written here,
//! once; the kinds (`DeviceBuffer`, `PinnedBuffer`, `ManagedBuffer`, `MappedBuffer`, and
//! `ipc::ImportedBuffer`) are `Buffer` with their allocation, plus the constructors and
//! operations that make sense for them.
//!
//! Alignment is checked once too: every constructor places its allocation through
//! [`Layout`](crate::contract::layout::Layout) before it becomes a `Buffer`.

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use bytemuck::Pod;

use crate::contract::memory::{sealed as mem, Loc};
use crate::error::Result;
use crate::fence::{Access, Fence};
use crate::handles::devices::Device;
use crate::handles::stream::Stream;

pub(crate) mod sealed {
    use std::fmt;
    use std::ptr::NonNull;

    use crate::contract::memory::Loc;
    use crate::error::Result;
    use crate::fence::Fence;
    use crate::handles::devices::Device;
    use crate::handles::stream::Stream;

    /// What [`Allocation`](super::Allocation) carries. Implemented in this crate only: an
    /// implementation promises that the memory it describes may be used from any host thread,
    /// and that dropping the value never frees the memory (only [`release`](Alloc::release)
    /// does, exactly once, and `into_raw` gives it away instead).
    pub trait Alloc: fmt::Debug + Send + Sync + Sized {
        /// Where the memory lives.
        const LOC: Loc;
        /// The kind's name, for `Debug`.
        const KIND: &'static str;

        /// The device the memory lives on, which device-side copies run on: device memory's;
        /// `None` for host and managed memory.
        fn located_on(&self) -> Option<Device> {
            None
        }

        /// The address kernels use for the memory at `ptr` (host memory: its device address).
        fn device_addr(&self, ptr: NonNull<u8>) -> Result<*const u8> {
            Ok(ptr.as_ptr())
        }

        /// Refuses GPU work on `stream` that the memory's state forbids.
        fn check_stream(&self, _stream: &Stream, _op: &'static str) -> Result<()> {
            Ok(())
        }

        /// Before `into_raw`: refuses to give the memory up (it cannot be freed by the call
        /// `into_raw` names), or prepares it (leaves a cache's accounting).
        fn detach(&mut self) -> Result<()> {
            Ok(())
        }

        /// Gives the `bytes` bytes at `ptr` back, after (or ordered after) all the work
        /// `fence` records. Called at most once; the buffer never uses the memory again. On
        /// error the memory must be leaked, never freed while work may still use it.
        fn release(&mut self, ptr: NonNull<u8>, bytes: usize, fence: &mut Fence) -> Result<()>;
    }

    /// An allocation the host may read and write in place once the fence allows (pinned,
    /// mapped, managed memory). Implemented in this crate only: an implementation promises
    /// that the memory is host-accessible and initialised, and that host access needs nothing
    /// but the fence's wait and [`check_host`](HostAlloc::check_host).
    pub trait HostAlloc: Alloc {
        /// Refuses host access the memory's state forbids.
        fn check_host(&self) -> Result<()> {
            Ok(())
        }
    }
}

/// How an owned [`Buffer`]'s memory was obtained and how it goes back: `cudaMalloc` or a
/// stream-ordered pool for [`DeviceMemory`](crate::DeviceMemory), `cudaHostAlloc`, a pool,
/// the [`PinnedPool`](crate::PinnedPool) or `mmap` + register for
/// [`PinnedMemory`](crate::PinnedMemory), and so on. Sealed: the kinds of this crate only.
pub trait Allocation: sealed::Alloc {}
impl<A: sealed::Alloc> Allocation for A {}

/// An allocation the host can access in place ([`Buffer::as_slice`]). Sealed.
pub trait HostAllocation: sealed::HostAlloc {}
impl<A: sealed::HostAlloc> HostAllocation for A {}

/// An owned buffer of `T` in memory of the kind `A`, freed on drop the way it was allocated:
/// [`DeviceBuffer`](crate::DeviceBuffer), [`PinnedBuffer`](crate::PinnedBuffer),
/// [`ManagedBuffer`](crate::ManagedBuffer), [`MappedBuffer`](crate::MappedBuffer) and
/// [`ImportedBuffer`](crate::ipc::ImportedBuffer) (another process's memory) are this type.
///
/// Every buffer holds at least one element, carries a fence that records the GPU work queued
/// on it (host access, [`free`](Self::free), [`into_raw`](Self::into_raw) and drop wait for
/// it), and has the same accessors whatever its kind: [`len`](Self::len),
/// [`byte_len`](Self::byte_len), [`as_ptr`](Self::as_ptr) (the buffer's own address: host
/// memory's host address, device memory's device address), and for memory the host can
/// access [`as_slice`](Self::as_slice) / [`as_mut_slice`](Self::as_mut_slice).
// `repr(C)` and aligned to a cache line: the address and length, then the fence's words that
// every queued operation reads (`Fence`'s `capture` and its tracker's hot part), are the first
// 64 bytes, one line; the runtime call between two operations evicts what the library
// touched, and every further line is a miss at the next one.
#[repr(C, align(64))]
pub struct Buffer<T: Pod, A: Allocation> {
    pub(crate) ptr: NonNull<T>,
    pub(crate) len: usize,
    pub(crate) fence: Fence,
    pub(crate) alloc: A,
    _owns: PhantomData<T>,
}

// SAFETY: a buffer owns its allocation exclusively, like `Vec<T>`; every kind of CUDA memory
// may be used and freed from any host thread (the `Alloc` promise), and the allocation value
// is `Send` (its handles are thread-safe runtime handles). Moving the buffer to another thread
// moves that ownership and the `T` values, sound when `T: Send`.
unsafe impl<T: Pod + Send, A: Allocation> Send for Buffer<T, A> {}
// SAFETY: `&Buffer` allows reads only (host reads after a fence wait, copies out of it) and
// fence waits; the fence's state is behind a mutex (its allocation stream is a shared,
// never-changed handle), and the allocation value is `Sync`. Sharing it shares `&T`, sound
// when `T: Sync`.
unsafe impl<T: Pod + Sync, A: Allocation> Sync for Buffer<T, A> {}

impl<T: Pod, A: Allocation> fmt::Debug for Buffer<T, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(A::KIND)
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("alloc", &self.alloc)
            .field("fence", &self.fence)
            .finish()
    }
}

impl<T: Pod, A: Allocation> Buffer<T, A> {
    /// A buffer of `len` elements at `ptr` (placed for `T` by a `Layout`), guarded by `fence`.
    pub(crate) fn from_parts(ptr: NonNull<T>, len: usize, fence: Fence, alloc: A) -> Self {
        Buffer {
            ptr,
            len,
            fence,
            alloc,
            _owns: PhantomData,
        }
    }

    /// The parts, without releasing anything: the caller owns the memory again (to rebuild
    /// the buffer as another kind over the same allocation).
    pub(crate) fn into_parts(self) -> (NonNull<T>, usize, Fence, A) {
        let me = ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again; each field is moved out exactly once.
        unsafe {
            (
                me.ptr,
                me.len,
                std::ptr::read(&me.fence),
                std::ptr::read(&me.alloc),
            )
        }
    }

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

    /// The buffer's own address: the host address of host memory (pinned, mapped, managed),
    /// the device address of device memory.
    ///
    /// A raw address: to hand it to GPU work, take it from
    /// [`device_ptr`](crate::DevicePtr::device_ptr) or
    /// [`device_ptr_mut`](crate::DevicePtrMut::device_ptr_mut) instead, which order and record
    /// that work.
    pub fn as_ptr(&self) -> *const T {
        self.ptr.as_ptr()
    }

    /// The same address, writable. Writing through it while GPU work on the buffer is pending
    /// is the caller's responsibility.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// Waits for all pending work recorded on this buffer.
    pub fn synchronize(&self) -> Result<()> {
        self.fence.host_wait(Access::Write)
    }

    /// Gives the memory back (the drop path). On error it is leaked.
    fn release(&mut self) -> Result<()> {
        let bytes = self.byte_len();
        self.alloc
            .release(self.ptr.cast::<u8>(), bytes, &mut self.fence)
    }

    /// Frees the memory now and reports failure, which drop ignores.
    ///
    /// On failure the memory is leaked, never handed back: either pending GPU work could not
    /// be waited for (it may still use the memory), or the free itself failed (a retry could
    /// free twice).
    pub fn free(self) -> Result<()> {
        let mut me = ManuallyDrop::new(self);
        let result = me.release();
        // SAFETY: `me` is never used or dropped again; the memory is freed (or leaked on
        // error, see above). The fence and the allocation value (whose drop never frees the
        // memory: the `Alloc` promise) are dropped, each once.
        unsafe {
            std::ptr::drop_in_place(&mut me.fence);
            std::ptr::drop_in_place(&mut me.alloc);
        }
        result
    }

    /// Gives up ownership of the memory, for another library or C++ code to free with the
    /// call that matches how it was allocated (`cudaFree` for device and managed memory,
    /// `cudaFreeHost` for pinned and mapped memory, `cudaFreeAsync` or `cudaFree` for memory
    /// from a pool; for another process's memory, the call that closes its mapping, see
    /// [`ImportedBuffer`](crate::ipc::ImportedBuffer)). Pending work recorded on the buffer is waited for first; if that wait
    /// fails, the memory is leaked (as by `free`) and the error returned.
    ///
    /// A pinned buffer from a [`PinnedPool`](crate::PinnedPool) leaves the pool (free it with
    /// `cudaFreeHost`); pinned memory made by `mmap` + `cudaHostRegister`
    /// ([`PinStrategy::MapRegister`](crate::PinStrategy), and pool blocks of 4 MiB or more)
    /// cannot be freed by `cudaFreeHost` and is refused with
    /// [`Misuse::InvalidArgument`](crate::Misuse::InvalidArgument): the buffer is then
    /// released as by drop.
    pub fn into_raw(mut self) -> Result<(*mut T, usize)> {
        self.alloc.detach()?;
        let mut me = ManuallyDrop::new(self);
        let waited = me.fence.host_wait_mut(Access::Write);
        // SAFETY: `me` is never used or dropped again; the memory passes to the caller (or is
        // leaked, on error). The fence and the detached allocation value (whose drop never
        // frees the memory) are dropped, each once.
        unsafe {
            std::ptr::drop_in_place(&mut me.fence);
            std::ptr::drop_in_place(&mut me.alloc);
        }
        waited.map(|()| (me.ptr.as_ptr(), me.len))
    }
}

impl<T: Pod, A: HostAllocation> Buffer<T, A> {
    /// The contents, after waiting for queued GPU work that writes the buffer (work that only
    /// reads it may go on: neither side changes the memory).
    ///
    /// On write-combined pinned memory this read is uncached and very slow; managed memory on
    /// a device without concurrent managed access is refused with
    /// [`Misuse::Unsupported`](crate::Misuse::Unsupported) (see
    /// [`ManagedBuffer`](crate::ManagedBuffer)).
    pub fn as_slice(&self) -> Result<&[T]> {
        self.alloc.check_host()?;
        self.fence.host_wait(Access::Read)?;
        // SAFETY: the allocation holds `len` initialised, host-accessible elements (the
        // `HostAlloc` promise; `T: Pod`); GPU work that may write them was waited for above,
        // and safe code can queue new writes only through `&mut self` (a copy's destination,
        // `device_ptr_mut`), impossible while this shared borrow lives. The borrow keeps the
        // memory alive.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The contents, writable, after waiting for all queued GPU work on the buffer.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.alloc.check_host()?;
        self.fence.host_wait_mut(Access::Write)?;
        // SAFETY: as for `as_slice`; `&mut self` makes the borrow unique, and no GPU work that
        // uses the buffer can be queued through safe code while it lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }
}

impl<T: Pod, A: Allocation> Drop for Buffer<T, A> {
    fn drop(&mut self) {
        // Errors are ignored: cudaErrorCudartUnloading at exit, or a sticky context error after
        // which the memory is gone with the context anyway; when the wait fails, `release`
        // leaks rather than frees. Drop never panics.
        let _ = self.release();
    }
}

impl<T: Pod, A: Allocation> mem::Raw<T> for Buffer<T, A> {
    fn raw_ptr(&self) -> *const T {
        self.ptr.as_ptr()
    }
    fn raw_len(&self) -> usize {
        self.len
    }
    fn loc(&self) -> Loc {
        A::LOC
    }
    fn fence(&self) -> Option<&Fence> {
        Some(&self.fence)
    }
    fn check_stream(&self, stream: &Stream, op: &'static str) -> Result<()> {
        self.alloc.check_stream(stream, op)
    }
    fn device_ordinal(&self) -> Option<i32> {
        self.alloc.located_on().map(Device::ordinal)
    }
}

impl<T: Pod, A: Allocation> mem::RawMut<T> for Buffer<T, A> {
    fn raw_mut_ptr(&mut self) -> *mut T {
        self.ptr.as_ptr()
    }
}

impl<T: Pod, A: Allocation> mem::Async<T> for Buffer<T, A> {
    fn device_addr(&self) -> Result<*const T> {
        Ok(self.alloc.device_addr(self.ptr.cast::<u8>())?.cast::<T>())
    }
    fn async_fence(&self) -> &Fence {
        &self.fence
    }
}

impl<T: Pod, A: HostAllocation> mem::Host<T> for Buffer<T, A> {
    fn check_host(&self) -> Result<()> {
        self.alloc.check_host()
    }
}
