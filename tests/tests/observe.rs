//! Files and git, answered by the worker through any replica: two API replicas, the worker
//! on replica 0, the client on replica 1 (so every call is forwarded between replicas).
//! Repositories are built with the git CLI, and the CLI is the reference.

use std::{
    collections::BTreeSet,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    process::Command,
};

use base64::Engine;
use berth_e2e::{Client, MockProvider, Part, Reply, Stack, client::code};
use serde_json::{Value, json};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(s).expect("base64")
}

/// Run git in `dir` with a fixed identity and no user or system configuration.
fn git_cmd(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .output()
        .expect("git runs")
}

fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = git_cmd(dir, args);
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Empty the workspace directory (keeping the directory itself: it is the workspace).
fn clear(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(&p).unwrap();
        } else {
            std::fs::remove_file(&p).unwrap();
        }
    }
}

fn write(dir: &Path, rel: impl AsRef<Path>, data: impl AsRef<[u8]>) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// (area, path bytes, change) triples.
type Status = BTreeSet<(String, Vec<u8>, String)>;

fn change_of(letter: u8) -> &'static str {
    match letter {
        b'A' => "added",
        b'M' => "modified",
        b'D' => "deleted",
        b'T' => "type-changed",
        other => panic!("unexpected status letter {}", other as char),
    }
}

/// `git status --porcelain=v2 -uall` (renames off: they are deletion plus addition).
fn cli_status(dir: &Path) -> Status {
    let out = git(
        dir,
        &["-c", "status.renames=false", "status", "--porcelain=v2", "-z", "-uall"],
    );
    let mut set = Status::new();
    for rec in out.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        match rec[0] {
            b'1' => {
                // 1 XY sub mH mI mW hH hI path
                let fields: Vec<&[u8]> = rec.splitn(9, |b| *b == b' ').collect();
                let (x, y) = (fields[1][0], fields[1][1]);
                let path = fields[8].to_vec();
                if x != b'.' {
                    set.insert(("staged".into(), path.clone(), change_of(x).into()));
                }
                if y != b'.' {
                    set.insert(("worktree".into(), path, change_of(y).into()));
                }
            }
            b'?' => {
                set.insert(("untracked".into(), rec[2..].to_vec(), "added".into()));
            }
            b'u' => {
                // u XY sub m1 m2 m3 mW h1 h2 h3 path: Berth lists it once, as staged.
                let fields: Vec<&[u8]> = rec.splitn(11, |b| *b == b' ').collect();
                set.insert(("staged".into(), fields[10].to_vec(), "unmerged".into()));
            }
            other => panic!("unexpected porcelain record {}", other as char),
        }
    }
    set
}

fn berth_status(status: &Value) -> Status {
    let mut set = Status::new();
    for area in ["staged", "worktree", "untracked"] {
        for e in status[area].as_array().unwrap() {
            set.insert((
                area.into(),
                unb64(e["path"]["bytesBase64"].as_str().unwrap()),
                e["change"].as_str().unwrap().into(),
            ));
        }
    }
    set
}

/// The hunks of a `git diff` output (from the first `@@`).
fn hunks(patch: &[u8]) -> String {
    let text = String::from_utf8_lossy(patch);
    text.find("\n@@").map(|i| text[i + 1..].to_string()).unwrap_or_default()
}

async fn diff(c: &mut Client, sid: &str, path: &[u8], area: &str) -> Value {
    c.ok(
        "git.diff",
        json!({"sessionId": sid, "path": {"bytesBase64": b64(path)}, "area": area}),
    )
    .await
}

struct Setup {
    _mock: MockProvider,
    stack: Stack,
    /// On replica 1; the worker is on replica 0.
    client: Client,
    sid: String,
    dir: PathBuf,
}

/// Where other replicas reach replica `i` of `stack` (its internal listener, as it announced
/// it), read with `db`.
async fn internal_url(stack: &Stack, i: usize, db: &tokio_postgres::Client) -> String {
    let mut c = stack.client(i).await;
    let replica = c.ok("status", json!({})).await["replicaId"]
        .as_str()
        .unwrap()
        .to_string();
    db.query_one("SELECT internal_url FROM replicas WHERE replica_id = $1", &[&replica])
        .await
        .expect("the replica announced its internal address")
        .get(0)
}

