//! `.gitattributes`: the filter drivers this module refuses.

use std::{ffi::OsStr, os::unix::ffi::OsStrExt, path::Path};

use berth_protocol::RpcError;

use super::{contents, unsupported};
use crate::workspace::Workspace;

/// Refuse repositories whose attributes select a filter driver with a configured command:
/// comparing without running it would be wrong, and running it is never allowed.
/// `attribute_files` are the worktree's (relative paths), read as files through the
/// workspace, never through a symlink (as git reads them); `info/attributes` is the
/// repository's own.
pub(super) fn check_filters(
    repo: &gix::Repository,
    ws: &Workspace,
    attribute_files: &[Vec<u8>],
) -> Result<(), RpcError> {
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
