//! Stream-ordered allocation from CUDA memory pools: `cudaMemPoolCreate`,
//! `cudaDeviceGetDefaultMemPool`, `cudaMallocFromPoolAsync` / `cudaFreeAsync`.
//!
//! `cudaMalloc` + `cudaFree` cost tens to hundreds of microseconds, and `cudaFree` may
//! synchronize the whole device, so dropping a buffer stalls every stream. A pool hands out
//! memory *in stream order*: the allocation is valid from the point the stream reaches it, and
//! a free queued on a stream returns the memory to the pool when the stream reaches the free.
//! Neither call blocks the host or the device, and with the pool's release threshold at its
//! maximum the pool keeps what it has reserved, so that a pair costs about what the raw pool
//! calls cost (measured in `docs/results/`).
//!
//! Pooled buffers are ordinary [`DeviceBuffer`](crate::DeviceBuffer)s and
//! [`PinnedBuffer`](crate::PinnedBuffer)s, usable wherever those are. Each remembers the pool
//! (keeping it alive) and the stream it was allocated on; on drop the free is queued on that
//! stream, ordered by the buffer's fence after every piece of work recorded on the buffer on
//! any stream, without waiting on the host.

use std::fmt;
use std::os::raw::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cuda_mem_sys as sys;

use crate::contract::layout::Layout;
use crate::contract::size::fmt_bytes;
use crate::error::{check, Error, ErrorCode, Misuse, Result};
use crate::fence::{Access, Fence};
use crate::handles::devices::Device;
use crate::handles::stream::Stream;

/// Where a pool's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PoolLocation {
    /// Device memory of this device.
    Device(Device),
    /// Pinned host memory (a pool created with `cudaMemLocationTypeHost`).
    Host,
}

/// Access a device has to a pool's memory (`cudaMemAccessFlags`). Any value the runtime reports
/// is kept, also one this crate does not name.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolAccess(pub u32);

impl PoolAccess {
    /// `cudaMemAccessFlagsProtNone`: no access (the default for other devices).
    pub const NONE: PoolAccess = PoolAccess(sys::cudaMemAccessFlags::cudaMemAccessFlagsProtNone.0);
    /// `cudaMemAccessFlagsProtRead`: read only.
    pub const READ: PoolAccess = PoolAccess(sys::cudaMemAccessFlags::cudaMemAccessFlagsProtRead.0);
    /// `cudaMemAccessFlagsProtReadWrite`: read and write.
    pub const READ_WRITE: PoolAccess =
        PoolAccess(sys::cudaMemAccessFlags::cudaMemAccessFlagsProtReadWrite.0);
}

impl fmt::Debug for PoolAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PoolAccess::NONE => f.write_str("NONE"),
            PoolAccess::READ => f.write_str("READ"),
            PoolAccess::READ_WRITE => f.write_str("READ_WRITE"),
            PoolAccess(v) => write!(f, "PoolAccess({v})"),
        }
    }
}

/// A pool's memory statistics in bytes (`cudaMemPoolAttr{Used,Reserved}Mem{Current,High}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Memory handed out and not yet freed (a queued free counts until the stream reaches it).
    pub used: u64,
    /// The high-water mark of `used` since creation or [`MemPool::reset_high_water`].
    pub used_high: u64,
    /// Memory the pool holds from the driver, used or not.
    pub reserved: u64,
    /// The high-water mark of `reserved`.
    pub reserved_high: u64,
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "used {} bytes (high {}), reserved {} bytes (high {})",
            self.used, self.used_high, self.reserved, self.reserved_high
        )
    }
}

/// The shared part of a [`MemPool`]: every pooled buffer keeps a clone, so an owned pool is
/// destroyed only after its last buffer was freed (or leaked).
struct PoolInner {
    raw: sys::cudaMemPool_t,
    owned: bool,
    location: PoolLocation,
    /// Made with `cudaMemHandleTypePosixFileDescriptor` ([`MemPool::shareable`]) or imported
    /// from another process: its memory may be exported to other processes.
    shareable: bool,
}

