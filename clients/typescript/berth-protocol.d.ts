// Berth protocol types, generated from the JSON Schema (`berth schema --typescript`).
// Do not edit: regenerate instead.

/** The protocol version these types describe. */
export const PROTOCOL_VERSION = 1;

/**
 * `admin.audit.list`: the tenant's audit log, newest first.
 */
export type AdminAuditListParams = {
  /**
   * The previous page's `nextBefore`; absent for the newest entries.
   */
  "before"?: number;
  /**
   * Entries per page (default and maximum 200).
   */
  "limit"?: number;
};

/**
 * `admin.credential.create`: a user credential (`userId`) or a worker credential (`worker: true`).
 */
export type AdminCredentialCreateParams = {
  /**
   * RFC 3339.
   */
  "expiresAt"?: string;
  "note"?: string | null;
  "operationId"?: string;
  "userId"?: string;
  "worker"?: boolean | null;
};

export type AdminCredentialRevokeParams = {
  "credentialId": string;
  "operationId"?: string;
};

export type AdminStatus = {
  "connectedWorkers": number;
  "queueDepth": number;
  "replicaId": string;
  /**
   * Replicas holding a worker connection of this tenant.
   */
  "replicas": Array<string>;
  "runningTurns": number;
};

export type AdminUserCreateParams = {
  "email": string;
  "operationId"?: string;
  "password"?: string;
  /**
   * `admin` or `member` (default).
   */
  "role"?: string;
};

export type AdminUserDisableParams = {
  "operationId"?: string;
  "userId": string;
};

/**
 * `admin.user.setRole`: make a user an `admin` or a `member`. Their live connections close
 * (they sign in again with the new role); the tenant's last enabled admin cannot be demoted.
 */
export type AdminUserSetRoleParams = {
  "operationId"?: string;
  /**
   * `admin` or `member`.
   */
  "role": string;
  "userId": string;
};

/**
 * A tenant's agent definition.
 */
export type Agent = {
  "agentId": string;
  "approval": ApprovalPolicy;
  "createdAt": string;
  "description"?: string;
  "model"?: string;
  /**
   * Unique within the tenant.
   */
  "name": string;
  "params"?: (ModelParams);
  "provider"?: string;
  /**
   * Replaces the built-in system prompt (absent: the built-in one).
   */
  "systemPrompt"?: string;
  /**
   * The tools offered to the model, by name (absent: every built-in tool; empty: none).
   * Names the worker does not offer are ignored, so a set may name tools that come from
   * elsewhere (MCP servers).
   */
  "tools"?: Array<string>;
  "updatedAt": string;
};

/**
 * Payload of `session.agentChanged`.
 */
export type AgentChanged = {
  /**
   * The agent now in use (absent: none).
   */
  "agentId"?: string;
  /**
   * Its name when the change was made.
   */
  "name"?: string;
};

/**
 * `agent.get`.
 */
export type AgentRef = {
  "agentId": string;
};

/**
 * `agent.remove` (idempotent); the agent's sessions go on without one.
 */
export type AgentRemoveParams = {
  "agentId": string;
  "operationId"?: string;
};

/**
 * `agent.save`: create an agent (no `agentId`) or replace one's definition whole (fields
 * left out are cleared).
 */
export type AgentSaveParams = {
  "agentId"?: string;
  "approval"?: (ApprovalPolicy);
  "description"?: string;
  "model"?: string;
  "name": string;
  "operationId"?: string;
  "params"?: (ModelParams);
  "provider"?: string;
  "systemPrompt"?: string;
  "tools"?: Array<string>;
};

/**
 * Which tool calls of an agent's sessions wait for a person's approval.
 */
export type ApprovalPolicy = ("ask" | "auto");

/**
 * One audited administrative action.
 */
export type AuditEntry = {
  /**
   * What was done, e.g. `credential.create`, `credential.revoke`, `user.create`,
   * `user.disable`, `user.role`, `user.password`, `tenant.create`.
   */
  "action": string;
  /**
   * Who did it: a user id, a credential id, `cli` or `bootstrap`.
   */
  "actor": string;
  "at": string;
  "auditId": number;
  /**
   * The id it was done to.
   */
  "target": string;
};

export type AuditPage = {
  "entries": Array<AuditEntry>;
  /**
   * Pass back as `before` for older entries; absent at the oldest.
   */
  "nextBefore"?: number;
};

/**
 * Where a forked session came from.
 */
export type Branch = {
  /**
   * The source's last event included in the fork.
   */
  "sequence": number;
  "sessionId": string;
  "turnId"?: string;
};

/**
 * Why a turn failed: a typed code plus safe fields, never a provider body.
 */
export type Cause = {
  /**
   * A [`CauseCode`](crate::CauseCode), or `refused-<error code>`.
   */
  "code": CauseCodeOrRefused;
  "status"?: number;
};

/**
 * Why a turn, a step, a title or a summary failed (`cause.code`). Besides these, a
 * worker whose request the server refused reports `refused-<error code>`
 * ([`CauseCode::refused`]).
 */
export type CauseCode = ("provider-unreachable" | "provider-timeout" | "provider-response-too-large" | "provider-unconfigured" | "base-url-not-allowed" | "internal" | "bad-params" | "rate-limited" | "turn-not-running" | "payload-too-large" | "unavailable" | "provider-status" | "provider-protocol" | "provider-failed" | "provider-rate-limited" | "provider-stream-ended" | "context-overflow" | "step-rejected" | "history-unreadable" | "step-limit" | "worker-lost" | "title-empty" | "summary-empty" | "attachment-unavailable" | "attachment-corrupt" | "mcp-server-unavailable" | "unauthorized");

/**
 * A `CauseCode`, or `refused-<error code>` when the server refused the worker's request.
 */
export type CauseCodeOrRefused = (CauseCode | string);

/**
 * A child session's turn ended: the child, its turn, and how it ended. Appended to the
 * coordinator's history (a session-level event: no `turnId` of the coordinator's own).
 */
export type ChildTurnEnded = {
  "cause"?: (Cause);
  "childTurnId": string;
  "sessionId": string;
  "state": TurnState;
};

export type Cleared = {
  /**
   * The `session.cleared` event's sequence.
   */
  "sequence": number;
};

/**
 * Who the client says it is (for logs and metrics only).
 */
export type ClientInfo = {
  "name": string;
  "version": string;
};

export type Compacted = {
  /**
   * A turn nearing the context window compacted (false: `session.compact`).
   */
  "automatic": boolean;
  /**
   * The first row still sent as itself.
   */
  "keepFrom": Position;
};

/**
 * A compaction (SPEC §4.17): the handoff row that summarizes the history before `keepFrom`.
 */
export type Compaction = {
  /**
   * The handoff row.
   */
  "handoff": Position;
  /**
   * The first row still sent as itself.
   */
  "keepFrom": Position;
};

/**
 * `content.read` parameters: a page of an attachment's bytes.
 */
export type ContentReadParams = {
  /**
   * The `nextAfter` of the previous page.
   */
  "after"?: string;
  "attachmentId": string;
};

/**
 * One page of an attachment's bytes: at most [`CONTENT_PAGE_BYTES`].
 */
