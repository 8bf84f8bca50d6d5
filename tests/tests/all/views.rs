//! Views of buffers, ownership transfer, foreign streams and mapped flags shared with a running
//! kernel (issue 12): what a crate built on cuda-mem, or a port of C++ code, needs.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cuda_mem::{
    alloc_mapped, copy, copy_async, memset_async, sys, Attach, Device, DeviceBuffer,
    DevicePtr as _, DevicePtrMut as _, Event, HostAllocFlags, ManagedBuffer, Misuse, PinnedBuffer,
    Slice as _, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{eventually, gpu_or_skip};

use crate::{first_not_written, pattern, SPIN};

/// Two halves of one buffer, written on two streams, one held by a slow kernel: the other
/// half's copy does not wait for it, and both land.
#[test]
fn halves_of_one_buffer_fill_on_two_streams_at_once() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 8 << 20;
    let data = pattern(n, 31);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let (s1, s2) = (
        Stream::non_blocking().unwrap(),
        Stream::non_blocking().unwrap(),
    );
    probes.spin(SPIN, &s1).unwrap();
    {
        let (mut lo, mut hi) = dev.split_at_mut(n / 2).unwrap();
        assert_eq!((lo.len(), hi.offset(), hi.len()), (n / 2, n / 2, n / 2));
        copy_async(&mut lo, &src.slice(..n / 2).unwrap(), &s1).unwrap();
        copy_async(&mut hi, &src.slice(n / 2..).unwrap(), &s2).unwrap();
    }
    assert!(
        eventually(Duration::from_millis(200), || s2.is_idle().unwrap()),
        "the second half waited for the first"
    );
    assert!(!s1.is_idle().unwrap(), "the held stream finished early");
    assert!(dev.to_vec().unwrap() == data);
}

/// A read of one half does not wait for a held write to the other half; a read of the whole
/// buffer does, and sees the write.
#[test]
fn views_order_only_overlapping_work() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 4 << 20;
    let old = pattern(n, 1);
    let new = pattern(n / 2, 2);
    let mut dev = DeviceBuffer::from_slice(&old).unwrap();
    let src = PinnedBuffer::from_slice(&new, HostAllocFlags::DEFAULT).unwrap();
    let s: Vec<Stream> = (0..3).map(|_| Stream::non_blocking().unwrap()).collect();
    probes.spin(SPIN, &s[0]).unwrap();
    copy_async(&mut dev.slice_mut(..n / 2).unwrap(), &src, &s[0]).unwrap();
    let mut hi = PinnedBuffer::<u32>::zeroed(n / 2, HostAllocFlags::DEFAULT).unwrap();
    copy_async(&mut hi, &dev.slice(n / 2..).unwrap(), &s[1]).unwrap();
    assert!(
        eventually(Duration::from_millis(200), || s[1].is_idle().unwrap()),
        "a read of the other half waited for the held write"
    );
    let mut all = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    copy_async(&mut all, &dev, &s[2]).unwrap();
    assert!(hi.as_slice().unwrap() == &old[n / 2..]);
    let all = all.as_slice().unwrap();
    assert!(
        all[..n / 2] == new[..],
        "the whole-buffer read overtook the write"
    );
    assert!(all[n / 2..] == old[n / 2..]);
}

