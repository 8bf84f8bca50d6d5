//! How pinned host memory is made: `cudaHostAlloc`, or fast cold pinning by mapping memory,
//! faulting its pages in with several threads and registering it (`cudaHostRegister`).
//!
//! `cudaHostAlloc` faults and locks every page of a new allocation on the calling thread
//! (the measured cost, and what this saves: `docs/results/` in the repository). Most of that
//! is the kernel zeroing and mapping pages one fault at a time, which parallelizes; registering memory
//! whose pages are already present is much cheaper. [`PinStrategy::MapRegister`] does that:
//! `mmap` (2 MiB aligned, optionally asking for transparent huge pages), the pages populated
//! by [`threads`](PinStrategy::MapRegister::threads) threads at once (one write per page),
//! then one `cudaHostRegister` of the whole range. (One registration: the runtime refuses a
//! copy that spans two registrations, so the threads cannot register their shares.)
//!
//! Write-combined memory cannot be made this way: `cudaHostRegister` has no write-combined
//! flag, and the kernel maps anonymous memory cached. Such requests are refused by
//! `MapRegister` ([`Misuse::InvalidArgument`]) and made by `cudaHostAlloc` under
//! [`PinStrategy::Auto`].

use std::ptr::NonNull;
use std::time::{Duration, Instant};

use cuda_mem_sys as sys;

use crate::contract::size::fmt_bytes;
use crate::error::{check, Misuse, Result};
use crate::handles::flags::HostAllocFlags;

/// How to make pinned host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinStrategy {
    /// `cudaHostAlloc` with the flags asked for (every flag combination).
    HostAlloc,
    /// `mmap` + populate with `threads` threads + `cudaHostRegister` (PORTABLE and MAPPED
    /// supported; write-combined refused). Freed with `cudaHostUnregister` + `munmap`.
    /// Blocks under 2 MiB (one huge page, the mapping's granularity) are made by
    /// `cudaHostAlloc` instead, so that a small block never pins a whole 2 MiB.
    MapRegister {
        /// Threads that fault the pages in (1 or more; the caller's thread is one of them).
        threads: usize,
        /// Ask for transparent huge pages (`madvise(MADV_HUGEPAGE)`): fewer, larger faults
        /// and fewer pages to lock, where the kernel grants them.
        huge_pages: bool,
    },
    /// [`MapRegister`](Self::MapRegister) with huge pages for blocks of
    /// [`AUTO_MAP_REGISTER_FROM`] bytes and more that are not write-combined, with a thread
    /// per 16 MiB up to [`default_pin_threads`] (a thread started to fault in a page or two
    /// costs more than it saves); `cudaHostAlloc` otherwise.
    Auto,
}

/// Threads that populate pages under [`PinStrategy::Auto`]: as many as the host has cores,
/// up to 16. On the 16-core H200 host each step up to 16 threads pinned faster; the figures
/// are in `docs/results/` (section "Measured design choices").
pub fn default_pin_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .clamp(1, 16)
}

/// Smallest block [`PinStrategy::Auto`] makes by mapping and registering: below it the
/// threads cost more than they save.
pub const AUTO_MAP_REGISTER_FROM: usize = 4 << 20;

/// Bytes each populating thread takes under [`PinStrategy::Auto`]: 256 MiB on 16 threads, as
/// measured.
const AUTO_BYTES_PER_THREAD: usize = 16 << 20;

/// Alignment (and size granularity) of mapped blocks: one transparent huge page.
const MAP_ALIGN: usize = 2 << 20;

impl PinStrategy {
    /// The concrete strategy for a block of `bytes` with `flags`.
    pub(crate) fn resolve(self, bytes: usize, flags: HostAllocFlags) -> PinStrategy {
        match self {
            // Mapped blocks take whole 2 MiB pages: smaller ones would pin far more than asked.
            // (Write-combined requests stay, to be refused as for any size.)
            PinStrategy::MapRegister { .. }
                if bytes < MAP_ALIGN && !flags.contains(HostAllocFlags::WRITE_COMBINED) =>
            {
                PinStrategy::HostAlloc
            }
            PinStrategy::Auto
                if bytes >= AUTO_MAP_REGISTER_FROM
                    && !flags.contains(HostAllocFlags::WRITE_COMBINED)
                    && cfg!(target_os = "linux") =>
            {
                PinStrategy::MapRegister {
                    threads: bytes
                        .div_ceil(AUTO_BYTES_PER_THREAD)
                        .min(default_pin_threads()),
                    huge_pages: true,
                }
            }
            PinStrategy::Auto => PinStrategy::HostAlloc,
            s => s,
        }
    }
}

