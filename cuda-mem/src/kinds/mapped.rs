//! Zero-copy mapped memory: pinned host memory mapped into the device's address space
//! (`cudaHostAlloc(cudaHostAllocMapped)` + `cudaHostGetDevicePointer`).
//!
//! Kernels read and write it directly over the bus: no copy, but every access crosses PCIe
//! (tens of GB/s, against terabytes per second for device memory). Good for data touched once,
//! or for small flags shared by CPU and GPU.
//!
//! The two functions mirror both shapes of the well-known C++ helper `cudaAllocMapped`:
//! [`alloc_mapped`] gives the CPU and the GPU pointer, [`alloc_mapped_uva`] one pointer that
//! must be the same on both sides under unified virtual addressing. Unlike the C++ original,
//! every error path frees the allocation: the buffer is owned from the moment it exists.

use std::ptr::NonNull;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::contract::buffer::sealed::{Alloc, HostAlloc};
use crate::contract::buffer::Buffer;
use crate::contract::layout::Layout;
use crate::contract::memory::Loc;
use crate::contract::size;
use crate::error::{Misuse, Result};
use crate::fence::{Access, Fence};
use crate::handles::devices::Device;
use crate::handles::flags::HostAllocFlags;
use crate::kinds::pinned::{host_device_pointer, PinnedBuffer, PinnedMemory};

/// Pinned host memory mapped into the device address space, freed on drop.
///
/// The CPU side is [`as_ptr`](Buffer::as_ptr) / [`as_slice`](Buffer::as_slice), the GPU side
/// [`device_address`](Buffer::device_address); kernels take it through
/// [`device_ptr`](crate::DevicePtr::device_ptr) / [`device_ptr_mut`](crate::DevicePtrMut::device_ptr_mut),
/// which order and record their work. Under unified virtual addressing (every 64-bit platform
/// CUDA 12 and 13 support) the two addresses are equal.
pub type MappedBuffer<T> = Buffer<T, MappedMemory>;

/// How a [`MappedBuffer`]'s memory was obtained (`cudaHostAlloc` with MAPPED, as a
/// [`PinnedMemory`]), and its device address, looked up once at allocation.
#[derive(Debug)]
pub struct MappedMemory {
    pinned: PinnedMemory,
    /// `cudaHostGetDevicePointer` of the memory (an address, never dereferenced here).
    device_addr: usize,
}

impl MappedMemory {
    /// The flags the memory was allocated with (MAPPED among them).
    pub(crate) fn flags(&self) -> HostAllocFlags {
        self.pinned.flags()
    }
}

impl Alloc for MappedMemory {
    const LOC: Loc = Loc::Pinned;
    const KIND: &'static str = "MappedBuffer";

    fn device_addr(&self, _ptr: NonNull<u8>) -> Result<*const u8> {
        Ok(self.device_addr as *const u8)
    }

    fn detach(&mut self) -> Result<()> {
        self.pinned.detach()
    }

    fn release(&mut self, ptr: NonNull<u8>, bytes: usize, fence: &mut Fence) -> Result<()> {
        self.pinned.release(ptr, bytes, fence)
    }
}

// Mapped memory is pinned host memory, initialised by every safe constructor.
impl HostAlloc for MappedMemory {}

/// Checks that the current device can map host memory and has unified addressing.
fn check_device() -> Result<()> {
    let dev = Device::current()?;
    dev.require(
        sys::cudaDeviceAttr::cudaDevAttrCanMapHostMemory,
        "cudaDevAttrCanMapHostMemory (mapped pinned memory)",
    )?;
    dev.require(
        sys::cudaDeviceAttr::cudaDevAttrUnifiedAddressing,
        "cudaDevAttrUnifiedAddressing (unified virtual addressing)",
    )
}

/// Asks the runtime for the device pointer of a mapped allocation.
fn device_pointer(host: *mut std::os::raw::c_void) -> Result<*mut std::os::raw::c_void> {
    Ok(host_device_pointer(host.cast_const())?.cast_mut())
}

