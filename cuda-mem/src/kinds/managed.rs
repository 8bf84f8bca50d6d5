//! Unified (managed) memory: `cudaMallocManaged`, one pointer valid on CPU and GPU, migrated
//! page by page on first touch, or ahead of time with [`ManagedBuffer::prefetch`].
//!
//! Page faults are slow (a few GB/s); prefetching moves the pages at copy speed, and advice
//! ([`Advice`]) tells the driver where pages should live.

use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::contract::buffer::sealed::{Alloc, HostAlloc};
use crate::contract::buffer::Buffer;
use crate::contract::layout::Layout;
use crate::contract::memory::Loc;
use crate::contract::size::fmt_bytes;
use crate::error::{check, Misuse, Result};
use crate::fence::{Access, Fence};
use crate::handles::devices::Device;
use crate::handles::stream::{Stream, StreamInner};

/// `cudaCpuDeviceId`: the host, where the API takes a device ordinal.
pub const CPU_DEVICE_ID: i32 = -1;

/// How a managed allocation is attached (`cudaMemAttach*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// `cudaMemAttachGlobal`: accessible from any stream on any device.
    Global,
    /// `cudaMemAttachHost`: initially visible only to the host, until attached to a stream.
    Host,
    /// `cudaMemAttachSingle` (with [`ManagedBuffer::attach`] only): visible to one stream.
    Single,
}

impl Attach {
    fn bits(self) -> u32 {
        match self {
            Attach::Global => sys::cudaMemAttachGlobal,
            Attach::Host => sys::cudaMemAttachHost,
            Attach::Single => sys::cudaMemAttachSingle,
        }
    }
}

/// Where pages live or should live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// The host (`cudaCpuDeviceId`, or `cudaMemLocationTypeHost`).
    Host,
    /// A device.
    Device(Device),
}

impl Location {
    /// The CUDA 12 encoding: a device ordinal, `cudaCpuDeviceId` for the host.
    pub fn as_device_id(self) -> i32 {
        match self {
            Location::Host => CPU_DEVICE_ID,
            Location::Device(d) => d.ordinal(),
        }
    }

    /// From the CUDA 12 encoding; `None` for `cudaInvalidDeviceId` (no location).
    pub fn from_device_id(id: i32) -> Option<Location> {
        match id {
            CPU_DEVICE_ID => Some(Location::Host),
            d if d >= 0 => Some(Location::Device(Device::from_ordinal_unchecked(d))),
            _ => None,
        }
    }

    /// The `cudaMemLocation` encoding (built through `cudaMemLocation::new`, whatever the
    /// header's layout of the struct).
    #[cfg(any(cudart_prefetch_location, cudart_advise_location))]
    fn as_mem_location(self) -> sys::cudaMemLocation {
        use sys::cudaMemLocationType as T;
        match self {
            Location::Host => sys::cudaMemLocation::new(T::cudaMemLocationTypeHost, 0),
            Location::Device(d) => {
                sys::cudaMemLocation::new(T::cudaMemLocationTypeDevice, d.ordinal())
            }
        }
    }
}

/// Advice for the driver about a managed range (`cudaMemAdvise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// `cudaMemAdviseSetReadMostly`: mostly read; the driver may keep read copies everywhere.
    SetReadMostly,
    /// `cudaMemAdviseUnsetReadMostly`.
    UnsetReadMostly,
    /// `cudaMemAdviseSetPreferredLocation`: pages should live here.
    SetPreferredLocation(Location),
    /// `cudaMemAdviseUnsetPreferredLocation`.
    UnsetPreferredLocation,
    /// `cudaMemAdviseSetAccessedBy`: map pages for this processor to avoid faults.
    SetAccessedBy(Location),
    /// `cudaMemAdviseUnsetAccessedBy`.
    UnsetAccessedBy(Location),
}

