//! Live output: deltas relayed to local watchers at once and, coalesced, to the other
//! replicas (and stored as the step's partial text).

use berth_protocol::worker::TurnDelta;
use berth_store::CHANNEL_DELTAS;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::turn::TurnTask;

/// A live item relayed to the other replicas' watchers.
#[derive(Debug, Serialize, Deserialize)]
pub struct RelayedDelta {
    pub replica: String,
    pub session: String,
    pub item: serde_json::Value,
}

/// NOTIFY payloads must stay under 8000 bytes, after JSON escaping (up to 6 bytes per
/// input byte for control characters) and the envelope.
const RELAY_TEXT_MAX: usize = 1200;

/// Coalesced output not yet relayed.
pub(super) struct Pending {
    /// When it is stored and relayed unless a step or the end takes it first.
    pub due: tokio::time::Instant,
    step: i32,
    text_offset: u64,
    text: String,
    thinking_offset: u64,
    thinking: String,
}

impl TurnTask {
    pub(super) fn delta(&mut self, d: TurnDelta) {
        let live = &mut self.live;
        let text = d.text.unwrap_or_default();
        let thinking = d.thinking.unwrap_or_default();
        if text.is_empty() && thinking.is_empty() {
            return;
        }
        let item = json!({
            "type": "model.delta", "turnId": self.turn_id, "step": live.step,
            "text": text, "textOffset": live.text, "thinking": thinking, "thinkingOffset": live.thinking,
        });
        let pending = self.pending.get_or_insert_with(|| Pending {
            due: tokio::time::Instant::now() + super::turn::FLUSH_EVERY,
            step: live.step,
            text_offset: live.text,
            text: String::new(),
            thinking_offset: live.thinking,
            thinking: String::new(),
        });
        pending.text.push_str(&text);
        pending.thinking.push_str(&thinking);
        live.text += text.len() as u64;
        live.thinking += thinking.len() as u64;
        self.conn
            .state
            .hub
            .local_delta(&live.session, &self.turn_id, live.step, &text, &thinking, item);
        if tracing::enabled!(tracing::Level::TRACE) {
            let now = std::time::SystemTime::now();
            super::connection::trace_delta("turn.delta relayed", &self.turn_id, &text, &thinking, now);
        }
    }

    /// Store coalesced output as the step's partial text and relay it to other replicas
    /// that watch the session, in one transaction (live only; the completed step is what
    /// history keeps), in a task of its own ([`TurnTask::flushing`]).
    pub(super) fn flush_relay(&mut self) {
        let Some((p, payloads)) = self.take_relay() else { return };
        let (conn, turn_id) = (self.conn.clone(), self.turn_id.clone());
        self.flushing = Some(tokio::spawn(async move {
            let state = &conn.state;
            let _permits = conn.write_permits().await;
            if let Err(e) = state
                .store
                .append_partial(
                    &conn.principal.tenant_id,
                    &turn_id,
                    &p.text,
                    &p.thinking,
                    &payloads,
                    // Local watchers got the deltas already: the relay is for other replicas' only.
                    Some(&state.config.replica_id),
                )
                .await
            {
                tracing::warn!(error = %e, "relaying live deltas failed");
            }
        }));
    }

    /// Wait for the relay write in flight, if any: what follows it (more relayed output, a
    /// step, the end) is stored after it. Cancel-safe: the write stays tracked until it is
    /// done (the turn's loop waits for it among other things).
    pub(super) async fn flushed(&mut self) {
        if let Some(f) = self.flushing.as_mut() {
            let _ = f.await;
            self.flushing = None;
        }
    }

    /// The coalesced output not yet relayed, and its `NOTIFY` payloads for other replicas.
    pub(super) fn take_relay(&mut self) -> Option<(Pending, Vec<String>)> {
        let p = self.pending.take()?;
        let state = &self.conn.state;
        let mut payloads = Vec::new();
        for (field, offset_field, value, mut offset) in [
            ("text", "textOffset", &p.text, p.text_offset),
            ("thinking", "thinkingOffset", &p.thinking, p.thinking_offset),
        ] {
            for piece in berth_protocol::text::chunks(value, RELAY_TEXT_MAX) {
                let item = json!({"type": "model.delta", "turnId": self.turn_id, "step": p.step, field: piece, offset_field: offset});
                offset += piece.len() as u64;
                let msg = RelayedDelta {
                    replica: state.config.replica_id.clone(),
                    session: self.live.session.clone(),
                    item,
                };
                payloads.push(serde_json::to_string(&msg).unwrap_or_default());
            }
        }
        Some((p, payloads))
    }

    /// Relay `item` to every watcher without waiting for the database: local watchers get it
    /// at once, and its `NOTIFY` for other replicas is written in the flushing slot
    /// ([`TurnTask::flushing`], which must be free), so that whatever the turn relays or
    /// stores next goes after it while the turn's messages keep being handled meanwhile.
    pub(super) fn relay_soon(&mut self, item: serde_json::Value) {
        self.conn.state.hub.live(&self.live.session, item.clone());
        let payload = self.relayed(item);
        self.notify_soon(payload);
    }

    /// A `NOTIFY` of `payload` ([`TurnTask::relayed`]) for other replicas, written in the
    /// flushing slot (which must be free), as [`TurnTask::relay_soon`] writes it.
    pub(super) fn notify_soon(&mut self, payload: String) {
        let conn = self.conn.clone();
        self.flushing = Some(tokio::spawn(async move {
            if let Err(e) = conn.state.store.notify(CHANNEL_DELTAS, &payload).await {
                tracing::warn!(error = %e, "relaying live deltas failed");
            }
        }));
    }

    /// [`TurnTask::relay_soon`] after the relay write in flight (never before it), and
    /// written when this returns.
    pub(super) async fn relay_now(&mut self, item: serde_json::Value) {
        self.flushed().await;
        self.relay_soon(item);
        self.flushed().await;
    }

    /// `item` as a `NOTIFY` payload for the other replicas' watchers.
    pub(super) fn relayed(&self, item: serde_json::Value) -> String {
        let msg = RelayedDelta {
            replica: self.conn.state.config.replica_id.clone(),
            session: self.live.session.clone(),
            item,
        };
        serde_json::to_string(&msg).unwrap_or_default()
    }
}
