//! Pinned (page-locked) host memory: `cudaHostAlloc`, `cudaMallocHost`, `cudaFreeHost`, or
//! stream-ordered from a host [`MemPool`]: `cudaMallocFromPoolAsync` / `cudaFreeAsync`.
//!
//! Pageable memory (`malloc`, `Vec`) forces the driver to stage every copy through a pinned
//! buffer of its own, one chunk at a time. Pinned memory is copied by DMA in one step, at the
//! link's speed, and is the only host memory an asynchronous copy can overlap with other work.
//! Pinning is expensive (the OS must lock every page: milliseconds per hundred MiB), so allocate
//! pinned buffers once and reuse them.

use std::fmt;
use std::ptr::NonNull;
use std::sync::OnceLock;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::alloc::pinned_pool::{BlockOwner, PinnedPool, PoolRef};
use crate::alloc::pinning::{self, Block, PinStrategy};
use crate::alloc::pool::{self, MemPool, PoolLocation, Pooled};
use crate::contract::buffer::sealed::{Alloc, HostAlloc};
use crate::contract::buffer::Buffer;
use crate::contract::layout::Layout;
use crate::contract::memory::Loc;
use crate::contract::size::fmt_bytes;
use crate::error::{check, Misuse, Result};
use crate::fence::{Access, Fence};
use crate::handles::flags::HostAllocFlags;
use crate::handles::stream::Stream;

/// A typed buffer of pinned host memory, freed on drop: `cudaFreeHost`, or for a buffer from a
/// host pool ([`from_pool`](Self::from_pool)) `cudaFreeAsync` queued on its stream, which
/// never waits.
///
/// Host access ([`as_slice`](Self::as_slice), [`as_mut_slice`](Self::as_mut_slice)) first
/// waits for asynchronous work queued on the buffer, which is why it returns a `Result`.
///
/// Element types aligned to more than 256 bytes (the alignment CUDA documents for its
/// allocators, and all it promises) are refused before anything is allocated, with
/// [`Misuse::AlignmentUnsupported`]; every address an allocator returns is checked for `T`'s
/// alignment too (a misaligned one is given back and refused with [`Misuse::Misaligned`]).
/// [`from_raw`](Self::from_raw) accepts any alignment that its address has.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{copy_async, DeviceBuffer, HostAllocFlags, PinnedBuffer, Stream};
/// let stream = Stream::new()?;
/// let mut host = PinnedBuffer::<u8>::zeroed(1 << 20, HostAllocFlags::DEFAULT)?;
/// host.as_mut_slice()?.fill(7);
/// let mut dev = DeviceBuffer::<u8>::uninit(1 << 20)?;
/// copy_async(&mut dev, &host, &stream)?;      // DMA, returns at once
/// host.as_mut_slice()?.fill(9);               // waits for the copy first
/// assert_eq!(dev.to_vec()?[0], 7);
/// # Ok(()) }
/// ```
pub type PinnedBuffer<T> = Buffer<T, PinnedMemory>;

/// How a [`PinnedBuffer`]'s memory was obtained: `cudaHostAlloc` (or `cudaMallocHost`) with
/// its flags, a host [`MemPool`], a [`PinnedPool`] block or a [`PinStrategy`] block. Also
/// holds the device address, looked up once (`cudaHostGetDevicePointer`) at the first guard
/// or asynchronous copy, as C++ code looks it up once per buffer.
pub struct PinnedMemory {
    flags: HostAllocFlags,
    source: Source,
    device_addr: OnceLock<usize>,
}

/// Where pinned memory came from, which says how it goes back.
enum Source {
    /// `cudaHostAlloc` / `cudaMallocHost`: `cudaFreeHost`.
    HostAlloc,
    /// A stream-ordered allocation from a host pool (its stream is the fence's origin):
    /// `cudaFreeAsync`.
    Pooled(Pooled),
    /// A block of a [`PinnedPool`] or of a [`PinStrategy`]; taken by `release`.
    Block(Option<OwnedBlock>),
}

/// A block owned by one buffer.
#[derive(Debug)]
struct OwnedBlock(BlockOwner);

// SAFETY: the block is the address and size of pinned host memory (and a reference to its
// pool's shared, mutex-guarded state) that this buffer owns exclusively; pinned memory may be
// used and freed from any thread, and the pool's state is made for that.
unsafe impl Send for OwnedBlock {}
// SAFETY: `&OwnedBlock` only reads the block's address, size and class (for `Debug`); nothing
// is mutated through a shared reference.
unsafe impl Sync for OwnedBlock {}

