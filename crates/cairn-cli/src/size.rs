//! Human sizes: parse `256K`, `1M`, `4MiB`, `2G`; print with binary units.

/// Parses a size with an optional K/M/G/T suffix (powers of 1024).
pub fn parse(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let digits = lower.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &lower[digits.len()..];
    let n: u64 = digits.trim().parse().map_err(|_| format!("{s:?} is not a size (try 256K, 1M, 2G)"))?;
    let mult: u64 = match unit {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use K, M, G or T)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

/// Formats bytes with a binary unit.
pub fn human(n: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("256K"), Ok(256 << 10));
        assert_eq!(parse("4MiB"), Ok(4 << 20));
        assert_eq!(parse("12"), Ok(12));
        assert!(parse("1X").is_err());
        assert!(parse("lots").is_err());
        assert_eq!(human(1536), "1.50 KiB");
    }
}
