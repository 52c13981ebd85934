//! `files.list`, `files.read`, `files.watch`: every path goes through the worker's one
//! confinement ([`Workspace`]), opened beneath the workspace root with the last component
//! never followed.

use std::{
    ffi::OsStr,
    io::Read,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use base64::Engine;
use berth_protocol::{
    ErrorCode, FILES_LIST_BYTES, FILES_LIST_PAGE, FileContentKind, FileEntry, FileKind, FilesListParams,
    FilesListResult, FilesReadItem, FilesReadParams, FilesWatchEnd, FilesWatchItem, FilesWatchParams, RpcError,
    files_read_chunk_ends, worker::CHUNK_RUN_BYTES,
};
use cap_std::fs::MetadataExt;
use sha2::{Digest, Sha256};

use super::{Items, decode_path, encode_path, failure};
use crate::workspace::{OpenError, Workspace};

/// Entries never listed or read: git's directory and Berth's own state.
const EXCLUDED: &[&[u8]] = &[b".git", b".berth"];
/// The largest file `files.read` captures (it holds the whole file in one buffer).
pub(crate) const READ_MAX: u64 = 64 << 20;
/// MiB of files that `files.read`s hold at once in the whole worker.
const HELD_MIB: usize = 256;
static HELD: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(HELD_MIB);
/// How long changes settle before `changed` goes out (coalescing bursts).
const SETTLE: Duration = Duration::from_millis(50);
/// The polling fallback rests at least this long between scans…
const POLL_MIN_PAUSE: Duration = Duration::from_secs(1);
/// …and at least this many times the last scan's duration (a 10% duty cycle).
const POLL_PAUSE_FACTOR: u32 = 9;

fn open_failure(e: OpenError) -> RpcError {
    match e {
        OpenError::Absent => failure(ErrorCode::NotFound, "reason", "absent"),
        OpenError::Symlink => failure(ErrorCode::Unsupported, "reason", "symlink"),
        OpenError::WrongKind => failure(ErrorCode::BadParams, "reason", "wrong-kind"),
        OpenError::Outside => failure(ErrorCode::Forbidden, "reason", "outside-workspace"),
        OpenError::Private => failure(ErrorCode::Forbidden, "reason", "private"),
        OpenError::Raced => failure(ErrorCode::Unavailable, "reason", "changed-during-open"),
        OpenError::Io(e) => io_failure(&e),
    }
}

fn io_failure(e: &std::io::Error) -> RpcError {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        return failure(ErrorCode::Forbidden, "reason", "permission-denied");
    }
    tracing::warn!(error = %e, "workspace I/O failed");
    failure(ErrorCode::Unavailable, "reason", "io-error")
}

/// The relative path of a client's optional directory (`.` for the root); `.git` and
/// Berth's state are never entered.
fn directory(p: Option<&berth_protocol::WorkspacePath>) -> Result<PathBuf, RpcError> {
    match p {
        None => Ok(PathBuf::from(".")),
        Some(p) => relative(p),
    }
}

fn relative(p: &berth_protocol::WorkspacePath) -> Result<PathBuf, RpcError> {
    let bytes = decode_path(p)?;
    if bytes.split(|b| *b == b'/').any(|c| EXCLUDED.contains(&c)) {
        return Err(failure(ErrorCode::Forbidden, "reason", "private"));
    }
    Ok(PathBuf::from(OsStr::from_bytes(&bytes)))
}

fn identity(meta: &cap_std::fs::Metadata) -> String {
    format!("{:x}:{:x}", meta.dev(), meta.ino())
}

fn join(dir: &Path, name: &[u8]) -> Vec<u8> {
    if dir == Path::new(".") {
        name.to_vec()
    } else {
        let mut p = dir.as_os_str().as_bytes().to_vec();
        p.push(b'/');
        p.extend_from_slice(name);
        p
    }
}

