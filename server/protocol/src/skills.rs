//! Skills (SPEC §4.16): instruction documents from the workspace (`.berth/skills/*/SKILL.md`)
//! and from the tenant, offered to the model by name and summary and read on demand.

use serde::{Deserialize, Serialize};

use crate::ErrorCode;

/// The most bytes of a skill's body (a workspace `SKILL.md` included).
pub const MAX_SKILL_BYTES: usize = 256 << 10;
/// The most bytes of a skill's summary.
pub const MAX_SKILL_SUMMARY_BYTES: usize = 1024;
/// The most bytes of a skill's name: letters, digits, `-`, `_` and `.`.
pub const MAX_SKILL_NAME_BYTES: usize = 64;

/// Whether `name` may name a skill: 1 to 64 ASCII letters, digits, `-`, `_`, `.`, not
/// starting with `.`.
pub fn is_skill_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SKILL_NAME_BYTES
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Where a skill comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum SkillSource {
    /// Saved in Berth for the whole tenant (`skill.save`).
    Tenant,
    /// A `.berth/skills/<dir>/SKILL.md` of the workspace.
    Workspace,
}

/// A skill as offered: its name and summary (what the model sees before reading it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SkillInfo {
    pub name: String,
    pub summary: String,
    pub source: SkillSource,
    /// A tenant skill's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_id: Option<String>,
}

/// `skill.list`: the tenant's skills and, given a workspace (or a session, for its
/// workspace), that workspace's.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SkillListParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SkillListResult {
    /// Workspace skills first, then the tenant's; each by name.
    pub skills: Vec<SkillInfo>,
    /// Why the workspace's skills are missing (e.g. `workspace-offline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_error: Option<ErrorCode>,
}

/// A tenant skill with its body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Skill {
    pub skill_id: String,
    pub name: String,
    pub summary: String,
    pub body: String,
    pub created_at: String,
    pub updated_at: String,
}

/// `skill.get`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SkillRef {
    pub skill_id: String,
}

/// `skill.save`: create a tenant skill (no `skillId`) or replace one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SkillSaveParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_id: Option<String>,
    pub name: String,
    pub summary: String,
    pub body: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// `skill.remove` (idempotent).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SkillRemoveParams {
    pub skill_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}
