//! History events and the items of a `session.watch` subscription.
//!
//! One enum, [`EventPayload`], tagged by `type`, with one variant per persisted event type
//! and its payload struct: the store can only append what is declared here, and a client
//! reads every event into it. To add an event type, add a variant (and a sample in
//! [`EventPayload::samples`]); its wire name is the `rename`.

use serde::{Deserialize, Serialize};

use crate::{
    Cause, Interaction, InteractionOutcome, InteractionResolution, InteractionState, Notice, Position, QueueEntry,
    QueueState, Row, SessionPhase, TurnState,
    worker::{ToolStatus, Usage},
};

/// A persisted history event: `{sequence, type, at, turnId?, rows?, …payload}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub sequence: i64,
    pub at: String,
    /// The turn the event belongs to (absent for session-level events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The rows this event publishes (absent when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<Row>,
    /// `type` and the type's own fields.
    #[serde(flatten)]
    pub payload: EventPayload,
}

/// Every persisted event type with its payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type")]
pub enum EventPayload {
    #[serde(rename = "session.created")]
    SessionCreated(SessionCreated),
    #[serde(rename = "session.titleChanged")]
    SessionTitleChanged(TitleChanged),
    #[serde(rename = "session.modelChanged")]
    SessionModelChanged(ModelChanged),
    /// The session's agent changed (`session.setAgent`); later turns use the new one.
    #[serde(rename = "session.agentChanged")]
    SessionAgentChanged(crate::AgentChanged),
    /// A fact for the client to word (`workspace-offline`, …).
    #[serde(rename = "session.notice")]
    SessionNotice(Notice),
    /// The turn's model set out or updated its plan (`update_plan`): the whole list, each
    /// step with its status, for a client to draw as a checklist.
    #[serde(rename = "plan.updated")]
    PlanUpdated(PlanUpdated),
    /// The first event after `session.clear`: everything before it is gone.
    #[serde(rename = "session.cleared")]
    SessionCleared(Nothing),
    /// A turn was admitted behind others (or while paused or offline).
    #[serde(rename = "turn.queued")]
    TurnQueued(TurnQueued),
    /// A turn started; publishes its prompt as the user row.
    #[serde(rename = "turn.started")]
    TurnStarted(Nothing),
    /// A model step completed; publishes its rows.
    #[serde(rename = "model.completed")]
    ModelCompleted(ModelCompleted),
    /// A tool call (the `toolCall` row at `position`) started running.
    #[serde(rename = "tool.status")]
    ToolStatus(ToolCallStatus),
    /// A tool call ended (`completed`, `failed`, `denied`); publishes its `toolResult` row.
    #[serde(rename = "tool.ended")]
    ToolEnded(ToolCallStatus),
    /// A turn settled; always the turn's last event.
    #[serde(rename = "turn.ended")]
    TurnEnded(TurnEnded),
    /// The queue as it now is (after a send queued, a queued turn started, an edit, a move,
    /// a removal, a pause or a clear).
    #[serde(rename = "queue.changed")]
    QueueChanged(QueueState),
    /// A tool call is held for approval, or a question is asked (SPEC §4.6).
    #[serde(rename = "interaction.requested")]
    InteractionRequested(InteractionRequested),
    /// An interaction was resolved: answered, expired, unwatched, auto-approved or closed.
    #[serde(rename = "interaction.resolved")]
    InteractionResolved(InteractionResolution),
    /// Older history was summarized (SPEC §4.17); publishes the `handoff` row. Rows before
    /// `keepFrom` are no longer sent to the model.
    #[serde(rename = "session.compacted")]
    SessionCompacted(Compacted),
    /// The first event of a fork's own: the history before it was copied from `branch`.
    #[serde(rename = "session.forked")]
    SessionForked(Forked),
    /// A turn of a child session (one this coordinator started) ended (SPEC §4.15).
    #[serde(rename = "child.turnEnded")]
    ChildTurnEnded(ChildTurnEnded),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Compacted {
    /// The first row still sent as itself.
    pub keep_from: Position,
    /// A turn nearing the context window compacted (false: `session.compact`).
    pub automatic: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Forked {
    pub branch: crate::Branch,
}

/// A payload without fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Nothing {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionCreated {
    pub workspace_id: String,
    /// The session whose delegate call started this one (a sub-agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// A tool call's status change: the call row's position and id, and the new status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ToolCallStatus {
    pub position: Position,
    pub call_id: String,
    pub status: ToolStatus,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TitleChanged {
    pub title: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ModelChanged {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TurnQueued {
    /// The entry as the queue shows it.
    pub entry: QueueEntry,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ModelCompleted {
    /// The model step within the turn that completed (0, 1, …): the same `step` as the
    /// `model.delta` items that streamed it, so that a client drops exactly that step's live
    /// text (and ignores any of it that arrives later). Absent only in events stored before
    /// Berth named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TurnEnded {
    pub state: TurnState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// The turn's model usage as the proxy metered it (absent when no step reported any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A child session's turn ended: the child, its turn, and how it ended. Appended to the
/// coordinator's history (a session-level event: no `turnId` of the coordinator's own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ChildTurnEnded {
    pub session_id: String,
    pub child_turn_id: String,
    pub state: TurnState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct InteractionRequested {
    /// The interaction as asked (`state: pending`); boxed to keep the payload enum small.
    pub interaction: Box<Interaction>,
}

/// A turn's plan as its model last set it (`plan.updated`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PlanUpdated {
    /// Why the plan is what it is now, in the model's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<String>,
    /// Every step, in order (at most [`PLAN_STEPS_MAX`]).
    pub plan: Vec<PlanStep>,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PlanStep {
    /// The step, a short sentence (at most [`PLAN_STEP_BYTES_MAX`] bytes).
    pub step: String,
    pub status: PlanStepStatus,
}

/// Where a plan step stands; at most one step is `inProgress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum PlanStepStatus {
    Pending,
    InProgress,
    Completed,
}

/// The most steps a plan has.
pub const PLAN_STEPS_MAX: usize = 50;
/// The longest plan step, and the longest explanation, in bytes.
pub const PLAN_STEP_BYTES_MAX: usize = 1000;

impl EventPayload {
    /// The wire `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            EventPayload::SessionCreated(_) => "session.created",
            EventPayload::SessionTitleChanged(_) => "session.titleChanged",
            EventPayload::SessionModelChanged(_) => "session.modelChanged",
            EventPayload::SessionAgentChanged(_) => "session.agentChanged",
            EventPayload::SessionCompacted(_) => "session.compacted",
            EventPayload::SessionNotice(_) => "session.notice",
            EventPayload::PlanUpdated(_) => "plan.updated",
            EventPayload::SessionCleared(_) => "session.cleared",
            EventPayload::TurnQueued(_) => "turn.queued",
            EventPayload::TurnStarted(_) => "turn.started",
            EventPayload::ModelCompleted(_) => "model.completed",
            EventPayload::ToolStatus(_) => "tool.status",
            EventPayload::ToolEnded(_) => "tool.ended",
            EventPayload::TurnEnded(_) => "turn.ended",
            EventPayload::QueueChanged(_) => "queue.changed",
            EventPayload::InteractionRequested(_) => "interaction.requested",
            EventPayload::InteractionResolved(_) => "interaction.resolved",
            EventPayload::SessionForked(_) => "session.forked",
            EventPayload::ChildTurnEnded(_) => "child.turnEnded",
        }
    }

    /// One sample of every variant, for schema and round-trip tests. The exhaustive match
    /// in `type_name` makes a new variant a compile error until it is named there; add its
    /// sample here too.
    pub fn samples() -> Vec<EventPayload> {
        let entry = QueueEntry {
            queue_id: "trn_1".into(),
            turn_id: "trn_1".into(),
            queue_revision: 0,
            preview: "fix the".into(),
            prompt_bytes: 20,
        };
        vec![
            EventPayload::SessionCreated(SessionCreated {
                workspace_id: "wsp_1".into(),
                parent: Some("ses_1".into()),
            }),
            EventPayload::ToolStatus(ToolCallStatus {
                position: Position {
                    source_sequence: 3,
                    item_index: 0,
                },
                call_id: "call_1".into(),
                status: ToolStatus::Running,
            }),
            EventPayload::ToolEnded(ToolCallStatus {
                position: Position {
                    source_sequence: 3,
                    item_index: 0,
                },
                call_id: "call_1".into(),
                status: ToolStatus::Denied,
            }),
            EventPayload::SessionTitleChanged(TitleChanged { title: "t".into() }),
            EventPayload::SessionModelChanged(ModelChanged {
                provider: None,
                model: Some("m".into()),
            }),
            EventPayload::SessionAgentChanged(crate::AgentChanged {
                agent_id: Some("agt_1".into()),
                name: Some("reviewer".into()),
            }),
            EventPayload::SessionNotice(Notice {
                level: "warning".into(),
                code: "workspace-offline".into(),
                params: serde_json::json!({"workspaceId": "wsp_1"}),
            }),
            EventPayload::PlanUpdated(PlanUpdated {
                explanation: Some("Fix the parser first".into()),
                plan: vec![
                    PlanStep {
                        step: "Reproduce the failure".into(),
                        status: PlanStepStatus::Completed,
                    },
                    PlanStep {
                        step: "Fix the parser".into(),
                        status: PlanStepStatus::InProgress,
                    },
                    PlanStep {
                        step: "Run the tests".into(),
                        status: PlanStepStatus::Pending,
                    },
                ],
            }),
            EventPayload::SessionCleared(Nothing {}),
            EventPayload::TurnQueued(TurnQueued { entry: entry.clone() }),
            EventPayload::TurnStarted(Nothing {}),
            EventPayload::ModelCompleted(ModelCompleted {
                step: Some(1),
                usage: Some(Usage {
                    input_tokens: 1,
                    output_tokens: 2,
                }),
            }),
            EventPayload::TurnEnded(TurnEnded {
                state: TurnState::Failed,
                cause: Some(Cause {
                    code: "provider-status".into(),
                    status: Some(500),
                }),
                usage: Some(Usage {
                    input_tokens: 3,
                    output_tokens: 4,
                }),
            }),
            EventPayload::QueueChanged(QueueState {
                queue: vec![entry],
                paused: true,
            }),
            EventPayload::InteractionRequested(InteractionRequested {
                interaction: Box::new(Interaction {
                    interaction_id: "int_1".into(),
                    kind: crate::INTERACTION_APPROVAL.into(),
                    session_id: "ses_1".into(),
                    turn_id: "trn_1".into(),
                    tool: Some(crate::InteractionTool {
                        name: "shell".into(),
                        call_id: "call_1".into(),
                    }),
                    input: serde_json::json!({"command": "make"}),
                    options: None,
                    params: None,
                    fallback: InteractionOutcome::Approval { approved: false },
                    created_at: "2026-01-01T00:00:00.000Z".into(),
                    expires_at: "2026-01-01T00:15:00.000Z".into(),
                    state: InteractionState::Pending,
                    outcome: None,
                    resolved_at: None,
                }),
            }),
            EventPayload::InteractionResolved(InteractionResolution {
                interaction_id: "int_1".into(),
                state: InteractionState::Answered,
                outcome: InteractionOutcome::Choice {
                    choice: Some("main".into()),
                },
                answered_by: Some("usr_1".into()),
            }),
            EventPayload::SessionCompacted(Compacted {
                keep_from: Position {
                    source_sequence: 9,
                    item_index: 0,
                },
                automatic: true,
            }),
            EventPayload::SessionForked(Forked {
                branch: crate::Branch {
                    session_id: "ses_1".into(),
                    turn_id: Some("trn_1".into()),
                    sequence: 7,
                },
            }),
            EventPayload::ChildTurnEnded(ChildTurnEnded {
                session_id: "ses_2".into(),
                child_turn_id: "trn_2".into(),
                state: TurnState::Completed,
                cause: None,
            }),
        ]
    }
}

/// Live-only: streamed model output of the running step (no sequence; not history).
/// Offsets are byte offsets into the step's text and thinking, so that a watcher can tell
/// exactly where a piece goes; a piece at offset 0 starts (or, after `resync`, replaces)
/// the step's text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ModelDelta {
    pub turn_id: String,
    /// The model step within the turn (0, 1, …); a new step starts new text.
    pub step: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_offset: Option<u64>,
}

/// Live-only: the session's phase changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PhaseItem {
    pub phase: SessionPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
}

/// What a client draws besides history: sent once a watch has caught up, and again after
/// a `resync`. It reflects every event through sequence `through` (events after it follow).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WatchState {
    pub through: i64,
    pub phase: SessionPhase,
    /// The running turn's id; `null` when none runs (as in the snapshot).
    #[serde(default)]
    pub running: Option<String>,
    pub queued: u32,
    pub queue: Vec<QueueEntry>,
    pub paused: bool,
    pub pending_interactions: Vec<crate::Interaction>,
}

