//! Coordinator sessions (SPEC §4.15): a coordinator's running turn starts child sessions in
//! any of the tenant's workspaces, sends to them, reads how their turns ended and stops
//! them. Children are ordinary sessions naming the coordinator in `parent_id` and the turn
//! that started them in `parent_turn_id`; a turn sent to an existing child names the
//! coordinator's turn in `turns.parent_turn_id`. Either way, stopping the coordinator's turn
//! stops it ([`crate::delegate::cancel_children`]).
//!
//! Locks follow the order every other path uses: the coordinator's session, then the
//! child's. A child's turn end is appended to the coordinator's history (`child.turnEnded`)
//! in the transaction that ends it, so paths that end a child's turn lock the coordinator
//! first ([`lock_coordinator_of`]).

use berth_protocol::{
    Cause, ChildTurnEnded, ErrorCode, EventPayload, SessionCreated, TurnState, Workspace,
    worker::{ChildTurn, ChildWaitResult},
};
use deadpool_postgres::GenericClient;

use crate::{
    Cached, Result, Store, StoreError,
    history::append_event,
    not_found,
    sessions::lock_session,
    tenant_tx, token,
    turns::{KeepText, admit, cancel_turn, lock_running_turn},
    workspaces::online_sql,
};

/// The coordinator session of a running turn handed to `connection_id`, locked; a turn of
/// an ordinary session is `forbidden`.
async fn lock_coordinator_turn(
    tx: &impl GenericClient,
    connection_id: &str,
    tenant_id: &str,
    turn_id: &str,
) -> Result<String> {
    let session_id = lock_running_turn(tx, Some(connection_id), tenant_id, turn_id).await?;
    let kind: Option<String> = tx
        .q1("SELECT kind FROM sessions WHERE id = $1", &[&session_id])
        .await?
        .get(0);
    if kind.as_deref() != Some("coordinator") {
        return Err(StoreError::Code(ErrorCode::Forbidden));
    }
    Ok(session_id)
}

/// Lock the live coordinator `session_id` is a child of (if any), before the child is
/// locked: the order of every path that locks both.
pub(crate) async fn lock_coordinator_of(tx: &impl GenericClient, tenant_id: &str, session_id: &str) -> Result<()> {
    let parent = tx
        .qo(
            "SELECT p.id FROM sessions c JOIN sessions p ON p.id = c.parent_id
              WHERE c.id = $1 AND c.tenant_id = $2 AND p.kind = 'coordinator' AND p.removed_at IS NULL",
            &[&session_id, &tenant_id],
        )
        .await?;
    if let Some(p) = parent {
        tx.ex(
            "SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE",
            &[&p.get::<_, String>(0)],
        )
        .await?;
    }
    Ok(())
}

/// Lock the live coordinator the session of turn `$1` (tenant `$2`) is a child of, if any:
/// found and locked in one statement, since every turn's end passes here. Each row by
/// primary key, the turn's, its session's, then the parent's: joined flat, a generic plan
/// made while the tables were small (a connection keeps its plan until the statistics
/// change) looked for coordinators among all of the tenant's live sessions (`sessions_list`)
/// on every end. `(…) IS TRUE` matches no partial index on live sessions.
pub(crate) const LOCK_COORDINATOR_OF_TURN: &str = "SELECT p.id FROM sessions p
  WHERE p.id = (SELECT c.parent_id FROM sessions c
                 WHERE c.id = (SELECT session_id FROM turns WHERE id = $1 AND tenant_id = $2) AND c.tenant_id = $2)
    AND p.kind = 'coordinator' AND (p.removed_at IS NULL) IS TRUE
    FOR UPDATE";

/// A child's turn ended: tell its coordinator's history (nothing for other sessions).
pub(crate) async fn child_ended(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    turn_id: &str,
    state: TurnState,
    cause: Option<&Cause>,
) -> Result<()> {
    let parent = tx
        .qo(
            "SELECT p.id FROM sessions c JOIN sessions p ON p.id = c.parent_id
              WHERE c.id = $1 AND c.tenant_id = $2 AND p.kind = 'coordinator' AND p.removed_at IS NULL",
            &[&session_id, &tenant_id],
        )
        .await?;
    let Some(parent) = parent else { return Ok(()) };
    let ended = EventPayload::ChildTurnEnded(ChildTurnEnded {
        session_id: session_id.to_string(),
        child_turn_id: turn_id.to_string(),
        state,
        cause: cause.cloned(),
    });
    append_event(tx, tenant_id, &parent.get::<_, String>(0), None, &ended, &[]).await?;
    Ok(())
}

/// A child of the coordinator `coordinator` (live), or `not-found`.
async fn check_child(tx: &impl GenericClient, tenant_id: &str, coordinator: &str, child: &str) -> Result<()> {
    let row = tx
        .qo(
            "SELECT 1 FROM sessions WHERE id = $1 AND tenant_id = $2 AND parent_id = $3 AND removed_at IS NULL",
            &[&child, &tenant_id, &coordinator],
        )
        .await?;
    if row.is_none() {
        return not_found();
    }
    Ok(())
}

