//! `session.pendingInteractions`, `session.interaction`, `session.respond`, and who watches
//! a session (a held interaction asked while nobody watches is answered by its fallback).

use std::{collections::HashSet, sync::Mutex};

use berth_protocol::{ErrorCode, Interaction, InteractionRef, InteractionResolution, SessionRef, SessionRespondParams};
use serde_json::json;

use super::Ctx;
use crate::{
    AppState,
    error::{ApiError, ApiResult},
};

#[tracing::instrument(skip_all, fields(session.id = %p.session_id))]
pub async fn pending(ctx: Ctx, p: SessionRef) -> ApiResult<Vec<Interaction>> {
    let me = ctx.principal()?;
    Ok(ctx
        .state
        .store
        .pending_interactions(&me.tenant_id, &p.session_id)
        .await?)
}

#[tracing::instrument(skip_all, fields(interaction.id = %p.interaction_id))]
pub async fn get(ctx: Ctx, p: InteractionRef) -> ApiResult<Interaction> {
    let me = ctx.principal()?;
    Ok(ctx.state.store.interaction(&me.tenant_id, &p.interaction_id).await?)
}

/// Answer once; a second answer, or one after expiry, is `interaction-closed` carrying the
/// recorded `state` and `outcome`.
#[tracing::instrument(skip_all, fields(interaction.id = %p.interaction_id))]
pub async fn respond(ctx: Ctx, p: SessionRespondParams) -> ApiResult<InteractionResolution> {
    let me = ctx.principal()?;
    let by = me.user_id.clone().unwrap_or(me.credential_id.clone());
    let r = ctx
        .state
        .store
        .respond_interaction(&me.tenant_id, &p.interaction_id, &p.answer, &by, ctx.op.as_ref())
        .await?;
    match r {
        Ok(done) => {
            tracing::info!("interaction answered");
            Ok(done)
        }
        Err(recorded) => Err(ApiError::with(
            ErrorCode::InteractionClosed,
            json!({"interactionId": recorded.interaction_id, "state": recorded.state, "outcome": recorded.outcome}),
        )),
    }
}

/// The session watches this replica holds, as recorded in PostgreSQL (`session_watchers`),
/// so that every replica can tell whether anyone watches a session. Only the ids listed here
/// are kept alive by the heartbeat: a row whose removal failed, or whose replica died,
/// stops counting once its heartbeat lapses.
#[derive(Default)]
pub struct Watchers {
    ids: Mutex<HashSet<String>>,
}

impl Watchers {
    /// The ids to keep alive.
    pub fn ids(&self) -> Vec<String> {
        self.ids.lock().expect("watchers lock").iter().cloned().collect()
    }
}

/// One open `session.watch`; removed when dropped.
pub struct Watcher {
    state: AppState,
    tenant_id: String,
    id: String,
}

impl Watcher {
    pub async fn register(state: &AppState, tenant_id: &str, session_id: &str) -> ApiResult<Watcher> {
        let id = state
            .store
            .watcher_add(tenant_id, session_id, &state.config.replica_id)
            .await?;
        state.watchers.ids.lock().expect("watchers lock").insert(id.clone());
        Ok(Watcher {
            state: state.clone(),
            tenant_id: tenant_id.to_string(),
            id,
        })
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.state.watchers.ids.lock().expect("watchers lock").remove(&self.id);
        let (state, tenant, id) = (
            self.state.clone(),
            std::mem::take(&mut self.tenant_id),
            std::mem::take(&mut self.id),
        );
        tokio::spawn(async move {
            if let Err(e) = state.store.watcher_remove(&tenant, &id).await {
                tracing::warn!(error = %e, "removing a session watcher failed; its heartbeat lapses instead");
            }
        });
    }
}
