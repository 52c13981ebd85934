//! `patch.snapshot`: the whole workspace's change against HEAD as one patch `git apply` takes.

use std::{collections::BTreeSet, ffi::OsStr, os::unix::ffi::OsStrExt, path::Path};

use berth_protocol::{ErrorCode, RpcError, worker::PatchCaptured};
use gix::objs::tree::EntryKind;

use super::{
    Side, broken, clean_side, head_tree, index::load_index, open, status::observe, workspace, worktree_blob,
    writer::file_patch,
};
use crate::{observe::failure, workspace::Workspace};

/// `patch.snapshot`: every change of the workspace against HEAD — the paths `status`
/// lists in any area — as one patch in the form `git diff --binary --full-index HEAD`
/// prints (worktree files as git would store them, line endings converted by their
/// attributes), which `git apply` takes on a clean checkout of its base: binary files and
/// text that is not UTF-8 as `GIT binary patch` literals, modes, symlinks and type changes
/// included. Submodules are left out (their commit is not content `git apply` can set).
/// More than `max` bytes is `payload-too-large {limit: "patch"}`.
pub fn patch(root: &Path, max: usize) -> Result<(String, PatchCaptured), RpcError> {
    let Some(repo) = open(root)? else {
        return Err(failure(ErrorCode::Unsupported, "feature", "no-repository"));
    };
    let Some((st, attributes)) = observe(root)? else {
        return Err(failure(ErrorCode::Unsupported, "feature", "no-repository"));
    };
    let index = load_index(&repo)?;
    let (head, tree) = head_tree(&repo)?;
    let mut paths = BTreeSet::new();
    for e in st.staged.iter().chain(&st.worktree).chain(&st.untracked) {
        let path = crate::observe::decode_raw(&e.path).map_err(|_| RpcError::new(ErrorCode::Internal))?;
        // A nested repository (`dir/`) is not content of this one.
        if !path.ends_with(b"/") && e.submodule.is_none() {
            paths.insert(path);
        }
    }
    let ws = workspace(root)?;
    let hash = repo.object_hash();
    let file_mode = super::file_mode(&repo);
    let blob = |id| -> Result<Vec<u8>, RpcError> { Ok(repo.find_blob(id).map_err(broken)?.data.clone()) };
    let too_large = || {
        let mut fields = serde_json::Map::new();
        fields.insert("limit".into(), "patch".into());
        fields.insert("max".into(), max.into());
        RpcError::with_fields(ErrorCode::PayloadTooLarge, fields)
    };
    let mut out = String::new();
    let mut files = 0u32;
    for path in paths {
        // Neither side is read when it alone would pass the limit.
        let old_too_large = match tree.get(&path) {
            Some(item) if item.kind != EntryKind::Commit => {
                repo.find_header(item.id).map_err(broken)?.size() > max as u64
            }
            _ => false,
        };
        let new_too_large = ws
            .lstat(Path::new(OsStr::from_bytes(&path)))
            .is_ok_and(|m| m.is_file() && m.len() > max as u64);
        if old_too_large || new_too_large {
            return Err(too_large());
        }
        let entry = index.stage0(&path);
        // A tracked file under `.berth/` is not content a snapshot carries to clients.
        if entry.is_some() && Workspace::is_private(Path::new(OsStr::from_bytes(&path))) {
            continue;
        }
        let old: Side = match tree.get(&path) {
            Some(item) if item.kind == EntryKind::Commit => continue,
            Some(item) => Some((blob(item.id)?, item.kind)),
            None => None,
        };
        let indexed = entry.filter(|e| !super::index::Index::intent_to_add(e));
        let new = match indexed {
            // Git does not look at an assume-unchanged or skip-worktree file: its index
            // entry is what `git diff HEAD` compares.
            Some(e) if index.unlooked(e) => {
                let kind = super::index::index_kind(e.mode).unwrap_or(EntryKind::Blob);
                Some((blob(e.id)?, kind))
            }
            _ => {
                let keep = indexed
                    .and_then(|e| super::index::index_kind(e.mode))
                    .filter(|_| !file_mode);
                let new = worktree_blob(&ws, &path, keep, false).map_err(broken)?;
                clean_side(&attributes, &path, new, &mut || indexed.and_then(|e| blob(e.id).ok()))?
            }
        };
        if old == new {
            continue;
        }
        files += 1;
        let mut bytes = Vec::new();
        file_patch(&mut bytes, hash, &path, &old, &new, false);
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(_) => {
                // Text that is not UTF-8 travels as a binary patch (the snapshot is text).
                let mut bytes = Vec::new();
                file_patch(&mut bytes, hash, &path, &old, &new, true);
                String::from_utf8(bytes).map_err(|_| RpcError::new(ErrorCode::Internal))?
            }
        };
        out.push_str(&text);
        if out.len() > max {
            return Err(too_large());
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
