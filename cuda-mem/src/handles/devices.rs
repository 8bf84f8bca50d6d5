//! Devices: count, selection, memory capabilities, free memory, versions.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU8, Ordering};

use cuda_mem_sys as sys;

use crate::error::{check, check_call, Misuse, Result};
use crate::handles::flags::flag_set;

flag_set! {
    /// Flags of `cudaSetDeviceFlags`, OR-able with `|` (at most one `SCHEDULE_*`).
    DeviceFlags {
        /// `cudaDeviceScheduleAuto`: the runtime picks how the host waits.
        DEFAULT = sys::cudaDeviceScheduleAuto;
        /// `cudaDeviceScheduleSpin`: spin while waiting (lowest latency, one busy core).
        SCHEDULE_SPIN = sys::cudaDeviceScheduleSpin;
        /// `cudaDeviceScheduleYield`: yield the thread while waiting.
        SCHEDULE_YIELD = sys::cudaDeviceScheduleYield;
        /// `cudaDeviceScheduleBlockingSync`: block on a synchronization primitive.
        SCHEDULE_BLOCKING_SYNC = sys::cudaDeviceScheduleBlockingSync;
        /// `cudaDeviceMapHost`: allow mapped pinned memory (always on under UVA).
        MAP_HOST = sys::cudaDeviceMapHost;
        /// `cudaDeviceLmemResizeToMax`: keep local memory at its high-water mark.
        LMEM_RESIZE_TO_MAX = sys::cudaDeviceLmemResizeToMax;
    }
}

/// The CUDA runtime version, e.g. `13000` for 13.0 (`cudaRuntimeGetVersion`).
pub fn runtime_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer.
    let code = unsafe { sys::cudaRuntimeGetVersion(&mut v) };
    check_call(code, "cudaRuntimeGetVersion")?;
    Ok(v)
}

/// The newest CUDA version the installed driver supports, e.g. `13000`; `0` when no driver is
/// installed (`cudaDriverGetVersion`).
pub fn driver_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer.
    let code = unsafe { sys::cudaDriverGetVersion(&mut v) };
    check_call(code, "cudaDriverGetVersion")?;
    Ok(v)
}

/// `CUDART_VERSION` of the headers this crate was built against, e.g. `13000`.
pub const BUILT_CUDART_VERSION: u32 = {
    match u32::from_str_radix(env!("CUDA_MEM_CUDART_VERSION"), 10) {
        Ok(v) => v,
        Err(_) => 0,
    }
};

/// Formats a CUDA version number as `major.minor` (13000 -> `13.0`).
pub fn format_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// A CUDA device, by ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    ordinal: i32,
}

/// The memory-related capabilities of a device, read with `cudaDeviceGetAttribute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryCapabilities {
    /// `cudaDevAttrCanMapHostMemory`: pinned host memory can be mapped (zero-copy).
    pub can_map_host_memory: bool,
    /// `cudaDevAttrUnifiedAddressing`: host and device share one virtual address space (UVA).
    pub unified_addressing: bool,
    /// `cudaDevAttrManagedMemory`: `cudaMallocManaged` is supported.
    pub managed_memory: bool,
    /// `cudaDevAttrConcurrentManagedAccess`: the CPU may touch managed memory while kernels run.
    pub concurrent_managed_access: bool,
    /// `cudaDevAttrPageableMemoryAccess`: kernels may read ordinary `malloc` memory.
    pub pageable_memory_access: bool,
    /// `cudaDevAttrHostNativeAtomicSupported`: atomics between host and device are native.
    pub host_native_atomics: bool,
}

