//! Host-side speed (issue 10): the caching pinned pool (reuse, flags as key, stream-aware
//! reuse, the bound), fast cold pinning (mmap + threaded populate + cudaHostRegister) and
//! staged pageable copies (bit-exact at odd lengths and offsets, ordered after pending GPU
//! work, an error midway is the call's error and leaks no staging buffer).

use std::time::Instant;

use cuda_mem::{
    copy, copy_async, copy_range, copy_staged, pointer_info, DeviceBuffer, DirectionConfig,
    ErrorCode, HostAllocFlags as F, Misuse, PinStrategy, PinnedBuffer, PinnedPool,
    PinnedPoolConfig, PointerKind, Slice as _, Stager, StagingConfig, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::gpu_or_skip;

use crate::{pattern, QUICK, SPIN};

#[test]
fn pinned_pool_reuses_blocks_by_size_class_and_flags() {
    let _dev = gpu_or_skip!();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let n = 5000; // a 20 000-byte request: class 20 480
    let data = pattern(n, 3);
    let a = pool.from_slice(&data, F::DEFAULT).unwrap();
    let addr = a.as_ptr() as usize;
    // Data goes through the device and back.
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    copy(&mut dev, &a).unwrap();
    assert_eq!(dev.to_vec().unwrap(), data);
    drop(a);
    let s = pool.stats();
    assert_eq!((s.hits, s.misses, s.in_use_bytes), (0, 1, 0));
    assert_eq!(s.cached_bytes, 20_480);
    // Same class, other length: the same block.
    let b = pool.alloc::<u8>(19_000, F::DEFAULT).unwrap();
    assert_eq!(b.as_ptr() as usize, addr);
    assert_eq!(b.len(), 19_000);
    // Other flags never get it.
    let m = pool.alloc::<u8>(19_000, F::MAPPED).unwrap();
    assert_ne!(m.as_ptr() as usize, addr);
    assert_eq!(m.flags(), F::MAPPED);
    assert_eq!(
        pointer_info(m.as_ptr()).unwrap().kind,
        PointerKind::PinnedHost,
        "pool blocks are pinned host memory"
    );
    let s = pool.stats();
    assert_eq!((s.hits, s.misses), (1, 2));
    assert_eq!(s.in_use_bytes, 2 * 20_480);
    drop((b, m));
    // Zeroed allocation of a reused block is zero.
    let z = pool.alloc_zeroed::<u32>(n, F::DEFAULT).unwrap();
    assert!(z.as_slice().unwrap().iter().all(|&v| v == 0));
    assert_eq!(pool.stats().hits, 2);
    drop(z);
    assert_eq!(pool.empty().unwrap(), 2 * 20_480);
    let s = pool.stats();
    assert_eq!((s.cached_bytes, s.driver_frees), (0, 2));
}

/// The pool must not hand out a block that an asynchronous copy still reads: the held stream
/// copies block A to the device after a long kernel; A is dropped at once (without waiting)
/// and a new allocation of the same size is written with other data. The device must see A's
/// data. Without the events of A's fence, the new allocation would get A's block back and
/// its writes would reach the device.
#[test]
fn pinned_pool_never_reuses_a_block_the_gpu_still_reads() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let n = 1 << 20;
    let (x, y) = (pattern(n, 41), pattern(n, 42));
    let s = Stream::non_blocking().unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let a = pool.from_slice(&x, F::DEFAULT).unwrap();
    let a_addr = a.as_ptr() as usize;
    probes.spin(SPIN, &s).unwrap();
    copy_async(&mut dev, &a, &s).unwrap();
    let t = Instant::now();
    drop(a);
    assert!(t.elapsed() < QUICK, "drop waited {:?}", t.elapsed());
    assert!(!s.is_idle().unwrap(), "the held stream finished first");
    assert_eq!(pool.stats().pending_blocks, 1);
    let mut b = pool.alloc::<u32>(n, F::DEFAULT).unwrap();
    let reused_early = b.as_ptr() as usize == a_addr;
    b.as_mut_slice().unwrap().copy_from_slice(&y);
    s.synchronize().unwrap();
    assert!(
        dev.to_vec().unwrap() == x,
        "the device saw data written into a reused block (block reused early: {reused_early})"
    );
    assert!(!reused_early, "a pending block was handed out");
    // Once the copy is done, the block is reusable.
    drop(b);
    let s2 = pool.stats();
    assert_eq!(s2.pending_blocks, 0);
    let c = pool.alloc::<u32>(n, F::DEFAULT).unwrap();
    let d = pool.alloc::<u32>(n, F::DEFAULT).unwrap();
    let got = [c.as_ptr() as usize, d.as_ptr() as usize];
    assert!(got.contains(&a_addr), "A's block came back after its copy");
    assert_eq!(pool.stats().misses, 2, "no third block was made");
}