/// A kernel and a memset through views touch their range only.
#[test]
fn kernels_and_memsets_through_views_stay_in_range() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 1 << 16;
    let mut dev = DeviceBuffer::from_slice(&vec![7u32; n]).unwrap();
    let s = Stream::new().unwrap();
    {
        let mut v = dev.slice_mut(1024..2048).unwrap();
        let w = v.device_ptr_mut(&s).unwrap();
        assert_eq!(w.len(), 1024);
        // SAFETY: the guard covers 1024 u32 (a multiple of 16 bytes, 4 KiB aligned within a
        // 256-byte aligned allocation), used on its stream while it lives.
        unsafe { probes.write(w.as_mut_ptr().cast(), 1024 * 4, &s).unwrap() };
    }
    memset_async(&mut dev.slice_mut(4096..4100).unwrap(), 0xab, &s).unwrap();
    let out = dev.to_vec().unwrap();
    for (i, &v) in out.iter().enumerate() {
        let want = match i {
            1024..2048 => ((i - 1024) / 4) as u32,
            4096..4100 => 0xabab_abab,
            _ => 7,
        };
        assert_eq!(v, want, "element {i}");
    }
    // Empty views copy nothing; ranges outside are misuse.
    let mut back = vec![0u32; 0];
    copy(&mut back, &dev.slice(5..5).unwrap()).unwrap();
    assert!(matches!(
        dev.slice(10..n + 1).unwrap_err().misuse(),
        Some(Misuse::OutOfBounds { .. })
    ));
    assert!(dev.split_at_mut(n + 1).is_err());
}

/// Memory crosses into and out of other code without a copy: `into_raw`, then `from_raw`.
#[test]
fn ownership_moves_out_and_back_for_every_owned_kind() {
    gpu_or_skip!();
    let data = pattern(4096, 5);
    let dev = DeviceBuffer::from_slice(&data).unwrap();
    let (p, len) = dev.into_raw().unwrap();
    // SAFETY: `p`/`len` came from `into_raw` of a cudaMalloc buffer on this device.
    let dev = unsafe { DeviceBuffer::from_raw(p, len) }.unwrap();
    assert!(dev.to_vec().unwrap() == data);

    let pinned = PinnedBuffer::from_slice(&data, HostAllocFlags::PORTABLE).unwrap();
    let (p, len) = pinned.into_raw().unwrap();
    // SAFETY: from `into_raw` of a cudaHostAlloc(PORTABLE) buffer.
    let pinned = unsafe { PinnedBuffer::from_raw(p, len, HostAllocFlags::PORTABLE) }.unwrap();
    assert!(pinned.as_slice().unwrap() == &data[..]);

    let mut raw = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; 4096 u32 of pinned memory, owned below.
    let code = unsafe { sys::cudaHostAlloc(&mut raw, 4096 * 4, sys::cudaHostAllocDefault) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    // SAFETY: fresh cudaHostAlloc memory of 4096 u32, initialised by the copy below before
    // it is read; nothing else owns it.
    let mut adopted =
        unsafe { PinnedBuffer::<u32>::from_raw(raw.cast(), 4096, HostAllocFlags::DEFAULT) }
            .unwrap();
    copy(&mut adopted, &dev).unwrap();
    assert!(adopted.as_slice().unwrap() == &data[..]);

    let mut m = ManagedBuffer::<u32>::zeroed(4096, Attach::Global).unwrap();
    copy(&mut m, &dev).unwrap();
    let (p, len) = m.into_raw().unwrap();
    // SAFETY: from `into_raw` of a cudaMallocManaged(Global) buffer on this device.
    let m = unsafe { ManagedBuffer::from_raw(p, len, Attach::Global) }.unwrap();
    assert!(m.as_slice().unwrap() == &data[..]);
    // SAFETY: null is refused before anything else is done.
    let e = unsafe { DeviceBuffer::<u32>::from_raw(std::ptr::null_mut(), 1) }.unwrap_err();
    assert!(matches!(e.misuse(), Some(Misuse::NullPointer { .. })));
}

/// A stream another library owns, borrowed: copies are ordered on it, and the buffers wait
/// for it; destroying it is the owner's business.
#[test]
fn a_foreign_stream_carries_our_work() {
    let dev = gpu_or_skip!();
    let mut raw = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the stream is destroyed below, after every use.
    let code = unsafe { sys::cudaStreamCreateWithFlags(&mut raw, sys::cudaStreamNonBlocking) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    {
        // SAFETY: `raw` stays valid until after `s` and the buffers below are dropped.
        let s = unsafe { Stream::from_raw(raw, Device::current().unwrap()) };
        assert_eq!((s.as_raw(), s.device()), (raw, dev));
        let data = pattern(1 << 20, 8);
        let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
        let mut d = DeviceBuffer::<u32>::zeroed(1 << 20).unwrap();
        copy_async(&mut d, &src, &s).unwrap();
        let mut back = PinnedBuffer::<u32>::zeroed(1 << 20, HostAllocFlags::DEFAULT).unwrap();
        copy_async(&mut back, &d, &s).unwrap();
        assert!(back.as_slice().unwrap() == &data[..]);
    }
    // SAFETY: our handle; the wrapper and every buffer that used it are gone.
    let code = unsafe { sys::cudaStreamDestroy(raw) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
}

/// A kernel polls a mapped flag that the host sets while the kernel runs: the atomic access
/// does not wait for the kernel (a waiting access would deadlock until the kernel's timeout).
#[test]
fn a_running_kernel_sees_a_mapped_flag_the_host_sets() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let mut flag = alloc_mapped::<u32>(4).unwrap();
    let s = Stream::non_blocking().unwrap();
    let timeout_ns = 20_000_000_000; // the kernel gives up after 20 s
    let t = Instant::now();
    {
        let f = flag.device_ptr(&s).unwrap();
        // SAFETY: `f` is mapped memory of 4 u32, alive until the kernel completes (the guard
        // records it on the flag's fence, which drop waits for).
        unsafe { probes.wait(f.as_ptr(), timeout_ns, &s).unwrap() };
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(!s.is_idle().unwrap(), "the kernel should still be polling");
    flag.atomic(0).unwrap().store(1, Ordering::Release);
    assert!(
        eventually(Duration::from_secs(5), || s.is_idle().unwrap()),
        "the kernel did not see the flag"
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(matches!(
        flag.atomic(4).unwrap_err().misuse(),
        Some(Misuse::OutOfBounds { .. })
    ));
    assert_eq!(flag.as_slice().unwrap()[0], 1);
}

/// `scope`: ordinary `Vec`s take part in asynchronous copies, and the scope returns only once
/// they are done, also when its closure panics.
#[test]
fn a_scope_waits_for_async_copies_of_borrowed_vecs() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 4 << 20;
    let input = pattern(n, 41);
    let mut output = vec![0u32; n];
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let s = Stream::non_blocking().unwrap();
    cuda_mem::scope(|sc| {
        let (input, mut output) = (sc.borrow(&input), sc.borrow_mut(&mut output));
        probes.spin(SPIN / 3, &s)?; // the copies queue behind this
        copy_async(&mut dev, &input, &s)?;
        copy_async(&mut output, &dev, &s)
    })
    .unwrap();
    assert!(
        s.is_idle().unwrap(),
        "the scope returned before its work was done"
    );
    assert!(output == input);

    // A panic inside the scope: it still waits before the borrows end.
    let mut out2 = vec![0u32; n];
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = cuda_mem::scope(|sc| -> cuda_mem::Result<()> {
            let mut out2 = sc.borrow_mut(&mut out2);
            probes.spin(SPIN / 3, &s)?;
            copy_async(&mut out2, &dev, &s)?;
            panic!("in the scope");
        });
    }));
    assert!(r.is_err());
    assert!(
        s.is_idle().unwrap(),
        "the scope did not wait when unwinding"
    );
    assert!(out2 == input);
}