impl Advice {
    fn raw(self) -> (sys::cudaMemoryAdvise, Location) {
        use sys::cudaMemoryAdvise as A;
        // The location is ignored by the runtime for the read-mostly and unset-preferred advice.
        match self {
            Advice::SetReadMostly => (A::cudaMemAdviseSetReadMostly, Location::Host),
            Advice::UnsetReadMostly => (A::cudaMemAdviseUnsetReadMostly, Location::Host),
            Advice::SetPreferredLocation(l) => (A::cudaMemAdviseSetPreferredLocation, l),
            Advice::UnsetPreferredLocation => {
                (A::cudaMemAdviseUnsetPreferredLocation, Location::Host)
            }
            Advice::SetAccessedBy(l) => (A::cudaMemAdviseSetAccessedBy, l),
            Advice::UnsetAccessedBy(l) => (A::cudaMemAdviseUnsetAccessedBy, l),
        }
    }
}

/// A typed buffer of managed memory, freed on drop (`cudaFree`).
///
/// Host access waits for GPU work recorded on the buffer (prefetches, async copies and
/// memsets, kernels given its address through [`device_ptr`](crate::DevicePtr::device_ptr) or
/// [`device_ptr_mut`](crate::DevicePtrMut::device_ptr_mut)).
///
/// Element types aligned to more than 256 bytes (the alignment CUDA documents for its
/// allocators, and all it promises) are refused before anything is allocated, with
/// [`Misuse::AlignmentUnsupported`]; every address an allocator returns is checked for `T`'s
/// alignment too (a misaligned one is given back and refused with [`Misuse::Misaligned`]).
/// [`from_raw`](Self::from_raw) accepts any alignment that its address has.
///
/// # Devices without concurrent managed access
///
/// On devices without `cudaDevAttrConcurrentManagedAccess` (Windows, GPUs before Pascal, some
/// Jetson boards) the CPU may not touch managed memory while *any* kernel runs on the device,
/// and memory attached to the host or to one stream may not be touched by other GPU work.
/// Neither can be checked from here: a slice handed out would stay alive across launches this
/// buffer never sees. There, safe host access ([`as_slice`](Self::as_slice),
/// [`as_mut_slice`](Self::as_mut_slice)) is refused with [`Misuse::Unsupported`] and the
/// `unsafe` [`as_slice_unchecked`](Self::as_slice_unchecked) states the rule instead; GPU work
/// on a stream the attachment ([`Attach`]) excludes is refused with
/// [`Misuse::InvalidArgument`]. Devices with concurrent access (Linux on Pascal and newer, the
/// H100/H200) have neither restriction.
///
/// ```no_run
/// # fn main() -> cuda_mem::Result<()> {
/// use cuda_mem::{Attach, Device, Location, ManagedBuffer, Stream};
/// let stream = Stream::new()?;
/// let mut m = ManagedBuffer::<u32>::zeroed(1 << 20, Attach::Global)?;
/// m.prefetch(Location::Device(Device::get(0)?), &stream)?; // migrate pages ahead of a kernel
/// m.memset_async(0xff, &stream)?;
/// assert_eq!(m.as_slice()?[0], u32::MAX);      // waits, then pages fault back to the host
/// # Ok(()) }
/// ```
pub type ManagedBuffer<T> = Buffer<T, ManagedMemory>;

/// How a [`ManagedBuffer`]'s memory was obtained (`cudaMallocManaged` on a device), and its
/// state: whether that device allows host access while kernels run, and its attachment.
#[derive(Debug)]
pub struct ManagedMemory {
    device: Device,
    /// `cudaDevAttrConcurrentManagedAccess` of `device`, read once at allocation.
    concurrent_access: bool,
    /// Which GPU work may touch the memory (enforced only without concurrent access).
    attached: Attached,
}

/// The attachment of a managed buffer.
#[derive(Debug, Clone)]
enum Attached {
    Global,
    Host,
    Single(Arc<StreamInner>),
}

