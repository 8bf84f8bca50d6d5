//! Operations on every kind: the driver's copies and memsets (`copy`), device-pointer guards
//! for kernels (`access`), views (`view`), scopes over borrowed slices (`scope`) and CUDA
//! graphs by stream capture (`graph`).

pub(crate) mod access;
pub(crate) mod copy;
pub(crate) mod graph;
pub(crate) mod scope;
pub(crate) mod view;
