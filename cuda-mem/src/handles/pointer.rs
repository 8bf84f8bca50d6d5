//! Classifying any pointer: unregistered host, pinned host, device or managed
//! (`cudaPointerGetAttributes`).

use std::os::raw::c_void;

use cuda_mem_sys as sys;

use crate::error::{check, Misuse, Result};

/// What kind of memory an address belongs to (`cudaMemoryType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PointerKind {
    /// Ordinary host memory CUDA does not know (`cudaMemoryTypeUnregistered`).
    UnregisteredHost,
    /// Pinned host memory: `cudaHostAlloc`, `cudaMallocHost` or `cudaHostRegister`
    /// (`cudaMemoryTypeHost`).
    PinnedHost,
    /// Device memory (`cudaMemoryTypeDevice`).
    Device,
    /// Managed memory (`cudaMemoryTypeManaged`).
    Managed,
    /// A value this crate does not know, from a newer runtime.
    Other(u32),
}

impl PointerKind {
    fn from_raw(t: sys::cudaMemoryType) -> Self {
        use sys::cudaMemoryType as M;
        match t {
            M::cudaMemoryTypeUnregistered => Self::UnregisteredHost,
            M::cudaMemoryTypeHost => Self::PinnedHost,
            M::cudaMemoryTypeDevice => Self::Device,
            M::cudaMemoryTypeManaged => Self::Managed,
            other => Self::Other(other.0),
        }
    }
}

/// What the runtime knows about an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    /// The kind of memory.
    pub kind: PointerKind,
    /// The device the memory belongs to (for pinned memory, the device current at allocation;
    /// meaningless for unregistered memory).
    pub device: i32,
    /// The address the host uses (null where the host cannot access it).
    pub host_ptr: usize,
    /// The address the device uses (null where the device cannot access it).
    pub device_ptr: usize,
}

/// Whether `p` is ordinary host memory the driver does not know (not pinned, registered,
/// mapped or managed); false where the runtime cannot say. A slice lies in one allocation, so
/// its first element tells for all of it.
pub(crate) fn is_unregistered_host<T>(p: *const T) -> bool {
    pointer_info(p).is_ok_and(|i| i.kind == PointerKind::UnregisteredHost)
}

/// Classifies `ptr` with `cudaPointerGetAttributes`. Any address is accepted: memory CUDA does
/// not know is [`PointerKind::UnregisteredHost`].
pub fn pointer_info<T>(ptr: *const T) -> Result<PointerInfo> {
    let mut attr = sys::cudaPointerAttributes::default();
    // SAFETY: `attr` is a valid out-pointer; the runtime only inspects the address value.
    let code = unsafe { sys::cudaPointerGetAttributes(&mut attr, ptr as *const c_void) };
    check(code, || format!("cudaPointerGetAttributes({ptr:p})"))?;
    Ok(PointerInfo {
        kind: PointerKind::from_raw(attr.type_),
        device: attr.device,
        host_ptr: attr.hostPointer as usize,
        device_ptr: attr.devicePointer as usize,
    })
}

/// Refuses (with [`Misuse::InvalidArgument`] for `op`) memory whose first or last of `len`
/// elements the runtime does not know as page-locked host memory: the check `from_raw` makes
/// before it adopts pinned, mapped or registered memory.
pub(crate) fn require_pinned<T>(ptr: *const T, len: usize, op: &'static str) -> Result<()> {
    let last = ptr.wrapping_add(len.saturating_sub(1));
    for (what, q) in [("first", ptr), ("last", last)] {
        let info = pointer_info(q)?;
        if info.kind != PointerKind::PinnedHost {
            return Err(Misuse::InvalidArgument {
                op,
                reason: format!(
                    "the {what} element ({q:p}) is not page-locked host memory \
                     (cudaPointerGetAttributes: {:?})",
                    info.kind
                ),
            }
            .into());
        }
    }
    Ok(())
}
