//! Berth's wire contract.
//!
//! Everything a client needs to talk to Berth — method names, parameter and result types,
//! event and row shapes, and the error codes — without pulling in the server. Each method
//! is declared once in [`methods!`]; the server's dispatcher and the method list come from
//! that declaration.
//!
//! Conventions every method follows:
//! - **Absent, never null** — except where SPEC gives a field as null: `session.history`'s
//!   and `session.search`'s and `files.list`'s `nextAfter` (null on the last page), a session's `running` (null when no turn runs), `git.status`'s `head`
//!   (null without a commit) and a workspace's `lastSeenAt`. Any other optional field
//!   without a value is left out of results, events and items. In params, `null` and absent
//!   mean the same (so a retry that sends `null` for an absent field is the same operation).
//! - **Unknown params fields are ignored** (as LSP and MCP do), so that a newer client can
//!   talk to an older server; a known field that is missing or has the wrong type is
//!   `bad-params {method, field}`.
//! - **One cursor convention.** A paged method answers `next<Cursor>` (`nextAfter`,
//!   `nextBefore`, `nextOffset`); the client passes it back unchanged as `<cursor>` (`after`,
//!   `before`, `offset`) with every other parameter, including the fence, kept fixed. A
//!   null or absent `next<Cursor>` ends the walk. Cursors are opaque unless documented.
//! - **Fences are named for what they fence and answered back.** `through` is a history
//!   sequence (`session.history`, `session.search`, `session.context`);
//!   `throughRevision` is a diagnostic revision (`session.diagnostics`, also read as
//!   `through`). A method that takes a fence answers the one it used.
//! - **Revisions are named for what they guard:** `historyRevision` (the session's history,
//!   guards fork), `queueRevision` (one queue entry, guards `queue.*`) and
//!   `diagnosticRevision` (the diagnostics log, its own counter).
//! - **Ids** carry a prefix naming their kind (`ses_`, `trn_`, `wsp_`, …); a queue entry's
//!   `queueId` is its turn's id.

/// A defaulted field's deserializer that reads `null` as its default: null and absent mean
/// the same for every optional or defaulted parameter (the protocol's convention).
pub(crate) fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de> + Default,
{
    Ok(<Option<T> as serde::Deserialize>::deserialize(d)?.unwrap_or_default())
}

pub mod agents;
pub mod batch;
pub mod codes;
pub mod error;
pub mod events;
pub mod jsonrpc;
pub mod mcp;
pub mod observe;
#[cfg(feature = "schema")]
pub mod schema;
pub mod search;
pub mod skills;
pub mod text;
pub mod types;
pub mod worker;

pub use agents::*;
pub use codes::{CauseCode, DiagnosticKind, InteractionKind, NoticeCode, NoticeLevel};
pub use error::{ErrorCode, RpcError};
pub use events::*;
pub use mcp::*;
pub use observe::*;
pub use search::*;
pub use skills::*;
pub use types::*;

/// The protocol version this release speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Every protocol version this release speaks.
pub const SUPPORTED_PROTOCOLS: &[u32] = &[1];

/// The largest prompt `session.send` and `queue.update` take, in bytes of UTF-8
/// (more → `payload-too-large {limit: "prompt", max}`).
pub const MAX_PROMPT_BYTES: usize = 256 << 10;
/// The most turns a session's queue holds (one more → `queue-full`).
pub const MAX_QUEUE_LENGTH: usize = 100;
/// The most attachments one `session.send` names.
pub const MAX_ATTACHMENTS_PER_TURN: usize = 32;
/// The most bytes of a queued prompt that queue entries carry (`preview`).
pub const QUEUE_PREVIEW_BYTES: usize = 256;

/// A method: its wire name plus its parameter and result types.
pub trait Method {
    const NAME: &'static str;
    type Params: serde::de::DeserializeOwned + serde::Serialize + Send + 'static;
    type Result: serde::de::DeserializeOwned + serde::Serialize + Send + 'static;
}

/// A method answered by a subscription: items (`subscription.item {id, item}`) until it
/// ends with its result or is closed.
pub trait Subscription: Method {
    type Item: serde::de::DeserializeOwned + serde::Serialize + Send + 'static;
}

