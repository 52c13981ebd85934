//! The turn path between the API tier and its workers under pressure (issue 7 items 2, 6,
//! 7, 8, 14 and issue 20): the model proxy's scope and limits, turns left running by a lost
//! connection, transient database errors, claims under the tenant's role, turns of one
//! worker that must not wait for each other, and a stop that reaches the worker before its
//! turn's run.

use berth_e2e::{
    MockProvider, Part, Reply, Stack,
    harness::{eventually, log_events, metric, statements_wait_on_locks, wall_us},
};
use berth_protocol::worker::{MODEL_PROXY_PATH, MODEL_PROXY_TURN_HEADER};
use serde_json::{Value, json};

fn is_turn_end(v: &Value) -> bool {
    v["type"] == "turn.ended"
}

/// Start a turn in a new session whose model reply is `reply`, with a watcher on it;
/// returns (session, turn, watcher).
async fn start_turn(
    stack: &Stack,
    c: &mut berth_e2e::Client,
    mock: &MockProvider,
    reply: Reply,
    prompt: &str,
) -> (String, String, berth_e2e::client::Subscription) {
    let sid = stack.session(c).await;
    mock.push(reply);
    let w = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let sent = c.ok("session.send", json!({"sessionId": sid, "prompt": prompt})).await;
    (sid, sent["turnId"].as_str().expect("turnId").to_string(), w)
}

async fn turn_state(stack: &Stack, turn: &str) -> String {
    let db = berth_e2e::harness::db(&stack.database_url).await;
    db.query_one("SELECT state FROM turns WHERE id = $1", &[&turn])
        .await
        .expect("turn")
        .get(0)
}

fn proxy_url(stack: &Stack, replica: usize) -> String {
    format!("http://{}{MODEL_PROXY_PATH}", stack.servers[replica].addr)
}

/// A proxy call as a worker would make it (or a rogue one), returning status and body.
async fn proxy_call(stack: &Stack, token: &str, turn: Option<&str>, body: &Value) -> (u16, Value) {
    proxy_call_at(stack, 0, token, turn, body).await
}

/// [`proxy_call`] through replica `replica`.
async fn proxy_call_at(stack: &Stack, replica: usize, token: &str, turn: Option<&str>, body: &Value) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(proxy_url(stack, replica))
        .bearer_auth(token)
        .json(body);
    if let Some(t) = turn {
        req = req.header(MODEL_PROXY_TURN_HEADER, t);
    }
    let resp = req.send().await.expect("proxy reachable");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// The summed `berth_model_tokens_total` of one kind, from the metrics listener.