export type ContentReadResult = {
  "attachment": RowAttachment;
  /**
   * The page's bytes, base64 (standard alphabet, padded).
   */
  "data": string;
  /**
   * Pass as `after` for the next page; absent on the last page.
   */
  "nextAfter"?: string;
  /**
   * The byte offset of `data` in the attachment.
   */
  "offset": number;
};

/**
 * `content.upload` parameters: the request is followed by one binary WebSocket message
 * whose first four bytes are this request's id (big-endian u32) and the rest the bytes.
 */
export type ContentUploadParams = {
  /**
   * The payload's size, if the client knows it: a binary message of another size (a
   * truncated one) is `bad-params {reason: "size-mismatch"}`.
   */
  "bytes"?: number;
  /**
   * The file's name as the user knows it (no directories).
   */
  "filename": string;
  /**
   * The content type (`image/png`, `text/plain`, …).
   */
  "mime": string;
  "sessionId": string;
};

/**
 * An uploaded attachment, to name in `session.send {attachments}`.
 */
export type ContentUploadResult = {
  "attachmentId": string;
  "bytes": number;
  /**
   * Lowercase hex SHA-256 of the bytes.
   */
  "sha256": string;
};

/**
 * What one model request held. Token counts are estimates (about four bytes a token);
 * `inputTokens` is what the provider reported (null until and unless it did).
 */
export type ContextReport = {
  "at": string;
  /**
   * The compaction in effect when the request was made: the rows before `keepFrom` were
   * sent as the handoff row's summary.
   */
  "compaction"?: (Compaction);
  "estimatedTokens": number;
  "inputTokens"?: number | null;
  "model"?: string | null;
  "provider"?: string | null;
  /**
   * The input grouped by role, in order of first appearance.
   */
  "roles": Array<RoleInput>;
  /**
   * The session's last event sequence when the request was made.
   */
  "sequence": number;
  "tools": Array<ToolSchemaSize>;
  "turnId"?: string | null;
};

/**
 * A credential as administrators see it (never the secret, except `token` once at creation).
 */
export type CredentialView = {
  "createdAt": string;
  "credentialId": string;
  "expiresAt"?: string;
  /**
   * `user` or `worker`.
   */
  "kind": string;
  "lastUsedAt"?: string;
  "note": string;
  "revokedAt"?: string;
  /**
   * The plaintext, present only in the response that created it.
   */
  "token"?: string;
  "userEmail"?: string;
  "userId"?: string;
};

export type Diagnostic = {
  "at": string;
  "cause": Cause;
  "diagnosticId": string;
  /**
   * The session's diagnostic revision this record was written at (its own counter,
   * independent of history).
   */
  "diagnosticRevision": number;
  /**
   * A [`DiagnosticKind`](crate::DiagnosticKind): `tool` is something a turn went on
   * without (e.g. an MCP server that did not start: `mcp-server-unavailable`).
   */
  "kind": DiagnosticKind;
  "sequence"?: number;
  "turnId"?: string;
};

/**
 * What failed, for a diagnostic record.
 */
export type DiagnosticKind = ("execution" | "model-step" | "title" | "tool" | "compaction");

/**
 * A `session.watchDiagnostics` item: the session's diagnostic revision now.
 */
export type DiagnosticsRevision = {
  "diagnosticRevision": number;
};

export type Disabled = {
  "disabled": boolean;
};

/**
 * No parameters / no result fields.
 */
export type Empty = Record<string, unknown>;

/**
 * A stable, typed error code. The client owns the wording.
 */
export type ErrorCode = ("parse-error" | "invalid-request" | "method-not-found" | "unauthorized" | "forbidden" | "not-found" | "bad-params" | "unsupported-protocol" | "stale-revision" | "turn-busy" | "turn-not-running" | "workspace-offline" | "operation-conflict" | "operation-in-progress" | "rate-limited" | "payload-too-large" | "history-cleared" | "unsupported" | "unavailable" | "internal" | "conflict" | "queue-full" | "interaction-closed" | "unknown-provider" | "unknown-model" | "base-url-not-allowed" | "depth-exceeded" | "child-limit");

/**
 * A persisted history event: `{sequence, type, at, turnId?, rows?, …payload}`.
 */
export type Event = {
  "at": string;
  /**
   * The rows this event publishes (absent when none).
   */
  "rows"?: Array<Row>;
  "sequence": number;
  /**
   * The turn the event belongs to (absent for session-level events).
   */
  "turnId"?: string;
} & (SessionCreated & {
  "type": "session.created";
} | TitleChanged & {
  "type": "session.titleChanged";
} | ModelChanged & {
  "type": "session.modelChanged";
} | AgentChanged & {
  "type": "session.agentChanged";
} | Notice & {
  "type": "session.notice";
} | PlanUpdated & {
  "type": "plan.updated";
} | Nothing & {
  "type": "session.cleared";
} | TurnQueued & {
  "type": "turn.queued";
} | Nothing & {
  "type": "turn.started";
} | ModelCompleted & {
  "type": "model.completed";
} | ToolCallStatus & {
  "type": "tool.status";
} | ToolCallStatus & {
  "type": "tool.ended";
} | TurnEnded & {
  "type": "turn.ended";
} | QueueState & {
  "type": "queue.changed";
} | InteractionRequested & {
  "type": "interaction.requested";
} | InteractionResolution & {
  "type": "interaction.resolved";
} | Compacted & {
  "type": "session.compacted";
} | Forked & {
  "type": "session.forked";
} | ChildTurnEnded & {
  "type": "child.turnEnded";
});

/**
 * Every persisted event type with its payload.
 */
export type EventPayload = (SessionCreated & {
  "type": "session.created";
} | TitleChanged & {
  "type": "session.titleChanged";
} | ModelChanged & {
  "type": "session.modelChanged";
} | AgentChanged & {
  "type": "session.agentChanged";
} | Notice & {
  "type": "session.notice";
} | PlanUpdated & {
  "type": "plan.updated";
} | Nothing & {
  "type": "session.cleared";
} | TurnQueued & {
  "type": "turn.queued";
} | Nothing & {
  "type": "turn.started";
} | ModelCompleted & {
  "type": "model.completed";
} | ToolCallStatus & {
  "type": "tool.status";
} | ToolCallStatus & {
  "type": "tool.ended";
} | TurnEnded & {
  "type": "turn.ended";
} | QueueState & {
  "type": "queue.changed";
} | InteractionRequested & {
  "type": "interaction.requested";
} | InteractionResolution & {
  "type": "interaction.resolved";
} | Compacted & {
  "type": "session.compacted";
} | Forked & {
  "type": "session.forked";
} | ChildTurnEnded & {
  "type": "child.turnEnded";
});

export type FileContentKind = "text" | "image";

export type FileEntry = {
  "kind": FileKind;
  /**
   * The path relative to the workspace root.
   */
  "path": WorkspacePath;
  /**
   * Bytes, for regular files.
   */
  "size"?: number;
};

export type FileKind = ("file" | "dir" | "other" | "symlink");

/**
 * `files.list` parameters.
 */
export type FilesListParams = {
  /**
   * The `nextAfter` of the previous page.
   */
  "after"?: string | null;
  /**
   * The directory; absent or null for the workspace root.
   */
  "path"?: (WorkspacePath | null);
  "sessionId": string;
};

