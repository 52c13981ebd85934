//! `ask_user`: the model asks the person a question — pick one of some options (`choice`),
//! free text (`text`) or yes/no (`confirm`) — as a question interaction (SPEC §4.6): the
//! server shows it to the session's clients and answers when someone does, or with its
//! fallback (`{choice: null}`) when nobody watches or nobody answers in time. The model
//! reads a typed answer: `{"answer": …}`, `{"skipped": true}`, or `{"answered": false,
//! "reason": …}` with what to do next.

use berth_protocol::{InteractionKind, InteractionState};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Outcome;
use crate::{
    model::ToolCall,
    turn::{Halt, TurnLink},
};

pub(crate) const ASK_USER: &str = "ask_user";

/// The longest question, in bytes.
const QUESTION_MAX: usize = 2000;
/// How many options a `choice` offers at most, and the longest one in bytes.
const OPTIONS_MAX: usize = 10;
const OPTION_MAX: usize = 200;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    kind: Kind,
    question: String,
    #[serde(default)]
    options: Option<Vec<String>>,
    #[serde(default)]
    allow_skip: Option<bool>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Debug)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Choice,
    Text,
    Confirm,
}

impl Kind {
    fn interaction(self) -> InteractionKind {
        match self {
            Kind::Choice => InteractionKind::Choice,
            Kind::Text => InteractionKind::Text,
            Kind::Confirm => InteractionKind::Confirm,
        }
    }
}

/// The answers a `confirm` offers.
const CONFIRM_OPTIONS: [&str; 2] = ["yes", "no"];

pub(crate) fn schema() -> Value {
    json!({"type": "function", "function": {
        "name": ASK_USER,
        "description": "Ask the user a question and wait for the answer. Use it only when you cannot go on well \
    without their decision (a choice between approaches, a missing fact, a confirmation before something hard to undo). \
    kind: choice (pick one of options), text (free answer) or confirm (yes or no). The answer comes back as \
    {\"answer\": ...}, {\"skipped\": true} when they chose not to answer, or {\"answered\": false, \"reason\": ...} when \
    nobody answered: then go on with your best judgement and say what you assumed.",
        "parameters": {"type": "object", "properties": {
            "kind": {"type": "string", "enum": ["choice", "text", "confirm"]},
            "question": {"type": "string", "description": "The question, as the user should read it."},
            "options": {"type": "array", "items": {"type": "string"},
                        "description": format!("For choice only: 2 to {OPTIONS_MAX} short options.")},
            "allow_skip": {"type": "boolean", "description": "Whether the user may skip the question (default true)."}
        }, "required": ["kind", "question"], "additionalProperties": false}
    }})
}

/// The `turn.interaction` params of a valid call, or the error the model reads.
fn interaction_params(turn_id: &str, call_id: &str, arguments: &str) -> Result<Value, Outcome> {
    let a = super::args::<Args>(arguments)?;
    let refuse = |why: String| Err(Outcome::error(format!("{why}; the question was not asked")));
    if a.question.trim().is_empty() || a.question.len() > QUESTION_MAX {
        return refuse(format!("question must be 1 to {QUESTION_MAX} bytes"));
    }
    let options = match (a.kind, a.options) {
        (Kind::Choice, Some(o)) => {
            let mut unique = o.clone();
            unique.sort();
            unique.dedup();
            if o.len() < 2 || o.len() > OPTIONS_MAX || unique.len() != o.len() {
                return refuse(format!("choice takes 2 to {OPTIONS_MAX} different options"));
            }
            if o.iter().any(|s| s.trim().is_empty() || s.len() > OPTION_MAX) {
                return refuse(format!("each option is 1 to {OPTION_MAX} bytes"));
            }
            Some(o)
        }
        (Kind::Choice, None) => return refuse("choice needs options".into()),
        (_, Some(_)) => return refuse("only choice takes options".into()),
        (Kind::Confirm, None) => Some(CONFIRM_OPTIONS.map(String::from).to_vec()),
        (Kind::Text, None) => None,
    };
    let mut params = json!({
        "turnId": turn_id,
        "callId": call_id,
        "kind": a.kind.interaction().as_str(),
        "input": {"question": a.question},
        "params": {"allowSkip": a.allow_skip.unwrap_or(true)},
        "fallback": {"choice": null},
    });
    if let Some(o) = options {
        params["options"] = json!(o);
    }
    Ok(params)
}

