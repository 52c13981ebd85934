//! Hardening of the client connection and the database connection (issue 7): sign-in,
//! slow readers, subscription slots, unauthenticated connections, login behind a proxy,
//! NUL checks. Each test fails on the code before the fix.

use std::time::Duration;

use berth_e2e::{
    Client, MockProvider, Reply, Stack, TestServer,
    client::code,
    fresh_database,
    harness::{eventually, metric},
};
use serde_json::{Value, json};

fn is_turn_end(v: &Value) -> bool {
    v["type"] == "turn.ended"
}

async fn wait_closed(c: &Client, secs: u64) -> Option<Option<u16>> {
    eventually(secs, || {
        let closed = *c.closed.lock().unwrap();
        async move { closed }
    })
    .await
}

/// A signed-in connection refuses `hello` as another principal and stays exactly who it
/// was: still registered, so revoking its credential still closes it.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_hello_cannot_switch_principals() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let server = TestServer::start(&db, &mock.base_url()).await.unwrap();
    let mut admin = Client::authed(&server.ws_url(), &server.admin_token()).await.unwrap();
    let me = admin.ok("hello", json!({"protocol": 1})).await;
    let mine = admin
        .ok(
            "admin.credential.create",
            json!({"userId": me["userId"], "note": "mine"}),
        )
        .await;
    let other = admin
        .ok("admin.user.create", json!({"email": "other@example.com"}))
        .await;
    let theirs = admin
        .ok(
            "admin.credential.create",
            json!({"userId": other["userId"], "note": "theirs"}),
        )
        .await;

    let mut c = Client::authed(&server.ws_url(), mine["token"].as_str().unwrap())
        .await
        .unwrap();
    let err = c.hello(theirs["token"].as_str().unwrap()).await.unwrap_err();
    assert_eq!(code(&err), "conflict", "{err:?}");
    // Another credential of the same user is another principal too.
    let again = admin
        .ok(
            "admin.credential.create",
            json!({"userId": me["userId"], "note": "again"}),
        )
        .await;
    let err = c.hello(again["token"].as_str().unwrap()).await.unwrap_err();
    assert_eq!(code(&err), "conflict");
    // The same token again is fine, and the connection is still the first principal.
    let same = c.hello(mine["token"].as_str().unwrap()).await.unwrap();
    assert_eq!(same["userId"], me["userId"]);
    assert_eq!(c.ok("hello", json!({"protocol": 1})).await["userId"], me["userId"]);
    // Its registration is intact: revoking the original credential closes it.
    admin
        .ok("admin.credential.revoke", json!({"credentialId": mine["credentialId"]}))
        .await;
    let closed = wait_closed(&c, 20).await;
    assert_eq!(closed, Some(Some(1008)), "closed as revoked");
}

/// A connection that never says `hello` is closed after the hello timeout; unauthenticated
/// connections are capped per address (authenticated ones are not counted there).
#[tokio::test(flavor = "multi_thread")]
async fn unauthenticated_connections_time_out_and_are_capped_per_address() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let env = [
        ("BERTH_HELLO_TIMEOUT_SECS", "2"),
        ("BERTH_MAX_UNAUTHENTICATED_PER_ADDRESS", "2"),
    ];
    let server = TestServer::start_with(&db, &mock.base_url(), &env).await.unwrap();
    let token = server.admin_token();
    let url = server.ws_url();

    let silent = Client::connect(&url).await.unwrap();
    let mut late = Client::connect(&url).await.unwrap();
    let refused = Client::connect(&url).await.err().expect("a third is refused");
    assert!(format!("{refused:#}").contains("429"), "{refused:#}");
    // An authenticated upgrade is not an unauthenticated connection.
    let mut authed = Client::connect_with(&url, Some(&token), None).await.unwrap();
    // Signing in frees the place.
    late.hello(&token).await.unwrap();
    let mut third = Client::connect(&url).await.unwrap();
    third.hello(&token).await.unwrap();

    assert_eq!(wait_closed(&silent, 20).await, Some(Some(1008)), "closed without hello");
    assert!(!late.is_closed() && !third.is_closed());
    assert_eq!(authed.ok("ping", json!({})).await["pong"], true);
    assert_eq!(late.ok("ping", json!({})).await["pong"], true);
    // The closed one's place is free again.
    let mut fresh = Client::connect(&url).await.unwrap();
    fresh.hello(&token).await.unwrap();
}

