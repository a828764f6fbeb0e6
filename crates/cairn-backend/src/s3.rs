//! Any S3-compatible store (AWS, MinIO, Ceph RGW, R2, moto) through the
//! `object_store` crate.
//!
//! The engine is synchronous, so the backend owns a small tokio runtime
//! and waits on it. Credentials come only from where the AWS tools look
//! (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, the
//! container or instance credentials); never from a command line.
//!
//! Every HTTP request is counted in the backend's [`Meter`] (the bill) as
//! it is sent, failed ones too: `object_store`'s own retries are switched
//! off (they would send requests nobody counts), so each attempt is one
//! call here and the retry policy is `Retrying`'s, which wraps this. A
//! multipart upload is driven here part by part for the same reason; a
//! listing is read page by page; a delete is one `DELETE /key` (not the
//! bulk `POST ?delete`).

use crate::meter::{self, Meter, RequestKind, Subsystem};
use crate::{validate_name, Backend, Capabilities, Error, ErrorKind, ObjectInfo, ObjectState, RestoreSpeed, RestoreState, Result, StorageClass};
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path as ObjPath;
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::{Attribute, AttributeValue, Attributes, ClientOptions, MultipartUpload, ObjectStore, ObjectStoreExt, PutMode, PutMultipartOptions, PutOptions, PutPayload, RetryConfig};
use std::sync::Arc;
use std::time::Duration;

/// Objects at least this large go up in parts (the request model's
/// threshold, which the bill and the simulator count by).
const MULTIPART_MIN: usize = cairn_model::prices::MULTIPART_MIN as usize;
/// The size of each part.
const PART_SIZE: usize = cairn_model::prices::PART_SIZE as usize;
/// Parts uploading at once.
const PARTS_IN_FLIGHT: usize = 4;

/// The requests a successful put of `len` bytes sends, as (PUT, POST)
/// (defined with the prices, in `cairn-model`).
pub use cairn_model::prices::put_requests;

/// Where an S3 volume lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Location {
    /// The bucket.
    pub bucket: String,
    /// The key prefix inside it ("" for the bucket's root), without slashes at either end.
    pub prefix: String,
    /// The service URL for S3-compatible stores (None: AWS).
    pub endpoint: Option<String>,
    /// The region (None: `AWS_REGION`/`AWS_DEFAULT_REGION`, else us-east-1).
    pub region: Option<String>,
}

impl S3Location {
    /// Parses `s3://BUCKET[/PREFIX]`.
    pub fn parse(url: &str, endpoint: Option<&str>, region: Option<&str>) -> Result<Self> {
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| Error::new(ErrorKind::Permanent, format!("{url:?} is not an s3://BUCKET/PREFIX URL")))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/');
        if bucket.is_empty() {
            return Err(Error::new(ErrorKind::Permanent, format!("{url:?} names no bucket")));
        }
        if !prefix.is_empty() {
            validate_name(prefix).map_err(|_| Error::new(ErrorKind::Permanent, format!("{url:?}: the prefix may hold letters, digits, '-', '_', '.' and '/'")))?;
        }
        Ok(S3Location { bucket: bucket.to_string(), prefix: prefix.to_string(), endpoint: endpoint.map(str::to_string), region: region.map(str::to_string) })
    }
}

/// Keys read from the AWS shared credentials file.
struct FileCredentials {
    key_id: String,
    secret: String,
    token: Option<String>,
}

/// What the message of a missing-credentials error starts with.
pub const NO_CREDENTIALS: &str = "no AWS credentials found";

