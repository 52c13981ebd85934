//! Turn hand-out: claim the workspaces' dispatched turns and send `turn.run`.

use axum::extract::ws::{Message, WebSocket};
use berth_protocol::{jsonrpc::Request, worker as wp};
use futures_util::SinkExt;
use serde_json::json;

use super::{LiveTurn, WorkerConn, text_msg};

impl WorkerConn {
    pub(super) async fn claim(
        &mut self,
        workspaces: &[String],
        sink: &mut futures_util::stream::SplitSink<WebSocket, Message>,
    ) -> anyhow::Result<()> {
        let claimed = self
            .state
            .store
            .claim_turns(&self.connection_id, &self.principal.tenant_id, workspaces)
            .await?;
        for c in claimed {
            tracing::info!(turn.id = %c.run.turn_id, session.id = %c.run.session_id, "turn handed to worker");
            let live = LiveTurn {
                session: c.run.session_id.clone(),
                started: std::time::Instant::now(),
                step: 0,
                text: 0,
                thinking: 0,
            };
            self.turns.insert(c.run.turn_id.clone(), live);
            self.relay_now(
                &c.run.session_id,
                json!({"type": "phase", "phase": "running", "turnId": c.run.turn_id}),
            )
            .await;
            let mut run = c.run;
            if run.model.is_none() {
                run.model = self.state.config.model.model.clone();
            }
            sink.send(text_msg(&Request::notification(
                wp::TURN_RUN,
                serde_json::to_value(run)?,
            )))
            .await?;
        }
        Ok(())
    }
}
