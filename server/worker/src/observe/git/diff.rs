//! `git.diff`: one path in one area, bounded.

use std::{ffi::OsStr, os::unix::ffi::OsStrExt, path::Path};

use base64::Engine;
use berth_protocol::{GIT_DIFF_FILE_MAX, GIT_DIFF_MAX, GitArea, GitChange, GitDiff, RpcError};
use gix::{ObjectId, objs::tree::EntryKind};

use super::{
    Side,
    attributes::Attributes,
    broken, clean_side, head_tree,
    index::{Index, index_kind, load_index},
    open,
    status::submodule,
    unsupported, workspace, worktree_blob,
    writer::{file_patch, is_binary, quoted, submodule_side},
};
use crate::workspace::Workspace;

/// `git.diff` of one path in one area, as `git diff --full-index` prints it (`--cached` for
/// the staged area, `--no-index /dev/null` for an untracked file): worktree files as git
/// would store them (line endings converted by their attributes), a submodule as its
/// `Subproject commit` lines, a type change as a deletion and an addition.
pub fn diff(root: &Path, path: &[u8], area: GitArea) -> Result<GitDiff, RpcError> {
    let Some(repo) = open(root)? else {
        return Ok(GitDiff::Unsupported {
            reason: "no-repository".into(),
        });
    };
    let index = load_index(&repo)?;
    let ws = workspace(root)?;
    let attributes = Attributes::for_path(&repo, &ws, path)?;
    let blob = |id: ObjectId| -> Result<Vec<u8>, RpcError> { Ok(repo.find_blob(id).map_err(broken)?.data.clone()) };
    let entry = index.stage0(path);
    if area == GitArea::Worktree
        && let Some(e) = entry
    {
        // A tracked file under `.berth/` is compared by `git.status` but never shown to
        // clients (it may hold what only the workspace's owner should read).
        if Workspace::is_private(Path::new(OsStr::from_bytes(path))) {
            return Ok(GitDiff::Unsupported {
                reason: "private".into(),
            });
        }
        // Git does not look at an assume-unchanged or skip-worktree file.
        if index.unlooked(e) {
            return Ok(GitDiff::Unchanged);
        }
    }
    let file_mode = super::file_mode(&repo);
    // A conflicted path is what git says of it, not a deletion of the whole file.
    if index.unmerged.contains(path) && area != GitArea::Untracked {
        return Ok(GitDiff::Text {
            patch: format!("* Unmerged path {}\n", quoted("", path)),
            patch_base64: None,
            truncated: None,
        });
    }
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
    // The file as git would store it.
    let read_file = || -> Result<Side, RpcError> {
        let keep = indexed.map(|(_, kind)| kind).filter(|_| !file_mode);
        let found = worktree_blob(&ws, path, keep, false).map_err(broken)?;
        let mut in_index = || indexed.filter(|_| !intent).and_then(|(id, _)| blob(id).ok());
        clean_side(&attributes, path, found, &mut in_index)
    };
    // One side from an object: a blob's content, or a submodule's commit line.
    let object = |id: ObjectId, kind: EntryKind| -> Result<Result<Side, GitDiff>, RpcError> {
        if kind == EntryKind::Commit {
            return Ok(Ok(Some(submodule_side(id, false))));
        }
        if blob_size(id)? > GIT_DIFF_FILE_MAX {
            return Ok(Err(GitDiff::Unsupported {
                reason: "too-large".into(),
            }));
        }
        Ok(Ok(Some((blob(id)?, kind))))
    };
    let (old, new): (Side, Side) = match area {
        GitArea::Staged => {
            let (_, tree) = head_tree(&repo)?;
            let old = match tree.get(path) {
                Some(item) => match object(item.id, item.kind)? {
                    Ok(side) => side,
                    Err(refused) => return Ok(refused),
                },
                None => None,
            };
            let new = match indexed {
                _ if intent => None,
                Some((id, kind)) => match object(id, kind)? {
                    Ok(side) => side,
                    Err(refused) => return Ok(refused),
                },
                None => None,
            };
            // A submodule whose `ignore` is `all` is left out of a diff of the index, added,
            // removed or moved on, as git's `diff --cached` leaves it out.
            let gitlink = |s: &Side| s.as_ref().is_some_and(|(_, k)| *k == EntryKind::Commit);
            let submodule_only = match (&old, &new) {
                (Some(_), Some(_)) => gitlink(&old) && gitlink(&new),
                _ => gitlink(&old) || gitlink(&new),
            };
            if submodule_only
                && super::status::SubmoduleIgnores::load(&repo, &ws).of(path) == super::status::SubmoduleIgnore::All
            {
                return Ok(GitDiff::Unchanged);
            }
            (old, new)
        }
        GitArea::Worktree if intent => {
            if file_size() > GIT_DIFF_FILE_MAX {
                return too_large();
            }
            match read_file()? {
                // Gone: git prints the deletion of the empty blob an intent to add records.
                None => (indexed.map(|(_, kind)| (Vec::new(), kind)), None),
                new => (None, new),
            }
        }
        GitArea::Worktree => {
            let Some((id, kind)) = indexed else {
                return Ok(GitDiff::Unchanged);
            };
            if kind == EntryKind::Commit {
                let old = Some(submodule_side(id, false));
                let ignore = super::status::SubmoduleIgnores::load(&repo, &ws).of(path);
                let new = match submodule(&ws, &repo, path, id, ignore)? {
                    (None, _) => return Ok(GitDiff::Unchanged),
                    (Some(GitChange::Deleted), _) => None,
                    (Some(GitChange::TypeChanged), _) if file_size() > GIT_DIFF_FILE_MAX => return too_large(),
                    (Some(GitChange::TypeChanged), _) => read_file()?,
                    (Some(_), state) => {
                        let head = super::status::submodule_status(&ws, &repo, Path::new(OsStr::from_bytes(path)))?
                            .and_then(|(head, _)| head)
                            .unwrap_or_else(|| ObjectId::null(repo.object_hash()));
                        // Untracked files alone are not `-dirty`, as git prints it.
                        if head == id && !state.modified {
                            return Ok(GitDiff::Unchanged);
                        }
                        Some(submodule_side(head, state.modified))
                    }
                };
                (old, new)
            } else {
                if blob_size(id)? > GIT_DIFF_FILE_MAX || file_size() > GIT_DIFF_FILE_MAX {
                    return too_large();
                }
                (Some((blob(id)?, kind)), read_file()?)
            }
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
    let content = |s: &Side| s.as_ref().is_some_and(|(d, k)| *k != EntryKind::Commit && is_binary(d));
    if content(&old) || content(&new) || attributes.at(path).no_diff {
        return Ok(GitDiff::Binary);
    }
    let mut patch = Vec::new();
    file_patch(&mut patch, repo.object_hash(), path, &old, &new, false);
    Ok(bounded(patch))
}

/// A text diff within [`GIT_DIFF_MAX`] (half of it when it is not UTF-8, as it then travels
/// twice): a longer one cut at its last line end within the bound, and marked.
pub(super) fn bounded(mut patch: Vec<u8>) -> GitDiff {
    let utf8 = std::str::from_utf8(&patch).is_ok();
    let max = if utf8 { GIT_DIFF_MAX } else { GIT_DIFF_MAX / 2 };
    let bytes = patch.len() as u64;
    let truncated = (patch.len() > max).then(|| {
        let mut end = patch[..max].iter().rposition(|b| *b == b'\n').map_or(max, |i| i + 1);
        // A cut without a line end stays on a character boundary.
        while utf8 && end > 0 && (patch[end] & 0xc0) == 0x80 {
            end -= 1;
        }
        patch.truncate(end);
        berth_protocol::Truncation {
            truncated: true,
            bytes,
            returned: patch.len() as u64,
        }
    });
    match String::from_utf8(patch) {
        Ok(patch) => GitDiff::Text {
            patch,
            patch_base64: None,
            truncated,
        },
        Err(e) => {
            let bytes = e.into_bytes();
            GitDiff::Text {
                patch: String::from_utf8_lossy(&bytes).into_owned(),
                patch_base64: Some(base64::engine::general_purpose::STANDARD.encode(&bytes)),
                truncated,
            }
        }
    }
}