async fn setup() -> Setup {
    let mock = MockProvider::start().await;
    let stack = Stack::start(&mock, 2).await;
    let mut client = stack.client(1).await;
    let sid = stack.session(&mut client).await;
    let dir = stack.workspace_dir.clone();
    Setup {
        _mock: mock,
        stack,
        client,
        sid,
        dir,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn git_status_and_diff_agree_with_the_git_cli() {
    let Setup {
        stack: _stack,
        mut client,
        sid,
        dir,
        ..
    } = setup().await;
    let non_utf8: &[u8] = b"caf\xe9.txt";

    // A plain directory is not a repository.
    write(&dir, "plain.txt", "x\n");
    assert_eq!(client.ok("git.status", json!({"sessionId": sid})).await, Value::Null);

    // An unborn repository: no head, a staged addition, an untracked file.
    clear(&dir);
    git(&dir, &["init", "-q", "-b", "main"]);
    write(&dir, "first.txt", "one\n");
    write(&dir, "loose.txt", "loose\n");
    git(&dir, &["add", "first.txt"]);
    let st = client.ok("git.status", json!({"sessionId": sid})).await;
    assert_eq!(st["head"], Value::Null, "{st}");
    assert_eq!(berth_status(&st), cli_status(&dir));
    let d = diff(&mut client, &sid, b"first.txt", "staged").await;
    assert_eq!(d["kind"], "text");
    assert_eq!(
        hunks(d["patch"].as_str().unwrap().as_bytes()),
        hunks(&git(&dir, &["diff", "--cached", "--", "first.txt"]))
    );

    // Every kind of change at once.
    clear(&dir);
    git(&dir, &["init", "-q", "-b", "main"]);
    let lines: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    for f in [
        "staged.txt",
        "modified.txt",
        "both.txt",
        "deleted.txt",
        "removed.txt",
        "old.txt",
    ] {
        write(&dir, f, &lines);
    }
    write(&dir, "image.bin", b"\x89PNG\0\0\x01binary");
    write(&dir, ".gitignore", "*.log\n");
    write(&dir, PathBuf::from(std::ffi::OsStr::from_bytes(non_utf8)), "caf\n");
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "base"]);

    write(&dir, "staged.txt", lines.replace("line 5\n", "line five\n"));
    git(&dir, &["add", "staged.txt"]);
    write(&dir, "modified.txt", lines.replace("line 20\n", "line twenty\n"));
    write(&dir, "both.txt", lines.replace("line 1\n", "line one\n"));
    git(&dir, &["add", "both.txt"]);
    write(
        &dir,
        "both.txt",
        lines.replace("line 1\n", "line one\n").replace("line 30\n", "end"),
    );
    std::fs::remove_file(dir.join("deleted.txt")).unwrap();
    git(&dir, &["rm", "-q", "removed.txt"]);
    git(&dir, &["mv", "old.txt", "renamed.txt"]);
    write(&dir, "image.bin", b"\x89PNG\0\0\x02other");
    write(
        &dir,
        PathBuf::from(std::ffi::OsStr::from_bytes(non_utf8)),
        "café au lait\n",
    );
    write(&dir, "new/deep/untracked.txt", "new\n");
    write(&dir, "ignored.log", "noise\n");
    write(
        &dir,
        PathBuf::from(std::ffi::OsStr::from_bytes(b"new-\xff")),
        "odd name\n",
    );

    let st = client.ok("git.status", json!({"sessionId": sid})).await;
    let head = String::from_utf8(git(&dir, &["rev-parse", "HEAD"])).unwrap();
    assert_eq!(st["head"]["oid"], head.trim());
    assert_eq!(st["head"]["ref"], "refs/heads/main");
    let ours = berth_status(&st);
    assert_eq!(ours, cli_status(&dir));
    // The shapes the CLI reports are all there (so the comparison covered them).
    for (area, path, change) in [
        ("staged", &b"staged.txt"[..], "modified"),
        ("worktree", b"modified.txt", "modified"),
        ("staged", b"both.txt", "modified"),
        ("worktree", b"both.txt", "modified"),
        ("worktree", b"deleted.txt", "deleted"),
        ("staged", b"removed.txt", "deleted"),
        ("staged", b"old.txt", "deleted"),
        ("staged", b"renamed.txt", "added"),
        ("worktree", b"image.bin", "modified"),
        ("worktree", non_utf8, "modified"),
        ("untracked", b"new/deep/untracked.txt", "added"),
        ("untracked", b"new-\xff", "added"),
    ] {
        assert!(
            ours.contains(&(area.to_string(), path.to_vec(), change.to_string())),
            "{area} {} {change} missing from {ours:?}",
            String::from_utf8_lossy(path)
        );
    }

    // Diffs: the same hunks as `git diff`.
    for (path, area, args) in [
        (&b"staged.txt"[..], "staged", vec!["diff", "--cached", "--"]),
        (b"both.txt", "staged", vec!["diff", "--cached", "--"]),
        (b"both.txt", "worktree", vec!["diff", "--"]),
        (b"modified.txt", "worktree", vec!["diff", "--"]),
        (b"deleted.txt", "worktree", vec!["diff", "--"]),
        (b"removed.txt", "staged", vec!["diff", "--cached", "--"]),
        (b"renamed.txt", "staged", vec!["diff", "--cached", "--no-renames", "--"]),
    ] {
        let ours = diff(&mut client, &sid, path, area).await;
        assert_eq!(ours["kind"], "text", "{ours}");
        let name = String::from_utf8_lossy(path).into_owned();
        let mut args = args.clone();
        args.push(&name);
        let theirs = git(&dir, &args);
        assert_eq!(
            hunks(ours["patch"].as_str().unwrap().as_bytes()),
            hunks(&theirs),
            "{name} {area}"
        );
        assert!(!hunks(&theirs).is_empty());
    }
    let untracked = diff(&mut client, &sid, b"new/deep/untracked.txt", "untracked").await;
    let cli = git_cmd(
        &dir,
        &["diff", "--no-index", "--", "/dev/null", "new/deep/untracked.txt"],
    );
    assert_eq!(
        hunks(untracked["patch"].as_str().unwrap().as_bytes()),
        hunks(&cli.stdout)
    );
    let bin = diff(&mut client, &sid, b"image.bin", "worktree").await;
    assert_eq!(bin, json!({"kind": "binary"}));
    let same = diff(&mut client, &sid, b"staged.txt", "worktree").await;
    assert_eq!(same, json!({"kind": "unchanged"}));
    let text = diff(&mut client, &sid, non_utf8, "worktree").await;
    assert_eq!(text["kind"], "text");
    assert!(text["patch"].as_str().unwrap().contains("+café au lait"));

    // Bad paths are typed errors.
    for bad in [&b"../etc/passwd"[..], b"/etc/passwd", b""] {
        let e = client
            .call(
                "git.diff",
                json!({"sessionId": sid, "path": {"bytesBase64": b64(bad)}, "area": "worktree"}),
            )
            .await
            .unwrap_err();
        assert_eq!(code(&e), "bad-params");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn configured_commands_never_run_through_berth_but_do_through_the_cli() {
    let Setup {
        stack: _stack,
        mut client,
        sid,
        dir,
        ..
    } = setup().await;
    let sentinels = berth_e2e::harness::scratch_dir("sentinels");
    let s = sentinels.display().to_string();
    git(&dir, &["init", "-q", "-b", "main"]);
    write(&dir, "a.txt", "a\n");
    write(&dir, "b.txt", "b\n");
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "base"]);
    // Every configured command the CLI would run during status and diff leaves a file.
    write(&dir, ".gitattributes", "*.txt filter=sent diff=sent\n");
    let fsmonitor = sentinels.join("fsmonitor.sh");
    std::fs::write(&fsmonitor, format!("#!/bin/sh\ntouch {s}/fsmonitor\nexit 1\n")).unwrap();
    let hook = dir.join(".git/hooks/post-index-change");
    std::fs::write(&hook, format!("#!/bin/sh\ntouch {s}/hook\n")).unwrap();
    for f in [&fsmonitor, &hook] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let clean = format!("touch {s}/clean; cat");
    git(&dir, &["config", "core.fsmonitor", fsmonitor.to_str().unwrap()]);
    git(&dir, &["config", "filter.sent.clean", &clean]);
    git(
        &dir,
        &["config", "diff.external", &format!("sh -c 'touch {s}/external' --")],
    );
    git(
        &dir,
        &[
            "config",
            "diff.sent.textconv",
            &format!("sh -c 'touch {s}/textconv; cat \"$1\"' --"),
        ],
    );
    write(&dir, "a.txt", "changed\n");
    // A new mtime, the same content: the CLI refreshes and rewrites the index.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    write(&dir, "b.txt", "b\n");
    let made = || -> BTreeSet<String> {
        std::fs::read_dir(&sentinels)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".sh"))
            .collect()
    };

    // An external filter is refused explicitly (comparing without it would be wrong).
    let e = client.call("git.status", json!({"sessionId": sid})).await.unwrap_err();
    assert_eq!(
        (code(&e), e.data["feature"].as_str()),
        ("unsupported", Some("external-filter"))
    );
    let e = client
        .call(
            "git.diff",
            json!({"sessionId": sid, "path": {"bytesBase64": b64(b"a.txt")}, "area": "worktree"}),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "unsupported");
    // Without the filter, status and diff work and still run nothing.
    git(&dir, &["config", "--unset", "filter.sent.clean"]);
    let st = client.ok("git.status", json!({"sessionId": sid})).await;
    assert_eq!(berth_status(&st), cli_status_quiet(&dir));
    let d = diff(&mut client, &sid, b"a.txt", "worktree").await;
    assert_eq!(d["kind"], "text");
    assert!(d["patch"].as_str().unwrap().contains("-a\n+changed\n"), "{d}");
    let unchanged = diff(&mut client, &sid, b"b.txt", "worktree").await;
    assert_eq!(unchanged, json!({"kind": "unchanged"}));
    assert_eq!(made(), BTreeSet::new(), "Berth ran a configured command");

    // The same operations through the CLI run every one of them (so this test can fail).
    git(&dir, &["config", "filter.sent.clean", &clean]);
    git(&dir, &["status", "--porcelain"]);
    git_cmd(&dir, &["diff"]);
    git_cmd(&dir, &["diff", "--no-ext-diff"]);
    let expected: BTreeSet<String> = ["clean", "external", "fsmonitor", "hook", "textconv"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(made(), expected);
}

