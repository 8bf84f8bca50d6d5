//! A caching pool of pinned host memory: [`PinnedPool`].
//!
//! Pinning is expensive (`cudaHostAlloc` locks every page: milliseconds per hundred MiB) and
//! freeing it too, so code that needs pinned buffers over and over (staging, per-batch
//! uploads) should not call the driver each time. The pool keeps freed blocks in size classes
//! and hands them out again; a cached allocation and its free skip `cudaHostAlloc` and
//! `cudaFreeHost` (measured figures: `docs/results/` in the repository).
//!
//! # Rules
//!
//! - **Size classes**: four per power of two (4 KiB, 5 KiB, 6 KiB, 7 KiB, 8 KiB, 10 KiB, ...),
//!   so a block is at most 25% larger than asked; 4 KiB at least.
//! - **Flags are part of the key**: a block made MAPPED, PORTABLE or write-combined is only
//!   handed out for a request with exactly those flags.
//! - **Stream-aware reuse**: a buffer dropped while GPU work it took part in may still run
//!   does not wait for it. Its fence records events for that work, and the block waits in a
//!   pending list until they have all completed; only then can it be handed out again. (A
//!   block is never handed straight back to the stream that used it: the pool does not know
//!   which stream the next user will queue on.)
//! - **A bound on cached bytes** ([`PinnedPoolConfig::max_cached_bytes`]): freed blocks
//!   beyond it are given back to the driver, largest first. [`trim`](PinnedPool::trim) and
//!   [`empty`](PinnedPool::empty) give back more.
//! - **Out of memory**: the pool empties its cache and retries once; the error then says how
//!   much was cached and in use.
//! - **Contents**: a fresh block is zeroed; a reused one holds what its previous user left.
//!   Both are initialised bytes, valid for any [`Pod`] type, so the allocation is safe.
//! - **Alignment**: element types aligned to more than 256 bytes are refused
//!   ([`Misuse::AlignmentUnsupported`]), as by every allocation of this crate: a block made
//!   by `cudaHostAlloc` is only promised that much. A block not aligned for `T` would go
//!   back to the pool, the request refused with [`Misuse::Misaligned`].
//! - Blocks are made by [`PinStrategy`] ([`PinStrategy::Auto`] by default: fast cold pinning
//!   for large blocks); the statistics count the time spent making and freeing them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::alloc::pinning::{Block, PinStrategy};
use crate::contract::layout::Layout;
use crate::contract::size::fmt_bytes;
use crate::error::{Error, Misuse, Result};
use crate::fence::{Access, Fence};
use crate::handles::event::Event;
use crate::handles::flags::HostAllocFlags;

/// Smallest size class: one page.
const MIN_CLASS: usize = 4096;

/// The size class of a request of `bytes`: the next of four steps per power of two.
fn class_of(bytes: usize) -> Option<usize> {
    if bytes > isize::MAX as usize / 2 {
        return None; // no allocation is that large, and the counters stay in range
    }
    if bytes <= MIN_CLASS {
        return Some(MIN_CLASS);
    }
    let k = usize::BITS - 1 - (bytes - 1).leading_zeros(); // 2^k <= bytes - 1 < 2^(k+1)
    let step = 1usize << (k - 2);
    bytes.checked_next_multiple_of(step)
}

/// A free list's key: size class and `cudaHostAlloc` flag bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    class: usize,
    flags: u32,
}

/// How a [`PinnedPool`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedPoolConfig {
    /// Most bytes kept in free (and pending) blocks; freed blocks beyond it go back to the
    /// driver. Default 1 GiB.
    pub max_cached_bytes: usize,
    /// How new blocks are made. Default [`PinStrategy::Auto`].
    pub strategy: PinStrategy,
}

impl Default for PinnedPoolConfig {
    fn default() -> Self {
        PinnedPoolConfig {
            max_cached_bytes: 1 << 30,
            strategy: PinStrategy::Auto,
        }
    }
}

/// A [`PinnedPool`]'s counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PinnedPoolStats {
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that made a new block.
    pub misses: u64,
    /// Bytes in cached blocks: free, or waiting for GPU work (pending).
    pub cached_bytes: usize,
    /// Bytes in blocks handed out and not yet freed (size classes, not lengths asked for).
    pub in_use_bytes: usize,
    /// Blocks waiting for GPU work before they can be reused.
    pub pending_blocks: usize,
    /// Blocks made by the driver (`cudaHostAlloc`, or mapped and registered).
    pub driver_allocs: u64,
    /// Blocks given back to the driver.
    pub driver_frees: u64,
    /// Time spent making and freeing blocks.
    pub driver_time: Duration,
    /// Out-of-memory failures answered by emptying the cache and retrying.
    pub oom_retries: u64,
    /// Blocks leaked because the GPU work using them could not be waited for.
    pub leaked_blocks: u64,
}

