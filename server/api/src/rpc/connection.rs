//! `hello`, `ping`, `status`, `subscription.close`.

use berth_protocol::{
    CauseCode, Empty, ErrorCode, HelloParams, HelloResult, ModelProbe, Notice, PROTOCOL_VERSION, PingResult,
    SUPPORTED_PROTOCOLS, StatusParams, StatusResult, SubscriptionCloseParams,
};
use berth_store::CredentialKind;
use serde_json::json;

use super::Ctx;
use crate::error::{ApiError, ApiResult};

const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

#[tracing::instrument(skip_all)]
pub async fn hello(ctx: Ctx, p: HelloParams) -> ApiResult<HelloResult> {
    if !SUPPORTED_PROTOCOLS.contains(&p.protocol) {
        return Err(ApiError::with(
            ErrorCode::UnsupportedProtocol,
            json!({"supported": SUPPORTED_PROTOCOLS}),
        ));
    }
    let existing = ctx.conn.principal.lock().expect("conn lock").clone();
    let principal = match (p.token, existing) {
        (Some(t), _) => match ctx.state.authenticate(&t).await? {
            Some(p) if p.kind == CredentialKind::User => p,
            _ => {
                ctx.state.metrics.auth_failures.with_label_values(&["invalid"]).inc();
                return Err(ApiError::code(ErrorCode::Unauthorized));
            }
        },
        (None, Some(p)) => p,
        // Not a wrong credential but a malformed sign-in: the token is required here.
        (None, None) => {
            ctx.state.metrics.auth_failures.with_label_values(&["missing"]).inc();
            return Err(ApiError::with(ErrorCode::BadParams, json!({"field": "token"})));
        }
    };
    ctx.conn.sign_in(&ctx.state, principal.clone())?;
    let email = match &principal.user_id {
        Some(user) => ctx.state.store.user_email(&principal.tenant_id, user).await?,
        None => None,
    };
    let mut notices = Vec::new();
    if ctx.state.config.model.base_url.is_none() {
        notices.push(Notice {
            level: berth_protocol::NoticeLevel::Warning.as_str().into(),
            code: berth_protocol::NoticeCode::ProviderUnconfigured.as_str().into(),
            params: json!({}),
        });
    }
    Ok(HelloResult {
        protocol: PROTOCOL_VERSION,
        server_version: SERVER_VERSION.into(),
        replica_id: ctx.state.config.replica_id.clone(),
        tenant_id: principal.tenant_id,
        user_id: principal.user_id,
        email,
        role: principal.role,
        notices,
    })
}

pub async fn ping(_ctx: Ctx, _p: Empty) -> ApiResult<PingResult> {
    Ok(PingResult { pong: true })
}

pub async fn status(ctx: Ctx, p: StatusParams) -> ApiResult<StatusResult> {
    let model = if p.probe_model {
        // A probe is a request to the provider like a model call: it takes one of the
        // tenant's proxy slots (within its per-minute rate) or is refused.
        let _permit = crate::complete::admit(&ctx.state, &ctx.principal()?.tenant_id)?;
        Some(probe_model(&ctx.state).await)
    } else {
        None
    };
    Ok(StatusResult {
        server_version: SERVER_VERSION.into(),
        protocol: PROTOCOL_VERSION,
        replica_id: ctx.state.config.replica_id.clone(),
        model,
    })
}

/// How long the model probe waits for an answer.
const MODEL_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `GET <base URL>/models` of the default provider profile, without its key: does the
/// endpoint answer at all? Any HTTP status counts; what the endpoint said is not passed on.
async fn probe_model(state: &crate::AppState) -> ModelProbe {
    let model = state.config.model.model.clone();
    let providers = state.config.providers.current();
    let Some(profile) = providers.get(None) else {
        return ModelProbe {
            model,
            answered: false,
            http_status: None,
            error: Some(CauseCode::ProviderUnconfigured.to_string()),
        };
    };
    let url = format!("{}/models", profile.base_url.trim_end_matches('/'));
    let sent = tokio::time::timeout(MODEL_PROBE_TIMEOUT, state.provider_http.get(&url).send()).await;
    let (answered, http_status, error) = match sent {
        Ok(Ok(r)) => (true, Some(r.status().as_u16()), None),
        Ok(Err(e)) if e.is_timeout() => (false, None, Some(CauseCode::ProviderTimeout)),
        Err(_) => (false, None, Some(CauseCode::ProviderTimeout)),
        Ok(Err(_)) => (false, None, Some(CauseCode::ProviderUnreachable)),
    };
    ModelProbe {
        model,
        answered,
        http_status,
        error: error.map(|c| c.to_string()),
    }
}

/// End a subscription early; its original request is answered once its task has stopped
/// (the slot and its id stay taken until then).
pub async fn close(ctx: Ctx, p: SubscriptionCloseParams) -> ApiResult<Empty> {
    if ctx.conn.subs.lock().expect("conn lock").close(p.id) {
        Ok(Empty {})
    } else {
        Err(ApiError::code(ErrorCode::NotFound))
    }
}
