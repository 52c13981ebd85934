use std::path::Path;

use super::{corpus::git, patch, status, writer::hunks};

fn repo() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    git(tmp.path(), &["init", "-q", "-b", "main"]);
    std::fs::create_dir(tmp.path().join("dir")).unwrap();
    std::fs::write(tmp.path().join("dir/a"), "a\n").unwrap();
    std::fs::write(tmp.path().join("b"), "b\n").unwrap();
    git(tmp.path(), &["add", "-A"]);
    git(tmp.path(), &["commit", "-q", "-m", "base"]);
    tmp
}

/// The worktree area of a status: raw paths and their changes.
fn worktree_changes(st: &berth_protocol::GitStatus) -> Vec<(Vec<u8>, berth_protocol::GitChange)> {
    st.worktree
        .iter()
        .map(|e| (crate::observe::decode_raw(&e.path).unwrap(), e.change))
        .collect()
}

fn feature(root: &Path) -> String {
    let e = status(root).unwrap_err();
    assert_eq!(e.data_code(), Some("unsupported"));
    e.data["feature"].as_str().unwrap().to_string()
}

/// What `git status -uall` lists as untracked, as raw path bytes.
fn cli_untracked(dir: &Path) -> Vec<Vec<u8>> {
    let out = git(dir, &["status", "--porcelain=v1", "-z", "-uall"]);
    let mut paths: Vec<Vec<u8>> = out
        .split(|b| *b == 0)
        .filter_map(|line| line.strip_prefix(b"?? "))
        .map(<[u8]>::to_vec)
        .collect();
    paths.sort();
    paths
}

#[test]
fn untracked_files_are_the_ones_git_lists() {
    use std::os::unix::{ffi::OsStrExt, fs::symlink};
    let r = repo();
    let root = r.path();
    let write = |rel: &str, text: &str| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(".gitignore", "*.log\nbuild/\n/top-only\n");
    write("keep/.gitignore", "!wanted.log\nlocal.tmp\n");
    write("tracked.log", "tracked although ignored\n");
    git(root, &["add", "-f", "tracked.log", ".gitignore", "keep/.gitignore"]);
    git(root, &["commit", "-q", "-m", "rules"]);
    write("tracked.log", "changed\n");
    write("debug.log", "ignored\n");
    write("keep/wanted.log", "re-included by a deeper rule\n");
    write("keep/local.tmp", "ignored by the deeper rule\n");
    write("other/local.tmp", "not ignored here\n");
    write("build/out.o", "ignored directory\n");
    write("deep/build/out.o", "ignored directory, deeper\n");
    write("top-only", "anchored rule\n");
    write("deep/top-only", "the anchored rule is for the top only\n");
    write("excluded.txt", "info/exclude\n");
    write(".git/info/exclude", "excluded.txt\n");
    write("new/a/b/c.txt", "deep untracked\n");
    write("dir/sibling", "untracked beside a tracked file\n");
    write("dir/sub/.gitattributes", "*.txt text\n");
    std::fs::write(root.join(std::ffi::OsStr::from_bytes(b"raw-\xff")), "non-UTF-8\n").unwrap();
    symlink("dir", root.join("dir-link")).unwrap();
    // Symlinked rule files are not read, by git or by the walk.
    write("rules-elsewhere", "*\nfilter=x\n");
    write("linked/kept.txt", "listed: the linked rules are not read\n");
    symlink("../rules-elsewhere", root.join("linked/.gitignore")).unwrap();
    symlink("../rules-elsewhere", root.join("linked/.gitattributes")).unwrap();
    let nested = root.join("vendored");
    std::fs::create_dir(&nested).unwrap();
    git(&nested, &["init", "-q"]);
    write("vendored/inside.txt", "in the nested repository\n");

    let index = super::index::load_index(&gix::open(root).unwrap()).unwrap();
    let (found, attributes) = super::untracked::untracked(root, &root.join(".git/info/exclude"), None, &index).unwrap();
    assert_eq!(
        found.iter().map(|p| String::from_utf8_lossy(p)).collect::<Vec<_>>(),
        cli_untracked(root)
            .iter()
            .map(|p| String::from_utf8_lossy(p))
            .collect::<Vec<_>>(),
    );
    for listed in [&b"vendored/"[..], b"keep/wanted.log", b"linked/kept.txt"] {
        assert!(found.contains(&listed.to_vec()), "{}", String::from_utf8_lossy(listed));
    }
    assert_eq!(attributes, vec![b"dir/sub/.gitattributes".to_vec()]);
    let st = status(root).unwrap().unwrap();
    assert_eq!(st.untracked.len(), found.len());
}

