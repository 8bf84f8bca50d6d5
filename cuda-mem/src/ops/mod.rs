//! Operations on every kind: the driver's copies and memsets (`copy`), device-pointer guards
//! for kernels (`access`), views (`view`) and scopes over borrowed slices (`scope`).

pub(crate) mod access;
pub(crate) mod copy;
pub(crate) mod scope;
pub(crate) mod view;
