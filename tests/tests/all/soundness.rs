//! The soundness promises, each against the failure that broke it before (issue 8): safe code
//! never reads, writes or frees memory that queued GPU work may still use, whatever threads,
//! streams and failures do. A slow kernel (`cm_spin`) holds a stream so that work queued
//! behind it is certainly still pending when the next step runs.

use std::time::Duration;

use cuda_mem::{
    copy, copy_async, copy_range_async, pointer_info, sys, testing, Attach, DeviceBuffer,
    DevicePtr as _, DevicePtrMut as _, ErrorCode, Event, HostAllocFlags, HostRegisterFlags,
    ManagedBuffer, Misuse, PinnedBuffer, PointerKind, RegisteredVec, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{eventually, gpu_or_skip};

use crate::{pattern, SPIN};

fn last_error() -> sys::cudaError_t {
    // SAFETY: no arguments; reads the thread's error state without resetting it.
    unsafe { sys::cudaPeekAtLastError() }
}

/// Issue 8.3: two threads copy out of one pinned buffer on two streams, the first held behind
/// a slow kernel; a host write afterwards must wait for both copies. (The old fence kept one
/// event, re-recorded by the second copy, and let the write race the first.)
#[test]
fn threads_copying_from_one_pinned_buffer_then_a_host_write_waits_for_both() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 16 << 20;
    let data = pattern(n, 3);
    let mut src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let (s1, s2) = (
        Stream::non_blocking().unwrap(),
        Stream::non_blocking().unwrap(),
    );
    let mut d1 = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let mut d2 = DeviceBuffer::<u32>::zeroed(n).unwrap();
    probes.spin(SPIN, &s1).unwrap();
    // The held copy is queued first and the fast one last, so a fence that keeps only the
    // last record would let the host write through while the first copy still reads.
    std::thread::scope(|sc| {
        sc.spawn(|| copy_async(&mut d1, &src, &s1).unwrap());
    });
    std::thread::scope(|sc| {
        sc.spawn(|| copy_async(&mut d2, &src, &s2).unwrap());
    });
    src.as_mut_slice().unwrap().fill(0xdead_beef);
    assert!(
        d1.to_vec().unwrap() == data,
        "the held copy saw the host write"
    );
    assert!(d2.to_vec().unwrap() == data);

    // The same with the two threads running at once, several times.
    for round in 0..4 {
        src.as_mut_slice().unwrap().copy_from_slice(&data);
        probes.spin(SPIN / 3, &s1).unwrap();
        std::thread::scope(|sc| {
            let src = &src;
            let (d1, d2) = (&mut d1, &mut d2);
            let (s1, s2) = (&s1, &s2);
            sc.spawn(move || copy_async(d1, src, s1).unwrap());
            sc.spawn(move || copy_async(d2, src, s2).unwrap());
        });
        src.as_mut_slice().unwrap().fill(round);
        assert!(d1.to_vec().unwrap() == data, "round {round}");
        assert!(d2.to_vec().unwrap() == data, "round {round}");
    }
}

/// Issue 8.5: `memset` runs on the legacy default stream and may return before it is done; an
/// asynchronous copy on a non-blocking stream must still see the fill.
#[test]
fn memset_then_an_async_copy_on_a_non_blocking_stream_reads_the_fill() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 1 << 20;
    let mut dev = DeviceBuffer::from_slice(&vec![0xabab_abab_u32; n]).unwrap();
    let legacy = Stream::legacy_default();
    let nb = Stream::non_blocking().unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(16 << 10, HostAllocFlags::DEFAULT).unwrap();
    probes.spin(SPIN, &legacy).unwrap(); // the memset queues behind this
    dev.memset(0).unwrap();
    copy_range_async(&mut out, 0, &dev, n - (16 << 10), 16 << 10, &nb).unwrap();
    assert!(
        out.as_slice().unwrap().iter().all(|&w| w == 0),
        "stale bytes"
    );
}

/// Issue 8.5: `DeviceBuffer::zeroed` (small buffers too) then an asynchronous copy on a
/// non-blocking stream reads zeros.
#[test]
fn zeroed_then_an_async_copy_on_a_non_blocking_stream_reads_zeros() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let legacy = Stream::legacy_default();
    let nb = Stream::non_blocking().unwrap();
    for n in [4096usize, 100_000, 1 << 20] {
        // Leave non-zero bytes where the next allocation is likely to land.
        drop(DeviceBuffer::from_slice(&vec![0x5a5a_5a5a_u32; n]).unwrap());
        probes.spin(SPIN / 3, &legacy).unwrap();
        let dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
        let mut out = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
        out.as_mut_slice().unwrap().fill(7);
        copy_async(&mut out, &dev, &nb).unwrap();
        assert!(
            out.as_slice().unwrap().iter().all(|&w| w == 0),
            "{n} elements"
        );
    }
}