/**
 * One page of a directory's direct children, sorted by name bytes.
 */
export type FilesListResult = {
  /**
   * Identifies the directory itself (device and inode); compare with `files.watch`'s `ready`.
   */
  "directoryIdentity": string;
  "entries": Array<FileEntry>;
  /**
   * Pass as `after` for the next page; `null` on the last page.
   */
  "nextAfter"?: string | null;
};

/**
 * A `files.read` item: `begin`, `chunk`s, `end`; or one explicit outcome instead.
 */
export type FilesReadItem = ({
  "kind": FileContentKind;
  "mime": string;
  "size": number;
  "type": "begin";
  "version": string;
} | {
  "dataBase64": string;
  "offset": number;
  "type": "chunk";
} | {
  "replaced"?: boolean;
  "sha256": string;
  "size": number;
  "type": "end";
  "version": string;
} | {
  "type": "absent";
} | {
  "type": "changed";
  "version": string;
} | {
  "type": "binary";
} | {
  "reason": string;
  "type": "unsupported";
});

/**
 * `files.read` parameters.
 */
export type FilesReadParams = {
  /**
   * Read only if the file is still this version (else a `changed` item).
   */
  "expectedVersion"?: string | null;
  "path": WorkspacePath;
  "sessionId": string;
};

/**
 * How a `files.watch` ended: `unavailable` when the directory was removed or replaced;
 * null when it was closed.
 */
export type FilesWatchEnd = ({
  "type": "unavailable";
});

/**
 * A `files.watch` item.
 */
export type FilesWatchItem = ({
  "directoryIdentity": string;
  "type": "ready";
} | {
  "type": "changed";
});

/**
 * `files.watch` parameters.
 */
export type FilesWatchParams = {
  "path"?: (WorkspacePath | null);
  "sessionId": string;
};

export type Forked = {
  "branch": Branch;
};

/**
 * Which comparison `git.diff` makes.
 */
export type GitArea = ("staged" | "worktree" | "untracked");

/**
 * How a path changed. Renames are a deletion plus an addition.
 */
export type GitChange = ("added" | "modified" | "deleted" | "type-changed" | "unmerged");

/**
 * One path's difference.
 */
export type GitDiff = ({
  "kind": "text";
  /**
   * The diff; when the file's text is not UTF-8, with U+FFFD for the bytes that are
   * not (the exact diff is then in `patchBase64`).
   */
  "patch": string;
  /**
   * The exact bytes of the diff, base64, present only when they are not UTF-8 (a
   * text file in another encoding). Such a diff is cut at half of [`GIT_DIFF_MAX`].
   */
  "patchBase64"?: string;
  "truncated"?: (Truncation);
} | {
  "kind": "binary";
} | {
  "kind": "unchanged";
} | {
  "kind": "unsupported";
  "reason": string;
});

/**
 * `git.diff` parameters.
 */
export type GitDiffParams = {
  "area": GitArea;
  "path": WorkspacePath;
  "sessionId": string;
};

export type GitEntry = {
  "change": GitChange;
  "path": WorkspacePath;
  /**
   * Present when the path is a submodule: its state in the worktree, as git's
   * `git status --porcelain=v2` sub-state `S<c><m><u>` reports it.
   */
  "submodule"?: (GitSubmodule);
};

export type GitHead = {
  /**
   * The commit id (hex).
   */
  "oid": string;
  /**
   * The branch HEAD points at (`refs/heads/…`); absent when detached.
   */
  "ref"?: string;
};

/**
 * The repository's state: `null` as a whole when the workspace is not a repository.
 */
export type GitStatus = {
  /**
   * `null` for an unborn repository (no commit yet).
   */
  "head"?: (GitHead | null);
  /**
   * HEAD compared to the index.
   */
  "staged": Array<GitEntry>;
  /**
   * Files neither tracked nor ignored.
   */
  "untracked": Array<GitEntry>;
  /**
   * The index compared to the files.
   */
  "worktree": Array<GitEntry>;
};

/**
 * `git.status` parameters.
 */
export type GitStatusParams = {
  "sessionId": string;
};

/**
 * A submodule's state in the worktree (git's porcelain v2 `S<c><m><u>`).
 */
export type GitSubmodule = {
  /**
   * Its checked-out commit is not the one the index records (`C`).
   */
  "commitChanged": boolean;
  /**
   * It has changes to its tracked files, staged or not (`M`).
   */
  "modified": boolean;
  /**
   * It has untracked files (`U`).
   */
  "untracked": boolean;
};

/**
 * `hello` parameters.
 */
export type HelloParams = {
  "client"?: (ClientInfo);
  "protocol": number;
  "token"?: string;
};

export type HelloResult = {
  /**
   * The signed-in person's email (absent for a credential without a user).
   */
  "email"?: string;
  /**
   * Host-level notices (e.g. no model provider configured).
   */
  "notices"?: Array<Notice>;
  "protocol": number;
  "replicaId": string;
  "role": string;
  "serverVersion": string;
  "tenantId": string;
  "userId"?: string;
};

/**
 * What `session.history` opens when given a `target`.
 */
export type HistoryTarget = ({
  "field": RowField;
  "kind": "row";
  "position": Position;
} | {
  "kind": "event";
  "sequence": number;
});

/**
 * A held tool call (`kind: "approval"`) or a question, as clients see it.
 */
export type Interaction = {
  "createdAt": string;
  "expiresAt": string;
  /**
   * The outcome recorded when nobody answers (expiry, nobody watching).
   */
  "fallback": InteractionOutcome;
  /**
   * The tool's arguments (approvals) or the question (questions).
   */
  "input": unknown;
  "interactionId": string;
  /**
   * An [`InteractionKind`](crate::InteractionKind).
   */
  "kind": InteractionKind;
  /**
   * The choices a question offers.
   */
  "options"?: Array<string>;
  /**
   * The recorded outcome once resolved.
   */
  "outcome"?: (InteractionOutcome);
  /**
   * Question parameters for the client to word the prompt with.
   */
  "params"?: unknown;
  "resolvedAt"?: string;
  "sessionId": string;
  "state": InteractionState;
  "tool"?: (InteractionTool);
  "turnId": string;
};

/**
 * What an interaction asks: an approval, or one of the question kinds (the model's
 * `ask_user` tool), answered `{choice: string|null}` (null: skipped, or no answer).
 */
export type InteractionKind = ("approval" | "choice" | "text" | "confirm");

/**
 * An interaction's answer: `{approved}` for approvals, `{choice}` for questions.
 */
export type InteractionOutcome = ({
  "approved": boolean;
} | {
  "choice"?: string | null;
});

export type InteractionRef = {
  "interactionId": string;
};

export type InteractionRequested = {
  /**
   * The interaction as asked (`state: pending`); boxed to keep the payload enum small.
   */
  "interaction": Interaction;
};

/**
 * How an interaction was resolved: the `session.respond` result and the payload of
 * `interaction.resolved`. A second answer gets `interaction-closed` with `state` and
 * `outcome` as error fields.
 */
export type InteractionResolution = {
  /**
   * The user (or credential) that answered, for `answered`.
   */
  "answeredBy"?: string;
  "interactionId": string;
  "outcome": InteractionOutcome;
  "state": InteractionState;
};