/// A function written against the public traits only (`cuda_mem_probes::Probes::xor_checksum`
/// takes any `DevicePtr<u32>`), used on every kind of memory and on views of them: the
/// checksum the kernel computes is the host's.
#[test]
fn one_generic_kernel_launcher_serves_every_kind_and_view() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::new().unwrap();
    let n = 1 << 16;
    let data = pattern(n, 77);
    let xor = |v: &[u32]| v.iter().fold(0, |a, &b| a ^ b);
    let whole = xor(&data);
    let part = xor(&data[100..5000]);

    let dev = DeviceBuffer::from_slice(&data).unwrap();
    let pinned = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut mapped = alloc_mapped::<u32>(n).unwrap();
    mapped.as_mut_slice().unwrap().copy_from_slice(&data);
    let mut managed = ManagedBuffer::<u32>::zeroed(n, Attach::Global).unwrap();
    managed.as_mut_slice().unwrap().copy_from_slice(&data);
    let registered =
        cuda_mem::RegisteredVec::register(data.clone(), cuda_mem::HostRegisterFlags::DEFAULT)
            .unwrap();
    assert_eq!(probes.xor_checksum(&dev, &s).unwrap(), whole, "device");
    assert_eq!(probes.xor_checksum(&pinned, &s).unwrap(), whole, "pinned");
    assert_eq!(probes.xor_checksum(&mapped, &s).unwrap(), whole, "mapped");
    assert_eq!(probes.xor_checksum(&managed, &s).unwrap(), whole, "managed");
    assert_eq!(
        probes.xor_checksum(&registered, &s).unwrap(),
        whole,
        "registered"
    );
    for (what, got) in [
        (
            "device view",
            probes.xor_checksum(&dev.slice(100..5000).unwrap(), &s),
        ),
        (
            "pinned view",
            probes.xor_checksum(&pinned.slice(100..5000).unwrap(), &s),
        ),
        (
            "mapped view",
            probes.xor_checksum(&mapped.slice(100..5000).unwrap(), &s),
        ),
        (
            "managed view",
            probes.xor_checksum(&managed.slice(100..5000).unwrap(), &s),
        ),
        (
            "registered view",
            probes.xor_checksum(&registered.slice(100..5000).unwrap(), &s),
        ),
    ] {
        assert_eq!(got.unwrap(), part, "{what}");
    }
    // Ordered after a pending write on another stream: the checksum sees the new data.
    let probes_s = Stream::non_blocking().unwrap();
    let mut dev2 = DeviceBuffer::<u32>::zeroed(n).unwrap();
    probes.spin(SPIN / 3, &probes_s).unwrap();
    copy_async(&mut dev2, &pinned, &probes_s).unwrap();
    assert_eq!(
        probes.xor_checksum(&dev2, &s).unwrap(),
        whole,
        "ordered after the copy"
    );
}

