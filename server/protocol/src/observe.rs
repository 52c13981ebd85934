//! Observing a workspace (answered by the worker that holds it): `git.*`, `files.*` and the
//! workspace methods that read or change the workspace itself.
//!
//! Paths inside a workspace travel as [`WorkspacePath`]: the exact relative pathname bytes,
//! base64-encoded, so names that are not UTF-8 survive the round trip.

use serde::{Deserialize, Serialize};

/// A relative path inside a workspace: its exact bytes, base64 (standard, padded).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspacePath {
    pub bytes_base64: String,
}

/// `git.status` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GitStatusParams {
    pub session_id: String,
}

/// The repository's state: `null` as a whole when the workspace is not a repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GitStatus {
    /// `null` for an unborn repository (no commit yet).
    #[serde(default)]
    pub head: Option<GitHead>,
    /// HEAD compared to the index.
    pub staged: Vec<GitEntry>,
    /// The index compared to the files.
    pub worktree: Vec<GitEntry>,
    /// Files neither tracked nor ignored.
    pub untracked: Vec<GitEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GitHead {
    /// The commit id (hex).
    pub oid: String,
    /// The branch HEAD points at (`refs/heads/…`); absent when detached.
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GitEntry {
    pub path: WorkspacePath,
    pub change: GitChange,
    /// Present when the path is a submodule: its state in the worktree, as git's
    /// `git status --porcelain=v2` sub-state `S<c><m><u>` reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submodule: Option<GitSubmodule>,
}

/// A submodule's state in the worktree (git's porcelain v2 `S<c><m><u>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GitSubmodule {
    /// Its checked-out commit is not the one the index records (`C`).
    pub commit_changed: bool,
    /// It has changes to its tracked files, staged or not (`M`).
    pub modified: bool,
    /// It has untracked files (`U`).
    pub untracked: bool,
}

/// How a path changed. Renames are a deletion plus an addition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum GitChange {
    Added,
    Modified,
    Deleted,
    /// File ↔ symlink ↔ submodule.
    TypeChanged,
    /// A merge conflict (the index holds several stages).
    Unmerged,
}

/// Which comparison `git.diff` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum GitArea {
    /// HEAD → index.
    Staged,
    /// Index → file.
    Worktree,
    /// Empty → file.
    Untracked,
}

/// `git.diff` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct GitDiffParams {
    pub session_id: String,
    pub path: WorkspacePath,
    pub area: GitArea,
}

/// One path's difference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum GitDiff {
    /// A diff as `git diff --full-index` prints it (`diff --git`, mode and `index` lines,
    /// `--- a/…`, `+++ b/…`, hunks with 3 lines of context). A diff longer than
    /// [`GIT_DIFF_MAX`] is cut at a line end and says so in `truncated` (`returned` of its
    /// `bytes` are in `patch`).
    Text {
        /// The diff; when the file's text is not UTF-8, with U+FFFD for the bytes that are
        /// not (the exact diff is then in `patchBase64`).
        patch: String,
        /// The exact bytes of the diff, base64, present only when they are not UTF-8 (a
        /// text file in another encoding). Such a diff is cut at half of [`GIT_DIFF_MAX`].
        #[serde(rename = "patchBase64", default, skip_serializing_if = "Option::is_none")]
        patch_base64: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        truncated: Option<crate::Truncation>,
    },
    Binary,
    Unchanged,
    /// This path cannot be compared (`too-large`: a side larger than
    /// [`GIT_DIFF_FILE_MAX`]).
    Unsupported {
        reason: String,
    },
}

/// The largest file `git.diff` compares (either side), in bytes.
pub const GIT_DIFF_FILE_MAX: u64 = 8 << 20;
/// The longest diff `git.diff` answers, in bytes (a longer one is cut, marked `truncated`).
pub const GIT_DIFF_MAX: usize = 1 << 20;

/// `files.list` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FilesListParams {
    pub session_id: String,
    /// The directory; absent or null for the workspace root.
    #[serde(default)]
    pub path: Option<WorkspacePath>,
    /// The `nextAfter` of the previous page.
    #[serde(default)]
    pub after: Option<String>,
}

