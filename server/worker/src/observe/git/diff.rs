//! `git.diff`: one path in one area, bounded.

use std::{ffi::OsStr, os::unix::ffi::OsStrExt, path::Path};

use berth_protocol::{GIT_DIFF_FILE_MAX, GIT_DIFF_MAX, GitArea, GitDiff, RpcError};
use gix::{ObjectId, objs::tree::EntryKind};

use super::{
    BINARY_PROBE, Side,
    attributes::check_filters,
    broken, head_tree,
    index::{Index, index_kind, load_index},
    open,
    patch::{file_patch, quoted},
    unsupported, workspace, worktree_blob,
};

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

pub(super) fn submodule() -> GitDiff {
    GitDiff::Unsupported {
        reason: "submodule".into(),
    }
}
