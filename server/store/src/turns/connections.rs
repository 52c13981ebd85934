//! Worker connections that end, are given up or hand their turns over, and the sweep that
//! interrupts the turns of connections that died.

use berth_protocol::{Cause, CauseCode, ErrorCode, TurnState};

use crate::{Cached, Principal, Result, Store, StoreError, workspaces::PRESENCE_TTL};

impl Store {
    /// The worker connection is gone: its presence row is deleted and its running turns end
    /// `interrupted` (never retried). A turn that cannot be settled now is left to the sweep,
    /// which interrupts every running turn whose connection has no live presence.
    ///
    /// The delete and the read of the turns stay two statements (each autocommit): an
    /// admission handing a turn to this connection holds its presence row (`FOR KEY
    /// SHARE`), so the delete waits for that admission's commit, and the read's snapshot,
    /// taken after the delete, then holds the turn. One statement or one snapshot for both
    /// would miss it (the same holds for the sweep and [`Store::abandon_connection`]).
    pub async fn interrupt_connection(&self, connection_id: &str) -> Result<Vec<String>> {
        let client = self.pool.get().await?;
        client
            .ex(
                "DELETE FROM worker_presence WHERE connection_id = $1",
                &[&connection_id],
            )
            .await?;
        let rows = client
            .qa(
                "SELECT id, tenant_id FROM turns WHERE dispatched_to = $1 AND state = 'running'",
                &[&connection_id],
            )
            .await?;
        drop(client);
        Ok(self.interrupt(rows).await)
    }

    /// A worker reconnected and says it gave up its connection `old`: forget that
    /// connection and interrupt its running turns now. Only a connection of the same
    /// credential is touched; one whose presence is already gone is left to the sweep.
    pub async fn abandon_connection(&self, principal: &Principal, old: &str) -> Result<Vec<String>> {
        let client = self.pool.get().await?;
        let forgotten = client
            .ex(
                "DELETE FROM worker_presence WHERE connection_id = $1 AND credential_id = $2",
                &[&old, &principal.credential_id],
            )
            .await?;
        if forgotten == 0 {
            return Ok(Vec::new());
        }
        let rows = client
            .qa(
                "SELECT id, tenant_id FROM turns WHERE dispatched_to = $1 AND tenant_id = $2 AND state = 'running'",
                &[&old, &principal.tenant_id],
            )
            .await?;
        drop(client);
        Ok(self.interrupt(rows).await)
    }

    /// A worker hands its running turns over from its connection `from` (on a draining
    /// replica, which released them) to its connection `to`: the turns among `turns` still
    /// running and handed to `from` are handed to `to`; returns them with their sessions.
    /// Both connections must be live and the credential's. The old presence row is held
    /// (`FOR KEY SHARE`) until `COMMIT`, so that its connection's cleanup — delete the
    /// presence, then interrupt the turns still handed to it — waits for this and then no
    /// longer sees the turns carried; once it has deleted the row, nothing is carried.
    pub async fn carry_turns(
        &self,
        principal: &Principal,
        from: &str,
        to: &str,
        turns: &[String],
    ) -> Result<Vec<(String, String)>> {
        if turns.is_empty() || from == to {
            return Ok(Vec::new());
        }
        let mut client = self.pool.get().await?;
        let tx = crate::tenant_tx(&mut client, &principal.tenant_id).await?;
        let live = tx
            .qa(
                "SELECT connection_id FROM worker_presence
                 WHERE connection_id IN ($1, $2) AND credential_id = $3 AND tenant_id = $4 FOR KEY SHARE",
                &[&from, &to, &principal.credential_id, &principal.tenant_id],
            )
            .await?;
        if live.len() != 2 {
            return Ok(Vec::new());
        }
        let rows = tx
            .qa(
                "UPDATE turns SET dispatched_to = $1
                 WHERE id = ANY($2) AND dispatched_to = $3 AND tenant_id = $4 AND state = 'running'
                 RETURNING id, session_id",
                &[&to, &turns, &from, &principal.tenant_id],
            )
            .await?;
        tx.commit().await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Forget worker connections whose replica stopped heartbeating (it died), then
    /// interrupt every running turn handed to a connection with no live presence row —
    /// whatever left it so (a crash or an error between deleting the presence and
    /// interrupting). Any replica may run this; it is idempotent.
    pub async fn sweep_stale_presence(&self) -> Result<Vec<String>> {
        let client = self.pool.get().await?;
        client
            .ex(
                &format!("DELETE FROM worker_presence WHERE heartbeat_at < now() - interval '{PRESENCE_TTL}'"),
                &[],
            )
            .await?;
        let orphans = client
            .qa(
                "SELECT t.id, t.tenant_id FROM turns t
                  WHERE t.state = 'running' AND t.dispatched_to IS NOT NULL
                    AND NOT EXISTS (SELECT 1 FROM worker_presence p WHERE p.connection_id = t.dispatched_to)",
                &[],
            )
            .await?;
        drop(client);
        Ok(self.interrupt(orphans).await)
    }

    /// End these `(turn, tenant)` rows `interrupted`, each in its own transaction; one that
    /// fails is logged and left for the next sweep, and the others still end.
    async fn interrupt(&self, rows: Vec<tokio_postgres::Row>) -> Vec<String> {
        let cause = Cause {
            code: CauseCode::WorkerLost.as_str().into(),
            status: None,
        };
        let mut ended = Vec::new();
        for r in rows {
            let (turn, tenant): (String, String) = (r.get(0), r.get(1));
            match self
                .end_turn(None, &tenant, &turn, TurnState::Interrupted, Some(&cause))
                .await
            {
                Ok(_) => ended.push(turn),
                Err(StoreError::Code(ErrorCode::TurnNotRunning)) => {}
                Err(e) => {
                    tracing::warn!(turn.id = %turn, error = %e, "interrupting a lost worker's turn failed; the sweep retries")
                }
            }
        }
        ended
    }
}
