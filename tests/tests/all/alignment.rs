//! Over-aligned element types (issue 19, item 2). `#[repr(C, align(N))]` types with derived
//! `Pod` are valid elements, but CUDA's allocators promise only 256-byte alignment: on an H200
//! host `cudaHostAlloc` returned addresses 1536 bytes into a page, and slices made there for
//! larger alignments were misaligned (undefined behaviour). Every allocator must either give
//! an address aligned for `T` or refuse with the exact error; the crate refuses element types
//! aligned to more than 256 bytes before allocating (`Misuse::AlignmentUnsupported`).

use std::mem::{align_of, size_of};

use bytemuck::{Pod, Zeroable};
use cuda_mem::{
    alloc_mapped, Attach, DeviceBuffer, HostAllocFlags, ManagedBuffer, MappedBuffer, MemPool,
    Misuse, PinStrategy, PinnedBuffer, PinnedPool, PinnedPoolConfig, Stream,
};
use cuda_mem_tests::gpu_or_skip;

#[repr(C, align(16))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct A16([u8; 16]);

#[repr(C, align(64))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct A64([u8; 64]);

#[repr(C, align(256))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct A256([u8; 256]);

#[repr(C, align(512))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct A512([u8; 512]);

#[repr(C, align(4096))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct A4096([u8; 4096]);

#[repr(C, align(65536))]
#[derive(Clone, Copy, Pod, Zeroable)]
struct A65536([[u8; 4096]; 16]);

/// The largest element alignment an allocation accepts: what CUDA documents for its
/// allocators.
const MAX_ALIGN: usize = 256;

/// The refusal of an element type aligned to `align` bytes.
fn refusal(align: usize) -> Misuse {
    Misuse::AlignmentUnsupported {
        align,
        max: MAX_ALIGN,
    }
}

/// Lengths of `T` from one element up to 1 MiB, varied (the misaligned addresses showed for
/// some sizes only), and one past 3 MiB: a block that `MapRegister` maps and registers.
fn lens<T>() -> Vec<usize> {
    const FIB: [usize; 16] = [
        1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597,
    ];
    let size = size_of::<T>();
    let mut v: Vec<usize> = FIB.into_iter().filter(|&n| n * size <= 1 << 20).collect();
    v.push((3 << 20) / size + 1);
    v
}

/// An allocation under test, kept alive until its group is done (live allocations make the
/// allocators hand out more varied addresses).
trait Held {
    /// Every address of the allocation that is handed out as `*T`: host, and device where it
    /// differs.
    fn addrs(&self) -> Vec<usize>;
    /// The host view: its length and whether every byte is zero; `None` for device memory
    /// (and managed memory on a device without concurrent managed access).
    fn host_view(&self) -> Option<cuda_mem::Result<(usize, bool)>>;
}

fn view<T: Pod>(s: cuda_mem::Result<&[T]>) -> cuda_mem::Result<(usize, bool)> {
    s.map(|s| {
        let zero = bytemuck::cast_slice::<T, u8>(s).iter().all(|&b| b == 0);
        (s.len(), zero)
    })
}

impl<T: Pod> Held for PinnedBuffer<T> {
    fn addrs(&self) -> Vec<usize> {
        vec![self.as_ptr() as usize]
    }
    fn host_view(&self) -> Option<cuda_mem::Result<(usize, bool)>> {
        Some(view(self.as_slice()))
    }
}

impl<T: Pod> Held for MappedBuffer<T> {
    fn addrs(&self) -> Vec<usize> {
        vec![self.as_ptr() as usize, self.device_address() as usize]
    }
    fn host_view(&self) -> Option<cuda_mem::Result<(usize, bool)>> {
        Some(view(self.as_slice()))
    }
}

impl<T: Pod> Held for ManagedBuffer<T> {
    fn addrs(&self) -> Vec<usize> {
        vec![self.as_ptr() as usize]
    }
    fn host_view(&self) -> Option<cuda_mem::Result<(usize, bool)>> {
        match self.as_slice() {
            Err(e) if matches!(e.misuse(), Some(Misuse::Unsupported { .. })) => None,
            s => Some(view(s)),
        }
    }
}

impl<T: Pod> Held for DeviceBuffer<T> {
    fn addrs(&self) -> Vec<usize> {
        vec![self.as_ptr() as usize]
    }
    fn host_view(&self) -> Option<cuda_mem::Result<(usize, bool)>> {
        None
    }
}

fn held<H: Held + 'static>(r: cuda_mem::Result<H>) -> cuda_mem::Result<Box<dyn Held>> {
    r.map(|h| Box::new(h) as Box<dyn Held>)
}

type Alloc<'a> = Box<dyn Fn(usize) -> cuda_mem::Result<Box<dyn Held>> + 'a>;