impl<T: Pod> MappedBuffer<T> {
    /// Allocates `len` zeroed elements of mapped memory; `extra` may add PORTABLE and
    /// WRITE_COMBINED (MAPPED is always set).
    pub fn zeroed(len: usize, extra: HostAllocFlags) -> Result<Self> {
        Self::with_resolver(len, extra, false, device_pointer, "MappedBuffer::zeroed")
    }

    /// Like [`zeroed`](Self::zeroed) without the zero fill, which dominates the cost of small
    /// allocations.
    ///
    /// # Safety
    /// The memory is uninitialised: write it (from the host, or from the device through
    /// [`device_ptr_mut`](crate::DevicePtrMut::device_ptr_mut)) before reading it through
    /// [`as_slice`](Self::as_slice).
    pub unsafe fn uninit(len: usize, extra: HostAllocFlags) -> Result<Self> {
        let host = || {
            // SAFETY: the caller takes on the initialisation duty.
            unsafe {
                PinnedBuffer::<T>::host_alloc(
                    len,
                    extra | HostAllocFlags::MAPPED,
                    "MappedBuffer::uninit",
                )
            }
        };
        Self::build(len, host, false, device_pointer, "MappedBuffer::uninit")
    }

    /// The allocation path, with the device-pointer lookup as a parameter so tests can make it
    /// fail and check that nothing leaks. `uva` requires the two pointers to be equal.
    pub(crate) fn with_resolver(
        len: usize,
        extra: HostAllocFlags,
        uva: bool,
        resolve: impl FnOnce(*mut std::os::raw::c_void) -> Result<*mut std::os::raw::c_void>,
        op: &'static str,
    ) -> Result<Self> {
        let host = || PinnedBuffer::<T>::zeroed(len, extra | HostAllocFlags::MAPPED);
        Self::build(len, host, uva, resolve, op)
    }

    fn build(
        len: usize,
        alloc: impl FnOnce() -> Result<PinnedBuffer<T>>,
        uva: bool,
        resolve: impl FnOnce(*mut std::os::raw::c_void) -> Result<*mut std::os::raw::c_void>,
        op: &'static str,
    ) -> Result<Self> {
        // The element type and length first (also refused without a device).
        Layout::<T>::of(len, op)?;
        check_device()?;
        // Owned from here on: any `?` below drops `host`, which calls cudaFreeHost.
        let mut host = alloc()?;
        let hp = host.as_mut_ptr();
        let dp = resolve(hp.cast())?;
        let device_ptr = NonNull::new(dp.cast::<T>()).ok_or(Misuse::NullPointer {
            op: "cudaHostGetDevicePointer",
        })?;
        if uva && !std::ptr::eq(dp.cast::<T>(), hp) {
            return Err(Misuse::UvaPointerMismatch {
                host: hp as usize,
                device: dp as usize,
            }
            .into());
        }
        Ok(Self::over(host, device_ptr))
    }

    /// The pinned buffer `host`, mapped at `device_ptr`, as a mapped buffer (the same memory,
    /// fence and allocation).
    fn over(host: PinnedBuffer<T>, device_ptr: NonNull<T>) -> Self {
        let (ptr, len, fence, pinned) = host.into_parts();
        let device_addr = device_ptr.as_ptr() as usize;
        Buffer::from_parts(
            ptr,
            len,
            fence,
            MappedMemory {
                pinned,
                device_addr,
            },
        )
    }

