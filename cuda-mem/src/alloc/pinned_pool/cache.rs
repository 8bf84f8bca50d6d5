//! The pool's machinery: a shared [`Core`] (the depot of blocks every thread may use, the
//! bound on cached bytes, the registry of thread caches) and one [`ThreadCache`] per thread
//! that uses the pool.
//!
//! # How a thread's cache works
//!
//! A thread's first use of a pool registers a cache for it (kept in a thread-local list, and
//! in the core's registry through a weak reference). An allocation looks in that cache first
//! and a free puts the block back there: both lock only the thread's own cache, which other
//! threads lock only to steal a block on a miss, to trim, empty or read statistics, and to
//! close the pool. A miss refills the cache from the depot in a batch (up to [`REFILL`]
//! blocks of the size class asked for), then steals a block from another thread's cache, then
//! makes a new block. A cache over its share of bytes flushes its largest free blocks to the
//! depot until it is down to half of it.
//!
//! # The bound
//!
//! Each cache holds at most its *reservation*: bytes taken out of the pool's bound when it
//! registered (`per_thread`, a slice of `max_cached_bytes`; caches are reserved at most half
//! of the bound in all, and a thread that finds none left caches nothing itself and uses the
//! depot). The depot keeps what the bound leaves once every reservation is taken off, freeing
//! its largest free blocks beyond that. So cached bytes never exceed the bound, however many
//! threads cache blocks, except for blocks still waiting for GPU work, which cannot be freed
//! yet (as before thread caches existed).
//!
//! # Lifetimes
//!
//! A thread that exits gives its cache back: its free and pending blocks and its counters move
//! to the depot, its reservation returns to the bound (thread-local destructor; a thread whose
//! destructors do not run keeps its cache until the pool closes or the process ends). When the
//! last handle to a pool is dropped the pool *closes*: every thread's cache is drained into the
//! depot, free blocks are freed, and from then on returned blocks are freed instead of cached;
//! once no buffer of the pool is left, blocks still waiting for GPU work are waited for and
//! freed. The core itself (a few hundred bytes) lives until its last thread cache and buffer
//! are gone.
//!
//! Lock order: registry, then a thread's cache, then the depot. No lock is held while blocks
//! are made, freed or waited for.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::LocalKey;
use std::time::{Duration, Instant};

use super::state::{Counters, Key, Pending, State, MIN_CLASS};
use super::{PinnedPoolConfig, PinnedPoolStats};
use crate::alloc::pinning::{Block, PinStrategy};
use crate::error::{Error, Result};
use crate::handles::flags::HostAllocFlags;

/// Blocks a miss moves from the depot into a thread's cache at most (the one handed out
/// included).
pub(super) const REFILL: usize = 8;

/// What a block waits for before it can be reused: GPU events (`Arc<Event>`), or a stand-in in
/// the tests.
pub(crate) trait GpuEvent: Sized + Send + Sync + 'static {
    /// Whether the work before the event has completed; a failed query counts as not yet (the
    /// block stays pending: leaked rather than reused early).
    fn done(&self) -> bool;
    /// Blocks until the work has completed; false if that wait failed.
    fn wait(&self) -> bool;
    /// The thread-local list of this thread's caches (one per pool it used).
    fn caches() -> &'static LocalKey<ThreadCaches<Self>>;
}

/// How blocks are made: [`Block::alloc`], or heap memory in the tests.
pub(crate) type MakeFn = fn(usize, HostAllocFlags, PinStrategy) -> Result<(Block, Duration)>;

/// Locks `m`; the state behind every lock here is consistent between statements that could
/// panic, so a poisoned lock is recovered.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shared part of a pool.
pub(crate) struct Core<E: GpuEvent> {
    pub(super) config: PinnedPoolConfig,
    /// Bytes a thread's cache reserves out of the bound when it registers (0: none).
    per_thread: usize,
    make: MakeFn,
    depot: Mutex<Depot<E>>,
    registry: Mutex<Registry<E>>,
    /// Bytes reserved by thread caches, all together.
    reserved: AtomicUsize,
}

struct Depot<E> {
    st: State<E>,
    closed: bool,
}

struct Registry<E: GpuEvent> {
    caches: Vec<Weak<ThreadCache<E>>>,
    closed: bool,
}

