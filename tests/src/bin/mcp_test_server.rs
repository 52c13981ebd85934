//! A minimal MCP server for the end-to-end tests: it offers one tool, `echo {text}`, whose
//! answer also tells where it runs (its working directory, its `WHERE` variable and the names
//! of its environment variables), so a test can check that the worker starts it outside the
//! workspace, told where the workspace is, with a clean environment.
//!
//! By default it speaks stdio (newline-delimited JSON-RPC 2.0, written by hand); with `PIDFILE`
//! set it writes its process id there first; with `LINGER` set it stays after its input ends
//! (until killed); with `ESCAPEE` set it starts `sleep` in a process group of its own (as a
//! daemon would) and writes that process's id there; with `QUIT` set it then exits before
//! any handshake (a server that fails to start), with `HANG` set it never answers one (a
//! server that never starts). With `--http` it serves streamable HTTP instead
//! (rmcp's server side) on a free local port, printing its URL as the first line of stdout;
//! with `REQUIRE_HEADER=name:value` every request without that header is refused (401). Over
//! stdio, `TOOL_NAME` names the tool in place of `echo`.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

const DESCRIPTION: &str = "Echo the text back, with where the server runs.";

fn schema() -> Value {
    json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
}

fn echo(text: &str) -> String {
    let cwd = std::env::current_dir()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let mut names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    names.sort();
    // `WHERE`: a value the worker may have filled in (`${workspace}`).
    let place = std::env::var("WHERE").unwrap_or_default();
    format!("echo: {text}\ncwd: {cwd}\nwhere: {place}\nenv: {}", names.join(","))
}

fn main() {
    if let Ok(path) = std::env::var("PIDFILE") {
        std::fs::write(path, std::process::id().to_string()).expect("pid file");
    }
    if let Ok(path) = std::env::var("ESCAPEE") {
        use std::os::unix::process::CommandExt;
        // Left running on purpose, never waited for: the worker must kill it.
        #[allow(clippy::zombie_processes)]
        let child = std::process::Command::new("sleep")
            .arg("600")
            .process_group(0)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("escapee");
        std::fs::write(path, child.id().to_string()).expect("escapee pid file");
    }
    if std::env::var_os("QUIT").is_some() {
        std::process::exit(1);
    }
    if std::env::var_os("HANG").is_some() {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    if std::env::args().any(|a| a == "--http") {
        http::serve();
    } else {
        stdio();
    }
}

fn stdio() {
    let tool = std::env::var("TOOL_NAME").unwrap_or_else(|_| "echo".into());
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
                "name": tool,
                "description": DESCRIPTION,
                "inputSchema": schema(),
            }]}}),
            "tools/call" if msg["params"]["name"] == tool.as_str() => {
                let text = msg["params"]["arguments"]["text"].as_str().unwrap_or_default();
                json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": echo(text)}], "isError": false}})
            }
            "ping" => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            _ => json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}}),
        };
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
    // A server that outlives its client's end (its input closed), as some do.
    if std::env::var_os("LINGER").is_some() {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
}

mod http {
    use std::sync::Arc;

    use axum::{
        extract::Request,
        http::StatusCode,
        middleware::{self, Next},
        response::{IntoResponse, Response},
    };
    use rmcp::{
        ErrorData, RoleServer, ServerHandler,
        model::{
            CallToolRequestParams, CallToolResult, Content, ListToolsResult, PaginatedRequestParams,
            ServerCapabilities, ServerInfo, Tool,
        },
        service::RequestContext,
        transport::streamable_http_server::{
            StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
        },
    };

    #[derive(Clone)]
    struct Echo;

    impl ServerHandler for Echo {
        fn get_info(&self) -> ServerInfo {
            ServerInfo {
                capabilities: ServerCapabilities::builder().enable_tools().build(),
                ..ServerInfo::default()
            }
        }

        async fn list_tools(
            &self,
            _request: Option<PaginatedRequestParams>,
            _context: RequestContext<RoleServer>,
        ) -> Result<ListToolsResult, ErrorData> {
            let serde_json::Value::Object(schema) = super::schema() else {
                unreachable!("the schema is an object")
            };
            Ok(ListToolsResult {
                tools: vec![Tool::new("echo", super::DESCRIPTION, Arc::new(schema))],
                ..ListToolsResult::default()
            })
        }

        async fn call_tool(
            &self,
            request: CallToolRequestParams,
            _context: RequestContext<RoleServer>,
        ) -> Result<CallToolResult, ErrorData> {
            if request.name != "echo" {
                return Err(ErrorData::invalid_params("no such tool", None));
            }
            let text = request
                .arguments
                .as_ref()
                .and_then(|a| a.get("text"))
                .and_then(|t| t.as_str())
                .unwrap_or_default();
            Ok(CallToolResult::success(vec![Content::text(super::echo(text))]))
        }
    }

    async fn require_header(request: Request, next: Next) -> Response {
        if let Ok(required) = std::env::var("REQUIRE_HEADER")
            && let Some((name, value)) = required.split_once(':')
            && request.headers().get(name).and_then(|v| v.to_str().ok()) != Some(value)
        {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        next.run(request).await
    }

    #[tokio::main(flavor = "current_thread")]
    pub async fn serve() {
        let service = StreamableHttpService::new(
            || Ok(Echo),
            LocalSessionManager::default().into(),
            StreamableHttpServerConfig::default(),
        );
        let app = axum::Router::new()
            .nest_service("/mcp", service)
            .layer(middleware::from_fn(require_header));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        println!("http://{}/mcp", listener.local_addr().expect("address"));
        axum::serve(listener, app).await.expect("serve");
    }
}
