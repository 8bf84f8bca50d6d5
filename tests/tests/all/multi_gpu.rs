//! Two GPUs: every buffer, stream and event on its device whatever is current, PORTABLE pinned
//! and zero-copy memory from both GPUs, peer access and peer copies (ordered by both fences),
//! a memory pool of one GPU read and written by kernels of the other (`MemPool::set_access`),
//! the pipelined copy through pinned host memory, managed memory prefetched GPU to GPU to
//! host, and NCCL over cuda-mem buffers in one process and in two.
//!
//! Every test skips with a visible `SKIP` line on fewer than two GPUs (even with
//! `CUDA_MEM_REQUIRE_GPU=1`: one GPU is a machine these tests do not apply to), and fails on
//! two if anything is wrong.

use std::time::Duration;

use cuda_mem::{
    copy, copy_async, copy_peer, copy_peer_async, copy_peer_range_async, Attach, Device,
    DeviceBuffer, DevicePtr as _, DevicePtrMut as _, Event, HostAllocFlags, Location,
    ManagedBuffer, MappedBuffer, MemPool, Misuse, PinnedBuffer, PoolAccess, StagedCopy, Stream,
};
use cuda_mem_nccl::{Comm, Group, ReduceOp, UniqueId};
use cuda_mem_probes::Probes;

use super::pattern;

/// Devices 0 and 1, or `None` after a visible SKIP line.
fn two_gpus(test: &str) -> Option<(Device, Device)> {
    match Device::count() {
        Ok(n) if n >= 2 => Some((Device::get(0).unwrap(), Device::get(1).unwrap())),
        Ok(n) => {
            cuda_mem_tests::skip(&format!("{test}: needs two GPUs, found {n}"));
            None
        }
        Err(e) => {
            cuda_mem_tests::skip(&format!("{test}: needs two GPUs ({e})"));
            None
        }
    }
}

macro_rules! two_gpus_or_skip {
    ($name:literal) => {
        match two_gpus(concat!("multi_gpu::", $name)) {
            Some(d) => d,
            None => return,
        }
    };
}

/// `cm_write`'s pattern: 16-byte word `i` is `(i, i, i, i)`.
fn written(len_u32: usize) -> Vec<u32> {
    (0..len_u32).map(|k| (k / 4) as u32).collect()
}

fn on<T>(d: Device, f: impl FnOnce() -> T) -> T {
    let _g = d.guard().unwrap();
    f()
}

/// Queues `cm_write` over all of `buf` on `s` (of the current device) behind 50 ms of
/// `cm_spin`, through a write guard taken first: the write stays pending ~50 ms after return;
/// the guard has recorded it on `buf`, so later work on `buf` must be ordered after it.
fn slow_write(probes: &Probes, buf: &mut DeviceBuffer<u32>, s: &Stream) {
    let w = buf.device_ptr_mut(s).unwrap();
    let bytes = 4 * w.len();
    probes.spin(50_000_000, s).unwrap();
    // SAFETY: the guard covers all `bytes` of `buf` (allocations are 256-byte aligned; `write`
    // refuses a length that is not whole 16-byte words), used on its stream while it lives.
    unsafe { probes.write(w.as_mut_ptr().cast(), bytes, s) }.unwrap();
}

#[test]
fn every_buffer_stream_and_event_knows_its_device() {
    let (d0, d1) = two_gpus_or_skip!("every_buffer_stream_and_event_knows_its_device");
    d0.set_current().unwrap();
    for d in [d0, d1] {
        assert_eq!(DeviceBuffer::<u32>::uninit_on(d, 16).unwrap().device(), d);
        assert_eq!(Stream::on(d, true).unwrap().device(), d);
        assert_eq!(Event::on(d).unwrap().device(), d);
        let m = on(d, || {
            ManagedBuffer::<u32>::zeroed(16, Attach::Global).unwrap()
        });
        assert_eq!(m.device(), d);
        assert_eq!(
            Device::current().unwrap(),
            d0,
            "the constructors restore device 0"
        );
    }
    let (e0, s1) = (Event::on(d0).unwrap(), Stream::on(d1, true).unwrap());
    let err = e0.record(&s1).unwrap_err();
    assert_eq!(
        err.misuse(),
        Some(&Misuse::DeviceMismatch {
            op: "Event::record",
            expected: 0,
            found: 1
        })
    );
}