impl Alloc for ManagedMemory {
    const LOC: Loc = Loc::Managed;
    const KIND: &'static str = "ManagedBuffer";

    /// Without concurrent managed access, GPU work may touch the memory only where its
    /// attachment allows: any stream when global, none when attached to the host, one stream
    /// when attached to it.
    fn check_stream(&self, stream: &Stream, op: &'static str) -> Result<()> {
        if self.concurrent_access {
            return Ok(());
        }
        let reason = match &self.attached {
            Attached::Global => return Ok(()),
            Attached::Single(s) if StreamInner::same(s, stream.inner()) => return Ok(()),
            Attached::Single(_) => {
                "the managed buffer is attached to another stream (cudaMemAttachSingle), and \
                 the device lacks concurrent managed access"
            }
            Attached::Host => {
                "the managed buffer is attached to the host (cudaMemAttachHost), and the \
                 device lacks concurrent managed access: attach it to the stream first"
            }
        };
        Err(Misuse::InvalidArgument {
            op,
            reason: reason.to_string(),
        }
        .into())
    }

    fn release(&mut self, ptr: NonNull<u8>, _bytes: usize, fence: &mut Fence) -> Result<()> {
        fence.host_wait_mut(Access::Write)?;
        // Free with the allocating device current, as `DeviceBuffer` does, whatever the caller
        // has current (the guard restores it).
        let _guard = self.device.guard().ok();
        let p = ptr.as_ptr();
        // SAFETY: the buffer owns the allocation and never uses it after this call (the
        // `release` contract); pending work on it was waited for above.
        check(unsafe { sys::cudaFree(p.cast()) }, || {
            format!("cudaFree({p:p})")
        })
    }
}

impl HostAlloc for ManagedMemory {
    /// Refuses safe host access where the device cannot make it sound.
    fn check_host(&self) -> Result<()> {
        if self.concurrent_access {
            Ok(())
        } else {
            Err(Misuse::Unsupported {
                device: self.device.ordinal(),
                feature: "cudaDevAttrConcurrentManagedAccess (safe host access to managed \
                          memory; see ManagedBuffer::as_slice_unchecked)",
            }
            .into())
        }
    }
}

impl<T: Pod> ManagedBuffer<T> {
    /// Allocates `len` zeroed elements with `cudaMallocManaged(attach)` on the current device.
    ///
    /// Checks first that the device supports managed memory, and refuses
    /// ([`Misuse::ManagedExceedsFree`]) a request larger than the device's free memory:
    /// oversubscribed managed memory can stall the whole GPU.
    pub fn zeroed(len: usize, attach: Attach) -> Result<Self> {
        let buf = Self::alloc(len, attach, "ManagedBuffer::zeroed")?;
        let (p, bytes) = (buf.ptr.as_ptr().cast::<u8>(), buf.byte_len());
        if buf.alloc.concurrent_access {
            // SAFETY: the allocation holds `bytes` bytes and nothing else uses it yet; the
            // device allows host access while kernels run.
            unsafe { std::ptr::write_bytes(p, 0, bytes) };
        } else {
            // Without concurrent access the host may not touch managed memory while any kernel
            // runs (another thread's too): fill it on the device, recorded on the buffer.
            // SAFETY: `p` covers our fresh allocation of `bytes` bytes.
            let code = unsafe { sys::cudaMemset(p.cast(), 0, bytes) };
            buf.fence.mark(
                &Stream::legacy_on(buf.alloc.device.ordinal()),
                (0, bytes),
                Access::Write,
            );
            check(code, || {
                format!("cudaMemset({p:p}, 0, {})", fmt_bytes(bytes))
            })?;
        }
        Ok(buf)
    }

    /// Like [`zeroed`](Self::zeroed) without the zero fill: no page is touched, so none is
    /// placed on the host before its first use (the fill dominates the cost of allocating).
    ///
    /// # Safety
    /// The memory is uninitialised: write it (from the host, or from the device through
    /// [`device_ptr_mut`](crate::DevicePtrMut::device_ptr_mut)) before reading it through
    /// [`as_slice`](Self::as_slice).
    pub unsafe fn uninit(len: usize, attach: Attach) -> Result<Self> {
        Self::alloc(len, attach, "ManagedBuffer::uninit")
    }