async fn workspace_online(tx: &impl GenericClient, workspace_id: &str) -> Result<bool> {
    Ok(tx
        .q1(&format!("SELECT {}", online_sql("$1::text")), &[&workspace_id])
        .await?
        .get(0))
}

async fn child_turn(
    tx: &impl GenericClient,
    child: &str,
    sent: berth_protocol::SessionSendResult,
) -> Result<ChildTurn> {
    let workspace: String = tx
        .q1("SELECT workspace_id FROM sessions WHERE id = $1", &[&child])
        .await?
        .get(0);
    Ok(ChildTurn {
        session_id: child.to_string(),
        turn_id: sent.turn_id,
        state: sent.state,
        online: workspace_online(tx, &workspace).await?,
    })
}

/// What starting a child needs besides the coordinator's turn.
pub struct NewChild<'a> {
    pub call_id: &'a str,
    pub workspace_id: &'a str,
    pub prompt: &'a str,
    pub title: Option<&'a str>,
    /// An agent definition of the tenant (id or name) the child runs as.
    pub agent: Option<&'a str>,
    /// Children one turn may start.
    pub max_children: u32,
}

impl Store {
    /// The tenant's workspaces, for a coordinator's running turn.
    pub async fn coordinator_workspaces(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
    ) -> Result<Vec<Workspace>> {
        {
            let mut client = self.pool.get().await?;
            let tx = tenant_tx(&mut client, tenant_id).await?;
            lock_coordinator_turn(&tx, connection_id, tenant_id, turn_id).await?;
        }
        self.list_workspaces(tenant_id).await
    }