/// Issue 8.5: a device-to-device `copy` may return before it is done; an asynchronous copy
/// of the destination on a non-blocking stream must see the new contents.
#[test]
fn device_to_device_copy_then_an_async_copy_on_a_non_blocking_stream() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 4 << 20;
    let data = pattern(n, 11);
    let src = DeviceBuffer::from_slice(&data).unwrap();
    let mut dst = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let nb = Stream::non_blocking().unwrap();
    probes.spin(SPIN, &Stream::legacy_default()).unwrap();
    copy(&mut dst, &src).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    copy_async(&mut out, &dst, &nb).unwrap();
    assert!(out.as_slice().unwrap() == &data[..]);
}

/// Issue 8.9: a not-ready answer is not left as the thread's last error.
#[test]
fn not_ready_queries_leave_the_last_error_clean() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    probes.spin(SPIN, &s).unwrap();
    assert!(!s.is_idle().unwrap());
    assert_eq!(last_error(), sys::cudaError::cudaSuccess);
    let e = Event::new().unwrap();
    e.record(&s).unwrap();
    assert!(!e.is_complete().unwrap());
    assert_eq!(last_error(), sys::cudaError::cudaSuccess);
    s.synchronize().unwrap();
    assert!(s.is_idle().unwrap() && e.is_complete().unwrap());
}

/// Issue 8.2: when the fence cannot record its event, queued work is still waited for (the
/// fence falls back to synchronizing the stream), both for host access and for work ordered
/// on another stream.
#[test]
fn a_failing_record_leaves_nothing_running_unseen() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 4 << 20;
    let data = pattern(n, 5);
    let mut src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let (s1, s2) = (
        Stream::non_blocking().unwrap(),
        Stream::non_blocking().unwrap(),
    );

    probes.spin(SPIN, &s1).unwrap();
    copy_async(&mut dev, &src, &s1).unwrap();
    testing::fail_next_fence_records(8);
    src.as_mut_slice().unwrap().fill(1); // must wait for the held copy all the same
    assert_eq!(
        testing::pending_fence_record_failures(),
        7,
        "one record was tried"
    );
    testing::fail_next_fence_records(0);
    assert!(dev.to_vec().unwrap() == data);

    // Ordering on another stream: the write to `dev` on s1 is held; a copy out of it on s2
    // must come after it even when the event for the wait cannot be recorded.
    src.as_mut_slice().unwrap().copy_from_slice(&data);
    dev.memset(0).unwrap();
    probes.spin(SPIN, &s1).unwrap();
    copy_async(&mut dev, &src, &s1).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    testing::fail_next_fence_records(8);
    copy_async(&mut out, &dev, &s2).unwrap();
    testing::fail_next_fence_records(0);
    assert!(out.as_slice().unwrap() == &data[..]);
}

/// Issue 8.11: readers on different streams do not wait for each other; a writer waits for
/// every reader.
#[test]
fn readers_on_two_streams_overlap_and_a_writer_waits_for_both() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 4 << 20;
    let data = pattern(n, 7);
    let mut dev = DeviceBuffer::from_slice(&data).unwrap();
    let s: Vec<Stream> = (0..3).map(|_| Stream::non_blocking().unwrap()).collect();
    let mut p1 = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    let mut p2 = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    probes.spin(3 * SPIN, &s[0]).unwrap();
    copy_async(&mut p1, &dev, &s[0]).unwrap(); // held
    copy_async(&mut p2, &dev, &s[1]).unwrap(); // must not wait for the held reader
    assert!(
        eventually(Duration::from_millis(2 * SPIN / 1_000_000), || s[1]
            .is_idle()
            .unwrap()),
        "a reader waited for a reader on another stream"
    );
    assert!(!s[0].is_idle().unwrap(), "the held stream finished early");
    // A writer on a third stream is ordered after both readers.
    let other = PinnedBuffer::from_slice(&pattern(n, 8), HostAllocFlags::DEFAULT).unwrap();
    copy_async(&mut dev, &other, &s[2]).unwrap();
    assert!(
        p1.as_slice().unwrap() == &data[..],
        "the writer overtook a reader"
    );
    assert!(p2.as_slice().unwrap() == &data[..]);
    assert!(dev.to_vec().unwrap() == pattern(n, 8));
}

