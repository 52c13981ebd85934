//! `berth acp`: an Agent Client Protocol agent on stdio whose sessions are remote Berth
//! sessions, driven through `berth-client`. An editor (Zed, …) starts it as its agent:
//!
//! - `session/new` creates a Berth session in the workspace given by `--workspace`, else
//!   the one `--map DIR=WORKSPACE` names for the editor's cwd, else the workspace whose path
//!   holds the cwd. ACP session ids are Berth session ids, so `session/load` opens any of
//!   the user's sessions and replays its history as updates.
//! - `session/prompt` sends the prompt and follows the session's watch until that turn
//!   ends: text and thinking as chunks (each byte once), tool calls and their status
//!   changes and results, then the stop reason.
//! - An approval the turn asks for becomes `session/request_permission`; the choice is the
//!   `session.respond` answer. `session/cancel` is `session.stop` of the turn.
//!
//! The bridge keeps nothing but the prompts in flight: everything else is the server's.

mod peer;
mod view;
mod wire;

pub(crate) use view::{tool_input, tool_title};

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use berth_client::{
    Client,
    method::{
        SessionCreate, SessionGet, SessionHistory, SessionRespond, SessionSend, SessionStop, WorkspaceGet,
        WorkspaceList,
    },
    protocol::{
        EventPayload, INTERACTION_APPROVAL, Interaction, LiveItem, SessionCreateParams, SessionHistoryParams,
        SessionRef, SessionRespondParams, SessionSendParams, SessionStopParams, WatchItem, Workspace, WorkspaceRef,
    },
};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use peer::{AcpError, Incoming, Peer};
use wire::{
    ContentBlock, PermissionOption, PermissionOptionKind, PermissionOutcome, RequestPermissionResponse, SessionUpdate,
    ToolCall, code,
};

/// Which workspace a new session goes to.
#[derive(Debug, Clone, Default)]
pub struct WorkspaceChoice {
    /// `--workspace`: every new session goes there (an id or a title).
    pub fixed: Option<String>,
    /// `--map DIR=WORKSPACE`: a cwd under DIR maps to WORKSPACE (the longest DIR wins).
    pub maps: Vec<(PathBuf, String)>,
}

impl WorkspaceChoice {
    /// Parse a `--map` value.
    pub fn parse_map(s: &str) -> Result<(PathBuf, String), String> {
        let (dir, ws) = s.split_once('=').ok_or("expected DIR=WORKSPACE")?;
        if dir.is_empty() || ws.is_empty() {
            return Err("expected DIR=WORKSPACE".into());
        }
        Ok((PathBuf::from(dir), ws.to_string()))
    }

    /// The workspace id for a session started in `cwd`.
    pub(crate) fn resolve(&self, cwd: &Path, workspaces: &[Workspace]) -> Option<String> {
        // A name given by flag or map: an id, or a title.
        let named = |name: &str| {
            workspaces
                .iter()
                .find(|w| w.workspace_id == name)
                .or_else(|| workspaces.iter().find(|w| w.title == name))
                .map_or_else(|| name.to_string(), |w| w.workspace_id.clone())
        };
        if let Some(name) = &self.fixed {
            return Some(named(name));
        }
        if let Some((_, name)) = self
            .maps
            .iter()
            .filter(|(dir, _)| cwd.starts_with(dir))
            .max_by_key(|(dir, _)| dir.components().count())
        {
            return Some(named(name));
        }
        // The workspace whose own directory holds the cwd (the editor runs on the worker's
        // machine, or mirrors its paths); the deepest wins, an online one before others.
        workspaces
            .iter()
            .filter(|w| !w.path.is_empty() && cwd.starts_with(&w.path))
            .max_by_key(|w| (Path::new(&w.path).components().count(), w.online))
            .map(|w| w.workspace_id.clone())
    }
}

/// Run the bridge on stdin/stdout until the client closes stdin.
pub async fn run(client: Client, workspaces: WorkspaceChoice) -> anyhow::Result<()> {
    let bridge = Arc::new(Bridge {
        client,
        peer: Peer::new(tokio::io::stdout()),
        workspaces,
        prompts: Mutex::default(),
    });
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        match peer::parse(&line) {
            Ok(Incoming::Request { id, method, params }) => {
                // Each request on its own task: a prompt runs while cancels, permission
                // answers and other sessions' requests keep flowing.
                let bridge = bridge.clone();
                tokio::spawn(async move {
                    let outcome = bridge.request(&method, params).await;
                    bridge.peer.respond(id, outcome);
                });
            }
            Ok(Incoming::Notification { method, params }) => bridge.notification(&method, params),
            Ok(Incoming::Response { id, outcome }) => bridge.peer.answered(id, outcome),
            Err((id, e)) => bridge.peer.respond(id, Err(e)),
        }
    }
    // The client went away. Turns in flight go on on the server (a later session/load
    // shows them); nothing here needs saving.
    Ok(())
}

