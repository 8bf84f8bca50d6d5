//! Model test of the handshake between work being queued and a stream capture beginning
//! (`cuda-mem/src/fence/handshake.rs`, issue 22), with the fence on both sides
//! (`Barrier::Fence`, the fallback where `membarrier` is unavailable; loom cannot model
//! `membarrier`, which gives the operation side the same guarantee).
//!
//! The property: work that an operation queues as ordinary work (it did not see the capture)
//! never lands in the capture. An operation that sees `OPEN` raised looks the capture up in the
//! registry (where the capture put itself before raising `OPEN`) and is refused. The model
//! runtime notes a call made while the stream is capturing that the operation did not know of.
//! Four mutations of the protocol (the operation reading `OPEN` before entering its slot, the
//! capture not waiting, the capture registering only after it began, the operation's side of
//! the barrier left out, for a plain and a nested operation) are each caught.

use cuda_mem_loom::handshake::{enter_and_read, wait_for_ops, Barrier, Slot};
use loom::sync::atomic::{fence, AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// The capture's stream, and another.
const S: usize = 0x10;
const OTHER: usize = 0x20;

#[derive(Default)]
struct Runtime {
    /// `cudaStreamBeginCapture(S)` has returned.
    capturing: bool,
    /// A call on `S`, from an operation that took it for ordinary work, landed in the capture.
    captured_unseen: bool,
}

struct World {
    open: AtomicUsize,
    /// The registry entry of the capture on `S` (registered, begun or not).
    registered: Mutex<bool>,
    runtime: Mutex<Runtime>,
    slot: Slot,
}

/// How the model's protocol is (mis)built.
#[derive(Clone, Copy, PartialEq)]
enum Mutant {
    None,
    /// The operation reads `OPEN`, then enters its slot.
    ReadBeforeEnter,
    /// The capture begins without waiting for the slots.
    NoWait,
    /// The capture registers itself only after `cudaStreamBeginCapture` (the old order).
    RegisterLate,
    /// The operation makes no fence (the membarrier side's compiler fence, without the
    /// capture's membarrier): its slot store may be late for the capture's look (store
    /// buffering).
    NoOpFence,
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// The runtime call of an operation on `S` that decided on ordinary work.
fn call(w: &World) {
    let mut rt = w.runtime.lock().unwrap();
    if rt.capturing {
        rt.captured_unseen = true;
    }
}

/// An operation on `S`, optionally nested inside one on `OTHER` (two fences, two streams: the
/// slot names several streams then).
fn operation(w: &World, mutant: Mutant, nested: bool) {
    let barrier = if mutant == Mutant::NoOpFence {
        Barrier::Membarrier
    } else {
        Barrier::Fence
    };
    if nested {
        enter_and_read(&w.slot, OTHER, &w.open, barrier);
    }
    let open = if mutant == Mutant::ReadBeforeEnter {
        let open = w.open.load(Ordering::Relaxed);
        w.slot.enter(S, barrier);
        open
    } else {
        enter_and_read(&w.slot, S, &w.open, barrier)
    };
    // The capture-aware path: refused where the capture on `S` is registered.
    if open == 0 || !*w.registered.lock().unwrap() {
        call(w);
    }
    w.slot.exit();
    if nested {
        w.slot.exit();
    }
}

/// `capture::begin` on `S`.
fn capture(w: &World, mutant: Mutant) {
    if mutant != Mutant::RegisterLate {
        *w.registered.lock().unwrap() = true;
    }
    w.open.fetch_add(1, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    if mutant != Mutant::NoWait {
        assert!(wait_for_ops([&w.slot], S, |_| {
            thread::yield_now();
            true
        }));
    }
    w.runtime.lock().unwrap().capturing = true;
    if mutant == Mutant::RegisterLate {
        *w.registered.lock().unwrap() = true;
    }
}

fn run(mutant: Mutant, nested: bool) {
    model(move || {
        let w = Arc::new(World {
            open: AtomicUsize::new(0),
            registered: Mutex::new(false),
            runtime: Mutex::new(Runtime::default()),
            slot: Slot::new(),
        });
        let op = {
            let w = w.clone();
            thread::spawn(move || operation(&w, mutant, nested))
        };
        capture(&w, mutant);
        op.join().unwrap();
        assert!(
            !w.runtime.lock().unwrap().captured_unseen,
            "ordinary work landed in the capture"
        );
    });
}

#[test]
fn an_operation_either_sees_the_capture_or_is_waited_for() {
    run(Mutant::None, false);
}

#[test]
fn a_nested_operation_on_a_second_stream_either_sees_the_capture_or_is_waited_for() {
    run(Mutant::None, true);
}

#[test]
#[should_panic(expected = "ordinary work landed in the capture")]
fn mutant_reading_open_before_entering_the_slot_is_caught() {
    run(Mutant::ReadBeforeEnter, false);
}

#[test]
#[should_panic(expected = "ordinary work landed in the capture")]
fn mutant_capture_that_does_not_wait_is_caught() {
    run(Mutant::NoWait, false);
}

#[test]
#[should_panic(expected = "ordinary work landed in the capture")]
fn mutant_capture_registered_after_it_began_is_caught() {
    run(Mutant::RegisterLate, false);
}

#[test]
#[should_panic(expected = "ordinary work landed in the capture")]
fn mutant_operation_without_its_fence_is_caught() {
    run(Mutant::NoOpFence, false);
}

#[test]
#[should_panic(expected = "ordinary work landed in the capture")]
fn mutant_nested_operation_without_its_fence_is_caught() {
    run(Mutant::NoOpFence, true);
}