/// Issue 8.12: work launched through the guards is ordered *before* it is queued: a read on
/// stream B after a held write on stream A sees the write, and a write on B after a held read
/// on A does not overtake the read. (The porting guide's old `record_use` after the launch
/// ordered nothing.)
#[test]
fn work_through_the_guards_is_ordered_after_other_streams() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 16 << 20;
    let bytes = n * 4;
    let data = pattern(n, 9);
    let [sa, sb] = crate::streams();

    // Read after write: d <- src on A (held), then e <- d on B through the guards.
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let mut e = DeviceBuffer::<u32>::zeroed(n).unwrap();
    probes.spin(SPIN, &sa).unwrap();
    copy_async(&mut d, &src, &sa).unwrap();
    {
        let r = d.device_ptr(&sb).unwrap();
        let w = e.device_ptr_mut(&sb).unwrap();
        // SAFETY: both guards cover `bytes` bytes of device memory and live until the copy
        // (standing in for a kernel) is queued on their stream.
        let code = unsafe {
            sys::cudaMemcpyAsync(
                w.as_mut_ptr().cast(),
                r.as_ptr().cast(),
                bytes,
                sys::cudaMemcpyKind::cudaMemcpyDeviceToDevice,
                sb.as_raw(),
            )
        };
        assert_eq!(code, sys::cudaError::cudaSuccess);
    }
    assert!(
        e.to_vec().unwrap() == data,
        "the read on B ran before the write on A"
    );

    // Write after read: out <- d on A (held), then a kernel on B writes d.
    let mut out = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    probes.spin(SPIN, &sa).unwrap();
    copy_async(&mut out, &d, &sa).unwrap();
    {
        let w = d.device_ptr_mut(&sb).unwrap();
        // SAFETY: `w` covers `bytes` bytes (a multiple of 16) and lives until the kernel is
        // queued on its stream.
        unsafe { probes.write(w.as_mut_ptr().cast(), bytes, &sb).unwrap() };
    }
    assert!(
        out.as_slice().unwrap() == &data[..],
        "the kernel overtook the read"
    );
    let after = d.to_vec().unwrap();
    assert!(
        (0..n).all(|i| after[i] == (i / 4) as u32),
        "the kernel's writes"
    );
}

/// Issue 8.13: four streams copying into disjoint quarters of one buffer do not wait for each
/// other.
#[test]
fn four_streams_on_disjoint_quarters_overlap() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let q = 4 << 20;
    let data = pattern(4 * q, 13);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(4 * q).unwrap();
    let s: Vec<Stream> = (0..4).map(|_| Stream::non_blocking().unwrap()).collect();
    probes.spin(3 * SPIN, &s[0]).unwrap();
    for (i, st) in s.iter().enumerate() {
        copy_range_async(&mut dev, i * q, &src, i * q, q, st).unwrap();
    }
    assert!(
        eventually(Duration::from_millis(2 * SPIN / 1_000_000), || s[1..]
            .iter()
            .all(|st| st.is_idle().unwrap())),
        "copies into other quarters waited for the held one"
    );
    assert!(!s[0].is_idle().unwrap(), "the held stream finished early");
    assert!(dev.to_vec().unwrap() == data);
}

/// Issue 8.8: memory registered READ_ONLY is never a destination of device writes.
#[test]
fn read_only_registrations_are_refused_as_destinations() {
    let dev = gpu_or_skip!();
    if dev
        .attribute(sys::cudaDeviceAttr::cudaDevAttrHostRegisterReadOnlySupported)
        .unwrap()
        == 0
    {
        cuda_mem_tests::skip("read_only_registrations: the device does not support them");
        return;
    }
    let data = pattern(4096, 2);
    let mut reg = RegisteredVec::register(data.clone(), HostRegisterFlags::READ_ONLY).unwrap();
    let d = DeviceBuffer::<u32>::zeroed(4096).unwrap();
    let s = Stream::new().unwrap();
    let refused = |op| Some(Misuse::ReadOnlyDestination { op });
    assert_eq!(
        copy(&mut reg, &d).unwrap_err().misuse().cloned(),
        refused("copy")
    );
    assert_eq!(
        copy_async(&mut reg, &d, &s).unwrap_err().misuse().cloned(),
        refused("copy_async")
    );
    assert_eq!(
        reg.device_ptr_mut(&s).unwrap_err().misuse().cloned(),
        refused("device_ptr_mut")
    );
    // Reading it is what it is for.
    let mut back = DeviceBuffer::<u32>::zeroed(4096).unwrap();
    copy_async(&mut back, &reg, &s).unwrap();
    assert!(back.to_vec().unwrap() == data);
    assert!(reg.as_slice().unwrap() == &data[..], "untouched");
}

