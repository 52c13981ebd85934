//! `git.status`, `git.diff` and `patch.snapshot`, computed here from what `gix` reads
//! (refs, objects, the index) plus `lstat` and content hashes of the files, so that no
//! configured command ever runs: no filter driver, hook, fsmonitor, textconv or external
//! diff. Repository features this cannot honour without running something (external
//! filters) or does not handle (a sparse index) fail explicitly with
//! `unsupported {feature}`.
//!
//! The workspace must be the repository root: a workspace without `.git` is not a
//! repository (`null`), whatever its parent directories are.
//!
//! One module per concern: the index and its stat data ([`index`]), attributes and the
//! end-of-line conversion they select ([`attributes`]), the three areas of `git.status`
//! with submodules ([`status`], [`untracked`]), `git.diff` ([`diff`]), the patch format
//! both share ([`writer`]) and `patch.snapshot` ([`patch`]). `corpus` tests all of it
//! against the git CLI.

mod attributes;
mod diff;
mod index;
mod lfs;
mod patch;
mod status;
mod untracked;
mod writer;

#[cfg(test)]
mod corpus;
#[cfg(test)]
mod tests;

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    os::unix::ffi::{OsStrExt, OsStringExt},
    path::Path,
};

use berth_protocol::{ErrorCode, GitHead, RpcError};
use gix::{ObjectId, bstr::ByteSlice, objs::tree::EntryKind};

pub use self::{diff::diff, patch::patch, status::status};
use super::failure;
use crate::workspace::{OpenError, Opened, Workspace};

/// Git's rule: a NUL in the first 8000 bytes makes content binary.
pub(super) const BINARY_PROBE: usize = 8000;

/// `unsupported {feature}`.
pub(super) fn unsupported(feature: &str) -> RpcError {
    failure(ErrorCode::Unsupported, "feature", feature)
}

pub(super) fn broken(e: impl std::fmt::Display) -> RpcError {
    tracing::warn!(error = %e, "reading the repository failed");
    failure(ErrorCode::Unavailable, "reason", "repository-unreadable")
}

/// The repository at exactly `root`, or None when `root` is not a repository root.
pub(super) fn open(root: &Path) -> Result<Option<gix::Repository>, RpcError> {
    if std::fs::symlink_metadata(root.join(".git")).is_err() {
        return Ok(None);
    }
    let repo = gix::open(root).map_err(broken)?;
    if repo.workdir().is_none() {
        return Err(unsupported("bare-repository"));
    }
    // gix reads refs from files only: a reftable repository is refused as what it is, not
    // as one that cannot be read.
    let storage = repo.config_snapshot().string("extensions.refStorage");
    if storage.is_some_and(|s| !s.eq_ignore_ascii_case(b"files")) {
        return Err(unsupported("reftable"));
    }
    Ok(Some(repo))
}

/// What a tree or the index says about one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Item {
    pub(super) id: ObjectId,
    pub(super) kind: EntryKind,
}

/// A tree flattened: blobs, symlinks and submodules by path.
pub(super) type Flat = BTreeMap<Vec<u8>, Item>;
/// One side of a diff: the content git would store, and its kind (None: absent).
pub(super) type Side = Option<(Vec<u8>, EntryKind)>;

