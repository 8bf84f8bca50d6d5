//! Events: markers in a stream, for waiting and timing, each bound to one device.

use std::ptr;

use cuda_mem_sys as sys;

use crate::error::{check, check_call, clear_not_ready, Result};
use crate::handles::devices::{current_ordinal, Device};
use crate::handles::flags::flag_set;
use crate::handles::stream::{Stream, StreamInner};

/// The size of an interprocess event handle (`cudaIpcEventHandle_t`), in bytes.
pub const IPC_EVENT_HANDLE_LEN: usize = 64;

flag_set! {
    /// Flags of `cudaEventCreateWithFlags`, OR-able with `|`.
    EventFlags {
        /// `cudaEventDefault`: records timing, the host spins while waiting.
        DEFAULT = sys::cudaEventDefault;
        /// `cudaEventBlockingSync`: the host blocks (rather than spins) in `synchronize`.
        BLOCKING_SYNC = sys::cudaEventBlockingSync;
        /// `cudaEventDisableTiming`: no timing, the cheapest event for waiting.
        DISABLE_TIMING = sys::cudaEventDisableTiming;
        /// `cudaEventInterprocess`: shareable with other processes (needs DISABLE_TIMING).
        INTERPROCESS = sys::cudaEventInterprocess;
    }
}

/// A CUDA event on one device, destroyed on drop (unless borrowed from another library with
/// [`Event::from_raw`]).
///
/// CUDA requires an event and the stream it is recorded on to belong to the same device:
/// [`Event::record`] refuses anything else with [`Misuse::DeviceMismatch`](crate::Misuse::DeviceMismatch). Waiting on an
/// event from a stream of another device is allowed.
#[derive(Debug)]
pub struct Event {
    raw: sys::cudaEvent_t,
    device: i32,
    /// Whether drop destroys the handle (false for a borrowed one).
    owned: bool,
}

// SAFETY: a cudaEvent_t is a handle the runtime allows to be used from any thread and
// concurrently (the runtime API is thread-safe); `Event` holds no thread-bound state.
unsafe impl Send for Event {}
// SAFETY: all methods take `&self` and only pass the handle to thread-safe runtime calls.
unsafe impl Sync for Event {}

impl Event {
    /// An event on the current device that records timing (`cudaEventDefault`), for
    /// [`Event::elapsed_ms`].
    pub fn timing() -> Result<Self> {
        Self::create(sys::cudaEventDefault, "cudaEventCreate(DEFAULT)")
    }

    /// An event on the current device without timing (`cudaEventDisableTiming`): the
    /// cheapest kind, for waiting.
    pub fn new() -> Result<Self> {
        Self::create(
            sys::cudaEventDisableTiming,
            "cudaEventCreate(DISABLE_TIMING)",
        )
    }

    /// An event on the current device with `flags` (`cudaEventCreateWithFlags`).
    pub fn with_flags(flags: EventFlags) -> Result<Self> {
        Self::create(flags.bits(), "cudaEventCreateWithFlags")
    }

    /// A waiting event ([`Event::new`]) on `device`.
    pub fn on(device: Device) -> Result<Self> {
        let _g = device.guard()?;
        Self::new()
    }

    fn create(flags: u32, call: &'static str) -> Result<Self> {
        let device = current_ordinal();
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer and flags are documented values.
        let code = unsafe { sys::cudaEventCreateWithFlags(&mut raw, flags) };
        check_call(code, call)?;
        Ok(Event {
            raw,
            device,
            owned: true,
        })
    }

    /// An event on `device` that other processes can open and wait for
    /// (`cudaEventInterprocess | cudaEventDisableTiming`: CUDA requires interprocess events to
    /// record no timing). Its handle: [`ipc_handle`](Self::ipc_handle).
    pub fn interprocess(device: Device) -> Result<Self> {
        let _g = device.guard()?;
        Self::create(
            sys::cudaEventInterprocess | sys::cudaEventDisableTiming,
            "cudaEventCreateWithFlags(INTERPROCESS | DISABLE_TIMING)",
        )
    }

