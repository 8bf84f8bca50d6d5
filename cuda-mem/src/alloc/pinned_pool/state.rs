//! The bookkeeping of one set of cached blocks (a thread's cache, or the pool's shared depot):
//! free lists by size class and flags, blocks waiting for GPU work, and counters. Generic over
//! the event type, so that it is testable without a GPU.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::alloc::pinning::Block;

/// Smallest size class: one page.
pub(super) const MIN_CLASS: usize = 4096;

/// The size class of a request of `bytes`: the next of four steps per power of two.
pub(super) fn class_of(bytes: usize) -> Option<usize> {
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
pub(super) struct Key {
    pub(super) class: usize,
    pub(super) flags: u32,
}

/// A block waiting for GPU work.
pub(super) struct Pending<E> {
    pub(super) key: Key,
    pub(super) block: Block,
    pub(super) events: Vec<E>,
}

/// Counters of one set of blocks. Byte counts are signed: a block taken from one set may
/// come back to another (another thread's cache); only the sum over the pool means anything.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counters {
    pub(super) hits: u64,
    pub(super) misses: u64,
    pub(super) cached: i64,
    pub(super) in_use: i64,
    pub(super) driver_allocs: u64,
    pub(super) driver_frees: u64,
    pub(super) driver_time: Duration,
    pub(super) oom_retries: u64,
    pub(super) leaked: u64,
}

impl Counters {
    pub(super) fn add(&mut self, c: &Counters) {
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

/// One set of cached blocks and its counters.
pub(super) struct State<E> {
    pub(super) free: BTreeMap<Key, Vec<Block>>,
    pub(super) pending: Vec<Pending<E>>,
    pub(super) c: Counters,
}

impl<E> State<E> {
    pub(super) const fn new() -> Self {
        State {
            free: BTreeMap::new(),
            pending: Vec::new(),
            c: Counters {
                hits: 0,
                misses: 0,
                cached: 0,
                in_use: 0,
                driver_allocs: 0,
                driver_frees: 0,
                driver_time: Duration::ZERO,
                oom_retries: 0,
                leaked: 0,
            },
        }
    }

    /// A cached block of `key`, counted in use (a hit).
    pub(super) fn take(&mut self, key: Key) -> Option<Block> {
        let block = self.take_free(key)?;
        self.c.hits += 1;
        self.c.in_use += key.class as i64;
        Some(block)
    }

    /// A free block of `key` taken out of this set (to move it to another set).
    pub(super) fn take_free(&mut self, key: Key) -> Option<Block> {
        let block = self.free.get_mut(&key)?.pop()?;
        self.c.cached -= key.class as i64;
        Some(block)
    }

    /// Adds a free block of `key` moved here from another set.
    pub(super) fn put_free(&mut self, key: Key, block: Block) {
        self.c.cached += key.class as i64;
        self.free.entry(key).or_default().push(block);
    }

    /// Adds a pending block moved here from another set.
    pub(super) fn put_pending(&mut self, p: Pending<E>) {
        self.c.cached += p.key.class as i64;
        self.pending.push(p);
    }

    /// Moves the pending blocks whose events have all completed to the free lists.
    #[inline]
    pub(super) fn poll(&mut self, done: impl Fn(&E) -> bool) {
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
    pub(super) fn give_back(&mut self, key: Key, block: Block, events: Vec<E>) {
        self.c.in_use -= key.class as i64;
        if events.is_empty() {
            self.put_free(key, block);
        } else {
            self.put_pending(Pending { key, block, events });
        }
    }

    /// Free blocks to give back to the driver, largest first, until they add up to `excess`
    /// bytes or none is left (pending blocks cannot go yet). Returns them and their bytes.
    pub(super) fn evict(&mut self, excess: usize) -> (Vec<Block>, usize) {
        let (mut out, mut bytes) = (Vec::new(), 0);
        while bytes < excess {
            let Some((key, b)) = self.pop_largest() else {
                break;
            };
            bytes += key.class;
            out.push(b);
        }
        (out, bytes)
    }

    /// Free blocks taken out, largest first, until at most `keep` bytes stay cached here (or
    /// no free block is left), to move them to another set.
    pub(super) fn shed(&mut self, keep: usize) -> Vec<(Key, Block)> {
        let mut out = Vec::new();
        while self.c.cached > keep as i64 {
            let Some(kb) = self.pop_largest() else {
                break;
            };
            out.push(kb);
        }
        out
    }

    /// The largest free block taken out (its bytes no longer counted cached here), emptied
    /// free lists removed on the way; `None` when no free block is left.
    fn pop_largest(&mut self) -> Option<(Key, Block)> {
        loop {
            let mut entry = self.free.last_entry()?;
            let key = *entry.key();
            match entry.get_mut().pop() {
                Some(b) => {
                    self.c.cached -= key.class as i64;
                    return Some((key, b));
                }
                None => {
                    entry.remove();
                }
            }
        }
    }

    /// Everything out: the free blocks, the pending ones and the counters (cached bytes
    /// included), leaving this set empty with zero counters.
    pub(super) fn drain(&mut self) -> (Vec<(Key, Block)>, Vec<Pending<E>>, Counters) {
        let free = std::mem::take(&mut self.free)
            .into_iter()
            .flat_map(|(k, v)| v.into_iter().map(move |b| (k, b)))
            .collect();
        let pending = std::mem::take(&mut self.pending);
        let c = std::mem::take(&mut self.c);
        (free, pending, c)
    }

    /// Takes in what [`drain`](Self::drain) took out of another set.
    pub(super) fn absorb(
        &mut self,
        (free, pending, c): (Vec<(Key, Block)>, Vec<Pending<E>>, Counters),
    ) {
        for (k, b) in free {
            self.free.entry(k).or_default().push(b);
        }
        self.pending.extend(pending);
        self.c.add(&c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handles::flags::HostAllocFlags;

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

    /// Moving blocks between two sets (a thread's cache and the depot) keeps every byte
    /// counted once, and a pending block keeps its events on the way.
    #[test]
    fn shedding_and_draining_move_blocks_with_their_bytes_and_events() {
        let (mut cache, mut depot) = (State::<u32>::new(), State::<u32>::new());
        cache.c.in_use += 3 * 4096 + 8192;
        cache.give_back(key(8192), Block::fake(8192), vec![]);
        cache.give_back(key(4096), Block::fake(4096), vec![]);
        cache.give_back(key(4096), Block::fake(4096), vec![]);
        cache.give_back(key(4096), Block::fake(4096), vec![9]);
        assert_eq!(cache.c.cached, 20480);
        // Down to 8 KiB: the largest free blocks go first; the pending one stays.
        let shed = cache.shed(8192);
        assert_eq!(
            shed.iter().map(|(k, _)| k.class).collect::<Vec<_>>(),
            [8192, 4096]
        );
        for (k, b) in shed {
            depot.put_free(k, b);
        }
        assert_eq!((cache.c.cached, depot.c.cached), (8192, 12288));
        // Everything else over, counters included.
        let all = cache.drain();
        depot.absorb(all);
        assert_eq!(cache.c.cached, 0);
        assert_eq!(depot.c.cached, 20480);
        assert_eq!(depot.c.in_use, 0);
        assert_eq!(depot.pending.len(), 1);
        assert!(depot.take(key(4096)).is_some() && depot.take(key(4096)).is_some());
        assert!(depot.take(key(4096)).is_none(), "the pending one waits");
        depot.poll(|&e| e == 9);
        assert!(depot.take(key(4096)).is_some());
    }
}