/// One thread's cache of one pool. Aligned to keep caches of different threads off each
/// other's cache lines (its reference count, which the thread's buffers share, included).
#[repr(align(128))]
pub(crate) struct ThreadCache<E: GpuEvent> {
    pub(super) core: Arc<Core<E>>,
    state: Mutex<CacheState<E>>,
}

struct CacheState<E> {
    st: State<E>,
    /// Most bytes this cache may hold (its reservation).
    reserve: usize,
    /// Given back (its thread exited, or the pool closed): every use goes to the depot.
    detached: bool,
}

/// A thread's caches, one per pool it used; given back when the thread exits.
pub(crate) struct ThreadCaches<E: GpuEvent>(RefCell<Vec<Arc<ThreadCache<E>>>>);

impl<E: GpuEvent> ThreadCaches<E> {
    pub(crate) const fn new() -> Self {
        ThreadCaches(RefCell::new(Vec::new()))
    }
}

impl<E: GpuEvent> Drop for ThreadCaches<E> {
    fn drop(&mut self) {
        for c in self.0.get_mut().drain(..) {
            c.detach();
        }
    }
}

/// Blocks to give back to the driver, and pending blocks to wait for first, once no lock is
/// held.
struct Release<E> {
    free: Vec<Block>,
    wait: Vec<Pending<E>>,
}

impl<E> Release<E> {
    fn none() -> Self {
        Release {
            free: Vec::new(),
            wait: Vec::new(),
        }
    }
}

/// Bytes a thread's cache of a pool bounded by `max` reserves: a quarter of the bound's share
/// per core, at most 64 MiB; none when that would not hold a few small blocks.
fn per_thread_bytes(max: usize) -> usize {
    let cores = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .clamp(1, 64);
    let b = (max / (4 * cores)).min(64 << 20);
    if b < 4 * MIN_CLASS {
        0
    } else {
        b
    }
}

impl<E: GpuEvent> Core<E> {
    pub(super) fn new(config: PinnedPoolConfig, make: MakeFn) -> Arc<Core<E>> {
        Arc::new(Core {
            config,
            per_thread: per_thread_bytes(config.max_cached_bytes),
            make,
            depot: Mutex::new(Depot {
                st: State::new(),
                closed: false,
            }),
            registry: Mutex::new(Registry {
                caches: Vec::new(),
                closed: false,
            }),
            reserved: AtomicUsize::new(0),
        })
    }

