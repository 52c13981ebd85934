//! `agent.*` and `session.setAgent`: the tenant's agent definitions (SPEC §4.16).

use berth_protocol::{
    Agent, AgentRef, AgentRemoveParams, AgentSaveParams, Empty, ErrorCode, MAX_AGENT_TOOLS, MAX_SYSTEM_PROMPT_BYTES,
    ModelParams, Removed, SessionSetAgentParams, SessionSnapshot,
};
use serde_json::json;

use super::{Ctx, admin::editor, session::choose_model};
use crate::error::{ApiError, ApiResult};

/// The longest agent name, in bytes.
const MAX_NAME_BYTES: usize = 100;
/// The longest description and tool name, in bytes.
const MAX_DESCRIPTION_BYTES: usize = 2000;
const MAX_TOOL_NAME_BYTES: usize = 200;

fn bad(field: &str) -> ApiError {
    ApiError::with(ErrorCode::BadParams, json!({"field": field}))
}

/// Check a definition; the model choice is checked against the configured profiles.
fn check(ctx: &Ctx, p: &mut AgentSaveParams) -> ApiResult<()> {
    p.name = p.name.trim().to_string();
    if p.name.is_empty() || p.name.len() > MAX_NAME_BYTES || p.name.contains('\0') {
        return Err(bad("name"));
    }
    if p.description.as_ref().is_some_and(|d| d.len() > MAX_DESCRIPTION_BYTES) {
        return Err(bad("description"));
    }
    if let Some(prompt) = &p.system_prompt
        && prompt.len() > MAX_SYSTEM_PROMPT_BYTES
    {
        return Err(ApiError::with(
            ErrorCode::PayloadTooLarge,
            json!({"limit": "systemPrompt", "max": MAX_SYSTEM_PROMPT_BYTES}),
        ));
    }
    if let Some(tools) = &p.tools {
        let bad_name = |t: &String| t.is_empty() || t.len() > MAX_TOOL_NAME_BYTES || t.contains('\0');
        if tools.len() > MAX_AGENT_TOOLS || tools.iter().any(bad_name) {
            return Err(bad("tools"));
        }
    }
    if let Some(ModelParams {
        temperature,
        top_p,
        max_tokens,
    }) = &p.params
    {
        if temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
            return Err(bad("params.temperature"));
        }
        if top_p.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
            return Err(bad("params.topP"));
        }
        if *max_tokens == Some(0) {
            return Err(bad("params.maxTokens"));
        }
    }
    p.model = choose_model(ctx, p.provider.as_deref(), p.model.take())?;
    Ok(())
}

#[tracing::instrument(skip_all)]
pub async fn list(ctx: Ctx, _p: Empty) -> ApiResult<Vec<Agent>> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.list_agents(&me.tenant_id).await?)
}

#[tracing::instrument(skip_all, fields(agent.id = %p.agent_id))]
pub async fn get(ctx: Ctx, p: AgentRef) -> ApiResult<Agent> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.get_agent(&me.tenant_id, &p.agent_id).await?)
}

#[tracing::instrument(skip_all)]
pub async fn save(ctx: Ctx, mut p: AgentSaveParams) -> ApiResult<Agent> {
    let me = ctx.principal()?;
    check(&ctx, &mut p)?;
    let agent = ctx
        .state
        .store
        .save_agent(&me.tenant_id, &p, &editor(&me), ctx.op.as_ref())
        .await
        .map_err(|e| match e.code() {
            ErrorCode::Conflict => ApiError::with(ErrorCode::Conflict, json!({"field": "name"})),
            ErrorCode::PayloadTooLarge => ApiError::with(
                ErrorCode::PayloadTooLarge,
                json!({"limit": "agents", "max": berth_protocol::MAX_AGENTS_PER_TENANT}),
            ),
            _ => e.into(),
        })?;
    tracing::info!(agent.id = %agent.agent_id, "agent saved");
    Ok(agent)
}

#[tracing::instrument(skip_all, fields(agent.id = %p.agent_id))]
pub async fn remove(ctx: Ctx, p: AgentRemoveParams) -> ApiResult<Removed> {
    let me = ctx.principal()?;
    Ok(ctx
        .state
        .store
        .remove_agent(&me.tenant_id, &p.agent_id, &editor(&me), ctx.op.as_ref())
        .await?)
}

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn set_agent(ctx: Ctx, p: SessionSetAgentParams) -> ApiResult<SessionSnapshot> {
    let me = ctx.principal()?;
    Ok(ctx
        .state
        .store
        .set_agent(
            &me.tenant_id,
            &p.session_id,
            p.agent.as_deref(),
            ctx.state.config.model.model.as_deref(),
            ctx.op.as_ref(),
        )
        .await?)
}
