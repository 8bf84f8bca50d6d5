//! How staged copies are cut and run ([`StagingConfig`]), its fallback values, and the
//! `CUDA_MEM_STAGED_*` environment overrides.

use super::Dir;
use crate::error::{Misuse, Result};

/// How a [`Stager`](super::Stager) cuts and runs copies.
///
/// [`StagingConfig::default`] is a fixed fallback; the process-wide stager measures its own
/// values on the machine at first use ([`staged_config`](super::staged_config)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagingConfig {
    /// Worker threads a copy uses, each with its own stream and staging block per device.
    pub threads: usize,
    /// Largest chunk, bytes: each staging slot holds this much. A copy is cut into about
    /// `threads * chunks_per_thread` chunks, each between `min_chunk_bytes` and this.
    pub chunk_bytes: usize,
    /// Smallest chunk, bytes.
    pub min_chunk_bytes: usize,
    /// Chunks each worker should get per copy: enough for its pipeline to fill.
    pub chunks_per_thread: usize,
    /// Staging slots per worker (2: one filled by the CPU while the other is copied).
    pub depth: usize,
    /// Copies from pageable host memory to the device.
    pub to_device: DirectionConfig,
    /// Copies from the device to pageable host memory.
    pub to_host: DirectionConfig,
}

/// What a [`StagingConfig`] sets per direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectionConfig {
    /// Copies smaller than this take the driver's path.
    pub min_bytes: usize,
    /// Write chunks with non-temporal stores (x86-64 with AVX2; ignored elsewhere): into the
    /// staging slot on the way to the device, into the destination on the way back.
    pub nt_stores: bool,
}

/// Cores of this machine (4 where the OS cannot say), at most 64.
pub(super) fn cores() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .clamp(1, 64)
}

impl Default for StagingConfig {
    /// The fallback values, chosen from the H200 measurements (`docs/guide.md`, "Staged
    /// pageable copies"; the figures: `docs/results/`, "Measured design choices"), for where
    /// nothing is measured: as many workers as the host has cores; about four chunks per
    /// worker, between 256 KiB and 4 MiB; two staging slots per worker; staged from 4 MiB up
    /// both ways; non-temporal stores on.
    fn default() -> Self {
        StagingConfig {
            threads: cores(),
            chunk_bytes: 4 << 20,
            min_chunk_bytes: 256 << 10,
            chunks_per_thread: 4,
            depth: 2,
            to_device: DirectionConfig {
                min_bytes: 4 << 20,
                nt_stores: true,
            },
            to_host: DirectionConfig {
                min_bytes: 4 << 20,
                nt_stores: true,
            },
        }
    }
}

impl StagingConfig {
    /// This configuration with both directions staged from `bytes` up.
    pub fn with_min_bytes(mut self, bytes: usize) -> Self {
        self.to_device.min_bytes = bytes;
        self.to_host.min_bytes = bytes;
        self
    }

    /// This configuration with non-temporal stores on or off both ways.
    pub fn with_nt_stores(mut self, on: bool) -> Self {
        self.to_device.nt_stores = on;
        self.to_host.nt_stores = on;
        self
    }

    /// The settings of direction `dir`.
    pub(super) fn dir(&self, dir: Dir) -> DirectionConfig {
        match dir {
            Dir::ToDevice => self.to_device,
            Dir::ToHost => self.to_host,
        }
    }

    /// The settings of direction `dir`, to change.
    pub(super) fn dir_mut(&mut self, dir: Dir) -> &mut DirectionConfig {
        match dir {
            Dir::ToDevice => &mut self.to_device,
            Dir::ToHost => &mut self.to_host,
        }
    }

    /// The chunk size for a copy of `bytes`: about `threads * chunks_per_thread` chunks, a
    /// multiple of 64 KiB, clamped to `min_chunk_bytes..=chunk_bytes`.
    pub fn chunk_for(&self, bytes: usize) -> usize {
        let want = bytes / self.threads.saturating_mul(self.chunks_per_thread).max(1);
        // (`max` then `min` rather than `clamp`: no panic for a config with min > max.)
        want.checked_next_multiple_of(64 << 10)
            .unwrap_or(usize::MAX)
            .max(self.min_chunk_bytes)
            .min(self.chunk_bytes)
            .max(4096)
    }

    /// [`Misuse::InvalidArgument`] (naming `op`) for values out of range.
    pub(super) fn check(&self, op: &'static str) -> Result<()> {
        let bad = |reason: &str| {
            Err(Misuse::InvalidArgument {
                op,
                reason: reason.into(),
            }
            .into())
        };
        if self.threads == 0 || self.threads > 1024 {
            return bad("threads must be between 1 and 1024");
        }
        if self.min_chunk_bytes < 4096 || self.chunk_bytes < self.min_chunk_bytes {
            return bad("chunk sizes must be at least 4096, min_chunk_bytes <= chunk_bytes");
        }
        if self.chunk_bytes > 1 << 30 {
            return bad("chunk_bytes must be at most 1 GiB");
        }
        if self.chunks_per_thread == 0 || self.chunks_per_thread > 1024 {
            return bad("chunks_per_thread must be between 1 and 1024");
        }
        if self.depth == 0 || self.depth > 16 {
            return bad("depth must be between 1 and 16");
        }
        Ok(())
    }
}

