//! Many threads allocating, copying (sync and async, each on its own stream) and freeing every
//! kind at once, with the data verified. Runs for `CUDA_MEM_STRESS_SECS` seconds (default 2;
//! the GPU runner sets 10).

use std::time::{Duration, Instant};

use cuda_mem::{
    alloc_mapped, copy, copy_async, Attach, DeviceBuffer, HostAllocFlags, HostRegisterFlags,
    ManagedBuffer, PinnedBuffer, RegisteredVec, Stream,
};
use cuda_mem_tests::gpu_or_skip;

use crate::pattern;

fn one_round(thread: u32, round: u32, stream: &Stream) {
    let n = 1024 + (thread as usize * 4099 + round as usize * 31) % 65_536;
    let seed = thread * 1_000_003 + round;
    let data = pattern(n, seed);
    // Pageable -> device (sync) -> pinned (async) -> device (async) -> managed (async)
    // -> registered (async) -> mapped (sync) -> check.
    let d1 = DeviceBuffer::from_slice(&data).unwrap();
    let mut pinned = PinnedBuffer::<u32>::zeroed(n, HostAllocFlags::DEFAULT).unwrap();
    copy_async(&mut pinned, &d1, stream).unwrap();
    let mut d2 = DeviceBuffer::<u32>::uninit(n).unwrap();
    copy_async(&mut d2, &pinned, stream).unwrap();
    let mut managed = ManagedBuffer::<u32>::zeroed(n, Attach::Global).unwrap();
    copy_async(&mut managed, &d2, stream).unwrap();
    let mut reg = RegisteredVec::register(vec![0u32; n], HostRegisterFlags::DEFAULT).unwrap();
    copy_async(&mut reg, &managed, stream).unwrap();
    let mut mapped = alloc_mapped::<u32>(n).unwrap();
    copy(&mut mapped, &reg).unwrap();
    assert!(
        mapped.as_slice().unwrap() == &data[..],
        "thread {thread} round {round}"
    );
    assert!(pinned.as_slice().unwrap() == &data[..]);
    assert!(managed.as_slice().unwrap() == &data[..]);
    let back = reg.into_vec().unwrap();
    assert!(back == data);
}

#[test]
fn threads_allocate_copy_and_free_every_kind() {
    gpu_or_skip!();
    let secs: u64 = std::env::var("CUDA_MEM_STRESS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let threads = 8u32;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let stream = if t % 2 == 0 {
                    Stream::non_blocking().unwrap()
                } else {
                    Stream::new().unwrap()
                };
                let mut rounds = 0u32;
                while Instant::now() < deadline {
                    one_round(t, rounds, &stream);
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    let rounds: Vec<u32> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    println!("concurrency: {threads} threads for {secs} s, rounds per thread {rounds:?}");
    assert!(rounds.iter().all(|&r| r > 0));
}
