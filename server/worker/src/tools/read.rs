//! `read_file`: a text file of the workspace as numbered lines (`cat -n`), a range of them,
//! long lines cut. What is not a text file at the path is said plainly, with what to do:
//! a directory's entries, the nearest paths to a missing one, an image's or a binary's kind.
//! UTF-16 with a byte-order mark is shown decoded, other text that is not UTF-8 with its
//! bad bytes replaced, each with a note.

use std::{
    io::{BufRead, BufReader, Read},
    path::Path,
};

use serde::Deserialize;

use super::{
    Outcome,
    fs::{EDIT_MAX, LINE_CHARS_MAX, ListArgs, Seen, list, walker},
};
use crate::workspace::{PathError, Workspace};

/// Bytes of numbered file text one read returns at most; the rest is reached with `offset`.
const READ_MAX: usize = 24 << 10;
const READ_LINES_DEFAULT: usize = 2000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadArgs {
    path: String,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}

/// One line of a reader, at most `keep` bytes of it kept (the rest read past): the kept
/// bytes (without the line end), the line's whole length and whether it was cut; None at
/// the end.
fn capped_line(reader: &mut impl BufRead, keep: usize) -> std::io::Result<Option<(Vec<u8>, usize, bool)>> {
    let mut kept = Vec::new();
    let mut total = 0usize;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            let cut = total > kept.len();
            return Ok((total > 0).then_some((kept, total, cut)));
        }
        let (chunk, done) = match memchr_newline(buf) {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        let room = keep.saturating_sub(kept.len()).min(chunk.len());
        kept.extend_from_slice(&chunk[..room]);
        total += chunk.len();
        let used = done.unwrap_or(buf.len());
        reader.consume(used);
        if done.is_some() {
            let cut = total > kept.len();
            if !cut && kept.last() == Some(&b'\r') {
                kept.pop();
            }
            return Ok(Some((kept, total + 1, cut)));
        }
    }
}

fn memchr_newline(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|b| *b == b'\n')
}

/// `read_file`: numbered lines (`cat -n`), a range of them, long lines cut. A directory
/// answers with its entries, a missing file with the nearest paths, an image or other
/// binary file with what it is; UTF-16 with a byte-order mark is shown decoded, and other
/// text that is not UTF-8 with its bad bytes replaced, saying so.
pub(super) fn read(ws: &Workspace, seen: &Seen, a: ReadArgs) -> Outcome {
    let file = match ws.open_file(&a.path) {
        Ok(f) => f,
        Err(e) => return not_readable(ws, &a.path, e),
    };
    let meta = file.metadata().ok();
    let size = meta.as_ref().map_or(0, |m| m.len());
    let mut plain = BufReader::new(file);
    let head = match plain.fill_buf() {
        Ok(b) => b[..b.len().min(8 << 10)].to_vec(),
        Err(e) => return Outcome::error(format!("{}: {e}", a.path)),
    };
    let mut notes = Vec::new();
    let mut reader: Box<dyn BufRead> = match utf16(&head) {
        Some(big_endian) => {
            // The file already opened, read on (its first bytes are still in the buffer).
            let mut bytes = Vec::new();
            if let Err(e) = (&mut plain).take(EDIT_MAX + 1).read_to_end(&mut bytes) {
                return Outcome::error(format!("{}: {e}", a.path));
            }
            if bytes.len() as u64 > EDIT_MAX {
                return Outcome::error(format!("{}: UTF-16 text larger than {EDIT_MAX} bytes", a.path));
            }
            notes.push(format!(
                "[{} is UTF-16 ({}) text, shown decoded; edit it with a command that keeps its encoding]",
                a.path,
                if big_endian { "big-endian" } else { "little-endian" }
            ));
            Box::new(std::io::Cursor::new(
                decode_utf16(bytes.get(2..).unwrap_or_default(), big_endian).into_bytes(),
            ))
        }
        None if head.contains(&0) => return Outcome::error(binary(&a.path, &head, size)),
        None => Box::new(plain),
    };
    let first = a.offset.unwrap_or(1).max(1);
    let limit = a.limit.unwrap_or(READ_LINES_DEFAULT).max(1);
    let mut out = String::new();
    let mut n = 0usize;
    // Bytes kept of one line: enough for LINE_CHARS_MAX characters of any width.
    let keep = LINE_CHARS_MAX * 4;
    let mut more = None;
    let mut lossy = false;
    loop {
        let (bytes, len, cut) = match capped_line(&mut reader, keep) {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => return Outcome::error(format!("{}: {e}", a.path)),
        };
        n += 1;
        if n < first {
            continue;
        }
        if bytes.contains(&0) {
            return Outcome::error(binary(&a.path, &head, size));
        }
        let text = match std::str::from_utf8(&bytes) {
            Ok(t) => t.to_string(),
            // A cut may fall inside a character: only a real encoding error is replaced.
            Err(e) if cut && e.error_len().is_none() => String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned(),
            Err(_) => {
                lossy = true;
                String::from_utf8_lossy(&bytes).into_owned()
            }
        };
        let mut shown: String = text.chars().take(LINE_CHARS_MAX).collect();
        if shown.len() < text.len() || cut {
            shown.push_str(&format!(" [… line cut: {len} bytes in all]"));
        }
        let numbered = format!("{n:>6}\t{shown}\n");
        if n >= first + limit || (out.len() + numbered.len() > READ_MAX && n > first) {
            more = Some(n);
            break;
        }
        out.push_str(&numbered);
    }
    if n < first {
        if n == 0 {
            return Outcome::ok(format!("({} is empty)", a.path));
        }
        return Outcome::error(format!("{}: has {n} lines; offset {first} is past the end", a.path));
    }
    if let Some(next) = more {
        // The file's length in lines, where counting it is cheap.
        let total = if size <= COUNT_MAX {
            let mut total = n;
            while let Ok(Some(_)) = capped_line(&mut reader, 0) {
                total += 1;
            }
            format!(" of {total}")
        } else {
            String::new()
        };
        out.push_str(&format!(
            "[lines {first}-{}{total} shown; more follow: read on with offset={next}]\n",
            next - 1
        ));
    }
    if lossy {
        notes.push(format!(
            "[{} is not UTF-8: bytes that are not were shown as �; edit_file and apply_patch cannot match those lines, so change them with a command]",
            a.path
        ));
    }
    for note in notes {
        out.push_str(&note);
        out.push('\n');
    }
    if let (Some(meta), Ok(rel)) = (meta, ws.normalized(&a.path)) {
        seen.record(rel, &meta);
    }
    out.push_str(&seen.agents_notes(ws, &a.path));
    Outcome::ok(out)
}

