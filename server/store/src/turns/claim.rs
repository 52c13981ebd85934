//! Dispatch to workers: claiming running turns for a worker connection, starting queued ones,
//! and what a turn handed out goes out with in `turn.run`.

use berth_protocol::{EventPayload, NewRow, Nothing, worker::TurnRun};
use deadpool_postgres::GenericClient;

use crate::{
    Cached, Param, Result, Store, attachments::turn_attachments, history::append_event, sessions::queue_changed,
    tenant_tx,
};

/// A turn handed to a worker connection, with the session's tenant.
#[derive(Debug, Clone)]
pub struct ClaimedTurn {
    pub tenant_id: String,
    /// The provider profile the turn was dispatched with (None: the default profile).
    pub provider: Option<String>,
    pub run: TurnRun,
}

impl Store {
    /// Hand out work to a worker connection serving `workspace_ids`: claim up to `limit`
    /// running turns not yet handed out, recording the model each is dispatched with (the
    /// session's, else `default_model`); start the next queued turn of every idle session
    /// there and claim those too, within the limit. Everything runs under the tenant's
    /// transactions; the worker reads each turn's conversation with `turn.history`.
    pub async fn claim_turns(
        &self,
        connection_id: &str,
        tenant_id: &str,
        workspace_ids: &[String],
        default_model: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ClaimedTurn>> {
        let mut client = self.pool.get().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // `BEGIN`, the tenant switch, the sessions whose queued turn may start, and the
        // claim of the running turns not yet handed out go out together: one wait.
        let candidate_params: [Param; 2] = [&tenant_id, &workspace_ids];
        let claim_params: [Param; 5] = [&connection_id, &tenant_id, &workspace_ids, &default_model, &limit];
        let tx = crate::Begun::new(&client);
        let mut results = crate::pipelined(
            tx.client(),
            Some((crate::TENANT_SQL, tenant_id)),
            &[
                (
                    "SELECT DISTINCT ON (t.session_id) t.session_id FROM turns t JOIN sessions s ON s.id = t.session_id
                      WHERE s.tenant_id = $1 AND s.workspace_id = ANY($2) AND t.state = 'queued' AND NOT s.paused AND s.removed_at IS NULL
                        AND NOT EXISTS (SELECT 1 FROM turns r WHERE r.session_id = t.session_id AND r.state = 'running')
                      ORDER BY t.session_id, t.queue_position",
                    &candidate_params,
                ),
                (CLAIM_SQL, &claim_params),
            ],
        )
        .await?;
        let claimed = results.pop().unwrap_or_default();
        let candidates = results.pop().unwrap_or_default();
        let c = tx.client();
        // The claimed turns' settings are read with the `COMMIT`: one wait.
        let mut turns = claimed_turns(c, tenant_id, claimed, Some(tx)).await?;
        // Usually none: a turn started by `session.send` is running already.
        if candidates.is_empty() {
            return Ok(turns);
        }
        match self
            .start_queued(
                &mut client,
                connection_id,
                tenant_id,
                workspace_ids,
                default_model,
                limit,
                &mut turns,
                candidates,
            )
            .await
        {
            Ok(()) => Ok(turns),
            // The turns claimed above are committed as handed to this connection: they must
            // go out. The queued ones are started and claimed by a later claim (the
            // claimer's next wake-up or safety tick).
            Err(e) if !turns.is_empty() => {
                tracing::warn!(error = %e, "starting queued turns failed; handing out the claimed ones");
                Ok(turns)
            }
            Err(e) => Err(e),
        }
    }

    /// The running turns recorded as handed to connection `connection_id` that are not
    /// among `held` (the turns the connection's replica holds for it), as a claim returns
    /// them: hand-outs whose `COMMIT` went through while the replica saw an error (its
    /// answer lost with the database connection), so that no `turn.run` went out. Read
    /// under the tenant's transaction, with the claim's reads.
    pub async fn unannounced_turns(
        &self,
        connection_id: &str,
        tenant_id: &str,
        held: &[String],
    ) -> Result<Vec<ClaimedTurn>> {
        let client = self.pool.get().await?;
        let tx = crate::Begun::new(&client);
        let params: [Param; 3] = [&connection_id, &tenant_id, &held];
        let mut rows = crate::pipelined(
            tx.client(),
            Some((crate::TENANT_SQL, tenant_id)),
            &[(UNANNOUNCED_SQL, &params)],
        )
        .await?;
        let rows = rows.pop().unwrap_or_default();
        claimed_turns(tx.client(), tenant_id, rows, Some(tx)).await
    }

    /// Start the next queued turn of each candidate session, then claim what was started,
    /// within what is left of `limit` after `turns`.
    #[allow(clippy::too_many_arguments)]
    async fn start_queued(
        &self,
        client: &mut deadpool_postgres::Object,
        connection_id: &str,
        tenant_id: &str,
        workspace_ids: &[String],
        default_model: Option<&str>,
        limit: i64,
        turns: &mut Vec<ClaimedTurn>,
        candidates: Vec<tokio_postgres::Row>,
    ) -> Result<()> {
        for c in candidates {
            let session_id: String = c.get(0);
            let tx = tenant_tx(client, tenant_id).await?;
            // Re-check under the session lock: another replica may have started one, or the
            // queue may have changed order.
            tx.q1("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", &[&session_id])
                .await?;
            let next = tx
                .qo(
                    "SELECT id, prompt FROM turns WHERE session_id = $1 AND state = 'queued'
                        AND NOT EXISTS (SELECT 1 FROM turns WHERE session_id = $1 AND state = 'running')
                        AND NOT (SELECT paused FROM sessions WHERE id = $1)
                      ORDER BY queue_position LIMIT 1",
                    &[&session_id],
                )
                .await?;
            if let Some(next) = next {
                start_turn(&tx, tenant_id, &session_id, next.get(0), next.get(1), true).await?;
            }
            tx.commit().await?;
        }
        let room = limit.saturating_sub(turns.len() as i64);
        if room > 0 {
            let tx = tenant_tx(client, tenant_id).await?;
            let claimed = tx
                .qa(
                    CLAIM_SQL,
                    &[&connection_id, &tenant_id, &workspace_ids, &default_model, &room],
                )
                .await?;
            let claimed = claimed_turns(&tx, tenant_id, claimed, None).await?;
            tx.commit().await?;
            turns.extend(claimed);
        }
        Ok(())
    }
}

/// Claim up to `$5` running turns not yet handed out in workspaces `$3` of tenant `$2` for
/// connection `$1`, recording the model each is dispatched with (the session's, else `$4`,
/// the default).
pub(super) const CLAIM_SQL: &str = concat!(
    // A fork never takes its agent's auto-approval (forks start narrowed).
    "UPDATE turns t SET (dispatched_to, model, provider, base_url) = ($1, ",
    dispatch_values!("$4"),
    ")
       FROM sessions s LEFT JOIN agents a ON a.id = s.agent_id
      WHERE s.id = t.session_id AND t.dispatched_to IS NULL AND t.state = 'running'
        AND t.id IN (SELECT u.id FROM turns u JOIN sessions v ON v.id = u.session_id
                      WHERE v.tenant_id = $2 AND v.workspace_id = ANY($3) AND v.removed_at IS NULL
                        AND u.state = 'running' AND u.dispatched_to IS NULL
                      ORDER BY u.started_at LIMIT $5 FOR UPDATE OF u SKIP LOCKED)
      RETURNING ",
    claimed_columns!()
);

/// The running turns handed to connection `$1` of tenant `$2` other than `$3`, as
/// [`CLAIM_SQL`] returns them.
const UNANNOUNCED_SQL: &str = concat!(
    "SELECT ",
    claimed_columns!(),
    " FROM turns t JOIN sessions s ON s.id = t.session_id LEFT JOIN agents a ON a.id = s.agent_id
     WHERE t.dispatched_to = $1 AND t.tenant_id = $2 AND t.state = 'running' AND t.id <> ALL($3)
       AND s.removed_at IS NULL"
);

/// The turns a [`CLAIM_SQL`] returned, with their attachments, the tenant's skills and MCP
/// servers (read together: one wait), and `commit` committed with those reads.
async fn claimed_turns(
    tx: &impl GenericClient,
    tenant_id: &str,
    claimed: Vec<tokio_postgres::Row>,
    commit: Option<crate::Begun<'_>>,
) -> Result<Vec<ClaimedTurn>> {
    if claimed.is_empty() {
        crate::commit_if(commit).await?;
        return Ok(Vec::new());
    }
    let turn_ids: Vec<String> = claimed.iter().map(|c| c.get(0)).collect();
    // A failing read fails the call, and the `COMMIT` then rolls the claim back.
    prepare_claim_reads(tx).await?;
    let commit = crate::commit_if(commit);
    let (reads, ()) = tokio::try_join!(biased; claim_reads(tx, tenant_id, &turn_ids), commit)?;
    Ok(claimed_from(tenant_id, &claimed, reads))
}

/// What every turn handed out is sent with besides its own settings.
pub(super) struct ClaimReads {
    attachments: std::collections::HashMap<String, Vec<crate::attachments::StoredAttachment>>,
    skills: Vec<berth_protocol::SkillInfo>,
    mcp_servers: Vec<berth_protocol::McpServerRun>,
}

/// Prepares [`claim_reads`]'s statements (cached after the first use on a connection), so
/// that they go out, and run, in order with what is sent beside them (a `COMMIT`).
pub(super) async fn prepare_claim_reads(tx: &impl GenericClient) -> Result<()> {
    tokio::try_join!(
        tx.prepare_cached(crate::attachments::TURN_ATTACHMENTS_SQL),
        tx.prepare_cached(crate::skills::TENANT_SKILLS_SQL),
        tx.prepare_cached(crate::mcp::ENABLED_SERVERS_SQL),
    )?;
    Ok(())
}

/// The attachments of `turn_ids`, the tenant's skills and MCP servers: three reads, all sent
/// on the first poll ([`prepare_claim_reads`] first).
pub(super) async fn claim_reads(tx: &impl GenericClient, tenant_id: &str, turn_ids: &[String]) -> Result<ClaimReads> {
    let (attachments, skills, mcp_servers) = tokio::try_join!(
        biased;
        turn_attachments(tx, tenant_id, turn_ids),
        crate::skills::tenant_skills(tx, tenant_id),
        crate::mcp::enabled_servers(tx, tenant_id),
    )?;
    Ok(ClaimReads {
        attachments,
        skills,
        mcp_servers,
    })
}

/// The turns of `rows` ([`claimed_columns`]) as they go out in `turn.run`: the settings
/// only, the worker reads the conversation with `turn.history`.
pub(super) fn claimed_from(tenant_id: &str, rows: &[tokio_postgres::Row], mut reads: ClaimReads) -> Vec<ClaimedTurn> {
    rows.iter()
        .map(|c| {
            let agent = turn_agent(c);
            // Only a turn with tools uses MCP servers (and gets their secrets), and only the
            // servers its agent could offer a tool of.
            let mcp_servers = match (c.get::<_, bool>(4), agent.as_ref().and_then(|a| a.tools.as_deref())) {
                (true, _) => Vec::new(),
                (false, Some(tools)) => reads
                    .mcp_servers
                    .iter()
                    .filter(|s| berth_protocol::mcp_server_offerable(&s.name, tools))
                    .cloned()
                    .collect(),
                (false, None) => reads.mcp_servers.clone(),
            };
            ClaimedTurn {
                tenant_id: tenant_id.to_string(),
                provider: c.get(8),
                run: TurnRun {
                    turn_id: c.get(0),
                    session_id: c.get(1),
                    workspace_id: c.get(2),
                    model: c.get(3),
                    no_tools: c.get(4),
                    auto_approve: c.get(5),
                    delegation_depth: c.get::<_, i32>(6).max(0) as u32,
                    coordinator: c.get(7),
                    skills: reads.skills.clone(),
                    mcp_servers,
                    agent,
                    // The API tier fills it from the turn's provider profile.
                    context_tokens: None,
                    channel: c.get(13),
                    // The API tier fills it from its configuration.
                    max_attachment_bytes: None,
                    attachments: reads
                        .attachments
                        .remove(&c.get::<_, String>(0))
                        .unwrap_or_default()
                        .into_iter()
                        .map(|a| a.meta)
                        .collect(),
                },
            }
        })
        .collect()
}

/// queued → running, publishing the prompt as the user row of `turn.started`; a turn that
/// waited in the queue (`from_queue`) also changes the queue that watchers draw.
async fn start_turn(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    turn_id: &str,
    prompt: &str,
    from_queue: bool,
) -> Result<i64> {
    tx.ex(
        "UPDATE turns SET state = 'running', started_at = now() WHERE id = $1",
        &[&turn_id],
    )
    .await?;
    let row = NewRow::user(prompt);
    let started = EventPayload::TurnStarted(Nothing {});
    let seq = append_event(tx, tenant_id, session_id, Some(turn_id), &started, &[row]).await?;
    crate::attachments::name_in_prompt_row(tx, tenant_id, session_id, turn_id, seq).await?;
    if from_queue {
        queue_changed(tx, tenant_id, session_id).await?;
    }
    Ok(seq)
}

/// What a claimed turn takes from its session's agent (columns 9..=12 of the claim).
fn turn_agent(c: &tokio_postgres::Row) -> Option<berth_protocol::TurnAgent> {
    let agent_id: String = c.get::<_, Option<String>>(9)?;
    let tools: Option<serde_json::Value> = c.get(11);
    let params: Option<serde_json::Value> = c.get(12);
    Some(berth_protocol::TurnAgent {
        agent_id,
        system_prompt: c.get(10),
        tools: tools.and_then(|t| serde_json::from_value(t).ok()),
        params: params.and_then(|p| serde_json::from_value(p).ok()),
    })
}
