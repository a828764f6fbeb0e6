//! The store a volume's location names, opened: a local directory, a
//! bucket (behind retries) or a tape (with its mirror), and one clear
//! sentence for a bucket's first failure.

use crate::config::{is_remote_url, is_tape_url, with_retries, Layout, LocalSettings};
use crate::error::{Error, ErrorKind, Result};
use cairn_backend::Backend;
use std::sync::Arc;

/// The backend a volume's settings name, with retries around it: a local
/// directory (`local:PATH`, relative to the volume directory) or a bucket.
pub fn open_backend(layout: &Layout, settings: &LocalSettings) -> Result<Arc<dyn Backend>> {
    if is_remote_url(&settings.backend) {
        return open_remote(settings);
    }
    Ok(with_retries(cairn_backend::LocalBackend::open(&layout.store_path(settings)?)?))
}

/// The bucket a volume's settings name, behind retries.
pub fn open_remote(settings: &LocalSettings) -> Result<Arc<dyn Backend>> {
    open_remote_with(settings, cairn_backend::RetryPolicy::cloud())
}

/// [`open_remote`] with a retry policy of the caller's (a short one for the
/// first request of a command, so a wrong endpoint fails in seconds).
pub fn open_remote_with(settings: &LocalSettings, policy: cairn_backend::RetryPolicy) -> Result<Arc<dyn Backend>> {
    if is_tape_url(&settings.backend) {
        // A tape does not fail and then succeed: no retries.
        return crate::tape::open_backend_mirrored(&settings.backend, settings.mirror.as_deref());
    }
    let loc = cairn_backend::S3Location::parse(&settings.backend, settings.endpoint.as_deref(), settings.region.as_deref())
        .map_err(|e| Error::invalid(e.to_string()))?;
    let s3 = cairn_backend::S3Backend::open(loc).map_err(|e| explain(e, &settings.backend, settings.endpoint.as_deref()))?;
    Ok(Arc::new(cairn_backend::Retrying::new(s3, policy)))
}

/// One clear sentence for a failure of the first request to a bucket: the
/// endpoint unreachable, the bucket missing, the credentials refused, or no
/// volume there.
pub fn explain(e: cairn_backend::Error, url: &str, endpoint: Option<&str>) -> Error {
    use cairn_backend::ErrorKind as B;
    if is_tape_url(url) {
        return match e.kind() {
            B::NotFound => Error::config(format!("{url} holds no Cairn volume (a formatted tape without its config); `cairn tape recover {url}` looks for one in the blocks")),
            _ => Error::from(e).context(url),
        };
    }
    let full = {
        let mut d = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            d.push_str(&format!(": {s}"));
            src = s.source();
        }
        d
    };
    // What the service said, short: S3's error code and message when it
    // sent them, else the innermost cause (e.g. "Connection refused").
    let tag = |t: &str| full.split(&format!("<{t}>")).nth(1).and_then(|r| r.split(&format!("</{t}>")).next()).map(str::to_string);
    let short = match (tag("Code"), tag("Message")) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c,
        _ => {
            let mut last = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                last = s.to_string();
                src = s.source();
            }
            last.chars().take(200).collect()
        }
    };
    let detail = short;
    let at = endpoint.map(|ep| format!(" at {ep}")).unwrap_or_default();
    if full.contains(cairn_backend::NO_CREDENTIALS) {
        return Error::config(format!("{url}: {e}"));
    }
    if full.contains("169.254.169.254") {
        // object_store fell through to the instance metadata service.
        return Error::config(format!(
            "{url}: no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials and AWS_PROFILE)"
        ));
    }
    match e.kind() {
        B::NotFound if full.contains("NoSuchBucket") => Error::config(format!("{url}: the bucket does not exist{at} (create it first)")),
        B::NotFound => Error::config(format!("{url} holds no Cairn volume (no config object{at}); create one with `cairn init {url}`")),
        B::Permanent if full.contains("NoSuchBucket") => Error::config(format!("{url}: the bucket does not exist{at} (create it first)")),
        B::Permanent => Error::config(format!(
            "{url}: the S3 service{at} refused access; check the credentials in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials, AWS_PROFILE) and the bucket's policy ({detail})"
        )),
        B::Transient => Error::new(ErrorKind::Io, format!("{url}: cannot reach the S3 service{} ({detail})", endpoint.map(|ep| format!(" at {ep}")).unwrap_or_else(|| " (AWS)".into()))),
        _ => Error::from(e).context(url),
    }
}