impl fmt::Display for PinnedPoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cached ({} pending blocks), {} in use, {} hits, {} misses",
            fmt_bytes(self.cached_bytes),
            self.pending_blocks,
            fmt_bytes(self.in_use_bytes),
            self.hits,
            self.misses
        )
    }
}

/// A block waiting for GPU work.
struct Pending<E> {
    key: Key,
    block: Block,
    events: Vec<E>,
}

/// One shard's counters. Byte counts are signed: a block taken from one shard may come back
/// to another; only the sum over the shards means anything.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    hits: u64,
    misses: u64,
    cached: i64,
    in_use: i64,
    driver_allocs: u64,
    driver_frees: u64,
    driver_time: Duration,
    oom_retries: u64,
    leaked: u64,
}

impl Counters {
    fn add(&mut self, c: &Counters) {
        self.hits += c.hits;
        self.misses += c.misses;
        self.cached += c.cached;
        self.in_use += c.in_use;
        self.driver_allocs += c.driver_allocs;
        self.driver_frees += c.driver_frees;
        self.driver_time += c.driver_time;
        self.oom_retries += c.oom_retries;
        self.leaked += c.leaked;
    }
}

/// One shard's bookkeeping, generic over the event type so that it is testable without a
/// GPU.
struct State<E> {
    free: BTreeMap<Key, Vec<Block>>,
    pending: Vec<Pending<E>>,
    c: Counters,
}

impl<E> State<E> {
    fn new() -> Self {
        State {
            free: BTreeMap::new(),
            pending: Vec::new(),
            c: Counters::default(),
        }
    }

    /// A cached block of `key`, counted in use.
    fn take(&mut self, key: Key) -> Option<Block> {
        let block = self.free.get_mut(&key)?.pop()?;
        self.c.hits += 1;
        self.c.cached -= key.class as i64;
        self.c.in_use += key.class as i64;
        Some(block)
    }

    /// Moves the pending blocks whose events have all completed to the free lists.
    fn poll(&mut self, done: impl Fn(&E) -> bool) {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            p.events.retain(|e| !done(e));
            if p.events.is_empty() {
                let p = self.pending.swap_remove(i);
                self.free.entry(p.key).or_default().push(p.block);
            } else {
                i += 1;
            }
        }
    }

    /// Takes back a block handed out for `key`: free at once, or once `events` completed.
    fn give_back(&mut self, key: Key, block: Block, events: Vec<E>) {
        self.c.in_use -= key.class as i64;
        self.c.cached += key.class as i64;
        if events.is_empty() {
            self.free.entry(key).or_default().push(block);
        } else {
            self.pending.push(Pending { key, block, events });
        }
    }

    /// Free blocks to give back to the driver, largest first, until they add up to `excess`
    /// bytes or none is left (pending blocks cannot go yet). Returns them and their bytes.
    fn evict(&mut self, excess: usize) -> (Vec<Block>, usize) {
        let (mut out, mut bytes) = (Vec::new(), 0);
        while bytes < excess {
            let Some(mut entry) = self.free.last_entry() else {
                break;
            };
            let class = entry.key().class;
            match entry.get_mut().pop() {
                Some(b) => {
                    self.c.cached -= class as i64;
                    bytes += class;
                    out.push(b);
                }
                None => {
                    entry.remove();
                }
            }
        }
        (out, bytes)
    }
}

/// A pool of pinned host blocks, cached across allocations; see the module docs. Cloning it
/// gives another handle to the same pool; buffers keep their pool alive.
///
/// The cache is split into shards, one per group of threads, each behind its own lock, so
/// that threads allocating at once do not queue on one lock: a thread takes and returns
/// blocks through its own shard, and looks into the others only when its own has no block
/// of the class it needs.
#[derive(Clone)]
pub struct PinnedPool {
    shared: Arc<Shared>,
}

struct Shared {
    shards: Box<[Shard]>,
    config: PinnedPoolConfig,
}