/// The fields the environment set, which calibration leaves alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Fixed {
    pub(super) threads: bool,
    pub(super) chunk: bool,
    pub(super) depth: bool,
    pub(super) min_bytes: [bool; 2],
    pub(super) nt: [bool; 2],
}

/// The `CUDA_MEM_STAGED_*` variables, each with what it sets.
pub(super) const ENV_VARS: [(&str, &str); 11] = [
    (
        "CUDA_MEM_STAGED_CALIBRATE",
        "0: use the fallback values, measure nothing",
    ),
    ("CUDA_MEM_STAGED_THREADS", "worker threads a copy uses"),
    (
        "CUDA_MEM_STAGED_CHUNK",
        "largest chunk (bytes; K, M, G suffixes)",
    ),
    ("CUDA_MEM_STAGED_MIN_CHUNK", "smallest chunk (bytes)"),
    ("CUDA_MEM_STAGED_DEPTH", "staging slots per worker"),
    (
        "CUDA_MEM_STAGED_MIN_BYTES",
        "staged from this size up, both ways (bytes)",
    ),
    (
        "CUDA_MEM_STAGED_MIN_BYTES_H2D",
        "the same, host to device only",
    ),
    (
        "CUDA_MEM_STAGED_MIN_BYTES_D2H",
        "the same, device to host only",
    ),
    (
        "CUDA_MEM_STAGED_NT",
        "1 or 0: non-temporal stores both ways",
    ),
    ("CUDA_MEM_STAGED_NT_H2D", "the same, host to device only"),
    ("CUDA_MEM_STAGED_NT_D2H", "the same, device to host only"),
];

/// A byte count: digits with an optional `K`, `M` or `G` suffix (powers of 1024; `KiB`,
/// `MiB`, `GiB` and lower case accepted).
pub(super) fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: usize = n.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