impl Device {
    /// The number of devices (`cudaGetDeviceCount`). Without a driver this is an error
    /// (`cudaErrorInsufficientDriver` or `cudaErrorNoDevice`), never a panic.
    pub fn count() -> Result<i32> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        let code = unsafe { sys::cudaGetDeviceCount(&mut n) };
        check_call(code, "cudaGetDeviceCount")?;
        Ok(n)
    }

    /// Device `ordinal`, checked against [`Device::count`].
    pub fn get(ordinal: i32) -> Result<Device> {
        let count = Self::count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(Misuse::DeviceOutOfRange { ordinal, count }.into());
        }
        Ok(Device { ordinal })
    }

    /// All devices.
    pub fn all() -> Result<Vec<Device>> {
        Ok((0..Self::count()?)
            .map(|ordinal| Device { ordinal })
            .collect())
    }

    /// The calling thread's current device (`cudaGetDevice`).
    pub fn current() -> Result<Device> {
        let mut ordinal = 0;
        // SAFETY: valid out-pointer.
        check_call(unsafe { sys::cudaGetDevice(&mut ordinal) }, "cudaGetDevice")?;
        Ok(Device { ordinal })
    }

    /// A device handle for an ordinal the crate already knows is valid (a stream's, an
    /// event's, a buffer's).
    pub(crate) fn from_ordinal_unchecked(ordinal: i32) -> Device {
        Device { ordinal }
    }

    /// The ordinal.
    pub fn ordinal(self) -> i32 {
        self.ordinal
    }

    /// Makes this the calling thread's current device (`cudaSetDevice`).
    pub fn set_current(self) -> Result<()> {
        // SAFETY: plain value argument; the runtime validates it.
        check(unsafe { sys::cudaSetDevice(self.ordinal) }, || {
            format!("cudaSetDevice({})", self.ordinal)
        })
    }

    /// Sets the calling thread's flags for this device (`cudaSetDeviceFlags`, with this device
    /// made current for the call): how the host waits for it, and what its context allows.
    /// Two `SCHEDULE_*` flags at once are [`Misuse::InvalidFlags`] (unknown bits cannot be
    /// constructed).
    pub fn set_flags(self, flags: DeviceFlags) -> Result<()> {
        let schedule = flags.bits() & sys::cudaDeviceScheduleMask;
        if schedule.count_ones() > 1 {
            return Err(Misuse::InvalidFlags {
                op: "cudaSetDeviceFlags",
                flags: flags.bits(),
            }
            .into());
        }
        let _g = self.guard()?;
        // SAFETY: plain value argument of known bits.
        let code = unsafe { sys::cudaSetDeviceFlags(flags.bits()) };
        check(code, || {
            format!("cudaSetDeviceFlags({flags}) on device {}", self.ordinal)
        })
    }

    /// The flags of this device's context as the runtime reports them (`cudaGetDeviceFlags`,
    /// raw bits: the runtime may add bits this crate does not name).
    pub fn flags(self) -> Result<u32> {
        let _g = self.guard()?;
        let mut f = 0u32;
        // SAFETY: valid out-pointer.
        let code = unsafe { sys::cudaGetDeviceFlags(&mut f) };
        check_call(code, "cudaGetDeviceFlags")?;
        Ok(f)
    }

    /// Makes this device current until the guard drops, then restores the previous one.
    pub fn guard(self) -> Result<DeviceGuard> {
        // In a process with one device, that device is always the current one: no call.
        let previous = if sole_device() {
            Device { ordinal: 0 }
        } else {
            Device::current()?
        };
        if previous == self {
            return Ok(DeviceGuard {
                previous: None,
                _not_send: PhantomData,
            });
        }
        self.set_current()?;
        Ok(DeviceGuard {
            previous: Some(previous),
            _not_send: PhantomData,
        })
    }

    /// Reads one `cudaDeviceGetAttribute` value.
    pub fn attribute(self, attr: sys::cudaDeviceAttr) -> Result<i32> {
        let mut v = 0;
        // SAFETY: valid out-pointer; the runtime validates `attr` and the ordinal.
        let code = unsafe { sys::cudaDeviceGetAttribute(&mut v, attr, self.ordinal) };
        check(code, || {
            format!(
                "cudaDeviceGetAttribute({}, device {})",
                attr.0, self.ordinal
            )
        })?;
        Ok(v)
    }

    fn flag(self, attr: sys::cudaDeviceAttr) -> Result<bool> {
        Ok(self.attribute(attr)? != 0)
    }

    /// The memory-related capabilities.
    pub fn memory_capabilities(self) -> Result<MemoryCapabilities> {
        use sys::cudaDeviceAttr as A;
        Ok(MemoryCapabilities {
            can_map_host_memory: self.flag(A::cudaDevAttrCanMapHostMemory)?,
            unified_addressing: self.flag(A::cudaDevAttrUnifiedAddressing)?,
            managed_memory: self.flag(A::cudaDevAttrManagedMemory)?,
            concurrent_managed_access: self.flag(A::cudaDevAttrConcurrentManagedAccess)?,
            pageable_memory_access: self.flag(A::cudaDevAttrPageableMemoryAccess)?,
            host_native_atomics: self.flag(A::cudaDevAttrHostNativeAtomicSupported)?,
        })
    }

    /// Fails with [`Misuse::Unsupported`] unless attribute `attr` is non-zero.
    pub(crate) fn require(self, attr: sys::cudaDeviceAttr, feature: &'static str) -> Result<()> {
        if self.flag(attr)? {
            Ok(())
        } else {
            Err(Misuse::Unsupported {
                device: self.ordinal,
                feature,
            }
            .into())
        }
    }

    /// The device's name, e.g. `NVIDIA H200`.
    pub fn name(self) -> Result<String> {
        let prop = self.properties()?;
        // SAFETY: `name` is a NUL-terminated C string written by the runtime (the buffer is
        // zero-initialised, so it is terminated even if the runtime wrote nothing).
        let name = unsafe { CStr::from_ptr(prop.name.as_ptr()) };
        Ok(name.to_string_lossy().into_owned())
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(self) -> Result<(i32, i32)> {
        Ok((
            self.attribute(sys::cudaDeviceAttr::cudaDevAttrComputeCapabilityMajor)?,
            self.attribute(sys::cudaDeviceAttr::cudaDevAttrComputeCapabilityMinor)?,
        ))
    }

    /// Number of multiprocessors.
    pub fn multiprocessor_count(self) -> Result<i32> {
        self.attribute(sys::cudaDeviceAttr::cudaDevAttrMultiProcessorCount)
    }

    /// The PCI bus id, e.g. `0000:18:00.0` (`cudaDeviceGetPCIBusId`).
    pub fn pci_bus_id(self) -> Result<String> {
        let mut buf = [0 as std::os::raw::c_char; 64];
        // SAFETY: `buf` is writable for the length passed; the runtime NUL-terminates within it.
        let code = unsafe {
            sys::cudaDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as c_int, self.ordinal)
        };
        check(code, || {
            format!("cudaDeviceGetPCIBusId(device {})", self.ordinal)
        })?;
        // Make termination certain whatever the runtime did.
        buf[buf.len() - 1] = 0;
        // SAFETY: `buf` is NUL-terminated (last byte forced to 0 above).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// `(free, total)` bytes of device memory (`cudaMemGetInfo`, on this device).
    pub fn mem_info(self) -> Result<(usize, usize)> {
        let _g = self.guard()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        let code = unsafe { sys::cudaMemGetInfo(&mut free, &mut total) };
        check_call(code, "cudaMemGetInfo")?;
        Ok((free, total))
    }

    /// Waits for all work on this device (`cudaDeviceSynchronize`).
    pub fn synchronize(self) -> Result<()> {
        let _g = self.guard()?;
        // SAFETY: no arguments.
        let code = unsafe { sys::cudaDeviceSynchronize() };
        check_call(code, "cudaDeviceSynchronize")
    }

    fn properties(self) -> Result<sys::cudaDeviceProp> {
        // SAFETY: cudaDeviceProp is plain C data for which all-zero bytes are valid.
        let mut prop: sys::cudaDeviceProp = unsafe { std::mem::zeroed() };
        #[cfg(not(cudart_device_properties_v2))]
        // SAFETY: `prop` is a valid, writable cudaDeviceProp of this header's layout.
        let code = unsafe { sys::cudaGetDeviceProperties(&mut prop, self.ordinal) };
        #[cfg(cudart_device_properties_v2)]
        // SAFETY: as above (CUDA 12 names the current layout's function `_v2`).
        let code = unsafe { sys::cudaGetDeviceProperties_v2(&mut prop, self.ordinal) };
        check(code, || {
            format!("cudaGetDeviceProperties(device {})", self.ordinal)
        })?;
        Ok(prop)
    }
}

