//! Tenants, credentials and the front door (issue 3).

use std::time::Duration;

use berth_e2e::{Client, MockProvider, Stack, TestServer, client::code, fresh_database, harness::eventually};
use serde_json::{Value, json};

/// Every method is classified: it takes an id (and is in the matrix) or it does not.
const NO_ID_METHODS: &[&str] = &[
    "hello",
    "ping",
    "status",
    "workspace.list",
    "admin.credential.list",
    "admin.user.list",
    "admin.user.create",
    "admin.status",
    "admin.audit.list",
    "admin.worker.list",
    "agent.list",
    // Named, not identified: another tenant's `mcp.save` of the same name saves its own.
    "mcp.list",
    "mcp.save",
];

#[tokio::test(flavor = "multi_thread")]
async fn another_tenants_ids_answer_exactly_like_missing_ids_and_change_nothing() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let mut a = stack.client(0).await;
    // Tenant A's objects: a session with history, a queued turn, a user, a credential.
    let sid = stack.session(&mut a).await;
    mock.push(berth_e2e::Reply::text(&["hello"]));
    let mut w = a.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let t1 = a.ok("session.send", json!({"sessionId": sid, "prompt": "hi"})).await;
    w.until(20, |i| i["type"] == "turn.ended").await.unwrap();
    stack.kill_worker().await;
    let queued = a.ok("session.send", json!({"sessionId": sid, "prompt": "later"})).await;
    let user = a.ok("admin.user.create", json!({"email": "member@example.com"})).await;
    let cred = a
        .ok("admin.credential.create", json!({"worker": true, "note": "a-worker"}))
        .await;
    let agent = a.ok("agent.save", json!({"name": "a-agent"})).await;
    let skill = a
        .ok(
            "skill.save",
            json!({"name": "a-skill", "summary": "A's", "body": "secret"}),
        )
        .await;
    a.ok(
        "mcp.save",
        json!({"name": "a-mcp", "transport": {"kind": "http", "url": "https://mcp.example/",
               "headers": {"authorization": "Bearer a-secret"}}}),
    )
    .await;
    let receipt_op = "op-of-a";
    a.ok(
        "session.rename",
        json!({"sessionId": sid, "title": "A's", "operationId": receipt_op}),
    )
    .await;
    let wsid = stack.workspace_id.clone();
    let pos = json!({"sourceSequence": 2, "itemIndex": 0});
    // A pending interaction of A's (written directly: this test's worker never asks).
    berth_e2e::harness::db(&stack.database_url)
        .await
        .execute(
            "INSERT INTO interactions (id, tenant_id, session_id, turn_id, call_id, kind, request, fallback, state, expires_at)
             SELECT 'int_of_a', tenant_id, id, $2, 'call', 'approval', '{\"input\": {}}', '{\"approved\": false}', 'pending',
                    now() + interval '1 hour' FROM sessions WHERE id = $1",
            &[&sid, &t1["turnId"].as_str().unwrap()],
        )
        .await
        .unwrap();
    // A patch of A's (its row, written directly: the workspace is no repository here).
    berth_e2e::harness::db(&stack.database_url)
        .await
        .execute(
            "INSERT INTO patches (id, tenant_id, session_id, files, bytes, sha256, object_key)
             SELECT 'pch_of_a', tenant_id, id, 0, 0, '', tenant_id || '/patches/pch_of_a' FROM sessions WHERE id = $1",
            &[&sid],
        )
        .await
        .unwrap();

    // An attachment of A's.
    let attachment = a
        .upload(
            json!({"sessionId": sid, "mime": "text/plain", "filename": "a.txt"}),
            b"A's",
            None,
        )
        .await
        .expect("content.upload");

    let b_token = stack.servers[0].tenant_b().await;
    let mut b = Client::authed(&stack.servers[0].ws_url(), &b_token).await.unwrap();

    let before = snapshot(&mut a, &sid).await;

    // method → (params naming A's objects, the same params with ids that exist nowhere).
    let q = queued["queueId"].clone();
    let matrix: Vec<(&str, Value, Value)> = vec![
        (
            "session.get",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "session.send",
            json!({"sessionId": sid, "prompt": "x"}),
            json!({"sessionId": "ses_random", "prompt": "x"}),
        ),
        (
            "content.read",
            json!({"attachmentId": attachment["attachmentId"]}),
            json!({"attachmentId": "att_random"}),
        ),
        (
            "content.upload",
            json!({"sessionId": sid, "mime": "text/plain", "filename": "b.txt"}),
            json!({"sessionId": "ses_random", "mime": "text/plain", "filename": "b.txt"}),
        ),
        (
            "session.history",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "session.watch",
            json!({"sessionId": sid, "after": 0}),
            json!({"sessionId": "ses_random", "after": 0}),
        ),
        (
            "session.rename",
            json!({"sessionId": sid, "title": "B"}),
            json!({"sessionId": "ses_random", "title": "B"}),
        ),
        (
            "session.setModel",
            json!({"sessionId": sid, "model": "m"}),
            json!({"sessionId": "ses_random", "model": "m"}),
        ),
        (
            "session.remove",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "session.clear",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "session.pause",
            json!({"sessionId": sid, "paused": true}),
            json!({"sessionId": "ses_random", "paused": true}),
        ),
        (
            "session.stop",
            json!({"sessionId": sid, "turnId": t1["turnId"]}),
            json!({"sessionId": "ses_random", "turnId": "trn_random"}),
        ),
        (
            "session.source",
            json!({"sessionId": sid, "position": pos, "field": "body"}),
            json!({"sessionId": "ses_random", "position": pos, "field": "body"}),
        ),
        (
            "session.diagnostics",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "session.watchDiagnostics",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "session.pendingInteractions",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "session.context",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "session.interaction",
            json!({"interactionId": "int_of_a"}),
            json!({"interactionId": "int_random"}),
        ),
        (
            "session.respond",
            json!({"interactionId": "int_of_a", "answer": {"approved": true}}),
            json!({"interactionId": "int_random", "answer": {"approved": true}}),
        ),
        (
            "session.create",
            json!({"workspaceId": wsid}),
            json!({"workspaceId": "wsp_random"}),
        ),
        (
            "session.list",
            json!({"workspaceId": wsid}),
            json!({"workspaceId": "wsp_random"}),
        ),
        (
            "workspace.get",
            json!({"workspaceId": wsid}),
            json!({"workspaceId": "wsp_random"}),
        ),
        (
            "workspace.rename",
            json!({"workspaceId": wsid, "title": "B's"}),
            json!({"workspaceId": "wsp_random", "title": "B's"}),
        ),
        (
            "workspace.remove",
            json!({"workspaceId": wsid}),
            json!({"workspaceId": "wsp_random"}),
        ),
        (
            "workspace.files",
            json!({"workspaceId": wsid, "prefix": ""}),
            json!({"workspaceId": "wsp_random", "prefix": ""}),
        ),
        (
            "git.status",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "git.diff",
            json!({"sessionId": sid, "path": {"bytesBase64": "YQ=="}, "area": "worktree"}),
            json!({"sessionId": "ses_random", "path": {"bytesBase64": "YQ=="}, "area": "worktree"}),
        ),
        (
            "patch.snapshot",
            json!({"sessionId": sid, "operationId": "snap-theirs"}),
            json!({"sessionId": "ses_random", "operationId": "snap-random"}),
        ),
        (
            "patch.read",
            json!({"patchId": "pch_of_a"}),
            json!({"patchId": "pch_random"}),
        ),
        (
            "files.list",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "files.watch",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "files.read",
            json!({"sessionId": sid, "path": {"bytesBase64": "YQ=="}}),
            json!({"sessionId": "ses_random", "path": {"bytesBase64": "YQ=="}}),
        ),
        (
            "queue.update",
            json!({"sessionId": sid, "queueId": q, "queueRevision": 0, "prompt": "B"}),
            json!({"sessionId": "ses_random", "queueId": "trn_random", "queueRevision": 0, "prompt": "B"}),
        ),
        (
            "queue.move",
            json!({"sessionId": sid, "queueId": q, "queueRevision": 0}),
            json!({"sessionId": "ses_random", "queueId": "trn_random", "queueRevision": 0}),
        ),
        (
            "queue.get",
            json!({"sessionId": sid, "queueId": q}),
            json!({"sessionId": "ses_random", "queueId": "trn_random"}),
        ),
        (
            "queue.remove",
            json!({"sessionId": sid, "queueId": q, "queueRevision": 0}),
            json!({"sessionId": "ses_random", "queueId": "trn_random", "queueRevision": 0}),
        ),
        (
            "operation.receipt",
            json!({"operationId": receipt_op}),
            json!({"operationId": "op-random"}),
        ),
        (
            "session.search",
            json!({"sessionId": sid, "query": "A"}),
            json!({"sessionId": "ses_random", "query": "A"}),
        ),
        (
            "session.fork",
            json!({"sessionId": sid, "sourceRevision": 0, "operationId": "fork-theirs"}),
            json!({"sessionId": "ses_random", "sourceRevision": 0, "operationId": "fork-random"}),
        ),
        (
            "session.forkReceipt",
            json!({"operationId": receipt_op}),
            json!({"operationId": "op-random"}),
        ),
        ("subscription.close", json!({"id": 1}), json!({"id": 4_000_000})),
        (
            "admin.credential.create",
            json!({"userId": user["userId"], "note": "x"}),
            json!({"userId": "usr_random", "note": "x"}),
        ),
        (
            "admin.credential.revoke",
            json!({"credentialId": cred["credentialId"]}),
            json!({"credentialId": "crd_random"}),
        ),
        (
            "admin.user.disable",
            json!({"userId": user["userId"]}),
            json!({"userId": "usr_random"}),
        ),
        (
            "admin.user.setRole",
            json!({"userId": user["userId"], "role": "admin"}),
            json!({"userId": "usr_random", "role": "admin"}),
        ),
        (
            "agent.get",
            json!({"agentId": agent["agentId"]}),
            json!({"agentId": "agt_random"}),
        ),
        (
            "agent.save",
            json!({"agentId": agent["agentId"], "name": "stolen"}),
            json!({"agentId": "agt_random", "name": "stolen"}),
        ),
        (
            "agent.remove",
            json!({"agentId": agent["agentId"]}),
            json!({"agentId": "agt_random"}),
        ),
        (
            "skill.list",
            json!({"workspaceId": wsid}),
            json!({"workspaceId": "wsp_random"}),
        ),
        (
            "skill.get",
            json!({"skillId": skill["skillId"]}),
            json!({"skillId": "skl_random"}),
        ),
        (
            "skill.save",
            json!({"skillId": skill["skillId"], "name": "stolen", "summary": "s", "body": "b"}),
            json!({"skillId": "skl_random", "name": "stolen", "summary": "s", "body": "b"}),
        ),
        (
            "skill.remove",
            json!({"skillId": skill["skillId"]}),
            json!({"skillId": "skl_random"}),
        ),
        ("mcp.remove", json!({"name": "a-mcp"}), json!({"name": "mcp-random"})),
        (
            "session.compact",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
        (
            "session.setAgent",
            json!({"sessionId": sid}),
            json!({"sessionId": "ses_random"}),
        ),
    ];

    let mut covered: Vec<&str> = matrix.iter().map(|(m, _, _)| *m).collect();
    covered.extend_from_slice(NO_ID_METHODS);
    covered.sort();
    let mut all = berth_protocol::METHOD_NAMES.to_vec();
    all.sort();
    assert_eq!(
        covered, all,
        "every method is either in the id matrix or declared id-free"
    );

    for (method, theirs, random) in &matrix {
        let got_theirs = call_any(&mut b, method, theirs.clone()).await;
        let got_random = call_any(&mut b, method, random.clone()).await;
        assert_eq!(
            got_theirs, got_random,
            "{method}: another tenant's id must look missing"
        );
    }
    // B saving a server of the same name saves B's own.
    b.ok(
        "mcp.save",
        json!({"name": "a-mcp", "transport": {"kind": "stdio", "command": "b-server"}}),
    )
    .await;
    assert_eq!(snapshot(&mut a, &sid).await, before, "nothing of tenant A changed");
    // A's credential still works, and B sees none of A's things in lists.
    assert_eq!(b.ok("workspace.list", json!({})).await, json!([]));
    assert_eq!(b.ok("session.list", json!({})).await["entries"], json!([]));
    assert_eq!(b.ok("agent.list", json!({})).await, json!([]));
    assert_eq!(b.ok("skill.list", json!({})).await, json!({"skills": []}));
    let b_mcp = b.ok("mcp.list", json!({})).await;
    assert_eq!(b_mcp.as_array().unwrap().len(), 1, "{b_mcp}");
    assert_eq!(b_mcp[0]["transport"]["kind"], "stdio", "{b_mcp}");
    let b_creds = b.ok("admin.credential.list", json!({})).await;
    assert!(
        b_creds
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["credentialId"] != cred["credentialId"])
    );
    let b_workers = b.ok("admin.worker.list", json!({})).await;
    assert!(
        b_workers
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["credentialId"] != cred["credentialId"]),
        "{b_workers}"
    );
    // B's audit log holds B's actions only; A's log has A's.
    let b_audit = b.ok("admin.audit.list", json!({})).await;
    for e in b_audit["entries"].as_array().unwrap() {
        assert!(
            e["target"] != cred["credentialId"] && e["target"] != user["userId"],
            "{e}"
        );
    }
    let a_audit = a.ok("admin.audit.list", json!({})).await;
    assert!(
        a_audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "credential.create" && e["target"] == cred["credentialId"]),
        "{a_audit}"
    );
}