async fn metered_tokens(stack: &Stack, kind: &str) -> u64 {
    let text = stack.servers[0].metrics().await;
    text.lines()
        .filter(|l| l.starts_with("berth_model_tokens_total") && l.contains(&format!("kind=\"{kind}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Issue 7 item 6: a proxy call names a running turn held by a connection of the calling
/// worker credential; the model is the turn's, `n` and `max_tokens` are the server's; usage
/// is metered from the provider's stream; per-tenant concurrency is bounded.
#[tokio::test(flavor = "multi_thread")]
async fn the_model_proxy_serves_only_the_callers_running_turns_within_limits() {
    let mock = MockProvider::start().await;
    let env = [
        ("BERTH_MODEL_MAX_CONCURRENT", "2"),
        ("BERTH_MODEL_MAX_OUTPUT_TOKENS", "100"),
    ];
    let stack = Stack::start_with(&mock, 1, &env).await;
    let mut c = stack.client(0).await;
    // The worker's own call for this turn stays open: one of the tenant's two slots.
    let (_, turn, mut w) = start_turn(
        &stack,
        &mut c,
        &mock,
        Reply::StreamThenHang(vec![Part::Text("working".into())]),
        "go",
    )
    .await;
    w.until(20, |i| i["type"] == "model.delta")
        .await
        .expect("the turn streams");
    let body = json!({
        "model": "some-expensive-model", "n": 4, "max_tokens": 100000,
        "store": true, "service_tier": "priority", "web_search_options": {}, "temperature": 0.5,
        "messages": [{"role": "user", "content": "hi"}],
    });

    // No turn named, a turn that does not run, a credential that is not a worker's, a
    // worker credential whose connection does not hold the turn: all refused, typed.
    let (status, err) = proxy_call(&stack, &stack.worker_token, None, &body).await;
    assert_eq!((status, err["error"]["code"].as_str()), (400, Some("bad-params")));
    let (status, err) = proxy_call(&stack, &stack.worker_token, Some("trn_nope"), &body).await;
    assert_eq!((status, err["error"]["code"].as_str()), (403, Some("turn-not-running")));
    let (status, _) = proxy_call(&stack, &stack.token, Some(&turn), &body).await;
    assert_eq!(status, 401);
    let other = stack.servers[0].worker_token().await;
    let (status, err) = proxy_call(&stack, &other, Some(&turn), &body).await;
    assert_eq!((status, err["error"]["code"].as_str()), (403, Some("turn-not-running")));
    assert_eq!(mock.requests().len(), 1, "no refused call reached the provider");

    // The holder's credential may call for its running turn, on the server's terms.
    mock.push(Reply::Stream(vec![
        Part::Text("x".into()),
        Part::Usage {
            prompt: 7,
            completion: 3,
        },
    ]));
    let (status, streamed) = proxy_call(&stack, &stack.worker_token, Some(&turn), &body).await;
    assert_eq!(status, 200);
    assert!(streamed.as_str().unwrap_or("").contains("[DONE]"));
    let sent = mock.requests().last().cloned().expect("the provider was called");
    assert_eq!(sent["model"], "mock-model", "the turn's model, not the caller's");
    assert_eq!(sent["max_tokens"], 100);
    assert_eq!(sent["temperature"], 0.5);
    for dropped in ["n", "store", "service_tier", "web_search_options"] {
        assert!(sent.get(dropped).is_none(), "{dropped} reached the provider: {sent}");
    }
    // Metered from the stream by the API tier, though no worker reported any step (stored
    // with the turn's next step, or when it ends: see below).
    let db = berth_e2e::harness::db(&stack.database_url).await;
    assert_eq!(metered_tokens(&stack, "input").await, 7);
    assert_eq!(metered_tokens(&stack, "output").await, 3);
    // The call recorded the credential's use.
    let digest = berth_store::token::digest(&stack.worker_token);
    let used = "SELECT last_used_at IS NOT NULL FROM credentials WHERE sha256 = $1";
    assert!(db.query_one(used, &[&digest]).await.unwrap().get::<_, bool>(0));

    // The holder's credential once expired, or its hash unknown: refused as unauthenticated
    // before the provider is asked, though the turn still runs on its connection.
    let expire = "UPDATE credentials SET expires_at = now() - interval '1 second' WHERE sha256 = $1";
    db.execute(expire, &[&digest]).await.unwrap();
    let (status, _) = proxy_call(&stack, &stack.worker_token, Some(&turn), &body).await;
    assert_eq!(status, 401, "an expired credential");
    let restore = "UPDATE credentials SET expires_at = NULL WHERE sha256 = $1";
    db.execute(restore, &[&digest]).await.unwrap();
    let unknown = berth_store::token::generate();
    let (status, _) = proxy_call(&stack, &unknown, Some(&turn), &body).await;
    assert_eq!(status, 401, "an unknown credential");
    assert_eq!(mock.requests().len(), 2, "no refused call reached the provider");

    // Two calls of the tenant are open (the worker's and this one): a third is refused.
    mock.push(Reply::StreamThenHang(vec![Part::Text("y".into())]));
    let open = reqwest::Client::new()
        .post(proxy_url(&stack, 0))
        .bearer_auth(&stack.worker_token)
        .header(MODEL_PROXY_TURN_HEADER, &turn)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(open.status().as_u16(), 200);
    let (status, err) = proxy_call(&stack, &stack.worker_token, Some(&turn), &body).await;
    assert_eq!((status, err["error"]["code"].as_str()), (429, Some("rate-limited")));
    // Closing one frees its slot.
    drop(open);
    mock.push(Reply::text(&["z"]));
    let freed = eventually(20, || async {
        let (status, _) = proxy_call(&stack, &stack.worker_token, Some(&turn), &body).await;
        (status == 200).then_some(())
    })
    .await;
    assert!(freed.is_some(), "a closed call gives its slot back");

    // The turn stopped without a step: what was metered for it is stored all the same (the
    // first call's 7 + 3 and the last one's 10 + 5).
    let sid = db
        .query_one("SELECT session_id FROM turns WHERE id = $1", &[&turn])
        .await
        .unwrap()
        .get::<_, String>(0);
    c.ok("session.stop", json!({"sessionId": sid, "turnId": turn})).await;
    let totals = "SELECT input_tokens, output_tokens FROM turns WHERE id = $1";
    let stored = eventually(20, || async {
        let row = db.query_one(totals, &[&turn]).await.ok()?;
        ((row.get::<_, i64>(0), row.get::<_, i64>(1)) == (17, 8)).then_some(())
    })
    .await;
    assert!(stored.is_some(), "the turn's metered usage is stored when it ends");
}

/// Issue 7 item 2 (the proxy's part): the request-body limit follows the model's context
/// window, so a session whose conversation passes 2 MB keeps working.
#[tokio::test(flavor = "multi_thread")]
async fn a_conversation_past_two_megabytes_still_reaches_the_model() {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(&mock, 1, &[("BERTH_MODEL_CONTEXT_TOKENS", "1000000")]).await;
    let mut c = stack.client(0).await;
    // Prompts are bounded (`MAX_PROMPT_BYTES`): the conversation grows past 2 MB through
    // the model's long first answer instead.
    let big = "y".repeat(berth_protocol::MAX_PROMPT_BYTES);
    let long_answer: Vec<String> = (0..30).map(|_| "z".repeat(64_000)).collect();
    let long_answer: Vec<&str> = long_answer.iter().map(String::as_str).collect();
    let (sid, _, mut w) = start_turn(&stack, &mut c, &mock, Reply::text(&long_answer), &big).await;
    let end = w.until(60, is_turn_end).await.expect("first turn ends");
    assert_eq!(end.last().unwrap()["state"], "completed");
    mock.push(Reply::text(&["two"]));
    c.ok("session.send", json!({"sessionId": sid, "prompt": big})).await;
    let end = w.until(60, is_turn_end).await.expect("second turn ends");
    assert_eq!(
        end.last().unwrap()["state"],
        "completed",
        "the second turn's request (> 2 MB) was accepted: {end:?}"
    );
    let sent = mock.requests().last().cloned().unwrap();
    assert!(sent.to_string().len() > 2 << 20);
}

/// Issue 7 item 7: a running turn whose connection has no presence row (the presence was
/// deleted but interrupting failed, or the replica crashed in between) is interrupted by
/// the sweep instead of blocking its session forever.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_interrupts_running_turns_whose_connection_is_gone() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let (_, turn, mut w) = start_turn(
        &stack,
        &mut c,
        &mock,
        Reply::StreamThenHang(vec![Part::Text("working".into())]),
        "go",
    )
    .await;
    w.until(20, |i| i["type"] == "model.delta")
        .await
        .expect("the turn streams");
    // What a crash between "delete presence" and "interrupt turns" leaves behind.
    let db = berth_e2e::harness::db(&stack.database_url).await;
    db.execute("UPDATE turns SET dispatched_to = 'wcn_lost' WHERE id = $1", &[&turn])
        .await
        .unwrap();
    let items = w.until(40, is_turn_end).await.expect("the sweep settles the turn");
    let end = items.last().unwrap();
    assert_eq!(end["state"], "interrupted");
    assert_eq!(end["cause"]["code"], "worker-lost");
}

/// Issue 7 item 8: database errors on claims and heartbeats are logged and retried; the
/// worker stays connected and its running turn keeps running. The faults are injected with
/// triggers that fail the presence heartbeat and the claim's update.
#[tokio::test(flavor = "multi_thread")]
async fn a_transient_database_error_does_not_disconnect_a_healthy_worker() {
    let mock = MockProvider::start().await;
    // Two replicas: a turn admitted on the one without the worker is claimed.
    let stack = Stack::start(&mock, 2).await;
    let mut c = stack.client(0).await;
    let (_, running, mut w) = start_turn(
        &stack,
        &mut c,
        &mock,
        Reply::StreamThenHang(vec![Part::Text("working".into())]),
        "go",
    )
    .await;
    w.until(20, |i| i["type"] == "model.delta")
        .await
        .expect("the turn streams");
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let connection: String = db
        .query_one("SELECT connection_id FROM worker_presence", &[])
        .await
        .unwrap()
        .get(0);
    db.batch_execute(
        "CREATE SEQUENCE beat_faults; CREATE SEQUENCE claim_faults;
         CREATE FUNCTION beat_fault() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS
           $$ BEGIN PERFORM nextval('beat_faults'); RAISE EXCEPTION 'injected fault'; END $$;
         CREATE FUNCTION claim_fault() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS
           $$ BEGIN PERFORM nextval('claim_faults'); RAISE EXCEPTION 'injected fault'; END $$;
         CREATE TRIGGER beat_fault BEFORE UPDATE ON worker_presence FOR EACH ROW EXECUTE FUNCTION beat_fault();
         CREATE TRIGGER claim_fault BEFORE UPDATE OF dispatched_to ON turns FOR EACH ROW
           WHEN (NEW.dispatched_to IS DISTINCT FROM OLD.dispatched_to) EXECUTE FUNCTION claim_fault();",
    )
    .await
    .unwrap();
    // A turn to hand out while claims fail (admitted on the other replica: one admitted on
    // the worker's would be handed out by its admission, not claimed).
    let mut other = stack.client(1).await;
    let (_, _, mut w2) = start_turn(&stack, &mut other, &mock, Reply::text(&["later"]), "next").await;
    let hit = eventually(30, || async {
        let q = "SELECT (SELECT is_called FROM beat_faults) AND (SELECT is_called FROM claim_faults)";
        db.query_one(q, &[]).await.ok()?.get::<_, bool>(0).then_some(())
    })
    .await;
    // (Before the fix the first failed claim dropped the connection, so no heartbeat of it
    // ever failed: the worker kept reconnecting.)
    assert!(hit.is_some(), "a heartbeat and a claim of one connection both failed");
    db.batch_execute("DROP TRIGGER beat_fault ON worker_presence; DROP TRIGGER claim_fault ON turns;")
        .await
        .unwrap();
    // The claim is retried: the second turn runs to the end on the same connection.
    let end = w2
        .until(30, is_turn_end)
        .await
        .expect("the turn is handed out after the fault");
    assert_eq!(end.last().unwrap()["state"], "completed");
    let now: String = db
        .query_one("SELECT connection_id FROM worker_presence", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(now, connection, "the worker stayed connected");
    assert_eq!(
        turn_state(&stack, &running).await,
        "running",
        "its running turn was not interrupted"
    );
}

/// Issue 7 item 14: handing turns out reads and writes tenant rows as the tenant's role
/// (under row-level security), not as the owner: by a claim, and by an admission on the
/// worker's replica.
#[tokio::test(flavor = "multi_thread")]
async fn claims_run_under_the_tenants_role() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let db = berth_e2e::harness::db(&stack.database_url).await;
    db.batch_execute(
        "CREATE TABLE claim_roles (role text, how text);
         GRANT INSERT ON claim_roles TO berth_app;
         CREATE FUNCTION record_claim_role() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN INSERT INTO claim_roles VALUES (current_user, TG_OP); RETURN NEW; END $$;
         CREATE TRIGGER record_claim_role BEFORE UPDATE OF dispatched_to ON turns FOR EACH ROW
           WHEN (OLD.dispatched_to IS NULL AND NEW.dispatched_to IS NOT NULL) EXECUTE FUNCTION record_claim_role();
         CREATE TRIGGER record_handed_role BEFORE INSERT ON turns FOR EACH ROW
           WHEN (NEW.dispatched_to IS NOT NULL) EXECUTE FUNCTION record_claim_role();",
    )
    .await
    .unwrap();
    // Replica 0 holds the worker: its admission hands the turn out; replica 1's is claimed.
    for replica in [0, 1] {
        let mut c = stack.client(replica).await;
        let (_, _, mut w) = start_turn(&stack, &mut c, &mock, Reply::text(&["hi"]), "go").await;
        let end = w.until(30, is_turn_end).await.expect("turn ends");
        assert_eq!(end.last().unwrap()["state"], "completed", "{end:?}");
    }
    let roles: Vec<(String, String)> = db
        .query("SELECT role, how FROM claim_roles", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let expected = [("berth_app", "INSERT"), ("berth_app", "UPDATE")].map(|(r, h)| (r.to_string(), h.to_string()));
    assert_eq!(roles, expected);
}

/// Issue 20: a turn admitted on the replica that holds its workspace's worker is handed out
/// by the admission's own transaction (no claim); one admitted on another replica is
/// claimed by the worker's. Both run to the end.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_admitted_on_its_workers_replica_is_handed_out_without_a_claim() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let handed = |m: &str, via: &str| metric(m, &format!("berth_turns_handed_total{{via=\"{via}\"}}")).unwrap_or(0);
    for (replica, via) in [(0, [1, 0]), (1, [1, 1]), (0, [2, 1])] {
        let mut c = stack.client(replica).await;
        let (_, turn, mut w) = start_turn(&stack, &mut c, &mock, Reply::text(&["hi"]), "go").await;
        let end = w.until(30, is_turn_end).await.expect("turn ends");
        assert_eq!(end.last().unwrap()["state"], "completed", "{end:?}");
        let m = stack.servers[0].metrics().await;
        assert_eq!(
            [handed(&m, "admission"), handed(&m, "claim")],
            via,
            "turns handed out by admission and by claim after a turn admitted on replica {replica}"
        );
        let db = berth_e2e::harness::db(&stack.database_url).await;
        let dispatched: Option<String> = db
            .query_one("SELECT dispatched_to FROM turns WHERE id = $1", &[&turn])
            .await
            .unwrap()
            .get(0);
        assert!(dispatched.is_some_and(|d| d.starts_with("wcn_")));
    }
    let other = stack.servers[1].metrics().await;
    assert_eq!([handed(&other, "admission"), handed(&other, "claim")], [0, 0]);
}

/// Issue 20: a turn whose step write is held (its session row locked by the test) does not
/// delay another turn of the same worker, which is handed out, runs and ends meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_step_write_does_not_delay_another_turn_on_the_same_worker() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    // Turn A streams a little, pauses (the test locks its session then), and finishes.
    let reply = Reply::Stream(vec![Part::Text("a".into()), Part::Delay(3000), Part::Text("b".into())]);
    let (sid_a, turn_a, mut wa) = start_turn(&stack, &mut c, &mock, reply, "slow").await;
    wa.until(20, |i| i["type"] == "model.delta")
        .await
        .expect("turn A streams");
    let mut locker = berth_e2e::harness::db(&stack.database_url).await;
    let lock = locker.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", &[&sid_a])
        .await
        .unwrap();
    // Wait until A's step write is blocked on that lock.
    let held = a_statement_waits_on_a_lock(&stack).await;
    assert!(held.is_some(), "turn A's step write waits on the session lock");

    let (_, _, mut wb) = start_turn(&stack, &mut c, &mock, Reply::text(&["quick"]), "fast").await;
    let end = wb.until(30, is_turn_end).await.expect("turn B ends while A is held");
    assert_eq!(end.last().unwrap()["state"], "completed");
    assert_eq!(turn_state(&stack, &turn_a).await, "running", "A was still held");

    lock.rollback().await.unwrap();
    let end = wa.until(30, is_turn_end).await.expect("turn A ends once released");
    assert_eq!(end.last().unwrap()["state"], "completed");
}

/// Whether a statement of the test's database comes to wait on a lock (within 30 s).
async fn a_statement_waits_on_a_lock(stack: &Stack) -> Option<()> {
    statements_wait_on_locks(&stack.database_url, 1).await
}

/// A connection holding turn `turn`'s row lock, in a transaction left open (`ROLLBACK` frees
/// it).
async fn hold_turn_row(stack: &Stack, turn: &str) -> tokio_postgres::Client {
    let db = berth_e2e::harness::db(&stack.database_url).await;
    db.batch_execute("BEGIN").await.unwrap();
    db.execute("SELECT 1 FROM turns WHERE id = $1 FOR UPDATE", &[&turn])
        .await
        .unwrap();
    db
}

/// Issue 8: live deltas reach the replica's watchers while the write of the turn's relayed
/// output waits for the database (its session row locked by the test); that write, and
/// the end after it, complete once the lock goes.
#[tokio::test(flavor = "multi_thread")]
async fn live_deltas_reach_watchers_while_the_relay_write_is_held() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let reply = Reply::Stream(vec![
        Part::Text("one ".into()),
        Part::Delay(1500),
        Part::Text("two ".into()),
        Part::Delay(1500),
        Part::Text("three".into()),
    ]);
    let (sid, turn, mut w) = start_turn(&stack, &mut c, &mock, reply, "count").await;
    let delta = |text: &'static str| move |i: &Value| i["type"] == "model.delta" && i["text"] == text;
    w.until(20, delta("one ")).await.expect("the first delta");
    let mut locker = berth_e2e::harness::db(&stack.database_url).await;
    let lock = locker.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", &[&sid])
        .await
        .unwrap();
    w.until(20, delta("two ")).await.expect("the second delta");
    // Its relay write (within 50 ms of it) waits on the lock.
    let held = a_statement_waits_on_a_lock(&stack).await;
    assert!(held.is_some(), "the relay write waits on the session lock");
    w.until(20, delta("three"))
        .await
        .expect("the third delta arrives while the relay write is held");
    assert_eq!(turn_state(&stack, &turn).await, "running", "still held");

    lock.rollback().await.unwrap();
    let end = w.until(30, is_turn_end).await.expect("the turn ends once released");
    assert_eq!(end.last().unwrap()["state"], "completed");
    let history = c.ok("session.history", json!({"sessionId": sid})).await;
    assert!(history.to_string().contains("one two three"), "{history}");
}

