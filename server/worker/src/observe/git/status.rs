//! `git.status`: HEAD against the index (staged), the index against the files (worktree),
//! and the files neither tracked nor ignored (untracked).

use std::{collections::HashSet, path::Path};

use berth_protocol::{ErrorCode, GitChange, GitEntry, GitHead, GitStatus, RpcError};
use gix::{ObjectId, bstr::ByteSlice, objs::tree::EntryKind};
use rustix::fs::OFlags;

use super::{
    Flat, Item,
    attributes::check_filters,
    blob_id, broken,
    index::{Index, index_kind, load_index, stat_suspects},
    is_link, open, unsupported,
    untracked::untracked,
    workspace, worktree_blob,
};
use crate::observe::encode_path;

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