/// What the allocators under test share.
struct Env {
    stream: Stream,
    device_pool: MemPool,
    /// `None` where host pools are unsupported.
    host_pool: Option<MemPool>,
    map_register_pool: PinnedPool,
}

const MAP_REGISTER: PinStrategy = PinStrategy::MapRegister {
    threads: 4,
    huge_pages: true,
};

/// Every allocator, for elements of `T`: its name, whether it zero-fills, and the call.
fn allocators<T: Pod>(env: &Env) -> Vec<(&'static str, bool, Alloc<'_>)> {
    let f = HostAllocFlags::DEFAULT;
    let mut v: Vec<(&'static str, bool, Alloc<'_>)> = vec![
        (
            "PinnedBuffer::zeroed",
            true,
            Box::new(move |n| held(PinnedBuffer::<T>::zeroed(n, f))),
        ),
        (
            "PinnedBuffer::zeroed(PORTABLE)",
            true,
            Box::new(|n| held(PinnedBuffer::<T>::zeroed(n, HostAllocFlags::PORTABLE))),
        ),
        (
            "PinnedBuffer::malloc_host",
            true,
            Box::new(|n| held(PinnedBuffer::<T>::malloc_host(n))),
        ),
        (
            "PinnedBuffer::with_strategy(MapRegister)",
            true,
            Box::new(move |n| held(PinnedBuffer::<T>::with_strategy(n, f, MAP_REGISTER))),
        ),
        (
            "PinnedPool::global().alloc",
            false,
            Box::new(move |n| held(PinnedPool::global().alloc::<T>(n, f))),
        ),
        (
            "PinnedPool(MapRegister).alloc",
            false,
            Box::new(move |n| held(env.map_register_pool.alloc::<T>(n, f))),
        ),
        (
            "MappedBuffer::zeroed",
            true,
            Box::new(move |n| held(MappedBuffer::<T>::zeroed(n, f))),
        ),
        (
            "alloc_mapped",
            true,
            Box::new(|n| held(alloc_mapped::<T>(n))),
        ),
        (
            "ManagedBuffer::zeroed",
            true,
            Box::new(|n| held(ManagedBuffer::<T>::zeroed(n, Attach::Global))),
        ),
        (
            "DeviceBuffer::zeroed",
            true,
            Box::new(|n| held(DeviceBuffer::<T>::zeroed(n))),
        ),
        (
            "DeviceBuffer::from_pool",
            false,
            Box::new(|n| {
                held(DeviceBuffer::<T>::from_pool(
                    &env.device_pool,
                    n,
                    &env.stream,
                ))
            }),
        ),
    ];
    if let Some(pool) = &env.host_pool {
        v.push((
            "PinnedBuffer::from_pool(host pool)",
            true,
            Box::new(move |n| held(PinnedBuffer::<T>::from_pool(pool, n, &env.stream))),
        ));
    }
    v
}

/// Allocates every length of [`lens`] from every allocator, all alive at once per allocator,
/// and checks each result: aligned for `T` (every address) with a working host view when
/// `T`'s alignment is at most 256 bytes, exactly the refusal above. Returns the allocations
/// made.
fn check_every_allocator<T: Pod>(env: &Env) -> usize {
    let align = align_of::<T>();
    let mut made = 0;
    for (kind, zeroed, alloc) in allocators::<T>(env) {
        let mut live = Vec::new();
        for len in lens::<T>() {
            let what = format!("{kind}: {len} elements aligned to {align}");
            match alloc(len) {
                Ok(b) => {
                    // Checked before the host view is made: a slice at a misaligned address
                    // is undefined behaviour.
                    for a in b.addrs() {
                        assert_eq!(a % align, 0, "{what}: Ok, but misaligned at {a:#x}");
                    }
                    assert!(
                        align <= MAX_ALIGN,
                        "{what}: Ok (aligned by chance), but must be refused: {:?}",
                        refusal(align)
                    );
                    if let Some(v) = b.host_view() {
                        let (n, zero) = v.unwrap_or_else(|e| panic!("{what}: host view: {e}"));
                        assert_eq!(n, len, "{what}: host view length");
                        assert!(zero || !zeroed, "{what}: not zero-filled");
                    }
                    made += 1;
                    live.push(b);
                }
                Err(e) => {
                    assert_eq!(e.misuse(), Some(&refusal(align)), "{what}: {e}");
                    assert!(align > MAX_ALIGN, "{what}: refused: {e}");
                }
            }
        }
        drop(live);
    }
    made
}

