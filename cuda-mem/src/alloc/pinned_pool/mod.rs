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
//! - **Per-thread caches**: each thread that uses the pool gets a cache of its own (a slice
//!   of the bound, [`PinnedPoolConfig::max_cached_bytes`] / (4 × cores), at most 64 MiB), so
//!   that an allocation and a free served from it lock nothing other threads use meanwhile.
//!   A miss refills it from the pool's shared depot in a batch (else takes a block from
//!   another thread's cache, else makes one); a cache past its slice flushes its largest
//!   blocks to the depot. A buffer may be dropped on any thread: its block goes to that
//!   thread's cache. A thread that exits gives its cache back to the depot.
//! - **A bound on cached bytes** ([`PinnedPoolConfig::max_cached_bytes`]), thread caches
//!   included: each holds at most the slice it reserved (all of them together at most half
//!   the bound), the depot at most the rest, and freed blocks beyond it are given back to the
//!   driver, largest first. [`trim`](PinnedPool::trim) and [`empty`](PinnedPool::empty) give
//!   back more, from every thread's cache.
//! - **Dropping the pool**: when its last handle goes, every thread's cache is emptied and
//!   the free blocks given back to the driver; blocks of buffers still alive are freed as
//!   they come back, and blocks still waiting for GPU work once no buffer is left.
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

mod cache;
mod state;

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use self::cache::{Core, GpuEvent, MakeFn, ThreadCache, ThreadCaches};
use self::state::{class_of, Key};
use crate::alloc::pinning::{Block, PinStrategy};
use crate::contract::layout::Layout;
use crate::contract::size::fmt_bytes;
use crate::error::{Misuse, Result};
use crate::fence::{Access, Fence};
use crate::handles::event::Event;
use crate::handles::flags::HostAllocFlags;

/// How a [`PinnedPool`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedPoolConfig {
    /// Most bytes kept in free (and pending) blocks, thread caches included; freed blocks
    /// beyond it go back to the driver. Default 1 GiB.
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

/// A [`PinnedPool`]'s counters, over every thread's cache.
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
    /// Blocks leaked because the GPU work using them could not be waited for (or their free
    /// failed).
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

/// What a pooled block waits for before reuse: the events its buffer's fence recorded.
type Ev = Arc<Event>;

impl GpuEvent for Ev {
    fn done(&self) -> bool {
        // Relaxed capture mode where a capture is open on some thread: a query from a thread
        // in global mode would invalidate it.
        let _relaxed = crate::fence::capture::Relaxed::new();
        self.is_complete().unwrap_or(false)
    }

    fn wait(&self) -> bool {
        let _relaxed = crate::fence::capture::Relaxed::new();
        self.synchronize().is_ok()
    }

    fn caches() -> &'static std::thread::LocalKey<ThreadCaches<Self>> {
        thread_local! {
            static CACHES: ThreadCaches<Ev> = const { ThreadCaches::new() };
        }
        &CACHES
    }
}

/// A pool of pinned host blocks, cached across allocations; see the module docs. Cloning it
/// gives another handle to the same pool; buffers keep their pool alive.
///
/// Each thread that uses the pool takes and returns blocks through a cache of its own, so
/// that threads allocating at once do not queue on one lock: an allocation served from the
/// thread's cache, and a free into it, touch nothing another thread touches meanwhile. The
/// pool's shared depot refills the caches and takes what they shed.
#[derive(Clone)]
pub struct PinnedPool {
    handle: Arc<Handle>,
}

/// The pool's handles share this; when the last goes, the pool closes.
struct Handle {
    core: Arc<Core<Ev>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.core.close();
    }
}

/// The process-wide pool, once made.
static GLOBAL: OnceLock<PinnedPool> = OnceLock::new();

/// How a buffer refers to its pool. The process-wide pool needs no reference count (it is
/// never dropped); another pool's buffer holds the cache of the thread that allocated it
/// (which holds the pool), so that threads allocating at once each count references on their
/// own cache line, not on one shared counter.
pub(crate) enum PoolRef {
    Global,
    Cache(Arc<ThreadCache<Ev>>),
    Core(Arc<Core<Ev>>),
}