/// Device and event flags (`cudaSetDeviceFlags`, `cudaEventCreateWithFlags`).
#[test]
fn device_and_event_flags() {
    let dev = gpu_or_skip!();
    use cuda_mem::{DeviceFlags, Event, EventFlags};
    // Drivers since CUDA 11 overwrite the flags of an active primary context; older ones
    // refuse with cudaErrorSetOnActiveProcess, which is the one other acceptable answer.
    match dev.set_flags(DeviceFlags::SCHEDULE_BLOCKING_SYNC | DeviceFlags::MAP_HOST) {
        Ok(()) => {
            let f = dev.flags().unwrap();
            assert_eq!(
                f & sys::cudaDeviceScheduleMask,
                sys::cudaDeviceScheduleBlockingSync
            );
            dev.set_flags(DeviceFlags::DEFAULT).unwrap();
        }
        Err(e) => assert_eq!(
            e.code().map(|c| c.0),
            Some(sys::cudaError::cudaErrorSetOnActiveProcess.0),
            "{e}"
        ),
    }
    let e = dev
        .set_flags(DeviceFlags::SCHEDULE_SPIN | DeviceFlags::SCHEDULE_YIELD)
        .unwrap_err();
    assert!(matches!(e.misuse(), Some(Misuse::InvalidFlags { .. })));
    let s = Stream::new().unwrap();
    let ev = Event::with_flags(EventFlags::BLOCKING_SYNC | EventFlags::DISABLE_TIMING).unwrap();
    ev.record(&s).unwrap();
    ev.synchronize().unwrap();
    assert!(ev.is_complete().unwrap());
    // No timing on such an event: the runtime says so.
    let t = Event::timing().unwrap();
    t.record(&s).unwrap();
    s.synchronize().unwrap();
    assert!(Event::elapsed_ms(&t, &ev).is_err());
}

