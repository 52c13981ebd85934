//! `mcp.*`: the tenant's MCP servers (SPEC §4.16). Everyone lists them (names, no secret
//! values); admins save and remove them (audited). Header and environment values are never
//! logged.

use axum::http::{HeaderName, HeaderValue};
use berth_protocol::{
    ErrorCode, MAX_MCP_ENTRIES, MAX_MCP_SERVERS, MAX_MCP_VALUE_BYTES, McpRemoveParams, McpSaveParams, McpServer,
    McpTransport, Removed, is_mcp_server_name,
};
use berth_store::admin::Actor;
use serde_json::json;

use super::{Ctx, admin::admin};
use crate::error::{ApiError, ApiResult};

pub async fn list(ctx: Ctx, _p: berth_protocol::Empty) -> ApiResult<Vec<McpServer>> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.list_mcp_servers(&me.tenant_id).await?)
}

#[tracing::instrument(skip_all, fields(mcp.server = %p.name))]
pub async fn save(ctx: Ctx, p: McpSaveParams) -> ApiResult<McpServer> {
    let me = admin(&ctx)?;
    if !is_mcp_server_name(&p.name) {
        return Err(ApiError::with(ErrorCode::BadParams, json!({"field": "name"})));
    }
    check(&p.transport).map_err(|(field, max)| {
        let mut fields = json!({"field": field});
        if let Some(max) = max {
            fields["max"] = json!(max);
        }
        ApiError::with(ErrorCode::BadParams, fields)
    })?;
    let actor = me.user_id.as_deref().unwrap_or(&me.credential_id);
    let server = ctx
        .state
        .store
        .save_mcp_server(
            &me.tenant_id,
            &p.name,
            &p.transport,
            p.enabled.unwrap_or(true),
            Actor(actor),
            ctx.op.as_ref(),
        )
        .await
        .map_err(|e| match e.code() {
            ErrorCode::BadParams => ApiError::with(
                ErrorCode::BadParams,
                json!({"field": "name", "limit": "servers", "max": MAX_MCP_SERVERS}),
            ),
            _ => e.into(),
        })?;
    tracing::info!(enabled = server.enabled, "MCP server saved");
    Ok(server)
}

#[tracing::instrument(skip_all, fields(mcp.server = %p.name))]
pub async fn remove(ctx: Ctx, p: McpRemoveParams) -> ApiResult<Removed> {
    let me = admin(&ctx)?;
    let actor = me.user_id.as_deref().unwrap_or(&me.credential_id);
    let r = ctx
        .state
        .store
        .remove_mcp_server(&me.tenant_id, &p.name, Actor(actor), ctx.op.as_ref())
        .await?;
    tracing::info!(removed = r.removed, "MCP server removed");
    Ok(r)
}

/// The field a definition is refused for, and the bound it passes when that is the reason.
fn check(t: &McpTransport) -> Result<(), (&'static str, Option<usize>)> {
    let plain = |s: &str| !s.is_empty() && s.len() <= MAX_MCP_VALUE_BYTES && !s.contains('\0');
    let bounded = |n: usize, field| {
        if n > MAX_MCP_ENTRIES {
            Err((field, Some(MAX_MCP_ENTRIES)))
        } else {
            Ok(())
        }
    };
    match t {
        McpTransport::Stdio(s) => {
            if !plain(&s.command) {
                return Err(("transport.command", None));
            }
            bounded(s.args.len(), "transport.args")?;
            // An argument may be empty, not unbounded.
            if s.args.iter().any(|a| a.len() > MAX_MCP_VALUE_BYTES || a.contains('\0')) {
                return Err(("transport.args", None));
            }
            bounded(s.env.len(), "transport.env")?;
            let env_name = |k: &str| {
                k.len() <= 256
                    && k.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                    && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            };
            if s.env
                .iter()
                .any(|(k, v)| !env_name(k) || v.len() > MAX_MCP_VALUE_BYTES || v.contains('\0'))
            {
                return Err(("transport.env", None));
            }
        }
        McpTransport::Http(h) => {
            let url_ok = plain(&h.url)
                && reqwest::Url::parse(&h.url).is_ok_and(|u| {
                    matches!(u.scheme(), "http" | "https")
                        && u.host().is_some()
                        // Credentials belong in headers, which are never listed.
                        && u.username().is_empty()
                        && u.password().is_none()
                });
            if !url_ok {
                return Err(("transport.url", None));
            }
            bounded(h.headers.len(), "transport.headers")?;
            if h.headers.iter().any(|(k, v)| {
                HeaderName::from_bytes(k.as_bytes()).is_err()
                    || v.len() > MAX_MCP_VALUE_BYTES
                    || HeaderValue::from_str(v).is_err()
            }) {
                return Err(("transport.headers", None));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn checked(v: Value) -> Result<(), (&'static str, Option<usize>)> {
        check(&serde_json::from_value(v).unwrap())
    }

    #[test]
    fn definitions_are_checked_field_by_field() {
        assert_eq!(
            checked(json!({"kind": "stdio", "command": "srv", "args": ["-x", ""], "env": {"TOKEN": "t"}})),
            Ok(())
        );
        assert_eq!(
            checked(json!({"kind": "http", "url": "https://mcp.example/x", "headers": {"Authorization": "Bearer t"}})),
            Ok(())
        );
        assert_eq!(
            checked(json!({"kind": "stdio", "command": ""})),
            Err(("transport.command", None))
        );
        assert_eq!(
            checked(json!({"kind": "stdio", "command": "srv", "env": {"1X": "v"}})),
            Err(("transport.env", None))
        );
        let many: Vec<String> = (0..=MAX_MCP_ENTRIES).map(|i| i.to_string()).collect();
        assert_eq!(
            checked(json!({"kind": "stdio", "command": "srv", "args": many})),
            Err(("transport.args", Some(MAX_MCP_ENTRIES)))
        );
        for url in [
            "file:///etc/passwd",
            "ftp://x/",
            "https://user:pw@mcp.example/",
            "not a url",
        ] {
            assert_eq!(
                checked(json!({"kind": "http", "url": url})),
                Err(("transport.url", None)),
                "{url}"
            );
        }
        assert_eq!(
            checked(json!({"kind": "http", "url": "http://x/", "headers": {"a b": "v"}})),
            Err(("transport.headers", None))
        );
        assert_eq!(
            checked(json!({"kind": "http", "url": "http://x/", "headers": {"x": "a\r\nb"}})),
            Err(("transport.headers", None))
        );
    }
}