/// `cli_status` on a copy without the repository's fsmonitor and hooks (they would leave
/// sentinels).
fn cli_status_quiet(dir: &Path) -> Status {
    let tmp = berth_e2e::harness::scratch_dir("quiet");
    let out = Command::new("cp").arg("-a").arg(dir).arg(&tmp).status().unwrap();
    assert!(out.success());
    let copy = tmp.join(dir.file_name().unwrap());
    git(&copy, &["config", "--unset", "core.fsmonitor"]);
    std::fs::remove_file(copy.join(".git/hooks/post-index-change")).unwrap();
    cli_status(&copy)
}

/// Collected `files.read` items: (begin, content, end), checking contiguous offsets.
async fn collect_read(sub: &mut berth_e2e::client::Subscription) -> (Value, Vec<u8>, Option<Value>) {
    let begin = sub.next(60).await.expect("begin");
    let mut content = Vec::new();
    loop {
        let Some(item) = sub.next(60).await else {
            return (begin, content, None);
        };
        match item["type"].as_str() {
            Some("chunk") => {
                assert_eq!(
                    item["offset"].as_u64().unwrap(),
                    content.len() as u64,
                    "contiguous offsets"
                );
                let data = unb64(item["dataBase64"].as_str().unwrap());
                assert!(data.len() <= 32 << 10);
                content.extend_from_slice(&data);
            }
            Some("end") => return (begin, content, Some(item)),
            other => panic!("unexpected item {other:?}: {item}"),
        }
    }
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

/// Valid UTF-8 text of about `len` bytes with multi-byte characters, so that chunk cuts
/// meet character boundaries.
fn text_of(len: usize, seed: &str) -> Vec<u8> {
    let line = format!("{seed} — naïve café ünïcödé ✓ 0123456789\n");
    line.repeat(len / line.len() + 1).into_bytes()
}

#[tokio::test(flavor = "multi_thread")]
async fn files_read_through_the_other_replica() {
    let Setup {
        stack: _stack,
        mut client,
        sid,
        dir,
        ..
    } = setup().await;
    let content = text_of(5 << 20, "five");
    write(&dir, "big.txt", &content);
    let mut sub = client.subscribe(
        "files.read",
        json!({"sessionId": sid, "path": {"bytesBase64": b64(b"big.txt")}}),
    );
    let (begin, got, end) = collect_read(&mut sub).await;
    assert_eq!(begin["type"], "begin");
    assert_eq!(begin["kind"], "text");
    assert_eq!(begin["size"], content.len() as u64);
    let end = end.expect("end");
    assert!(got == content, "the content arrives whole");
    assert_eq!(end["sha256"], sha256_hex(&content));
    assert_eq!(end["version"], begin["version"]);
    assert_eq!(end.get("replaced"), None);
    let done = sub.done.await.unwrap();
    assert!(
        done.error.is_none() && done.result.unwrap_or_default().is_null(),
        "final value null"
    );
    let version = begin["version"].as_str().unwrap().to_string();

    // Two reads of the file at once, the first read last: each arrives whole (the two
    // calls' chunks never mix on the worker's connection or between the replicas).
    let path = json!({"sessionId": sid, "path": {"bytesBase64": b64(b"big.txt")}});
    let mut first = client.subscribe("files.read", path.clone());
    let mut second = client.subscribe("files.read", path);
    for sub in [&mut second, &mut first] {
        let (begin, got, end) = collect_read(sub).await;
        assert_eq!(begin["version"], version.as_str());
        assert!(got == content, "a concurrent read arrives whole ({} bytes)", got.len());
        assert_eq!(end.expect("end")["sha256"], sha256_hex(&content));
    }

    // After a replace, `expectedVersion` reports the change instead of reading.
    write(&dir, "replacement.tmp", "new\n");
    std::fs::rename(dir.join("replacement.tmp"), dir.join("big.txt")).unwrap();
    let mut stale = client.subscribe(
        "files.read",
        json!({"sessionId": sid, "path": {"bytesBase64": b64(b"big.txt")}, "expectedVersion": version}),
    );
    let changed = stale.next(30).await.unwrap();
    assert_eq!(changed["type"], "changed");
    assert_ne!(changed["version"], version.as_str());

    // A replace during delivery: every chunk from the one captured buffer, and `end` says
    // the path no longer names it. The file is large enough that the worker is still
    // delivering (held back by credit) while the client does not read.
    let old = text_of(48 << 20, "old");
    write(&dir, "huge.txt", &old);
    let mut sub = client.subscribe(
        "files.read",
        json!({"sessionId": sid, "path": {"bytesBase64": b64(b"huge.txt")}}),
    );
    let begin = sub.next(60).await.expect("begin");
    client.pause_reading(true);
    write(&dir, "huge.tmp", text_of(48 << 20, "new"));
    std::fs::rename(dir.join("huge.tmp"), dir.join("huge.txt")).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    client.pause_reading(false);
    let mut got = Vec::new();
    let end = loop {
        let item = sub.next(60).await.expect("item");
        match item["type"].as_str() {
            Some("chunk") => {
                assert_eq!(item["offset"].as_u64().unwrap(), got.len() as u64);
                got.extend_from_slice(&unb64(item["dataBase64"].as_str().unwrap()));
            }
            Some("end") => break item,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(begin["type"], "begin");
    assert!(got == old, "all chunks come from the version captured first");
    assert_eq!(end["sha256"], sha256_hex(&old));
    assert_eq!(end["replaced"], true);

    // Outcomes and refusals.
    let outside = berth_e2e::harness::scratch_dir("outside");
    std::fs::write(outside.join("secret"), "secret").unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), dir.join("leak")).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("leakdir")).unwrap();
    write(&dir, "blob.bin", b"\0\x01\x02binary");
    let one = |path: &[u8]| json!({"sessionId": sid, "path": {"bytesBase64": b64(path)}});
    for (path, expected) in [
        (&b"missing.txt"[..], json!({"type": "absent"})),
        (b"blob.bin", json!({"type": "binary"})),
        (b"leak", json!({"type": "unsupported", "reason": "symlink"})),
    ] {
        let mut s = client.subscribe("files.read", one(path));
        assert_eq!(s.next(30).await.unwrap(), expected);
    }
    for (path, expected) in [
        (&b"leakdir/secret"[..], "forbidden"),
        (b"../outside/secret", "bad-params"),
        (b"/etc/passwd", "bad-params"),
        (b".git/config", "forbidden"),
    ] {
        let s = client.subscribe("files.read", one(path));
        let done = tokio::time::timeout(std::time::Duration::from_secs(30), s.done)
            .await
            .unwrap()
            .unwrap();
        let e = done
            .error
            .unwrap_or_else(|| panic!("{} was read", String::from_utf8_lossy(path)));
        assert_eq!(code(&e), expected, "{}", String::from_utf8_lossy(path));
    }
}

