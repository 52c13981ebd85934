//! `POST /v1/auth/login`: a person's password for a short-lived JWT that the WebSocket
//! accepts like a credential. Rate limited per account and per source address (the client's
//! address from `X-Forwarded-For` when the peer is a trusted proxy), with a cap on
//! concurrent password verifications; the answer never says whether the account exists.
//! Each replica limits accounts and addresses in memory first; an account's attempts are
//! also counted in the database, so that every replica, and the tenant typed by name or by
//! id, take from one bucket.

use std::net::{IpAddr, SocketAddr};

use axum::{
    Json,
    extract::{ConnectInfo, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
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

/// The client's address: the peer's, unless the peer is a trusted proxy; then the
/// right-most `X-Forwarded-For` entry that is not itself a trusted proxy (entries left of
/// it could be forged by the client). Unparseable entries stop the walk at the last hop
/// known for sure.
pub(crate) fn client_addr(peer: SocketAddr, headers: &HeaderMap, trusted: &[ipnet::IpNet]) -> IpAddr {
    let is_trusted = |a: &IpAddr| {
        let a = match a {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(*a, IpAddr::V4),
            IpAddr::V4(_) => *a,
        };
        trusted.iter().any(|n| n.contains(&a))
    };
    let mut addr = peer.ip();
    if !is_trusted(&addr) {
        return addr;
    }
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect();
    for hop in hops.iter().rev() {
        let Ok(hop) = hop.trim().parse::<IpAddr>() else {
            break;
        };
        addr = hop;
        if !is_trusted(&addr) {
            break;
        }
    }
    addr
}

fn rate_limited(state: &AppState, wait: auth::RetryAfter) -> Response {
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
    resp
}

pub async fn login(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Result<Json<LoginRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Ok(Json(req)) = body else {
        return error(StatusCode::BAD_REQUEST, "bad-params");
    };
    let Some(keys) = state.config.jwt.clone() else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "unsupported");
    };
    let account = auth::account_key(&req.tenant, &req.email);
    let addr = client_addr(peer, &headers, &state.config.trusted_proxies);
    if let Err(wait) = state.login_limiter.check(&account, addr) {
        return rate_limited(&state, wait);
    }
    let found = match state.store.login_lookup(&req.tenant, &req.email).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "looking up a sign-in's account failed");
            return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
        }
    };
    // The account's attempts, counted across replicas and whether the tenant was typed by
    // name or by id. Taken for accounts that do not exist too, so the answers and their
    // timing stay alike.
    // An existing account is keyed by its user (however its e-mail was spelt), any other
    // by the tenant and the e-mail typed.
    let shared = auth::account_digest(&match &found {
        Some(f) => match &f.user {
            Some((user, ..)) => auth::account_key(&f.tenant_id, user),
            None => auth::account_key(&f.tenant_id, &req.email),
        },
        None => auth::account_key(&req.tenant, &req.email),
    });
    let per_account = auth::BucketConfig::PER_ACCOUNT;
    match state
        .store
        .login_take(&shared, per_account.capacity, per_account.refill_every)
        .await
    {
        Ok(Ok(())) => {}
        Ok(Err(wait)) => return rate_limited(&state, auth::RetryAfter(wait)),
        Err(e) => {
            tracing::warn!(error = %e, "counting a sign-in attempt failed");
            return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
        }
    }
    let found = found.and_then(|f| f.user.map(|(user, role, hash)| (f.tenant_id, user, role, hash)));
    // Verification costs 19 MiB and real CPU time: a bounded number run at once, and the
    // rest are told to come back rather than queue up.
    let Ok(permit) = state.password_checks.clone().try_acquire_owned() else {
        state.metrics.auth_failures.with_label_values(&["login-busy"]).inc();
        let mut resp = error(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return resp;
    };
    let password = req.password;
    let account_found = found.as_ref().map(|(tenant, user, ..)| (tenant.clone(), user.clone()));
    // Hashing is CPU-heavy: keep it off the async workers.
    let verdict = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        match found {
            Some((tenant, user, role, Some(hash))) => {
                auth::verify_password(&password, &hash).then_some((tenant, user, role))
            }
            _ => {
                auth::dummy_verify();
                None
            }
        }
    })
    .await
    .ok()
    .flatten();
    let Some((tenant_id, user_id, role)) = verdict else {
        state.metrics.auth_failures.with_label_values(&["login"]).inc();
        // An existing account's failed attempt is the tenant's to see; one for an account
        // that does not exist has no tenant to record it in (the metric counts it). Written
        // after the answer, not before: waiting for the write made a refusal for an account
        // that exists measurably slower than one for an account that does not.
        if let Some((tenant, user)) = account_found {
            let store = state.store.clone();
            tokio::spawn(async move {
                if let Err(e) = store.audit_login(&tenant, &user, false).await {
                    tracing::warn!(error = %e, "recording a failed sign-in failed");
                }
            });
        }
        return error(StatusCode::UNAUTHORIZED, "unauthorized");
    };
    if let Err(e) = state.store.audit_login(&tenant_id, &user_id, true).await {
        tracing::warn!(error = %e, "recording a sign-in failed");
    }
    state.login_limiter.reset_account(&account);
    if let Err(e) = state.store.login_forget(&shared).await {
        tracing::warn!(error = %e, "forgetting a sign-in's failed attempts failed");
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn forwarded_for_counts_only_behind_a_trusted_proxy() {
        let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
        let proxy: SocketAddr = "10.1.2.3:5555".parse().unwrap();
        let stranger: SocketAddr = "203.0.113.9:5555".parse().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // No trusted proxy: the header is ignored (a client could write anything).
        assert_eq!(
            client_addr(stranger, &xff(&["198.51.100.1"]), &trusted),
            ip("203.0.113.9")
        );
        assert_eq!(client_addr(proxy, &xff(&["198.51.100.1"]), &[]), ip("10.1.2.3"));
        // Behind the proxy: the right-most untrusted hop; forged entries left of it lose.
        assert_eq!(
            client_addr(proxy, &xff(&["198.51.100.1"]), &trusted),
            ip("198.51.100.1")
        );
        assert_eq!(
            client_addr(proxy, &xff(&["1.1.1.1, 198.51.100.1, 10.9.9.9"]), &trusted),
            ip("198.51.100.1")
        );
        assert_eq!(
            client_addr(proxy, &xff(&["1.1.1.1", "198.51.100.1"]), &trusted),
            ip("198.51.100.1")
        );
        // Garbage stops the walk at the last hop known for sure.
        assert_eq!(client_addr(proxy, &xff(&["garbage"]), &trusted), ip("10.1.2.3"));
        assert_eq!(
            client_addr(proxy, &xff(&["1.1.1.1, junk, 10.9.9.9"]), &trusted),
            ip("10.9.9.9")
        );
        // No header behind the proxy: the proxy's own address.
        assert_eq!(client_addr(proxy, &HeaderMap::new(), &trusted), ip("10.1.2.3"));
        let local: SocketAddr = "[::1]:1".parse().unwrap();
        assert_eq!(client_addr(local, &xff(&["2001:db8::7"]), &trusted), ip("2001:db8::7"));
    }
}
