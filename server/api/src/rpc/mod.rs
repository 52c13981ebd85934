//! The client WebSocket (`GET /v1/rpc`): JSON-RPC 2.0, one message per text frame.
//!
//! Authentication is the `Authorization` header on the upgrade (HTTP 401 when wrong) or a
//! `hello` request (within the hello timeout, or the connection closes). Every request runs
//! as its own task; responses and subscription items go through one outbound queue bounded
//! in bytes and drained by a writer task, so a slow client slows its own subscriptions
//! (which then read from the database at their own pace) and never makes the server buffer
//! without bound. A write the client does not take within the write timeout closes the
//! connection; its registration (which counts against the per-credential limit) is dropped
//! only after the writer has ended.

mod admin;
mod agent;
mod answer;
mod conn;
mod connection;
mod ctx;
mod files;
mod fork;
mod git;
pub(crate) mod interaction;
mod mcp;
pub(crate) mod patch;
mod queue;
mod receipts;
mod request;
mod search;
mod session;
mod skill;
mod socket;
pub(crate) mod upload;
mod workspace;

use std::net::SocketAddr;

use axum::{
    extract::{ConnectInfo, State, WebSocketUpgrade},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use berth_protocol::{ErrorCode, Method, RpcError, method};
use berth_store::CredentialKind;
use serde_json::json;

pub(super) use answer::decode;
use answer::{Answer, call, call_written};
pub use conn::{Conn, Outbound, Subs};
pub use ctx::Ctx;
use socket::run;

use crate::{
    AppState,
    error::{ApiError, ApiResult},
};

/// The bearer token of an `Authorization` header. The scheme is case-insensitive (RFC 7235).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim_start();
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The largest WebSocket message a client's connection takes: room above the limits, so
/// that an oversized message is refused by us (1009 for text; a typed error for an upload).
pub(crate) fn max_message(config: &crate::Config) -> usize {
    config
        .max_text_message
        .max(config.max_attachment_bytes.saturating_add(4))
        .saturating_add(64 << 10)
}

/// Whether a browser page at `origin` may open the WebSocket: an origin in the allow-list,
/// or the server's own origin (its authority is the `Host` the browser sent the upgrade
/// to), which is where the embedded console is served from. A page elsewhere sends its own
/// origin, which matches neither. Authentication never rides on ambient credentials
/// (cookies), so this is defence in depth, not the only guard.
fn origin_allowed(origin: &str, host: Option<&str>, allowed: &[String]) -> bool {
    if allowed.iter().any(|a| a == origin) {
        return true;
    }
    let Some(host) = host else { return false };
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    authority.is_some_and(|a| !a.is_empty() && !a.contains('/') && a.eq_ignore_ascii_case(host))
}

pub async fn upgrade(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let allowed = origin
            .to_str()
            .is_ok_and(|o| origin_allowed(o, host, &state.config.allowed_origins));
        if !allowed {
            state.metrics.auth_failures.with_label_values(&["origin"]).inc();
            return StatusCode::FORBIDDEN.into_response();
        }
    }
    let principal = match bearer(&headers) {
        None => None,
        Some(t) => match state.authenticate(t).await {
            Ok(Some(p)) if p.kind == CredentialKind::User => Some(p),
            Ok(_) => {
                state.metrics.auth_failures.with_label_values(&["invalid"]).inc();
                return StatusCode::UNAUTHORIZED.into_response();
            }
            Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        },
    };
    if let Some(p) = &principal
        && !state
            .connections
            .has_room(p, state.config.limits.max_connections_per_credential)
    {
        return StatusCode::TOO_MANY_REQUESTS.into_response();
    }
    // A connection that will authenticate by `hello` counts against its address until then.
    let pending = if principal.is_none() {
        let addr = crate::login::client_addr(peer, &headers, &state.config.trusted_proxies);
        match state
            .connections
            .pending(addr, state.config.limits.max_unauthenticated_per_address)
        {
            Some(p) => Some(p),
            None => {
                state
                    .metrics
                    .auth_failures
                    .with_label_values(&["unauthenticated-limit"])
                    .inc();
                return StatusCode::TOO_MANY_REQUESTS.into_response();
            }
        }
    } else {
        None
    };
    let max = max_message(&state.config);
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| run(state, principal, pending, socket))
}

