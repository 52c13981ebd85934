//! Skills (SPEC §4.16): instruction documents the model is offered by name and summary (in
//! its system prompt) and reads on demand with the `read_skill` tool. A workspace's skills
//! are its `.berth/skills/<dir>/SKILL.md` files (read through `workspace.rs`, like every
//! path); the tenant's come with the turn (`turn.run`), their bodies read with `turn.skill`.
//! A workspace skill shadows a tenant skill of the same name.

use berth_protocol::{
    MAX_SKILL_BYTES, MAX_SKILL_SUMMARY_BYTES, SkillInfo, SkillSource, is_skill_name,
    worker::{self as wp, TurnSkill},
};
use serde_json::{Value, json};

use crate::{
    tools::Outcome,
    turn::{Halt, TurnLink},
    workspace::Workspace,
};

pub(crate) const READ_SKILL: &str = "read_skill";
const SKILLS_DIR: &str = ".berth/skills";
/// The most workspace skills read (directories past it are left out).
const WORKSPACE_MAX: usize = 100;
/// The most characters of a summary the system prompt shows.
const PROMPT_SUMMARY_CHARS: usize = 300;

pub(crate) fn schema() -> Value {
    json!({"type": "function", "function": {
        "name": READ_SKILL,
        "description": "Read a skill: instructions for a particular kind of task. Read the skill before doing such a task.",
        "parameters": {"type": "object", "properties": {
            "name": {"type": "string", "description": "The skill's name, as listed."}
        }, "required": ["name"]}
    }})
}

/// A `SKILL.md`: its name and summary from the front matter (`name:`, `description:`),
/// else the directory's name and the first line of text; and the text after the front
/// matter.
fn parse(dir: &str, text: &str) -> Option<(String, String, String)> {
    let mut name = None;
    let mut summary = None;
    let mut body = text;
    let rest = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n"));
    if let Some(rest) = rest
        && let Some(end) = rest.find("\n---")
    {
        for line in rest[..end].lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim().trim_matches(|c| c == '"' || c == '\'').trim();
            match key.trim() {
                "name" if !value.is_empty() => name = Some(value.to_string()),
                "description" if !value.is_empty() => summary = Some(value.to_string()),
                _ => {}
            }
        }
        let after = &rest[end + 4..];
        body = after.split_once('\n').map_or("", |(_, b)| b);
    }
    let name = name
        .filter(|n| is_skill_name(n))
        .or_else(|| is_skill_name(dir).then(|| dir.to_string()))?;
    let summary = summary.or_else(|| {
        body.lines()
            .map(|l| l.trim().trim_start_matches('#').trim())
            .find(|l| !l.is_empty())
            .map(str::to_string)
    })?;
    let summary = berth_protocol::text::prefix(&summary, MAX_SKILL_SUMMARY_BYTES).to_string();
    Some((name, summary, body.to_string()))
}

/// The workspace's skills with their directories, by directory name.
fn scan(ws: &Workspace) -> Vec<(SkillInfo, String)> {
    let Ok(entries) = ws.list_private(SKILLS_DIR) else {
        return Vec::new();
    };
    let mut out: Vec<(SkillInfo, String)> = Vec::new();
    for e in entries.iter().filter(|e| e.kind == "dir").take(WORKSPACE_MAX) {
        let path = format!("{SKILLS_DIR}/{}/SKILL.md", e.name);
        let Ok(Some(bytes)) = ws.read_private(&path, MAX_SKILL_BYTES as u64) else {
            continue;
        };
        let Ok(text) = String::from_utf8(bytes) else { continue };
        let Some((name, summary, _)) = parse(&e.name, &text) else {
            continue;
        };
        if out.iter().any(|(s, _)| s.name == name) {
            continue;
        }
        let info = SkillInfo {
            name,
            summary,
            source: SkillSource::Workspace,
            skill_id: None,
        };
        out.push((info, e.name.clone()));
    }
    out
}

/// The workspace's skills (`skill.list`, answered for the server).
pub(crate) fn list(ws: &Workspace) -> Vec<SkillInfo> {
    scan(ws).into_iter().map(|(s, _)| s).collect()
}

/// A workspace skill's text (after its front matter).
fn read_workspace(ws: &Workspace, name: &str) -> Option<String> {
    let (_, dir) = scan(ws).into_iter().find(|(s, _)| s.name == name)?;
    let bytes = ws
        .read_private(&format!("{SKILLS_DIR}/{dir}/SKILL.md"), MAX_SKILL_BYTES as u64)
        .ok()??;
    let text = String::from_utf8(bytes).ok()?;
    parse(&dir, &text).map(|(_, _, body)| body)
}

