//! `berth doctor`: is the setup working? One line per check — the server answers, the
//! credential signs in, the model endpoint answers, a worker is online — each ok or fail,
//! with the next step when it fails.

use std::time::Duration;

use berth_client::{Client, RetryPolicy, method::Hello, protocol::HelloParams};
use serde::Serialize;

use super::{
    print_json,
    remote::{self, Remote, shown},
    render::Style,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Outcome {
    Ok,
    Fail,
    /// Not checked (an earlier check failed, or it cannot be checked from here).
    Skip,
}

#[derive(Serialize)]
struct Check {
    check: &'static str,
    outcome: Outcome,
    detail: String,
}

async fn checks(remote: &Remote, http: &reqwest::Client) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut add = |check: &'static str, outcome: Outcome, detail: String| {
        checks.push(Check { check, outcome, detail });
    };
    let target = match remote::target(remote.server.as_deref(), remote.token_file.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            add("server", Outcome::Fail, e.to_string());
            for c in ["credential", "model", "worker"] {
                add(c, Outcome::Skip, "no server to ask".into());
            }
            return checks;
        }
    };
    let server = shown(&target.server);

    match http.get(format!("{server}/healthz")).send().await {
        Ok(r) if r.status().is_success() => add("server", Outcome::Ok, format!("{server} answers")),
        Ok(r) => add(
            "server",
            Outcome::Fail,
            format!(
                "{server} answered HTTP {}: is it a Berth server? Pass another with --server",
                r.status().as_u16()
            ),
        ),
        Err(e) => {
            add(
                "server",
                Outcome::Fail,
                format!(
                    "cannot reach {server} ({}): start one with `berth dev`, or pass --server",
                    berth_store::error_chain(&e)
                ),
            );
            for c in ["credential", "model", "worker"] {
                add(c, Outcome::Skip, "the server does not answer".into());
            }
            return checks;
        }
    }

    let retry = RetryPolicy {
        connect_attempts: 1,
        call_retries: 0,
        ..Default::default()
    };
    let signed_in = match Client::connect_with(&target.server, &target.token, retry).await {
        Ok(client) => client
            .call::<Hello>(HelloParams {
                protocol: berth_protocol::PROTOCOL_VERSION,
                token: None,
                client: None,
            })
            .await
            .map(|me| (client, me)),
        Err(e) => Err(e),
    };
    let (client, me) = match signed_in {
        Ok(pair) => pair,
        Err(berth_client::Error::Unauthorized) => {
            add(
                "credential",
                Outcome::Fail,
                format!("{server} refuses it (unauthorized): run `berth login --server {server}`"),
            );
            for c in ["model", "worker"] {
                add(c, Outcome::Skip, "not signed in".into());
            }
            return checks;
        }
        Err(e) => {
            add(
                "credential",
                Outcome::Fail,
                remote::explain(e, &server, remote::Subject::None).to_string(),
            );
            for c in ["model", "worker"] {
                add(c, Outcome::Skip, "not signed in".into());
            }
            return checks;
        }
    };
    let who = me
        .email
        .as_deref()
        .or(me.user_id.as_deref())
        .unwrap_or("a credential without a user");
    add(
        "credential",
        Outcome::Ok,
        format!("signs in as {who} ({}) in tenant {}", me.role, me.tenant_id),
    );

    if me.notices.iter().any(|n| n.code == "provider-unconfigured") {
        add(
            "model",
            Outcome::Fail,
            "the server has no model endpoint: start it with BERTH_MODEL_BASE_URL and BERTH_MODEL set".into(),
        );
    } else {
        // Asked from the server, which holds the endpoint and reaches it as turns do.
        let probe = client
            .call::<berth_client::method::Status>(berth_protocol::StatusParams { probe_model: true })
            .await;
        let model = |p: &berth_protocol::ModelProbe| p.model.clone().unwrap_or_else(|| "the default model".into());
        match probe.map(|s| s.model) {
            Ok(Some(p)) if p.answered => add(
                "model",
                Outcome::Ok,
                format!(
                    "the endpoint of {} answers the server (HTTP {})",
                    model(&p),
                    p.http_status.unwrap_or_default()
                ),
            ),
            Ok(Some(p)) => add(
                "model",
                Outcome::Fail,
                format!(
                    "the endpoint of {} does not answer the server ({}): check BERTH_MODEL_BASE_URL on the server and that the endpoint is up",
                    model(&p),
                    p.error.as_deref().unwrap_or("no answer")
                ),
            ),
            Ok(None) => add(
                "model",
                Outcome::Skip,
                "the server is too old to check its model endpoint".into(),
            ),
            Err(e) => add(
                "model",
                Outcome::Fail,
                remote::explain(e, &server, remote::Subject::None).to_string(),
            ),
        }
    }

    match remote::workspaces(&client).await {
        Ok(list) => {
            let online: Vec<&str> = list.iter().filter(|w| w.online).map(|w| w.title.as_str()).collect();
            if online.is_empty() {
                add(
                    "worker",
                    Outcome::Fail,
                    format!(
                        "none of {} workspace(s) is online: run `berth dev` in a project directory, or start `berth worker` on its machine",
                        list.len()
                    ),
                );
            } else {
                add(
                    "worker",
                    Outcome::Ok,
                    format!(
                        "{} of {} workspace(s) online: {}",
                        online.len(),
                        list.len(),
                        online.join(", ")
                    ),
                );
            }
        }
        Err(e) => add("worker", Outcome::Fail, e.to_string()),
    }
    checks
}

pub async fn doctor(remote: Remote) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .build()?;
    let checks = checks(&remote, &http).await;
    let style = Style::for_stdout(remote.json);
    for c in &checks {
        if remote.json {
            print_json(c)?;
            continue;
        }
        let outcome = match c.outcome {
            Outcome::Ok => style.green("ok  "),
            Outcome::Fail => style.red("fail"),
            Outcome::Skip => style.dim("skip"),
        };
        println!("{outcome}  {:<10}  {}", c.check, c.detail);
    }
    let failed = checks.iter().filter(|c| c.outcome == Outcome::Fail).count();
    anyhow::ensure!(failed == 0, "{failed} check(s) failed");
    Ok(())
}
