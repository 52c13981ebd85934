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
use berth_e2e::{Client, MockProvider, Stack, client::code};
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
    for f in ["staged.txt", "modified.txt", "both.txt", "deleted.txt", "removed.txt", "old.txt"] {
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
    write(&dir, "both.txt", lines.replace("line 1\n", "line one\n").replace("line 30\n", "end"));
    std::fs::remove_file(dir.join("deleted.txt")).unwrap();
    git(&dir, &["rm", "-q", "removed.txt"]);
    git(&dir, &["mv", "old.txt", "renamed.txt"]);
    write(&dir, "image.bin", b"\x89PNG\0\0\x02other");
    write(&dir, PathBuf::from(std::ffi::OsStr::from_bytes(non_utf8)), "café au lait\n");
    write(&dir, "new/deep/untracked.txt", "new\n");
    write(&dir, "ignored.log", "noise\n");
    write(&dir, PathBuf::from(std::ffi::OsStr::from_bytes(b"new-\xff")), "odd name\n");

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
    let cli = git_cmd(&dir, &["diff", "--no-index", "--", "/dev/null", "new/deep/untracked.txt"]);
    assert_eq!(hunks(untracked["patch"].as_str().unwrap().as_bytes()), hunks(&cli.stdout));
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
