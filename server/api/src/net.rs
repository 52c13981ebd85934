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
use futures_util::Sink;
use tokio::net::{TcpListener, TcpStream};

/// [`berth_protocol::batch::write_batch`] of a client's or worker's connection: a `Close`
/// ends the batch (true once it is sent).
pub async fn write_batch<S>(
    sink: &mut S,
    first: Message,
    more: impl FnMut() -> Option<Message>,
) -> Result<bool, S::Error>
where
    S: Sink<Message> + Unpin,
{
    berth_protocol::batch::write_batch(sink, first, more, |m| matches!(m, Message::Close(_))).await
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
}
