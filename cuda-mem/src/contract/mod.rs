//! The memory contract: where memory lives and the sealed traits every kind keeps
//! (`memory`), the one owned buffer type `Buffer` with its allocation trait (`buffer`), sizes and alignment (`layout`, `size`),
//! and host access (`host`). Above the handles and the fence; below the allocators and kinds.

pub(crate) mod buffer;
pub(crate) mod host;
pub(crate) mod layout;
pub(crate) mod memory;
pub(crate) mod size;