// SAFETY: a cudaMemPool_t is a driver handle that every runtime call accepts from any thread,
// also concurrently (the runtime API is thread-safe); nothing here is bound to a thread.
unsafe impl Send for PoolInner {}
// SAFETY: the fields are only read after construction and passed to thread-safe calls.
unsafe impl Sync for PoolInner {}

impl Drop for PoolInner {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we created the pool and destroy it once, when the last clone goes. Frees
            // still queued on streams are allowed: the runtime documents that the pool is then
            // released once they have completed. Errors are ignored: drop never panics.
            unsafe { sys::cudaMemPoolDestroy(self.raw) };
        }
    }
}

/// A CUDA memory pool (`cudaMemPool_t`): a device's default pool, or one created here and
/// destroyed when the last handle and the last buffer allocated from it are gone.
///
/// Cloning is cheap and shares the pool.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{Device, DeviceBuffer, MemPool, Stream};
/// let pool = MemPool::new(Device::get(0)?)?;  // release threshold: keep everything
/// let stream = Stream::non_blocking()?;
/// pool.reserve(64 << 20, &stream)?;             // pre-grow to 64 MiB
/// let mut buf = DeviceBuffer::<f32>::from_pool(&pool, 1 << 20, &stream)?; // no cudaMalloc
/// buf.memset_async(0, &stream)?;
/// drop(buf);                                    // cudaFreeAsync on `stream`: no wait
/// println!("{}", pool.stats()?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemPool {
    inner: Arc<PoolInner>,
}

impl fmt::Debug for MemPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemPool({:p}, {:?}", self.inner.raw, self.inner.location)?;
        if !self.inner.owned {
            f.write_str(", default")?;
        }
        f.write_str(")")
    }
}

/// `cudaDevAttrHostMemoryPoolsSupported`, by number: the attribute is newer than CUDA 12.0's
/// header, and a driver that does not know it answers an error (taken as "no").
const ATTR_HOST_MEMORY_POOLS: sys::cudaDeviceAttr = sys::cudaDeviceAttr(144);

fn require_pools(device: Device) -> Result<()> {
    device.require(
        sys::cudaDeviceAttr::cudaDevAttrMemoryPoolsSupported,
        "memory pools (cudaDevAttrMemoryPoolsSupported)",
    )
}

impl MemPool {
    /// The default pool of `device` (`cudaDeviceGetDefaultMemPool`), which `cudaMallocAsync`
    /// uses. It is shared by everything in the process and never destroyed; settings made on it
    /// (such as [`set_release_threshold`](Self::set_release_threshold)) affect all its users.
    ///
    /// As CUDA ships it, its release threshold is 0: every synchronization hands its free
    /// memory back to the driver, which makes each allocation after one as slow as
    /// `cudaMalloc`. [`MemPool::new`] makes a pool that keeps it.
    ///
    /// Errors: [`Misuse::Unsupported`] when the device has no memory pools.
    pub fn default_for(device: Device) -> Result<MemPool> {
        require_pools(device)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the ordinal was checked by the attribute query above.
        let code = unsafe { sys::cudaDeviceGetDefaultMemPool(&mut raw, device.ordinal()) };
        check(code, || {
            format!("cudaDeviceGetDefaultMemPool(device {})", device.ordinal())
        })?;
        Ok(MemPool {
            inner: Arc::new(PoolInner {
                raw,
                owned: false,
                location: PoolLocation::Device(device),
                shareable: false,
            }),
        })
    }

    /// A new pool of device memory on `device` (`cudaMemPoolCreate`), with its release
    /// threshold at the maximum: memory freed into it stays reserved for the next allocation
    /// until [`trim`](Self::trim) (RMM's pools behave the same way). Accessible from `device`
    /// only; see [`set_access`](Self::set_access).
    ///
    /// Errors: [`Misuse::Unsupported`] when the device has no memory pools.
    pub fn new(device: Device) -> Result<MemPool> {
        require_pools(device)?;
        Self::create(PoolLocation::Device(device), device, 0)
    }

