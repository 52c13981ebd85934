//! The TypeScript example client (`clients/typescript/example-client.ts`), compiled by `tsc`
//! with the checked-in `tsconfig.json` and run by Node against a real server: its
//! `subscribe` resolves once the watch has started, so `demo` sends, follows the turn to its
//! end and closes the watch.

use std::{path::PathBuf, process::Stdio};

use berth_e2e::{MockProvider, Reply, Stack, harness::scratch_dir};

fn ts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/typescript")
}

/// `tsc` and a Node with WebSocket (`--experimental-websocket` on Node 20/21, built in
/// later). Absent outside CI → skipped with a note; in CI they must be there.
fn tools() -> Option<(PathBuf, PathBuf)> {
    let tsc = [
        std::env::var_os("BERTH_TSC").map(PathBuf::from),
        Some(PathBuf::from("/var/tmp/berth-ts/node_modules/.bin/tsc")),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.exists());
    let node = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("node"))
            .find(|p| p.is_file())
    });
    match (tsc, node) {
        (Some(t), Some(n)) => Some((t, n)),
        _ if std::env::var_os("CI").is_some() => panic!("tsc and node are needed (as .ci/run installs them)"),
        _ => None,
    }
}

#[tokio::test]
async fn the_example_client_subscribes_follows_a_turn_and_closes_its_watch() {
    let Some((tsc, node)) = tools() else {
        eprintln!("SKIPPED: tsc or node not installed");
        return;
    };
    let out = scratch_dir("ts-client");
    let compiled = std::process::Command::new(&tsc)
        .arg("-p")
        .arg(ts_dir().join("tsconfig.json"))
        .args(["--noEmit", "false", "--outDir"])
        .arg(&out)
        .output()
        .expect("run tsc");
    assert!(
        compiled.status.success(),
        "tsc: {}{}",
        String::from_utf8_lossy(&compiled.stdout),
        String::from_utf8_lossy(&compiled.stderr)
    );
    std::fs::write(out.join("package.json"), r#"{"type": "module"}"#).unwrap();
    std::fs::write(
        out.join("run.mjs"),
        r#"import { BerthClient, demo } from "./example-client.js";
const [url, token] = process.argv.slice(2);
const ws = new WebSocket(url);
await new Promise((open, fail) => { ws.onopen = open; ws.onerror = fail; });
const text = await demo(new BerthClient(ws), token);
console.log(JSON.stringify({ text }));
ws.close();
"#,
    )
    .unwrap();

    let mock = MockProvider::start().await;
    mock.push(Reply::text(&["Hello ", "from ", "TypeScript"]));
    let stack = Stack::start(&mock, 1).await;
    // Node 22+ has WebSocket built in; on older ones it sits behind a flag.
    let version = std::process::Command::new(&node).arg("--version").output().unwrap();
    let major: u32 = String::from_utf8_lossy(&version.stdout)
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let mut run = tokio::process::Command::new(&node);
    if major < 22 {
        run.arg("--experimental-websocket");
    }
    let ran = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        run.arg(out.join("run.mjs"))
            .arg(stack.servers[0].ws_url())
            .arg(&stack.token)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output(),
    )
    .await
    .expect("demo ends: its watch started, so the turn's end was seen")
    .unwrap();
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(ran.status.success(), "{stdout}{}", String::from_utf8_lossy(&ran.stderr));
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("{stdout}"));
    let result: serde_json::Value = serde_json::from_str(line).unwrap();
    let text = result["text"].as_str().unwrap();
    assert!(text.starts_with("Hello from TypeScript\n[completed]"), "{text}");
}
