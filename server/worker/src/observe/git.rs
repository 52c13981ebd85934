//! `git.status` and `git.diff`, computed here from what `gix` reads (refs, objects, the
//! index) plus `lstat` and content hashes of the files, so that no configured command ever
//! runs: no filter, hook, fsmonitor, textconv or external diff. Repository features this
//! cannot honour without running something (external filters) or does not handle
//! (sparse checkout, submodules) fail explicitly with `unsupported {feature}`.
//!
//! The workspace must be the repository root: a workspace without `.git` is not a
//! repository (`null`), whatever its parent directories are.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    ffi::{CStr, CString, OsStr},
    ops::Range,
    os::{
        fd::OwnedFd,
        unix::ffi::{OsStrExt, OsStringExt},
    },
    path::Path,
    rc::Rc,
};

use berth_protocol::{
    ErrorCode, GIT_DIFF_FILE_MAX, GIT_DIFF_MAX, GitArea, GitChange, GitDiff, GitEntry, GitHead, GitStatus, RpcError,
    worker::PatchCaptured,
};
use gix::{ObjectId, bstr::ByteSlice, index::entry::Mode, objs::tree::EntryKind};
use ignore::{
    Match,
    gitignore::{Gitignore, GitignoreBuilder},
};
use rustix::fs::{AtFlags, FileType, OFlags};

use super::{encode_path, failure};
use crate::workspace::{OpenError, Opened, Workspace};

/// Git's rule: a NUL in the first 8000 bytes makes content binary.
const BINARY_PROBE: usize = 8000;

/// `unsupported {feature}`.
fn unsupported(feature: &str) -> RpcError {
    failure(ErrorCode::Unsupported, "feature", feature)
}

fn broken(e: impl std::fmt::Display) -> RpcError {
    tracing::warn!(error = %e, "reading the repository failed");
    failure(ErrorCode::Unavailable, "reason", "repository-unreadable")
}

/// The repository at exactly `root`, or None when `root` is not a repository root.
fn open(root: &Path) -> Result<Option<gix::Repository>, RpcError> {
    if std::fs::symlink_metadata(root.join(".git")).is_err() {
        return Ok(None);
    }
    let repo = gix::open(root).map_err(broken)?;
    if repo.workdir().is_none() {
        return Err(unsupported("bare-repository"));
    }
    Ok(Some(repo))
}

/// What a tree or the index says about one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Item {
    id: ObjectId,
    kind: EntryKind,
}

/// A tree flattened: blobs, symlinks and submodules by path.
type Flat = BTreeMap<Vec<u8>, Item>;
/// One side of a diff: the content git would store, and its kind (None: absent).
type Side = Option<(Vec<u8>, EntryKind)>;

/// HEAD's tree, flattened (empty when unborn).
fn head_tree(repo: &gix::Repository) -> Result<(Option<GitHead>, Flat), RpcError> {
    let head = repo.head().map_err(broken)?;
    let reference = head.referent_name().map(|n| n.as_bstr().to_str_lossy().into_owned());
    let Some(id) = head.id() else {
        return Ok((None, BTreeMap::new()));
    };
    let git_head = GitHead {
        oid: id.to_string(),
        reference: if head.is_detached() { None } else { reference },
    };
    let tree = repo.head_commit().map_err(broken)?.tree().map_err(broken)?;
    let files = tree.traverse().breadthfirst.files().map_err(broken)?;
    let mut map = BTreeMap::new();
    for f in files {
        let kind = f.mode.kind();
        if kind == EntryKind::Tree {
            continue;
        }
        map.insert(f.filepath.to_vec(), Item { id: f.oid, kind });
    }
    Ok((Some(git_head), map))
}

fn index_kind(mode: Mode) -> Option<EntryKind> {
    match mode {
        Mode::FILE => Some(EntryKind::Blob),
        Mode::FILE_EXECUTABLE => Some(EntryKind::BlobExecutable),
        Mode::SYMLINK => Some(EntryKind::Link),
        Mode::COMMIT => Some(EntryKind::Commit),
        _ => None,
    }
}

/// The index, checked for features this module does not handle.
struct Index {
    /// Owned, not gix's shared snapshot, so that threads can share it.
    file: gix::index::File,
    /// Paths with conflict stages.
    unmerged: BTreeSet<Vec<u8>>,
}

impl Index {
    /// The stage-0 entry at `path` (the index is sorted by path, then stage).
    fn stage0(&self, path: &[u8]) -> Option<&gix::index::Entry> {
        let entries = self.file.entries();
        let at = entries.partition_point(|e| e.path(&self.file).as_bytes() < path);
        entries
            .get(at)
            .filter(|e| e.path(&self.file).as_bytes() == path && e.stage() == gix::index::entry::Stage::Unconflicted)
    }

    /// Whether `e` was added with `git add -N`: in the index by name, with no content yet.
    fn intent_to_add(e: &gix::index::Entry) -> bool {
        e.flags.contains(gix::index::entry::Flags::INTENT_TO_ADD)
    }

    /// Stage-0 entries with their paths, in path order.
    fn stage0_entries(&self) -> impl Iterator<Item = (&[u8], &gix::index::Entry)> {
        self.file
            .entries()
            .iter()
            .filter(|e| e.stage() == gix::index::entry::Stage::Unconflicted)
            .map(|e| (e.path(&self.file).as_bytes(), e))
    }
}