/// Issue 20: in-flight turn work per worker connection is bounded. With room for one turn,
/// a second session's turn starts but waits unclaimed (nothing buffered for it) and is
/// handed out as soon as the first turn ends.
#[tokio::test(flavor = "multi_thread")]
async fn turns_beyond_a_connections_bound_wait_to_be_handed_out() {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(&mock, 1, &[("BERTH_WORKER_MAX_TURNS", "1")]).await;
    let mut c = stack.client(0).await;
    let (sid_a, turn_a, mut wa) = start_turn(
        &stack,
        &mut c,
        &mock,
        Reply::StreamThenHang(vec![Part::Text("working".into())]),
        "first",
    )
    .await;
    wa.until(20, |i| i["type"] == "model.delta")
        .await
        .expect("turn A streams");
    let (_, turn_b, mut wb) = start_turn(&stack, &mut c, &mock, Reply::text(&["second"]), "second").await;
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let undispatched = "SELECT state = 'running' AND dispatched_to IS NULL FROM turns WHERE id = $1";
    assert!(db.query_one(undispatched, &[&turn_b]).await.unwrap().get::<_, bool>(0));
    // A claim pass (the safety retry runs every 5 s) still leaves it waiting.
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert!(
        db.query_one(undispatched, &[&turn_b]).await.unwrap().get::<_, bool>(0),
        "the connection is full: B is not handed out"
    );
    assert_eq!(mock.requests().len(), 1);
    c.ok("session.stop", json!({"sessionId": sid_a, "turnId": turn_a}))
        .await;
    let end = wb.until(30, is_turn_end).await.expect("B is handed out once A ends");
    assert_eq!(end.last().unwrap()["state"], "completed");
}

