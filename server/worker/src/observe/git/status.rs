//! `git.status`: HEAD against the index (staged), the index against the files (worktree),
//! and the files neither tracked nor ignored (untracked).

use std::{collections::HashSet, ffi::OsStr, os::unix::ffi::OsStrExt, path::Path};

use berth_protocol::{ErrorCode, GitChange, GitEntry, GitHead, GitStatus, GitSubmodule, RpcError};
use gix::{ObjectId, bstr::ByteSlice, index::entry::Mode, objs::tree::EntryKind};
use rustix::fs::OFlags;

use super::{
    Flat, Item,
    attributes::Attributes,
    blob_id, broken, clean_side,
    index::{Index, index_kind, load_index, stat_suspects},
    large_file, open, same_type, unsupported,
    untracked::untracked,
    workspace, worktree_blob,
};
use crate::{observe::encode_path, workspace::Workspace};

/// HEAD's side of the staged comparison: the blobs of every subtree that the index's cache
/// tree (git's `TREE` extension) does not record as identical to HEAD's, and the
/// directories (`dir/`, sorted) it does record so, whose index entries need no comparison.
/// Git skips them the same way; a fresh commit leaves the whole tree skipped.
#[derive(Default)]
pub(super) struct HeadSide {
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

pub(super) fn head_side(repo: &gix::Repository, index: &Index) -> Result<(Option<GitHead>, HeadSide), RpcError> {
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
pub(super) fn collect_head(
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
pub(super) fn staged(index: &Index, head: &HeadSide) -> Result<Vec<GitEntry>, RpcError> {
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
                if !same_type(o.kind, kind) {
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
    Ok(changes.into_iter().map(|(p, c)| git_entry(p, c, None)).collect())
}
/// `git.status`: `None` outside a repository.
///
/// Like git, the `lstat` of every tracked file (in two halves on two threads, relative to
/// the root's descriptor) overlaps with the walk for untracked files (a third thread);
/// contents are hashed only for entries whose stat data does not vouch for them, after the
/// end-of-line conversion their attributes select.
pub fn status(root: &Path) -> Result<Option<GitStatus>, RpcError> {
    Ok(observe(root)?.map(|(status, _)| status))
}

/// `git.status`, and the attribute rules it read (for a patch of the same files).
pub(super) fn observe(root: &Path) -> Result<Option<(GitStatus, Attributes)>, RpcError> {
    let Some(repo) = open(root)? else { return Ok(None) };
    let index = load_index(&repo)?;
    let (head, head_side) = head_side(&repo, &index)?;
    let mut staged = staged(&index, &head_side)?;

    let dir = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| broken(std::io::Error::from(e)))?;
    let stage0 = |e: &gix::index::Entry| e.stage() == gix::index::entry::Stage::Unconflicted;
    // Submodules are looked at on their own, below.
    let tracked: Vec<(&[u8], usize)> = index
        .file
        .entries()
        .iter()
        .enumerate()
        // An entry assume-unchanged or outside a sparse checkout is, as git takes it,
        // unchanged.
        .filter(|(_, e)| stage0(e) && !Index::intent_to_add(e) && e.mode != Mode::COMMIT && !index.unlooked(e))
        .map(|(i, e)| (e.path(&index.file).as_bytes(), i))
        .collect();
    let (first, second) = tracked.split_at(tracked.len() / 2);
    let exclude_file = repo.common_dir().join("info/exclude");
    // Wherever the configuration sets it (the repository's own included).
    let excludes_file = repo.config_snapshot().trusted_path("core.excludesFile").ok().flatten();
    let file_mode = super::file_mode(&repo);
    let (walked, mut suspects) = std::thread::scope(|s| {
        let walk = s.spawn(|| untracked(root, &exclude_file, excludes_file.as_deref(), &index));
        let half = s.spawn(|| stat_suspects(&dir, &index, second, file_mode));
        let mut suspects = stat_suspects(&dir, &index, first, file_mode);
        suspects.extend(half.join().unwrap_or_default());
        (walk.join(), suspects)
    });
    let (untracked_paths, mut attribute_files) = walked.map_err(|_| RpcError::new(ErrorCode::Internal))??;
    // The walk does not enter an ignored directory, whose tracked files its own
    // `.gitattributes` (tracked too) still rules, as git reads it.
    let name = b".gitattributes";
    attribute_files.extend(
        index
            .file
            .entries()
            .iter()
            .map(|e| e.path(&index.file).as_bytes())
            .filter(|p| p.ends_with(name) && (p.len() == name.len() || p[p.len() - name.len() - 1] == b'/'))
            .map(<[u8]>::to_vec),
    );
    attribute_files.sort_unstable();
    attribute_files.dedup();
    let ws = workspace(root)?;
    let attributes = Attributes::load(&repo, &ws, &attribute_files)?;

    // An intent to add is an addition in the worktree while its file is there; a submodule
    // is compared by its checked-out commit and its own status.
    let others = index
        .file
        .entries()
        .iter()
        .enumerate()
        .filter(|(_, e)| stage0(e) && (Index::intent_to_add(e) || e.mode == Mode::COMMIT))
        .map(|(i, _)| i);
    suspects.extend(others);
    suspects.sort_unstable();
    let mut worktree = Vec::new();
    let mut submodules = Vec::new();
    let ignores = std::cell::OnceCell::new();
    for i in suspects {
        let e = &index.file.entries()[i];
        let path = e.path(&index.file).as_bytes();
        if e.mode == Mode::COMMIT {
            let ignores = ignores.get_or_init(|| SubmoduleIgnores::load(&repo, &ws));
            let (change, state) = submodule(&ws, &repo, path, e.id, ignores.of(path))?;
            submodules.push((path, state));
            if let Some(change) = change {
                worktree.push(git_entry(path, change, Some(state)));
            }
            continue;
        }
        // The file as git would store it: held whole, or, too large to hold, hashed as it is
        // read ([`large_file`]).
        let keep = index_kind(e.mode).filter(|_| !file_mode);
        let found = match large_file(&ws, &repo, &attributes, path, e.id, keep)? {
            Some((kind, same)) => Some((Content::Hashed(same), kind)),
            None => {
                let blob = || repo.find_blob(e.id).ok().map(|b| b.data.clone());
                let found = worktree_blob(&ws, path, keep, true).map_err(broken)?;
                clean_side(&attributes, path, found, &mut || blob())?.map(|(data, kind)| (Content::Held(data), kind))
            }
        };
        let change = match found {
            None => GitChange::Deleted,
            Some(_) if Index::intent_to_add(e) => GitChange::Added,
            Some((content, kind)) => {
                let indexed = index_kind(e.mode).ok_or_else(|| unsupported("index-entry-mode"))?;
                if !same_type(kind, indexed) {
                    GitChange::TypeChanged
                } else if kind != indexed || !content.is(&repo, e.id)? {
                    GitChange::Modified
                } else {
                    continue;
                }
            }
        };
        worktree.push(git_entry(path, change, None));
    }
    // A staged submodule carries its worktree state too, as git's porcelain reports it.
    for entry in &mut staged {
        let path = crate::observe::decode_raw(&entry.path).map_err(|_| RpcError::new(ErrorCode::Internal))?;
        entry.submodule = submodules.iter().find(|(p, _)| *p == path.as_slice()).map(|(_, s)| *s);
    }
    let untracked = untracked_paths
        .iter()
        .map(|p| git_entry(p, GitChange::Added, None))
        .collect();
    let status = GitStatus {
        head,
        staged,
        worktree,
        untracked,
    };
    Ok(Some((status, attributes)))
}

/// What `git status` leaves out of a submodule's state (`submodule.<name>.ignore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum SubmoduleIgnore {
    #[default]
    None,
    /// Its untracked files.
    Untracked,
    /// Anything but a change of its commit.
    Dirty,
    /// Everything: its worktree is never changed.
    All,
}

impl SubmoduleIgnore {
    fn parse(v: &[u8]) -> Option<SubmoduleIgnore> {
        match v {
            b"none" => Some(SubmoduleIgnore::None),
            b"untracked" => Some(SubmoduleIgnore::Untracked),
            b"dirty" => Some(SubmoduleIgnore::Dirty),
            b"all" => Some(SubmoduleIgnore::All),
            _ => None,
        }
    }
}

/// The submodules' `ignore` settings, as git takes them: the repository's
/// `submodule.<name>.ignore`, else `.gitmodules`' (read from the worktree once, no includes
/// followed), else `diff.ignoreSubmodules`.
pub(super) struct SubmoduleIgnores {
    by_path: Vec<(Vec<u8>, SubmoduleIgnore)>,
    fallback: SubmoduleIgnore,
}

impl SubmoduleIgnores {
    pub(super) fn load(repo: &gix::Repository, ws: &Workspace) -> SubmoduleIgnores {
        let config = repo.config_snapshot();
        let fallback = config
            .string("diff.ignoreSubmodules")
            .and_then(|v| SubmoduleIgnore::parse(v.as_ref()))
            .unwrap_or_default();
        let text = ws
            .open_tracked(Path::new(".gitmodules"))
            .ok()
            .and_then(|file| super::contents(file).ok())
            .unwrap_or_default();
        let meta = gix::config::file::Metadata::from(gix::config::Source::Local);
        let modules = gix::config::File::from_bytes_no_includes(&text, meta, Default::default()).ok();
        let sections = modules.as_ref().and_then(|m| m.sections_by_name("submodule"));
        let by_path = sections
            .into_iter()
            .flatten()
            .filter_map(|section| {
                let path = section.value("path")?;
                let name = section.header().subsection_name()?;
                let own = config.string(format!("submodule.{name}.ignore").as_str());
                let ignore = own
                    .or_else(|| section.value("ignore"))
                    .and_then(|v| SubmoduleIgnore::parse(v.as_slice()))
                    .unwrap_or(fallback);
                Some((path.to_vec(), ignore))
            })
            .collect();
        SubmoduleIgnores { by_path, fallback }
    }

    /// The setting of the submodule at `path`.
    pub(super) fn of(&self, path: &[u8]) -> SubmoduleIgnore {
        self.by_path
            .iter()
            .find(|(p, _)| p.as_slice() == path)
            .map_or(self.fallback, |(_, ignore)| *ignore)
    }
}

/// The submodule at `path`, whose index entry records commit `recorded`: how its worktree
/// differs (None: it does not) and its state, as git reports them, less what its `ignore`
/// setting leaves out. A submodule that is not checked out (an empty directory, or a
/// repository whose git directory is outside the workspace) is unchanged; one whose
/// directory is gone is deleted.
pub(super) fn submodule(
    ws: &Workspace,
    outer: &gix::Repository,
    path: &[u8],
    recorded: ObjectId,
    ignore: SubmoduleIgnore,
) -> Result<(Option<GitChange>, GitSubmodule), RpcError> {
    let mut state = GitSubmodule {
        commit_changed: false,
        modified: false,
        untracked: false,
    };
    let rel = Path::new(OsStr::from_bytes(path));
    match ws.lstat(rel) {
        Err(_) => return Ok((Some(GitChange::Deleted), state)),
        Ok(meta) if !meta.is_dir() => return Ok((Some(GitChange::TypeChanged), state)),
        Ok(_) => {}
    }
    let Some((head, status)) = submodule_status(ws, outer, rel)? else {
        return Ok((None, state));
    };
    state.commit_changed = head != Some(recorded);
    for e in status.staged.iter().chain(&status.worktree) {
        // A nested submodule with only untracked files makes this one untracked, not
        // modified, as git counts it.
        match e.submodule {
            Some(s) if !s.commit_changed && !s.modified && s.untracked && e.change == GitChange::Modified => {
                state.untracked = true;
            }
            _ => state.modified = true,
        }
    }
    state.untracked |= !status.untracked.is_empty();
    match ignore {
        SubmoduleIgnore::None => {}
        SubmoduleIgnore::Untracked => state.untracked = false,
        SubmoduleIgnore::Dirty => (state.modified, state.untracked) = (false, false),
        SubmoduleIgnore::All => {
            state = GitSubmodule {
                commit_changed: false,
                modified: false,
                untracked: false,
            }
        }
    }
    let changed = state.commit_changed || state.modified || state.untracked;
    Ok((changed.then_some(GitChange::Modified), state))
}

/// A worktree file's content, as compared with its index entry.
enum Content {
    /// Read whole (as git would store it).
    Held(Vec<u8>),
    /// Too large to hold: whether it hashed to the entry's blob ([`large_file`]).
    Hashed(bool),
}

impl Content {
    /// Whether the content is the blob `id`.
    fn is(&self, repo: &gix::Repository, id: ObjectId) -> Result<bool, RpcError> {
        match self {
            Content::Held(data) => Ok(blob_id(repo, data)? == id),
            Content::Hashed(same) => Ok(*same),
        }
    }
}

/// The checked-out commit and the status of the submodule at `rel` of the workspace `ws`
/// (whose repository is `outer`), or None when it is not checked out (no `.git` in it, or a
/// git directory outside the workspace and its repository).
pub(super) fn submodule_status(
    ws: &Workspace,
    outer: &gix::Repository,
    rel: &Path,
) -> Result<Option<(Option<ObjectId>, GitStatus)>, RpcError> {
    let root = ws.root().join(rel);
    if ws.lstat(&rel.join(".git")).is_err() {
        return Ok(None);
    }
    let repo = gix::open(&root).map_err(broken)?;
    // Its repository lies in the workspace, or in the workspace's own repository (a linked
    // worktree's submodules are under `<main>/.git/worktrees/<name>/modules/`); a `.git`
    // file that leads anywhere else is not followed.
    let bases: Vec<std::path::PathBuf> = [ws.root(), outer.git_dir(), outer.common_dir()]
        .into_iter()
        .filter_map(|b| b.canonicalize().ok())
        .collect();
    let inside = |p: &Path| p.canonicalize().is_ok_and(|p| bases.iter().any(|b| p.starts_with(b)));
    if !inside(repo.git_dir()) || !inside(repo.common_dir()) {
        return Ok(None);
    }
    let head = repo.head_id().ok().map(|id| id.detach());
    match status(&root)? {
        Some(status) => Ok(Some((head, status))),
        None => Ok(None),
    }
}

fn git_entry(path: &[u8], change: GitChange, submodule: Option<GitSubmodule>) -> GitEntry {
    GitEntry {
        path: encode_path(path),
        change,
        submodule,
    }
}
