//! A connection's WebSocket: the writer task that drains the outbound queue within the
//! write timeout, and the read loop (pings, the idle and hello deadlines, revocation,
//! shutdown, message size limits) that hands each text message to the request checks and
//! each binary message to its upload, then the closing handshake and cleanup.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use berth_protocol::jsonrpc::Response as RpcResponse;
use berth_store::Principal;
use futures_util::{SinkExt, StreamExt};
use tokio_util::sync::CancellationToken;

use super::{Conn, Outbound, Subs, answer::run_job, ctx::text, request::admit_frame, upload};
use crate::AppState;

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// The largest message a connection may send before `hello` succeeds (a `hello` with a
/// login token is well under 4 KiB).
const PRE_HELLO_MAX: usize = 64 << 10;

pub(super) async fn run(
    state: AppState,
    principal: Option<Principal>,
    pending: Option<crate::connections::Pending>,
    socket: WebSocket,
) {
    state.metrics.connections.with_label_values(&["client"]).inc();
    let limits = state.config.limits.clone();
    let (mut sink, mut stream) = socket.split();
    let (out, mut rx) = Outbound::new(limits.outbound_bytes);
    let conn = Arc::new(Conn {
        principal: Mutex::new(None),
        out,
        subs: Mutex::new(Subs::default()),
        closed: CancellationToken::new(),
        revoked: CancellationToken::new(),
        registration: Mutex::new(None),
        in_flight: Arc::new(tokio::sync::Semaphore::new(limits.max_in_flight)),
        uploads: upload::Uploads::default(),
        pending: Mutex::new(pending),
    });
    if let Some(p) = principal
        && conn.sign_in(&state, p).is_err()
    {
        let _ = sink.send(close(1008, "too many connections")).await;
        state.metrics.connections.with_label_values(&["client"]).dec();
        return;
    }
    // The writer hands queued messages to the socket, a batch within the write timeout; a
    // client that stops reading is dropped then. Messages stay counted against the byte
    // budget until written.
    let writer_done = CancellationToken::new();
    let writer = tokio::spawn({
        let (done, closed, budget) = (writer_done.clone(), conn.closed.clone(), conn.out.budget.clone());
        let write_timeout = limits.write_timeout;
        async move {
            let mut held = Vec::with_capacity(berth_protocol::batch::WRITE_BATCH);
            loop {
                // Once the connection is closing, send what is queued and stop.
                let next = tokio::select! {
                    biased;
                    m = rx.recv() => m,
                    _ = closed.cancelled() => rx.try_recv().ok(),
                };
                let Some((first, permit)) = next else { break };
                held.push(permit);
                // The permits are kept until the batch is flushed.
                let more = || {
                    rx.try_recv().ok().map(|(msg, permit)| {
                        held.push(permit);
                        msg
                    })
                };
                match tokio::time::timeout(write_timeout, crate::net::write_batch(&mut sink, first, more)).await {
                    Ok(Ok(false)) => held.clear(),
                    _ => break,
                }
            }
            // Senders waiting for room give up; the read loop ends.
            budget.close();
            done.cancel();
            let _ = tokio::time::timeout(write_timeout, sink.close()).await;
        }
    });
    let mut ping = tokio::time::interval(limits.ping_interval);
    let mut last_heard = Instant::now();
    let hello_deadline = tokio::time::sleep(limits.hello_timeout);
    tokio::pin!(hello_deadline);
    let mut writer_gone = false;
    loop {
        let unauthenticated = conn.principal.lock().expect("conn lock").is_none();
        let msg = tokio::select! {
            m = stream.next() => m,
            _ = ping.tick() => {
                if last_heard.elapsed() > limits.idle_timeout {
                    let _ = conn.out.try_send(close(1000, "idle"));
                    break;
                }
                let _ = conn.out.try_send(Message::Ping(Default::default()));
                continue;
            }
            _ = &mut hello_deadline, if unauthenticated => {
                // A `hello` may have succeeded while we waited.
                if conn.principal.lock().expect("conn lock").is_some() {
                    continue;
                }
                let _ = conn.out.try_send(close(1008, "not authenticated"));
                break;
            }
            _ = conn.revoked.cancelled() => {
                let _ = conn.out.send(close(1008, "revoked")).await;
                break;
            }
            _ = state.shutdown.cancelled() => {
                let _ = conn.out.send(close(1001, "shutting down")).await;
                break;
            }
            _ = writer_done.cancelled() => {
                writer_gone = true;
                break;
            }
        };
        last_heard = Instant::now();
        let msg = match msg {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                // The only read error we can still answer is an oversized message.
                if e.to_string().contains("too long") || e.to_string().contains("Space limit") {
                    let _ = conn.out.send(close(1009, "message too big")).await;
                }
                break;
            }
            None => break,
        };
        // As of now (a `hello` may have succeeded while this message was awaited).
        let unauthenticated = conn.principal.lock().expect("conn lock").is_none();
        match msg {
            Message::Text(t) if t.len() > state.config.max_text_message => {
                let _ = conn.out.send(close(1009, "message too big")).await;
                break;
            }
            // Before `hello` a peer is nobody: it gets a hello's worth of room, not a
            // prompt's, and no upload.
            Message::Text(t) if unauthenticated && t.len() > PRE_HELLO_MAX => {
                let _ = conn.out.send(close(1009, "message too big before hello")).await;
                break;
            }
            Message::Binary(_) if unauthenticated => {
                let _ = conn.out.send(close(1008, "not authenticated")).await;
                break;
            }
            Message::Text(t) => match admit_frame(&state, &conn, t.as_str()) {
                Ok(Some(job)) => {
                    tokio::spawn(run_job(job));
                }
                Ok(None) => {}
                // Refusals wait for room in the outbound queue: a flood slows its own reads.
                Err(refusal) => {
                    let _ = conn.out.send(text(&refusal)).await;
                }
            },
            // An upload's bytes; one whose id matches no upload in flight is a typed error
            // and the connection goes on. (Cloning `Bytes` shares the buffer.)
            Message::Binary(b) => {
                if let Err(stray) = conn.uploads.deliver(b, &state.upload_memory) {
                    let refusal = RpcResponse::err(None, stray.error().0);
                    let _ = conn.out.send(text(&refusal)).await;
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    // Closing handshake: if we sent a Close, wait (briefly) for the peer's, so that the
    // peer reads our close code before the socket goes away. A peer whose writes failed or
    // timed out is not waited for.
    if !writer_gone {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            while let Some(Ok(m)) = stream.next().await {
                if matches!(m, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }
    conn.closed.cancel();
    conn.subs.lock().expect("conn lock").cancel_all();
    // The connection counts (per credential, or per address before hello) until its
    // writer has let go of the socket.
    let registration = conn.registration.lock().expect("conn lock").take();
    let pending = conn.pending.lock().expect("conn lock").take();
    drop(conn);
    let _ = writer.await;
    drop(stream);
    state.metrics.connections.with_label_values(&["client"]).dec();
    drop(registration);
    drop(pending);
}
