//! Issue 19, the third soundness round: the holes an adversarial review found on the H200,
//! each as the program that showed it (which failed before its fix), and the rule they share:
//! `mem::forget` is safe, so no guard's destructor may be needed for soundness. A slow kernel
//! (`cm_spin`) holds a stream so that the work queued behind it is certainly still pending
//! when the next step runs.

use std::mem;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use cuda_mem::{
    copy_async, sys, testing, DeviceBuffer, DevicePtr as _, DevicePtrMut as _, HostAllocFlags,
    MappedBuffer, MemPool, Misuse, PinnedBuffer, PinnedPool, PinnedPoolConfig, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{gpu_or_skip, still_pending};

use crate::{first_not_written, pattern, SPIN};

/// `cudaStreamPerThread`, as C++ code (or code built with `--default-stream per-thread`)
/// hands it over.
const PER_THREAD: sys::cudaStream_t = 2usize as sys::cudaStream_t;

/// Queues a device-side copy of `bytes` bytes from `src` to `dst` on `stream` (the raw call
/// a kernel or another library would make through guards).
///
/// # Safety
/// Both addresses must be device-accessible memory of `bytes` bytes, alive until the copy
/// completes.
unsafe fn raw_copy(dst: *mut u32, src: *const u32, bytes: usize, stream: &Stream) {
    // SAFETY: the caller vouches for the memory; the stream is live.
    let code = unsafe {
        sys::cudaMemcpyAsync(
            dst.cast(),
            src.cast(),
            bytes,
            sys::cudaMemcpyKind::cudaMemcpyDefault,
            stream.as_raw(),
        )
    };
    assert_eq!(code, sys::cudaError::cudaSuccess);
}

/// Item 1: a value stored through `MappedBuffer::atomic` must never be overwritten by a copy
/// queued before it. (`atomic` skipped the fence altogether, for polling kernels, and so also
/// the copy: it landed after the store, 10/10 runs with 256 MiB.) A kernel that polls through
/// a read guard still runs beside the atomics: `a_running_kernel_sees_a_mapped_flag_the_host_sets`.
#[test]
fn an_atomic_store_is_not_overwritten_by_dma_queued_before_it() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 16 << 20; // 64 MiB
    let dev = DeviceBuffer::from_slice(&pattern(n, 1)).unwrap();
    let mut m = MappedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    let s = Stream::non_blocking().unwrap();
    for round in 0..3u32 {
        probes.spin(SPIN / 3, &s).unwrap();
        copy_async(&mut m, &dev, &s).unwrap();
        still_pending(
            !s.is_idle().unwrap(),
            "the copy into the mapped buffer is pending",
        );
        let x = 0xa70_0000 + round;
        m.atomic(n - 1).unwrap().store(x, Ordering::Release);
        assert_eq!(m.atomic(n - 1).unwrap().load(Ordering::Acquire), x);
        let got = m.as_slice().unwrap();
        assert_eq!(
            got[n - 1],
            x,
            "round {round}: the copy landed after the store"
        );
        assert_eq!(got[0], pattern(1, 1)[0], "the copy itself landed");
    }
}

/// Item 5: the per-thread default stream (`cudaStreamPerThread`) is a different stream on
/// every thread. The fence took two threads' per-thread streams for one (same handle) and
/// never ordered them: 16 Mi elements were stale in 5/5 runs. Thread A writes a buffer on its
/// per-thread stream behind a slow kernel and hands it over; thread B reads it on its own
/// per-thread stream and must see A's data: while A is still alive, and after A has exited.
#[test]
fn per_thread_default_streams_of_two_threads_are_ordered_as_two_streams() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 16 << 20;
    let data = pattern(n, 5);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    for (round, a_exits) in [false, true, false, true].into_iter().enumerate() {
        std::thread::scope(|sc| {
            let (buf_tx, buf_rx) = mpsc::channel();
            let (done_tx, done_rx) = mpsc::channel::<()>();
            let (src, probes) = (&src, &probes);
            let a = sc.spawn(move || {
                dev.set_current().unwrap();
                // SAFETY: this thread's per-thread default stream, a valid handle on it.
                let sa = unsafe { Stream::from_raw(PER_THREAD, dev) };
                let mut d = DeviceBuffer::<u32>::zeroed(n).unwrap();
                probes.spin(SPIN, &sa).unwrap();
                copy_async(&mut d, src, &sa).unwrap();
                still_pending(!sa.is_idle().unwrap(), "A's copy is pending");
                buf_tx.send(d).unwrap();
                // Stay alive (with this thread's stream) until told.
                let _ = done_rx.recv();
            });
            let d = buf_rx.recv().unwrap();
            if a_exits {
                drop(done_tx);
                a.join().unwrap();
                let back = sc
                    .spawn(move || read_on_this_threads_stream(dev, &d))
                    .join()
                    .unwrap();
                assert!(back == data, "round {round}: B read before A's copy landed");
            } else {
                let back = sc
                    .spawn(move || read_on_this_threads_stream(dev, &d))
                    .join()
                    .unwrap();
                drop(done_tx);
                assert!(back == data, "round {round}: B read before A's copy landed");
            }
        });
    }
}

