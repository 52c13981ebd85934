//! Issue 49's corpus: scratch repositories in every state the issue names, where
//! `git.status` must equal `git status --porcelain=v2 -z`, every `git.diff` the bytes of
//! `git diff --full-index` (`--cached`, `--no-index` for untracked files), and
//! `patch.snapshot`, applied with `git apply` to a fresh clone of its base, must reproduce
//! the working tree (contents, modes, symlinks).

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsStr,
    os::unix::{
        ffi::OsStrExt,
        fs::{PermissionsExt, symlink},
    },
    path::Path,
    process::Command,
};

use base64::Engine;
use berth_protocol::{GitArea, GitChange, GitDiff, GitSubmodule};

use super::{diff, patch, status};
use crate::observe::decode_raw;

fn cli<S: AsRef<OsStr>>(dir: &Path, args: &[S]) -> std::process::Output {
    Command::new("git")
        .args(["-c", "protocol.file.allow=always"])
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

/// Run git in `dir` (no system or user configuration), its output; it must succeed.
pub(super) fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = cli(dir, args);
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Whether git succeeds at `args` in `dir`.
pub(super) fn cli_ok(dir: &Path, args: &[&str]) -> bool {
    cli(dir, args).status.success()
}

fn write(dir: &Path, rel: &str, data: impl AsRef<[u8]>) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, data).unwrap();
}

/// Areas by path: what changed in each, and a submodule's state.
#[derive(Debug, Default, PartialEq, Eq)]
struct Areas {
    staged: BTreeMap<Vec<u8>, GitChange>,
    worktree: BTreeMap<Vec<u8>, GitChange>,
    untracked: BTreeSet<Vec<u8>>,
    submodules: BTreeMap<Vec<u8>, GitSubmodule>,
}

fn change(letter: u8) -> GitChange {
    match letter {
        b'A' => GitChange::Added,
        b'M' => GitChange::Modified,
        b'D' => GitChange::Deleted,
        b'T' => GitChange::TypeChanged,
        other => panic!("unexpected status letter {}", other as char),
    }
}

/// `git status --porcelain=v2 -z -uall --no-renames`, parsed.
fn cli_status(dir: &Path) -> Areas {
    let out = git(dir, &["status", "--porcelain=v2", "-z", "-uall", "--no-renames"]);
    let mut areas = Areas::default();
    for record in out.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        match record[0] {
            b'1' => {
                // 1 XY sub mH mI mW hH hI path
                let fields: Vec<&[u8]> = record.splitn(9, |b| *b == b' ').collect();
                let (xy, sub, path) = (fields[1], fields[2], fields[8].to_vec());
                if xy[0] != b'.' {
                    areas.staged.insert(path.clone(), change(xy[0]));
                }
                if xy[1] != b'.' {
                    areas.worktree.insert(path.clone(), change(xy[1]));
                }
                if sub[0] == b'S' {
                    let state = GitSubmodule {
                        commit_changed: sub[1] == b'C',
                        modified: sub[2] == b'M',
                        untracked: sub[3] == b'U',
                    };
                    areas.submodules.insert(path, state);
                }
            }
            b'u' => {
                let path = record.splitn(11, |b| *b == b' ').nth(10).unwrap().to_vec();
                areas.staged.insert(path, GitChange::Unmerged);
            }
            b'?' => {
                areas.untracked.insert(record[2..].to_vec());
            }
            other => panic!("unexpected record {}", other as char),
        }
    }
    areas
}

fn berth_status(dir: &Path) -> Areas {
    let st = status(dir).unwrap().expect("a repository");
    let mut areas = Areas::default();
    let mut sorted = Vec::new();
    for e in &st.staged {
        let path = decode_raw(&e.path).unwrap();
        sorted.push(path.clone());
        areas.staged.insert(path.clone(), e.change);
        if let Some(s) = e.submodule {
            areas.submodules.insert(path, s);
        }
    }
    assert!(sorted.is_sorted(), "staged entries are sorted");
    for e in &st.worktree {
        let path = decode_raw(&e.path).unwrap();
        areas.worktree.insert(path.clone(), e.change);
        if let Some(s) = e.submodule {
            assert_eq!(
                areas.submodules.insert(path, s).unwrap_or(s),
                s,
                "one state per submodule"
            );
        }
    }
    for e in &st.untracked {
        areas.untracked.insert(decode_raw(&e.path).unwrap());
    }
    areas
}