/// What tenant A can see of its own state (to check that tenant B changed nothing).
async fn snapshot(a: &mut Client, sid: &str) -> Value {
    let mut s = a.ok("session.get", json!({"sessionId": sid})).await;
    s.as_object_mut().unwrap().remove("updatedAt");
    let h = a.ok("session.history", json!({"sessionId": sid})).await;
    let mut creds = a.ok("admin.credential.list", json!({})).await;
    for c in creds.as_array_mut().unwrap() {
        c.as_object_mut().unwrap().remove("lastUsedAt");
    }
    let users = a.ok("admin.user.list", json!({})).await;
    let ws = a.ok("workspace.list", json!({})).await;
    let agents = a.ok("agent.list", json!({})).await;
    let skills = a.ok("skill.list", json!({})).await;
    let mcp = a.ok("mcp.list", json!({})).await;
    json!([s, h, creds, users, ws, agents, skills, mcp])
}

/// A call's outcome as comparable JSON: the result, or the error (subscriptions: their end).
async fn call_any(c: &mut Client, method: &str, params: Value) -> Value {
    if method == "session.watch" || method == "session.watchDiagnostics" {
        let mut sub = c.subscribe(method, params);
        let done = tokio::time::timeout(Duration::from_secs(10), &mut sub.done)
            .await
            .unwrap()
            .unwrap();
        return json!({"result": done.result, "error": done.error});
    }
    let outcome = if method == "content.upload" {
        c.upload(params, b"from tenant b", None).await
    } else {
        c.call(method, params).await
    };
    match outcome {
        Ok(v) => json!({"result": v}),
        Err(e) => json!({"error": e}),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn row_level_security_admits_only_the_transactions_tenant() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut a = stack.client(0).await;
    let sid = stack.session(&mut a).await;
    let b_token = stack.servers[0].tenant_b().await;
    let _ = b_token;
    let client = berth_e2e::harness::db(&stack.database_url).await;
    let tenant_a: String = client
        .query_one("SELECT tenant_id FROM sessions WHERE id = $1", &[&sid])
        .await
        .unwrap()
        .get(0);
    let tenant_b: String = client
        .query_one("SELECT id FROM tenants WHERE name = 'tenant-b'", &[])
        .await
        .unwrap()
        .get(0);
    let count_as = |tenant: Option<String>| {
        let client = &client;
        async move {
            client.batch_execute("BEGIN").await.unwrap();
            client
                .execute("SELECT set_config('role', 'berth_app', true)", &[])
                .await
                .unwrap();
            if let Some(t) = tenant {
                client
                    .execute("SELECT set_config('berth.tenant_id', $1, true)", &[&t])
                    .await
                    .unwrap();
            }
            let n: i64 = client
                .query_one("SELECT count(*) FROM sessions", &[])
                .await
                .unwrap()
                .get(0);
            let e: i64 = client
                .query_one("SELECT count(*) FROM events", &[])
                .await
                .unwrap()
                .get(0);
            client.batch_execute("ROLLBACK").await.unwrap();
            (n, e)
        }
    };
    assert_eq!(count_as(Some(tenant_a.clone())).await.0, 1);
    assert!(count_as(Some(tenant_a.clone())).await.1 >= 1);
    assert_eq!(
        count_as(Some(tenant_b.clone())).await,
        (0, 0),
        "tenant B sees none of A's rows"
    );
    assert_eq!(count_as(None).await, (0, 0), "no tenant set: no rows");
    // Writing another tenant's rows is refused by the policy.
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute("SELECT set_config('role', 'berth_app', true)", &[])
        .await
        .unwrap();
    client
        .execute("SELECT set_config('berth.tenant_id', $1, true)", &[&tenant_b])
        .await
        .unwrap();
    let err = client
        .execute("UPDATE sessions SET title = 'stolen' WHERE id = $1", &[&sid])
        .await
        .unwrap();
    assert_eq!(err, 0, "A's session is invisible to B's transaction");
    let insert = client
        .execute(
            "INSERT INTO sessions (id, tenant_id, workspace_id) VALUES ('ses_evil', $1, $2)",
            &[&tenant_a, &stack.workspace_id],
        )
        .await;
    assert!(insert.is_err(), "inserting a row of another tenant violates the policy");
    client.batch_execute("ROLLBACK").await.unwrap();
    // The app role owns nothing and cannot bypass policies.
    let row = client
        .query_one(
            "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = 'berth_app'",
            &[],
        )
        .await
        .unwrap();
    assert!(!row.get::<_, bool>(0) && !row.get::<_, bool>(1));
    let forced: bool = client
        .query_one(
            "SELECT relforcerowsecurity FROM pg_class WHERE relname = 'sessions'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(forced);
    // Every table that holds tenant data forces its policies (new tables included).
    let unforced: Vec<String> = client
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'public' AND c.relkind = 'r' AND NOT c.relforcerowsecurity
                AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'tenant_id')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        unforced,
        Vec::<String>::new(),
        "tables with tenant data but no forced policy"
    );
}

