//! In-memory fan-out on one replica. Holds no authoritative state: it only wakes local
//! watchers (who then read from the database) and passes live items along.
//!
//! Event wake-ups come from Postgres `LISTEN berth_events` (whichever replica appended);
//! a watcher that misses a wake-up still catches up on its next read, because it always
//! reads everything after its own cursor. Live deltas of turns whose worker this replica
//! holds also accumulate here as the running step's partial output, so a watcher that
//! subscribes mid-turn gets exactly the text so far plus everything after it.
//!
//! Events this replica itself appended for a turn (`turn.started`, a worker's steps, tool
//! status changes, plans and ends; their notices go out only for other replicas' watchers,
//! see [`Hub::committed`] and [`Hub::failed`]) are also kept
//! here for a moment, as the append statement returned them: a local watcher whose cursor
//! is right before them sends them from here instead of reading them back from the
//! database. It takes only an unbroken run that starts right after its cursor, so it still
//! never skips or repeats an event; anything else is read as before.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use berth_store::{EventRecord, Partial};
use tokio::sync::{broadcast, watch};

/// Live items kept per session for slow receivers; one that falls further behind lags and
/// gets `resync` (then the partial text again), never a silent gap.
const LIVE_BUFFER: usize = 1024;

/// Events kept per watched session for local watchers ([`Hub::committed`]), and their rows'
/// text at most: an event larger than that is read from the database. Across all sessions
/// the hub keeps at most [`RECENT_TOTAL_BYTES`]; past that, watchers read.
const RECENT_EVENTS: usize = 16;
const RECENT_BYTES: usize = 256 << 10;
const RECENT_TOTAL_BYTES: usize = 16 << 20;

/// What a session's watchers are woken with: the latest sequence known committed, and a
/// count of wake-ups that name no sequence (the session changed; notifications may have
/// been missed), after which a watcher must read the database.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    pub sequence: i64,
    pub pokes: u64,
}

#[derive(Default)]
pub struct Hub {
    sessions: Mutex<HashMap<String, Channels>>,
    /// What every session's `recent` holds, as [`event_bytes`] counts it.
    recent_total: AtomicUsize,
}

struct Channels {
    /// Latest sequence known to be committed, and the pokes.
    events: watch::Sender<Mark>,
    /// Events appended through this replica, by sequence (see the module's note).
    recent: VecDeque<Arc<EventRecord>>,
    recent_bytes: usize,
    /// Appends of this replica in flight ([`Hub::appending`]), and the latest sequence a
    /// notification named meanwhile: held back until they are done, so that watchers wake
    /// when the hub has the events, not on hearing this replica's own `NOTIFY` first.
    appending: usize,
    deferred: i64,
    /// Live-only items (`model.delta`, `phase`).
    live: broadcast::Sender<Arc<serde_json::Value>>,
    /// The running step's output so far, when this replica holds the turn's worker.
    partial: Option<Partial>,
}

impl Channels {
    fn new() -> Channels {
        Channels {
            events: watch::channel(Mark::default()).0,
            recent: VecDeque::new(),
            recent_bytes: 0,
            appending: 0,
            deferred: 0,
            live: broadcast::channel(LIVE_BUFFER).0,
            partial: None,
        }
    }

    /// Nobody watches, holds a turn's partial output or appends here: the channels can go.
    fn unused(&self) -> bool {
        self.events.receiver_count() == 0 && self.partial.is_none() && self.appending == 0
    }
}

/// A watcher's handle on one session's channels; the last one dropped removes the entry.
pub struct Subscription<'a> {
    hub: &'a Hub,
    session_id: String,
    pub events: watch::Receiver<Mark>,
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
            && ch.appending == 0
        {
            self.hub.remove(&mut map, &self.session_id);
        }
    }
}