/**
 * Where an interaction stands. Everything but `pending` is final.
 */
export type InteractionState = ("pending" | "answered" | "expired" | "unwatched" | "auto" | "closed");

/**
 * The tool call an approval holds.
 */
export type InteractionTool = {
  "callId": string;
  "name": string;
};

/**
 * The live-only items of a watch (no `sequence`).
 */
export type LiveItem = (ModelDelta & {
  "type": "model.delta";
} | PhaseItem & {
  "type": "phase";
} | WatchState & {
  "type": "state";
} | Resync & {
  "type": "resync";
});

/**
 * A streamable-HTTP server at `url` (http or https), sent `headers` on every request.
 */
export type McpHttp = {
  /**
   * Values may be secrets (never listed).
   */
  "headers"?: Record<string, string>;
  "url": string;
};

export type McpHttpView = {
  /**
   * The names of the headers sent (their values are not shown).
   */
  "headerNames"?: Array<string>;
  "url": string;
};

/**
 * `mcp.remove` (idempotent).
 */
export type McpRemoveParams = {
  "name": string;
  "operationId"?: string;
};

/**
 * `mcp.save`: create the server `name`, or replace its whole definition (values not sent
 * again are gone: header and environment values are never read back).
 */
export type McpSaveParams = {
  /**
   * Absent: enabled.
   */
  "enabled"?: boolean;
  "name": string;
  "operationId"?: string;
  "transport": McpTransport;
};

/**
 * A tenant's MCP server as listed.
 */
export type McpServer = {
  "createdAt": string;
  /**
   * Whether turns connect to it.
   */
  "enabled": boolean;
  /**
   * Unique within the tenant; its tools reach the model as `mcp__<name>__<tool>`.
   */
  "name": string;
  "transport": McpTransportView;
  "updatedAt": string;
};

/**
 * A stdio server: `command` with `args`, in the workspace root, with a clean environment
 * plus `env`.
 */
export type McpStdio = {
  "args"?: Array<string>;
  "command": string;
  /**
   * Values may be secrets (never listed).
   */
  "env"?: Record<string, string>;
};

export type McpStdioView = {
  "args"?: Array<string>;
  "command": string;
  /**
   * The names of the server's environment variables (their values are not shown).
   */
  "envNames"?: Array<string>;
};

/**
 * How a server is reached.
 */
export type McpTransport = (McpStdio & {
  "kind": "stdio";
} | McpHttp & {
  "kind": "http";
});

/**
 * A transport as listed: secret values left out.
 */
export type McpTransportView = (McpStdioView & {
  "kind": "stdio";
} | McpHttpView & {
  "kind": "http";
});

export type ModelChanged = {
  "model"?: string;
  "provider"?: string;
};

export type ModelCompleted = {
  /**
   * The model step within the turn that completed (0, 1, …): the same `step` as the
   * `model.delta` items that streamed it, so that a client drops exactly that step's live
   * text (and ignores any of it that arrives later). Absent only in events stored before
   * Berth named it.
   */
  "step"?: number;
  "usage"?: (Usage);
};

/**
 * Live-only: streamed model output of the running step (no sequence; not history).
 * Offsets are byte offsets into the step's text and thinking, so that a watcher can tell
 * exactly where a piece goes; a piece at offset 0 starts (or, after `resync`, replaces)
 * the step's text.
 */
export type ModelDelta = {
  /**
   * The model step within the turn (0, 1, …); a new step starts new text.
   */
  "step": number;
  "text"?: string;
  "textOffset"?: number;
  "thinking"?: string;
  "thinkingOffset"?: number;
  "turnId": string;
};

/**
 * Where a session's effective model came from.
 */
export type ModelLevel = "session" | "agent" | "tenant";

/**
 * Sampling parameters an agent sets on every model request of its sessions.
 */
export type ModelParams = {
  /**
   * The output cap of one step (the server's own cap still applies).
   */
  "maxTokens"?: number;
  "temperature"?: number;
  "topP"?: number;
};

/**
 * Whether the server's default model endpoint answered a probe. The endpoint itself is not
 * named (it is the operator's configuration).
 */
export type ModelProbe = {
  /**
   * An HTTP answer came (any status: without the key a 401 is an answer too).
   */
  "answered": boolean;
  /**
   * Why it did not answer: a `CauseCode` (`provider-unconfigured`, `provider-timeout`,
   * `provider-unreachable`).
   */
  "error"?: (CauseCode);
  "httpStatus"?: number;
  /**
   * The default model, if one is configured.
   */
  "model"?: string;
};

/**
 * A payload without fields.
 */
export type Nothing = Record<string, unknown>;

/**
 * A notice: a fact for the client to word, never a sentence.
 */
export type Notice = {
  /**
   * A [`NoticeCode`](crate::NoticeCode); `params` depend on it.
   */
  "code": NoticeCode;
  /**
   * A [`NoticeLevel`](crate::NoticeLevel).
   */
  "level": NoticeLevel;
  "params"?: unknown;
};

/**
 * What a notice (`session.notice`, `hello`'s `notices`) says; its `params` depend on it.
 */
export type NoticeCode = ("provider-unconfigured" | "workspace-offline" | "context-compacted" | "step-limit" | "mcp-server-unavailable");

/**
 * How much a notice matters.
 */
export type NoticeLevel = "info" | "warning" | "error";

export type OperationReceiptParams = {
  "operationId": string;
};

/**
 * A captured patch: every change of the workspace against HEAD (staged, worktree and
 * untracked files, ignored files left out) as one `git apply`-able unified diff.
 */
export type PatchInfo = {
  /**
   * The commit the patch applies to; absent for a repository without commits.
   */
  "base"?: string;
  /**
   * Bytes of patch text (UTF-8).
   */
  "bytes": number;
  "createdAt": string;
  /**
   * How many paths the patch changes.
   */
  "files": number;
  "patchId": string;
  "sessionId": string;
  /**
   * Lowercase hex SHA-256 of the patch text.
   */
  "sha256": string;
  "turnId"?: string;
};

/**
 * `patch.read` parameters.
 */
export type PatchReadParams = {
  /**
   * The `nextAfter` of the previous page.
   */
  "after"?: string;
  "patchId": string;
};

/**
 * One page of a patch's text: at most [`PATCH_PAGE_BYTES`], ending on a line boundary
 * when the page holds one.
 */
export type PatchReadResult = {
  /**
   * Pass as `after` for the next page; absent on the last page.
   */
  "nextAfter"?: string;
  /**
   * The byte offset of `text` in the patch.
   */
  "offset": number;
  "patch": PatchInfo;
  "text": string;
};

/**
 * `patch.snapshot` parameters.
 */
export type PatchSnapshotParams = {
  /**
   * Required: a retry returns the patch the first attempt captured.
   */
  "operationId": string;
  "sessionId": string;
  /**
   * Label the patch with this settled turn of the session (`turn-busy` while it is
   * queued or running); without it, the session must have no running turn.
   */
  "turnId"?: string;
};

/**
 * Live-only: the session's phase changed.
 */
export type PhaseItem = {
  "phase": SessionPhase;
  "turnId"?: string;
};

export type PingResult = {
  "pong": boolean;
};

/**
 * One step of a plan.
 */