/// Copies `d` to the host on the calling thread's per-thread default stream.
fn read_on_this_threads_stream(dev: cuda_mem::Device, d: &DeviceBuffer<u32>) -> Vec<u32> {
    dev.set_current().unwrap();
    // SAFETY: this thread's per-thread default stream, a valid handle on it.
    let sb = unsafe { Stream::from_raw(PER_THREAD, dev) };
    let mut back = PinnedBuffer::<u32>::zeroed(d.len(), HostAllocFlags::DEFAULT).unwrap();
    copy_async(&mut back, d, &sb).unwrap();
    back.as_slice().unwrap().to_vec()
}

/// Item 5, the safe constructor: `Stream::per_thread` has the per-thread identity, refuses
/// work from another thread with the exact error, and a pooled buffer allocated on one
/// thread's per-thread stream is freed from another thread after all of its work (the free
/// goes through the legacy stream there, which waits for every blocking stream).
#[test]
fn the_per_thread_stream_is_this_threads_and_buffers_on_it_drop_anywhere() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 4 << 20;
    let data = pattern(n, 55);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let pool = MemPool::new(dev).unwrap();
    let mine = Stream::per_thread().unwrap();
    assert!(format!("{mine:?}").contains("per-thread"), "{mine:?}");
    std::thread::scope(|sc| {
        let mine = &mine;
        let e = sc
            .spawn(move || {
                let mut d = DeviceBuffer::<u32>::zeroed(16).unwrap();
                memset_err(&mut d, mine)
            })
            .join()
            .unwrap();
        match e.misuse() {
            Some(Misuse::InvalidArgument { reason, .. }) => {
                assert!(reason.contains("per-thread"), "{reason}")
            }
            other => panic!("expected the per-thread refusal, got {other:?} ({e})"),
        }
    });
    let data2 = pattern(n, 56);
    let src2 = PinnedBuffer::from_slice(&data2, HostAllocFlags::DEFAULT).unwrap();
    let other = Stream::non_blocking().unwrap();
    for round in 0..3 {
        let mut d = DeviceBuffer::<u32>::from_pool(&pool, n, &mine).unwrap();
        probes.spin(SPIN / 3, &mine).unwrap();
        copy_async(&mut d, &src, &mine).unwrap();
        // Dropped on another thread, where `cudaStreamPerThread` names another stream: the
        // free must still come after the copy, so that the pool cannot hand the memory to
        // another stream while the copy writes it.
        std::thread::scope(|sc| {
            sc.spawn(move || drop(d));
        });
        still_pending(!mine.is_idle().unwrap(), "the copy is pending");
        let mut e = DeviceBuffer::<u32>::from_pool(&pool, n, &other).unwrap();
        copy_async(&mut e, &src2, &other).unwrap();
        mine.synchronize().unwrap();
        assert!(
            e.to_vec().unwrap() == data2,
            "round {round}: the freed memory was reused under the copy"
        );
    }
}

fn memset_err(d: &mut DeviceBuffer<u32>, s: &Stream) -> cuda_mem::Error {
    cuda_mem::memset_async(d, 0, s).unwrap_err()
}