    /// Takes ownership of mapped memory allocated elsewhere (C or C++ code) with
    /// `cudaHostAlloc(flags)`, `flags` including MAPPED; freed with `cudaFreeHost` on drop. The
    /// device address is looked up here (`cudaHostGetDevicePointer`).
    ///
    /// Everything is checked before anything is adopted, so on error the memory stays the
    /// caller's: [`Misuse::NullPointer`], [`Misuse::ZeroLength`], [`Misuse::SizeOverflow`],
    /// [`Misuse::Misaligned`]; [`Misuse::InvalidFlags`] for flags without MAPPED; [`Misuse::Unsupported`] when the current device cannot map host memory;
    /// [`Misuse::InvalidArgument`] when the runtime does not know the first or the last element
    /// as page-locked host memory (`cudaPointerGetAttributes`); the runtime's error when it has
    /// no device address for it (`cudaHostGetDevicePointer`).
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use cuda_mem::{HostAllocFlags, MappedBuffer};
    /// let m = MappedBuffer::<u32>::zeroed(1024, HostAllocFlags::DEFAULT)?;
    /// let (p, n) = m.into_raw()?;          // e.g. handed to C++ code, then back:
    /// // SAFETY: `p` is the cudaHostAlloc(MAPPED) memory of `n` u32 that `into_raw` gave up.
    /// let m = unsafe { MappedBuffer::from_raw(p, n, HostAllocFlags::MAPPED)? };
    /// # drop(m); Ok(()) }
    /// ```
    ///
    /// # Safety
    /// `ptr` must come from `cudaHostAlloc` with `flags` (MAPPED among them), hold at least
    /// `len` initialised elements, not be freed elsewhere, not be owned by anything else, and
    /// have no GPU work pending on it.
    pub unsafe fn from_raw(ptr: *mut T, len: usize, flags: HostAllocFlags) -> Result<Self> {
        let op = "MappedBuffer::from_raw";
        let p = Layout::adopt(ptr, len, op)?;
        if !flags.contains(HostAllocFlags::MAPPED) {
            return Err(Misuse::InvalidFlags {
                op: "MappedBuffer::from_raw (MAPPED is required)",
                flags: flags.bits(),
            }
            .into());
        }
        check_device()?;
        crate::handles::pointer::require_pinned(p.as_ptr(), len, op)?;
        let dp = device_pointer(p.as_ptr().cast())?;
        let device_ptr = NonNull::new(dp.cast::<T>()).ok_or(Misuse::NullPointer {
            op: "cudaHostGetDevicePointer",
        })?;
        // SAFETY: the caller's contract is `PinnedBuffer::from_raw`'s (cudaHostAlloc memory
        // with `flags`, `len` initialised elements, owned by nothing else, no pending work);
        // its checks passed above, so it adopts the memory and cannot fail.
        let host = unsafe { PinnedBuffer::from_raw(p.as_ptr(), len, flags)? };
        Ok(Self::over(host, device_ptr))
    }

    /// The GPU address (`cudaHostGetDevicePointer`, looked up once at allocation). A raw
    /// address: kernels take it from [`device_ptr`](crate::DevicePtr::device_ptr) or
    /// [`device_ptr_mut`](crate::DevicePtrMut::device_ptr_mut), which order and record
    /// their work.
    pub fn device_address(&self) -> *const T {
        self.alloc.device_addr as *const T
    }

    /// The flags the buffer was allocated with (MAPPED among them).
    pub fn flags(&self) -> HostAllocFlags {
        self.alloc.flags()
    }

    /// The flags as the runtime reports them (`cudaHostGetFlags`); see
    /// [`PinnedBuffer::runtime_flags`](Buffer::runtime_flags).
    pub fn runtime_flags(&self) -> Result<u32> {
        crate::kinds::pinned::runtime_flags(self.ptr.as_ptr())
    }
}

/// Element types with a host atomic of the same size and alignment, for
/// [`MappedBuffer::atomic`]. Sealed.
pub trait AtomicElement: Pod + sealed_atomic::Sealed {
    /// The atomic type (`AtomicU32` for `u32`, ...).
    type Atomic;
}

mod sealed_atomic {
    pub trait Sealed {}
}

macro_rules! atomic_element {
    ($($t:ty => $a:ty),+) => {$(
        impl sealed_atomic::Sealed for $t {}
        impl AtomicElement for $t {
            type Atomic = $a;
        }
    )+};
}
atomic_element!(
    u32 => std::sync::atomic::AtomicU32,
    i32 => std::sync::atomic::AtomicI32,
    u64 => std::sync::atomic::AtomicU64,
    i64 => std::sync::atomic::AtomicI64
);