impl PoolRef {
    fn core(&self) -> &Arc<Core<Ev>> {
        match self {
            PoolRef::Global => &PinnedPool::global().handle.core,
            PoolRef::Cache(c) => &c.core,
            PoolRef::Core(c) => c,
        }
    }
}

impl fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedPool")
            .field("config", &self.config())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for PinnedPool {
    fn default() -> Self {
        PinnedPool::new(PinnedPoolConfig::default())
    }
}

impl PinnedPool {
    /// A new, empty pool.
    pub fn new(config: PinnedPoolConfig) -> PinnedPool {
        PinnedPool::with_maker(config, Block::alloc)
    }

    /// A new pool whose blocks are made by `make` (heap memory in the tests).
    fn with_maker(config: PinnedPoolConfig, make: MakeFn) -> PinnedPool {
        PinnedPool {
            handle: Arc::new(Handle {
                core: Core::new(config, make),
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
            .is_some_and(|g| Arc::ptr_eq(&g.handle, &self.handle))
    }

    /// The configuration.
    pub fn config(&self) -> PinnedPoolConfig {
        self.handle.core.config
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
        let core = &self.handle.core;
        let mine = core.my_cache();
        let block = match core.take(mine.as_deref(), key) {
            Some(b) => b,
            None => {
                let b = core.make(mine.as_deref(), key, flags)?;
                if self.is_global() {
                    empty_global_at_exit();
                }
                b
            }
        };
        let owner = if self.is_global() {
            PoolRef::Global
        } else {
            match mine {
                Some(c) => PoolRef::Cache(c),
                None => PoolRef::Core(core.clone()),
            }
        };
        Ok((block, (owner, key.class)))
    }

    /// Gives free blocks back to the driver until at most `keep` bytes are cached, every
    /// thread's cache included (blocks still waiting for GPU work stay). Returns the bytes
    /// given back.
    pub fn trim(&self, keep: usize) -> Result<usize> {
        self.handle.core.trim(keep)
    }

    /// Gives every free block back to the driver; see [`trim`](Self::trim).
    pub fn empty(&self) -> Result<usize> {
        self.trim(0)
    }

    /// The counters over every thread's cache, after moving blocks whose GPU work has
    /// completed to the free lists.
    pub fn stats(&self) -> PinnedPoolStats {
        self.handle.core.stats()
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

/// Whose memory a [`PinnedBuffer`](crate::PinnedBuffer) made from a [`Block`] is: a pool's
/// (with the block's size class), or its own.
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
            let core = pool.core();
            let mine = core.my_cache();
            core.count(mine.as_deref(), |c| c.in_use -= class as i64);
        }
        Ok(())
    }

    /// Releases the memory of a buffer with `flags` and `fence`: back to the pool without
    /// blocking (into the calling thread's cache, once the work on `fence` is done), or
    /// waited for and freed. On error the memory is leaked.
    pub(crate) fn release(self, flags: HostAllocFlags, fence: &mut Fence) -> Result<()> {
        let Some((pool, class)) = self.pool else {
            fence.host_wait_mut(Access::Write)?;
            return self.block.free();
        };
        let key = Key {
            class,
            flags: flags.bits(),
        };
        let core = pool.core();
        let mine = core.my_cache();
        match fence.retire() {
            Ok(events) => {
                core.give_back(mine.as_deref(), key, self.block, events);
                Ok(())
            }
            Err(e) => {
                core.count(mine.as_deref(), |c| {
                    c.in_use -= class as i64;
                    c.leaked += 1;
                });
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The pool on heap blocks (no GPU): per-thread caches, cross-thread frees, thread exit,
    //! the bound, closing; and stream-aware reuse with stand-in events.

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    use super::cache::{Core, GpuEvent, ThreadCaches};
    use super::state::Key;
    use super::*;

    fn heap(bytes: usize, _: HostAllocFlags, _: PinStrategy) -> Result<(Block, Duration)> {
        Ok((Block::heap(bytes), Duration::ZERO))
    }

    fn pool(max: usize) -> PinnedPool {
        PinnedPool::with_maker(
            PinnedPoolConfig {
                max_cached_bytes: max,
                strategy: PinStrategy::HostAlloc,
            },
            heap,
        )
    }

    /// Rounds of work per thread: fewer under Miri.
    const ROUNDS: usize = if cfg!(miri) { 20 } else { 2000 };

    const F: HostAllocFlags = HostAllocFlags::DEFAULT;

    #[test]
    fn a_thread_reuses_its_own_blocks() {
        let p = pool(1 << 30);
        let a = p.alloc::<u8>(5000, F).unwrap();
        let addr = a.as_ptr() as usize;
        drop(a);
        for _ in 0..10 {
            let b = p.alloc::<u8>(5100, F).unwrap(); // the same class (5 KiB)
            assert_eq!(b.as_ptr() as usize, addr);
        }
        let s = p.stats();
        assert_eq!((s.hits, s.misses, s.in_use_bytes), (10, 1, 0));
        assert_eq!(s.cached_bytes, 5120);
        assert_eq!(p.empty().unwrap(), 5120);
        assert_eq!(p.stats().driver_frees, 1);
    }

    /// Threads allocate, write their own pattern, let the others run, check it and free, over
    /// and over, at several sizes: no block is ever handed to two buffers at once (the
    /// patterns would clash), and the counters add up across the threads' caches.
    #[test]
    fn a_storm_of_threads_keeps_every_buffer_to_itself() {
        let p = pool(1 << 30);
        let threads = 4;
        let rounds = if cfg!(miri) { 12 } else { ROUNDS / 4 };
        std::thread::scope(|s| {
            for t in 0..threads as u32 {
                let p = &p;
                s.spawn(move || {
                    for r in 0..rounds as u32 {
                        // (A quarter of the sizes under Miri, where filling is slow.)
                        let n = [100usize, 1000, 3000, 20_000][(r % 4) as usize]
                            / if cfg!(miri) { 4 } else { 1 };
                        let seed = t << 24 | r;
                        let mut a = p.alloc::<u32>(n, F).unwrap();
                        let mut b = p.alloc::<u32>(n / 2 + 1, F).unwrap();
                        a.as_mut_slice().unwrap().fill(seed);
                        b.as_mut_slice().unwrap().fill(!seed);
                        std::thread::yield_now();
                        assert!(a.as_slice().unwrap().iter().all(|&v| v == seed));
                        assert!(b.as_slice().unwrap().iter().all(|&v| v == !seed));
                    }
                });
            }
        });
        let s = p.stats();
        assert_eq!(s.in_use_bytes, 0, "{s:?}");
        assert_eq!(s.hits + s.misses, (threads * rounds * 2) as u64);
        assert_eq!(s.leaked_blocks, 0);
        assert_eq!(s.driver_allocs, s.misses);
        // Each thread asks for eight size classes (two per round, four kinds of round): no
        // more blocks are made than that, however the rounds interleave.
        assert!(
            s.misses <= (threads * 8) as u64,
            "blocks were not reused: {s:?}"
        );
    }

    /// A buffer allocated on one thread and dropped on another goes to the dropping thread's
    /// cache: that thread's next allocation of the class gets it back.
    #[test]
    fn a_buffer_freed_on_another_thread_is_reused_there() {
        let p = pool(1 << 30);
        let (tx, rx) = std::sync::mpsc::channel();
        let addr = std::thread::scope(|s| {
            let p = &p;
            s.spawn(move || {
                let mut b = p.alloc::<u32>(3000, F).unwrap();
                b.as_mut_slice().unwrap().fill(7);
                tx.send(b).unwrap();
            })
            .join()
            .unwrap();
            s.spawn(move || {
                let b = rx.recv().unwrap();
                assert!(b.as_slice().unwrap().iter().all(|&v| v == 7));
                let addr = b.as_ptr() as usize;
                drop(b); // on this thread
                let again = p.alloc::<u32>(3000, F).unwrap();
                assert_eq!(
                    again.as_ptr() as usize,
                    addr,
                    "not reused by the freeing thread"
                );
                addr
            })
            .join()
            .unwrap()
        });
        let s = p.stats();
        assert_eq!((s.misses, s.in_use_bytes), (1, 0), "{s:?}");
        assert_eq!(p.alloc::<u32>(3000, F).unwrap().as_ptr() as usize, addr);
    }

    /// A thread that exits gives its cache back: its blocks show in the pool's statistics and
    /// serve other threads without new blocks, and its reservation returns to the bound.
    #[test]
    fn a_thread_that_exits_gives_its_blocks_back() {
        let p = pool(1 << 30);
        let core = p.handle.core.clone();
        let per = core.per_thread();
        assert!(per > 0);
        let addrs: Vec<usize> = {
            let p = p.clone();
            std::thread::spawn(move || {
                let bufs: Vec<_> = (0..5).map(|_| p.alloc::<u8>(8192, F).unwrap()).collect();
                bufs.iter().map(|b| b.as_ptr() as usize).collect()
                // dropped here, into this thread's cache; then the thread exits
            })
            .join()
            .unwrap()
        };
        // `join` returns once the thread's destructors have run.
        assert_eq!(core.reserved(), 0, "the reservation came back");
        let s = p.stats();
        assert_eq!((s.cached_bytes, s.in_use_bytes, s.misses), (5 * 8192, 0, 5));
        let bufs: Vec<_> = (0..5).map(|_| p.alloc::<u8>(8192, F).unwrap()).collect();
        let mut got: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
        got.sort_unstable();
        let mut want = addrs;
        want.sort_unstable();
        assert_eq!(got, want, "the exited thread's blocks were not reused");
        assert_eq!(p.stats().misses, 5);
    }

    /// The bound holds over every thread's cache: many threads free many blocks at once,
    /// and the cached bytes never exceed it.
    #[test]
    fn the_bound_counts_thread_caches() {
        let max = 1 << 20;
        let p = pool(max);
        let threads = 6;
        let barrier = Barrier::new(threads);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..(ROUNDS / 200).max(2) {
                        // 48 blocks of 16 KiB each: 768 KiB a thread, 4.5 MiB in all.
                        let bufs: Vec<_> =
                            (0..48).map(|_| p.alloc::<u8>(16384, F).unwrap()).collect();
                        barrier.wait();
                        drop(bufs);
                        let s = p.stats();
                        assert!(
                            s.cached_bytes <= max,
                            "{} cached, bound {max}",
                            s.cached_bytes
                        );
                        barrier.wait();
                    }
                });
            }
        });
        let s = p.stats();
        assert!(s.cached_bytes <= max && s.cached_bytes > 0, "{s:?}");
        assert_eq!(
            s.driver_allocs - s.driver_frees,
            (s.cached_bytes / 16384) as u64
        );
        assert_eq!(s.in_use_bytes, 0);
    }