    /// Like [`MemPool::new`], with the pool capped at `max_bytes` (`cudaMemPoolProps::maxSize`;
    /// the driver may round it up): allocations beyond it fail as out of memory.
    ///
    /// Errors: [`Misuse::Unsupported`] where the headers this crate was built with have no
    /// `maxSize` (CUDA before 12.2) or the driver refuses it; [`Misuse::ZeroLength`] for 0.
    pub fn with_max_size(device: Device, max_bytes: usize) -> Result<MemPool> {
        if max_bytes == 0 {
            return Err(Misuse::ZeroLength {
                op: "MemPool::with_max_size",
            }
            .into());
        }
        if cfg!(cudart_mem_pool_max_size) {
            require_pools(device)?;
            Self::create(PoolLocation::Device(device), device, max_bytes)
        } else {
            Err(Misuse::Unsupported {
                device: device.ordinal(),
                feature: "a maximum pool size (cudaMemPoolProps::maxSize, CUDA 12.2+ headers)",
            }
            .into())
        }
    }

    /// A new pool of pinned host memory (`cudaMemPoolCreate` with `cudaMemLocationTypeHost`)
    /// that `device` may read and write, release threshold at the maximum. Allocate from it
    /// with [`PinnedBuffer::from_pool`](crate::PinnedBuffer::from_pool) on a stream of
    /// `device`.
    ///
    /// Errors: [`Misuse::Unsupported`] where the headers this crate was built with lack host
    /// pools (before CUDA 12.2), where the device says it has none
    /// (`cudaDevAttrHostMemoryPoolsSupported`, drivers of CUDA 12.6+), or where the driver
    /// refuses to create one.
    pub fn host(device: Device) -> Result<MemPool> {
        require_pools(device)?;
        let unsupported = |feature| {
            Error::from(Misuse::Unsupported {
                device: device.ordinal(),
                feature,
            })
        };
        if !cfg!(cudart_mem_pool_host) {
            return Err(unsupported(
                "host memory pools (cudaMemLocationTypeHost: this build's CUDA headers predate 12.2)",
            ));
        }
        if !matches!(device.attribute(ATTR_HOST_MEMORY_POOLS), Ok(v) if v != 0) {
            // (A failed read has cleared its own error: `check` does that.)
            return Err(unsupported(
                "host memory pools (cudaDevAttrHostMemoryPoolsSupported)",
            ));
        }
        let pool = Self::create(PoolLocation::Host, device, 0).map_err(|e| {
            let refused = [
                ErrorCode::INVALID_VALUE,
                ErrorCode(sys::cudaError::cudaErrorNotSupported.0),
            ];
            match e.code() {
                Some(c) if refused.contains(&c) => {
                    unsupported("host memory pools (cudaMemPoolCreate refused the host location)")
                }
                _ => e,
            }
        })?;
        pool.set_access(device, PoolAccess::READ_WRITE)?;
        Ok(pool)
    }

    /// `cudaMemPoolCreate`; the callers have checked that `device` has pools.
    fn create(location: PoolLocation, device: Device, max_bytes: usize) -> Result<MemPool> {
        Self::create_with(location, device, max_bytes, false)
    }

    /// [`create`](Self::create), shareable with other processes through a POSIX file
    /// descriptor when `shareable`.
    fn create_with(
        location: PoolLocation,
        device: Device,
        max_bytes: usize,
        shareable: bool,
    ) -> Result<MemPool> {
        // (Only the refusal of builds without host pools names the device.)
        #[cfg(cudart_mem_pool_host)]
        let _ = device;
        // SAFETY: cudaMemPoolProps is plain C data; all-zero is its documented default (no
        // handle types, no security attributes, reserved bytes zero).
        let mut props: sys::cudaMemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::cudaMemAllocationType::cudaMemAllocationTypePinned;
        props.handleTypes = if shareable {
            sys::cudaMemAllocationHandleType::cudaMemHandleTypePosixFileDescriptor
        } else {
            sys::cudaMemAllocationHandleType::cudaMemHandleTypeNone
        };
        props.location = match location {
            PoolLocation::Device(d) => {
                let d = d.ordinal();
                sys::cudaMemLocation::new(sys::cudaMemLocationType::cudaMemLocationTypeDevice, d)
            }
            #[cfg(cudart_mem_pool_host)]
            PoolLocation::Host => {
                sys::cudaMemLocation::new(sys::cudaMemLocationType::cudaMemLocationTypeHost, 0)
            }
            #[cfg(not(cudart_mem_pool_host))]
            PoolLocation::Host => {
                return Err(Misuse::Unsupported {
                    device: device.ordinal(),
                    feature: "host memory pools",
                }
                .into())
            }
        };
        #[cfg(cudart_mem_pool_max_size)]
        {
            props.maxSize = max_bytes;
        }
        #[cfg(not(cudart_mem_pool_max_size))]
        let _ = max_bytes;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer and a fully initialised props struct.
        let code = unsafe { sys::cudaMemPoolCreate(&mut raw, &props) };
        check(code, || {
            format!(
                "cudaMemPoolCreate({location:?}{}{})",
                if shareable {
                    ", POSIX file descriptor"
                } else {
                    ""
                },
                if max_bytes > 0 {
                    format!(", max {}", fmt_bytes(max_bytes))
                } else {
                    String::new()
                }
            )
        })?;
        let pool = MemPool {
            inner: Arc::new(PoolInner {
                raw,
                owned: true,
                location,
                shareable,
            }),
        };
        pool.set_release_threshold(u64::MAX)?;
        Ok(pool)
    }