#[test]
fn nothing_is_read_through_a_symlink_out_of_the_workspace() {
    use berth_protocol::{GitArea, GitChange, GitDiff};
    use std::os::unix::fs::symlink;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "SECRET\n").unwrap();
    std::fs::write(outside.path().join("a"), "SECRET a\n").unwrap();
    let r = repo();
    let root = r.path();
    symlink(outside.path(), root.join("out")).unwrap();
    // A tracked directory replaced by a symlink that leads out: its files are gone, as
    // git sees them, and their diff is a deletion.
    std::fs::remove_dir_all(root.join("dir")).unwrap();
    symlink(outside.path(), root.join("dir")).unwrap();

    let st = status(root).unwrap().unwrap();
    let worktree = worktree_changes(&st);
    assert_eq!(worktree, vec![(b"dir/a".to_vec(), GitChange::Deleted)]);
    let untracked: Vec<_> = st
        .untracked
        .iter()
        .map(|e| crate::observe::decode_raw(&e.path).unwrap())
        .collect();
    assert_eq!(untracked, cli_untracked(root));
    let worktree_diff = super::diff(root, b"dir/a", GitArea::Worktree).unwrap();
    let GitDiff::Text { patch: text, .. } = &worktree_diff else {
        panic!("{worktree_diff:?}")
    };
    assert!(text.contains("+++ /dev/null") && !text.contains("SECRET"), "{text}");
    for path in [&b"out/secret"[..], b"dir/secret"] {
        let d = super::diff(root, path, GitArea::Untracked).unwrap();
        assert!(matches!(d, GitDiff::Unchanged), "{d:?}");
    }
    let (text, _) = patch(root, usize::MAX).unwrap();
    assert!(!text.contains("SECRET"), "{text}");
}

/// A sparse checkout's files outside it are not there and not changes, as git sees them;
/// so is a skip-worktree file kept locally changed. A sparse index still fails explicitly.
#[test]
fn sparse_checkouts_and_skip_worktree_files_are_as_git_sees_them() {
    let sparse = repo();
    let root = sparse.path();
    assert!(status(root).unwrap().is_some());
    git(root, &["sparse-checkout", "set", "--no-cone", "/b"]);
    assert!(!root.join("dir/a").exists());
    std::fs::write(root.join("new.txt"), "n\n").unwrap();
    assert_eq!(cli_status(root), ["?? new.txt"]);
    assert_eq!(berth_status(root), cli_status(root));
    git(root, &["sparse-checkout", "disable"]);
    git(root, &["update-index", "--skip-worktree", "b"]);
    std::fs::write(root.join("b"), "local\n").unwrap();
    assert_eq!(berth_status(root), cli_status(root));
    let d = super::diff(root, b"b", berth_protocol::GitArea::Worktree).unwrap();
    assert_eq!(d, berth_protocol::GitDiff::Unchanged);
    let cone = repo();
    git(
        cone.path(),
        &["sparse-checkout", "set", "--cone", "--sparse-index", "dir"],
    );
    assert_eq!(feature(cone.path()), "sparse-checkout");
}

fn staged(root: &Path) -> Vec<(String, berth_protocol::GitChange)> {
    status(root)
        .unwrap()
        .unwrap()
        .staged
        .into_iter()
        .map(|e| {
            let path = crate::observe::decode_raw(&e.path).unwrap();
            (String::from_utf8(path).unwrap(), e.change)
        })
        .collect()
}