async fn login(addr: &str, email: &str, password: &str, forwarded_for: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}/v1/auth/login"))
        .json(&json!({"tenant": "default", "email": email, "password": password}));
    if let Some(xff) = forwarded_for {
        req = req.header("x-forwarded-for", xff);
    }
    req.send().await.unwrap()
}

/// Logging in again mints a new token each time; the per-credential connection limit
/// counts the user, so the tokens do not multiply it.
#[tokio::test(flavor = "multi_thread")]
async fn login_tokens_share_their_users_connection_limit() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let env = [("BERTH_MAX_CONNECTIONS_PER_CREDENTIAL", "2")];
    let server = TestServer::start_with(&db, &mock.base_url(), &env).await.unwrap();
    let mut admin = Client::authed(&server.ws_url(), &server.admin_token()).await.unwrap();
    admin
        .ok(
            "admin.user.create",
            json!({"email": "person@example.com", "password": "pw-secret-long-enough"}),
        )
        .await;
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let resp = login(&server.addr, "person@example.com", "pw-secret-long-enough", None).await;
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        tokens.push(body["token"].as_str().unwrap().to_string());
    }
    let url = server.ws_url();
    let _a = Client::connect_with(&url, Some(&tokens[0]), None).await.unwrap();
    let _b = Client::connect_with(&url, Some(&tokens[1]), None).await.unwrap();
    let refused = Client::connect_with(&url, Some(&tokens[2]), None).await.err();
    assert!(format!("{:#}", refused.expect("a third is refused")).contains("429"));
    let mut c = Client::connect(&url).await.unwrap();
    let err = c.hello(&tokens[2]).await.unwrap_err();
    assert_eq!(code(&err), "rate-limited");
}

/// `count` login attempts with wrong passwords for different accounts, all sent at once
/// (so that no bucket refills meanwhile); returns their statuses.
async fn login_burst(addr: &str, count: usize, forwarded_for: impl Fn(usize) -> String) -> Vec<u16> {
    let attempts = (0..count).map(|i| {
        let xff = forwarded_for(i);
        async move {
            let resp = login(addr, &format!("nobody{i}@example.com"), "wrong", Some(&xff)).await;
            resp.status().as_u16()
        }
    });
    futures_util::future::join_all(attempts).await
}

/// Behind a trusted proxy the per-address login limit keys on the client's address from
/// `X-Forwarded-For`, so one client cannot lock out everyone behind the same proxy; from
/// an untrusted peer the header is ignored.
#[tokio::test(flavor = "multi_thread")]
async fn login_limits_key_on_the_forwarded_client_behind_a_trusted_proxy() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    // One password check at a time: the burst is answered quickly (503 past the first).
    let env = [
        ("BERTH_TRUSTED_PROXIES", "127.0.0.0/8"),
        ("BERTH_MAX_PASSWORD_CHECKS", "1"),
    ];
    let server = TestServer::start_with(&db, &mock.base_url(), &env).await.unwrap();
    // The per-address bucket holds 20 attempts; each attempt names another account so that
    // only the address limit can refuse.
    let noisy = tokio::spawn({
        let server_addr = server.addr.clone();
        async move { login_burst(&server_addr, 25, |_| "198.51.100.7".into()).await }
    });
    // While the burst is being answered (the address bucket refills one attempt per 3 s).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = login(&server.addr, "nobody-else@example.com", "wrong", Some("198.51.100.8")).await;
    assert_ne!(
        resp.status(),
        429,
        "another client behind the same proxy is not limited"
    );
    let statuses = noisy.await.unwrap();
    assert!(statuses.contains(&429), "the noisy client is limited: {statuses:?}");

    // Without the setting, the header is the client's word and counts for nothing.
    let db = fresh_database().await;
    let env = [("BERTH_MAX_PASSWORD_CHECKS", "1")];
    let server = TestServer::start_with(&db, &mock.base_url(), &env).await.unwrap();
    let statuses = login_burst(&server.addr, 25, |i| format!("203.0.113.{i}")).await;
    assert!(
        statuses.contains(&429),
        "forged headers do not escape the limit: {statuses:?}"
    );
}

