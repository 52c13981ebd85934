//! File tools: read (numbered lines), write, edit (exact replacement, once or everywhere),
//! list (a directory, or a tree to a depth) and glob. Every path goes through
//! [`Workspace`].
//!
//! What a tool returns is what the model reads: each result fits the model's share of a tool
//! result ([`crate::model::messages::TOOL_OUTPUT_SHOWN`]) by itself, and says where it
//! stopped and how to go on, so nothing is cut out of its middle unannounced.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Mutex,
    time::SystemTime,
};

use serde::Deserialize;

use super::Outcome;
use crate::workspace::Workspace;

/// Characters of one line shown; a longer line is cut (and says so), so a read always
/// advances, a minified file's one line included.
pub(super) const LINE_CHARS_MAX: usize = 2000;
/// Largest file `edit_file` rewrites.
pub(super) const EDIT_MAX: u64 = 16 << 20;
/// Entries one listing, and paths one glob, return at most.
const LIST_MAX: usize = 500;
/// The deepest tree `list_directory` draws.
const DEPTH_MAX: usize = 6;
/// Lines of the changed region an edit shows back.
const SNIPPET_LINES: usize = 24;
/// Bytes of a nested `AGENTS.md` shown with the first file read or written under it.
const AGENTS_MAX: usize = 8 << 10;

/// What this turn's model has seen of the workspace's files: each file's size and
/// modification time when it last read or wrote it (a later write warns when the file
/// changed since), and the nested `AGENTS.md` files already shown to it.
#[derive(Default)]
pub(crate) struct Seen {
    files: Mutex<HashMap<PathBuf, Stamp>>,
    agents: Mutex<HashSet<PathBuf>>,
}

type Stamp = (u64, Option<SystemTime>);

fn stamp(meta: &std::fs::Metadata) -> Stamp {
    (meta.len(), meta.modified().ok())
}

impl Seen {
    pub(super) fn record(&self, rel: PathBuf, meta: &std::fs::Metadata) {
        self.files.lock().expect("seen lock").insert(rel, stamp(meta));
    }

    pub(super) fn record_path(&self, ws: &Workspace, path: &str) {
        if let (Ok(rel), Ok(file)) = (ws.normalized(path), ws.open_file(path))
            && let Ok(meta) = file.metadata()
        {
            self.record(rel, &meta);
        }
    }

    /// A warning when `path` changed since the model last read or wrote it (None: it did
    /// not, or the model never looked at it).
    pub(super) fn changed_since(&self, ws: &Workspace, path: &str) -> Option<String> {
        let rel = ws.normalized(path).ok()?;
        let seen = *self.files.lock().expect("seen lock").get(&rel)?;
        let now = ws.open_file(path).ok()?.metadata().ok()?;
        (stamp(&now) != seen).then(|| {
            format!("Note: {path} changed on disk since you last read it (another process, or a command you ran).\n")
        })
    }