/// The staged area skips the directories the index's cache tree records as HEAD's, and
/// only those: a fresh commit (all valid), `git add`/`git rm --cached` (the touched
/// directories invalidated) and a soft reset (valid cache entries naming another tree).
#[test]
fn the_staged_area_uses_the_cache_tree_only_where_it_matches_head() {
    use berth_protocol::GitChange::{Added, Deleted, Modified};
    let r = repo();
    let root = r.path();
    for d in ["x", "y", "z", "w/deep"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
        std::fs::write(root.join(d).join("f"), d).unwrap();
        std::fs::write(root.join(d).join("g"), d).unwrap();
    }
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "dirs"]);
    assert_eq!(staged(root), vec![]);

    std::fs::write(root.join("x/f"), "changed").unwrap();
    std::fs::write(root.join("y/new"), "new").unwrap();
    git(root, &["add", "x/f", "y/new"]);
    git(root, &["rm", "-q", "--cached", "z/g"]);
    let expected = vec![
        ("x/f".to_string(), Modified),
        ("y/new".to_string(), Added),
        ("z/g".to_string(), Deleted),
    ];
    assert_eq!(staged(root), expected);

    // Commit, then move HEAD back: the index's cache tree is valid but for the newer tree.
    std::fs::write(root.join("w/deep/f"), "deeper").unwrap();
    git(root, &["add", "w/deep/f"]);
    git(root, &["commit", "-q", "-m", "more"]);
    git(root, &["write-tree"]);
    git(root, &["reset", "-q", "--soft", "HEAD~1"]);
    let mut expected = expected;
    expected.insert(0, ("w/deep/f".to_string(), Modified));
    assert_eq!(staged(root), expected);
}

#[test]
fn a_directory_inside_a_repository_is_not_its_root() {
    let r = repo();
    assert_eq!(status(&r.path().join("dir")).unwrap(), None);
}

