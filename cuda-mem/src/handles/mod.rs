//! Handles: devices (selection, capabilities, versions), streams, events, the flag sets,
//! and what the runtime knows of an address. The lowest layer: it names nothing above it.

pub(crate) mod devices;
pub(crate) mod driver;
pub(crate) mod event;
pub(crate) mod flags;
pub(crate) mod pointer;
pub(crate) mod stream;