/// How a [`Block`] was made, which decides how it is freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Made {
    HostAlloc,
    /// `mmap` of `map_len` bytes at the block's address, registered as a whole.
    Mapped {
        map_len: usize,
    },
    /// Ordinary heap memory standing in for pinned memory, for the pool's tests without a GPU.
    #[cfg(test)]
    Heap,
}

/// One allocation of pinned host memory, every byte initialised (zeroed when made). Freed
/// only by [`Block::free`]; a `Block` that is dropped instead is leaked.
#[derive(Debug)]
pub(crate) struct Block {
    ptr: NonNull<u8>,
    /// Usable bytes (what was asked for; a mapped block may have more behind it).
    bytes: usize,
    made: Made,
}

// SAFETY: a `Block` is an owned address range of pinned memory with no thread affinity:
// pinned memory may be used and freed from any thread (cudaFreeHost, cudaHostUnregister and
// munmap are process-wide), and the type gives no access to the memory by itself.
unsafe impl Send for Block {}

impl Block {
    /// Makes `bytes` (non-zero) of pinned memory with `flags` by `strategy`, every byte
    /// zero. Returns the time spent in the driver and the kernel too.
    pub(crate) fn alloc(
        bytes: usize,
        flags: HostAllocFlags,
        strategy: PinStrategy,
    ) -> Result<(Block, Duration)> {
        let t = Instant::now();
        let block = match strategy.resolve(bytes, flags) {
            PinStrategy::MapRegister {
                threads,
                huge_pages,
            } => map_register(bytes, flags, threads, huge_pages)?,
            _ => host_alloc(bytes, flags)?,
        };
        Ok((block, t.elapsed()))
    }

    /// The address.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Usable bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// A block that is not memory at all, for the pool's bookkeeping tests: never free it.
    #[cfg(test)]
    pub(crate) fn fake(bytes: usize) -> Block {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static ADDRS: [u8; 64] = [0; 64];
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let i = NEXT.fetch_add(1, Ordering::Relaxed) % ADDRS.len();
        Block {
            ptr: NonNull::from(&ADDRS[i]),
            bytes,
            made: Made::HostAlloc,
        }
    }

    /// `bytes` (non-zero) of zeroed heap memory standing in for a pinned block, for the pool's
    /// tests without a GPU: 4096-aligned as `cudaHostAlloc`'s blocks, given back to the heap
    /// by [`free`](Self::free). Always succeeds (an allocation failure aborts, as for `Vec`).
    #[cfg(test)]
    pub(crate) fn heap(bytes: usize) -> Block {
        let layout = Self::heap_layout(bytes);
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Block {
            ptr,
            bytes,
            made: Made::Heap,
        }
    }

    /// The layout of a [`heap`](Self::heap) block of `bytes`, the same at allocation and at
    /// [`free`](Self::free).
    #[cfg(test)]
    fn heap_layout(bytes: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(bytes.max(1), 4096)
            .unwrap_or_else(|_| std::alloc::Layout::new::<u8>())
    }

    /// Whether the block was made by mapping and registering.
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self.made, Made::Mapped { .. })
    }

    /// Frees the memory. On error it is leaked (a retry could free twice, or unmap memory the
    /// device may still reach).
    ///
    /// The caller must know that no GPU work still uses the block.
    pub(crate) fn free(self) -> Result<()> {
        let p = self.ptr.as_ptr();
        match self.made {
            Made::HostAlloc => {
                // SAFETY: the block owns this cudaHostAlloc allocation; it is consumed here and
                // never used again; the caller guarantees that no GPU work uses it.
                check(unsafe { sys::cudaFreeHost(p.cast()) }, || {
                    format!("cudaFreeHost({p:p})")
                })
            }
            Made::Mapped { map_len } => {
                // SAFETY: the block registered exactly this address; nothing uses it any more.
                check(unsafe { sys::cudaHostUnregister(p.cast()) }, || {
                    format!("cudaHostUnregister({p:p})")
                })?;
                unmap(p, map_len);
                Ok(())
            }
            #[cfg(test)]
            Made::Heap => {
                let layout = Self::heap_layout(self.bytes);
                // SAFETY: made by `Block::heap` with this layout; consumed here, never used
                // again.
                unsafe { std::alloc::dealloc(p, layout) };
                Ok(())
            }
        }
    }
}