/// Restores the previous current device on drop (see [`Device::guard`]).
///
/// The current device is per thread, so the guard cannot move to another thread (it would
/// restore the device there), and it must be bound to a name to have any effect:
///
/// ```compile_fail,E0277
/// fn assert_send<T: Send>(_: T) {}
/// let guard = cuda_mem::Device::get(0).unwrap().guard().unwrap();
/// assert_send(guard); // error: `*const ()` cannot be sent between threads safely
/// ```
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// cuda_mem::Device::get(0).unwrap().guard().unwrap(); // error: unused `DeviceGuard`
/// ```
#[derive(Debug)]
#[must_use = "the previous device is restored when the guard drops: bind it, `let _g = ...`"]
pub struct DeviceGuard {
    /// The device to restore; `None` when it was already current.
    previous: Option<Device>,
    /// Neither `Send` nor `Sync`: the current device belongs to the thread.
    _not_send: PhantomData<*const ()>,
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.previous {
            // SAFETY: plain value argument. An error (e.g. at process exit) is not reported,
            // since drop never panics, but it is cleared from the thread's last-error state so
            // that it does not surface in an unrelated later call.
            unsafe {
                if sys::cudaSetDevice(prev.ordinal) != sys::cudaError::cudaSuccess {
                    sys::cudaGetLastError();
                }
            }
        }
    }
}

