//! A kernel that faults (an illegal address, from embedded PTX), run in a child process: the
//! error is sticky, every later call reports it, and dropping buffers afterwards neither panics
//! nor hangs. Also: a process that exits with live buffers ends cleanly.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use cuda_mem::{DeviceBuffer, ErrorCode, HostAllocFlags, ManagedBuffer, PinnedBuffer, Stream};
use cuda_mem_probes::Probes;
use cuda_mem_tests::{gpu_or_skip, run_child};

const FAULT_CHILD: &str = "CUDA_MEM_FAULT_CHILD";
const EXIT_CHILD: &str = "CUDA_MEM_EXIT_CHILD";

/// The child half: does nothing unless started by `sticky_fault_in_a_child_process`.
#[test]
fn fault_child() {
    if std::env::var(FAULT_CHILD).is_err() {
        return;
    }
    let dev = DeviceBuffer::<u32>::zeroed(1024).unwrap();
    let pinned = PinnedBuffer::<u32>::zeroed(1024, HostAllocFlags::DEFAULT).unwrap();
    let managed = ManagedBuffer::<u32>::zeroed(1024, cuda_mem::Attach::Global).unwrap();
    let stream = Stream::new().unwrap();
    let probes = Probes::load().unwrap();
    // SAFETY: deliberately invalid: this process exists to take the sticky error.
    unsafe { probes.fault(0x10 as *mut u32, &stream).unwrap() };
    let e = stream.synchronize().unwrap_err();
    println!(
        "FAULT code={} sticky={}",
        e.code().unwrap().0,
        e.is_sticky()
    );
    // Every later call reports the sticky error, allocation included.
    let later = DeviceBuffer::<u32>::zeroed(16).unwrap_err();
    println!(
        "LATER code={} sticky={}",
        later.code().unwrap().0,
        later.is_sticky()
    );
    let sync = cuda_mem::Device::get(0)
        .and_then(|d| d.synchronize())
        .unwrap_err();
    println!("SYNC code={}", sync.code().unwrap().0);
    // Explicit free reports the error and leaks the memory (it is gone with the context).
    match dev.free() {
        Ok(()) => println!("FREE ok"),
        Err(e) => println!("FREE code={}", e.code().map_or(0, |c| c.0)),
    }
    drop(pinned);
    drop(managed);
    drop(stream);
    drop(probes);
    println!("CHILD-DONE");
}

#[test]
fn sticky_fault_in_a_child_process() {
    gpu_or_skip!();
    let (ok, out) = run_child(
        "faults::fault_child",
        &[(FAULT_CHILD, "1")],
        Duration::from_secs(120),
    )
    .expect("child must not hang");
    assert!(ok, "child failed:\n{out}");
    let illegal = ErrorCode::ILLEGAL_ADDRESS.0;
    assert!(
        out.contains(&format!("FAULT code={illegal} sticky=true")),
        "{out}"
    );
    assert!(
        out.contains(&format!("LATER code={illegal} sticky=true")),
        "{out}"
    );
    assert!(out.contains(&format!("SYNC code={illegal}")), "{out}");
    assert!(out.contains(&format!("FREE code={illegal}")), "{out}");
    assert!(out.contains("CHILD-DONE"), "{out}");
    assert!(!out.contains("panicked"), "{out}");
}

static KEPT: OnceLock<DeviceBuffer<u8>> = OnceLock::new();
static DROPPED_AT_EXIT: Mutex<Option<PinnedBuffer<u8>>> = Mutex::new(None);

extern "C" fn drop_at_exit() {
    // Runs during exit, possibly after cudart has started unloading: the drop must tolerate
    // cudaErrorCudartUnloading without panicking.
    if let Ok(mut g) = DROPPED_AT_EXIT.lock() {
        drop(g.take());
    }
}

/// The child half of `exit_with_live_buffers_ends_cleanly`.
#[test]
fn exit_child() {
    if std::env::var(EXIT_CHILD).is_err() {
        return;
    }
    let _ = KEPT.set(DeviceBuffer::zeroed(1 << 20).unwrap());
    Box::leak(Box::new(
        PinnedBuffer::<u8>::zeroed(1 << 20, HostAllocFlags::MAPPED).unwrap(),
    ));
    Box::leak(Box::new(
        ManagedBuffer::<u8>::zeroed(1 << 20, cuda_mem::Attach::Global).unwrap(),
    ));
    *DROPPED_AT_EXIT.lock().unwrap() =
        Some(PinnedBuffer::zeroed(1 << 20, HostAllocFlags::DEFAULT).unwrap());
    // SAFETY: registers a plain extern "C" function with no arguments.
    let code = unsafe { libc::atexit(drop_at_exit) };
    assert_eq!(code, 0);
    let live = DeviceBuffer::<u8>::zeroed(4096).unwrap();
    println!("EXITING");
    // Exit with `live` still on the stack: no destructor runs for it.
    let _keep = &live;
    std::process::exit(0);
}

#[test]
fn exit_with_live_buffers_ends_cleanly() {
    gpu_or_skip!();
    let (ok, out) = run_child(
        "faults::exit_child",
        &[(EXIT_CHILD, "1")],
        Duration::from_secs(60),
    )
    .expect("child must not hang");
    assert!(ok, "child failed:\n{out}");
    assert!(out.contains("EXITING"), "{out}");
    assert!(!out.contains("panicked"), "{out}");
}