export type PlanStep = {
  "status": PlanStepStatus;
  /**
   * The step, a short sentence (at most [`PLAN_STEP_BYTES_MAX`] bytes).
   */
  "step": string;
};

/**
 * Where a plan step stands; at most one step is `inProgress`.
 */
export type PlanStepStatus = "pending" | "inProgress" | "completed";

/**
 * A turn's plan as its model last set it (`plan.updated`).
 */
export type PlanUpdated = {
  /**
   * Why the plan is what it is now, in the model's words.
   */
  "explanation"?: string;
  /**
   * Every step, in order (at most [`PLAN_STEPS_MAX`]).
   */
  "plan": Array<PlanStep>;
};

/**
 * A row's address: the event that emitted it, then its ordinal.
 */
export type Position = {
  "itemIndex": number;
  "sourceSequence": number;
};

/**
 * A queued turn as the queue shows it: a preview of its prompt, never the whole text
 * (`queue.get` reads that). `queueId` is the turn's id (`trn_…`); both are given so that
 * queue edits and turn references read naturally.
 */
export type QueueEntry = {
  /**
   * The prompt's first [`crate::QUEUE_PREVIEW_BYTES`] bytes at most (cut on a character boundary).
   */
  "preview": string;
  /**
   * The whole prompt's length in bytes (more than the preview's: it was cut).
   */
  "promptBytes": number;
  "queueId": string;
  /**
   * Guards `queue.update`, `queue.move`, `queue.remove` (stale → `stale-revision`).
   */
  "queueRevision": number;
  "turnId": string;
};

/**
 * `queue.get`: one queued turn's whole prompt.
 */
export type QueueGetParams = {
  "queueId": string;
  "sessionId": string;
};

export type QueueMoveParams = {
  /**
   * Move before this entry; absent or null moves to the end.
   */
  "beforeQueueId"?: string;
  "operationId"?: string;
  "queueId": string;
  /**
   * Also accepted as `revision` (SPEC §4.4's name).
   */
  "queueRevision": number;
  "sessionId": string;
};

export type QueueRemoveParams = {
  "operationId"?: string;
  "queueId": string;
  /**
   * Also accepted as `revision` (SPEC §4.4's name).
   */
  "queueRevision": number;
  "sessionId": string;
};

/**
 * The queue after a change (also the payload of `queue.changed`).
 */
export type QueueState = {
  "paused": boolean;
  "queue": Array<QueueEntry>;
};

export type QueueUpdateParams = {
  "operationId"?: string;
  "prompt": string;
  "queueId": string;
  /**
   * Also accepted as `revision` (SPEC §4.4's name).
   */
  "queueRevision": number;
  "sessionId": string;
};

/**
 * A queued turn with its whole prompt.
 */
export type QueuedPrompt = {
  "prompt": string;
  "queueId": string;
  "queueRevision": number;
  "turnId": string;
};

/**
 * Where an operation is.
 */
export type ReceiptState = ("pending" | "done");

/**
 * A stored operation receipt (`operation.receipt`).
 */
export type ReceiptView = {
  "createdAt": string;
  /**
   * The method's typed error, when it failed.
   */
  "error"?: (RpcError);
  /**
   * The method the operation called.
   */
  "method": string;
  "operationId": string;
  /**
   * The method's result (its result type), when it succeeded.
   */
  "result"?: unknown;
  "state": ReceiptState;
};

export type Removed = {
  "removed": boolean;
};

/**
 * Live items may have been lost for this watcher (it read too slowly, or its replica's
 * connection to the other replicas' live output was re-established). Drop the live view
 * (streamed text, phase): any history events not yet sent, a `state` item and the running
 * step's text from offset 0 follow. History events are never dropped.
 */
export type Resync = {
  "reason": ResyncReason;
};

export type ResyncReason = ("lagged" | "reconnected");

export type Revoked = {
  "revoked": boolean;
};

export type RoleInput = {
  "bytes": number;
  "estimatedTokens": number;
  "messages": number;
  "role": string;
};

/**
 * A conversation item published by an event.
 */
export type Row = {
  /**
   * A user row's attachments, in the order they were sent; on a channel session's reply
   * row, the files the model attached during its turn (`attach_file`), in order.
   */
  "attachments"?: Array<RowAttachment>;
  "body": string;
  "hidden"?: boolean;
  "kind": RowKind;
  "position": Position;
  "thinking"?: string;
  "tool"?: (ToolInfo);
  /**
   * Fields cut to fit the page, by field.
   */
  "truncated"?: {
    "body"?: Truncation;
    "thinking"?: Truncation;
  };
  "turnId"?: string;
};

/**
 * An attachment as a history row names it.
 */
export type RowAttachment = {
  "attachmentId": string;
  "bytes": number;
  "mimeType": string;
  "name": string;
  /**
   * Lowercase hex SHA-256.
   */
  "sha256": string;
};

/**
 * A row's text fields.
 */
export type RowField = "body" | "thinking";

/**
 * What a row is.
 */
export type RowKind = ("user" | "assistant" | "toolCall" | "toolResult" | "notice" | "handoff");

/**
 * A JSON-RPC error object: `{code, message, data: {code, …fields}}`.
 */
export type RpcError = {
  "code": number;
  "data": unknown;
  "message": string;
};

/**
 * Where a search page stopped. With `field` absent the row at `position` was searched
 * whole; with `field` and `offset` the scan resumes in that row's field at that byte.
 */
export type SearchCursor = {
  "field"?: (RowField);
  "offset"?: number;
  "position": Position;
};

/**
 * A match: the row, the field and the byte range `[start, end)` in that field's text, so
 * that `session.history {target: {kind: "row", position, field}}` and `session.source`
 * open exactly it.
 */
export type SearchHit = {
  "end": number;
  "field": RowField;
  "position": Position;
  "start": number;
};

/**
 * `session.compact`: summarize the session's history so far into a handoff row.
 */
export type SessionCompactParams = {
  "operationId"?: string;
  "sessionId": string;
};

/**
 * What `session.compact` did: the new compaction, or none when there was nothing to
 * compact (`compacted: false`).
 */
export type SessionCompactResult = {
  "compacted": boolean;
  "compaction"?: (Compaction);
};

/**
 * `session.context` parameters.
 */
export type SessionContextParams = {
  "sessionId": string;
  /**
   * The history sequence fence: the latest request made at or before it.
   */
  "through"?: number;
};

/**
 * `session.context`: the latest main model request the session prepared (null: none yet).
 */
export type SessionContextResult = {
  "request"?: (ContextReport | null);
  /**
   * The history sequence fence the report was read under: the `through` asked for
   * (at most the session's last sequence), or the last sequence when none was.
   */
  "through": number;
};

/**
 * `session.create` parameters.
 */