/// HEAD's tree, flattened (empty when unborn).
pub(super) fn head_tree(repo: &gix::Repository) -> Result<(Option<GitHead>, Flat), RpcError> {
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

/// `core.fileMode`: whether a file's executable bit counts (unless set false, as on
/// file systems that report every file executable).
pub(super) fn file_mode(repo: &gix::Repository) -> bool {
    repo.config_snapshot().boolean("core.fileMode").unwrap_or(true)
}

/// The kind git records for a regular file of mode `mode`: executable when its owner may
/// execute it (git looks at that bit only); `keep` (the index's kind, where
/// `core.fileMode` is false) stands instead.
pub(super) fn file_kind(mode: u32, keep: Option<EntryKind>) -> EntryKind {
    match keep {
        Some(kind @ (EntryKind::Blob | EntryKind::BlobExecutable)) => kind,
        _ if mode & 0o100 != 0 => EntryKind::BlobExecutable,
        _ => EntryKind::Blob,
    }
}

/// The blob git would store for the file at `rel` (no filters), with its kind; None when
/// there is nothing there that git tracks (absent, a directory, or a path that only a
/// symlink out of the workspace leads to, which git too sees as absent). Read through the
/// workspace's confinement, the last component never followed. `keep`: the kind a regular
/// file keeps whatever its executable bit ([`file_kind`]). `tracked`: a tracked file under
/// `.berth/` is read too, to be compared (never a `.git`'s).
pub(super) fn worktree_blob(
    ws: &Workspace,
    rel: &[u8],
    keep: Option<EntryKind>,
    tracked: bool,
) -> std::io::Result<Side> {
    use cap_std::fs::MetadataExt;
    let rel = Path::new(OsStr::from_bytes(rel));
    let unreadable = |e: OpenError| match e {
        OpenError::Io(e) => Err(e),
        OpenError::Raced => Err(std::io::Error::other("the file was replaced while it was read")),
        OpenError::Absent | OpenError::Outside | OpenError::Private | OpenError::Symlink | OpenError::WrongKind => {
            Ok(None)
        }
    };
    if through_symlink(ws, rel) {
        return Ok(None);
    }
    let opened = if tracked {
        ws.open_tracked(rel)
    } else {
        ws.open_regular(rel)
    };
    match opened {
        Ok(file) => {
            let kind = file_kind(file.meta.mode(), keep);
            Ok(Some((contents(file)?, kind)))
        }
        Err(OpenError::Symlink) => match ws.read_link(rel) {
            Ok(target) => Ok(Some((target.into_os_string().into_vec(), EntryKind::Link))),
            Err(e) => unreadable(e),
        },
        Err(e) => unreadable(e),
    }
}

/// Whether a directory on the way to `rel` is a symlink: git does not follow one, so a
/// directory replaced by a link is gone, whatever the link leads to.
fn through_symlink(ws: &Workspace, rel: &Path) -> bool {
    rel.ancestors()
        .skip(1)
        .filter(|a| !a.as_os_str().is_empty())
        .any(|a| ws.lstat(a).is_ok_and(|m| m.file_type().is_symlink()))
}

/// Files larger than this are not held whole to be compared with their index entry: they
/// are hashed as they are read ([`large_file`]). (1 MiB in unit tests, which take that path
/// without writing and hashing 64 MiB in a debug build.)
pub(super) const HELD_MAX: u64 = if cfg!(test) { 1 << 20 } else { 64 << 20 };

/// The file at `rel` when it is a regular file larger than [`HELD_MAX`] (None otherwise:
/// the caller reads it whole): its kind and whether what git would store for it is the blob
/// `id`. It is hashed as it is read, a MiB at a time, with git's text statistics of it: a
/// file git converts on its way in (CRLFs under `text`, or under `text=auto` when it is
/// text and the index's blob has none) is read a second time, converted as it is hashed;
/// an LFS file is hashed as its pointer.
fn large_file(
    ws: &Workspace,
    repo: &gix::Repository,
    attributes: &attributes::Attributes,
    rel: &[u8],
    id: ObjectId,
    keep: Option<EntryKind>,
) -> Result<Option<(EntryKind, bool)>, RpcError> {
    use cap_std::fs::MetadataExt;
    use sha2::Digest;
    use std::io::Read;
    let path = Path::new(OsStr::from_bytes(rel));
    if through_symlink(ws, path) {
        return Ok(None);
    }
    match ws.lstat(path) {
        Ok(m) if m.is_file() && m.len() > HELD_MAX => {}
        _ => return Ok(None),
    }
    let Ok(mut file) = ws.open_tracked(path) else {
        return Ok(None);
    };
    let len = file.meta.len();
    if len <= HELD_MAX {
        return Ok(None);
    }
    let kind = file_kind(file.meta.mode(), keep);
    let mut hasher = gix::hash::hasher(repo.object_hash());
    hasher.update(format!("blob {len}\0").as_bytes());
    let mut lfs = attributes.lfs(rel).then(sha2::Sha256::new);
    let mut stats = gix_filter::eol::Stats::default();
    let mut buf = vec![0u8; 1 << 20];
    // A last CR (or ^Z) is counted with what follows it, which decides what it is.
    let (mut carried, mut read) = (0usize, 0u64);
    loop {
        let n = file.handle.read(&mut buf[carried..]).map_err(broken)?;
        if n == 0 {
            break;
        }
        read += n as u64;
        if read > len {
            break;
        }
        let end = carried + n;
        hasher.update(&buf[carried..end]);
        if let Some(sha) = &mut lfs {
            sha.update(&buf[carried..end]);
        }
        let carry = matches!(buf[end - 1], b'\r' | 0x1a);
        add_stats(&mut stats, &buf[..end - usize::from(carry)]);
        carried = usize::from(carry);
        if carry {
            buf[0] = buf[end - 1];
        }
    }
    add_stats(&mut stats, &buf[..carried]);
    if read != len {
        return Err(broken("the file changed while it was read"));
    }
    if let Some(sha) = lfs {
        let pointer = lfs::pointer(&format!("{:x}", sha.finalize()), len);
        return Ok(Some((kind, blob_id(repo, &pointer)? == id)));
    }
    let index_has_crlf = || {
        repo.find_blob(id).is_ok_and(|b| {
            let s = gix_filter::eol::Stats::from_bytes(&b.data);
            !s.is_binary() && s.crlf > 0
        })
    };
    if attributes.converts(rel, &stats, index_has_crlf) {
        let converted = len - stats.crlf as u64;
        return Ok(Some((kind, hash_crlf_as_lf(ws, repo, path, len, converted)? == id)));
    }
    Ok(Some((kind, hasher.try_finalize().map_err(broken)? == id)))
}

/// `bytes`' text statistics added to `stats`.
fn add_stats(stats: &mut gix_filter::eol::Stats, bytes: &[u8]) {
    let s = gix_filter::eol::Stats::from_bytes(bytes);
    stats.null += s.null;
    stats.lone_cr += s.lone_cr;
    stats.lone_lf += s.lone_lf;
    stats.crlf += s.crlf;
    stats.printable += s.printable;
    stats.non_printable += s.non_printable;
}

/// The blob id of the file at `path` (`len` bytes) with each CRLF stored as LF (`converted`
/// bytes then), read again and hashed as it is converted.
fn hash_crlf_as_lf(
    ws: &Workspace,
    repo: &gix::Repository,
    path: &Path,
    len: u64,
    converted: u64,
) -> Result<ObjectId, RpcError> {
    use std::io::Read;
    let mut file = ws
        .open_tracked(path)
        .map_err(|_| broken("the file changed while it was read"))?;
    if file.meta.len() != len {
        return Err(broken("the file changed while it was read"));
    }
    let mut hasher = gix::hash::hasher(repo.object_hash());
    hasher.update(format!("blob {converted}\0").as_bytes());
    let mut buf = vec![0u8; 1 << 20];
    let mut out = Vec::with_capacity(buf.len() + 1);
    let (mut cr, mut read, mut written) = (false, 0u64, 0u64);
    loop {
        let n = file.handle.read(&mut buf).map_err(broken)?;
        if n == 0 {
            break;
        }
        read += n as u64;
        for &b in &buf[..n] {
            if std::mem::take(&mut cr) && b != b'\n' {
                out.push(b'\r');
            }
            if b == b'\r' {
                cr = true;
            } else {
                out.push(b);
            }
        }
        written += out.len() as u64;
        hasher.update(&out);
        out.clear();
    }
    if cr {
        hasher.update(b"\r");
        written += 1;
    }
    if read != len || written != converted {
        return Err(broken("the file changed while it was read"));
    }
    hasher.try_finalize().map_err(broken)
}

/// All of an opened file.
pub(super) fn contents(mut file: Opened<std::fs::File>) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut data = Vec::with_capacity(usize::try_from(file.meta.len()).unwrap_or(0));
    file.handle.read_to_end(&mut data)?;
    Ok(data)
}

