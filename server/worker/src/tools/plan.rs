//! `update_plan`: the model's plan for the turn — a short checklist whose steps it marks
//! pending, in progress and completed as it works (Codex's `update_plan`, opencode's
//! `todowrite`). Each update goes to the server as `turn.plan` and is stored as a
//! `plan.updated` event, which clients draw; the model reads back a one-line summary.

use berth_protocol::{PLAN_STEP_BYTES_MAX, PLAN_STEPS_MAX, PlanStep, PlanStepStatus, PlanUpdated, worker as wp};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Outcome;
use crate::turn::{Halt, TurnLink};

pub(crate) const UPDATE_PLAN: &str = "update_plan";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    #[serde(default)]
    explanation: Option<String>,
    plan: Vec<Step>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    step: String,
    status: Status,
}

/// The model's spelling (Codex's): `in_progress`.
#[derive(Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Status {
    Pending,
    InProgress,
    Completed,
}

pub(crate) fn schema() -> Value {
    json!({"type": "function", "function": {
        "name": UPDATE_PLAN,
        "description": "Set out or update your plan for this task: the whole list of steps, each pending, \
    in_progress or completed (at most one in_progress). Use it for work of several steps; mark a step completed as \
    soon as it is done and the next one in_progress. The user sees the plan as a checklist.",
        "parameters": {"type": "object", "properties": {
            "explanation": {"type": "string", "description": "Why the plan is what it is now (optional)."},
            "plan": {"type": "array", "items": {"type": "object", "properties": {
                "step": {"type": "string", "description": "A short sentence."},
                "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}
            }, "required": ["step", "status"], "additionalProperties": false}}
        }, "required": ["plan"], "additionalProperties": false}
    }})
}

/// Check the plan and hand it to the server.
pub(crate) async fn run(t: &TurnLink, arguments: &str) -> Result<Outcome, Halt> {
    let a = match super::args::<Args>(arguments) {
        Ok(a) => a,
        Err(e) => return Ok(e),
    };
    if a.plan.len() > PLAN_STEPS_MAX {
        return Ok(Outcome::error(format!(
            "a plan has at most {PLAN_STEPS_MAX} steps; merge some; the plan was not updated"
        )));
    }
    if a.plan.iter().filter(|s| s.status == Status::InProgress).count() > 1 {
        return Ok(Outcome::error(
            "at most one step can be in_progress; the plan was not updated",
        ));
    }
    let too_long = |s: &str| s.len() > PLAN_STEP_BYTES_MAX;
    if a.plan.iter().any(|s| s.step.trim().is_empty() || too_long(&s.step))
        || a.explanation.as_deref().is_some_and(too_long)
    {
        return Ok(Outcome::error(format!(
            "each step is a short non-empty sentence (at most {PLAN_STEP_BYTES_MAX} bytes, as is the explanation); \
the plan was not updated"
        )));
    }
    let plan = PlanUpdated {
        explanation: a.explanation.filter(|e| !e.trim().is_empty()),
        plan: a
            .plan
            .iter()
            .map(|s| PlanStep {
                step: s.step.trim().replace('\0', ""),
                status: match s.status {
                    Status::Pending => PlanStepStatus::Pending,
                    Status::InProgress => PlanStepStatus::InProgress,
                    Status::Completed => PlanStepStatus::Completed,
                },
            })
            .collect(),
    };
    let count = |st: Status| a.plan.iter().filter(|s| s.status == st).count();
    let summary = format!(
        "Plan updated: {} steps, {} completed, {} in progress, {} pending.",
        a.plan.len(),
        count(Status::Completed),
        count(Status::InProgress),
        count(Status::Pending)
    );
    let p = wp::TurnPlan {
        turn_id: t.turn_id().to_string(),
        plan,
    };
    match t
        .request(wp::TURN_PLAN, serde_json::to_value(&p).unwrap_or_default())
        .await
    {
        Ok(_) => Ok(Outcome::ok(summary)),
        Err(Halt::Refused(code)) => Ok(Outcome::error(format!("the plan was not recorded ({code})"))),
        Err(h) => Err(h),
    }
}
