//! Turn hand-out and presence, in a task of their own: claim the workspaces' dispatched
//! turns and send `turn.run`; keep the presence row fresh. A database error here is logged
//! and retried: it does not end a healthy connection (only a presence that could not be
//! refreshed for long enough to go stale does).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use berth_protocol::{jsonrpc::Request, worker as wp};
use berth_store::ClaimedTurn;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{Conn, Reservation, text_msg, turn};

/// How often claims are retried without a wake-up (a missed NOTIFY, a failed claim).
const SAFETY: Duration = Duration::from_secs(5);
const HEARTBEAT: Duration = Duration::from_secs(10);
/// A failed claim or heartbeat is retried this soon.
const RETRY: Duration = Duration::from_secs(1);
/// Without a successful heartbeat for this long the presence row is about to go stale (its
/// TTL is 45 s) and other replicas will interrupt the turns: give the connection up.
const PRESENCE_AT_RISK: Duration = Duration::from_secs(40);

pub(super) async fn claimer(conn: Arc<Conn>, kick: Arc<Notify>, lost: CancellationToken) {
    let mut safety = tokio::time::interval(SAFETY);
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.reset();
    let mut last_beat = Instant::now();
    let (mut claim_failed, mut beat_failed) = (false, false);
    loop {
        let retrying = claim_failed || beat_failed;
        tokio::select! {
            _ = conn.closing.cancelled() => return,
            _ = kick.notified() => claim_failed = !claim(&conn).await,
            _ = safety.tick() => {
                claim_failed = !claim(&conn).await;
                resend_unannounced(&conn).await;
            }
            _ = heartbeat.tick() => beat_failed = !beat(&conn, &mut last_beat, &lost).await,
            _ = tokio::time::sleep(RETRY), if retrying => {
                if claim_failed {
                    claim_failed = !claim(&conn).await;
                }
                if beat_failed {
                    beat_failed = !beat(&conn, &mut last_beat, &lost).await;
                }
            }
        }
    }
}

/// Refresh the presence row (re-inserting it if it was swept). False: it failed.
async fn beat(conn: &Conn, last: &mut Instant, lost: &CancellationToken) -> bool {
    let store = &conn.state.store;
    let r = match store.presence_heartbeat(&conn.connection_id).await {
        Ok(true) => Ok(()),
        Ok(false) => {
            tracing::warn!(worker.connection = %conn.connection_id, "presence was swept; restoring it");
            store
                .presence_insert(
                    &conn.connection_id,
                    &conn.principal,
                    &conn.state.config.replica_id,
                    &conn.workspaces,
                    conn.instance.as_deref(),
                )
                .await
        }
        Err(e) => Err(e),
    };
    match r {
        Ok(()) => {
            *last = Instant::now();
            true
        }
        Err(e) => {
            tracing::warn!(worker.connection = %conn.connection_id, error = %e, "presence heartbeat failed; retrying");
            if last.elapsed() > PRESENCE_AT_RISK {
                lost.cancel();
            }
            false
        }
    }
}

/// Claim what may be handed out, up to the connection's bound, and send `turn.run` for
/// each. False: the claim failed (it is retried).
async fn claim(conn: &Arc<Conn>) -> bool {
    let state = &conn.state;
    // A draining replica hands out nothing more: its workers' next connections claim; nor
    // is anything handed to a worker shutting down: its next process claims.
    if state.draining.is_cancelled() || conn.worker_draining() {
        return true;
    }
    let claimed = state
        .store
        .claim_turns(
            &conn.connection_id,
            &conn.principal.tenant_id,
            &conn.workspaces,
            state.config.model.model.as_deref(),
            conn.begin_claim(),
        )
        .await;
    let ok = match claimed {
        Ok(claimed) => {
            for c in claimed {
                hand_out(conn, c, Via::Claim).await;
            }
            true
        }
        Err(e) => {
            tracing::warn!(worker.connection = %conn.connection_id, error = ?e, "claiming turns failed; retrying");
            false
        }
    };
    // After the hand-outs: the claimed turns now count against the bound themselves.
    conn.end_claim();
    ok
}

/// Send `turn.run` again for the turns recorded as handed to this connection that it does
/// not hold ([`berth_store::Store::unannounced_turns`]): none, unless the database's answer
/// to a hand-out was lost after its `COMMIT` (the turn would otherwise run on no worker
/// until the connection ends). On the safety tick, between claims, and only while no
/// admission or carry is handing a turn out, since one may be between its `COMMIT` and its
/// registration; a failure is logged and tried again on the next tick.
async fn resend_unannounced(conn: &Arc<Conn>) {
    let Some((held, mark)) = conn.held_turns() else { return };
    let store = &conn.state.store;
    match store
        .unannounced_turns(&conn.connection_id, &conn.principal.tenant_id, &held)
        .await
    {
        Ok(turns) if conn.no_hand_out_since(mark) => {
            for c in turns {
                tracing::warn!(turn.id = %c.run.turn_id, worker.connection = %conn.connection_id,
                    "turn handed to the connection without its turn.run");
                hand_out(conn, c, Via::Recovery).await;
            }
        }
        Ok(turns) if !turns.is_empty() => {
            tracing::info!(worker.connection = %conn.connection_id, turns = turns.len(),
                "turns handed out unannounced, or being handed out by an admission: looking again on the next tick");
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(worker.connection = %conn.connection_id, error = ?e, "looking for turns handed out unannounced failed");
        }
    }
}

/// How a turn came to be handed to a connection.
pub(super) enum Via {
    /// By its admission, in the slot it reserved.
    Admission(Reservation),
    Claim,
    /// Found handed out without its `turn.run` ([`resend_unannounced`]).
    Recovery,
}

/// Send `turn.run` for a turn handed to this connection, its turn task registered first.
pub(super) async fn hand_out(conn: &Arc<Conn>, mut c: ClaimedTurn, via: Via) {
    let (via, slot) = match via {
        Via::Admission(slot) => ("admission", Some(slot)),
        Via::Claim => ("claim", None),
        Via::Recovery => ("recovery", None),
    };
    let state = &conn.state;
    c.run.context_tokens = crate::compaction::context_window(state, c.provider.as_deref(), c.run.model.as_deref());
    if c.run.channel.is_some() {
        c.run.max_attachment_bytes = Some(state.config.max_attachment_bytes as u64);
    }
    // Encoded first: a turn registered here is one its worker was told about.
    let run = match serde_json::to_value(&c.run) {
        Ok(v) => text_msg(&Request::notification(wp::TURN_RUN, v)),
        Err(e) => {
            tracing::error!(turn.id = %c.run.turn_id, error = %e, "encoding turn.run failed");
            return;
        }
    };
    let (handle, inbox) = turn::handle(conn);
    if !conn.register(&c.run.turn_id, handle, slot) {
        tracing::info!(turn.id = %c.run.turn_id, via, "turn stopped before it was handed to the worker");
        return;
    }
    turn::spawn(conn.clone(), &c.run.turn_id, &c.run.session_id, inbox, None);
    state.metrics.turns_handed.with_label_values(&[via]).inc();
    tracing::info!(turn.id = %c.run.turn_id, session.id = %c.run.session_id, via, "turn handed to worker");
    conn.send(run).await;
}