/// Password verifications are capped per replica: past the cap a login is answered 503
/// with `Retry-After` instead of queueing another 19 MiB argon2 run.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_password_checks_are_capped() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let env = [("BERTH_MAX_PASSWORD_CHECKS", "1")];
    let server = TestServer::start_with(&db, &mock.base_url(), &env).await.unwrap();
    // Sent at once: each verification takes far longer than sending the next request.
    let attempts = (0..8).map(|i| {
        let addr = &server.addr;
        async move { login(addr, &format!("nobody{i}@example.com"), "wrong", None).await }
    });
    let responses = futures_util::future::join_all(attempts).await;
    let statuses: Vec<u16> = responses.iter().map(|r| r.status().as_u16()).collect();
    assert!(statuses.contains(&401), "{statuses:?}");
    let busy: Vec<&reqwest::Response> = responses.iter().filter(|r| r.status() == 503).collect();
    assert!(!busy.is_empty(), "{statuses:?}");
    assert_eq!(busy[0].headers()["retry-after"], "1");
}

/// The NUL check looks at decoded strings: the JSON text `\\u0000` (a backslash, then
/// `u0000`) is legitimate; an actual NUL character is refused.
#[tokio::test(flavor = "multi_thread")]
async fn nul_is_refused_but_its_escaped_spelling_is_not() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let server = TestServer::start(&db, &mock.base_url()).await.unwrap();
    let mut admin = Client::authed(&server.ws_url(), &server.admin_token()).await.unwrap();
    let me = admin.ok("hello", json!({"protocol": 1})).await;
    let literal = r"printf '\u0000' | xxd";
    let cred = admin
        .ok(
            "admin.credential.create",
            json!({"userId": me["userId"], "note": literal}),
        )
        .await;
    let list = admin.ok("admin.credential.list", json!({})).await;
    let stored = list
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["credentialId"] == cred["credentialId"])
        .unwrap()
        .clone();
    assert_eq!(stored["note"], literal);
    let err = admin
        .call(
            "admin.credential.create",
            json!({"userId": me["userId"], "note": "a\u{0}b"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), "bad-params");
    assert_eq!(err.data["reason"], "nul-character");
}

/// A session title a client sets is bounded wherever it is set: `session.create` as
/// `session.rename` (`bad-params {field, max}`), and nothing is created past it.
#[tokio::test(flavor = "multi_thread")]
async fn session_titles_are_bounded_at_create_as_at_rename() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let max = berth_protocol::MAX_SESSION_TITLE_BYTES;
    let long = "t".repeat(max + 1);
    let err = c
        .call(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "title": long}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), "bad-params");
    assert_eq!(err.data["field"], "title");
    assert_eq!(err.data["max"], max);
    let list = c.ok("session.list", json!({})).await;
    assert_eq!(list["entries"], json!([]), "no session was created");

    let fits = "t".repeat(max);
    let s = c
        .ok(
            "session.create",
            json!({"workspaceId": stack.workspace_id, "title": fits}),
        )
        .await;
    assert_eq!(s["title"], fits);
    let err = c
        .call("session.rename", json!({"sessionId": s["sessionId"], "title": long}))
        .await
        .unwrap_err();
    assert_eq!((code(&err), &err.data["max"]), ("bad-params", &json!(max)));
}

/// Run `turns` turns whose answers are `bytes` long each; returns the session id.
async fn session_with_big_answers(stack: &Stack, mock: &MockProvider, turns: usize, bytes: usize) -> String {
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let chunk = "x".repeat(64 << 10);
    let mut parts: Vec<&str> = vec![chunk.as_str(); bytes / chunk.len()];
    let rest = "y".repeat(bytes % chunk.len());
    parts.push(&rest);
    let mut w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    for i in 0..turns {
        mock.push(Reply::text(&parts));
        c.ok(
            "session.send",
            json!({"sessionId": sid, "prompt": format!("answer {i}")}),
        )
        .await;
        w.until(60, is_turn_end).await.expect("turn ends");
    }
    sid
}