impl Hub {
    /// Forget a session's channels (nobody uses them any more).
    fn remove(&self, map: &mut HashMap<String, Channels>, session_id: &str) {
        if let Some(ch) = map.remove(session_id) {
            self.recent_total.fetch_sub(ch.recent_bytes, Ordering::Relaxed);
        }
    }

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
        if let Some(ch) = map.get_mut(session_id) {
            if ch.unused() {
                self.remove(&mut map, session_id);
            } else if sequence == 0 {
                ch.events.send_modify(|m| m.pokes += 1);
            } else if ch.appending > 0 {
                ch.deferred = ch.deferred.max(sequence);
            } else {
                advance(ch, sequence);
            }
        }
    }

    /// An append of this replica in `session_id` is about to go out, and local watchers are
    /// subscribed (None: none are): its events are then to be handed to
    /// [`Hub::committed`] with the returned guard. Until then, or until the guard is
    /// dropped (the append failed), notifications for the session are held back.
    pub fn appending(&self, session_id: &str) -> Option<Appending<'_>> {
        let mut map = self.sessions.lock().expect("hub lock");
        let ch = map.get_mut(session_id).filter(|ch| ch.events.receiver_count() > 0)?;
        ch.appending += 1;
        Some(Appending {
            hub: self,
            session_id: session_id.to_string(),
        })
    }

    /// Whether an event holding `bytes` of row text can be kept for the local watchers
    /// ([`Hub::committed`]): a larger one is left for them to read, so it need not be returned
    /// by its append.
    pub fn keeps(&self, bytes: usize) -> bool {
        bytes <= RECENT_BYTES
    }

    /// An append that wakes the local watchers itself (its notice only for other replicas')
    /// failed with `e`. An error the store decided (a code) wrote nothing; any other (a lost
    /// connection, an answer that did not read) may have come after its `COMMIT` went out,
    /// so the local watchers read what is there rather than wait for their safety read.
    pub fn failed(&self, append: Option<Appending<'_>>, session_id: &str, e: &berth_store::StoreError) {
        drop(append);
        if !matches!(e, berth_store::StoreError::Code(_)) {
            self.event(session_id, 0);
        }
    }

    /// The outcome of an append of `session_id` taken under `append` (its sequence and the
    /// events as written): [`Hub::committed`], or [`Hub::failed`]. Returns the sequence.
    pub fn written(
        &self,
        append: Option<Appending<'_>>,
        session_id: &str,
        r: berth_store::Result<(i64, Vec<EventRecord>)>,
    ) -> berth_store::Result<i64> {
        match r {
            Ok((sequence, events)) => {
                self.committed(append, session_id, events, sequence);
                Ok(sequence)
            }
            Err(e) => {
                self.failed(append, session_id, &e);
                Err(e)
            }
        }
    }

    /// Events this replica committed (in sequence order, `sequence` the last), as the append
    /// returned them: kept for the local watchers, who are then woken as by [`Hub::event`].
    /// An event too large to keep is left for them to read.
    pub fn committed(&self, append: Option<Appending<'_>>, session_id: &str, events: Vec<EventRecord>, sequence: i64) {
        let Some(append) = append else {
            self.event(session_id, sequence);
            return;
        };
        {
            let mut map = self.sessions.lock().expect("hub lock");
            if let Some(ch) = map.get_mut(&append.session_id)
                && ch.events.receiver_count() > 0
            {
                let before = ch.recent_bytes;
                for e in events {
                    let size = event_bytes(&e);
                    let total = self.recent_total.load(Ordering::Relaxed);
                    if size > RECENT_BYTES
                        || (total + ch.recent_bytes + size).saturating_sub(before) > RECENT_TOTAL_BYTES
                    {
                        continue;
                    }
                    if ch.recent.back().is_some_and(|last| last.sequence >= e.sequence) {
                        // Out of order with what is kept (a later append of this replica
                        // came first): kept from here on; watchers read what is not.
                        ch.recent.clear();
                        ch.recent_bytes = 0;
                    }
                    ch.recent_bytes += size;
                    ch.recent.push_back(Arc::new(e));
                    while ch.recent.len() > RECENT_EVENTS || ch.recent_bytes > RECENT_BYTES {
                        let Some(old) = ch.recent.pop_front() else { break };
                        ch.recent_bytes -= event_bytes(&old);
                    }
                }
                // Under the map's lock, as every change of the total.
                if ch.recent_bytes >= before {
                    self.recent_total.fetch_add(ch.recent_bytes - before, Ordering::Relaxed);
                } else {
                    self.recent_total.fetch_sub(before - ch.recent_bytes, Ordering::Relaxed);
                }
                ch.deferred = ch.deferred.max(sequence);
            }
        }
        // The guard wakes the watchers as it goes.
        drop(append);
    }

    /// The events kept for the session that follow `cursor` without a gap (empty when the
    /// one right after it is not kept).
    pub fn recent_after(&self, session_id: &str, cursor: i64) -> Vec<Arc<EventRecord>> {
        let map = self.sessions.lock().expect("hub lock");
        let Some(ch) = map.get(session_id) else {
            return Vec::new();
        };
        let mut out: Vec<Arc<EventRecord>> = Vec::new();
        for e in ch.recent.iter().skip_while(|e| e.sequence <= cursor) {
            if e.sequence != out.last().map_or(cursor, |l| l.sequence) + 1 {
                break;
            }
            out.push(e.clone());
        }
        out
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
            if ch.unused() {
                self.remove(&mut map, session_id);
            }
        }
    }

    /// Wake every watcher (after the LISTEN connection was re-established and
    /// notifications may have been missed).
    pub fn poke_all(&self) {
        let map = self.sessions.lock().expect("hub lock");
        for ch in map.values() {
            ch.events.send_modify(|m| m.pokes += 1);
        }
    }

    /// After the LISTEN connection was re-established: every watched session whose live
    /// items come from another replica (this replica holds no running step of it) may have
    /// missed some, so `item` (a `resync`) goes out on its live stream, after whatever was
    /// relayed before it. Returns how many sessions got it.
    pub fn resync_remote(&self, item: &serde_json::Value) -> usize {
        let map = self.sessions.lock().expect("hub lock");
        let item = Arc::new(item.clone());
        let mut n = 0;
        for ch in map
            .values()
            .filter(|ch| ch.partial.is_none() && ch.events.receiver_count() > 0)
        {
            if ch.live.send(item.clone()).is_ok() {
                n += 1;
            }
        }
        n
    }
}

