//! Review 8: a capture's join of another stream (the capturing thread's work on a buffer given
//! to the capture, queued on a second stream) must not stall on another thread's operation in
//! flight on that stream. GPU-only (SKIPs without a GPU); the same race is pinned on the CPU by
//! the unit tests `fence::tests::a_join_settles_another_threads_work_on_the_buffer_outside_its_lock`
//! and `work_checked_during_a_join_of_its_stream_is_refused_at_once`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cuda_mem::{copy_async, memset_async, CaptureMode, DeviceBuffer, Slice as _, Stream};
use cuda_mem_tests::gpu_or_skip;

use crate::pattern;

/// Words in each half of the shared buffer.
const N: usize = 1 << 12;
/// Captures raced.
const ROUNDS: usize = 300;

/// Whether `e` is one of the exact refusals another thread's work on the joined stream may get
/// while the capture joins it: its check came between the join's note and the join
/// ("joining"), or after the join, for its own buffer ("not given"); or its read was ordered
/// after the capture's stream's work on the buffer (one entry per stream: should the capture's
/// write and earlier work of that stream be merged, "outside").
fn expected_refusal(e: &cuda_mem::Error) -> bool {
    matches!(
        e.misuse(),
        Some(cuda_mem::Misuse::InvalidArgument { reason, .. })
            if reason.starts_with("the capturing thread is joining this stream into its capture")
                || reason.starts_with("the buffer was not given to this capture")
                || reason.starts_with("work outside an open stream capture would wait")
    )
}

/// The capturing thread writes the first half of `x` (given to the capture) on the capture's
/// stream, shares `x` with a thread that copies the second half to a buffer of its own on a
/// stream `t`, again and again, and meanwhile forks onto `t` (copies the first half to `y` there:
/// ordered after the captured write, `t` is joined into the capture). The other thread's copies
/// wait for `x`'s lock while in flight on `t`; when the join waited for them under that lock, the
/// two threads waited for each other for 10 s, then the fork was refused. Each fork must succeed
/// within 1 s, the graph must copy what the capture wrote, each other copy is either `Ok` (and
/// ran: its buffer holds the second half) or one of the exact refusals, and nothing else fails.
#[test]
fn review8_forks_racing_another_threads_work_on_the_joined_stream_never_stall() {
    let _dev = gpu_or_skip!();
    let (c, t) = (
        Stream::non_blocking().unwrap(),
        Stream::non_blocking().unwrap(),
    );
    let hi = pattern(N, 8);
    let mut x = DeviceBuffer::<u32>::zeroed(2 * N).unwrap();
    // Written on `t`: the capture's stream has no work on the second half.
    copy_async(
        &mut x.slice_mut(N..).unwrap(),
        &DeviceBuffer::from_slice(&hi).unwrap(),
        &t,
    )
    .unwrap();
    let mut y = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let mut z = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let (mut slowest, mut other_ok, mut refused) = (Duration::ZERO, 0usize, 0usize);
    for round in 0..ROUNDS {
        // Host reads: the writes of the last round (the launch's, on `c`) are waited for and
        // forgotten, so that the fork joins `t` through `x` (its captured write), not `y`.
        assert_eq!(x.to_vec().unwrap()[N..], hi[..], "round {round}");
        y.to_vec().unwrap();
        let byte = (round % 250 + 1) as u8;
        let mut fork = None;
        let mut other = (0usize, 0usize, Vec::new());
        let graph = c
            .capture(CaptureMode::Relaxed, (&mut x, &mut y), |cap, (x, y)| {
                memset_async(&mut x.slice_mut(..N)?, byte, cap.stream())?;
                let xs: &DeviceBuffer<u32> = x;
                let done = AtomicBool::new(false);
                let (zr, tr, done_r) = (&mut z, &t, &done);
                std::thread::scope(|sc| {
                    let b = sc.spawn(move || {
                        let (mut ok, mut refused, mut errors) = (0, 0, Vec::new());
                        while !done_r.load(Ordering::Relaxed) {
                            match xs.slice(N..).and_then(|src| copy_async(&mut *zr, &src, tr)) {
                                Ok(()) => ok += 1,
                                Err(e) if expected_refusal(&e) => refused += 1,
                                Err(e) => errors.push(e.to_string()),
                            }
                        }
                        (ok, refused, errors)
                    });
                    let start = Instant::now();
                    let r = xs.slice(..N).and_then(|src| copy_async(&mut **y, &src, &t));
                    fork = Some(r.map(|()| start.elapsed()));
                    done.store(true, Ordering::Relaxed);
                    other = b.join().unwrap();
                });
                Ok(())
            })
            .unwrap_or_else(|e| panic!("round {round}: the capture failed: {e}"));
        let took = fork
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: the fork was refused: {e}"));
        assert!(
            took < Duration::from_secs(1),
            "round {round}: the fork waited {took:?} (a join stalled on the other thread's work)"
        );
        slowest = slowest.max(took);
        let (ok, no, errors) = other;
        assert!(
            errors.is_empty(),
            "round {round}: the other thread: {errors:?}"
        );
        other_ok += ok;
        refused += no;
        let exec = graph.instantiate().unwrap();
        exec.launch(&c).unwrap();
        c.synchronize().unwrap();
        drop(exec);
        assert_eq!(
            y.to_vec().unwrap(),
            vec![u32::from_ne_bytes([byte; 4]); N],
            "round {round}: the graph did not copy what the capture wrote"
        );
        t.synchronize().unwrap();
        if ok > 0 {
            assert_eq!(
                z.to_vec().unwrap(),
                hi,
                "round {round}: the other thread's Ok copy did not run"
            );
        }
        z.memset_async(0, &t).unwrap();
    }
    eprintln!(
        "review8: {ROUNDS} forks, slowest {slowest:?}; the other thread's copies: {other_ok} Ok, \
         {refused} refused"
    );
}