/// The peak resident memory of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn client_connections(metrics: &str) -> Option<i64> {
    metrics
        .lines()
        .find(|l| l.starts_with("berth_connections{kind=\"client\"}"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

/// A client that never reads cannot make a replica hold more than its outbound byte budget
/// (plus the responses of its in-flight requests), and its connection counts against the
/// per-credential limit until it is really gone: the write timeout drops it, and only
/// then may the credential connect again.
#[tokio::test(flavor = "multi_thread")]
async fn a_reader_that_never_reads_is_bounded_and_counted_until_gone() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let sid = session_with_big_answers(&stack, &mock, 1, 900 << 10).await;
    // A replica of its own, so that its memory and connections are this test's alone.
    let env = [
        ("BERTH_MAX_CONNECTIONS_PER_CREDENTIAL", "1"),
        ("BERTH_WS_OUTBOUND_BYTES", "1048576"),
        ("BERTH_MAX_IN_FLIGHT", "8"),
        ("BERTH_WS_WRITE_TIMEOUT_SECS", "3"),
        ("BERTH_WS_PING_SECS", "1"),
        ("BERTH_WS_IDLE_SECS", "2"),
    ];
    let replica = TestServer::start_with(&stack.database_url, &mock.base_url(), &env)
        .await
        .unwrap();
    let pid = replica.child.id().unwrap();
    let baseline = peak_rss(pid);
    let mut admin = stack.client(0).await;
    let me = admin.ok("hello", json!({"protocol": 1})).await;
    let cred = admin
        .ok(
            "admin.credential.create",
            json!({"userId": me["userId"], "note": "slow"}),
        )
        .await;
    let token = cred["token"].as_str().unwrap().to_string();
    let mut stalled = Client::authed(&replica.ws_url(), &token).await.unwrap();
    let page = stalled
        .ok("session.history", json!({"sessionId": sid, "maxBytes": 1 << 20}))
        .await;
    assert!(page.to_string().len() > 900 << 10, "one page is about 1 MB");
    stalled.pause_reading(true);
    // 300 MB of answers asked for, none read. Paced, so that a server without a byte
    // bound would answer (and queue) nearly all of them rather than refuse most as
    // over the in-flight limit.
    for i in 0..300 {
        stalled.send_raw(
            &json!({"jsonrpc": "2.0", "id": 1000 + i, "method": "session.history",
                    "params": {"sessionId": sid, "maxBytes": 1 << 20}})
            .to_string(),
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // While it is there, it counts: the credential has no room for another connection.
    let refused = Client::connect_with(&replica.ws_url(), Some(&token), None).await.err();
    assert!(format!("{:#}", refused.expect("refused while the stalled one lives")).contains("429"));
    // The credential gets a connection again only once the stalled one is gone.
    let next = eventually(60, || {
        let (url, token) = (replica.ws_url(), token.clone());
        async move { Client::connect_with(&url, Some(&token), None).await.ok() }
    })
    .await
    .expect("the stalled connection is dropped and the credential may connect again");
    let open = client_connections(&replica.metrics().await);
    assert_eq!(open, Some(1), "the stalled connection is gone, not a zombie");
    let grown = peak_rss(pid).saturating_sub(baseline);
    // The bound: the budget (1 MiB) + 8 in-flight answers waiting for room (~1 MB each,
    // held encoded and as a value: ~2 MB) + slack for the allocator.
    assert!(grown < 64 << 20, "the replica grew by {} MiB", grown >> 20);
    drop(next);
}

/// Append `count` events of about `bytes` each to a session, straight into the database: the
/// API appends history this large only through turns, whose conversation grows with it.
async fn append_big_events(stack: &Stack, sid: &str, count: usize, bytes: usize) {
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let text = "z".repeat(bytes);
    for _ in 0..count {
        db.execute(
            "WITH s AS (UPDATE sessions SET last_sequence = last_sequence + 1 WHERE id = $1
                         RETURNING tenant_id, last_sequence)
             INSERT INTO events (session_id, sequence, tenant_id, type, payload)
             SELECT $1, last_sequence, tenant_id, 'session.notice',
                    jsonb_build_object('level', 'info', 'code', 'bulk', 'params', jsonb_build_object('text', $2::text)) FROM s",
            &[&sid, &text],
        )
        .await
        .unwrap();
    }
}

/// `subscription.close` stops a watch in the middle of its catch-up: what the closed watch
/// still delivers is what was already queued, not the rest of the history.
#[tokio::test(flavor = "multi_thread")]
async fn closing_a_watch_stops_its_catch_up() {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(&mock, 1, &[("BERTH_WS_OUTBOUND_BYTES", "262144")]).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let total = 40;
    append_big_events(&stack, &sid, total, 900 << 10).await;
    c.pause_reading(true);
    let mut sub = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    // Let the catch-up fill the socket buffers and the outbound queue (~36 MB of history
    // is far more than they hold), then close it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.send_raw(
        &json!({"jsonrpc": "2.0", "id": 99, "method": "subscription.close", "params": {"id": sub.id}}).to_string(),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.pause_reading(false);
    let done = tokio::time::timeout(Duration::from_secs(60), &mut sub.done)
        .await
        .expect("the closed watch is answered")
        .expect("response");
    assert!(done.error.is_none(), "{:?}", done.error);
    let mut delivered = 0;
    while let Ok(item) = sub.items.try_recv() {
        if item["code"] == "bulk" {
            delivered += 1;
        }
    }
    assert!(
        delivered < total,
        "the closed watch went on to send all {delivered} events"
    );
    // The connection is fine and the id can be used again.
    assert_eq!(c.ok("ping", json!({})).await["pong"], true);
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command makes the test certificates");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A throwaway CA, a certificate for localhost signed by it, and an unrelated CA.
fn throwaway_certificates(dir: &std::path::Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "1",
    ];
    let ca = [
        &["req", "-x509"][..],
        &ec,
        &["-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=berth test CA"],
    ]
    .concat();
    openssl(dir, &ca);
    let other = [
        &["req", "-x509"][..],
        &ec,
        &["-keyout", "other.key", "-out", "other.crt", "-subj", "/CN=unrelated CA"],
    ]
    .concat();
    openssl(dir, &other);
    let csr = [
        &["req"][..],
        &ec,
        &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"],
    ]
    .concat();
    openssl(dir, &csr);
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "san.ext",
        ],
    );
}