    /// The calling thread's cache of this pool, registered on first use; `None` once the pool
    /// is closed, or while the thread's cache list is being torn down (thread exit).
    pub(super) fn my_cache(self: &Arc<Self>) -> Option<Arc<ThreadCache<E>>> {
        E::caches()
            .try_with(|tls| {
                {
                    let list = tls.0.try_borrow().ok()?;
                    if let Some(c) = list.iter().find(|c| Arc::ptr_eq(&c.core, self)) {
                        return Some(c.clone());
                    }
                }
                let c = self.register()?;
                let Ok(mut list) = tls.0.try_borrow_mut() else {
                    c.detach();
                    return None;
                };
                // Caches of closed pools (detached) let their cores go.
                let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut *list)
                    .into_iter()
                    .partition(|c| !c.is_detached());
                *list = keep;
                list.push(c.clone());
                drop(list);
                drop(gone);
                Some(c)
            })
            .ok()
            .flatten()
    }

    /// A new cache for the calling thread, with a reservation where the bound has room for
    /// one; `None` once the pool is closed.
    fn register(self: &Arc<Self>) -> Option<Arc<ThreadCache<E>>> {
        let mut reg = lock(&self.registry);
        if reg.closed {
            return None;
        }
        reg.caches.retain(|w| w.strong_count() > 0);
        let half = self.config.max_cached_bytes / 2;
        let reserve = if self.per_thread > 0
            && self.reserved.load(Ordering::Relaxed) + self.per_thread <= half
        {
            self.reserved.fetch_add(self.per_thread, Ordering::Relaxed);
            self.per_thread
        } else {
            0
        };
        let c = Arc::new(ThreadCache {
            core: self.clone(),
            state: Mutex::new(CacheState {
                st: State::new(),
                reserve,
                detached: false,
            }),
        });
        reg.caches.push(Arc::downgrade(&c));
        drop(reg);
        if reserve > 0 {
            // The depot's share of the bound shrank.
            let r = self.settle(&mut lock(&self.depot));
            self.release(r);
        }
        Some(c)
    }

    /// Every registered cache (strong references: drop them with no lock held).
    fn snapshot(&self) -> Vec<Arc<ThreadCache<E>>> {
        lock(&self.registry)
            .caches
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Applies `f` to the counters of `mine` (the calling thread's cache) or, without one or
    /// once it is detached, to the depot's.
    pub(super) fn count(&self, mine: Option<&ThreadCache<E>>, f: impl FnOnce(&mut Counters)) {
        if let Some(c) = mine {
            let mut cs = lock(&c.state);
            if !cs.detached {
                f(&mut cs.st.c);
                return;
            }
        }
        let r = {
            let mut d = lock(&self.depot);
            f(&mut d.st.c);
            if d.closed {
                self.settle(&mut d)
            } else {
                Release::none()
            }
        };
        self.release(r);
    }

    /// A cached block of `key`: from `mine` (the calling thread's cache), else from the depot
    /// (refilling `mine` in a batch), else stolen from another thread's cache. Blocks whose GPU
    /// work has completed are moved to the free lists on the way.
    pub(super) fn take(&self, mine: Option<&ThreadCache<E>>, key: Key) -> Option<Block> {
        if let Some(c) = mine {
            let mut cs = lock(&c.state);
            if !cs.detached {
                if let Some(b) = cs.st.take(key) {
                    return Some(b);
                }
                if !cs.st.pending.is_empty() {
                    cs.st.poll(E::done);
                    if let Some(b) = cs.st.take(key) {
                        return Some(b);
                    }
                }
                let mut d = lock(&self.depot);
                d.st.poll(E::done);
                if let Some(b) = d.st.take(key) {
                    let room = (cs.reserve as i64 - cs.st.c.cached).max(0) as usize;
                    let extra = if key.class <= cs.reserve {
                        (room / key.class).min(REFILL - 1)
                    } else {
                        0
                    };
                    for _ in 0..extra {
                        match d.st.take_free(key) {
                            Some(x) => cs.st.put_free(key, x),
                            None => break,
                        }
                    }
                    return Some(b);
                }
                drop(d);
                drop(cs);
                return self.steal(mine, key);
            }
        }
        {
            let mut d = lock(&self.depot);
            d.st.poll(E::done);
            if let Some(b) = d.st.take(key) {
                return Some(b);
            }
        }
        self.steal(mine, key)
    }

    /// A free block of `key` from another thread's cache.
    fn steal(&self, mine: Option<&ThreadCache<E>>, key: Key) -> Option<Block> {
        let others = self.snapshot();
        let mut got = None;
        for c in &others {
            if mine.is_some_and(|m| std::ptr::eq(m, &**c)) {
                continue;
            }
            let mut cs = lock(&c.state);
            if cs.detached {
                continue;
            }
            got = cs.st.take(key);
            if got.is_none() && !cs.st.pending.is_empty() {
                cs.st.poll(E::done);
                got = cs.st.take(key);
            }
            if got.is_some() {
                break;
            }
        }
        drop(others);
        got
    }

    /// A new block of `key` with `flags`, counted as a miss (in `mine`'s counters where it
    /// has a cache). Out of memory: the cache is emptied and the call retried once.
    pub(super) fn make(
        &self,
        mine: Option<&ThreadCache<E>>,
        key: Key,
        flags: HostAllocFlags,
    ) -> Result<Block> {
        let class = key.class as i64;
        self.count(mine, |c| {
            c.misses += 1;
            c.in_use += class;
        });
        let strategy = self.config.strategy;
        let made = match (self.make)(key.class, flags, strategy) {
            Err(e) if e.is_out_of_memory() => {
                self.count(mine, |c| c.oom_retries += 1);
                let _ = self.trim(0);
                (self.make)(key.class, flags, strategy)
            }
            r => r,
        };
        match made {
            Ok((block, t)) => {
                self.count(mine, |c| {
                    c.driver_allocs += 1;
                    c.driver_time += t;
                });
                Ok(block)
            }
            Err(e) => {
                self.count(mine, |c| c.in_use -= class);
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

    /// Takes back a block handed out for `key`, free at once or once `events` have completed:
    /// into `mine` (the calling thread's cache) where it fits, else into the depot. A block
    /// freed because of the bound that fails to free is counted as leaked, not reported: it
    /// need not be this block.
    pub(super) fn give_back(
        &self,
        mine: Option<&ThreadCache<E>>,
        key: Key,
        block: Block,
        events: Vec<E>,
    ) {
        if let Some(c) = mine {
            let mut cs = lock(&c.state);
            if !cs.detached && key.class <= cs.reserve {
                cs.st.give_back(key, block, events);
                if cs.st.c.cached > cs.reserve as i64 {
                    let r = self.flush(&mut cs);
                    drop(cs);
                    self.release(r);
                }
                return;
            }
        }
        let r = {
            let mut d = lock(&self.depot);
            d.st.give_back(key, block, events);
            self.settle(&mut d)
        };
        self.release(r);
    }

    /// Moves a cache over its reservation down to half of it: its largest free blocks, then
    /// (if still over) its oldest pending blocks, to the depot, in one batch. Returns what the
    /// depot gives up in turn, to release once the cache's lock is dropped.
    fn flush(&self, cs: &mut CacheState<E>) -> Release<E> {
        cs.st.poll(E::done);
        let keep = cs.reserve / 2;
        let shed = cs.st.shed(keep);
        let mut pending = Vec::new();
        while cs.st.c.cached > keep as i64 && !cs.st.pending.is_empty() {
            let p = cs.st.pending.remove(0);
            cs.st.c.cached -= p.key.class as i64;
            pending.push(p);
        }
        let mut d = lock(&self.depot);
        for (k, b) in shed {
            d.st.put_free(k, b);
        }
        for p in pending {
            d.st.put_pending(p);
        }
        self.settle(&mut d)
    }

    /// What the depot must give up: past its share of the bound, its largest free blocks;
    /// once the pool is closed, every free block, and once no buffer is left, the pending
    /// blocks (to wait for, then free).
    fn settle(&self, d: &mut Depot<E>) -> Release<E> {
        let mut r = Release::none();
        if d.closed {
            d.st.poll(E::done);
            r.free = d.st.evict(usize::MAX).0;
            if d.st.c.in_use <= 0 {
                for p in std::mem::take(&mut d.st.pending) {
                    d.st.c.cached -= p.key.class as i64;
                    r.wait.push(p);
                }
            }
            return r;
        }
        let share = self
            .config
            .max_cached_bytes
            .saturating_sub(self.reserved.load(Ordering::Relaxed)) as i64;
        if d.st.c.cached > share {
            d.st.poll(E::done);
            r.free = d.st.evict((d.st.c.cached - share) as usize).0;
        }
        r
    }

    /// Frees what [`settle`](Self::settle) gave up, with no lock held; failures are counted as
    /// leaked blocks.
    fn release(&self, r: Release<E>) {
        if r.free.is_empty() && r.wait.is_empty() {
            return;
        }
        let mut blocks = r.free;
        let mut leaked = 0;
        for p in r.wait {
            if p.events.iter().all(E::wait) {
                blocks.push(p.block);
            } else {
                leaked += 1; // the GPU may still use it
            }
        }
        let (failed, _) = self.free_blocks(blocks);
        if leaked + failed > 0 {
            lock(&self.depot).st.c.leaked += leaked + failed;
        }
    }

    /// Gives blocks back to the driver (no lock held); returns how many failed (each leaked)
    /// and the first error.
    fn free_blocks(&self, blocks: Vec<Block>) -> (u64, Result<()>) {
        if blocks.is_empty() {
            return (0, Ok(()));
        }
        let t = Instant::now();
        let n = blocks.len() as u64;
        let (mut failed, mut first) = (0, Ok(()));
        for b in blocks {
            if let Err(e) = b.free() {
                failed += 1;
                first = first.and(Err(e));
            }
        }
        let mut d = lock(&self.depot);
        d.st.c.driver_frees += n - failed;
        d.st.c.driver_time += t.elapsed();
        (failed, first)
    }

    /// Gives free blocks back to the driver, largest first, until at most `keep` bytes are
    /// cached in all (blocks still waiting for GPU work stay); returns the bytes given back.
    /// Thread caches are emptied into the depot first when that is needed.
    pub(super) fn trim(&self, keep: usize) -> Result<usize> {
        let caches = self.snapshot();
        let mut total = 0i64;
        for c in &caches {
            let mut cs = lock(&c.state);
            if cs.detached {
                continue;
            }
            cs.st.poll(E::done);
            total += cs.st.c.cached;
        }
        total += lock(&self.depot).st.c.cached;
        if total <= keep as i64 {
            return Ok(0);
        }
        let mut in_caches = 0i64;
        for c in &caches {
            let mut cs = lock(&c.state);
            if cs.detached {
                continue;
            }
            let shed = cs.st.shed(0);
            in_caches += cs.st.c.cached; // pending blocks, which stay
            let mut d = lock(&self.depot);
            for (k, b) in shed {
                d.st.put_free(k, b);
            }
        }
        let (blocks, bytes) = {
            let mut d = lock(&self.depot);
            d.st.poll(E::done);
            let excess = (d.st.c.cached + in_caches - keep as i64).max(0) as usize;
            d.st.evict(excess)
        };
        drop(caches);
        let (failed, first) = self.free_blocks(blocks);
        if failed > 0 {
            lock(&self.depot).st.c.leaked += failed;
        }
        first.map(|()| bytes)
    }

    /// The counters over every thread's cache and the depot, after moving blocks whose GPU
    /// work has completed to the free lists.
    pub(super) fn stats(&self) -> PinnedPoolStats {
        let caches = self.snapshot();
        let mut sum = Counters::default();
        let mut pending = 0;
        for c in &caches {
            let mut cs = lock(&c.state);
            if cs.detached {
                continue;
            }
            cs.st.poll(E::done);
            pending += cs.st.pending.len();
            sum.add(&cs.st.c);
        }
        {
            let mut d = lock(&self.depot);
            d.st.poll(E::done);
            pending += d.st.pending.len();
            sum.add(&d.st.c);
        }
        drop(caches);
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

    /// Closes the pool (its last handle is gone): drains every thread's cache into the depot
    /// and frees what can be freed; see the module docs.
    pub(super) fn close(&self) {
        let caches = {
            let mut reg = lock(&self.registry);
            reg.closed = true;
            reg.caches
                .iter()
                .filter_map(Weak::upgrade)
                .collect::<Vec<_>>()
        };
        for c in &caches {
            c.detach();
        }
        let r = {
            let mut d = lock(&self.depot);
            d.closed = true;
            self.settle(&mut d)
        };
        self.release(r);
        drop(caches);
    }

    /// The bytes a thread's cache reserves (for the tests).
    #[cfg(test)]
    pub(super) fn per_thread(&self) -> usize {
        self.per_thread
    }

    /// Bytes reserved by thread caches (for the tests).
    #[cfg(test)]
    pub(super) fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }
}

impl<E: GpuEvent> ThreadCache<E> {
    fn is_detached(&self) -> bool {
        lock(&self.state).detached
    }

    /// Gives the cache back to the pool: its blocks and counters to the depot, its
    /// reservation to the bound. Every later use goes to the depot. Idempotent.
    pub(super) fn detach(&self) {
        let core = &self.core;
        let r = {
            let mut cs = lock(&self.state);
            if cs.detached {
                return;
            }
            cs.detached = true;
            let reserve = std::mem::take(&mut cs.reserve);
            let moved = cs.st.drain();
            let mut d = lock(&core.depot);
            d.st.absorb(moved);
            core.reserved.fetch_sub(reserve, Ordering::Relaxed);
            core.settle(&mut d)
        };
        core.release(r);
        let me: *const Self = self;
        lock(&core.registry).caches.retain(|w| w.as_ptr() != me);
    }
}

impl<E: GpuEvent> Drop for ThreadCache<E> {
    /// A cache is detached before its last reference goes (thread exit, pool close); this
    /// only makes sure of it.
    fn drop(&mut self) {
        self.detach();
    }
}

impl<E: GpuEvent> Drop for Core<E> {
    /// Frees every block left (no thread cache is: each holds the core): a pending one after
    /// waiting for its events (leaked if that wait fails). Errors are ignored: drop never
    /// panics.
    fn drop(&mut self) {
        let d = self.depot.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, blocks) in std::mem::take(&mut d.st.free) {
            for b in blocks {
                let _ = b.free();
            }
        }
        for p in std::mem::take(&mut d.st.pending) {
            if p.events.iter().all(E::wait) {
                let _ = p.block.free();
            }
        }
    }
}
