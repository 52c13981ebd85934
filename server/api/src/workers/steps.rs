//! Persisting what a worker streams back: completed steps (`turn.step`) and ends
//! (`turn.end`).

use berth_protocol::worker::{TurnEnd, TurnStep};
use serde_json::json;

use super::WorkerConn;
use crate::error::ApiError;

impl WorkerConn {
    /// `turn.step`: append the completed step as one `model.completed` event.
    pub(super) async fn step(&mut self, step: TurnStep) -> Result<serde_json::Value, ApiError> {
        let tenant = self.principal.tenant_id.clone();
        let state = self.state.clone();
        let store = &state.store;
        self.flush_relay().await;
        let conn = &self.connection_id;
        let r = store
            .append_step(conn, &tenant, &step.turn_id, &step.rows, step.usage)
            .await;
        if let Some(live) = self.turns.get_mut(&step.turn_id) {
            self.state.hub.end_step(&live.session);
            live.step += 1;
            live.text = 0;
            live.thinking = 0;
        }
        if let (Ok(_), Some(u)) = (&r, step.usage) {
            let model = self.state.config.model.model.clone().unwrap_or_default();
            let m = &self.state.metrics.model_tokens;
            m.with_label_values(&["default", &model, "input"])
                .inc_by(u.input_tokens);
            m.with_label_values(&["default", &model, "output"])
                .inc_by(u.output_tokens);
        }
        r.map(|seq| {
            self.state.metrics.events_appended.inc();
            json!({"sequence": seq})
        })
        .map_err(ApiError::from)
    }

    /// `turn.end`: settle the turn (`turn.ended`) and tell watchers it went idle.
    pub(super) async fn end(&mut self, end: TurnEnd) -> Result<serde_json::Value, ApiError> {
        let tenant = self.principal.tenant_id.clone();
        let state = self.state.clone();
        let store = &state.store;
        self.flush_relay().await;
        let r = store
            .end_turn(
                Some(&self.connection_id),
                &tenant,
                &end.turn_id,
                end.state,
                end.cause.as_ref(),
            )
            .await;
        if let Some(live) = self.turns.remove(&end.turn_id) {
            self.state
                .metrics
                .turn_duration
                .observe(live.started.elapsed().as_secs_f64());
            self.state.hub.end_step(&live.session);
            let idle = json!({"type": "phase", "phase": "idle", "turnId": end.turn_id});
            self.relay_now(&live.session, idle).await;
        }
        r.map(|(_, seq)| {
            self.state.metrics.events_appended.inc();
            self.state.metrics.turns.with_label_values(&[end.state.as_str()]).inc();
            tracing::info!(turn.id = %end.turn_id, state = end.state.as_str(), "turn settled");
            json!({"sequence": seq})
        })
        .map_err(ApiError::from)
    }
}
