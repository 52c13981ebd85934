//! In-memory fan-out on one replica. Holds no authoritative state: it only wakes local
//! watchers (who then read from the database) and passes live items along.
//!
//! Event wake-ups come from Postgres `LISTEN berth_events` (whichever replica appended);
//! a watcher that misses a wake-up still catches up on its next read, because it always
//! reads everything after its own cursor. Live deltas of turns whose worker this replica
//! holds also accumulate here as the running step's partial output, so a watcher that
//! subscribes mid-turn gets exactly the text so far plus everything after it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use berth_store::Partial;
use tokio::sync::{broadcast, watch};

/// Live items kept per session for slow receivers; one that falls further behind lags and
/// gets `resync` (then the partial text again), never a silent gap.
const LIVE_BUFFER: usize = 1024;

#[derive(Default)]
pub struct Hub {
    sessions: Mutex<HashMap<String, Channels>>,
}

struct Channels {
    /// Latest sequence known to be committed.
    events: watch::Sender<i64>,
    /// Live-only items (`model.delta`, `phase`).
    live: broadcast::Sender<Arc<serde_json::Value>>,
    /// The running step's output so far, when this replica holds the turn's worker.
    partial: Option<Partial>,
}

impl Channels {
    fn new() -> Channels {
        Channels {
            events: watch::channel(0).0,
            live: broadcast::channel(LIVE_BUFFER).0,
            partial: None,
        }
    }
}

/// A watcher's handle on one session's channels; the last one dropped removes the entry.
pub struct Subscription<'a> {
    hub: &'a Hub,
    session_id: String,
    pub events: watch::Receiver<i64>,
    pub live: broadcast::Receiver<Arc<serde_json::Value>>,
    /// The local partial output at the moment of subscribing (None: not held here).
    pub partial: Option<Partial>,
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        let mut map = self.hub.sessions.lock().expect("hub lock");
        // This subscription's receiver is still alive here: 1 means it was the last.
        if let Some(ch) = map.get(&self.session_id)
            && ch.events.receiver_count() <= 1
            && ch.partial.is_none()
        {
            map.remove(&self.session_id);
        }
    }
}

impl Hub {
    pub fn subscribe(&self, session_id: &str) -> Subscription<'_> {
        let mut map = self.sessions.lock().expect("hub lock");
        let ch = map.entry(session_id.to_string()).or_insert_with(Channels::new);
        Subscription {
            hub: self,
            session_id: session_id.to_string(),
            events: ch.events.subscribe(),
            live: ch.live.subscribe(),
            partial: ch.partial.clone(),
        }
    }

    /// The local partial output of the session's running step, if this replica holds it.
    pub fn partial(&self, session_id: &str) -> Option<Partial> {
        let map = self.sessions.lock().expect("hub lock");
        map.get(session_id).and_then(|ch| ch.partial.clone())
    }

    /// A new event was committed in `session_id` (sequence 0: the session changed, e.g. removed).
    pub fn event(&self, session_id: &str, sequence: i64) {
        let mut map = self.sessions.lock().expect("hub lock");
        if let Some(ch) = map.get(session_id) {
            if ch.events.receiver_count() == 0 && ch.partial.is_none() {
                map.remove(session_id);
            } else if sequence == 0 {
                ch.events.send_modify(|_| {});
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

    /// A delta of a turn whose worker this replica holds: extend the partial output and
    /// publish the item, atomically with respect to `subscribe`.
    pub fn local_delta(
        &self,
        session_id: &str,
        turn_id: &str,
        step: i32,
        text: &str,
        thinking: &str,
        item: serde_json::Value,
    ) {
        let mut map = self.sessions.lock().expect("hub lock");
        let ch = map.entry(session_id.to_string()).or_insert_with(Channels::new);
        let p = ch.partial.get_or_insert_with(|| Partial {
            turn_id: turn_id.to_string(),
            step,
            ..Partial::default()
        });
        if p.turn_id != turn_id || p.step != step {
            *p = Partial {
                turn_id: turn_id.to_string(),
                step,
                ..Partial::default()
            };
        }
        p.text.push_str(text);
        p.thinking.push_str(thinking);
        let _ = ch.live.send(Arc::new(item));
    }

    /// The local step ended (completed or the turn settled): forget its partial output.
    pub fn end_step(&self, session_id: &str) {
        let mut map = self.sessions.lock().expect("hub lock");
        if let Some(ch) = map.get_mut(session_id) {
            ch.partial = None;
            if ch.events.receiver_count() == 0 {
                map.remove(session_id);
            }
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
