//! Object storage for attachment bytes and patch text (immutable blobs), behind one small type.
//!
//! [`Blobs`] wraps the `object_store` crate: a local directory by default
//! (`file://<data-dir>/objects`), S3-compatible in production (`s3://bucket/prefix`, with the
//! usual `AWS_*` variables: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL` for an endpoint override). Requests are path-style unless
//! `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`; an `http://` endpoint is allowed (a local
//! S3-compatible server). Keys are Berth's own (`<tenant>/<kind>/<id>`), never client text.
//! Every byte moved is counted in `berth_object_store_bytes_total{op}`.

use std::{path::Path, sync::Arc};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use object_store::{ObjectStore, PutPayload, aws::AmazonS3Builder, local::LocalFileSystem, path::Path as Key};
use prometheus::IntCounterVec;

/// Where blobs live, and the counter of bytes moved.
#[derive(Clone)]
pub struct Blobs {
    store: Arc<dyn ObjectStore>,
    /// `<prefix>/` inside the bucket (empty for none).
    prefix: String,
    /// What the store is, for logs (`file:///…`, `s3://bucket/prefix`), without credentials.
    pub url: String,
    bytes: IntCounterVec,
}

impl std::fmt::Debug for Blobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blobs").field("url", &self.url).finish()
    }
}

/// The counter `berth_object_store_bytes_total{op}` (`put`, `get`).
pub fn bytes_counter() -> IntCounterVec {
    IntCounterVec::new(
        prometheus::Opts::new(
            "berth_object_store_bytes_total",
            "bytes moved to and from object storage",
        ),
        &["op"],
    )
    .expect("metric")
}

impl Blobs {
    /// Open the store named by `url` (`BERTH_OBJECT_STORE`); None means a local directory
    /// under `data_dir`. `aws` holds the `AWS_*` settings for an `s3://` store.
    pub fn open(
        url: Option<&str>,
        data_dir: &Path,
        aws: impl IntoIterator<Item = (String, String)>,
        bytes: IntCounterVec,
    ) -> anyhow::Result<Blobs> {
        let url = match url {
            Some(u) => u.to_string(),
            None => format!("file://{}", data_dir.join("objects").display()),
        };
        if let Some(dir) = url.strip_prefix("file://") {
            std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("BERTH_OBJECT_STORE: creating {dir}: {e}"))?;
            let store = LocalFileSystem::new_with_prefix(dir)
                .map_err(|e| anyhow::anyhow!("BERTH_OBJECT_STORE={url:?}: {e}"))?;
            return Ok(Blobs {
                store: Arc::new(store),
                prefix: String::new(),
                url,
                bytes,
            });
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            anyhow::bail!("BERTH_OBJECT_STORE={url:?}: expected file://PATH or s3://BUCKET/PREFIX");
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            anyhow::bail!("BERTH_OBJECT_STORE={url:?}: no bucket");
        }
        let mut builder = AmazonS3Builder::new().with_bucket_name(bucket);
        let mut http_endpoint = false;
        for (k, v) in aws {
            let key = k.to_ascii_lowercase();
            if (key == "aws_endpoint_url" || key == "aws_endpoint") && v.starts_with("http://") {
                http_endpoint = true;
            }
            if let Ok(config_key) = key.parse() {
                builder = builder.with_config(config_key, v);
            }
        }
        // A plain-HTTP endpoint is a local S3-compatible server the operator chose.
        if http_endpoint {
            builder = builder.with_allow_http(true);
        }
        let store = builder
            .build()
            .map_err(|e| anyhow::anyhow!("BERTH_OBJECT_STORE={url:?}: {e}"))?;
        let prefix = prefix.trim_matches('/');
        Ok(Blobs {
            store: Arc::new(store),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            url,
            bytes,
        })
    }

    fn key(&self, key: &str) -> Key {
        Key::from(format!("{}{key}", self.prefix))
    }

    /// Store `data` under `key` (overwrites: keys are fresh ids, so a retry writes the same bytes).
    pub async fn put(&self, key: &str, data: Bytes) -> anyhow::Result<()> {
        let n = data.len() as u64;
        self.store.put(&self.key(key), PutPayload::from_bytes(data)).await?;
        self.bytes.with_label_values(&["put"]).inc_by(n);
        Ok(())
    }

    /// The whole blob.
    pub async fn get(&self, key: &str) -> anyhow::Result<Bytes> {
        let data = self.store.get(&self.key(key)).await?.bytes().await?;
        self.bytes.with_label_values(&["get"]).inc_by(data.len() as u64);
        Ok(data)
    }

    /// The blob as a stream of chunks (counted as they are read).
    pub async fn stream(&self, key: &str) -> anyhow::Result<impl Stream<Item = anyhow::Result<Bytes>> + use<>> {
        let counter = self.bytes.with_label_values(&["get"]);
        let stream = self.store.get(&self.key(key)).await?.into_stream();
        Ok(stream.map(move |chunk| {
            let chunk = chunk?;
            counter.inc_by(chunk.len() as u64);
            Ok(chunk)
        }))
    }

    /// Keys of the blobs rows own (`<tenant>/attachments/<id>`, `<tenant>/patches/<id>`)
    /// last written before `before`: what the orphan sweep checks against the rows.
    pub async fn owned_older_than(&self, before: chrono::DateTime<chrono::Utc>) -> anyhow::Result<Vec<String>> {
        let prefix = (!self.prefix.is_empty()).then(|| Key::from(self.prefix.trim_end_matches('/')));
        let mut listing = self.store.list(prefix.as_ref());
        let mut out = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta?;
            let key = meta.location.as_ref();
            let key = key.strip_prefix(self.prefix.as_str()).unwrap_or(key);
            let mut parts = key.split('/');
            let owned = matches!(
                (parts.next(), parts.next(), parts.next(), parts.next()),
                (Some(_), Some("attachments" | "patches"), Some(_), None)
            );
            if owned && meta.last_modified < before {
                out.push(key.to_string());
            }
        }
        Ok(out)
    }

    /// Bytes `range` of a blob (cut at its end).
    pub async fn get_range(&self, key: &str, range: std::ops::Range<u64>) -> anyhow::Result<Bytes> {
        let data = self.store.get_range(&self.key(key), range).await?;
        self.bytes.with_label_values(&["get"]).inc_by(data.len() as u64);
        Ok(data)
    }

    /// Remove a blob; an absent one is not an error (removal is idempotent).
    pub async fn delete(&self, key: &str) -> anyhow::Result<()> {
        match self.store.delete(&self.key(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