/// What the model reads for the interaction's resolution (`{outcome, state}`).
fn answer(resolution: &Value) -> Outcome {
    let state = resolution
        .get("state")
        .and_then(|s| serde_json::from_value::<InteractionState>(s.clone()).ok());
    let choice = resolution.pointer("/outcome/choice");
    let reply = match (state, choice) {
        (Some(InteractionState::Answered), Some(Value::String(s))) => json!({"answer": s}),
        (Some(InteractionState::Answered), _) => json!({"skipped": true}),
        (state, _) => {
            let reason = match state {
                Some(InteractionState::Unwatched) => "nobody is watching this session",
                Some(InteractionState::Expired) => "nobody answered in time",
                _ => "the question was closed",
            };
            json!({"answered": false, "reason": reason,
                   "next": "Go on with your best judgement and say what you assumed."})
        }
    };
    Outcome::ok(reply.to_string())
}

/// Ask, wait for the answer (or the turn's stop) and return it to the model.
pub(crate) async fn run(t: &TurnLink, call: &ToolCall, cancel: &CancellationToken) -> Result<Outcome, Halt> {
    let params = match interaction_params(t.turn_id(), &call.id, &call.arguments) {
        Ok(p) => p,
        Err(e) => return Ok(e),
    };
    match crate::policy::interaction(t, params, cancel).await {
        Ok(resolution) => Ok(answer(&resolution)),
        Err(Halt::Refused(code)) => Ok(Outcome::error(format!(
            "the question could not be asked ({code}); go on without the answer"
        ))),
        Err(h) => Err(h),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_are_typed_and_checked() {
        let p = interaction_params(
            "t",
            "c",
            r#"{"kind":"confirm","question":"Delete it?","allow_skip":false}"#,
        )
        .unwrap();
        assert_eq!(p["kind"], "confirm");
        assert_eq!(p["options"], json!(["yes", "no"]));
        assert_eq!(p["params"], json!({"allowSkip": false}));
        assert_eq!(p["fallback"], json!({"choice": null}));
        let p = interaction_params("t", "c", r#"{"kind":"text","question":"Name?"}"#).unwrap();
        assert!(p.get("options").is_none());
        assert_eq!(p["params"]["allowSkip"], true);
        for bad in [
            r#"{"kind":"choice","question":"Which?"}"#,
            r#"{"kind":"choice","question":"Which?","options":["a"]}"#,
            r#"{"kind":"choice","question":"Which?","options":["a","a"]}"#,
            r#"{"kind":"text","question":"Which?","options":["a","b"]}"#,
            r#"{"kind":"text","question":" "}"#,
            r#"{"kind":"maybe","question":"Which?"}"#,
        ] {
            assert!(!interaction_params("t", "c", bad).unwrap_err().ok, "{bad}");
        }
    }

    #[test]
    fn the_model_reads_a_typed_answer() {
        let a = |v: Value| serde_json::from_str::<Value>(&answer(&v).output).unwrap();
        assert_eq!(
            a(json!({"state": "answered", "outcome": {"choice": "dev"}})),
            json!({"answer": "dev"})
        );
        assert_eq!(
            a(json!({"state": "answered", "outcome": {"choice": null}})),
            json!({"skipped": true})
        );
        let expired = a(json!({"state": "expired", "outcome": {"choice": null}}));
        assert_eq!(expired["answered"], false);
        assert_eq!(expired["reason"], "nobody answered in time");
    }
}
