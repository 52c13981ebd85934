//! Object storage and attachments (issue 12), against real processes: the local directory
//! store always, and a real S3-compatible server when `.ci/run` started one
//! (`BERTH_TEST_S3_ENDPOINT`; without it the S3 tests say they were skipped and why).

use base64::Engine;
use berth_api::blobs::{Blobs, bytes_counter};
use berth_e2e::{
    Client, MockProvider, Reply, Stack, TestServer,
    client::code,
    harness::{db, eventually, statements_wait_on_locks},
};
use bytes::Bytes;
use futures_util::TryStreamExt;
use rand::RngCore;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::time::Duration;

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// The S3 server's settings for a fresh bucket, or None (after saying why) outside CI.
async fn s3_settings(test: &str) -> Option<Vec<(String, String)>> {
    berth_e2e::s3::settings(test).await
}

async fn blobs_round_trip(blobs: &Blobs) {
    let big: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
    blobs
        .put("t1/attachments/a", Bytes::from(big.clone()))
        .await
        .expect("put");
    assert_eq!(blobs.get("t1/attachments/a").await.expect("get"), big);
    let streamed: Vec<Bytes> = blobs
        .stream("t1/attachments/a")
        .await
        .expect("stream")
        .try_collect()
        .await
        .expect("chunks");
    assert_eq!(streamed.concat(), big);
    blobs.put("t1/other/x", Bytes::from_static(b"x")).await.expect("put");
    let soon = chrono::Utc::now() + chrono::Duration::minutes(1);
    assert_eq!(
        blobs.owned_older_than(soon).await.expect("list"),
        vec!["t1/attachments/a".to_string()],
        "the sweep lists attachment and patch keys only, relative to the prefix"
    );
    let past = chrono::Utc::now() - chrono::Duration::hours(1);
    assert!(blobs.owned_older_than(past).await.expect("list").is_empty());
    blobs.delete("t1/other/x").await.expect("delete");
    blobs.delete("t1/attachments/a").await.expect("delete");
    assert!(blobs.get("t1/attachments/a").await.is_err(), "deleted");
    blobs.delete("t1/attachments/a").await.expect("deleting twice is fine");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_local_directory_store_keeps_bytes_and_counts_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let counter = bytes_counter();
    let blobs = Blobs::open(None, dir.path(), [], counter.clone()).expect("open");
    assert!(blobs.url.starts_with("file://"), "{}", blobs.url);
    blobs_round_trip(&blobs).await;
    assert_eq!(counter.with_label_values(&["put"]).get(), (3 << 20) + 1);
    assert_eq!(counter.with_label_values(&["get"]).get(), 2 * (3 << 20));
    assert!(dir.path().join("objects").is_dir(), "under the data dir by default");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_s3_store_keeps_bytes_under_its_prefix() {
    let Some(settings) = s3_settings("the_s3_store_keeps_bytes_under_its_prefix").await else {
        return;
    };
    let url = settings[0].1.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let blobs = Blobs::open(Some(&url), dir.path(), settings.into_iter().skip(1), bytes_counter()).expect("open");
    blobs_round_trip(&blobs).await;
}

#[test]
fn a_store_url_that_is_neither_file_nor_s3_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Blobs::open(Some("ftp://x"), dir.path(), [], bytes_counter()).unwrap_err();
    assert!(err.to_string().contains("BERTH_OBJECT_STORE"), "{err}");
}

fn is_turn_end(v: &Value) -> bool {
    v["type"] == "turn.ended"
}

