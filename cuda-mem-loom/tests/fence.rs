//! Model test of the fence bookkeeping (`cuda-mem/src/fence/tracker.rs`) under every thread
//! interleaving that loom can reach, over a model GPU that keeps, per stream, the queue of
//! work and device-side waits, and what has completed.
//!
//! Two properties are checked, the two the crate's soundness rests on:
//! - **device ordering**: when work is queued, every earlier conflicting work item of another
//!   stream (a write against anything, anything against a write, on overlapping bytes) is
//!   ordered before it through the waits the fence inserted;
//! - **host waits**: when `host_wait(access)` returns `Ok`, every conflicting work item queued
//!   before it has completed.
//!
//! The scenarios are the failures the fence had: threads copying from one buffer on several
//! streams (the old fence kept one event and lost all but the last), work on the same and on
//! disjoint ranges, and event records that fail.

use cuda_mem_loom::tracker::{Access, Backend, Tracker};
use loom::sync::{Arc, Mutex};
use loom::thread;

#[derive(Debug, Clone, Copy)]
enum Op {
    Work {
        range: (usize, usize),
        access: Access,
    },
    /// Wait until stream `stream` has completed its first `pos` ops.
    Wait { stream: usize, pos: usize },
}

#[derive(Default)]
struct Gpu {
    ops: Vec<Vec<Op>>,
    done: Vec<usize>,
    fail_records: usize,
}

impl Gpu {
    fn complete(&mut self, stream: usize, pos: usize) {
        if self.done[stream] >= pos {
            return;
        }
        let start = self.done[stream];
        self.done[stream] = pos;
        for k in start..pos {
            if let Op::Wait { stream: s, pos: p } = self.ops[stream][k] {
                self.complete(s, p);
            }
        }
    }

    /// Whether op `i` of stream `s` is ordered before position `j` of stream `t`.
    fn before(&self, s: usize, i: usize, t: usize, j: usize) -> bool {
        if s == t {
            return i < j;
        }
        self.ops[t][..j].iter().any(|op| match *op {
            Op::Wait { stream, pos } => self.before(s, i, stream, pos),
            Op::Work { .. } => false,
        })
    }
}

#[derive(Clone)]
struct MockStream {
    id: usize,
    gpu: Arc<Mutex<Gpu>>,
}

struct MockEvent {
    stream: usize,
    pos: usize,
    gpu: Arc<Mutex<Gpu>>,
}

#[derive(Debug)]
struct Failed;

struct Model;

impl Backend for Model {
    type Stream = MockStream;
    type Event = MockEvent;
    type Error = Failed;

    fn same(a: &MockStream, b: &MockStream) -> bool {
        a.id == b.id
    }

    fn id(s: &MockStream) -> usize {
        s.id
    }

    fn record(stream: &MockStream, _reuse: Option<MockEvent>) -> Result<MockEvent, Failed> {
        let mut g = stream.gpu.lock().unwrap();
        if g.fail_records > 0 {
            g.fail_records -= 1;
            return Err(Failed);
        }
        Ok(MockEvent {
            stream: stream.id,
            pos: g.ops[stream.id].len(),
            gpu: stream.gpu.clone(),
        })
    }

    fn wait(stream: &MockStream, event: &MockEvent) -> Result<(), Failed> {
        let mut g = stream.gpu.lock().unwrap();
        g.ops[stream.id].push(Op::Wait {
            stream: event.stream,
            pos: event.pos,
        });
        Ok(())
    }

    fn query(event: &MockEvent) -> Result<bool, Failed> {
        Ok(event.gpu.lock().unwrap().done[event.stream] >= event.pos)
    }

    fn sync_event(event: &MockEvent) -> Result<(), Failed> {
        event.gpu.lock().unwrap().complete(event.stream, event.pos);
        Ok(())
    }