/// One shard: its state, and a copy of its cached byte count that other threads read
/// without the lock (for the bound). Aligned to keep shards off each other's cache lines.
#[repr(align(128))]
struct Shard {
    state: Mutex<State<Arc<Event>>>,
    cached: AtomicI64,
}

/// The process-wide pool, once made.
static GLOBAL: OnceLock<PinnedPool> = OnceLock::new();

/// How a buffer refers to its pool: the process-wide pool needs no reference count (it is
/// never dropped), which keeps threads that allocate from it at once off one shared counter.
pub(crate) enum PoolRef {
    Global,
    Owned(PinnedPool),
}

impl PoolRef {
    fn get(&self) -> &PinnedPool {
        match self {
            PoolRef::Global => PinnedPool::global(),
            PoolRef::Owned(p) => p,
        }
    }
}

impl fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedPool")
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for PinnedPool {
    fn default() -> Self {
        PinnedPool::new(PinnedPoolConfig::default())
    }
}

/// This thread's shard index (before the modulo), handed out round robin.
fn thread_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    MINE.with(|m| *m)
}

impl PinnedPool {
    /// A new, empty pool.
    pub fn new(config: PinnedPoolConfig) -> PinnedPool {
        let n = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .clamp(1, 64);
        PinnedPool {
            shared: Arc::new(Shared {
                shards: (0..n)
                    .map(|_| Shard {
                        state: Mutex::new(State::new()),
                        cached: AtomicI64::new(0),
                    })
                    .collect(),
                config,
            }),
        }
    }

