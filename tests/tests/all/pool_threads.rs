//! The pinned pool's per-thread caches on the GPU (issue 21 §2): many threads allocating,
//! copying through the device and freeing at once keep every buffer's data; a buffer freed on
//! another thread, or with GPU work pending, is not handed out early; the bound on cached
//! bytes covers the thread caches; a thread that exits gives its blocks back.

use std::time::Instant;

use cuda_mem::{
    copy_async, pointer_info, DeviceBuffer, HostAllocFlags as F, PinStrategy, PinnedPool,
    PinnedPoolConfig, PointerKind, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{gpu_or_skip, still_pending};

use crate::{pattern, QUICK, SPIN};

/// Eight threads, each on its own stream: a pool buffer with the thread's pattern goes to the
/// device and back into another pool buffer, over and over at several sizes; the first buffer
/// is dropped right after its copy is queued (its block pending), the second after the check.
/// A block handed to two buffers at once, or reused under a pending copy, shows as another
/// thread's pattern.
#[test]
fn pinned_pool_thread_storm_round_trips_every_threads_data() {
    let _dev = gpu_or_skip!();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let threads = 8u32;
    std::thread::scope(|sc| {
        for t in 0..threads {
            let pool = &pool;
            sc.spawn(move || {
                let s = Stream::non_blocking().unwrap();
                for r in 0..40u32 {
                    let n = [1000usize, 5000, 70_000, 300_000][(r % 4) as usize];
                    let want = pattern(n, t * 1000 + r);
                    let up = pool.from_slice(&want, F::DEFAULT).unwrap();
                    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
                    copy_async(&mut dev, &up, &s).unwrap();
                    drop(up); // pending until the copy is done
                    let mut down = pool.alloc::<u32>(n, F::DEFAULT).unwrap();
                    copy_async(&mut down, &dev, &s).unwrap();
                    assert!(
                        down.as_slice().unwrap() == want,
                        "thread {t} round {r}: another buffer's data"
                    );
                }
            });
        }
    });
    let st = pool.stats();
    assert_eq!(st.in_use_bytes, 0, "{st:?}");
    assert_eq!(st.leaked_blocks, 0, "{st:?}");
    assert!(st.hits > st.misses, "the caches were not used: {st:?}");
}

/// A buffer allocated on one thread, read by a copy held behind a slow kernel, and dropped on
/// another thread at once: that thread's next allocation of the size must not get its block
/// while the copy is pending (its writes would reach the device).
#[test]
fn pinned_pool_cross_thread_free_waits_for_pending_work() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let n = 1 << 18;
    let (x, y) = (pattern(n, 211), pattern(n, 212));
    let s = Stream::non_blocking().unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let a = pool.from_slice(&x, F::DEFAULT).unwrap();
    let a_addr = a.as_ptr() as usize;
    probes.spin(SPIN, &s).unwrap();
    copy_async(&mut dev, &a, &s).unwrap();
    let reused_early = std::thread::scope(|sc| {
        sc.spawn(|| {
            let t = Instant::now();
            drop(a); // on this thread: into its cache, pending
            assert!(t.elapsed() < QUICK, "drop waited {:?}", t.elapsed());
            still_pending(!s.is_idle().unwrap(), "the copy from A is pending");
            let mut b = pool.alloc::<u32>(n, F::DEFAULT).unwrap();
            b.as_mut_slice().unwrap().copy_from_slice(&y);
            b.as_ptr() as usize == a_addr
        })
        .join()
        .unwrap()
    });
    s.synchronize().unwrap();
    assert!(
        dev.to_vec().unwrap() == x,
        "the device saw data written into a reused block (reused early: {reused_early})"
    );
    assert!(!reused_early, "a pending block was handed out");
    assert_eq!(pool.stats().in_use_bytes, 0);
}