    /// The bytes of the event's interprocess handle (`cudaIpcGetEventHandle`), for another
    /// process to open with [`open_ipc`](Self::open_ipc). An event made without
    /// [`EventFlags::INTERPROCESS`] is refused by the runtime (its error code is kept).
    pub fn ipc_handle(&self) -> Result<[u8; IPC_EVENT_HANDLE_LEN]> {
        let mut h = sys::cudaIpcEventHandle_t {
            reserved: [0; IPC_EVENT_HANDLE_LEN],
        };
        // SAFETY: `h` is a valid out-pointer; the event handle is live.
        let code = unsafe { sys::cudaIpcGetEventHandle(&mut h, self.raw) };
        check(code, || format!("cudaIpcGetEventHandle({:p})", self.raw))?;
        Ok(h.reserved.map(|b| b as u8))
    }

    /// Opens another process's interprocess event from its handle bytes
    /// (`cudaIpcOpenEventHandle`), with `device` current: the local ordinal of the device the
    /// event was created on. The opened event may be waited for ([`wait_on`](Self::wait_on),
    /// [`synchronize`](Self::synchronize), [`is_complete`](Self::is_complete)); it is
    /// destroyed on drop. CUDA: using it after the exporting process destroyed the event is
    /// undefined, so the exporter must keep the event alive while others may wait for it
    /// ([`ipc`](crate::ipc) does).
    pub fn open_ipc(handle: &[u8; IPC_EVENT_HANDLE_LEN], device: Device) -> Result<Self> {
        let _g = device.guard()?;
        let h = sys::cudaIpcEventHandle_t {
            reserved: handle.map(|b| b as std::os::raw::c_char),
        };
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the handle is plain bytes, which the runtime
        // validates (a forged one is an error code, not undefined behaviour, as far as the
        // runtime documents).
        let code = unsafe { sys::cudaIpcOpenEventHandle(&mut raw, h) };
        check_call(code, "cudaIpcOpenEventHandle")?;
        Ok(Event {
            raw,
            device: device.ordinal(),
            owned: true,
        })
    }

    /// Borrows an event that another library owns (PyTorch, cuBLAS, cudarc, C++ code), for use
    /// wherever an `Event` goes: [`record`](Self::record), [`wait_on`](Self::wait_on),
    /// [`synchronize`](Self::synchronize), [`is_complete`](Self::is_complete),
    /// [`elapsed_ms`](Self::elapsed_ms). It is never destroyed here. `device` is the device
    /// it was created on (the one whose streams it may be recorded on).
    ///
    /// ```no_run
    /// # fn main() -> cuda_mem::Result<()> {
    /// use cuda_mem::{sys, Device, Event, Stream};
    /// let mut raw = std::ptr::null_mut();
    /// // SAFETY: a valid out-pointer (this stands for the other library's event).
    /// unsafe { sys::cudaEventCreate(&mut raw) };
    /// // SAFETY: `raw` outlives `ev` (destroyed below, after `ev` is gone).
    /// let ev = unsafe { Event::from_raw(raw, Device::current()?) };
    /// let stream = Stream::new()?;
    /// ev.wait_on(&stream)?; // later work on `stream` waits for the other library's work
    /// drop(ev);             // the handle stays valid: its owner destroys it
    /// // SAFETY: the owner's handle, no longer borrowed.
    /// unsafe { sys::cudaEventDestroy(raw) };
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// `raw` must be a valid event created on `device`, and stay valid (not destroyed by its
    /// owner) until the returned value is dropped.
    pub unsafe fn from_raw(raw: sys::cudaEvent_t, device: Device) -> Self {
        Event {
            raw,
            device: device.ordinal(),
            owned: false,
        }
    }

