//! The patch writer `git.diff` and `patch.snapshot` share: one path's change in the form
//! `git diff --binary --full-index` prints it, bytes for bytes (binary literals aside:
//! they are deflated by zlib-rs, which git apply inflates alike).

use std::io::Write;

use gix::{ObjectId, objs::tree::EntryKind};

use super::{BINARY_PROBE, Side, same_type};

/// Git's rule: a NUL in the first 8000 bytes makes content binary.
pub(super) fn is_binary(data: &[u8]) -> bool {
    data[..data.len().min(BINARY_PROBE)].contains(&0)
}

pub(super) fn mode(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::BlobExecutable => "100755",
        EntryKind::Link => "120000",
        EntryKind::Commit => "160000",
        _ => "100644",
    }
}

/// The side of a submodule as git diffs it: its commit, as a line of text.
pub(super) fn submodule_side(id: ObjectId, dirty: bool) -> (Vec<u8>, EntryKind) {
    let dirty = if dirty { "-dirty" } else { "" };
    (
        format!("Subproject commit {id}{dirty}\n").into_bytes(),
        EntryKind::Commit,
    )
}

/// The object id of one side (the null id when absent).
fn object_id(hash: gix::hash::Kind, side: &Side) -> ObjectId {
    match side {
        None => ObjectId::null(hash),
        Some((data, EntryKind::Commit)) => {
            let hex = &data[b"Subproject commit ".len()..][..hash.len_in_hex()];
            ObjectId::from_hex(hex).unwrap_or_else(|_| ObjectId::null(hash))
        }
        Some((data, _)) => {
            gix::objs::compute_hash(hash, gix::objs::Kind::Blob, data).unwrap_or_else(|_| ObjectId::null(hash))
        }
    }
}

/// A path as git writes it in a patch header: C-quoted (git's letter escapes, octal ones
/// for other control and non-ASCII bytes) when it needs quoting, so any name survives as UTF-8 text.
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
            0x07 => s.push_str("\\a"),
            0x08 => s.push_str("\\b"),
            b'\t' => s.push_str("\\t"),
            b'\n' => s.push_str("\\n"),
            0x0b => s.push_str("\\v"),
            0x0c => s.push_str("\\f"),
            b'\r' => s.push_str("\\r"),
            0x20..0x7f => s.push(b as char),
            _ => s.push_str(&format!("\\{b:03o}")),
        }
    }
    s.push('"');
    s
}

/// One path's change, as git prints it: a type change (file ↔ symlink ↔ submodule) as a
/// deletion then an addition; mode lines; the `index` line with full object ids when the
/// content differs; then hunks, or a `GIT binary patch` (both sides as literals) when
/// either side is binary or `force_binary` (text a snapshot cannot carry as text).
pub(super) fn file_patch(
    out: &mut Vec<u8>,
    hash: gix::hash::Kind,
    path: &[u8],
    old: &Side,
    new: &Side,
    force_binary: bool,
) {
    if let (Some(o), Some(n)) = (old, new)
        && !same_type(o.1, n.1)
    {
        file_patch(out, hash, path, old, &None, force_binary);
        file_patch(out, hash, path, &None, new, force_binary);
        return;
    }
    let (a, b) = (quoted("a/", path), quoted("b/", path));
    let _ = writeln!(out, "diff --git {a} {b}");
    match (old, new) {
        (None, Some((_, kind))) => {
            let _ = writeln!(out, "new file mode {}", mode(*kind));
        }
        (Some((_, kind)), None) => {
            let _ = writeln!(out, "deleted file mode {}", mode(*kind));
        }
        (Some((_, o)), Some((_, n))) if mode(*o) != mode(*n) => {
            let _ = write!(out, "old mode {}\nnew mode {}\n", mode(*o), mode(*n));
        }
        _ => {}
    }
    let (old_id, new_id) = (object_id(hash, old), object_id(hash, new));
    let before = old.as_ref().map_or(&[][..], |o| o.0.as_slice());
    let after = new.as_ref().map_or(&[][..], |n| n.0.as_slice());
    if old_id != new_id {
        let _ = write!(out, "index {old_id}..{new_id}");
        match (old, new) {
            (Some((_, o)), Some((_, n))) if mode(*o) == mode(*n) => {
                let _ = writeln!(out, " {}", mode(*o));
            }
            _ => out.push(b'\n'),
        }
    } else if before == after {
        // A mode change only: no index line, no hunks.
        return;
    }
    if before.is_empty() && after.is_empty() {
        // An empty file added or removed: no hunks.
        return;
    }
    let from = if old.is_some() { a } else { "/dev/null".into() };
    let to = if new.is_some() { b } else { "/dev/null".into() };
    if force_binary || is_binary(before) || is_binary(after) {
        out.extend_from_slice(b"GIT binary patch\n");
        literal(out, after);
        out.push(b'\n');
        literal(out, before);
        out.push(b'\n');
        return;
    }
    // Git ends a name holding a space with a tab, so that the name's end is plain.
    let tab = |name: &str| if name.contains(' ') { "\t" } else { "" };
    let _ = write!(out, "--- {from}{}\n+++ {to}{}\n", tab(&from), tab(&to));
    out.extend_from_slice(&hunks(before, after));
}