/// One page of a directory's direct children, sorted by name bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FilesListResult {
    /// Identifies the directory itself (device and inode); compare with `files.watch`'s `ready`.
    pub directory_identity: String,
    pub entries: Vec<FileEntry>,
    /// Pass as `after` for the next page; `null` on the last page.
    #[serde(default)]
    pub next_after: Option<String>,
    /// The cursor as a worker before `nextAfter` wrote it (SPEC's name); read, never written
    /// (a peer built before this field reads `next` as `nextAfter`, and both at once would
    /// be a duplicate field to it).
    #[serde(default, skip_serializing)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub next: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    /// The path relative to the workspace root.
    pub path: WorkspacePath,
    pub kind: FileKind,
    /// Bytes, for regular files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum FileKind {
    File,
    Dir,
    /// A leaf: never followed.
    Symlink,
    Other,
}

/// `files.watch` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FilesWatchParams {
    pub session_id: String,
    #[serde(default)]
    pub path: Option<WorkspacePath>,
}

/// A `files.watch` item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum FilesWatchItem {
    /// The initial scan is done.
    #[serde(rename_all = "camelCase")]
    Ready { directory_identity: String },
    /// The directory needs rereading (coalesced).
    Changed,
}

/// How a `files.watch` ended: `unavailable` when the directory was removed or replaced;
/// null when it was closed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum FilesWatchEnd {
    Unavailable,
}

/// `files.read` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct FilesReadParams {
    pub session_id: String,
    pub path: WorkspacePath,
    /// Read only if the file is still this version (else a `changed` item).
    #[serde(default)]
    pub expected_version: Option<String>,
}

/// A `files.read` item: `begin`, `chunk`s, `end`; or one explicit outcome instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum FilesReadItem {
    #[serde(rename_all = "camelCase")]
    Begin {
        version: String,
        size: u64,
        kind: FileContentKind,
        mime: String,
    },
    /// At most 32 KiB of original bytes; text chunks end on UTF-8 boundaries.
    #[serde(rename_all = "camelCase")]
    Chunk { offset: u64, data_base64: String },
    /// `sha256` (hex) covers every byte delivered; `replaced` says the path no longer names
    /// the version delivered (it was replaced or changed while being read).
    #[serde(rename_all = "camelCase")]
    End {
        version: String,
        size: u64,
        sha256: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        replaced: bool,
    },
    /// No such file.
    Absent,
    /// The file is not `expectedVersion` any more.
    #[serde(rename_all = "camelCase")]
    Changed { version: String },
    /// Neither UTF-8 text nor a supported image.
    Binary,
    /// Not a regular file, or too large (`reason`).
    #[serde(rename_all = "camelCase")]
    Unsupported { reason: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum FileContentKind {
    Text,
    Image,
}

/// `workspace.rename` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceRenameParams {
    pub workspace_id: String,
    pub title: String,
    #[serde(default)]
    pub operation_id: Option<String>,
}

/// `workspace.remove` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceRemoveParams {
    pub workspace_id: String,
    #[serde(default)]
    pub operation_id: Option<String>,
}

/// `workspace.files` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceFilesParams {
    pub workspace_id: String,
    /// Only paths starting with this (`/`-separated, relative).
    #[serde(default)]
    pub prefix: Option<String>,
}

/// Completion candidates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceFilesResult {
    /// Sorted by path; ancestors of matching files are included as directories.
    pub entries: Vec<WorkspaceFile>,
    /// More matched than [`WORKSPACE_FILES_MAX`].
    pub truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceFile {
    /// Relative, `/`-separated.
    pub path: String,
    pub dir: bool,
}

/// The most entries `workspace.files` answers.
pub const WORKSPACE_FILES_MAX: usize = 2000;
/// The most entries a `files.list` page holds.
pub const FILES_LIST_PAGE: usize = 128;
/// The soft byte target of a `files.list` page.
pub const FILES_LIST_BYTES: usize = 512 << 10;
/// The most original bytes a `files.read` chunk carries.
pub const FILES_READ_CHUNK: usize = 32 << 10;

