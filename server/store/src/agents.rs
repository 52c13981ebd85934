//! Agent definitions (SPEC §4.16): a tenant's shared agents, and switching a session's.

use berth_protocol::{
    Agent, AgentChanged, AgentSaveParams, ApprovalPolicy, ErrorCode, EventPayload, ModelParams, Removed,
    SessionSnapshot,
};
use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;

use crate::{
    Cached, Result, Store, StoreError,
    admin::{Editor, audit, lock_owned},
    fmt_time,
    history::append_event,
    not_found,
    receipts::{Receipt, finish},
    sessions::{lock_session, snapshot},
    tenant_tx, token,
};

const AGENT_COLUMNS: &str =
    "id, name, description, system_prompt, tools, provider, model, params, approval, created_at, updated_at";

fn agent_from(r: &tokio_postgres::Row) -> Result<Agent> {
    let json = |e: serde_json::Error| StoreError::Other(e.into());
    let tools: Option<serde_json::Value> = r.get(4);
    let params: Option<serde_json::Value> = r.get(7);
    Ok(Agent {
        agent_id: r.get(0),
        name: r.get(1),
        description: r.get(2),
        system_prompt: r.get(3),
        tools: tools.map(serde_json::from_value).transpose().map_err(json)?,
        provider: r.get(5),
        model: r.get(6),
        params: params
            .map(serde_json::from_value::<ModelParams>)
            .transpose()
            .map_err(json)?,
        approval: ApprovalPolicy::parse(r.get(8)).unwrap_or_default(),
        created_at: fmt_time(r.get(9)),
        updated_at: fmt_time(r.get(10)),
    })
}

/// The name of the tenant's agent `agent_id` (not-found when there is none).
pub(crate) async fn agent_name(tx: &impl GenericClient, tenant_id: &str, agent_id: &str) -> Result<String> {
    match tx
        .qo(
            "SELECT name FROM agents WHERE id = $1 AND tenant_id = $2",
            &[&agent_id, &tenant_id],
        )
        .await?
    {
        Some(r) => Ok(r.get(0)),
        None => not_found(),
    }
}