/// Whether the sessions named `app` are encrypted, as the server sees them.
async fn encrypted(admin: &tokio_postgres::Client, app: &str) -> Vec<bool> {
    admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
            &[&app],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The store honours `sslmode` over TCP: `require` and `prefer` encrypt (with rustls),
/// `disable` does not; with a CA file the server must prove itself against that CA. The
/// LISTEN connection follows the same rules as the pool.
#[tokio::test(flavor = "multi_thread")]
async fn database_tls_follows_sslmode() {
    use berth_store::{
        DbOptions, Store,
        cluster::{ClusterOptions, PrivateCluster},
    };
    let dir = berth_e2e::harness::scratch_dir("tls");
    throwaway_certificates(&dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = ClusterOptions {
        unsafe_no_fsync: true,
        tcp_port: Some(port),
        tls: Some((dir.join("server.crt"), dir.join("server.key"))),
        ..ClusterOptions::default()
    };
    let cluster_dir = dir.join("cluster");
    let cluster = tokio::task::spawn_blocking(move || PrivateCluster::start(&cluster_dir, &options))
        .await
        .unwrap()
        .expect("a TLS cluster");
    let admin = berth_e2e::harness::db(&cluster.url("postgres")).await;
    let url = |mode: &str, app: &str| {
        format!("host=localhost port={port} user=berth dbname=postgres sslmode={mode} application_name={app}")
    };

    let mut stores = Vec::new();
    for (mode, tls) in [("require", true), ("prefer", true), ("disable", false)] {
        let app = format!("berth_{mode}");
        let store = Store::connect(&url(mode, &app), 1).unwrap();
        store
            .notify("berth_test", "x")
            .await
            .unwrap_or_else(|e| panic!("sslmode={mode}: {e}"));
        assert_eq!(encrypted(&admin, &app).await, vec![tls], "sslmode={mode}");
        stores.push(store);
    }
    let (_listening, _rx) = stores[0].listen(&["berth_test"]).await.unwrap();
    assert_eq!(
        encrypted(&admin, "berth_require").await,
        vec![true, true],
        "pool and LISTEN"
    );

    // Verified against the CA that signed the server's certificate: accepted.
    let verified = DbOptions {
        max_size: 1,
        ca_file: Some(dir.join("ca.crt")),
        ..DbOptions::default()
    };
    let store = Store::connect_with(&url("require", "berth_verified"), &verified).unwrap();
    store.notify("berth_test", "x").await.unwrap();
    assert_eq!(encrypted(&admin, "berth_verified").await, vec![true]);
    // Any other CA: the server cannot prove itself, nothing is sent.
    let unrelated = DbOptions {
        ca_file: Some(dir.join("other.crt")),
        ..verified
    };
    let store = Store::connect_with(&url("require", "berth_unverified"), &unrelated).unwrap();
    assert!(store.notify("berth_test", "x").await.is_err());
    assert!(encrypted(&admin, "berth_unverified").await.is_empty());
}

/// A TCP proxy to the test cluster's Unix socket that can make the LISTEN connections open
/// at that moment go silent: their bytes are taken and dropped both ways and nothing is
/// closed, as with a peer lost behind a network failure.
struct SilencingProxy {
    addr: std::net::SocketAddr,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::sync::Arc<ProxiedConn>>>>,
}

#[derive(Default)]
struct ProxiedConn {
    listens: std::sync::atomic::AtomicBool,
    silent: std::sync::atomic::AtomicBool,
}

impl SilencingProxy {
    async fn start(socket: std::path::PathBuf) -> SilencingProxy {
        use std::sync::{Arc, atomic::Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        async fn pump(
            mut from: impl tokio::io::AsyncRead + Unpin,
            mut to: impl tokio::io::AsyncWrite + Unpin,
            conn: Arc<ProxiedConn>,
            from_client: bool,
        ) {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if from_client && buf[..n].windows(7).any(|w| w == b"LISTEN ") {
                    conn.listens.store(true, Ordering::SeqCst);
                }
                if conn.silent.load(Ordering::SeqCst) {
                    continue;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<std::sync::Mutex<Vec<Arc<ProxiedConn>>>> = Arc::default();
        let registry = conns.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(unix) = tokio::net::UnixStream::connect(&socket).await else {
                    continue;
                };
                let conn = Arc::new(ProxiedConn::default());
                registry.lock().unwrap().push(conn.clone());
                let (tr, tw) = tcp.into_split();
                let (ur, uw) = unix.into_split();
                tokio::spawn(pump(tr, uw, conn.clone(), true));
                tokio::spawn(pump(ur, tw, conn, false));
            }
        });
        SilencingProxy { addr, conns }
    }

    /// Silence every LISTEN connection open now; returns how many.
    fn silence_listeners(&self) -> usize {
        use std::sync::atomic::Ordering;
        let conns = self.conns.lock().unwrap();
        let listening: Vec<_> = conns.iter().filter(|c| c.listens.load(Ordering::SeqCst)).collect();
        for c in &listening {
            c.silent.store(true, Ordering::SeqCst);
        }
        listening.len()
    }
}

fn listen_reconnects(metrics: &str) -> u64 {
    metric(metrics, "berth_db_listen_reconnects_total").unwrap_or(0)
}

/// A LISTEN connection that goes silent without closing (half-open) is noticed by its
/// probe and replaced, so live deltas from the replica running a turn reach this replica's
/// watchers again.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_listen_connection_is_noticed_and_replaced() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    // The test cluster's socket and this test's database, from `host=… port=… … dbname=…`.
    let field = |k: &str| {
        stack
            .database_url
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
            .unwrap()
            .to_string()
    };
    let socket = std::path::Path::new(&field("host")).join(format!(".s.PGSQL.{}", field("port")));
    let proxy = SilencingProxy::start(socket).await;
    let url = format!(
        "host=127.0.0.1 port={} user={} dbname={} sslmode=disable",
        proxy.addr.port(),
        field("user"),
        field("dbname")
    );
    let env = [("BERTH_DB_PROBE_SECS", "1"), ("BERTH_DB_PROBE_TIMEOUT_SECS", "1")];
    let replica = TestServer::start_with(&url, &mock.base_url(), &env).await.unwrap();

    let mut writer = stack.client(0).await;
    let sid = stack.session(&mut writer).await;
    let mut watcher = Client::authed(&replica.ws_url(), &stack.token).await.unwrap();
    let mut w = watcher.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    assert!(w.next(10).await.is_some());
    // Silence it only once it listens on every channel: a connection silenced halfway
    // through its LISTENs fails its set-up, which is retried but is no lost connection.
    let up = eventually(30, || {
        let replica = &replica;
        async move {
            metric(&replica.metrics().await, "berth_db_listen_up")
                .filter(|&v| v == 1)
                .map(|_| ())
        }
    })
    .await;
    assert!(up.is_some(), "the replica listens");
    let silenced = eventually(10, || {
        let n = proxy.silence_listeners();
        async move { (n > 0).then_some(n) }
    })
    .await;
    assert_eq!(silenced, Some(1), "the replica's one LISTEN connection");
    let noticed = eventually(30, || {
        let replica = &replica;
        async move { (listen_reconnects(&replica.metrics().await) > 0).then_some(()) }
    })
    .await;
    assert!(noticed.is_some(), "the silent LISTEN connection is noticed");

    // The turn runs on replica 0's worker; its live deltas reach replica 1 only by NOTIFY.
    // The reconnect counter moves when the old connection is given up, before the new one
    // listens: turns until one's deltas arrive (a listener never replaced fails them all).
    let mut seen = Vec::new();
    for _ in 0..5 {
        let mut parts = Vec::new();
        for word in ["one ", "two ", "three ", "four ", "five"] {
            parts.push(berth_e2e::Part::Text(word.into()));
            parts.push(berth_e2e::Part::Delay(300));
        }
        mock.push(Reply::Stream(parts));
        writer
            .ok("session.send", json!({"sessionId": sid, "prompt": "count"}))
            .await;
        let items = w.until(30, is_turn_end).await.expect("the turn ends");
        let live = items.iter().any(|i| i["type"] == "model.delta");
        seen.push(items);
        if live {
            return;
        }
    }
    panic!("live deltas never arrive again: {seen:?}");
}

/// Uploaded bodies count against the replica's memory until they are stored
/// (`BERTH_UPLOAD_MEMORY_BYTES`), across connections: past it an upload is refused
/// `rate-limited {limit: "upload-memory"}`, not held. Here the object store never answers,
/// so the first upload holds its share.
#[tokio::test(flavor = "multi_thread")]
async fn uploaded_bodies_are_held_within_the_replicas_memory() {
    use tokio::io::AsyncReadExt;
    let stalled = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", stalled.local_addr().unwrap());
    let (reached, mut reached_rx) = tokio::sync::mpsc::unbounded_channel();
    // Reads every request and answers none.
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = stalled.accept().await {
            let reached = reached.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = sock.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let _ = reached.send(n);
                }
            });
        }
    });
    let mock = MockProvider::start().await;
    let env = [
        ("BERTH_OBJECT_STORE", "s3://stalled/blobs"),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "test-access-key"),
        ("AWS_SECRET_ACCESS_KEY", "test-secret-key"),
        ("AWS_REGION", "us-east-1"),
        ("BERTH_OBJECT_SWEEP_SECS", "3600000"),
        ("BERTH_MAX_ATTACHMENT_BYTES", "614400"),
        // The budget is never below the largest message a connection takes.
        ("BERTH_MAX_TEXT_MESSAGE", "65536"),
        ("BERTH_UPLOAD_MEMORY_BYTES", "1048576"),
    ];
    let stack = Stack::start_with(&mock, 1, &env).await;
    let mut first = stack.client(0).await;
    let sid = stack.session(&mut first).await;
    let upload = |name: &str| json!({"sessionId": sid, "mime": "application/octet-stream", "filename": name});
    let held = tokio::spawn({
        let params = upload("first.bin");
        async move { first.upload(params, &[b'a'; 600 * 1024], None).await }
    });
    // The first body is held once its store has begun.
    tokio::time::timeout(Duration::from_secs(30), reached_rx.recv())
        .await
        .expect("the object store was asked to store the first body")
        .unwrap();
    let mut second = stack.client(0).await;
    let err = second
        .upload(upload("second.bin"), &[b'b'; 600 * 1024], None)
        .await
        .unwrap_err();
    assert_eq!(code(&err), "rate-limited");
    assert_eq!(err.data["limit"], "upload-memory");
    assert_eq!(err.data["max"], 1048576);
    // The connection goes on; the first upload still waits for the store.
    assert_eq!(second.ok("ping", json!({})).await["pong"], true);
    assert!(!held.is_finished());
    held.abort();
}