    fn sync_stream(stream: &MockStream) -> Result<(), Failed> {
        let mut g = stream.gpu.lock().unwrap();
        let n = g.ops[stream.id].len();
        g.complete(stream.id, n);
        Ok(())
    }
}

fn conflicts(a: Access, b: Access) -> bool {
    a == Access::Write || b == Access::Write
}

fn overlap(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

struct World {
    gpu: Arc<Mutex<Gpu>>,
    fence: Tracker<Model>,
    streams: Vec<MockStream>,
}

impl World {
    fn new(streams: usize) -> Arc<World> {
        Self::with_fence(streams, |_| Tracker::default())
    }

    /// A world whose fence `fence` makes from the streams (after queueing work on them in
    /// the model GPU, as the crate does before it builds a marked fence).
    fn with_fence(streams: usize, fence: impl FnOnce(&World) -> Tracker<Model>) -> Arc<World> {
        let gpu = Arc::new(Mutex::new(Gpu {
            ops: vec![Vec::new(); streams],
            done: vec![0; streams],
            fail_records: 0,
        }));
        let mut w = World {
            streams: (0..streams)
                .map(|id| MockStream {
                    id,
                    gpu: gpu.clone(),
                })
                .collect(),
            gpu,
            fence: Tracker::default(),
        };
        w.fence = fence(&w);
        Arc::new(w)
    }

    /// A world whose buffer is a stream-ordered allocation: queued on stream 0
    /// (`cudaMallocFromPoolAsync`), then its fence built marking it, as the crate does.
    fn pooled(streams: usize) -> Arc<World> {
        Self::with_fence(streams, |w| {
            w.enqueue(0, ALL, Access::Write);
            Tracker::marked(w.streams[0].clone(), ALL, Access::Write)
        })
    }

    /// A pooled buffer's drop, by its only owner: the free ordered on the allocation stream
    /// through the exclusive borrow, then queued there (`cudaFreeAsync`).
    fn free_pooled(w: &mut Arc<World>) {
        let w = Arc::get_mut(w).expect("the owner is the only one left");
        let origin = w
            .fence
            .order_origin_mut(ALL, Access::Write)
            .expect("the model's waits do not fail");
        assert_eq!(origin.map(|s| s.id), Some(0), "the free's stream");
        w.enqueue(0, ALL, Access::Write);
    }

    /// Queues work on the model GPU, first checking that every conflicting work item already
    /// queued on another stream is complete or ordered before it. (Concurrent queueing of
    /// conflicting work is excluded by Rust's borrows in the crate, and the scenarios respect
    /// that.)
    fn enqueue(&self, stream: usize, range: (usize, usize), access: Access) {
        let mut g = self.gpu.lock().unwrap();
        let j = g.ops[stream].len();
        for t in 0..g.ops.len() {
            for i in 0..g.ops[t].len() {
                if let Op::Work {
                    range: r,
                    access: a,
                } = g.ops[t][i]
                {
                    if t != stream && conflicts(a, access) && overlap(r, range) {
                        assert!(
                            g.done[t] > i || g.before(t, i, stream, j),
                            "work {i} of stream {t} ({a:?} {r:?}) is not ordered before \
                             {access:?} {range:?} on stream {stream}"
                        );
                    }
                }
            }
        }
        g.ops[stream].push(Op::Work { range, access });
    }

    /// Queues work as the crate does: begin (orders and marks), enqueue, end. Checks device
    /// ordering.
    fn queue(&self, stream: usize, range: (usize, usize), access: Access) {
        let s = &self.streams[stream];
        self.fence
            .begin(s, range, access)
            .expect("the model's waits do not fail");
        self.enqueue(stream, range, access);
        self.fence.end();
    }

    /// A host access as the crate does it: wait, then check that conflicting work is done.
    fn host(&self, access: Access) {
        self.fence
            .host_wait(access)
            .expect("the model's syncs do not fail");
        let g = self.gpu.lock().unwrap();
        for t in 0..g.ops.len() {
            for i in 0..g.ops[t].len() {
                if let Op::Work { access: a, .. } = g.ops[t][i] {
                    if conflicts(a, access) {
                        assert!(
                            g.done[t] > i,
                            "host {access:?} while work {i} ({a:?}) of stream {t} may run"
                        );
                    }
                }
            }
        }
    }
}

const ALL: (usize, usize) = (0, 64);

/// loom's exhaustive search, bounded to three preemptions per execution (loom's advice: most
/// concurrency bugs need two or three), which keeps the suite to seconds in CI.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// Runs `f` on a new model thread with its own handle to the world.
fn spawn(w: &Arc<World>, f: impl FnOnce(Arc<World>) + Send + 'static) -> thread::JoinHandle<()> {
    let w = w.clone();
    thread::spawn(move || f(w))
}

/// Runs `a` and `b` on two threads at once (spawned in this order) and waits for both.
fn race(
    w: &Arc<World>,
    a: impl FnOnce(Arc<World>) + Send + 'static,
    b: impl FnOnce(Arc<World>) + Send + 'static,
) {
    let (a, b) = (spawn(w, a), spawn(w, b));
    a.join().unwrap();
    b.join().unwrap();
}

/// The failure of the old fence: two threads copy out of one buffer on two streams (reads);
/// afterwards a host write must wait for both.
#[test]
fn readers_on_two_threads_then_a_host_write_waits_for_both() {
    model(|| {
        let w = World::new(2);
        race(
            &w,
            |w| w.queue(0, ALL, Access::Read),
            |w| {
                w.queue(1, ALL, Access::Read);
                w.queue(1, ALL, Access::Read);
            },
        );
        w.host(Access::Write);
    });
}

/// A host read (`&self`) concurrent with GPU readers on other threads: it waits only for
/// writes; a later writer on a third stream is ordered after every reader, and the final host
/// write after everything.
#[test]
fn host_reads_beside_gpu_readers_then_a_writer() {
    model(|| {
        let w = World::new(3);
        w.queue(2, ALL, Access::Write);
        let a = spawn(&w, |w| w.queue(0, ALL, Access::Read));
        let b = spawn(&w, |w| w.host(Access::Read));
        w.queue(1, (0, 32), Access::Read);
        a.join().unwrap();
        b.join().unwrap();
        w.queue(2, ALL, Access::Write);
        w.host(Access::Write);
    });
}

/// Writers on disjoint ranges from two threads (views of one buffer, `split_at_mut`) need no
/// order between them; readers of each half afterwards are ordered after its writer.
#[test]
fn disjoint_writers_then_readers() {
    model(|| {
        let w = World::new(3);
        race(
            &w,
            |w| w.queue(0, (0, 32), Access::Write),
            |w| w.queue(1, (32, 64), Access::Write),
        );
        w.queue(2, (0, 64), Access::Read);
        {
            let g = w.gpu.lock().unwrap();
            let waits = g.ops[0]
                .iter()
                .chain(&g.ops[1])
                .filter(|op| matches!(op, Op::Wait { .. }))
                .count();
            assert_eq!(waits, 0, "disjoint writers waited on each other");
        }
        w.host(Access::Write);
    });
}

/// Records that fail fall back to synchronizing the stream: nothing queued is left unseen.
#[test]
fn failing_records_leave_nothing_unseen() {
    model(|| {
        let w = World::new(2);
        w.queue(0, ALL, Access::Write);
        w.gpu.lock().unwrap().fail_records = 2;
        race(
            &w,
            |w| w.queue(1, ALL, Access::Read),
            |w| w.host(Access::Read),
        );
        w.host(Access::Write);
    });
}

/// Repeated work on one stream never waits, and repeated conflicts with the same unchanged
/// work of another stream wait once.
#[test]
fn implied_waits_are_skipped() {
    model(|| {
        let w = World::new(2);
        for _ in 0..3 {
            w.queue(0, ALL, Access::Write);
        }
        w.queue(1, ALL, Access::Read);
        w.queue(1, ALL, Access::Read);
        let g = w.gpu.lock().unwrap();
        assert!(g.ops[0].iter().all(|op| matches!(op, Op::Work { .. })));
        let waits = g.ops[1]
            .iter()
            .filter(|op| matches!(op, Op::Wait { .. }))
            .count();
        assert_eq!(waits, 1);
    });
}

/// Work from more streams than the fence keeps before pruning: completed entries are dropped
/// (here some complete through a host read), pending ones are kept, and a host write still
/// waits for everything pending; a writer on another thread meanwhile is ordered after all.
#[test]
fn many_streams_are_pruned_without_losing_pending_work() {
    model(|| {
        let w = World::new(12);
        w.queue(11, ALL, Access::Write);
        w.host(Access::Read); // completes stream 11's write
        for s in 0..10 {
            w.queue(s, (s, s + 1), Access::Read);
        }
        let a = spawn(&w, |w| w.queue(10, (3, 4), Access::Read));
        a.join().unwrap();
        w.queue(11, ALL, Access::Write);
        w.host(Access::Write);
    });
}

/// A reader on another stream records the event of an entry while work of that entry's
/// stream is still being queued (in flight); that event must not count as covering it: a
/// later writer on the reader's stream waits for the in-flight work too.
#[test]
fn an_event_recorded_beside_work_in_flight_covers_nothing_new() {
    model(|| {
        let w = World::new(2);
        w.queue(0, ALL, Access::Write);
        race(
            &w,
            |w| w.queue(0, ALL, Access::Read),
            |w| {
                w.queue(1, ALL, Access::Read);
                w.host(Access::Read);
            },
        );
        w.queue(1, ALL, Access::Write);
        w.host(Access::Write);
    });
}

/// A stream-ordered allocation: the allocation is queued on stream 0, then the fence is built
/// already marking it (`Tracker::marked`, no lock). Readers on two other threads' streams are
/// ordered after the allocation and a host read waits for it; the free, ordered through the
/// exclusive borrow the owner has at drop (`order_origin_mut`, no lock, on the allocation's
/// stream), comes after every reader. The threads' first calls race to enter the allocation's
/// lazy mark.
#[test]
fn pooled_allocation_marked_at_birth_and_freed_through_an_exclusive_borrow() {
    model(|| {
        let mut w = World::pooled(3);
        race(
            &w,
            |w| w.queue(1, ALL, Access::Read),
            |w| {
                w.queue(2, (0, 32), Access::Read);
                w.host(Access::Read);
            },
        );
        // Drop: the owner is the only one left.
        World::free_pooled(&mut w);
    });
}

/// A stream-ordered allocation freed with no other use, and one freed after a host read on
/// another thread: the first free finds the allocation's mark still pending and orders
/// nothing (the free queues behind it on the same stream), the second after the read entered
/// it; in both the model sees the free after the allocation, and the read waited for it.
#[test]
fn pooled_allocation_freed_before_or_after_its_lazy_mark_is_entered() {
    model(|| {
        World::free_pooled(&mut World::pooled(2));

        let mut w = World::pooled(2);
        let reader = spawn(&w, |w| w.host(Access::Read));
        reader.join().unwrap();
        World::free_pooled(&mut w);
    });
}

/// Issue 19.6: a host read whose event record fails synchronizes the stream instead, while a
/// read guard on that *same* stream is still queueing (begun, not ended: a `&` guard beside a
/// `&` host read). The fallback must not forget the guard's read: the host write afterwards
/// waits for it. (The old fallback removed the whole entry; the model of the other
/// scenarios put the work in flight on another stream and missed this.)
#[test]
fn a_failed_record_beside_work_in_flight_on_the_same_stream_forgets_nothing() {
    model(|| {
        let w = World::new(1);
        w.queue(0, ALL, Access::Write);
        w.gpu.lock().unwrap().fail_records = 1;
        race(
            &w,
            |w| w.queue(0, ALL, Access::Read),
            |w| w.host(Access::Read),
        );
        w.host(Access::Write);
    });
}

/// Issue 19.7: a guard leaked with `mem::forget` (its `begin` never ends) while another
/// thread reads on another stream. The owner's next exclusive access drops the leaked count:
/// its host write waits for everything and leaves the fence idle (before, the marks stayed
/// pending for good and every later wait recorded anew).
#[test]
fn a_leaked_guard_is_settled_by_the_next_exclusive_access() {
    model(|| {
        let mut w = World::new(2);
        race(
            &w,
            |w| {
                w.fence
                    .begin(&w.streams[0], ALL, Access::Read)
                    .expect("the model's waits do not fail");
                w.enqueue(0, ALL, Access::Read);
                // No `end`: the guard was leaked.
            },
            |w| w.queue(1, (0, 32), Access::Read),
        );
        let w = Arc::get_mut(&mut w).expect("the owner is the only one left");
        w.fence.exclusive();
        w.host(Access::Write);
        assert!(
            w.fence.is_idle(),
            "the leaked guard's marks are still pending"
        );
    });
}

/// The lock-free path of `begin`: stream 0's write publishes its marks, then a read on stream 0
/// inside them (a fast `begin`, no new mark) runs beside a host read on another thread, whose
/// record must not count as covering the fast read while it may still be queueing (it is in
/// flight: the record leaves the marks pending). The host write afterwards waits for the read.
/// Caught: the fast path's increment `Relaxed`, the holder's read of the count a plain load
/// (the Dekker pair of `invalidate`), and holders that do not withdraw the publication.
#[test]
fn a_fast_begin_beside_a_host_read_keeps_its_marks() {
    model(|| {
        let w = World::new(1);
        w.queue(0, ALL, Access::Write);
        race(
            &w,
            |w| w.queue(0, (0, 32), Access::Read),
            |w| w.host(Access::Read),
        );
        w.host(Access::Write);
    });
}

/// A fast write on one half (a view, `split_at_mut`) beside another stream's write on the
/// other half, which waits for the earlier whole-buffer write of stream 0 and records while
/// the fast write may be in flight: that wait must not be remembered as covering stream 0's
/// work, nor its record clear the marks, so that a later reader of the first half on stream 1
/// still waits for the fast write.
#[test]
fn a_fast_write_beside_another_streams_writer_on_the_other_half() {
    model(|| {
        let w = World::new(2);
        w.queue(0, ALL, Access::Write);
        race(
            &w,
            |w| w.queue(0, (0, 32), Access::Write),
            |w| w.queue(1, (32, 64), Access::Write),
        );
        w.queue(1, (0, 32), Access::Read);
        w.host(Access::Write);
    });
}

/// A fast `begin` whose guard is leaked (no `end`) beside a reader on another stream; the
/// owner's exclusive access drops the count, and its host write then waits for the leaked
/// guard's work (its marks were still pending) and leaves the fence idle.
#[test]
fn a_leaked_fast_guard_is_settled_by_the_next_exclusive_access() {
    model(|| {
        let mut w = World::new(2);
        w.queue(0, ALL, Access::Write);
        race(
            &w,
            |w| {
                w.fence
                    .begin(&w.streams[0], (0, 32), Access::Read)
                    .expect("the model's waits do not fail");
                w.enqueue(0, (0, 32), Access::Read);
                // No `end`: the guard was leaked.
            },
            |w| w.queue(1, (32, 64), Access::Read),
        );
        let w = Arc::get_mut(&mut w).expect("the owner is the only one left");
        w.fence.exclusive();
        w.host(Access::Write);
        assert!(
            w.fence.is_idle(),
            "the leaked guard's marks are still pending"
        );
    });
}

/// What a publication covers, on one thread: read marks let reads through only (a write
/// inside them takes the lock and is marked, so a reader on another stream waits for it), and
/// a stream with marks beside another stream's conflicting entry that it has not waited for
/// publishes nothing (its marks, merged into their hull past four pieces, may cover bytes it
/// never used, which the other stream wrote). Caught: a read publication that lets writes
/// through, and publishing beside other entries without checking them.
#[test]
fn publications_cover_only_what_their_marks_subsume() {
    model(|| {
        let w = World::new(2);
        w.queue(0, ALL, Access::Read);
        w.queue(0, ALL, Access::Write);
        w.queue(1, ALL, Access::Read);

        // Stream 0's reads of five pieces are kept as their hull, which covers stream 1's
        // write in a gap: stream 0's read there must still wait for it.
        let w = World::new(2);
        w.queue(1, (40, 44), Access::Write);
        for p in [0, 8, 16, 24, 48] {
            w.queue(0, (p, p + 4), Access::Read);
        }
        w.queue(0, (40, 44), Access::Read);
        w.host(Access::Write);
    });
}

/// A fast `begin` racing a holder that withdraws the publication and another that publishes
/// anew, in the same mode, for another stream (a host read that completes stream 0's write
/// and empties the fence, then a write on stream 1 to the other half): the fast path either
/// validates the first publication (and the holders then see it in flight) or falls back to
/// the lock; it never takes the fields of one publication for the other's. Then a host write
/// waits for everything. Caught: a seal whose sequence number is not bumped (A-B-A).
#[test]
fn a_fast_begin_racing_a_new_publication() {
    model(|| {
        let w = World::new(2);
        w.queue(0, ALL, Access::Write);
        race(
            &w,
            |w| w.queue(0, (0, 32), Access::Read),
            |w| {
                w.host(Access::Read);
                w.queue(1, (32, 64), Access::Write);
            },
        );
        w.host(Access::Write);
    });
}

/// Issue 21: a publication beside another stream's entry that the publishing stream waited
/// for (stream 1 read the buffer once; stream 0's write waited for that read). Stream 0's
/// fast write on one half races stream 1's read of the other half, which waits for stream 0's
/// earlier write and records while the fast write may be in flight; afterwards stream 1's
/// read of the first half must still wait for the fast write (no wait of stream 1 may be
/// remembered as covering it), and a host write for everything.
#[test]
fn a_fast_begin_beside_an_entry_it_waited_for() {
    model(|| {
        let w = World::new(2);
        w.queue(1, ALL, Access::Read);
        w.queue(0, ALL, Access::Write);
        race(
            &w,
            |w| w.queue(0, (0, 32), Access::Write),
            |w| w.queue(1, (32, 64), Access::Read),
        );
        w.queue(1, (0, 32), Access::Read);
        w.host(Access::Write);
    });
}

/// A wait for another stream's entry stands for that entry only as it was: once the other
/// stream marks anew, a publication whose range (here the hull of five pieces) covers its new
/// marks is not made, so that the write into them takes the lock and waits. Caught: a
/// publication that trusts a `waited` record whatever the entry's clock.
#[test]
fn a_wait_for_an_entry_as_it_was_does_not_let_a_publication_past_its_new_marks() {
    model(|| {
        let w = World::new(2);
        w.queue(1, (40, 44), Access::Read);
        w.queue(0, (40, 44), Access::Write);
        w.queue(1, (40, 44), Access::Read);
        for p in [0, 8, 16, 24, 48] {
            w.queue(0, (p, p + 4), Access::Write);
        }
        w.queue(0, (40, 44), Access::Write);
        w.host(Access::Write);
    });
}

/// Review of issue 21: a `waited` record outlives the entry it names when a host wait retires
/// that entry (only pruning drops such records). Stream 1 writes the first half; stream 0
/// reads everything, waiting for it (a record for stream 1 at its clock then), and publishes
/// its reads beside it; a host read retires stream 1's entry. Then stream 1 writes the second
/// half on one thread (a new entry, a new clock) while stream 0 reads the first half fast on
/// another; afterwards stream 0's read of the second half must wait for the new write, the
/// stale record notwithstanding. Caught: a clock per entry (a new entry's first mark would
/// match the stale record), and a publication or skip that trusts a record for a stream
/// whose entry was replaced.
#[test]
fn a_stale_wait_for_a_retired_entry_is_not_trusted_for_its_successor() {
    model(|| {
        let w = World::new(2);
        w.queue(1, (0, 32), Access::Write);
        w.queue(0, ALL, Access::Read);
        w.host(Access::Read);
        race(
            &w,
            |w| w.queue(0, (0, 32), Access::Read),
            |w| w.queue(1, (32, 64), Access::Write),
        );
        w.queue(0, (32, 64), Access::Read);
        w.host(Access::Write);
    });
}

/// Review of issue 21: stream 0 publishes its writes beside stream 1's read, which it waited
/// for; on another thread stream 1 reads the other half of a view anew (its entry changes:
/// new marks, a new clock, under the lock) while stream 0 writes its half fast. Afterwards a
/// write of stream 0 inside the old publication's range, on the bytes stream 1 just read,
/// must wait for that read: the holder withdrew the publication, and the wait stream 0 made
/// for stream 1's entry as it was stands no more. Caught: a holder that changes another
/// entry without withdrawing, and a `waited` match without the clock.
#[test]
fn a_publication_beside_a_waited_entry_ends_when_that_entry_marks_anew() {
    model(|| {
        let w = World::new(2);
        w.queue(1, ALL, Access::Read);
        w.queue(0, ALL, Access::Write);
        race(
            &w,
            |w| w.queue(0, (0, 32), Access::Write),
            |w| w.queue(1, (32, 64), Access::Read),
        );
        w.queue(0, (32, 64), Access::Write);
        w.host(Access::Write);
    });
}

/// Review of issue 21: publications alternate between two streams that each waited for the
/// other (stream 0 writes the first half after stream 1's read, stream 1 then writes the
/// second half after stream 0's write of the first... on disjoint bytes, then each reads the
/// other's half), two threads queueing at once on disjoint views; every conflicting pair
/// must be ordered, and the host write waits for everything. Caught: a publication that
/// outlives a holder, or one made beside an entry whose wait was recorded while work was in
/// flight (the record then covers only part of the entry's work).
#[test]
fn publications_alternate_between_streams_that_waited_for_each_other() {
    model(|| {
        let w = World::new(2);
        w.queue(1, ALL, Access::Read);
        w.queue(0, (0, 32), Access::Write);
        w.queue(1, (32, 64), Access::Write);
        race(
            &w,
            |w| {
                w.queue(0, (0, 32), Access::Write);
                w.queue(0, (0, 32), Access::Read);
            },
            |w| w.queue(1, (32, 64), Access::Write),
        );
        w.queue(1, (0, 32), Access::Read);
        w.queue(0, (32, 64), Access::Read);
        w.host(Access::Write);
    });
}

/// Review of issue 21: the other entries a publication is checked against include the marks
/// an event was recorded for but that are not known complete (an entry's recorded ranges):
/// stream 1's write is recorded, not waited for, when the marks of eight more streams (reads
/// elsewhere) prune the entries; stream 0 then writes five pieces around it, whose hull
/// covers it, and its write into the gap must still wait for stream 1's write. Caught: a
/// publication checked against the other entries' marks since their last record only.
#[test]
fn a_publication_is_checked_against_marks_already_recorded() {
    model(|| {
        let w = World::new(10);
        w.queue(1, (40, 44), Access::Write);
        for s in 2..10 {
            w.queue(s, (54 + s, 55 + s), Access::Read);
        }
        for p in [0, 8, 16, 24, 48] {
            w.queue(0, (p, p + 4), Access::Write);
        }
        w.queue(0, (40, 44), Access::Write);
        w.host(Access::Write);
    });
}