/// What holds no tenant's rows is the owner role's: `berth_app` cannot read the cluster
/// secret, and reads the replicas' internal addresses (a worker call's route is read under
/// the tenant's role) but cannot write them, so no tenant-scoped transaction can point
/// another replica's worker calls elsewhere. Routing still works through the other replica.
#[tokio::test(flavor = "multi_thread")]
async fn the_app_role_reads_the_replicas_but_cannot_write_them() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let client = berth_e2e::harness::db(&stack.database_url).await;
    let may = |table: &'static str, privilege: &'static str| {
        let client = &client;
        async move {
            client
                .query_one("SELECT has_table_privilege('berth_app', $1, $2)", &[&table, &privilege])
                .await
                .unwrap()
                .get::<_, bool>(0)
        }
    };
    assert!(may("replicas", "SELECT").await);
    for privilege in ["INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"] {
        assert!(!may("replicas", privilege).await, "berth_app may {privilege} replicas");
    }
    assert!(!may("cluster_secret", "SELECT").await);
    // As a tenant-scoped transaction runs it: the write is refused.
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute("SELECT set_config('role', 'berth_app', true)", &[])
        .await
        .unwrap();
    let seen: i64 = client
        .query_one("SELECT count(*) FROM replicas", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 2, "both replicas announced themselves");
    let err = client
        .execute("UPDATE replicas SET internal_url = 'http://attacker.invalid'", &[])
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
    );
    client.batch_execute("ROLLBACK").await.unwrap();
    // A worker call through the replica that does not hold the worker still finds its route.
    let mut c = stack.client(1).await;
    let sid = stack.session(&mut c).await;
    let status = c.ok("git.status", json!({"sessionId": sid})).await;
    assert_eq!(status, Value::Null, "the workspace is no repository");
}