/// `cudaHostAlloc(bytes, flags)`; `bytes` non-zero, flags known bits (callers check both).
pub(crate) fn cuda_host_alloc(bytes: usize, flags: HostAllocFlags) -> Result<NonNull<u8>> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid out-pointer; `bytes` is non-zero; flags are known bits (checked by the
    // callers through `HostAllocFlags`).
    let code = unsafe { sys::cudaHostAlloc(&mut raw, bytes, flags.bits()) };
    check(code, || {
        format!("cudaHostAlloc({}, {flags})", fmt_bytes(bytes))
    })?;
    NonNull::new(raw.cast::<u8>()).ok_or_else(|| {
        Misuse::NullPointer {
            op: "cudaHostAlloc",
        }
        .into()
    })
}

fn host_alloc(bytes: usize, flags: HostAllocFlags) -> Result<Block> {
    let ptr = cuda_host_alloc(bytes, flags)?;
    // The runtime does not promise zeroed memory: make every byte initialised.
    // SAFETY: the allocation holds `bytes` writable bytes that nothing else uses yet.
    unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, bytes) };
    Ok(Block {
        ptr,
        bytes,
        made: Made::HostAlloc,
    })
}

#[cfg(not(target_os = "linux"))]
fn map_register(_: usize, _: HostAllocFlags, _: usize, _: bool) -> Result<Block> {
    Err(Misuse::InvalidArgument {
        op: "PinStrategy::MapRegister",
        reason: "mapping and registering is implemented for Linux only".into(),
    }
    .into())
}

#[cfg(not(target_os = "linux"))]
fn unmap(_: *mut u8, _: usize) {}

/// `munmap`; a failure (impossible for a range this module mapped) leaks the range.
#[cfg(target_os = "linux")]
fn unmap(p: *mut u8, len: usize) {
    // SAFETY: `p..p + len` is a mapping this module made and nothing refers to any more.
    unsafe { libc::munmap(p.cast(), len) };
}

#[cfg(target_os = "linux")]
fn map_register(
    bytes: usize,
    flags: HostAllocFlags,
    threads: usize,
    huge_pages: bool,
) -> Result<Block> {
    const OP: &str = "PinStrategy::MapRegister";
    if flags.contains(HostAllocFlags::WRITE_COMBINED) {
        return Err(Misuse::InvalidArgument {
            op: OP,
            reason: "write-combined memory cannot be made by mmap + cudaHostRegister \
                     (cudaHostRegister has no write-combined flag): use PinStrategy::HostAlloc"
                .into(),
        }
        .into());
    }
    if threads == 0 {
        return Err(Misuse::InvalidArgument {
            op: OP,
            reason: "threads must be at least 1".into(),
        }
        .into());
    }
    let map_len = bytes
        .checked_next_multiple_of(MAP_ALIGN)
        .ok_or(Misuse::SizeOverflow {
            len: bytes,
            elem_size: 1,
        })?;
    let t0 = Instant::now();
    let p = map_aligned(map_len)?;
    if huge_pages {
        // A hint: refusal (THP disabled) only means small pages.
        // SAFETY: `p..p + map_len` is our private anonymous mapping.
        unsafe { libc::madvise(p.cast(), map_len, libc::MADV_HUGEPAGE) };
    }
    let t_map = t0.elapsed();
    let mut reg = sys::cudaHostRegisterDefault;
    if flags.contains(HostAllocFlags::PORTABLE) {
        reg |= sys::cudaHostRegisterPortable;
    }
    if flags.contains(HostAllocFlags::MAPPED) {
        reg |= sys::cudaHostRegisterMapped;
    }
    let t1 = Instant::now();
    populate(p, &shares(map_len, threads));
    let t2 = Instant::now();
    // One registration of the whole range: a copy may not span two registrations (the
    // runtime refuses it with cudaErrorInvalidValue, seen on the H200 machine), so the
    // range cannot be registered in pieces by the populating threads.
    if let Err(e) = register(p, map_len, reg) {
        unmap(p, map_len);
        return Err(e);
    }
    set_phases([t_map, t2 - t1, t2.elapsed()]);
    Ok(Block {
        // `map_aligned` never returns null.
        ptr: NonNull::new(p).ok_or(Misuse::NullPointer { op: OP })?,
        bytes,
        made: Made::Mapped { map_len },
    })
}

