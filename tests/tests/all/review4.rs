//! Review 4 (the day's new code: capture handshake, graph launch fast path, `ImportedBuffer`,
//! pageable copies through `cudaMemcpyAsync`): demonstrations of findings. Every test here is
//! GPU-only (it SKIPs on a machine without one) and asserts the *sound* behaviour, so it fails
//! while the finding stands. Where a failure would leave a DMA running into memory the test
//! then frees, the test drains the device before it fails.

use cuda_mem::{
    copy, copy_async, Attach, DeviceBuffer, HostAllocFlags, ManagedBuffer, PinnedBuffer, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{gpu_or_skip, still_pending};

use crate::{pattern, SPIN};

/// 256 KiB of `u32`: below the staging threshold (1 MiB), so `copy` takes the driver's path
/// (`copy_planned`).
const N: usize = 1 << 16;

/// Drains every stream of the device (the legacy stream waits for the blocking ones; `s` is
/// non-blocking), so that a copy the crate lost track of cannot outlive the test's buffers.
fn drain(s: &Stream) {
    let _ = s.synchronize();
    let _ = Stream::legacy_default().synchronize();
}

/// F1 (ops/copy.rs `copy_planned`, b3ed201): a plain `&mut [T]` is `Loc::Pageable` whatever
/// memory it points to. A slice of a *pinned* buffer (`as_mut_slice`) as the destination of a
/// device-to-host `copy` now gets `cudaMemcpyAsync` on the legacy stream, which for pinned
/// memory is fully asynchronous: `copy` returns before the destination is written, and nothing
/// tracks the copy (the slice has no fence, and `Device -> Pageable` is never marked or
/// synchronized). `cudaMemcpy`, before, returned only once the copy was done.
/// Expected (fixed): the slice holds the device data when `copy` returns.
#[test]
fn review4_a_copy_into_a_slice_of_pinned_memory_is_done_at_return() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let data = pattern(N, 41);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut p = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    // `d` receives `data` only after the spin: the copy out of it waits on the device.
    probes.spin(SPIN, &s).unwrap();
    copy_async(&mut d, &src, &s).unwrap();
    let out = p.as_mut_slice().unwrap();
    still_pending(
        !s.is_idle().unwrap(),
        "the spin ended before the copy was queued",
    );
    copy(out, &d).unwrap();
    let ok = *out == data[..];
    if !ok {
        drain(&s);
    }
    assert!(
        ok,
        "copy returned before writing its destination (a slice of pinned memory)"
    );
}

/// F1b: the same hole from the other side. A slice of a pinned buffer (`as_slice`) as the
/// source of a host-to-device `copy`: `cudaMemcpyAsync` from pinned memory is not staged, the
/// DMA reads the source when the legacy stream reaches it. `copy` promises the source was
/// staged at return ("source staged for h2d"), so the borrow ends, and safe code rewrites the
/// pinned buffer (its fence knows nothing of the copy) before the DMA has read it.
/// Expected (fixed): the device holds the data the source had when `copy` was called.
#[test]
fn review4_a_copy_from_a_slice_of_pinned_memory_has_read_it_at_return() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let old = pattern(N, 43);
    let new = pattern(N, 44);
    let filler = PinnedBuffer::from_slice(&pattern(N, 45), HostAllocFlags::DEFAULT).unwrap();
    let mut p = PinnedBuffer::from_slice(&old, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    // A write to `d` pending behind the spin: the copy into `d` is ordered after it.
    probes.spin(SPIN, &s).unwrap();
    copy_async(&mut d, &filler, &s).unwrap();
    still_pending(
        !s.is_idle().unwrap(),
        "the spin ended before the copy was queued",
    );
    copy(&mut d, p.as_slice().unwrap()).unwrap();
    // The source's borrow has ended: safe code may write it.
    p.as_mut_slice().unwrap().copy_from_slice(&new);
    let got = d.to_vec().unwrap();
    assert!(
        got == old,
        "the copy read its source after copy returned (got the later host write: {})",
        got == new
    );
}

/// F1c: the destination a slice of *managed* memory (`as_mut_slice`): `Loc::Pageable` again,
/// so `cudaMemcpyAsync(DeviceToHost)` on the legacy stream, asynchronous for memory the driver
/// knows. Expected (fixed): the slice holds the device data when `copy` returns.
#[test]
fn review4_a_copy_into_a_slice_of_managed_memory_is_done_at_return() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let mut m = ManagedBuffer::<u32>::zeroed(N, Attach::Global).unwrap();
    if !m.has_concurrent_access() {
        cuda_mem_tests::skip("no concurrent managed access: host slices wait for the device");
        return;
    }
    let data = pattern(N, 47);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    probes.spin(SPIN, &s).unwrap();
    copy_async(&mut d, &src, &s).unwrap();
    let out = m.as_mut_slice().unwrap();
    still_pending(
        !s.is_idle().unwrap(),
        "the spin ended before the copy was queued",
    );
    copy(out, &d).unwrap();
    let ok = *out == data[..];
    if !ok {
        drain(&s);
    }
    assert!(
        ok,
        "copy returned before writing its destination (a slice of managed memory)"
    );
}
