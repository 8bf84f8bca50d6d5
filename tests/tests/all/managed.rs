//! Managed memory on the GPU: device writes read on the host, prefetch and its range
//! attribute, advice, stream attach, and the free-memory guard.

use cuda_mem::DevicePtrMut as _;
use cuda_mem::{
    pointer_info, Advice, Attach, Error, Location, ManagedBuffer, Misuse, PointerKind, Stream,
};
use cuda_mem_probes::Probes;
use cuda_mem_tests::gpu_or_skip;

#[test]
fn set_on_the_device_read_on_the_host() {
    gpu_or_skip!();
    let stream = Stream::non_blocking().unwrap();
    let mut m = ManagedBuffer::<u32>::zeroed(1 << 20, Attach::Global).unwrap();
    assert_eq!(pointer_info(m.as_ptr()).unwrap().kind, PointerKind::Managed);
    m.memset_async(0x7e, &stream).unwrap();
    assert!(m.as_slice().unwrap().iter().all(|&w| w == 0x7e7e_7e7e));

    // A kernel writes through the same pointer; host access waits for it.
    let probes = Probes::load().unwrap();
    let bytes = m.byte_len();
    {
        let out = m.device_ptr_mut(&stream).unwrap();
        // SAFETY: the buffer holds 4 MiB (multiple of 16 bytes), used on the guard's stream
        // while the guard lives; the guard records the launch.
        unsafe {
            probes
                .write(out.as_mut_ptr().cast(), bytes, &stream)
                .unwrap()
        };
    }
    for (i, w) in m.as_slice().unwrap().chunks(4).enumerate() {
        assert_eq!(w, [i as u32; 4]);
    }
    // Host writes are seen by the device.
    m.as_mut_slice().unwrap().fill(9);
    let mut out = vec![0u32; m.len()];
    cuda_mem::copy(&mut out, &m).unwrap();
    assert!(out.iter().all(|&w| w == 9));
}

#[test]
fn prefetch_moves_the_last_prefetch_location() {
    let dev = gpu_or_skip!();
    let stream = Stream::non_blocking().unwrap();
    let mut m = ManagedBuffer::<u8>::zeroed(8 << 20, Attach::Global).unwrap();
    assert_eq!(
        m.last_prefetch_location().unwrap(),
        None,
        "never prefetched"
    );
    m.prefetch(Location::Device(dev), &stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(
        m.last_prefetch_location().unwrap(),
        Some(Location::Device(dev))
    );
    m.prefetch(Location::Host, &stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(m.last_prefetch_location().unwrap(), Some(Location::Host));
    assert!(m.as_slice().unwrap().iter().all(|&b| b == 0));
}

#[test]
fn advice_is_read_back() {
    let dev = gpu_or_skip!();
    let m = ManagedBuffer::<u64>::zeroed(1 << 18, Attach::Global).unwrap();
    let d = Location::Device(dev);
    assert!(!m.is_read_mostly().unwrap());
    m.advise(Advice::SetReadMostly).unwrap();
    assert!(m.is_read_mostly().unwrap());
    m.advise(Advice::UnsetReadMostly).unwrap();
    assert!(!m.is_read_mostly().unwrap());
    m.advise(Advice::SetPreferredLocation(d)).unwrap();
    assert_eq!(m.preferred_location().unwrap(), Some(d));
    m.advise(Advice::SetPreferredLocation(Location::Host))
        .unwrap();
    assert_eq!(m.preferred_location().unwrap(), Some(Location::Host));
    m.advise(Advice::UnsetPreferredLocation).unwrap();
    assert_eq!(m.preferred_location().unwrap(), None);
    m.advise(Advice::SetAccessedBy(d)).unwrap();
    m.advise(Advice::UnsetAccessedBy(d)).unwrap();
}

#[test]
fn host_attached_then_attached_to_a_stream() {
    gpu_or_skip!();
    let stream = Stream::non_blocking().unwrap();
    let mut m = ManagedBuffer::<u32>::zeroed(4096, Attach::Host).unwrap();
    m.as_mut_slice().unwrap().fill(5);
    m.attach(&stream, Attach::Single).unwrap();
    m.memset_async(1, &stream).unwrap();
    assert!(m.as_slice().unwrap().iter().all(|&w| w == 0x0101_0101));
    m.attach(&stream, Attach::Global).unwrap();
    m.free().unwrap();
}

#[test]
fn more_than_free_memory_is_refused_before_allocating() {
    let dev = gpu_or_skip!();
    let (free, total) = dev.mem_info().unwrap();
    let want = total + (1 << 30);
    match ManagedBuffer::<u8>::zeroed(want, Attach::Global) {
        Err(Error::Misuse(Misuse::ManagedExceedsFree { bytes, free: f })) => {
            assert_eq!(bytes, want);
            assert!(f <= total && f.abs_diff(free) < (1 << 30));
        }
        other => panic!("expected ManagedExceedsFree, got {other:?}"),
    }
}