#[test]
fn pinned_pool_keeps_to_its_bound_and_trims() {
    let _dev = gpu_or_skip!();
    let pool = PinnedPool::new(PinnedPoolConfig {
        max_cached_bytes: 64 << 10,
        strategy: PinStrategy::HostAlloc,
    });
    let bufs: Vec<PinnedBuffer<u8>> = (0..4)
        .map(|_| pool.alloc(32 << 10, F::DEFAULT).unwrap())
        .collect();
    assert_eq!(pool.stats().in_use_bytes, 128 << 10);
    drop(bufs);
    let s = pool.stats();
    assert_eq!(s.cached_bytes, 64 << 10, "{s:?}");
    assert_eq!(s.driver_frees, 2);
    assert_eq!(pool.trim(32 << 10).unwrap(), 32 << 10);
    assert_eq!(pool.stats().cached_bytes, 32 << 10);
    // Bad input is an error, not a panic.
    let e = pool.alloc::<u8>(0, F::DEFAULT).unwrap_err();
    assert!(matches!(e.misuse(), Some(Misuse::ZeroLength { .. })), "{e}");
    let e = pool.alloc::<u64>(usize::MAX / 4, F::DEFAULT).unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::SizeOverflow { .. })),
        "{e}"
    );
    let e = pool.alloc::<u8>(usize::MAX / 2, F::DEFAULT).unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::SizeOverflow { .. })),
        "{e}"
    );
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[test]
fn map_register_pins_memory_that_copies_and_maps() {
    let dev = gpu_or_skip!();
    let n = (48 << 20) / 4 + 5; // not a multiple of the 2 MiB mapping granularity
    let data = pattern(n, 7);
    for (flags, huge) in [
        (F::DEFAULT, true),
        (F::DEFAULT, false),
        (F::PORTABLE | F::MAPPED, true),
    ] {
        let strategy = PinStrategy::MapRegister {
            threads: 8,
            huge_pages: huge,
        };
        let mut h = PinnedBuffer::<u32>::with_strategy(n, flags, strategy).unwrap();
        assert!(h.as_slice().unwrap().iter().all(|&v| v == 0), "zeroed");
        let info = pointer_info(h.as_ptr()).unwrap();
        assert_eq!(
            info.kind,
            PointerKind::PinnedHost,
            "{flags} huge={huge}: pinned"
        );
        h.as_mut_slice().unwrap().copy_from_slice(&data);
        let s = Stream::non_blocking().unwrap();
        let mut d = DeviceBuffer::<u32>::zeroed(n).unwrap();
        copy_async(&mut d, &h, &s).unwrap();
        let mut back = PinnedBuffer::<u32>::with_strategy(n, flags, strategy).unwrap();
        copy_async(&mut back, &d, &s).unwrap();
        assert!(back.as_slice().unwrap() == data, "{flags} huge={huge}");
        if flags.contains(F::MAPPED) {
            // The GPU reads it in place through its device address.
            let probes = Probes::load().unwrap();
            let sum = probes.xor_checksum(&h, &s).unwrap();
            let want = data.iter().fold(0u32, |a, &v| a ^ v);
            assert_eq!(sum, want);
        }
        let _ = dev;
    }
    let wc = PinnedBuffer::<u8>::with_strategy(
        4 << 20,
        F::WRITE_COMBINED,
        PinStrategy::MapRegister {
            threads: 2,
            huge_pages: false,
        },
    )
    .unwrap_err();
    assert!(
        matches!(wc.misuse(), Some(Misuse::InvalidArgument { .. }))
            && wc.to_string().contains("write-combined"),
        "{wc}"
    );
}