/// Stream-aware reuse under per-thread caching: a block dropped with a copy pending on one
/// stream is handed neither to this thread (its own cache) nor to another thread working on
/// another stream (the depot, or a steal from this thread's cache), until the copy is done;
/// then it is reused.
#[test]
fn pinned_pool_pending_block_goes_to_no_stream_early_under_thread_caches() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let n = 1 << 18;
    let x = pattern(n, 221);
    let s1 = Stream::non_blocking().unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let a = pool.from_slice(&x, F::DEFAULT).unwrap();
    let a_addr = a.as_ptr() as usize;
    // Held across the allocations of five threads below.
    probes.spin(2 * SPIN, &s1).unwrap();
    copy_async(&mut dev, &a, &s1).unwrap();
    drop(a);
    still_pending(!s1.is_idle().unwrap(), "the copy from A is pending");
    // This thread, on another stream.
    let s2 = Stream::non_blocking().unwrap();
    let mut mine = pool.alloc::<u32>(n, F::DEFAULT).unwrap();
    assert_ne!(
        mine.as_ptr() as usize,
        a_addr,
        "handed back to the same thread"
    );
    mine.as_mut_slice().unwrap().fill(0xdead_beef);
    let mut dev2 = DeviceBuffer::<u32>::zeroed(n).unwrap();
    copy_async(&mut dev2, &mine, &s2).unwrap();
    // Other threads, each on its own stream, several allocations each.
    // Each thread hands its device buffer back instead of dropping it: `cudaFree` waits for
    // the whole device, which would end the held copy before the check below.
    let (others, keep): (Vec<Vec<usize>>, Vec<DeviceBuffer<u32>>) = std::thread::scope(|sc| {
        (0..4)
            .map(|_| {
                sc.spawn(|| {
                    let s = Stream::non_blocking().unwrap();
                    let bufs: Vec<_> = (0..3)
                        .map(|_| {
                            let mut b = pool.alloc::<u32>(n, F::DEFAULT).unwrap();
                            b.as_mut_slice().unwrap().fill(0xbad0_bad0);
                            b
                        })
                        .collect();
                    let mut d = DeviceBuffer::<u32>::zeroed(n).unwrap();
                    for b in &bufs {
                        copy_async(&mut d, b, &s).unwrap();
                    }
                    (bufs.iter().map(|b| b.as_ptr() as usize).collect(), d)
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .unzip()
    });
    let others: Vec<usize> = others.into_iter().flatten().collect();
    still_pending(!s1.is_idle().unwrap(), "the copy from A is still pending");
    assert!(
        !others.contains(&a_addr),
        "another thread got the pending block"
    );
    drop(keep);
    s1.synchronize().unwrap();
    assert!(
        dev.to_vec().unwrap() == x,
        "the copy from A read overwritten data"
    );
    // Done: A's block comes back (to this thread's cache, or from the depot).
    drop(mine);
    s2.synchronize().unwrap();
    let got: Vec<_> = (0..16)
        .map(|_| pool.alloc::<u32>(n, F::DEFAULT).unwrap())
        .collect();
    assert!(
        got.iter().any(|b| b.as_ptr() as usize == a_addr),
        "A's block was not reused once its copy was done"
    );
}

/// The bound on cached bytes holds with every thread caching: sixteen threads each free
/// twenty 256 KiB blocks into a pool bounded at 4 MiB.
#[test]
fn pinned_pool_bound_covers_thread_caches() {
    let _dev = gpu_or_skip!();
    let max = 4 << 20;
    let pool = PinnedPool::new(PinnedPoolConfig {
        max_cached_bytes: max,
        strategy: PinStrategy::HostAlloc,
    });
    let barrier = std::sync::Barrier::new(16);
    std::thread::scope(|sc| {
        for _ in 0..16 {
            sc.spawn(|| {
                let bufs: Vec<_> = (0..20)
                    .map(|_| pool.alloc::<u8>(256 << 10, F::DEFAULT).unwrap())
                    .collect();
                barrier.wait();
                drop(bufs);
                let st = pool.stats();
                assert!(st.cached_bytes <= max, "{st:?}");
            });
        }
    });
    let st = pool.stats();
    assert!(st.cached_bytes <= max && st.cached_bytes > 0, "{st:?}");
    assert_eq!(
        st.driver_allocs - st.driver_frees,
        (st.cached_bytes / (256 << 10)) as u64,
        "every block beyond the bound went back to the driver: {st:?}"
    );
    assert_eq!(pool.empty().unwrap(), st.cached_bytes);
}

/// A thread that exits gives its cached blocks back to the pool: they show in the statistics
/// and serve the next thread without new `cudaHostAlloc` calls.
#[test]
fn pinned_pool_thread_exit_returns_its_blocks() {
    let _dev = gpu_or_skip!();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let addrs: Vec<usize> = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            let bufs: Vec<_> = (0..4)
                .map(|i| pool.from_slice(&pattern(10_000, i), F::DEFAULT).unwrap())
                .collect();
            bufs.iter().map(|b| b.as_ptr() as usize).collect()
        })
        .join()
        .unwrap()
    };
    let st = pool.stats();
    assert_eq!((st.in_use_bytes, st.misses), (0, 4), "{st:?}");
    assert_eq!(st.cached_bytes, 4 * 40_960, "{st:?}");
    let again: Vec<_> = std::thread::spawn({
        let pool = pool.clone();
        move || {
            // All four alive at once: each must be one of the exited thread's blocks.
            let bufs: Vec<_> = (0..4)
                .map(|_| pool.alloc::<u32>(10_000, F::DEFAULT).unwrap())
                .collect();
            bufs.iter()
                .map(|b| {
                    assert_eq!(
                        pointer_info(b.as_ptr()).unwrap().kind,
                        PointerKind::PinnedHost
                    );
                    b.as_ptr() as usize
                })
                .collect()
        }
    })
    .join()
    .unwrap();
    let mut want = addrs;
    want.sort_unstable();
    let mut got = again;
    got.sort_unstable();
    assert_eq!(got, want, "the exited thread's blocks were not reused");
    assert_eq!(pool.stats().misses, 4, "new blocks were made");
}
