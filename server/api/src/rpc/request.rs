//! The per-frame checks of a request, done in the read loop before anything is spawned:
//! nesting depth, JSON, the envelope, NUL characters, the credential's request rate, and a
//! slot (in flight, or as a subscription).

use std::sync::Arc;

use berth_protocol::{
    ErrorCode, Method,
    jsonrpc::{Request, Response as RpcResponse},
    method,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Conn, Ctx};
use crate::{AppState, error::ApiError};

/// Nesting depth of a JSON text (brackets outside strings), without parsing it.
fn json_depth(text: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// A request that passed the per-frame checks, with what it holds while it runs.
pub(super) struct Job {
    pub(super) ctx: Ctx,
    pub(super) req: Request,
    /// The connection's in-flight slot (None for subscriptions, which have their own count).
    pub(super) _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// A subscription's slot: its serial and cancellation token.
    pub(super) sub: Option<(u64, CancellationToken)>,
}

/// Whether a decoded JSON value holds a NUL character anywhere (PostgreSQL text cannot).
/// Checked on decoded strings: the JSON text `\\u0000` is a backslash and `u0000`.
fn has_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(a) => a.iter().any(has_nul),
        serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// Per-frame checks, done in the read loop before anything is spawned, so that a client
/// that floods requests gets typed refusals and never piles up tasks: nesting depth, JSON,
/// the envelope, NUL characters (PostgreSQL text cannot hold them), the credential's request
/// rate, and a slot — in flight, or as a subscription under a request id not in use.
pub(super) fn admit_frame(state: &AppState, conn: &Arc<Conn>, text_msg: &str) -> Result<Option<Job>, Box<RpcResponse>> {
    let fail = |id: Option<u32>, e: ApiError| Box::new(RpcResponse::err(id, e.0));
    let max_depth = state.config.limits.max_json_depth;
    if json_depth(text_msg) > max_depth {
        return Err(fail(
            None,
            ApiError::with(ErrorCode::PayloadTooLarge, json!({"limit": "depth", "max": max_depth})),
        ));
    }
    let value: serde_json::Value =
        serde_json::from_str(text_msg).map_err(|_| fail(None, ApiError::code(ErrorCode::ParseError)))?;
    let id = value
        .get("id")
        .and_then(|i| i.as_u64())
        .and_then(|i| u32::try_from(i).ok());
    let req: Request = match serde_json::from_value::<Request>(value) {
        Ok(r) if r.jsonrpc == "2.0" => r,
        _ => return Err(fail(id, ApiError::code(ErrorCode::InvalidRequest))),
    };
    // Notifications from clients carry nothing we act on.
    let Some(id) = req.id else { return Ok(None) };
    // An upload's binary message may follow at once: its slot exists before anything can
    // refuse the request (a refused upload's message is then swallowed, see `upload`).
    let upload = req.method == method::ContentUpload::NAME;
    if upload {
        conn.uploads.begin(id);
    }
    let refuse_upload = |e| {
        if upload {
            conn.uploads.end(id);
        }
        e
    };
    admit_checked(state, conn, req, id).map_err(refuse_upload)
}

/// The checks of [`admit_frame`] after the envelope.
fn admit_checked(state: &AppState, conn: &Arc<Conn>, req: Request, id: u32) -> Result<Option<Job>, Box<RpcResponse>> {
    let fail = |id: Option<u32>, e: ApiError| Box::new(RpcResponse::err(id, e.0));
    if has_nul(&req.params) {
        return Err(fail(
            Some(id),
            ApiError::with(ErrorCode::BadParams, json!({"reason": "nul-character"})),
        ));
    }
    let credential = conn
        .principal
        .lock()
        .expect("conn lock")
        .as_ref()
        .map(|p| p.credential_id.clone());
    if let Some(credential) = credential
        && let Err(wait) = state.request_limiter.check(&credential)
    {
        let ms = (wait.0.as_millis() as u64).max(1);
        return Err(fail(
            Some(id),
            ApiError::with(ErrorCode::RateLimited, json!({"limit": "requests", "retryAfterMs": ms})),
        ));
    }
    let (permit, sub) = if is_subscription(&req.method) {
        let sub = conn
            .subs
            .lock()
            .expect("conn lock")
            .reserve(id, &conn.closed, state.config.limits.max_subscriptions)
            .map_err(|e| fail(Some(id), e))?;
        (None, Some(sub))
    } else {
        let permit = conn.in_flight.clone().try_acquire_owned().map_err(|_| {
            fail(
                Some(id),
                ApiError::with(ErrorCode::RateLimited, json!({"limit": "in-flight"})),
            )
        })?;
        (Some(permit), None)
    };
    let ctx = Ctx {
        state: state.clone(),
        conn: conn.clone(),
        id: Some(id),
        op: None,
    };
    Ok(Some(Job {
        ctx,
        req,
        _permit: permit,
        sub,
    }))
}

/// Methods answered by a subscription (items until closed), as the protocol declares them.
fn is_subscription(method: &str) -> bool {
    berth_protocol::SUBSCRIPTION_NAMES.contains(&method)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_is_checked_in_decoded_strings() {
        let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
        // The JSON text `\\u0000`: a backslash followed by `u0000`, legitimate.
        assert!(!has_nul(&parse(r#"{"prompt": "type \\u0000 here"}"#)));
        assert!(has_nul(&parse(r#"{"prompt": "a\u0000b"}"#)));
        assert!(has_nul(&parse(r#"{"a": [1, {"b": ["x\u0000"]}]}"#)));
        assert!(has_nul(&parse(r#"{"k\u0000": 1}"#)));
        assert!(!has_nul(&parse(r#"{"a": [1, null, true, "ok"]}"#)));
    }
}