/// Every client method, by its declared name. A method before a successful `hello` (or an
/// authenticated upgrade) answers `unauthorized`.
async fn dispatch(ctx: &Ctx, name: &str, params: serde_json::Value) -> ApiResult<Answer> {
    if name == method::Hello::NAME {
        return call::<method::Hello, _, _>(ctx, params, connection::hello).await;
    }
    // Before sign-in every other name, known or not, is `unauthorized`: an anonymous peer
    // learns nothing about the method set.
    ctx.principal()?;
    if !berth_protocol::METHOD_NAMES.contains(&name) {
        return Err(ApiError::code(ErrorCode::MethodNotFound));
    }
    match name {
        method::Ping::NAME => call::<method::Ping, _, _>(ctx, params, connection::ping).await,
        method::Status::NAME => call::<method::Status, _, _>(ctx, params, connection::status).await,
        method::SubscriptionClose::NAME => {
            call::<method::SubscriptionClose, _, _>(ctx, params, connection::close).await
        }
        method::WorkspaceList::NAME => call::<method::WorkspaceList, _, _>(ctx, params, workspace::list).await,
        method::WorkspaceGet::NAME => call::<method::WorkspaceGet, _, _>(ctx, params, workspace::get).await,
        method::WorkspaceRename::NAME => call::<method::WorkspaceRename, _, _>(ctx, params, workspace::rename).await,
        method::WorkspaceRemove::NAME => call::<method::WorkspaceRemove, _, _>(ctx, params, workspace::remove).await,
        method::WorkspaceFiles::NAME => call::<method::WorkspaceFiles, _, _>(ctx, params, workspace::files).await,
        method::GitStatusGet::NAME => call::<method::GitStatusGet, _, _>(ctx, params, git::status).await,
        method::GitDiffGet::NAME => call::<method::GitDiffGet, _, _>(ctx, params, git::diff).await,
        method::PatchSnapshot::NAME => call::<method::PatchSnapshot, _, _>(ctx, params, patch::snapshot).await,
        method::PatchRead::NAME => call::<method::PatchRead, _, _>(ctx, params, patch::read).await,
        method::FilesList::NAME => call::<method::FilesList, _, _>(ctx, params, files::list).await,
        method::FilesWatch::NAME => call::<method::FilesWatch, _, _>(ctx, params, files::watch).await,
        method::FilesRead::NAME => call::<method::FilesRead, _, _>(ctx, params, files::read).await,
        method::SessionCreate::NAME => call::<method::SessionCreate, _, _>(ctx, params, session::create).await,
        method::SessionGet::NAME => call::<method::SessionGet, _, _>(ctx, params, session::get).await,
        method::SessionSend::NAME => call::<method::SessionSend, _, _>(ctx, params, session::send).await,
        method::SessionHistory::NAME => {
            call_written::<method::SessionHistory, _, _>(ctx, params, session::history).await
        }
        method::ContentUpload::NAME => call::<method::ContentUpload, _, _>(ctx, params, upload::content_upload).await,
        method::ContentRead::NAME => call::<method::ContentRead, _, _>(ctx, params, upload::content_read).await,
        method::SessionWatch::NAME => call::<method::SessionWatch, _, _>(ctx, params, session::watch).await,
        method::SessionList::NAME => call::<method::SessionList, _, _>(ctx, params, session::list).await,
        method::SessionRename::NAME => call::<method::SessionRename, _, _>(ctx, params, session::rename).await,
        method::SessionSetModel::NAME => call::<method::SessionSetModel, _, _>(ctx, params, session::set_model).await,
        method::SessionSetAgent::NAME => call::<method::SessionSetAgent, _, _>(ctx, params, agent::set_agent).await,
        method::SessionRemove::NAME => call::<method::SessionRemove, _, _>(ctx, params, session::remove).await,
        method::SessionClear::NAME => call::<method::SessionClear, _, _>(ctx, params, session::clear).await,
        method::SessionPause::NAME => call::<method::SessionPause, _, _>(ctx, params, session::pause).await,
        method::SessionStop::NAME => call::<method::SessionStop, _, _>(ctx, params, session::stop).await,
        method::SessionSource::NAME => call::<method::SessionSource, _, _>(ctx, params, session::source).await,
        method::SessionWatchDiagnostics::NAME => {
            call::<method::SessionWatchDiagnostics, _, _>(ctx, params, session::watch_diagnostics).await
        }
        method::SessionContext::NAME => call::<method::SessionContext, _, _>(ctx, params, session::context).await,
        method::SessionCompact::NAME => call::<method::SessionCompact, _, _>(ctx, params, session::compact).await,
        method::SessionSearch::NAME => call::<method::SessionSearch, _, _>(ctx, params, search::search).await,
        method::SessionFork::NAME => call::<method::SessionFork, _, _>(ctx, params, fork::fork).await,
        method::SessionForkReceipt::NAME => {
            call::<method::SessionForkReceipt, _, _>(ctx, params, fork::fork_receipt).await
        }
        method::SessionDiagnostics::NAME => {
            call::<method::SessionDiagnostics, _, _>(ctx, params, session::diagnostics).await
        }
        method::SessionPendingInteractions::NAME => {
            call::<method::SessionPendingInteractions, _, _>(ctx, params, interaction::pending).await
        }
        method::SessionInteraction::NAME => {
            call::<method::SessionInteraction, _, _>(ctx, params, interaction::get).await
        }
        method::SessionRespond::NAME => call::<method::SessionRespond, _, _>(ctx, params, interaction::respond).await,
        method::QueueUpdate::NAME => call::<method::QueueUpdate, _, _>(ctx, params, queue::update).await,
        method::QueueMove::NAME => call::<method::QueueMove, _, _>(ctx, params, queue::move_entry).await,
        method::QueueRemove::NAME => call::<method::QueueRemove, _, _>(ctx, params, queue::remove).await,
        method::QueueGet::NAME => call::<method::QueueGet, _, _>(ctx, params, queue::get).await,
        method::OperationReceipt::NAME => call::<method::OperationReceipt, _, _>(ctx, params, receipts::receipt).await,
        method::AdminCredentialCreate::NAME => {
            call::<method::AdminCredentialCreate, _, _>(ctx, params, admin::credential_create).await
        }
        method::AdminCredentialList::NAME => {
            call::<method::AdminCredentialList, _, _>(ctx, params, admin::credential_list).await
        }
        method::AdminCredentialRevoke::NAME => {
            call::<method::AdminCredentialRevoke, _, _>(ctx, params, admin::credential_revoke).await
        }
        method::AdminUserCreate::NAME => call::<method::AdminUserCreate, _, _>(ctx, params, admin::user_create).await,
        method::AdminUserList::NAME => call::<method::AdminUserList, _, _>(ctx, params, admin::user_list).await,
        method::AdminUserDisable::NAME => {
            call::<method::AdminUserDisable, _, _>(ctx, params, admin::user_disable).await
        }
        method::AdminStatusGet::NAME => call::<method::AdminStatusGet, _, _>(ctx, params, admin::status).await,
        method::AdminUserSetRole::NAME => {
            call::<method::AdminUserSetRole, _, _>(ctx, params, admin::user_set_role).await
        }
        method::AdminAuditList::NAME => call::<method::AdminAuditList, _, _>(ctx, params, admin::audit_list).await,
        method::AdminWorkerList::NAME => call::<method::AdminWorkerList, _, _>(ctx, params, admin::worker_list).await,
        method::AgentList::NAME => call::<method::AgentList, _, _>(ctx, params, agent::list).await,
        method::AgentGet::NAME => call::<method::AgentGet, _, _>(ctx, params, agent::get).await,
        method::AgentSave::NAME => call::<method::AgentSave, _, _>(ctx, params, agent::save).await,
        method::AgentRemove::NAME => call::<method::AgentRemove, _, _>(ctx, params, agent::remove).await,
        method::SkillList::NAME => call::<method::SkillList, _, _>(ctx, params, skill::list).await,
        method::SkillGet::NAME => call::<method::SkillGet, _, _>(ctx, params, skill::get).await,
        method::SkillSave::NAME => call::<method::SkillSave, _, _>(ctx, params, skill::save).await,
        method::SkillRemove::NAME => call::<method::SkillRemove, _, _>(ctx, params, skill::remove).await,
        method::McpList::NAME => call::<method::McpList, _, _>(ctx, params, mcp::list).await,
        method::McpSave::NAME => call::<method::McpSave, _, _>(ctx, params, mcp::save).await,
        method::McpRemove::NAME => call::<method::McpRemove, _, _>(ctx, params, mcp::remove).await,
        _ => Err(ApiError::with(ErrorCode::Internal, json!({}))).inspect_err(|_| {
            tracing::error!(method = name, "declared method has no handler");
        }),
    }
}