/// Issue 20: a turn that ends normally on a full connection hands out the turn waiting for
/// room at once. The end's `NOTIFY` wakes claims only for its session's queued turns, so
/// the replica holding the connection wakes its own claimer when the end frees a slot
/// (without it, the waiting turn would wait for the claimer's safety read, every 5 s).
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_ending_on_a_full_connection_hands_out_the_waiting_one_at_once() {
    a_freed_slot_hands_out_the_waiting_turn_at_once(false).await;
}

/// A stop frees a full connection's slot as an end does: the waiting turn is handed out at
/// once, not at the next 5 s safety tick (the stop's dispatch `NOTIFY` may reach the claimer
/// before the connection has let go of the stopped turn).
#[tokio::test]
async fn a_turn_stopped_on_a_full_connection_hands_out_the_waiting_one_at_once() {
    a_freed_slot_hands_out_the_waiting_turn_at_once(true).await;
}

/// On a connection bound to one turn, turn A runs and turn B waits; A ends (or is stopped,
/// with `stop`), and B must be handed out and end within 3 s, three rounds.
async fn a_freed_slot_hands_out_the_waiting_turn_at_once(stop: bool) {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(&mock, 1, &[("BERTH_WORKER_MAX_TURNS", "1")]).await;
    let mut c = stack.client(0).await;
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let undispatched = "SELECT state = 'running' AND dispatched_to IS NULL FROM turns WHERE id = $1";
    for round in 0..3 {
        let slow = Reply::Stream(vec![
            Part::Text("working".into()),
            Part::Delay(if stop { 30_000 } else { 1500 }),
            Part::Text(" done".into()),
        ]);
        let (sa, turn_a, mut wa) = start_turn(&stack, &mut c, &mock, slow, "first").await;
        wa.until(20, |i| i["type"] == "model.delta")
            .await
            .expect("turn A streams");
        let (_, turn_b, mut wb) = start_turn(&stack, &mut c, &mock, Reply::text(&["second"]), "second").await;
        assert!(
            db.query_one(undispatched, &[&turn_b]).await.unwrap().get::<_, bool>(0),
            "round {round}: the connection is full, B waits"
        );
        let a_state = if stop {
            c.ok("session.stop", json!({"sessionId": sa, "turnId": turn_a})).await;
            "cancelled"
        } else {
            "completed"
        };
        let end = wa.until(30, is_turn_end).await.expect("A ends");
        assert_eq!(end.last().unwrap()["state"], a_state);
        let end = wb.until(3, is_turn_end).await;
        assert!(
            end.is_some_and(|e| e.last().unwrap()["state"] == "completed"),
            "round {round}: B is handed out and ends at once once A ended or was stopped"
        );
    }
}

/// A worker speaking the protocol by hand on its own host and workspace: returns the socket
/// and its workspace id, and whether the server takes the last step in `turn.end`.
async fn raw_worker(
    stack: &Stack,
    host: &str,
) -> (
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    String,
    bool,
) {
    raw_worker_with(stack, host, &stack.servers[0].worker_token().await).await
}

/// [`raw_worker`] with the worker credential `token`.
async fn raw_worker_with(
    stack: &Stack,
    host: &str,
    token: &str,
) -> (
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    String,
    bool,
) {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let mut ws = worker_socket(stack, token).await;
    let dir = berth_e2e::harness::scratch_dir("raw-worker");
    let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "worker.hello", "params": {
        "protocol": berth_protocol::PROTOCOL_VERSION, "host": host,
        "workspaces": [{"name": "raw", "path": dir.display().to_string()}]}});
    ws.send(Message::Text(hello.to_string().into())).await.unwrap();
    let reply = next_json(&mut ws).await;
    let workspace = reply["result"]["workspaces"][0]["workspaceId"]
        .as_str()
        .unwrap_or_else(|| panic!("worker.hello: {reply}"))
        .to_string();
    let carries = reply["result"]["endCarriesStep"] == true;
    (ws, workspace, carries)
}

