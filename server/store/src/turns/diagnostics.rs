//! Notices and diagnostics: a running turn's `turn.notice`, session notices, and a session's
//! diagnostics with their revision.

use berth_protocol::{
    Cause, CauseCode, Diagnostic, DiagnosticKind, ErrorCode, EventPayload, Notice, NoticeCode, NoticeLevel,
    SessionDiagnosticsResult,
};
use deadpool_postgres::GenericClient;

use super::end::lock_running_turn;
use crate::{Cached, Result, Store, StoreError, fmt_time, history::append_event, tenant_tx, token};

impl Store {
    /// A running turn goes on without something (`turn.notice`): a `session.notice`
    /// `{level: "warning", code, params}` and a `tool` diagnostic with cause `code`, in one
    /// transaction. Only the connection running the turn may write it. Returns the sequence.
    pub async fn turn_notice(
        &self,
        connection_id: &str,
        tenant_id: &str,
        turn_id: &str,
        code: NoticeCode,
        params: serde_json::Value,
    ) -> Result<i64> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let session_id = lock_running_turn(&tx, Some(connection_id), tenant_id, turn_id).await?;
        let event = EventPayload::SessionNotice(Notice {
            level: NoticeLevel::Warning.as_str().into(),
            code: code.as_str().into(),
            params,
        });
        let seq = append_event(&tx, tenant_id, &session_id, Some(turn_id), &event, &[]).await?;
        let cause = Cause {
            code: code.as_str().into(),
            status: None,
        };
        diagnostic(
            &tx,
            tenant_id,
            &session_id,
            DiagnosticKind::Tool,
            Some(turn_id),
            Some(seq),
            &cause,
        )
        .await?;
        tx.commit().await?;
        Ok(seq)
    }

    /// Record a failure that belongs to no turn (a `title` diagnostic).
    pub async fn session_diagnostic(
        &self,
        tenant_id: &str,
        session_id: &str,
        kind: DiagnosticKind,
        cause: &Cause,
    ) -> Result<()> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        diagnostic(&tx, tenant_id, session_id, kind, None, None, cause).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The session's diagnostic revision (not-found for another tenant's or a removed session).
    pub async fn diagnostic_revision(&self, tenant_id: &str, session_id: &str) -> Result<i64> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let row = tx
            .qo(
                "SELECT diagnostic_revision FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL",
                &[&session_id, &tenant_id],
            )
            .await?;
        tx.commit().await?;
        row.map(|r| r.get(0)).ok_or(StoreError::Code(ErrorCode::NotFound))
    }

    /// Diagnostics newest first, under a fixed revision fence.
    pub async fn diagnostics(
        &self,
        tenant_id: &str,
        session_id: &str,
        through: Option<i64>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<SessionDiagnosticsResult> {
        let mut client = self.pool.get().await?;
        let client = tenant_tx(&mut client, tenant_id).await?;
        let current: i64 = client
            .qo(
                "SELECT diagnostic_revision FROM sessions WHERE id = $1 AND tenant_id = $2 AND removed_at IS NULL",
                &[&session_id, &tenant_id],
            )
            .await?
            .map(|r| r.get(0))
            .ok_or(StoreError::Code(ErrorCode::NotFound))?;
        let through = through.unwrap_or(current).min(current);
        let before = before.unwrap_or(i64::MAX);
        let limit = i64::from(limit.clamp(1, 200));
        let rows = client
            .qa(
                "SELECT id, revision, kind, turn_id, sequence, cause, at FROM diagnostics
                  WHERE session_id = $1 AND tenant_id = $2 AND revision <= $3 AND revision < $4
                  ORDER BY revision DESC LIMIT $5",
                &[&session_id, &tenant_id, &through, &before, &(limit + 1)],
            )
            .await?;
        let more = rows.len() as i64 > limit;
        let diagnostics: Vec<Diagnostic> = rows
            .iter()
            .take(limit as usize)
            .map(|r| Diagnostic {
                diagnostic_id: r.get(0),
                diagnostic_revision: r.get(1),
                kind: r.get(2),
                turn_id: r.get(3),
                sequence: r.get(4),
                cause: serde_json::from_value(r.get(5)).unwrap_or(Cause {
                    code: CauseCode::Internal.as_str().into(),
                    status: None,
                }),
                at: fmt_time(r.get(6)),
            })
            .collect();
        let next_before = if more {
            diagnostics.last().map(|d| d.diagnostic_revision)
        } else {
            None
        };
        Ok(SessionDiagnosticsResult {
            through_revision: through,
            diagnostics,
            next_before,
        })
    }
}

/// A session-level notice event `{level, code, params}`.
pub(crate) async fn notice(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    level: NoticeLevel,
    code: NoticeCode,
    params: serde_json::Value,
) -> Result<i64> {
    let notice = EventPayload::SessionNotice(Notice {
        level: level.as_str().into(),
        code: code.as_str().into(),
        params,
    });
    append_event(tx, tenant_id, session_id, None, &notice, &[]).await
}

pub(super) async fn diagnostic(
    tx: &impl GenericClient,
    tenant_id: &str,
    session_id: &str,
    kind: DiagnosticKind,
    turn_id: Option<&str>,
    sequence: Option<i64>,
    cause: &Cause,
) -> Result<()> {
    let revision: i64 = tx
        .q1(
            "UPDATE sessions SET diagnostic_revision = diagnostic_revision + 1 WHERE id = $1 RETURNING diagnostic_revision",
            &[&session_id],
        )
        .await?
        .get(0);
    tx.ex(
        "INSERT INTO diagnostics (id, tenant_id, session_id, revision, kind, turn_id, sequence, cause)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &token::new_id("dia"),
            &tenant_id,
            &session_id,
            &revision,
            &kind.as_str(),
            &turn_id,
            &sequence,
            &serde_json::to_value(cause).unwrap_or_default(),
        ],
    )
    .await?;
    Ok(())
}