/// Bytes of a file `read_file` goes on reading past its range to count its lines.
const COUNT_MAX: u64 = 64 << 20;

/// Whether text starts with a UTF-16 byte-order mark: Some(big-endian) if it does.
fn utf16(head: &[u8]) -> Option<bool> {
    match head {
        [0xFF, 0xFE, ..] => Some(false),
        [0xFE, 0xFF, ..] => Some(true),
        _ => None,
    }
}

fn decode_utf16(bytes: &[u8], big_endian: bool) -> String {
    let units = bytes.chunks_exact(2).map(|c| {
        if big_endian {
            u16::from_be_bytes([c[0], c[1]])
        } else {
            u16::from_le_bytes([c[0], c[1]])
        }
    });
    char::decode_utf16(units)
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect()
}

/// What a file that is not text is, as the model reads it, and what to do instead.
fn binary(path: &str, head: &[u8], size: u64) -> String {
    if let Some(mime) = super::image::mime_of(head) {
        return format!("{path}: an image ({mime}, {size} bytes), not text; look at it with view_image");
    }
    let kind = if head.starts_with(b"%PDF") {
        "a PDF document"
    } else if head.starts_with(b"PK\x03\x04") {
        "a zip archive (or a format built on one)"
    } else if head.starts_with(b"\x7fELF") {
        "an executable (ELF)"
    } else if head.starts_with(b"\x1f\x8b") {
        "gzip-compressed data"
    } else {
        "a binary file"
    };
    format!(
        "{path}: {kind} ({size} bytes); it cannot be shown as text (a command such as `file` or `xxd | head` tells more)"
    )
}

/// Why `path` could not be read, as the model should read it: a directory's entries, or the
/// paths nearest a missing one.
fn not_readable(ws: &Workspace, path: &str, e: PathError) -> Outcome {
    if ws.dir_path(path).is_ok() {
        let listing = list(
            ws,
            ListArgs {
                path: Some(path.to_string()),
                depth: None,
            },
        );
        return Outcome::error(format!(
            "{path} is a directory, not a file; its entries:\n{}",
            listing.output
        ));
    }
    if !e.is_not_found() {
        return Outcome::error(e.0);
    }
    let near = nearest_paths(ws, path);
    if near.is_empty() {
        return Outcome::error(e.0);
    }
    Outcome::error(format!("{}. Did you mean: {}?", e.0, near.join(", ")))
}

/// Entries of a walk for [`nearest_paths`] at most, so a missing path in a huge workspace
/// answers at once.
const NEAR_WALK_MAX: usize = 20_000;