/// `cudaHostRegister` of `len` bytes at `p` with flags `reg`.
#[cfg(target_os = "linux")]
fn register(p: *mut u8, len: usize, reg: u32) -> Result<()> {
    // SAFETY: `p..p + len` is a live, page-aligned, populated range of a mapping we own; the
    // flags are known bits. On failure nothing was registered.
    let code = unsafe { sys::cudaHostRegister(p.cast(), len, reg) };
    check(code, || {
        format!("cudaHostRegister({}, {reg:#x})", fmt_bytes(len))
    })
}

/// How pages are faulted in: 0 one write per page (the default: on the H200 host, by far the
/// fastest of the three; figures in `docs/results/`), 1
/// `madvise(MADV_POPULATE_WRITE)` (falling back to writes), 2 `MAP_POPULATE` when mapping
/// (one thread, in the kernel). Set by `measure::set_populate_mode` to compare them.
pub(crate) static POPULATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn populate_mode() -> u8 {
    POPULATE.load(std::sync::atomic::Ordering::Relaxed)
}

thread_local! {
    /// Map, populate and register time of this thread's last `MapRegister` block.
    static PHASES: std::cell::Cell<[Duration; 3]> = const { std::cell::Cell::new([Duration::ZERO; 3]) };
}

fn set_phases(p: [Duration; 3]) {
    PHASES.with(|c| c.set(p));
}

/// The phases of this thread's last `MapRegister` block (for `cuda-mem bench`).
#[allow(dead_code)]
pub(crate) fn last_phases() -> [Duration; 3] {
    PHASES.with(std::cell::Cell::get)
}

/// The threads' shares of `len` bytes: whole huge pages each, so that no two threads fault
/// the same one; at most `threads` of them.
fn shares(len: usize, threads: usize) -> Vec<(usize, usize)> {
    let pages = (len / MAP_ALIGN).max(1);
    let threads = threads.clamp(1, pages);
    let per = pages.div_ceil(threads) * MAP_ALIGN;
    (0..len.div_ceil(per))
        .map(|i| (i * per, per.min(len - i * per)))
        .collect()
}

/// A private anonymous read-write mapping of `len` bytes (a multiple of `MAP_ALIGN`) whose
/// start is `MAP_ALIGN`-aligned, so that it can be backed by huge pages.
#[cfg(target_os = "linux")]
fn map_aligned(len: usize) -> Result<*mut u8> {
    let over = len
        .checked_add(MAP_ALIGN)
        .ok_or(Misuse::SizeOverflow { len, elem_size: 1 })?;
    // SAFETY: a fresh anonymous mapping: no existing memory is affected.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            over,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | if populate_mode() == 2 {
                    libc::MAP_POPULATE
                } else {
                    0
                },
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        // ENOMEM counts as out of memory (`Error::is_out_of_memory`), so that a pool empties
        // its cache and retries.
        return Err(crate::error::Error::os(
            format!("mmap({}) for pinned memory", fmt_bytes(over)),
            &std::io::Error::last_os_error(),
        ));
    }
    let base = raw as usize;
    let start = base.next_multiple_of(MAP_ALIGN);
    let (head, tail) = (start - base, base + over - (start + len));
    // Trim the unaligned head and the tail. (Failure would only leave them mapped.)
    if head > 0 {
        unmap(base as *mut u8, head);
    }
    if tail > 0 {
        unmap((start + len) as *mut u8, tail);
    }
    Ok(start as *mut u8)
}

/// Faults in every page of the `shares` of the mapping at `p` for writing, one thread per
/// share (the calling thread takes the first).
#[cfg(target_os = "linux")]
fn populate(p: *mut u8, shares: &[(usize, usize)]) {
    let base = p as usize;
    std::thread::scope(|s| {
        for &(off, len) in shares.iter().skip(1) {
            let at = (base + off) as *mut u8 as usize;
            let spawned = std::thread::Builder::new()
                .spawn_scoped(s, move || populate_range(at as *mut u8, len));
            if spawned.is_err() {
                // The OS refused a thread: fault this share in here instead.
                populate_range(at as *mut u8, len);
            }
        }
        if let Some(&(off, len)) = shares.first() {
            populate_range((base + off) as *mut u8, len);
        }
    });
}