#[tokio::test(flavor = "multi_thread")]
async fn revocation_closes_connections_on_another_replica_within_two_seconds() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut admin = stack.client(0).await;
    let user = admin
        .ok(
            "admin.user.create",
            json!({"email": "dev@example.com", "password": "correct horse battery"}),
        )
        .await;
    let cred = admin
        .ok(
            "admin.credential.create",
            json!({"userId": user["userId"], "note": "laptop"}),
        )
        .await;
    let token = cred["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("berth_"));
    // The plaintext is shown once: lists never carry it.
    let listed = admin.ok("admin.credential.list", json!({})).await;
    assert!(!listed.to_string().contains(&token));
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["credentialId"] == cred["credentialId"])
        .unwrap();
    assert_eq!(entry["note"], "laptop");
    assert_eq!(entry["kind"], "user");

    let url_b = stack.servers[1].ws_url();
    let mut on_b = Client::connect_with(&url_b, Some(&token), None).await.unwrap();
    assert_eq!(on_b.ok("ping", json!({})).await["pong"], true);
    // Last use is recorded (at most once a minute).
    let listed = admin.ok("admin.credential.list", json!({})).await;
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["credentialId"] == cred["credentialId"])
        .unwrap()
        .clone();
    assert!(entry["lastUsedAt"].is_string(), "{entry}");
    let _again = Client::connect_with(&url_b, Some(&token), None).await.unwrap();
    let listed = admin.ok("admin.credential.list", json!({})).await;
    let again = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["credentialId"] == cred["credentialId"])
        .unwrap()
        .clone();
    assert_eq!(
        again["lastUsedAt"], entry["lastUsedAt"],
        "not rewritten within a minute"
    );
    let revoked = admin
        .ok("admin.credential.revoke", json!({"credentialId": cred["credentialId"]}))
        .await;
    assert_eq!(revoked["revoked"], true);
    let closed = eventually(2, || {
        let closed = on_b.is_closed();
        async move { closed.then_some(()) }
    })
    .await;
    assert!(
        closed.is_some(),
        "the revoked credential's connection on the other replica closes within 2 s"
    );
    assert_eq!(*on_b.closed.lock().unwrap(), Some(Some(1008)));
    let err = Client::connect_with(&url_b, Some(&token), None)
        .await
        .err()
        .expect("refused");
    assert!(format!("{err:#}").contains("401"));

    // Disabling a user closes their signed-in (JWT) connections too.
    let login = login(&stack.servers[1], "default", "dev@example.com", "correct horse battery").await;
    assert_eq!(login.0, 200, "{}", login.1);
    let jwt = login.1["token"].as_str().unwrap().to_string();
    let mut jwt_client = Client::connect(&url_b).await.unwrap();
    let hello = jwt_client.hello(&jwt).await.unwrap();
    assert_eq!(hello["userId"], user["userId"]);
    admin.ok("admin.user.disable", json!({"userId": user["userId"]})).await;
    let closed = eventually(2, || {
        let closed = jwt_client.is_closed();
        async move { closed.then_some(()) }
    })
    .await;
    assert!(closed.is_some(), "the disabled user's connection closes within 2 s");
    let mut fresh = Client::connect(&url_b).await.unwrap();
    assert_eq!(code(&fresh.hello(&jwt).await.unwrap_err()), "unauthorized");
    assert_eq!(
        login_status(&stack.servers[0], "default", "dev@example.com", "correct horse battery").await,
        401
    );

    // Revoking a worker credential disconnects the worker: its workspace goes offline.
    let creds = admin.ok("admin.credential.list", json!({})).await;
    let worker_cred = creds
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "worker")
        .unwrap()
        .clone();
    admin
        .ok(
            "admin.credential.revoke",
            json!({"credentialId": worker_cred["credentialId"]}),
        )
        .await;
    let offline = eventually(5, || {
        let (url, token) = (stack.servers[0].ws_url(), stack.token.clone());
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            let list = c.ok("workspace.list", json!({})).await;
            (list[0]["online"] == false).then_some(())
        }
    })
    .await;
    assert!(offline.is_some(), "the revoked worker is disconnected");
    // Every administration action is audited, without secrets.
    let client = berth_e2e::harness::db(&stack.database_url).await;
    let rows = client
        .query("SELECT actor, action, target FROM audit_log ORDER BY id", &[])
        .await
        .unwrap();
    let actions: Vec<String> = rows.iter().map(|r| r.get::<_, String>(1)).collect();
    for a in ["user.create", "credential.create", "credential.revoke", "user.disable"] {
        assert!(actions.iter().any(|x| x == a), "{a} audited: {actions:?}");
    }
    let dump: String = rows
        .iter()
        .map(|r| format!("{}{}", r.get::<_, String>(0), r.get::<_, String>(2)))
        .collect();
    assert!(!dump.contains(&token) && !dump.contains("correct horse"));
}