/// Berth's `git.diff` as bytes: the text (exactly), `binary` for a binary
/// answer, nothing when unchanged.
fn berth_diff(dir: &Path, path: &[u8], area: GitArea) -> Vec<u8> {
    match diff(dir, path, area).unwrap() {
        GitDiff::Text {
            patch,
            patch_base64: None,
            truncated: None,
        } => patch.into_bytes(),
        GitDiff::Text {
            patch,
            patch_base64: Some(bytes),
            truncated: None,
        } => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(bytes).unwrap();
            assert_eq!(patch, String::from_utf8_lossy(&bytes), "the text is the bytes, lossily");
            bytes
        }
        GitDiff::Binary => b"binary".to_vec(),
        GitDiff::Unchanged => Vec::new(),
        other => panic!("{}: {other:?}", String::from_utf8_lossy(path)),
    }
}

/// The CLI's diff of `path` in `area`; a binary one reduced to `binary`.
fn cli_diff(dir: &Path, path: &[u8], area: GitArea) -> Vec<u8> {
    let p = OsStr::from_bytes(path);
    let args: Vec<&OsStr> = match area {
        GitArea::Staged => ["diff", "--cached", "--full-index", "--"].map(OsStr::new).to_vec(),
        GitArea::Worktree => ["diff", "--full-index", "--"].map(OsStr::new).to_vec(),
        GitArea::Untracked => ["diff", "--no-index", "--full-index", "--", "/dev/null"]
            .map(OsStr::new)
            .to_vec(),
    };
    let out = cli(dir, &[args, vec![p]].concat()).stdout;
    let binary = out.split(|b| *b == b'\n').any(|l| l.starts_with(b"Binary files "));
    if binary { b"binary".to_vec() } else { out }
}

/// Every path in every area diffs as the CLI diffs it, byte for byte.
fn diffs_agree(dir: &Path, areas: &Areas) {
    let all = [
        (GitArea::Staged, areas.staged.keys().collect::<Vec<_>>()),
        (GitArea::Worktree, areas.worktree.keys().collect()),
        (GitArea::Untracked, areas.untracked.iter().collect()),
    ];
    for (area, paths) in all {
        for path in paths {
            let ours = berth_diff(dir, path, area);
            let theirs = cli_diff(dir, path, area);
            assert_eq!(
                String::from_utf8_lossy(&ours),
                String::from_utf8_lossy(&theirs),
                "{area:?} {}",
                String::from_utf8_lossy(path)
            );
            assert_eq!(ours, theirs, "{area:?} {}: the bytes", String::from_utf8_lossy(path));
        }
    }
}

/// Regular files, symlinks (their targets) and executable bits under `dir`, `.git`, the
/// submodule and `skip` left out.
fn tree(dir: &Path, skip: &[&str]) -> BTreeMap<String, (Vec<u8>, bool, bool)> {
    fn walk(root: &Path, dir: &Path, skip: &[&str], out: &mut BTreeMap<String, (Vec<u8>, bool, bool)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel == ".git" || skip.contains(&rel.as_str()) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(rel, (target.as_os_str().as_bytes().to_vec(), false, true));
            } else if meta.is_dir() {
                walk(root, &path, skip, out);
            } else {
                let exec = meta.permissions().mode() & 0o111 != 0;
                out.insert(rel, (std::fs::read(&path).unwrap(), exec, false));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, skip, &mut out);
    out
}

/// `patch.snapshot` applied with `git apply` to a fresh clone of HEAD reproduces `dir`.
fn snapshot_applies(dir: &Path, skip: &[&str]) {
    let (text, captured) = patch(dir, usize::MAX).unwrap();
    let clone = tempfile::tempdir().unwrap();
    git(clone.path(), &["clone", "-q", dir.to_str().unwrap(), "."]);
    git(clone.path(), &["checkout", "-q", captured.base.as_deref().unwrap()]);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &text).unwrap();
    git(clone.path(), &["apply", file.path().to_str().unwrap()]);
    let (ours, theirs) = (tree(dir, skip), tree(clone.path(), skip));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{text}"
    );
    for (path, o) in &ours {
        assert_eq!(o, &theirs[path], "{path}\n{text}");
    }
}

/// Set a file's modification time a few seconds ahead (git's `touch`), so its stat data no
/// longer vouches for it.
fn touch(dir: &Path, rel: &str) {
    let file = std::fs::File::options().write(true).open(dir.join(rel)).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    file.set_modified(later).unwrap();
}

fn init(dir: &Path) {
    git(dir, &["init", "-q", "-b", "main"]);
}