/// A forwarded call's response body, as a replica asking for frames and an older one
/// asking for JSON lines each get it: the same chunks either way.
#[tokio::test(flavor = "multi_thread")]
async fn a_forwarded_read_is_framed_for_new_replicas_and_json_lines_for_old_ones() {
    let Setup { stack, dir, .. } = setup().await;
    let content = text_of(200 << 10, "forwarded");
    write(&dir, "mid.txt", &content);
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let secret: String = db
        .query_one("SELECT secret FROM cluster_secret", &[])
        .await
        .unwrap()
        .get(0);
    let tenant: String = db
        .query_one("SELECT tenant_id FROM workspaces WHERE id = $1", &[&stack.workspace_id])
        .await
        .unwrap()
        .get(0);
    let body = json!({"tenantId": tenant, "call": {
        "workspaceId": stack.workspace_id,
        "method": "files.read",
        "params": {"sessionId": "s", "path": {"bytesBase64": b64(b"mid.txt")}},
    }});
    // The worker is on replica 0: the call runs there, as if replica 1 had forwarded it.
    let internal = internal_url(&stack, 0, &db).await;
    let forward = |accept: Option<&str>, runs: bool| {
        let mut req = reqwest::Client::new()
            .post(format!("{internal}/v1/internal/call"))
            .header("x-berth-cluster-secret", &secret)
            .json(&body);
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        if runs {
            req = req.header("x-berth-chunk-runs", "1");
        }
        req
    };
    // `max`: the most bytes one chunk item (or run frame) may carry.
    let check = |items: Vec<(String, u64, Vec<u8>)>, answer: Value, max: usize| {
        assert_eq!(items.first().map(|i| i.0.as_str()), Some("begin"));
        assert_eq!(items.last().map(|i| i.0.as_str()), Some("end"));
        let mut got = Vec::new();
        for (kind, offset, data) in &items[1..items.len() - 1] {
            assert_eq!(kind, "chunk");
            assert_eq!(*offset, got.len() as u64, "contiguous offsets");
            assert!(data.len() <= max, "{} bytes in one chunk", data.len());
            assert!(std::str::from_utf8(data).is_ok(), "cut on a UTF-8 boundary");
            got.extend_from_slice(data);
        }
        assert!(got == content, "the content arrives whole");
        assert_eq!(answer, Value::Null);
    };

    // An older replica (no `accept`): JSON lines, chunks as base64 items.
    let resp = forward(None, false).send().await.unwrap();
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let text = resp.text().await.unwrap();
    let (mut items, mut answer) = (Vec::new(), None);
    for line in text.lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        if let Some(item) = line.get("item") {
            let data = item["dataBase64"].as_str().map(unb64).unwrap_or_default();
            let kind = item["type"].as_str().unwrap().to_string();
            items.push((kind, item["offset"].as_u64().unwrap_or(0), data));
        } else if let Some(r) = line.get("result") {
            answer = Some(r.clone());
        }
    }
    check(
        items,
        answer.unwrap_or_else(|| panic!("no answer line: {}", text.lines().last().unwrap_or_default())),
        32 << 10,
    );

    // A replica asking for frames: length-prefixed, chunks as raw bytes; runs of chunks as
    // one frame only to a replica that says it reads them.
    let frames = "application/x-berth-call-frames";
    for runs in [false, true] {
        let resp = forward(Some(frames), runs).send().await.unwrap();
        assert_eq!(resp.headers()["content-type"], frames);
        let bytes = resp.bytes().await.unwrap();
        let (items, answer, run_frames) = read_frames(&bytes);
        assert_eq!(run_frames > 0, runs, "run frames only when asked for");
        check(
            items,
            answer.expect("an answer frame"),
            if runs { 256 << 10 } else { 32 << 10 },
        );
    }
}

