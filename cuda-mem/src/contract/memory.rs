//! The memory contract every kind of memory keeps, as traits: where it lives ([`Loc`]), its
//! raw parts (`sealed::Raw`, `sealed::RawMut`), and the promises asynchronous work and host
//! access rest on (`sealed::Async`, `sealed::Host`), sealed because an implementation carries
//! them; the public [`Memory`], [`MemoryMut`] and [`AsyncMemory`] that generic code bounds on.
//! The owned buffers' shared code is `buffer.rs`, alignment and sizes `layout.rs`, host access
//! `host.rs`.

use bytemuck::Pod;
use cuda_mem_sys as sys;

use crate::fence::Fence;

/// Where a kind of memory lives, which picks the `cudaMemcpyKind` of a copy and whether
/// `cudaMemcpy` may return before it is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// Ordinary host memory (`Vec`, slices): the driver stages copies through its own buffer.
    Pageable,
    /// Page-locked host memory: pinned, mapped, registered.
    Pinned,
    /// Device memory.
    Device,
    /// Managed memory, which migrates between host and device.
    Managed,
}

impl Loc {
    pub(crate) fn is_host(self) -> bool {
        matches!(self, Loc::Pageable | Loc::Pinned)
    }

    /// The copy kind for a copy from `src` to `dst`.
    pub(crate) fn copy_kind(src: Loc, dst: Loc) -> sys::cudaMemcpyKind {
        use sys::cudaMemcpyKind as K;
        match (src, dst) {
            (Loc::Managed, _) | (_, Loc::Managed) => K::cudaMemcpyDefault,
            (s, d) if s.is_host() && d.is_host() => K::cudaMemcpyHostToHost,
            (s, Loc::Device) if s.is_host() => K::cudaMemcpyHostToDevice,
            (Loc::Device, d) if d.is_host() => K::cudaMemcpyDeviceToHost,
            _ => K::cudaMemcpyDeviceToDevice,
        }
    }

    /// The kind's name as the C API spells it, for messages.
    pub(crate) fn kind_name(kind: sys::cudaMemcpyKind) -> &'static str {
        use sys::cudaMemcpyKind as K;
        match kind {
            K::cudaMemcpyHostToHost => "HostToHost",
            K::cudaMemcpyHostToDevice => "HostToDevice",
            K::cudaMemcpyDeviceToHost => "DeviceToHost",
            K::cudaMemcpyDeviceToDevice => "DeviceToDevice",
            _ => "Default",
        }
    }

    /// Whether `cudaMemcpy` from `src` to `dst` may return before the copy is done (the
    /// runtime's "API synchronization behavior"), and whether the source may still be read
    /// then (a pageable source is staged before the call returns).
    pub(crate) fn sync_copy_may_run_on(src: Loc, dst: Loc) -> Option<bool> {
        match (src, dst) {
            (Loc::Managed, _) | (_, Loc::Managed) => Some(true),
            (Loc::Device, Loc::Device) => Some(true),
            // Pageable sources are staged before the call returns; pinned ones too when the
            // memory is not pinned for this device's context (registered without PORTABLE,
            // used from another device), so the destination may still be written.
            (Loc::Pageable | Loc::Pinned, Loc::Device) => Some(false),
            _ => None,
        }
    }
}

pub(crate) mod sealed {
    use super::Loc;
    use crate::error::Result;
    use crate::fence::Fence;
    use crate::handles::stream::Stream;

    /// The raw view of a memory kind that copies need. Sealed: implemented in this crate only.
    pub trait Raw<T> {
        /// Address of the first element, as the copy engine sees it.
        fn raw_ptr(&self) -> *const T;
        /// Length in elements.
        fn raw_len(&self) -> usize;
        /// Where the memory lives.
        fn loc(&self) -> Loc;
        /// The pending-work fence, for kinds that track it.
        fn fence(&self) -> Option<&Fence>;
        /// Where this memory starts in its fence's byte ranges: 0 for a buffer, the view's
        /// byte offset for a view.
        fn fence_base(&self) -> usize {
            0
        }
        /// The device that device memory lives on (`None` for other kinds).
        fn device_ordinal(&self) -> Option<i32> {
            None
        }
        /// Refuses work on `stream` that the memory's state forbids (managed memory attached
        /// to another stream on a device without concurrent managed access).
        fn check_stream(&self, _stream: &Stream, _op: &'static str) -> Result<()> {
            Ok(())
        }
    }