/// A `worker.hello` is bounded before anything of it is stored: past 256 workspaces, or
/// with a host, name or path past its length, it is refused (`bad-params {field, max}`),
/// the connection closes, and neither the host binding nor any workspace is recorded.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_hello_past_its_bounds_is_refused_and_stores_nothing() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let token = stack.servers[0].worker_token().await;
    let ws = |name: &str, path: &str| json!({"name": name, "path": path});
    let many: Vec<Value> = (0..=256).map(|i| ws(&format!("w{i}"), "/srv/w")).collect();
    let cases = [
        ("workspaces", 256, json!("bounded-host"), Value::Array(many)),
        ("host", 256, json!("h".repeat(257)), json!([ws("a", "/srv/a")])),
        (
            "workspaces.name",
            256,
            json!("bounded-host"),
            json!([ws(&"n".repeat(257), "/srv/a")]),
        ),
        (
            "workspaces.path",
            4096,
            json!("bounded-host"),
            json!([ws("a", &"p".repeat(4097))]),
        ),
    ];
    for (field, max, host, workspaces) in cases {
        let mut socket = worker_socket(&stack, &token).await;
        let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "worker.hello", "params": {
            "protocol": berth_protocol::PROTOCOL_VERSION, "host": host, "workspaces": workspaces}});
        socket.send(Message::Text(hello.to_string().into())).await.unwrap();
        let reply = next_json(&mut socket).await;
        assert_eq!(reply["error"]["data"]["code"], "bad-params", "{field}: {reply}");
        assert_eq!(reply["error"]["data"]["field"], field, "{reply}");
        assert_eq!(reply["error"]["data"]["max"], max, "{reply}");
    }
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let digest = berth_store::token::digest(&token);
    let bound: Option<String> = db
        .query_one("SELECT host FROM credentials WHERE sha256 = $1", &[&digest])
        .await
        .unwrap()
        .get(0);
    assert_eq!(bound, None, "no host was bound");
    let stored: i64 = db
        .query_one("SELECT count(*) FROM workspaces WHERE host <> 'test-host'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 0, "no workspace was registered");
    // Within the bounds the same credential says hello.
    let (_socket, workspace, _) = raw_worker_with(&stack, "bounded-host", &token).await;
    assert!(workspace.starts_with("wsp_"));
}