/// A forwarded call's item as a test sees it: kind, offset, bytes.
type SeenItem = (String, u64, Vec<u8>);

/// A framed forwarded-call body's items, its answer, and how many chunk-run frames it held.
fn read_frames(bytes: &[u8]) -> (Vec<SeenItem>, Option<Value>, usize) {
    use base64::Engine;
    let (mut items, mut answer, mut at, mut runs) = (Vec::new(), None, 0, 0);
    while at < bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let frame = &bytes[at + 4..at + 4 + len];
        at += 4 + len;
        match frame[0] {
            1 => {
                let item: Value = serde_json::from_slice(&frame[1..]).unwrap();
                items.push((item["type"].as_str().unwrap().to_string(), 0, Vec::new()));
            }
            2 => {
                let offset = u64::from_be_bytes(frame[1..9].try_into().unwrap());
                items.push(("chunk".to_string(), offset, frame[9..].to_vec()));
            }
            // A run of whole chunks: offset, flags (1: text), bytes.
            6 => {
                let offset = u64::from_be_bytes(frame[1..9].try_into().unwrap());
                assert_eq!(frame[9], 1, "a text file's run");
                items.push(("chunk".to_string(), offset, frame[10..].to_vec()));
                runs += 1;
            }
            3 => answer = Some(serde_json::from_slice(&frame[1..]).unwrap()),
            5 => {}
            other => panic!(
                "frame kind {other}: {}",
                base64::engine::general_purpose::STANDARD.encode(frame)
            ),
        }
    }
    (items, answer, runs)
}

