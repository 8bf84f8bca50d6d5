//! Allocators: stream-ordered pools (`pool`), the caching pinned pool (`pinned_pool`, blocks,
//! not buffers) and how pinned memory is made (`pinning`). They know nothing of the buffer
//! types above them.

pub(crate) mod pinned_pool;
pub(crate) mod pinning;
pub(crate) mod pool;
