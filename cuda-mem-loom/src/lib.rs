//! The fence bookkeeping of `cuda-mem` (`cuda-mem/src/fence/tracker.rs`) and the handshake of
//! work being queued with capture begins (`cuda-mem/src/fence/handshake.rs`), included here by
//! path, so the models check the very code the crate runs, with loom's synchronisation
//! primitives, for the model tests in `tests/fence.rs` and `tests/handshake.rs`.

#[path = "../../cuda-mem/src/fence/tracker.rs"]
pub mod tracker;

#[path = "../../cuda-mem/src/fence/handshake.rs"]
pub mod handshake;

/// What `tracker` and `handshake` take from their parent module: loom's primitives here, std's
/// in the crate.
mod sync {
    pub use loom::sync::{Arc, Mutex, MutexGuard};

    /// loom's atomics, and a compiler fence that orders nothing (as in the memory model: only
    /// `Barrier::Fence` is modelled; loom cannot model `membarrier`).
    pub mod atomic {
        pub use loom::sync::atomic::*;
        pub use std::sync::atomic::Ordering;

        /// No ordering between threads.
        pub fn compiler_fence(_: Ordering) {}
    }
}
