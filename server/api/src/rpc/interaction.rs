//! `session.pendingInteractions`, `session.interaction`, `session.respond`, and who watches
//! a session (a held interaction asked while nobody watches is answered by its fallback).

use std::{collections::HashMap, sync::Mutex};

use berth_protocol::{ErrorCode, Interaction, InteractionRef, InteractionResolution, SessionRef, SessionRespondParams};
use berth_store::WatcherKey;
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
/// so that every replica can tell whether anyone watches a session, and whether an append
/// must `NOTIFY` another replica. Only the rows listed here are kept alive by the heartbeat
/// (and recorded again if they were swept while the watch stayed open): a row whose removal
/// failed, or whose replica died, stops counting once its heartbeat lapses.
#[derive(Default)]
pub struct Watchers {
    /// Session (and tenant) of each watcher id.
    ids: Mutex<HashMap<String, (String, String)>>,
}

impl Watchers {
    /// The rows to keep alive.
    pub fn keys(&self) -> Vec<WatcherKey> {
        let ids = self.ids.lock().expect("watchers lock");
        ids.iter()
            .map(|(id, (tenant_id, session_id))| WatcherKey {
                id: id.clone(),
                tenant_id: tenant_id.clone(),
                session_id: session_id.clone(),
            })
            .collect()
    }

    /// Whether this replica still holds the watch `id`.
    pub fn holds(&self, id: &str) -> bool {
        self.ids.lock().expect("watchers lock").contains_key(id)
    }
}

/// Keep this replica's watcher rows alive. A row recorded again (it had been swept) means
/// appends may have skipped their `NOTIFY` for its session: its watchers read again. A row
/// recorded again for a watch that ended meanwhile (its removal ran first) is removed.
pub async fn heartbeat(state: &AppState) -> berth_store::Result<()> {
    let restored = state
        .store
        .watchers_heartbeat(&state.config.replica_id, &state.watchers.keys())
        .await?;
    for w in restored {
        tracing::warn!(session.id = %w.session_id, "session watcher row was swept while the watch was open; recorded again");
        if state.watchers.holds(&w.id) {
            state.hub.event(&w.session_id, 0);
        } else {
            state.store.watcher_remove(&w.tenant_id, &w.id).await?;
        }
    }
    Ok(())
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
        state
            .watchers
            .ids
            .lock()
            .expect("watchers lock")
            .insert(id.clone(), (tenant_id.to_string(), session_id.to_string()));
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
        // A replica shutting down (a rollout) closes its clients' sockets, and they watch
        // again through another replica a moment later: their rows are left to lapse with
        // their heartbeat, so that a question asked meanwhile waits for them instead of
        // being settled at once as unwatched (an approval denied that nobody saw).
        if self.state.draining.is_cancelled() || self.state.shutdown.is_cancelled() {
            return;
        }
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