/// `files.list`: one page of direct children, sorted by name bytes.
pub(crate) fn list(ws: &Workspace, p: &FilesListParams) -> Result<FilesListResult, RpcError> {
    let rel = directory(p.path.as_ref())?;
    let dir = ws.open_directory(&rel).map_err(open_failure)?;
    let after = match &p.after {
        Some(a) => Some(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(a)
                .map_err(|_| failure(ErrorCode::BadParams, "field", "after"))?,
        ),
        None => None,
    };
    let mut names = Vec::new();
    for entry in dir.handle.entries().map_err(|e| io_failure(&e))? {
        let entry = entry.map_err(|e| io_failure(&e))?;
        let name = entry.file_name().as_bytes().to_vec();
        if EXCLUDED.contains(&name.as_slice()) || after.as_ref().is_some_and(|a| name <= *a) {
            continue;
        }
        names.push((name, entry));
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    let mut entries = Vec::new();
    let mut bytes = 0usize;
    let mut last: Option<Vec<u8>> = None;
    let mut next = None;
    for (name, entry) in names {
        let (kind, size) = match entry.metadata() {
            Ok(m) if m.file_type().is_symlink() => (FileKind::Symlink, None),
            Ok(m) if m.is_dir() => (FileKind::Dir, None),
            Ok(m) if m.is_file() => (FileKind::File, Some(m.len())),
            // Gone since the directory was read, or unreadable: still an entry.
            _ => (FileKind::Other, None),
        };
        let e = FileEntry {
            path: encode_path(&join(&rel, &name)),
            kind,
            size,
        };
        // Roughly what the entry costs on the wire; one complete first entry always fits.
        let cost = e.path.bytes_base64.len() + 64;
        if entries.len() == FILES_LIST_PAGE || (!entries.is_empty() && bytes + cost > FILES_LIST_BYTES) {
            // The cursor is the last name delivered.
            next = last.map(|n| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(n));
            break;
        }
        bytes += cost;
        entries.push(e);
        last = Some(name);
    }
    Ok(FilesListResult {
        directory_identity: identity(&dir.meta),
        entries,
        next_after: next,
        next: None,
    })
}

/// What `files.read` captured: one buffer, and the identity it came from.
struct Capture {
    /// The whole file: every chunk of the read is cut from it.
    data: Vec<u8>,
    meta: cap_std::fs::Metadata,
    version: String,
    /// Whether `data` is text: no NUL early on (git's rule for binary) and valid UTF-8.
    text: bool,
}

/// A read's `version`: its bytes (by XXH3-128, which hashes 8 MiB in well under a
/// millisecond, so `begin` does not wait for the SHA-256 that `end` carries), the file's and
/// its parent's identity, and its path. A precondition, not an integrity check: a forged
/// collision could only let a read go ahead, and what it delivers is checked by `end`'s
/// SHA-256.
fn version(rel: &Path, meta: &cap_std::fs::Metadata, parent: &str, content: u128) -> String {
    let mut h = Sha256::new();
    h.update(content.to_le_bytes());
    h.update(format!("{}:{}:{}:", meta.dev(), meta.ino(), parent).as_bytes());
    h.update(rel.as_os_str().as_bytes());
    let v = h.finalize();
    crate::attachments::hex(&v[..16])
}

/// How much of a file `files.read` reads at a time: small enough that a block is still in
/// the cache when its UTF-8 check and its hash run right after its read.
const CAPTURE_BLOCK: usize = 128 << 10;

/// Read all of `file` (`len` bytes by its metadata) into one buffer, block by block, each
/// block checked for UTF-8 and hashed (XXH3-128) while it is in the cache: one pass over
/// memory instead of three. The bytes, whether they are text (no NUL in the first 8000
/// bytes, git's rule for binary, and valid UTF-8) and their hash; None when the file turned
/// out longer than `len` or [`READ_MAX`] (a writer is at work, or it is too large).
fn read_scanned(file: &std::fs::File, len: u64) -> Result<Option<(Vec<u8>, bool, u128)>, RpcError> {
    let len = len.min(READ_MAX) as usize;
    let mut data = Vec::with_capacity(len + 1);
    let mut hash = xxhash_rust::xxh3::Xxh3Default::new();
    let mut utf8 = true;
    // Where the part not yet known to be UTF-8 starts: a character cut by a block's end
    // is checked again with the next block.
    let mut unchecked = 0;
    loop {
        let start = data.len();
        // One byte past the length the metadata gave, to see a file that grew. Read into
        // the buffer's spare capacity (reserved once, never zeroed: the read's copy is the
        // first touch of the block's memory), in a few growing reads a block (`read_to_end`
        // starts each at 8 KiB): a zeroed block read at once cost more (docs/performance.md).
        let want = CAPTURE_BLOCK.min(len + 1 - start);
        let n = file
            .take(want as u64)
            .read_to_end(&mut data)
            .map_err(|e| io_failure(&e))?;
        if data.len() > len {
            return Ok(None);
        }
        hash.update(&data[start..]);
        if utf8 {
            match simdutf8::compat::from_utf8(&data[unchecked..]) {
                Ok(_) => unchecked = data.len(),
                // Only a character cut at the end: checked whole with the next block.
                Err(e) if e.error_len().is_none() => unchecked += e.valid_up_to(),
                Err(_) => utf8 = false,
            }
        }
        // A short read is the end (a writer appending meanwhile is seen by the metadata).
        if n < want {
            break;
        }
    }
    let text = utf8 && unchecked == data.len() && !data[..data.len().min(8000)].contains(&0);
    Ok(Some((data, text, hash.digest128())))
}

/// Read the whole file through one handle; retried when a writer changed it meanwhile.
fn capture(ws: &Workspace, rel: &Path) -> Result<Result<Capture, FilesReadItem>, RpcError> {
    let parent = rel
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    for _ in 0..3 {
        let opened = match ws.open_regular(rel) {
            Ok(o) => o,
            Err(OpenError::Absent) => return Ok(Err(FilesReadItem::Absent)),
            Err(OpenError::Symlink) => {
                return Ok(Err(FilesReadItem::Unsupported {
                    reason: "symlink".into(),
                }));
            }
            Err(OpenError::WrongKind) => {
                return Ok(Err(FilesReadItem::Unsupported {
                    reason: "not-a-file".into(),
                }));
            }
            Err(OpenError::Raced) => continue,
            Err(e) => return Err(open_failure(e)),
        };
        if opened.meta.len() > READ_MAX {
            return Ok(Err(FilesReadItem::Unsupported {
                reason: "too-large".into(),
            }));
        }
        let Some((data, text, content)) = read_scanned(&opened.handle, opened.meta.len())? else {
            // Longer than its metadata said: read again (refused as too large if it now is).
            continue;
        };
        let after = cap_std::fs::Metadata::from_file(&opened.handle).map_err(|e| io_failure(&e))?;
        if after.len() != data.len() as u64
            || after.mtime() != opened.meta.mtime()
            || after.mtime_nsec() != opened.meta.mtime_nsec()
        {
            // Written to while we read: read again.
            continue;
        }
        let parent_id = ws.lstat(parent).map(|m| identity(&m)).unwrap_or_default();
        let version = version(rel, &after, &parent_id, content);
        return Ok(Ok(Capture {
            data,
            meta: after,
            version,
            text,
        }));
    }
    Err(failure(ErrorCode::Unavailable, "reason", "changing"))
}

/// Consecutive chunks (by their `ends`) grouped into runs of at most `max` bytes: each
/// run's start, end and number of chunks.
fn chunk_runs(ends: &[usize], max: usize) -> Vec<(usize, usize, u32)> {
    let mut runs = Vec::new();
    let (mut start, mut last, mut count) = (0, 0, 0u32);
    for &end in ends {
        if count > 0 && end - start > max {
            runs.push((start, last, count));
            (start, count) = (last, 0);
        }
        last = end;
        count += 1;
    }
    if count > 0 {
        runs.push((start, last, count));
    }
    runs
}

/// `files.read`: `begin`, chunks and `end` from one buffer, or one explicit outcome.
pub(crate) async fn read(ws: Arc<Workspace>, p: FilesReadParams, items: &Items) -> Result<(), RpcError> {
    let rel = relative(&p.path)?;
    // A read holds its file until the last chunk is sent (a slow reader keeps it long): the
    // worker holds at most [`HELD_MIB`] of them at once, reserved by the size the file has
    // now (and refused past `READ_MAX` by the capture).
    let size = ws.lstat(&rel).map(|m| m.len()).unwrap_or(0).min(READ_MAX);
    let _held = HELD
        .acquire_many(u32::try_from(size >> 20).unwrap_or(u32::MAX) + 1)
        .await
        .map_err(|_| RpcError::new(ErrorCode::Internal))?;
    let (w, r) = (ws.clone(), rel.clone());
    let capture = super::blocking(move || capture(&w, &r)).await?;
    let cap = match capture {
        Ok(c) => c,
        Err(outcome) => {
            items.send(&outcome).await;
            return Ok(());
        }
    };
    if let Some(expected) = &p.expected_version
        && *expected != cap.version
    {
        items.send(&FilesReadItem::Changed { version: cap.version }).await;
        return Ok(());
    }
    let (kind, mime) = if cap.text {
        (FileContentKind::Text, "text/plain; charset=utf-8")
    } else if let Some(mime) = crate::tools::image::mime_of(&cap.data) {
        (FileContentKind::Image, mime)
    } else {
        items.send(&FilesReadItem::Binary).await;
        return Ok(());
    };
    let size = cap.data.len() as u64;
    let begin = FilesReadItem::Begin {
        version: cap.version.clone(),
        size,
        kind,
        mime: mime.into(),
    };
    if !items.send(&begin).await {
        return Ok(());
    }
    let text = kind == FileContentKind::Text;
    let ends = files_read_chunk_ends(&cap.data, text);
    // `end`'s SHA-256 is of what went out, hashed piece by piece just before each is sent:
    // the first piece leaves at once, and the hashing shares the cores with the relaying
    // replicas and the client instead of holding one while the pipeline waits.
    let mut sha256 = Sha256::new();
    if items.chunk_runs() {
        // Whole chunks in runs of at most `CHUNK_RUN_BYTES`: one message per run.
        for (start, end, chunks) in chunk_runs(&ends, CHUNK_RUN_BYTES) {
            let run = &cap.data[start..end];
            sha256.update(run);
            if !items.send_run(start, text, run, chunks).await {
                return Ok(());
            }
        }
    } else {
        let mut offset = 0usize;
        for end in ends {
            let piece = &cap.data[offset..end];
            sha256.update(piece);
            if !items.send_chunk(offset, piece).await {
                return Ok(());
            }
            offset = end;
        }
    }
    // Whether the path still names what was delivered.
    let (w, r) = (ws.clone(), rel.clone());
    let now = super::blocking(move || Ok(w.lstat(&r).ok())).await?;
    let replaced = !now.is_some_and(|m| {
        (m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec())
            == (
                cap.meta.dev(),
                cap.meta.ino(),
                cap.meta.len(),
                cap.meta.mtime(),
                cap.meta.mtime_nsec(),
            )
    });
    let end = FilesReadItem::End {
        version: cap.version,
        size,
        sha256: crate::attachments::hex(&sha256.finalize()),
        replaced,
    };
    items.send(&end).await;
    Ok(())
}

/// A `chunk` item as JSON text, written in one pass: its base64 is encoded straight into
/// `out` (base64 needs no JSON escaping, so no serializer has to look at it again).
pub(super) fn write_chunk(out: &mut String, offset: usize, piece: &[u8]) {
    use std::fmt::Write;
    let _ = write!(out, r#"{{"type":"chunk","offset":{offset},"dataBase64":""#);
    base64_simd::STANDARD.encode_append(piece, out);
    out.push_str("\"}");
}

/// A cheap signature of a directory's entries (names, kinds, sizes, times) for polling.
fn scan(ws: &Workspace, rel: &Path) -> Result<Option<(String, Vec<u8>)>, RpcError> {
    let dir = match ws.open_directory(rel) {
        Ok(d) => d,
        Err(OpenError::Absent | OpenError::WrongKind | OpenError::Symlink | OpenError::Raced) => return Ok(None),
        Err(e) => return Err(open_failure(e)),
    };
    let mut h = Sha256::new();
    let mut rows = Vec::new();
    for entry in dir.handle.entries().map_err(|e| io_failure(&e))? {
        let entry = entry.map_err(|e| io_failure(&e))?;
        let mut row = entry.file_name().as_bytes().to_vec();
        if let Ok(m) = entry.metadata() {
            row.extend_from_slice(format!("\0{}:{}:{}:{}", m.ino(), m.len(), m.mtime(), m.mtime_nsec()).as_bytes());
        }
        rows.push(row);
    }
    rows.sort();
    for r in rows {
        h.update(&r);
        h.update(b"\n");
    }
    Ok(Some((identity(&dir.meta), h.finalize().to_vec())))
}

/// Filesystems whose changes made elsewhere (another client of the share) never reach
/// inotify: NFS, SMB/CIFS, FUSE, 9p, Ceph, AFS, Coda (`statfs` magic numbers).
const REMOTE_FILESYSTEMS: &[u64] = &[
    0x6969,
    0x517B,
    0xFE53_4D42,
    0xFF53_4D42,
    0x6573_5546,
    0x0102_1997,
    0x00C3_6400,
    0x5346_414F,
    0x7375_7245,
];

/// Whether native notifications can be trusted for the directory `dir`.
fn notifications_trusted(dir: &cap_std::fs::Dir) -> bool {
    match rustix::fs::fstatfs(dir) {
        Ok(fs) => !REMOTE_FILESYSTEMS.contains(&((fs.f_type as u64) & 0xFFFF_FFFF)),
        Err(_) => false,
    }
}

/// `files.watch`: `ready`, then `changed` (coalesced) whenever the directory needs
/// rereading; ends with `unavailable` when it is removed or replaced. Native notifications
/// (inotify through `notify`) when they can be set up and trusted (a local filesystem),
/// else metadata polling at a 10% duty cycle.
pub(crate) async fn watch(
    ws: Arc<Workspace>,
    p: FilesWatchParams,
    items: &Items,
) -> Result<Option<FilesWatchEnd>, RpcError> {
    let rel = directory(p.path.as_ref())?;
    let dir = ws.open_directory(&rel).map_err(open_failure)?;
    let ready_identity = identity(&dir.meta);
    let trusted = notifications_trusted(&dir.handle);
    drop(dir);
    let wake = Arc::new(tokio::sync::Notify::new());
    let native = if !trusted {
        Err(notify::Error::generic("a remote filesystem"))
    } else {
        super::watcher::register(&ws.root().join(&rel), wake.clone())
    };
    let native = match native {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::info!(error = %e, "native file notifications unavailable or untrusted; polling");
            None
        }
    };
    // The directory as of `ready` (after the watch is in place, so nothing falls between).
    let (w, r) = (ws.clone(), rel.clone());
    let Some((identity_now, mut signature)) = super::blocking(move || scan(&w, &r)).await? else {
        return Ok(Some(FilesWatchEnd::Unavailable));
    };
    if identity_now != ready_identity {
        return Ok(Some(FilesWatchEnd::Unavailable));
    }
    if !items
        .send(&FilesWatchItem::Ready {
            directory_identity: ready_identity.clone(),
        })
        .await
    {
        return Ok(None);
    }
    let mut pause = POLL_MIN_PAUSE;
    loop {
        if native.is_some() {
            wake.notified().await;
            tokio::time::sleep(SETTLE).await;
        } else {
            tokio::time::sleep(pause).await;
        }
        let started = Instant::now();
        let (w, r) = (ws.clone(), rel.clone());
        let scanned = super::blocking(move || scan(&w, &r)).await?;
        pause = POLL_MIN_PAUSE.max(started.elapsed() * POLL_PAUSE_FACTOR);
        let Some((id, sig)) = scanned else {
            return Ok(Some(FilesWatchEnd::Unavailable));
        };
        if id != ready_identity {
            return Ok(Some(FilesWatchEnd::Unavailable));
        }
        // Native events for the directory itself (e.g. its own times) need no reread.
        if sig != signature {
            signature = sig;
            if !items.send(&FilesWatchItem::Changed).await {
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_go_in_runs_of_whole_chunks_within_the_bound() {
        let text = "é✓".repeat(100_000); // 500 000 bytes of 2- and 3-byte characters
        let data = text.as_bytes();
        let ends = files_read_chunk_ends(data, true);
        let runs = chunk_runs(&ends, CHUNK_RUN_BYTES);
        let mut at = 0;
        let mut chunks = 0;
        for &(start, end, count) in &runs {
            assert_eq!(start, at);
            assert!(end - start <= CHUNK_RUN_BYTES);
            // Each run ends where a chunk ends and holds exactly its chunks.
            assert!(ends.contains(&end));
            assert_eq!(files_read_chunk_ends(&data[start..end], true).len(), count as usize);
            chunks += count as usize;
            at = end;
        }
        assert_eq!((at, chunks), (data.len(), ends.len()));
        assert_eq!(runs.len(), 2);
        assert_eq!(chunk_runs(&[], CHUNK_RUN_BYTES), vec![]);
        assert_eq!(chunk_runs(&[10], CHUNK_RUN_BYTES), vec![(0, 10, 1)]);
    }

    #[test]
    fn a_written_chunk_is_the_chunk_item_in_its_call_item() {
        let piece = "naïve ✓ \"quoted\"\n".as_bytes();
        let written = super::super::call_item_text(7, 0, |out| write_chunk(out, 65_536, piece));
        let parsed: serde_json::Value = serde_json::from_str(&written).unwrap();
        let item = FilesReadItem::Chunk {
            offset: 65_536,
            data_base64: base64::engine::general_purpose::STANDARD.encode(piece),
        };
        let expected = serde_json::json!({
            "jsonrpc": "2.0",
            "method": berth_protocol::worker::CALL_ITEM,
            "params": {"callId": 7, "item": item},
        });
        assert_eq!(parsed, expected);
    }

    #[test]
    fn a_capture_holds_the_whole_file_and_its_kind() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        // Several blocks of `CAPTURE_BLOCK`, multi-byte characters across their ends.
        let text = "naïve ✓ café\n".repeat(50_000);
        let mut invalid = text.clone().into_bytes();
        invalid.push(0xC3); // a truncated character at the very end: not UTF-8
        let mut nul = b"\0".to_vec();
        nul.extend_from_slice(text.as_bytes());
        // A character cut by the end of the first block the capture reads, one cut by the
        // second's, and a byte that is never UTF-8 in the third block.
        let mut straddling = vec![b'a'; CAPTURE_BLOCK - 1];
        straddling.extend_from_slice("✓".as_bytes());
        straddling.resize(2 * CAPTURE_BLOCK - 2, b'b');
        straddling.extend_from_slice("😀".as_bytes());
        straddling.extend_from_slice(b"tail");
        let mut invalid_later = straddling.clone();
        invalid_later.resize(2 * CAPTURE_BLOCK + 1000, b'c');
        invalid_later.push(0xFF);
        invalid_later.extend_from_slice(b"more");
        // A 2-byte character cut after its first byte, a 4-byte one after its third.
        let mut two_and_four = vec![b'a'; CAPTURE_BLOCK - 1];
        two_and_four.extend_from_slice("é".as_bytes());
        two_and_four.resize(2 * CAPTURE_BLOCK - 3, b'b');
        two_and_four.extend_from_slice("😀".as_bytes());
        // A block that ends in the first byte of a character the next block does not go on.
        let mut cut_off = vec![b'a'; CAPTURE_BLOCK - 1];
        cut_off.push(0xE2);
        cut_off.extend_from_slice(b"ascii");
        // Exactly two blocks.
        let whole_blocks = vec![b'w'; 2 * CAPTURE_BLOCK];
        for (name, data, is_text) in [
            ("text", text.as_bytes().to_vec(), true),
            ("invalid", invalid, false),
            ("nul", nul, false),
            ("empty", Vec::new(), true),
            ("straddling", straddling, true),
            ("invalid-later", invalid_later, false),
            ("two-and-four", two_and_four, true),
            ("cut-off", cut_off, false),
            ("whole-blocks", whole_blocks, true),
        ] {
            std::fs::write(tmp.path().join(name), &data).unwrap();
            let cap = capture(&ws, Path::new(name)).unwrap().ok().unwrap();
            assert!(cap.data == data, "{name}: captured other bytes");
            assert_eq!(cap.text, is_text, "{name}");
            // The block-wise hash is the hash of the whole file.
            let file = std::fs::File::open(tmp.path().join(name)).unwrap();
            let (_, _, hash) = read_scanned(&file, data.len() as u64).unwrap().unwrap();
            assert_eq!(hash, xxhash_rust::xxh3::xxh3_128(&data), "{name}");
        }
        // A file longer than its metadata said (a writer at work) is not taken, also by one
        // byte past whole blocks; a shorter one is read to its end (the metadata check
        // after the read sees it).
        std::fs::write(tmp.path().join("grown"), "0123456789").unwrap();
        let file = std::fs::File::open(tmp.path().join("grown")).unwrap();
        assert!(read_scanned(&file, 4).unwrap().is_none());
        std::fs::write(tmp.path().join("grown"), vec![b'g'; 2 * CAPTURE_BLOCK + 1]).unwrap();
        let file = std::fs::File::open(tmp.path().join("grown")).unwrap();
        assert!(read_scanned(&file, 2 * CAPTURE_BLOCK as u64).unwrap().is_none());
        let file = std::fs::File::open(tmp.path().join("grown")).unwrap();
        let (shorter, _, _) = read_scanned(&file, 3 * CAPTURE_BLOCK as u64).unwrap().unwrap();
        assert_eq!(shorter.len(), 2 * CAPTURE_BLOCK + 1);
    }

    #[test]
    fn the_version_binds_the_bytes_the_file_and_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        let version = |name: &str| capture(&ws, Path::new(name)).unwrap().ok().unwrap().version;
        let text = "naïve ✓ café\n".repeat(50_000);
        std::fs::write(tmp.path().join("a"), &text).unwrap();
        let first = version("a");
        assert_eq!(version("a"), first, "the same file read twice");
        // The last byte changed, in place: same file, same size.
        let mut changed = text.clone().into_bytes();
        *changed.last_mut().unwrap() = b'!';
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(tmp.path().join("a"))
            .unwrap();
        std::io::Write::write_all(&mut f, &changed).unwrap();
        drop(f);
        let second = version("a");
        assert_ne!(second, first, "other bytes");
        // The same bytes under another name.
        std::fs::write(tmp.path().join("b"), &changed).unwrap();
        assert_ne!(version("b"), second, "another file");
    }

    #[test]
    fn local_directories_are_watched_natively() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        let dir = ws.open_directory(Path::new(".")).unwrap();
        assert!(notifications_trusted(&dir.handle));
    }

    #[test]
    fn polling_sees_changes_and_the_directory_going_away() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        let d = Path::new("d");
        let (id, first) = scan(&ws, d).unwrap().unwrap();
        std::fs::write(tmp.path().join("d/new.txt"), "x").unwrap();
        let (id2, second) = scan(&ws, d).unwrap().unwrap();
        assert_eq!(id, id2);
        assert_ne!(first, second);
        std::fs::remove_dir_all(tmp.path().join("d")).unwrap();
        assert!(scan(&ws, d).unwrap().is_none());
    }
}