/// An event another library owns (here: created with the raw runtime call), borrowed: it
/// orders one stream after another, answers queries and host waits, and is not destroyed
/// when the borrow ends.
#[test]
fn a_borrowed_event_orders_streams_and_is_left_to_its_owner() {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let mut raw = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the event is destroyed at the end, after every use.
    let code = unsafe { sys::cudaEventCreateWithFlags(&mut raw, sys::cudaEventDisableTiming) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    // SAFETY: `raw` is an event of this device, destroyed only after `ev` is dropped.
    let ev = unsafe { Event::from_raw(raw, dev) };
    assert!(!ev.is_owned());
    assert_eq!((ev.as_raw(), ev.device()), (raw, dev));

    let n = 4 << 20;
    let (s1, s2) = (
        Stream::non_blocking().unwrap(),
        Stream::non_blocking().unwrap(),
    );
    let d = DeviceBuffer::<u32>::zeroed(n).unwrap();
    d.synchronize().unwrap();
    // Raw device addresses, outside cuda-mem's fences: only the event orders s2 after s1.
    let p = d.as_ptr().cast_mut();
    probes.spin(SPIN, &s1).unwrap();
    // SAFETY: `p` is n u32 of device memory, 16-byte aligned, alive until both streams are
    // synchronized below.
    unsafe { probes.write(p.cast(), n * 4, &s1).unwrap() };
    ev.record(&s1).unwrap();
    assert!(!ev.is_complete().unwrap(), "nothing was tested");
    ev.wait_on(&s2).unwrap();
    let mut host = vec![0u32; n];
    // SAFETY: `host` and `p` hold n u32; s2 is synchronized before `host` is read or freed.
    let code = unsafe {
        sys::cudaMemcpyAsync(
            host.as_mut_ptr().cast(),
            p.cast(),
            n * 4,
            sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
            s2.as_raw(),
        )
    };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    s2.synchronize().unwrap();
    assert_eq!(first_not_written(&host), None);
    ev.synchronize().unwrap();
    assert!(ev.is_complete().unwrap());
    s1.synchronize().unwrap();

    drop(ev);
    // SAFETY: the owner's handle, still valid: the borrow did not destroy it.
    let code = unsafe { sys::cudaEventQuery(raw) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    // SAFETY: destroyed once, by its owner.
    let code = unsafe { sys::cudaEventDestroy(raw) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
}

/// Issue 20: host access to a view waits only for the GPU work on its own elements. The GPU
/// writes the upper half of a pinned buffer behind a slow kernel while the host fills and
/// reads the lower half through `HostMemoryMut` / `HostMemory` (generic code); the upper
/// half's copy is still pending afterwards, and a host read of it then waits for it.
#[test]
fn the_host_fills_one_half_while_the_gpu_writes_the_other() {
    use cuda_mem::{HostMemory, HostMemoryMut};
    fn sum<M: HostMemory<u32> + ?Sized>(m: &M) -> u64 {
        m.as_slice().unwrap().iter().map(|&x| u64::from(x)).sum()
    }
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 4 << 20;
    let half = n / 2;
    let data = pattern(half, 77);
    let dev = DeviceBuffer::from_slice(&data).unwrap();
    let s = Stream::non_blocking().unwrap();
    let mut host = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    for round in 0..3u32 {
        let (mut lo, mut hi) = host.split_at_mut(half).unwrap();
        probes.spin(SPIN / 3, &s).unwrap();
        copy_async(&mut hi, &dev, &s).unwrap();
        lo.as_mut_slice().unwrap().fill(round + 1);
        assert_eq!(sum(&lo), u64::from(round + 1) * half as u64);
        assert!(
            !s.is_idle().unwrap() || cuda_mem_tests::under_sanitizer(),
            "the host access to the lower half waited for the upper half's copy"
        );
        assert!(hi.as_slice().unwrap() == &data[..], "round {round}");
        assert!(HostMemory::as_slice(&host).unwrap()[..half]
            .iter()
            .all(|&x| x == round + 1));
    }
    // Views of device memory have no host access: `HostMemory` is not implemented for them
    // (a compile error), and managed memory refuses it where the device cannot allow it.
}
