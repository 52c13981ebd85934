//! Persisting what a worker streams back: completed steps (`turn.step`) and ends
//! (`turn.end`).

use berth_protocol::{
    ErrorCode,
    worker::{TurnEnd, TurnStep},
};
use berth_store::StoreError;
use serde_json::json;

use super::turn::TurnTask;
use crate::error::ApiError;

impl TurnTask {
    /// `turn.step`: append the completed step as one `model.completed` event (its usage is
    /// what the model proxy metered, not the worker's report: handed over by this replica's
    /// proxy, or stored by another's).
    pub(super) async fn step(&mut self, step: TurnStep) -> Result<serde_json::Value, ApiError> {
        // The output not yet relayed goes to other replicas in the step's transaction, before
        // its event (the stored partial text is cleared there anyway): one transaction less.
        self.flushed().await;
        let relay = self.take_relay().map(|(_, payloads)| payloads).unwrap_or_default();
        let metered = self.usage.take();
        let conn = self.conn.clone();
        let (append, r) = {
            let _permits = conn.write_permits().await;
            // Local watchers get the event as written, without reading it back (their
            // wake-ups wait for it from here, so not while waiting for a permit).
            let append = conn.state.hub.appending(&self.live.session);
            let r = conn
                .state
                .store
                .append_step(
                    &conn.connection_id,
                    &conn.principal.tenant_id,
                    &self.turn_id,
                    &step.rows,
                    &metered,
                    &relay,
                    // Local watchers are woken below: the NOTIFY is for other replicas' only.
                    Some(&conn.state.config.replica_id),
                    append.is_some(),
                )
                .await;
            (append, r)
        };
        conn.state.hub.end_step(&self.live.session);
        self.live.step += 1;
        self.live.text = 0;
        self.live.thinking = 0;
        // Local watchers wake now, not when this replica hears its own NOTIFY back.
        let seq = conn
            .state
            .hub
            .written(append, &self.live.session, r)
            .inspect_err(|_| self.usage.restore(metered))?;
        conn.state.metrics.events_appended.inc();
        Ok(json!({"sequence": seq}))
    }

    /// `turn.end`: settle the turn (`turn.ended`), with its last step first when the end
    /// carries one (one transaction), tell watchers it went idle, and let the turn go (its
    /// queue closes; the task ends).
    pub(super) async fn end(&mut self, end: TurnEnd) -> Result<serde_json::Value, ApiError> {
        // The output not yet relayed goes to other replicas with the end, in its transaction
        // (the stored partial text is cleared there anyway): one transaction less on the
        // turn's critical path, and the deltas still arrive before `turn.ended`.
        self.flushed().await;
        let mut relay = self.take_relay().map(|(_, payloads)| payloads).unwrap_or_default();
        // So is the idle phase, last: committed with the end, or not at all.
        let idle = json!({"type": "phase", "phase": "idle", "turnId": self.turn_id});
        relay.push(self.relayed(idle.clone()));
        let conn = self.conn.clone();
        let mut metered = self.usage.take();
        // Usage metered without a step to carry it (a call whose answer is not stored) goes in
        // first, so that `turn.ended` counts it.
        if end.step.is_none()
            && let Err((left, e)) = self.meter_in_database(std::mem::take(&mut metered)).await
        {
            self.usage.restore(left);
            return Err(e.into());
        }
        let (append, r) = {
            let _permits = conn.write_permits().await;
            let append = conn.state.hub.appending(&self.live.session);
            let r = conn
                .state
                .store
                .end_turn_with_step(
                    Some(&conn.connection_id),
                    &conn.principal.tenant_id,
                    &self.turn_id,
                    end.step.as_deref().map(|rows| (rows, metered.as_slice())),
                    end.state,
                    end.cause.as_ref(),
                    &relay,
                    Some(&conn.state.config.replica_id),
                    append.is_some(),
                )
                .await;
            (append, r)
        };
        // Not stored with the step: kept for a retried end, or metered when the task ends.
        if r.is_err() && end.step.is_some() {
            self.usage.restore(metered);
        }
        let r = match r {
            Ok(ended) => Ok(ended),
            // Already stopped, swept or handed elsewhere: the turn leaves this connection.
            Err(e @ StoreError::Code(ErrorCode::TurnNotRunning | ErrorCode::NotFound)) => Err(e),
            // Not settled (a database error, or an end refused as malformed): the turn still
            // runs here, and the worker's next `turn.end` must still reach this task (nor may
            // the connection's claimer take it for a turn never sent out).
            Err(e) => {
                conn.state.hub.failed(append, &self.live.session, &e);
                return Err(e.into());
            }
        };
        // The end's own NOTIFY wakes a claim only for the session's next queued turn; a slot
        // freed on a full connection is this replica's to hand out.
        conn.release_turn(&self.turn_id);
        let metrics = &conn.state.metrics;
        metrics.turn_duration.observe(self.live.started.elapsed().as_secs_f64());
        conn.state.hub.end_step(&self.live.session);
        let berth_store::Ended {
            session_id,
            sequence: seq,
            events,
            untitled,
        } = match r {
            Ok(ended) => ended,
            Err(e) => {
                // Not settled here (already stopped or swept): the idle phase goes out alone.
                self.relay_now(idle).await;
                return Err(e.into());
            }
        };
        // The end's events first, then the idle phase (watchers deliver idle after them).
        conn.state.hub.committed(append, &session_id, events, seq);
        conn.state.hub.live(&self.live.session, idle);
        // A titled session's turns skip the title's claim (a transaction each).
        if end.state == berth_protocol::TurnState::Completed && untitled {
            crate::titles::spawn(conn.state.clone(), conn.principal.tenant_id.clone(), session_id);
        }
        metrics.events_appended.inc_by(if end.step.is_some() { 2 } else { 1 });
        metrics.turns.with_label_values(&[end.state.as_str()]).inc();
        tracing::info!(turn.id = %end.turn_id, state = end.state.as_str(), "turn settled");
        Ok(json!({"sequence": seq}))
    }
}