    /// The nested `AGENTS.md` files (below the root's, which the system prompt holds) that
    /// apply to `path` and were not shown yet, as a note to append to a tool's result.
    pub(super) fn agents_notes(&self, ws: &Workspace, path: &str) -> String {
        let Ok(rel) = ws.normalized(path) else {
            return String::new();
        };
        let mut out = String::new();
        let mut dir = PathBuf::new();
        let parents: Vec<_> = rel.parent().map(|p| p.components().collect()).unwrap_or_default();
        for c in parents {
            dir.push(c);
            let file = dir.join("AGENTS.md");
            if !self.agents.lock().expect("seen lock").insert(file.clone()) {
                continue;
            }
            let name = file.to_string_lossy().into_owned();
            if let Ok(Some(bytes)) = ws.read_bounded(&name, AGENTS_MAX as u64 * 4) {
                let text = String::from_utf8_lossy(&bytes);
                let shown = berth_protocol::text::prefix(&text, AGENTS_MAX);
                out.push_str(&format!(
                    "\n\n[Instructions from {name}, which apply to files under {}/:]\n{shown}",
                    dir.display()
                ));
                if shown.len() < text.len() {
                    out.push_str("\n[… the rest of it was cut; read it with read_file]");
                }
            }
        }
        out
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WriteArgs {
    path: String,
    content: String,
}

pub(super) fn write(ws: &Workspace, seen: &Seen, a: WriteArgs) -> Outcome {
    let warning = seen.changed_since(ws, &a.path).unwrap_or_default();
    if let Err(e) = ws.write(&a.path, a.content.as_bytes()) {
        return Outcome::error(e.0);
    }
    seen.record_path(ws, &a.path);
    let lines = a.content.lines().count();
    let notes = seen.agents_notes(ws, &a.path);
    Outcome::ok(format!(
        "{warning}wrote {} ({} bytes, {lines} lines){notes}",
        a.path,
        a.content.len()
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

pub(super) fn edit(ws: &Workspace, seen: &Seen, a: EditArgs) -> Outcome {
    if a.old_string.is_empty() {
        return Outcome::error("old_string is empty; use write_file to create a file");
    }
    if a.old_string == a.new_string {
        return Outcome::error("old_string and new_string are the same: there is nothing to change");
    }
    let bytes = match ws.read_bounded(&a.path, EDIT_MAX) {
        Ok(Some(b)) => b,
        Ok(None) => return Outcome::error(format!("{}: larger than {EDIT_MAX} bytes", a.path)),
        Err(e) => return Outcome::error(e.0),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return Outcome::error(format!("{}: not UTF-8 text", a.path));
    };
    // A CRLF file is matched and written with CRLF: read_file shows lines without their
    // ends, so the model writes `\n`.
    let (old_string, new_string) = if mostly_crlf(&text) {
        (crlf(&a.old_string), crlf(&a.new_string))
    } else {
        (a.old_string.clone(), a.new_string.clone())
    };
    let starts: Vec<usize> = text.match_indices(&old_string).map(|(i, _)| i).collect();
    let (updated, at, new_len, count, loose) = match starts.len() {
        0 => match loose_matches(&text, &old_string).as_slice() {
            [] => return Outcome::error(not_found(&a.path, &text, &a.old_string)),
            [m] => {
                let new = m.reindent(&new_string);
                let updated = format!("{}{new}{}", &text[..m.start], &text[m.end..]);
                let note = format!(
                    " (old_string matched {} when each line's leading and trailing whitespace is ignored{})",
                    m.lines(&text),
                    if new == new_string {
                        ""
                    } else {
                        "; new_string was indented as the file is there"
                    }
                );
                (updated, m.start, new.len(), 1, note)
            }
            many => {
                let lines: Vec<String> = many
                    .iter()
                    .take(10)
                    .map(|m| line_of(&text, m.start).to_string())
                    .collect();
                return Outcome::error(format!(
                    "{}: old_string is not in the file exactly; ignoring whitespace it matches {} places (at lines {}). Read the file again and copy the text exactly, with more surrounding lines",
                    a.path,
                    many.len(),
                    lines.join(", ")
                ));
            }
        },
        1 => (
            text.replacen(&old_string, &new_string, 1),
            starts[0],
            new_string.len(),
            1,
            String::new(),
        ),
        n if !a.replace_all => {
            let lines: Vec<String> = starts.iter().take(10).map(|&i| line_of(&text, i).to_string()).collect();
            return Outcome::error(format!(
                "{}: old_string occurs {n} times (at lines {}); include more surrounding text so it matches once, or set replace_all to change every one",
                a.path,
                lines.join(", ")
            ));
        }
        n => (
            text.replace(&old_string, &new_string),
            starts[0],
            new_string.len(),
            n,
            String::new(),
        ),
    };
    let warning = seen.changed_since(ws, &a.path).unwrap_or_default();
    if let Err(e) = ws.write(&a.path, updated.as_bytes()) {
        return Outcome::error(e.0);
    }
    seen.record_path(ws, &a.path);
    // Where the first replacement landed, in the new text.
    let snippet = numbered_region(&updated, at, at + new_len);
    let notes = seen.agents_notes(ws, &a.path);
    Outcome::ok(format!(
        "{warning}edited {}: {count} replacement{}{loose}. The file now reads:\n{snippet}{notes}",
        a.path,
        if count == 1 { "" } else { "s" }
    ))
}

/// Whether most of `text`'s line ends are CRLF.
pub(super) fn mostly_crlf(text: &str) -> bool {
    text.matches("\r\n").count() * 2 > text.matches('\n').count()
}

/// `s` with every bare `\n` as `\r\n`.
fn crlf(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 16);
    let mut prev = '\0';
    for c in s.chars() {
        if c == '\n' && prev != '\r' {
            out.push('\r');
        }
        out.push(c);
        prev = c;
    }
    out
}

/// Where `old` matches whole lines of a file when each line's surrounding whitespace is
/// ignored: the bytes it covers, and the indentation the model's first line had and the
/// file's has.
#[derive(Debug, PartialEq)]
struct Loose {
    start: usize,
    end: usize,
    model_indent: String,
    file_indent: String,
}

impl Loose {
    /// `new` indented as the file is where `old` matched: each line that starts with the
    /// model's indentation of old_string's first line starts with the file's instead.
    fn reindent(&self, new: &str) -> String {
        if self.model_indent == self.file_indent {
            return new.to_string();
        }
        new.split_inclusive('\n')
            .map(|line| match line.strip_prefix(self.model_indent.as_str()) {
                Some(rest) if !line.trim().is_empty() => format!("{}{rest}", self.file_indent),
                _ => line.to_string(),
            })
            .collect()
    }

    /// "line N" or "lines N–M".
    fn lines(&self, text: &str) -> String {
        let (first, last) = (
            line_of(text, self.start),
            line_of(text, self.end.max(self.start + 1) - 1),
        );
        if first == last {
            format!("line {first}")
        } else {
            format!("lines {first}–{last}")
        }
    }
}

fn indent(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// Every place `old` matches whole lines of `text` ignoring each line's leading and trailing
/// whitespace (at most 11; none for an old_string of blank lines).
fn loose_matches(text: &str, old: &str) -> Vec<Loose> {
    let ends_line = old.ends_with('\n');
    let want: Vec<&str> = old
        .strip_suffix('\n')
        .unwrap_or(old)
        .split('\n')
        .map(str::trim)
        .collect();
    let Some(first) = want.iter().position(|l| !l.is_empty()) else {
        return Vec::new();
    };
    let model_indent = indent(old.split('\n').nth(first).unwrap_or_default()).to_string();
    // Each line's start and its end without and with its line end.
    let mut spans = Vec::new();
    let mut at = 0;
    for piece in text.split_inclusive('\n') {
        let bare = piece.trim_end_matches(['\n', '\r']).len();
        spans.push((at, at + bare, at + piece.len()));
        at += piece.len();
    }
    let mut found = Vec::new();
    for i in 0..spans.len().saturating_sub(want.len() - 1) {
        let same = want
            .iter()
            .enumerate()
            .all(|(k, w)| text[spans[i + k].0..spans[i + k].1].trim() == *w);
        if same {
            let last = spans[i + want.len() - 1];
            found.push(Loose {
                start: spans[i].0,
                end: if ends_line { last.2 } else { last.1 },
                model_indent: model_indent.clone(),
                file_indent: indent(&text[spans[i + first].0..spans[i + first].1]).to_string(),
            });
            if found.len() > 10 {
                break;
            }
        }
    }
    found
}

/// The 1-based line number of byte `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// The lines of `text` around bytes `start..end`, numbered, two lines of context each side,
/// at most [`SNIPPET_LINES`].
fn numbered_region(text: &str, start: usize, end: usize) -> String {
    let first = line_of(text, start).saturating_sub(2).max(1);
    let last = line_of(text, end.min(text.len())) + 2;
    let mut out = String::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .skip(first - 1)
        .take((last + 1 - first).min(SNIPPET_LINES))
    {
        let shown: String = line.chars().take(LINE_CHARS_MAX).collect();
        out.push_str(&format!("{:>6}\t{shown}\n", i + 1));
    }
    if last + 1 - first > SNIPPET_LINES {
        out.push_str("[…]\n");
    }
    out
}

/// Why `old` was not found in `text`, with the nearest candidate: the same lines apart from
/// whitespace, else the line its first line is on (trimmed).
fn not_found(path: &str, text: &str, old: &str) -> String {
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let want: Vec<String> = old.lines().map(squash).filter(|l| !l.is_empty()).collect();
    let lines: Vec<&str> = text.lines().collect();
    let mut hint = String::new();
    if let Some(first) = want.first() {
        let found = (0..lines.len()).find(|&i| {
            let mut got = lines[i..].iter().map(|l| squash(l)).filter(|l| !l.is_empty());
            want.iter().all(|w| got.next().as_deref() == Some(w.as_str()))
        });
        if let Some(i) = found {
            let span = old.lines().count().max(1);
            let shown: Vec<String> = lines[i..(i + span).min(lines.len())]
                .iter()
                .enumerate()
                .map(|(k, l)| format!("{:>6}\t{l}", i + k + 1))
                .collect();
            hint = format!(
                " The same text apart from whitespace (indentation, line breaks) is at line {}:\n{}\nCopy it exactly, with its whitespace.",
                i + 1,
                shown.join("\n")
            );
        } else if let Some(i) = lines.iter().position(|l| squash(l).contains(first.as_str())) {
            hint = format!(
                " Its first line is at line {}:\n{:>6}\t{}\nbut what follows differs; read the file again and copy the text exactly.",
                i + 1,
                i + 1,
                lines[i]
            );
        }
    }
    if hint.is_empty() {
        hint = " Nothing like it is in the file; read the file again (read_file) and copy the text exactly.".into();
    }
    format!("{path}: old_string not found.{hint}")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListArgs {
    #[serde(default)]
    pub(super) path: Option<String>,
    /// Levels below `path` drawn (1: its entries only).
    #[serde(default)]
    pub(super) depth: Option<usize>,
}

pub(super) fn list(ws: &Workspace, a: ListArgs) -> Outcome {
    let path = a.path.unwrap_or_else(|| ".".into());
    let depth = a.depth.unwrap_or(1).clamp(1, DEPTH_MAX);
    if depth > 1 {
        return tree(ws, &path, depth);
    }
    let entries = match ws.list(&path) {
        Ok(e) => e,
        Err(e) => return Outcome::error(e.0),
    };
    let entries: Vec<_> = entries.iter().filter(|e| !hidden_dir(&e.name)).collect();
    let total = entries.len();
    let mut out = String::new();
    for e in entries.iter().take(LIST_MAX) {
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

/// Directories no listing or walk shows: git's and Berth's.
fn hidden_dir(name: &str) -> bool {
    name == ".git" || name == crate::workspace::PRIVATE_DIR
}

/// A walk of the workspace below `start` (an absolute path inside it) that respects
/// `.gitignore`, shows hidden files, never follows symlinks and skips `.git` and `.berth`.
pub(super) fn walker(start: &Path) -> ignore::WalkBuilder {
    let mut walk = ignore::WalkBuilder::new(start);
    walk.follow_links(false)
        .hidden(false)
        .require_git(false)
        .filter_entry(|e| !hidden_dir(&e.file_name().to_string_lossy()) && !crate::workspace::is_secret(e.path()))
        .sort_by_file_name(|a, b| a.cmp(b));
    walk
}

/// `list_directory` to a depth: an indented tree (gitignored entries left out).
fn tree(ws: &Workspace, path: &str, depth: usize) -> Outcome {
    let start = match ws.dir_path(path) {
        Ok(p) => p,
        Err(e) => return Outcome::error(e.0),
    };
    let mut walk = walker(&start);
    walk.max_depth(Some(depth));
    let mut out = String::new();
    let mut shown = 0usize;
    let mut more = 0usize;
    for entry in walk.build().skip(1) {
        let Ok(entry) = entry else { continue };
        if shown >= LIST_MAX {
            more += 1;
            continue;
        }
        let indent = "  ".repeat(entry.depth().saturating_sub(1));
        let name = entry.file_name().to_string_lossy();
        let line = match entry.file_type() {
            Some(t) if t.is_dir() => format!("{indent}{name}/\n"),
            Some(t) if t.is_symlink() => format!("{indent}{name}\tsymlink\n"),
            _ => {
                let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
                format!("{indent}{name}\t{size} bytes\n")
            }
        };
        out.push_str(&line);
        shown += 1;
    }
    if more > 0 {
        out.push_str(&format!(
            "[{more} more entries not shown: list a subdirectory, or less deep]\n"
        ));
    }
    if out.is_empty() {
        out.push_str("(empty directory)\n");
    }
    Outcome::ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GlobArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

/// `glob`: the workspace's files whose path (relative to `path`) matches the pattern, most
/// recently modified first (gitignored files left out).
pub(super) fn glob(ws: &Workspace, a: GlobArgs) -> Outcome {
    let base = a.path.as_deref().unwrap_or(".");
    let start = match ws.dir_path(base) {
        Ok(p) => p,
        Err(e) => return Outcome::error(e.0),
    };
    let mut o = ignore::overrides::OverrideBuilder::new(&start);
    let built = o.add(&a.pattern).and_then(|o| o.build());
    let overrides = match built {
        Ok(ov) => ov,
        Err(e) => return Outcome::error(format!("invalid glob: {e}")),
    };
    let mut walk = walker(&start);
    walk.overrides(overrides);
    let mut found: Vec<(Option<SystemTime>, String)> = Vec::new();
    for entry in walk.build() {
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        let Ok(rel) = entry.path().strip_prefix(ws.root()) else {
            continue;
        };
        let modified = entry.metadata().ok().and_then(|m| m.modified().ok());
        found.push((modified, rel.to_string_lossy().into_owned()));
    }
    if found.is_empty() {
        return Outcome::ok(format!("no files match {}\n", a.pattern));
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let total = found.len();
    let mut out: String = found.iter().take(LIST_MAX).map(|(_, p)| format!("{p}\n")).collect();
    if total > LIST_MAX {
        out.push_str(&format!(
            "[{} more files not shown: narrow the pattern or the path]\n",
            total - LIST_MAX
        ));
    }
    Outcome::ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::tests::scratch_workspace as ws;

    #[test]
    fn write_creates_directories() {
        let (_t, w) = ws();
        let r = write(
            &w,
            &Seen::default(),
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
            replace_all: false,
        };
        let seen = Seen::default();
        let edit = |a| edit(&w, &seen, a);
        let missing = edit(e("delta", "x"));
        assert!(!missing.ok && missing.output.contains("not found"), "{missing:?}");
        let ambiguous = edit(e("alpha", "x"));
        assert!(
            !ambiguous.ok && ambiguous.output.contains("occurs 2 times (at lines 1, 1)"),
            "{ambiguous:?}"
        );
        assert_eq!(
            std::fs::read_to_string(w.root().join("f")).unwrap(),
            "alpha beta alpha gamma"
        );
        assert!(edit(e("beta", "BETA")).ok);
        assert_eq!(
            std::fs::read_to_string(w.root().join("f")).unwrap(),
            "alpha BETA alpha gamma"
        );
    }

    /// A CRLF file: the model's `\n` lines (as read_file shows them) match, and what it
    /// writes gets the file's CRLF; the file's other lines are untouched.
    #[test]
    fn edit_matches_and_keeps_a_crlf_files_line_ends() {
        let (_t, w) = ws();
        std::fs::write(w.root().join("win.txt"), "fn a() {\r\n    one();\r\n}\r\n").unwrap();
        let r = edit(
            &w,
            &Seen::default(),
            EditArgs {
                path: "win.txt".into(),
                old_string: "fn a() {\n    one();\n".into(),
                new_string: "fn a() {\n    one();\n    two();\n".into(),
                replace_all: false,
            },
        );
        assert!(r.ok, "{r:?}");
        assert_eq!(
            std::fs::read(w.root().join("win.txt")).unwrap(),
            b"fn a() {\r\n    one();\r\n    two();\r\n}\r\n"
        );
    }

    /// Whitespace drift in old_string (indentation, trailing spaces) still edits when it
    /// matches one place, with new_string indented as the file is there, and says so; where
    /// it matches several places nothing changes.
    #[test]
    fn edit_tolerates_whitespace_drift_where_it_matches_once() {
        let (_t, w) = ws();
        let file = "impl A {\n        fn f() {\n            go();  \n        }\n}\n";
        std::fs::write(w.root().join("a.rs"), file).unwrap();
        let seen = Seen::default();
        let e = |old: &str, new: &str| EditArgs {
            path: "a.rs".into(),
            old_string: old.into(),
            new_string: new.into(),
            replace_all: false,
        };
        let r = edit(
            &w,
            &seen,
            e(
                "    fn f() {\n        go();\n",
                "    fn f() {\n        stop();\n        go();\n",
            ),
        );
        assert!(r.ok, "{r:?}");
        assert!(
            r.output
                .contains("matched lines 2–3 when each line's leading and trailing whitespace is ignored")
                && r.output.contains("indented as the file is"),
            "{}",
            r.output
        );
        assert_eq!(
            std::fs::read_to_string(w.root().join("a.rs")).unwrap(),
            "impl A {\n        fn f() {\n            stop();\n            go();\n        }\n}\n"
        );
        // Two places match loosely: refused, with both lines named.
        std::fs::write(w.root().join("a.rs"), "  x = 1\ny\n    x = 1\n").unwrap();
        let r = edit(&w, &seen, e(" x = 1 \n", "x = 2\n"));
        assert!(!r.ok && r.output.contains("matches 2 places (at lines 1, 3)"), "{r:?}");
        assert_eq!(
            std::fs::read_to_string(w.root().join("a.rs")).unwrap(),
            "  x = 1\ny\n    x = 1\n"
        );
    }

    #[test]
    fn list_hides_git_and_shows_kinds() {
        let (_t, w) = ws();
        std::fs::create_dir(w.root().join(".git")).unwrap();
        std::fs::create_dir(w.root().join("src")).unwrap();
        std::fs::write(w.root().join("x"), "abc").unwrap();
        let r = list(
            &w,
            ListArgs {
                path: None,
                depth: None,
            },
        );
        assert_eq!(r.output, "src/\nx\t3 bytes\n");
    }
}
