//! Device memory: `cudaMalloc` / `cudaMemset` / `cudaMemcpy` / `cudaFree`, or stream-ordered
//! from a [`MemPool`]: `cudaMallocFromPoolAsync` / `cudaFreeAsync`.

use std::ptr::NonNull;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::alloc::pool::{self, MemPool, PoolLocation, Pooled};
use crate::contract::buffer::sealed::Alloc;
use crate::contract::buffer::Buffer;
use crate::contract::layout::Layout;
use crate::contract::memory::Loc;
use crate::contract::size::fmt_bytes;
use crate::error::{check, Misuse, Result};
use crate::fence::{Access, Fence};
use crate::handles::devices::{current_ordinal, Device};
use crate::handles::stream::Stream;

/// A typed buffer of device memory, freed on drop: `cudaFree`, or for a buffer from a pool
/// ([`from_pool`](Self::from_pool)) `cudaFreeAsync` queued on its stream, which never waits.
///
/// Device memory is not accessible from the CPU: move data with [`copy`](crate::copy) or the
/// methods here. The buffer remembers the device it was allocated on.
///
/// Element types aligned to more than 256 bytes (the alignment CUDA documents for its
/// allocators, and all it promises) are refused before anything is allocated, with
/// [`Misuse::AlignmentUnsupported`]; every address an allocator returns is checked for `T`'s
/// alignment too (a misaligned one is given back and refused with [`Misuse::Misaligned`]).
/// [`from_raw`](Self::from_raw) accepts any alignment that its address has.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::DeviceBuffer;
/// let mut buf = DeviceBuffer::<f32>::from_slice(&[1.0, 2.0, 3.0])?; // cudaMalloc + H2D
/// buf.memset(0)?;                                                    // cudaMemset
/// assert_eq!(buf.to_vec()?, vec![0.0; 3]);                           // D2H
/// # Ok(()) }
/// ```
pub type DeviceBuffer<T> = Buffer<T, DeviceMemory>;

/// How a [`DeviceBuffer`]'s memory was obtained: `cudaMalloc` on its device, or a
/// stream-ordered [`MemPool`] (whose stream is the fence's origin).
#[derive(Debug)]
pub struct DeviceMemory {
    device: Device,
    /// The pool of a stream-ordered allocation; `None` for `cudaMalloc`.
    pooled: Option<Pooled>,
}

impl Alloc for DeviceMemory {
    const LOC: Loc = Loc::Device;
    const KIND: &'static str = "DeviceBuffer";

    fn located_on(&self) -> Option<Device> {
        Some(self.device)
    }

    fn release(&mut self, ptr: NonNull<u8>, bytes: usize, fence: &mut Fence) -> Result<()> {
        if let Some(pooled) = &self.pooled {
            return pooled.free(ptr.as_ptr().cast(), bytes, fence);
        }
        fence.host_wait_mut(Access::Write)?;
        // The allocating device current for the free (the guard switches only where needed,
        // and restores the caller's device).
        let _guard = self.device.guard().ok();
        let p = ptr.as_ptr();
        // SAFETY: the buffer owns the allocation and never uses it after this call (the
        // `release` contract); pending work on it was waited for above.
        check(unsafe { sys::cudaFree(p.cast()) }, || {
            format!("cudaFree({p:p})")
        })
    }
}

impl DeviceMemory {
    /// The pool of a stream-ordered allocation.
    pub(crate) fn pool(&self) -> Option<&MemPool> {
        self.pooled.as_ref().map(Pooled::pool)
    }
}

/// Frees an allocation of `cudaMalloc` or `cudaMallocManaged` that [`Layout::place`] refused.
pub(crate) fn free_refused(p: NonNull<std::os::raw::c_void>) -> Result<()> {
    // SAFETY: the allocation just made, refused before anything used it.
    check(unsafe { sys::cudaFree(p.as_ptr()) }, || {
        format!("cudaFree({p:p})")
    })
}

impl<T: Pod> DeviceBuffer<T> {
    /// Allocates `len` elements on the current device, contents unspecified (`cudaMalloc`).
    ///
    /// Safe because `T: Pod` accepts any bytes and the memory is never read by the CPU in
    /// place: copying it out yields arbitrary but valid values.
    pub fn uninit(len: usize) -> Result<Self> {
        Self::malloc(len, "DeviceBuffer::uninit")
    }

    /// Owns `ptr`, an allocation of `len` elements on the current device.
    fn adopt(ptr: NonNull<T>, len: usize) -> Self {
        Buffer::from_parts(
            ptr,
            len,
            Fence::default(),
            DeviceMemory {
                device: Device::from_ordinal_unchecked(current_ordinal()),
                pooled: None,
            },
        )
    }

    /// Allocates `len` elements from `pool` in `stream`'s order (`cudaMallocFromPoolAsync`),
    /// contents unspecified. Returns at once: the memory is valid from the point `stream`
    /// reaches the allocation, and the buffer records that, so work on other streams, copies
    /// and host waits are ordered after it. Dropped (or [`free`](Self::free)d), the buffer is
    /// freed with `cudaFreeAsync` on `stream`, after all work recorded on it on any stream,
    /// without blocking the host or the device. The buffer keeps the pool and the stream
    /// alive.
    ///
    /// Out of memory: the pool is trimmed and the allocation retried once; the error then
    /// names the pool and its statistics.
    ///
    /// The legacy default stream of any device may be passed: its device is made current for
    /// the calls that need it.
    ///
    /// Errors: [`Misuse::ZeroLength`], [`Misuse::SizeOverflow`],
    /// [`Misuse::AlignmentUnsupported`]; [`Misuse::InvalidArgument`]
    /// for a host pool (use [`PinnedBuffer::from_pool`](crate::PinnedBuffer::from_pool)).
    pub fn from_pool(pool: &MemPool, len: usize, stream: &Stream) -> Result<Self> {
        Self::pool_alloc(pool, len, stream, "DeviceBuffer::from_pool")
    }