fn load_index(repo: &gix::Repository) -> Result<Index, RpcError> {
    let file = if repo.index_path().exists() {
        repo.open_index().map_err(broken)?
    } else {
        gix::index::File::from_state(gix::index::State::new(repo.object_hash()), repo.index_path())
    };
    if file.is_sparse() {
        return Err(unsupported("sparse-checkout"));
    }
    let mut unmerged = BTreeSet::new();
    for e in file.entries() {
        if e.flags.contains(gix::index::entry::Flags::SKIP_WORKTREE) {
            return Err(unsupported("sparse-checkout"));
        }
        if e.mode == Mode::COMMIT {
            return Err(unsupported("submodules"));
        }
        if e.stage() != gix::index::entry::Stage::Unconflicted {
            unmerged.insert(e.path(&file).to_vec());
        }
    }
    Ok(Index { file, unmerged })
}

/// Refuse repositories whose attributes select a filter driver with a configured command:
/// comparing without running it would be wrong, and running it is never allowed.
/// `attribute_files` are the worktree's (relative paths), read as files through the
/// workspace, never through a symlink (as git reads them); `info/attributes` is the
/// repository's own.
fn check_filters(repo: &gix::Repository, ws: &Workspace, attribute_files: &[Vec<u8>]) -> Result<(), RpcError> {
    let config = repo.config_snapshot();
    let in_tree = attribute_files.iter().map(|rel| {
        ws.open_regular(Path::new(OsStr::from_bytes(rel)))
            .ok()
            .and_then(|f| contents(f).ok())
    });
    let texts = std::iter::once(std::fs::read(repo.git_dir().join("info/attributes")).ok()).chain(in_tree);
    for text in texts.flatten() {
        for token in text.split(|b| b.is_ascii_whitespace()) {
            let Some(name) = token.strip_prefix(b"filter=") else {
                continue;
            };
            let name = String::from_utf8_lossy(name);
            let configured = ["clean", "smudge", "process"]
                .iter()
                .any(|k| config.string(format!("filter.{name}.{k}").as_str()).is_some());
            if configured {
                return Err(unsupported("external-filter"));
            }
        }
    }
    Ok(())
}

/// The blob git would store for the file at `rel` (no filters), with its kind; None when
/// there is nothing there that git tracks (absent, a directory, or a path that only a
/// symlink out of the workspace leads to, which git too sees as absent). Read through the
/// workspace's confinement, the last component never followed.
fn worktree_blob(ws: &Workspace, rel: &[u8]) -> std::io::Result<Side> {
    use cap_std::fs::MetadataExt;
    let rel = Path::new(OsStr::from_bytes(rel));
    let unreadable = |e: OpenError| match e {
        OpenError::Io(e) => Err(e),
        OpenError::Raced => Err(std::io::Error::other("the file was replaced while it was read")),
        OpenError::Absent | OpenError::Outside | OpenError::Symlink | OpenError::WrongKind => Ok(None),
    };
    match ws.open_regular(rel) {
        Ok(file) => {
            let kind = if file.meta.mode() & 0o111 != 0 {
                EntryKind::BlobExecutable
            } else {
                EntryKind::Blob
            };
            Ok(Some((contents(file)?, kind)))
        }
        Err(OpenError::Symlink) => match ws.read_link(rel) {
            Ok(target) => Ok(Some((target.into_os_string().into_vec(), EntryKind::Link))),
            Err(e) => unreadable(e),
        },
        Err(e) => unreadable(e),
    }
}

/// All of an opened file.
fn contents(mut file: Opened<std::fs::File>) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut data = Vec::with_capacity(usize::try_from(file.meta.len()).unwrap_or(0));
    file.handle.read_to_end(&mut data)?;
    Ok(data)
}

/// The workspace at `root`, for reading worktree files through its confinement.
fn workspace(root: &Path) -> Result<Workspace, RpcError> {
    Workspace::open(root).map_err(broken)
}

fn blob_id(repo: &gix::Repository, data: &[u8]) -> Result<ObjectId, RpcError> {
    gix::objs::compute_hash(repo.object_hash(), gix::objs::Kind::Blob, data).map_err(broken)
}

fn is_link(kind: EntryKind) -> bool {
    kind == EntryKind::Link
}

/// HEAD's side of the staged comparison: the blobs of every subtree that the index's cache
/// tree (git's `TREE` extension) does not record as identical to HEAD's, and the
/// directories (`dir/`, sorted) it does record so, whose index entries need no comparison.
/// Git skips them the same way; a fresh commit leaves the whole tree skipped.
#[derive(Default)]
struct HeadSide {
    flat: Flat,
    same_dirs: Vec<Vec<u8>>,
    /// The whole tree is the index's.
    all_same: bool,
}

impl HeadSide {
    /// Whether `path`'s index entry matches HEAD by the cache tree.
    fn skips(&self, path: &[u8]) -> bool {
        if self.all_same {
            return true;
        }
        // The directories are disjoint, so only the last one sorting before `path` can hold it.
        let at = self.same_dirs.partition_point(|d| d.as_slice() <= path);
        at > 0 && path.starts_with(&self.same_dirs[at - 1])
    }
}

fn head_side(repo: &gix::Repository, index: &Index) -> Result<(Option<GitHead>, HeadSide), RpcError> {
    let head = repo.head().map_err(broken)?;
    let reference = head.referent_name().map(|n| n.as_bstr().to_str_lossy().into_owned());
    let Some(id) = head.id() else {
        return Ok((None, HeadSide::default()));
    };
    let git_head = GitHead {
        oid: id.to_string(),
        reference: if head.is_detached() { None } else { reference },
    };
    let tree = repo.head_commit().map_err(broken)?.tree_id().map_err(broken)?.detach();
    let mut side = HeadSide::default();
    let cache = index.file.tree();
    if cache.is_some_and(|c| c.num_entries.is_some() && c.id == tree) {
        side.all_same = true;
    } else {
        collect_head(repo, tree, cache, &mut Vec::new(), &mut side)?;
    }
    Ok((Some(git_head), side))
}