/// The patch of every kind of change, applied with `git apply` to a fresh checkout of
/// the base commit, reproduces the workspace; binary changes are named.
#[test]
fn a_patch_applies_to_its_base_and_reproduces_the_workspace() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let r = repo();
    let root = r.path();
    let lines: String = (1..=40).map(|i| format!("line {i}\n")).collect();
    std::fs::write(root.join("long.txt"), &lines).unwrap();
    std::fs::write(root.join("gone.txt"), "bye\n").unwrap();
    std::fs::write(root.join("run.sh"), "echo\n").unwrap();
    std::fs::write(root.join("caf\u{e9} \"q\".txt"), "x\n").unwrap();
    std::fs::write(root.join("blob.bin"), b"\0\x01").unwrap();
    std::fs::write(root.join(".gitignore"), "*.log\n").unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "more"]);
    let base = tempfile::tempdir().unwrap();
    git(base.path(), &["clone", "-q", root.to_str().unwrap(), "."]);

    std::fs::write(
        root.join("long.txt"),
        lines.replace("line 3\n", "three\n").replace("line 39\n", ""),
    )
    .unwrap();
    git(root, &["add", "long.txt"]);
    std::fs::write(root.join("dir/a"), "a\nmore").unwrap();
    std::fs::remove_file(root.join("gone.txt")).unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(root.join("caf\u{e9} \"q\".txt"), "y\n").unwrap();
    std::fs::create_dir(root.join("new")).unwrap();
    std::fs::write(root.join("new/file.txt"), "fresh\n").unwrap();
    std::fs::write(root.join("empty"), "").unwrap();
    symlink("dir/a", root.join("link")).unwrap();
    std::fs::write(root.join("debug.log"), "ignored\n").unwrap();

    std::fs::write(root.join("blob.bin"), b"\0\x02").unwrap();

    let (text, captured) = patch(root, usize::MAX).unwrap();
    assert_eq!(captured.files, 9, "{text}");
    assert!(captured.base.is_some());
    assert!(!text.contains("debug.log"), "ignored files are left out");
    assert!(text.contains("GIT binary patch\nliteral 2\n"), "{text}");
    let file = base.path().join("p.diff");
    std::fs::write(&file, &text).unwrap();
    git(base.path(), &["apply", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();
    for f in [
        "long.txt",
        "dir/a",
        "caf\u{e9} \"q\".txt",
        "new/file.txt",
        "empty",
        "blob.bin",
    ] {
        assert_eq!(
            std::fs::read(base.path().join(f)).unwrap(),
            std::fs::read(root.join(f)).unwrap(),
            "{f}"
        );
    }
    assert!(!base.path().join("gone.txt").exists());
    assert_eq!(
        std::fs::read_link(base.path().join("link")).unwrap(),
        Path::new("dir/a")
    );
    let mode = std::fs::metadata(base.path().join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_ne!(mode & 0o111, 0, "the mode change applies");

    assert_eq!(
        patch(root, 10).unwrap_err().data_code(),
        Some("payload-too-large"),
        "over the limit"
    );
    let plain = tempfile::tempdir().unwrap();
    assert_eq!(
        patch(plain.path(), usize::MAX).unwrap_err().data_code(),
        Some("unsupported")
    );
}

#[test]
fn hunks_look_like_git() {
    let before: String = (1..=20).map(|i| format!("line {i}\n")).collect();
    let after = before.replace("line 2\n", "two\n").replace("line 18\n", "");
    assert_eq!(
        String::from_utf8(hunks(before.as_bytes(), after.as_bytes())).unwrap(),
        "@@ -1,5 +1,5 @@\n line 1\n-line 2\n+two\n line 3\n line 4\n line 5\n\
         @@ -15,6 +15,5 @@ line 14\n line 15\n line 16\n line 17\n-line 18\n line 19\n line 20\n"
    );
    assert_eq!(
        hunks(b"", b"a\nb"),
        b"@@ -0,0 +1,2 @@\n+a\n+b\n\\ No newline at end of file\n"
    );
    assert_eq!(hunks(b"a\n", b""), b"@@ -1 +0,0 @@\n-a\n");
}

/// A diff that is not UTF-8 travels twice (lossy text and exact bytes), so it is cut at half
/// the bound, at a line end, with its exact bytes in `patch_base64`.
#[test]
fn a_diff_that_is_not_utf8_is_cut_at_half_the_bound() {
    use base64::Engine;
    use berth_protocol::{GIT_DIFF_MAX, GitDiff};
    let line = b"caf\xe9 au lait\n";
    let patch: Vec<u8> = line.repeat(GIT_DIFF_MAX / line.len() + 10);
    let GitDiff::Text {
        patch: text,
        patch_base64: Some(bytes),
        truncated: Some(t),
    } = super::diff::bounded(patch.clone())
    else {
        panic!("a cut text diff with its bytes")
    };
    let bytes = base64::engine::general_purpose::STANDARD.decode(bytes).unwrap();
    assert!(bytes.len() <= GIT_DIFF_MAX / 2 && bytes.ends_with(b"\n"));
    assert_eq!(bytes, patch[..bytes.len()]);
    assert_eq!((t.bytes, t.returned), (patch.len() as u64, bytes.len() as u64));
    assert_eq!(text, String::from_utf8_lossy(&bytes));
}

/// A file too large to hold is hashed as it is read, with the same answer git gives: one
/// touched but unchanged is not listed, one changed in place (same size) is modified; a
/// patch that one side alone would pass the limit with is refused before that side is read.
#[test]
fn large_files_are_compared_without_being_held() {
    use berth_protocol::GitChange;
    use std::io::{Seek, SeekFrom, Write};
    let r = repo();
    let root = r.path();
    let big = root.join("big.bin");
    let len = super::HELD_MAX + (1 << 20);
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(len).unwrap();
    drop(f);
    git(root, &["add", "big.bin"]);
    git(root, &["commit", "-q", "-m", "big"]);
    // Touched, not changed: its stat no longer matches the index, so its content is hashed.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&big)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let st = status(root).unwrap().unwrap();
    assert!(st.worktree.is_empty(), "{:?}", st.worktree);
    assert!(cli_modified(root).is_empty());
    // One byte changed in place: the same size, another blob.
    let mut f = std::fs::File::options().write(true).open(&big).unwrap();
    f.seek(SeekFrom::Start(len / 2)).unwrap();
    f.write_all(b"x").unwrap();
    drop(f);
    let st = status(root).unwrap().unwrap();
    let worktree = worktree_changes(&st);
    assert_eq!(worktree, vec![(b"big.bin".to_vec(), GitChange::Modified)]);
    assert_eq!(cli_modified(root), vec![b"big.bin".to_vec()]);
    let e = patch(root, 1 << 20).unwrap_err();
    assert_eq!(e.data_code(), Some("payload-too-large"));
}

/// What `git status` lists as modified in the worktree, as raw path bytes.
fn cli_modified(dir: &Path) -> Vec<Vec<u8>> {
    let out = git(dir, &["status", "--porcelain=v1", "-z"]);
    out.split(|b| *b == 0)
        .filter_map(|line| line.strip_prefix(b" M "))
        .map(<[u8]>::to_vec)
        .collect()
}

/// A repository's own files and Berth's are not content: an untracked diff of one, or of
/// one reached through a committed symlink, is as of a file that is not there.
#[test]
fn git_and_berth_directories_are_never_diffed() {
    use berth_protocol::{GitArea, GitDiff};
    use std::os::unix::fs::symlink;
    let r = repo();
    let root = r.path();
    std::fs::create_dir_all(root.join(".berth")).unwrap();
    std::fs::write(root.join(".berth/mcp.json"), "{\"token\": \"SECRET\"}").unwrap();
    symlink(".git", root.join("g")).unwrap();
    for path in [&b".git/config"[..], b"g/config", b".berth/mcp.json", b"g/HEAD"] {
        let d = super::diff(root, path, GitArea::Untracked).unwrap();
        assert!(
            matches!(d, GitDiff::Unchanged),
            "{}: {d:?}",
            String::from_utf8_lossy(path)
        );
    }
}

/// What `git status --porcelain=v1` prints for the worktree (`XY path` lines, `-uall`).
fn cli_status(dir: &Path) -> Vec<String> {
    let out = git(dir, &["status", "--porcelain=v1", "-uall"]);
    let mut lines: Vec<String> = String::from_utf8(out).unwrap().lines().map(str::to_string).collect();
    lines.sort();
    lines
}

/// Berth's worktree and untracked areas in the same shape.
fn berth_status(dir: &Path) -> Vec<String> {
    use berth_protocol::GitChange;
    let st = status(dir).unwrap().unwrap();
    let mut lines: Vec<String> = worktree_changes(&st)
        .into_iter()
        .map(|(path, change)| {
            let y = match change {
                GitChange::Modified => 'M',
                GitChange::Deleted => 'D',
                GitChange::TypeChanged => 'T',
                GitChange::Added => 'A',
                other => panic!("{other:?}"),
            };
            format!(" {y} {}", String::from_utf8(path).unwrap())
        })
        .chain(st.untracked.iter().map(|e| {
            let path = crate::observe::decode_raw(&e.path).unwrap();
            format!("?? {}", String::from_utf8(path).unwrap())
        }))
        .collect();
    lines.sort();
    lines
}

/// Settings under which git does not see a change: `core.fileMode=false` (a file system
/// that reports every file executable), only the owner's execute bit counting, and
/// assume-unchanged entries. Each as git prints it.
#[test]
fn changes_git_does_not_see_are_not_reported() {
    use std::os::unix::fs::PermissionsExt;
    let r = repo();
    let root = r.path();
    let chmod = |rel: &str, mode: u32| {
        std::fs::set_permissions(root.join(rel), std::fs::Permissions::from_mode(mode)).unwrap();
    };
    // Group and others' execute bits are not git's executable bit.
    chmod("b", 0o654);
    assert_eq!(cli_status(root), Vec::<String>::new());
    assert_eq!(berth_status(root), cli_status(root));
    // Nor is the owner's, with core.fileMode false.
    git(root, &["config", "core.fileMode", "false"]);
    chmod("dir/a", 0o755);
    assert_eq!(berth_status(root), cli_status(root));
    std::fs::write(root.join("dir/a"), "changed\n").unwrap();
    assert_eq!(cli_status(root), [" M dir/a"]);
    assert_eq!(berth_status(root), cli_status(root));
    let d = super::diff(root, b"dir/a", berth_protocol::GitArea::Worktree).unwrap();
    let berth_protocol::GitDiff::Text { patch, .. } = d else {
        panic!("{d:?}")
    };
    assert!(!patch.contains("mode"), "{patch}");
    git(root, &["config", "core.fileMode", "true"]);
    assert_eq!(cli_status(root), [" M dir/a"]);
    assert_eq!(berth_status(root), cli_status(root));
    // Assume-unchanged: neither a change nor a removal shows.
    git(root, &["update-index", "--assume-unchanged", "dir/a", "b"]);
    std::fs::remove_file(root.join("b")).unwrap();
    assert_eq!(cli_status(root), Vec::<String>::new());
    assert_eq!(berth_status(root), cli_status(root));
}

/// Only files and symlinks are untracked: git lists no FIFO or socket; and a directory the
/// walk may not enter does not fail the status.
#[test]
fn fifos_and_sockets_are_not_untracked_files() {
    let r = repo();
    let root = r.path();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(root.join("app.sock")).unwrap();
    std::fs::write(root.join("new.txt"), "n\n").unwrap();
    assert_eq!(cli_status(root), ["?? new.txt"]);
    assert_eq!(berth_status(root), cli_status(root));
}

/// A tracked file under `.berth/` (a project's committed skills) is compared as git
/// compares it, but its worktree content is not shown to clients.
#[test]
fn tracked_berth_files_are_compared_but_not_shown() {
    let r = repo();
    let root = r.path();
    std::fs::create_dir_all(root.join(".berth/skills/s")).unwrap();
    std::fs::write(root.join(".berth/skills/s/SKILL.md"), "skill\n").unwrap();
    git(root, &["add", ".berth"]);
    git(root, &["commit", "-q", "-m", "skills"]);
    assert_eq!(berth_status(root), Vec::<String>::new());
    std::fs::write(root.join(".berth/skills/s/SKILL.md"), "changed\n").unwrap();
    assert_eq!(cli_status(root), [" M .berth/skills/s/SKILL.md"]);
    assert_eq!(berth_status(root), cli_status(root));
    let d = super::diff(root, b".berth/skills/s/SKILL.md", berth_protocol::GitArea::Worktree).unwrap();
    assert_eq!(
        d,
        berth_protocol::GitDiff::Unsupported {
            reason: "private".into()
        }
    );
    let (text, _) = patch(root, 1 << 20).unwrap();
    assert!(!text.contains("changed"), "{text}");
}

/// A directory is a repository of its own only when its `.git` is one (git's rule): an
/// empty `.git` directory or a `.git` file that is not a `gitdir:` link does not hide the
/// directory's files, and a repository's gitfile does.
#[test]
fn only_a_real_repository_is_nested() {
    let r = repo();
    let root = r.path();
    git(root, &["init", "-q", &root.join("nested").display().to_string()]);
    std::fs::write(root.join("nested/inner"), "i\n").unwrap();
    std::fs::create_dir_all(root.join("fake/.git")).unwrap();
    std::fs::write(root.join("fake/f"), "f\n").unwrap();
    std::fs::create_dir_all(root.join("junk")).unwrap();
    std::fs::write(root.join("junk/.git"), "not a link\n").unwrap();
    std::fs::write(root.join("junk/j"), "j\n").unwrap();
    std::fs::create_dir_all(root.join("linked")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    git(elsewhere.path(), &["init", "-q", "--bare", "store.git"]);
    std::fs::write(
        root.join("linked/.git"),
        format!("gitdir: {}\n", elsewhere.path().join("store.git").display()),
    )
    .unwrap();
    std::fs::write(root.join("linked/l"), "l\n").unwrap();
    assert_eq!(cli_status(root), ["?? fake/f", "?? junk/j", "?? linked/", "?? nested/"]);
    assert_eq!(berth_status(root), cli_status(root));
}

/// A tracked directory replaced by a symlink to a copy of it: its files are gone, as git
/// sees them (git does not follow a symlink on the way), and the link is untracked.
#[test]
fn a_directory_replaced_by_a_symlink_is_gone() {
    let r = repo();
    let root = r.path();
    std::fs::rename(root.join("dir"), root.join("other")).unwrap();
    std::os::unix::fs::symlink("other", root.join("dir")).unwrap();
    assert_eq!(cli_status(root), [" D dir/a", "?? dir", "?? other/a"]);
    assert_eq!(berth_status(root), cli_status(root));
}

/// A tracked `.gitattributes` inside an ignored directory still rules the tracked files
/// there (the walk does not enter the directory): a CRLF file its `eol=crlf` covers is
/// clean after a `touch`, as in git.
#[test]
fn attributes_in_an_ignored_directory_rule_its_tracked_files() {
    let r = repo();
    let root = r.path();
    std::fs::create_dir_all(root.join("gen")).unwrap();
    std::fs::write(root.join(".gitignore"), "gen/\n").unwrap();
    std::fs::write(root.join("gen/.gitattributes"), "*.bat text eol=crlf\n").unwrap();
    std::fs::write(root.join("gen/run.bat"), "echo a\r\necho b\r\n").unwrap();
    git(root, &["add", "-f", ".gitignore", "gen/.gitattributes", "gen/run.bat"]);
    git(root, &["commit", "-q", "-m", "generated"]);
    // New stat data: the file is compared by content, as converted by its attributes.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(root.join("gen/run.bat"), "echo a\r\necho b\r\n").unwrap();
    assert_eq!(cli_status(root), Vec::<String>::new());
    assert_eq!(berth_status(root), cli_status(root));
}

/// An intent to add whose file is gone: the worktree diff is the deletion of the empty
/// blob, byte for byte as `git diff` prints it.
#[test]
fn a_removed_intent_to_add_is_a_deleted_empty_file() {
    let r = repo();
    let root = r.path();
    std::fs::write(root.join("planned"), "soon\n").unwrap();
    git(root, &["add", "-N", "planned"]);
    std::fs::remove_file(root.join("planned")).unwrap();
    let expected = String::from_utf8(git(root, &["diff", "--full-index", "--", "planned"])).unwrap();
    assert!(expected.contains("deleted file mode 100644"), "{expected}");
    let d = super::diff(root, b"planned", berth_protocol::GitArea::Worktree).unwrap();
    let berth_protocol::GitDiff::Text { patch, .. } = d else {
        panic!("{d:?}")
    };
    assert_eq!(patch, expected);
}

/// `core.excludesFile` set in the repository's own configuration is read, as git reads it.
#[test]
fn a_repositorys_own_excludes_file_is_read() {
    let r = repo();
    let root = r.path();
    let rules = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(rules.path(), "*.tmp\n").unwrap();
    git(
        root,
        &["config", "core.excludesFile", &rules.path().display().to_string()],
    );
    std::fs::write(root.join("scratch.tmp"), "t\n").unwrap();
    std::fs::write(root.join("kept.txt"), "k\n").unwrap();
    assert_eq!(cli_status(root), ["?? kept.txt"]);
    assert_eq!(berth_status(root), cli_status(root));
}

/// A snapshot takes an assume-unchanged or skip-worktree file as git does, by its index
/// entry: a staged change of it is carried, its hidden local edit (or its absence) is not.
#[test]
fn a_snapshot_takes_unlooked_files_by_their_index_entry() {
    let r = repo();
    let root = r.path();
    std::fs::write(root.join("b"), "staged\n").unwrap();
    git(root, &["add", "b"]);
    git(root, &["update-index", "--assume-unchanged", "b"]);
    std::fs::write(root.join("b"), "hidden local edit\n").unwrap();
    let (text, _) = patch(root, 1 << 20).unwrap();
    assert!(text.contains("+staged") && !text.contains("hidden"), "{text}");
    let expected = String::from_utf8(git(root, &["diff", "--full-index", "HEAD", "--", "b"])).unwrap();
    assert!(
        expected.contains("+staged") && !expected.contains("hidden"),
        "{expected}"
    );
}

/// Large files under `text=auto`, hashed as they are read: binary content holding CRs is
/// not converted (clean when only touched), CRLF text is converted as git converts it
/// (clean when only touched, modified when changed), as `git status` says.
#[test]
fn large_files_under_text_auto_are_converted_as_git_converts_them() {
    let r = repo();
    let root = r.path();
    std::fs::write(root.join(".gitattributes"), "* text=auto\n").unwrap();
    let len = super::HELD_MAX as usize + 4096;
    // Binary: CRs, NULs and every other byte.
    let binary: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    assert!(binary.contains(&b'\r') && binary.contains(&0));
    std::fs::write(root.join("blob.dat"), &binary).unwrap();
    // Text with CRLFs (stored with LFs), and a CR that ends a read of a MiB.
    let mut text = "a line of text\r\n".repeat(len / 16).into_bytes();
    text[(1 << 20) - 1] = b'\r';
    text[1 << 20] = b'\n';
    std::fs::write(root.join("crlf.txt"), &text).unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "large"]);
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    for name in ["blob.dat", "crlf.txt"] {
        let f = std::fs::File::options().write(true).open(root.join(name)).unwrap();
        f.set_modified(later).unwrap();
    }
    let st = status(root).unwrap().unwrap();
    assert!(st.worktree.is_empty(), "{:?}", st.worktree);
    assert!(cli_modified(root).is_empty());
    text[5] = b'X';
    std::fs::write(root.join("crlf.txt"), &text).unwrap();
    let st = status(root).unwrap().unwrap();
    assert_eq!(
        worktree_changes(&st),
        vec![(b"crlf.txt".to_vec(), berth_protocol::GitChange::Modified)]
    );
    assert_eq!(cli_modified(root), vec![b"crlf.txt".to_vec()]);
}

/// With git-lfs the configured `lfs` filter, a file under `filter=lfs` is compared as its
/// pointer, computed here (git-lfs is not needed, and never run): the content a pointer
/// names is clean, held or hashed as it is read; changed content is modified, its diff the
/// pointer's. Another configured filter driver is still refused.
#[test]
fn lfs_pointers_are_computed_without_git_lfs() {
    use berth_protocol::{GitArea, GitChange, GitDiff};
    use sha2::Digest;
    let r = repo();
    let root = r.path();
    let small = b"small content\n".to_vec();
    let large: Vec<u8> = (0..super::HELD_MAX as usize + 10).map(|i| (i % 200) as u8).collect();
    let pointer = |data: &[u8]| {
        format!(
            "version https://git-lfs.github.com/spec/v1\noid sha256:{:x}\nsize {}\n",
            sha2::Sha256::digest(data),
            data.len()
        )
    };
    // Committed as git-lfs would have stored them: their pointers.
    std::fs::write(root.join("small.psd"), pointer(&small)).unwrap();
    std::fs::write(root.join("large.psd"), pointer(&large)).unwrap();
    std::fs::write(
        root.join(".gitattributes"),
        "*.psd filter=lfs diff=lfs merge=lfs -text\n",
    )
    .unwrap();
    git(root, &["add", "-A"]);
    git(root, &["commit", "-q", "-m", "lfs"]);
    for (k, v) in [
        ("filter.lfs.clean", "git-lfs clean -- %f"),
        ("filter.lfs.smudge", "git-lfs smudge -- %f"),
        ("filter.lfs.process", "git-lfs filter-process"),
    ] {
        git(root, &["config", k, v]);
    }
    // Checked out: the content in the worktree.
    std::fs::write(root.join("small.psd"), &small).unwrap();
    std::fs::write(root.join("large.psd"), &large).unwrap();
    let st = status(root).unwrap().unwrap();
    assert!(st.worktree.is_empty(), "{:?}", st.worktree);
    std::fs::write(root.join("small.psd"), b"other content\n").unwrap();
    let st = status(root).unwrap().unwrap();
    assert_eq!(
        worktree_changes(&st),
        vec![(b"small.psd".to_vec(), GitChange::Modified)]
    );
    match super::diff(root, b"small.psd", GitArea::Worktree).unwrap() {
        GitDiff::Text { patch, .. } => {
            assert!(
                patch.contains("-size 14\n+size 14\n") || patch.contains("+oid sha256:"),
                "{patch}"
            );
            assert!(
                patch.contains(&format!("-oid sha256:{:x}", sha2::Sha256::digest(&small))),
                "{patch}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Any other driver with a command is refused, as before.
    git(root, &["config", "filter.lfs.process", "my-lfs filter-process"]);
    assert_eq!(feature(root), "external-filter");
}

/// A reftable repository (which gix cannot read refs of) is refused as such.
#[test]
fn a_reftable_repository_is_unsupported_as_such() {
    let tmp = tempfile::tempdir().unwrap();
    if !super::corpus::cli_ok(tmp.path(), &["init", "-q", "--ref-format=reftable"]) {
        eprintln!("skipped: this git cannot make a reftable repository");
        return;
    }
    assert_eq!(feature(tmp.path()), "reftable");
}
