//! `POST /v1/auth/login`: a person's password for a short-lived JWT that the WebSocket
//! accepts like a credential. Rate limited per account and per source address; the answer
//! never says whether the account exists.

use std::net::SocketAddr;

use axum::{
    Json,
    extract::{ConnectInfo, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde::Deserialize;
use serde_json::json;

use crate::{AppState, auth};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// Tenant name or id.
    tenant: String,
    email: String,
    password: String,
}

impl std::fmt::Debug for LoginRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginRequest")
            .field("tenant", &self.tenant)
            .field("password", &"<redacted>")
            .finish()
    }
}

fn error(status: StatusCode, code: &str) -> Response {
    (status, Json(json!({"error": {"code": code}}))).into_response()
}

pub async fn login(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    body: Result<Json<LoginRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Ok(Json(req)) = body else {
        return error(StatusCode::BAD_REQUEST, "bad-params");
    };
    let Some(keys) = state.config.jwt.clone() else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "unsupported");
    };
    let account = auth::account_key(&req.tenant, &req.email);
    if let Err(wait) = state.login_limiter.check(&account, peer.ip()) {
        state
            .metrics
            .auth_failures
            .with_label_values(&["login-rate-limited"])
            .inc();
        let mut resp = (
            StatusCode::TOO_MANY_REQUESTS,
            Json(json!({"error": {"code": "rate-limited", "retryAfterSecs": wait.secs()}})),
        )
            .into_response();
        if let Ok(v) = HeaderValue::from_str(&wait.secs().to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return resp;
    }
    let found = match state.store.login_lookup(&req.tenant, &req.email).await {
        Ok(f) => f,
        Err(_) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    let password = req.password;
    // Hashing is CPU-heavy: keep it off the async workers.
    let verdict = tokio::task::spawn_blocking(move || match found {
        Some((tenant, user, role, Some(hash))) => {
            auth::verify_password(&password, &hash).then_some((tenant, user, role))
        }
        _ => {
            auth::dummy_verify();
            None
        }
    })
    .await
    .ok()
    .flatten();
    let Some((tenant_id, user_id, role)) = verdict else {
        state.metrics.auth_failures.with_label_values(&["login"]).inc();
        return error(StatusCode::UNAUTHORIZED, "unauthorized");
    };
    state.login_limiter.reset_account(&account);
    let (token, claims) = keys.issue(&user_id, &tenant_id, &role, state.config.jwt_ttl);
    tracing::info!(user.id = %user_id, "signed in");
    Json(json!({
        "token": token,
        "tokenType": "Bearer",
        "expiresAt": chrono::DateTime::from_timestamp(claims.exp, 0).map(|t| t.to_rfc3339()),
        "userId": user_id,
        "tenantId": tenant_id,
    }))
    .into_response()
}
