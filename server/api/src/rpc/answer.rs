//! Running one request and writing its answer: the handler called with its typed params
//! (a mutation with an `operationId` through its receipt), the result serialized once into
//! the response text, and the request's metrics.

use std::time::Instant;

use axum::extract::ws::Message;
use berth_protocol::{ErrorCode, Method, jsonrpc::Response as RpcResponse, method};
use serde_json::json;

use super::{Ctx, ctx::text, dispatch, receipts, request::Job};
use crate::error::{ApiError, ApiResult};

pub(super) async fn run_job(job: Job) {
    let Job { ctx, req, _permit, sub } = job;
    let started = Instant::now();
    let result = match &sub {
        // A subscription stops wherever it is (catching up included) once cancelled.
        Some((_, token)) => tokio::select! {
            r = dispatch(&ctx, &req.method, req.params) => r,
            _ = token.cancelled() => encode(&()),
        },
        None => dispatch(&ctx, &req.method, req.params).await,
    };
    if let (Some((serial, _)), Some(id)) = (&sub, ctx.id) {
        ctx.conn.subs.lock().expect("conn lock").finish(id, *serial);
    }
    if req.method == method::ContentUpload::NAME
        && let Some(id) = ctx.id
    {
        ctx.conn.uploads.end(id);
    }
    let code = match &result {
        Ok(_) => "ok",
        Err(e) => e.data_code(),
    };
    let label = if berth_protocol::METHOD_NAMES.contains(&req.method.as_str()) {
        req.method.as_str()
    } else {
        "unknown"
    };
    ctx.state.metrics.rpc_requests.with_label_values(&[label, code]).inc();
    ctx.state
        .metrics
        .rpc_duration
        .with_label_values(&[label])
        .observe(started.elapsed().as_secs_f64());
    respond(&ctx, ctx.id, result).await;
}

/// A method's result, already written out as JSON: the handler's typed result is
/// serialized once, straight into the text the response frame carries (no `Value` tree in
/// between, which for a history page of 200 rows was most of the encoding cost).
pub(super) type Answer = Box<serde_json::value::RawValue>;

fn encode<T: serde::Serialize>(result: &T) -> ApiResult<Answer> {
    serde_json::value::to_raw_value(result).map_err(|_| ApiError::code(ErrorCode::Internal))
}

/// The success envelope around an [`Answer`], written once into a buffer of its size (a
/// history page is tens of kilobytes): the same text as serializing [`RpcResponse::ok`]
/// (its fields, in its order).
fn answered_text(id: Option<u32>, result: &serde_json::value::RawValue) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(result.get().len() + 40);
    text.push_str(r#"{"jsonrpc":"2.0","id":"#);
    match id {
        Some(id) => {
            let _ = write!(text, "{id}");
        }
        None => text.push_str("null"),
    }
    text.push_str(r#","result":"#);
    text.push_str(result.get());
    text.push('}');
    text
}

async fn respond(ctx: &Ctx, id: Option<u32>, result: ApiResult<Answer>) {
    let msg = match result {
        Ok(result) => Message::Text(answered_text(id, &result).into()),
        Err(e) => text(&RpcResponse::err(id, e.0)),
    };
    let _ = ctx.conn.out.send(msg).await;
}

/// Decode params (null means `{}`), call the handler, encode the result.
pub(super) async fn call<M, F, Fut>(ctx: &Ctx, params: serde_json::Value, f: F) -> ApiResult<Answer>
where
    M: Method,
    F: FnOnce(Ctx, M::Params) -> Fut,
    Fut: std::future::Future<Output = ApiResult<M::Result>>,
{
    let params = if params.is_null() { json!({}) } else { params };
    if receipts::is_mutation(M::NAME)
        && let Some(op) = params.get("operationId").and_then(|o| o.as_str()).map(str::to_string)
    {
        return encode(&receipts::with_receipt::<M, F, Fut>(ctx, params, op, f).await?);
    }
    decode_and_run::<M, F, Fut>(ctx.clone(), params, f).await
}

/// Decode params, run the handler, encode the result.
async fn decode_and_run<M, F, Fut>(ctx: Ctx, params: serde_json::Value, f: F) -> ApiResult<Answer>
where
    M: Method,
    F: FnOnce(Ctx, M::Params) -> Fut,
    Fut: std::future::Future<Output = ApiResult<M::Result>>,
{
    let result = f(ctx, decode::<M>(params)?).await?;
    encode(&result)
}

/// Typed params, or `bad-params` naming the method and the field that failed to decode
/// (`field`: its path, e.g. `queueRevision` or `path.bytesBase64`; absent when the params
/// as a whole are wrong).
pub(crate) fn decode<M: Method>(params: serde_json::Value) -> ApiResult<M::Params> {
    serde_path_to_error::deserialize(params).map_err(|e| {
        let mut data = json!({"method": M::NAME, "line": 0, "column": 0});
        if let Some(field) = failed_field(&e) {
            data["field"] = field.into();
        }
        ApiError::with(ErrorCode::BadParams, data)
    })
}

/// The path of the field a decode failed at; for a missing field, the field's own path.
fn failed_field(e: &serde_path_to_error::Error<serde_json::Error>) -> Option<String> {
    let path = e.path().to_string();
    let at = (path != ".").then_some(path);
    let message = e.inner().to_string();
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| name.to_string());
    match (at, missing) {
        (Some(at), Some(name)) => Some(format!("{at}.{name}")),
        (at, missing) => missing.or(at),
    }
}

