//! `patch.snapshot`, and the patch writer `git.diff` shares: git's format, hunks included.

use std::{collections::BTreeSet, path::Path};

use berth_protocol::{ErrorCode, RpcError, worker::PatchCaptured};
use gix::objs::tree::EntryKind;

use super::{BINARY_PROBE, Side, broken, head_tree, is_link, open, status::status, workspace, worktree_blob};
use crate::observe::failure;

/// `patch.snapshot`: every change of the workspace against HEAD — the paths `status`
/// lists in any area — as one unified diff `git apply` takes (HEAD's content → the
/// file's; binary or non-UTF-8 content as `Binary files … differ`), and the facts about it.
/// More than `max` bytes is `payload-too-large {limit: "patch"}`.
pub fn patch(root: &Path, max: usize) -> Result<(String, PatchCaptured), RpcError> {
    let Some(repo) = open(root)? else {
        return Err(failure(ErrorCode::Unsupported, "feature", "no-repository"));
    };
    let Some(st) = status(root)? else {
        return Err(failure(ErrorCode::Unsupported, "feature", "no-repository"));
    };
    let (head, tree) = head_tree(&repo)?;
    let mut paths = BTreeSet::new();
    for e in st.staged.iter().chain(&st.worktree).chain(&st.untracked) {
        let path = crate::observe::decode_raw(&e.path).map_err(|_| RpcError::new(ErrorCode::Internal))?;
        // A nested repository (`dir/`) is not content of this one.
        if !path.ends_with(b"/") {
            paths.insert(path);
        }
    }
    let ws = workspace(root)?;
    let mut out = String::new();
    let mut files = 0u32;
    for path in paths {
        let old: Side = match tree.get(&path) {
            Some(item) if item.kind == EntryKind::Commit => continue,
            Some(item) => Some((repo.find_blob(item.id).map_err(broken)?.data.clone(), item.kind)),
            None => None,
        };
        let new = worktree_blob(&ws, &path).map_err(broken)?;
        if old == new {
            continue;
        }
        files += 1;
        match (old, new) {
            (Some(o), Some(n)) if is_link(o.1) != is_link(n.1) => {
                file_patch(&mut out, &path, Some(o), None);
                file_patch(&mut out, &path, None, Some(n));
            }
            (o, n) => file_patch(&mut out, &path, o, n),
        }
        if out.len() > max {
            let mut fields = serde_json::Map::new();
            fields.insert("limit".into(), "patch".into());
            fields.insert("max".into(), max.into());
            return Err(RpcError::with_fields(ErrorCode::PayloadTooLarge, fields));
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

pub(super) fn mode(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::BlobExecutable => "100755",
        EntryKind::Link => "120000",
        _ => "100644",
    }
}

/// A path as git writes it in a patch header: C-quoted (octal escapes for control and
/// non-ASCII bytes) when it needs quoting, so any name survives as UTF-8 text.
pub(super) fn quoted(prefix: &str, path: &[u8]) -> String {
    let plain = path
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
    if plain {
        return format!("{prefix}{}", String::from_utf8_lossy(path));
    }
    let mut s = String::from("\"");
    s.push_str(prefix);
    for &b in path {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\t' => s.push_str("\\t"),
            b'\n' => s.push_str("\\n"),
            b'\r' => s.push_str("\\r"),
            0x20..0x7f => s.push(b as char),
            _ => s.push_str(&format!("\\{b:03o}")),
        }
    }
    s.push('"');
    s
}

/// One path's part of a patch, in git's format.
pub(super) fn file_patch(out: &mut String, path: &[u8], old: Side, new: Side) {
    let (a, b) = (quoted("a/", path), quoted("b/", path));
    out.push_str(&format!("diff --git {a} {b}\n"));
    match (&old, &new) {
        (None, Some((_, kind))) => out.push_str(&format!("new file mode {}\n", mode(*kind))),
        (Some((_, kind)), None) => out.push_str(&format!("deleted file mode {}\n", mode(*kind))),
        (Some((_, o)), Some((_, n))) if mode(*o) != mode(*n) => {
            out.push_str(&format!("old mode {}\nnew mode {}\n", mode(*o), mode(*n)));
        }
        _ => {}
    }
    let before = old.as_ref().map(|o| o.0.as_slice());
    let after = new.as_ref().map(|n| n.0.as_slice());
    if before.unwrap_or_default() == after.unwrap_or_default() {
        // A mode change only, or an empty file added or removed: no hunks.
        return;
    }
    let from = if before.is_some() {
        a.clone()
    } else {
        "/dev/null".into()
    };
    let to = if after.is_some() { b.clone() } else { "/dev/null".into() };
    let binary = |d: Option<&[u8]>| d.is_some_and(|d| d[..d.len().min(BINARY_PROBE)].contains(&0));
    let text = (
        std::str::from_utf8(before.unwrap_or_default()),
        std::str::from_utf8(after.unwrap_or_default()),
    );
    match text {
        (Ok(t0), Ok(t1)) if !binary(before) && !binary(after) => {
            out.push_str(&format!("--- {from}\n+++ {to}\n"));
            out.push_str(&hunks(t0, t1));
        }
        _ => out.push_str(&format!("Binary files {from} and {to} differ\n")),
    }
}

/// Lines of context around changes, as git's default.
pub(super) const CONTEXT: u32 = 3;

/// Unified hunks (3 lines of context) in git's format: git's line-sliding heuristic,
/// `@@ -l,s +l,s @@ <function line>` with `,1` left out and an empty side numbered by the
/// line before it, and a last line without newline marked.
pub(super) fn hunks(before: &str, after: &str) -> String {
    use std::fmt::Write;

    use imara_diff::{Algorithm, Diff, InternedInput};
    let input = InternedInput::new(before, after);
    let mut diff = Diff::compute(Algorithm::Myers, &input);
    diff.postprocess_lines(&input);
    let all: Vec<imara_diff::Hunk> = diff.hunks().collect();
    let text = |t: &imara_diff::Token| input.interner[*t];
    let (old, new) = (&input.before, &input.after);
    let mut out = String::new();
    let line = |out: &mut String, sign: char, s: &str| {
        out.push(sign);
        out.push_str(s);
        if !s.ends_with('\n') {
            out.push_str("\n\\ No newline at end of file\n");
        }
    };
    let mut i = 0;
    while i < all.len() {
        // Changes closer than twice the context share a hunk.
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].before.start - all[j].before.end <= 2 * CONTEXT {
            j += 1;
        }
        let lead = CONTEXT.min(all[i].before.start);
        let trail = CONTEXT.min(old.len() as u32 - all[j].before.end);
        let (b_from, b_to) = (all[i].before.start - lead, all[j].before.end + trail);
        let (a_from, a_to) = (all[i].after.start - lead, all[j].after.end + trail);
        let _ = write!(
            out,
            "@@ -{} +{} @@",
            range(b_from, b_to - b_from),
            range(a_from, a_to - a_from)
        );
        if let Some(f) = old[..b_from as usize].iter().rev().map(text).find(|l| {
            l.as_bytes()
                .first()
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_' || *c == b'$')
        }) {
            let f = f.trim_end();
            let mut cut = f.len().min(80);
            while !f.is_char_boundary(cut) {
                cut -= 1;
            }
            out.push(' ');
            out.push_str(&f[..cut]);
        }
        out.push('\n');
        let mut pos = b_from;
        for h in &all[i..=j] {
            for t in &old[pos as usize..h.before.start as usize] {
                line(&mut out, ' ', text(t));
            }
            for t in &old[h.before.start as usize..h.before.end as usize] {
                line(&mut out, '-', text(t));
            }
            for t in &new[h.after.start as usize..h.after.end as usize] {
                line(&mut out, '+', text(t));
            }
            pos = h.before.end;
        }
        for t in &old[pos as usize..b_to as usize] {
            line(&mut out, ' ', text(t));
        }
        i = j + 1;
    }
    out
}

pub(super) fn range(start: u32, len: u32) -> String {
    match len {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        _ => format!("{},{len}", start + 1),
    }
}
