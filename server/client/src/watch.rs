//! `session.watch` as a stream that survives reconnects: it resubscribes from the last
//! sequence it delivered, so its consumer sees every event once, in order.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    task::{Context, Poll},
};

use berth_protocol::WatchItem;
use futures_util::Stream;
use tokio::sync::mpsc;

use crate::{Client, Error, Result, connection::answer};

/// A session watch: a [`Stream`] of [`WatchItem`]s. Dropping it ends the subscription.
pub struct Watch {
    items: mpsc::Receiver<Result<WatchItem>>,
    last: Arc<AtomicI64>,
}

impl Watch {
    /// The sequence of the last event delivered (or the `after` it started from).
    pub fn last_sequence(&self) -> i64 {
        self.last.load(Ordering::SeqCst)
    }

    /// The next item; `None` when the subscription has ended.
    pub async fn next_item(&mut self) -> Option<Result<WatchItem>> {
        self.items.recv().await
    }
}

impl Stream for Watch {
    type Item = Result<WatchItem>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.items.poll_recv(cx)
    }
}

pub(crate) fn start(client: Client, session_id: String, after: i64) -> Watch {
    // A small buffer: a slow consumer slows the reading of this subscription only.
    let (tx, items) = mpsc::channel(256);
    let last = Arc::new(AtomicI64::new(after));
    // The task ends when the subscription does, or (closing it) when the Watch is dropped.
    tokio::spawn(run(client, session_id, last.clone(), tx));
    Watch { items, last }
}

async fn run(client: Client, session_id: String, last: Arc<AtomicI64>, tx: mpsc::Sender<Result<WatchItem>>) {
    let retry = client.inner.retry.clone();
    let mut failures = 0u32;
    loop {
        let conn = match client.connection().await {
            Ok(c) => c,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        let id = client.next_id();
        let after = last.load(Ordering::SeqCst);
        let params = serde_json::json!({"sessionId": session_id, "after": after});
        let Ok(mut sub) = conn.subscribe(id, "session.watch", params) else {
            // The connection closed under us: the next round reconnects.
            continue;
        };
        loop {
            tokio::select! {
                biased;
                item = sub.items.recv() => {
                    let Some(value) = item else {
                        // The items ended: either the subscription's answer arrived, or the
                        // connection dropped (no answer will).
                        match (&mut sub.done).await {
                            Ok(resp) => {
                                if let Err(e) = answer(resp) {
                                    let _ = tx.send(Err(e)).await;
                                }
                                return;
                            }
                            Err(_) => break,
                        }
                    };
                    let item: WatchItem = match serde_json::from_value(value) {
                        Ok(i) => i,
                        Err(e) => {
                            let _ = tx.send(Err(Error::Protocol(format!("watch item: {e}")))).await;
                            continue;
                        }
                    };
                    if let WatchItem::Event(ev) = &item {
                        // Resubscribing from `last` makes this impossible; kept as a guard
                        // so that no consumer ever sees an event twice.
                        if ev.sequence <= last.load(Ordering::SeqCst) {
                            continue;
                        }
                        last.store(ev.sequence, Ordering::SeqCst);
                    }
                    failures = 0;
                    if tx.send(Ok(item)).await.is_err() {
                        conn.close_subscription(id, client.next_id());
                        return;
                    }
                }
                _ = tx.closed() => {
                    conn.close_subscription(id, client.next_id());
                    return;
                }
            }
        }
        failures += 1;
        tracing::debug!(session = %session_id, after = last.load(Ordering::SeqCst), "watch lost its connection; resuming");
        if failures > retry.call_retries {
            let _ = tx.send(Err(Error::Disconnected)).await;
            return;
        }
        tokio::time::sleep(retry.backoff(failures - 1)).await;
    }
}