/// Every allocator, every alignment from 16 bytes to 64 KiB, lengths from one element to
/// 3 MiB: each allocation is aligned for its element type (and readable from the host, for
/// host kinds) or refused with exactly `AlignmentUnsupported`; nothing is ever handed out at
/// a misaligned address. Before the fix, alignments of 512 and more were allocated and often
/// misaligned (61 of 224 on an H200 host): this test failed there.
#[test]
fn every_allocator_gives_aligned_elements_or_refuses_exactly() {
    let dev = gpu_or_skip!();
    let host_pool = match MemPool::host(dev) {
        Ok(p) => Some(p),
        Err(e) => {
            assert!(
                matches!(e.misuse(), Some(Misuse::Unsupported { .. })),
                "{e}"
            );
            cuda_mem_tests::skip(&format!("alignment of host pool buffers: {e}"));
            None
        }
    };
    let env = Env {
        stream: Stream::non_blocking().unwrap(),
        device_pool: MemPool::new(dev).unwrap(),
        host_pool,
        map_register_pool: PinnedPool::new(PinnedPoolConfig {
            strategy: MAP_REGISTER,
            ..PinnedPoolConfig::default()
        }),
    };
    let made = [
        check_every_allocator::<A16>(&env),
        check_every_allocator::<A64>(&env),
        check_every_allocator::<A256>(&env),
        check_every_allocator::<A512>(&env),
        check_every_allocator::<A4096>(&env),
        check_every_allocator::<A65536>(&env),
    ];
    let kinds = allocators::<A16>(&env).len();
    // Alignments up to 256 bytes: every allocation made; above: none.
    assert_eq!(
        made,
        [
            kinds * lens::<A16>().len(),
            kinds * lens::<A64>().len(),
            kinds * lens::<A256>().len(),
            0,
            0,
            0
        ]
    );
    env.stream.synchronize().unwrap();
    let stats = env.map_register_pool.stats();
    assert!(stats.driver_allocs > 0, "{stats}");
}

/// Element types aligned to more than 256 bytes are refused by every constructor before
/// anything is allocated, so without a GPU too, and a pinned pool makes no block for them.
/// Before the fix these calls reached the runtime (and on a GPU allocated misaligned memory).
#[test]
fn over_aligned_elements_are_refused_before_anything_is_allocated() {
    fn refused<T>(what: &str, align: usize, r: cuda_mem::Result<T>) {
        match r {
            Err(e) => assert_eq!(e.misuse(), Some(&refusal(align)), "{what}: {e}"),
            Ok(_) => panic!("{what}: allocated an element type aligned to {align} bytes"),
        }
    }
    let f = HostAllocFlags::DEFAULT;
    let src = vec![A512::zeroed(); 3];
    refused(
        "PinnedBuffer::zeroed",
        512,
        PinnedBuffer::<A512>::zeroed(3, f),
    );
    refused(
        "PinnedBuffer::zeroed",
        65536,
        PinnedBuffer::<A65536>::zeroed(1, HostAllocFlags::MAPPED),
    );
    refused(
        "PinnedBuffer::from_slice",
        512,
        PinnedBuffer::from_slice(&src, f),
    );
    // SAFETY: refused before anything is allocated: nothing uninitialised is read.
    refused("PinnedBuffer::uninit", 4096, unsafe {
        PinnedBuffer::<A4096>::uninit(3, f)
    });
    refused(
        "PinnedBuffer::malloc_host",
        512,
        PinnedBuffer::<A512>::malloc_host(3),
    );
    refused(
        "PinnedBuffer::with_strategy",
        4096,
        PinnedBuffer::<A4096>::with_strategy(1 << 10, f, MAP_REGISTER),
    );
    refused(
        "PinnedPool::global().alloc",
        512,
        PinnedPool::global().alloc::<A512>(3, f),
    );
    let pool = PinnedPool::new(PinnedPoolConfig::default());
    refused("PinnedPool::alloc", 4096, pool.alloc::<A4096>(3, f));
    refused(
        "PinnedPool::alloc_zeroed",
        512,
        pool.alloc_zeroed::<A512>(3, f),
    );
    refused("PinnedPool::from_slice", 512, pool.from_slice(&src, f));
    let stats = pool.stats();
    assert_eq!(
        (stats.misses, stats.driver_allocs, stats.in_use_bytes),
        (0, 0, 0),
        "no block made: {stats}"
    );
    refused(
        "ManagedBuffer::zeroed",
        512,
        ManagedBuffer::<A512>::zeroed(3, Attach::Global),
    );
    // SAFETY: refused before anything is allocated: nothing uninitialised is read.
    refused("ManagedBuffer::uninit", 65536, unsafe {
        ManagedBuffer::<A65536>::uninit(3, Attach::Host)
    });
    refused("DeviceBuffer::zeroed", 512, DeviceBuffer::<A512>::zeroed(3));
    refused(
        "DeviceBuffer::uninit",
        4096,
        DeviceBuffer::<A4096>::uninit(3),
    );
    refused(
        "DeviceBuffer::from_slice",
        512,
        DeviceBuffer::from_slice(&src),
    );
}