/// HEAD's tree `id` at `prefix`, skipping the subtrees `cache` records as unchanged.
fn collect_head(
    repo: &gix::Repository,
    id: ObjectId,
    cache: Option<&gix::index::extension::Tree>,
    prefix: &mut Vec<u8>,
    side: &mut HeadSide,
) -> Result<(), RpcError> {
    let tree = repo.find_tree(id).map_err(broken)?;
    let decoded = tree.decode().map_err(broken)?;
    for entry in &decoded.entries {
        let len = prefix.len();
        prefix.extend_from_slice(entry.filename);
        let kind = entry.mode.kind();
        if kind == EntryKind::Tree {
            let child = cache.and_then(|c| {
                c.children
                    .iter()
                    .find(|t| t.name.as_slice() == entry.filename.as_bytes())
            });
            prefix.push(b'/');
            if child.is_some_and(|c| c.num_entries.is_some() && c.id == entry.oid) {
                side.same_dirs.push(prefix.clone());
            } else {
                collect_head(repo, entry.oid.to_owned(), child, prefix, side)?;
            }
        } else {
            side.flat.insert(
                prefix.clone(),
                Item {
                    id: entry.oid.to_owned(),
                    kind,
                },
            );
        }
        prefix.truncate(len);
    }
    Ok(())
}

/// The staged area: HEAD against the index.
fn staged(index: &Index, head: &HeadSide) -> Result<Vec<GitEntry>, RpcError> {
    let mut changes: Vec<(&[u8], GitChange)> = Vec::new();
    let mut in_index = HashSet::new();
    for (path, e) in index.stage0_entries() {
        // An intent to add is not staged: git shows it as added in the worktree.
        if head.skips(path) || Index::intent_to_add(e) {
            continue;
        }
        in_index.insert(path);
        let change = match head.flat.get(path) {
            None => GitChange::Added,
            Some(o) => {
                let kind = index_kind(e.mode).ok_or_else(|| unsupported("index-entry-mode"))?;
                if is_link(o.kind) != is_link(kind) {
                    GitChange::TypeChanged
                } else if o.id != e.id || o.kind != kind {
                    GitChange::Modified
                } else {
                    continue;
                }
            }
        };
        changes.push((path, change));
    }
    for path in head.flat.keys() {
        if !in_index.contains(path.as_slice()) && !index.unmerged.contains(path) {
            changes.push((path, GitChange::Deleted));
        }
    }
    changes.extend(index.unmerged.iter().map(|p| (p.as_slice(), GitChange::Unmerged)));
    changes.sort_by(|a, b| a.0.cmp(b.0));
    Ok(changes.into_iter().map(|(p, c)| git_entry(p, c)).collect())
}

/// The index's stat data for what `lstat` says now (truncated as git stores it).
fn index_stat(st: &rustix::fs::Stat) -> gix::index::entry::Stat {
    use gix::index::entry::stat::Time;
    gix::index::entry::Stat {
        mtime: Time {
            secs: st.st_mtime as u32,
            nsecs: st.st_mtime_nsec as u32,
        },
        ctime: Time {
            secs: st.st_ctime as u32,
            nsecs: st.st_ctime_nsec as u32,
        },
        dev: st.st_dev as u32,
        ino: st.st_ino as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u32,
    }
}

/// The kind of entry git would record for a file of mode `st_mode` (a regular file with any
/// execute bit is executable, as git decides with `core.fileMode`).
fn stat_kind(st_mode: u32) -> EntryKind {
    match FileType::from_raw_mode(st_mode) {
        FileType::Symlink => EntryKind::Link,
        FileType::Directory => EntryKind::Commit,
        _ if st_mode & 0o111 != 0 => EntryKind::BlobExecutable,
        _ => EntryKind::Blob,
    }
}

/// The directory `parent` beneath `root`, reached without any symlink (None when a
/// symlink or nothing is on the way). Kernels without `openat2` resolve it as `openat` does.
fn open_parent(root: &OwnedFd, parent: &[u8]) -> Option<OwnedFd> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mode = rustix::fs::Mode::empty();
    let resolve = rustix::fs::ResolveFlags::BENEATH | rustix::fs::ResolveFlags::NO_SYMLINKS;
    match rustix::fs::openat2(root, parent, flags, mode, resolve) {
        Err(rustix::io::Errno::NOSYS) => rustix::fs::openat(root, parent, flags, mode).ok(),
        opened => opened.ok(),
    }
}

