//! The host copy of staged copies: `copy_nonoverlapping`, or for large chunks a copy whose
//! destination is written with non-temporal stores (AVX2).
//!
//! Non-temporal stores skip the read-for-ownership of the destination and leave it out of
//! the caches: with every core copying, they reach far more bandwidth than ordinary stores
//! (the host memcpy ceiling in `docs/results/`). Whether they win inside a staged copy
//! depends on the host and the direction (the staging buffer is read next by the copy
//! engine, the destination of a copy to the host by the application), which is why the
//! choice is per direction and measured ([`calibrate`](super::calibrate)).

/// Bytes from which a chunk is copied with non-temporal stores when they are asked for:
/// below, the ordinary copy is as fast and keeps the data in cache.
pub(crate) const NT_FROM: usize = 64 * 1024;

/// Whether this CPU can copy with non-temporal stores here (x86-64 with AVX2).
pub(crate) fn nt_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Copies `len` bytes; with `nt`, copies of [`NT_FROM`] bytes and more use non-temporal
/// stores where the CPU has AVX2.
///
/// # Safety
/// As `copy_nonoverlapping`: both ranges valid for `len` bytes and not overlapping.
pub(crate) unsafe fn host_copy(dst: *mut u8, src: *const u8, len: usize, nt: bool) {
    #[cfg(target_arch = "x86_64")]
    if nt && len >= NT_FROM && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked); the caller's promise covers the ranges.
        unsafe { nt::copy(dst, src, len) };
        return;
    }
    let _ = nt;
    // SAFETY: the caller's promise.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cfg(target_arch = "x86_64")]
mod nt {
    use std::arch::x86_64::*;

    /// A copy whose destination is written with 32-byte non-temporal stores (no
    /// read-for-ownership of the destination, which is not cached afterwards).
    ///
    /// # Safety
    /// AVX2 present; both ranges valid for `len` bytes and not overlapping.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: every access is inside `dst..dst + len` or `src..src + len` (the caller's
        // promise); the stores are to 32-byte aligned addresses (`head` makes `d` aligned);
        // loads are unaligned loads.
        unsafe {
            let head = dst.align_offset(32).min(len);
            std::ptr::copy_nonoverlapping(src, dst, head);
            let (mut d, mut s, mut n) = (dst.add(head), src.add(head), len - head);
            while n >= 128 {
                let a = _mm256_loadu_si256(s.cast());
                let b = _mm256_loadu_si256(s.add(32).cast());
                let c = _mm256_loadu_si256(s.add(64).cast());
                let e = _mm256_loadu_si256(s.add(96).cast());
                _mm256_stream_si256(d.cast(), a);
                _mm256_stream_si256(d.add(32).cast(), b);
                _mm256_stream_si256(d.add(64).cast(), c);
                _mm256_stream_si256(d.add(96).cast(), e);
                d = d.add(128);
                s = s.add(128);
                n -= 128;
            }
            std::ptr::copy_nonoverlapping(s, d, n);
            // Make the streamed stores visible before the DMA engine (or another thread)
            // reads the buffer.
            _mm_sfence();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "the non-temporal path is inline asm (vmovntdq), which Miri cannot run; \
                  Miri reports no AVX2, leaving a plain copy that takes a minute"
    )]
    fn host_copy_is_exact_at_odd_lengths_and_offsets() {
        // (Sizes just past the 64 KiB non-temporal threshold: Miri runs this too.)
        let src: Vec<u8> = (0..140_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for nt in [true, false] {
            for (so, dof, len) in [
                (0, 0, 140_000 - 1),
                (3, 5, 65_536 + 77),
                (1, 31, 100_001),
                (0, 0, 10),
                (7, 0, NT_FROM - 1),
                (0, 1, NT_FROM),
            ] {
                let mut dst = vec![0u8; 140_064];
                // SAFETY: both ranges lie inside their vectors and do not overlap.
                unsafe { host_copy(dst.as_mut_ptr().add(dof), src.as_ptr().add(so), len, nt) };
                assert_eq!(
                    &dst[dof..dof + len],
                    &src[so..so + len],
                    "nt={nt} len={len}"
                );
                assert!(dst[..dof].iter().all(|&b| b == 0));
                assert!(dst[dof + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