/// Where the credentials come from when the environment has no keys:
/// `None` when the environment provides them (keys, a web identity, a
/// container's credentials), else the profile `AWS_PROFILE` (or `default`)
/// of `AWS_SHARED_CREDENTIALS_FILE` (or `~/.aws/credentials`), else the EC2
/// instance's role, but only on EC2 and for AWS itself. Anywhere else the
/// answer is an error at once: object_store would otherwise spend seconds
/// asking the instance metadata address of a machine that has none.
fn credentials_outside_env(custom_endpoint: bool) -> Result<Option<FileCredentials>> {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if (set("AWS_ACCESS_KEY_ID") && set("AWS_SECRET_ACCESS_KEY"))
        || (set("AWS_WEB_IDENTITY_TOKEN_FILE") && set("AWS_ROLE_ARN"))
        || set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
        || set("AWS_CONTAINER_CREDENTIALS_FULL_URI")
    {
        return Ok(None);
    }
    let file = std::env::var_os("AWS_SHARED_CREDENTIALS_FILE").filter(|v| !v.is_empty()).map(std::path::PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".aws/credentials")));
    let profile = std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "default".to_string());
    if let Some(f) = &file {
        if let Some(c) = read_credentials_file(f, &profile)? {
            return Ok(Some(c));
        }
    }
    if !custom_endpoint && on_ec2() {
        return Ok(None);
    }
    let where_ = file.map_or("~/.aws/credentials".to_string(), |f| f.display().to_string());
    Err(Error::new(
        ErrorKind::Permanent,
        format!("{NO_CREDENTIALS}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or put aws_access_key_id and aws_secret_access_key under [{profile}] in {where_} (AWS_PROFILE picks another profile)"),
    ))
}

/// The keys of `profile` in an AWS shared credentials file (an INI file);
/// None if the file or the profile is missing.
fn read_credentials_file(path: &std::path::Path, profile: &str) -> Result<Option<FileCredentials>> {
    use std::io::Read;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::from_io(&format!("reading {}", path.display()), e)),
    };
    // A credentials file is a few lines; read no more than 1 MiB of one.
    let mut text = String::new();
    f.take(1 << 20).read_to_string(&mut text).map_err(|e| Error::from_io(&format!("reading {}", path.display()), e))?;
    Ok(parse_credentials(&text, profile))
}

fn parse_credentials(text: &str, profile: &str) -> Option<FileCredentials> {
    let (mut key_id, mut secret, mut token) = (None, None, None);
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == profile;
            continue;
        }
        if !inside {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            let v = v.trim().to_string();
            match k.trim() {
                "aws_access_key_id" => key_id = Some(v),
                "aws_secret_access_key" => secret = Some(v),
                "aws_session_token" => token = Some(v),
                _ => {}
            }
        }
    }
    Some(FileCredentials { key_id: key_id?, secret: secret?, token })
}