async fn next_json(
    ws: &mut (
             impl futures_util::Stream<
        Item = Result<tokio_tungstenite::tungstenite::Message, tokio_tungstenite::tungstenite::Error>,
    > + Unpin
         ),
) -> Value {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    loop {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(30), ws.next())
            .await
            .expect("a message within 30 s")
            .expect("open")
            .expect("frame");
        if let Message::Text(t) = msg {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

/// A new session of `workspace`.
async fn new_session(c: &mut berth_e2e::Client, workspace: &str) -> String {
    c.ok("session.create", json!({"workspaceId": workspace})).await["sessionId"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A new session of the raw worker's `workspace`, watched from its start, whose turn runs
/// `prompt`: the session, the watch, and the turn once handed to the worker (`ws`).
async fn raw_turn(
    c: &mut berth_e2e::Client,
    ws: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    workspace: &str,
    prompt: &str,
) -> (String, berth_e2e::client::Subscription, String) {
    let sid = new_session(c, workspace).await;
    let watch = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    c.ok("session.send", json!({"sessionId": sid, "prompt": prompt})).await;
    loop {
        let v = next_json(ws).await;
        if v["method"] == "turn.run" {
            return (sid, watch, v["params"]["turnId"].as_str().unwrap().to_string());
        }
    }
}

/// The answer to request `id` (skipping notifications such as `turn.run`).
async fn answer(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    id: u32,
) -> Value {
    loop {
        let v = next_json(ws).await;
        if v["id"] == id && v.get("method").is_none() {
            return v;
        }
    }
}

/// A patch whose capture a turn of its session started during (its worker may have changed
/// the workspace meanwhile) is refused `turn-busy` and not recorded: storing the patch
/// checks again, under the session's lock, that no turn started since the capture was let
/// begin.
#[tokio::test(flavor = "multi_thread")]
async fn a_patch_captured_while_a_turn_started_is_not_recorded() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let (mut ws, workspace, _) = raw_worker(&stack, "patch-host").await;
    let mut c = stack.client(0).await;
    let sid = new_session(&mut c, &workspace).await;
    let mut snapper = stack.client(0).await;
    let params = json!({"sessionId": sid, "operationId": "snap-race"});
    let snapshot = tokio::spawn(async move { snapper.call("patch.snapshot", params).await });
    let call = loop {
        let v = next_json(&mut ws).await;
        if v["method"] == "call" && v["params"]["method"] == "patch.snapshot" {
            break v;
        }
    };
    // While the worker captures, a turn of the session starts and is handed to it.
    c.ok("session.send", json!({"sessionId": sid, "prompt": "change things"}))
        .await;
    while next_json(&mut ws).await["method"] != "turn.run" {}
    let captured = json!({"jsonrpc": "2.0", "id": call["id"], "result": {"files": 0}});
    ws.send(Message::Text(captured.to_string().into())).await.unwrap();
    let refused = snapshot.await.unwrap().expect_err("the patch is refused");
    assert_eq!(berth_e2e::client::code(&refused), "turn-busy");
    let patches = "SELECT count(*) FROM patches WHERE session_id = $1";
    assert_eq!(stack.sql_i64(patches, &sid).await, 0, "no patch recorded");
}

/// A turn recorded as handed to a worker connection whose `turn.run` never went out (the
/// database's answer to the hand-out lost after its `COMMIT`; here the row is written
/// directly) is found by the connection's claimer and sent out, once, and runs to its end.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_handed_out_without_its_run_is_sent_later() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let (mut ws, workspace, _) = raw_worker(&stack, "lost-host").await;
    let mut c = stack.client(0).await;
    let sid = new_session(&mut c, &workspace).await;
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let conn: String = db
        .query_one(
            "SELECT connection_id FROM worker_presence WHERE $1 = ANY(workspace_ids)",
            &[&workspace],
        )
        .await
        .unwrap()
        .get(0);
    db.execute(
        "INSERT INTO turns (id, tenant_id, session_id, state, started_at, prompt, queue_position, dispatched_to, model)
         SELECT 'trn_lost', tenant_id, id, 'running', now(), 'lost', 1, $2, 'mock-model' FROM sessions WHERE id = $1",
        &[&sid, &conn],
    )
    .await
    .unwrap();
    // Within two of the claimer's 5 s safety ticks.
    let run = tokio::time::timeout(std::time::Duration::from_secs(12), async {
        loop {
            let v = next_json(&mut ws).await;
            if v["method"] == "turn.run" {
                return v;
            }
        }
    })
    .await
    .expect("turn.run within 12 s");
    assert_eq!(run["params"]["turnId"], "trn_lost");
    assert_eq!(run["params"]["sessionId"], sid.as_str());
    assert_eq!(run["params"]["model"], "mock-model");
    let recovered = |m: &str| metric(m, "berth_turns_handed_total{via=\"recovery\"}");
    assert_eq!(recovered(&stack.servers[0].metrics().await), Some(1));
    // Its task is registered: a malformed end is refused and leaves it running here, not
    // sent again on the claimer's next tick; then the end is stored.
    let malformed = json!({"jsonrpc": "2.0", "id": 6, "method": "turn.end", "params": {
        "turnId": "trn_lost", "state": "running"}});
    ws.send(Message::Text(malformed.to_string().into())).await.unwrap();
    let refused = answer(&mut ws, 6).await;
    assert!(refused.get("error").is_some(), "a running end is refused: {refused}");
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(recovered(&stack.servers[0].metrics().await), Some(1), "sent once");
    let end = json!({"jsonrpc": "2.0", "id": 7, "method": "turn.end", "params": {
        "turnId": "trn_lost", "state": "completed", "step": [{"kind": "assistant", "body": "found"}]}});
    ws.send(Message::Text(end.to_string().into())).await.unwrap();
    let done = answer(&mut ws, 7).await;
    assert!(done["result"]["sequence"].is_i64(), "turn.end: {done}");
    assert_eq!(turn_state(&stack, "trn_lost").await, "completed");
}

/// Issue 8: the last step travels in `turn.end` and is stored with `turn.ended` in one
/// transaction. When the end cannot be stored, neither is the step (no answer without its
/// end); the retried end stores both, the step's event right before the end.
#[tokio::test(flavor = "multi_thread")]
async fn the_last_step_and_the_end_are_stored_together() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let (mut ws, workspace, carries) = raw_worker(&stack, "atomic-host").await;
    assert!(carries, "the server takes the last step in turn.end");
    let mut c = stack.client(0).await;
    let (sid, mut watch, turn) = raw_turn(&mut c, &mut ws, &workspace, "hello").await;
    // Make storing `turn.ended` fail once, inside the end's transaction.
    let db = berth_e2e::harness::db(&stack.database_url).await;
    berth_e2e::harness::refuse_inserts(&db, "refuse_end", "events", "NEW.type = 'turn.ended'").await;
    let end = json!({"jsonrpc": "2.0", "id": 7, "method": "turn.end", "params": {
        "turnId": turn, "state": "completed",
        "step": [{"kind": "assistant", "body": "the answer"}]}});
    ws.send(Message::Text(end.to_string().into())).await.unwrap();
    let refused = answer(&mut ws, 7).await;
    assert!(refused.get("error").is_some(), "the end failed: {refused}");
    let completed = "SELECT count(*) FROM events WHERE session_id = $1 AND type = 'model.completed'";
    assert_eq!(
        stack.sql_i64(completed, &sid).await,
        0,
        "no step stored without its end"
    );
    let answers = "SELECT count(*) FROM rows WHERE session_id = $1 AND kind = 'assistant'";
    assert_eq!(stack.sql_i64(answers, &sid).await, 0);

    db.batch_execute("DROP TRIGGER refuse_end ON events").await.unwrap();
    let retry = json!({"jsonrpc": "2.0", "id": 8, "method": "turn.end", "params": end["params"]});
    ws.send(Message::Text(retry.to_string().into())).await.unwrap();
    let done = answer(&mut ws, 8).await;
    let end_seq = done["result"]["sequence"]
        .as_i64()
        .unwrap_or_else(|| panic!("turn.end: {done}"));
    let items = watch
        .until(30, is_turn_end)
        .await
        .expect("turn.ended reaches the watcher");
    let step = items
        .iter()
        .find(|i| i["type"] == "model.completed")
        .expect("model.completed before turn.ended");
    assert_eq!(step["sequence"].as_i64(), Some(end_seq - 1));
    assert_eq!(step["rows"][0]["body"], "the answer");
    assert_eq!(items.last().unwrap()["state"], "completed");
    assert_eq!(stack.sql_i64(completed, &sid).await, 1, "stored once");
    assert_eq!(turn_state(&stack, &turn).await, "completed");
}

/// Issue 8: with `berth_worker::model` at TRACE the worker logs each chunk of model output
/// it receives (its turn, text and thinking, and the wall-clock time it arrived), and with
/// `berth_api::workers` at TRACE the API tier logs each delta as it arrives and as it is
/// handed to local watchers, so that a delta's way to a watcher can be measured; never the
/// request or a credential. Below TRACE, no model output reaches the worker's log.
#[tokio::test(flavor = "multi_thread")]
async fn the_worker_traces_each_chunk_of_model_output_with_its_arrival() {
    let mock = MockProvider::start().await;
    let server_env = [
        ("RUST_LOG", "info,berth_api::workers=trace"),
        ("BERTH_LOG_FORMAT", "json"),
    ];
    let mut stack = Stack::start_with(&mock, 1, &server_env).await;
    let mut c = stack.client(0).await;
    let reply = |a: &str, b: &str| {
        Reply::Stream(vec![
            Part::Reasoning(format!("thinking {a}")),
            Part::Text(a.into()),
            Part::Delay(20),
            Part::Text(b.into()),
        ])
    };

    // The harness's worker logs at DEBUG.
    let (_, _, mut w) = start_turn(&stack, &mut c, &mock, reply("quiet one", "quiet two"), "prompt one").await;
    w.until(30, is_turn_end).await.expect("turn ended");
    let log = std::fs::read_to_string(&stack.worker.as_ref().unwrap().log).unwrap();
    assert!(!log.contains("quiet one") && !log.contains("quiet two"), "{log}");

    stack.kill_worker().await;
    let env = [
        ("RUST_LOG", "info,berth_worker::model=trace"),
        ("BERTH_LOG_FORMAT", "json"),
    ];
    stack.start_worker_with_env(0, &[], &env).await;
    let before = wall_us();
    let (_, turn, mut w) = start_turn(
        &stack,
        &mut c,
        &mock,
        reply("first piece", "second piece"),
        "prompt two",
    )
    .await;
    let items = w.until(30, is_turn_end).await.expect("turn ended");
    let after = wall_us();
    assert_eq!(items.last().unwrap()["state"], "completed");
    let worker_log = &stack.worker.as_ref().unwrap().log;
    let events = log_events(worker_log, "berth_worker::model");
    let output: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            assert_eq!(e["level"], "TRACE");
            assert_eq!(e["fields"]["turn"], turn.as_str());
            let at = e["fields"]["received_us"].as_u64().expect("received_us");
            assert!((before..=after).contains(&at), "{at} not within the turn");
            let f = &e["fields"];
            (f["text"].as_str().unwrap(), f["thinking"].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        output,
        [("", "thinking first piece"), ("first piece", ""), ("second piece", "")]
    );
    let log = std::fs::read_to_string(worker_log).unwrap();
    assert!(!log.contains("prompt two"), "the request is not logged");
    assert!(!log.contains(&stack.worker_token) && !log.contains("sk-test-provider-key"));

    // The API tier: each of this turn's deltas, received and then relayed (the reader may
    // receive the next delta before the turn's task relays this one).
    let server_log = &stack.servers[0].log;
    let mut steps: Vec<((String, String), Vec<String>)> = Vec::new();
    for e in log_events(server_log, "berth_api::workers") {
        let f = &e["fields"];
        if f["turn"] != turn.as_str() {
            continue;
        }
        let at = f["at_us"].as_u64().expect("at_us");
        assert!((before..=after).contains(&at), "{at} not within the turn");
        let s = |k: &str| f[k].as_str().unwrap().to_string();
        let piece = (s("text"), s("thinking"));
        match steps.iter_mut().find(|(p, _)| *p == piece) {
            Some((_, seen)) => seen.push(s("message")),
            None => steps.push((piece, vec![s("message")])),
        }
    }
    let expected: Vec<((String, String), Vec<String>)> = output
        .iter()
        .map(|(text, thinking)| {
            let both = vec!["turn.delta received".to_string(), "turn.delta relayed".to_string()];
            ((text.to_string(), thinking.to_string()), both)
        })
        .collect();
    assert_eq!(steps, expected);
    let log = std::fs::read_to_string(server_log).unwrap();
    assert!(!log.contains(&stack.worker_token) && !log.contains(&stack.token));
    assert!(!log.contains("sk-test-provider-key"));
}

/// Issue 20: the usage the model proxy meters for a turn whose worker connection the same
/// replica holds is stored with the turn's next step, without a database write of its own
/// (the call ends while the turn's row is locked by the test); a call through another
/// replica is metered in the database (it waits for that lock). Either way the step's
/// `model.completed`, `turn.ended`, the turn's totals and `session.context` count the same
/// usage; and usage metered without a step to carry it still reaches `turn.ended`.
#[tokio::test(flavor = "multi_thread")]
async fn metered_usage_is_stored_with_the_step_or_by_the_database() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let worker_token = stack.servers[0].worker_token().await;
    let (mut ws, workspace, _) = raw_worker_with(&stack, "meter-host", &worker_token).await;
    let mut c = stack.client(0).await;
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let mut id = 100;
    // (replica the call goes through, whether the end carries the step)
    for (n, (replica, with_step)) in [(0, true), (1, true), (0, false)].into_iter().enumerate() {
        let prompt = 40 + n as u64;
        let (sid, mut watch, turn) = raw_turn(&mut c, &mut ws, &workspace, "count me").await;
        mock.push(Reply::Stream(vec![
            Part::Text("counted".into()),
            Part::Usage { prompt, completion: 7 },
        ]));
        // The turn's row locked: a meter written by the database waits for it.
        let lock = hold_turn_row(&stack, &turn).await;
        let request = json!({"model": "x", "messages": [{"role": "user", "content": "count me"}]});
        let call = proxy_call_at(&stack, replica, &worker_token, Some(&turn), &request);
        let (_, streamed) = if replica == 0 {
            // Held by this replica's connection: nothing waits for the lock.
            let answer = tokio::time::timeout(std::time::Duration::from_secs(25), call)
                .await
                .expect("the stream ends without a database write of its meter");
            lock.batch_execute("ROLLBACK").await.unwrap();
            answer
        } else {
            let release = async {
                assert!(
                    a_statement_waits_on_a_lock(&stack).await.is_some(),
                    "another replica meters in the database"
                );
                lock.batch_execute("ROLLBACK").await.unwrap();
            };
            tokio::join!(call, release).0
        };
        assert!(streamed.as_str().unwrap_or("").contains("[DONE]"), "{streamed}");
        id += 1;
        let mut end = json!({"turnId": turn, "state": "completed"});
        if with_step {
            end["step"] = json!([{"kind": "assistant", "body": "counted"}]);
        }
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "turn.end", "params": end});
        ws.send(Message::Text(msg.to_string().into())).await.unwrap();
        let done = answer(&mut ws, id).await;
        assert!(done.get("result").is_some(), "turn.end: {done}");
        let items = watch.until(30, is_turn_end).await.expect("turn.ended");
        let usage = json!({"inputTokens": prompt, "outputTokens": 7});
        let ended = items.last().unwrap();
        assert_eq!(ended["usage"], usage, "call {n}: {ended}");
        let completed = items.iter().find(|i| i["type"] == "model.completed");
        if with_step {
            assert_eq!(completed.expect("model.completed")["usage"], usage, "call {n}");
        } else {
            assert!(completed.is_none());
        }
        let totals = db
            .query_one("SELECT input_tokens, output_tokens FROM turns WHERE id = $1", &[&turn])
            .await
            .unwrap();
        assert_eq!((totals.get::<_, i64>(0), totals.get::<_, i64>(1)), (prompt as i64, 7));
        let report = c.ok("session.context", json!({"sessionId": sid})).await["request"].clone();
        assert_eq!(report["turnId"], turn.as_str());
        assert_eq!(
            report["inputTokens"], prompt,
            "call {n}: the context record's input usage"
        );
    }
}