impl Store {
    /// The tenant's agents, by name.
    pub async fn list_agents(&self, tenant_id: &str) -> Result<Vec<Agent>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let rows = tx
            .qa(
                &format!("SELECT {AGENT_COLUMNS} FROM agents WHERE tenant_id = $1 ORDER BY name, id"),
                &[&tenant_id],
            )
            .await?;
        rows.iter().map(agent_from).collect()
    }

    pub async fn get_agent(&self, tenant_id: &str, agent_id: &str) -> Result<Agent> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let row = tx
            .qo(
                &format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = $1 AND tenant_id = $2"),
                &[&agent_id, &tenant_id],
            )
            .await?;
        match row {
            Some(r) => agent_from(&r),
            None => not_found(),
        }
    }

    /// Create an agent (owned by `editor`), or replace one's definition whole (its owner or
    /// an admin only), audited. A name another agent of the tenant has is `conflict`.
    pub async fn save_agent(
        &self,
        tenant_id: &str,
        p: &AgentSaveParams,
        editor: &Editor<'_>,
        op: Option<&Receipt>,
    ) -> Result<Agent> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let tools = p.tools.as_ref().map(|t| serde_json::json!(t));
        let params = p
            .params
            .as_ref()
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| StoreError::Other(e.into()))?;
        let approval = p.approval.unwrap_or_default().as_str();
        let written = match &p.agent_id {
            None => {
                // A new agent within the tenant's bound (`payload-too-large`; the count is
                // read in the creating transaction, so two at the edge may both pass).
                let count: i64 = tx
                    .q1("SELECT count(*) FROM agents WHERE tenant_id = $1", &[&tenant_id])
                    .await?
                    .get(0);
                if count >= berth_protocol::MAX_AGENTS_PER_TENANT as i64 {
                    return Err(StoreError::Code(ErrorCode::PayloadTooLarge));
                }
                tx.qo(
                    &format!(
                        "INSERT INTO agents (id, tenant_id, name, description, system_prompt, tools, provider, model, params, approval, owner)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                         ON CONFLICT (tenant_id, name) DO NOTHING RETURNING {AGENT_COLUMNS}"
                    ),
                    &[
                        &token::new_id("agt"),
                        &tenant_id,
                        &p.name,
                        &p.description,
                        &p.system_prompt,
                        &tools,
                        &p.provider,
                        &p.model,
                        &params,
                        &approval,
                        &editor.actor,
                    ],
                )
                .await?
            }
            Some(id) => {
                if !lock_owned(&tx, "agents", tenant_id, id, editor).await? {
                    return not_found();
                }
                let taken = tx
                    .qo(
                        "SELECT 1 FROM agents WHERE tenant_id = $1 AND name = $2 AND id <> $3",
                        &[&tenant_id, &p.name, id],
                    )
                    .await?;
                if taken.is_some() {
                    None
                } else {
                    let r = tx
                        .qo(
                            &format!(
                                "UPDATE agents SET name = $3, description = $4, system_prompt = $5, tools = $6,
                                        provider = $7, model = $8, params = $9, approval = $10, updated_at = now()
                                  WHERE id = $1 AND tenant_id = $2 RETURNING {AGENT_COLUMNS}"
                            ),
                            &[
                                id,
                                &tenant_id,
                                &p.name,
                                &p.description,
                                &p.system_prompt,
                                &tools,
                                &p.provider,
                                &p.model,
                                &params,
                                &approval,
                            ],
                        )
                        .await;
                    match r {
                        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => None,
                        r => r?,
                    }
                }
            }
        };
        let Some(row) = written else {
            return Err(StoreError::Code(ErrorCode::Conflict));
        };
        let agent = agent_from(&row)?;
        audit(&tx, tenant_id, editor.actor, "agent.save", &agent.agent_id).await?;
        finish(&tx, op, &agent).await?;
        tx.commit().await?;
        Ok(agent)
    }

    /// Remove an agent (idempotent; its owner or an admin only), audited; sessions that used
    /// it go on without one.
    pub async fn remove_agent(
        &self,
        tenant_id: &str,
        agent_id: &str,
        editor: &Editor<'_>,
        op: Option<&Receipt>,
    ) -> Result<Removed> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let removed = lock_owned(&tx, "agents", tenant_id, agent_id, editor).await?;
        if removed {
            tx.ex(
                "DELETE FROM agents WHERE id = $1 AND tenant_id = $2",
                &[&agent_id, &tenant_id],
            )
            .await?;
            audit(&tx, tenant_id, editor.actor, "agent.remove", agent_id).await?;
        }
        let result = Removed { removed };
        finish(&tx, op, &result).await?;
        tx.commit().await?;
        Ok(result)
    }

    /// Switch a live session's agent (None: none). History is kept; the change is recorded
    /// once, as `session.agentChanged`, and later turns take the new definition.
    pub async fn set_agent(
        &self,
        tenant_id: &str,
        session_id: &str,
        agent_id: Option<&str>,
        default_model: Option<&str>,
        op: Option<&Receipt>,
    ) -> Result<SessionSnapshot> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        lock_session(&tx, tenant_id, session_id).await?;
        let name = match agent_id {
            Some(id) => Some(agent_name(&tx, tenant_id, id).await?),
            None => None,
        };
        tx.ex(
            "UPDATE sessions SET agent_id = $2 WHERE id = $1",
            &[&session_id, &agent_id],
        )
        .await?;
        let event = EventPayload::SessionAgentChanged(AgentChanged {
            agent_id: agent_id.map(Into::into),
            name,
        });
        append_event(&tx, tenant_id, session_id, None, &event, &[]).await?;
        let snap = snapshot(&tx, tenant_id, session_id, default_model).await?;
        finish(&tx, op, &snap).await?;
        tx.commit().await?;
        Ok(snap)
    }
}
