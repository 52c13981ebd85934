//! Scale-out behind a real nginx: clients land on different replicas through one address,
//! and sessions, turns and watches work across them.

use berth_e2e::{Client, MockProvider, Reply, Stack, nginx::Nginx};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn replicas_behind_nginx_serve_one_consistent_history() {
    if berth_e2e::nginx::nginx_bin().is_none() {
        // CI installs nginx (.ci/run); on a developer machine without it, say so loudly.
        assert!(std::env::var_os("CI").is_none(), "nginx must be installed in CI");
        eprintln!("SKIPPED: nginx is not installed (apt-get install nginx)");
        return;
    }
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let upstreams: Vec<&str> = stack.servers.iter().map(|s| s.addr.as_str()).collect();
    let nginx = Nginx::start(&upstreams).await.unwrap();

    // Round robin: consecutive connections reach both replicas.
    let mut clients = Vec::new();
    let mut replicas = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let mut c = Client::authed(&nginx.ws_url(), &stack.token).await.unwrap();
        replicas.insert(
            c.ok("status", json!({})).await["replicaId"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        clients.push(c);
    }
    assert_eq!(replicas.len(), 2, "nginx spreads connections over both replicas");

    // A watch on one connection, sends on others: everything arrives once, in order.
    let sid = stack.session(&mut clients[0]).await;
    let mut watch = clients[1].subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    for (i, prompt) in ["one", "two", "three"].iter().enumerate() {
        mock.push(Reply::text(&["answer ", prompt]));
        clients[2 + i % 2]
            .ok("session.send", json!({"sessionId": sid, "prompt": prompt}))
            .await;
        watch.until(30, |e| e["type"] == "turn.ended").await.expect("turn ends");
    }
    let last = clients[3].ok("session.get", json!({"sessionId": sid})).await["sequence"]
        .as_i64()
        .unwrap();
    // Resume through nginx (any replica) from the middle: exactly the rest.
    let mut again = Client::authed(&nginx.ws_url(), &stack.token).await.unwrap();
    let mut resumed = again.subscribe("session.watch", json!({"sessionId": sid, "after": 3}));
    let items = resumed.until(10, |e| e["sequence"] == last).await.expect("caught up");
    let seqs: Vec<i64> = items.iter().filter_map(|e| e["sequence"].as_i64()).collect();
    assert_eq!(seqs, (4..=last).collect::<Vec<_>>());
    let bodies = again.history_bodies(&sid).await;
    assert_eq!(
        bodies,
        ["one", "answer one", "two", "answer two", "three", "answer three"]
    );
    // HTTP passes through too.
    let ready = reqwest::get(format!("http://{}/readyz", nginx.addr)).await.unwrap();
    assert_eq!(ready.status(), 200);
}