/// The calls on device-0 memory, made with device 1 current: each must run on device 0, give
/// exact data, and leave device 1 current.
fn device_zero_work_with_device_one_current(d0: Device, d1: Device) {
    d1.set_current().unwrap();
    let still = |what: &str| assert_eq!(Device::current().unwrap(), d1, "after {what}");
    let n = (1 << 20) + 12;
    let data = pattern(n, 41);
    let mut b0 = DeviceBuffer::<u32>::uninit_on(d0, n).unwrap();
    still("uninit_on");
    copy(&mut b0, &data).unwrap(); // H2D to device 0 from pageable memory
    still("copy H2D");
    assert_eq!(b0.to_vec().unwrap(), data);
    still("to_vec");
    // A synchronous H2D from pinned memory may return before it is done: it must be recorded
    // on device 0's legacy stream, so that a non-blocking stream of device 0 waits for it.
    let pinned = on(d0, || {
        PinnedBuffer::from_slice(&pattern(n, 42), HostAllocFlags::DEFAULT)
    })
    .unwrap();
    copy(&mut b0, &pinned).unwrap();
    still("copy from pinned");
    let s0 = Stream::on(d0, true).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::PORTABLE).unwrap();
    copy_async(&mut out, &b0, &s0).unwrap();
    still("copy_async on a device-0 stream");
    assert_eq!(out.as_slice().unwrap(), &pattern(n, 42)[..]);
    let e = Event::on(d0).unwrap();
    e.record(&s0).unwrap();
    still("Event::record");
    e.wait_on(&Stream::on(d1, true).unwrap()).unwrap();
    e.synchronize().unwrap();
    s0.synchronize().unwrap();
    still("synchronize");
    let mut m = on(d0, || ManagedBuffer::<u32>::zeroed(n, Attach::Global)).unwrap();
    m.prefetch(Location::Device(d0), &s0).unwrap();
    still("prefetch");
    m.free().unwrap();
    still("managed free");
    pinned.free().unwrap();
    still("pinned free");
    b0.free().unwrap();
    still("device free");
    drop(out);
    still("drop");
}

#[test]
fn frees_copies_and_records_run_on_the_buffers_device_and_restore_the_current_one() {
    let (d0, d1) = two_gpus_or_skip!("frees_copies_and_records_restore_the_current_device");
    device_zero_work_with_device_one_current(d0, d1);
    // On a fresh thread too (its current device starts at 0; the helper makes it 1).
    std::thread::spawn(move || device_zero_work_with_device_one_current(d0, d1))
        .join()
        .unwrap();
    d0.set_current().unwrap();
}

#[test]
fn portable_pinned_memory_is_copied_to_and_from_both_gpus() {
    let (d0, d1) = two_gpus_or_skip!("portable_pinned_memory_is_copied_to_and_from_both_gpus");
    let n = (4 << 20) + 4;
    let src = on(d0, || {
        PinnedBuffer::from_slice(&pattern(n, 7), HostAllocFlags::PORTABLE)
    })
    .unwrap();
    for d in [d0, d1] {
        let s = Stream::on(d, true).unwrap();
        let mut dev = DeviceBuffer::<u32>::uninit_on(d, n).unwrap();
        let mut back = on(d0, || {
            PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::PORTABLE)
        })
        .unwrap();
        copy_async(&mut dev, &src, &s).unwrap();
        copy_async(&mut back, &dev, &s).unwrap();
        assert_eq!(
            back.as_slice().unwrap(),
            src.as_slice().unwrap(),
            "via device {d:?}"
        );
    }
}

#[test]
fn portable_mapped_memory_is_read_and_written_by_kernels_of_both_gpus() {
    let (d0, d1) = two_gpus_or_skip!("portable_mapped_memory_is_read_and_written_by_both_gpus");
    const TARGET: u32 = 0x1234_5678; // `cm_read` counts threads whose words XOR to this
    let words = 4096;
    let mut buf = on(d0, || {
        MappedBuffer::<u32>::zeroed(4 * words, HostAllocFlags::PORTABLE)
    })
    .unwrap();
    for (d, every) in [(d0, 3usize), (d1, 5usize)] {
        // Word w (one per thread of the grid) XORs to TARGET only when w % every == 0.
        for (w, chunk) in buf.as_mut_slice().unwrap().chunks_mut(4).enumerate() {
            let x = if w % every == 0 { TARGET } else { w as u32 + 1 };
            chunk.copy_from_slice(&[x, 0, 0, 0]);
        }
        let _g = d.guard().unwrap();
        let probes = Probes::load().unwrap();
        let s = Stream::non_blocking().unwrap();
        let mut sink = DeviceBuffer::<u64>::zeroed(1).unwrap();
        {
            let r = buf.device_ptr(&s).unwrap();
            let k = sink.device_ptr_mut(&s).unwrap();
            // SAFETY: the mapped buffer's device pointer covers `words` 16-byte words and the
            // sink one u64, used on the guards' stream while they live.
            unsafe { probes.read(r.as_ptr().cast(), 16 * words, k.as_mut_ptr(), &s) }.unwrap();
        }
        let expect = words.div_ceil(every) as u64;
        assert_eq!(
            sink.to_vec().unwrap(),
            vec![expect],
            "kernel reads on {d:?}"
        );
        {
            let w = buf.device_ptr_mut(&s).unwrap();
            // SAFETY: as above; the guard records the write, host access waits for it.
            unsafe { probes.write(w.as_mut_ptr().cast(), 16 * words, &s) }.unwrap();
        }
        assert_eq!(
            buf.as_slice().unwrap(),
            &written(4 * words)[..],
            "kernel writes on {d:?}"
        );
    }
}