async fn login(server: &TestServer, tenant: &str, email: &str, password: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/auth/login", server.addr))
        .json(&json!({"tenant": tenant, "email": email, "password": password}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn login_status(server: &TestServer, tenant: &str, email: &str, password: &str) -> u16 {
    login(server, tenant, email, password).await.0
}

fn sign(secret: &[u8], alg: jsonwebtoken::Algorithm, claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(alg),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn passwords_jwts_and_their_rejections() {
    use base64::Engine as _;
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let server = TestServer::start(&db, &mock.base_url()).await.unwrap();
    let mut admin = Client::authed(&server.ws_url(), &server.admin_token()).await.unwrap();
    let user = admin
        .ok(
            "admin.user.create",
            json!({"email": "Person@Example.com", "password": "pw-secret-long-enough", "role": "member"}),
        )
        .await;
    assert_eq!(user["hasPassword"], true);
    // argon2id with OWASP parameters at rest.
    let client = berth_e2e::harness::db(&db).await;
    let hash: String = client
        .query_one(
            "SELECT password_hash FROM users WHERE id = $1",
            &[&user["userId"].as_str().unwrap()],
        )
        .await
        .unwrap()
        .get(0);
    assert!(hash.starts_with("$argon2id$"));
    assert_eq!(berth_api::auth::argon2_params_of(&hash), Some((19456, 2, 1)));
    assert!(!hash.contains("pw-secret"));

    let (status, body) = login(&server, "default", "person@example.com", "pw-secret-long-enough").await;
    assert_eq!(status, 200, "{body}");
    let jwt = body["token"].as_str().unwrap().to_string();
    let mut c = Client::connect_with(&server.ws_url(), Some(&jwt), None).await.unwrap();
    assert_eq!(c.ok("ping", json!({})).await["pong"], true);
    // A member is not an admin.
    assert_eq!(
        code(&c.call("admin.user.list", json!({})).await.unwrap_err()),
        "forbidden"
    );
    assert_eq!(
        code(
            &c.call("admin.credential.create", json!({"worker": true}))
                .await
                .unwrap_err()
        ),
        "forbidden"
    );

    let secret = std::fs::read_to_string(server.data_dir.join("run/jwt-secret"))
        .unwrap()
        .trim()
        .to_string();
    let now = chrono_now();
    let claims = |exp: i64| json!({"sub": user["userId"], "tid": body["tenantId"], "role": "admin", "iat": now, "exp": exp, "jti": "j1"});
    let good = sign(secret.as_bytes(), jsonwebtoken::Algorithm::HS256, &claims(now + 600));
    let wrong_key = sign(
        b"another-secret-that-is-long-enough-0123456789",
        jsonwebtoken::Algorithm::HS256,
        &claims(now + 600),
    );
    let expired = sign(secret.as_bytes(), jsonwebtoken::Algorithm::HS256, &claims(now - 600));
    let hs512 = sign(secret.as_bytes(), jsonwebtoken::Algorithm::HS512, &claims(now + 600));
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let none = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims(now + 600))
    );
    let parts: Vec<&str> = good.split('.').collect();
    let mut forged = claims(now + 600);
    forged["sub"] = json!("usr_someone_else");
    let tampered = format!("{}.{}.{}", parts[0], b64(&forged), parts[2]);
    // The role in a token is not trusted: the database says member.
    let mut g = Client::connect_with(&server.ws_url(), Some(&good), None).await.unwrap();
    assert_eq!(
        code(&g.call("admin.user.list", json!({})).await.unwrap_err()),
        "forbidden"
    );
    for (name, bad) in [
        ("wrong key", &wrong_key),
        ("expired", &expired),
        ("HS512", &hs512),
        ("alg none", &none),
        ("tampered", &tampered),
    ] {
        let err = Client::connect_with(&server.ws_url(), Some(bad), None)
            .await
            .err()
            .unwrap_or_else(|| panic!("{name} accepted"));
        assert!(format!("{err:#}").contains("401"), "{name}: {err:#}");
        let mut h = Client::connect(&server.ws_url()).await.unwrap();
        assert_eq!(code(&h.hello(bad).await.unwrap_err()), "unauthorized", "{name}");
    }

    // Wrong passwords, unknown accounts: 401 alike; then the account is rate limited.
    assert_eq!(
        login_status(&server, "default", "nobody@example.com", "whatever-password").await,
        401
    );
    // Five attempts, then one per 12 s: attempts until the first 429 (each refused one costs
    // an argon2 hash, which on a loaded machine may be slow enough for a refill in between).
    let mut statuses = Vec::new();
    while statuses.len() < 20 && statuses.last() != Some(&429) {
        statuses.push(login_status(&server, "default", "person@example.com", "wrong-password-123").await);
    }
    assert!(statuses.starts_with(&[401, 401, 401, 401, 401]), "{statuses:?}");
    assert_eq!(*statuses.last().unwrap(), 429, "{statuses:?}");
    let (status, body) = login(&server, "default", "person@example.com", "pw-secret-long-enough").await;
    assert_eq!(status, 429);
    assert_eq!(body["error"]["code"], "rate-limited");

    // The account's sign-ins, both kinds, are in the tenant's audit log, with nothing
    // presented in them; an unknown account's attempt has no tenant to be logged in.
    // (A failed one is written after the answer: read until all are there.)
    let refused = statuses.iter().filter(|s| **s == 401).count();
    let count = |audit: &Value, action: &str| {
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["action"] == action && e["target"] == user["userId"])
            .count()
    };
    let mut audit = Value::Null;
    for _ in 0..100 {
        audit = admin.ok("admin.audit.list", json!({"limit": 100})).await;
        if count(&audit, "login.failed") >= refused {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let of_user = |action: &str| count(&audit, action);
    assert_eq!(of_user("login"), 1, "{audit}");
    assert_eq!(of_user("login.failed"), refused, "{audit}");
    assert!(!audit.to_string().contains("pw-secret") && !audit.to_string().contains("wrong-password"));
    assert!(!audit.to_string().contains("nobody@example.com"));

    // Nothing secret reached the log.
    let log = std::fs::read_to_string(&server.log).unwrap();
    for secret_text in [
        jwt.as_str(),
        "pw-secret-long-enough",
        server.admin_token().as_str(),
        secret.as_str(),
    ] {
        assert!(!log.contains(secret_text), "a secret reached the log");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_accounts_sign_in_attempts_are_counted_across_replicas_and_tenant_spellings() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut admin = stack.client(0).await;
    admin
        .ok(
            "admin.user.create",
            json!({"email": "person@example.com", "password": "pw-secret-long-enough", "role": "member"}),
        )
        .await;
    let tenant_id: String = berth_e2e::harness::db(&stack.database_url)
        .await
        .query_one("SELECT id FROM tenants WHERE name = 'default'", &[])
        .await
        .unwrap()
        .get(0);
    // Each replica's own limit allows five attempts for each spelling of the tenant: taking
    // turns over two replicas and two spellings, twenty wrong passwords would be answered.
    // The account has five, then one every 12 s wherever they are sent (an attempt costs an
    // argon2 hash, so allow a refill or two on a loaded machine).
    let mut statuses = Vec::new();
    while statuses.len() < 20 && statuses.last() != Some(&429) {
        let n = statuses.len();
        let tenant = if n % 2 == 0 { "default" } else { tenant_id.as_str() };
        let server = &stack.servers[(n / 2) % 2];
        statuses.push(login_status(server, tenant, "Person@Example.com", "wrong-password-123").await);
    }
    assert!(statuses.starts_with(&[401, 401, 401, 401, 401]), "{statuses:?}");
    assert_eq!(*statuses.last().unwrap(), 429, "{statuses:?}");
    assert!(statuses.len() <= 8, "{statuses:?}");
    // The right password is refused too, on either replica and either spelling, until the
    // bucket refills.
    for server in &stack.servers {
        for tenant in ["default", tenant_id.as_str()] {
            let (status, body) = login(server, tenant, "person@example.com", "pw-secret-long-enough").await;
            assert_eq!(status, 429, "{body}");
            assert_eq!(body["error"]["code"], "rate-limited");
            assert!(body["error"]["retryAfterSecs"].as_u64().unwrap() >= 1, "{body}");
        }
    }
    // Another account of the tenant is not held back by it.
    assert_eq!(
        login_status(&stack.servers[1], &tenant_id, "nobody@example.com", "whatever-password").await,
        401
    );
}

fn chrono_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_answer_with_typed_errors_and_others_keep_being_served() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let env = [
        ("BERTH_MAX_TEXT_MESSAGE", "65536"),
        ("BERTH_MAX_JSON_DEPTH", "32"),
        ("BERTH_RATE_PER_SEC", "20"),
        ("BERTH_RATE_BURST", "20"),
        ("BERTH_MAX_CONNECTIONS_PER_CREDENTIAL", "4"),
    ];
    let server = TestServer::start_with(&db, &mock.base_url(), &env).await.unwrap();
    let admin_token = server.admin_token();
    let mut admin = Client::authed(&server.ws_url(), &admin_token).await.unwrap();
    let me = admin.ok("hello", json!({"protocol": 1})).await;
    let other = admin
        .ok(
            "admin.credential.create",
            json!({"userId": me["userId"], "note": "other"}),
        )
        .await;
    let other_token = other["token"].as_str().unwrap().to_string();

    // Deep JSON: a typed error; the connection stays open.
    let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
    admin.send_raw(&deep);
    let resp = tokio::time::timeout(Duration::from_secs(10), admin.orphans.recv())
        .await
        .unwrap()
        .unwrap();
    let err = resp.error.unwrap();
    assert_eq!(err.data_code(), Some("payload-too-large"));
    assert_eq!(err.data["limit"], "depth");
    assert_eq!(admin.ok("ping", json!({})).await["pong"], true);

    // A flood: rate-limited answers, and another credential is still served.
    let mut flood = Client::authed(&server.ws_url(), &admin_token).await.unwrap();
    let mut limited = 0;
    let mut tasks = Vec::new();
    for _ in 0..60 {
        tasks.push(flood.call("ping", json!({})).await);
    }
    for r in tasks {
        if let Err(e) = r {
            assert_eq!(code(&e), "rate-limited");
            assert!(e.data["retryAfterMs"].as_u64().unwrap() >= 1);
            limited += 1;
        }
    }
    assert!(limited > 0, "the flood was limited");
    let mut bystander = Client::authed(&server.ws_url(), &other_token).await.unwrap();
    assert_eq!(bystander.ok("ping", json!({})).await["pong"], true);

    // Connections per credential.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            Client::connect_with(&server.ws_url(), Some(&other_token), None)
                .await
                .unwrap(),
        );
    }
    held.push(
        Client::connect_with(&server.ws_url(), Some(&other_token), None)
            .await
            .unwrap(),
    );
    let err = Client::connect_with(&server.ws_url(), Some(&other_token), None)
        .await
        .err()
        .expect("too many");
    assert!(format!("{err:#}").contains("429"), "{err:#}");

    // An oversized message closes the connection with 1009; the server keeps serving.
    let big = Client::authed(&server.ws_url(), &admin_token).await.unwrap();
    big.send_raw(&format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"params\":{{\"pad\":\"{}\"}}}}",
        "x".repeat(100_000)
    ));
    let closed = eventually(5, || {
        let c = *big.closed.lock().unwrap();
        async move { c }
    })
    .await;
    assert_eq!(closed, Some(Some(1009)));
    assert_eq!(bystander.ok("status", json!({})).await["protocol"], 1);
    assert_eq!(server.get("/healthz").await.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_credentials_and_idle_connections_are_refused() {
    let mock = MockProvider::start().await;
    let db = fresh_database().await;
    let env = [("BERTH_WS_PING_SECS", "1"), ("BERTH_WS_IDLE_SECS", "2")];
    let server = TestServer::start_with(&db, &mock.base_url(), &env).await.unwrap();
    let mut admin = Client::authed(&server.ws_url(), &server.admin_token()).await.unwrap();
    let me = admin.ok("hello", json!({"protocol": 1})).await;
    let past = admin
        .ok(
            "admin.credential.create",
            json!({"userId": me["userId"], "note": "old", "expiresAt": "2020-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(past["expiresAt"], "2020-01-01T00:00:00.000Z");
    let err = Client::connect_with(&server.ws_url(), Some(past["token"].as_str().unwrap()), None)
        .await
        .err();
    assert!(format!("{:#}", err.expect("expired")).contains("401"));
    let bad = admin
        .call(
            "admin.credential.create",
            json!({"worker": true, "expiresAt": "tomorrow"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&bad), "bad-params");
    // A peer that stops answering pings is closed as idle; one that reads stays.
    let stalled = Client::authed(&server.ws_url(), &server.admin_token()).await.unwrap();
    stalled.pause_reading(true);
    tokio::time::sleep(Duration::from_secs(5)).await;
    stalled.pause_reading(false);
    let closed = eventually(5, || {
        let c = *stalled.closed.lock().unwrap();
        async move { c }
    })
    .await;
    // The close frame (1000, "idle") may be lost: the stalled peer's late pong replies meet
    // a socket the server already dropped. That the server closed it is what counts.
    assert!(
        matches!(closed, Some(Some(1000)) | Some(None)),
        "closed as idle: {closed:?}"
    );
    assert_eq!(
        admin.ok("ping", json!({})).await["pong"],
        true,
        "a live peer answers pings and stays"
    );
}

/// A worker credential serves one host: another credential cannot take over that host's
/// workspaces while the first is live; rotating (revoke the old one) hands it over.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_credential_cannot_take_over_another_hosts_workspaces() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut admin = stack.client(0).await;
    let second = admin
        .ok("admin.credential.create", json!({"worker": true, "note": "intruder"}))
        .await;
    let token = second["token"].as_str().unwrap();
    let elsewhere = berth_e2e::harness::scratch_dir("elsewhere");
    let intruder = berth_e2e::TestWorker::start(&stack.servers[0], token, "proj", &elsewhere)
        .await
        .unwrap();
    let refused = eventually(10, || async {
        let log = std::fs::read_to_string(&intruder.log).unwrap_or_default();
        log.contains("refused").then_some(())
    })
    .await;
    assert!(refused.is_some(), "the second credential is refused for the bound host");
    let list = admin.ok("workspace.list", json!({})).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(
        list[0]["path"],
        stack.workspace_dir.canonicalize().unwrap().display().to_string(),
        "path unchanged"
    );

    // Rotation: revoke the first credential; the second one now serves the host.
    let creds = admin.ok("admin.credential.list", json!({})).await;
    let first = creds
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "worker" && c["note"] != "intruder")
        .unwrap()
        .clone();
    admin
        .ok(
            "admin.credential.revoke",
            json!({"credentialId": first["credentialId"]}),
        )
        .await;
    let moved = eventually(30, || {
        let (url, token) = (stack.servers[0].ws_url(), stack.token.clone());
        let path = elsewhere.canonicalize().unwrap().display().to_string();
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            let list = c.ok("workspace.list", json!({})).await;
            (list[0]["online"] == true && list[0]["path"] == path.as_str()).then_some(())
        }
    })
    .await;
    assert!(
        moved.is_some(),
        "after rotation the new credential serves the workspace"
    );
}

/// Disabling the tenant's last enabled admin is refused as demoting them is
/// (`conflict {reason: "last-admin"}`): the tenant would have no one to administer it.
/// With another enabled admin, either may be disabled.
#[tokio::test(flavor = "multi_thread")]
async fn the_last_enabled_admin_cannot_be_disabled() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let url = stack.servers[0].ws_url();
    let mut admin = stack.client(0).await;
    let me = admin.ok("hello", json!({"protocol": 1, "token": stack.token})).await;
    let enabled = |users: &Value, id: &Value| {
        let user = users.as_array().unwrap().iter().find(|u| &u["userId"] == id).unwrap();
        user["disabled"] == false
    };
    let err = admin
        .call("admin.user.disable", json!({"userId": me["userId"]}))
        .await
        .unwrap_err();
    assert_eq!(code(&err), "conflict");
    assert_eq!(err.data["reason"], "last-admin");
    let users = admin.ok("admin.user.list", json!({})).await;
    assert!(enabled(&users, &me["userId"]), "{users}");

    // A member is no admin: the bootstrap admin stays the last one.
    let member = admin
        .ok("admin.user.create", json!({"email": "member@example.com"}))
        .await;
    admin
        .ok("admin.user.disable", json!({"userId": member["userId"]}))
        .await;
    let err = admin
        .call("admin.user.disable", json!({"userId": me["userId"]}))
        .await
        .unwrap_err();
    assert_eq!((code(&err), &err.data["reason"]), ("conflict", &json!("last-admin")));

    // With a second enabled admin, the first may go; then the second is the last.
    let second = admin
        .ok(
            "admin.user.create",
            json!({"email": "second@example.com", "role": "admin"}),
        )
        .await;
    let cred = admin
        .ok(
            "admin.credential.create",
            json!({"userId": second["userId"], "note": "second admin"}),
        )
        .await;
    let mut other = Client::authed(&url, cred["token"].as_str().unwrap()).await.unwrap();
    other.ok("admin.user.disable", json!({"userId": me["userId"]})).await;
    let err = other
        .call("admin.user.disable", json!({"userId": second["userId"]}))
        .await
        .unwrap_err();
    assert_eq!((code(&err), &err.data["reason"]), ("conflict", &json!("last-admin")));
    let users = other.ok("admin.user.list", json!({})).await;
    assert!(!enabled(&users, &me["userId"]), "{users}");
    assert!(enabled(&users, &second["userId"]), "{users}");
}

/// `admin.user.setRole` changes what a user may do, closing their live connections so that
/// none keeps the old role, and never demotes the last admin; `admin.audit.list` pages the
/// audited actions newest first; `admin.worker.list` shows where each worker is connected.
#[tokio::test(flavor = "multi_thread")]
async fn roles_change_with_their_connections_the_audit_log_pages_and_workers_show_their_replica() {
    let mock = MockProvider::start().await;
    let mut stack = Stack::start(&mock, 1).await;
    let url = stack.servers[0].ws_url();
    let mut admin = stack.client(0).await;
    let me = admin.ok("hello", json!({"protocol": 1, "token": stack.token})).await;
    let user = admin
        .ok("admin.user.create", json!({"email": "role@example.com"}))
        .await;
    let cred = admin
        .ok(
            "admin.credential.create",
            json!({"userId": user["userId"], "note": "role"}),
        )
        .await;
    let token = cred["token"].as_str().unwrap().to_string();
    let mut member = Client::authed(&url, &token).await.unwrap();
    assert_eq!(
        code(&member.call("admin.user.list", json!({})).await.unwrap_err()),
        "forbidden"
    );

    let promoted = admin
        .ok("admin.user.setRole", json!({"userId": user["userId"], "role": "admin"}))
        .await;
    assert_eq!(promoted["role"], "admin");
    let closed = eventually(5, || {
        let closed = member.is_closed();
        async move { closed.then_some(()) }
    })
    .await;
    assert!(closed.is_some(), "the member's connection closes with the role change");
    let mut again = Client::authed(&url, &token).await.unwrap();
    let hello = again.ok("hello", json!({"protocol": 1, "token": token})).await;
    assert_eq!(hello["role"], "admin");
    again.ok("admin.user.list", json!({})).await;

    assert_eq!(
        code(
            &admin
                .call("admin.user.setRole", json!({"userId": user["userId"], "role": "owner"}))
                .await
                .unwrap_err()
        ),
        "bad-params"
    );
    admin
        .ok(
            "admin.user.setRole",
            json!({"userId": user["userId"], "role": "member"}),
        )
        .await;
    // The bootstrap admin is now the only admin: demoting them would lock the tenant out.
    let err = admin
        .call("admin.user.setRole", json!({"userId": me["userId"], "role": "member"}))
        .await
        .unwrap_err();
    assert_eq!(code(&err), "conflict");
    assert_eq!(err.data["reason"], "last-admin");
    let users = admin.ok("admin.user.list", json!({})).await;
    let boot = users
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["userId"] == me["userId"])
        .unwrap();
    assert_eq!(boot["role"], "admin");

    // The audit log, newest first, one entry a page, walked to its end.
    let all = admin.ok("admin.audit.list", json!({})).await;
    let entries = all["entries"].as_array().unwrap();
    let actions: Vec<&str> = entries.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(
        &actions[..4],
        ["user.role", "user.role", "credential.create", "user.create"],
        "{all}"
    );
    assert_eq!(entries[0]["target"], user["userId"]);
    assert_eq!(entries[0]["actor"], me["userId"]);
    let mut walked = Vec::new();
    let mut before = Value::Null;
    loop {
        let page = admin
            .ok("admin.audit.list", json!({"limit": 1, "before": before}))
            .await;
        walked.extend(page["entries"].as_array().unwrap().iter().cloned());
        match page.get("nextBefore") {
            Some(n) => before = n.clone(),
            None => break,
        }
    }
    assert_eq!(&walked, entries);
    assert_eq!(
        code(&admin.call("admin.audit.list", json!({"limit": 0})).await.unwrap_err()),
        "bad-params"
    );

    // Workers: online on this replica, with the workspace of their host; then offline.
    let workers = admin.ok("admin.worker.list", json!({})).await;
    let w = &workers.as_array().unwrap()[0];
    assert_eq!(w["online"], true, "{workers}");
    assert_eq!(w["replicaId"], me["replicaId"]);
    assert_eq!(w["workspaceIds"], json!([stack.workspace_id]));
    assert!(w["host"].is_string() && w["lastSeenAt"].is_string(), "{w}");
    stack.kill_worker().await;
    let offline = eventually(20, || {
        let url = url.clone();
        let token = stack.token.clone();
        async move {
            let mut c = Client::authed(&url, &token).await.ok()?;
            let workers = c.ok("admin.worker.list", json!({})).await;
            let w = workers.as_array()?[0].clone();
            (w["online"] == false).then_some(w)
        }
    })
    .await
    .expect("the worker shows offline");
    assert!(offline.get("replicaId").is_none(), "{offline}");
    assert!(offline["lastSeenAt"].is_string(), "{offline}");
    assert_eq!(offline["workspaceIds"], json!([stack.workspace_id]));
}