/// The skills offered in a turn: the workspace's, then the tenant's they do not shadow.
pub(crate) async fn offered(ws: std::sync::Arc<Workspace>, tenant: &[SkillInfo]) -> Vec<SkillInfo> {
    let mut skills = tokio::task::spawn_blocking(move || list(&ws)).await.unwrap_or_default();
    for s in tenant {
        if !skills.iter().any(|w| w.name == s.name) {
            skills.push(s.clone());
        }
    }
    skills
}

/// What the system prompt says about the skills.
pub(crate) fn prompt_section(skills: &[SkillInfo]) -> String {
    let mut out = format!(
        "\n\nSkills are instructions for particular kinds of task. Before doing such a task, read its skill with the {READ_SKILL} tool. Available skills:"
    );
    for s in skills {
        let summary: String = s.summary.chars().take(PROMPT_SUMMARY_CHARS).collect();
        // One line each: no line break of any kind (nor other control) starts another.
        let summary = summary.replace(|c: char| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'), " ");
        out.push_str(&format!("\n- {}: {}", s.name, summary));
    }
    out
}

/// The `read_skill` tool.
pub(crate) async fn run(
    t: &TurnLink,
    ws: std::sync::Arc<Workspace>,
    skills: &[SkillInfo],
    arguments: &str,
) -> Result<Outcome, Halt> {
    #[derive(serde::Deserialize)]
    struct Args {
        name: String,
    }
    let text = if arguments.trim().is_empty() { "{}" } else { arguments };
    let name = match serde_json::from_str::<Args>(text) {
        Ok(a) => a.name,
        Err(e) => return Ok(Outcome::error(format!("invalid arguments: {e}"))),
    };
    let Some(skill) = skills.iter().find(|s| s.name == name) else {
        let names: Vec<&str> = skills.iter().map(|s| s.name.as_str()).collect();
        return Ok(Outcome::error(format!(
            "no skill named {name:?}; the skills are: {}",
            names.join(", ")
        )));
    };
    let body = match skill.source {
        SkillSource::Workspace => {
            let n = name.clone();
            tokio::task::spawn_blocking(move || read_workspace(&ws, &n))
                .await
                .ok()
                .flatten()
        }
        SkillSource::Tenant => {
            let p = TurnSkill {
                turn_id: t.turn_id().to_string(),
                name: name.clone(),
            };
            match t
                .request(wp::TURN_SKILL, serde_json::to_value(&p).unwrap_or_default())
                .await
            {
                Ok(v) => v.get("body").and_then(Value::as_str).map(str::to_string),
                Err(Halt::Refused(_)) => None,
                Err(h) => return Err(h),
            }
        }
    };
    Ok(match body {
        Some(body) => Outcome::ok(body),
        None => Outcome::error(format!(
            "the skill {name:?} could not be read (it may have been removed)"
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A skill's summary is one line of the system prompt, whatever line breaks it holds.
    #[test]
    fn a_summary_stays_on_its_line() {
        let skill = SkillInfo {
            name: "s".into(),
            summary: "one\rtwo\u{2028}three\u{2029}four\nfive\u{85}six".into(),
            source: berth_protocol::SkillSource::Tenant,
            skill_id: None,
        };
        let section = prompt_section(&[skill]);
        let line = section.lines().last().unwrap();
        assert_eq!(line, "- s: one two three four five six");
        assert_eq!(section.trim_start().lines().count(), 2, "{section:?}");
    }

    #[test]
    fn front_matter_names_and_summarizes_else_the_directory_and_first_line() {
        let (name, summary, body) = parse(
            "dir",
            "---\nname: pdf-tools\ndescription: \"Work with PDFs\"\n---\n# PDF\nSteps.\n",
        )
        .unwrap();
        assert_eq!((name.as_str(), summary.as_str()), ("pdf-tools", "Work with PDFs"));
        assert_eq!(body, "# PDF\nSteps.\n");
        let (name, summary, body) = parse("release", "\n# Cutting a release\nTag it.\n").unwrap();
        assert_eq!((name.as_str(), summary.as_str()), ("release", "Cutting a release"));
        assert!(body.contains("Tag it."));
        // A name that is no skill name falls back to the directory; none usable: no skill.
        assert_eq!(parse("ok", "---\nname: bad name!\n---\ntext").unwrap().0, "ok");
        assert!(parse(".hidden", "text").is_none());
        assert!(parse("empty", "").is_none());
    }
}