/// Faults in `p..p + len` as `POPULATE` says: one write per page, or
/// `madvise(MADV_POPULATE_WRITE)` (Linux 5.14+, writes where the kernel refuses it).
#[cfg(target_os = "linux")]
fn populate_range(p: *mut u8, len: usize) {
    /// `MADV_POPULATE_WRITE` (not exported by `libc` for every target).
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    match populate_mode() {
        1 => {}
        2 => return, // populated by mmap
        _ => return touch(p, len),
    }
    // SAFETY: `p..p + len` lies inside our private anonymous mapping; populating only faults
    // pages in (zero-filled), it changes no content.
    if unsafe { libc::madvise(p.cast(), len, MADV_POPULATE_WRITE) } != 0 {
        touch(p, len);
    }
}

/// One write per page of `p..p + len`.
#[cfg(target_os = "linux")]
fn touch(p: *mut u8, len: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: inside our read-write mapping, which nothing else uses yet; writing the
        // zero the page already holds changes nothing but faults the page in.
        unsafe { std::ptr::write_volatile(p.add(off), 0) };
        off += 4096;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_whole_huge_pages_covering_the_range_once() {
        let m = MAP_ALIGN;
        assert_eq!(
            shares(10 * m, 4),
            [(0, 3 * m), (3 * m, 3 * m), (6 * m, 3 * m), (9 * m, m)]
        );
        assert_eq!(shares(m, 16), [(0, m)]);
        assert_eq!(shares(4 * m, 1), [(0, 4 * m)]);
    }

    #[test]
    fn auto_picks_map_register_for_large_cached_blocks_only() {
        let f = HostAllocFlags::DEFAULT;
        assert_eq!(PinStrategy::Auto.resolve(4096, f), PinStrategy::HostAlloc);
        let small = PinStrategy::Auto.resolve(AUTO_MAP_REGISTER_FROM, f);
        assert_eq!(
            small,
            PinStrategy::MapRegister {
                threads: 1,
                huge_pages: true
            },
            "one thread for a block of a few huge pages"
        );
        for (bytes, threads) in [(40 << 20, 3), (256 << 20, 16), (1 << 30, 16)] {
            assert_eq!(
                PinStrategy::Auto.resolve(bytes, f),
                PinStrategy::MapRegister {
                    threads: threads.min(default_pin_threads()),
                    huge_pages: true
                }
            );
        }
        assert_eq!(
            PinStrategy::Auto.resolve(1 << 30, HostAllocFlags::WRITE_COMBINED),
            PinStrategy::HostAlloc
        );
        assert_eq!(
            PinStrategy::HostAlloc.resolve(1 << 30, f),
            PinStrategy::HostAlloc
        );
    }

    #[test]
    fn map_register_refuses_write_combined_and_zero_threads() {
        let wc = map_register(1 << 20, HostAllocFlags::WRITE_COMBINED, 4, false).unwrap_err();
        assert!(wc.to_string().contains("write-combined"), "{wc}");
        let zero = map_register(1 << 20, HostAllocFlags::DEFAULT, 0, false).unwrap_err();
        assert!(zero.to_string().contains("threads"), "{zero}");
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "mmap with MAP_NORESERVE and munmap of a part: Miri supports neither"
    )]
    fn populate_faults_every_page_of_an_aligned_mapping() {
        // No CUDA here: map, populate with several threads, check the contents, unmap.
        let len = 3 * MAP_ALIGN;
        let p = map_aligned(len).unwrap();
        assert_eq!(p as usize % MAP_ALIGN, 0);
        let sh = shares(len, 4);
        assert_eq!(
            sh,
            [
                (0, MAP_ALIGN),
                (MAP_ALIGN, MAP_ALIGN),
                (2 * MAP_ALIGN, MAP_ALIGN)
            ]
        );
        populate(p, &sh);
        // SAFETY: the mapping is ours, `len` bytes, zero-filled by the kernel.
        let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
        assert!(s.iter().all(|&b| b == 0));
        s[len - 1] = 7;
        assert_eq!(s[len - 1], 7);
        unmap(p, len);
    }
}