/// `.gitattributes` conversions: a CRLF `*.bat` under `eol=crlf` and a `text` file are clean
/// after `touch`; a changed one diffs in git's (LF) form; `text=auto` leaves a CRLF the
/// index already holds alone; `-text` and `binary` are not converted, `-diff` diffs as binary.
#[test]
fn attributes_convert_line_endings_as_git_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    // Committed before any attribute: a CRLF in the index, which `text=auto` leaves alone.
    write(dir, "kept.auto", "crlf\r\nin the index\r\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "before"]);
    write(
        dir,
        ".gitattributes",
        "*.bat eol=crlf\n*.txt text\n*.auto text=auto\n*.raw -text\n*.nodiff -diff\n",
    );
    write(dir, "run.bat", "@echo off\r\necho hi\r\n");
    write(dir, "clean.bat", "@echo off\r\n");
    write(dir, "notes.txt", "one\ntwo\n");
    write(dir, "raw.raw", "raw\r\n");
    write(dir, "sub/deeper.bat", "a\r\n");
    write(dir, "data.nodiff", "plain text\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);

    for f in [
        "run.bat",
        "clean.bat",
        "notes.txt",
        "kept.auto",
        "raw.raw",
        "sub/deeper.bat",
    ] {
        touch(dir, f);
    }
    let areas = berth_status(dir);
    assert_eq!(areas, cli_status(dir));
    assert!(areas.worktree.is_empty(), "all clean after touch: {areas:?}");

    write(dir, "run.bat", "@echo off\r\necho hello\r\n");
    write(dir, "notes.txt", "one\r\ntwo\r\nthree\r\n");
    write(dir, "kept.auto", "crlf\r\nin the index\r\nmore\r\n");
    write(dir, "raw.raw", "raw\r\nmore\r\n");
    write(dir, "data.nodiff", "plain text, changed\n");
    write(dir, "new.bat", "new\r\n");
    let areas = berth_status(dir);
    assert_eq!(areas, cli_status(dir));
    assert_eq!(areas.worktree.len(), 5, "{areas:?}");
    diffs_agree(dir, &areas);
    let notes = berth_diff(dir, b"notes.txt", GitArea::Worktree);
    assert!(!notes.contains(&b'\r'), "{}", String::from_utf8_lossy(&notes));
    assert_eq!(berth_diff(dir, b"data.nodiff", GitArea::Worktree), b"binary");
    // The snapshot holds git's form; `git apply` writes the worktree's.
    write(dir, "notes.txt", "one\ntwo\nthree\n");
    snapshot_applies(dir, &[]);
}

/// Content and types: text that is not UTF-8 diffs as text (git's NUL rule for binary), a
/// file replaced by a symlink and a symlink by a file are type changes diffed as a deletion
/// and an addition; mode changes, empty files, deletions, intents to add, binaries, and a
/// snapshot of all of it that `git apply` takes.
#[test]
fn content_types_and_modes_agree_with_git() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    let lines: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    write(dir, "latin1.txt", b"caf\xe9\nna\xefve\nr\xe9sum\xe9\n");
    write(dir, "becomes-link", "a file\n");
    symlink("latin1.txt", dir.join("becomes-file")).unwrap();
    write(dir, "run.sh", "echo\n");
    write(dir, "gone.txt", "bye\n");
    write(dir, "long.txt", &lines);
    write(dir, "image.bin", b"\x89PNG\0\x01\x02\x03");
    write(dir, "late-nul.txt", [vec![b'a'; 9000], vec![0, b'\n']].concat());
    write(dir, "staged.txt", "staged\n");
    write(dir, "becomes-dir", "a file, then a directory\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
    std::fs::remove_file(dir.join("becomes-dir")).unwrap();
    write(
        dir,
        "becomes-dir/inside.txt",
        "untracked in a directory where a file was\n",
    );

    write(dir, "latin1.txt", b"caf\xe9\nna\xefve, chang\xe9\nr\xe9sum\xe9\n");
    std::fs::remove_file(dir.join("becomes-link")).unwrap();
    symlink("run.sh", dir.join("becomes-link")).unwrap();
    std::fs::remove_file(dir.join("becomes-file")).unwrap();
    write(dir, "becomes-file", "now a file\n");
    std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_file(dir.join("gone.txt")).unwrap();
    write(
        dir,
        "long.txt",
        lines.replace("line 4\n", "four\n").replace("line 27\n", ""),
    );
    write(dir, "image.bin", b"\x89PNG\0\x01\x02\x04\xff");
    write(dir, "late-nul.txt", [vec![b'b'; 9000], vec![0, b'\n']].concat());
    write(dir, "staged.txt", "staged, changed\n");
    git(dir, &["add", "staged.txt"]);
    write(dir, "staged.txt", "staged, changed again\n");
    write(dir, "empty", "");
    write(dir, "new/binary.dat", b"\0\0\x01new");
    write(dir, "new/text.txt", "fresh\n");
    write(dir, "intent.txt", "to be added\n");
    git(dir, &["add", "-N", "intent.txt"]);
    write(dir, "odd-\u{e9}.txt", b"\xff\xfe odd bytes\n");
    symlink("new/text.txt", dir.join("new-link")).unwrap();

    let areas = berth_status(dir);
    assert_eq!(areas, cli_status(dir));
    assert_eq!(areas.worktree[&b"becomes-link".to_vec()], GitChange::TypeChanged);
    diffs_agree(dir, &areas);
    let latin = berth_diff(dir, b"latin1.txt", GitArea::Worktree);
    assert!(latin.windows(9).any(|w| w == b"+na\xefve, c"), "a text diff");
    let late = berth_diff(dir, b"late-nul.txt", GitArea::Worktree);
    assert!(late.starts_with(b"diff --git"), "a NUL past 8000 bytes is text");
    snapshot_applies(dir, &[]);
}

/// A repository with a submodule is observed, not refused: the submodule's changed commit,
/// modified and untracked content as git's porcelain v2 `S<c><m><u>` says, its diff as
/// `Subproject commit` lines, and the rest of the repository as usual.
#[test]
fn submodules_are_reported_as_git_reports_them() {
    let tmp = tempfile::tempdir().unwrap();
    let inner = tmp.path().join("inner");
    let dir = tmp.path().join("outer");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    init(&inner);
    write(&inner, "a", "a\n");
    git(&inner, &["add", "-A"]);
    git(&inner, &["commit", "-q", "-m", "a"]);
    init(&dir);
    write(&dir, "file.txt", "x\n");
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "base"]);
    git(&dir, &["submodule", "add", "-q", inner.to_str().unwrap(), "sub"]);
    git(&dir, &["commit", "-q", "-m", "sub"]);
    let sub = dir.join("sub");

    let check = |what: &str| {
        let areas = berth_status(&dir);
        assert_eq!(areas, cli_status(&dir), "{what}");
        diffs_agree(&dir, &areas);
        areas
    };
    assert!(check("clean").worktree.is_empty());
    write(&dir, "file.txt", "y\n");
    // Untracked content only: reported, and no diff (git prints none).
    write(&sub, "untracked", "u\n");
    let areas = check("untracked");
    assert_eq!(
        areas.submodules[&b"sub".to_vec()],
        GitSubmodule {
            commit_changed: false,
            modified: false,
            untracked: true
        }
    );
    // Modified content: `-dirty`.
    write(&sub, "a", "changed\n");
    check("modified");
    // What its `ignore` setting leaves out, from `.gitmodules` (committed or not), the
    // repository's configuration over it, or `diff.ignoreSubmodules`.
    git(&dir, &["config", "-f", ".gitmodules", "submodule.sub.ignore", "dirty"]);
    assert!(!check("ignore dirty").submodules.contains_key(b"sub".as_slice()));
    git(
        &dir,
        &["config", "-f", ".gitmodules", "submodule.sub.ignore", "untracked"],
    );
    check("ignore untracked");
    git(&dir, &["config", "submodule.sub.ignore", "all"]);
    assert!(!check("ignore all").submodules.contains_key(b"sub".as_slice()));
    git(&dir, &["config", "submodule.sub.ignore", "none"]);
    check("none in the repository's configuration");
    git(&dir, &["config", "--unset", "submodule.sub.ignore"]);
    git(
        &dir,
        &["config", "-f", ".gitmodules", "--unset", "submodule.sub.ignore"],
    );
    git(&dir, &["config", "diff.ignoreSubmodules", "dirty"]);
    check("diff.ignoreSubmodules");
    git(&dir, &["config", "--unset", "diff.ignoreSubmodules"]);
    check("modified again");
    // A new commit in the submodule, then staged in the outer repository.
    git(&sub, &["add", "a"]);
    git(&sub, &["commit", "-q", "-m", "b"]);
    let areas = check("new commit");
    assert!(areas.submodules[&b"sub".to_vec()].commit_changed);
    git(&dir, &["add", "sub"]);
    check("staged");
    // `ignore = all`: git status still lists the staged commit, `diff --cached` shows none.
    git(&dir, &["config", "submodule.sub.ignore", "all"]);
    check("staged, ignore all");
    assert!(berth_diff(&dir, b"sub", GitArea::Staged).is_empty());
    git(&dir, &["config", "--unset", "submodule.sub.ignore"]);
    std::fs::remove_file(sub.join("untracked")).unwrap();
    check("staged, clean");
    // A linked worktree's submodule (its repository under the main one's
    // `.git/worktrees/<name>/modules/`): observed as in the main worktree.
    let linked = tmp.path().join("linked");
    git(
        &dir,
        &["worktree", "add", "-q", linked.to_str().unwrap(), "-b", "linked"],
    );
    git(&linked, &["submodule", "update", "-q", "--init"]);
    write(&linked.join("sub"), "a", "in the linked worktree\n");
    let areas = berth_status(&linked);
    assert_eq!(areas, cli_status(&linked));
    assert!(areas.submodules[&b"sub".to_vec()].modified, "{areas:?}");
    diffs_agree(&linked, &areas);
    // A clone whose submodule is not checked out (an empty directory): unchanged, as in git;
    // its directory gone: deleted.
    let clone = tmp.path().join("clone");
    git(tmp.path(), &["clone", "-q", dir.to_str().unwrap(), "clone"]);
    let areas = berth_status(&clone);
    assert_eq!(areas, cli_status(&clone));
    assert!(areas.worktree.is_empty(), "{areas:?}");
    std::fs::remove_dir(clone.join("sub")).unwrap();
    let areas = berth_status(&clone);
    assert_eq!(areas, cli_status(&clone));
    assert_eq!(areas.worktree[&b"sub".to_vec()], GitChange::Deleted);
    diffs_agree(&clone, &areas);
    // The snapshot carries the rest (not the submodule's commit).
    let (text, _) = patch(&dir, usize::MAX).unwrap();
    assert!(text.contains("+y\n") && !text.contains("Subproject"), "{text}");
}

