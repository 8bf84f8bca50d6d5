//! Stream-ordered allocation from memory pools (issue 11): data stays bit-exact through pooled
//! device and host-pool pinned buffers, dropping one never waits for other streams, its free
//! is still ordered after every piece of work recorded on it, memory reused in stream order is
//! never corrupted, and out of memory trims, retries and names the pool.

use std::time::Instant;

use cuda_mem::{
    copy, copy_async, DeviceBuffer, HostAllocFlags, MemPool, Misuse, PinnedBuffer, PoolAccess,
    PoolLocation, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::gpu_or_skip;

use crate::{pattern, QUICK, SPIN};

fn pinned(data: &[u32]) -> PinnedBuffer<u32> {
    PinnedBuffer::from_slice(data, HostAllocFlags::DEFAULT).unwrap()
}

#[test]
fn pooled_device_buffers_carry_data_bit_exact() {
    let dev = gpu_or_skip!();
    let n = 4 << 20;
    let data = pattern(n, 11);
    let src = pinned(&data);
    let s = Stream::non_blocking().unwrap();
    for pool in [
        MemPool::new(dev).unwrap(),
        MemPool::default_for(dev).unwrap(),
    ] {
        assert_eq!(pool.location(), PoolLocation::Device(dev));
        // Asynchronous in and out on the allocation stream.
        let mut buf = DeviceBuffer::<u32>::from_pool(&pool, n, &s).unwrap();
        assert_eq!((buf.len(), buf.device()), (n, dev));
        assert!(buf.pool().is_some() && buf.alloc_stream().is_some());
        copy_async(&mut buf, &src, &s).unwrap();
        let mut out = pinned(&vec![0; n]);
        copy_async(&mut out, &buf, &s).unwrap();
        assert!(
            out.as_slice().unwrap() == data,
            "{pool:?}: async round trip"
        );
        // Synchronous copies (legacy stream) are ordered after the allocation stream.
        let mut other = DeviceBuffer::<u32>::from_pool(&pool, n, &s).unwrap();
        copy(&mut other, &buf).unwrap();
        assert!(other.to_vec().unwrap() == data, "{pool:?}: sync copy");
        let zero = DeviceBuffer::<u32>::zeroed_from_pool(&pool, n, &s).unwrap();
        assert!(zero.to_vec().unwrap().iter().all(|&x| x == 0));
        buf.free().unwrap();
        drop(other);
    }
    // The legacy default stream as the allocation stream.
    let pool = MemPool::new(dev).unwrap();
    let legacy = Stream::legacy_default();
    let mut buf = DeviceBuffer::<u32>::from_pool(&pool, n, &legacy).unwrap();
    buf.copy_from(&data[..]).unwrap();
    assert!(buf.to_vec().unwrap() == data);
    // Dropped on another thread, whose current device may differ.
    std::thread::spawn(move || drop(buf)).join().unwrap();
    legacy.synchronize().unwrap();
    assert_eq!(pool.used().unwrap(), 0);
}

#[test]
fn pool_statistics_threshold_reserve_and_trim() {
    let dev = gpu_or_skip!();
    let pool = MemPool::new(dev).unwrap();
    assert!(!pool.is_default());
    assert!(MemPool::default_for(dev).unwrap().is_default());
    assert_eq!(pool.release_threshold().unwrap(), u64::MAX);
    let s = Stream::non_blocking().unwrap();
    pool.reserve(64 << 20, &s).unwrap();
    s.synchronize().unwrap();
    let st = pool.stats().unwrap();
    assert!(st.reserved >= 64 << 20, "{st}");
    assert_eq!(st.used, 0, "{st}");
    assert!(st.used_high >= 64 << 20, "{st}");
    // Served from the reserve: the pool does not grow.
    let buf = DeviceBuffer::<u8>::from_pool(&pool, 1 << 20, &s).unwrap();
    assert!(pool.used().unwrap() >= 1 << 20);
    assert_eq!(pool.reserved().unwrap(), st.reserved);
    drop(buf);
    s.synchronize().unwrap();
    assert_eq!(pool.used().unwrap(), 0);
    // Kept over a synchronization (threshold at the maximum), given back by trim.
    dev.synchronize().unwrap();
    assert_eq!(pool.reserved().unwrap(), st.reserved);
    pool.trim(0).unwrap();
    assert_eq!(pool.reserved().unwrap(), 0);
    pool.reset_high_water().unwrap();
    assert_eq!(pool.stats().unwrap().used_high, 0);
    // A threshold of 0 gives the memory back at the next synchronization.
    pool.set_release_threshold(0).unwrap();
    assert_eq!(pool.release_threshold().unwrap(), 0);
    pool.reserve(8 << 20, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(pool.reserved().unwrap(), 0);
    assert_eq!(pool.access(dev).unwrap(), PoolAccess::READ_WRITE);
}

/// The target: a pooled buffer dropped while another stream runs a long kernel returns
/// without waiting for it (`cudaFree` may synchronize the whole device).
#[test]
fn dropping_a_pooled_buffer_does_not_wait_for_a_busy_stream() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let pool = MemPool::new(dev).unwrap();
    let [a, busy] = crate::streams();
    for alloc_stream in [&a, &Stream::legacy_default()] {
        let mut buf = DeviceBuffer::<u32>::from_pool(&pool, 1 << 20, alloc_stream).unwrap();
        buf.memset_async(7, alloc_stream).unwrap();
        alloc_stream.synchronize().unwrap();
        probes.spin(SPIN, &busy).unwrap();
        let t = Instant::now();
        drop(buf);
        let took = t.elapsed();
        assert!(!busy.is_idle().unwrap(), "the busy stream finished first");
        assert!(took < QUICK, "drop took {took:?}");
        // Allocating again while the kernel runs does not wait either.
        let t = Instant::now();
        let again = DeviceBuffer::<u32>::from_pool(&pool, 1 << 20, alloc_stream).unwrap();
        again.free().unwrap();
        assert!(t.elapsed() < QUICK, "alloc + free took {:?}", t.elapsed());
        assert!(!busy.is_idle().unwrap());
        busy.synchronize().unwrap();
    }
}

/// The free is queued without a host wait, yet ordered on the device after a copy that another
/// (held) stream still has to make out of the buffer: the memory reused on the allocation
/// stream right after is written only once that copy has read it.
#[test]
fn the_free_waits_on_the_device_for_work_on_other_streams() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let pool = MemPool::new(dev).unwrap();
    let n = 8 << 20;
    let data = pattern(n, 21);
    let src = pinned(&data);
    let mut out = pinned(&vec![0; n]);
    let [a, b] = crate::streams();
    let mut x = DeviceBuffer::<u32>::from_pool(&pool, n, &a).unwrap();
    copy_async(&mut x, &src, &a).unwrap();
    probes.spin(SPIN, &b).unwrap();
    copy_async(&mut out, &x, &b).unwrap(); // reads `x` after the spin
    let x_addr = x.as_ptr() as usize;
    let t = Instant::now();
    drop(x);
    let took = t.elapsed();
    assert!(took < QUICK, "drop waited {took:?} for the held stream");
    assert!(!b.is_idle().unwrap());
    let mut y = DeviceBuffer::<u32>::from_pool(&pool, n, &a).unwrap();
    let reused = y.as_ptr() as usize == x_addr;
    y.memset_async(0xff, &a).unwrap();
    assert!(
        out.as_slice().unwrap() == data,
        "the copy on the held stream saw memory reused by the pool (address reused: {reused})"
    );
    assert!(y.to_vec().unwrap().iter().all(|&v| v == u32::MAX));
    if !reused {
        eprintln!("NOTE pool did not hand the freed address back: ordering not exercised");
    }
}