/// Issue 8.6: on a device without concurrent managed access (injected here: the H200 has
/// it), safe host access is refused, the unsafe form works, and GPU work on a stream the
/// attachment excludes is refused.
#[test]
fn managed_memory_without_concurrent_access_refuses_what_cannot_be_sound() {
    gpu_or_skip!();
    testing::assume_no_concurrent_managed_access(true);
    let global = ManagedBuffer::<u32>::zeroed(4096, Attach::Global);
    let host = ManagedBuffer::<u32>::zeroed(4096, Attach::Host);
    testing::assume_no_concurrent_managed_access(false);
    let (mut global, mut host) = (global.unwrap(), host.unwrap());
    assert!(!global.has_concurrent_access());
    let e = global.as_slice().unwrap_err();
    assert!(
        matches!(e.misuse(), Some(Misuse::Unsupported { feature, .. })
            if feature.contains("cudaDevAttrConcurrentManagedAccess")),
        "{e}"
    );
    assert!(global.as_mut_slice().is_err());
    // SAFETY: no kernel runs on the device while the slice lives (this thread launches none
    // and the test runs alone in its process on the GPU runner).
    assert!(unsafe { global.as_slice_unchecked() }
        .unwrap()
        .iter()
        .all(|&w| w == 0));

    let (s1, s2) = (Stream::new().unwrap(), Stream::new().unwrap());
    global.memset_async(1, &s1).unwrap(); // global: any stream
    let refused = |r: cuda_mem::Result<()>| {
        matches!(
            r.unwrap_err().misuse(),
            Some(Misuse::InvalidArgument { .. })
        )
    };
    assert!(refused(host.memset_async(1, &s1)), "host-attached");
    let mut pinned = PinnedBuffer::<u32>::zeroed(4096, HostAllocFlags::DEFAULT).unwrap();
    assert!(refused(copy_async(&mut pinned, &host, &s1)));
    assert!(refused(host.device_ptr(&s1).map(drop)));
    host.attach(&s1, Attach::Single).unwrap();
    host.memset_async(2, &s1).unwrap(); // the attached stream
    assert!(refused(host.memset_async(3, &s2)), "another stream");
    assert!(refused(copy_async(&mut pinned, &host, &s2)));
    copy_async(&mut pinned, &host, &s1).unwrap();
    assert!(pinned.as_slice().unwrap().iter().all(|&w| w == 0x0202_0202));
}

/// Issue 8.10: when pending work cannot be waited for, memory is leaked, never freed or
/// unregistered under it.
#[test]
fn a_failed_wait_leaks_instead_of_freeing() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();

    let mut dev = DeviceBuffer::<u8>::zeroed(1 << 20).unwrap();
    let addr = dev.as_ptr();
    probes.spin(SPIN / 3, &s).unwrap();
    dev.memset_async(7, &s).unwrap();
    testing::fail_next_fence_syncs(100);
    let e = dev.free().unwrap_err();
    testing::fail_next_fence_syncs(0);
    assert!(e.call().unwrap().contains("forced"), "{e}");
    assert_eq!(
        pointer_info(addr).unwrap().kind,
        PointerKind::Device,
        "freed"
    );
    s.synchronize().unwrap();
    // SAFETY: the allocation was leaked by `free` above and nothing else owns it.
    let code = unsafe { sys::cudaFree(addr.cast_mut().cast()) };
    assert_eq!(code, sys::cudaError::cudaSuccess);

    let reg = RegisteredVec::register(vec![1u8; 1 << 20], HostRegisterFlags::DEFAULT).unwrap();
    let host = reg.as_ptr();
    let mut d = DeviceBuffer::<u8>::zeroed(1 << 20).unwrap();
    probes.spin(SPIN / 3, &s).unwrap();
    copy_async(&mut d, &reg, &s).unwrap();
    testing::fail_next_fence_syncs(100);
    drop(reg);
    testing::fail_next_fence_syncs(0);
    assert_eq!(
        pointer_info(host).unwrap().kind,
        PointerKind::PinnedHost,
        "unregistered (and freed) while a copy was pending"
    );
    s.synchronize().unwrap();
    assert!(d.to_vec().unwrap().iter().all(|&b| b == 1));
    // SAFETY: the registration was leaked by the drop above; undo it (its 1 MiB stays leaked).
    let code = unsafe { sys::cudaHostUnregister(host.cast_mut().cast()) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
}