#[tokio::test(flavor = "multi_thread")]
async fn files_list_and_watch_through_the_other_replica() {
    let Setup {
        stack: _stack,
        mut client,
        sid,
        dir,
        ..
    } = setup().await;
    std::fs::create_dir_all(dir.join(".git")).unwrap();
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    for i in 0..300 {
        write(&dir, format!("sub/f{i:03}"), "x");
    }
    write(&dir, PathBuf::from(std::ffi::OsStr::from_bytes(b"sub/\xff-odd")), "y");
    std::os::unix::fs::symlink("/etc", dir.join("sub/link")).unwrap();
    // Pages of at most 128 entries, sorted by bytes, following `next`.
    let sub_path = json!({"bytesBase64": b64(b"sub")});
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut after = Value::Null;
    let mut identity = None;
    loop {
        let page = client
            .ok(
                "files.list",
                json!({"sessionId": sid, "path": sub_path, "after": after}),
            )
            .await;
        assert!(page["entries"].as_array().unwrap().len() <= 128);
        identity.get_or_insert(page["directoryIdentity"].clone());
        for e in page["entries"].as_array().unwrap() {
            names.push(unb64(e["path"]["bytesBase64"].as_str().unwrap()));
            if e["path"]["bytesBase64"] == b64(b"sub/link") {
                assert_eq!(e["kind"], "symlink");
            }
        }
        assert!(page.get("next").is_none(), "one cursor name: nextAfter");
        match page.get("nextAfter").filter(|n| !n.is_null()) {
            Some(n) => after = n.clone(),
            None => break,
        }
    }
    assert_eq!(names.len(), 302);
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert!(names.contains(&b"sub/\xff-odd".to_vec()));
    let root = client.ok("files.list", json!({"sessionId": sid})).await;
    let top: Vec<Value> = root["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].clone())
        .collect();
    assert_eq!(top, [json!({"bytesBase64": b64(b"sub")})], ".git is never listed");

    // Watch: ready (matching the listing), changed after a file appears, unavailable when
    // the directory goes away.
    let mut watch = client.subscribe("files.watch", json!({"sessionId": sid, "path": sub_path}));
    let ready = watch.next(30).await.expect("ready");
    assert_eq!(ready["type"], "ready");
    assert_eq!(Some(&ready["directoryIdentity"]), identity.as_ref());
    write(&dir, "sub/created.txt", "new");
    assert_eq!(watch.next(30).await.expect("changed"), json!({"type": "changed"}));
    std::fs::remove_dir_all(dir.join("sub")).unwrap();
    let done = tokio::time::timeout(std::time::Duration::from_secs(30), watch.done)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.result, Some(json!({"type": "unavailable"})));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_lost_mid_read_is_a_typed_error_and_then_offline() {
    let Setup {
        mut stack,
        mut client,
        sid,
        dir,
        ..
    } = setup().await;
    write(&dir, "huge.txt", text_of(48 << 20, "x"));
    let mut sub = client.subscribe(
        "files.read",
        json!({"sessionId": sid, "path": {"bytesBase64": b64(b"huge.txt")}}),
    );
    assert_eq!(sub.next(60).await.expect("begin")["type"], "begin");
    client.pause_reading(true);
    stack.kill_worker().await;
    client.pause_reading(false);
    while let Some(item) = sub.next(10).await {
        assert_eq!(item["type"], "chunk", "no end after the worker was lost");
    }
    let done = tokio::time::timeout(std::time::Duration::from_secs(60), sub.done)
        .await
        .expect("an answer, not a hang")
        .unwrap();
    let e = done.error.expect("a typed error");
    assert_eq!(code(&e), "unavailable");
    // With no worker, calls answer `workspace-offline` at once.
    let e = client.call("git.status", json!({"sessionId": sid})).await.unwrap_err();
    assert_eq!(code(&e), "workspace-offline");
}

#[tokio::test(flavor = "multi_thread")]
async fn workspaces_are_renamed_completed_and_removed() {
    let Setup {
        stack,
        mut client,
        sid,
        dir,
        ..
    } = setup().await;
    let wid = stack.workspace_id.clone();
    // The replica-to-replica endpoint is on its own listener and wants the cluster secret;
    // the public listener does not serve it at all, whatever it is given.
    let db = berth_e2e::harness::db(&stack.database_url).await;
    let secret: String = db
        .query_one("SELECT secret FROM cluster_secret", &[])
        .await
        .unwrap()
        .get(0);
    let internal = internal_url(&stack, 0, &db).await;
    assert_ne!(internal, format!("http://{}", stack.servers[0].addr));
    let call = json!({"tenantId": "x", "call": {"workspaceId": wid, "method": "git.status"}});
    for secret in [None, Some("wrong")] {
        let mut req = reqwest::Client::new()
            .post(format!("{internal}/v1/internal/call"))
            .json(&call);
        if let Some(s) = secret {
            req = req.header("x-berth-cluster-secret", s);
        }
        assert_eq!(req.send().await.unwrap().status(), 403);
    }
    let public = reqwest::Client::new()
        .post(format!("http://{}/v1/internal/call", stack.servers[0].addr))
        .header("x-berth-cluster-secret", &secret)
        .json(&call)
        .send()
        .await
        .unwrap();
    assert_eq!(
        public.status(),
        404,
        "the public listener serves no replica-to-replica call"
    );
    let renamed = client
        .ok(
            "workspace.rename",
            json!({"workspaceId": wid, "title": "Renamed", "operationId": "op-1"}),
        )
        .await;
    assert_eq!(renamed["title"], "Renamed");
    let e = client
        .call("workspace.rename", json!({"workspaceId": wid, "title": "  "}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "bad-params");

    std::fs::create_dir_all(dir.join(".git")).unwrap();
    write(&dir, ".gitignore", "target/\n");
    write(&dir, "src/deep/mod.rs", "");
    write(&dir, "src/lib.rs", "");
    write(&dir, "target/out", "");
    let files = client
        .ok("workspace.files", json!({"workspaceId": wid, "prefix": "src/d"}))
        .await;
    assert_eq!(
        files["entries"],
        json!([{"path": "src/deep", "dir": true}, {"path": "src/deep/mod.rs", "dir": false}])
    );
    let all = client.ok("workspace.files", json!({"workspaceId": wid})).await;
    let paths: Vec<&str> = all["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.contains(&"src/lib.rs") && !paths.iter().any(|p| p.starts_with("target")),
        "{paths:?}"
    );

    let removed = client
        .ok("workspace.remove", json!({"workspaceId": wid, "operationId": "op-2"}))
        .await;
    assert_eq!(removed, json!({"removed": true}));
    let e = client.call("session.get", json!({"sessionId": sid})).await.unwrap_err();
    assert_eq!(code(&e), "not-found");
    let again = client.ok("workspace.remove", json!({"workspaceId": wid})).await;
    assert_eq!(again, json!({"removed": false}));
    let e = client
        .call("workspace.get", json!({"workspaceId": wid}))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "not-found");
}

/// Issue 49: `git.diff` is bounded — a side past the file bound is refused as `too-large`
/// without being read, a long diff is cut at a line end and marked — so an observation never
/// closes the worker's connection, and a turn running on the workspace meanwhile goes on. A
/// mode change alone and an empty new file are diffs as git prints them.
#[tokio::test(flavor = "multi_thread")]
async fn a_huge_diff_is_bounded_and_the_running_turn_goes_on() {
    use std::os::unix::fs::PermissionsExt;
    let Setup {
        _mock: mock,
        stack,
        mut client,
        sid,
        dir,
    } = setup().await;
    git(&dir, &["init", "-q", "-b", "main"]);
    write(&dir, "huge.txt", "a line of a huge file\n".repeat(1 << 20));
    write(&dir, "big.txt", "a line of a big file\n".repeat(100_000));
    mock.push(Reply::StreamThenHang(vec![Part::Text("working".into())]));
    let mut worker_side = stack.client(0).await;
    let turn_sid = stack.session(&mut worker_side).await;
    let mut watch = worker_side.subscribe("session.watch", json!({"sessionId": turn_sid, "after": 0}));
    let sent = worker_side
        .ok("session.send", json!({"sessionId": turn_sid, "prompt": "work"}))
        .await;
    watch
        .until(30, |i| i["type"] == "model.delta")
        .await
        .expect("the turn streams");

    let d = diff(&mut client, &sid, b"huge.txt", "untracked").await;
    assert_eq!(d, json!({"kind": "unsupported", "reason": "too-large"}));
    let d = diff(&mut client, &sid, b"big.txt", "untracked").await;
    assert_eq!(d["kind"], "text");
    let patch = d["patch"].as_str().unwrap();
    let t = &d["truncated"];
    assert_eq!(t["truncated"], true);
    assert_eq!(t["returned"].as_u64().unwrap(), patch.len() as u64);
    assert!(
        patch.len() <= 1 << 20 && t["bytes"].as_u64().unwrap() > 2_000_000,
        "{t}"
    );
    assert!(
        patch.starts_with(
            "diff --git a/big.txt b/big.txt\nnew file mode 100644\nindex 0000000000000000000000000000000000000000.."
        ) && patch.contains("\n--- /dev/null\n+++ b/big.txt\n")
            && patch.ends_with("big file\n"),
        "{}",
        &patch[..200]
    );

    // A mode change alone, and an empty new file, as git prints them (no hunk).
    write(&dir, "run.sh", "echo hi\n");
    git(&dir, &["add", "run.sh"]);
    std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = diff(&mut client, &sid, b"run.sh", "worktree").await;
    let ours = d["patch"].as_str().unwrap().to_string();
    let cli = String::from_utf8(git(&dir, &["diff", "--", "run.sh"])).unwrap();
    assert_eq!(ours, cli, "{d}");
    assert_eq!(ours, "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n");
    write(&dir, "empty.txt", "");
    let d = diff(&mut client, &sid, b"empty.txt", "untracked").await;
    assert_eq!(
        d["patch"],
        "diff --git a/empty.txt b/empty.txt\nnew file mode 100644\n\
         index 0000000000000000000000000000000000000000..e69de29bb2d1d6434b8b29ae775ad8c2e48c5391\n",
        "{d}"
    );
    assert!(client.ok("git.status", json!({"sessionId": sid})).await.is_object());

    // The worker kept its connection: the turn still runs, and stops as asked (not lost).
    let snap = worker_side.ok("session.get", json!({"sessionId": turn_sid})).await;
    assert_eq!(snap["running"], sent["turnId"], "{snap}");
    worker_side
        .ok("session.stop", json!({"sessionId": turn_sid, "turnId": sent["turnId"]}))
        .await;
    let ended = watch
        .until(30, |i| i["type"] == "turn.ended")
        .await
        .expect("the turn ends");
    assert_eq!(ended.last().unwrap()["state"], "cancelled", "{:?}", ended.last());
}

/// Issue 49: index states as git reports them — an intent to add (`git add -N`) is an
/// addition in the worktree, not staged, and diffs as a new file; a conflicted path is
/// reported unmerged and diffs as git's "Unmerged path", not a deletion; staged entries come
/// sorted; a non-UTF-8 name keeps its bytes in a diff (git's quoted octal form).
#[tokio::test(flavor = "multi_thread")]
async fn index_states_and_names_are_reported_as_git_reports_them() {
    let Setup {
        stack: _stack,
        mut client,
        sid,
        dir,
        ..
    } = setup().await;
    git(&dir, &["init", "-q", "-b", "main"]);
    write(&dir, "conflict.txt", "base\n");
    write(&dir, "z/last.txt", "z\n");
    git(&dir, &["add", "."]);
    git(&dir, &["commit", "-q", "-m", "base"]);
    git(&dir, &["checkout", "-q", "-b", "other"]);
    write(&dir, "conflict.txt", "theirs\n");
    git(&dir, &["commit", "-q", "-am", "theirs"]);
    git(&dir, &["checkout", "-q", "main"]);
    write(&dir, "conflict.txt", "ours\n");
    git(&dir, &["commit", "-q", "-am", "ours"]);
    let merge = git_cmd(&dir, &["merge", "-q", "other"]);
    assert!(!merge.status.success(), "the merge conflicts");
    // Staged changes in several directories, added in reverse order.
    write(&dir, "z/new.txt", "z\n");
    write(&dir, "a/new.txt", "a\n");
    git(&dir, &["add", "z/new.txt"]);
    git(&dir, &["add", "a/new.txt"]);
    write(&dir, "intent.txt", "to be added\n");
    git(&dir, &["add", "-N", "intent.txt"]);
    let odd: &[u8] = b"caf\xe9 \"q\".txt";
    write(&dir, std::ffi::OsStr::from_bytes(odd), "odd\n");

    let st = client.ok("git.status", json!({"sessionId": sid})).await;
    assert_eq!(berth_status(&st), cli_status(&dir), "{st}");
    let staged: Vec<Vec<u8>> = st["staged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| unb64(e["path"]["bytesBase64"].as_str().unwrap()))
        .collect();
    let mut sorted = staged.clone();
    sorted.sort();
    assert_eq!(staged, sorted, "staged entries are sorted");

    let d = diff(&mut client, &sid, b"conflict.txt", "staged").await;
    assert_eq!(d["patch"], "* Unmerged path conflict.txt\n", "{d}");
    let d = diff(&mut client, &sid, b"intent.txt", "worktree").await;
    let ours = d["patch"].as_str().unwrap().to_string();
    assert!(
        ours.starts_with(
            "diff --git a/intent.txt b/intent.txt\nnew file mode 100644\nindex 0000000000000000000000000000000000000000.."
        ) && ours.contains("\n--- /dev/null\n+++ b/intent.txt\n"),
        "{ours}"
    );
    assert_eq!(hunks(ours.as_bytes()), hunks(&git(&dir, &["diff", "--", "intent.txt"])));
    assert_eq!(
        diff(&mut client, &sid, b"intent.txt", "staged").await,
        json!({"kind": "unchanged"})
    );
    let d = diff(&mut client, &sid, odd, "untracked").await;
    let head = d["patch"].as_str().unwrap().lines().next().unwrap().to_string();
    assert_eq!(
        head, "diff --git \"a/caf\\351 \\\"q\\\".txt\" \"b/caf\\351 \\\"q\\\".txt\"",
        "{d}"
    );
    assert!(!d.to_string().contains('\u{fffd}'), "{d}");

    // Text that is not UTF-8 is a text diff: its exact bytes, as git prints them, in
    // `patchBase64`.
    write(&dir, "latin1.txt", b"caf\xe9\nna\xefve\n");
    let d = diff(&mut client, &sid, b"latin1.txt", "untracked").await;
    assert_eq!(d["kind"], "text", "{d}");
    assert!(d["patchBase64"].is_string(), "{d}");
    let cli = git_cmd(
        &dir,
        &["diff", "--no-index", "--full-index", "--", "/dev/null", "latin1.txt"],
    );
    assert_eq!(unb64(d["patchBase64"].as_str().unwrap()), cli.stdout, "{d}");
    assert_eq!(d["patch"], String::from_utf8_lossy(&cli.stdout).as_ref());
}