/// Many buffers allocated, filled, read on another (held) stream and dropped at once, one
/// after the other: every read sees its own data, although the pool reuses the memory in
/// stream order while the reads are still pending.
#[test]
fn stream_ordered_reuse_does_not_corrupt_data() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let pool = MemPool::new(dev).unwrap();
    let n = 1 << 20;
    let rounds = 12;
    let srcs: Vec<_> = (0..rounds).map(|i| pinned(&pattern(n, 100 + i))).collect();
    let mut outs: Vec<_> = (0..rounds).map(|_| pinned(&vec![0; n])).collect();
    let [a, b] = crate::streams();
    probes.spin(SPIN / 3, &b).unwrap();
    let mut addrs = Vec::new();
    for (src, out) in srcs.iter().zip(&mut outs) {
        let mut buf = DeviceBuffer::<u32>::from_pool(&pool, n, &a).unwrap();
        addrs.push(buf.as_ptr() as usize);
        copy_async(&mut buf, src, &a).unwrap();
        copy_async(out, &buf, &b).unwrap();
        // Dropped with the read pending: freed on `a` after it, without a host wait.
    }
    for (i, out) in outs.iter().enumerate() {
        assert!(
            out.as_slice().unwrap() == pattern(n, 100 + i as u32),
            "round {i} (addresses {addrs:x?})"
        );
    }
    a.synchronize().unwrap();
    assert_eq!(pool.used().unwrap(), 0);
}

