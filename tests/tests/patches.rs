//! Patch snapshots (issue 12, SPEC §4.11) against real processes: two API replicas sharing
//! one object store (a local directory, or the S3-compatible server `.ci/run` starts), the
//! worker on replica 0, the client on replica 1, a repository built with the git CLI; the
//! patch is checked by applying it with `git apply` to a fresh clone of its base.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use berth_e2e::{Client, MockProvider, Part, Reply, Stack, TestServer, client::code};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// Run git in `dir` with a fixed identity and no user or system configuration.
fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn write(dir: &Path, rel: &str, data: impl AsRef<[u8]>) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, data).expect("write");
}

fn is_turn_end(v: &Value) -> bool {
    v["type"] == "turn.ended"
}

/// Every page of a patch, checked for a gapless walk; returns the text and the page count.
async fn read_all(c: &mut Client, patch_id: &str) -> (String, usize) {
    let mut text = String::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut params = json!({"patchId": patch_id});
        if let Some(a) = &after {
            params["after"] = json!(a);
        }
        let page = c.ok("patch.read", params).await;
        assert_eq!(page["offset"], text.len(), "pages follow each other");
        assert_eq!(page["patch"]["patchId"], patch_id);
        text.push_str(page["text"].as_str().expect("text"));
        pages += 1;
        match page["nextAfter"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return (text, pages),
        }
    }
}