export type SessionCreateParams = {
  /**
   * The agent definition the session uses (its id).
   */
  "agent"?: string;
  "autoApprove"?: boolean;
  "baseUrl"?: string;
  /**
   * The chat channel the answers are read on (at most [`MAX_CHANNEL_BYTES`], no control
   * characters): the model is told to answer in short plain text, and with tools it
   * gets `attach_file`, whose files come back on its reply row (`attachments`).
   */
  "channel"?: string;
  /**
   * How many levels of sessions below this one it may start (sub-agents, a
   * coordinator's children), at most [`MAX_DELEGATION_DEPTH`]; default 1, or 2 for a
   * coordinator (so that its children may still start sub-agents).
   *
   * A budget that counts **down**: a child gets one less, and 0 starts nothing. This is
   * the opposite direction of the client protocol it came from, whose `delegation_depth`
   * counts **up** (how deep the client itself already is, 0 at the top, checked against
   * a fixed limit). A client bridging from there sends `MAX_DELEGATION_DEPTH - its depth`.
   */
  "delegationDepth"?: number;
  /**
   * `coordinator`: the session directs sessions in the tenant's workspaces (SPEC §4.15).
   */
  "kind"?: (SessionKind);
  "model"?: string;
  "noTools"?: boolean;
  "operationId"?: string;
  "provider"?: string;
  /**
   * At most 1000 bytes of UTF-8 ([`MAX_SESSION_TITLE_BYTES`]).
   */
  "title"?: string;
  "workspaceId": string;
};

export type SessionCreated = {
  /**
   * The session whose delegate call started this one (a sub-agent).
   */
  "parent"?: string;
  "workspaceId": string;
};

export type SessionDiagnosticsParams = {
  "before"?: number;
  "limit"?: number;
  "sessionId": string;
  /**
   * The fence: the diagnostic revision (not a history sequence) the pages are read
   * under; absent for the current one, then pass back the answer's `throughRevision`.
   * Also read as `through`, its earlier name.
   */
  "throughRevision"?: number;
};

export type SessionDiagnosticsResult = {
  "diagnostics": Array<Diagnostic>;
  "nextBefore"?: number;
  /**
   * The diagnostic revision fence these pages are read under.
   */
  "throughRevision": number;
};

/**
 * `session.fork` parameters.
 */
export type SessionForkParams = {
  /**
   * Required: a lost response is recovered with `session.forkReceipt`.
   */
  "operationId": string;
  "sessionId": string;
  /**
   * The source's history revision (`session.get`'s `revision`) the client saw.
   */
  "sourceRevision": number;
  /**
   * A settled turn to fork from (its history up to its end); absent or null: all
   * current history, which must then have no running turn.
   */
  "turnId"?: string;
};

/**
 * `session.forkReceipt` parameters.
 */
export type SessionForkReceiptParams = {
  "operationId": string;
};

/**
 * `session.fork` result (also what `session.forkReceipt` finds).
 */
export type SessionForkResult = {
  "branch": Branch;
  "sessionId": string;
};

/**
 * `session.history` parameters.
 */
export type SessionHistoryParams = {
  "after"?: (Position);
  "limit"?: number;
  /**
   * Page byte budget (default and maximum set by the server).
   */
  "maxBytes"?: number;
  "sessionId": string;
  /**
   * Open one row or one event under the fence.
   */
  "target"?: (HistoryTarget);
  "through"?: number;
};

export type SessionHistoryResult = {
  /**
   * The next page's `after`; `null` on the last page (SPEC: "null ends").
   */
  "nextAfter"?: (Position | null);
  "rows": Array<Row>;
  "through": number;
};

/**
 * What a session is for (`session.create {kind}`).
 */
export type SessionKind = "coordinator";

/**
 * One `session.list` entry (no message bodies).
 */
export type SessionListEntry = {
  "agentId"?: string;
  /**
   * For a fork: what it was forked from (the `Branch` of `session.fork`'s answer).
   */
  "branch"?: (Branch);
  "channel"?: string;
  "effectiveModelId"?: string;
  "effectiveModelLevel"?: (ModelLevel);
  "kind"?: (SessionKind);
  "messageCount": number;
  "modelId"?: string;
  "parent"?: string;
  "phase": SessionPhase;
  /**
   * How many turns are queued (as in the snapshot).
   */
  "queued": number;
  /**
   * The running turn's id; `null` when none runs (as in the snapshot).
   */
  "running"?: string | null;
  "sessionId": string;
  "title": string;
  "updatedAt": string;
  "workspaceId": string;
};

/**
 * `session.list` parameters.
 */
export type SessionListParams = {
  /**
   * The previous page's `nextAfter`.
   */
  "after"?: string;
  "limit"?: number;
  "parent"?: string;
  "workspaceId"?: string;
};

export type SessionListResult = {
  "entries": Array<SessionListEntry>;
  "nextAfter"?: string;
};

/**
 * `session.remove`, `session.clear`: a session and an optional operation id.
 */
export type SessionOpParams = {
  "operationId"?: string;
  "sessionId": string;
};

export type SessionPauseParams = {
  "operationId"?: string;
  "paused": boolean;
  "sessionId": string;
};

/**
 * What a session is doing.
 */
export type SessionPhase = "idle" | "running";

export type SessionRef = {
  "sessionId": string;
};

export type SessionRenameParams = {
  "operationId"?: string;
  "sessionId": string;
  /**
   * At most 1000 bytes of UTF-8 ([`MAX_SESSION_TITLE_BYTES`]).
   */
  "title": string;
};

/**
 * `session.respond`: `answer` is `{approved: bool}` (approvals) or `{choice: string|null}`
 * (questions; a choice must be one of the options when the question offers any).
 */
export type SessionRespondParams = {
  "answer": unknown;
  "interactionId": string;
  "operationId"?: string | null;
};

/**
 * `session.search` parameters. Keep `query`, the options and `through` fixed while
 * following `nextAfter`; start with `after` absent.
 */
export type SessionSearchParams = {
  "after"?: (SearchCursor);
  "caseSensitive"?: boolean | null;
  /**
   * Literal text (not a pattern).
   */
  "query": string;
  "sessionId": string;
  /**
   * The fence: no row published after this event is searched. Absent: the session's
   * last sequence now, returned in the result.
   */
  "through"?: number;
  "wholeWord"?: boolean | null;
};

/**
 * One page of hits, in history order. A page may hold no hits and still advance:
 * follow `nextAfter` until it is null.
 */
export type SessionSearchResult = {
  "hits": Array<SearchHit>;
  "nextAfter"?: (SearchCursor | null);
  "through": number;
};

/**
 * `session.send` parameters.
 */
export type SessionSendParams = {
  "attachments"?: Array<string> | null;
  "operationId"?: string;
  "prompt": string;
  "sessionId": string;
};

export type SessionSendResult = {
  "queueId"?: string;
  "queueRevision"?: number;
  /**
   * SPEC §4.4's name for `queueRevision` (the same value).
   */
  "revision"?: number;
  "state": TurnState;
  "turnId": string;
};

/**
 * `session.setAgent`: switch a live session's agent (null: none), keeping its history.
 */
export type SessionSetAgentParams = {
  "agent"?: string;
  "operationId"?: string;
  "sessionId": string;
};

export type SessionSetModelParams = {
  "model"?: string;
  "operationId"?: string;
  "provider"?: string;
  "sessionId": string;
};

/**
 * Everything a reconnecting client needs to draw a session.
 */
