//! Byte sizes (parse and print) and the median, shared by the parser, the benchmark and the
//! writers.

/// One KiB.
pub const KIB: u64 = 1 << 10;
/// One MiB.
pub const MIB: u64 = 1 << 20;
/// One GiB.
pub const GIB: u64 = 1 << 30;

/// Parses a byte size: a number with an optional binary unit, `K`/`KiB`, `M`/`MiB`, `G`/`GiB`
/// (case-insensitive), e.g. `4096`, `4K`, `64MiB`, `1g`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a size (examples: 4096, 4K, 64MiB, 1G)"))?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => KIB,
        "m" | "mib" | "mb" => MIB,
        "g" | "gib" | "gb" => GIB,
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (use K, M or G, binary)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("'{text}' is too large"))
}

/// Formats a byte size compactly in binary units when exact: `4KiB`, `1MiB`, `1GiB`, `1000B`.
pub fn fmt_size(bytes: u64) -> String {
    for (unit, name) in [(GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{}{name}", bytes / unit);
        }
    }
    format!("{bytes}B")
}

/// The median of `xs` (the mean of the two middle values for an even count); NaN when empty.
/// NaN inputs sort last.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// GB/s (1 GB = 1e9 bytes) for `bytes` moved in `seconds`.
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / 1e9 / seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 * MIB));
        assert_eq!(parse_size("1g"), Ok(GIB));
        assert!(parse_size("").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
        assert!(parse_size("18446744073709551615G").is_err());
        assert_eq!(fmt_size(4096), "4KiB");
        assert_eq!(fmt_size(GIB), "1GiB");
        assert_eq!(fmt_size(3 * MIB), "3MiB");
        assert_eq!(fmt_size(1000), "1000B");
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(gbps(2_000_000_000, 2.0), 1.0);
    }
}