    /// Start the child of the coordinator turn's call `call_id` (or find the one already
    /// started for it) in `workspace_id`, and its first turn. The child inherits the
    /// coordinator's model choice and approval policy, with one level less of depth.
    pub async fn child_start(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        new: &NewChild<'_>,
    ) -> Result<ChildTurn> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let coordinator = lock_coordinator_turn(&tx, connection_id, tenant_id, turn_id).await?;
        let existing = tx
            .qo(
                "SELECT s.id, (SELECT t.id FROM turns t WHERE t.session_id = s.id ORDER BY t.queue_position LIMIT 1),
                        (SELECT t.state FROM turns t WHERE t.session_id = s.id ORDER BY t.queue_position LIMIT 1),
                        s.workspace_id = $4 AND (SELECT t.prompt FROM turns t WHERE t.session_id = s.id
                                                  ORDER BY t.queue_position LIMIT 1) IS NOT DISTINCT FROM $5
                   FROM sessions s WHERE s.tenant_id = $1 AND s.parent_turn_id = $2 AND s.parent_call_id = $3",
                &[&tenant_id, &turn_id, &new.call_id, &new.workspace_id, &new.prompt],
            )
            .await?;
        // The same call asked again (a retry) finds its child; another call under its id (a
        // model repeating an earlier step's call id) is refused, never answered with it.
        if existing
            .as_ref()
            .is_some_and(|r| r.get::<_, Option<String>>(1).is_some() && !r.get::<_, bool>(3))
        {
            return Err(StoreError::Code(ErrorCode::Conflict));
        }
        if let Some(r) = existing
            && let (Some(first), Some(state)) = (r.get::<_, Option<String>>(1), r.get::<_, Option<String>>(2))
        {
            let child: String = r.get(0);
            let sent = berth_protocol::SessionSendResult {
                turn_id: first,
                state: TurnState::parse(&state).unwrap_or(TurnState::Queued),
                queue_id: None,
                queue_revision: None,
                revision: None,
            };
            let answer = child_turn(&tx, &child, sent).await?;
            tx.commit().await?;
            return Ok(answer);
        }
        let s = tx
            .q1(
                concat!(
                    "SELECT s.model, s.provider, s.base_url, s.auto_approve, s.delegation_depth,
                            (SELECT count(*) FROM sessions c WHERE c.tenant_id = $2 AND c.parent_turn_id = $3), ",
                    effective_auto_approve!(),
                    ", ",
                    child_auto_approve_within!(),
                    " FROM sessions s LEFT JOIN agents a ON a.id = s.agent_id WHERE s.id = $1"
                ),
                &[&coordinator, &tenant_id, &turn_id],
            )
            .await?;
        let depth: i32 = s.get(4);
        if depth <= 0 {
            return Err(StoreError::Code(ErrorCode::DepthExceeded));
        }
        if s.get::<_, i64>(5) >= i64::from(new.max_children) {
            return Err(StoreError::Code(ErrorCode::ChildLimit));
        }
        let workspace = tx
            .qo(
                "SELECT 1 FROM workspaces WHERE id = $1 AND tenant_id = $2",
                &[&new.workspace_id, &tenant_id],
            )
            .await?;
        if workspace.is_none() {
            return not_found();
        }
        // A child with an agent runs as that agent: its model (else the tenant default),
        // not the coordinator's own choice.
        let agent: Option<String> = match new.agent {
            Some(name) => match tx
                .qo(
                    "SELECT id FROM agents WHERE tenant_id = $1 AND (id = $2 OR name = $2)",
                    &[&tenant_id, &name],
                )
                .await?
            {
                Some(r) => Some(r.get(0)),
                None => return not_found(),
            },
            None => None,
        };
        let inherited = |i: usize| agent.is_none().then(|| s.get::<_, Option<String>>(i)).flatten();
        let child = token::new_id("ses");
        tx.ex(
            "INSERT INTO sessions (id, tenant_id, workspace_id, title, model, provider, base_url, auto_approve,
                                   parent_id, parent_turn_id, parent_call_id, delegation_depth, agent_id,
                                   may_auto_approve, auto_approve_within)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
            &[
                &child,
                &tenant_id,
                &new.workspace_id,
                &new.title.unwrap_or_default(),
                &inherited(0),
                &inherited(1),
                &inherited(2),
                // The coordinator's own `autoApprove` only where it took effect (see
                // `delegate`): a coordinator that asks starts children that ask.
                &(s.get::<_, bool>(3) && s.get::<_, bool>(6)),
                &coordinator,
                &turn_id,
                &new.call_id,
                &(depth - 1),
                &agent,
                // The child's agent may not approve more than the coordinator does, nor
                // auto-run tools beyond the coordinator's agent's.
                &s.get::<_, bool>(6),
                &s.get::<_, Option<serde_json::Value>>(7),
            ],
        )
        .await?;
        let created = EventPayload::SessionCreated(SessionCreated {
            workspace_id: new.workspace_id.to_string(),
            parent: Some(coordinator),
        });
        append_event(&tx, tenant_id, &child, None, &created, &[]).await?;
        let sent = admit(&tx, tenant_id, &child, new.prompt, &[], Some(turn_id)).await?;
        let answer = child_turn(&tx, &child, sent).await?;
        tx.commit().await?;
        Ok(answer)
    }

    /// Send `prompt` to a child of the coordinator whose turn `turn_id` runs.
    pub async fn child_send(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        child: &str,
        prompt: &str,
    ) -> Result<ChildTurn> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let coordinator = lock_coordinator_turn(&tx, connection_id, tenant_id, turn_id).await?;
        check_child(&tx, tenant_id, &coordinator, child).await?;
        let sent = admit(&tx, tenant_id, child, prompt, &[], Some(turn_id)).await?;
        let answer = child_turn(&tx, child, sent).await?;
        tx.commit().await?;
        Ok(answer)
    }

    /// Stop a child's running and queued turns; returns their ids.
    pub async fn child_stop(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        child: &str,
    ) -> Result<Vec<String>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let coordinator = lock_coordinator_turn(&tx, connection_id, tenant_id, turn_id).await?;
        check_child(&tx, tenant_id, &coordinator, child).await?;
        lock_session(&tx, tenant_id, child).await?;
        let active = tx
            .qa(
                "SELECT id FROM turns WHERE session_id = $1 AND state IN ('running', 'queued') ORDER BY queue_position",
                &[&child],
            )
            .await?;
        let mut stopped = Vec::new();
        for t in active {
            let id: String = t.get(0);
            cancel_turn(&tx, tenant_id, child, id.clone(), true, KeepText::Stored).await?;
            stopped.push(id);
        }
        tx.commit().await?;
        Ok(stopped)
    }

    /// How a child's turn (default: its latest) stands, for a coordinator's turn `turn_id`
    /// waiting on it: state, cause, final answer once settled, and whether the child's
    /// workspace has a worker online. Also whether the coordinator's turn still runs.
    pub async fn child_wait_state(
        &self,
        tenant_id: &str,
        turn_id: &str,
        child: &str,
        child_turn: Option<&str>,
    ) -> Result<(ChildWaitResult, bool)> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let row = tx
            .qo(
                &format!(
                    "SELECT t.id, t.state, t.cause, {},
                            (SELECT r.body FROM rows r WHERE r.session_id = s.id AND r.turn_id = t.id AND r.kind = 'assistant'
                              ORDER BY r.source_sequence DESC, r.item_index DESC LIMIT 1),
                            c.state = 'running'
                       FROM turns c
                       JOIN sessions s ON s.parent_id = c.session_id
                       JOIN turns t ON t.session_id = s.id
                      WHERE c.id = $1 AND c.tenant_id = $2 AND s.id = $3 AND s.removed_at IS NULL
                        AND ($4::text IS NULL OR t.id = $4)
                      ORDER BY t.queue_position DESC LIMIT 1",
                    online_sql("s.workspace_id")
                ),
                &[&turn_id, &tenant_id, &child, &child_turn],
            )
            .await?;
        tx.commit().await?;
        let Some(r) = row else { return not_found() };
        let state = TurnState::parse(r.get(1)).unwrap_or(TurnState::Interrupted);
        let cause: Option<serde_json::Value> = r.get(2);
        let result = ChildWaitResult {
            session_id: child.to_string(),
            turn_id: r.get(0),
            state,
            cause: cause.and_then(|c| serde_json::from_value(c).ok()),
            answer: if state.is_settled() { r.get(4) } else { None },
            online: r.get(3),
            timed_out: false,
        };
        Ok((result, r.get(5)))
    }
}