/// The stage-0 entries (indices into `entries`) whose stat data does not vouch for their
/// content: changed, racily clean (the index was written in the same second as the file
/// last changed) or gone. Unchanged stat information means unchanged content, as git decides it.
fn stat_suspects(root: &OwnedFd, index: &Index, entries: &[(&[u8], usize)]) -> Vec<usize> {
    let timestamp = index.file.timestamp();
    let options = gix::index::entry::stat::Options::default();
    let all = index.file.entries();
    let mut out = Vec::new();
    // The entries are in path order, so a directory's files come together: each is looked
    // up by its name in the directory's descriptor (the one last opened), not walked to
    // from the root.
    let mut dir: (&[u8], Option<OwnedFd>) = (&[], None);
    for &(path, i) in entries {
        let e = &all[i];
        let st = match path.iter().rposition(|b| *b == b'/') {
            None => rustix::fs::statat(root, path, AtFlags::SYMLINK_NOFOLLOW),
            Some(at) => {
                let (parent, name) = (&path[..at], &path[at + 1..]);
                if dir.0 != parent {
                    dir = (parent, open_parent(root, parent));
                }
                match &dir.1 {
                    Some(fd) => rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW),
                    // Not reached without a symlink on the way: the file is read through
                    // the workspace's confinement instead.
                    None => Err(rustix::io::Errno::NOENT),
                }
            }
        };
        // The mode too: a `chmod +x` within the second of the index write keeps every time
        // git compares.
        let clean = st.is_ok_and(|st| {
            e.stat.matches(&index_stat(&st), options)
                && !e.stat.is_racy(timestamp, options)
                && index_kind(e.mode) == Some(stat_kind(st.st_mode))
        });
        if !clean {
            out.push(i);
        }
    }
    out
}

/// `git.status`: `None` outside a repository.
///
/// Like git, the `lstat` of every tracked file (in two halves on two threads, relative to
/// the root's descriptor) overlaps with the walk for untracked files (a third thread);
/// contents are hashed only for entries whose stat data does not vouch for them.
pub fn status(root: &Path) -> Result<Option<GitStatus>, RpcError> {
    let Some(repo) = open(root)? else { return Ok(None) };
    let index = load_index(&repo)?;
    let (head, head_side) = head_side(&repo, &index)?;
    let staged = staged(&index, &head_side)?;

    let dir = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| broken(std::io::Error::from(e)))?;
    let tracked: Vec<(&[u8], usize)> = index
        .file
        .entries()
        .iter()
        .enumerate()
        .filter(|(_, e)| e.stage() == gix::index::entry::Stage::Unconflicted && !Index::intent_to_add(e))
        .map(|(i, e)| (e.path(&index.file).as_bytes(), i))
        .collect();
    let (first, second) = tracked.split_at(tracked.len() / 2);
    let exclude_file = repo.common_dir().join("info/exclude");
    let (walked, mut suspects) = std::thread::scope(|s| {
        let walk = s.spawn(|| untracked(root, &exclude_file, &index));
        let half = s.spawn(|| stat_suspects(&dir, &index, second));
        let mut suspects = stat_suspects(&dir, &index, first);
        suspects.extend(half.join().unwrap_or_default());
        (walk.join(), suspects)
    });
    let (untracked_paths, attribute_files) = walked.map_err(|_| RpcError::new(ErrorCode::Internal))??;
    let ws = workspace(root)?;
    check_filters(&repo, &ws, &attribute_files)?;

    // An intent to add is an addition in the worktree while its file is there.
    let intents: Vec<usize> = index
        .file
        .entries()
        .iter()
        .enumerate()
        .filter(|(_, e)| e.stage() == gix::index::entry::Stage::Unconflicted && Index::intent_to_add(e))
        .map(|(i, _)| i)
        .collect();
    suspects.extend(&intents);
    suspects.sort_unstable();
    let mut worktree = Vec::new();
    for i in suspects {
        let e = &index.file.entries()[i];
        let path = e.path(&index.file).as_bytes();
        let change = match worktree_blob(&ws, path).map_err(broken)? {
            None => GitChange::Deleted,
            Some(_) if Index::intent_to_add(e) => GitChange::Added,
            Some((data, kind)) => {
                let indexed = index_kind(e.mode).ok_or_else(|| unsupported("index-entry-mode"))?;
                if is_link(kind) != is_link(indexed) {
                    GitChange::TypeChanged
                } else if kind != indexed || blob_id(&repo, &data)? != e.id {
                    GitChange::Modified
                } else {
                    continue;
                }
            }
        };
        worktree.push(git_entry(path, change));
    }
    let untracked = untracked_paths.iter().map(|p| git_entry(p, GitChange::Added)).collect();
    Ok(Some(GitStatus {
        head,
        staged,
        worktree,
        untracked,
    }))
}

fn git_entry(path: &[u8], change: GitChange) -> GitEntry {
    GitEntry {
        path: encode_path(path),
        change,
    }
}

/// Paths relative to the workspace root, as bytes.
type RelPaths = Vec<Vec<u8>>;

/// The `.gitignore` rules in force in one directory: its own file's, then its parents'.
struct Rules {
    own: Gitignore,
    parent: Option<Rc<Rules>>,
}

/// The walk for untracked files: what it has found so far, and what it consults.
struct Untracked<'a> {
    root: &'a Path,
    index: &'a Index,
    /// `info/exclude`, then the user's global excludes: consulted after every `.gitignore`.
    excludes: [Gitignore; 2],
    found: Vec<Vec<u8>>,
    attributes: Vec<Vec<u8>>,
}

/// A directory being walked: its child directories not yet entered.
struct Level {
    dir: rustix::fs::Dir,
    /// Its path relative to the root, with a trailing `/` (empty for the root).
    rel: Vec<u8>,
    /// The index entries beneath it (a contiguous run: the index is sorted by path).
    beneath: Range<usize>,
    rules: Option<Rc<Rules>>,
    subdirs: Vec<CString>,
}