impl<T: AtomicElement> MappedBuffer<T> {
    /// Element `i` as a host atomic, for flags shared with a *running* kernel. It waits for
    /// pending GPU work that **writes** the buffer (copies and memsets into it, kernels through
    /// [`device_ptr_mut`](crate::DevicePtrMut::device_ptr_mut)), so that a value stored here
    /// is never overwritten by work queued before it, but not for work that only reads it: a
    /// kernel that polls a flag the host sets reads it through
    /// [`device_ptr`](crate::DevicePtr::device_ptr) (volatile or atomic loads; the guard may
    /// be dropped once the kernel is queued) and keeps running beside the host's stores (a
    /// waiting access would never let it finish). Work queued earlier that reads the element
    /// may see the value stored here. It takes `&mut self`, so that no plain host access
    /// (`as_slice` from another thread, say) and no new GPU work through this crate can
    /// overlap an atomic one. Out of range is [`Misuse::OutOfBounds`]; a failed wait is the
    /// runtime's error (the element is not handed out).
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use std::sync::atomic::Ordering;
    /// let mut flag = cuda_mem::alloc_mapped::<u32>(1)?;
    /// // ... launch a kernel that spins on `flag.device_ptr(&stream)?` ...
    /// flag.atomic(0)?.store(1, Ordering::Release); // the kernel sees it and finishes
    /// # Ok(()) }
    /// ```
    ///
    /// Plain host access cannot overlap it (that would mix atomic and plain accesses, a data
    /// race):
    ///
    /// ```compile_fail,E0502
    /// # fn main() -> cuda_mem::Result<()> {
    /// use std::sync::atomic::Ordering;
    /// let mut flag = cuda_mem::alloc_mapped::<u32>(1)?;
    /// let a = flag.atomic(0)?;
    /// let plain = flag.as_slice()?; // error: `flag` is already borrowed as mutable
    /// a.store(1, Ordering::Release);
    /// # drop(plain); Ok(()) }
    /// ```
    pub fn atomic(&mut self, i: usize) -> Result<&T::Atomic> {
        size::range(i, 1, self.len())?;
        // Pending writes first: a copy queued before this store must not land after it.
        self.fence.host_wait_mut(Access::Read)?;
        let p = self.ptr.as_ptr().wrapping_add(i).cast::<T::Atomic>();
        // SAFETY: `p` is element `i` of the live pinned allocation (in bounds, checked above),
        // aligned for `T`, whose atomic has the same size and alignment (the sealed impls above
        // pair each integer with its std atomic). Every GPU write queued on the buffer has
        // completed (waited for above), and the exclusive borrow of `self` keeps the memory
        // alive and excludes every other host access to the buffer (plain reads through
        // `as_slice` included) and every GPU work queued through this crate while the atomic
        // reference lives; concurrent GPU reads by work queued earlier (a polling kernel) are
        // made by another agent through the device mapping, as with memory shared with
        // another process, which atomics are the way to observe.
        Ok(unsafe { &*p })
    }
}

/// Shape 1 of C++ `cudaAllocMapped(void** cpuPtr, void** gpuPtr, size_t size)`: zeroed mapped
/// memory whose CPU and GPU pointers are [`MappedBuffer::as_ptr`](Buffer::as_ptr) and
/// [`MappedBuffer::device_address`](Buffer::device_address) (kernels take the latter through
/// [`DevicePtr::device_ptr`](crate::DevicePtr::device_ptr), which orders and records them).
///
/// Checks first that the device can map host memory and has unified addressing. Zero length is
/// [`Misuse::ZeroLength`], as the C++ helper refuses `size == 0`.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// let buf = cuda_mem::alloc_mapped::<f32>(1024)?;
/// let (cpu, gpu) = (buf.as_ptr(), buf.device_address());
/// # let _ = (cpu, gpu); Ok(()) }
/// ```
pub fn alloc_mapped<T: Pod>(len: usize) -> Result<MappedBuffer<T>> {
    MappedBuffer::with_resolver(
        len,
        HostAllocFlags::DEFAULT,
        false,
        device_pointer,
        "alloc_mapped",
    )
}

/// Shape 2 of C++ `cudaAllocMapped(void** ptr, size_t size)`: one pointer valid on CPU and GPU.
/// Fails with [`Misuse::UvaPointerMismatch`] (and frees the allocation) if the runtime's device
/// pointer differs from the host pointer.
pub fn alloc_mapped_uva<T: Pod>(len: usize) -> Result<MappedBuffer<T>> {
    MappedBuffer::with_resolver(
        len,
        HostAllocFlags::DEFAULT,
        true,
        device_pointer,
        "alloc_mapped_uva",
    )
}