/// A repository with a base commit and every kind of change on top, including a file
/// large enough that its patch takes several pages.
fn repository_with_changes(dir: &Path) {
    git(dir, &["init", "-q", "-b", "main"]);
    let lines: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    write(dir, "kept.txt", &lines);
    write(dir, "staged.txt", &lines);
    write(dir, "deleted.txt", "bye\n");
    write(dir, "src/lib.rs", "fn main() {}\n");
    write(dir, ".gitignore", "*.log\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);

    write(dir, "staged.txt", lines.replace("line 4\n", "line four\n"));
    git(dir, &["add", "staged.txt"]);
    write(dir, "kept.txt", lines.replace("line 29\n", "line twenty-nine\n"));
    std::fs::remove_file(dir.join("deleted.txt")).expect("rm");
    let big: String = (0..12_000).map(|i| format!("generated line {i} – ünïcödé\n")).collect();
    write(dir, "src/big.txt", big);
    write(dir, "build.log", "ignored\n");
}

/// Apply `patch` with `git apply` to a fresh clone of `repo`'s HEAD; returns the clone.
fn apply_to_base(repo: &Path, patch: &str) -> tempfile::TempDir {
    let clone = tempfile::tempdir().expect("tempdir");
    git(clone.path(), &["clone", "-q", repo.to_str().expect("utf8"), "."]);
    let file = clone.path().join(".git/berth.patch");
    std::fs::write(&file, patch).expect("write patch");
    git(clone.path(), &["apply", file.to_str().expect("utf8")]);
    clone
}

async fn a_patch_survives_later_turns_changes_and_a_restart(env: Vec<(String, String)>, local: Option<PathBuf>) {
    let mock = MockProvider::start().await;
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut stack = Stack::start_with(&mock, 2, &env_refs).await;
    let mut c = stack.client(1).await;
    let sid = stack.session(&mut c).await;
    let dir = stack.workspace_dir.clone();
    repository_with_changes(&dir);

    let snap = c
        .ok("patch.snapshot", json!({"sessionId": sid, "operationId": "snap-1"}))
        .await;
    let patch_id = snap["patchId"].as_str().expect("patchId").to_string();
    assert!(patch_id.starts_with("pch_"), "{snap}");
    assert_eq!(snap["sessionId"], sid.as_str());
    assert_eq!(snap["files"], 4, "{snap}");
    let head = String::from_utf8(git(&dir, &["rev-parse", "HEAD"])).expect("utf8");
    assert_eq!(snap["base"], head.trim());

    // A retry is the same patch, captured once; other params under the same id conflict.
    let again = c
        .ok("patch.snapshot", json!({"sessionId": sid, "operationId": "snap-1"}))
        .await;
    assert_eq!(again, snap);
    assert_eq!(
        stack
            .sql_i64("SELECT count(*) FROM patches WHERE session_id = $1", &sid)
            .await,
        1
    );
    let e = c
        .call(
            "patch.snapshot",
            json!({"sessionId": sid, "turnId": "trn_other", "operationId": "snap-1"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "operation-conflict");

    let (text, pages) = read_all(&mut c, &patch_id).await;
    assert!(pages > 1, "a patch of {} bytes takes several pages", text.len());
    assert_eq!(text.len() as u64, snap["bytes"].as_u64().expect("bytes"));
    assert_eq!(sha256_hex(text.as_bytes()), snap["sha256"]);
    assert!(!text.contains("build.log"), "ignored files are not in the patch");
    // git itself is the reference: the patch applied to the base reproduces the workspace.
    let clone = apply_to_base(&dir, &text);
    for f in ["kept.txt", "staged.txt", "src/big.txt", "src/lib.rs"] {
        assert_eq!(
            std::fs::read(clone.path().join(f)).expect("applied file"),
            std::fs::read(dir.join(f)).expect("workspace file"),
            "{f}"
        );
    }
    assert!(!clone.path().join("deleted.txt").exists());

    // The bytes live in object storage under the tenant's patches, not in PostgreSQL.
    if let Some(objects) = &local {
        let stored: Vec<PathBuf> = std::fs::read_dir(objects)
            .expect("objects")
            .flatten()
            .map(|t| t.path().join("patches").join(&patch_id))
            .filter(|p| p.is_file())
            .collect();
        assert_eq!(stored.len(), 1, "one blob under <tenant>/patches/<id>");
        assert_eq!(std::fs::read(&stored[0]).expect("blob"), text.as_bytes());
    }

    // A later turn, further changes to the workspace, and the replica that captured the
    // patch replaced by a fresh process: the patch still reads the same, everywhere.
    mock.push(Reply::text(&["done"]));
    let mut sub = c.subscribe("session.watch", json!({"sessionId": sid, "after": 0}));
    c.ok("session.send", json!({"sessionId": sid, "prompt": "next"})).await;
    sub.until(60, is_turn_end).await.expect("turn ended");
    write(&dir, "kept.txt", "rewritten\n");
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "later"]);
    drop(sub);
    drop(c);
    stack.servers[1].terminate().await;
    stack.servers[1] = TestServer::start_with(&stack.database_url, &mock.base_url(), &env_refs)
        .await
        .expect("restarted replica");
    for replica in [1, 0] {
        let mut c = stack.client(replica).await;
        let (after, _) = read_all(&mut c, &patch_id).await;
        assert_eq!(after, text, "replica {replica} reads the original bytes");
    }

    // A new snapshot sees the new state; the old one is unchanged.
    let mut c = stack.client(1).await;
    let newer = c
        .ok("patch.snapshot", json!({"sessionId": sid, "operationId": "snap-2"}))
        .await;
    assert_ne!(newer["patchId"], snap["patchId"]);
    assert_ne!(newer["sha256"], snap["sha256"]);
    assert_eq!(read_all(&mut c, &patch_id).await.0, text);

    // Another tenant's patch id is not-found, like one that does not exist; so is its
    // session for a snapshot.
    let token_b = stack.servers[0].tenant_b().await;
    let mut b = Client::authed(&stack.servers[1].ws_url(), &token_b).await.expect("b");
    for id in [patch_id.as_str(), "pch_000000000000000000000000"] {
        let e = b.call("patch.read", json!({"patchId": id})).await.unwrap_err();
        assert_eq!(code(&e), "not-found");
    }
    let e = b
        .call("patch.snapshot", json!({"sessionId": sid, "operationId": "b-1"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_patch_survives_later_turns_changes_and_a_restart_in_a_local_store() {
    let objects = tempfile::tempdir().expect("tempdir");
    let env = vec![(
        "BERTH_OBJECT_STORE".to_string(),
        format!("file://{}", objects.path().display()),
    )];
    a_patch_survives_later_turns_changes_and_a_restart(env, Some(objects.path().to_path_buf())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_patch_survives_later_turns_changes_and_a_restart_in_s3() {
    let Some(env) = berth_e2e::s3::settings("a_patch_survives_later_turns_changes_and_a_restart_in_s3").await else {
        return;
    };
    a_patch_survives_later_turns_changes_and_a_restart(env, None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_refuse_what_they_cannot_capture_with_typed_errors() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let dir = stack.workspace_dir.clone();

    let e = c.call("patch.snapshot", json!({"sessionId": sid})).await.unwrap_err();
    assert_eq!(code(&e), "bad-params", "operationId is required");

    write(&dir, "plain.txt", "not a repository\n");
    let e = c
        .call("patch.snapshot", json!({"sessionId": sid, "operationId": "p-1"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "unsupported");
    assert_eq!(e.data["feature"], "no-repository");

    // A queued turn has not settled: its patch cannot be taken yet. An unknown turn is
    // not-found.
    git(&dir, &["init", "-q", "-b", "main"]);
    c.ok("session.pause", json!({"sessionId": sid, "paused": true})).await;
    let queued = c.ok("session.send", json!({"sessionId": sid, "prompt": "later"})).await;
    assert_eq!(queued["state"], "queued");
    let e = c
        .call(
            "patch.snapshot",
            json!({"sessionId": sid, "turnId": queued["turnId"], "operationId": "p-2"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "turn-busy");
    let e = c
        .call(
            "patch.snapshot",
            json!({"sessionId": sid, "turnId": "trn_nope", "operationId": "p-3"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");

    // An unborn repository with only untracked files: a patch of additions, no base.
    let snap = c
        .ok("patch.snapshot", json!({"sessionId": sid, "operationId": "p-4"}))
        .await;
    assert_eq!(snap["files"], 1);
    assert!(snap.get("base").is_none(), "{snap}");
    let page = c.ok("patch.read", json!({"patchId": snap["patchId"]})).await;
    assert!(
        page["text"]
            .as_str()
            .expect("text")
            .starts_with("diff --git a/plain.txt b/plain.txt\nnew file mode 100644\n")
    );
    assert!(page.get("nextAfter").is_none());
    let e = c
        .call("patch.read", json!({"patchId": snap["patchId"], "after": "nope"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "bad-params");

    // With the workspace's worker gone, a capture is workspace-offline; reading still works.
    let mut stack = stack;
    stack.kill_worker().await;
    let e = c
        .call("patch.snapshot", json!({"sessionId": sid, "operationId": "p-5"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "workspace-offline");
    c.ok("patch.read", json!({"patchId": snap["patchId"]})).await;
    // An offline workspace is not the operation's outcome: the retry with the same
    // operationId, once the worker is back, takes the patch.
    stack.start_worker(0).await;
    let retried = c
        .ok("patch.snapshot", json!({"sessionId": sid, "operationId": "p-5"}))
        .await;
    assert!(retried["patchId"].is_string(), "{retried}");
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| if e.path().is_dir() { count_files(&e.path()) } else { 1 })
                .sum()
        })
        .unwrap_or(0)
}

/// Removing a session releases its patches (rows, then bytes); removing a workspace
/// releases the attachments and patches of all its sessions.
#[tokio::test(flavor = "multi_thread")]
async fn removing_a_session_or_workspace_releases_its_blobs() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let dir = stack.workspace_dir.clone();
    git(&dir, &["init", "-q", "-b", "main"]);
    write(&dir, "a.txt", "a\n");
    let objects = stack.servers[0].data_dir.join("objects");

    let first = stack.session(&mut c).await;
    let snap = c
        .ok("patch.snapshot", json!({"sessionId": first, "operationId": "s-1"}))
        .await;
    assert_eq!(count_files(&objects), 1);
    c.ok("session.remove", json!({"sessionId": first})).await;
    assert_eq!(count_files(&objects), 0, "the session's patch bytes are gone");
    assert_eq!(
        stack
            .sql_i64("SELECT count(*) FROM patches WHERE session_id = $1", &first)
            .await,
        0
    );
    let e = c
        .call("patch.read", json!({"patchId": snap["patchId"]}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");

    let second = stack.session(&mut c).await;
    let third = stack.session(&mut c).await;
    // A turn, so that the workspace has history (events and their rows) to remove.
    mock.push(Reply::text(&["done"]));
    let mut sub = c.subscribe("session.watch", json!({"sessionId": second, "after": 0}));
    c.ok("session.send", json!({"sessionId": second, "prompt": "go"})).await;
    sub.until(60, is_turn_end).await.expect("turn ended");
    drop(sub);
    assert!(
        stack
            .sql_i64("SELECT count(*) FROM rows WHERE session_id = $1", &second)
            .await
            > 0
    );
    c.ok("patch.snapshot", json!({"sessionId": second, "operationId": "s-2"}))
        .await;
    c.ok("patch.snapshot", json!({"sessionId": third, "operationId": "s-3"}))
        .await;
    c.upload(
        json!({"sessionId": third, "mime": "text/plain", "filename": "note.txt"}),
        b"an attachment",
        None,
    )
    .await
    .expect("upload");
    assert_eq!(count_files(&objects), 3);
    let removed = c
        .ok(
            "workspace.remove",
            json!({"workspaceId": stack.workspace_id, "operationId": "w-1"}),
        )
        .await;
    assert_eq!(removed["removed"], true);
    assert_eq!(count_files(&objects), 0, "every blob of the workspace is gone");
    let db = berth_e2e::harness::db(&stack.database_url).await;
    // Its sessions' history too: events and rows (deleted with the workspace, not by a key's
    // cascade), turns, context records and the sessions.
    for table in [
        "patches",
        "attachments",
        "events",
        "rows",
        "turns",
        "context_records",
        "sessions",
    ] {
        let n: i64 = db
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(n, 0, "{table} rows are gone");
    }
}

/// The orphan sweep removes a patch blob no row names (a crash between storing the text
/// and recording the row) and keeps recorded patches readable.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_removes_unrecorded_patch_blobs_and_keeps_recorded_ones() {
    let mock = MockProvider::start().await;
    let stack = Stack::start_with(
        &mock,
        1,
        &[("BERTH_OBJECT_SWEEP_SECS", "1"), ("BERTH_OBJECT_ORPHAN_AGE_SECS", "0")],
    )
    .await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let dir = stack.workspace_dir.clone();
    git(&dir, &["init", "-q", "-b", "main"]);
    write(&dir, "a.txt", "a\n");
    let snap = c
        .ok("patch.snapshot", json!({"sessionId": sid, "operationId": "kept"}))
        .await;
    let objects = stack.servers[0].data_dir.join("objects");
    let patches_dir = std::fs::read_dir(&objects)
        .expect("objects")
        .flatten()
        .map(|t| t.path().join("patches"))
        .find(|p| p.is_dir())
        .expect("the tenant's patches");
    let kept = patches_dir.join(snap["patchId"].as_str().expect("id"));
    assert!(kept.is_file());
    let orphan = patches_dir.join("pch_orphan");
    std::fs::write(&orphan, "diff --git a/x b/x\n").expect("orphan");
    let gone = berth_e2e::harness::eventually(30, || {
        let gone = !orphan.exists();
        async move { gone.then_some(()) }
    })
    .await;
    assert!(gone.is_some(), "the orphan is swept");
    assert!(kept.is_file(), "a recorded patch stays");
    let page = c.ok("patch.read", json!({"patchId": snap["patchId"]})).await;
    assert!(page["text"].as_str().expect("text").contains("+a\n"));
}

/// Issue 49: a snapshot waits for every writer of the workspace: while a turn of another
/// session runs there, `patch.snapshot` is `turn-busy`; once it has ended, the capture goes
/// through.
#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_is_refused_while_any_session_writes_to_the_workspace() {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let dir = stack.workspace_dir.clone();
    git(&dir, &["init", "-q", "-b", "main"]);
    write(&dir, "a.txt", "a\n");
    let quiet = stack.session(&mut c).await;
    let busy = stack.session(&mut c).await;
    mock.push(Reply::StreamThenHang(vec![Part::Text("writing".into())]));
    let mut watch = c.subscribe("session.watch", json!({"sessionId": busy, "after": 0}));
    let sent = c
        .ok("session.send", json!({"sessionId": busy, "prompt": "write"}))
        .await;
    watch
        .until(30, |i| i["type"] == "model.delta")
        .await
        .expect("the other session's turn runs");
    let e = c
        .call("patch.snapshot", json!({"sessionId": quiet, "operationId": "q-1"}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "turn-busy");
    c.ok("session.stop", json!({"sessionId": busy, "turnId": sent["turnId"]}))
        .await;
    watch.until(30, |i| i["type"] == "turn.ended").await.expect("it ends");
    let snap = c
        .ok("patch.snapshot", json!({"sessionId": quiet, "operationId": "q-2"}))
        .await;
    assert_eq!(snap["files"], 1, "{snap}");
}

/// Regular files, symlinks (their targets) and executable bits under `dir`, `.git` left out.
fn tree(dir: &Path) -> std::collections::BTreeMap<String, (Vec<u8>, bool, bool)> {
    use std::os::unix::{ffi::OsStrExt, fs::PermissionsExt};
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            let rel = path.strip_prefix(dir).expect("inside").to_string_lossy().into_owned();
            if rel == ".git" {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).expect("readlink");
                out.insert(rel, (target.as_os_str().as_bytes().to_vec(), false, true));
            } else if meta.is_dir() {
                stack.push(path);
            } else {
                let exec = meta.permissions().mode() & 0o111 != 0;
                out.insert(rel, (std::fs::read(&path).expect("read"), exec, false));
            }
        }
    }
    out
}

/// Issue 49: a snapshot taken through the server carries binaries (`GIT binary patch`),
/// modes, symlinks, a file replaced by a symlink and back, text that is not UTF-8, an empty
/// file and line endings converted by `.gitattributes`: `git apply` of the text read back
/// with `patch.read`, on a fresh clone of its base, reproduces the working tree exactly.
#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_with_binaries_modes_and_symlinks_reproduces_the_tree_with_git_apply() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 1).await;
    let mut c = stack.client(0).await;
    let sid = stack.session(&mut c).await;
    let dir = stack.workspace_dir.clone();
    git(&dir, &["init", "-q", "-b", "main"]);
    write(&dir, ".gitattributes", "*.bat eol=crlf\n");
    write(&dir, "image.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\x01\x02");
    write(&dir, "gone.bin", b"\0\x01\x02 deleted binary");
    write(&dir, "run.sh", "echo hi\n");
    write(&dir, "was-file", "a file, then a symlink\n");
    symlink("run.sh", dir.join("was-link")).expect("symlink");
    write(&dir, "latin1.txt", b"caf\xe9\n");
    write(&dir, "setup.bat", "@echo off\r\n");
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "base"]);

    let blob: Vec<u8> = (0..70_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    write(&dir, "image.png", &blob);
    std::fs::remove_file(dir.join("gone.bin")).expect("rm");
    write(&dir, "assets/new.bin", b"\0new binary\xff");
    std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::remove_file(dir.join("was-file")).expect("rm");
    symlink("latin1.txt", dir.join("was-file")).expect("symlink");
    std::fs::remove_file(dir.join("was-link")).expect("rm");
    write(&dir, "was-link", "a symlink, then a file\n");
    write(&dir, "latin1.txt", b"caf\xe9 cr\xe8me\n");
    write(&dir, "setup.bat", "@echo off\r\necho more\r\n");
    write(&dir, "empty", "");
    symlink("assets/new.bin", dir.join("link-to-new")).expect("symlink");
    write(&dir, "tool.py", "print()\n");
    std::fs::set_permissions(dir.join("tool.py"), std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let snap = c
        .ok("patch.snapshot", json!({"sessionId": sid, "operationId": "bin-1"}))
        .await;
    assert_eq!(snap["files"], 11, "{snap}");
    let patch_id = snap["patchId"].as_str().expect("patchId").to_string();
    let (text, _) = read_all(&mut c, &patch_id).await;
    assert_eq!(sha256_hex(text.as_bytes()), snap["sha256"]);
    assert!(text.contains("GIT binary patch\nliteral 70000\n"), "{text}");
    let head = String::from_utf8(git(&dir, &["rev-parse", "HEAD"])).expect("utf8");
    let empty = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391";
    assert!(
        text.contains(&format!(
            "new file mode 100644\nindex 0000000000000000000000000000000000000000..{empty}\n"
        )),
        "full index lines: {text}"
    );
    assert_eq!(snap["base"], head.trim());
    let clone = apply_to_base(&dir, &text);
    let (ours, theirs) = (tree(&dir), tree(clone.path()));
    assert_eq!(ours.keys().collect::<Vec<_>>(), theirs.keys().collect::<Vec<_>>());
    for (path, o) in &ours {
        assert_eq!(o, &theirs[path], "{path}");
    }
}