    /// A stand-in pool whose handle is never passed to the runtime, for timing the
    /// bookkeeping of pooled buffers without a GPU (`measure::detached_pool_pairs`).
    #[cfg(feature = "measure")]
    pub(crate) fn detached() -> MemPool {
        MemPool {
            inner: Arc::new(PoolInner {
                raw: NonNull::dangling().as_ptr(),
                // Not owned: never destroyed.
                owned: false,
                location: PoolLocation::Device(Device::from_ordinal_unchecked(0)),
                shareable: false,
            }),
        }
    }

    /// A new pool of device memory on `device`, like [`MemPool::new`], whose memory other
    /// processes can map (`cudaMemPoolCreate` with `cudaMemHandleTypePosixFileDescriptor`):
    /// the pool travels as a file descriptor ([`export_fd`](Self::export_fd)), its buffers as
    /// [`ipc`](crate::ipc) handles.
    ///
    /// Errors: [`Misuse::Unsupported`] when the device has no memory pools; the runtime's
    /// error where it refuses shareable pools (some sandboxes).
    pub fn shareable(device: Device) -> Result<MemPool> {
        require_pools(device)?;
        Self::create_with(PoolLocation::Device(device), device, 0, true)
    }

    /// Whether the pool's memory can be shared with other processes: made by
    /// [`shareable`](Self::shareable), or imported from another process.
    pub fn is_shareable(&self) -> bool {
        self.inner.shareable
    }

    /// A new file descriptor for the pool (`cudaMemPoolExportToShareableHandle`), for another
    /// process to import (sent over a Unix socket with `SCM_RIGHTS`, as
    /// [`ipc::Channel`](crate::ipc::Channel) does). Closed when dropped.
    ///
    /// Errors: [`Misuse::InvalidArgument`] for a pool that is not
    /// [`shareable`](Self::shareable).
    pub fn export_fd(&self) -> Result<std::os::fd::OwnedFd> {
        if !self.inner.shareable {
            return Err(Misuse::InvalidArgument {
                op: "MemPool::export_fd",
                reason: format!(
                    "{self:?} was not made shareable (MemPool::shareable): only such a pool \
                     can be exported"
                ),
            }
            .into());
        }
        let mut fd: std::os::raw::c_int = -1;
        // SAFETY: for a POSIX file descriptor the shareable handle is an `int`, written
        // through the valid out-pointer; the pool is live.
        let code = unsafe {
            sys::cudaMemPoolExportToShareableHandle(
                (&mut fd as *mut std::os::raw::c_int).cast(),
                self.inner.raw,
                sys::cudaMemAllocationHandleType::cudaMemHandleTypePosixFileDescriptor,
                0,
            )
        };
        check(code, || {
            format!(
                "cudaMemPoolExportToShareableHandle({:p}, POSIX file descriptor)",
                self.inner.raw
            )
        })?;
        if fd < 0 {
            return Err(Misuse::InvalidArgument {
                op: "MemPool::export_fd",
                reason: format!("the runtime returned file descriptor {fd}"),
            }
            .into());
        }
        // SAFETY: a new descriptor the runtime opened for the caller, owned by nothing else.
        Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    }