struct Bridge {
    client: Client,
    peer: Peer,
    workspaces: WorkspaceChoice,
    /// Session id → the prompt in flight in it.
    prompts: Mutex<HashMap<String, Prompting>>,
}

#[derive(Default)]
struct Prompting {
    turn_id: Option<String>,
    cancel_asked: bool,
}

fn params<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, AcpError> {
    serde_json::from_value(v).map_err(|e| AcpError::invalid_params(e.to_string()))
}

/// A Berth error as an ACP error: not-found and bad input keep their JSON-RPC meaning, the
/// typed code travels in `data.code`.
fn remote(e: berth_client::Error) -> AcpError {
    let rpc = match e.code() {
        Some("not-found") => code::RESOURCE_NOT_FOUND,
        Some("bad-params" | "payload-too-large") => code::INVALID_PARAMS,
        Some("unauthorized") => -32000,
        _ => code::INTERNAL_ERROR,
    };
    let mut err = AcpError::new(rpc, e.to_string());
    if let Some(c) = e.code() {
        err = err.with_data(json!({"code": c}));
    }
    err
}

/// The prompt's text for Berth: text as is, mentions as their URI, embedded files with
/// their contents.
fn prompt_text(blocks: &[ContentBlock]) -> Result<String, AcpError> {
    let mut parts = Vec::new();
    for b in blocks {
        match b {
            ContentBlock::Text { text } => parts.push(text.clone()),
            ContentBlock::ResourceLink { uri, .. } => parts.push(format!("@{uri}")),
            ContentBlock::Resource { resource } => match &resource.text {
                Some(text) => parts.push(format!("{}:\n```\n{text}\n```", resource.uri)),
                None => return Err(AcpError::invalid_params("binary resources are not supported")),
            },
            ContentBlock::Unsupported => {
                return Err(AcpError::invalid_params(
                    "only text and resources are supported (promptCapabilities)",
                ));
            }
        }
    }
    let text = parts.join("\n");
    if text.trim().is_empty() {
        return Err(AcpError::invalid_params("empty prompt"));
    }
    Ok(text)
}

impl Bridge {
    async fn request(self: &Arc<Self>, method: &str, p: Value) -> Result<Value, AcpError> {
        match method {
            wire::INITIALIZE => {
                let init: wire::InitializeRequest = params(p)?;
                tracing::debug!(client_protocol = init.protocol_version, "initialize");
                // Version negotiation: answer the one this side speaks; a client that
                // does not speak it disconnects.
                Ok(json!({
                    "protocolVersion": wire::PROTOCOL_VERSION,
                    "agentCapabilities": {
                        "loadSession": true,
                        "promptCapabilities": {"image": false, "audio": false, "embeddedContext": true},
                        "mcpCapabilities": {"http": false, "sse": false},
                    },
                    "authMethods": [],
                    "agentInfo": {"name": "berth", "title": "Berth", "version": env!("CARGO_PKG_VERSION")},
                }))
            }
            // No auth methods are offered: the credential is `berth acp`'s own.
            wire::AUTHENTICATE => Ok(json!({})),
            wire::SESSION_NEW => self.new_session(params(p)?).await,
            wire::SESSION_LOAD => self.load_session(params(p)?).await,
            wire::SESSION_PROMPT => self.prompt(params(p)?).await,
            _ => Err(AcpError::new(
                code::METHOD_NOT_FOUND,
                format!("unknown method {method}"),
            )),
        }
    }

