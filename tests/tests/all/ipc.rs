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

use cuda_mem::ipc::{Back, Channel, HandleKind, ImportedBuffer, Importer, IpcHandle, Listener};
use cuda_mem::{
    memset_async, sys, DeviceBuffer, DevicePtrMut as _, Error, MemPool, Misuse, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{gpu_or_skip, run_child, still_pending};

use crate::{first_not_written, pattern, SPIN};

const SOCKET: &str = "CUDA_MEM_IPC_SOCKET";
const ROLE: &str = "CUDA_MEM_IPC_ROLE";
const T: Duration = Duration::from_secs(120);
const ROUNDS: u64 = 1000;

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
    let forged = IpcHandle::from_bytes(&b).unwrap();
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