    /// Whether drop destroys the handle: false for an event borrowed with
    /// [`from_raw`](Self::from_raw).
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// The device the event belongs to.
    pub fn device(&self) -> Device {
        Device::from_ordinal_unchecked(self.device)
    }

    /// Records the event at the current end of `stream`, which must be on the event's device.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.record_inner(stream.inner())
    }

    pub(crate) fn record_inner(&self, stream: &StreamInner) -> Result<()> {
        check_same_device("Event::record", self.device, stream.device())?;
        let _g = stream.enter()?;
        // SAFETY: both handles are live (the borrows keep them); a null stream means the
        // legacy stream of the event's device, made current above.
        let code = unsafe { sys::cudaEventRecord(self.raw, stream.raw()) };
        check(code, || {
            format!("cudaEventRecord({:p}, stream {:p})", self.raw, stream.raw())
        })
    }

    /// Waits on the host until the work before the last record has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live.
        check(unsafe { sys::cudaEventSynchronize(self.raw) }, || {
            format!("cudaEventSynchronize({:p})", self.raw)
        })
    }

    /// Whether the work before the last record has completed, without waiting. A not-ready
    /// answer leaves the runtime's last-error state clean (`cudaSuccess`).
    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: the handle is live.
        let code = unsafe { sys::cudaEventQuery(self.raw) };
        if clear_not_ready(code) {
            return Ok(false);
        }
        check(code, || format!("cudaEventQuery({:p})", self.raw)).map(|()| true)
    }

    /// Makes later work on `stream` wait until this event completes (`cudaStreamWaitEvent`),
    /// without blocking the host. The stream may belong to another device.
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        // Another thread's per-thread default stream cannot be named here.
        stream.inner().check_current("Event::wait_on")?;
        self.wait_on_inner(stream.inner())
    }

    /// [`wait_on`](Self::wait_on) for the fence: another thread's per-thread default stream
    /// is named by its device's legacy stream (`StreamInner::raw`), where the crate's own
    /// work for it goes too (a pooled buffer's free, dropped on another thread), so that this
    /// wait orders that work.
    pub(crate) fn wait_on_inner(&self, stream: &StreamInner) -> Result<()> {
        let _g = stream.enter()?;
        // SAFETY: both handles are live; a null stream is the legacy stream of its device,
        // made current above.
        let code = unsafe { sys::cudaStreamWaitEvent(stream.raw(), self.raw, 0) };
        check(code, || {
            format!(
                "cudaStreamWaitEvent(stream {:p}, {:p})",
                stream.raw(),
                self.raw
            )
        })
    }

    /// Milliseconds between two recorded timing events (`cudaEventElapsedTime`).
    pub fn elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid out-pointer; both handles are live.
        let code = unsafe { sys::cudaEventElapsedTime(&mut ms, start.raw, end.raw) };
        check(code, || "cudaEventElapsedTime".to_string())?;
        Ok(ms)
    }

    /// The raw handle, for calls this crate does not wrap. Stays owned by `self` (or by the
    /// library it was borrowed from).
    pub fn as_raw(&self) -> sys::cudaEvent_t {
        self.raw
    }
}

/// CUDA's rule for recording: "event and stream must be on the same CUDA context".
pub(crate) fn check_same_device(op: &'static str, event: i32, stream: i32) -> Result<()> {
    crate::handles::devices::require_same(op, event, stream)
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we own the handle and destroy it once; errors are ignored (drop never
            // panics). A borrowed handle is left to its owner.
            unsafe { sys::cudaEventDestroy(self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_across_devices_is_refused_before_the_runtime() {
        assert!(check_same_device("Event::record", 1, 1).is_ok());
        let e = check_same_device("Event::record", 0, 1).unwrap_err();
        assert_eq!(
            e.misuse(),
            Some(&crate::Misuse::DeviceMismatch {
                op: "Event::record",
                expected: 0,
                found: 1
            })
        );
        assert_eq!(
            e.to_string(),
            "Event::record: expected device 0, found device 1 (CUDA requires the same device)"
        );
    }
}