#[test]
fn peer_access_is_queried_enabled_twice_and_disabled() {
    let (d0, d1) = two_gpus_or_skip!("peer_access_is_queried_enabled_twice_and_disabled");
    let (a, b) = (
        d0.can_access_peer(d1).unwrap(),
        d1.can_access_peer(d0).unwrap(),
    );
    eprintln!("multi_gpu: can_access_peer 0->1 {a}, 1->0 {b}");
    let same = d0.can_access_peer(d0).unwrap_err();
    assert!(
        matches!(same.misuse(), Some(Misuse::InvalidArgument { .. })),
        "{same}"
    );
    d1.set_current().unwrap();
    if a {
        d0.enable_peer_access(d1).unwrap();
        d0.enable_peer_access(d1).unwrap(); // twice: not an error
        assert_eq!(Device::current().unwrap(), d1);
        d0.disable_peer_access(d1).unwrap();
        d0.disable_peer_access(d1).unwrap(); // not enabled: not an error either
    } else {
        cuda_mem_tests::skip("multi_gpu: devices 0 and 1 have no peer access; enable untested");
    }
    assert_eq!(Device::current().unwrap(), d1);
    d0.set_current().unwrap();
}

/// A pool of device 0 that device 1 is given access to (`MemPool::set_access`; no peer access
/// enabled: pools grant it themselves): device 1 starts without access, is refused read-only
/// access (`cudaErrorNotSupported`), gets read and write; its kernels read what the host put into a pooled buffer of device 0 and write
/// it, ordered after the allocation on device 0's stream, and the host sees the writes. The
/// free on device 0's stream comes after device 1's work.
#[test]
fn a_pool_of_device_zero_is_read_and_written_by_kernels_of_device_one() {
    let (d0, d1) = two_gpus_or_skip!("a_pool_of_device_zero_is_read_and_written_by_device_one");
    if !d1.can_access_peer(d0).unwrap() {
        cuda_mem_tests::skip("multi_gpu: device 1 cannot access device 0; pool access untested");
        return;
    }
    d0.set_current().unwrap();
    let pool = MemPool::new(d0).unwrap();
    assert_eq!(pool.access(d0).unwrap(), PoolAccess::READ_WRITE);
    assert_eq!(pool.access(d1).unwrap(), PoolAccess::NONE);
    // Read-only access is not offered for device pools (seen on the H200s, driver 580): the
    // exact error, and nothing changed.
    let e = pool.set_access(d1, PoolAccess::READ).unwrap_err();
    assert_eq!(
        e.code(),
        Some(cuda_mem::ErrorCode(
            cuda_mem::sys::cudaError::cudaErrorNotSupported.0
        )),
        "{e}"
    );
    assert_eq!(pool.access(d1).unwrap(), PoolAccess::NONE);
    pool.set_access(d1, PoolAccess::READ_WRITE).unwrap();
    assert_eq!(pool.access(d1).unwrap(), PoolAccess::READ_WRITE);

    let words = 4096; // 16-byte words
    let s0 = Stream::on(d0, true).unwrap();
    let data = pattern(4 * words, 11);
    let mut buf = DeviceBuffer::<u32>::from_pool(&pool, 4 * words, &s0).unwrap();
    assert_eq!(buf.device(), d0);
    buf.copy_from(&data[..]).unwrap();

    // Device 1 current: its kernels on its stream use device 0's pool memory.
    let _g = d1.guard().unwrap();
    let probes = Probes::load().unwrap();
    let s1 = Stream::non_blocking().unwrap();
    assert_eq!(s1.device(), d1);
    let want = data.iter().fold(0, |x, &w| x ^ w);
    assert_eq!(
        probes.xor_checksum(&buf, &s1).unwrap(),
        want,
        "device 1 reads device 0's pool"
    );
    {
        let w = buf.device_ptr_mut(&s1).unwrap();
        // SAFETY: the guard covers the buffer's `words` 16-byte words (pool allocations are
        // 256-byte aligned), used on its stream while it lives; it records the kernel, so host
        // access and the free wait for it.
        unsafe { probes.write(w.as_mut_ptr().cast(), 16 * words, &s1) }.unwrap();
    }
    assert_eq!(
        buf.to_vec().unwrap(),
        written(4 * words),
        "device 1 writes device 0's pool"
    );
    assert_eq!(Device::current().unwrap(), d1);
    buf.free().unwrap();

    // Dropped while device 1's slow write is still queued: the free on device 0's stream waits
    // for it on the device, so once s0 has reached the free, s1 is done too.
    let mut buf = DeviceBuffer::<u32>::from_pool(&pool, 4 * words, &s0).unwrap();
    slow_write(&probes, &mut buf, &s1);
    drop(buf);
    s0.synchronize().unwrap();
    assert!(
        s1.is_idle().unwrap(),
        "the free on device 0 did not wait for device 1's write"
    );
    assert_eq!(pool.used().unwrap(), 0);
    assert_eq!(Device::current().unwrap(), d1);
}