/// Live items may have been lost for this watcher (it read too slowly, or its replica's
/// connection to the other replicas' live output was re-established). Drop the live view
/// (streamed text, phase): any history events not yet sent, a `state` item and the running
/// step's text from offset 0 follow. History events are never dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Resync {
    pub reason: ResyncReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum ResyncReason {
    /// The watcher fell behind the live stream.
    Lagged,
    /// The replica's `LISTEN` connection (which carries the other replicas' live output)
    /// was lost and re-established: live items sent meanwhile may have been missed.
    Reconnected,
}

/// The live-only items of a watch (no `sequence`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type")]
pub enum LiveItem {
    #[serde(rename = "model.delta")]
    ModelDelta(ModelDelta),
    #[serde(rename = "phase")]
    Phase(PhaseItem),
    #[serde(rename = "state")]
    State(WatchState),
    #[serde(rename = "resync")]
    Resync(Resync),
}

/// Any item of a `session.watch` subscription: a history event (it has a `sequence`) or a
/// live-only item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum WatchItem {
    Event(Event),
    Live(LiveItem),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serialize, read back into the typed union, serialize again: nothing may be lost or added.
    fn round_trip(item: &WatchItem) {
        let wire = serde_json::to_value(item).unwrap();
        let back: WatchItem = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(&back, item);
        assert_eq!(serde_json::to_value(&back).unwrap(), wire);
        // Absent, never null, but for the running turn SPEC gives as null when none runs.
        let text = wire.to_string().replace("\"running\":null", "");
        assert!(!text.contains("null"), "absent, never null: {wire}");
    }

    #[test]
    fn every_event_type_round_trips_with_its_type_name() {
        let samples = EventPayload::samples();
        let mut names: Vec<_> = samples.iter().map(EventPayload::type_name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), samples.len(), "one sample per variant");
        for payload in samples {
            let name = payload.type_name();
            let event = Event {
                sequence: 3,
                at: "2026-01-01T00:00:00Z".into(),
                turn_id: Some("trn_1".into()),
                rows: Vec::new(),
                payload,
            };
            let wire = serde_json::to_value(&event).unwrap();
            assert_eq!(wire["type"], name);
            round_trip(&WatchItem::Event(event));
        }
    }

    #[test]
    fn live_items_round_trip() {
        let delta = ModelDelta {
            turn_id: "trn_1".into(),
            step: 1,
            text: Some("hi".into()),
            text_offset: Some(4),
            thinking: None,
            thinking_offset: None,
        };
        for item in [
            LiveItem::ModelDelta(delta),
            LiveItem::Phase(PhaseItem {
                phase: SessionPhase::Running,
                turn_id: Some("trn_1".into()),
            }),
            LiveItem::Resync(Resync {
                reason: ResyncReason::Lagged,
            }),
            LiveItem::State(WatchState {
                through: 9,
                phase: SessionPhase::Idle,
                running: None,
                queued: 0,
                queue: Vec::new(),
                paused: false,
                pending_interactions: Vec::new(),
            }),
        ] {
            round_trip(&WatchItem::Live(item));
        }
    }
}