/// [`call`] for a read whose handler writes its result's JSON itself (the text of
/// `M::Result`), straight from what it read.
pub(super) async fn call_written<M, F, Fut>(ctx: &Ctx, params: serde_json::Value, f: F) -> ApiResult<Answer>
where
    M: Method,
    F: FnOnce(Ctx, M::Params) -> Fut,
    Fut: std::future::Future<Output = ApiResult<Answer>>,
{
    let params = if params.is_null() { json!({}) } else { params };
    f(ctx.clone(), decode::<M>(params)?).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bad-params` names the field that failed: a missing one, a mistyped nested one.
    #[test]
    fn bad_params_name_the_field() {
        let field = |params: serde_json::Value| {
            let e = decode::<berth_protocol::method::QueueUpdate>(params).expect_err("refused");
            e.0.data.get("field").cloned()
        };
        assert_eq!(
            field(json!({"sessionId": "s", "queueId": "q", "prompt": "p"})),
            Some(json!("queueRevision"))
        );
        assert_eq!(
            field(json!({"sessionId": "s", "queueId": "q", "queueRevision": "one", "prompt": "p"})),
            Some(json!("queueRevision"))
        );
        assert_eq!(field(json!("text")), None);
        let e = decode::<berth_protocol::method::FilesRead>(json!({"sessionId": "s", "path": {"bytesBase64": 7}}))
            .expect_err("refused");
        assert_eq!(e.0.data["field"], "path.bytesBase64", "{}", e.0.data);
        // SPEC §4.4's name for the revision is taken.
        assert!(
            decode::<berth_protocol::method::QueueUpdate>(
                json!({"sessionId": "s", "queueId": "q", "revision": 3, "prompt": "p"})
            )
            .is_ok()
        );
    }

    /// A result written once (no `Value` in between) goes out as the same response as the
    /// `Value` it stands for, for a struct result and for `null` (keys now in the struct's
    /// order rather than sorted, as JSON leaves it open).
    #[test]
    fn written_results_make_the_same_response_text() {
        let page = berth_protocol::SessionHistoryResult {
            through: 7,
            rows: Vec::new(),
            next_after: Some(berth_protocol::Position {
                source_sequence: 3,
                item_index: 1,
            }),
        };
        for (written, value) in [
            (encode(&page).unwrap(), serde_json::to_value(&page).unwrap()),
            (encode(&()).unwrap(), serde_json::Value::Null),
        ] {
            for id in [Some(9), None] {
                let Message::Text(old) = text(&RpcResponse::ok(id, value.clone())) else {
                    panic!("text")
                };
                let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
                assert_eq!(parse(&answered_text(id, &written)), parse(old.as_str()));
            }
        }
    }
}