/// Allocation + free without a synchronize stays far below `cudaMalloc` + `cudaFree` (the
/// bench measures the exact figure; this only catches a hidden host or device wait).
#[test]
fn pooled_allocation_and_free_never_wait_for_the_device() {
    // Behaviour, not speed (the bench times it): a cudaMalloc + cudaFree pair may synchronize
    // the whole device; pooled pairs on a free stream must not wait for a kernel that holds
    // another stream.
    let dev = gpu_or_skip!();
    let probes = cuda_mem_probes::Probes::load().unwrap();
    let pool = MemPool::new(dev).unwrap();
    let s = Stream::non_blocking().unwrap();
    let busy = Stream::non_blocking().unwrap();
    pool.reserve(1 << 20, &s).unwrap();
    s.synchronize().unwrap();
    probes.spin(2_000_000_000, &busy).unwrap();
    for _ in 0..500 {
        DeviceBuffer::<u8>::from_pool(&pool, 4096, &s)
            .unwrap()
            .free()
            .unwrap();
    }
    assert!(
        !busy.is_idle().unwrap(),
        "500 pooled allocations and frees waited for a 2 s kernel on another stream"
    );
    s.synchronize().unwrap();
    busy.synchronize().unwrap();
}

#[test]
fn out_of_memory_trims_retries_and_names_the_pool() {
    let dev = gpu_or_skip!();
    let pool = MemPool::new(dev).unwrap();
    let s = Stream::non_blocking().unwrap();
    let keep = DeviceBuffer::<u8>::from_pool(&pool, 1 << 20, &s).unwrap();
    // All of the device's memory: never available (the context itself uses some), and still a
    // size the driver takes for a request rather than an invalid value.
    let (_, total) = dev.mem_info().unwrap();
    let e = DeviceBuffer::<u8>::from_pool(&pool, total, &s).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let text = e.to_string();
    for part in [
        "cudaMallocFromPoolAsync",
        "after trimming the pool and one retry",
        &format!("{:p}", pool.as_raw()),
        "used ",
        "reserved ",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    // The pool and the buffer it holds are fine afterwards.
    drop(keep);
    DeviceBuffer::<u8>::from_pool(&pool, 1 << 20, &s)
        .unwrap()
        .free()
        .unwrap();

    // A capped pool: its reserve is trimmed to make room, and a request beyond it fails.
    let cap = 64 << 20;
    let capped = match MemPool::with_max_size(dev, cap) {
        Ok(p) => p,
        Err(e) => {
            assert!(
                matches!(e.misuse(), Some(Misuse::Unsupported { .. })),
                "{e}"
            );
            cuda_mem_tests::skip(&format!("capped pool part: {e}"));
            return;
        }
    };
    DeviceBuffer::<u8>::from_pool(&capped, 48 << 20, &s)
        .unwrap()
        .free()
        .unwrap();
    s.synchronize().unwrap();
    assert!(capped.reserved().unwrap() >= 48 << 20);
    let big = DeviceBuffer::<u8>::from_pool(&capped, 60 << 20, &s).unwrap();
    let e = DeviceBuffer::<u8>::from_pool(&capped, 32 << 20, &s).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&format!("used {} bytes", 60u64 << 20)),
        "{text}"
    );
    drop(big);
}