#[test]
fn peer_copies_move_exact_data_both_ways_with_and_without_peer_access() {
    let (d0, d1) = two_gpus_or_skip!("peer_copies_move_exact_data_both_ways");
    let n = (3 << 20) + 5;
    let peer = d0.can_access_peer(d1).unwrap() && d1.can_access_peer(d0).unwrap();
    for access in [false, true] {
        if access && !peer {
            continue;
        }
        for (a, b) in [(d0, d1), (d1, d0)] {
            if access {
                a.enable_peer_access(b).unwrap();
                b.enable_peer_access(a).unwrap();
            } else {
                a.disable_peer_access(b).unwrap();
                b.disable_peer_access(a).unwrap();
            }
            let seed = a.ordinal() as u32 * 10 + access as u32;
            let src = on(a, || DeviceBuffer::from_slice(&pattern(n, seed))).unwrap();
            let mut dst = on(b, || DeviceBuffer::from_slice(&pattern(n, 99))).unwrap();
            let s = Stream::on(a, true).unwrap();
            copy_peer_async(&mut dst, &src, &s).unwrap();
            assert_eq!(
                dst.to_vec().unwrap(),
                pattern(n, seed),
                "{a:?}->{b:?} async"
            );
            // Ranges: only [10, 10 + 1000) of dst changes, from src[77..].
            let mut dst2 = on(b, || DeviceBuffer::from_slice(&pattern(n, 98))).unwrap();
            copy_peer_range_async(&mut dst2, 10, &src, 77, 1000, &s).unwrap();
            let mut want = pattern(n, 98);
            want[10..1010].copy_from_slice(&pattern(n, seed)[77..1077]);
            assert_eq!(dst2.to_vec().unwrap(), want, "{a:?}->{b:?} range");
            // Synchronous, with the other device current.
            b.set_current().unwrap();
            let mut dst3 = on(b, || DeviceBuffer::<u32>::zeroed(n)).unwrap();
            copy_peer(&mut dst3, &src).unwrap();
            assert_eq!(Device::current().unwrap(), b);
            assert_eq!(
                dst3.to_vec().unwrap(),
                pattern(n, seed),
                "{a:?}->{b:?} sync"
            );
            let short = on(b, || DeviceBuffer::<u32>::zeroed(n - 1)).unwrap();
            let mut short = short;
            let e = copy_peer(&mut short, &src).unwrap_err();
            assert!(
                matches!(e.misuse(), Some(Misuse::LengthMismatch { .. })),
                "{e}"
            );
            d0.set_current().unwrap();
        }
    }
}

#[test]
fn peer_copies_wait_for_pending_work_on_both_buffers() {
    let (d0, d1) = two_gpus_or_skip!("peer_copies_wait_for_pending_work_on_both_buffers");
    let words = 1 << 16;
    let n = 4 * words;
    let p0 = on(d0, || Probes::load().unwrap());
    let p1 = on(d1, || Probes::load().unwrap());
    // Source side: a slow kernel on device 0 writes src; the copy on a device-1 stream must
    // wait for it (else it copies the old contents).
    let mut src = on(d0, || DeviceBuffer::from_slice(&pattern(n, 1))).unwrap();
    let mut dst = on(d1, || DeviceBuffer::from_slice(&pattern(n, 2))).unwrap();
    let (s0, s1) = (Stream::on(d0, true).unwrap(), Stream::on(d1, true).unwrap());
    on(d0, || slow_write(&p0, &mut src, &s0));
    copy_peer_async(&mut dst, &src, &s1).unwrap();
    assert_eq!(
        dst.to_vec().unwrap(),
        written(n),
        "copy after the writer of its source"
    );
    // Destination side: a slow kernel on device 1 writes dst; a copy into dst on a device-0
    // stream must land after it (else the kernel overwrites the copy).
    let fresh = on(d0, || DeviceBuffer::from_slice(&pattern(n, 3))).unwrap();
    on(d1, || slow_write(&p1, &mut dst, &s1));
    copy_peer_async(&mut dst, &fresh, &s0).unwrap();
    assert_eq!(
        dst.to_vec().unwrap(),
        pattern(n, 3),
        "copy after the writer of its destination"
    );
}

