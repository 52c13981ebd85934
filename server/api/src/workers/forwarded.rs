//! The serving side of a forwarded worker call: `POST /v1/internal/call`, where another
//! replica forwards a call for a worker connection this replica holds (authenticated with
//! the cluster secret, streamed back as frames or JSON lines), and what this replica needs
//! to take part in routing (the secret and its announced address).

use std::time::Duration;

use axum::{
    Json,
    body::Body,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use berth_protocol::{ErrorCode, RpcError, worker as wp};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::{
    calls::{CallEvent, Forwarded, Item, JsonLine, KEEPALIVE, SECRET_HEADER, chunk_json_len, write_chunk_json},
    frames::{self, Line},
};
use crate::AppState;

/// One line of a forwarded call's response body in the JSON-lines form (for an older
/// replica).
pub(super) fn line_bytes(l: &Line) -> Bytes {
    let mut v = match l {
        // Written by hand, sized once: an item is copied once, not grown into a
        // serializer's buffer.
        Line::Item(Item::Json(item)) => {
            let mut v = Vec::with_capacity(item.get().len() + 10);
            v.extend_from_slice(b"{\"item\":");
            v.extend_from_slice(item.get().as_bytes());
            v.push(b'}');
            v
        }
        // A chunk run: one line per chunk, as JSON items.
        Line::Item(run @ Item::Chunk { data, .. }) => {
            let mut text = String::with_capacity(chunk_json_len(data.len()) + 12 * data.len().div_ceil(1 << 15));
            for (i, (offset, piece)) in run.chunks().into_iter().enumerate() {
                if i > 0 {
                    text.push('\n');
                }
                text.push_str("{\"item\":");
                write_chunk_json(&mut text, offset, &piece);
                text.push('}');
            }
            text.into_bytes()
        }
        Line::Result(r) => serde_json::to_vec(&JsonLine::Result(r.clone())).unwrap_or_default(),
        Line::Error(e) => serde_json::to_vec(&JsonLine::Error(e.clone())).unwrap_or_default(),
        Line::Keepalive => serde_json::to_vec(&JsonLine::Keepalive).unwrap_or_default(),
    };
    v.push(b'\n');
    Bytes::from(v)
}

/// How a forwarded call's response body is written: frames, or JSON lines for a replica
/// that did not ask for frames.
#[derive(Clone, Copy)]
struct BodyWriter {
    framed: bool,
    /// The requesting replica reads chunk-run frames.
    runs: bool,
}

impl BodyWriter {
    /// Queue `line` for the body; false once the requesting replica has gone away.
    async fn send(self, tx: &mpsc::Sender<Bytes>, line: &Line) -> bool {
        if !self.framed {
            return tx.send(line_bytes(line)).await.is_ok();
        }
        for bytes in frames::encode(line, self.runs) {
            if tx.send(bytes).await.is_err() {
                return false;
            }
        }
        true
    }

    fn try_send(self, tx: &mpsc::Sender<Bytes>, line: &Line) {
        // Only for an error (one frame or line).
        let bytes = if self.framed {
            frames::encode(line, self.runs).concat().into()
        } else {
            line_bytes(line)
        };
        let _ = tx.try_send(bytes);
    }
}

/// `POST /v1/internal/call`: another replica forwards a call for a worker this replica holds.
pub async fn internal_call(State(state): State<AppState>, headers: HeaderMap, Json(req): Json<Forwarded>) -> Response {
    let presented = headers.get(SECRET_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
    let expected = state.cluster.secret.as_bytes();
    if !bool::from(subtle::ConstantTimeEq::ct_eq(presented, expected)) {
        state.metrics.auth_failures.with_label_values(&["cluster"]).inc();
        return StatusCode::FORBIDDEN.into_response();
    }
    let framed = headers
        .get(axum::http::header::ACCEPT)
        .is_some_and(|v| v.as_bytes() == frames::CONTENT_TYPE.as_bytes());
    let runs = framed && headers.contains_key(frames::RUNS_HEADER);
    let writer = BodyWriter { framed, runs };
    // A credit window's worth of items (a chunk is two pieces: its header and its data) may
    // wait for the response body: the worker's window is not narrowed by this hop.
    let (tx, rx) = mpsc::channel::<Bytes>(2 * wp::CALL_WINDOW as usize + 2);
    match state.workers.call_local(&req.tenant_id, req.call).await {
        Ok(Some(mut stream)) => {
            tokio::spawn(async move {
                let mut keepalive = tokio::time::interval(KEEPALIVE);
                keepalive.tick().await;
                loop {
                    let out = tokio::select! {
                        ev = stream.next() => match ev {
                            Some(CallEvent::Item(v)) => Line::Item(v),
                            Some(CallEvent::Done(Ok(v))) => Line::Result(v),
                            Some(CallEvent::Done(Err(e))) => Line::Error(e),
                            None => break,
                        },
                        _ = keepalive.tick() => Line::Keepalive,
                    };
                    // The requesting replica went away: dropping the stream cancels the call.
                    if !writer.send(&tx, &out).await {
                        break;
                    }
                }
            });
        }
        Ok(None) => writer.try_send(&tx, &Line::Error(RpcError::new(ErrorCode::WorkspaceOffline))),
        Err(e) => writer.try_send(&tx, &Line::Error(e.0)),
    }
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .header(
            "content-type",
            if framed {
                frames::CONTENT_TYPE
            } else {
                "application/x-ndjson"
            },
        )
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// What this replica needs to take part in routing.
pub struct Cluster {
    /// Shared by every replica of the database (generated by the first).
    pub secret: String,
    /// Where other replicas reach this one (None: they cannot; see `BERTH_INTERNAL_URL`).
    pub internal_url: Option<String>,
}

impl Cluster {
    /// Load the cluster secret and work out this replica's internal address: the configured
    /// one, else the listener's own address unless it is a wildcard.
    pub async fn load(
        store: &berth_store::Store,
        configured: Option<&str>,
        listen: std::net::SocketAddr,
    ) -> anyhow::Result<Cluster> {
        let mut bytes = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
        let candidate: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let secret = store.cluster_secret(&candidate).await?;
        let internal_url = match configured {
            Some(u) => Some(u.trim_end_matches('/').to_string()),
            None if listen.ip().is_unspecified() => {
                tracing::warn!(
                    "BERTH_INTERNAL_URL is not set and the listener is a wildcard address: other replicas cannot forward worker calls to this one"
                );
                None
            }
            None => Some(format!("http://{listen}")),
        };
        Ok(Cluster { secret, internal_url })
    }
}

/// Keep this replica's internal address announced while it runs.
pub fn spawn_announce(state: AppState) {
    let Some(url) = state.cluster.internal_url.clone() else {
        return;
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(30));
        loop {
            tokio::select! {
                _ = tick.tick() => if let Err(e) = state.store.replica_announce(&state.config.replica_id, &url).await {
                    tracing::warn!(error = %e, "announcing this replica's address failed");
                },
                _ = state.shutdown.cancelled() => return,
            }
        }
    });
}
