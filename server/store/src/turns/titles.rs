//! A session's automatic title: its one attempt claimed, and the title set unless a human
//! named the session first.

use berth_protocol::{EventPayload, TitleChanged};

use crate::{Cached, Result, Store, history::append_event, tenant_tx};

/// What an automatic title is made from.
#[derive(Debug, Clone)]
pub struct TitleSource {
    pub provider: Option<String>,
    pub model: Option<String>,
    pub base_url: Option<String>,
    pub prompt: String,
    pub answer: String,
}

impl Store {
    /// Claim the session's one automatic title attempt: only while its title is empty and
    /// no attempt was made. Returns what to name it from (the first prompt and answer,
    /// cut to `max` bytes each) and the session's provider choice.
    pub async fn claim_title(&self, tenant_id: &str, session_id: &str, max: i32) -> Result<Option<TitleSource>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let claimed = tx
            .qo(
                // The model the session's turns use: the session's own, else its agent's
                // (with the agent's provider), as the claim resolves it.
                "WITH claimed AS (
                   UPDATE sessions SET title_attempted = true
                    WHERE id = $1 AND tenant_id = $2 AND title = '' AND NOT title_attempted AND removed_at IS NULL
                    RETURNING agent_id, provider, model, base_url)
                 SELECT CASE WHEN c.model IS NULL AND a.model IS NOT NULL THEN a.provider ELSE c.provider END,
                        coalesce(c.model, a.model),
                        CASE WHEN c.model IS NULL AND a.model IS NOT NULL THEN NULL ELSE c.base_url END
                   FROM claimed c LEFT JOIN agents a ON a.id = c.agent_id",
                &[&session_id, &tenant_id],
            )
            .await?;
        let Some(claimed) = claimed else {
            tx.commit().await?;
            return Ok(None);
        };
        let first = |kind: &'static str| {
            let tx = &tx;
            async move {
                tx.qo(
                    "SELECT left(body, $3) FROM rows WHERE session_id = $1 AND kind = $2 AND NOT hidden
                      ORDER BY source_sequence, item_index LIMIT 1",
                    &[&session_id, &kind, &max],
                )
                .await
                .map(|r| r.map(|r| r.get::<_, String>(0)).unwrap_or_default())
            }
        };
        let prompt = first("user").await?;
        let answer = first("assistant").await?;
        tx.commit().await?;
        Ok(Some(TitleSource {
            provider: claimed.get(0),
            model: claimed.get(1),
            base_url: claimed.get(2),
            prompt,
            answer,
        }))
    }

    /// Set an automatic title unless the session has one by now (a human's rename wins);
    /// returns the `session.titleChanged` sequence when set.
    pub async fn set_auto_title(&self, tenant_id: &str, session_id: &str, title: &str) -> Result<Option<i64>> {
        let mut client = self.pool.get().await?;
        let tx = tenant_tx(&mut client, tenant_id).await?;
        let n = tx
            .ex(
                "UPDATE sessions SET title = $3 WHERE id = $1 AND tenant_id = $2 AND title = '' AND removed_at IS NULL",
                &[&session_id, &tenant_id, &title],
            )
            .await?;
        let seq = if n == 1 {
            let event = EventPayload::SessionTitleChanged(TitleChanged { title: title.into() });
            Some(append_event(&tx, tenant_id, session_id, None, &event, &[]).await?)
        } else {
            None
        };
        tx.commit().await?;
        Ok(seq)
    }
}
