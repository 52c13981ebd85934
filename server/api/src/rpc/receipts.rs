//! Operation receipts around mutations: the same `operationId` with the same params returns
//! the original outcome without doing the work again; with other params it is
//! `operation-conflict`; while the first attempt runs it is `operation-in-progress`.

use berth_protocol::{ErrorCode, Method, OperationReceiptParams, ReceiptView, RpcError};
use berth_store::Begin;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::Ctx;
use crate::error::{ApiError, ApiResult};

/// Methods that take an `operationId`.
const MUTATIONS: &[&str] = &[
    "session.create",
    "session.send",
    "session.stop",
    "session.remove",
    "session.clear",
    "session.rename",
    "session.setModel",
    "session.setAgent",
    "session.compact",
    "session.pause",
    "session.respond",
    "session.fork",
    "queue.update",
    "queue.move",
    "queue.remove",
    "workspace.rename",
    "workspace.remove",
    "patch.snapshot",
    "admin.credential.create",
    "admin.credential.revoke",
    "admin.user.create",
    "admin.user.disable",
    "admin.user.setRole",
    "agent.save",
    "agent.remove",
    "skill.save",
    "skill.remove",
    "mcp.save",
    "mcp.remove",
];

pub fn is_mutation(method: &str) -> bool {
    MUTATIONS.contains(&method)
}

/// Who a receipt belongs to: the user, or the credential for non-user principals.
fn principal_key(ctx: &Ctx) -> ApiResult<(String, String)> {
    let me = ctx.principal()?;
    Ok((me.tenant_id, me.user_id.unwrap_or(me.credential_id)))
}

pub async fn with_receipt<M, F, Fut>(ctx: &Ctx, params: Value, operation_id: String, f: F) -> ApiResult<Value>
where
    M: Method,
    F: FnOnce(Ctx, M::Params) -> Fut,
    Fut: std::future::Future<Output = ApiResult<M::Result>>,
{
    if operation_id.is_empty() || operation_id.len() > 200 {
        return Err(ApiError::with(
            ErrorCode::BadParams,
            serde_json::json!({"field": "operationId"}),
        ));
    }
    let (tenant, principal) = principal_key(ctx)?;
    // Params that do not decode are no operation: answered without a receipt.
    let typed = super::decode::<M>(params)?;
    // The operation's identity is what the method understood: the decoded params written
    // back out, so that `null` and absent, unknown fields and key order make no difference.
    let decoded = serde_json::to_value(&typed).map_err(|_| ApiError::code(ErrorCode::Internal))?;
    let hash = operation_digest(decoded);
    let store = &ctx.state.store;
    match store
        .receipt_begin(&tenant, &principal, &operation_id, M::NAME, &hash)
        .await?
    {
        Begin::Replay { error: Some(e), .. } => Err(ApiError(
            serde_json::from_value::<RpcError>(e).unwrap_or_else(|_| RpcError::new(ErrorCode::Internal)),
        )),
        Begin::Replay { result, error: None } => Ok(result.unwrap_or(Value::Null)),
        Begin::Proceed(receipt) => {
            let mut owned = ctx.clone();
            owned.op = Some(receipt.clone());
            let out = match f(owned, typed).await {
                Ok(result) => serde_json::to_value(result).map_err(|_| ApiError::code(ErrorCode::Internal)),
                Err(e) => Err(e),
            };
            if let Err(e) = &out {
                let recorded = match e.data_code() {
                    // Not an outcome: let a retry do the work (a refusal at a rate or
                    // concurrency limit too, or its retry would replay the refusal; and a
                    // state that passes: the workspace offline, a turn still running).
                    "internal"
                    | "unavailable"
                    | "operation-in-progress"
                    | "rate-limited"
                    | "workspace-offline"
                    | "turn-busy" => store.receipt_abandon(&receipt).await,
                    _ => {
                        store
                            .receipt_fail(&receipt, &serde_json::to_value(&e.0).unwrap_or_default())
                            .await
                    }
                };
                if let Err(err) = recorded {
                    tracing::warn!(error = %err, "recording the operation's outcome failed");
                }
            }
            out
        }
    }
}

/// The caller's stored receipt for `operation_id`, if any.
pub async fn lookup(ctx: &Ctx, operation_id: &str) -> ApiResult<Option<ReceiptView>> {
    let (tenant, principal) = principal_key(ctx)?;
    Ok(ctx.state.store.receipt_get(&tenant, &principal, operation_id).await?)
}

/// `operation.receipt`: the stored outcome, or null.
pub async fn receipt(ctx: Ctx, p: OperationReceiptParams) -> ApiResult<Option<ReceiptView>> {
    lookup(&ctx, &p.operation_id).await
}

/// The stored digest of an operation's decoded params: without its operation id, and
/// without secrets (a password, an MCP server's env and header values — only their names
/// count), of which not even a digest is kept: a low-entropy secret could be found from it.
fn operation_digest(mut params: Value) -> String {
    if let Some(obj) = params.as_object_mut() {
        obj.remove("operationId");
        obj.remove("password");
        if let Some(transport) = obj.get_mut("transport").and_then(Value::as_object_mut) {
            for secrets in ["env", "headers"] {
                if let Some(map) = transport.get_mut(secrets).and_then(Value::as_object_mut) {
                    map.values_mut().for_each(|v| *v = Value::Null);
                }
            }
        }
    }
    // serde_json's map is ordered by key, so this is a canonical form.
    Sha256::digest(params.to_string().as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::operation_digest;

    #[test]
    fn operation_digests_keep_no_secret() {
        let save = |header: &str, env: &str| {
            operation_digest(json!({
                "name": "tools",
                "operationId": "op-1",
                "transport": {"kind": "http", "url": "https://mcp.example", "headers": {"Authorization": header}, "env": {"TOKEN": env}},
            }))
        };
        assert_eq!(
            save("Bearer a", "x"),
            save("Bearer b", "y"),
            "secret values do not count"
        );
        let renamed = operation_digest(json!({
            "name": "tools",
            "transport": {"kind": "http", "url": "https://mcp.example", "headers": {"X-Key": "Bearer a"}, "env": {"TOKEN": "x"}},
        }));
        assert_ne!(save("Bearer a", "x"), renamed, "their names do");
        assert_eq!(
            operation_digest(json!({"email": "a@example.com", "password": "one"})),
            operation_digest(json!({"email": "a@example.com", "password": "two"})),
        );
        assert_ne!(
            operation_digest(json!({"email": "a@example.com"})),
            operation_digest(json!({"email": "b@example.com"})),
        );
    }
}