    /// The process-wide pool with the default configuration, made on first use (staged
    /// copies take their chunks from it). Its free blocks are given back to the driver when
    /// the process exits.
    pub fn global() -> &'static PinnedPool {
        GLOBAL.get_or_init(PinnedPool::default)
    }

    /// Whether this is the process-wide pool.
    fn is_global(&self) -> bool {
        GLOBAL
            .get()
            .is_some_and(|g| Arc::ptr_eq(&g.shared, &self.shared))
    }

    /// How a buffer refers to this pool.
    fn as_ref_for_buffer(&self) -> PoolRef {
        if self.is_global() {
            PoolRef::Global
        } else {
            PoolRef::Owned(self.clone())
        }
    }

    /// The configuration.
    pub fn config(&self) -> PinnedPoolConfig {
        self.shared.config
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, State<Arc<Event>>> {
        // The state is consistent between statements that could panic: recover it.
        self.shared.shards[shard]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes shard `i`'s cached bytes (call with its lock held, `st` its state).
    fn publish(&self, i: usize, st: &State<Arc<Event>>) {
        self.shared.shards[i]
            .cached
            .store(st.c.cached, Ordering::Relaxed);
    }

    /// Bytes cached over all shards (a snapshot).
    fn cached_total(&self) -> usize {
        let sum: i64 = self
            .shared
            .shards
            .iter()
            .map(|s| s.cached.load(Ordering::Relaxed))
            .sum();
        sum.max(0) as usize
    }

    fn mine(&self) -> usize {
        thread_shard() % self.shared.shards.len()
    }

    /// A block for `layout` with `flags`, from the cache where a free block of its size
    /// class and flags is ready, else newly made, with the owner its buffer keeps (this pool
    /// and the class, to give it back). The allocator's half of
    /// [`PinnedPool::alloc`](crate::PinnedPool::alloc): the buffer is made where the kind
    /// lives (`kinds/pinned.rs`).
    pub(crate) fn block_for<T>(
        &self,
        layout: &Layout<T>,
        flags: HostAllocFlags,
    ) -> Result<(Block, (PoolRef, usize))> {
        let key = Key {
            class: class_of(layout.bytes()).ok_or(Misuse::SizeOverflow {
                len: layout.len(),
                elem_size: std::mem::size_of::<T>(),
            })?,
            flags: flags.bits(),
        };
        let block = self.take_or_make(key, flags)?;
        Ok((block, (self.as_ref_for_buffer(), key.class)))
    }

    /// A cached block of `key` from this thread's shard, else from another shard (after
    /// moving completed pending blocks to the free lists).
    fn take(&self, key: Key) -> Option<Block> {
        let mine = self.mine();
        let n = self.shared.shards.len();
        for i in 0..n {
            let at = (mine + i) % n;
            let mut st = self.lock(at);
            if let Some(b) = st.take(key) {
                self.publish(at, &st);
                return Some(b);
            }
            if !st.pending.is_empty() {
                st.poll(event_done);
                if let Some(b) = st.take(key) {
                    self.publish(at, &st);
                    return Some(b);
                }
            }
        }
        None
    }

    fn take_or_make(&self, key: Key, flags: HostAllocFlags) -> Result<Block> {
        if let Some(b) = self.take(key) {
            return Ok(b);
        }
        let mine = self.mine();
        {
            let mut st = self.lock(mine);
            st.c.misses += 1;
            st.c.in_use += key.class as i64;
        }
        let strategy = self.shared.config.strategy;
        let made = match Block::alloc(key.class, flags, strategy) {
            Err(e) if e.is_out_of_memory() => {
                self.lock(mine).c.oom_retries += 1;
                let _ = self.empty();
                Block::alloc(key.class, flags, strategy)
            }
            r => r,
        };
        match made {
            Ok((block, t)) => {
                {
                    let mut st = self.lock(mine);
                    st.c.driver_allocs += 1;
                    st.c.driver_time += t;
                }
                if self.is_global() {
                    empty_global_at_exit();
                }
                Ok(block)
            }
            Err(e) => {
                self.lock(mine).c.in_use -= key.class as i64;
                Err(match e {
                    Error::Cuda { code, call } if code.is_out_of_memory() => Error::Cuda {
                        code,
                        call: format!(
                            "{call} (after emptying the pinned pool and one retry; pool: {})",
                            self.stats()
                        ),
                    },
                    e => e,
                })
            }
        }
    }

    /// Takes back a block of size class `class` handed out with `flags`, once the work on
    /// `fence` is done (without blocking). On error the block is leaked.
    pub(crate) fn give_back(
        &self,
        class: usize,
        flags: HostAllocFlags,
        block: Block,
        fence: &mut Fence,
    ) -> Result<()> {
        let key = Key {
            class,
            flags: flags.bits(),
        };
        let mine = self.mine();
        let events = match fence.retire() {
            Ok(ev) => ev,
            Err(e) => {
                let mut st = self.lock(mine);
                st.c.in_use -= class as i64;
                st.c.leaked += 1;
                return Err(e);
            }
        };
        let own = {
            let mut st = self.lock(mine);
            st.give_back(key, block, events);
            self.publish(mine, &st);
            st.c.cached
        };
        // Every shard within its share of the bound keeps the total within it; only past
        // that are the other shards' counts read.
        let max = self.shared.config.max_cached_bytes;
        let share = (max / self.shared.shards.len()) as i64;
        if own > share && self.cached_total() > max {
            // A failure to free another block is not this buffer's: it is counted (and that
            // block leaked), not returned.
            if self.evict_to(max).is_err() {
                self.lock(mine).c.leaked += 1;
            }
        }
        Ok(())
    }

    /// Gives free blocks back to the driver, largest first and this thread's shard first,
    /// until at most `keep` bytes are cached; returns the bytes given back.
    fn evict_to(&self, keep: usize) -> Result<usize> {
        let mine = self.mine();
        let n = self.shared.shards.len();
        let mut blocks = Vec::new();
        let mut total = 0;
        for i in 0..n {
            let excess = self.cached_total().saturating_sub(keep);
            if excess == 0 {
                break;
            }
            let at = (mine + i) % n;
            let (b, bytes) = {
                let mut st = self.lock(at);
                if !st.pending.is_empty() {
                    st.poll(event_done);
                }
                let r = st.evict(excess);
                self.publish(at, &st);
                r
            };
            total += bytes;
            blocks.extend(b);
        }
        self.free_blocks(blocks).map(|()| total)
    }

    /// Gives blocks back to the driver, outside the locks; returns the first error (the block
    /// that failed is leaked, the others are still freed).
    fn free_blocks(&self, blocks: Vec<Block>) -> Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        let t = std::time::Instant::now();
        let n = blocks.len() as u64;
        let mut first = Ok(());
        for b in blocks {
            if let Err(e) = b.free() {
                first = first.and(Err(e));
            }
        }
        let mut st = self.lock(self.mine());
        st.c.driver_frees += n;
        st.c.driver_time += t.elapsed();
        first
    }

    /// Gives free blocks back to the driver until at most `keep` bytes are cached (blocks
    /// still waiting for GPU work stay). Returns the bytes given back.
    pub fn trim(&self, keep: usize) -> Result<usize> {
        self.evict_to(keep)
    }

    /// Gives every free block back to the driver; see [`trim`](Self::trim).
    pub fn empty(&self) -> Result<usize> {
        self.trim(0)
    }

    /// The counters, after moving blocks whose GPU work has completed to the free lists.
    pub fn stats(&self) -> PinnedPoolStats {
        let mut sum = Counters::default();
        let mut pending = 0;
        for i in 0..self.shared.shards.len() {
            let mut st = self.lock(i);
            if !st.pending.is_empty() {
                st.poll(event_done);
            }
            pending += st.pending.len();
            sum.add(&st.c);
        }
        PinnedPoolStats {
            hits: sum.hits,
            misses: sum.misses,
            cached_bytes: sum.cached.max(0) as usize,
            in_use_bytes: sum.in_use.max(0) as usize,
            pending_blocks: pending,
            driver_allocs: sum.driver_allocs,
            driver_frees: sum.driver_frees,
            driver_time: sum.driver_time,
            oom_retries: sum.oom_retries,
            leaked_blocks: sum.leaked,
        }
    }
}