fn small_stager(pool: &PinnedPool) -> Stager {
    Stager::new(
        StagingConfig {
            threads: 3,
            chunk_bytes: 64 << 10,
            min_chunk_bytes: 64 << 10,
            chunks_per_thread: 4,
            depth: 2,
            to_device: DirectionConfig {
                min_bytes: 0,
                nt_stores: true,
            },
            to_host: DirectionConfig {
                min_bytes: 0,
                nt_stores: true,
            },
        },
        pool.clone(),
    )
    .unwrap()
}

#[test]
fn staged_copies_are_bit_exact_at_odd_lengths_and_offsets() {
    let _dev = gpu_or_skip!();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let st = small_stager(&pool);
    for len in [1usize, 4095, 65_536, 65_537, 3 * 65_536 + 1, 1_000_003] {
        let src: Vec<u8> = (0..len).map(|i| (i * 31 + i / 977) as u8).collect();
        let mut dev = DeviceBuffer::<u8>::zeroed(len + 13).unwrap();
        // Unaligned starts on both sides.
        st.copy_range(&mut dev, 13, &src, 0, len).unwrap();
        let all = dev.to_vec().unwrap();
        assert!(all[..13].iter().all(|&b| b == 0), "{len}: before the range");
        assert!(all[13..] == src[..], "{len}: to the device");
        let mut back = vec![0u8; len + 7];
        st.copy_range(&mut back, 7, &dev, 13, len).unwrap();
        assert!(back[..7].iter().all(|&b| b == 0));
        assert!(back[7..] == src[..], "{len}: back to the host");
    }
    assert!(
        pool.stats().hits + pool.stats().misses > 0,
        "the copies did not go through the staging buffers"
    );
    // Typed, through a view, whole-buffer form.
    let n = 777_777;
    let data = pattern(n, 9);
    let mut dev = DeviceBuffer::<u32>::zeroed(n + 100).unwrap();
    st.copy(&mut dev.slice_mut(50..50 + n).unwrap(), &data)
        .unwrap();
    let mut out = vec![0u32; n];
    st.copy(&mut out, &dev.slice(50..50 + n).unwrap()).unwrap();
    assert!(out == data);
    assert_eq!(
        pool.stats().in_use_bytes,
        0,
        "every staging buffer went back"
    );
}

#[test]
fn staged_copies_wait_for_pending_gpu_work() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let st = small_stager(&pool);
    let n = 1 << 20;
    let (x, y) = (pattern(n, 51), pattern(n, 52));
    let s = Stream::non_blocking().unwrap();
    let xs = PinnedBuffer::from_slice(&x, F::DEFAULT).unwrap();
    // A held stream writes `x` into the buffer late; the staged copy of `y` must land after
    // it (so `y` stays), and a staged read must see `y`.
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    probes.spin(SPIN / 3, &s).unwrap();
    copy_async(&mut dev, &xs, &s).unwrap();
    st.copy(&mut dev, &y).unwrap();
    assert!(
        dev.to_vec().unwrap() == y,
        "the staged write came before the pending one"
    );
    // A pending write, then a staged read.
    probes.spin(SPIN / 3, &s).unwrap();
    copy_async(&mut dev, &xs, &s).unwrap();
    let mut out = vec![0u32; n];
    st.copy(&mut out, &dev).unwrap();
    assert!(
        out == x,
        "the staged read did not wait for the pending write"
    );
}