    /// Writable memory.
    pub trait RawMut<T>: Raw<T> {
        /// Writable address of the first element.
        fn raw_mut_ptr(&mut self) -> *mut T;
        /// Refuses device writes the memory does not allow (`READ_ONLY` registrations).
        fn check_device_writable(&self, _op: &'static str) -> Result<()> {
            Ok(())
        }
    }

    /// Memory whose host address ([`Raw::raw_ptr`]) the host may use once the fence allows:
    /// pinned, mapped, managed and registered memory, and views of them. Implemented in this
    /// crate only: an impl promises that `raw_ptr()` points to `raw_len()` initialised
    /// elements that the host can access, alive while `self` is, and that host access needs
    /// nothing but the fence's wait and [`check_host`](Host::check_host).
    pub trait Host<T>: Async<T> {
        /// Refuses host access the memory's state forbids (managed memory on a device without
        /// concurrent managed access).
        fn check_host(&self) -> Result<()> {
            Ok(())
        }
    }

    /// Memory whose owner waits for recorded work before host access or free, and which no
    /// safe code can free while that work runs. Implemented in this crate only: an impl
    /// carries that promise.
    pub trait Async<T>: Raw<T> {
        /// The address kernels use, for [`DevicePtr`](crate::DevicePtr).
        fn device_addr(&self) -> Result<*const T>;
        /// The fence (every such kind has one).
        fn async_fence(&self) -> &Fence;
    }
}

/// Memory a copy can read: any buffer of this crate, or a host slice (`[T]`, `Vec<T>`).
pub trait Memory<T>: sealed::Raw<T> {}
impl<T, M: sealed::Raw<T> + ?Sized> Memory<T> for M {}

/// Memory a copy can write.
pub trait MemoryMut<T>: Memory<T> + sealed::RawMut<T> {}
impl<T, M: sealed::RawMut<T> + ?Sized> MemoryMut<T> for M {}

/// Memory that asynchronous work may use: it tracks pending work and waits for it before host
/// access or free, and cannot be freed by safe code while that work runs. Ordinary slices and
/// `Vec`s are not: use a pinned buffer or a [`RegisteredVec`](crate::RegisteredVec).
///
/// The trait is sealed, because an implementation carries that promise:
///
/// ```compile_fail,E0277
/// #[derive(Clone, Copy)]
/// #[repr(transparent)]
/// struct W(u32);
/// // SAFETY: a `u32` wrapper: any bit pattern is valid, all zero too.
/// unsafe impl bytemuck::Zeroable for W {}
/// // SAFETY: as above.
/// unsafe impl bytemuck::Pod for W {}
/// impl cuda_mem::AsyncMemory<W> for Vec<W> {} // error: `Vec<W>: Async<W>` is not satisfied
/// ```
pub trait AsyncMemory<T>: Memory<T> + sealed::Async<T> {}
impl<T, M: sealed::Async<T> + ?Sized> AsyncMemory<T> for M {}

/// Ordinary (pageable) host memory: slices and `Vec`s, which have no fence and so take part in
/// synchronous copies only.
macro_rules! pageable_memory {
    ($($ty:ty),+) => {$(
        impl<T: Pod> sealed::Raw<T> for $ty {
            fn raw_ptr(&self) -> *const T {
                self.as_ptr()
            }
            fn raw_len(&self) -> usize {
                self.len()
            }
            fn loc(&self) -> Loc {
                Loc::Pageable
            }
            fn fence(&self) -> Option<&Fence> {
                None
            }
        }

        impl<T: Pod> sealed::RawMut<T> for $ty {
            fn raw_mut_ptr(&mut self) -> *mut T {
                self.as_mut_ptr()
            }
        }
    )+};
}
pageable_memory!([T], Vec<T>);