    /// Imports a pool that another process exported (`cudaMemPoolImportFromShareableHandle`),
    /// whose memory lives on the local device `device`. The descriptor stays the caller's;
    /// the pool is destroyed when its last handle and buffer are gone.
    pub(crate) fn import_fd(fd: std::os::fd::BorrowedFd<'_>, device: Device) -> Result<MemPool> {
        use std::os::fd::AsRawFd;
        let raw_fd = fd.as_raw_fd();
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; for a POSIX file descriptor the runtime takes the `int`
        // itself as the pointer-sized argument (the CUDA samples pass `(void*)(uintptr_t)fd`);
        // the descriptor is open (borrowed) for the call.
        let code = unsafe {
            sys::cudaMemPoolImportFromShareableHandle(
                &mut raw,
                raw_fd as usize as *mut c_void,
                sys::cudaMemAllocationHandleType::cudaMemHandleTypePosixFileDescriptor,
                0,
            )
        };
        check(code, || {
            format!("cudaMemPoolImportFromShareableHandle(fd {raw_fd}, POSIX file descriptor)")
        })?;
        Ok(MemPool {
            inner: Arc::new(PoolInner {
                raw,
                owned: true,
                location: PoolLocation::Device(device),
                shareable: true,
            }),
        })
    }

    /// Where the pool's memory lives.
    pub fn location(&self) -> PoolLocation {
        self.inner.location
    }

    /// Whether this is a device's default pool (never destroyed).
    pub fn is_default(&self) -> bool {
        !self.inner.owned
    }

    /// The raw handle, for calls this crate does not wrap. Stays owned by `self`.
    pub fn as_raw(&self) -> sys::cudaMemPool_t {
        self.inner.raw
    }