#[test]
fn a_staged_copy_failing_midway_reports_it_and_leaks_no_staging_buffer() {
    let _dev = gpu_or_skip!();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let st = small_stager(&pool);
    let len = 40 * (64 << 10) + 3;
    let src: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    let mut dev = DeviceBuffer::<u8>::zeroed(len).unwrap();
    for to_device in [true, false] {
        cuda_mem::testing::fail_next_staged_copy_at(17);
        let e = if to_device {
            st.copy(&mut dev, &src).unwrap_err()
        } else {
            let mut out = vec![0u8; len];
            st.copy(&mut out, &dev).unwrap_err()
        };
        assert_eq!(
            e.code(),
            Some(ErrorCode(
                cuda_mem::sys::cudaError::cudaErrorLaunchFailure.0
            ))
        );
        assert!(e.to_string().contains("chunk 17"), "{e}");
        let s = pool.stats();
        assert_eq!(s.in_use_bytes, 0, "staging buffers leaked: {s:?}");
        assert_eq!(s.leaked_blocks, 0);
    }
    // The stager still works, bit-exact.
    st.copy(&mut dev, &src).unwrap();
    let mut out = vec![0u8; len];
    st.copy(&mut out, &dev).unwrap();
    assert!(out == src);
}

#[test]
fn copy_stages_large_pageable_copies_through_the_global_pool() {
    let _dev = gpu_or_skip!();
    let n = (64 << 20) / 4 + 1;
    let data = pattern(n, 61);
    let before = PinnedPool::global().stats();
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    copy(&mut dev, &data).unwrap();
    let mut out = vec![0u32; n];
    copy(&mut out, &dev).unwrap();
    assert!(out == data);
    let after = PinnedPool::global().stats();
    assert!(
        after.hits + after.misses > before.hits + before.misses,
        "copy did not stage: {after:?}"
    );
    // A slice that is in fact pinned is not staged (DMA copies it directly).
    let pinned = PinnedBuffer::from_slice(&data, F::DEFAULT).unwrap();
    let before = PinnedPool::global().stats();
    let mut dev3 = DeviceBuffer::<u32>::zeroed(n).unwrap();
    copy(&mut dev3, pinned.as_slice().unwrap()).unwrap();
    let after = PinnedPool::global().stats();
    assert!(dev3.to_vec().unwrap() == data);
    assert_eq!(
        after.hits + after.misses,
        before.hits + before.misses,
        "a pinned slice went through the staging buffers"
    );
    // The explicit call, and copy_range with offsets, agree.
    let mut out2 = vec![0u32; n - 2];
    copy_range(&mut out2, 0, &dev, 1, n - 2).unwrap();
    assert!(out2[..] == data[1..n - 1]);
    let mut dev2 = DeviceBuffer::<u32>::zeroed(n).unwrap();
    copy_staged(&mut dev2, &data).unwrap();
    assert!(dev2.to_vec().unwrap() == data);
}

#[test]
fn concurrent_staged_copies_from_several_threads_stay_apart() {
    let _dev = gpu_or_skip!();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let st = small_stager(&pool);
    std::thread::scope(|sc| {
        for t in 0..4u32 {
            let st = &st;
            sc.spawn(move || {
                let n = 300_001 + t as usize * 7;
                let data = pattern(n, 1000 + t);
                let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
                for _ in 0..5 {
                    st.copy(&mut dev, &data).unwrap();
                    let mut out = vec![0u32; n];
                    st.copy(&mut out, &dev).unwrap();
                    assert!(out == data, "thread {t}");
                }
            });
        }
    });
    assert_eq!(pool.stats().in_use_bytes, 0);
}

#[test]
fn into_raw_hands_over_pool_memory_and_refuses_mapped_memory() {
    let _dev = gpu_or_skip!();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let b = pool.from_slice(&pattern(1000, 5), F::DEFAULT).unwrap();
    let (p, len) = b.into_raw().unwrap();
    assert_eq!(len, 1000);
    assert_eq!(pool.stats().in_use_bytes, 0, "the block left the pool");
    // SAFETY: `p` is cudaHostAlloc memory of 1000 u32 now owned here, with no pending work.
    let back = unsafe { PinnedBuffer::from_raw(p, len, F::DEFAULT) }.unwrap();
    assert!(back.as_slice().unwrap() == pattern(1000, 5));
    back.free().unwrap(); // cudaFreeHost
    let m = PinnedBuffer::<u8>::with_strategy(
        4 << 20,
        F::DEFAULT,
        PinStrategy::MapRegister {
            threads: 2,
            huge_pages: true,
        },
    )
    .unwrap();
    let e = m.into_raw().unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::InvalidArgument { .. }))
            && e.to_string().contains("cudaFreeHost"),
        "{e}"
    );
}