/// Registers, once, an exit handler that gives the process-wide pool's free blocks back to the
/// driver, so that tools like compute-sanitizer see no pinned memory left at exit. Registered
/// after the first block was made, hence after the CUDA runtime registered its own teardown:
/// exit handlers run in reverse order, so this one runs while the runtime is still there.
fn empty_global_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn at_exit() {
        // Never unwind out of an exit handler; errors at exit are ignored.
        let _ = std::panic::catch_unwind(|| {
            if let Some(pool) = GLOBAL.get() {
                let _ = pool.empty();
            }
        });
    }
    ONCE.call_once(|| {
        // SAFETY: `at_exit` is a plain `extern "C" fn()` that lives for the whole program
        // and catches any panic; registration failure only means no cleanup at exit.
        unsafe { libc::atexit(at_exit) };
    });
}

/// Whether an event has completed; a failed query counts as not yet (the block stays
/// pending: leaked rather than reused early).
fn event_done(e: &Arc<Event>) -> bool {
    e.is_complete().unwrap_or(false)
}

impl Drop for Shared {
    /// Frees every cached block; a pending one after waiting for its events (leaked if that
    /// wait fails). Errors are ignored: drop never panics.
    fn drop(&mut self) {
        for shard in self.shards.iter_mut() {
            let st = shard.state.get_mut().unwrap_or_else(|e| e.into_inner());
            for (_, blocks) in std::mem::take(&mut st.free) {
                for b in blocks {
                    let _ = b.free();
                }
            }
            for p in std::mem::take(&mut st.pending) {
                if p.events.iter().all(|e| e.synchronize().is_ok()) {
                    let _ = p.block.free();
                }
            }
        }
    }
}

/// Whose memory a [`PinnedBuffer`] made from a [`Block`] is: a pool's (with the block's size
/// class), or its own.
pub(crate) struct BlockOwner {
    pub(crate) block: Block,
    pub(crate) pool: Option<(PoolRef, usize)>,
}

impl fmt::Debug for BlockOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pool {
            Some((_, class)) => write!(f, "pinned pool block of {}", fmt_bytes(*class)),
            None if self.block.is_mapped() => {
                write!(f, "{} mapped and registered", fmt_bytes(self.block.bytes()))
            }
            None => write!(f, "{} from cudaHostAlloc", fmt_bytes(self.block.bytes())),
        }
    }
}

impl BlockOwner {
    /// Gives the memory up for `cudaFreeHost` by its new owner (`into_raw`): a block made by
    /// `cudaHostAlloc` leaves its pool's accounting; a mapped-and-registered block is refused
    /// (`cudaFreeHost` cannot free it) and stays with the buffer.
    pub(crate) fn detach(&mut self) -> Result<()> {
        if self.block.is_mapped() {
            return Err(Misuse::InvalidArgument {
                op: "PinnedBuffer::into_raw",
                reason:
                    "the memory was made by mmap + cudaHostRegister (PinStrategy::MapRegister, \
                         or a pool block of 4 MiB or more), which cudaFreeHost cannot free: keep \
                         it in a PinnedBuffer"
                        .into(),
            }
            .into());
        }
        if let Some((pool, class)) = self.pool.take() {
            let p = pool.get();
            p.lock(p.mine()).c.in_use -= class as i64;
        }
        Ok(())
    }