export type SessionSnapshot = {
  /**
   * The session's agent definition, if it has one.
   */
  "agentId"?: string;
  /**
   * For a fork: the session, turn and sequence it was forked from (as `session.fork`
   * answered).
   */
  "branch"?: (Branch);
  /**
   * The chat channel its answers are read on (`session.create {channel}`).
   */
  "channel"?: string;
  "createdAt": string;
  /**
   * How many levels of sessions below it this one may still start (a budget counting
   * down: a child has one less; see [`SessionCreateParams::delegation_depth`]).
   */
  "delegationDepth": number;
  "effectiveModelId"?: string;
  "effectiveModelLevel"?: (ModelLevel);
  /**
   * The history revision (what `session.fork` is guarded by).
   */
  "historyRevision": number;
  /**
   * Absent for an ordinary session.
   */
  "kind"?: (SessionKind);
  "modelId"?: string;
  /**
   * The session that started this one (a coordinator, or a delegate call's session).
   */
  "parent"?: string;
  /**
   * The queue is held (`session.pause`).
   */
  "paused": boolean;
  /**
   * Interactions waiting for an answer, oldest first.
   */
  "pendingInteractions": Array<Interaction>;
  "phase": SessionPhase;
  "provider"?: string;
  /**
   * The queued turns in order (previews, not whole prompts).
   */
  "queue": Array<QueueEntry>;
  /**
   * How many turns are queued.
   */
  "queued": number;
  /**
   * SPEC §4.3's name for `historyRevision` (the same value).
   */
  "revision"?: number;
  /**
   * The running turn's id; `null` when none runs.
   */
  "running"?: string | null;
  /**
   * Last event sequence.
   */
  "sequence": number;
  "sessionId": string;
  "title": string;
  "updatedAt": string;
  "workspaceId": string;
};

/**
 * `session.source`: read a row's field onward from a byte offset.
 */
export type SessionSourceParams = {
  "field": RowField;
  "limit"?: number;
  "offset"?: number | null;
  "position": Position;
  "sessionId": string;
};

export type SessionSourceResult = {
  "bytes": number;
  "data": string;
  /**
   * Where the next read starts (exclusive of what this one returned); null at the end.
   */
  "nextOffset"?: number;
  "offset": number;
};

export type SessionStopParams = {
  "operationId"?: string;
  "sessionId": string;
  "turnId": string;
};

/**
 * `session.watch` parameters.
 */
export type SessionWatchParams = {
  "after"?: number | null;
  "sessionId": string;
};

/**
 * A tenant skill with its body.
 */
export type Skill = {
  "body": string;
  "createdAt": string;
  "name": string;
  "skillId": string;
  "summary": string;
  "updatedAt": string;
};

/**
 * A skill as offered: its name and summary (what the model sees before reading it).
 */
export type SkillInfo = {
  "name": string;
  /**
   * A tenant skill's id.
   */
  "skillId"?: string;
  "source": SkillSource;
  "summary": string;
};

/**
 * `skill.list`: the tenant's skills and, given a workspace (or a session, for its
 * workspace), that workspace's.
 */
export type SkillListParams = {
  "sessionId"?: string;
  "workspaceId"?: string;
};

export type SkillListResult = {
  /**
   * Workspace skills first, then the tenant's; each by name.
   */
  "skills": Array<SkillInfo>;
  /**
   * Why the workspace's skills are missing (e.g. `workspace-offline`).
   */
  "workspaceError"?: (ErrorCode);
};

/**
 * `skill.get`.
 */
export type SkillRef = {
  "skillId": string;
};

/**
 * `skill.remove` (idempotent).
 */
export type SkillRemoveParams = {
  "operationId"?: string;
  "skillId": string;
};

/**
 * `skill.save`: create a tenant skill (no `skillId`) or replace one.
 */
export type SkillSaveParams = {
  "body": string;
  "name": string;
  "operationId"?: string;
  "skillId"?: string;
  "summary": string;
};

/**
 * Where a skill comes from.
 */
export type SkillSource = ("tenant" | "workspace");

export type StatusParams = {
  /**
   * Also check, from this replica, that the default model endpoint answers (`berth
   * doctor`): one `GET <base URL>/models`, without the provider key.
   */
  "probeModel"?: boolean | null;
};

export type StatusResult = {
  /**
   * The default model endpoint's answer, when `probeModel` asked for it.
   */
  "model"?: (ModelProbe);
  "protocol": number;
  "replicaId": string;
  "serverVersion": string;
};

export type SubscriptionCloseParams = {
  "id": number;
};

/**
 * The params of a `subscription.item` notification: the subscribing request's id and one
 * item (for `session.watch`, a [`crate::WatchItem`]).
 */
export type SubscriptionItem = {
  "id": number;
  "item": WatchItem;
};

export type TitleChanged = {
  "title": string;
};

/**
 * A tool call's status change: the call row's position and id, and the new status.
 */
export type ToolCallStatus = {
  "callId": string;
  "position": Position;
  "status": ToolStatus;
};

/**
 * A tool row's tool.
 */
export type ToolInfo = {
  "callId": string;
  "name": string;
  /**
   * A [`ToolStatus`](crate::worker::ToolStatus).
   */
  "status": ToolStatus;
};

export type ToolSchemaSize = {
  "bytes": number;
  "estimatedTokens": number;
  "name": string;
};

/**
 * A tool call's status: `requested → running → completed | failed | denied`
 * (`requested → denied` when an approval is refused).
 */
export type ToolStatus = "requested" | "running" | "completed" | "failed" | "denied";

/**
 * A field cut to fit the page: `returned` bytes of `bytes` are in the row.
 */
export type Truncation = {
  "bytes": number;
  "returned": number;
  "truncated": boolean;
};

export type TurnEnded = {
  "cause"?: (Cause);
  "state": TurnState;
  /**
   * The turn's model usage as the proxy metered it (absent when no step reported any).
   */
  "usage"?: (Usage);
};

export type TurnQueued = {
  /**
   * The entry as the queue shows it.
   */
  "entry": QueueEntry;
};

export type TurnRef = {
  "state": TurnState;
  "turnId": string;
};

/**
 * A turn's lifecycle state.
 */
export type TurnState = "queued" | "running" | "completed" | "failed" | "cancelled" | "interrupted";

export type Usage = {
  "inputTokens": number;
  "outputTokens": number;
};

export type UserView = {
  "createdAt": string;
  "disabled": boolean;
  "email": string;
  "hasPassword": boolean;
  "role": string;
  "userId": string;
};

/**
 * Any item of a `session.watch` subscription: a history event (it has a `sequence`) or a
 * live-only item.
 */
export type WatchItem = (Event | LiveItem);

/**
 * What a client draws besides history: sent once a watch has caught up, and again after
 * a `resync`. It reflects every event through sequence `through` (events after it follow).
 */
export type WatchState = {
  "paused": boolean;
  "pendingInteractions": Array<Interaction>;
  "phase": SessionPhase;
  "queue": Array<QueueEntry>;
  "queued": number;
  /**
   * The running turn's id; `null` when none runs (as in the snapshot).
   */
  "running"?: string | null;
  "through": number;
};

/**
 * A worker credential and where its worker is: `admin.worker.list`.
 */
export type WorkerView = {
  "connectedAt"?: string;
  "credentialId": string;
  /**
   * The host the credential is bound to (on its first connection).
   */
  "host"?: string;
  /**
   * The latest heartbeat, else the credential's last use.
   */
  "lastSeenAt"?: string;
  "note": string;
  /**
   * A live connection of this credential is present.
   */
  "online": boolean;
  /**
   * The replica holding that connection.
   */
  "replicaId"?: string;
  "revokedAt"?: string;
  /**
   * The workspaces registered from its host.
   */
  "workspaceIds": Array<string>;
};