/// [`Misuse::DeviceMismatch`] naming `op` unless `found` is the device `expected`.
pub(crate) fn require_same(op: &'static str, expected: i32, found: i32) -> Result<()> {
    if expected == found {
        return Ok(());
    }
    Err(Misuse::DeviceMismatch {
        op,
        expected,
        found,
    }
    .into())
}

/// The device current on this thread, as an ordinal (0 if the runtime cannot say). In a
/// process with one device ([`sole_device`]) that is 0, known without a call: the hot path's
/// checks of the legacy stream's device cost no `cudaGetDevice` there.
#[inline]
pub(crate) fn current_ordinal() -> i32 {
    if sole_device() {
        return 0;
    }
    current_ordinal_call()
}

/// [`current_ordinal`] by asking the runtime (`cudaGetDevice`).
#[inline(never)]
fn current_ordinal_call() -> i32 {
    Device::current().map(Device::ordinal).unwrap_or(0)
}

/// What [`sole_device`] learnt: not yet asked (or the runtime could not say), one device,
/// several.
static DEVICES: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const ONE: u8 = 1;
const SEVERAL: u8 = 2;

/// Whether the process has exactly one device, so that device 0 is the current device of
/// every thread whatever anyone set (`cudaSetDevice` accepts no other ordinal, and a driver
/// context made current by another library is a context of that device too). The count is
/// asked once (`cudaGetDeviceCount`) and kept: the runtime enumerates the devices once per
/// process, at its initialisation (which that first call makes), under the
/// `CUDA_VISIBLE_DEVICES` of that moment, and the count never changes afterwards. A count the
/// runtime cannot give (no driver) is not kept, and answers false.
#[inline]
pub(crate) fn sole_device() -> bool {
    match DEVICES.load(Ordering::Relaxed) {
        ONE => true,
        SEVERAL => false,
        _ => count_devices(),
    }
}

#[cold]
#[inline(never)]
fn count_devices() -> bool {
    match Device::count() {
        Ok(n) => {
            DEVICES.store(if n == 1 { ONE } else { SEVERAL }, Ordering::Relaxed);
            n == 1
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One device is known as such (then device 0 is current everywhere, without a call);
    /// a count the runtime cannot give (no driver) is never kept, so that no process is
    /// taken for a one-device one by mistake, and the current device is then asked for.
    #[test]
    #[cfg_attr(miri, ignore = "calls the CUDA runtime, which Miri cannot run")]
    fn only_a_count_of_one_lets_the_current_device_go_unasked() {
        match Device::count() {
            Ok(n) => {
                assert_eq!(sole_device(), n == 1);
                assert_eq!(
                    DEVICES.load(Ordering::Relaxed),
                    if n == 1 { ONE } else { SEVERAL }
                );
                assert_eq!(current_ordinal(), current_ordinal_call());
            }
            Err(_) => {
                assert!(!sole_device());
                assert_eq!(
                    DEVICES.load(Ordering::Relaxed),
                    UNKNOWN,
                    "a failed count was kept"
                );
                assert_eq!(current_ordinal(), 0);
            }
        }
    }
}
