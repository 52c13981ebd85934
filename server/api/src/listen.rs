//! The replica's one LISTEN connection: wakes local watchers on committed appends, kicks
//! local worker connections when turns may be handed out, and relays other replicas'
//! live deltas. Reconnects with backoff; after a reconnect every watcher is woken because
//! notifications may have been missed while the connection was down, and every watcher of
//! a turn running elsewhere gets `resync` (its live deltas may have been missed). A connection can die
//! without a word (a half-open socket after a network failure or a failover), so it is
//! probed with a trivial query on a timer; no answer in time counts as lost.

use std::time::Duration;

use berth_store::{
    CHANNEL_CONTROL, CHANNEL_DELTAS, CHANNEL_DISPATCH, CHANNEL_EVENTS, CHANNEL_INTERACTIONS, CHANNEL_REVOKE,
};

use crate::AppState;

pub fn spawn(state: AppState) {
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            // Setting up may meet a silent socket too.
            let listening = tokio::time::timeout(
                state.config.listen_probe_timeout * 3,
                state.store.listen(&[
                    CHANNEL_EVENTS,
                    CHANNEL_DISPATCH,
                    CHANNEL_DELTAS,
                    CHANNEL_CONTROL,
                    CHANNEL_REVOKE,
                    CHANNEL_INTERACTIONS,
                ]),
            )
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")));
            match listening {
                Ok((client, mut rx)) => {
                    backoff = Duration::from_millis(100);
                    state.metrics.listen_up.set(1);
                    state.hub.poke_all();
                    // Live output other replicas relayed meanwhile is lost for good: the
                    // watchers that follow it start their live view again.
                    let resync = berth_protocol::LiveItem::Resync(berth_protocol::Resync {
                        reason: berth_protocol::ResyncReason::Reconnected,
                    });
                    let resynced = state
                        .hub
                        .resync_remote(&serde_json::to_value(&resync).unwrap_or_default());
                    if resynced > 0 {
                        tracing::info!(sessions = resynced, "listen connection back; watchers resync");
                    }
                    state.workers.kick_all();
                    state.interactions.wake_all();
                    // Revocations sent while we were not listening were missed.
                    crate::connections::verify_soon(&state, None);
                    let mut probe = tokio::time::interval(state.config.listen_probe_interval);
                    probe.tick().await;
                    loop {
                        tokio::select! {
                            n = rx.recv() => match n {
                                Some(n) => handle(&state, n.channel(), n.payload()),
                                None => break,
                            },
                            _ = probe.tick() => {
                                let answer = tokio::time::timeout(
                                    state.config.listen_probe_timeout,
                                    client.simple_query("SELECT 1"),
                                );
                                if !matches!(answer.await, Ok(Ok(_))) {
                                    tracing::warn!("listen connection did not answer its probe");
                                    break;
                                }
                            }
                            _ = state.shutdown.cancelled() => return,
                        }
                    }
                    state.metrics.listen_up.set(0);
                    state.metrics.listen_reconnects.inc();
                    tracing::warn!("listen connection lost; reconnecting");
                }
                Err(e) => tracing::warn!(error = %e, "listen connection failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = state.shutdown.cancelled() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    });
}

fn handle(state: &AppState, channel: &str, payload: &str) {
    state.metrics.notices.with_label_values(&[channel]).inc();
    match channel {
        CHANNEL_EVENTS => {
            if let Some((session, seq)) = payload.rsplit_once(':')
                && let Ok(seq) = seq.parse()
            {
                state.hub.event(session, seq);
            }
        }
        CHANNEL_DISPATCH => {
            if let Some(workspace_id) = berth_store::dispatch_target(payload, &state.config.replica_id) {
                state.workers.kick(workspace_id);
            }
        }
        CHANNEL_INTERACTIONS => state.interactions.wake(payload),
        CHANNEL_REVOKE => {
            let closed = state.connections.revoke(payload);
            if closed > 0 {
                tracing::info!(connections = closed, "revoked principal's connections closed");
            }
        }
        CHANNEL_CONTROL => {
            if let Some(rest) = payload.strip_prefix("stop:")
                && let Some((conn, turn)) = rest.split_once(':')
            {
                state.workers.stop(conn, turn);
            }
        }
        CHANNEL_DELTAS => {
            let Ok(msg) = serde_json::from_str::<crate::workers::RelayedDelta>(payload) else {
                return;
            };
            if msg.replica != state.config.replica_id {
                state.hub.live(&msg.session, msg.item);
            }
        }
        _ => {}
    }
}