/**
 * A workspace as the client sees it.
 */
export type Workspace = {
  "host": string;
  /**
   * `null` for a workspace no worker has served yet.
   */
  "lastSeenAt"?: string | null;
  "online": boolean;
  "path": string;
  "title": string;
  "workspaceId": string;
};

export type WorkspaceFile = {
  "dir": boolean;
  /**
   * Relative, `/`-separated.
   */
  "path": string;
};

/**
 * `workspace.files` parameters.
 */
export type WorkspaceFilesParams = {
  /**
   * Only paths starting with this (`/`-separated, relative).
   */
  "prefix"?: string | null;
  "workspaceId": string;
};

/**
 * Completion candidates.
 */
export type WorkspaceFilesResult = {
  /**
   * Sorted by path; ancestors of matching files are included as directories.
   */
  "entries": Array<WorkspaceFile>;
  /**
   * More matched than [`WORKSPACE_FILES_MAX`].
   */
  "truncated": boolean;
};

/**
 * A relative path inside a workspace: its exact bytes, base64 (standard, padded).
 */
export type WorkspacePath = {
  "bytesBase64": string;
};

export type WorkspaceRef = {
  "workspaceId": string;
};

/**
 * `workspace.remove` parameters.
 */
export type WorkspaceRemoveParams = {
  "operationId"?: string | null;
  "workspaceId": string;
};

/**
 * `workspace.rename` parameters.
 */
export type WorkspaceRenameParams = {
  "operationId"?: string | null;
  "title": string;
  "workspaceId": string;
};

/** Every method: its params and its result. */
export interface Methods {
  "admin.audit.list": { params: AdminAuditListParams; result: AuditPage };
  "admin.credential.create": { params: AdminCredentialCreateParams; result: CredentialView };
  "admin.credential.list": { params: Empty; result: Array<CredentialView> };
  "admin.credential.revoke": { params: AdminCredentialRevokeParams; result: Revoked };
  "admin.status": { params: Empty; result: AdminStatus };
  "admin.user.create": { params: AdminUserCreateParams; result: UserView };
  "admin.user.disable": { params: AdminUserDisableParams; result: Disabled };
  "admin.user.list": { params: Empty; result: Array<UserView> };
  "admin.user.setRole": { params: AdminUserSetRoleParams; result: UserView };
  "admin.worker.list": { params: Empty; result: Array<WorkerView> };
  "agent.get": { params: AgentRef; result: Agent };
  "agent.list": { params: Empty; result: Array<Agent> };
  "agent.remove": { params: AgentRemoveParams; result: Removed };
  "agent.save": { params: AgentSaveParams; result: Agent };
  "content.read": { params: ContentReadParams; result: ContentReadResult };
  "content.upload": { params: ContentUploadParams; result: ContentUploadResult };
  "files.list": { params: FilesListParams; result: FilesListResult };
  "files.read": { params: FilesReadParams; result: null };
  "files.watch": { params: FilesWatchParams; result: (FilesWatchEnd | null) };
  "git.diff": { params: GitDiffParams; result: GitDiff };
  "git.status": { params: GitStatusParams; result: (GitStatus | null) };
  "hello": { params: HelloParams; result: HelloResult };
  "mcp.list": { params: Empty; result: Array<McpServer> };
  "mcp.remove": { params: McpRemoveParams; result: Removed };
  "mcp.save": { params: McpSaveParams; result: McpServer };
  "operation.receipt": { params: OperationReceiptParams; result: (ReceiptView | null) };
  "patch.read": { params: PatchReadParams; result: PatchReadResult };
  "patch.snapshot": { params: PatchSnapshotParams; result: PatchInfo };
  "ping": { params: Empty; result: PingResult };
  "queue.get": { params: QueueGetParams; result: QueuedPrompt };
  "queue.move": { params: QueueMoveParams; result: QueueState };
  "queue.remove": { params: QueueRemoveParams; result: Removed };
  "queue.update": { params: QueueUpdateParams; result: QueueEntry };
  "session.clear": { params: SessionOpParams; result: Cleared };
  "session.compact": { params: SessionCompactParams; result: SessionCompactResult };
  "session.context": { params: SessionContextParams; result: SessionContextResult };
  "session.create": { params: SessionCreateParams; result: SessionSnapshot };
  "session.diagnostics": { params: SessionDiagnosticsParams; result: SessionDiagnosticsResult };
  "session.fork": { params: SessionForkParams; result: SessionForkResult };
  "session.forkReceipt": { params: SessionForkReceiptParams; result: (SessionForkResult | null) };
  "session.get": { params: SessionRef; result: SessionSnapshot };
  "session.history": { params: SessionHistoryParams; result: SessionHistoryResult };
  "session.interaction": { params: InteractionRef; result: Interaction };
  "session.list": { params: SessionListParams; result: SessionListResult };
  "session.pause": { params: SessionPauseParams; result: QueueState };
  "session.pendingInteractions": { params: SessionRef; result: Array<Interaction> };
  "session.remove": { params: SessionOpParams; result: Removed };
  "session.rename": { params: SessionRenameParams; result: SessionSnapshot };
  "session.respond": { params: SessionRespondParams; result: InteractionResolution };
  "session.search": { params: SessionSearchParams; result: SessionSearchResult };
  "session.send": { params: SessionSendParams; result: SessionSendResult };
  "session.setAgent": { params: SessionSetAgentParams; result: SessionSnapshot };
  "session.setModel": { params: SessionSetModelParams; result: SessionSnapshot };
  "session.source": { params: SessionSourceParams; result: SessionSourceResult };
  "session.stop": { params: SessionStopParams; result: TurnRef };
  "session.watch": { params: SessionWatchParams; result: null };
  "session.watchDiagnostics": { params: SessionRef; result: null };
  "skill.get": { params: SkillRef; result: Skill };
  "skill.list": { params: SkillListParams; result: SkillListResult };
  "skill.remove": { params: SkillRemoveParams; result: Removed };
  "skill.save": { params: SkillSaveParams; result: Skill };
  "status": { params: StatusParams; result: StatusResult };
  "subscription.close": { params: SubscriptionCloseParams; result: Empty };
  "workspace.files": { params: WorkspaceFilesParams; result: WorkspaceFilesResult };
  "workspace.get": { params: WorkspaceRef; result: Workspace };
  "workspace.list": { params: Empty; result: Array<Workspace> };
  "workspace.remove": { params: WorkspaceRemoveParams; result: Removed };
  "workspace.rename": { params: WorkspaceRenameParams; result: Workspace };
}

export type MethodName = keyof Methods;

/** Subscription methods and the items they deliver. */
export interface Subscriptions {
  "files.read": FilesReadItem;
  "files.watch": FilesWatchItem;
  "session.watch": WatchItem;
  "session.watchDiagnostics": DiagnosticsRevision;
}

export type WireEvent = Event;
export type WireWatchItem = WatchItem;
export type WireError = RpcError;
export type WireErrorCode = ErrorCode;
