//! Issue 21 §1, the fence's lock-free path beside other streams' entries: a stream goes fast
//! only where the locked path would wait for nothing. Each test holds the other stream with a
//! slow kernel (`cm_spin`), so that its work is certainly still pending when the fast-path
//! candidate is queued, and checks the data that lands.

use cuda_mem::{copy_range_async, DeviceBuffer, HostAllocFlags, PinnedBuffer};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{gpu_or_skip, still_pending};

use crate::{pattern, SPIN};

/// Elements per block of the buffer; the buffer is 16 blocks.
const BLK: usize = 1 << 16;

/// The first element of block `b` that differs between `got` and `want`.
fn first_diff(got: &[u32], want: &[u32], b: usize) -> Option<usize> {
    let r = b * BLK..(b + 1) * BLK;
    got[r.clone()]
        .iter()
        .zip(&want[r])
        .position(|(g, w)| g != w)
        .map(|i| b * BLK + i)
}

/// Stream B's write to block 10 is pending (behind a slow kernel); stream A then writes five
/// other blocks (0, 2, 4, 6, 12: their marks merge into one hull that covers block 10) and
/// then block 10. A's write there conflicts with B's pending write and must be ordered after
/// it: A's publication of its hull beside B's entry, which it never waited for, would let it
/// through unordered, and B's write would then land last.
#[test]
fn a_fast_write_is_not_let_past_another_streams_pending_write_by_a_hull() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 16 * BLK;
    let (pa, pb) = (pattern(n, 21), pattern(n, 22));
    let ha = PinnedBuffer::from_slice(&pa, HostAllocFlags::DEFAULT).unwrap();
    let hb = PinnedBuffer::from_slice(&pb, HostAllocFlags::DEFAULT).unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let [a, b] = crate::streams();
    probes.spin(SPIN, &b).unwrap();
    copy_range_async(&mut dev, 10 * BLK, &hb, 10 * BLK, BLK, &b).unwrap();
    for blk in [0, 2, 4, 6, 12, 10] {
        copy_range_async(&mut dev, blk * BLK, &ha, blk * BLK, BLK, &a).unwrap();
    }
    still_pending(
        !b.is_idle().unwrap(),
        "B's write is pending behind the spin kernel",
    );
    let back = dev.to_vec().unwrap();
    for blk in [0, 2, 4, 6, 12, 10] {
        assert_eq!(
            first_diff(&back, &pa, blk),
            None,
            "block {blk}: A's write did not land last (block 10: B's pending write came after)"
        );
    }
}

/// A wait stands for another stream's work only as it was: stream A's write to block 10 waited
/// for stream B's read of it; B then reads block 10 again (pending behind a slow kernel), and
/// A writes five other blocks (whose hull covers block 10) and block 10 again. That write
/// must wait for B's second read, which must see A's first write's data, not the second's: a
/// publication that trusted A's old wait would let the write through.
#[test]
fn an_old_wait_does_not_let_a_fast_write_past_a_new_pending_read() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 16 * BLK;
    let (p1, p2) = (pattern(n, 31), pattern(n, 32));
    let h1 = PinnedBuffer::from_slice(&p1, HostAllocFlags::DEFAULT).unwrap();
    let h2 = PinnedBuffer::from_slice(&p2, HostAllocFlags::DEFAULT).unwrap();
    let mut got = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let [a, b] = crate::streams();
    copy_range_async(&mut got, 10 * BLK, &dev, 10 * BLK, BLK, &b).unwrap();
    copy_range_async(&mut dev, 10 * BLK, &h1, 10 * BLK, BLK, &a).unwrap();
    probes.spin(SPIN, &b).unwrap();
    copy_range_async(&mut got, 10 * BLK, &dev, 10 * BLK, BLK, &b).unwrap();
    for blk in [0, 2, 4, 6, 12, 10] {
        copy_range_async(&mut dev, blk * BLK, &h2, blk * BLK, BLK, &a).unwrap();
    }
    still_pending(
        !b.is_idle().unwrap(),
        "B's read is pending behind the spin kernel",
    );
    let read = got.as_slice().unwrap();
    assert_eq!(
        first_diff(read, &p1, 10),
        None,
        "B's read saw A's later write: the write was not ordered after the pending read"
    );
    let back = dev.to_vec().unwrap();
    assert_eq!(first_diff(&back, &p2, 10), None, "A's last write is lost");
}

/// The common case the publication beside another stream is for: stream B read the buffer
/// once (and A waited for that read); A then keeps writing it (fast), and B's next read,
/// queued while A's last write is pending behind a slow kernel, sees that last write.
#[test]
fn fast_writes_beside_a_waited_reader_are_seen_by_its_next_read() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let n = 16 * BLK;
    let data: Vec<Vec<u32>> = (0..4).map(|s| pattern(n, 40 + s)).collect();
    let hosts: Vec<PinnedBuffer<u32>> = data
        .iter()
        .map(|d| PinnedBuffer::from_slice(d, HostAllocFlags::DEFAULT).unwrap())
        .collect();
    let mut got = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(n).unwrap();
    let [a, b] = crate::streams();
    copy_range_async(&mut got, 0, &dev, 0, n, &b).unwrap();
    copy_range_async(&mut dev, 0, &hosts[0], 0, n, &a).unwrap();
    copy_range_async(&mut dev, 0, &hosts[1], 0, n, &a).unwrap();
    copy_range_async(&mut dev, 0, &hosts[2], 0, n, &a).unwrap();
    probes.spin(SPIN, &a).unwrap();
    copy_range_async(&mut dev, 0, &hosts[3], 0, n, &a).unwrap();
    copy_range_async(&mut got, 0, &dev, 0, n, &b).unwrap();
    still_pending(
        !a.is_idle().unwrap(),
        "A's last write is pending behind the spin kernel",
    );
    let read = got.as_slice().unwrap();
    for blk in 0..16 {
        assert_eq!(
            first_diff(read, &data[3], blk),
            None,
            "block {blk}: B's read did not wait for A's last (fast) write"
        );
    }
}