    fn notification(self: &Arc<Self>, method: &str, p: Value) {
        if method != wire::SESSION_CANCEL {
            tracing::debug!(method, "ignored notification");
            return;
        }
        let Ok(c) = params::<wire::CancelNotification>(p) else {
            return;
        };
        let turn = {
            let mut prompts = self.lock();
            let Some(p) = prompts.get_mut(&c.session_id) else {
                return;
            };
            p.cancel_asked = true;
            // Without a turn id yet, the prompt stops its turn as soon as it has one.
            p.turn_id.clone()
        };
        if let Some(turn_id) = turn {
            let bridge = self.clone();
            tokio::spawn(async move { bridge.stop(&c.session_id, &turn_id).await });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Prompting>> {
        self.prompts.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn stop(&self, session_id: &str, turn_id: &str) {
        let stopped = self
            .client
            .call::<SessionStop>(SessionStopParams {
                session_id: session_id.to_string(),
                turn_id: turn_id.to_string(),
                operation_id: None,
            })
            .await;
        if let Err(e) = stopped {
            // Typically the turn ended first; the prompt answers from its end either way.
            tracing::debug!(error = %e, "stop");
        }
    }

    async fn new_session(&self, p: wire::NewSessionRequest) -> Result<Value, AcpError> {
        if !p.mcp_servers.is_empty() {
            tracing::warn!(
                count = p.mcp_servers.len(),
                "the client's MCP servers are not used: Berth's tools run on the workspace's worker"
            );
        }
        let workspaces = self
            .client
            .call::<WorkspaceList>(Default::default())
            .await
            .map_err(remote)?;
        let workspace_id = self.workspaces.resolve(&p.cwd, &workspaces).ok_or_else(|| {
            AcpError::invalid_params(format!(
                "no workspace for {}: start `berth acp` with --workspace or --map DIR=WORKSPACE",
                p.cwd.display()
            ))
        })?;
        let s = self
            .client
            .call::<SessionCreate>(SessionCreateParams {
                workspace_id,
                ..Default::default()
            })
            .await
            .map_err(remote)?;
        Ok(json!({"sessionId": s.session_id}))
    }

    fn update(&self, session_id: &str, update: &SessionUpdate) {
        self.peer
            .notify(wire::SESSION_UPDATE, json!({"sessionId": session_id, "update": update}));
    }

    /// The directory of workspace `workspace_id` (absolute paths for the editor's diffs;
    /// None when it cannot be read, and the diffs are left out).
    async fn workspace_root(&self, workspace_id: &str) -> Option<PathBuf> {
        let w = self
            .client
            .call::<WorkspaceGet>(WorkspaceRef {
                workspace_id: workspace_id.to_string(),
            })
            .await
            .ok()?;
        (!w.path.is_empty()).then(|| PathBuf::from(w.path))
    }

    /// The directory of session `session_id`'s workspace.
    async fn session_root(&self, session_id: &str) -> Option<PathBuf> {
        let s = self
            .client
            .call::<SessionGet>(SessionRef {
                session_id: session_id.to_string(),
            })
            .await
            .ok()?;
        self.workspace_root(&s.workspace_id).await
    }

    /// Replay the session's history as updates, then answer.
    async fn load_session(&self, p: wire::LoadSessionRequest) -> Result<Value, AcpError> {
        if !p.mcp_servers.is_empty() {
            tracing::warn!("the client's MCP servers are not used");
        }
        let root = self.session_root(&p.session_id).await;
        let mut params = SessionHistoryParams {
            session_id: p.session_id.clone(),
            ..Default::default()
        };
        loop {
            let page = self
                .client
                .call::<SessionHistory>(params.clone())
                .await
                .map_err(remote)?;
            for row in &page.rows {
                for u in view::replay(row, root.as_deref()) {
                    self.update(&p.session_id, &u);
                }
            }
            match page.next_after {
                Some(after) => {
                    params.through = Some(page.through);
                    params.after = Some(after);
                }
                None => return Ok(json!({})),
            }
        }
    }

    async fn prompt(self: &Arc<Self>, p: wire::PromptRequest) -> Result<Value, AcpError> {
        let text = prompt_text(&p.prompt)?;
        let sid = p.session_id.clone();
        {
            let mut prompts = self.lock();
            if prompts.contains_key(&sid) {
                return Err(AcpError::new(
                    code::INVALID_REQUEST,
                    "a prompt is already running in this session",
                ));
            }
            prompts.insert(sid.clone(), Prompting::default());
        }
        let outcome = self.run_prompt(&sid, text).await;
        self.lock().remove(&sid);
        outcome
    }

    async fn run_prompt(self: &Arc<Self>, sid: &str, text: String) -> Result<Value, AcpError> {
        let snapshot = self
            .client
            .call::<SessionGet>(SessionRef {
                session_id: sid.to_string(),
            })
            .await
            .map_err(remote)?;
        // Watch from before the send, so that nothing of the turn is missed.
        let mut watch = self.client.watch(sid, snapshot.sequence);
        let sent = self
            .client
            .call::<SessionSend>(SessionSendParams {
                session_id: sid.to_string(),
                prompt: text,
                attachments: Vec::new(),
                operation_id: None,
            })
            .await
            .map_err(remote)?;
        let turn_id = sent.turn_id;
        let cancel_first = {
            let mut prompts = self.lock();
            let p = prompts.entry(sid.to_string()).or_default();
            p.turn_id = Some(turn_id.clone());
            p.cancel_asked
        };
        if cancel_first {
            self.stop(sid, &turn_id).await;
        }
        let root = self.workspace_root(&snapshot.workspace_id).await;
        let mut turn = view::TurnView::new(&turn_id, root);
        loop {
            let item = match watch.next_item().await {
                Some(Ok(item)) => item,
                Some(Err(e)) => return Err(remote(e)),
                None => return Err(AcpError::new(code::INTERNAL_ERROR, "the session's watch ended")),
            };
            let updates = match &item {
                WatchItem::Live(LiveItem::ModelDelta(d)) => turn.delta(d),
                WatchItem::Event(ev) => {
                    match &ev.payload {
                        EventPayload::InteractionRequested(r) if r.interaction.turn_id == turn_id => {
                            let bridge = self.clone();
                            let interaction = (*r.interaction).clone();
                            let root = turn.root().map(Path::to_path_buf);
                            tokio::spawn(async move { bridge.ask(interaction, root).await });
                        }
                        EventPayload::TurnEnded(end) if ev.turn_id.as_deref() == Some(turn_id.as_str()) => {
                            let cancel_asked = self.lock().get(sid).is_some_and(|p| p.cancel_asked);
                            return match view::ending(end, cancel_asked) {
                                view::Ending::Stop(reason) => Ok(json!({"stopReason": reason})),
                                view::Ending::Failed { state, cause } => Err(AcpError::new(
                                    code::INTERNAL_ERROR,
                                    format!(
                                        "the turn ended {}{}",
                                        state.as_str(),
                                        cause.as_ref().map(|c| format!(": {}", c.code)).unwrap_or_default()
                                    ),
                                )
                                .with_data(json!({"state": state, "cause": cause}))),
                            };
                        }
                        _ => {}
                    }
                    turn.event(ev)
                }
                _ => Vec::new(),
            };
            for u in &updates {
                self.update(sid, u);
            }
        }
    }

    /// Ask the client about an interaction and answer it with the choice. Approvals offer
    /// allow/reject; questions offer their options (and skipping, which answers null).
    async fn ask(&self, interaction: Interaction, root: Option<PathBuf>) {
        let approval = interaction.kind == INTERACTION_APPROVAL;
        let (tool_call, options) = if approval {
            let name = interaction.tool.as_ref().map_or("tool", |t| t.name.as_str());
            let call = ToolCall {
                tool_call_id: interaction.tool.as_ref().map_or_else(
                    || interaction.interaction_id.clone(),
                    |t| view::call_id(Some(&interaction.turn_id), &t.call_id),
                ),
                title: Some(view::tool_title(name, &interaction.input)),
                kind: Some(view::tool_kind(name)),
                raw_input: Some(interaction.input.clone()),
                ..Default::default()
            };
            // A change to approve is shown as its diff.
            let (content, locations) = view::file_changes(name, &interaction.input, root.as_deref()).unzip();
            let call = ToolCall {
                content,
                locations,
                ..call
            };
            let options = vec![
                PermissionOption {
                    option_id: "allow".into(),
                    name: "Allow".into(),
                    kind: PermissionOptionKind::AllowOnce,
                },
                PermissionOption {
                    option_id: "reject".into(),
                    name: "Reject".into(),
                    kind: PermissionOptionKind::RejectOnce,
                },
            ];
            (call, options)
        } else {
            let title = match &interaction.input {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let call = ToolCall {
                tool_call_id: interaction.interaction_id.clone(),
                title: Some(title),
                raw_input: Some(interaction.input.clone()),
                ..Default::default()
            };
            let mut options: Vec<PermissionOption> = interaction
                .options
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, o)| PermissionOption {
                    option_id: format!("choice-{i}"),
                    name: o.clone(),
                    kind: PermissionOptionKind::AllowOnce,
                })
                .collect();
            options.push(PermissionOption {
                option_id: "skip".into(),
                name: "Skip".into(),
                kind: PermissionOptionKind::RejectOnce,
            });
            (call, options)
        };
        let asked = self
            .peer
            .request(
                wire::SESSION_REQUEST_PERMISSION,
                json!({"sessionId": interaction.session_id, "toolCall": tool_call, "options": options}),
            )
            .await;
        let chosen = match asked.and_then(params::<RequestPermissionResponse>) {
            Ok(RequestPermissionResponse {
                outcome: PermissionOutcome::Selected { option_id },
            }) => Some(option_id),
            // Cancelled: the prompt is being cancelled, and its stop closes the interaction.
            Ok(_) => return,
            Err(e) => {
                // The interaction's own timeout answers it with its fallback.
                tracing::warn!(code = e.code, "the client did not answer a permission request");
                return;
            }
        };
        let answer = if approval {
            json!({"approved": chosen.as_deref() == Some("allow")})
        } else {
            let choice = chosen
                .and_then(|id| id.strip_prefix("choice-").and_then(|i| i.parse::<usize>().ok()))
                .and_then(|i| interaction.options.as_ref()?.get(i).cloned());
            json!({"choice": choice})
        };
        let answered = self
            .client
            .call::<SessionRespond>(SessionRespondParams {
                interaction_id: interaction.interaction_id.clone(),
                answer,
                operation_id: None,
            })
            .await;
        if let Err(e) = answered {
            // `interaction-closed`: answered elsewhere, expired, or its turn ended.
            tracing::debug!(error = %e, "session.respond");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(id: &str, title: &str, path: &str, online: bool) -> Workspace {
        Workspace {
            workspace_id: id.into(),
            title: title.into(),
            host: "h".into(),
            path: path.into(),
            online,
            last_seen_at: None,
        }
    }

    #[test]
    fn a_new_sessions_workspace_comes_from_the_flag_a_map_or_the_cwd() {
        let list = [
            ws("wsp_a", "app", "/srv/app", true),
            ws("wsp_b", "lib", "/srv/app/lib", true),
            ws("wsp_c", "old", "/srv/app/lib", false),
        ];
        let none = WorkspaceChoice::default();
        assert_eq!(none.resolve(Path::new("/srv/app/src"), &list).as_deref(), Some("wsp_a"));
        assert_eq!(
            none.resolve(Path::new("/srv/app/lib/x"), &list).as_deref(),
            Some("wsp_b"),
            "the deepest, online first"
        );
        assert_eq!(none.resolve(Path::new("/srv/application"), &list), None);
        assert_eq!(none.resolve(Path::new("/home/me"), &list), None);

        let mapped = WorkspaceChoice {
            fixed: None,
            maps: vec![
                WorkspaceChoice::parse_map("/home/me=app").unwrap(),
                WorkspaceChoice::parse_map("/home/me/lib=wsp_b").unwrap(),
            ],
        };
        assert_eq!(mapped.resolve(Path::new("/home/me/x"), &list).as_deref(), Some("wsp_a"));
        assert_eq!(
            mapped.resolve(Path::new("/home/me/lib/y"), &list).as_deref(),
            Some("wsp_b")
        );
        assert_eq!(mapped.resolve(Path::new("/srv/app"), &list).as_deref(), Some("wsp_a"));

        let fixed = WorkspaceChoice {
            fixed: Some("lib".into()),
            maps: Vec::new(),
        };
        assert_eq!(fixed.resolve(Path::new("/anywhere"), &list).as_deref(), Some("wsp_b"));
        assert!(WorkspaceChoice::parse_map("no-equals").is_err());
        assert!(WorkspaceChoice::parse_map("=x").is_err());
    }

    #[test]
    fn prompts_become_berth_text() {
        let blocks = vec![
            ContentBlock::text("explain"),
            ContentBlock::ResourceLink {
                uri: "file:///srv/app/a.rs".into(),
                name: "a.rs".into(),
            },
        ];
        assert_eq!(prompt_text(&blocks).unwrap(), "explain\n@file:///srv/app/a.rs");
        assert_eq!(
            prompt_text(&[ContentBlock::Unsupported]).unwrap_err().code,
            code::INVALID_PARAMS
        );
        assert_eq!(
            prompt_text(&[ContentBlock::text("  ")]).unwrap_err().code,
            code::INVALID_PARAMS
        );
    }
}
