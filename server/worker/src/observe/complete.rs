//! `workspace.files {prefix}`: path completion candidates. Walks only the directories on
//! the way to the prefix and below it, respects gitignore, never follows symlinks, and
//! synthesizes the ancestor directories of every match.

use std::{collections::BTreeMap, path::Path};

use berth_protocol::{ErrorCode, WORKSPACE_FILES_MAX, WorkspaceFile, WorkspaceFilesResult};

use super::failure;

/// Candidates under `root` whose relative `/`-separated path starts with `prefix`.
pub(crate) fn files(root: &Path, prefix: &str) -> Result<WorkspaceFilesResult, berth_protocol::RpcError> {
    let invalid = || failure(ErrorCode::BadParams, "field", "prefix");
    if prefix.starts_with('/') || prefix.contains('\0') || prefix.split('/').any(|c| c == "..") {
        return Err(invalid());
    }
    let root = root
        .canonicalize()
        .map_err(|_| failure(ErrorCode::Unavailable, "reason", "workspace"))?;
    // The directory part of the prefix: nothing outside it (or its ancestors) is entered.
    let base = prefix.rsplit_once('/').map(|(d, _)| d.to_string()).unwrap_or_default();
    let walk_root = root.clone();
    let walk = ignore::WalkBuilder::new(&root)
        .hidden(false)
        .ignore(false)
        .parents(false)
        .git_ignore(true)
        .git_exclude(true)
        .git_global(true)
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(move |e| {
            if e.file_name() == ".git" || e.file_name() == ".berth" {
                return false;
            }
            let Some(rel) = e.path().strip_prefix(&walk_root).ok().and_then(|r| r.to_str()) else {
                return false;
            };
            // On the way to the prefix's directory, or inside it.
            base.is_empty()
                || rel.is_empty()
                || rel == base
                || base.starts_with(&format!("{rel}/"))
                || rel.starts_with(&format!("{base}/"))
        })
        .build();
    let mut out: BTreeMap<String, bool> = BTreeMap::new();
    let mut truncated = false;
    for entry in walk {
        let Ok(entry) = entry else { continue };
        let Some(rel) = entry.path().strip_prefix(&root).ok().and_then(|r| r.to_str()) else {
            continue;
        };
        if rel.is_empty() || !rel.starts_with(prefix) {
            continue;
        }
        if out.len() >= WORKSPACE_FILES_MAX {
            truncated = true;
            break;
        }
        let dir = entry.file_type().is_some_and(|t| t.is_dir());
        out.insert(rel.to_string(), dir);
        // Ancestors that match the prefix too.
        let mut at = rel;
        while let Some((parent, _)) = at.rsplit_once('/') {
            if parent.starts_with(prefix) {
                out.entry(parent.to_string()).or_insert(true);
            }
            at = parent;
        }
    }
    Ok(WorkspaceFilesResult {
        entries: out.into_iter().map(|(path, dir)| WorkspaceFile { path, dir }).collect(),
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_respect_gitignore_and_the_prefix() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        std::fs::create_dir_all(root.join("target")).unwrap();
        std::fs::write(root.join(".gitignore"), "target/\n").unwrap();
        std::fs::write(root.join("src/deep/mod.rs"), "").unwrap();
        std::fs::write(root.join("src/lib.rs"), "").unwrap();
        std::fs::write(root.join("target/out"), "").unwrap();
        std::fs::write(root.join("readme"), "").unwrap();
        let all = files(root, "").unwrap();
        let paths: Vec<(&str, bool)> = all.entries.iter().map(|e| (e.path.as_str(), e.dir)).collect();
        assert_eq!(
            paths,
            [
                (".gitignore", false),
                ("readme", false),
                ("src", true),
                ("src/deep", true),
                ("src/deep/mod.rs", false),
                ("src/lib.rs", false)
            ]
        );
        let some = files(root, "src/d").unwrap();
        let paths: Vec<&str> = some.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["src/deep", "src/deep/mod.rs"]);
        assert!(files(root, "../").is_err());
    }
}
