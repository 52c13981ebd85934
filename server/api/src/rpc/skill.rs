//! `skill.*`: the tenant's skills, and a workspace's (answered by its worker) (SPEC §4.16).

use berth_protocol::{
    ErrorCode, MAX_SKILL_BYTES, MAX_SKILL_SUMMARY_BYTES, Method, Removed, Skill, SkillInfo, SkillListParams,
    SkillListResult, SkillRef, SkillRemoveParams, SkillSaveParams, is_skill_name, method,
};
use serde_json::json;

use super::{Ctx, admin::editor};
use crate::{
    error::{ApiError, ApiResult},
    workers::calls,
};

/// The workspace's skills come first; a tenant skill of the same name is listed too (the
/// model is offered the workspace's).
#[tracing::instrument(skip_all)]
pub async fn list(ctx: Ctx, p: SkillListParams) -> ApiResult<SkillListResult> {
    let me = ctx.principal()?;
    let store = &ctx.state.store;
    let workspace = match (&p.workspace_id, &p.session_id) {
        (Some(w), _) => {
            store.get_workspace(&me.tenant_id, w).await?;
            Some(w.clone())
        }
        (None, Some(s)) => Some(store.get_session(&me.tenant_id, s, None).await?.workspace_id),
        (None, None) => None,
    };
    let mut skills = Vec::new();
    let mut workspace_error = None;
    if let Some(w) = workspace {
        let asked = calls::unary::<Vec<SkillInfo>>(
            &ctx.state,
            &me.tenant_id,
            calls::To::Workspace(&w),
            method::SkillList::NAME,
            json!({}),
        )
        .await;
        match asked {
            Ok(found) => skills = found,
            // The tenant's skills are still worth listing without the worker.
            Err(e) => {
                workspace_error = Some(serde_json::from_value(json!(e.data_code())).unwrap_or(ErrorCode::Unavailable));
            }
        }
    }
    skills.extend(store.list_skills(&me.tenant_id).await?);
    Ok(SkillListResult {
        skills,
        workspace_error,
    })
}

#[tracing::instrument(skip_all, fields(skill.id = %p.skill_id))]
pub async fn get(ctx: Ctx, p: SkillRef) -> ApiResult<Skill> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.get_skill(&me.tenant_id, &p.skill_id).await?)
}

#[tracing::instrument(skip_all)]
pub async fn save(ctx: Ctx, mut p: SkillSaveParams) -> ApiResult<Skill> {
    let me = ctx.principal()?;
    let bad = |field: &str| ApiError::with(ErrorCode::BadParams, json!({"field": field}));
    if !is_skill_name(&p.name) {
        return Err(bad("name"));
    }
    p.summary = p.summary.trim().to_string();
    if p.summary.is_empty() || p.summary.len() > MAX_SKILL_SUMMARY_BYTES || p.summary.contains('\0') {
        return Err(bad("summary"));
    }
    if p.body.len() > MAX_SKILL_BYTES {
        return Err(ApiError::with(
            ErrorCode::PayloadTooLarge,
            json!({"limit": "skill", "max": MAX_SKILL_BYTES}),
        ));
    }
    if p.body.contains('\0') {
        return Err(bad("body"));
    }
    ctx.state
        .store
        .save_skill(&me.tenant_id, &p, &editor(&me), ctx.op.as_ref())
        .await
        .map_err(|e| match e.code() {
            ErrorCode::Conflict => ApiError::with(ErrorCode::Conflict, json!({"field": "name"})),
            _ => e.into(),
        })
}

#[tracing::instrument(skip_all, fields(skill.id = %p.skill_id))]
pub async fn remove(ctx: Ctx, p: SkillRemoveParams) -> ApiResult<Removed> {
    let me = ctx.principal()?;
    Ok(ctx
        .state
        .store
        .remove_skill(&me.tenant_id, &p.skill_id, &editor(&me), ctx.op.as_ref())
        .await?)
}