impl Untracked<'_> {
    /// Whether `rel` is ignored by the rules in force, as git decides: the deepest
    /// `.gitignore` with an opinion, then `info/exclude`, then the global excludes.
    fn ignored(&self, rules: Option<&Rc<Rules>>, rel: &[u8], is_dir: bool) -> bool {
        let path = self.root.join(OsStr::from_bytes(rel));
        let chain = std::iter::successors(rules, |r| r.parent.as_ref()).map(|r| &r.own);
        for rules in chain.chain(&self.excludes) {
            match rules.matched(&path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
    }

    /// The index entries in `within` beneath directory `prefix` (which ends with `/`).
    fn beneath(&self, within: &Range<usize>, prefix: &[u8]) -> Range<usize> {
        let file = &self.index.file;
        let entries = &file.entries()[within.clone()];
        let lo = entries.partition_point(|e| e.path(file).as_bytes() < prefix);
        let len = entries[lo..].partition_point(|e| e.path(file).as_bytes().starts_with(prefix));
        within.start + lo..within.start + lo + len
    }

    fn tracked(&self, within: &Range<usize>, path: &[u8]) -> bool {
        let file = &self.index.file;
        file.entries()[within.clone()]
            .binary_search_by(|e| e.path(file).as_bytes().cmp(path))
            .is_ok()
    }

    /// Read one directory: its untracked files are recorded, its subdirectories that are
    /// not ignored are returned to be entered. A directory holding `.git` (other than the
    /// root) is a nested repository: one entry, `rel`, never entered.
    fn read(
        &mut self,
        fd: OwnedFd,
        rel: Vec<u8>,
        beneath: Range<usize>,
        rules: Option<Rc<Rules>>,
    ) -> Result<Level, RpcError> {
        let mut dir = rustix::fs::Dir::new(fd).map_err(walk_error)?;
        let mut names = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(walk_error)?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::Unknown => rustix::fs::statat(dir.fd().map_err(walk_error)?, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| FileType::from_raw_mode(st.st_mode))
                    .map_err(walk_error)?,
                kind => kind,
            };
            names.push((name.to_owned(), kind));
        }
        let mut level = Level {
            dir,
            rel,
            beneath,
            rules,
            subdirs: Vec::new(),
        };
        let kind_of = |n: &CStr| {
            names
                .iter()
                .find(|(name, _)| name.as_c_str() == n)
                .map(|(_, kind)| *kind)
        };
        if !level.rel.is_empty() && kind_of(c".git").is_some() {
            self.found.push(std::mem::take(&mut level.rel));
            return Ok(level);
        }
        // A `.gitignore` that is a symlink is not read, as git does not read it.
        if kind_of(c".gitignore") == Some(FileType::RegularFile) {
            let file = self.root.join(OsStr::from_bytes(&level.rel)).join(".gitignore");
            level.rules = Some(Rc::new(Rules {
                own: Gitignore::new(file).0,
                parent: level.rules.take(),
            }));
        }
        let mut path = level.rel.clone();
        for (name, kind) in names {
            if name.as_c_str() == c".git" {
                continue;
            }
            path.truncate(level.rel.len());
            path.extend_from_slice(name.to_bytes());
            if kind == FileType::Directory {
                if !self.ignored(level.rules.as_ref(), &path, true) {
                    level.subdirs.push(name);
                }
                continue;
            }
            if name.as_c_str() == c".gitattributes" && kind == FileType::RegularFile {
                self.attributes.push(path.clone());
            }
            // Only untracked files are matched against the ignore rules, as in git.
            if !self.tracked(&level.beneath, &path) && !self.ignored(level.rules.as_ref(), &path, false) {
                self.found.push(path.clone());
            }
        }
        Ok(level)
    }
}

fn walk_error(e: rustix::io::Errno) -> RpcError {
    broken(std::io::Error::from(e))
}

/// Files that are neither tracked nor ignored (sorted), as `git status -uall` lists them,
/// and the `.gitattributes` files seen on the way. A nested repository is one entry
/// (`dir/`), never entered.
///
/// Each directory is read once through a descriptor opened beneath its parent's without
/// following symlinks; a file is looked up only among the index entries of its own
/// directory, and only untracked files are matched against the ignore rules.
fn untracked(root: &Path, exclude_file: &Path, index: &Index) -> Result<(RelPaths, RelPaths), RpcError> {
    let mut exclude = GitignoreBuilder::new(root);
    // A missing `info/exclude` excludes nothing.
    let _ = exclude.add(exclude_file);
    let mut walk = Untracked {
        root,
        index,
        excludes: [
            exclude.build().unwrap_or_else(|_| Gitignore::empty()),
            GitignoreBuilder::new(root).build_global().0,
        ],
        found: Vec::new(),
        attributes: Vec::new(),
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = rustix::fs::open(root, flags, rustix::fs::Mode::empty()).map_err(walk_error)?;
    let mut stack = vec![walk.read(fd, Vec::new(), 0..index.file.entries().len(), None)?];
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.subdirs.pop() else {
            stack.pop();
            continue;
        };
        let fd = rustix::fs::openat(
            top.dir.fd().map_err(walk_error)?,
            &*name,
            flags | OFlags::NOFOLLOW,
            rustix::fs::Mode::empty(),
        )
        .map_err(walk_error)?;
        let mut rel = top.rel.clone();
        rel.extend_from_slice(name.to_bytes());
        rel.push(b'/');
        let beneath = walk.beneath(&top.beneath, &rel);
        let rules = top.rules.clone();
        let level = walk.read(fd, rel, beneath, rules)?;
        stack.push(level);
    }
    walk.found.sort();
    Ok((walk.found, walk.attributes))
}

