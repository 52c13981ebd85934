//! The protocol's closed sets of codes, as enums: the schema lists their values, and the
//! server writes them through these types. On the wire they are plain strings, and the
//! fields that carry them stay strings in Rust so that a client reading a newer server (or
//! an event stored by an older one) never fails on a value it does not know; such a value is
//! shown generically. `parse` reads a known one.

use serde::{Deserialize, Serialize};

macro_rules! codes {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $wire:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $wire)] $variant,)*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &[$name] = &[$($name::$variant),*];

            /// The wire value.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)*
                }
            }

            /// A known wire value.
            pub fn parse(s: &str) -> Option<$name> {
                match s {
                    $($wire => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

codes! {
    /// How much a notice matters.
    NoticeLevel {
        Info = "info",
        Warning = "warning",
        Error = "error",
    }
}

codes! {
    /// What a notice (`session.notice`, `hello`'s `notices`) says; its `params` depend on it.
    NoticeCode {
        /// `hello`: the server has no model provider configured.
        ProviderUnconfigured = "provider-unconfigured",
        /// A prompt was queued while its workspace's worker is offline (`{workspaceId}`).
        WorkspaceOffline = "workspace-offline",
        /// Older history was summarized (`{handoff, keepFrom, automatic}`).
        ContextCompacted = "context-compacted",
        /// The turn used all its steps; a last summarising step follows (`{maxSteps}`).
        StepLimit = "step-limit",
        /// A turn goes on without an MCP server (`{server, reason}`).
        McpServerUnavailable = "mcp-server-unavailable",
    }
}

codes! {
    /// What failed, for a diagnostic record.
    DiagnosticKind {
        /// A turn failed.
        Execution = "execution",
        /// A model step failed (the turn may have gone on).
        ModelStep = "model-step",
        /// Naming the session failed.
        Title = "title",
        /// Something a turn went on without (e.g. an MCP server).
        Tool = "tool",
        /// Summarizing history failed; the turn went on.
        Compaction = "compaction",
    }
}

codes! {
    /// What an interaction asks: an approval, or one of the question kinds (the model's
    /// `ask_user` tool), answered `{choice: string|null}` (null: skipped, or no answer).
    InteractionKind {
        /// May this tool call run? Answered `{approved}`.
        Approval = "approval",
        /// Pick one of `options`.
        Choice = "choice",
        /// Free text: `choice` is the text.
        Text = "text",
        /// Yes or no: `options` are `["yes", "no"]`.
        Confirm = "confirm",
    }
}

codes! {
    /// Why a turn, a step, a title or a summary failed (`cause.code`). Besides these, a
    /// worker whose request the server refused reports `refused-<error code>`
    /// ([`CauseCode::refused`]).
    CauseCode {
        ProviderUnreachable = "provider-unreachable",
        /// The provider answered an HTTP error (`status`).
        ProviderStatus = "provider-status",
        ProviderTimeout = "provider-timeout",
        /// The provider's stream was not what its API promises.
        ProviderProtocol = "provider-protocol",
        /// The provider reported a failed response in its stream.
        ProviderFailed = "provider-failed",
        /// HTTP 429 from the provider (`status`).
        ProviderRateLimited = "provider-rate-limited",
        ProviderResponseTooLarge = "provider-response-too-large",
        /// The stream ended before the response did.
        ProviderStreamEnded = "provider-stream-ended",
        ProviderUnconfigured = "provider-unconfigured",
        /// The request does not fit the model's context window.
        ContextOverflow = "context-overflow",
        BaseUrlNotAllowed = "base-url-not-allowed",
        /// The server refused a completed step.
        StepRejected = "step-rejected",
        /// The server's answer about the turn's history did not read.
        HistoryUnreadable = "history-unreadable",
        /// The turn used all its steps (its last summarising step failed there).
        StepLimit = "step-limit",
        /// The turn's worker went away.
        WorkerLost = "worker-lost",
        Internal = "internal",
        /// The title model answered nothing usable.
        TitleEmpty = "title-empty",
        /// The summary model answered nothing usable.
        SummaryEmpty = "summary-empty",
        /// An attachment of the prompt could not be read.
        AttachmentUnavailable = "attachment-unavailable",
        /// An attachment's bytes did not match its checksum or size.
        AttachmentCorrupt = "attachment-corrupt",
        /// An MCP server a turn went without (a `tool` diagnostic).
        McpServerUnavailable = "mcp-server-unavailable",
        /// The model proxy refused the call: these are its error codes.
        Unauthorized = "unauthorized",
        BadParams = "bad-params",
        RateLimited = "rate-limited",
        TurnNotRunning = "turn-not-running",
        PayloadTooLarge = "payload-too-large",
        Unavailable = "unavailable",
    }
}

impl CauseCode {
    /// The prefix of a cause a worker reports when the server refused its request.
    pub const REFUSED_PREFIX: &'static str = "refused-";

    /// `refused-<code>`: the server refused the worker's request with error `code`.
    pub fn refused(code: &str) -> String {
        format!("{}{code}", Self::REFUSED_PREFIX)
    }
}

/// The schema of `cause.code`: a [`CauseCode`], or `refused-<error code>`.
#[cfg(feature = "schema")]
pub(crate) struct CauseCodeWire;

#[cfg(feature = "schema")]
impl schemars::JsonSchema for CauseCodeWire {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "CauseCodeOrRefused".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let known = generator.subschema_for::<CauseCode>();
        schemars::json_schema!({
            "description": "A `CauseCode`, or `refused-<error code>` when the server refused the worker's request.",
            "anyOf": [known, {"type": "string", "pattern": "^refused-[a-z-]+$"}],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_round_trip_and_are_unique() {
        fn check<T: Copy + PartialEq + std::fmt::Debug + Serialize + serde::de::DeserializeOwned>(
            all: &[T],
            as_str: fn(T) -> &'static str,
            parse: fn(&str) -> Option<T>,
        ) {
            let mut seen = std::collections::HashSet::new();
            for &v in all {
                let wire = as_str(v);
                assert!(seen.insert(wire), "{wire} twice");
                assert_eq!(serde_json::to_value(v).unwrap(), wire);
                assert_eq!(serde_json::from_value::<T>(wire.into()).unwrap(), v);
                assert_eq!(parse(wire), Some(v));
            }
        }
        check(NoticeLevel::ALL, NoticeLevel::as_str, NoticeLevel::parse);
        check(NoticeCode::ALL, NoticeCode::as_str, NoticeCode::parse);
        check(DiagnosticKind::ALL, DiagnosticKind::as_str, DiagnosticKind::parse);
        check(InteractionKind::ALL, InteractionKind::as_str, InteractionKind::parse);
        check(CauseCode::ALL, CauseCode::as_str, CauseCode::parse);
        assert_eq!(CauseCode::refused("turn-not-running"), "refused-turn-not-running");
    }
}
