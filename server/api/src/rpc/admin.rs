//! `admin.*`: tenant administration, for the tenant's admins only (members get `forbidden`).

use berth_protocol::{
    AdminAuditListParams, AdminCredentialCreateParams, AdminCredentialRevokeParams, AdminStatus, AdminUserCreateParams,
    AdminUserDisableParams, AdminUserSetRoleParams, AuditPage, CredentialView, Disabled, Empty, ErrorCode, Revoked,
    UserView, WorkerView,
};
use berth_store::{
    Principal,
    admin::{Actor, Editor},
};
use serde_json::json;

use super::Ctx;
use crate::error::{ApiError, ApiResult};

/// Who may change the shared definition `me` is saving or removing: the owner, or an admin.
pub(super) fn editor(me: &Principal) -> Editor<'_> {
    Editor {
        actor: actor(me),
        admin: me.role == "admin",
    }
}

pub(super) fn admin(ctx: &Ctx) -> ApiResult<Principal> {
    let me = ctx.principal()?;
    if me.role != "admin" {
        return Err(ApiError::code(ErrorCode::Forbidden));
    }
    Ok(me)
}

/// Who `me` is in the audit log: the user, else the credential.
pub(super) fn actor(me: &Principal) -> &str {
    me.user_id.as_deref().unwrap_or(&me.credential_id)
}

#[tracing::instrument(skip_all)]
pub async fn credential_create(ctx: Ctx, p: AdminCredentialCreateParams) -> ApiResult<CredentialView> {
    let me = admin(&ctx)?;
    if p.worker == p.user_id.is_some() {
        return Err(ApiError::with(ErrorCode::BadParams, json!({"field": "userId|worker"})));
    }
    let expires_at = match &p.expires_at {
        None => None,
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|_| ApiError::with(ErrorCode::BadParams, json!({"field": "expiresAt"})))?
                .with_timezone(&chrono::Utc),
        ),
    };
    if p.note.len() > 500 {
        return Err(ApiError::with(
            ErrorCode::BadParams,
            json!({"field": "note", "max": 500}),
        ));
    }
    let store = &ctx.state.store;
    let view = store
        .admin_create_credential(
            &me.tenant_id,
            p.user_id.as_deref(),
            &p.note,
            expires_at,
            Actor(actor(&me)),
            ctx.op.as_ref(),
        )
        .await?;
    tracing::info!(credential.id = %view.credential_id, kind = %view.kind, "credential created");
    Ok(view)
}

pub async fn credential_list(ctx: Ctx, _p: Empty) -> ApiResult<Vec<CredentialView>> {
    let me = admin(&ctx)?;
    Ok(ctx.state.store.admin_list_credentials(&me.tenant_id).await?)
}

#[tracing::instrument(skip_all, fields(credential.id = %p.credential_id))]
pub async fn credential_revoke(ctx: Ctx, p: AdminCredentialRevokeParams) -> ApiResult<Revoked> {
    let me = admin(&ctx)?;
    let store = &ctx.state.store;
    let r = store
        .admin_revoke_credential(&me.tenant_id, &p.credential_id, Actor(actor(&me)), ctx.op.as_ref())
        .await?;
    tracing::info!("credential revoked");
    Ok(r)
}

#[tracing::instrument(skip_all)]
pub async fn user_create(ctx: Ctx, p: AdminUserCreateParams) -> ApiResult<UserView> {
    let me = admin(&ctx)?;
    let email = p.email.trim().to_string();
    if email.is_empty() || email.len() > 320 || !email.contains('@') {
        return Err(ApiError::with(ErrorCode::BadParams, json!({"field": "email"})));
    }
    let role = p.role.unwrap_or_else(|| "member".into());
    if role != "admin" && role != "member" {
        return Err(ApiError::with(ErrorCode::BadParams, json!({"field": "role"})));
    }
    let hash = match p.password {
        Some(pw) if pw.chars().count() < 12 || pw.len() > 1024 => {
            return Err(ApiError::with(
                ErrorCode::BadParams,
                json!({"field": "password", "minChars": 12}),
            ));
        }
        Some(pw) => Some(
            tokio::task::spawn_blocking(move || crate::auth::hash_password(&pw))
                .await
                .map_err(|_| ApiError::code(ErrorCode::Internal))?,
        ),
        None => None,
    };
    let store = &ctx.state.store;
    let user = store
        .admin_create_user(
            &me.tenant_id,
            &email,
            &role,
            hash.as_deref(),
            Actor(actor(&me)),
            ctx.op.as_ref(),
        )
        .await?;
    tracing::info!(user.id = %user.user_id, "user created");
    Ok(user)
}

pub async fn user_list(ctx: Ctx, _p: Empty) -> ApiResult<Vec<UserView>> {
    let me = admin(&ctx)?;
    Ok(ctx.state.store.admin_list_users(&me.tenant_id).await?)
}

/// The store's `conflict` for a change that would leave the tenant without an enabled admin.
fn last_admin(e: berth_store::StoreError) -> ApiError {
    match e.code() {
        ErrorCode::Conflict => ApiError::with(ErrorCode::Conflict, json!({"reason": "last-admin"})),
        _ => e.into(),
    }
}

#[tracing::instrument(skip_all, fields(user.id = %p.user_id))]
pub async fn user_disable(ctx: Ctx, p: AdminUserDisableParams) -> ApiResult<Disabled> {
    let me = admin(&ctx)?;
    let store = &ctx.state.store;
    let r = store
        .admin_disable_user(&me.tenant_id, &p.user_id, Actor(actor(&me)), ctx.op.as_ref())
        .await
        .map_err(last_admin)?;
    tracing::info!("user disabled");
    Ok(r)
}

pub async fn status(ctx: Ctx, _p: Empty) -> ApiResult<AdminStatus> {
    let me = admin(&ctx)?;
    Ok(ctx
        .state
        .store
        .admin_status(&me.tenant_id, &ctx.state.config.replica_id)
        .await?)
}

#[tracing::instrument(skip_all, fields(user.id = %p.user_id))]
pub async fn user_set_role(ctx: Ctx, p: AdminUserSetRoleParams) -> ApiResult<UserView> {
    let me = admin(&ctx)?;
    if p.role != "admin" && p.role != "member" {
        return Err(ApiError::with(ErrorCode::BadParams, json!({"field": "role"})));
    }
    let store = &ctx.state.store;
    let view = store
        .admin_set_role(&me.tenant_id, &p.user_id, &p.role, Actor(actor(&me)), ctx.op.as_ref())
        .await
        .map_err(last_admin)?;
    tracing::info!(role = %view.role, "user role set");
    Ok(view)
}

pub async fn audit_list(ctx: Ctx, p: AdminAuditListParams) -> ApiResult<AuditPage> {
    let me = admin(&ctx)?;
    let limit = p.limit.unwrap_or(200);
    if limit == 0 || limit > 200 {
        return Err(ApiError::with(
            ErrorCode::BadParams,
            json!({"field": "limit", "max": 200}),
        ));
    }
    Ok(ctx.state.store.admin_audit(&me.tenant_id, p.before, limit).await?)
}

pub async fn worker_list(ctx: Ctx, _p: Empty) -> ApiResult<Vec<WorkerView>> {
    let me = admin(&ctx)?;
    Ok(ctx.state.store.admin_workers(&me.tenant_id).await?)
}