/// A call of the turn metered by another replica while the turn's step waits for the turn's
/// row: the step's `model.completed` counts it, and the next step does not count it again
/// (the usage the step takes and resets is read under the row's lock, not from before).
#[tokio::test(flavor = "multi_thread")]
async fn a_meter_committed_while_the_step_waits_goes_with_the_step() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let worker_token = stack.servers[0].worker_token().await;
    let (mut ws, workspace, _) = raw_worker_with(&stack, "race-host", &worker_token).await;
    let mut c = stack.client(0).await;
    let (_, mut watch, turn) = raw_turn(&mut c, &mut ws, &workspace, "race me").await;
    mock.push(Reply::Stream(vec![
        Part::Text("raced".into()),
        Part::Usage {
            prompt: 50,
            completion: 7,
        },
    ]));
    let lock = hold_turn_row(&stack, &turn).await;
    let request = json!({"model": "x", "messages": [{"role": "user", "content": "race me"}]});
    // Through the replica not holding the worker: metered by the database, which waits.
    let call = proxy_call_at(&stack, 1, &worker_token, Some(&turn), &request);
    let step = |id: u32| {
        let p = json!({"turnId": turn, "rows": [{"kind": "assistant", "body": "raced"}]});
        Message::Text(
            json!({"jsonrpc": "2.0", "id": id, "method": "turn.step", "params": p})
                .to_string()
                .into(),
        )
    };
    let release = async {
        assert!(
            statements_wait_on_locks(&stack.database_url, 1).await.is_some(),
            "the meter waits"
        );
        // The step starts after the meter and waits behind it.
        ws.send(step(1)).await.unwrap();
        assert!(
            statements_wait_on_locks(&stack.database_url, 2).await.is_some(),
            "the step waits too"
        );
        lock.batch_execute("ROLLBACK").await.unwrap();
    };
    let ((_, streamed), ()) = tokio::join!(call, release);
    assert!(streamed.as_str().unwrap_or("").contains("[DONE]"), "{streamed}");
    let stored = answer(&mut ws, 1).await;
    assert!(stored.get("result").is_some(), "turn.step: {stored}");
    ws.send(step(2)).await.unwrap();
    assert!(answer(&mut ws, 2).await.get("result").is_some());
    let end = json!({"turnId": turn, "state": "completed"});
    let msg = json!({"jsonrpc": "2.0", "id": 3, "method": "turn.end", "params": end});
    ws.send(Message::Text(msg.to_string().into())).await.unwrap();
    assert!(answer(&mut ws, 3).await.get("result").is_some());
    let items = watch.until(30, is_turn_end).await.expect("turn.ended");
    let steps: Vec<&Value> = items.iter().filter(|i| i["type"] == "model.completed").collect();
    assert_eq!(steps.len(), 2);
    let usage = json!({"inputTokens": 50, "outputTokens": 7});
    assert_eq!(steps[0]["usage"], usage, "the step taken after the meter counts it");
    assert!(
        steps[1].get("usage").is_none(),
        "and the next one does not: {}",
        steps[1]
    );
    assert_eq!(items.last().unwrap()["usage"], usage, "the turn's total");
}