    fn get_u64(&self, attr: sys::cudaMemPoolAttr, name: &str) -> Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: the pool is live (we hold it); these attributes are cuuint64_t values and
        // `v` is a writable u64.
        let code = unsafe {
            sys::cudaMemPoolGetAttribute(self.inner.raw, attr, (&mut v as *mut u64).cast())
        };
        check(code, || {
            format!("cudaMemPoolGetAttribute({:p}, {name})", self.inner.raw)
        })?;
        Ok(v)
    }

    fn set_u64(&self, attr: sys::cudaMemPoolAttr, name: &str, mut v: u64) -> Result<()> {
        // SAFETY: the pool is live; these attributes take a pointer to a cuuint64_t.
        let code = unsafe {
            sys::cudaMemPoolSetAttribute(self.inner.raw, attr, (&mut v as *mut u64).cast())
        };
        check(code, || {
            format!("cudaMemPoolSetAttribute({:p}, {name}, {v})", self.inner.raw)
        })
    }

    /// Sets how much reserved memory the pool keeps at a synchronization
    /// (`cudaMemPoolAttrReleaseThreshold`); `u64::MAX` keeps everything.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        use sys::cudaMemPoolAttr as A;
        self.set_u64(
            A::cudaMemPoolAttrReleaseThreshold,
            "ReleaseThreshold",
            bytes,
        )
    }

    /// The release threshold, bytes.
    pub fn release_threshold(&self) -> Result<u64> {
        use sys::cudaMemPoolAttr as A;
        self.get_u64(A::cudaMemPoolAttrReleaseThreshold, "ReleaseThreshold")
    }

    /// The memory statistics.
    pub fn stats(&self) -> Result<PoolStats> {
        use sys::cudaMemPoolAttr as A;
        Ok(PoolStats {
            used: self.get_u64(A::cudaMemPoolAttrUsedMemCurrent, "UsedMemCurrent")?,
            used_high: self.get_u64(A::cudaMemPoolAttrUsedMemHigh, "UsedMemHigh")?,
            reserved: self.get_u64(A::cudaMemPoolAttrReservedMemCurrent, "ReservedMemCurrent")?,
            reserved_high: self.get_u64(A::cudaMemPoolAttrReservedMemHigh, "ReservedMemHigh")?,
        })
    }

    /// Bytes handed out and not yet freed.
    pub fn used(&self) -> Result<u64> {
        self.get_u64(
            sys::cudaMemPoolAttr::cudaMemPoolAttrUsedMemCurrent,
            "UsedMemCurrent",
        )
    }

    /// Bytes the pool holds from the driver.
    pub fn reserved(&self) -> Result<u64> {
        self.get_u64(
            sys::cudaMemPoolAttr::cudaMemPoolAttrReservedMemCurrent,
            "ReservedMemCurrent",
        )
    }

    /// Resets both high-water marks to the current values.
    pub fn reset_high_water(&self) -> Result<()> {
        use sys::cudaMemPoolAttr as A;
        // The runtime only accepts 0 for these: it resets the mark to the current value.
        self.set_u64(A::cudaMemPoolAttrUsedMemHigh, "UsedMemHigh", 0)?;
        self.set_u64(A::cudaMemPoolAttrReservedMemHigh, "ReservedMemHigh", 0)
    }

    /// Hands reserved memory that is not in use back to the driver until at most `keep` bytes
    /// remain reserved (`cudaMemPoolTrimTo`). Memory whose free is still queued on a stream is
    /// in use until the stream reaches the free.
    pub fn trim(&self, keep: usize) -> Result<()> {
        // SAFETY: the pool is live; plain value argument.
        let code = unsafe { sys::cudaMemPoolTrimTo(self.inner.raw, keep) };
        check(code, || {
            format!(
                "cudaMemPoolTrimTo({:p}, {})",
                self.inner.raw,
                fmt_bytes(keep)
            )
        })
    }

    /// Grows the pool to hold at least `bytes` (one allocation of that size, freed at once on
    /// `stream`), so that later allocations up to it need no driver call. The memory stays
    /// reserved only while the release threshold is at least `bytes` (always, for pools from
    /// [`MemPool::new`]); with the default pool's threshold of 0 the next synchronization
    /// hands it back.
    pub fn reserve(&self, bytes: usize, stream: &Stream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // The null handle is the current device's legacy stream: keep the stream's device
        // current across both calls, so that the free is ordered after the allocation.
        let _g = stream.inner().enter()?;
        let (ptr, ..) = alloc(self, bytes, stream, "MemPool::reserve")?;
        let p = ptr.as_ptr();
        // SAFETY: `p` was just allocated on `stream` from this pool and is used by nothing:
        // freeing it in the same stream's order is always valid.
        let code = unsafe { sys::cudaFreeAsync(p, stream.as_raw()) };
        check(code, || format!("cudaFreeAsync({p:p})"))
    }

    /// Lets `device` access the pool's memory (`cudaMemPoolSetAccess`): peer devices need it
    /// (with peer access possible between the two), and for a host pool every device that
    /// touches it. The pool's own device always has read-write access to a device pool and
    /// cannot lose it. Read-only access ([`PoolAccess::READ`]) to a device pool is refused by
    /// the driver with `cudaErrorNotSupported` (seen with driver 580 on H200s): grant
    /// [`PoolAccess::READ_WRITE`].
    pub fn set_access(&self, device: Device, access: PoolAccess) -> Result<()> {
        let desc = sys::cudaMemAccessDesc {
            location: sys::cudaMemLocation::new(
                sys::cudaMemLocationType::cudaMemLocationTypeDevice,
                device.ordinal(),
            ),
            flags: sys::cudaMemAccessFlags(access.0),
        };
        // SAFETY: the pool is live; `desc` is one valid descriptor, read during the call.
        let code = unsafe { sys::cudaMemPoolSetAccess(self.inner.raw, &desc, 1) };
        check(code, || {
            format!(
                "cudaMemPoolSetAccess({:p}, device {}, {access:?})",
                self.inner.raw,
                device.ordinal()
            )
        })
    }

    /// The access `device` has to the pool's memory (`cudaMemPoolGetAccess`).
    pub fn access(&self, device: Device) -> Result<PoolAccess> {
        let mut loc = sys::cudaMemLocation::new(
            sys::cudaMemLocationType::cudaMemLocationTypeDevice,
            device.ordinal(),
        );
        let mut flags = sys::cudaMemAccessFlags(0);
        // SAFETY: valid out-pointer and location; the pool is live.
        let code = unsafe { sys::cudaMemPoolGetAccess(&mut flags, self.inner.raw, &mut loc) };
        check(code, || {
            format!(
                "cudaMemPoolGetAccess({:p}, device {})",
                self.inner.raw,
                device.ordinal()
            )
        })?;
        Ok(PoolAccess(flags.0))
    }
}

