//! Several processes (issue 23): a parent and a child that the test spawns (this executable
//! again, `ipc::ipc_child`) share device memory through `cuda_mem::ipc`, both paths (legacy
//! IPC handles, a shareable pool), ordered by the fence, freed only once the importer closed.
//!
//! Where a sandbox refuses CUDA IPC, the tests print `SKIP` with the exact error, unless
//! `CUDA_MEM_REQUIRE_IPC=1` (set it where IPC is known to work, such as the H200), which turns
//! the refusal into a failure.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use cuda_mem::ipc::{
    Back, Channel, Exporter, HandleKind, ImportedBuffer, Importer, IpcHandle, Listener,
};
use cuda_mem::{
    memset_async, sys, CaptureMode, DeviceBuffer, DevicePtrMut as _, Error, MemPool, Misuse, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{gpu_or_skip, run_child, still_pending};

use crate::{first_not_written, pattern, SPIN};

const SOCKET: &str = "CUDA_MEM_IPC_SOCKET";
const ROLE: &str = "CUDA_MEM_IPC_ROLE";
const T: Duration = Duration::from_secs(120);
const ROUNDS: u64 = 1000;

/// The crate's refusal of an import on a capturing stream (`ipc::IMPORT_INTO_CAPTURE`, copied:
/// the constant is not public).
pub(crate) const IMPORT_INTO_CAPTURE: &str =
    "the stream is capturing: an import cannot be recorded into a graph (the wait for the \
     exporter's event would be a node that runs only at launch, and the mapping would count as \
     graph memory the capture keeps); import on a stream that is not capturing, and let the \
     capture use the imported buffer";
/// `ipc::PASS_INTO_CAPTURE`, copied.
pub(crate) const PASS_INTO_CAPTURE: &str =
    "the stream is capturing: the event the other process waits for would be recorded into the \
     graph (a node, not a record), so it would wait for nothing; offer or pass the buffer on a \
     stream that is not capturing";
/// `ipc::TAKE_BACK_INTO_CAPTURE`, copied.
pub(crate) const TAKE_BACK_INTO_CAPTURE: &str =
    "the stream is capturing: the wait for the other process's pass would be a node of the \
     graph, run only at launch, and work on the buffer after the capture would not wait for \
     that process's writes; take the buffer back on a stream that is not capturing";
/// `fence::capture::LEGACY_DURING_CAPTURE`, copied.
pub(crate) const LEGACY_DURING_CAPTURE: &str =
    "a stream capture is open: the legacy default stream (synchronous copies and memsets, \
     `zeroed`) would join or invalidate it; use copy_async / memset_async on a stream";

/// `e` is exactly `Misuse::InvalidArgument { op, reason }`.
#[track_caller]
pub(crate) fn assert_misuse(e: &Error, op: &str, reason: &str) {
    match e.misuse() {
        Some(Misuse::InvalidArgument { op: o, reason: r }) => {
            assert_eq!((*o, r.as_str()), (op, reason), "not the exact refusal")
        }
        _ => panic!("not Misuse::InvalidArgument from {op}: {e}"),
    }
}

/// The number of nodes in the graph `g`.
pub(crate) fn node_count(g: sys::cudaGraph_t) -> usize {
    let mut n = 0usize;
    // SAFETY: a live graph (its owner outlives the call); a null node array asks for the count.
    let code = unsafe { sys::cudaGraphGetNodes(g, std::ptr::null_mut(), &mut n) };
    assert_eq!(code, sys::cudaError::cudaSuccess);
    n
}

/// Runs `inside` (given the capturing stream) in a capture on `s` in `mode` whose only work is
/// a memset of a scratch buffer to `v`: the capture must end `Ok` (a refused step inside did
/// not invalidate it) with that one node (nothing of the step was captured), and its replay
/// must write the scratch buffer.
#[track_caller]
pub(crate) fn inside_a_capture(s: &Stream, mode: CaptureMode, v: u8, inside: impl FnOnce(&Stream)) {
    let mut scratch = DeviceBuffer::<u32>::zeroed(1024).unwrap();
    let graph = s
        .capture(mode, &mut scratch, |cap, x| {
            inside(cap.stream());
            x.memset_async(v, cap.stream())
        })
        .unwrap_or_else(|e| panic!("the capture did not end Ok: {e}"));
    assert_eq!(
        node_count(graph.as_raw()),
        1,
        "the capture holds more than its memset: the refused step was captured"
    );
    let exec = graph.instantiate().unwrap();
    exec.launch(s).unwrap();
    let scratch = exec.into_resources().unwrap();
    assert!(
        scratch
            .to_vec()
            .unwrap()
            .iter()
            .all(|&w| w == u32::from_ne_bytes([v; 4])),
        "the capture's replay did not write its memset"
    );
}

/// Whether a CUDA refusal may be a skip (not under `CUDA_MEM_REQUIRE_IPC=1`).
fn ipc_refused_is_skip(test: &str, e: &Error) -> bool {
    if e.code().is_none() {
        return false;
    }
    assert!(
        std::env::var("CUDA_MEM_REQUIRE_IPC").as_deref() != Ok("1"),
        "{test}: CUDA_MEM_REQUIRE_IPC=1 but CUDA refused IPC: {e}"
    );
    cuda_mem_tests::skip(&format!("{test}: CUDA refused IPC here: {e}"));
    true
}

/// A listener at a fresh path, and the child started with `role` connecting to it: the
/// child's thread yields (success, output).
fn spawn(role: &str) -> (Listener, std::thread::JoinHandle<(bool, String)>) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("cuda-mem-ipc-{}-{n}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = Listener::bind(&path).unwrap();
    let (p, r) = (path.display().to_string(), role.to_string());
    let child = std::thread::spawn(move || {
        run_child(
            "ipc::ipc_child",
            &[(SOCKET, &p), (ROLE, &r)],
            Duration::from_secs(300),
        )
        .unwrap_or_else(|e| (false, e.to_string()))
    });
    (l, child)
}

fn join(child: std::thread::JoinHandle<(bool, String)>) -> String {
    let (ok, out) = child.join().unwrap();
    assert!(ok, "child failed:\n{out}");
    assert!(!out.contains("panicked"), "{out}");
    out
}

/// The byte written before read `r` of the ping-pong (never 0, differs from its neighbours).
fn byte(r: u64) -> u8 {
    (r % 251) as u8 + 1
}

/// The child half: does nothing unless started by a test of this module.
#[test]
fn ipc_child() {
    let (Ok(path), Ok(role)) = (std::env::var(SOCKET), std::env::var(ROLE)) else {
        return;
    };
    let chan = Channel::connect(&path).unwrap();
    let s = Stream::non_blocking().unwrap();
    let accept = |chan| match Importer::<u32>::accept(chan, &s, T) {
        Ok(i) => Some(i),
        Err(e) => {
            println!("CHILD REFUSED {e}");
            None
        }
    };
    match role.as_str() {
        "gib" => {
            let Some(mut imp) = accept(chan) else { return };
            println!("CHILD PENDING {}", !imp.peer_work_done().unwrap());
            let got = imp.buffer().unwrap().to_vec().unwrap();
            println!("CHILD FIRST-WRONG {:?}", first_not_written(&got));
            drop(got);
            memset_async(&mut imp.buffer_mut().unwrap(), 0x5a, &s).unwrap();
            imp.pass(&s).unwrap();
            imp.close().unwrap();
            println!("CHILD CLOSED");
        }
        "pingpong" => {
            let Some(mut imp) = accept(chan) else { return };
            let probes = Probes::load().unwrap();
            let (mut stale, mut pending) = (0u64, 0u64);
            for r in (1..=ROUNDS).step_by(2) {
                if r > 1 {
                    imp.take_back(&s, T).unwrap();
                }
                pending += u64::from(!imp.peer_work_done().unwrap());
                let got = imp.buffer().unwrap().to_vec().unwrap();
                stale += u64::from(got.iter().any(|&w| w != u32::from_ne_bytes([byte(r); 4])));
                if r < ROUNDS {
                    probes.spin(200_000, &s).unwrap();
                    memset_async(&mut imp.buffer_mut().unwrap(), byte(r + 1), &s).unwrap();
                    imp.pass(&s).unwrap();
                }
            }
            imp.close().unwrap();
            println!("CHILD STALE {stale} PENDING {pending}");
        }
        "control" => {
            let Some(mut imp) = accept(chan) else { return };
            let n = imp.buffer().unwrap().len();
            imp.pass(&s).unwrap();
            let (mut stale, mut wrong) = (0, 0);
            for i in 1..=5u8 {
                imp.take_back(&s, T).unwrap();
                let b = imp.buffer().unwrap();
                // Unordered: a raw copy on the legacy stream, which does not wait for the
                // non-blocking streams (ours, the exporter's) nor for the exporter's event.
                let mut raw = vec![0u32; n];
                // SAFETY: `raw` holds `n` u32; the mapping lives (we hold the importer).
                let code = unsafe {
                    sys::cudaMemcpy(
                        raw.as_mut_ptr().cast(),
                        b.as_ptr().cast(),
                        n * 4,
                        sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
                    )
                };
                assert_eq!(code, sys::cudaError::cudaSuccess);
                let want = u32::from_ne_bytes([i; 4]);
                stale += u32::from(raw.iter().any(|&w| w != want));
                // Ordered: through the fence.
                wrong += u32::from(b.to_vec().unwrap().iter().any(|&w| w != want));
                imp.pass(&s).unwrap();
            }
            println!("CHILD UNORDERED-STALE {stale} OF 5 ORDERED-WRONG {wrong}");
        }
        "exit" => {
            // The exporter: shares 64 MiB, takes it back once, then exits without closing.
            let mut buf = DeviceBuffer::<u32>::uninit(16 << 20).unwrap();
            memset_async(&mut buf, 0x3c, &s).unwrap();
            let mut exp = cuda_mem::ipc::Exporter::offer(buf, chan, &s).unwrap();
            assert_eq!(exp.take_back(&s, T).unwrap(), Back::Passed);
            println!("EXPORTER EXITING");
            std::process::exit(0);
        }
        "stale" => {
            // Opens, keeps the handle, closes; once the exporter freed the memory (a byte on
            // the second connection), opens the old handle again.
            let mut signal = UnixStream::connect(&path).unwrap();
            let Some(imp) = accept(chan) else { return };
            let handle: IpcHandle = *imp.handle();
            imp.close().unwrap();
            let mut b = [0];
            signal.read_exact(&mut b).unwrap();
            // SAFETY: the exporter freed the memory already (that is the test); CUDA is
            // expected to refuse the handle, and an opened buffer is dropped unused.
            match unsafe { ImportedBuffer::<u32>::open(&handle, None, &s) } {
                Ok(_) => println!("STALE OPENED"),
                Err(e) => println!("STALE code={:?} {e}", e.code().map(|c| c.0)),
            }
        }
        "alone" => {
            // Takes the handle from an importer it closes at once; once the exporter says so
            // (a byte on the second connection), opens it alone, twice: a write pending at
            // `free`, then one pending at `into_raw`, whose mapping this side closes itself.
            let mut signal = UnixStream::connect(&path).unwrap();
            let Some(imp) = accept(chan) else { return };
            let handle: IpcHandle = *imp.handle();
            imp.close().unwrap();
            let mut b = [0];
            signal.read_exact(&mut b).unwrap();
            let probes = Probes::load().unwrap();
            // SAFETY: the exporter keeps the memory and its event, and leaves them alone,
            // until this side's byte below.
            let open = || unsafe { ImportedBuffer::<u32>::open(&handle, None, &s) }.unwrap();
            let mut buf = open();
            println!(
                "CHILD KIND {:?} LEN {} SAME-DEVICE {} READ {}",
                buf.kind(),
                buf.len(),
                buf.device() == s.device(),
                buf.to_vec().unwrap() == pattern(buf.len(), 7)
            );
            probes.spin(SPIN, &s).unwrap();
            memset_async(&mut buf, 0x11, &s).unwrap();
            let pending = !s.is_idle().unwrap();
            buf.free().unwrap();
            // (Opened again and dropped at once: one mapping of the handle at a time.)
            let freed = open().to_vec().unwrap().iter().all(|&w| w == 0x1111_1111);
            println!("CHILD FREE PENDING {pending} WRITTEN {freed}");
            let mut buf = open();
            let bytes = buf.byte_len();
            probes.spin(SPIN, &s).unwrap();
            {
                let w = buf.device_ptr_mut(&s).unwrap();
                // SAFETY: the guard's device memory, written on its stream while it lives.
                unsafe { probes.write(w.as_mut_ptr().cast(), bytes, &s).unwrap() };
            }
            let pending = !s.is_idle().unwrap();
            let (p, len) = buf.into_raw().unwrap();
            let idle = s.is_idle().unwrap();
            // SAFETY: the mapping `into_raw` handed over, closed once, its work done.
            let code = unsafe { sys::cudaIpcCloseMemHandle(p.cast()) };
            // (The code's name, not its `Debug` form: bindgen's newtype prints `cudaError(0)`.)
            let close = cuda_mem::ErrorCode::from(code).name();
            println!("CHILD RAW PENDING {pending} IDLE {idle} LEN {len} CLOSE {close}");
            signal.write_all(&[1]).unwrap();
        }
        "capture" => {
            // The exporter of `an_import_refused_inside_a_capture_...`: its first offer is
            // refused by the parent's import inside a capture (told, so the buffer comes
            // back); the second, written behind a slow kernel, is imported outside it.
            let probes = Probes::load().unwrap();
            let buf = DeviceBuffer::<u32>::zeroed(CAPTURE_N).unwrap();
            let first = Exporter::offer(buf, chan, &s);
            let mut signal = UnixStream::connect(&path).unwrap();
            let mut exp = match first {
                Ok(e) => e,
                Err(e) => {
                    println!("CHILD REFUSED {e}");
                    signal.write_all(&[0]).unwrap();
                    return;
                }
            };
            signal.write_all(&[1]).unwrap(); // the offer is on the channel
            let e = exp.take_back(&s, T).unwrap_err();
            println!("CHILD FIRST {e}");
            let mut buf = exp.close(T).unwrap();
            // (Pending well past the parent's open of the handle.)
            probes.spin(3 * SPIN, &s).unwrap();
            memset_async(&mut buf, 0x78, &s).unwrap();
            let chan = Channel::connect(&path).unwrap();
            let mut exp = Exporter::offer(buf, chan, &s).unwrap();
            // A take-back inside a capture: refused before anything is read, so the parent's
            // pass is still there for the take-back after it.
            inside_a_capture(&s, CaptureMode::ThreadLocal, 5, |cs| {
                let e = exp.take_back(cs, T).unwrap_err();
                assert_misuse(&e, "Exporter::take_back", TAKE_BACK_INTO_CAPTURE);
            });
            assert_eq!(exp.take_back(&s, T).unwrap(), Back::Passed);
            let got = exp.buffer().unwrap().to_vec().unwrap();
            println!("CHILD READ-BACK {}", got.iter().all(|&w| w == 0x5a5a_5a5a));
            // A pass inside a capture: refused, and this side still holds the buffer.
            inside_a_capture(&s, CaptureMode::ThreadLocal, 6, |cs| {
                let e = exp.pass(cs).unwrap_err();
                assert_misuse(&e, "Exporter::pass", PASS_INTO_CAPTURE);
            });
            println!("CHILD HELD {}", exp.is_held());
            exp.close(T).unwrap();
            println!("CHILD CLOSED");
        }
        r => panic!("unknown role {r}"),
    }
}

/// 1 GiB each way, bit-exact, through `kind`: the parent's pending write (behind a slow
/// kernel) is what the child reads; the child's memset is what the parent reads.
fn gib_round_trip(test: &str, kind: HandleKind) {
    let dev = gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let n = 1 << 28; // u32: 1 GiB
    let mut buf = match kind {
        HandleKind::Pool => match MemPool::shareable(dev) {
            Ok(p) => DeviceBuffer::<u32>::from_pool(&p, n, &s).unwrap(),
            Err(e) if ipc_refused_is_skip(test, &e) => return,
            Err(e) => panic!("{e}"),
        },
        _ => DeviceBuffer::<u32>::uninit(n).unwrap(),
    };
    let (l, child) = spawn("gib");
    let chan = l.accept(T).unwrap();
    // The child has connected and now starts CUDA: the write stays pending well past that.
    probes.spin(10 * SPIN, &s).unwrap();
    {
        let w = buf.device_ptr_mut(&s).unwrap();
        // SAFETY: the guard's 1 GiB of device memory, written on its stream while it lives.
        unsafe { probes.write(w.as_mut_ptr().cast(), n * 4, &s).unwrap() };
    }
    let mut exp = match cuda_mem::ipc::Exporter::offer(buf, chan, &s) {
        Ok(e) => e,
        Err(e) if ipc_refused_is_skip(test, &e) => return,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(exp.kind(), kind);
    assert!(exp.buffer().is_err(), "the exporter reached a lent buffer");
    match exp.take_back(&s, T) {
        Ok(Back::Passed) => {}
        Err(e) if ipc_refused_is_skip(test, &e) => {
            drop(exp);
            join(child);
            return;
        }
        r => panic!("{r:?}"),
    }
    let back = exp.buffer().unwrap().to_vec().unwrap();
    let wrong = back.iter().filter(|&&w| w != 0x5a5a_5a5a).count();
    drop(back);
    let buf = exp.close(T).unwrap();
    assert_eq!(buf.len(), n);
    let out = join(child);
    still_pending(
        out.contains("CHILD PENDING true"),
        "the parent's write had finished before the child opened the buffer",
    );
    assert!(out.contains("CHILD FIRST-WRONG None"), "{out}");
    assert!(out.contains("CHILD CLOSED"), "{out}");
    assert_eq!(
        wrong, 0,
        "the parent read {wrong} words the child did not write"
    );
}

#[test]
fn a_gib_crosses_processes_bit_exact_through_legacy_handles() {
    gib_round_trip(
        "a_gib_crosses_processes_bit_exact_through_legacy_handles",
        HandleKind::Legacy,
    );
}

#[test]
fn a_gib_crosses_processes_bit_exact_through_a_shareable_pool() {
    gib_round_trip(
        "a_gib_crosses_processes_bit_exact_through_a_shareable_pool",
        HandleKind::Pool,
    );
}

/// 1,000 reads alternating between the processes, each after the other side's write behind
/// a 200 µs kernel: the fence's ordering leaves no stale read, and the writes were pending when
/// the reader took the buffer (else the test showed nothing).
#[test]
fn a_ping_pong_of_1000_rounds_reads_nothing_stale() {
    const TEST: &str = "a_ping_pong_of_1000_rounds_reads_nothing_stale";
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let mut buf = DeviceBuffer::<u32>::uninit(64 << 10).unwrap();
    probes.spin(200_000, &s).unwrap();
    memset_async(&mut buf, byte(1), &s).unwrap();
    let (l, child) = spawn("pingpong");
    let mut exp = match cuda_mem::ipc::Exporter::offer(buf, l.accept(T).unwrap(), &s) {
        Ok(e) => e,
        Err(e) if ipc_refused_is_skip(TEST, &e) => return,
        Err(e) => panic!("{e}"),
    };
    let mut stale = 0;
    for r in (2..=ROUNDS).step_by(2) {
        match exp.take_back(&s, T) {
            Ok(Back::Passed) => {}
            Err(e) if r == 2 && ipc_refused_is_skip(TEST, &e) => {
                drop(exp);
                join(child);
                return;
            }
            other => panic!("round {r}: {other:?}"),
        }
        let got = exp.buffer().unwrap().to_vec().unwrap();
        stale += u64::from(got.iter().any(|&w| w != u32::from_ne_bytes([byte(r); 4])));
        if r < ROUNDS {
            probes.spin(200_000, &s).unwrap();
            memset_async(&mut exp.buffer_mut().unwrap(), byte(r + 1), &s).unwrap();
            exp.pass(&s).unwrap();
        }
    }
    exp.close(T).unwrap();
    let out = join(child);
    assert_eq!(stale, 0, "the parent read stale data in {stale} rounds");
    let line = out
        .lines()
        .find_map(|l| marked(l, "CHILD STALE"))
        .unwrap_or_else(|| panic!("{out}"));
    let f: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
    assert_eq!(f[0], 0, "the child read stale data: {line}");
    still_pending(
        f[1] >= ROUNDS / 4,
        &format!(
            "the parent's writes had mostly finished before the child took the buffer: {line}"
        ),
    );
}

/// The control: the same hand-over read without the ordering (a raw copy that waits for no
/// event) sees the old data, while the ordered read of the same round sees the new.
#[test]
fn without_the_ordering_a_reader_sees_stale_data() {
    const TEST: &str = "without_the_ordering_a_reader_sees_stale_data";
    gpu_or_skip!();
    let probes = Probes::load().unwrap();
    let s = Stream::non_blocking().unwrap();
    let buf = DeviceBuffer::<u32>::zeroed(1 << 20).unwrap();
    buf.synchronize().unwrap();
    let (l, child) = spawn("control");
    let mut exp = match cuda_mem::ipc::Exporter::offer(buf, l.accept(T).unwrap(), &s) {
        Ok(e) => e,
        Err(e) if ipc_refused_is_skip(TEST, &e) => return,
        Err(e) => panic!("{e}"),
    };
    // The child passes at once; then five times: this side writes behind a 50 ms kernel
    // and passes, the child reads unordered and ordered and passes back.
    for i in 1..=5u8 {
        match exp.take_back(&s, T) {
            Ok(Back::Passed) => {}
            Err(e) if i == 1 && ipc_refused_is_skip(TEST, &e) => {
                drop(exp);
                join(child);
                return;
            }
            other => panic!("{other:?}"),
        }
        probes.spin(50_000_000, &s).unwrap();
        memset_async(&mut exp.buffer_mut().unwrap(), i, &s).unwrap();
        exp.pass(&s).unwrap();
    }
    assert_eq!(exp.take_back(&s, T).unwrap(), Back::Passed);
    exp.close(T).unwrap();
    let out = join(child);
    let line = out
        .lines()
        .find_map(|l| marked(l, "CHILD UNORDERED-STALE"))
        .unwrap_or_else(|| panic!("{out}"));
    eprintln!("NOTE {TEST}: {line}");
    let f: Vec<u32> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
    assert_eq!(f[2], 0, "an ordered read was stale: {line}");
    assert!(f[0] >= 1, "the unordered reads never raced: {line}");
}

/// The exporter's process exits while this process holds its buffer: the channel says the
/// peer is gone (exact error), so the protocol never reads memory the exporter's exit freed;
/// what CUDA itself does with the open mapping is printed (see docs/ipc.md).
#[test]
fn an_exporter_that_exits_early_is_an_error_not_a_read_of_freed_memory() {
    const TEST: &str = "an_exporter_that_exits_early_is_an_error_not_a_read_of_freed_memory";
    gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let (l, child) = spawn("exit");
    let chan = l.accept(T).unwrap();
    let mut imp = match Importer::<u32>::accept(chan, &s, T) {
        Ok(i) => i,
        Err(e) if ipc_refused_is_skip(TEST, &e) => {
            join(child);
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let first = imp.buffer().unwrap().to_vec().unwrap();
    assert!(
        first.iter().all(|&w| w == 0x3c3c_3c3c),
        "the exporter's fill"
    );
    let addr = imp.buffer().unwrap().as_ptr() as usize;
    let n = first.len();
    imp.pass(&s).unwrap();
    let out = join(child);
    assert!(out.contains("EXPORTER EXITING"), "{out}");
    // Our side: the peer is gone, so nothing hands the buffer back.
    match imp.take_back(&s, T).unwrap_err() {
        Error::Os { errno, call } => {
            assert_eq!(errno, libc::ECONNRESET, "{call}");
            assert!(call.contains("the peer closed the channel"), "{call}");
        }
        e => panic!("{e}"),
    }
    assert!(
        imp.buffer().is_err(),
        "the buffer was reachable after the exporter left"
    );
    // What CUDA does with the mapping the exporter's exit left: reported, not asserted.
    let mut raw = vec![0u32; n];
    // SAFETY: `raw` holds `n` u32; the mapping is still open (the importer holds it).
    let code = unsafe {
        sys::cudaMemcpy(
            raw.as_mut_ptr().cast(),
            addr as *const _,
            n * 4,
            sys::cudaMemcpyKind::cudaMemcpyDeviceToHost,
        )
    };
    eprintln!(
        "NOTE {TEST}: after the exporter exited, a raw read of its mapping returned {code:?}, \
         data intact: {}",
        raw.iter().all(|&w| w == 0x3c3c_3c3c)
    );
    // SAFETY: clears the error a failed raw read may have left.
    unsafe { sys::cudaGetLastError() };
    // Closing: the mapping goes; telling the exporter fails (it is gone): EPIPE, or CUDA's
    // refusal to unmap, printed.
    let e = imp.close().unwrap_err();
    eprintln!("NOTE {TEST}: closing after the exporter exited: {e}");
    assert!(
        matches!(e, Error::Os { errno, .. } if errno == libc::EPIPE) || e.code().is_some(),
        "{e}"
    );
}

/// Bad input, each with its exact error and no crash.
#[test]
fn bad_handles_are_exact_errors() {
    let dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    // A garbage handle: refused before CUDA.
    let e = IpcHandle::from_bytes(&[0x5a; IpcHandle::LEN]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("IpcHandle::from_bytes: not a cuda-mem IPC handle"),
        "{e}"
    );
    // A forged one that passes our checks (another process's tag, this device): CUDA refuses
    // it with its own code.
    let forged = forged_handle(dev);
    // SAFETY: a forged handle that names no memory: CUDA refuses it, nothing is mapped.
    let e = unsafe { ImportedBuffer::<u32>::open(&forged, None, &s) }.unwrap_err();
    eprintln!("NOTE bad_handles_are_exact_errors: a forged handle: {e}");
    assert!(e.code().is_some(), "{e}");
    assert!(
        e.call().unwrap().starts_with("cudaIpcOpenMemHandle("),
        "{e}"
    );
    // The wrong element type, and a handle opened in its own process: refused before CUDA,
    // and the exporter is told (so it gets its buffer back).
    let (a, b) = Channel::pair().unwrap();
    let buf = DeviceBuffer::<u32>::zeroed(1024).unwrap();
    let mut exp = match cuda_mem::ipc::Exporter::offer(buf, a, &s) {
        Ok(e) => e,
        Err(e) if ipc_refused_is_skip("bad_handles_are_exact_errors", &e) => return,
        Err(e) => panic!("{e}"),
    };
    let e = Importer::<u64>::accept(b, &s, T).unwrap_err();
    assert_eq!(
        e.misuse(),
        Some(&Misuse::InvalidArgument {
            op: "ImportedBuffer::open",
            reason: "the handle holds elements of 4 bytes; the element type has 8".into()
        })
    );
    let e = exp.take_back(&s, T).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Exporter::take_back: the importer refused the offer before calling CUDA"
    );
    let buf = exp.close(T).unwrap();
    let (a, b) = Channel::pair().unwrap();
    let exp = cuda_mem::ipc::Exporter::offer(buf, a, &s).unwrap();
    let e = Importer::<u32>::accept(b, &s, T).unwrap_err();
    assert!(
        e.to_string()
            .contains("the handle was exported by this process"),
        "{e}"
    );
    exp.close(T).unwrap();
    // A pooled buffer from a pool that is not shareable: refused, naming the fix.
    let pool = MemPool::new(dev).unwrap();
    let buf = DeviceBuffer::<u32>::from_pool(&pool, 1024, &s).unwrap();
    let e = cuda_mem::ipc::Exporter::offer(buf, Channel::pair().unwrap().0, &s).unwrap_err();
    assert!(e.to_string().contains("which is not shareable"), "{e}");
}

/// A handle of memory the exporter has freed (after the importer closed it): CUDA's error,
/// printed with its code, and no crash.
#[test]
fn a_handle_of_freed_memory_is_cudas_error() {
    const TEST: &str = "a_handle_of_freed_memory_is_cudas_error";
    gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let (l, child) = spawn("stale");
    let chan = l.accept(T).unwrap();
    let mut signal = UnixStream::from(l.accept(T).unwrap().into_fd());
    let buf = DeviceBuffer::<u32>::zeroed(1 << 20).unwrap();
    let exp = match cuda_mem::ipc::Exporter::offer(buf, chan, &s) {
        Ok(e) => e,
        Err(e) if ipc_refused_is_skip(TEST, &e) => return,
        Err(e) => panic!("{e}"),
    };
    match exp.close(T) {
        Ok(buf) => buf.free().unwrap(),
        Err(e) if ipc_refused_is_skip(TEST, &e) => {
            join(child);
            return;
        }
        Err(e) => panic!("{e}"),
    }
    signal.write_all(&[1]).unwrap();
    let out = join(child);
    let line = out
        .lines()
        .find_map(|l| marked(l, "STALE"))
        .unwrap_or_else(|| panic!("{out}"));
    eprintln!("NOTE {TEST}: {line}");
    assert!(
        line.starts_with("STALE code=Some("),
        "opening a freed buffer's handle did not fail: {out}"
    );
}

/// `ImportedBuffer` is the shared `Buffer`: opened alone (outside the protocol, legacy handle),
/// it has a `DeviceBuffer`'s accessors and guards, reads the exporter's data, and its `free`
/// and `into_raw` wait for a write still pending on it before the mapping goes (`free`
/// unmaps it, `into_raw` hands it over open: the child's own `cudaIpcCloseMemHandle`
/// succeeds). Unmapping under the pending write would fault it or lose it, which the data
/// the exporter reads afterwards shows.
#[test]
fn an_imported_buffer_opened_alone_unmaps_only_after_its_work() {
    const TEST: &str = "an_imported_buffer_opened_alone_unmaps_only_after_its_work";
    gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let (l, child) = spawn("alone");
    let chan = l.accept(T).unwrap();
    let mut signal = UnixStream::from(l.accept(T).unwrap().into_fd());
    let n = 1 << 20;
    let buf = DeviceBuffer::<u32>::from_slice(&pattern(n, 7)).unwrap();
    let mut exp = match cuda_mem::ipc::Exporter::offer(buf, chan, &s) {
        Ok(e) => e,
        Err(e) if ipc_refused_is_skip(TEST, &e) => return,
        Err(e) => panic!("{e}"),
    };
    // The child's importer closes at once; this side keeps the memory and its event (the
    // exporter is not closed) while the child opens the handle alone.
    match exp.take_back(&s, T) {
        Ok(Back::Closed) => {}
        Err(e) if ipc_refused_is_skip(TEST, &e) => {
            drop(exp);
            join(child);
            return;
        }
        r => panic!("{r:?}"),
    }
    signal.write_all(&[1]).unwrap();
    let mut b = [0];
    if signal.read_exact(&mut b).is_err() {
        join(child);
        panic!("the child closed the connection without its byte");
    }
    let buf = exp.close(T).unwrap();
    let got = buf.to_vec().unwrap();
    let out = join(child);
    let line = |m: &str| {
        out.lines()
            .find_map(|l| marked(l, m))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string()
    };
    assert_eq!(
        line("CHILD KIND"),
        format!("CHILD KIND Legacy LEN {n} SAME-DEVICE true READ true")
    );
    let free = line("CHILD FREE");
    still_pending(
        free.contains("PENDING true"),
        &format!("the child's write had finished before free: {free}"),
    );
    assert!(free.ends_with("WRITTEN true"), "{free}");
    let raw = line("CHILD RAW");
    still_pending(
        raw.contains("PENDING true"),
        &format!("the child's write had finished before into_raw: {raw}"),
    );
    assert!(
        raw.ends_with(&format!("IDLE true LEN {n} CLOSE cudaSuccess")),
        "{raw}"
    );
    assert_eq!(first_not_written(&got), None, "the child's last write");
}

/// The words of the buffer `an_import_refused_inside_a_capture_...` shares.
const CAPTURE_N: usize = 1 << 20;

/// An import on a capturing stream (the bug: it went through the allocation handshake, the
/// mapping became graph memory of the capture, which was then refused at its end, and the
/// mapping leaked) is refused up front with the exact misuse, before CUDA or the channel is
/// touched: through `ImportedBuffer::open` (a forged handle, which CUDA would refuse with its
/// own code if it were reached), on the legacy stream while the capture is open, and through
/// `Importer::accept`, which tells the exporter (its `take_back` says the importer refused
/// before calling CUDA, and `close` gives the buffer back intact). The capture ends `Ok` with
/// only its own memset. GPU; one process (the refusal comes before the handle's
/// own-process check).
#[test]
fn an_import_on_a_capturing_stream_is_refused_before_cuda_and_the_capture_stays_valid() {
    const TEST: &str =
        "an_import_on_a_capturing_stream_is_refused_before_cuda_and_the_capture_stays_valid";
    let dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let data = pattern(CAPTURE_N, 81);
    let buf = DeviceBuffer::from_slice(&data).unwrap();
    let (a, b) = Channel::pair().unwrap();
    let mut exp = match Exporter::offer(buf, a, &s) {
        Ok(e) => e,
        Err(e) if ipc_refused_is_skip(TEST, &e) => return,
        Err(e) => panic!("{e}"),
    };
    let forged = forged_handle(dev);
    inside_a_capture(&s, CaptureMode::ThreadLocal, 7, |cs| {
        // SAFETY: refused before anything is mapped (a forged handle would be CUDA's error).
        let e = unsafe { ImportedBuffer::<u32>::open(&forged, None, cs) }.unwrap_err();
        assert_misuse(&e, "ImportedBuffer::open", IMPORT_INTO_CAPTURE);
        let legacy = Stream::legacy_default();
        // SAFETY: as above.
        let e = unsafe { ImportedBuffer::<u32>::open(&forged, None, &legacy) }.unwrap_err();
        assert_misuse(&e, "ImportedBuffer::open", LEGACY_DURING_CAPTURE);
        let e = Importer::<u32>::accept(b, cs, T).unwrap_err();
        assert_misuse(&e, "Importer::accept", IMPORT_INTO_CAPTURE);
    });
    let e = exp.take_back(&s, T).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Exporter::take_back: the importer refused the offer before calling CUDA"
    );
    let buf = exp.close(T).unwrap();
    assert!(
        buf.to_vec().unwrap() == data,
        "the offered buffer came back changed"
    );
}

/// The exporter's side in one process: an offer on a capturing stream is refused before any
/// runtime call (a buffer from a pool that is not shareable, whose own refusal would otherwise
/// come first), and a take-back on it before the channel is read: the importer's `Refused`
/// is still there for the take-back after the capture. The capture ends `Ok` with only its
/// memset (relaxed mode: the refused offer frees its buffer, on the stream it was allocated
/// on, inside the capture).
#[test]
fn an_offer_or_take_back_on_a_capturing_stream_is_refused_and_the_capture_stays_valid() {
    const TEST: &str =
        "an_offer_or_take_back_on_a_capturing_stream_is_refused_and_the_capture_stays_valid";
    let dev = gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let other = Stream::non_blocking().unwrap();
    let pool = MemPool::new(dev).unwrap();
    let pooled = DeviceBuffer::<u32>::from_pool(&pool, 1024, &other).unwrap();
    let data = pattern(CAPTURE_N, 82);
    let (a, b) = Channel::pair().unwrap();
    let mut exp = match Exporter::offer(DeviceBuffer::from_slice(&data).unwrap(), a, &s) {
        Ok(e) => e,
        Err(e) if ipc_refused_is_skip(TEST, &e) => return,
        Err(e) => panic!("{e}"),
    };
    // Refused (its own process): the exporter is told.
    let e = Importer::<u32>::accept(b, &s, T).unwrap_err();
    assert!(
        e.to_string()
            .contains("the handle was exported by this process"),
        "{e}"
    );
    let (c, _d) = Channel::pair().unwrap();
    inside_a_capture(&s, CaptureMode::Relaxed, 8, |cs| {
        let e = Exporter::offer(pooled, c, cs).unwrap_err();
        assert_misuse(&e, "Exporter::offer", PASS_INTO_CAPTURE);
        let e = exp.take_back(cs, T).unwrap_err();
        assert_misuse(&e, "Exporter::take_back", TAKE_BACK_INTO_CAPTURE);
    });
    let e = exp.take_back(&s, T).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Exporter::take_back: the importer refused the offer before calling CUDA",
        "the take-back inside the capture read (and lost) the importer's message"
    );
    assert!(exp.close(T).unwrap().to_vec().unwrap() == data);
}

/// Two processes, the child exporting: the parent's import of the first offer inside a
/// capture is refused (exact), the capture ends `Ok`, and the exporter, told, gets its buffer
/// back. The second offer, its write still pending behind a slow kernel, is imported on the
/// same stream outside the capture and reads what the exporter wrote. Then a pass inside a
/// capture is refused (the importer still holds the buffer); the pass after it reaches the
/// exporter, whose own take-back inside a capture was refused without reading it, and a
/// take-back inside a capture here is refused too. GPU.
#[test]
fn an_import_refused_inside_a_capture_succeeds_after_it_and_reads_the_exporters_data() {
    const TEST: &str =
        "an_import_refused_inside_a_capture_succeeds_after_it_and_reads_the_exporters_data";
    gpu_or_skip!();
    let s = Stream::non_blocking().unwrap();
    let (l, child) = spawn("capture");
    let chan = l.accept(T).unwrap();
    let mut signal = UnixStream::from(l.accept(T).unwrap().into_fd());
    let mut b = [0];
    signal.read_exact(&mut b).unwrap();
    if b[0] == 0 {
        let out = join(child);
        let line = out
            .lines()
            .find_map(|l| marked(l, "CHILD REFUSED"))
            .unwrap();
        assert!(
            std::env::var("CUDA_MEM_REQUIRE_IPC").as_deref() != Ok("1"),
            "{TEST}: CUDA_MEM_REQUIRE_IPC=1 but the exporter's offer failed: {line}"
        );
        cuda_mem_tests::skip(&format!("{TEST}: the exporter's offer failed: {line}"));
        return;
    }
    inside_a_capture(&s, CaptureMode::ThreadLocal, 9, |cs| {
        let e = Importer::<u32>::accept(chan, cs, T).unwrap_err();
        assert_misuse(&e, "Importer::accept", IMPORT_INTO_CAPTURE);
    });
    let mut imp = match Importer::<u32>::accept(l.accept(T).unwrap(), &s, T) {
        Ok(i) => i,
        Err(e) if ipc_refused_is_skip(TEST, &e) => {
            join(child);
            return;
        }
        Err(e) => panic!("{e}"),
    };
    still_pending(
        !imp.peer_work_done().unwrap(),
        "the exporter's write had finished before the import",
    );
    let got = imp.buffer().unwrap().to_vec().unwrap();
    assert!(
        got.iter().all(|&w| w == 0x7878_7878),
        "the import read data the exporter did not write"
    );
    inside_a_capture(&s, CaptureMode::ThreadLocal, 10, |cs| {
        let e = imp.pass(cs).unwrap_err();
        assert_misuse(&e, "Importer::pass", PASS_INTO_CAPTURE);
    });
    assert!(imp.is_held(), "a refused pass let the buffer go");
    memset_async(&mut imp.buffer_mut().unwrap(), 0x5a, &s).unwrap();
    imp.pass(&s).unwrap();
    inside_a_capture(&s, CaptureMode::ThreadLocal, 11, |cs| {
        let e = imp.take_back(cs, T).unwrap_err();
        assert_misuse(&e, "Importer::take_back", TAKE_BACK_INTO_CAPTURE);
    });
    imp.close().unwrap();
    let out = join(child);
    assert!(
        out.contains(
            "CHILD FIRST Exporter::take_back: the importer refused the offer before calling CUDA"
        ),
        "{out}"
    );
    assert!(out.contains("CHILD READ-BACK true"), "{out}");
    assert!(out.contains("CHILD HELD true"), "{out}");
    assert!(out.contains("CHILD CLOSED"), "{out}");
}

/// A handle that passes the crate's checks (another process's tag, `dev`'s bus id, 1024
/// `u32`) but names no memory: CUDA refuses it with its own code.
fn forged_handle(dev: cuda_mem::Device) -> IpcHandle {
    let mut b = [0u8; IpcHandle::LEN];
    b[..4].copy_from_slice(b"CMIH");
    b[4..6].copy_from_slice(&1u16.to_le_bytes());
    b[6] = 1;
    b[12..20].copy_from_slice(&1u64.to_le_bytes());
    b[20..24].copy_from_slice(&4u32.to_le_bytes());
    b[28..36].copy_from_slice(&1024u64.to_le_bytes());
    let bus = dev.pci_bus_id().unwrap();
    b[44..44 + bus.len()].copy_from_slice(bus.as_bytes());
    b[76..140].fill(0xa7);
    IpcHandle::from_bytes(&b).unwrap()
}

/// Not a GPU test: a truncated offer on the channel is an exact error at the importer, before
/// CUDA is touched.
#[test]
fn a_truncated_offer_is_an_exact_error() {
    let (a, b) = UnixStream::pair().unwrap();
    (&a).write_all(b"CMIP\x01\x00\x01\x00").unwrap();
    drop(a);
    let e =
        Importer::<u32>::accept(Channel::from_stream(b), &Stream::legacy_default(), T).unwrap_err();
    assert_eq!(
        e.to_string(),
        "ipc::Channel::recv: truncated message: 8 of 12 header bytes, then the peer closed the channel"
    );
}

/// The part of `line` from `marker` on: a child's report may follow libtest's
/// `test ipc::ipc_child ... ` on the same line.
fn marked<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.find(marker).map(|i| &line[i..])
}
