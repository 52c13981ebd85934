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
/// Redirects are not followed: a provider's key (`x-api-key` survives reqwest's redirect
/// to another host) and the cluster secret go to the URL they were meant for, or nowhere.
pub fn provider_client(connect_timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .connect_timeout(connect_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// The same for endpoints a session chose (`baseUrl`), where the profile does not allow
/// private ones: names resolve to public addresses only, so a session cannot point the
/// proxy at the API tier itself, its metrics, the cloud's metadata service or anything else
/// on the private network ([`is_public`]; an address given literally is checked by
/// [`public_url`]). Redirects are not followed (a redirect to an address literal would
/// skip the resolver), and no proxy from the environment is used (the resolver would then
/// check the proxy's address, and the proxy would reach the private network for it).
pub fn public_only_client(connect_timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .connect_timeout(connect_timeout)
        .dns_resolver(std::sync::Arc::new(PublicOnly))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
}

/// Whether `ip` is on the public internet: not loopback, private, shared (CGNAT),
/// link-local, unique-local, unspecified, multicast, broadcast or documentation space (and
/// an IPv4-mapped IPv6 address as its IPv4 address).
pub fn is_public(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0)
                || a >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            let v4 = |hi: u16, lo: u16| IpAddr::V4(std::net::Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)));
            // An IPv4 address inside: NAT64 (64:ff9b::/96) and the deprecated IPv4-compatible
            // form (::a.b.c.d) reach it; 6to4 (2002::/16) routes to it. The local-use NAT64
            // prefix (64:ff9b:1::/48) reaches whatever its operator's translator serves.
            if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
                return false;
            }
            if (s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4]) || (s[..6] == [0; 6] && s[6] != 0) {
                return is_public(v4(s[6], s[7]));
            }
            if s[0] == 0x2002 {
                return is_public(v4(s[1], s[2]));
            }
            let first = s[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                || first == 0x2001 && v6.segments()[1] == 0x0db8)
        }
    }
}

/// Whether `url`'s host is not an address literal outside the public internet (names are
/// checked when they resolve, by [`public_only_client`]).
pub fn public_url(url: &str) -> bool {
    let Some(host) = reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
    else {
        return false;
    };
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    match literal.parse::<std::net::IpAddr>() {
        Ok(ip) => is_public(ip),
        Err(_) => {
            let name = host.trim_end_matches('.').to_ascii_lowercase();
            name != "localhost" && !name.ends_with(".localhost")
        }
    }
}

/// A resolver whose answers keep only public addresses (none left: the name does not resolve).
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async move {
            let found = tokio::net::lookup_host((name.as_str(), 0)).await?;
            let public: Vec<std::net::SocketAddr> = found.filter(|a| is_public(a.ip())).collect();
            if public.is_empty() {
                return Err(format!("{}: no public address", name.as_str()).into());
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
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

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a00:1",
            "::169.254.169.254",
            "::10.0.0.1",
            "2002:a9fe:a9fe::1",
            "2002:7f00:1::",
        ] {
            assert!(!is_public(private.parse().unwrap()), "{private}");
        }
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
        assert!(!public_url("http://127.0.0.1:8790/v1"));
        assert!(!public_url("http://[::1]/v1"));
        assert!(!public_url("http://169.254.169.254/latest"));
        assert!(!public_url("http://localhost:9464/"));
        assert!(!public_url("http://metrics.localhost./"));
        assert!(public_url("https://api.example.com/v1"));
        assert!(public_url("https://8.8.8.8/v1"));
    }

    #[tokio::test]
    async fn the_public_only_resolver_drops_private_answers() {
        use reqwest::dns::Resolve;
        let name: reqwest::dns::Name = "localhost".parse().unwrap();
        assert!(PublicOnly.resolve(name).await.is_err());
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