/// What a pooled buffer remembers besides its fence: its pool, kept alive. Its allocation
/// stream, where the free is queued, is the fence's [`origin`](Fence::origin) (one stream
/// reference for both).
pub(crate) struct Pooled {
    pool: MemPool,
}

impl fmt::Debug for Pooled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.pool.fmt(f)
    }
}

impl Pooled {
    /// The pool.
    pub(crate) fn pool(&self) -> &MemPool {
        &self.pool
    }

    /// Queues the free of `ptr` (`bytes` long, guarded by `fence`) on the allocation stream,
    /// after every piece of work recorded on the fence, without blocking the host. On error
    /// nothing was freed: the caller leaks the memory.
    #[inline]
    pub(crate) fn free(&self, ptr: *mut c_void, bytes: usize, fence: &mut Fence) -> Result<()> {
        Self::free_with(ptr, bytes, fence, |ptr, s| {
            // SAFETY: we own the allocation (from this pool, allocated on `s`); `free_with`
            // ordered the stream after all pending work on it on other streams, and its own
            // earlier work precedes the free in stream order. Nothing uses the memory
            // afterwards.
            // (Another thread's per-thread default stream is named through its device's
            // legacy stream, which comes after all of its work: `StreamInner::raw`.)
            let code = unsafe { sys::cudaFreeAsync(ptr, s.inner().raw()) };
            check(code, || format!("cudaFreeAsync({ptr:p}, {s:?})"))
        })
    }

    /// [`free`](Self::free) with the runtime call `raw_free` (the ablation seam of
    /// `measure::PoolPair`), called with the allocation stream ordered after all work recorded
    /// on `fence` and its device current. The exclusive borrow of the fence (the buffer is
    /// being freed: nothing else can use it) spares the lock.
    #[inline]
    pub(crate) fn free_with(
        ptr: *mut c_void,
        bytes: usize,
        fence: &mut Fence,
        raw_free: impl FnOnce(*mut c_void, &Stream) -> Result<()>,
    ) -> Result<()> {
        // The legacy stream's null handle means the current device's: make its device current.
        let _g = fence.origin().map(|s| s.inner().enter()).transpose()?;
        // Ordering without marking: nothing can wait for the free, the buffer is gone after it.
        let Some(s) = fence.order_origin_mut((0, bytes), Access::Write)? else {
            // Every pooled buffer's fence is made by `alloc_with`, with its stream.
            return Err(Misuse::InvalidArgument {
                op: "free",
                reason: "a pooled buffer without its allocation stream".into(),
            }
            .into());
        };
        raw_free(ptr, &s)
    }
}

/// `cudaMallocFromPoolAsync(bytes)` on `stream`; out of memory trims the pool to 0 and retries
/// once, and a second failure says which pool and how full it is. The caller owns the memory,
/// to free through the [`Pooled`], and guards it with the [`Fence`], which records the
/// allocation already (a write on `stream`), so that work elsewhere and host access wait until
/// the stream has reached it.
#[inline]
pub(crate) fn alloc(
    pool: &MemPool,
    bytes: usize,
    stream: &Stream,
    op: &'static str,
) -> Result<(NonNull<c_void>, Pooled, Fence)> {
    alloc_with(pool, bytes, stream, op, || {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the pool and stream are live handles; `bytes` is non-zero
        // (checked by the callers) and the runtime validates the rest.
        let code = unsafe {
            sys::cudaMallocFromPoolAsync(&mut raw, bytes, pool.as_raw(), stream.as_raw())
        };
        check(code, || {
            format!(
                "cudaMallocFromPoolAsync({}, {pool:?}, {stream:?})",
                fmt_bytes(bytes)
            )
        })
        .map(|()| raw)
    })
}