/// Item 6: a host read whose fence event record fails synchronizes the stream instead, while
/// a read guard on that same stream is still to queue its work. The old fallback forgot the
/// guard's read with the stream's entry: the pinned-pool block was handed out again and
/// overwritten under the read (5/5 with a forced record failure).
#[test]
fn a_failed_record_does_not_forget_a_read_in_flight_on_the_same_stream() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    // 2 MiB: a `cudaHostAlloc` block of the pool (larger ones are mapped and registered).
    let n = 1 << 19;
    let data = pattern(n, 6);
    let dev_data = DeviceBuffer::from_slice(&data).unwrap();
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let s = Stream::non_blocking().unwrap();
    for round in 0..3 {
        let mut buf = pool.alloc::<u32>(n, HostAllocFlags::DEFAULT).unwrap();
        let mut out = DeviceBuffer::<u32>::zeroed(n).unwrap();
        copy_async(&mut buf, &dev_data, &s).unwrap(); // a write on `s`, so host reads wait
        {
            let g = buf.device_ptr(&s).unwrap(); // a read guard: its work is not queued yet
            testing::fail_next_fence_records(1);
            assert_eq!(buf.as_slice().unwrap()[0], data[0]); // record fails: syncs `s`
            assert_eq!(testing::pending_fence_record_failures(), 0);
            probes.spin(SPIN, &s).unwrap(); // the read below stays pending
            let o = out.device_ptr_mut(&s).unwrap();
            // SAFETY: both guards cover `n` u32 and live until the copy is queued on their
            // stream; they record it.
            unsafe { raw_copy(o.as_mut_ptr(), g.as_ptr(), n * 4, &s) };
        }
        drop(buf); // back to the pool: pending until the read completes
        let mut again = pool.alloc::<u32>(n, HostAllocFlags::DEFAULT).unwrap();
        again.as_mut_slice().unwrap().fill(0xdead_beef);
        still_pending(!s.is_idle().unwrap(), "the guarded read is pending");
        assert!(
            out.to_vec().unwrap() == data,
            "round {round}: the block was reused under the read"
        );
    }
}

/// Guards leaked with `mem::forget` (safe code): a write guard's kernel is still waited for by
/// host reads, by drop and by a pinned-pool reuse; a read guard's copy is still waited for by
/// a host write. (Item 7: the leaked count is dropped at the owner's next exclusive access;
/// `fence::tests::a_leaked_guard_slows_waits_only_until_the_next_exclusive_access` counts
/// the calls.)
#[test]
fn forgotten_guards_leave_host_access_drop_and_reuse_correct() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 1 << 19;
    let bytes = n * 4;
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    let s = Stream::non_blocking().unwrap();
    for round in 0..3 {
        // A write guard leaked after its kernel: the host read waits for the kernel.
        let mut buf = pool
            .alloc_zeroed::<u32>(n, HostAllocFlags::DEFAULT)
            .unwrap();
        probes.spin(SPIN / 3, &s).unwrap();
        let g = buf.device_ptr_mut(&s).unwrap();
        // SAFETY: `g` covers `bytes` bytes of pinned memory, queued on its stream while it
        // lives (it is leaked afterwards, which safe code may do).
        unsafe { probes.write(g.as_mut_ptr().cast(), bytes, &s).unwrap() };
        mem::forget(g);
        still_pending(!s.is_idle().unwrap(), "the kernel is pending");
        assert_eq!(
            first_not_written(buf.as_slice().unwrap()),
            None,
            "round {round}"
        );
        // Exclusive access after the leak, then reads: correct (and, per item 7, fast).
        buf.as_mut_slice().unwrap().fill(1);
        assert!(buf.as_slice().unwrap().iter().all(|&w| w == 1));

        // Leaked, then dropped at once: the block must not be reused under the kernel.
        probes.spin(SPIN / 3, &s).unwrap();
        let g = buf.device_ptr_mut(&s).unwrap();
        // SAFETY: as above.
        unsafe { probes.write(g.as_mut_ptr().cast(), bytes, &s).unwrap() };
        mem::forget(g);
        drop(buf);
        let mut again = pool.alloc::<u32>(n, HostAllocFlags::DEFAULT).unwrap();
        again.as_mut_slice().unwrap().fill(0x5eed);
        s.synchronize().unwrap();
        assert!(
            again.as_slice().unwrap().iter().all(|&w| w == 0x5eed),
            "round {round}: the leaked guard's kernel wrote into a reused block"
        );

        // A read guard leaked after its copy: a host write waits for the read.
        let data = pattern(n, 70 + round);
        let mut src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
        let mut out = DeviceBuffer::<u32>::zeroed(n).unwrap();
        probes.spin(SPIN / 3, &s).unwrap();
        {
            let g = src.device_ptr(&s).unwrap();
            let o = out.device_ptr_mut(&s).unwrap();
            // SAFETY: both guards cover `n` u32 and live until the copy is queued.
            unsafe { raw_copy(o.as_mut_ptr(), g.as_ptr(), bytes, &s) };
            mem::forget(g);
        }
        still_pending(!s.is_idle().unwrap(), "the guarded copy is pending");
        src.as_mut_slice().unwrap().fill(0);
        assert!(
            out.to_vec().unwrap() == data,
            "round {round}: the host write overtook the leaked guard's read"
        );
    }
}