#[test]
fn staged_copies_through_host_memory_move_exact_data() {
    let (d0, d1) = two_gpus_or_skip!("staged_copies_through_host_memory_move_exact_data");
    for (a, b) in [(d0, d1), (d1, d0)] {
        let mut staged = StagedCopy::new(a, b, 1 << 20, 3).unwrap();
        // Several copies back to back reuse the ring's slots: each must arrive intact.
        let sizes = [(5 << 18) + 3, 1, 1 << 18, (3 << 20) / 4 + 7];
        let srcs: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| on(a, || DeviceBuffer::from_slice(&pattern(n, 50 + i as u32))))
            .collect::<Result<_, _>>()
            .unwrap();
        let mut dsts: Vec<_> = sizes
            .iter()
            .map(|&n| DeviceBuffer::<u32>::zeroed_on(b, n))
            .collect();
        for (dst, src) in dsts.iter_mut().zip(&srcs) {
            staged.copy(dst, src).unwrap();
        }
        for (i, dst) in dsts.iter().enumerate() {
            assert_eq!(
                dst.to_vec().unwrap(),
                pattern(sizes[i], 50 + i as u32),
                "{a:?}->{b:?} #{i}"
            );
        }
        // Ordered after a slow writer of the source on another stream.
        let words = 1 << 16;
        let mut src = on(a, || DeviceBuffer::<u32>::zeroed(4 * words)).unwrap();
        let pa = on(a, || Probes::load().unwrap());
        let sa = Stream::on(a, true).unwrap();
        on(a, || slow_write(&pa, &mut src, &sa));
        let mut dst = DeviceBuffer::<u32>::zeroed_on(b, 4 * words);
        staged.copy(&mut dst, &src).unwrap();
        assert_eq!(
            dst.to_vec().unwrap(),
            written(4 * words),
            "{a:?}->{b:?} ordered"
        );
        // Buffers on the wrong devices are refused.
        let e = staged.copy_range(&mut dst, 0, &dsts[0], 0, 1).unwrap_err();
        assert!(
            matches!(e.misuse(), Some(Misuse::DeviceMismatch { .. })),
            "{e}"
        );
    }
    assert!(StagedCopy::new(d0, d1, 0, 4).is_err());
    assert!(StagedCopy::new(d0, d1, 1 << 20, 1).is_err());
}

trait ZeroedOn: Sized {
    fn zeroed_on(d: Device, n: usize) -> Self;
}

impl ZeroedOn for DeviceBuffer<u32> {
    fn zeroed_on(d: Device, n: usize) -> Self {
        on(d, || DeviceBuffer::zeroed(n)).unwrap()
    }
}

