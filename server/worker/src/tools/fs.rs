//! File tools: read (line ranges), write, edit (exact replacement), list. Every path goes
//! through [`Workspace`].

use std::io::{BufRead, BufReader, Read};

use serde::Deserialize;

use super::Outcome;
use crate::workspace::Workspace;

/// Bytes of file text one read returns at most; the rest is reached with `offset`.
const READ_MAX: usize = 256 << 10;
const READ_LINES_DEFAULT: usize = 2000;
/// Largest file `edit_file` rewrites.
const EDIT_MAX: u64 = 16 << 20;
/// Entries one listing returns at most.
const LIST_MAX: usize = 1000;

#[derive(Deserialize)]
pub(super) struct ReadArgs {
    path: String,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}

pub(super) fn read(ws: &Workspace, a: ReadArgs) -> Outcome {
    let file = match ws.open_file(&a.path) {
        Ok(f) => f,
        Err(e) => return Outcome::error(e.0),
    };
    let first = a.offset.unwrap_or(1).max(1);
    let limit = a.limit.unwrap_or(READ_LINES_DEFAULT).max(1);
    let mut reader = BufReader::new(file);
    let mut out = String::new();
    let mut line = Vec::new();
    let mut n = 0usize;
    loop {
        line.clear();
        // Bound one line too: a huge single-line file must not fill memory.
        let read = match (&mut reader).take(READ_MAX as u64 + 1).read_until(b'\n', &mut line) {
            Ok(r) => r,
            Err(e) => return Outcome::error(format!("{}: {e}", a.path)),
        };
        if read == 0 {
            break;
        }
        n += 1;
        if n < first {
            continue;
        }
        if line.contains(&0) {
            return Outcome::error(format!("{}: a binary file", a.path));
        }
        let Ok(text) = std::str::from_utf8(&line) else {
            return Outcome::error(format!("{}: not UTF-8 text", a.path));
        };
        if n >= first + limit || out.len() + text.len() > READ_MAX {
            out.push_str(&format!("\n[more lines follow: continue with offset={n}]"));
            return Outcome::ok(out);
        }
        out.push_str(text);
    }
    if n < first && n > 0 {
        return Outcome::error(format!("{}: has {n} lines; offset {first} is past the end", a.path));
    }
    Outcome::ok(out)
}

#[derive(Deserialize)]
pub(super) struct WriteArgs {
    path: String,
    content: String,
}

pub(super) fn write(ws: &Workspace, a: WriteArgs) -> Outcome {
    match ws.write(&a.path, a.content.as_bytes()) {
        Ok(()) => Outcome::ok(format!("wrote {} bytes to {}", a.content.len(), a.path)),
        Err(e) => Outcome::error(e.0),
    }
}

#[derive(Deserialize)]
pub(super) struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
}

pub(super) fn edit(ws: &Workspace, a: EditArgs) -> Outcome {
    if a.old_string.is_empty() {
        return Outcome::error("old_string is empty; use write_file to create a file");
    }
    let bytes = match ws.read_bounded(&a.path, EDIT_MAX) {
        Ok(Some(b)) => b,
        Ok(None) => return Outcome::error(format!("{}: larger than {EDIT_MAX} bytes", a.path)),
        Err(e) => return Outcome::error(e.0),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return Outcome::error(format!("{}: not UTF-8 text", a.path));
    };
    let found = text.matches(&a.old_string).count();
    match found {
        0 => return Outcome::error(format!("{}: old_string not found", a.path)),
        1 => {}
        n => {
            return Outcome::error(format!(
                "{}: old_string occurs {n} times; include more surrounding text so it matches once",
                a.path
            ));
        }
    }
    let updated = text.replacen(&a.old_string, &a.new_string, 1);
    match ws.write(&a.path, updated.as_bytes()) {
        Ok(()) => Outcome::ok(format!("edited {}", a.path)),
        Err(e) => Outcome::error(e.0),
    }
}

#[derive(Deserialize)]
pub(super) struct ListArgs {
    #[serde(default)]
    path: Option<String>,
}

pub(super) fn list(ws: &Workspace, a: ListArgs) -> Outcome {
    let path = a.path.unwrap_or_else(|| ".".into());
    let entries = match ws.list(&path) {
        Ok(e) => e,
        Err(e) => return Outcome::error(e.0),
    };
    let total = entries.len();
    let mut out = String::new();
    for e in entries.iter().filter(|e| e.name != ".git").take(LIST_MAX) {
        match e.kind {
            "dir" => out.push_str(&format!("{}/\n", e.name)),
            "file" => out.push_str(&format!("{}\t{} bytes\n", e.name, e.size)),
            kind => out.push_str(&format!("{}\t{kind}\n", e.name)),
        }
    }
    if total > LIST_MAX {
        out.push_str(&format!("[{} more entries not shown]\n", total - LIST_MAX));
    }
    if out.is_empty() {
        out.push_str("(empty directory)\n");
    }
    Outcome::ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws() -> (tempfile::TempDir, Workspace) {
        let t = tempfile::tempdir().unwrap();
        let w = Workspace::open(t.path()).unwrap();
        (t, w)
    }

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
            read(&w, read_args("f.txt", None, None)),
            Outcome::ok("one\ntwo\nthree\nfour\n")
        );
        let r = read(&w, read_args("f.txt", Some(2), Some(2)));
        assert!(r.ok);
        assert_eq!(r.output, "two\nthree\n\n[more lines follow: continue with offset=4]");
        assert!(!read(&w, read_args("f.txt", Some(9), None)).ok);
        assert!(!read(&w, read_args("missing", None, None)).ok);
        std::fs::write(w.root().join("bin"), b"a\0b").unwrap();
        assert!(read(&w, read_args("bin", None, None)).output.contains("binary"));
    }

    #[test]
    fn write_creates_directories() {
        let (_t, w) = ws();
        let r = write(
            &w,
            WriteArgs {
                path: "a/b/c.txt".into(),
                content: "hi".into(),
            },
        );
        assert!(r.ok, "{r:?}");
        assert_eq!(std::fs::read_to_string(w.root().join("a/b/c.txt")).unwrap(), "hi");
    }

    #[test]
    fn edit_refuses_missing_and_ambiguous_matches_and_says_which() {
        let (_t, w) = ws();
        std::fs::write(w.root().join("f"), "alpha beta alpha gamma").unwrap();
        let e = |old: &str, new: &str| EditArgs {
            path: "f".into(),
            old_string: old.into(),
            new_string: new.into(),
        };
        let missing = edit(&w, e("delta", "x"));
        assert!(!missing.ok && missing.output.contains("not found"), "{missing:?}");
        let ambiguous = edit(&w, e("alpha", "x"));
        assert!(
            !ambiguous.ok && ambiguous.output.contains("occurs 2 times"),
            "{ambiguous:?}"
        );
        assert_eq!(
            std::fs::read_to_string(w.root().join("f")).unwrap(),
            "alpha beta alpha gamma"
        );
        assert!(edit(&w, e("beta", "BETA")).ok);
        assert_eq!(
            std::fs::read_to_string(w.root().join("f")).unwrap(),
            "alpha BETA alpha gamma"
        );
    }

    #[test]
    fn list_hides_git_and_shows_kinds() {
        let (_t, w) = ws();
        std::fs::create_dir(w.root().join(".git")).unwrap();
        std::fs::create_dir(w.root().join("src")).unwrap();
        std::fs::write(w.root().join("x"), "abc").unwrap();
        let r = list(&w, ListArgs { path: None });
        assert_eq!(r.output, "src/\nx\t3 bytes\n");
    }
}