/// `core.autocrlf=true` with no attribute: a CRLF file is clean after `touch` and a change
/// to it diffs in git's (LF) form; `core.autocrlf=input` likewise.
#[test]
fn core_autocrlf_converts_as_git_does() {
    for setting in ["true", "input"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        init(dir);
        git(dir, &["config", "core.autocrlf", setting]);
        write(dir, "win.txt", "one\r\ntwo\r\n");
        write(dir, "image.bin", b"\0\r\n");
        git(dir, &["add", "-A"]);
        git(dir, &["commit", "-q", "-m", "base"]);
        touch(dir, "win.txt");
        touch(dir, "image.bin");
        let areas = berth_status(dir);
        assert_eq!(areas, cli_status(dir), "{setting}");
        assert!(areas.worktree.is_empty(), "{setting}: {areas:?}");
        write(dir, "win.txt", "one\r\ntwo\r\nthree\r\n");
        let areas = berth_status(dir);
        assert_eq!(areas, cli_status(dir), "{setting}");
        diffs_agree(dir, &areas);
    }
}

/// Index states and names: a conflicted path is unmerged (its staged diff git's `* Unmerged
/// path`), a name that is not UTF-8 keeps its bytes (git's quoted octal form).
#[test]
fn conflicts_and_names_agree_with_git() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    write(dir, "conflict.txt", "base\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
    git(dir, &["checkout", "-q", "-b", "other"]);
    write(dir, "conflict.txt", "theirs\n");
    git(dir, &["commit", "-q", "-am", "theirs"]);
    git(dir, &["checkout", "-q", "main"]);
    write(dir, "conflict.txt", "ours\n");
    git(dir, &["commit", "-q", "-am", "ours"]);
    assert!(
        !cli(dir, &["merge", "-q", "other"]).status.success(),
        "the merge conflicts"
    );
    let odd = OsStr::from_bytes(b"raw-\xff\tname.txt");
    std::fs::write(dir.join(odd), b"bytes \xfe\n").unwrap();
    write(dir, "staged-b.txt", "b\n");
    write(dir, "staged-a.txt", "a\n");
    git(dir, &["add", "staged-b.txt"]);
    git(dir, &["add", "staged-a.txt"]);
    let areas = berth_status(dir);
    assert_eq!(areas, cli_status(dir));
    assert_eq!(areas.staged[&b"conflict.txt".to_vec()], GitChange::Unmerged);
    diffs_agree(dir, &areas);
    assert_eq!(
        berth_diff(dir, b"conflict.txt", GitArea::Staged),
        b"* Unmerged path conflict.txt\n"
    );
}