/// An append in flight ([`Hub::appending`]); dropped, it wakes the watchers with what was
/// held back.
pub struct Appending<'a> {
    hub: &'a Hub,
    session_id: String,
}

impl Drop for Appending<'_> {
    fn drop(&mut self) {
        let mut map = self.hub.sessions.lock().expect("hub lock");
        if let Some(ch) = map.get_mut(&self.session_id) {
            ch.appending -= 1;
            if ch.appending == 0 {
                let sequence = std::mem::take(&mut ch.deferred);
                advance(ch, sequence);
                if ch.unused() {
                    self.hub.remove(&mut map, &self.session_id);
                }
            }
        }
    }
}

/// Wakes the session's watchers if `sequence` is newer than what they were told.
fn advance(ch: &Channels, sequence: i64) {
    ch.events.send_if_modified(|m| {
        let newer = sequence > m.sequence;
        m.sequence = m.sequence.max(sequence);
        newer
    });
}

/// An event's size as [`RECENT_BYTES`] counts it: its rows' text.
fn event_bytes(e: &EventRecord) -> usize {
    e.rows
        .iter()
        .map(|r| r.body.len() + r.thinking.as_ref().map_or(0, String::len))
        .sum::<usize>()
        + 256
}

#[cfg(test)]
mod tests {
    use berth_protocol::{EventPayload, Nothing, Position, Row, RowKind};

    use super::*;

    fn event(sequence: i64, text_bytes: usize) -> EventRecord {
        EventRecord {
            sequence,
            at: "2026-12-01T00:00:00.000Z".into(),
            turn_id: Some("trn_1".into()),
            rows: vec![Row {
                position: Position {
                    source_sequence: sequence,
                    item_index: 0,
                },
                turn_id: Some("trn_1".into()),
                kind: RowKind::User,
                body: "x".repeat(text_bytes),
                thinking: None,
                tool: None,
                hidden: None,
                truncated: None,
                attachments: None,
            }],
            payload: EventPayload::TurnStarted(Nothing {}),
        }
    }

    fn sequences(events: &[Arc<EventRecord>]) -> Vec<i64> {
        events.iter().map(|e| e.sequence).collect()
    }

