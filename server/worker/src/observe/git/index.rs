//! The index: its entries, the states this module refuses, and the stat data that vouches
//! for a file's content without reading it.

use std::{
    collections::BTreeSet,
    os::{fd::OwnedFd, unix::ffi::OsStrExt},
    path::Path,
};

use berth_protocol::RpcError;
use gix::{bstr::ByteSlice, index::entry::Mode, objs::tree::EntryKind};
use rustix::fs::{AtFlags, FileType, OFlags};

use super::{broken, unsupported};

pub(super) fn index_kind(mode: Mode) -> Option<EntryKind> {
    match mode {
        Mode::FILE => Some(EntryKind::Blob),
        Mode::FILE_EXECUTABLE => Some(EntryKind::BlobExecutable),
        Mode::SYMLINK => Some(EntryKind::Link),
        Mode::COMMIT => Some(EntryKind::Commit),
        _ => None,
    }
}

/// The index, checked for features this module does not handle.
pub(super) struct Index {
    /// Owned, not gix's shared snapshot, so that threads can share it.
    pub(super) file: gix::index::File,
    /// Paths with conflict stages.
    pub(super) unmerged: BTreeSet<Vec<u8>>,
    /// The worktree, and whether a sparse checkout is on that git expects no files outside
    /// of (`core.sparseCheckout` without `sparse.expectFilesOutsideOfPatterns`): a
    /// skip-worktree file present there anyway is then looked at, as git clears its bit.
    root: std::path::PathBuf,
    sparse_checkout: bool,
}

impl Index {
    /// The stage-0 entry at `path` (the index is sorted by path, then stage).
    pub(super) fn stage0(&self, path: &[u8]) -> Option<&gix::index::Entry> {
        let entries = self.file.entries();
        let at = entries.partition_point(|e| e.path(&self.file).as_bytes() < path);
        entries
            .get(at)
            .filter(|e| e.path(&self.file).as_bytes() == path && e.stage() == gix::index::entry::Stage::Unconflicted)
    }

    /// Whether `e` was added with `git add -N`: in the index by name, with no content yet.
    pub(super) fn intent_to_add(e: &gix::index::Entry) -> bool {
        e.flags.contains(gix::index::entry::Flags::INTENT_TO_ADD)
    }

    /// Stage-0 entries with their paths, in path order.
    pub(super) fn stage0_entries(&self) -> impl Iterator<Item = (&[u8], &gix::index::Entry)> {
        self.file
            .entries()
            .iter()
            .filter(|e| e.stage() == gix::index::entry::Stage::Unconflicted)
            .map(|e| (e.path(&self.file).as_bytes(), e))
    }

    /// Whether git takes the entry's file as unchanged without looking: assume-unchanged
    /// (`update-index --assume-unchanged`), or outside a sparse checkout (skip-worktree)
    /// unless the checkout is sparse and the file is there all the same.
    pub(super) fn unlooked(&self, e: &gix::index::Entry) -> bool {
        use gix::index::entry::Flags;
        if e.flags.contains(Flags::ASSUME_VALID) {
            return true;
        }
        if !e.flags.contains(Flags::SKIP_WORKTREE) {
            return false;
        }
        let path = std::ffi::OsStr::from_bytes(e.path(&self.file).as_bytes());
        !(self.sparse_checkout && std::fs::symlink_metadata(self.root.join(path)).is_ok())
    }
}

pub(super) fn load_index(repo: &gix::Repository) -> Result<Index, RpcError> {
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
        if e.stage() != gix::index::entry::Stage::Unconflicted {
            unmerged.insert(e.path(&file).to_vec());
        }
    }
    let config = repo.config_snapshot();
    let sparse_checkout = config.boolean("core.sparseCheckout") == Some(true)
        && config.boolean("sparse.expectFilesOutsideOfPatterns") != Some(true);
    Ok(Index {
        file,
        unmerged,
        root: repo.workdir().map(Path::to_path_buf).unwrap_or_default(),
        sparse_checkout,
    })
}
/// The index's stat data for what `lstat` says now (truncated as git stores it).
pub(super) fn index_stat(st: &rustix::fs::Stat) -> gix::index::entry::Stat {
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

/// The kind of entry git would record for a file of mode `st_mode` (a regular file as
/// [`super::file_kind`] says, `keep` standing where `core.fileMode` is false).
pub(super) fn stat_kind(st_mode: u32, keep: Option<EntryKind>) -> EntryKind {
    match FileType::from_raw_mode(st_mode) {
        FileType::Symlink => EntryKind::Link,
        FileType::Directory => EntryKind::Commit,
        _ => super::file_kind(st_mode, keep),
    }
}

/// The directory `parent` beneath `root`, reached without any symlink (None when a
/// symlink or nothing is on the way). Kernels without `openat2` resolve it as `openat` does.
pub(super) fn open_parent(root: &OwnedFd, parent: &[u8]) -> Option<OwnedFd> {
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
pub(super) fn stat_suspects(root: &OwnedFd, index: &Index, entries: &[(&[u8], usize)], file_mode: bool) -> Vec<usize> {
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
                && index_kind(e.mode) == Some(stat_kind(st.st_mode, index_kind(e.mode).filter(|_| !file_mode)))
        });
        if !clean {
            out.push(i);
        }
    }
    out
}