/// Names git writes specially in a patch (a space: the `---`/`+++` lines end with a tab;
/// control bytes: git's letter escapes) and `.gitignore` patterns with braces, which git
/// matches literally (no `{a,b}` alternation), agree with git.
#[test]
fn spaced_names_escapes_and_literal_braces_agree_with_git() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    write(dir, "my file.txt", "one\n");
    write(dir, "bell\x07\x0bx", "one\n");
    write(dir, ".gitignore", "*.{tmp,bak}\n{{cookiecutter.slug}}/\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
    write(dir, "my file.txt", "two\n");
    write(dir, "bell\x07\x0bx", "two\n");
    write(dir, "new one.txt", "new\n");
    for name in ["a.tmp", "b.bak", "c.{tmp,bak}", "{{cookiecutter.slug}}/x.py"] {
        write(dir, name, "x\n");
    }
    let areas = berth_status(dir);
    assert_eq!(areas, cli_status(dir));
    assert!(areas.untracked.contains(b"a.tmp".as_slice()), "{areas:?}");
    assert!(!areas.untracked.contains(b"c.{tmp,bak}".as_slice()), "{areas:?}");
    diffs_agree(dir, &areas);
    assert!(
        berth_diff(dir, b"my file.txt", GitArea::Worktree)
            .starts_with(b"diff --git a/my file.txt b/my file.txt\nindex ")
    );
    // The ignored files are not carried.
    snapshot_applies(dir, &["c.{tmp,bak}", "{{cookiecutter.slug}}"]);
}