    #[test]
    fn appends_are_taken_only_as_a_run_right_after_the_cursor() {
        let hub = Hub::default();
        assert!(hub.appending("ses").is_none(), "nobody watches: nothing is kept");
        let sub = hub.subscribe("ses");
        let append = hub.appending("ses");
        assert!(append.is_some());
        hub.committed(append, "ses", vec![event(3, 10), event(4, 10)], 4);
        assert_eq!(sub.events.borrow().sequence, 4, "the watchers are woken");
        assert_eq!(sequences(&hub.recent_after("ses", 2)), [3, 4]);
        assert_eq!(sequences(&hub.recent_after("ses", 3)), [4]);
        assert!(hub.recent_after("ses", 4).is_empty());
        assert!(hub.recent_after("ses", 1).is_empty(), "2 is not kept: no run after 1");
        // Another append that came second is kept from there on, and not joined to a gap.
        let append = hub.appending("ses");
        hub.committed(append, "ses", vec![event(6, 10)], 6);
        assert_eq!(
            sequences(&hub.recent_after("ses", 4)),
            Vec::<i64>::new(),
            "5 is missing"
        );
        assert_eq!(sequences(&hub.recent_after("ses", 5)), [6]);
        let append = hub.appending("ses");
        hub.committed(append, "ses", vec![event(5, 10)], 5);
        assert_eq!(sequences(&hub.recent_after("ses", 4)), [5], "out of order: kept from 5");
        drop(sub);
        assert_eq!(hub.recent_total.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn notifications_wait_for_an_append_in_flight_and_pokes_do_not() {
        let hub = Hub::default();
        let sub = hub.subscribe("ses");
        let append = hub.appending("ses");
        hub.event("ses", 7);
        assert_eq!(
            sub.events.borrow().sequence,
            0,
            "held back while the append is in flight"
        );
        hub.event("ses", 0);
        assert_eq!(sub.events.borrow().pokes, 1, "a poke is not held back");
        drop(append);
        assert_eq!(sub.events.borrow().sequence, 7, "released when the append failed");
        let append = hub.appending("ses");
        hub.event("ses", 9);
        hub.committed(append, "ses", vec![event(8, 10)], 8);
        assert_eq!(sub.events.borrow().sequence, 9, "the newest of both");
    }

    /// A failed append whose notice would have gone to other replicas only: an error the
    /// store decided wrote nothing and wakes nobody; any other may have committed, and the
    /// local watchers are poked to read.
    #[test]
    fn a_failed_append_that_may_have_committed_pokes_the_local_watchers() {
        let hub = Hub::default();
        let sub = hub.subscribe("ses");
        let decided = berth_store::StoreError::Code(berth_protocol::ErrorCode::TurnNotRunning);
        hub.failed(hub.appending("ses"), "ses", &decided);
        assert_eq!(sub.events.borrow().pokes, 0, "nothing was written");
        let unknown = berth_store::StoreError::Other(anyhow::anyhow!("connection lost after COMMIT"));
        hub.failed(hub.appending("ses"), "ses", &unknown);
        assert_eq!(sub.events.borrow().pokes, 1, "the watchers read what is there");
        let append = hub.appending("ses");
        hub.committed(append, "ses", vec![event(3, 10)], 3);
        assert_eq!(sub.events.borrow().sequence, 3, "later appends are kept as before");
    }

    #[test]
    fn a_reconnect_resyncs_only_sessions_whose_live_items_come_from_elsewhere() {
        let hub = Hub::default();
        let mut remote = hub.subscribe("remote");
        let mut local = hub.subscribe("local");
        hub.local_delta(
            "local",
            "trn_1",
            0,
            "hi",
            "",
            serde_json::json!({"type": "model.delta"}),
        );
        assert_eq!(local.live.try_recv().unwrap()["type"], "model.delta");
        let resync = serde_json::json!({"type": "resync", "reason": "reconnected"});
        assert_eq!(hub.resync_remote(&resync), 1);
        assert_eq!(*remote.live.try_recv().unwrap(), resync);
        assert!(
            local.live.try_recv().is_err(),
            "its deltas come from this replica: none missed"
        );
    }

    #[test]
    fn the_hub_keeps_a_bounded_amount_of_appended_text() {
        let hub = Hub::default();
        let subs: Vec<_> = (0..100).map(|i| hub.subscribe(&format!("ses{i}"))).collect();
        for i in 0..100 {
            let id = format!("ses{i}");
            let append = hub.appending(&id);
            hub.committed(append, &id, vec![event(1, 200 << 10)], 1);
            assert!(hub.recent_total.load(Ordering::Relaxed) <= RECENT_TOTAL_BYTES);
        }
        assert!(!hub.recent_after("ses0", 0).is_empty(), "the first are kept");
        assert!(hub.recent_after("ses99", 0).is_empty(), "past the bound, watchers read");
        let append = hub.appending("ses1");
        hub.committed(append, "ses1", vec![event(2, RECENT_BYTES)], 2);
        assert!(
            hub.recent_after("ses1", 1).is_empty(),
            "an event over the session's bound is read"
        );
        drop(subs);
        assert_eq!(hub.recent_total.load(Ordering::Relaxed), 0);
    }
}
