//! Benchmark: `session.search` scan rate against `grep -F -c` over the same text, measured
//! in the same run. `cargo build --release -p berth && cargo bench -p berth-e2e --bench search`
//! Prints ratios; asserts nothing about time.

use std::time::Instant;

use berth_e2e::{MockProvider, Stack};
use serde_json::{Value, json};

const ROWS: i64 = 200_000;

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let db = berth_e2e::harness::db(&stack.database_url).await;
    db.batch_execute(&format!(
        "INSERT INTO events (session_id, sequence, tenant_id, type, payload)
           SELECT id, g + 2, tenant_id, 'model.completed', '{{}}' FROM sessions, generate_series(0, {last}) g WHERE id = '{sid}';
         INSERT INTO rows (session_id, source_sequence, item_index, tenant_id, kind, body)
           SELECT id, g + 2, 0, tenant_id, 'assistant',
                  'line ' || g || ' of a long conversation about code, tests and the ' ||
                  CASE WHEN g % 97 = 0 THEN 'Needle' ELSE 'haystack' END || ' we keep looking through'
             FROM sessions, generate_series(0, {last}) g WHERE id = '{sid}';
         UPDATE sessions SET last_sequence = {ROWS} + 1 WHERE id = '{sid}';",
        last = ROWS - 1
    ))
    .await
    .expect("bulk rows");
    let bodies = db
        .query(
            "SELECT body FROM rows WHERE session_id = $1 ORDER BY source_sequence, item_index",
            &[&sid],
        )
        .await
        .unwrap();
    let text: String = bodies.iter().map(|r| format!("{}\n", r.get::<_, &str>(0))).collect();
    let bytes = text.len() as f64;
    let file = berth_e2e::harness::scratch_dir("bench-search").join("rows.txt");
    std::fs::write(&file, &text).unwrap();

    // Baseline: grep over the same text, case-insensitively like the search below.
    let t0 = Instant::now();
    let out = std::process::Command::new("grep")
        .args(["-F", "-c", "-i", "needle"])
        .arg(&file)
        .output()
        .expect("grep");
    let grep = t0.elapsed();
    let grep_count: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);

    // Berth: every page of the same search through the API.
    let t0 = Instant::now();
    let mut hits = 0u64;
    let mut pages = 0u64;
    let mut after = Value::Null;
    let mut through = Value::Null;
    loop {
        let mut p = json!({"sessionId": sid, "query": "needle", "caseSensitive": false, "wholeWord": false});
        if !after.is_null() {
            p["after"] = after.clone();
            p["through"] = through.clone();
        }
        let page = c.ok("session.search", p).await;
        through = page["through"].clone();
        hits += page["hits"].as_array().map_or(0, |h| h.len() as u64);
        pages += 1;
        after = page["nextAfter"].clone();
        if after.is_null() {
            break;
        }
    }
    let berth = t0.elapsed();
    let mb = |d: std::time::Duration| bytes / 1e6 / d.as_secs_f64();
    println!("search scan over {ROWS} rows, {:.1} MB of text", bytes / 1e6);
    println!(
        "  grep -F -c -i:    {:>8.1} MB/s ({grep_count} matching lines)",
        mb(grep)
    );
    println!(
        "  session.search:   {:>8.1} MB/s ({hits} hits, {pages} pages)",
        mb(berth)
    );
    println!(
        "  ratio (Berth / grep scan rate): {:.3}",
        grep.as_secs_f64() / berth.as_secs_f64()
    );
}