/// The name of a subscription method (`methods!` names one per `=> items`).
macro_rules! subscription_name {
    ($name:literal, $item:ty) => {
        $name
    };
}

/// Every method, declared once: `Marker = "wire.name" (Params) -> Result;`, and for a
/// subscription `-> Result => items Item;`. The method markers, [`METHOD_NAMES`],
/// [`SUBSCRIPTION_NAMES`] and the schema document (methods and subscriptions with their
/// items) all come from this one list.
macro_rules! methods {
    ($( $(#[$doc:meta])* $ty:ident = $name:literal ($params:ty) -> $result:ty $(=> items $item:ty)?; )*) => {
        /// Client-facing methods, one marker type each.
        pub mod method {
            use super::*;
            $(
                $(#[$doc])*
                pub struct $ty;
                impl Method for $ty {
                    const NAME: &'static str = $name;
                    type Params = $params;
                    type Result = $result;
                }
                $(impl Subscription for $ty {
                    type Item = $item;
                })?
            )*
        }
        /// The wire names of every client-facing method, in declaration order.
        pub const METHOD_NAMES: &[&str] = &[$($name),*];
        /// The wire names of the methods answered by a subscription, in declaration order.
        pub const SUBSCRIPTION_NAMES: &[&str] = &[$($(subscription_name!($name, $item),)?)*];

        /// Every subscription's name with its items' schema, in declaration order.
        #[cfg(feature = "schema")]
        fn subscription_schemas(generator: &mut schemars::SchemaGenerator) -> Vec<(&'static str, schemars::Schema)> {
            vec![$($(($name, generator.subschema_for::<$item>()),)?)*]
        }

        /// Every method's name with its params and result schemas, in declaration order.
        #[cfg(feature = "schema")]
        fn method_schemas(generator: &mut schemars::SchemaGenerator) -> Vec<schema::MethodSchema> {
            vec![$(schema::MethodSchema {
                name: $name,
                params: generator.subschema_for::<$params>(),
                result: generator.subschema_for::<$result>(),
            }),*]
        }
    };
}

methods! {
    /// Authenticate the connection and agree on the protocol version.
    Hello = "hello" (HelloParams) -> HelloResult;
    /// Liveness of the connection.
    Ping = "ping" (Empty) -> PingResult;
    /// Server version, protocol and replica id.
    Status = "status" (StatusParams) -> StatusResult;
    /// Workspaces of the caller's tenant.
    WorkspaceList = "workspace.list" (Empty) -> Vec<Workspace>;
    /// One workspace.
    WorkspaceGet = "workspace.get" (WorkspaceRef) -> Workspace;
    /// Set a workspace's title.
    WorkspaceRename = "workspace.rename" (WorkspaceRenameParams) -> Workspace;
    /// Remove a workspace with its sessions (idempotent).
    WorkspaceRemove = "workspace.remove" (WorkspaceRemoveParams) -> Removed;
    /// Path completion candidates in a workspace (answered by its worker).
    WorkspaceFiles = "workspace.files" (WorkspaceFilesParams) -> WorkspaceFilesResult;
    /// The session's repository: staged, worktree and untracked changes (null: no repository).
    GitStatusGet = "git.status" (GitStatusParams) -> Option<GitStatus>;
    /// One path's difference in one area.
    GitDiffGet = "git.diff" (GitDiffParams) -> GitDiff;
    /// Capture the workspace's changes as an immutable patch (through its worker).
    PatchSnapshot = "patch.snapshot" (PatchSnapshotParams) -> PatchInfo;
    /// A page of a captured patch's text.
    PatchRead = "patch.read" (PatchReadParams) -> PatchReadResult;
    /// A page of a directory's direct children.
    FilesList = "files.list" (FilesListParams) -> FilesListResult;
    /// Subscription: `ready`, then `changed` whenever the directory needs rereading; ends
    /// with `unavailable` when the directory goes away.
    FilesWatch = "files.watch" (FilesWatchParams) -> Option<FilesWatchEnd> => items FilesWatchItem;
    /// Subscription: one file's content as `begin`, `chunk`s and `end` (or one outcome item).
    FilesRead = "files.read" (FilesReadParams) -> () => items FilesReadItem;
    /// Create a session in a workspace.
    SessionCreate = "session.create" (SessionCreateParams) -> SessionSnapshot;
    /// A session's snapshot.
    SessionGet = "session.get" (SessionRef) -> SessionSnapshot;
    /// Admit a prompt; returns the turn's identity at once.
    SessionSend = "session.send" (SessionSendParams) -> SessionSendResult;
    /// Upload an attachment: this request, then one binary message `[id: u32 BE][bytes]`.
    ContentUpload = "content.upload" (ContentUploadParams) -> ContentUploadResult;
    /// A page of an attachment's bytes (an upload, or a file a channel session's model
    /// attached), base64.
    ContentRead = "content.read" (ContentReadParams) -> ContentReadResult;
    /// Read history rows under a fixed `through` fence.
    SessionHistory = "session.history" (SessionHistoryParams) -> SessionHistoryResult;
    /// Subscription: every event after `after`, then a `state` item, then live; items are
    /// [`WatchItem`]s. The final value is null.
    SessionWatch = "session.watch" (SessionWatchParams) -> () => items WatchItem;
    /// End a subscription early.
    SubscriptionClose = "subscription.close" (SubscriptionCloseParams) -> Empty;
    /// Sessions by `updatedAt` desc then id desc, paged.
    SessionList = "session.list" (SessionListParams) -> SessionListResult;
    /// Set the title.
    SessionRename = "session.rename" (SessionRenameParams) -> SessionSnapshot;
    /// Set the session-level model override.
    SessionSetModel = "session.setModel" (SessionSetModelParams) -> SessionSnapshot;
    /// Switch the session's agent (null: none), keeping its history; recorded once as
    /// `session.agentChanged`.
    SessionSetAgent = "session.setAgent" (SessionSetAgentParams) -> SessionSnapshot;
    /// Remove the session (idempotent); a running turn is stopped and never writes back.
    SessionRemove = "session.remove" (SessionOpParams) -> Removed;
    /// Forget history and queue; old cursors then answer `history-cleared`.
    SessionClear = "session.clear" (SessionOpParams) -> Cleared;
    /// Hold or release the queue.
    SessionPause = "session.pause" (SessionPauseParams) -> QueueState;
    /// Stop exactly this turn.
    SessionStop = "session.stop" (SessionStopParams) -> TurnRef;
    /// Read a row's field onward from a byte offset.
    SessionSource = "session.source" (SessionSourceParams) -> SessionSourceResult;
    /// Literal text search over the session's rows under a fixed fence, paged.
    SessionSearch = "session.search" (SessionSearchParams) -> SessionSearchResult;
    /// Start a side session from a settled turn or all current history.
    SessionFork = "session.fork" (SessionForkParams) -> SessionForkResult;
    /// The fork an `operationId` published, or null (which proves nothing).
    SessionForkReceipt = "session.forkReceipt" (SessionForkReceiptParams) -> Option<SessionForkResult>;
    /// Execution, model-step and title failures, newest first.
    SessionDiagnostics = "session.diagnostics" (SessionDiagnosticsParams) -> SessionDiagnosticsResult;
    /// Subscription: the session's diagnostic revision on subscribe and after each change;
    /// items are [`DiagnosticsRevision`]s. The final value is null.
    SessionWatchDiagnostics = "session.watchDiagnostics" (SessionRef) -> () => items DiagnosticsRevision;
    /// The latest main model request the session prepared: input by role, tool schemas,
    /// estimated tokens, and the provider-reported input usage.
    SessionContext = "session.context" (SessionContextParams) -> SessionContextResult;
    /// Summarize the session's history so far into a handoff row (SPEC §4.17): later turns
    /// send the summary instead of those rows, which stay readable.
    SessionCompact = "session.compact" (SessionCompactParams) -> SessionCompactResult;
    /// Interactions of the session waiting for an answer, oldest first.
    SessionPendingInteractions = "session.pendingInteractions" (SessionRef) -> Vec<Interaction>;
    /// One interaction as it was asked (and how it was resolved, once it was).
    SessionInteraction = "session.interaction" (InteractionRef) -> Interaction;
    /// Answer an interaction; a second answer or one after expiry is `interaction-closed`.
    SessionRespond = "session.respond" (SessionRespondParams) -> InteractionResolution;
    /// Edit a queued prompt (revision-guarded).
    QueueUpdate = "queue.update" (QueueUpdateParams) -> QueueEntry;
    /// Move a queued prompt (revision-guarded).
    QueueMove = "queue.move" (QueueMoveParams) -> QueueState;
    /// Remove a queued prompt (revision-guarded).
    QueueRemove = "queue.remove" (QueueRemoveParams) -> Removed;
    /// A queued prompt's whole text (queue entries carry a preview).
    QueueGet = "queue.get" (QueueGetParams) -> QueuedPrompt;
    /// The stored outcome of an operation, or null.
    OperationReceipt = "operation.receipt" (OperationReceiptParams) -> Option<ReceiptView>;
    /// Create a credential (admins); the plaintext is returned once.
    AdminCredentialCreate = "admin.credential.create" (AdminCredentialCreateParams) -> CredentialView;
    /// The tenant's credentials (admins).
    AdminCredentialList = "admin.credential.list" (Empty) -> Vec<CredentialView>;
    /// Revoke a credential (admins); its live connections close on every replica.
    AdminCredentialRevoke = "admin.credential.revoke" (AdminCredentialRevokeParams) -> Revoked;
    /// Create a user (admins).
    AdminUserCreate = "admin.user.create" (AdminUserCreateParams) -> UserView;
    /// The tenant's users (admins).
    AdminUserList = "admin.user.list" (Empty) -> Vec<UserView>;
    /// Disable a user (admins); their live connections close on every replica.
    AdminUserDisable = "admin.user.disable" (AdminUserDisableParams) -> Disabled;
    /// Replicas, workers, running turns and queue depth of the tenant (admins).
    AdminStatusGet = "admin.status" (Empty) -> crate::types::AdminStatus;
    /// Make a user an admin or a member (admins); their live connections close.
    AdminUserSetRole = "admin.user.setRole" (crate::types::AdminUserSetRoleParams) -> UserView;
    /// The tenant's audit log, newest first, paged (admins).
    AdminAuditList = "admin.audit.list" (crate::types::AdminAuditListParams) -> crate::types::AuditPage;
    /// The tenant's worker credentials with their presence and workspaces (admins).
    AdminWorkerList = "admin.worker.list" (Empty) -> Vec<crate::types::WorkerView>;
    /// The tenant's agent definitions, by name.
    AgentList = "agent.list" (Empty) -> Vec<Agent>;
    /// One agent definition.
    AgentGet = "agent.get" (AgentRef) -> Agent;
    /// Create an agent, or replace one's definition (`agentId` given).
    AgentSave = "agent.save" (AgentSaveParams) -> Agent;
    /// Remove an agent (idempotent); its sessions go on without one.
    AgentRemove = "agent.remove" (AgentRemoveParams) -> Removed;
    /// The skills offered to the model: a workspace's (given it or a session) and the tenant's.
    SkillList = "skill.list" (SkillListParams) -> SkillListResult;
    /// One tenant skill with its body.
    SkillGet = "skill.get" (SkillRef) -> Skill;
    /// Create a tenant skill, or replace one (`skillId` given).
    SkillSave = "skill.save" (SkillSaveParams) -> Skill;
    /// Remove a tenant skill (idempotent).
    SkillRemove = "skill.remove" (SkillRemoveParams) -> Removed;
    /// The tenant's MCP servers, by name (header and environment values never shown).
    McpList = "mcp.list" (Empty) -> Vec<McpServer>;
    /// Create or replace the tenant's MCP server `name` (admins).
    McpSave = "mcp.save" (McpSaveParams) -> McpServer;
    /// Remove the tenant's MCP server `name` (admins; idempotent).
    McpRemove = "mcp.remove" (McpRemoveParams) -> Removed;
}

/// No parameters / no result fields.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Empty {}