/// Applies the `CUDA_MEM_STAGED_*` settings read by `get` (the environment, or a map in the
/// tests) to `base`. Returns the configuration, the fields set, whether calibration is off,
/// and the settings applied (`NAME=value`). A value that does not parse, or a configuration
/// out of range, is [`Misuse::InvalidArgument`] naming the variable.
pub(super) fn apply_env(
    mut base: StagingConfig,
    get: impl Fn(&str) -> Option<String>,
) -> Result<(StagingConfig, Fixed, bool, Vec<String>)> {
    let mut fixed = Fixed::default();
    let mut applied = Vec::new();
    let mut calibrate = true;
    for (name, what) in ENV_VARS {
        let Some(v) = get(name) else { continue };
        let bad = || -> crate::error::Error {
            Misuse::InvalidArgument {
                op: name,
                reason: format!("{v:?} is not {what}"),
            }
            .into()
        };
        let flag = || match v.trim() {
            "1" | "true" | "on" | "yes" => Ok(true),
            "0" | "false" | "off" | "no" => Ok(false),
            _ => Err(bad()),
        };
        let bytes = || parse_bytes(&v).ok_or_else(bad);
        let count = || v.trim().parse::<usize>().map_err(|_| bad());
        match name {
            "CUDA_MEM_STAGED_CALIBRATE" => calibrate = flag()?,
            "CUDA_MEM_STAGED_THREADS" => {
                base.threads = count()?;
                fixed.threads = true;
            }
            "CUDA_MEM_STAGED_CHUNK" => {
                base.chunk_bytes = bytes()?;
                base.min_chunk_bytes = base.min_chunk_bytes.min(base.chunk_bytes);
                fixed.chunk = true;
            }
            "CUDA_MEM_STAGED_MIN_CHUNK" => {
                base.min_chunk_bytes = bytes()?;
                fixed.chunk = true;
            }
            "CUDA_MEM_STAGED_DEPTH" => {
                base.depth = count()?;
                fixed.depth = true;
            }
            "CUDA_MEM_STAGED_MIN_BYTES" => {
                let b = bytes()?;
                base = base.with_min_bytes(b);
                fixed.min_bytes = [true, true];
            }
            "CUDA_MEM_STAGED_MIN_BYTES_H2D" => {
                base.to_device.min_bytes = bytes()?;
                fixed.min_bytes[0] = true;
            }
            "CUDA_MEM_STAGED_MIN_BYTES_D2H" => {
                base.to_host.min_bytes = bytes()?;
                fixed.min_bytes[1] = true;
            }
            "CUDA_MEM_STAGED_NT" => {
                base = base.with_nt_stores(flag()?);
                fixed.nt = [true, true];
            }
            "CUDA_MEM_STAGED_NT_H2D" => {
                base.to_device.nt_stores = flag()?;
                fixed.nt[0] = true;
            }
            "CUDA_MEM_STAGED_NT_D2H" => {
                base.to_host.nt_stores = flag()?;
                fixed.nt[1] = true;
            }
            _ => {}
        }
        applied.push(format!("{name}={v}"));
    }
    if !applied.is_empty() {
        base.check("CUDA_MEM_STAGED_* (the staged-copy settings of the environment)")?;
    }
    Ok((base, fixed, !calibrate, applied))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_out_of_range_is_refused() {
        let ok = StagingConfig::default();
        assert!(ok.check("t").is_ok());
        for bad in [
            StagingConfig { threads: 0, ..ok },
            StagingConfig {
                chunk_bytes: 100,
                ..ok
            },
            StagingConfig { depth: 0, ..ok },
            StagingConfig {
                chunk_bytes: 2 << 30,
                ..ok
            },
        ] {
            let e = bad.check("t").unwrap_err();
            assert!(
                matches!(
                    e,
                    crate::Error::Misuse(Misuse::InvalidArgument { op: "t", .. })
                ),
                "{e}"
            );
        }
    }

    #[test]
    fn chunks_scale_with_the_copy_within_bounds() {
        let c = StagingConfig {
            threads: 16,
            chunk_bytes: 4 << 20,
            min_chunk_bytes: 256 << 10,
            chunks_per_thread: 8,
            ..StagingConfig::default()
        };
        assert_eq!(c.chunk_for(1 << 20), 256 << 10);
        // Any config, even one `check` refuses, gives a chunk without panicking.
        let odd = StagingConfig {
            threads: usize::MAX,
            chunks_per_thread: usize::MAX,
            min_chunk_bytes: 8 << 20,
            chunk_bytes: 4096,
            ..c
        };
        assert_eq!(odd.chunk_for(usize::MAX), 4096);
        assert_eq!(c.chunk_for(256 << 20), 2 << 20);
        assert_eq!(c.chunk_for(1 << 30), 4 << 20);
        assert_eq!(c.chunk_for((64 << 20) + 1), 512 << 10);
        assert_eq!(
            c.chunk_for(100 << 20),
            (800 << 10) - (800 << 10) % (64 << 10) + (64 << 10)
        );
    }

    #[test]
    fn byte_counts_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("4K"), Some(4096));
        assert_eq!(parse_bytes(" 2MiB "), Some(2 << 20));
        assert_eq!(parse_bytes("1g"), Some(1 << 30));
        assert_eq!(parse_bytes("3 M"), Some(3 << 20));
        for bad in ["", "M", "1.5M", "-1", "4T", "12x"] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
        assert_eq!(parse_bytes("99999999999999999999G"), None);
    }

    /// Each variable sets its field and marks it fixed (calibration leaves it); a bad value
    /// is a misuse error naming the variable, not a panic and not silently ignored.
    #[test]
    fn environment_overrides_set_and_fix_their_fields() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let base = StagingConfig::default();
        let (c, fixed, off, applied) = apply_env(base, env(&[])).unwrap();
        assert_eq!((c, fixed, off), (base, Fixed::default(), false));
        assert!(applied.is_empty());
        let (c, fixed, off, applied) = apply_env(
            base,
            env(&[
                ("CUDA_MEM_STAGED_THREADS", "3"),
                ("CUDA_MEM_STAGED_CHUNK", "1M"),
                ("CUDA_MEM_STAGED_MIN_BYTES_D2H", "8M"),
                ("CUDA_MEM_STAGED_NT_H2D", "0"),
                ("CUDA_MEM_STAGED_CALIBRATE", "0"),
            ]),
        )
        .unwrap();
        assert!(off);
        assert_eq!(applied.len(), 5);
        assert_eq!((c.threads, c.chunk_bytes), (3, 1 << 20));
        assert_eq!(c.min_chunk_bytes, 256 << 10);
        assert_eq!(c.to_host.min_bytes, 8 << 20);
        assert_eq!(c.to_device.min_bytes, base.to_device.min_bytes);
        assert!(!c.to_device.nt_stores && c.to_host.nt_stores);
        assert!(fixed.threads && fixed.chunk && !fixed.depth);
        assert_eq!((fixed.min_bytes, fixed.nt), ([false, true], [true, false]));
        for (name, v) in [
            ("CUDA_MEM_STAGED_THREADS", "many"),
            ("CUDA_MEM_STAGED_THREADS", "0"),
            ("CUDA_MEM_STAGED_NT", "maybe"),
            ("CUDA_MEM_STAGED_CHUNK", "1K"),
        ] {
            let e = apply_env(base, move |k| (k == name).then(|| v.to_string())).unwrap_err();
            assert!(
                matches!(e, crate::Error::Misuse(Misuse::InvalidArgument { .. })),
                "{name}={v}: {e}"
            );
            assert!(
                e.to_string().contains("CUDA_MEM_STAGED"),
                "{name}={v}: the error names the setting: {e}"
            );
        }
    }
}