/// The workspace at `root`, for reading worktree files through its confinement.
pub(super) fn workspace(root: &Path) -> Result<Workspace, RpcError> {
    Workspace::open(root).map_err(broken)
}

pub(super) fn blob_id(repo: &gix::Repository, data: &[u8]) -> Result<ObjectId, RpcError> {
    gix::objs::compute_hash(repo.object_hash(), gix::objs::Kind::Blob, data).map_err(broken)
}

/// Whether entries of kinds `a` and `b` are of one type (file, symlink or submodule): a
/// change between types is git's type change.
pub(super) fn same_type(a: EntryKind, b: EntryKind) -> bool {
    let family = |k| match k {
        EntryKind::Link => 1,
        EntryKind::Commit => 2,
        _ => 0,
    };
    family(a) == family(b)
}

/// A worktree side as git would store it: a regular file's content with its line endings
/// converted as its attributes say (`indexed` gives the index's blob at `path`, which
/// `text=auto` consults); a symlink as it is.
fn clean_side(
    attributes: &attributes::Attributes,
    path: &[u8],
    side: Side,
    indexed: &mut dyn FnMut() -> Option<Vec<u8>>,
) -> Result<Side, RpcError> {
    match side {
        Some((data, kind)) if kind != EntryKind::Link => Ok(Some((attributes.clean(path, data, indexed)?, kind))),
        side => Ok(side),
    }
}
