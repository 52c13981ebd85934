//! The worker's probe endpoints (issue 14, the chart's worker probes): with
//! `--health-listen`, `/healthz` answers while the process runs and `/readyz` only while the
//! worker is registered with the API tier — it turns unready when the API tier goes away and
//! the worker is left retrying.

use berth_e2e::{MockProvider, Stack, harness::eventually};

async fn status(url: &str) -> Option<u16> {
    reqwest::get(url).await.ok().map(|r| r.status().as_u16())
}

#[tokio::test]
async fn readyz_follows_the_link_to_the_api_tier() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    stack.kill_worker().await;
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("addr").to_string()
    };
    stack.start_worker_with_args(0, &["--health-listen", &addr]).await;
    let (healthz, readyz) = (format!("http://{addr}/healthz"), format!("http://{addr}/readyz"));

    assert_eq!(status(&healthz).await, Some(200));
    // The workspace is online: the worker's hello was accepted (its answer may still be on
    // the way to the worker).
    let ready = eventually(30, || {
        let readyz = readyz.clone();
        async move { (status(&readyz).await == Some(200)).then_some(()) }
    })
    .await;
    assert!(ready.is_some(), "/readyz never ready while registered");

    stack.servers[0].terminate().await;
    let unready = eventually(30, || {
        let readyz = readyz.clone();
        async move { (status(&readyz).await == Some(503)).then_some(()) }
    })
    .await;
    assert!(unready.is_some(), "/readyz still ready with the API tier gone");
    // Retrying, not dead: liveness must not restart it.
    assert_eq!(status(&healthz).await, Some(200));
}
