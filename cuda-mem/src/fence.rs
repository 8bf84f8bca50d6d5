//! The pending-work fence every buffer carries.
//!
//! Asynchronous operations (copies, memsets, prefetches, kernels the caller marks with
//! `record_use`) record an event here after they are queued. Host access to the memory, a
//! synchronous copy, and the free on drop first wait on that event, so safe code can never read,
//! write or free host memory that queued GPU work may still be using (the failure of cudarc
//! issue #340).
//!
//! One event is reused per buffer. When work on a second stream is recorded while work on a
//! first is pending, the second stream is first made to wait on the old event
//! (`cudaStreamWaitEvent`), so that the one event, re-recorded, still covers both.

use std::sync::Mutex;

use crate::error::Result;
use crate::event::Event;
use crate::stream::Stream;

/// Pending GPU work on one buffer (see the module docs). Not nameable outside the crate.
#[derive(Debug, Default)]
pub struct Fence {
    inner: Mutex<Option<Pending>>,
}

#[derive(Debug)]
struct Pending {
    event: Event,
    /// Whether the event was recorded and not yet seen complete.
    armed: bool,
}

impl Fence {
    /// Before queueing work on `stream`: orders it after work already recorded on other
    /// streams (a device-side wait, the host does not block).
    pub fn before(&self, stream: &Stream) -> Result<()> {
        if let Some(p) = self.lock().as_ref() {
            if p.armed {
                p.event.wait_on(stream)?;
            }
        }
        Ok(())
    }

    /// After queueing work on `stream`: records that the work queued so far may use the
    /// memory. Call [`Fence::before`] first, so the one event covers earlier work too.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let mut guard = self.lock();
        match guard.as_mut() {
            Some(p) => {
                p.event.record(stream)?;
                p.armed = true;
            }
            None => {
                let event = Event::new()?;
                event.record(stream)?;
                *guard = Some(Pending { event, armed: true });
            }
        }
        Ok(())
    }

    /// Waits until all recorded work has completed.
    pub fn wait(&self) -> Result<()> {
        let mut guard = self.lock();
        if let Some(p) = guard.as_mut() {
            if p.armed {
                p.event.synchronize()?;
                p.armed = false;
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Pending>> {
        // A panic while holding the lock cannot leave the Option inconsistent: recover it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}