    /// Like [`from_pool`](Self::from_pool), zero-filled on `stream` (`cudaMemsetAsync`).
    pub fn zeroed_from_pool(pool: &MemPool, len: usize, stream: &Stream) -> Result<Self> {
        let mut buf = Self::pool_alloc(pool, len, stream, "DeviceBuffer::zeroed_from_pool")?;
        // A legacy stream of another device is accepted, as by `from_pool`: make it current.
        let _g = stream.inner().enter()?;
        buf.memset_async(0, stream)?;
        Ok(buf)
    }

    fn pool_alloc(pool: &MemPool, len: usize, stream: &Stream, op: &'static str) -> Result<Self> {
        let layout = Layout::<T>::of(len, op)?;
        let PoolLocation::Device(device) = pool.location() else {
            return Err(Misuse::InvalidArgument {
                op,
                reason: format!("{pool:?} holds host memory: use PinnedBuffer::from_pool"),
            }
            .into());
        };
        let (ptr, pooled, fence) = pool::alloc_for(pool, &layout, stream, op)?;
        Ok(Buffer::from_parts(
            ptr,
            len,
            fence,
            DeviceMemory {
                device,
                pooled: Some(pooled),
            },
        ))
    }

    /// The pool the buffer came from, for a stream-ordered allocation.
    pub fn pool(&self) -> Option<&MemPool> {
        self.alloc.pool()
    }

    /// The stream a pooled buffer was allocated on, where its free will be queued.
    pub fn alloc_stream(&self) -> Option<&Stream> {
        self.fence.origin()
    }

    /// `cudaMalloc`, with `op` naming the public constructor in misuse errors.
    pub(crate) fn malloc(len: usize, op: &'static str) -> Result<Self> {
        let layout = Layout::<T>::of(len, op)?;
        let bytes = layout.bytes();
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `bytes` is non-zero and fits in isize.
        let code = unsafe { sys::cudaMalloc(&mut raw, bytes) };
        check(code, || format!("cudaMalloc({})", fmt_bytes(bytes)))?;
        let ptr = layout.place(raw, "cudaMalloc", free_refused)?;
        Ok(Self::adopt(ptr, len))
    }

    /// Allocates `len` elements on `device` (made current for the call only).
    pub fn uninit_on(device: Device, len: usize) -> Result<Self> {
        let _guard = device.guard()?;
        Self::uninit(len)
    }

    /// Allocates `len` zeroed elements (`cudaMalloc` + `cudaMemset(0)`).
    pub fn zeroed(len: usize) -> Result<Self> {
        let mut buf = Self::malloc(len, "DeviceBuffer::zeroed")?;
        buf.memset(0)?;
        Ok(buf)
    }

    /// Sets every byte to `byte` (`cudaMemset`).
    ///
    /// Like the C++ call, this may return before the fill is done (the runtime queues it on
    /// the legacy default stream). It is recorded on the buffer, so host-visible results stay
    /// exact: copies out of the buffer, and asynchronous work on it through this crate on any
    /// stream (non-blocking ones included), are ordered after the fill.
    pub fn memset(&mut self, byte: u8) -> Result<()> {
        // `cudaMemset` runs on the current device's legacy stream: make it this buffer's.
        let legacy = Stream::legacy_on(self.alloc.device.ordinal());
        let _guard = legacy.inner().enter()?;
        let bytes = self.byte_len();
        self.fence.order(&legacy, (0, bytes), Access::Write)?;
        let p = self.ptr.as_ptr();
        // SAFETY: `p` is our live allocation of `bytes` bytes, borrowed mutably; conflicting
        // pending work was ordered before the fill, and the fill is recorded below.
        let code = unsafe { sys::cudaMemset(p.cast(), byte.into(), bytes) };
        self.fence.mark(&legacy, (0, bytes), Access::Write);
        check(code, || {
            format!("cudaMemset({p:p}, {byte}, {})", fmt_bytes(bytes))
        })
    }

    /// The device the memory lives on.
    pub fn device(&self) -> Device {
        self.alloc.device
    }

    /// Takes ownership of device memory allocated with `cudaMalloc` elsewhere (C or C++ code).
    ///
    /// Errors: [`Misuse::NullPointer`], [`Misuse::ZeroLength`], [`Misuse::SizeOverflow`],
    /// [`Misuse::Misaligned`].
    ///
    /// # Safety
    /// `ptr` must come from `cudaMalloc` on the current device, hold at least `len` elements,
    /// not be freed elsewhere, and not be owned by anything else.
    pub unsafe fn from_raw(ptr: *mut T, len: usize) -> Result<Self> {
        let ptr = Layout::adopt(ptr, len, "DeviceBuffer::from_raw")?;
        Ok(Self::adopt(ptr, len))
    }
}