#[test]
fn host_pool_pinned_buffers_or_unsupported() {
    let dev = gpu_or_skip!();
    let device_pool = MemPool::new(dev).unwrap();
    let s = Stream::non_blocking().unwrap();
    let e = PinnedBuffer::<u32>::from_pool(&device_pool, 16, &s).unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::InvalidArgument { .. })),
        "{e}"
    );
    let pool = match MemPool::host(dev) {
        Ok(p) => p,
        Err(e) => {
            assert!(
                matches!(e.misuse(), Some(Misuse::Unsupported { .. })),
                "{e}"
            );
            cuda_mem_tests::skip(&format!("host pools: {e}"));
            return;
        }
    };
    assert_eq!(pool.location(), PoolLocation::Host);
    assert_eq!(pool.access(dev).unwrap(), PoolAccess::READ_WRITE);
    let e = DeviceBuffer::<u32>::from_pool(&pool, 16, &s).unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::InvalidArgument { .. })),
        "{e}"
    );

    let n = 4 << 20;
    let data = pattern(n, 31);
    let mut host = PinnedBuffer::<u32>::from_pool(&pool, n, &s).unwrap();
    assert!(host.as_slice().unwrap().iter().all(|&x| x == 0));
    host.as_mut_slice().unwrap().copy_from_slice(&data);
    // Through the device and back, asynchronously and synchronously.
    let mut d = DeviceBuffer::<u32>::uninit(n).unwrap();
    copy_async(&mut d, &host, &s).unwrap();
    let mut back = PinnedBuffer::<u32>::from_pool(&pool, n, &s).unwrap();
    copy_async(&mut back, &d, &s).unwrap();
    assert!(back.as_slice().unwrap() == data, "async round trip");
    let mut back2 = PinnedBuffer::<u32>::from_pool(&pool, n, &s).unwrap();
    copy(&mut back2, &d).unwrap();
    assert!(back2.as_slice().unwrap() == data, "sync copy");

    // Dropping while another stream is held returns at once; the copy it feeds stays exact.
    let probes = Probes::load().unwrap();
    let b = Stream::non_blocking().unwrap();
    let mut d2 = DeviceBuffer::<u32>::zeroed(n).unwrap();
    probes.spin(SPIN, &b).unwrap();
    copy_async(&mut d2, &host, &b).unwrap();
    let t = Instant::now();
    drop(host);
    assert!(t.elapsed() < QUICK, "drop took {:?}", t.elapsed());
    assert!(!b.is_idle().unwrap());
    let mut reuse = PinnedBuffer::<u32>::from_pool(&pool, n, &s).unwrap();
    reuse.as_mut_slice().unwrap().fill(0xdead_beef);
    assert!(
        d2.to_vec().unwrap() == data,
        "the held copy saw reused host memory"
    );
    drop((back, back2, reuse));
    s.synchronize().unwrap();
    assert_eq!(pool.used().unwrap(), 0);
}

/// A pool handle dropped while its buffers live: the buffers keep it alive.
#[test]
fn buffers_keep_their_pool_alive() {
    let dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let pool = MemPool::new(dev).unwrap();
    let data = pattern(1 << 16, 41);
    let mut buf = DeviceBuffer::<u32>::from_pool(&pool, data.len(), &s).unwrap();
    drop(pool);
    buf.copy_from(&data[..]).unwrap();
    assert!(buf.to_vec().unwrap() == data);
    assert!(buf.pool().unwrap().used().unwrap() >= 1 << 18);
    let (p, len) = buf.into_raw().unwrap();
    assert_eq!(len, data.len());
    // SAFETY: `p` came from the pool (now destroyed once its memory is freed) and is freed
    // once here; cudaFree accepts pool memory.
    let code = unsafe { cuda_mem::sys::cudaFree(p.cast()) };
    assert_eq!(code, cuda_mem::sys::cudaError::cudaSuccess);
}