    /// Dropping the pool's last handle while other threads still hold caches and buffers:
    /// the buffers stay usable and go back on their threads, every block is freed in the end,
    /// nothing panics.
    #[test]
    fn the_pool_may_go_before_its_threads_and_buffers() {
        let p = pool(1 << 30);
        let core = p.handle.core.clone();
        let (go, wait) = (Arc::new(Barrier::new(3)), Arc::new(Barrier::new(3)));
        let workers: Vec<_> = (0..2u32)
            .map(|t| {
                let (p, go, wait) = (p.clone(), go.clone(), wait.clone());
                std::thread::spawn(move || {
                    // A cached block and a live buffer on this thread.
                    drop(p.alloc::<u32>(1000, F).unwrap());
                    let mut held = p.alloc::<u32>(1000, F).unwrap();
                    held.as_mut_slice().unwrap().fill(t);
                    drop(p);
                    go.wait(); // the main thread drops the last handle
                    wait.wait();
                    assert!(held.as_slice().unwrap().iter().all(|&v| v == t));
                    drop(held); // into a closed pool: freed
                })
            })
            .collect();
        go.wait();
        drop(p);
        let s = core.stats();
        assert_eq!(
            s.cached_bytes, 0,
            "closing freed the threads' cached blocks: {s:?}"
        );
        wait.wait();
        for w in workers {
            w.join().unwrap();
        }
        let s = core.stats();
        assert_eq!((s.cached_bytes, s.in_use_bytes), (0, 0), "{s:?}");
        assert_eq!(s.driver_frees, s.driver_allocs, "{s:?}");
    }