/// A `files.read` buffer's chunk boundaries: at most [`FILES_READ_CHUNK`] bytes each, text
/// cut on UTF-8 boundaries. Greedy from the start, so the ends of any run of whole chunks,
/// cut again from the run's start, are the same ends (a replica recuts a chunk run this way).
pub fn files_read_chunk_ends(data: &[u8], text: bool) -> Vec<usize> {
    let mut ends = Vec::with_capacity(data.len() / FILES_READ_CHUNK + 1);
    let mut at = 0;
    while at < data.len() {
        let mut end = (at + FILES_READ_CHUNK).min(data.len());
        // A UTF-8 continuation byte (10xxxxxx) cannot start a chunk; at most 3 steps back
        // in valid UTF-8, and never to an empty chunk.
        while text && end < data.len() && end > at + 1 && data[end] & 0xC0 == 0x80 {
            end -= 1;
        }
        ends.push(end);
        at = end;
    }
    ends
}

/// The largest patch `patch.snapshot` captures, in bytes (more → `payload-too-large
/// {limit: "patch", max}`).
pub const MAX_PATCH_BYTES: usize = 64 << 20;
/// The most bytes of patch text one `patch.read` page carries.
pub const PATCH_PAGE_BYTES: usize = 256 << 10;

/// `patch.snapshot` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PatchSnapshotParams {
    pub session_id: String,
    /// Label the patch with this settled turn of the session (`turn-busy` while it is
    /// queued or running); without it, the session must have no running turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// Required: a retry returns the patch the first attempt captured.
    pub operation_id: String,
}

/// A captured patch: every change of the workspace against HEAD (staged, worktree and
/// untracked files, ignored files left out) as one `git apply`-able unified diff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PatchInfo {
    pub patch_id: String,
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The commit the patch applies to; absent for a repository without commits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// How many paths the patch changes.
    pub files: u32,
    /// Bytes of patch text (UTF-8).
    pub bytes: u64,
    /// Lowercase hex SHA-256 of the patch text.
    pub sha256: String,
    pub created_at: String,
}

/// `patch.read` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PatchReadParams {
    pub patch_id: String,
    /// The `nextAfter` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// One page of a patch's text: at most [`PATCH_PAGE_BYTES`], ending on a line boundary
/// when the page holds one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PatchReadResult {
    pub patch: PatchInfo,
    /// The byte offset of `text` in the patch.
    pub offset: u64,
    pub text: String,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text of 1-, 2-, 3- and 4-byte characters, so that cuts fall inside characters.
    fn mixed_text(len: usize) -> Vec<u8> {
        "aé✓😀".repeat(len / 10 + 1).into_bytes()[..].to_vec()
    }

    #[test]
    fn chunk_ends_are_bounded_utf8_boundaries() {
        let data = mixed_text(300_000);
        let ends = files_read_chunk_ends(&data, true);
        let mut at = 0;
        for &end in &ends {
            assert!(end > at && end - at <= FILES_READ_CHUNK);
            assert!(
                std::str::from_utf8(&data[at..end]).is_ok(),
                "cut inside a character at {end}"
            );
            at = end;
        }
        assert_eq!(at, data.len());
        // Some cuts had to step back from a full chunk.
        assert!(ends.windows(2).any(|w| w[1] - w[0] < FILES_READ_CHUNK));
        assert_eq!(files_read_chunk_ends(b"", true), Vec::<usize>::new());
        assert_eq!(
            files_read_chunk_ends(&[0x80u8; 70_000], false),
            vec![32768, 65536, 70_000]
        );
        // Not UTF-8 although called text: still bounded, never empty, and it ends.
        let odd = files_read_chunk_ends(&[0x80u8; 70_000], true);
        assert_eq!(*odd.last().unwrap(), 70_000);
    }

    #[test]
    fn a_run_of_whole_chunks_recuts_to_the_same_chunks() {
        for text in [true, false] {
            let data = mixed_text(1 << 20);
            let ends = files_read_chunk_ends(&data, text);
            // Runs of up to 8 chunks, as a worker groups them, cut again from their start.
            let mut recut = Vec::new();
            let mut start = 0;
            for run in ends.chunks(8) {
                let end = *run.last().unwrap();
                recut.extend(files_read_chunk_ends(&data[start..end], text).iter().map(|e| start + e));
                start = end;
            }
            assert_eq!(recut, ends);
        }
    }
}
