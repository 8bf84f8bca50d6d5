//! The kinds of memory: device, pinned, zero-copy mapped, managed and registered host
//! memory, each an allocation strategy plus what makes sense for it.

pub(crate) mod device;
pub(crate) mod managed;
pub(crate) mod mapped;
pub(crate) mod pinned;
pub(crate) mod registered;