    /// `mem::forget` of a buffer and of a pool handle is safe: the block and the pool leak,
    /// nothing else happens.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "leaks on purpose (mem::forget), which Miri's leak check reports"
    )]
    fn forgetting_buffers_and_handles_only_leaks() {
        let p = pool(1 << 30);
        std::mem::forget(p.alloc::<u8>(100, F).unwrap());
        let q = p.clone();
        std::mem::forget(q);
        drop(p); // not the last handle: the pool stays open
        let p = pool(1 << 30);
        let b = p.alloc::<u8>(100, F).unwrap();
        let core = p.handle.core.clone();
        drop(p); // closed, a buffer still out
        std::mem::forget(b);
        assert_eq!(core.stats().in_use_bytes, 4096);
    }

    // ---------------------------------------------------------------------------------------
    // Stream-aware reuse with stand-in events.
    // ---------------------------------------------------------------------------------------

    /// A stand-in event: done once its flag is set.
    #[derive(Clone)]
    struct Flag(Arc<AtomicBool>);

    impl Flag {
        fn new() -> Flag {
            Flag(Arc::new(AtomicBool::new(false)))
        }
        fn set(&self) {
            self.0.store(true, Ordering::Release);
        }
    }

    impl GpuEvent for Flag {
        fn done(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
        fn wait(&self) -> bool {
            while !self.done() {
                std::thread::yield_now();
            }
            true
        }
        fn caches() -> &'static std::thread::LocalKey<ThreadCaches<Self>> {
            thread_local! {
                static CACHES: ThreadCaches<Flag> = const { ThreadCaches::new() };
            }
            &CACHES
        }
    }

    fn flag_core(max: usize) -> Arc<Core<Flag>> {
        Core::new(
            PinnedPoolConfig {
                max_cached_bytes: max,
                strategy: PinStrategy::HostAlloc,
            },
            heap,
        )
    }

    fn key(class: usize) -> Key {
        Key { class, flags: 0 }
    }

    /// One allocation from `core` on the calling thread, as `PinnedPool::block_for` does.
    fn take(core: &Arc<Core<Flag>>, k: Key) -> Block {
        let mine = core.my_cache();
        match core.take(mine.as_deref(), k) {
            Some(b) => b,
            None => core.make(mine.as_deref(), k, F).unwrap(),
        }
    }

    fn give(core: &Arc<Core<Flag>>, k: Key, b: Block, events: Vec<Flag>) {
        let mine = core.my_cache();
        core.give_back(mine.as_deref(), k, b, events);
    }

    /// A block given back with work pending is handed to nobody, on this thread or another,
    /// through the thread's cache, the depot or a steal, until every event is done; then it
    /// is reused.
    #[test]
    fn a_pending_block_is_reused_by_no_thread_before_its_work_is_done() {
        let core = flag_core(1 << 30);
        let k = key(8192);
        let b = take(&core, k);
        let addr = b.ptr();
        let (e1, e2) = (Flag::new(), Flag::new());
        give(&core, k, b, vec![e1.clone(), e2.clone()]);
        assert_eq!(core.stats().pending_blocks, 1);
        let here = take(&core, k);
        assert_ne!(here.ptr(), addr, "handed back on the same thread");
        let there = std::thread::scope(|s| s.spawn(|| take(&core, k)).join().unwrap());
        assert_ne!(there.ptr(), addr, "stolen by another thread");
        e1.set();
        let again = take(&core, k);
        assert_ne!(again.ptr(), addr, "handed out with one event still running");
        e2.set();
        let last = take(&core, k);
        assert_eq!(last.ptr(), addr, "reused once done");
        for b in [here, there, again, last] {
            give(&core, k, b, vec![]);
        }
        assert_eq!(core.stats().in_use_bytes, 0);
    }

    /// Pending blocks keep their events through a flush to the depot (a cache over its
    /// reservation) and through their thread's exit: no thread gets them early.
    #[test]
    fn pending_blocks_keep_waiting_through_flushes_and_thread_exit() {
        let core = flag_core(1 << 20); // thread caches of a slice of 1 MiB
        let per = core.per_thread();
        let k = key(16384);
        let n = per / 16384 + 4; // more than one cache holds: some go to the depot
        let ev = Flag::new();
        let pending: Vec<usize> = {
            let core = core.clone();
            let ev = ev.clone();
            std::thread::spawn(move || {
                let bufs: Vec<Block> = (0..n).map(|_| take(&core, k)).collect();
                let addrs = bufs.iter().map(|b| b.ptr().as_ptr() as usize).collect();
                for b in bufs {
                    give(&core, k, b, vec![ev.clone()]);
                }
                addrs
            })
            .join()
            .unwrap()
        };
        assert_eq!(core.stats().pending_blocks, n);
        let fresh: Vec<Block> = (0..n).map(|_| take(&core, k)).collect();
        for b in &fresh {
            assert!(
                !pending.contains(&(b.ptr().as_ptr() as usize)),
                "a pending block was handed out"
            );
        }
        ev.set();
        let s = core.stats();
        assert_eq!(s.pending_blocks, 0);
        for b in fresh {
            give(&core, k, b, vec![]);
        }
        assert_eq!(core.stats().in_use_bytes, 0);
    }

    /// A closed pool frees returned blocks, and waits for pending ones only once no buffer is
    /// out (as dropping the pool waited before thread caches); the wait happens with no lock
    /// held, so another thread can give its buffer back meanwhile.
    #[test]
    fn a_closed_pool_frees_pending_blocks_once_the_last_buffer_is_back() {
        let core = flag_core(1 << 30);
        let k = key(4096);
        let (a, b) = (take(&core, k), take(&core, k));
        let ev = Flag::new();
        give(&core, k, a, vec![ev.clone()]);
        core.close();
        let s = core.stats();
        assert_eq!((s.pending_blocks, s.in_use_bytes), (1, 4096), "{s:?}");
        // The last buffer comes back: the pending block is waited for (the event is set by
        // another thread a little later) and freed.
        std::thread::scope(|sc| {
            sc.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                ev.set();
            });
            give(&core, k, b, vec![]);
        });
        let s = core.stats();
        assert_eq!(
            (s.pending_blocks, s.cached_bytes, s.in_use_bytes),
            (0, 0, 0)
        );
        assert_eq!(s.driver_frees, 2);
    }

    /// Per-pair cost of a cached allocation and free on 1 and 2 threads (heap blocks; run
    /// with `--ignored --nocapture` in release mode).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn measure_cached_pairs() {
        let p = pool(1 << 30);
        for threads in [1usize, 2, 4] {
            let n = 1_000_000;
            let barrier = Barrier::new(threads);
            let per: Vec<f64> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|_| {
                        s.spawn(|| {
                            drop(p.alloc::<u8>(4096, F).unwrap());
                            barrier.wait();
                            let t = std::time::Instant::now();
                            for _ in 0..n {
                                drop(std::hint::black_box(p.alloc::<u8>(4096, F).unwrap()));
                            }
                            t.elapsed().as_secs_f64() * 1e9 / n as f64
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            println!("{threads} threads: {per:.1?} ns per pair per thread");
        }
    }
}