/// [`alloc`] of `layout`'s bytes for elements of `T`, the address checked by
/// [`Layout::place_owned`]: a misaligned one is freed on `stream` (`cudaFreeAsync`) before the
/// refusal.
#[inline]
pub(crate) fn alloc_for<T>(
    pool: &MemPool,
    layout: &Layout<T>,
    stream: &Stream,
    op: &'static str,
) -> Result<(NonNull<T>, Pooled, Fence)> {
    let (raw, pooled, mut fence) = alloc(pool, layout.bytes(), stream, op)?;
    // The pool and the fence stay where they are (borrowed by the refusal's free only): a
    // fence is a few cache lines, and every move of it costs a copy on this hot path.
    let ptr = layout.place(raw.as_ptr(), "cudaMallocFromPoolAsync", |p| {
        pooled.free(p.as_ptr(), layout.bytes(), &mut fence)
    })?;
    Ok((ptr, pooled, fence))
}

/// [`alloc`] with the runtime call `raw_alloc` (the ablation seam of
/// `measure::PoolPair`), called with the stream's device current.
#[inline]
pub(crate) fn alloc_with(
    pool: &MemPool,
    bytes: usize,
    stream: &Stream,
    op: &'static str,
    raw_alloc: impl Fn() -> Result<*mut c_void>,
) -> Result<(NonNull<c_void>, Pooled, Fence)> {
    // The stream's device current first: a legacy stream of another device is accepted.
    let _g = stream.inner().enter()?;
    stream.inner().check_current(op)?;
    // In flight for capture begins until marked below (an allocation that lands in a capture
    // is graph memory: it must be known as such).
    let queued = Fence::queue_alloc(stream)?;
    let raw = match raw_alloc() {
        Ok(raw) => raw,
        Err(e) => retry_after_trim(pool, e, &raw_alloc)?,
    };
    let ptr = NonNull::new(raw).ok_or(Misuse::NullPointer { op })?;
    // The allocation is queued: mark it on the new fence (which nobody else sees yet, so no
    // ordering is needed and nothing can be in flight) before anyone can use the memory.
    let fence = queued.marked((0, bytes), Access::Write);
    Ok((ptr, Pooled { pool: pool.clone() }, fence))
}

/// [`alloc_with`]'s failure path, out of line: out of memory trims the pool to 0 and retries
/// once, and a second failure says which pool and how full it is; other errors are returned.
#[cold]
#[inline(never)]
fn retry_after_trim(
    pool: &MemPool,
    error: Error,
    raw_alloc: &impl Fn() -> Result<*mut c_void>,
) -> Result<*mut c_void> {
    if !error.is_out_of_memory() {
        return Err(error);
    }
    let _ = pool.trim(0);
    raw_alloc().map_err(|e| match e {
        Error::Cuda { code, call } if code.is_out_of_memory() => Error::Cuda {
            code,
            call: format!(
                "{call} (after trimming the pool and one retry; pool {})",
                pool.stats().map_or_else(
                    |e| format!("statistics unavailable: {e}"),
                    |s| s.to_string()
                )
            ),
        },
        e => e,
    })
}

#[cfg(test)]
mod tests {
    use std::os::raw::c_void;

    use super::Pooled;
    use crate::error::{Error, Misuse};
    use crate::fence::Fence;

    /// A free through a fence that holds no allocation stream (only a fence made by
    /// `alloc_with` has one) is refused with the exact misuse, before any runtime call: the
    /// memory is then leaked, never freed on a guessed stream.
    #[test]
    fn a_free_without_its_allocation_stream_is_refused() {
        let mut fence = Fence::default();
        let mut called = false;
        let ptr = std::ptr::NonNull::<u64>::dangling()
            .as_ptr()
            .cast::<c_void>();
        let e = Pooled::free_with(ptr, 64, &mut fence, |_, _| {
            called = true;
            Ok(())
        })
        .unwrap_err();
        assert!(!called, "the free was queued");
        match e {
            Error::Misuse(Misuse::InvalidArgument { op, reason }) => {
                assert_eq!(op, "free");
                assert_eq!(reason, "a pooled buffer without its allocation stream");
            }
            e => panic!("unexpected error: {e:?}"),
        }
    }
}