    /// Takes ownership of managed memory allocated with `cudaMallocManaged(.., attach)` on the
    /// current device elsewhere (C or C++ code); freed with `cudaFree` on drop.
    ///
    /// Errors: [`Misuse::NullPointer`], [`Misuse::ZeroLength`], [`Misuse::SizeOverflow`],
    /// [`Misuse::Misaligned`], and [`Misuse::InvalidFlags`] for [`Attach::Single`] (attach the
    /// buffer to its stream with [`attach`](Self::attach) after adopting it).
    ///
    /// # Safety
    /// `ptr` must come from `cudaMallocManaged` with `attach` on the current device, hold at
    /// least `len` initialised elements, not be freed elsewhere, not be owned by anything
    /// else, and have no GPU work pending on it.
    pub unsafe fn from_raw(ptr: *mut T, len: usize, attach: Attach) -> Result<Self> {
        let p = Layout::adopt(ptr, len, "ManagedBuffer::from_raw")?;
        if attach == Attach::Single {
            return Err(Misuse::InvalidFlags {
                op: "ManagedBuffer::from_raw (SINGLE: adopt as GLOBAL or HOST, then attach)",
                flags: attach.bits(),
            }
            .into());
        }
        let dev = Device::current()?;
        let concurrent_access =
            dev.attribute(sys::cudaDeviceAttr::cudaDevAttrConcurrentManagedAccess)? != 0;
        Ok(Self::adopt(p, len, dev, concurrent_access, attach))
    }

    fn adopt(
        ptr: NonNull<T>,
        len: usize,
        device: Device,
        concurrent_access: bool,
        attach: Attach,
    ) -> Self {
        let attached = if attach == Attach::Host {
            Attached::Host
        } else {
            Attached::Global
        };
        Buffer::from_parts(
            ptr,
            len,
            Fence::default(),
            ManagedMemory {
                device,
                concurrent_access,
                attached,
            },
        )
    }

