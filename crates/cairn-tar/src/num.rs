//! Numeric header fields: octal text, GNU base-256, pax decimal and times.

/// A numeric header field: octal digits (leading spaces and NULs allowed,
/// ended by a space, a NUL or the end of the field), or GNU base-256 when
/// the first byte has its top bit set (0x80 positive, 0xff negative).
/// An all-blank field is 0. `Err` holds a short reason.
pub(crate) fn parse_numeric(field: &[u8]) -> Result<i128, &'static str> {
    if let Some(&first) = field.first() {
        if first & 0x80 != 0 {
            return parse_base256(field);
        }
    }
    let mut i = 0;
    while i < field.len() && (field[i] == b' ' || field[i] == 0) {
        i += 1;
    }
    let mut v: i128 = 0;
    let mut digits = 0;
    while i < field.len() && (b'0'..=b'7').contains(&field[i]) {
        v = v * 8 + i128::from(field[i] - b'0');
        digits += 1;
        i += 1;
    }
    // Whatever follows the digits must be terminators.
    if field[i..].iter().any(|&c| c != b' ' && c != 0) {
        return Err("not an octal number");
    }
    let _ = digits;
    Ok(v)
}

fn parse_base256(field: &[u8]) -> Result<i128, &'static str> {
    let negative = field[0] == 0xff;
    if !negative && field[0] != 0x80 {
        return Err("unknown binary number marker");
    }
    // Up to 11 significant bytes fit an i128 comfortably; more leading
    // bytes must be sign extension.
    let body = &field[1..];
    let fill = if negative { 0xff } else { 0x00 };
    let significant = body.len().saturating_sub(8);
    if body[..significant].iter().any(|&b| b != fill) {
        return Err("binary number out of range");
    }
    let mut v: i128 = if negative { -1 } else { 0 };
    for &b in &body[significant..] {
        v = (v << 8) | i128::from(b);
    }
    Ok(v)
}

/// An unsigned header field that must fit in `u64`.
pub(crate) fn parse_u64(field: &[u8]) -> Result<u64, &'static str> {
    let v = parse_numeric(field)?;
    u64::try_from(v).map_err(|_| "negative or out of range")
}

/// Writes `v` as zero-padded octal digits followed by a NUL, filling the
/// field. Returns false (field untouched) if it does not fit.
pub(crate) fn put_octal(field: &mut [u8], v: u64) -> bool {
    // By hand, not `format!`: an archive of N members calls this ~10 N times.
    let digits = field.len() - 1;
    if digits < 22 && v >> (3 * digits) != 0 {
        return false;
    }
    let mut x = v;
    for d in field[..digits].iter_mut().rev() {
        *d = b'0' + (x & 7) as u8;
        x >>= 3;
    }
    field[digits] = 0;
    true
}

/// Writes `v` in GNU base-256 (always fits for an 8- or 12-byte field
/// holding an i64).
pub(crate) fn put_base256(field: &mut [u8], v: i64) {
    let fill = if v < 0 { 0xff } else { 0x00 };
    field.fill(fill);
    let bytes = v.to_be_bytes();
    let n = bytes.len().min(field.len() - 1);
    let len = field.len();
    field[len - n..].copy_from_slice(&bytes[bytes.len() - n..]);
    field[0] = if v < 0 { 0xff } else { 0x80 };
}

/// A pax decimal integer (no sign, no spaces).
pub(crate) fn parse_pax_u64(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 20 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// A pax time: optional '-', decimal seconds, optional '.' and fraction
/// (digits past nanoseconds are dropped). Returns nanoseconds.
pub(crate) fn parse_pax_time(v: &[u8]) -> Option<i64> {
    let (neg, rest) = match v.first() {
        Some(b'-') => (true, &v[1..]),
        _ => (false, v),
    };
    let (secs, frac) = match rest.iter().position(|&c| c == b'.') {
        Some(p) => (&rest[..p], &rest[p + 1..]),
        None => (rest, &[][..]),
    };
    if secs.is_empty() && frac.is_empty() {
        return None;
    }
    if !secs.iter().all(u8::is_ascii_digit) || !frac.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let s: i64 = if secs.is_empty() {
        0
    } else {
        if secs.len() > 19 {
            return None;
        }
        std::str::from_utf8(secs).ok()?.parse().ok()?
    };
    let mut ns: i64 = 0;
    for i in 0..9 {
        ns = ns * 10 + frac.get(i).map_or(0, |&c| i64::from(c - b'0'));
    }
    let total = s.checked_mul(1_000_000_000)?.checked_add(ns)?;
    Some(if neg { -total } else { total })
}

/// Formats nanoseconds as a pax time: seconds, and a fraction without
/// trailing zeros when there is one.
pub(crate) fn format_pax_time(ns: i64) -> String {
    let neg = ns < 0;
    let abs = ns.unsigned_abs();
    let secs = abs / 1_000_000_000;
    let frac = abs % 1_000_000_000;
    let sign = if neg { "-" } else { "" };
    if frac == 0 {
        format!("{sign}{secs}")
    } else {
        let f = format!("{frac:09}");
        format!("{sign}{secs}.{}", f.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_octal_matches_format_and_refuses_what_does_not_fit() {
        for width in [2usize, 8, 12, 23] {
            let digits = width - 1;
            for v in [0u64, 1, 7, 8, 0o644, 0o7777777, 0o77777777777, 1 << 33, u64::MAX >> 1, u64::MAX] {
                let mut f = vec![b'x'; width];
                let s = format!("{v:0digits$o}");
                if put_octal(&mut f, v) {
                    assert_eq!(&f[..digits], s.as_bytes(), "{v:o} in {width}");
                    assert_eq!(f[digits], 0);
                } else {
                    assert!(s.len() > digits, "{v:o} fits in {width}");
                    assert!(f.iter().all(|&c| c == b'x'), "untouched");
                }
            }
        }
    }

    #[test]
    fn octal_and_base256() {
        assert_eq!(parse_numeric(b"0000644\0"), Ok(0o644));
        assert_eq!(parse_numeric(b"   644 \0"), Ok(0o644));
        assert_eq!(parse_numeric(b"\0\0\0\0"), Ok(0));
        assert!(parse_numeric(b"12x4\0").is_err());
        let mut f = [0u8; 12];
        put_base256(&mut f, 1 << 40);
        assert_eq!(parse_numeric(&f), Ok(1 << 40));
        put_base256(&mut f, -5);
        assert_eq!(parse_numeric(&f), Ok(-5));
        let mut g = [0u8; 12];
        assert!(put_octal(&mut g, 0o77777777777));
        assert!(!put_octal(&mut g, 1 << 33));
    }

    #[test]
    fn pax_times() {
        assert_eq!(parse_pax_time(b"12.5"), Some(12_500_000_000));
        assert_eq!(parse_pax_time(b"-1.25"), Some(-1_250_000_000));
        assert_eq!(parse_pax_time(b"7"), Some(7_000_000_000));
        assert_eq!(parse_pax_time(b"1.1234567891"), Some(1_123_456_789));
        assert_eq!(parse_pax_time(b""), None);
        assert_eq!(parse_pax_time(b"1e3"), None);
        assert_eq!(format_pax_time(12_500_000_000), "12.5");
        assert_eq!(format_pax_time(-1_250_000_000), "-1.25");
        assert_eq!(format_pax_time(3_000_000_000), "3");
    }
}
