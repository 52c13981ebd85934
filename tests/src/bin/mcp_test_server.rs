//! A minimal MCP server over stdio (newline-delimited JSON-RPC 2.0) for the end-to-end
//! tests: it offers one tool, `echo {text}`, whose answer also tells where it runs (its
//! working directory and the names of its environment variables), so a test can check that
//! the worker starts it inside the workspace with a clean environment. With `PIDFILE` set it
//! writes its process id there first.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

fn main() {
    if let Ok(path) = std::env::var("PIDFILE") {
        std::fs::write(path, std::process::id().to_string()).expect("pid file");
    }
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        // Notifications (no id) need no answer.
        let Some(id) = msg.get("id").cloned() else {
            continue;
        };
        let reply = match msg["method"].as_str().unwrap_or_default() {
            "initialize" => json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "berth-mcp-test-server", "version": "1.0.0"}
            }}),
            "tools/list" => json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [{
                "name": "echo",
                "description": "Echo the text back, with where the server runs.",
                "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
            }]}}),
            "tools/call" if msg["params"]["name"] == "echo" => {
                let text = msg["params"]["arguments"]["text"].as_str().unwrap_or_default();
                let cwd = std::env::current_dir()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default();
                let mut names: Vec<String> = std::env::vars_os()
                    .map(|(k, _)| k.to_string_lossy().into_owned())
                    .collect();
                names.sort();
                let answer = format!("echo: {text}\ncwd: {cwd}\nenv: {}", names.join(","));
                json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": answer}], "isError": false}})
            }
            "ping" => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            _ => json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}}),
        };
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
}