/// Up to five of the workspace's files whose path is nearest a missing `path`: the same
/// name elsewhere, the name with another extension or letter case, or a name that contains
/// it, nearest first.
fn nearest_paths(ws: &Workspace, path: &str) -> Vec<String> {
    let wanted = Path::new(path.trim_start_matches("./"));
    let Some(name) = wanted.file_name().map(|n| n.to_string_lossy().to_lowercase()) else {
        return Vec::new();
    };
    let stem = name.split('.').next().unwrap_or(&name).to_string();
    let wanted_dir = wanted.parent().unwrap_or(Path::new(""));
    let mut scored: Vec<(u8, String)> = Vec::new();
    for entry in walker(ws.root()).build().skip(1).take(NEAR_WALK_MAX).flatten() {
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        let Ok(rel) = entry.path().strip_prefix(ws.root()) else {
            continue;
        };
        let other = entry.file_name().to_string_lossy().to_lowercase();
        let score = if other == name {
            0
        } else if other.split('.').next() == Some(stem.as_str()) && !stem.is_empty() {
            1
        } else if stem.len() >= 3 && other.contains(stem.as_str()) {
            2
        } else {
            continue;
        };
        // The same directory first.
        let elsewhere = u8::from(rel.parent() != Some(wanted_dir));
        scored.push((score * 2 + elsewhere, rel.to_string_lossy().into_owned()));
    }
    scored.sort();
    scored.into_iter().take(5).map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::tests::scratch_workspace as ws;

    fn read_args(path: &str, offset: Option<usize>, limit: Option<usize>) -> ReadArgs {
        ReadArgs {
            path: path.into(),
            offset,
            limit,
        }
    }

    #[test]
    fn read_returns_line_ranges() {
        let (_t, w) = ws();
        std::fs::write(w.root().join("f.txt"), "one\ntwo\nthree\nfour\n").unwrap();
        assert_eq!(
            read(&w, &Seen::default(), read_args("f.txt", None, None)),
            Outcome::ok("     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour\n")
        );
        let r = read(&w, &Seen::default(), read_args("f.txt", Some(2), Some(2)));
        assert!(r.ok);
        assert_eq!(
            r.output,
            "     2\ttwo\n     3\tthree\n[lines 2-3 of 4 shown; more follow: read on with offset=4]\n"
        );
        assert!(!read(&w, &Seen::default(), read_args("f.txt", Some(9), None)).ok);
        assert!(!read(&w, &Seen::default(), read_args("missing", None, None)).ok);
        std::fs::write(w.root().join("bin"), b"a\0b").unwrap();
        assert!(
            read(&w, &Seen::default(), read_args("bin", None, None))
                .output
                .contains("binary")
        );
    }

    /// What is not a text file at the path the model gave is said plainly, with what to do:
    /// a directory's entries, the nearest paths to a missing one, an image's kind; UTF-16
    /// is decoded and Latin-1 shown with its bad bytes replaced, each with a note.
    #[test]
    fn read_says_what_a_path_is_when_it_is_not_a_text_file() {
        let (_t, w) = ws();
        let root = w.root().to_path_buf();
        std::fs::create_dir_all(root.join("src/util")).unwrap();
        std::fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
        std::fs::write(root.join("src/util/parse.rs"), "\n").unwrap();
        std::fs::write(root.join("README.md"), "hi\n").unwrap();
        let read = |path: &str| read(&w, &Seen::default(), read_args(path, None, None));

        let dir = read("src");
        assert!(!dir.ok);
        assert_eq!(
            dir.output,
            "src is a directory, not a file; its entries:\nmain.rs\t13 bytes\nutil/\n"
        );

        let missing = read("src/Main.rs");
        assert_eq!(
            missing.output,
            "src/Main.rs: no such file or directory. Did you mean: src/main.rs?"
        );
        let moved = read("parse.rs");
        assert_eq!(
            moved.output,
            "parse.rs: no such file or directory. Did you mean: src/util/parse.rs?"
        );
        let other_ext = read("readme.txt");
        assert!(
            other_ext.output.ends_with("Did you mean: README.md?"),
            "{}",
            other_ext.output
        );
        assert_eq!(
            read("nothing/like/it.zz").output,
            "nothing/like/it.zz: no such file or directory"
        );

        std::fs::write(root.join("shot.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
        let png = read("shot.png");
        assert!(!png.ok);
        assert!(
            png.output
                .contains("an image (image/png, 16 bytes), not text; look at it with view_image"),
            "{}",
            png.output
        );

        let utf16: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain("héllo\r\nwörld\r\n".encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        std::fs::write(root.join("win.rc"), utf16).unwrap();
        let decoded = read("win.rc");
        assert!(decoded.ok);
        assert!(
            decoded
                .output
                .starts_with("     1\théllo\n     2\twörld\n[win.rc is UTF-16 (little-endian) text"),
            "{}",
            decoded.output
        );

        std::fs::write(root.join("latin1.txt"), b"caf\xe9\nok\n").unwrap();
        let lossy = read("latin1.txt");
        assert!(lossy.ok);
        assert!(
            lossy
                .output
                .starts_with("     1\tcaf\u{FFFD}\n     2\tok\n[latin1.txt is not UTF-8"),
            "{}",
            lossy.output
        );
    }
}