/// Whether this machine is an EC2 instance (its firmware says so).
fn on_ec2() -> bool {
    ["/sys/devices/virtual/dmi/id/sys_vendor", "/sys/devices/virtual/dmi/id/board_vendor", "/sys/hypervisor/uuid"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .any(|v| v.contains("Amazon") || v.starts_with("ec2"))
}

/// An S3 bucket (or a prefix in one) as a [`Backend`]. Its requests are
/// billed to [`Subsystem::Other`]; [`Backend::paid_by`] gives a handle on
/// the same connection billing another subsystem.
pub struct S3Backend {
    core: Arc<S3Core>,
    /// Who this handle's requests are counted for.
    who: Subsystem,
}

/// What every handle on one bucket shares.
struct S3Core {
    loc: S3Location,
    /// The region requests are signed for.
    region: String,
    store: AmazonS3,
    /// For the requests object_store does not send (RestoreObject, a HEAD
    /// that reads `x-amz-storage-class` and `x-amz-restore`), signed with
    /// object_store's own signer and credentials.
    http: HttpClient,
    rt: tokio::runtime::Runtime,
    meter: Arc<Meter>,
}

impl S3Backend {
    /// Connects (lazily: nothing is sent until the first request).
    pub fn open(loc: S3Location) -> Result<Self> {
        let region = loc
            .region
            .clone()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| "us-east-1".to_string());
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&loc.bucket)
            .with_region(region.clone())
            // No retries inside object_store: every attempt must be counted.
            .with_retry(RetryConfig { max_retries: 0, retry_timeout: Duration::from_secs(15), ..Default::default() })
            .with_disable_bulk_delete(true)
            .with_client_options(client_options());
        if let Some(ep) = &loc.endpoint {
            b = b.with_endpoint(ep).with_allow_http(ep.starts_with("http://")).with_virtual_hosted_style_request(false);
        }
        match credentials_outside_env(loc.endpoint.is_some())? {
            Some(c) => {
                b = b.with_access_key_id(c.key_id).with_secret_access_key(c.secret);
                if let Some(t) = c.token {
                    b = b.with_token(t);
                }
            }
            None => {}
        }
        let store = b.build().map_err(|e| Error::new(ErrorKind::Permanent, format!("configuring S3 access to bucket {}", loc.bucket)).with_source(e))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cairn-s3")
            .enable_all()
            .build()
            .map_err(|e| Error::from_io("starting the S3 client's runtime", e))?;
        // Plain http only where the endpoint says so (as object_store's own).
        let http_opts = client_options().with_allow_http(loc.endpoint.as_deref().is_some_and(|ep| ep.starts_with("http://")));
        let http = ReqwestConnector::default().connect(&http_opts).map_err(|e| Error::new(ErrorKind::Permanent, format!("configuring S3 access to bucket {}", loc.bucket)).with_source(e))?;
        let meter = meter::shared(&format!("s3|{}|{}|{}", loc.endpoint.as_deref().unwrap_or("aws"), loc.bucket, loc.prefix));
        Ok(S3Backend { core: Arc::new(S3Core { loc, region, store, http, rt, meter }), who: Subsystem::Other })
    }

    /// Where this backend's requests are counted: one meter for every
    /// backend of this process on the same endpoint, bucket and prefix.
    pub fn meter(&self) -> &Arc<Meter> {
        &self.core.meter
    }

    /// A multipart upload: POST (create), PUT per part, POST (complete);
    /// DELETE (abort) when a part or the completion fails, so no parts are
    /// left behind. Each request is counted when it is started.
    async fn put_parts(&self, key: &ObjPath, data: &[u8], who: Subsystem, attributes: Attributes) -> object_store::Result<()> {
        self.core.meter.record_as(who, RequestKind::Post, 1, 0);
        let mut upload = self.core.store.put_multipart_opts(key, PutMultipartOptions { attributes, ..Default::default() }).await?;
        let parts = {
            let meter = &self.core.meter;
            let upload = &mut upload;
            futures::stream::iter(data.chunks(PART_SIZE))
                .map(|c| {
                    let part = upload.put_part(PutPayload::from(c.to_vec()));
                    let n = c.len() as u64;
                    async move {
                        meter.record_as(who, RequestKind::Put, 1, n);
                        part.await
                    }
                })
                .buffer_unordered(PARTS_IN_FLIGHT)
                .try_collect::<Vec<()>>()
                .await
        };
        let done = match parts {
            Ok(_) => {
                self.core.meter.record_as(who, RequestKind::Post, 1, 0);
                upload.complete().await.map(|_| ())
            }
            Err(e) => Err(e),
        };
        if done.is_err() {
            self.core.meter.record_as(who, RequestKind::Delete, 1, 0);
            if let Err(e) = upload.abort().await {
                tracing::warn!("aborting the multipart upload of {key}: {e}");
            }
        }
        done
    }

    /// A put (in parts past [`MULTIPART_MIN`]) with `attributes` (a
    /// storage class) on the PUT or on the creation of the upload.
    fn put_with(&self, name: &str, data: &[u8], attributes: Attributes) -> Result<()> {
        let key = self.key(name)?;
        let who = self.who;
        self.core.rt
            .block_on(async {
                if data.len() < MULTIPART_MIN {
                    self.core.meter.record_as(who, RequestKind::Put, 1, data.len() as u64);
                    let opts = PutOptions { attributes, ..Default::default() };
                    self.core.store.put_opts(&key, PutPayload::from(data.to_vec()), opts).await.map(|_| ())
                } else {
                    self.put_parts(&key, data, who, attributes).await
                }
            })
            .map_err(|e| self.fail("put", name, e))
    }

    /// The URL of `key` for a request of our own: path style at a custom
    /// endpoint (as object_store is configured there), virtual-hosted at AWS.
    fn url_of(&self, key: &ObjPath) -> String {
        // Keys hold only letters, digits, '-', '_', '.' and '/' (the naming
        // contract), none of which needs escaping in a path.
        match &self.core.loc.endpoint {
            Some(ep) => format!("{}/{}/{key}", ep.trim_end_matches('/'), self.core.loc.bucket),
            None => format!("https://{}.s3.{}.amazonaws.com/{key}", self.core.loc.bucket, self.core.region),
        }
    }

    /// Sends one request object_store has no call for, signed (SigV4) by
    /// object_store's [`AwsAuthorizer`](object_store::aws::AwsAuthorizer)
    /// with the store's own credentials; `query`: a sub-resource
    /// (`restore`) or "". Returns the status, the headers and the body.
    fn signed(&self, method: http::Method, key: &ObjPath, query: &str, body: Vec<u8>) -> std::result::Result<(http::StatusCode, http::HeaderMap, String), String> {
        let url = if query.is_empty() { self.url_of(key) } else { format!("{}?{query}", self.url_of(key)) };
        self.core.rt.block_on(async {
            let cred = self.core.store.credentials().get_credential().await.map_err(|e| format!("getting the AWS credentials: {e}"))?;
            let mut req = http::Request::builder().method(method).uri(&url);
            if !body.is_empty() {
                req = req.header("content-type", "application/xml");
            }
            let mut req = req.body(HttpRequestBody::from(body)).map_err(|e| format!("building the request to {url}: {e}"))?;
            object_store::aws::AwsAuthorizer::new(&cred, "s3", &self.core.region).try_authorize(&mut req, None).map_err(|e| format!("signing the request to {url}: {e}"))?;
            let resp = tokio::time::timeout(Duration::from_secs(60), self.core.http.execute(req)).await.map_err(|_| format!("{url}: timed out"))?.map_err(|e| format!("{url}: {e}"))?;
            let (parts, body) = resp.into_parts();
            let text = body.bytes().await.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
            Ok((parts.status, parts.headers, text))
        })
    }

    /// A request of ours that got no answer: transient (`Retrying` retries).
    fn fail_signed(&self, kind: RequestKind, op: &str, name: &str, e: String) -> Error {
        self.core.meter.record_error(kind);
        Error::new(ErrorKind::Transient, format!("{op} {name} in {}: {e}", self.describe())).with_object(name)
    }

    /// A request of ours answered with an error status, classified as
    /// object_store classifies its own.
    fn status_error(&self, kind: RequestKind, op: &str, name: &str, status: http::StatusCode, text: &str) -> Error {
        let k = match status.as_u16() {
            404 => ErrorKind::NotFound,
            408 | 429 | 500..=599 => ErrorKind::Transient,
            _ => ErrorKind::Permanent,
        };
        if k != ErrorKind::NotFound {
            self.core.meter.record_error(kind);
        }
        let text: String = text.chars().take(300).collect();
        Error::new(k, format!("{op} {name} in {}: {status} {text}", self.describe())).with_object(name)
    }

    fn key(&self, name: &str) -> Result<ObjPath> {
        validate_name(name)?;
        let k = if self.core.loc.prefix.is_empty() { name.to_string() } else { format!("{}/{name}", self.core.loc.prefix) };
        ObjPath::parse(k).map_err(|e| Error::new(ErrorKind::InvalidName, format!("object name {name:?}")).with_source(e))
    }

    /// The object's name from its key.
    fn name_of<'a>(&self, key: &'a str) -> Option<&'a str> {
        if self.core.loc.prefix.is_empty() {
            Some(key)
        } else {
            key.strip_prefix(self.core.loc.prefix.as_str())?.strip_prefix('/')
        }
    }

    fn fail(&self, op: &str, name: &str, e: object_store::Error) -> Error {
        use object_store::Error as E;
        let kind = match &e {
            E::NotFound { .. } => ErrorKind::NotFound,
            E::AlreadyExists { .. } | E::Precondition { .. } => ErrorKind::AlreadyExists,
            E::PermissionDenied { .. } | E::Unauthenticated { .. } | E::NotSupported { .. } | E::NotImplemented { .. } | E::UnknownConfigurationKey { .. } | E::InvalidPath { .. } => {
                ErrorKind::Permanent
            }
            // Network errors, timeouts, 5xx and 429: `Retrying` retries.
            _ => ErrorKind::Transient,
        };
        // A GET of an archived object without a restored copy: S3's 403
        // InvalidObjectState (object_store reports any 403 as
        // PermissionDenied, with the response body in its message).
        let kind = if kind == ErrorKind::Permanent && matches!(&e, E::PermissionDenied { .. }) && error_text(&e).contains("InvalidObjectState") { ErrorKind::Archived } else { kind };
        // An answer that the object is missing or already there is no
        // failure of the request.
        if !matches!(kind, ErrorKind::NotFound | ErrorKind::AlreadyExists) {
            let rk = match op {
                "get" => RequestKind::Get,
                "head" => RequestKind::Head,
                "delete" => RequestKind::Delete,
                "list" => RequestKind::List,
                _ => RequestKind::Put,
            };
            self.core.meter.record_error(rk);
        }
        if kind == ErrorKind::Archived {
            return Error::new(kind, format!("{op} {name} in {}: the object is archived (its storage class needs a restore before a GET)", self.describe())).with_object(name).with_source(e);
        }
        Error::new(kind, format!("{op} {name} in {}", self.describe())).with_object(name).with_source(e)
    }
}

