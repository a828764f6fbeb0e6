//! Figures as a person reads them: durations, dollars, bytes in hex.

/// `3.2 days`, `5.0 hours`, `12 s`.
pub fn human_duration(secs: f64) -> String {
    match secs {
        s if s >= 86_400.0 * 365.0 => format!("{:.1} years", s / (86_400.0 * 365.0)),
        s if s >= 86_400.0 => format!("{:.1} days", s / 86_400.0),
        s if s >= 3_600.0 => format!("{:.1} hours", s / 3_600.0),
        s if s >= 60.0 => format!("{:.1} minutes", s / 60.0),
        s => format!("{s:.0} s"),
    }
}

/// Dollars as a person reads them: `$0.0123`, `$4.50`, `< $0.000001`
/// (never `1.033e-9`). JSON output keeps the exact figures.
pub fn money(x: f64) -> String {
    if x == 0.0 {
        return "$0".to_string();
    }
    if x.abs() < 0.000_001 {
        return if x < 0.0 { "> -$0.000001".to_string() } else { "< $0.000001".to_string() };
    }
    let digits = if x.abs() >= 1.0 { 2 } else { 6 };
    let s = format!("{:.*}", digits, x.abs());
    let s = if digits > 2 { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    format!("{}${s}", if x < 0.0 { "-" } else { "" })
}

pub fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
