//! Member paths for extraction.

use crate::TarError;

/// The components of a member path, for extraction under a directory.
///
/// Leading `./`, repeated slashes, `.` components and a trailing `/` are
/// dropped; an empty result (the member `.` or `./`) means the extraction
/// root itself. Refused, with [`TarError::UnsafePath`]: an empty path,
/// absolute paths, `..` components, NUL bytes, and names that are not
/// valid UTF-8.
pub fn safe_path(path: &[u8]) -> Result<Vec<&[u8]>, TarError> {
    let refuse = |reason: &'static str| TarError::UnsafePath {
        path: path.to_vec(),
        reason,
    };
    if path.is_empty() {
        return Err(refuse("the path is empty"));
    }
    if path[0] == b'/' {
        return Err(refuse("absolute paths are not extracted"));
    }
    if path.contains(&0) {
        return Err(refuse("the path contains a NUL byte"));
    }
    if std::str::from_utf8(path).is_err() {
        return Err(refuse("the path is not valid UTF-8"));
    }
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(refuse("the path contains a '..' component")),
            _ => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components() {
        assert_eq!(safe_path(b"./a/b/").unwrap(), vec![&b"a"[..], b"b"]);
        assert_eq!(safe_path(b"a//./b").unwrap(), vec![&b"a"[..], b"b"]);
        assert!(safe_path(b".").unwrap().is_empty());
        assert!(safe_path(b"./").unwrap().is_empty());
        for bad in [
            &b""[..],
            b"/etc/passwd",
            b"a/../b",
            b"..",
            b"a/\0b",
            b"\xff\xfe",
        ] {
            let e = safe_path(bad).unwrap_err();
            assert!(matches!(e, TarError::UnsafePath { .. }), "{bad:?}");
            assert!(e.to_string().starts_with("refusing tar member path"));
        }
    }
}