/// An error and its causes, one line.
fn error_text(e: &dyn std::error::Error) -> String {
    let mut t = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        t.push_str(": ");
        t.push_str(&s.to_string());
        src = s.source();
    }
    t
}

/// The HTTP client settings of both object_store's client and ours.
fn client_options() -> ClientOptions {
    ClientOptions::new().with_timeout(Duration::from_secs(60)).with_connect_timeout(Duration::from_secs(5))
}

impl Backend for S3Backend {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.put_with(name, data, Attributes::new())
    }

    fn put_in_class(&self, name: &str, data: &[u8], class: StorageClass) -> Result<()> {
        // Also the standard class explicitly: the object is replaced and
        // takes the class it is given, whatever it had.
        let attrs = Attributes::from_iter([(Attribute::StorageClass, AttributeValue::from(class.name()))]);
        self.put_with(name, data, attrs)
    }

    fn restore(&self, name: &str, days: u32, speed: RestoreSpeed) -> Result<()> {
        let key = self.key(name)?;
        let body = format!(
            "<RestoreRequest xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Days>{}</Days><GlacierJobParameters><Tier>{}</Tier></GlacierJobParameters></RestoreRequest>",
            days.max(1),
            speed.name()
        );
        self.core.meter.record(self.who, RequestKind::Restore, 0);
        let (status, _, text) = self.signed(http::Method::POST, &key, "restore", body.into_bytes()).map_err(|e| self.fail_signed(RequestKind::Restore, "restore", name, e))?;
        match status.as_u16() {
            // Accepted (202); already restored, the expiry extended (200).
            200 | 202 => Ok(()),
            // A restore of this object is under way already: the same one.
            409 if text.contains("RestoreAlreadyInProgress") => Ok(()),
            403 if text.contains("InvalidObjectState") => {
                self.core.meter.record_error(RequestKind::Restore);
                Err(Error::new(ErrorKind::Permanent, format!("restore {name} in {}: not in an archive class (nothing to restore)", self.describe())).with_object(name))
            }
            _ => Err(self.status_error(RequestKind::Restore, "restore", name, status, &text)),
        }
    }

    fn restore_state(&self, name: &str) -> Result<ObjectState> {
        let key = self.key(name)?;
        self.core.meter.record(self.who, RequestKind::Head, 0);
        let (status, headers, text) = self.signed(http::Method::HEAD, &key, "", Vec::new()).map_err(|e| self.fail_signed(RequestKind::Head, "head", name, e))?;
        if !status.is_success() {
            return Err(self.status_error(RequestKind::Head, "head", name, status, &text));
        }
        let header = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
        // No header: STANDARD (S3 leaves it out for that class).
        let class = match header("x-amz-storage-class") {
            None => StorageClass::Standard,
            Some(c) => StorageClass::from_name(c).ok_or_else(|| Error::new(ErrorKind::Permanent, format!("head {name} in {}: storage class {c:?} is not one Cairn uses", self.describe())).with_object(name))?,
        };
        let restore = match header("x-amz-restore") {
            None => RestoreState::None,
            Some(h) => RestoreState::parse_header(h).ok_or_else(|| Error::new(ErrorKind::Permanent, format!("head {name} in {}: unreadable x-amz-restore {h:?}", self.describe())).with_object(name))?,
        };
        Ok(ObjectState { class, restore })
    }

    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        let key = self.key(name)?;
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        self.core.meter.record(self.who, RequestKind::Put, data.len() as u64);
        self.core.rt
            .block_on(self.core.store.put_opts(&key, PutPayload::from(data.to_vec()), opts))
            .map(|_| ())
            .map_err(|e| self.fail("put", name, e))
    }

    fn conditional_updates(&self) -> bool {
        // object_store sends If-Match with the ETag (its default,
        // S3ConditionalPut::ETagMatch), which S3 honours since 2024.
        true
    }

    fn get_tagged(&self, name: &str) -> Result<(Vec<u8>, String)> {
        let key = self.key(name)?;
        let got = self.core.rt.block_on(async {
            let r = self.core.store.get(&key).await?;
            let tag = r.meta.e_tag.clone();
            Ok::<_, object_store::Error>((r.bytes().await?, tag))
        });
        self.core.meter.record(self.who, RequestKind::Get, got.as_ref().map_or(0, |b| b.0.len() as u64));
        let (data, tag) = got.map_err(|e| self.fail("get", name, e))?;
        let tag = tag.ok_or_else(|| Error::new(ErrorKind::Permanent, format!("{} returned {name} without an ETag: conditional updates are not possible", self.describe())).with_object(name))?;
        Ok((data.to_vec(), tag))
    }

    fn put_if_match(&self, name: &str, data: &[u8], tag: &str) -> Result<String> {
        let key = self.key(name)?;
        let mode = PutMode::Update(object_store::UpdateVersion { e_tag: Some(tag.to_string()), version: None });
        let opts = PutOptions { mode, ..Default::default() };
        self.core.meter.record(self.who, RequestKind::Put, data.len() as u64);
        match self.core.rt.block_on(self.core.store.put_opts(&key, PutPayload::from(data.to_vec()), opts)) {
            Ok(r) => r.e_tag.ok_or_else(|| Error::new(ErrorKind::Permanent, format!("{} stored {name} without returning an ETag", self.describe())).with_object(name)),
            // If-Match failed (412), or the object is gone (object_store
            // reports S3's 404 as a precondition failure too).
            Err(e @ (object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. })) => {
                Err(Error::new(ErrorKind::Changed, format!("put {name} in {}: replaced or deleted since it was read", self.describe())).with_object(name).with_source(e))
            }
            Err(e) => Err(self.fail("put", name, e)),
        }
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let key = self.key(name)?;
        let end = offset.checked_add(len).ok_or_else(|| Error::new(ErrorKind::OutOfRange, format!("object {name}: range {offset}+{len} overflows")).with_object(name))?;
        let out_of_range = |size: u64| Error::new(ErrorKind::OutOfRange, format!("object {name}: range {offset}+{len} past its end ({size} bytes)")).with_object(name);
        if len == 0 {
            let size = self.size(name)?;
            return if offset <= size { Ok(Vec::new()) } else { Err(out_of_range(size)) };
        }
        let got = self.core.rt.block_on(self.core.store.get_range(&key, offset..end));
        self.core.meter.record(self.who, RequestKind::Get, got.as_ref().map_or(0, |b| b.len() as u64));
        match got {
            Ok(b) if b.len() as u64 == len => Ok(b.to_vec()),
            Ok(b) => {
                // A server may answer a range that runs past the end with
                // what there is: that is the caller's OutOfRange.
                let size = self.size(name)?;
                if end > size {
                    Err(out_of_range(size))
                } else {
                    Err(Error::new(ErrorKind::Corrupt, format!("object {name}: asked for {len} bytes at {offset}, got {}", b.len())).with_object(name))
                }
            }
            Err(e @ object_store::Error::NotFound { .. }) => Err(self.fail("get", name, e)),
            Err(e) => {
                // Range errors come back as generic ones; the size decides.
                match self.size(name) {
                    Ok(size) if end > size => Err(out_of_range(size)),
                    _ => Err(self.fail("get", name, e)),
                }
            }
        }
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let key = self.key(name)?;
        let got = self.core.rt.block_on(async { self.core.store.get(&key).await?.bytes().await });
        self.core.meter.record(self.who, RequestKind::Get, got.as_ref().map_or(0, |b| b.len() as u64));
        got.map(|b| b.to_vec()).map_err(|e| self.fail("get", name, e))
    }

    fn size(&self, name: &str) -> Result<u64> {
        let key = self.key(name)?;
        self.core.meter.record(self.who, RequestKind::Head, 0);
        self.core.rt.block_on(self.core.store.head(&key)).map(|m| m.size).map_err(|e| self.fail("head", name, e))
    }

    fn delete(&self, name: &str) -> Result<()> {
        let key = self.key(name)?;
        self.core.meter.record(self.who, RequestKind::Delete, 0);
        match self.core.rt.block_on(self.core.store.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.fail("delete", name, e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        // S3 lists by string prefix, which is the contract's; page by page
        // (up to 1,000 keys each), so that each request is counted.
        if !prefix.is_empty() && !prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b)) {
            return Err(Error::new(ErrorKind::InvalidName, format!("list prefix {prefix:?}")));
        }
        let full = if self.core.loc.prefix.is_empty() { prefix.to_string() } else { format!("{}/{prefix}", self.core.loc.prefix) };
        let who = self.who;
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let opts = PaginatedListOptions { page_token: token.take(), ..Default::default() };
            self.core.meter.record_as(who, RequestKind::List, 1, 0);
            let page = self
                .core
                .rt
                .block_on(self.core.store.list_paginated((!full.is_empty()).then_some(full.as_str()), opts))
                .map_err(|e| self.fail("list", prefix, e))?;
            for m in page.result.objects {
                if let Some(name) = self.name_of(m.location.as_ref()) {
                    if name.starts_with(prefix) {
                        out.push(ObjectInfo { name: name.to_string(), size: m.size });
                    }
                }
            }
            match page.page_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(out),
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { remote: true, cheap_ranged_reads: true, frees_on_delete: true, preferred_pack_size: 32 << 20, exclusive: false, deferred_durability: false }
    }

    fn meter(&self) -> Option<Arc<Meter>> {
        Some(self.core.meter.clone())
    }

    fn paid_by(&self, who: Subsystem) -> Option<Arc<dyn Backend>> {
        Some(Arc::new(S3Backend { core: self.core.clone(), who }))
    }

    fn describe(&self) -> String {
        let p = if self.core.loc.prefix.is_empty() { String::new() } else { format!("/{}", self.core.loc.prefix) };
        match &self.core.loc.endpoint {
            Some(ep) => format!("s3://{}{p} at {ep}", self.core.loc.bucket),
            None => format!("s3://{}{p}", self.core.loc.bucket),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_count_their_parts() {
        assert_eq!(put_requests(0), (1, 0));
        assert_eq!(put_requests(MULTIPART_MIN as u64 - 1), (1, 0));
        let parts = |n: usize| vec![0u8; n].chunks(PART_SIZE).count() as u64;
        for n in [MULTIPART_MIN, MULTIPART_MIN + 1, 128 << 20, (128 << 20) + 5] {
            assert_eq!(put_requests(n as u64), (parts(n), 2), "{n}");
        }
    }

    #[test]
    fn urls_parse_and_bad_ones_say_why() {
        let l = S3Location::parse("s3://bkt/vols/a/", Some("http://127.0.0.1:9000"), None).unwrap();
        assert_eq!((l.bucket.as_str(), l.prefix.as_str()), ("bkt", "vols/a"));
        assert_eq!(S3Location::parse("s3://bkt", None, None).unwrap().prefix, "");
        for bad in ["bkt/x", "s3://", "s3:///x", "s3://b/../x"] {
            let e = S3Location::parse(bad, None, None).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Permanent, "{bad}: {e}");
        }
    }
}

#[cfg(test)]
mod credential_tests {
    use super::*;

    #[test]
    fn the_shared_credentials_file_is_read_by_profile() {
        let text = "# a comment\n[default]\naws_access_key_id = AK1\naws_secret_access_key=SK1\n\n[other]\naws_access_key_id=AK2\naws_secret_access_key = SK2\naws_session_token = T2\n";
        let d = parse_credentials(text, "default").unwrap();
        assert_eq!((d.key_id.as_str(), d.secret.as_str(), d.token), ("AK1", "SK1", None));
        let o = parse_credentials(text, "other").unwrap();
        assert_eq!((o.key_id.as_str(), o.secret.as_str(), o.token.as_deref()), ("AK2", "SK2", Some("T2")));
        assert!(parse_credentials(text, "missing").is_none());
        assert!(parse_credentials("[default]\naws_access_key_id = AK\n", "default").is_none(), "a key without its secret is no credential");
    }
}