/// Git's base85 alphabet (`base85.c`).
const BASE85: &[u8; 85] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

/// `literal <size>` and `data` deflated, in lines of base85 of at most 52 bytes each, each
/// led by its length (`A`–`Z` for 1–26, `a`–`z` for 27–52).
fn literal(out: &mut Vec<u8>, data: &[u8]) {
    let _ = writeln!(out, "literal {}", data.len());
    let mut z = gix::zlib::stream::deflate::Write::new(Vec::new(), gix::zlib::Compression::DEFAULT);
    // Writing into memory cannot fail.
    let _ = z.write_all(data).and_then(|()| z.flush());
    let deflated = z.into_inner();
    for line in deflated.chunks(52) {
        let n = line.len() as u8;
        out.push(if n <= 26 { b'A' + n - 1 } else { b'a' + n - 27 });
        for group in line.chunks(4) {
            let mut word = [0u8; 4];
            word[..group.len()].copy_from_slice(group);
            let mut v = u32::from_be_bytes(word);
            let mut digits = [0u8; 5];
            for d in digits.iter_mut().rev() {
                *d = BASE85[(v % 85) as usize];
                v /= 85;
            }
            out.extend_from_slice(&digits);
        }
        out.push(b'\n');
    }
}

/// Lines of context around changes, as git's default.
const CONTEXT: u32 = 3;

/// The function line git puts after a hunk header: the nearest line before the hunk that
/// starts with a letter, `_` or `$`, cut to 80 bytes, trailing whitespace trimmed (git's
/// default `def_ff`, bytes as they are).
fn function_line(line: &[u8]) -> Option<&[u8]> {
    let first = *line.first()?;
    if !(first.is_ascii_alphabetic() || first == b'_' || first == b'$') {
        return None;
    }
    let mut len = line.len().min(80);
    while len > 0 && matches!(line[len - 1], b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c) {
        len -= 1;
    }
    Some(&line[..len])
}

/// Unified hunks (3 lines of context) in git's format, over bytes: git's line-sliding
/// heuristic, `@@ -l,s +l,s @@ <function line>` with `,1` left out and an empty side
/// numbered by the line before it, and a last line without newline marked.
pub(super) fn hunks(before: &[u8], after: &[u8]) -> Vec<u8> {
    use imara_diff::{Algorithm, Diff, InternedInput};
    let input = InternedInput::new(before, after);
    let mut diff = Diff::compute(Algorithm::Myers, &input);
    diff.postprocess_lines(&input);
    let all: Vec<imara_diff::Hunk> = diff.hunks().collect();
    let text = |t: &imara_diff::Token| input.interner[*t];
    let (old, new) = (&input.before, &input.after);
    let mut out = Vec::new();
    let line = |out: &mut Vec<u8>, sign: u8, s: &[u8]| {
        out.push(sign);
        out.extend_from_slice(s);
        if !s.ends_with(b"\n") {
            out.extend_from_slice(b"\n\\ No newline at end of file\n");
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
        if let Some(f) = old[..b_from as usize].iter().rev().find_map(|t| function_line(text(t))) {
            out.push(b' ');
            out.extend_from_slice(f);
        }
        out.push(b'\n');
        let mut pos = b_from;
        for h in &all[i..=j] {
            for t in &old[pos as usize..h.before.start as usize] {
                line(&mut out, b' ', text(t));
            }
            for t in &old[h.before.start as usize..h.before.end as usize] {
                line(&mut out, b'-', text(t));
            }
            for t in &new[h.after.start as usize..h.after.end as usize] {
                line(&mut out, b'+', text(t));
            }
            pos = h.before.end;
        }
        for t in &old[pos as usize..b_to as usize] {
            line(&mut out, b' ', text(t));
        }
        i = j + 1;
    }
    out
}

fn range(start: u32, len: u32) -> String {
    match len {
        0 => format!("{start},0"),
        1 => format!("{}", start + 1),
        _ => format!("{},{len}", start + 1),
    }
}