    fn alloc(len: usize, attach: Attach, op: &'static str) -> Result<Self> {
        let layout = Layout::<T>::of(len, op)?;
        let bytes = layout.bytes();
        if attach == Attach::Single {
            return Err(Misuse::InvalidFlags {
                op: "cudaMallocManaged (SINGLE is only for cudaStreamAttachMemAsync)",
                flags: attach.bits(),
            }
            .into());
        }
        let dev = Device::current()?;
        dev.require(
            sys::cudaDeviceAttr::cudaDevAttrManagedMemory,
            "cudaDevAttrManagedMemory (managed memory)",
        )?;
        #[allow(unused_mut)]
        let mut concurrent_access =
            dev.attribute(sys::cudaDeviceAttr::cudaDevAttrConcurrentManagedAccess)? != 0;
        #[cfg(feature = "testing")]
        if crate::testing::no_concurrent_managed_access() {
            concurrent_access = false;
        }
        let (free, _) = dev.mem_info()?;
        if bytes > free {
            return Err(Misuse::ManagedExceedsFree { bytes, free }.into());
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer, non-zero size, documented flag.
        let code = unsafe { sys::cudaMallocManaged(&mut raw, bytes, attach.bits()) };
        check(code, || {
            format!("cudaMallocManaged({}, {attach:?})", fmt_bytes(bytes))
        })?;
        let ptr = layout.place(raw, "cudaMallocManaged", crate::kinds::device::free_refused)?;
        let buf = Self::adopt(ptr, len, dev, concurrent_access, attach);
        Ok(buf)
    }

    /// The contents, after waiting for recorded GPU work and, on devices without concurrent
    /// managed access, for the whole device (`cudaDeviceSynchronize`).
    ///
    /// # Safety
    /// On a device without concurrent managed access, no kernel may be launched on the device
    /// (by any thread, through any library) while the returned slice lives. On other devices
    /// this is [`as_slice`](Self::as_slice).
    pub unsafe fn as_slice_unchecked(&self) -> Result<&[T]> {
        self.fence.host_wait(Access::Read)?;
        if !self.alloc.concurrent_access {
            self.alloc.device.synchronize()?;
        }
        // SAFETY: as `as_slice`; the caller keeps the device idle while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The writable form of [`as_slice_unchecked`](Self::as_slice_unchecked).
    ///
    /// # Safety
    /// As for [`as_slice_unchecked`](Self::as_slice_unchecked).
    pub unsafe fn as_mut_slice_unchecked(&mut self) -> Result<&mut [T]> {
        self.fence.host_wait_mut(Access::Write)?;
        if !self.alloc.concurrent_access {
            self.alloc.device.synchronize()?;
        }
        // SAFETY: as `as_mut_slice`; the caller keeps the device idle while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// Whether the device allows host access while kernels run (read at allocation).
    pub fn has_concurrent_access(&self) -> bool {
        self.alloc.concurrent_access
    }

    fn queued(
        &self,
        stream: &Stream,
        access: Access,
        op: &'static str,
        f: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.alloc.check_stream(stream, op)?;
        // The stream's device current for the call, whatever the caller has current.
        let _g = stream.device().guard()?;
        let _use = self.fence.begin(stream, (0, self.byte_len()), access)?;
        f()
    }

    /// Queues a migration of the whole buffer to `to` on `stream` (`cudaMemPrefetchAsync`).
    pub fn prefetch(&mut self, to: Location, stream: &Stream) -> Result<()> {
        let (p, bytes) = (self.ptr.as_ptr(), self.byte_len());
        self.queued(stream, Access::Read, "prefetch", || {
            #[cfg(cudart_prefetch_location)]
            // SAFETY: `p`/`bytes` cover our live managed allocation; the location is valid.
            let code = unsafe {
                sys::cudaMemPrefetchAsync(p.cast(), bytes, to.as_mem_location(), 0, stream.as_raw())
            };
            #[cfg(not(cudart_prefetch_location))]
            // SAFETY: as above, CUDA 12 signature (device ordinal or cudaCpuDeviceId).
            let code = unsafe {
                sys::cudaMemPrefetchAsync(p.cast(), bytes, to.as_device_id(), stream.as_raw())
            };
            check(code, || {
                format!("cudaMemPrefetchAsync({p:p}, {}, {to:?})", fmt_bytes(bytes))
            })
        })
    }

    /// Gives the driver advice about the whole buffer (`cudaMemAdvise`).
    pub fn advise(&self, advice: Advice) -> Result<()> {
        let (p, bytes) = (self.ptr.as_ptr(), self.byte_len());
        let (raw, loc) = advice.raw();
        #[cfg(cudart_advise_location)]
        // SAFETY: `p`/`bytes` cover our live managed allocation; advice and location are valid.
        let code = unsafe { sys::cudaMemAdvise(p.cast(), bytes, raw, loc.as_mem_location()) };
        #[cfg(not(cudart_advise_location))]
        // SAFETY: as above, CUDA 12 signature.
        let code = unsafe { sys::cudaMemAdvise(p.cast(), bytes, raw, loc.as_device_id()) };
        check(code, || {
            format!("cudaMemAdvise({p:p}, {}, {advice:?})", fmt_bytes(bytes))
        })
    }

    /// Attaches the buffer to `stream` with `flags` (`cudaStreamAttachMemAsync`); with
    /// [`Attach::Single`] only work on that stream may touch it.
    pub fn attach(&mut self, stream: &Stream, flags: Attach) -> Result<()> {
        let p = self.ptr.as_ptr();
        // Attaching is itself stream work, allowed whatever the current attachment.
        let _use = self
            .fence
            .begin(stream, (0, self.byte_len()), Access::Write)?;
        {
            // SAFETY: `p` is the start of our live managed allocation; length 0 means all of it.
            let code = unsafe {
                sys::cudaStreamAttachMemAsync(stream.as_raw(), p.cast(), 0, flags.bits())
            };
            check(code, || {
                format!("cudaStreamAttachMemAsync({p:p}, {flags:?})")
            })?;
        }
        self.alloc.attached = match flags {
            Attach::Global => Attached::Global,
            Attach::Host => Attached::Host,
            Attach::Single => Attached::Single(stream.inner().clone()),
        };
        Ok(())
    }

    /// Queues a byte fill on `stream` (`cudaMemsetAsync`).
    pub fn memset_async(&mut self, byte: u8, stream: &Stream) -> Result<()> {
        let (p, bytes) = (self.ptr.as_ptr(), self.byte_len());
        self.queued(stream, Access::Write, "memset_async", || {
            // SAFETY: `p`/`bytes` cover our allocation, which waits for `stream` before host
            // access or free (recorded by `queued`).
            let code =
                unsafe { sys::cudaMemsetAsync(p.cast(), byte.into(), bytes, stream.as_raw()) };
            check(code, || {
                format!("cudaMemsetAsync({p:p}, {byte}, {})", fmt_bytes(bytes))
            })
        })
    }

    fn range_attribute(&self, attr: sys::cudaMemRangeAttribute, name: &str) -> Result<i32> {
        let mut v: c_int = 0;
        let (p, bytes) = (self.ptr.as_ptr(), self.byte_len());
        // SAFETY: `v` is 4 writable bytes, the size these int-valued attributes need; the range
        // is our live managed allocation.
        let code = unsafe {
            sys::cudaMemRangeGetAttribute(
                (&mut v as *mut c_int).cast(),
                std::mem::size_of::<c_int>(),
                attr,
                p.cast(),
                bytes,
            )
        };
        check(code, || format!("cudaMemRangeGetAttribute({p:p}, {name})"))?;
        Ok(v)
    }

    /// Where the last prefetch sent the whole range (`cudaMemRangeAttributeLastPrefetchLocation`);
    /// `None` if it was never prefetched, or its parts went to different places.
    pub fn last_prefetch_location(&self) -> Result<Option<Location>> {
        let id = self.range_attribute(
            sys::cudaMemRangeAttribute::cudaMemRangeAttributeLastPrefetchLocation,
            "LastPrefetchLocation",
        )?;
        Ok(Location::from_device_id(id))
    }

    /// The preferred location set by advice, if any (`cudaMemRangeAttributePreferredLocation`).
    pub fn preferred_location(&self) -> Result<Option<Location>> {
        let id = self.range_attribute(
            sys::cudaMemRangeAttribute::cudaMemRangeAttributePreferredLocation,
            "PreferredLocation",
        )?;
        Ok(Location::from_device_id(id))
    }

    /// Whether the read-mostly advice is set on the whole range.
    pub fn is_read_mostly(&self) -> Result<bool> {
        Ok(self.range_attribute(
            sys::cudaMemRangeAttribute::cudaMemRangeAttributeReadMostly,
            "ReadMostly",
        )? != 0)
    }

    /// The device that was current at allocation.
    pub fn device(&self) -> Device {
        self.alloc.device
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_round_trip_through_device_ids() {
        assert_eq!(Location::Host.as_device_id(), CPU_DEVICE_ID);
        assert_eq!(
            Location::Device(Device::from_ordinal_unchecked(3)).as_device_id(),
            3
        );
        assert_eq!(Location::from_device_id(-1), Some(Location::Host));
        assert_eq!(
            Location::from_device_id(0),
            Some(Location::Device(Device::from_ordinal_unchecked(0)))
        );
        assert_eq!(Location::from_device_id(-2), None);
    }
}
