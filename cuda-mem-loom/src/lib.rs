//! The fence bookkeeping of `cuda-mem` (`cuda-mem/src/fence/tracker.rs`, included here by path,
//! so the model checks the very code the crate runs), with loom's synchronisation primitives,
//! for the model test in `tests/fence.rs`.

#[path = "../../cuda-mem/src/fence/tracker.rs"]
pub mod tracker;

/// What `tracker` takes from its parent module: loom's primitives here, std's in the crate.
mod sync {
    pub use loom::sync::{atomic, Arc, Mutex, MutexGuard};
}