/// `git.diff` of one path in one area.
pub fn diff(root: &Path, path: &[u8], area: GitArea) -> Result<GitDiff, RpcError> {
    let Some(repo) = open(root)? else {
        return Ok(GitDiff::Unsupported {
            reason: "no-repository".into(),
        });
    };
    let index = load_index(&repo)?;
    let ws = workspace(root)?;
    check_filters(&repo, &ws, &[b".gitattributes".to_vec()])?;
    let blob = |id: ObjectId| -> Result<Vec<u8>, RpcError> { Ok(repo.find_blob(id).map_err(broken)?.data.clone()) };
    // A conflicted path is what git says of it, not a deletion of the whole file.
    if index.unmerged.contains(path) && area != GitArea::Untracked {
        return Ok(GitDiff::Text {
            patch: format!("* Unmerged path {}\n", quoted("", path)),
            truncated: None,
        });
    }
    let entry = index.stage0(path);
    // An intent to add has no content in the index: in the worktree it is a new file.
    let intent = entry.is_some_and(Index::intent_to_add);
    let indexed = match entry {
        Some(e) => Some((e.id, index_kind(e.mode).ok_or_else(|| unsupported("index-entry-mode"))?)),
        None => None,
    };
    // A side past the bound is not read at all (a 20 MB file is not diffed, whatever its
    // answer would be).
    let too_large = || {
        Ok(GitDiff::Unsupported {
            reason: "too-large".into(),
        })
    };
    let blob_size = |id: ObjectId| -> Result<u64, RpcError> { Ok(repo.find_header(id).map_err(broken)?.size()) };
    let file_size = || {
        ws.lstat(Path::new(OsStr::from_bytes(path)))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    let read_file = || -> Result<Option<(Vec<u8>, EntryKind)>, RpcError> { worktree_blob(&ws, path).map_err(broken) };
    let (old, new): (Side, Side) = match area {
        GitArea::Staged => {
            let (_, tree) = head_tree(&repo)?;
            let old = match tree.get(path) {
                Some(item) if item.kind == EntryKind::Commit => return Ok(submodule()),
                Some(item) if blob_size(item.id)? > GIT_DIFF_FILE_MAX => return too_large(),
                Some(item) => Some((blob(item.id)?, item.kind)),
                None => None,
            };
            let new = match indexed {
                _ if intent => None,
                Some((id, _)) if blob_size(id)? > GIT_DIFF_FILE_MAX => return too_large(),
                Some((id, kind)) => Some((blob(id)?, kind)),
                None => None,
            };
            (old, new)
        }
        GitArea::Worktree if intent => {
            if file_size() > GIT_DIFF_FILE_MAX {
                return too_large();
            }
            (None, read_file()?)
        }
        GitArea::Worktree => {
            let Some((id, kind)) = indexed else {
                return Ok(GitDiff::Unchanged);
            };
            if blob_size(id)? > GIT_DIFF_FILE_MAX || file_size() > GIT_DIFF_FILE_MAX {
                return too_large();
            }
            (Some((blob(id)?, kind)), read_file()?)
        }
        GitArea::Untracked => {
            if indexed.is_some() {
                return Ok(GitDiff::Unchanged);
            }
            if file_size() > GIT_DIFF_FILE_MAX {
                return too_large();
            }
            (None, read_file()?)
        }
    };
    // Unchanged only when the content and the mode are (a `chmod +x` is a change).
    if old == new {
        return Ok(GitDiff::Unchanged);
    }
    let (before, after) = (
        old.as_ref().map(|o| o.0.as_slice()),
        new.as_ref().map(|n| n.0.as_slice()),
    );
    let binary = |d: Option<&[u8]>| d.is_some_and(|d| d[..d.len().min(BINARY_PROBE)].contains(&0));
    if binary(before) || binary(after) {
        return Ok(GitDiff::Binary);
    }
    if std::str::from_utf8(before.unwrap_or_default()).is_err()
        || std::str::from_utf8(after.unwrap_or_default()).is_err()
    {
        return Ok(GitDiff::Unsupported {
            reason: "not-utf8".into(),
        });
    }
    // As git prints it: `diff --git`, mode lines (a mode change alone, or an empty file
    // added, has no hunk), the quoted names, the hunks.
    let mut patch = String::new();
    file_patch(&mut patch, path, old, new);
    Ok(bounded(patch))
}

/// A text diff within [`GIT_DIFF_MAX`]: a longer one cut at its last line end within the
/// bound, and marked.
fn bounded(mut patch: String) -> GitDiff {
    if patch.len() <= GIT_DIFF_MAX {
        return GitDiff::Text { patch, truncated: None };
    }
    let bytes = patch.len() as u64;
    let cut = berth_protocol::text::prefix(&patch, GIT_DIFF_MAX);
    let end = cut.rfind('\n').map_or(cut.len(), |i| i + 1);
    patch.truncate(end);
    GitDiff::Text {
        truncated: Some(berth_protocol::Truncation {
            truncated: true,
            bytes,
            returned: patch.len() as u64,
        }),
        patch,
    }
}

/// `patch.snapshot`: every change of the workspace against HEAD — the paths `status`
/// lists in any area — as one unified diff `git apply` takes (HEAD's content → the
/// file's; binary or non-UTF-8 content as `Binary files … differ`), and the facts about it.
/// More than `max` bytes is `payload-too-large {limit: "patch"}`.
pub fn patch(root: &Path, max: usize) -> Result<(String, PatchCaptured), RpcError> {
    let Some(repo) = open(root)? else {
        return Err(failure(ErrorCode::Unsupported, "feature", "no-repository"));
    };
    let Some(st) = status(root)? else {
        return Err(failure(ErrorCode::Unsupported, "feature", "no-repository"));
    };
    let (head, tree) = head_tree(&repo)?;
    let mut paths = BTreeSet::new();
    for e in st.staged.iter().chain(&st.worktree).chain(&st.untracked) {
        let path = super::decode_raw(&e.path).map_err(|_| RpcError::new(ErrorCode::Internal))?;
        // A nested repository (`dir/`) is not content of this one.
        if !path.ends_with(b"/") {
            paths.insert(path);
        }
    }
    let ws = workspace(root)?;
    let mut out = String::new();
    let mut files = 0u32;
    for path in paths {
        let old: Side = match tree.get(&path) {
            Some(item) if item.kind == EntryKind::Commit => continue,
            Some(item) => Some((repo.find_blob(item.id).map_err(broken)?.data.clone(), item.kind)),
            None => None,
        };
        let new = worktree_blob(&ws, &path).map_err(broken)?;
        if old == new {
            continue;
        }
        files += 1;
        match (old, new) {
            (Some(o), Some(n)) if is_link(o.1) != is_link(n.1) => {
                file_patch(&mut out, &path, Some(o), None);
                file_patch(&mut out, &path, None, Some(n));
            }
            (o, n) => file_patch(&mut out, &path, o, n),
        }
        if out.len() > max {
            let mut fields = serde_json::Map::new();
            fields.insert("limit".into(), "patch".into());
            fields.insert("max".into(), max.into());
            return Err(RpcError::with_fields(ErrorCode::PayloadTooLarge, fields));
        }
    }
    Ok((
        out,
        PatchCaptured {
            base: head.map(|h| h.oid),
            files,
        },
    ))
}

fn mode(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::BlobExecutable => "100755",
        EntryKind::Link => "120000",
        _ => "100644",
    }
}