impl fmt::Debug for PinnedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("PinnedMemory");
        d.field("flags", &self.flags);
        match &self.source {
            Source::HostAlloc => d.field("source", &"cudaHostAlloc"),
            Source::Pooled(p) => d.field("pooled", p),
            Source::Block(b) => d.field("block", b),
        };
        d.finish()
    }
}

impl PinnedMemory {
    fn new(flags: HostAllocFlags, source: Source) -> Self {
        PinnedMemory {
            flags,
            source,
            device_addr: OnceLock::new(),
        }
    }

    /// The flags the memory was allocated with.
    pub(crate) fn flags(&self) -> HostAllocFlags {
        self.flags
    }

    /// The pool of a stream-ordered allocation.
    pub(crate) fn pool(&self) -> Option<&MemPool> {
        match &self.source {
            Source::Pooled(p) => Some(p.pool()),
            _ => None,
        }
    }
}

impl Alloc for PinnedMemory {
    const LOC: Loc = Loc::Pinned;
    const KIND: &'static str = "PinnedBuffer";

    fn device_addr(&self, ptr: NonNull<u8>) -> Result<*const u8> {
        if let Source::Pooled(_) = self.source {
            // Pool memory is mapped at one virtual address for the host and for every device
            // given access; cudaHostGetDevicePointer knows only cudaHostAlloc'd memory.
            return Ok(ptr.as_ptr());
        }
        if let Some(&addr) = self.device_addr.get() {
            return Ok(addr as *const u8);
        }
        let addr = host_device_pointer(ptr.as_ptr().cast_const())?;
        Ok(*self.device_addr.get_or_init(|| addr as usize) as *const u8)
    }

    fn detach(&mut self) -> Result<()> {
        match &mut self.source {
            Source::Block(Some(owner)) => owner.0.detach(),
            _ => Ok(()),
        }
    }

    fn release(&mut self, ptr: NonNull<u8>, bytes: usize, fence: &mut Fence) -> Result<()> {
        match &mut self.source {
            Source::Block(owner) => match owner.take() {
                Some(owner) => owner.0.release(self.flags, fence),
                None => Ok(()),
            },
            Source::Pooled(pooled) => pooled.free(ptr.as_ptr().cast(), bytes, fence),
            Source::HostAlloc => {
                fence.host_wait_mut(Access::Write)?;
                let p = ptr.as_ptr();
                // SAFETY: the buffer owns the allocation and never uses it after this call
                // (the `release` contract); pending work on it was waited for above.
                check(unsafe { sys::cudaFreeHost(p.cast()) }, || {
                    format!("cudaFreeHost({p:p})")
                })
            }
        }
    }
}

// Pinned memory is host memory, initialised by every safe constructor.
impl HostAlloc for PinnedMemory {}

/// `cudaFreeHost` of an allocation refused by [`Layout::place`].
fn free_host<U>(p: NonNull<U>) -> Result<()> {
    let p = p.as_ptr();
    // SAFETY: `p` is a `cudaHostAlloc`/`cudaMallocHost` allocation just made, refused before
    // anything used it.
    check(unsafe { sys::cudaFreeHost(p.cast()) }, || {
        format!("cudaFreeHost({p:p})")
    })
}

/// `cudaHostGetFlags` of the pinned allocation at `p`.
pub(crate) fn runtime_flags<T>(p: *const T) -> Result<u32> {
    let mut flags = 0u32;
    // SAFETY: valid out-pointer; the runtime checks that `p` is page-locked memory and
    // answers an error otherwise.
    let code = unsafe { sys::cudaHostGetFlags(&mut flags, p.cast_mut().cast()) };
    check(code, || format!("cudaHostGetFlags({p:p})"))?;
    Ok(flags)
}

/// The device address of page-locked host memory (`cudaHostGetDevicePointer`): for memory
/// allocated or registered MAPPED, or any pinned memory under unified addressing.
pub(crate) fn host_device_pointer<T>(p: *const T) -> Result<*const T> {
    let mut dev = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the runtime checks that `p` is page-locked memory and
    // answers an error otherwise; flags must be 0.
    let code = unsafe { sys::cudaHostGetDevicePointer(&mut dev, p.cast_mut().cast(), 0) };
    check(code, || format!("cudaHostGetDevicePointer({p:p})"))?;
    Ok(dev.cast_const().cast())
}

