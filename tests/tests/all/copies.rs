//! Copies between every pair of kinds, synchronous and asynchronous, plus streams and events.

use cuda_mem::{
    copy, copy_async, copy_range, copy_range_async, Attach, DeviceBuffer, Event, HostAllocFlags,
    HostRegisterFlags, ManagedBuffer, MappedBuffer, PinnedBuffer, RegisteredVec, Stream,
};
use cuda_mem_tests::gpu_or_skip;

use crate::pattern;

const N: usize = 1 << 16;

/// One buffer of each kind that async copies accept, all holding `seed`'s pattern.
struct Kinds {
    device: DeviceBuffer<u32>,
    pinned: PinnedBuffer<u32>,
    wc: PinnedBuffer<u32>,
    mapped: MappedBuffer<u32>,
    managed: ManagedBuffer<u32>,
    registered: RegisteredVec<u32>,
}

impl Kinds {
    fn new(seed: u32) -> Kinds {
        let data = pattern(N, seed);
        let mut mapped = MappedBuffer::zeroed(N, HostAllocFlags::DEFAULT).unwrap();
        mapped.as_mut_slice().unwrap().copy_from_slice(&data);
        let mut managed = ManagedBuffer::zeroed(N, Attach::Global).unwrap();
        managed.as_mut_slice().unwrap().copy_from_slice(&data);
        Kinds {
            device: DeviceBuffer::from_slice(&data).unwrap(),
            pinned: PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap(),
            wc: PinnedBuffer::from_slice(&data, HostAllocFlags::WRITE_COMBINED).unwrap(),
            mapped,
            managed,
            registered: RegisteredVec::register(data, HostRegisterFlags::DEFAULT).unwrap(),
        }
    }
}

/// Calls `$body` with `$dst` bound to each kind of `$k` in turn.
macro_rules! each_kind {
    ($k:expr, |$name:ident, $dst:ident| $body:expr) => {{
        {
            let $name = "device";
            let $dst = &mut $k.device;
            $body;
        }
        {
            let $name = "pinned";
            let $dst = &mut $k.pinned;
            $body;
        }
        {
            let $name = "write-combined";
            let $dst = &mut $k.wc;
            $body;
        }
        {
            let $name = "mapped";
            let $dst = &mut $k.mapped;
            $body;
        }
        {
            let $name = "managed";
            let $dst = &mut $k.managed;
            $body;
        }
        {
            let $name = "registered";
            let $dst = &mut $k.registered;
            $body;
        }
    }};
}

fn read_back<M: cuda_mem::Memory<u32> + ?Sized>(m: &M) -> Vec<u32> {
    let mut out = vec![0u32; N];
    copy(&mut out, m).unwrap();
    out
}

#[test]
fn every_pair_of_kinds_sync_and_async() {
    gpu_or_skip!();
    let stream = Stream::non_blocking().unwrap();
    let mut src = Kinds::new(100);
    let want = pattern(N, 100);
    // From a pageable Vec into every kind, then back into a Vec.
    each_kind!(src, |name, s| {
        let mut dst = Kinds::new(1);
        each_kind!(dst, |dname, d| {
            copy(d, &*s).unwrap();
            assert!(read_back(&*d) == want, "sync {name} -> {dname}");
        });
        let mut dst = Kinds::new(2);
        each_kind!(dst, |dname, d| {
            copy_async(d, &*s, &stream).unwrap();
            assert!(read_back(&*d) == want, "async {name} -> {dname}");
        });
    });
    // Pageable host memory, both ways.
    let host = pattern(N, 100);
    let mut dst = Kinds::new(3);
    each_kind!(dst, |dname, d| {
        copy(d, &host).unwrap();
        assert!(read_back(&*d) == want, "Vec -> {dname}");
    });
}

#[test]
fn partial_ranges() {
    gpu_or_skip!();
    let stream = Stream::new().unwrap();
    let data = pattern(N, 8);
    let src = PinnedBuffer::from_slice(&data, HostAllocFlags::DEFAULT).unwrap();
    let mut dev = DeviceBuffer::<u32>::zeroed(N).unwrap();
    copy_range_async(&mut dev, 10, &src, 20, 100, &stream).unwrap();
    let back = dev.to_vec().unwrap();
    assert!(back[..10].iter().all(|&w| w == 0));
    assert_eq!(&back[10..110], &data[20..120]);
    assert!(back[110..].iter().all(|&w| w == 0));
    let mut host = vec![0u32; 5];
    copy_range(&mut host, 0, &dev, 12, 5).unwrap();
    assert_eq!(host, &data[22..27]);
}

#[test]
fn events_time_a_copy_and_streams_report_idle() {
    gpu_or_skip!();
    let stream = Stream::new().unwrap();
    let (a, b) = (Event::timing().unwrap(), Event::timing().unwrap());
    let src = PinnedBuffer::<u8>::zeroed(64 << 20, HostAllocFlags::DEFAULT).unwrap();
    let mut dev = DeviceBuffer::<u8>::uninit(64 << 20).unwrap();
    a.record(&stream).unwrap();
    copy_async(&mut dev, &src, &stream).unwrap();
    b.record(&stream).unwrap();
    b.synchronize().unwrap();
    assert!(b.is_complete().unwrap());
    let ms = Event::elapsed_ms(&a, &b).unwrap();
    assert!(ms > 0.0, "{ms} ms");
    stream.synchronize().unwrap();
    assert!(stream.is_idle().unwrap());
}