/// A path as git writes it in a patch header: C-quoted (octal escapes for control and
/// non-ASCII bytes) when it needs quoting, so any name survives as UTF-8 text.
fn quoted(prefix: &str, path: &[u8]) -> String {
    let plain = path
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
    if plain {
        return format!("{prefix}{}", String::from_utf8_lossy(path));
    }
    let mut s = String::from("\"");
    s.push_str(prefix);
    for &b in path {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\t' => s.push_str("\\t"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            0x20..0x7f => s.push(b as char),
            _ => s.push_str(&format!("\\{b:03o}")),
        }
    }
    s.push('"');
    s
}

/// One path's part of a patch, in git's format.
fn file_patch(out: &mut String, path: &[u8], old: Side, new: Side) {
    let (a, b) = (quoted("a/", path), quoted("b/", path));
    out.push_str(&format!("diff --git {a} {b}\n"));
    match (&old, &new) {
        (None, Some((_, kind))) => out.push_str(&format!("new file mode {}\n", mode(*kind))),
        (Some((_, kind)), None) => out.push_str(&format!("deleted file mode {}\n", mode(*kind))),
        (Some((_, o)), Some((_, n))) if mode(*o) != mode(*n) => {
            out.push_str(&format!("old mode {}\nnew mode {}\n", mode(*o), mode(*n)));
        }
        _ => {}
    }
    let before = old.as_ref().map(|o| o.0.as_slice());
    let after = new.as_ref().map(|n| n.0.as_slice());
    if before.unwrap_or_default() == after.unwrap_or_default() {
        // A mode change only, or an empty file added or removed: no hunks.
        return;
    }
    let from = if before.is_some() {
        a.clone()
    } else {
        "/dev/null".into()
    };
    let to = if after.is_some() { b.clone() } else { "/dev/null".into() };
    let binary = |d: Option<&[u8]>| d.is_some_and(|d| d[..d.len().min(BINARY_PROBE)].contains(&0));
    let text = (
        std::str::from_utf8(before.unwrap_or_default()),
        std::str::from_utf8(after.unwrap_or_default()),
    );
    match text {
        (Ok(t0), Ok(t1)) if !binary(before) && !binary(after) => {
            out.push_str(&format!("--- {from}\n+++ {to}\n"));
            out.push_str(&hunks(t0, t1));
        }
        _ => out.push_str(&format!("Binary files {from} and {to} differ\n")),
    }
}

fn submodule() -> GitDiff {
    GitDiff::Unsupported {
        reason: "submodule".into(),
    }
}

/// Lines of context around changes, as git's default.
const CONTEXT: u32 = 3;