/// A `turn.stop` can reach the worker before its turn's `turn.run` (the stop reached the
/// server's connection while the hand-out was between its registration and its send):
/// that turn must not run. The test plays the API tier for a real worker process.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_whose_stop_came_before_its_run_does_not_run_on_the_worker() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address").to_string();
    let dir = berth_e2e::harness::scratch_dir("stop-first");
    let worker = berth_e2e::TestWorker::start_at(&addr, "brt_test", "test-host", "proj", &dir, &[], &[])
        .await
        .expect("worker");
    let (tcp, _) = tokio::time::timeout(std::time::Duration::from_secs(30), listener.accept())
        .await
        .expect("the worker connects")
        .expect("accept");
    let mut ws = tokio_tungstenite::accept_async(tcp).await.expect("websocket");
    let hello = next_json(&mut ws).await;
    assert_eq!(hello["method"], "worker.hello", "{hello}");
    let send = |v: Value| Message::text(v.to_string());
    ws.send(send(json!({"jsonrpc": "2.0", "id": hello["id"],
        "result": {"workspaces": [{"name": "proj", "workspaceId": "w1"}]}})))
        .await
        .expect("hello answered");
    let note = |method: &str, params: Value| send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    let run = |turn: &str| {
        note(
            "turn.run",
            json!({"turnId": turn, "sessionId": "s1", "workspaceId": "w1", "noTools": true}),
        )
    };
    // The stop first, then its turn's run; then another turn, which runs.
    ws.send(note("turn.stop", json!({"turnId": "t1"}))).await.expect("stop");
    ws.send(run("t1")).await.expect("run t1");
    ws.send(run("t2")).await.expect("run t2");
    // t2 asks for its history (refused here), then settles; t1 never says a word.
    loop {
        let msg = next_json(&mut ws).await;
        assert_ne!(msg["params"]["turnId"], "t1", "the stopped turn ran: {msg}");
        if msg["method"] == "turn.end" {
            assert_eq!(msg["params"]["turnId"], "t2", "{msg}");
            ws.send(send(json!({"jsonrpc": "2.0", "id": msg["id"], "result": null})))
                .await
                .expect("end answered");
            break;
        }
        if !msg["id"].is_null() {
            ws.send(send(json!({"jsonrpc": "2.0", "id": msg["id"],
                "error": {"code": -32000, "message": "unavailable", "data": {"code": "unavailable"}}})))
                .await
                .expect("refused");
        }
    }
    let said = eventually(10, || async {
        let log = std::fs::read_to_string(&worker.log).unwrap_or_default();
        log.contains("turn stopped by the server before it ran").then_some(())
    })
    .await;
    assert!(said.is_some(), "the worker did not say why t1 did not run");
}

/// A WebSocket to replica 0's worker endpoint, signed in with the worker credential `token`
/// (nothing sent yet).
async fn worker_socket(
    stack: &Stack,
    token: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, http::HeaderValue};
    let mut req = format!("ws://{}/v1/worker", stack.servers[0].addr)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    tokio_tungstenite::connect_async(req).await.expect("worker websocket").0
}

/// The worker credential alone does not let a second process connect beside the worker (a
/// command the worker ran that read its token file): while the worker is connected, a hello
/// on its credential from another process — with no process key, or another one — is
/// refused `conflict {reason: "worker-running"}` before anything of it is stored; once the
/// worker is gone, the credential connects again.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_process_on_the_workers_credential_is_refused_while_it_is_connected() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let token = stack.worker_token.clone();
    let db = berth_e2e::harness::db(&stack.database_url).await;
    for instance in [None, Some("0123456789abcdef0123456789abcdef")] {
        let mut socket = worker_socket(&stack, &token).await;
        let mut params = json!({"protocol": berth_protocol::PROTOCOL_VERSION, "host": "test-host",
            "workspaces": [{"name": "other", "path": "/srv/other"}]});
        if let Some(i) = instance {
            params["instance"] = json!(i);
        }
        let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "worker.hello", "params": params});
        socket.send(Message::Text(hello.to_string().into())).await.unwrap();
        let reply = next_json(&mut socket).await;
        assert_eq!(reply["error"]["data"]["code"], "conflict", "{reply}");
        assert_eq!(reply["error"]["data"]["reason"], "worker-running", "{reply}");
    }
    let stored: i64 = db
        .query_one("SELECT count(*) FROM workspaces WHERE name = 'other'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 0, "the refused hello registered nothing");
    let live: i64 = db
        .query_one("SELECT count(*) FROM worker_presence", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(live, 1, "only the worker's connection");

    // The worker is gone (its connection closed): the credential connects again.
    stack.kill_worker().await;
    let mut connected = None;
    for _ in 0..100 {
        let mut socket = worker_socket(&stack, &token).await;
        let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "worker.hello", "params": {
            "protocol": berth_protocol::PROTOCOL_VERSION, "host": "test-host",
            "workspaces": [{"name": "proj", "path": stack.workspace_dir.display().to_string()}]}});
        socket.send(Message::Text(hello.to_string().into())).await.unwrap();
        let reply = next_json(&mut socket).await;
        if reply["result"]["workspaces"][0]["workspaceId"].is_string() {
            connected = Some(socket);
            break;
        }
        assert_eq!(reply["error"]["data"]["reason"], "worker-running", "{reply}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(connected.is_some(), "the credential connects once the worker is gone");
}
