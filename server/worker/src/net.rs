//! The worker's sockets to the API tier. A turn is a stream of small writes (live deltas,
//! steps); with Nagle's algorithm on, a small write that follows another waits for its ACK,
//! which the peer delays by up to 40 ms. So both the WebSocket and the model-proxy client
//! have `TCP_NODELAY` set, here, in one place.

use std::time::Duration;

use tokio::net::TcpStream;
use tokio_tungstenite::{
    MaybeTlsStream, WebSocketStream, connect_async_with_config,
    tungstenite::{self, client::IntoClientRequest, handshake::client::Response},
};

pub(crate) type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Open the WebSocket to the API tier with Nagle's algorithm off.
pub(crate) async fn connect(req: impl IntoClientRequest + Unpin) -> Result<(Socket, Response), tungstenite::Error> {
    connect_async_with_config(req, None, true).await
}

/// The HTTP client for the model proxy: Nagle off, connections reused between turns.
pub(crate) fn http_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .build()
}

/// The HTTP client for one streamable-HTTP MCP server: Nagle off, the server's configured
/// headers (credentials, from the worker's own configuration) on every request, and no
/// redirect followed (a redirect to another host would carry those headers there).
pub(crate) fn mcp_http_client(headers: &std::collections::BTreeMap<String, String>) -> anyhow::Result<reqwest::Client> {
    let mut map = reqwest::header::HeaderMap::new();
    for (k, v) in headers {
        let mut value = reqwest::header::HeaderValue::from_str(v)?;
        value.set_sensitive(true);
        map.insert(reqwest::header::HeaderName::from_bytes(k.as_bytes())?, value);
    }
    Ok(reqwest::Client::builder()
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .default_headers(map)
        .redirect(reqwest::redirect::Policy::none())
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn websocket_to_the_api_tier_has_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio_tungstenite::accept_async(tcp).await.unwrap()
        });
        let (socket, _) = connect(format!("ws://{addr}/v1/worker")).await.unwrap();
        let MaybeTlsStream::Plain(tcp) = socket.get_ref() else {
            panic!("plain ws:// expected")
        };
        assert!(tcp.nodelay().unwrap(), "worker socket without TCP_NODELAY");
        drop(server.await.unwrap());
    }

    /// An MCP server's redirect is not followed: its headers never reach another address.
    #[tokio::test]
    async fn an_mcp_servers_redirect_is_not_followed() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = elsewhere.local_addr().unwrap();
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut tcp, _) = server.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = tcp.read(&mut buf).await;
            let reply = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://{target}/mcp\r\nContent-Length: 0\r\n\r\n"
            );
            tcp.write_all(reply.as_bytes()).await.unwrap();
        });
        let headers = [("x-api-key".to_string(), "secret".to_string())].into();
        let client = mcp_http_client(&headers).unwrap();
        let resp = client.post(format!("http://{addr}/mcp")).send().await.unwrap();
        assert_eq!(resp.status(), reqwest::StatusCode::TEMPORARY_REDIRECT);
        let reached = tokio::time::timeout(std::time::Duration::from_millis(200), elsewhere.accept()).await;
        assert!(reached.is_err(), "the redirect was followed");
    }

    /// The connection loop opens its sockets through this module only.
    #[test]
    fn the_worker_connects_through_this_module() {
        let src = include_str!("lib.rs");
        assert!(src.contains("net::connect("));
        assert!(src.contains("net::http_client()"));
        assert!(!src.contains("connect_async("), "connect with net::connect (Nagle off)");
        assert!(
            !src.contains("reqwest::Client::builder()"),
            "build clients with net::http_client"
        );
    }
}
