//! Applies `migrations/*.sql` (embedded at build time) under an advisory lock.

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

/// The migrations, in order: (file name, SQL).
#[rustfmt::skip]
pub const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_skeleton.sql", include_str!("../../../migrations/0001_skeleton.sql")),
    ("0002_sessions.sql", include_str!("../../../migrations/0002_sessions.sql")),
    ("0003_row_level_security.sql", include_str!("../../../migrations/0003_row_level_security.sql")),
    ("0004_email_case.sql", include_str!("../../../migrations/0004_email_case.sql")),
    ("0005_worker_host_binding.sql", include_str!("../../../migrations/0005_worker_host_binding.sql")),
    ("0006_turn_model_and_usage.sql", include_str!("../../../migrations/0006_turn_model_and_usage.sql")),
    ("0007_typed_event_payloads.sql", include_str!("../../../migrations/0007_typed_event_payloads.sql")),
    ("0008_fork.sql", include_str!("../../../migrations/0008_fork.sql")),
    ("0009_interactions.sql", include_str!("../../../migrations/0009_interactions.sql")),
    ("0010_delegation.sql", include_str!("../../../migrations/0010_delegation.sql")),
    ("0011_provider_choice.sql", include_str!("../../../migrations/0011_provider_choice.sql")),
    ("0012_worker_call_routing.sql", include_str!("../../../migrations/0012_worker_call_routing.sql")),
    ("0013_attachments.sql", include_str!("../../../migrations/0013_attachments.sql")),
    ("0014_coordinator.sql", include_str!("../../../migrations/0014_coordinator.sql")),
    ("0015_patches.sql", include_str!("../../../migrations/0015_patches.sql")),
    ("0016_agents_skills_compaction.sql", include_str!("../../../migrations/0016_agents_skills_compaction.sql")),
    ("0017_channel_sessions.sql", include_str!("../../../migrations/0017_channel_sessions.sql")),
    ("0018_mcp_servers.sql", include_str!("../../../migrations/0018_mcp_servers.sql")),
    ("0019_turns_by_session.sql", include_str!("../../../migrations/0019_turns_by_session.sql")),
    (
        "0020_turns_dispatched_handed_out.sql",
        include_str!("../../../migrations/0020_turns_dispatched_handed_out.sql"),
    ),
    ("0021_hot_path_foreign_keys.sql", include_str!("../../../migrations/0021_hot_path_foreign_keys.sql")),
    (
        "0022_approval_ceiling_and_owners.sql",
        include_str!("../../../migrations/0022_approval_ceiling_and_owners.sql"),
    ),
    ("0023_auto_approve_within.sql", include_str!("../../../migrations/0023_auto_approve_within.sql")),
    (
        "0024_replicas_read_only_for_app.sql",
        include_str!("../../../migrations/0024_replicas_read_only_for_app.sql"),
    ),
    ("0025_login_buckets.sql", include_str!("../../../migrations/0025_login_buckets.sql")),
    ("0026_worker_instance.sql", include_str!("../../../migrations/0026_worker_instance.sql")),
];

/// An arbitrary constant shared by every replica: "berth" in ASCII.
const LOCK_KEY: i64 = 0x0062_6572_7468;

/// Apply every pending migration. Safe to run from several processes at once.
pub async fn migrate(client: &mut tokio_postgres::Client) -> anyhow::Result<usize> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY]).await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS berth_migrations (
            name text PRIMARY KEY, sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await?;
    let mut applied = 0;
    for (name, sql) in MIGRATIONS {
        let digest = hex(&Sha256::digest(sql.as_bytes()));
        let row = tx
            .query_opt("SELECT sha256 FROM berth_migrations WHERE name = $1", &[name])
            .await?;
        match row {
            Some(row) => {
                let recorded: String = row.get(0);
                if recorded != digest {
                    bail!("migration {name} changed after it was applied (recorded sha256 {recorded})");
                }
            }
            None => {
                tx.batch_execute(sql)
                    .await
                    .with_context(|| format!("applying migration {name}"))?;
                tx.execute(
                    "INSERT INTO berth_migrations (name, sha256) VALUES ($1, $2)",
                    &[name, &digest],
                )
                .await?;
                applied += 1;
            }
        }
    }
    tx.commit().await?;
    Ok(applied)
}

/// Whether every migration this build knows is applied (for `/readyz`).
pub async fn is_current(client: &tokio_postgres::Client) -> anyhow::Result<bool> {
    let exists: bool = client
        .query_one("SELECT to_regclass('berth_migrations') IS NOT NULL", &[])
        .await?
        .get(0);
    if !exists {
        return Ok(false);
    }
    let n: i64 = client
        .query_one("SELECT count(*) FROM berth_migrations", &[])
        .await?
        .get(0);
    Ok(n as usize >= MIGRATIONS.len())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    /// Every file in `migrations/` is embedded, in file-name order.
    #[test]
    fn every_migration_file_is_embedded_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("migrations dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        files.sort();
        let embedded: Vec<&str> = super::MIGRATIONS.iter().map(|(n, _)| *n).collect();
        assert_eq!(files, embedded);
    }
}