    /// Releases the memory of a buffer with `flags` and `fence`: back to the pool without
    /// blocking, or waited for and freed. On error the memory is leaked.
    pub(crate) fn release(self, flags: HostAllocFlags, fence: &mut Fence) -> Result<()> {
        match self.pool {
            Some((pool, class)) => pool.get().give_back(class, flags, self.block, fence),
            None => {
                fence.host_wait_mut(Access::Write)?;
                self.block.free()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_four_per_power_of_two() {
        assert_eq!(class_of(1), Some(4096));
        assert_eq!(class_of(4096), Some(4096));
        assert_eq!(class_of(4097), Some(5120));
        assert_eq!(class_of(5120), Some(5120));
        assert_eq!(class_of(7000), Some(7168));
        assert_eq!(class_of(8192), Some(8192));
        assert_eq!(class_of(8193), Some(10240));
        assert_eq!(class_of(256 << 20), Some(256 << 20));
        assert_eq!(class_of((256 << 20) + 1), Some(320 << 20));
        assert_eq!(class_of(usize::MAX), None);
        assert_eq!(class_of(isize::MAX as usize), None);
        assert_eq!(class_of(1 << 40), Some(1 << 40));
        for b in [
            1usize,
            4095,
            4097,
            12345,
            1 << 20,
            (1 << 20) + 3,
            999_999_999,
        ] {
            let c = class_of(b).unwrap();
            assert!(c >= b && (c <= 4096 || c - b < c / 4 + 1), "{b} -> {c}");
        }
    }

    fn key(class: usize) -> Key {
        Key { class, flags: 0 }
    }

    /// `n` blocks of class 4096 handed out by `st` (fake blocks: dropping one frees nothing).
    fn handed_out(st: &mut State<u32>, n: usize) -> Vec<Block> {
        st.c.in_use += n as i64 * 4096;
        (0..n).map(|_| Block::fake(4096)).collect()
    }

    #[test]
    fn free_blocks_are_reused_and_flags_are_part_of_the_key() {
        let mut st = State::<u32>::new();
        let b = handed_out(&mut st, 1).pop().unwrap();
        let addr = b.ptr();
        st.give_back(key(4096), b, vec![]);
        assert_eq!(st.c.cached, 4096);
        let mapped = Key {
            class: 4096,
            flags: HostAllocFlags::MAPPED.bits(),
        };
        assert!(
            st.take(mapped).is_none(),
            "a MAPPED request gets no DEFAULT block"
        );
        assert!(st.take(key(8192)).is_none());
        let again = st.take(key(4096)).unwrap();
        assert_eq!(again.ptr(), addr);
        assert_eq!((st.c.hits, st.c.cached, st.c.in_use), (1, 0, 4096));
    }

    #[test]
    fn pending_blocks_wait_for_all_their_events() {
        let mut st = State::<u32>::new();
        let b = handed_out(&mut st, 1).pop().unwrap();
        // Two events: 1 completes first, 2 later.
        st.give_back(key(4096), b, vec![1, 2]);
        assert!(st.take(key(4096)).is_none(), "pending: not reusable");
        st.poll(|&e| e == 1);
        assert!(st.take(key(4096)).is_none(), "one event still running");
        assert_eq!(st.pending.len(), 1);
        st.poll(|&e| e == 2);
        assert!(st.pending.is_empty());
        assert!(
            st.take(key(4096)).is_some(),
            "reusable once all events completed"
        );
    }

    #[test]
    fn eviction_takes_free_blocks_largest_first_never_pending_ones() {
        let mut st = State::<u32>::new();
        st.c.in_use += 3 * 4096 + 8192;
        st.give_back(key(8192), Block::fake(8192), vec![]);
        st.give_back(key(4096), Block::fake(4096), vec![7]);
        st.give_back(key(4096), Block::fake(4096), vec![]);
        st.give_back(key(4096), Block::fake(4096), vec![]);
        assert_eq!(st.c.cached, 20480);
        let (first, bytes) = st.evict(5000);
        assert_eq!(first.iter().map(Block::bytes).collect::<Vec<_>>(), [8192]);
        assert_eq!((bytes, st.c.cached), (8192, 12288));
        let (rest, bytes) = st.evict(usize::MAX);
        assert_eq!(
            (rest.len(), bytes),
            (2, 8192),
            "pending blocks are not evicted"
        );
        assert_eq!(st.c.cached, 4096);
    }
}
