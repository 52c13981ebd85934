//! Sockets on the turn path. Every turn is a chain of small writes (a JSON-RPC answer, a
//! subscription item, an SSE chunk, a live delta); with Nagle's algorithm on, a small write
//! that follows another waits for its ACK, which the peer delays by up to 40 ms. So every
//! socket the API tier accepts or opens has `TCP_NODELAY` set, here, in one place.
//! (PostgreSQL connections: tokio-postgres sets it on its TCP sockets itself.)

use std::time::Duration;

use axum::{
    extract::ws::Message,
    serve::{ListenerExt, TapIo},
};
use futures_util::{Sink, SinkExt};
use tokio::net::{TcpListener, TcpStream};

/// The most queued messages a WebSocket writer hands to the socket before it flushes.
pub const WRITE_BATCH: usize = 32;

/// Hand `first` and whatever `more` has queued now (up to [`WRITE_BATCH`] in all) to a
/// WebSocket, then flush once: a burst (a file's chunks, many turns' events) goes out in a
/// few large writes instead of a system call, and a wake-up of the peer, per message.
/// Nothing waits for more to arrive, so a lone message goes out as soon as it is queued.
/// True once a `Close` has been sent (nothing after it is taken).
pub async fn write_batch<S>(
    sink: &mut S,
    first: Message,
    mut more: impl FnMut() -> Option<Message>,
) -> Result<bool, S::Error>
where
    S: Sink<Message> + Unpin,
{
    let mut next = Some(first);
    let mut sent = 0;
    while let Some(msg) = next.take() {
        let close = matches!(msg, Message::Close(_));
        sink.feed(msg).await?;
        sent += 1;
        if close {
            sink.flush().await?;
            return Ok(true);
        }
        if sent < WRITE_BATCH {
            next = more();
        }
    }
    sink.flush().await?;
    Ok(false)
}

/// A listener whose accepted connections have Nagle's algorithm off.
pub type NodelayListener = TapIo<TcpListener, fn(&mut TcpStream)>;

/// `listener` with Nagle's algorithm turned off on every accepted connection.
pub fn nodelay(listener: TcpListener) -> NodelayListener {
    listener.tap_io(set_nodelay as fn(&mut TcpStream))
}

fn set_nodelay(tcp: &mut TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::warn!(error = %e, "could not set TCP_NODELAY on an accepted connection");
    }
}

/// The HTTP client for the model provider: Nagle off (each streamed chunk goes out as it
/// comes), connections kept alive and reused between turns.
pub fn http_client() -> reqwest::Result<reqwest::Client> {
    provider_client(Duration::from_secs(10))
}

/// The same with the providers' connect timeout (`BERTH_MODEL_CONNECT_TIMEOUT_SECS`).
pub fn provider_client(connect_timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .connect_timeout(connect_timeout)
        .build()
}

#[cfg(test)]
mod tests {
    use axum::serve::Listener;

    use super::*;

    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut listener = nodelay(listener);
        let _client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await;
        assert!(accepted.nodelay().unwrap(), "accepted socket without TCP_NODELAY");
    }

    /// Every server `serve` starts is on a listener wrapped by [`nodelay`], and the provider
    /// client is [`http_client`]: a new `axum::serve` or client built elsewhere fails here.
    #[test]
    fn serve_uses_only_nodelay_sockets() {
        let src = include_str!("lib.rs");
        let body = &src[src.find("pub async fn serve(").expect("serve")..];
        let serves: Vec<&str> = body.split("axum::serve(").skip(1).collect();
        assert!(serves.len() >= 2, "the API and metrics servers");
        for call in serves {
            assert!(
                call.trim_start().starts_with("net::nodelay("),
                "axum::serve on a listener not wrapped by net::nodelay: {}",
                &call[..call.len().min(80)]
            );
        }
        assert!(
            !src.contains("reqwest::Client::builder()"),
            "build clients with net::http_client"
        );
        assert!(src.contains("net::http_client()"));
    }

    /// A sink that records what it is handed and each flush.
    #[derive(Default)]
    struct Recorder(Vec<String>);

    impl Sink<Message> for Recorder {
        type Error = std::convert::Infallible;
        fn poll_ready(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn start_send(mut self: std::pin::Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
            let name = match item {
                Message::Text(t) => t.to_string(),
                Message::Close(_) => "close".into(),
                _ => "other".into(),
            };
            self.0.push(name);
            Ok(())
        }
        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            self.0.push("flush".into());
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_close(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_batch_is_what_is_queued_in_order_then_one_flush() {
        let text = |i: usize| Message::Text(i.to_string().into());
        // A lone message: sent and flushed at once.
        let mut sink = Recorder::default();
        assert!(!write_batch(&mut sink, text(0), || None).await.unwrap());
        assert_eq!(sink.0, ["0", "flush"]);
        // A burst longer than a batch: the first WRITE_BATCH in order, one flush; the rest
        // stays queued for the next batch.
        let mut queue: std::collections::VecDeque<Message> = (1..=WRITE_BATCH + 5).map(text).collect();
        let mut sink = Recorder::default();
        assert!(!write_batch(&mut sink, text(0), || queue.pop_front()).await.unwrap());
        let expected: Vec<String> = (0..WRITE_BATCH)
            .map(|i| i.to_string())
            .chain(["flush".into()])
            .collect();
        assert_eq!(sink.0, expected);
        assert_eq!(queue.len(), 6);
        // A close ends the batch, flushed; nothing after it is taken.
        let mut queue: std::collections::VecDeque<Message> = [text(1), Message::Close(None), text(2)].into();
        let mut sink = Recorder::default();
        assert!(write_batch(&mut sink, text(0), || queue.pop_front()).await.unwrap());
        assert_eq!(sink.0, ["0", "1", "close", "flush"]);
        assert_eq!(queue.len(), 1);
    }
}
