//! Tenant skills (SPEC §4.16): instruction documents saved in Berth, offered to the model by
//! name and summary and read on demand by a running turn.

use berth_protocol::{ErrorCode, Removed, Skill, SkillInfo, SkillSaveParams, SkillSource};
use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;

use crate::{
    Cached, Result, Store, StoreError,
    admin::{Editor, audit, lock_owned},
    fmt_time, not_found,
    receipts::{Receipt, finish},
    tenant_tx, token,
    turns::lock_running_turn,
};

/// The most tenant skills offered to one turn.
const OFFERED_MAX: i64 = 200;

const SKILL_COLUMNS: &str = "id, name, summary, body, created_at, updated_at";

fn skill_from(r: &tokio_postgres::Row) -> Skill {
    Skill {
        skill_id: r.get(0),
        name: r.get(1),
        summary: r.get(2),
        body: r.get(3),
        created_at: fmt_time(r.get(4)),
        updated_at: fmt_time(r.get(5)),
    }
}

/// The tenant's skills by name (no bodies).
/// The tenant's skills offered to a turn, by name.
pub(crate) const TENANT_SKILLS_SQL: &str =
    "SELECT id, name, summary FROM skills WHERE tenant_id = $1 ORDER BY name LIMIT $2";

pub(crate) async fn tenant_skills(tx: &impl GenericClient, tenant_id: &str) -> Result<Vec<SkillInfo>> {
    let rows = tx.qa(TENANT_SKILLS_SQL, &[&tenant_id, &OFFERED_MAX]).await?;
    Ok(rows
        .iter()
        .map(|r| SkillInfo {
            skill_id: Some(r.get(0)),
            name: r.get(1),
            summary: r.get(2),
            source: SkillSource::Tenant,
        })
        .collect())
}

impl Store {
    pub async fn list_skills(&self, tenant_id: &str) -> Result<Vec<SkillInfo>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        tenant_skills(&tx, tenant_id).await
    }

    pub async fn get_skill(&self, tenant_id: &str, skill_id: &str) -> Result<Skill> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let row = tx
            .qo(
                &format!("SELECT {SKILL_COLUMNS} FROM skills WHERE id = $1 AND tenant_id = $2"),
                &[&skill_id, &tenant_id],
            )
            .await?;
        row.map(|r| skill_from(&r)).map_or_else(not_found, Ok)
    }

    /// Create a tenant skill (owned by `editor`), or replace one (its owner or an admin
    /// only), audited; a name another skill has is `conflict`.
    pub async fn save_skill(
        &self,
        tenant_id: &str,
        p: &SkillSaveParams,
        editor: &Editor<'_>,
        op: Option<&Receipt>,
    ) -> Result<Skill> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let written = match &p.skill_id {
            None => tx
                .qo(
                    &format!(
                        "INSERT INTO skills (id, tenant_id, name, summary, body, owner) VALUES ($1, $2, $3, $4, $5, $6)
                         ON CONFLICT (tenant_id, name) DO NOTHING RETURNING {SKILL_COLUMNS}"
                    ),
                    &[
                        &token::new_id("skl"),
                        &tenant_id,
                        &p.name,
                        &p.summary,
                        &p.body,
                        &editor.actor,
                    ],
                )
                .await
                .map_err(StoreError::from),
            Some(id) => {
                if !lock_owned(&tx, "skills", tenant_id, id, editor).await? {
                    return not_found();
                }
                let r = tx
                    .qo(
                        &format!(
                            "UPDATE skills SET name = $3, summary = $4, body = $5, updated_at = now()
                              WHERE id = $1 AND tenant_id = $2 RETURNING {SKILL_COLUMNS}"
                        ),
                        &[id, &tenant_id, &p.name, &p.summary, &p.body],
                    )
                    .await;
                match r {
                    Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => Ok(None),
                    r => r.map_err(StoreError::from),
                }
            }
        }?;
        let Some(row) = written else {
            return Err(StoreError::Code(ErrorCode::Conflict));
        };
        let skill = skill_from(&row);
        audit(&tx, tenant_id, editor.actor, "skill.save", &skill.skill_id).await?;
        finish(&tx, op, &skill).await?;
        tx.commit().await?;
        Ok(skill)
    }

    /// Remove a tenant skill (idempotent; its owner or an admin only), audited.
    pub async fn remove_skill(
        &self,
        tenant_id: &str,
        skill_id: &str,
        editor: &Editor<'_>,
        op: Option<&Receipt>,
    ) -> Result<Removed> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let removed = lock_owned(&tx, "skills", tenant_id, skill_id, editor).await?;
        if removed {
            tx.ex(
                "DELETE FROM skills WHERE id = $1 AND tenant_id = $2",
                &[&skill_id, &tenant_id],
            )
            .await?;
            audit(&tx, tenant_id, editor.actor, "skill.remove", skill_id).await?;
        }
        let result = Removed { removed };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }

    /// The body of the tenant skill `name`, for a turn that runs on `connection_id`.
    pub async fn turn_skill(&self, connection_id: &str, tenant_id: &str, turn_id: &str, name: &str) -> Result<String> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        lock_running_turn(&tx, Some(connection_id), tenant_id, turn_id).await?;
        let row = tx
            .qo(
                "SELECT body FROM skills WHERE tenant_id = $1 AND name = $2",
                &[&tenant_id, &name],
            )
            .await?;
        tx.commit().await?;
        row.map(|r| r.get(0)).map_or_else(not_found, Ok)
    }
}