#[test]
fn managed_memory_is_prefetched_to_each_gpu_then_to_the_host() {
    let (d0, d1) = two_gpus_or_skip!("managed_memory_is_prefetched_to_each_gpu_then_the_host");
    let n = 4 << 20;
    let mut m = on(d0, || ManagedBuffer::<u32>::zeroed(n, Attach::Global)).unwrap();
    if !m.has_concurrent_access() {
        cuda_mem_tests::skip("multi_gpu: no concurrent managed access; prefetch test skipped");
        return;
    }
    m.as_mut_slice().unwrap().copy_from_slice(&pattern(n, 8));
    let (s0, s1) = (Stream::on(d0, true).unwrap(), Stream::on(d1, true).unwrap());
    for (to, s) in [
        (Location::Device(d0), &s0),
        (Location::Device(d1), &s1),
        (Location::Host, &s0),
    ] {
        m.prefetch(to, s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(
            m.last_prefetch_location().unwrap(),
            Some(to),
            "after prefetch to {to:?}"
        );
    }
    assert_eq!(m.as_slice().unwrap(), &pattern(n, 8)[..]);
}

/// Element-wise wrapping sum of two patterns (NCCL sums `u32` with wrap-around).
fn summed(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter().zip(b).map(|(x, y)| x.wrapping_add(*y)).collect()
}

/// The collectives one rank runs and checks, rank `r` of two, with `issue` queueing each on
/// the rank's communicator (directly, or through a group for all ranks at once).
fn check_nccl_two_ranks(comms: &[Comm], n: usize) {
    let streams: Vec<Stream> = comms
        .iter()
        .map(|c| Stream::on(c.device(), true).unwrap())
        .collect();
    let ranks = || comms.iter().zip(&streams);
    let seed = |c: &Comm, base: u32| base + c.rank() as u32;
    let up = |c: &Comm, data: Vec<u32>| on(c.device(), || DeviceBuffer::from_slice(&data)).unwrap();

    // all-reduce (sum, in place): every rank ends with pattern(1) + pattern(2), bit-exact.
    let mut bufs: Vec<_> = ranks()
        .map(|(c, _)| up(c, pattern(n, seed(c, 1))))
        .collect();
    {
        let mut g = Group::start().unwrap();
        for ((c, s), b) in ranks().zip(bufs.iter_mut()) {
            g.all_reduce_in_place(c, b, ReduceOp::Sum, s).unwrap();
        }
        g.end().unwrap();
    }
    let want = summed(&pattern(n, 1), &pattern(n, 2));
    for b in &bufs {
        assert_eq!(b.to_vec().unwrap(), want, "all-reduce sum");
    }
    // all-reduce (max, out of place).
    let sends: Vec<_> = ranks()
        .map(|(c, _)| up(c, pattern(n, seed(c, 5))))
        .collect();
    {
        let mut g = Group::start().unwrap();
        for (((c, s), send), recv) in ranks().zip(&sends).zip(bufs.iter_mut()) {
            g.all_reduce(c, send, recv, ReduceOp::Max, s).unwrap();
        }
        g.end().unwrap();
    }
    let want: Vec<u32> = pattern(n, 5)
        .iter()
        .zip(pattern(n, 6))
        .map(|(a, b)| (*a).max(b))
        .collect();
    for b in &bufs {
        assert_eq!(b.to_vec().unwrap(), want, "all-reduce max");
    }
    // all-gather: rank r's part at [r * n, (r + 1) * n).
    let mut gathered: Vec<_> = ranks().map(|(c, _)| up(c, vec![0; 2 * n])).collect();
    {
        let mut g = Group::start().unwrap();
        for (((c, s), send), recv) in ranks().zip(&sends).zip(gathered.iter_mut()) {
            g.all_gather(c, send, recv, s).unwrap();
        }
        g.end().unwrap();
    }
    let mut want = pattern(n, 5);
    want.extend(pattern(n, 6));
    for b in &gathered {
        assert_eq!(b.to_vec().unwrap(), want, "all-gather");
    }
    // broadcast from rank 1.
    let mut bufs: Vec<_> = ranks()
        .map(|(c, _)| up(c, pattern(n, seed(c, 20))))
        .collect();
    {
        let mut g = Group::start().unwrap();
        for ((c, s), b) in ranks().zip(bufs.iter_mut()) {
            g.broadcast_in_place(c, b, 1, s).unwrap();
        }
        g.end().unwrap();
    }
    for b in &bufs {
        assert_eq!(b.to_vec().unwrap(), pattern(n, 21), "broadcast");
    }
    // Misuse: a stream of the other device is refused before NCCL sees it (nothing queued,
    // so the group ends empty).
    {
        let mut g = Group::start().unwrap();
        let last = &streams[streams.len() - 1];
        let e = g
            .all_reduce_in_place(&comms[0], &mut bufs[0], ReduceOp::Sum, last)
            .err();
        if comms.len() > 1 {
            assert!(e.is_some_and(|e| e.to_string().contains("stream is on device")));
        }
        g.end().unwrap();
    }
    // A direct collective on a communicator of `init_all` would wait forever for the other
    // ranks: refused, pointing to `Group`.
    if comms.len() > 1 {
        let e = comms[0]
            .all_reduce_in_place(&mut bufs[0], ReduceOp::Sum, &streams[0])
            .unwrap_err();
        assert!(e.to_string().contains("Comm::init_all"), "{e}");
        assert!(e.to_string().contains("Group"), "{e}");
    }
}

/// NCCL loads only where the launcher exported `NCCL_NVLS_ENABLE=0` (cuda-mem-nccl never
/// changes the environment). Where it is unset, runs `test` again in a child process with it
/// set and returns `false` (the test is done); `true` where this process may run it.
fn nvls_off_or_rerun(test: &str) -> bool {
    if std::env::var_os("NCCL_NVLS_ENABLE").is_some() {
        return true;
    }
    eprintln!("multi_gpu: NCCL_NVLS_ENABLE unset: {test} runs in a child with it set to 0");
    let (ok, out) =
        cuda_mem_tests::run_child(test, &[("NCCL_NVLS_ENABLE", "0")], Duration::from_secs(240))
            .unwrap();
    assert!(ok && out.contains("1 passed"), "{test} in a child:\n{out}");
    false
}

/// Refused while a group is open on the thread, so that no collective outlives its borrows
/// (NCCL only queues it at `ncclGroupEnd`): the direct collectives, a nested group, and
/// creating communicators. `comm` is a communicator of `init_rank`.
fn direct_collectives_are_refused_in_a_group(comm: &Comm, s: &Stream) {
    let mut buf = on(comm.device(), || DeviceBuffer::<u32>::zeroed(1024)).unwrap();
    let g = Group::start().unwrap();
    let e = comm
        .all_reduce_in_place(&mut buf, ReduceOp::Sum, s)
        .unwrap_err();
    assert!(e.to_string().contains("a Group is open"), "{e}");
    let e = comm.broadcast_in_place(&mut buf, 0, s).unwrap_err();
    assert!(e.to_string().contains("a Group is open"), "{e}");
    drop(buf); // what the refusal protects: freed before ncclGroupEnd
    let e = Group::start().unwrap_err();
    assert!(e.to_string().contains("already open"), "{e}");
    let id = UniqueId::from_bytes(&[0; 128]).unwrap();
    let e = Comm::init_rank(comm.device(), 2, 0, &id).unwrap_err();
    assert!(e.to_string().contains("a Group is open"), "{e}");
    g.end().unwrap();
}

#[test]
fn nccl_collectives_in_one_process_are_bit_exact() {
    let (d0, d1) = two_gpus_or_skip!("nccl_collectives_in_one_process_are_bit_exact");
    if !nvls_off_or_rerun("multi_gpu::nccl_collectives_in_one_process_are_bit_exact") {
        return;
    }
    d0.set_current().unwrap();
    let comms = Comm::init_all(&[d0, d1]).unwrap();
    assert_eq!(Device::current().unwrap(), d0);
    assert_eq!((comms[1].rank(), comms[1].nranks()), (1, 2));
    check_nccl_two_ranks(&comms, (8 << 20) + 3);
    check_nccl_two_ranks(&comms, 1);
    // Inside an open group nothing else is issued on this thread; the group still works after.
    {
        let g = Group::start().unwrap();
        assert!(Group::start().is_err(), "a nested group");
        assert!(Comm::init_all(&[d0, d1]).is_err(), "init_all in a group");
        g.end().unwrap();
    }
    check_nccl_two_ranks(&comms, 5);
}

/// One rank of the two-process test: runs only in a child started by
/// `nccl_two_processes_share_the_unique_id_through_a_file` (env `RANK`,
/// `CUDA_MEM_NCCL_ID_FILE`), and is a no-op otherwise.
#[test]
fn nccl_rank() {
    let (Ok(rank), Ok(file)) = (
        std::env::var("RANK"),
        std::env::var("CUDA_MEM_NCCL_ID_FILE"),
    ) else {
        return;
    };
    let rank: i32 = rank.parse().unwrap();
    let path = std::path::PathBuf::from(file);
    // The same path as ranks on different hosts: rank 0 makes the id, the others read it.
    let id = if rank == 0 {
        let id = UniqueId::new().unwrap();
        id.write_file(&path).unwrap();
        id
    } else {
        UniqueId::read_file(&path, Duration::from_secs(60)).unwrap()
    };
    let device = Device::get(rank).unwrap();
    let comm = Comm::init_rank(device, 2, rank, &id).unwrap();
    let s = Stream::on(device, true).unwrap();
    direct_collectives_are_refused_in_a_group(&comm, &s);
    let n = (16 << 20) + 1;
    let up = |data: Vec<u32>| on(device, || DeviceBuffer::from_slice(&data)).unwrap();
    let mut b = up(pattern(n, 1 + rank as u32));
    comm.all_reduce_in_place(&mut b, ReduceOp::Sum, &s).unwrap();
    assert_eq!(
        b.to_vec().unwrap(),
        summed(&pattern(n, 1), &pattern(n, 2)),
        "all-reduce"
    );
    let send = up(pattern(n, 5 + rank as u32));
    let mut recv = up(vec![0; 2 * n]);
    comm.all_gather(&send, &mut recv, &s).unwrap();
    let mut want = pattern(n, 5);
    want.extend(pattern(n, 6));
    assert_eq!(recv.to_vec().unwrap(), want, "all-gather");
    let mut b = up(pattern(n, 20 + rank as u32));
    comm.broadcast_in_place(&mut b, 0, &s).unwrap();
    assert_eq!(b.to_vec().unwrap(), pattern(n, 20), "broadcast");
    // A registered buffer takes part like any other, directly and in a group.
    let nccl = cuda_mem_nccl::nccl().unwrap();
    match comm.register(up(pattern(n, 30 + rank as u32))) {
        Ok(mut r) => {
            comm.all_reduce_in_place(&mut r, ReduceOp::Sum, &s).unwrap();
            let want = summed(&pattern(n, 30), &pattern(n, 31));
            assert_eq!(r.to_vec().unwrap(), want, "registered");
            let mut g = Group::start().unwrap();
            g.broadcast_in_place(&comm, &mut r, 1, &s).unwrap();
            g.end().unwrap();
            assert_eq!(
                r.to_vec().unwrap(),
                want,
                "registered, broadcast in a group"
            );
            println!("nccl rank {rank}: registered buffer ok");
        }
        // The one documented "not offered" answer: an NCCL older than 2.19, without
        // ncclCommRegister. Any other failure is a failure.
        Err(cuda_mem_nccl::Error::Unsupported(why)) => {
            println!("nccl rank {rank}: registration not supported: {why}")
        }
        Err(e) => panic!("nccl rank {rank}: ncclCommRegister failed: {e}"),
    }
    println!("nccl rank {rank} ok (NCCL {})", nccl.version_string());
}

#[test]
fn nccl_two_processes_share_the_unique_id_through_a_file() {
    two_gpus_or_skip!("nccl_two_processes_share_the_unique_id_through_a_file");
    let file = std::env::temp_dir().join(format!("cuda-mem-nccl-id-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let f = file.to_str().unwrap().to_string();
    // The children inherit NCCL_NVLS_ENABLE from the launcher; set to 0 where it is unset (a
    // value other than 0 makes them fail, naming it).
    let nvls_unset = std::env::var_os("NCCL_NVLS_ENABLE").is_none();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            let f = f.clone();
            std::thread::spawn(move || {
                let r = rank.to_string();
                let mut env = vec![("RANK", r.as_str()), ("CUDA_MEM_NCCL_ID_FILE", &f)];
                if nvls_unset {
                    env.push(("NCCL_NVLS_ENABLE", "0"));
                }
                cuda_mem_tests::run_child("multi_gpu::nccl_rank", &env, Duration::from_secs(240))
            })
        })
        .collect();
    for (rank, c) in children.into_iter().enumerate() {
        let (ok, out) = c.join().unwrap().unwrap();
        assert!(ok, "rank {rank} failed:\n{out}");
        assert!(
            out.contains(&format!("nccl rank {rank} ok")),
            "rank {rank}:\n{out}"
        );
        eprint!(
            "{}",
            out.lines()
                .filter(|l| l.starts_with("nccl rank"))
                .map(|l| format!("{l}\n"))
                .collect::<String>()
        );
    }
    let _ = std::fs::remove_file(&file);
}

/// Arguments NCCL would misuse are refused before any NCCL call, each with its exact message:
/// no devices, a rank outside the communicator, mismatched lengths, a receive buffer of the
/// wrong size, a root outside the communicator, a buffer on another rank's device.
#[test]
fn nccl_refuses_bad_arguments_with_exact_errors() {
    let (d0, d1) = two_gpus_or_skip!("nccl_refuses_bad_arguments_with_exact_errors");
    if !nvls_off_or_rerun("multi_gpu::nccl_refuses_bad_arguments_with_exact_errors") {
        return;
    }
    d0.set_current().unwrap();
    let e = Comm::init_all(&[]).unwrap_err();
    assert_eq!(e.to_string(), "Comm::init_all: no devices");
    let id = UniqueId::new().unwrap();
    let e = Comm::init_rank(d0, 2, 2, &id).unwrap_err();
    assert_eq!(e.to_string(), "Comm::init_rank: rank 2 is not in 0..2");
    let comms = Comm::init_all(&[d0, d1]).unwrap();
    let s0 = Stream::on(d0, true).unwrap();
    let send = on(d0, || DeviceBuffer::<u32>::zeroed(4)).unwrap();
    let mut recv = on(d0, || DeviceBuffer::<u32>::zeroed(5)).unwrap();
    let mut recv2 = on(d0, || DeviceBuffer::<u32>::zeroed(5)).unwrap();
    let mut buf = on(d0, || DeviceBuffer::<u32>::zeroed(4)).unwrap();
    let elsewhere = on(d1, || DeviceBuffer::<u32>::zeroed(5)).unwrap();
    let mut recv3 = on(d0, || DeviceBuffer::<u32>::zeroed(5)).unwrap();
    let mut g = Group::start().unwrap();
    let e = g
        .all_reduce(&comms[0], &send, &mut recv, ReduceOp::Sum, &s0)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "ncclAllReduce: send has 4 elements, receive 5"
    );
    let e = g.all_gather(&comms[0], &send, &mut recv2, &s0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "ncclAllGather: the receive buffer needs 2 ranks x 4 elements, has 5"
    );
    let e = g
        .broadcast_in_place(&comms[0], &mut buf, 2, &s0)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "ncclBroadcast (in place): root 2 is not in 0..2"
    );
    let e = g
        .all_reduce(&comms[0], &elsewhere, &mut recv3, ReduceOp::Sum, &s0)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "ncclAllReduce: the send buffer is on device 1, the communicator's rank 0 on device 0"
    );
    g.end().unwrap();
}
