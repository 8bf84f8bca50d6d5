//! Review 5 (issue 21: the fence's lock-free path beside other streams' entries): end-to-end
//! checks of what the loom model checks on the bookkeeping. GPU-only (SKIP without one); each
//! asserts data, and fails if the fast path let work past a conflict it must wait for.

use cuda_mem::{copy_async, DeviceBuffer, HostAllocFlags, PinnedBuffer};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{gpu_or_skip, still_pending};

use crate::{pattern, SPIN};

/// 256 KiB of `u32`.
const N: usize = 1 << 16;

/// Stream `b` reads the buffer once; stream `a`'s write waits for that read (its fence then
/// publishes `a`'s marks beside `b`'s entry, which `a` waited for), and `a`'s next write, held
/// behind a spin, takes the lock-free path. A read on `b` afterwards must still wait for that
/// write: no wait `b` made before may stand for it. Fails (the old data arrives) if the fast
/// write is not ordered before `b`'s read.
#[test]
fn review5_a_fast_write_beside_a_waited_reader_is_seen_by_that_reader() {
    let _dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let [sa, sb] = crate::streams();
    let first = PinnedBuffer::from_slice(&pattern(N, 51), HostAllocFlags::DEFAULT).unwrap();
    let second_data = pattern(N, 52);
    let second = PinnedBuffer::from_slice(&second_data, HostAllocFlags::DEFAULT).unwrap();
    let mut d = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut once = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    let mut out = PinnedBuffer::<u32>::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
    copy_async(&mut once, &d, &sb).unwrap();
    copy_async(&mut d, &first, &sa).unwrap();
    probes.spin(SPIN, &sa).unwrap();
    copy_async(&mut d, &second, &sa).unwrap();
    copy_async(&mut out, &d, &sb).unwrap();
    still_pending(
        !sa.is_idle().unwrap(),
        "the spin ended before the read on the other stream was queued",
    );
    let got = out.as_slice().unwrap() == &second_data[..];
    if !got {
        let _ = sa.synchronize();
    }
    assert!(got, "the read on b did not wait for a's fast write");
    assert!(once.as_slice().unwrap().iter().all(|&x| x == 0));
}