/// Issue 8.4: streams and events know their device.
#[test]
fn streams_and_events_know_their_device() {
    let dev = gpu_or_skip!();
    assert_eq!(Stream::new().unwrap().device(), dev);
    assert_eq!(Stream::on(dev, true).unwrap().device(), dev);
    assert_eq!(Stream::legacy_default().device(), dev);
    assert_eq!(Event::new().unwrap().device(), dev);
    assert_eq!(Event::on(dev).unwrap().device(), dev);
}

/// Issue 8.9: the sticky list is exactly the codes the installed header documents with "the
/// process must be terminated and relaunched" (codes newer than the header may be added).
#[test]
fn sticky_codes_are_the_headers_terminate_and_relaunch_codes() {
    let include = env!("CUDA_MEM_TESTS_INCLUDE");
    let Some(header) = std::env::split_paths(include)
        .map(|d| d.join("driver_types.h"))
        .find(|p| p.exists())
    else {
        // A bundle run on a machine without the toolkit it was built against; the build
        // machine always has it (cuda-mem-sys found it), and CI runs this there.
        assert!(
            include.is_empty() || cuda_mem_tests::has_gpu(),
            "driver_types.h not found in {include}"
        );
        cuda_mem_tests::skip("sticky codes: the toolkit headers are not on this machine");
        return;
    };
    let text = std::fs::read_to_string(header).unwrap();
    let start = text.find("enum __device_builtin__ cudaError").unwrap();
    let body = &text[start..start + text[start..].find("};").unwrap()];
    let (mut comment, mut declared, mut documented) = (String::new(), Vec::new(), Vec::new());
    for line in body.lines() {
        let l = line.trim();
        if let Some((name, value)) = l
            .split_once('=')
            .filter(|(n, _)| n.trim().starts_with("cuda"))
        {
            let _ = name;
            let v: u32 = value.trim().trim_end_matches(',').trim().parse().unwrap();
            declared.push(v);
            let flat = comment.split_whitespace().collect::<Vec<_>>().join(" ");
            if flat.contains("terminated and relaunched") {
                documented.push(v);
            }
            comment.clear();
        } else {
            comment.push_str(l.trim_start_matches(['/', '*']));
            comment.push(' ');
        }
    }
    assert!(documented.len() >= 9, "parsed {documented:?}");
    for v in &documented {
        assert!(ErrorCode(*v).is_sticky(), "{v} is documented sticky");
    }
    for c in ErrorCode::sticky_codes() {
        if declared.contains(&c.0) {
            assert!(
                documented.contains(&c.0),
                "{} is not documented sticky",
                c.0
            );
        }
    }
    assert!(!ErrorCode(sys::cudaError::cudaErrorUnknown.0).is_sticky());
}

/// A synchronous host-to-host copy is made by the CPU inside `cudaMemcpy`, outside any
/// stream's order: it must wait on the host for a pending GPU write to its source.
#[test]
fn a_host_to_host_copy_waits_for_a_pending_gpu_write_to_its_source() {
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 4 << 20;
    let data = pattern(n, 21);
    let dev = DeviceBuffer::from_slice(&data).unwrap();
    let mut pinned = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    let nb = Stream::non_blocking().unwrap();
    probes.spin(SPIN, &nb).unwrap();
    copy_async(&mut pinned, &dev, &nb).unwrap();
    let mut out = vec![0u32; n];
    copy(&mut out, &pinned).unwrap();
    assert!(out == data, "the CPU copied before the DMA wrote");
}

/// One buffer used from many short-lived streams (more than the fence keeps before pruning),
/// never waited on by the host in between: every copy lands, and the streams' entries do not
/// pile up (each stream is destroyed with its last use).
#[test]
fn a_buffer_used_from_many_streams_stays_correct() {
    gpu_or_skip!();
    let n = 1 << 16;
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    for i in 0..40u32 {
        let s = Stream::non_blocking().unwrap();
        let src = PinnedBuffer::from_slice(&pattern(n, i), HostAllocFlags::DEFAULT).unwrap();
        copy_async(&mut dev, &src, &s).unwrap();
        let mut back = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
        copy_async(&mut back, &dev, &Stream::non_blocking().unwrap()).unwrap();
        assert!(back.as_slice().unwrap() == &pattern(n, i)[..], "round {i}");
    }
}