impl<T: Pod> PinnedBuffer<T> {
    /// Allocates `len` zeroed elements with `cudaHostAlloc(flags)`.
    pub fn zeroed(len: usize, flags: HostAllocFlags) -> Result<Self> {
        // SAFETY: the memory is zero-filled before anyone can read it.
        let mut buf = unsafe { Self::host_alloc(len, flags, "PinnedBuffer::zeroed")? };
        buf.zero_fill();
        Ok(buf)
    }

    /// Allocates with `cudaHostAlloc(flags)` and copies `src` in.
    pub fn from_slice(src: &[T], flags: HostAllocFlags) -> Result<Self> {
        // SAFETY: every element is written from `src` before anyone can read it.
        let buf = unsafe { Self::host_alloc(src.len(), flags, "PinnedBuffer::from_slice")? };
        // SAFETY: the allocation holds `src.len()` elements and does not overlap `src`.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), buf.ptr.as_ptr(), src.len());
        }
        Ok(buf)
    }

    /// Allocates `len` elements with `cudaHostAlloc(flags)`, contents left as the OS gave them.
    ///
    /// # Safety
    /// The memory is uninitialised: write it (e.g. by a copy from the device) before reading it
    /// through [`as_slice`](Self::as_slice).
    pub unsafe fn uninit(len: usize, flags: HostAllocFlags) -> Result<Self> {
        // SAFETY: the caller takes on the initialisation duty.
        unsafe { Self::host_alloc(len, flags, "PinnedBuffer::uninit") }
    }

    /// `cudaHostAlloc`, with `op` naming the public constructor in misuse errors.
    ///
    /// # Safety
    /// As [`uninit`](Self::uninit): the memory is uninitialised.
    pub(crate) unsafe fn host_alloc(
        len: usize,
        flags: HostAllocFlags,
        op: &'static str,
    ) -> Result<Self> {
        let layout = Layout::<T>::of(len, op)?;
        let p = pinning::cuda_host_alloc(layout.bytes(), flags)?;
        let ptr = layout.place(p.as_ptr(), "cudaHostAlloc", free_host)?;
        Ok(Self::adopt(ptr, len, flags))
    }

    /// Allocates `len` zeroed elements with `cudaMallocHost` (the same as
    /// `cudaHostAlloc(DEFAULT)`).
    pub fn malloc_host(len: usize) -> Result<Self> {
        let layout = Layout::<T>::of(len, "PinnedBuffer::malloc_host")?;
        let bytes = layout.bytes();
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; `bytes` is non-zero.
        let code = unsafe { sys::cudaMallocHost(&mut raw, bytes) };
        check(code, || format!("cudaMallocHost({})", fmt_bytes(bytes)))?;
        let ptr = layout.place(raw, "cudaMallocHost", free_host)?;
        let mut buf = Self::adopt(ptr, len, HostAllocFlags::DEFAULT);
        buf.zero_fill();
        Ok(buf)
    }

    /// Takes ownership of pinned memory allocated with `cudaHostAlloc(flags)` or
    /// `cudaMallocHost` elsewhere (C or C++ code); freed with `cudaFreeHost` on drop.
    ///
    /// Errors: [`Misuse::NullPointer`], [`Misuse::ZeroLength`], [`Misuse::SizeOverflow`],
    /// [`Misuse::Misaligned`].
    ///
    /// # Safety
    /// `ptr` must come from `cudaHostAlloc` with `flags` (or `cudaMallocHost` with
    /// [`HostAllocFlags::DEFAULT`]), hold at least `len` initialised elements, not be freed
    /// elsewhere, not be owned by anything else, and have no GPU work pending on it.
    pub unsafe fn from_raw(ptr: *mut T, len: usize, flags: HostAllocFlags) -> Result<Self> {
        let p = Layout::adopt(ptr, len, "PinnedBuffer::from_raw")?;
        Ok(Self::adopt(p, len, flags))
    }

    /// Owns `ptr`, memory of `len` elements to free with `cudaFreeHost`.
    fn adopt(ptr: NonNull<T>, len: usize, flags: HostAllocFlags) -> Self {
        Buffer::from_parts(
            ptr,
            len,
            Fence::default(),
            PinnedMemory::new(flags, Source::HostAlloc),
        )
    }

    /// Allocates `len` elements of pinned host memory from the host pool `pool`
    /// ([`MemPool::host`]) in `stream`'s order (`cudaMallocFromPoolAsync`), and zero-fills
    /// them once `stream` has reached the allocation (the host waits for that: memory freed
    /// into the pool on that stream may still be in use by work queued before the free).
    ///
    /// Freed with `cudaFreeAsync` on `stream`, after all work recorded on the buffer, without
    /// blocking. Usable wherever a `cudaHostAlloc` buffer is; its device address is its host
    /// address (pool memory has one address for the host and every device given access).
    /// Only devices the pool grants access to (its own, and those given
    /// [`MemPool::set_access`]) may touch it: work on another device's stream is refused by
    /// the runtime, not checked here.
    ///
    /// Errors: [`Misuse::ZeroLength`], [`Misuse::SizeOverflow`],
    /// [`Misuse::AlignmentUnsupported`]; [`Misuse::InvalidArgument`]
    /// for a device pool; out of memory as for
    /// [`DeviceBuffer::from_pool`](crate::DeviceBuffer::from_pool).
    pub fn from_pool(pool: &MemPool, len: usize, stream: &Stream) -> Result<Self> {
        // SAFETY: zero-filled below before anyone can read it.
        let mut buf = unsafe { Self::pool_alloc(pool, len, stream, "PinnedBuffer::from_pool")? };
        buf.as_mut_slice()?.fill(T::zeroed());
        Ok(buf)
    }

    /// Like [`from_pool`](Self::from_pool) without the zero fill and without waiting:
    /// returns as soon as the allocation is queued.
    ///
    /// # Safety
    /// The memory is uninitialised: write it (through [`as_mut_slice`](Self::as_mut_slice),
    /// which first waits for the stream to reach the allocation, or by a copy from the device)
    /// before reading it.
    pub unsafe fn uninit_from_pool(pool: &MemPool, len: usize, stream: &Stream) -> Result<Self> {
        // SAFETY: the caller takes on the initialisation duty.
        unsafe { Self::pool_alloc(pool, len, stream, "PinnedBuffer::uninit_from_pool") }
    }

    /// # Safety
    /// As [`uninit_from_pool`](Self::uninit_from_pool).
    unsafe fn pool_alloc(
        pool: &MemPool,
        len: usize,
        stream: &Stream,
        op: &'static str,
    ) -> Result<Self> {
        let layout = Layout::<T>::of(len, op)?;
        if pool.location() != PoolLocation::Host {
            return Err(Misuse::InvalidArgument {
                op,
                reason: format!("{pool:?} holds device memory: use DeviceBuffer::from_pool"),
            }
            .into());
        }
        let (ptr, pooled, fence) = pool::alloc_for(pool, &layout, stream, op)?;
        Ok(Buffer::from_parts(
            ptr,
            len,
            fence,
            PinnedMemory::new(HostAllocFlags::DEFAULT, Source::Pooled(pooled)),
        ))
    }

    /// Allocates `len` zeroed elements of pinned memory made by `strategy` (see
    /// [`PinStrategy`]: [`MapRegister`](PinStrategy::MapRegister) pins a large buffer several
    /// times faster than `cudaHostAlloc`). Freed on drop the way it was made.
    ///
    /// Errors: as [`zeroed`](Self::zeroed); [`Misuse::InvalidArgument`] for write-combined
    /// memory by `MapRegister`, or no threads.
    pub fn with_strategy(len: usize, flags: HostAllocFlags, strategy: PinStrategy) -> Result<Self> {
        const OP: &str = "PinnedBuffer::with_strategy";
        let layout = Layout::<T>::of(len, OP)?;
        let (block, _) = Block::alloc(layout.bytes(), flags, strategy)?;
        // SAFETY: a new block of `layout.bytes()` zeroed (initialised) bytes, owned by the
        // buffer.
        unsafe { Self::from_block(block, layout, flags, None) }
    }

    /// A buffer of `layout` over `block`, which goes back to `pool` (with its size class) or
    /// is freed on release; a block misaligned for `T` goes back (or is freed) at once.
    ///
    /// # Safety
    /// `block` holds at least `layout.bytes()` initialised bytes with `flags` and is owned by
    /// nothing else.
    pub(crate) unsafe fn from_block(
        block: Block,
        layout: Layout<T>,
        flags: HostAllocFlags,
        pool: Option<(PoolRef, usize)>,
    ) -> Result<Self> {
        let raw = block.ptr().as_ptr();
        let owner = BlockOwner { block, pool };
        // A refused block is handed back: no GPU work can use it yet.
        let (ptr, owner) = layout.place_owned(raw, "pinned block", owner, |_, owner| {
            owner.release(flags, &mut Fence::default())
        })?;
        Ok(Buffer::from_parts(
            ptr,
            layout.len(),
            Fence::default(),
            PinnedMemory::new(flags, Source::Block(Some(OwnedBlock(owner)))),
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

    fn zero_fill(&mut self) {
        // SAFETY: the allocation holds `len` elements; all-zero bytes are a valid `T` (Pod).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), 0, self.len) };
    }

    /// The flags the buffer was allocated with.
    pub fn flags(&self) -> HostAllocFlags {
        self.alloc.flags
    }

    /// The flags as the runtime reports them (`cudaHostGetFlags`). They are not always the
    /// flags asked for: under unified addressing every pinned allocation is mapped, so MAPPED
    /// is reported for all of them, and drivers may leave PORTABLE out (all pinned memory is
    /// portable under UVA). WRITE_COMBINED is reported as asked.
    pub fn runtime_flags(&self) -> Result<u32> {
        runtime_flags(self.ptr.as_ptr())
    }

    /// Whether the memory is write-combined: reading it from the CPU is very slow.
    pub fn is_write_combined(&self) -> bool {
        self.alloc.flags.contains(HostAllocFlags::WRITE_COMBINED)
    }
}

/// The pinned pool's buffers: blocks of the allocator (`alloc/pinned_pool/`), made buffers here.
impl PinnedPool {
    /// A pinned buffer of `len` elements with `flags`, from the cache where a free block of
    /// its size class and flags is ready, else newly made. Its contents are unspecified
    /// (zeros, or what a previous user of the block left): use
    /// [`alloc_zeroed`](Self::alloc_zeroed) or [`from_slice`](Self::from_slice) to set them.
    ///
    /// The buffer goes back to the pool on drop, without waiting for GPU work that uses it.
    ///
    /// Errors: [`Misuse::ZeroLength`], [`Misuse::SizeOverflow`],
    /// [`Misuse::AlignmentUnsupported`] for an element type aligned to more than 256 bytes;
    /// out of memory after emptying the cache and one retry, with the pool's statistics.
    pub fn alloc<T: Pod>(&self, len: usize, flags: HostAllocFlags) -> Result<PinnedBuffer<T>> {
        const OP: &str = "PinnedPool::alloc";
        let layout = Layout::<T>::of(len, OP)?;
        let (block, owner) = self.block_for(&layout, flags)?;
        // SAFETY: the block holds at least `layout.bytes()` initialised bytes (its size class;
        // see the pinned pool's module docs) and is owned by the buffer from now on;
        // `from_block` checks the alignment.
        unsafe { PinnedBuffer::from_block(block, layout, flags, Some(owner)) }
    }

    /// [`alloc`](Self::alloc), then zero-filled.
    pub fn alloc_zeroed<T: Pod>(
        &self,
        len: usize,
        flags: HostAllocFlags,
    ) -> Result<PinnedBuffer<T>> {
        let mut buf = self.alloc(len, flags)?;
        buf.as_mut_slice()?.fill(T::zeroed());
        Ok(buf)
    }

    /// [`alloc`](Self::alloc), then `src` copied in.
    pub fn from_slice<T: Pod>(&self, src: &[T], flags: HostAllocFlags) -> Result<PinnedBuffer<T>> {
        let mut buf = self.alloc(src.len(), flags)?;
        buf.as_mut_slice()?.copy_from_slice(src);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::HostAllocFlags as F;

    #[test]
    fn flags_combine_and_print() {
        assert_eq!(F::DEFAULT.to_string(), "DEFAULT");
        assert_eq!((F::MAPPED | F::PORTABLE).to_string(), "PORTABLE|MAPPED");
        assert_eq!(
            (F::WRITE_COMBINED | F::MAPPED | F::PORTABLE).to_string(),
            "PORTABLE|MAPPED|WRITE_COMBINED"
        );
        assert!((F::MAPPED | F::PORTABLE).contains(F::MAPPED));
        assert!(!F::PORTABLE.contains(F::MAPPED));
        assert_eq!(F::from_bits(8), None);
        assert_eq!(F::from_bits(2), Some(F::MAPPED));
        assert_eq!((F::PORTABLE | F::WRITE_COMBINED).bits(), 5);
    }
}