/// Unified hunks (3 lines of context) in git's format: git's line-sliding heuristic,
/// `@@ -l,s +l,s @@ <function line>` with `,1` left out and an empty side numbered by the
/// line before it, and a last line without newline marked.
pub(crate) fn hunks(before: &str, after: &str) -> String {
    use std::fmt::Write;

    use imara_diff::{Algorithm, Diff, InternedInput};
    let input = InternedInput::new(before, after);
    let mut diff = Diff::compute(Algorithm::Myers, &input);
    diff.postprocess_lines(&input);
    let all: Vec<imara_diff::Hunk> = diff.hunks().collect();
    let text = |t: &imara_diff::Token| input.interner[*t];
    let (old, new) = (&input.before, &input.after);
    let mut out = String::new();
    let line = |out: &mut String, sign: char, s: &str| {
        out.push(sign);
        out.push_str(s);
        if !s.ends_with('\n') {
            out.push_str("\n\\ No newline at end of file\n");
        }
    };
    let mut i = 0;
    while i < all.len() {
        // Changes closer than twice the context share a hunk.
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].before.start - all[j].before.end <= 2 * CONTEXT {
            j += 1;
        }
        let lead = CONTEXT.min(all[i].before.start);
        let trail = CONTEXT.min(old.len() as u32 - all[j].before.end);
        let (b_from, b_to) = (all[i].before.start - lead, all[j].before.end + trail);
        let (a_from, a_to) = (all[i].after.start - lead, all[j].after.end + trail);
        let _ = write!(
            out,
            "@@ -{} +{} @@",
            range(b_from, b_to - b_from),
            range(a_from, a_to - a_from)
        );
        if let Some(f) = old[..b_from as usize].iter().rev().map(text).find(|l| {
            l.as_bytes()
                .first()
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_' || *c == b'$')
        }) {
            let f = f.trim_end();
            let mut cut = f.len().min(80);
            while !f.is_char_boundary(cut) {
                cut -= 1;
            }
            out.push(' ');
            out.push_str(&f[..cut]);
        }
        out.push('\n');
        let mut pos = b_from;
        for h in &all[i..=j] {
            for t in &old[pos as usize..h.before.start as usize] {
                line(&mut out, ' ', text(t));
            }
            for t in &old[h.before.start as usize..h.before.end as usize] {
                line(&mut out, '-', text(t));
            }
            for t in &new[h.after.start as usize..h.after.end as usize] {
                line(&mut out, '+', text(t));
            }
            pos = h.before.end;
        }
        for t in &old[pos as usize..b_to as usize] {
            line(&mut out, ' ', text(t));
        }
        i = j + 1;
    }
    out
}

fn range(start: u32, len: u32) -> String {
    match len {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        _ => format!("{},{len}", start + 1),
    }
}

#[cfg(test)]
mod tests {
    use std::{path::Path, process::Command};

    use super::{hunks, patch, status};

    fn git(dir: &Path, args: &[&str]) {
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
    }

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

    fn feature(root: &Path) -> String {
        let e = status(root).unwrap_err();
        assert_eq!(e.data_code(), Some("unsupported"));
        e.data["feature"].as_str().unwrap().to_string()
    }

    /// What `git status -uall` lists as untracked, as raw path bytes.
    fn cli_untracked(dir: &Path) -> Vec<Vec<u8>> {
        let out = Command::new("git")
            .args(["status", "--porcelain=v1", "-z", "-uall"])
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .expect("git runs");
        assert!(out.status.success());
        let mut paths: Vec<Vec<u8>> = out
            .stdout
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

        let index = super::load_index(&gix::open(root).unwrap()).unwrap();
        let (found, attributes) = super::untracked(root, &root.join(".git/info/exclude"), &index).unwrap();
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
        let worktree: Vec<_> = st
            .worktree
            .iter()
            .map(|e| (super::super::decode_raw(&e.path).unwrap(), e.change))
            .collect();
        assert_eq!(worktree, vec![(b"dir/a".to_vec(), GitChange::Deleted)]);
        let untracked: Vec<_> = st
            .untracked
            .iter()
            .map(|e| super::super::decode_raw(&e.path).unwrap())
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

    #[test]
    fn sparse_checkouts_and_submodules_fail_explicitly() {
        let sparse = repo();
        assert!(status(sparse.path()).unwrap().is_some());
        git(sparse.path(), &["sparse-checkout", "set", "--no-cone", "/b"]);
        assert_eq!(feature(sparse.path()), "sparse-checkout");

        let outer = repo();
        let inner = repo();
        git(
            outer.path(),
            &[
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "add",
                "-q",
                inner.path().to_str().unwrap(),
                "sub",
            ],
        );
        assert_eq!(feature(outer.path()), "submodules");
    }

    fn staged(root: &Path) -> Vec<(String, berth_protocol::GitChange)> {
        status(root)
            .unwrap()
            .unwrap()
            .staged
            .into_iter()
            .map(|e| {
                let path = super::super::decode_raw(&e.path).unwrap();
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

        let (text, captured) = patch(root, usize::MAX).unwrap();
        assert_eq!(captured.files, 8, "{text}");
        assert!(captured.base.is_some());
        assert!(!text.contains("debug.log"), "ignored files are left out");
        // git apply cannot apply a binary change without its contents: check it is named,
        // then apply the rest.
        std::fs::write(root.join("blob.bin"), b"\0\x02").unwrap();
        let (with_binary, _) = patch(root, usize::MAX).unwrap();
        assert!(
            with_binary.contains("Binary files a/blob.bin and b/blob.bin differ\n"),
            "{with_binary}"
        );
        let file = base.path().join("p.diff");
        std::fs::write(&file, &text).unwrap();
        git(base.path(), &["apply", file.to_str().unwrap()]);
        std::fs::remove_file(&file).unwrap();
        for f in ["long.txt", "dir/a", "caf\u{e9} \"q\".txt", "new/file.txt", "empty"] {
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
            hunks(&before, &after),
            "@@ -1,5 +1,5 @@\n line 1\n-line 2\n+two\n line 3\n line 4\n line 5\n\
             @@ -15,6 +15,5 @@ line 14\n line 15\n line 16\n line 17\n-line 18\n line 19\n line 20\n"
        );
        assert_eq!(
            hunks("", "a\nb"),
            "@@ -0,0 +1,2 @@\n+a\n+b\n\\ No newline at end of file\n"
        );
        assert_eq!(hunks("a\n", ""), "@@ -1 +0,0 @@\n-a\n");
    }
}