/// An image and a 20 MiB binary, uploaded and sent: the worker fetches both through the
/// API tier, the model gets the image as an image part and the binary's digest as the
/// worker computed it over the bytes it received.
async fn attachments_reach_the_worker_and_the_model(env: &[(String, String)]) {
    let mock = MockProvider::start().await;
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let stack = Stack::start_with(&mock, 1, &env).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;

    let image: Vec<u8> = b"\x89PNG\r\n\x1a\n-not-really-a-png-but-bytes".to_vec();
    let mut binary = vec![0u8; 20 << 20];
    rand::rng().fill_bytes(&mut binary);

    let img = c
        .upload(
            json!({"sessionId": sid, "mime": "image/png", "filename": "shot.png"}),
            &image,
            None,
        )
        .await
        .expect("image upload");
    assert_eq!(img["bytes"], image.len());
    assert_eq!(img["sha256"], sha256_hex(&image));
    let bin = c
        .upload(
            json!({"sessionId": sid, "mime": "application/octet-stream", "filename": "dump.bin", "bytes": binary.len()}),
            &binary,
            None,
        )
        .await
        .expect("binary upload");
    assert_eq!(bin["sha256"], sha256_hex(&binary));

    mock.push(Reply::text(&["got them"]));
    let mut sub = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    let sent = c
        .ok(
            "session.send",
            json!({"sessionId": sid, "prompt": "look at these", "attachments": [img["attachmentId"], bin["attachmentId"]]}),
        )
        .await;
    let items = sub.until(120, is_turn_end).await.expect("turn ended");
    let end = items.last().expect("end");
    assert_eq!(end["turnId"], sent["turnId"]);
    assert_eq!(end["state"], "completed", "{end}");

    // The prompt row names the attachments, in order, live and in history.
    let expected = json!([
        {"attachmentId": img["attachmentId"], "name": "shot.png", "mimeType": "image/png",
         "bytes": image.len(), "sha256": img["sha256"]},
        {"attachmentId": bin["attachmentId"], "name": "dump.bin", "mimeType": "application/octet-stream",
         "bytes": binary.len(), "sha256": bin["sha256"]},
    ]);
    let started = items
        .iter()
        .find(|i| i["type"] == "turn.started")
        .expect("turn.started");
    assert_eq!(started["rows"][0]["attachments"], expected);
    let history = c.ok("session.history", json!({"sessionId": sid})).await;
    let user_row = &history["rows"][0];
    assert_eq!(user_row["kind"], "user");
    assert_eq!(user_row["attachments"], expected);

    let requests = mock.requests();
    let last = requests.last().expect("a model request");
    let user = last["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .expect("user message");
    let parts = user["content"].as_array().expect("content parts");
    assert_eq!(parts[0], json!({"type": "text", "text": "look at these"}));
    let image_url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&image)
    );
    assert!(
        parts
            .iter()
            .any(|p| p["type"] == "image_url" && p["image_url"]["url"] == image_url.as_str()),
        "the image reaches the model as an image part"
    );
    let digest = format!("sha256:{}", sha256_hex(&binary));
    assert!(
        parts.iter().any(|p| p["text"]
            .as_str()
            .is_some_and(|t| t.contains(&digest) && t.contains("dump.bin"))),
        "the binary arrived byte-identical in the worker (its digest over the received bytes)"
    );

    let metrics = stack.servers[0].metrics().await;
    let put = metrics
        .lines()
        .find(|l| l.starts_with("berth_object_store_bytes_total{op=\"put\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .expect("put counter");
    assert_eq!(put, (image.len() + binary.len()) as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn attachments_reach_the_worker_and_the_model_through_the_local_store() {
    attachments_reach_the_worker_and_the_model(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn attachments_reach_the_worker_and_the_model_through_s3() {
    let Some(settings) = s3_settings("attachments_reach_the_worker_and_the_model_through_s3").await else {
        return;
    };
    attachments_reach_the_worker_and_the_model(&settings).await;
}

/// A binary message for no upload in flight (a wrong request id, or too short to hold one)
/// is answered with a typed error that names no request, and the connection goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_binary_message_for_no_upload_is_a_typed_error_and_the_connection_stays() {
    let mock = MockProvider::start().await;
    let db = berth_e2e::fresh_database().await;
    let server = TestServer::start(&db, &mock.base_url()).await.expect("server");
    let mut c = Client::authed(&server.ws_url(), &server.admin_token())
        .await
        .expect("client");
    assert_eq!(c.ok("ping", json!({})).await["pong"], true);

    c.send_binary(vec![0, 0, 3, 231, 1, 2, 3]);
    let stray = tokio::time::timeout(Duration::from_secs(10), c.orphans.recv())
        .await
        .expect("an answer to the stray binary message")
        .expect("connection open");
    assert_eq!(stray.id, None, "the error names no request");
    let e = stray.error.expect("an error");
    assert_eq!(code(&e), "bad-params");
    assert_eq!(e.data["reason"], "no-upload-in-flight");
    assert_eq!(e.data["requestId"], 999);

    c.send_binary(vec![0, 1]);
    let short = tokio::time::timeout(Duration::from_secs(10), c.orphans.recv())
        .await
        .expect("an answer to the short binary message")
        .expect("connection open")
        .error
        .expect("an error");
    assert_eq!(code(&short), "bad-params");
    assert_eq!(short.data["reason"], "short-binary-message");

    assert_eq!(c.ok("ping", json!({})).await["pong"], true);
    assert!(!c.is_closed(), "the connection stays usable");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_uploads_are_typed_errors_and_the_connection_stays_usable() {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(&mock, 1, &[("BERTH_MAX_ATTACHMENT_BYTES", "1048576")]).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let params = json!({"sessionId": sid, "mime": "text/plain", "filename": "a.txt"});

    let e = c
        .upload(params.clone(), &vec![b'x'; (1 << 20) + 1], None)
        .await
        .unwrap_err();
    assert_eq!(code(&e), "payload-too-large");
    assert_eq!(e.data["max"], 1 << 20);

    // A truncated message: fewer bytes than the request declared.
    let mut declared = params.clone();
    declared["bytes"] = json!(10);
    let e = c.upload(declared, b"12345", None).await.unwrap_err();
    assert_eq!(code(&e), "bad-params");
    assert_eq!(e.data["reason"], "size-mismatch");

    let mut unknown = params.clone();
    unknown["sessionId"] = json!("ses_000000000000000000000000");
    let e = c.upload(unknown, b"hi", None).await.unwrap_err();
    assert_eq!(code(&e), "not-found");

    let mut bad_name = params.clone();
    bad_name["filename"] = json!("../etc/passwd");
    let e = c.upload(bad_name, b"hi", None).await.unwrap_err();
    assert_eq!(code(&e), "bad-params");

    let e = c
        .call(
            "session.send",
            json!({"sessionId": sid, "prompt": "p", "attachments": ["att_nope"]}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");

    // After all of that the connection still works, and a good upload goes through.
    assert_eq!(c.ok("ping", json!({})).await["pong"], true);
    let ok = c.upload(params, b"hello", None).await.expect("upload");
    assert_eq!(ok["bytes"], 5);
    assert!(!c.is_closed());
}

#[tokio::test(flavor = "multi_thread")]
async fn another_tenants_attachment_and_session_are_not_found() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut a = stack.client(0).await;
    let sid_a = stack.session(&mut a).await;
    let att = a
        .upload(
            json!({"sessionId": sid_a, "mime": "text/plain", "filename": "secret.txt"}),
            b"tenant a's secret",
            None,
        )
        .await
        .expect("upload");

    let token_b = stack.servers[0].tenant_b().await;
    let mut b = Client::authed(&stack.servers[0].ws_url(), &token_b).await.expect("b");
    // Tenant B cannot upload into A's session…
    let e = b
        .upload(
            json!({"sessionId": sid_a, "mime": "text/plain", "filename": "x.txt"}),
            b"x",
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
    // …nor name A's attachment from a session of its own (an offline workspace of B's,
    // made directly in the database: no worker of B's runs here).
    let db = berth_e2e::harness::db(&stack.database_url).await;
    db.batch_execute(
        "INSERT INTO workspaces (id, tenant_id, host, name, path, title)
           SELECT 'wsp_b', id, 'host-b', 'b', '/b', 'b' FROM tenants WHERE name = 'tenant-b';
         INSERT INTO sessions (id, tenant_id, workspace_id) SELECT 'ses_b', tenant_id, id FROM workspaces WHERE id = 'wsp_b';",
    )
    .await
    .expect("B's session");
    let e = b
        .call(
            "session.send",
            json!({"sessionId": "ses_b", "prompt": "p", "attachments": [att["attachmentId"]]}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
    let own = b
        .upload(
            json!({"sessionId": "ses_b", "mime": "text/plain", "filename": "mine.txt"}),
            b"b's own",
            None,
        )
        .await
        .expect("B uploads into its own session");
    let sent = b
        .ok(
            "session.send",
            json!({"sessionId": "ses_b", "prompt": "p", "attachments": [own["attachmentId"]]}),
        )
        .await;
    assert_eq!(
        sent["state"], "queued",
        "B's own attachment is accepted (the workspace is offline)"
    );
    let rows = stack
        .sql_i64("SELECT count(*) FROM attachments WHERE session_id = $1", &sid_a)
        .await;
    assert_eq!(rows, 1, "B's attempt left nothing behind");
}

#[tokio::test(flavor = "multi_thread")]
async fn removing_a_session_removes_its_attachments_rows_then_bytes() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let att = c
        .upload(
            json!({"sessionId": sid, "mime": "text/plain", "filename": "gone.txt"}),
            b"soon gone",
            None,
        )
        .await
        .expect("upload");
    let id = att["attachmentId"].as_str().expect("id").to_string();
    let objects = stack.servers[0].data_dir.join("objects");
    let count_files = |dir: &std::path::Path| -> usize {
        fn walk(d: &std::path::Path) -> usize {
            std::fs::read_dir(d)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| if e.path().is_dir() { walk(&e.path()) } else { 1 })
                        .sum()
                })
                .unwrap_or(0)
        }
        walk(dir)
    };
    assert_eq!(count_files(&objects), 1, "the bytes are in the local store");
    c.ok("session.remove", json!({"sessionId": sid})).await;
    let rows = stack
        .sql_i64("SELECT count(*) FROM attachments WHERE id = $1", &id)
        .await;
    assert_eq!(rows, 0);
    assert_eq!(count_files(&objects), 0, "the bytes are gone");
}

/// A fork shares its source's attachments: removing the source keeps the ones the fork's
/// history names (rows and bytes); removing the fork too releases them.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_keeps_its_sources_attachments_alive() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let att = c
        .upload(
            json!({"sessionId": sid, "mime": "text/plain", "filename": "shared.txt"}),
            b"shared bytes",
            None,
        )
        .await
        .expect("upload");
    let id = att["attachmentId"].as_str().expect("id").to_string();
    mock.push(Reply::text(&["ok"]));
    let mut sub = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    c.ok(
        "session.send",
        json!({"sessionId": sid, "prompt": "keep this", "attachments": [id]}),
    )
    .await;
    sub.until(60, is_turn_end).await.expect("turn ended");
    let revision = c.ok("session.get", json!({"sessionId": sid})).await["historyRevision"].clone();
    let fork = c
        .ok(
            "session.fork",
            json!({"sessionId": sid, "sourceRevision": revision, "operationId": "fork-att"}),
        )
        .await;
    let fork_id = fork["sessionId"].as_str().expect("fork id").to_string();
    let history = c.ok("session.history", json!({"sessionId": fork_id})).await;
    assert_eq!(history["rows"][0]["attachments"][0]["attachmentId"], id.as_str());

    c.ok("session.remove", json!({"sessionId": sid})).await;
    let count = |stack: &Stack| {
        let id = id.clone();
        let url = stack.database_url.clone();
        async move {
            let db = berth_e2e::harness::db(&url).await;
            db.query_one("SELECT count(*) FROM attachments WHERE id = $1", &[&id])
                .await
                .expect("count")
                .get::<_, i64>(0)
        }
    };
    assert_eq!(count(&stack).await, 1, "the fork still names it");
    c.ok("session.remove", json!({"sessionId": fork_id})).await;
    assert_eq!(count(&stack).await, 0, "released with the last session naming it");
}

/// A blob whose row was never written (a crash between the two) is removed by the sweep
/// once old enough; recorded attachments stay.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_removes_blobs_without_rows_and_keeps_the_rest() {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(
        &mock,
        1,
        &[("BERTH_OBJECT_SWEEP_SECS", "1"), ("BERTH_OBJECT_ORPHAN_AGE_SECS", "0")],
    )
    .await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let att = c
        .upload(
            json!({"sessionId": sid, "mime": "text/plain", "filename": "kept.txt"}),
            b"kept",
            None,
        )
        .await
        .expect("upload");
    let objects = stack.servers[0].data_dir.join("objects");
    let tenant_dir = std::fs::read_dir(&objects)
        .expect("objects dir")
        .flatten()
        .next()
        .expect("tenant dir")
        .path();
    let kept = tenant_dir
        .join("attachments")
        .join(att["attachmentId"].as_str().expect("id"));
    assert!(kept.is_file());
    let orphan = tenant_dir.join("attachments").join("att_orphan");
    std::fs::write(&orphan, b"no row names me").expect("orphan");
    let gone = eventually(30, || {
        let gone = !orphan.exists();
        async move { gone.then_some(()) }
    })
    .await;
    assert!(gone.is_some(), "the orphan is swept");
    assert!(kept.is_file(), "a recorded attachment stays");
}

/// A profile declares which of its models take image input: the image reaches the one that
/// does as an image part; the other gets a text note in its place, and no image bytes.
#[tokio::test(flavor = "multi_thread")]
async fn images_reach_only_the_models_that_take_them() {
    let mock = MockProvider::start().await;
    let url = mock.base_url();
    let stack = Stack::start_with(
        &mock,
        1,
        &[
            ("BERTH_PROVIDERS", "vision"),
            ("BERTH_PROVIDER_VISION_BASE_URL", &url),
            ("BERTH_PROVIDER_VISION_MODELS", "seeing,text-only"),
            ("BERTH_PROVIDER_VISION_IMAGE_INPUT", "seeing"),
        ],
    )
    .await;
    let mut c = stack.client(0).await;
    let image = b"\x89PNG\r\n\x1a\n-pixels".to_vec();
    let image_b64 = base64::engine::general_purpose::STANDARD.encode(&image);
    for model in ["seeing", "text-only"] {
        let s = c
            .ok(
                "session.create",
                json!({"workspaceId": stack.workspace_id, "provider": "vision", "model": model}),
            )
            .await;
        let sid = s["sessionId"].as_str().expect("sid").to_string();
        let img = c
            .upload(
                json!({"sessionId": sid, "mime": "image/png", "filename": "shot.png"}),
                &image,
                None,
            )
            .await
            .expect("upload");
        mock.push(Reply::text(&["seen"]));
        let mut sub = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
        c.ok(
            "session.send",
            json!({"sessionId": sid, "prompt": "what is this", "attachments": [img["attachmentId"]]}),
        )
        .await;
        let items = sub.until(60, is_turn_end).await.expect("turn ended");
        assert_eq!(items.last().expect("end")["state"], "completed");
    }
    let requests = mock.requests();
    let user_parts = |model: &str| -> Vec<Value> {
        let req = requests
            .iter()
            .find(|r| r["model"] == model)
            .unwrap_or_else(|| panic!("a request for {model}"));
        req["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .find(|m| m["role"] == "user")
            .expect("user message")["content"]
            .as_array()
            .expect("parts")
            .clone()
    };
    let seeing = user_parts("seeing");
    assert!(
        seeing.iter().any(|p| p["type"] == "image_url"
            && p["image_url"]["url"] == format!("data:image/png;base64,{image_b64}").as_str()),
        "the model with image input gets the image: {seeing:?}"
    );
    let blind = user_parts("text-only");
    assert!(blind.iter().all(|p| p["type"] == "text"), "{blind:?}");
    assert!(
        blind
            .iter()
            .any(|p| p["text"].as_str().is_some_and(|t| t.contains("image omitted"))),
        "a note stands in for the image: {blind:?}"
    );
    assert!(!Value::Array(blind).to_string().contains(&image_b64), "no image bytes");
}

/// An upload racing its session's removal: the row goes in under the session's key lock, so
/// an upload that reaches the database while the removal holds the session waits for it and
/// then finds the session gone (`not-found`, its bytes deleted) instead of leaving a row,
/// and a blob, that the removal's clean-up had already passed.
#[tokio::test(flavor = "multi_thread")]
async fn an_upload_racing_its_sessions_removal_leaves_no_row() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    // A removal as `session.remove` makes it (the session locked, then marked), held open.
    let removal = db(&stack.database_url).await;
    removal.batch_execute("BEGIN").await.unwrap();
    for sql in [
        "SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE",
        "UPDATE sessions SET removed_at = now() WHERE id = $1",
    ] {
        removal.execute(sql, &[&sid]).await.unwrap();
    }
    let upload = c.upload(
        json!({"sessionId": sid, "mime": "text/plain", "filename": "late.txt"}),
        b"too late",
        None,
    );
    let commit = async {
        assert!(
            statements_wait_on_locks(&stack.database_url, 1).await.is_some(),
            "the upload's row waits for the removal"
        );
        removal.batch_execute("COMMIT").await.unwrap();
    };
    let (uploaded, ()) = tokio::join!(upload, commit);
    let e = uploaded.expect_err("an upload into a removed session");
    assert_eq!(code(&e), "not-found", "{e:?}");
    let rows: i64 = removal
        .query_one("SELECT count(*) FROM attachments WHERE session_id = $1", &[&sid])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "no attachment row for the removed session");
}
