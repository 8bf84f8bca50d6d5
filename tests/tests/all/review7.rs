//! Review 7: the exact refusals of work that a stream capture cannot take, each compared with
//! the crate's text (copied here: the constants are not public) and the operation it names, so
//! that a refusal for another reason, or from another place, fails the test. GPU-only (each test
//! SKIPs without a GPU). The refusal of IPC steps on a capturing stream is tested in `ipc.rs`
//! (`an_import_on_a_capturing_stream_...` and the tests after it). `OPS_HELD` (a capture begin
//! giving up after 10 s) is tested by the crate's unit tests (`fence::capture`).

use cuda_mem::interop::cudarc::cudarc_stream;
use cuda_mem::{memset_async, CaptureMode, DeviceBuffer, DevicePtrMut as _, MemPool, Stream};
use cuda_mem_tests::gpu_or_skip;

use crate::ipc::{assert_misuse, inside_a_capture};
use crate::pattern;

/// `ops::graph::GRAPH_INTO_CAPTURE`, copied.
const GRAPH_INTO_CAPTURE: &str =
    "the stream is capturing: a graph launched there would become a node of the capture's graph, \
     which would not keep this graph's buffers; launch it after the capture ends, or capture its \
     work itself";
/// `fence::capture::CAPTURE_ELSEWHERE`, copied.
const CAPTURE_ELSEWHERE: &str =
    "another thread is capturing on this stream (or beginning to): the allocation would be \
     graph memory of a capture this thread does not own, or land in it or not by timing; \
     allocate inside the capture's closure";
/// `fence::capture::FOREIGN_CAPTURED`, copied.
const FOREIGN_CAPTURED: &str =
    "work on the buffer was queued on a stream that another library began capturing while the \
     work was being queued: it may be a node of that graph, so the buffer is never used, waited \
     for or freed again (it is leaked)";

/// 256 KiB of `u32`.
const N: usize = 1 << 16;

/// An executable graph uploaded, or launched, on a stream that is capturing (here the
/// capture's own stream, on the capturing thread) is refused with `GRAPH_INTO_CAPTURE`, each
/// naming its operation, before anything is queued: the capture holds only its memset. The
/// graph then uploads and launches outside the capture, and its work lands.
#[test]
fn review7_an_upload_or_launch_into_a_capturing_stream_is_the_exact_refusal() {
    let _dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let mut a = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let exec = s
        .capture(CaptureMode::ThreadLocal, &mut a, |cap, a| {
            a.memset_async(0x21, cap.stream())
        })
        .unwrap()
        .instantiate()
        .unwrap();
    inside_a_capture(&s, CaptureMode::ThreadLocal, 1, |cs| {
        let e = exec.upload(cs).unwrap_err();
        assert_misuse(&e, "GraphExec::upload", GRAPH_INTO_CAPTURE);
        let e = exec.launch(cs).unwrap_err();
        assert_misuse(&e, "GraphExec::launch", GRAPH_INTO_CAPTURE);
    });
    exec.upload(&s).unwrap();
    exec.launch(&s).unwrap();
    assert_eq!(
        exec.into_resources().unwrap().to_vec().unwrap(),
        vec![0x2121_2121u32; N]
    );
}

/// A stream-ordered allocation on a stream that another thread is capturing on is refused
/// with `CAPTURE_ELSEWHERE` ("stream-ordered allocation"), before the allocation call: not
/// made graph memory of a capture that thread does not own. The capture stays valid (only its
/// memset); the same allocation after it succeeds and is ordinary memory (a host read works).
#[test]
fn review7_a_pool_allocation_on_a_stream_another_thread_captures_is_the_exact_refusal() {
    let dev = gpu_or_skip!();
    let pool = MemPool::new(dev).unwrap();
    let s = Stream::non_blocking().unwrap();
    inside_a_capture(&s, CaptureMode::ThreadLocal, 2, |_| {
        let r = std::thread::scope(|sc| {
            sc.spawn(|| DeviceBuffer::<u32>::from_pool(&pool, N, &s).map(|b| b.len()))
                .join()
                .unwrap()
        });
        let e = r.expect_err("another thread allocated on the capturing stream");
        assert_misuse(&e, "stream-ordered allocation", CAPTURE_ELSEWHERE);
    });
    let mut b = DeviceBuffer::<u32>::from_pool(&pool, N, &s).unwrap();
    memset_async(&mut b, 0x22, &s).unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![0x2222_2222u32; N]);
}

/// A buffer whose work may be a node of another library's graph (a write guard on a stream
/// lent to cudarc, dropped while cudarc's own capture is open on it) is given up: every later
/// use is refused with `FOREIGN_CAPTURED`, each from its place, with its operation: queueing
/// work on another stream ("queueing work"), a host wait ("host wait"), giving it to a capture
/// ("Stream::capture"), the free of a pooled buffer ("free"), the free of a `cudaMalloc`
/// buffer (its host wait). Nothing is freed (the memory leaks, by design). A buffer left alone
/// meanwhile is unaffected (the control).
#[test]
fn review7_a_buffer_given_up_to_a_foreign_capture_refuses_each_use_exactly() {
    let dev = gpu_or_skip!();
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let s = Stream::non_blocking().unwrap();
    let other = Stream::non_blocking().unwrap();
    let pool = MemPool::new(dev).unwrap();
    let mut pooled = DeviceBuffer::<u32>::from_pool(&pool, N, &s).unwrap();
    let mut plain = DeviceBuffer::<u32>::zeroed(N).unwrap();
    let control = DeviceBuffer::from_slice(&pattern(N, 71)).unwrap();
    let cs = cudarc_stream(&s).unwrap(); // lent from here on
    {
        let gp = pooled.device_ptr_mut(&s).unwrap();
        let gm = plain.device_ptr_mut(&s).unwrap();
        cs.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .unwrap();
        // Their ends see cudarc's capture open: work through them may be in its graph.
        drop(gp);
        drop(gm);
        let g = cs.end_capture(CUgraphInstantiate_flags(0)).unwrap();
        drop(g); // never launched
    }
    let e = memset_async(&mut plain, 0, &other).unwrap_err();
    assert_misuse(&e, "queueing work", FOREIGN_CAPTURED);
    let e = plain.synchronize().unwrap_err();
    assert_misuse(&e, "host wait", FOREIGN_CAPTURED);
    let e = other
        .capture(CaptureMode::ThreadLocal, (&plain,), |_, _| Ok(()))
        .map(drop)
        .unwrap_err();
    assert_misuse(&e, "Stream::capture", FOREIGN_CAPTURED);
    let e = pooled.free().unwrap_err();
    assert_misuse(&e, "free", FOREIGN_CAPTURED);
    let e = plain.free().unwrap_err();
    assert_misuse(&e, "host wait", FOREIGN_CAPTURED);
    assert_eq!(control.to_vec().unwrap(), pattern(N, 71));
}
