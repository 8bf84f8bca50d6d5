//! The host model's arithmetic: what each buffer holds is a `Vec<u32>` updated by every
//! operation as the program says, and these are the values and range rules both sides share.

use crate::program::Init;

/// A value per element that differs per element and per seed, so stale data never matches.
pub fn value(seed: u32, i: usize) -> u32 {
    let mut x = seed.wrapping_mul(0x9e37_79b1) ^ (i as u32).wrapping_mul(0x85eb_ca77);
    x ^= x >> 15;
    x = x.wrapping_mul(0x2c1b_3c6d);
    x ^= x >> 12;
    x = x.wrapping_mul(0x297a_2d39);
    x ^ (x >> 15)
}

/// `n` elements of [`value`] for `seed`.
pub fn pattern(seed: u32, n: usize) -> Vec<u32> {
    (0..n).map(|i| value(seed, i)).collect()
}

/// What `cm_write` leaves in `n` elements: element `e` is `e / 4` (16-byte word `e / 4` holds
/// its index in all four lanes), relative to the address it was given.
pub fn written(n: usize) -> Vec<u32> {
    (0..n).map(|e| (e / 4) as u32).collect()
}

/// Every byte `b`.
pub fn splat(b: u8) -> u32 {
    u32::from(b) * 0x0101_0101
}

impl Init {
    /// The contents of a new buffer of `len` elements.
    pub fn fill(self, len: usize) -> Vec<u32> {
        match self {
            Init::Zero => vec![0; len],
            Init::Byte(b) => vec![splat(b); len],
            Init::Pattern(s) => pattern(s, len),
        }
    }
}

/// The XOR of all elements (what `cm_xor` computes).
pub fn xor(v: &[u32]) -> u32 {
    v.iter().fold(0, |a, &b| a ^ b)
}

/// Elements `off..off + n` of a buffer of `len > 0` elements, clamped: `off` wraps around
/// `len`, `n` is cut at the end, and with `aligned` both are whole 16-byte words (four
/// elements; buffer lengths are multiples of four). `None` when nothing is left.
pub fn clamp(len: usize, off: u32, n: u32, aligned: bool) -> Option<(usize, usize)> {
    if len == 0 {
        return None;
    }
    let mut off = off as usize % len;
    if aligned {
        off &= !3;
    }
    let mut n = (n as usize).min(len - off);
    if aligned {
        n &= !3;
    }
    (n > 0).then_some((off, n))
}

/// The ranges of a copy of `n` elements from `src_off` of a buffer of `src_len` to `dst_off`
/// of one of `dst_len`, clamped as by [`clamp`]: `(dst_off, src_off, n)`.
pub fn clamp2(
    dst_len: usize,
    src_len: usize,
    dst_off: u32,
    src_off: u32,
    n: u32,
) -> Option<(usize, usize, usize)> {
    let (d, dn) = clamp(dst_len, dst_off, n, false)?;
    let (s, sn) = clamp(src_len, src_off, n, false)?;
    Some((d, s, dn.min(sn)))
}

/// Where a buffer of `len` elements is split for `split_at_mut`: inside it, 16-byte aligned,
/// both halves non-empty (`None` for buffers of fewer than 8 elements).
pub fn split_point(len: usize, mid: u32) -> Option<usize> {
    if len < 8 {
        return None;
    }
    // Whole words from 4 to len - 4.
    let words = len / 4;
    Some((1 + mid as usize % (words - 1)) * 4)
}

/// `Ok` when `got` is `want`; else a description of the difference: where, how many
/// elements, and the first values.
pub fn compare(what: &str, base: usize, got: &[u32], want: &[u32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements read, {} expected",
            got.len(),
            want.len()
        ));
    }
    if got == want {
        return Ok(());
    }
    let first = (0..got.len()).find(|&i| got[i] != want[i]).unwrap_or(0);
    let bad = (first..got.len()).filter(|&i| got[i] != want[i]).count();
    let last = (first..got.len())
        .rev()
        .find(|&i| got[i] != want[i])
        .unwrap_or(first);
    let show = |v: &[u32]| {
        v[first..got.len().min(first + 4)]
            .iter()
            .map(|x| format!("{x:#010x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    Err(format!(
        "{what}: MISMATCH at element {} ({bad} of {} elements differ, last at {}): got {} expected {}",
        base + first,
        got.len(),
        base + last,
        show(got),
        show(want)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_clamped_into_the_buffer() {
        assert_eq!(clamp(16, 4, 8, false), Some((4, 8)));
        assert_eq!(clamp(16, 20, 100, false), Some((4, 12)));
        assert_eq!(clamp(16, 5, 7, true), Some((4, 4)));
        assert_eq!(clamp(16, 13, 2, true), None);
        assert_eq!(clamp(0, 0, 1, false), None);
        assert_eq!(clamp2(8, 16, 6, 0, 16), Some((6, 0, 2)));
        assert_eq!(split_point(4, 0), None);
        for mid in 0..20 {
            let m = split_point(16, mid).unwrap();
            assert!(m % 4 == 0 && (4..=12).contains(&m), "{m}");
        }
    }

    #[test]
    fn comparisons_name_the_first_difference() {
        assert!(compare("x", 0, &[1, 2], &[1, 2]).is_ok());
        let e = compare("x", 10, &[1, 9, 3, 9], &[1, 2, 3, 4]).unwrap_err();
        assert!(
            e.contains("element 11") && e.contains("2 of 4") && e.contains("last at 13"),
            "{e}"
        );
        assert_eq!(written(8), vec![0, 0, 0, 0, 1, 1, 1, 1]);
        assert_ne!(pattern(1, 4), pattern(2, 4));
    }
}