/// Error when the subscription's connection is gone.
pub fn gone() -> RpcError {
    RpcError::new(ErrorCode::Unavailable)
}

/// The bytes of a stored blob of `total` bytes from the cursor `after` (a byte offset as a
/// string; absent: the start), at most `page` of them, read by byte range on any replica.
/// Returns the page's offset and bytes; a cursor past the end is `bad-params {field:"after"}`.
pub(super) async fn blob_page(
    ctx: &Ctx,
    key: &str,
    total: u64,
    after: Option<&str>,
    page: usize,
) -> ApiResult<(u64, bytes::Bytes)> {
    let offset = match after {
        None => 0,
        Some(a) => a
            .parse::<u64>()
            .ok()
            .filter(|o| *o <= total)
            .ok_or_else(|| ApiError::with(ErrorCode::BadParams, json!({"field": "after"})))?,
    };
    let end = (offset + page as u64).min(total);
    if offset == end {
        return Ok((offset, bytes::Bytes::new()));
    }
    let data = ctx.state.blobs.get_range(key, offset..end).await.map_err(|e| {
        tracing::warn!(error = %e, "object store read failed");
        ApiError::code(ErrorCode::Unavailable)
    })?;
    if data.len() as u64 != end - offset {
        tracing::warn!("object store returned a short range");
        return Err(ApiError::code(ErrorCode::Unavailable));
    }
    Ok((offset, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            bearer(&h).map(str::to_owned)
        };
        for v in ["Bearer tok", "bearer tok", "BEARER tok", "  bEaReR   tok "] {
            assert_eq!(with(v).as_deref(), Some("tok"), "{v:?}");
        }
        for v in ["Basic tok", "Bearertok", "Bearer", "tok"] {
            assert_eq!(with(v), None, "{v:?}");
        }
    }

    #[test]
    fn only_listed_origins_and_the_servers_own_may_open_the_socket() {
        let listed = vec!["https://editor.example".to_string()];
        let ok = |o: &str, h: Option<&str>| origin_allowed(o, h, &listed);
        assert!(ok("https://editor.example", Some("berth.example")));
        // The console, served by the server itself.
        assert!(ok("https://berth.example", Some("berth.example")));
        assert!(ok("http://127.0.0.1:8790", Some("127.0.0.1:8790")));
        assert!(ok("http://Berth.Example:8443", Some("berth.example:8443")));
        // Anything else: another site, another port, a suffix trick, no Host, opaque origins.
        assert!(!ok("https://evil.example", Some("berth.example")));
        assert!(!ok("http://127.0.0.1:9999", Some("127.0.0.1:8790")));
        assert!(!ok("https://berth.example.evil.example", Some("berth.example")));
        assert!(!ok("https://berth.example/x", Some("berth.example")));
        assert!(!ok("https://berth.example", None));
        assert!(!ok("null", Some("null")));
        assert!(!ok("file://", Some("")));
    }

    /// Every declared method must appear in the dispatcher's match.
    #[test]
    fn every_declared_method_is_dispatched() {
        let src = include_str!("mod.rs");
        let dispatch = &src[src.find("async fn dispatch").expect("dispatch")..];
        for (name, ty) in berth_protocol::METHOD_NAMES.iter().zip(METHOD_TYPES) {
            assert!(
                dispatch.contains(&format!("method::{ty}::NAME")),
                "{name} ({ty}) is not dispatched"
            );
        }
    }

    const METHOD_TYPES: &[&str] = &[
        "Hello",
        "Ping",
        "Status",
        "WorkspaceList",
        "WorkspaceGet",
        "WorkspaceRename",
        "WorkspaceRemove",
        "WorkspaceFiles",
        "GitStatusGet",
        "GitDiffGet",
        "PatchSnapshot",
        "PatchRead",
        "FilesList",
        "FilesWatch",
        "FilesRead",
        "SessionCreate",
        "SessionGet",
        "SessionSend",
        "ContentUpload",
        "ContentRead",
        "SessionHistory",
        "SessionWatch",
        "SubscriptionClose",
        "SessionList",
        "SessionRename",
        "SessionSetModel",
        "SessionSetAgent",
        "SessionRemove",
        "SessionClear",
        "SessionPause",
        "SessionStop",
        "SessionSource",
        "SessionSearch",
        "SessionFork",
        "SessionForkReceipt",
        "SessionDiagnostics",
        "SessionWatchDiagnostics",
        "SessionContext",
        "SessionCompact",
        "SessionPendingInteractions",
        "SessionInteraction",
        "SessionRespond",
        "QueueUpdate",
        "QueueMove",
        "QueueRemove",
        "QueueGet",
        "OperationReceipt",
        "AdminCredentialCreate",
        "AdminCredentialList",
        "AdminCredentialRevoke",
        "AdminUserCreate",
        "AdminUserList",
        "AdminUserDisable",
        "AdminStatusGet",
        "AdminUserSetRole",
        "AdminAuditList",
        "AdminWorkerList",
        "AgentList",
        "AgentGet",
        "AgentSave",
        "AgentRemove",
        "SkillList",
        "SkillGet",
        "SkillSave",
        "SkillRemove",
        "McpList",
        "McpSave",
        "McpRemove",
    ];

    #[test]
    fn method_names_are_unique() {
        let mut names = berth_protocol::METHOD_NAMES.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), berth_protocol::METHOD_NAMES.len());
        assert_eq!(names.len(), METHOD_TYPES.len());
    }
}