/// A repository using Git LFS (git-lfs its configured filter) is compared as git compares
/// it, git-lfs never run by Berth: a file under `filter=lfs` as its pointer (clean when
/// only touched, modified when changed, its diff the pointer's), the rest as usual. Needs
/// git-lfs for git's side of it: skipped without it, except where
/// `BERTH_TEST_GIT_LFS_REQUIRED` is set (`.ci/run` installs it and sets it).
#[test]
fn lfs_files_compare_as_git_with_git_lfs_compares_them() {
    if Command::new("git-lfs").arg("version").output().is_err() {
        assert!(
            std::env::var_os("BERTH_TEST_GIT_LFS_REQUIRED").is_none(),
            "git-lfs is required here but is not installed"
        );
        eprintln!("skipped: git-lfs is not installed (apt-get install git-lfs)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    git(dir, &["lfs", "install", "--local"]);
    git(dir, &["lfs", "track", "*.psd", "*.bin"]);
    write(dir, "art.psd", vec![7u8; 3000]);
    write(dir, "same.bin", b"\0\x01 fixed");
    write(dir, "empty.bin", "");
    write(dir, "readme.md", "hello\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
    touch(dir, "same.bin");
    touch(dir, "art.psd");
    let areas = berth_status(dir);
    assert_eq!(areas, cli_status(dir));
    assert!(areas.worktree.is_empty(), "{areas:?}");
    write(dir, "readme.md", "changed\n");
    write(dir, "art.psd", vec![8u8; 3001]);
    write(dir, "new.bin", "new\n");
    let areas = berth_status(dir);
    assert_eq!(areas, cli_status(dir));
    assert_eq!(areas.worktree.len(), 2, "{areas:?}");
    diffs_agree(dir, &areas);
    git(dir, &["add", "art.psd"]);
    let areas = berth_status(dir);
    assert_eq!(areas, cli_status(dir));
    diffs_agree(dir, &areas);
}

/// A sparse checkout: files outside it are unchanged while absent, and one put back there
/// anyway is looked at (git clears its skip-worktree bit): modified when it differs.
#[test]
fn a_sparse_checkouts_files_put_back_are_looked_at_as_git_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    write(dir, "a/x", "x\n");
    write(dir, "b/y", "y\n");
    write(dir, "b/same", "same\n");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
    git(dir, &["sparse-checkout", "set", "a"]);
    assert!(!dir.join("b").exists());
    let areas = berth_status(dir);
    assert_eq!(areas, cli_status(dir));
    assert!(areas.worktree.is_empty(), "{areas:?}");
    write(dir, "b/y", "changed\n");
    write(dir, "b/same", "same\n");
    let areas = berth_status(dir);
    assert_eq!(areas.worktree.len(), 1, "{areas:?}");
    assert_eq!(areas, cli_status(dir));
    diffs_agree(dir, &areas);
}
