//! In-memory fan-out on one replica. Holds no authoritative state: it only wakes local
//! watchers (who then read from the database) and passes live deltas along.
//!
//! Event wake-ups come from Postgres `LISTEN berth_events` (whichever replica appended);
//! a watcher that misses a wake-up still catches up on its next read, because it always
//! reads everything after its own cursor.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tokio::sync::{broadcast, watch};

/// Live deltas kept per session for slow receivers before they lag (and skip).
const DELTA_BUFFER: usize = 256;

#[derive(Default)]
pub struct Hub {
    sessions: Mutex<HashMap<String, Channels>>,
}

struct Channels {
    /// Latest sequence known to be committed.
    events: watch::Sender<i64>,
    /// Live-only items (`model.delta`, `phase`).
    live: broadcast::Sender<Arc<serde_json::Value>>,
}

/// A watcher's handle on one session's channels.
pub struct Subscription {
    pub events: watch::Receiver<i64>,
    pub live: broadcast::Receiver<Arc<serde_json::Value>>,
}

impl Hub {
    pub fn subscribe(&self, session_id: &str) -> Subscription {
        let mut map = self.sessions.lock().expect("hub lock");
        let ch = map
            .entry(session_id.to_string())
            .or_insert_with(|| Channels {
                events: watch::channel(0).0,
                live: broadcast::channel(DELTA_BUFFER).0,
            });
        Subscription {
            events: ch.events.subscribe(),
            live: ch.live.subscribe(),
        }
    }

    /// A new event was committed in `session_id`.
    pub fn event(&self, session_id: &str, sequence: i64) {
        let mut map = self.sessions.lock().expect("hub lock");
        if let Some(ch) = map.get(session_id) {
            if ch.events.receiver_count() == 0 {
                map.remove(session_id);
            } else {
                ch.events.send_if_modified(|s| {
                    let newer = sequence > *s;
                    *s = (*s).max(sequence);
                    newer
                });
            }
        }
    }

    /// A live item for the session's watchers on this replica.
    pub fn live(&self, session_id: &str, item: serde_json::Value) {
        let map = self.sessions.lock().expect("hub lock");
        if let Some(ch) = map.get(session_id) {
            let _ = ch.live.send(Arc::new(item));
        }
    }

    /// Wake every watcher (after the LISTEN connection was re-established and
    /// notifications may have been missed).
    pub fn poke_all(&self) {
        let map = self.sessions.lock().expect("hub lock");
        for ch in map.values() {
            ch.events.send_modify(|_| {});
        }
    }
}
