//! `apply_patch`: several files added, changed, moved and deleted in one call, in the patch
//! format Codex's models are trained on:
//!
//! ```text
//! *** Begin Patch
//! *** Add File: docs/new.md
//! +first line
//! *** Update File: src/lib.rs
//! *** Move to: src/core.rs
//! @@ fn main() {
//!      let x = 1;
//! -    println!("{x}");
//! +    println!("x = {x}");
//! *** Delete File: old.txt
//! *** End Patch
//! ```
//!
//! A change's lines (context ` `, removed `-`) are found in order, from after the previous
//! change (and after its `@@` line when it names one), exactly, else ignoring trailing
//! whitespace, else ignoring surrounding whitespace, else also typographic punctuation; a
//! blank line at a change's edge that the file lacks there is let go; `*** End of File`
//! anchors a change at the end. Lines keep their line ends (LF or CRLF). Every file's new content is worked out before anything is written: a patch
//! that does not apply changes nothing. Paths go through [`Workspace`] like every tool's.

use std::fmt::Write as _;

use serde::Deserialize;

use super::{Outcome, fs::Seen};
use crate::workspace::Workspace;

/// Largest file a patch rewrites.
const FILE_MAX: u64 = 16 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Args {
    /// The whole patch, `*** Begin Patch` to `*** End Patch`.
    pub(super) input: String,
}

#[derive(Debug, PartialEq)]
enum Op {
    Add {
        path: String,
        content: String,
    },
    Delete {
        path: String,
    },
    Update {
        path: String,
        move_to: Option<String>,
        chunks: Vec<Chunk>,
    },
}

#[derive(Debug, Default, PartialEq)]
struct Chunk {
    /// The `@@` line's text: a line to find first (the change is after it).
    anchor: Option<String>,
    /// The change's lines: `' '` context, `'-'` removed, `'+'` added.
    lines: Vec<(char, String)>,
    /// `*** End of File`: the change is at the end of the file.
    at_end: bool,
}

impl Chunk {
    /// The lines the change is found by (context and removed).
    fn old(&self) -> Vec<String> {
        self.lines
            .iter()
            .filter(|(k, _)| *k != '+')
            .map(|(_, l)| l.clone())
            .collect()
    }

    /// Whether each line of [`Chunk::replacement`] ends CRLF: a context line as the file's
    /// line did (`found`), an added line as the file usually does.
    fn replacement_ends(&self, found: &[bool], usual: bool) -> Vec<bool> {
        let mut old = found.iter();
        let mut out = Vec::new();
        for (kind, _) in &self.lines {
            match kind {
                '+' => out.push(usual),
                ' ' => out.push(old.next().copied().unwrap_or(usual)),
                _ => {
                    old.next();
                }
            }
        }
        out
    }

    /// The change without the blank context lines at its start and end, if it has any.
    fn without_blank_edges(&self) -> Option<Chunk> {
        let blank = |(k, l): &(char, String)| *k == ' ' && l.trim().is_empty();
        let start = self.lines.iter().position(|l| !blank(l))?;
        let end = self.lines.iter().rposition(|l| !blank(l))? + 1;
        (start > 0 || end < self.lines.len()).then(|| Chunk {
            anchor: self.anchor.clone(),
            lines: self.lines[start..end].to_vec(),
            at_end: self.at_end && end == self.lines.len(),
        })
    }

    /// What replaces `found` (the file's lines the change was found at): its context lines
    /// as the file has them (whitespace included), the added lines as the patch has them.
    fn replacement(&self, found: &[String]) -> Vec<String> {
        let mut old = found.iter();
        let mut out = Vec::new();
        for (kind, line) in &self.lines {
            match kind {
                '+' => out.push(line.clone()),
                ' ' => out.push(old.next().cloned().unwrap_or_else(|| line.clone())),
                _ => {
                    old.next();
                }
            }
        }
        out
    }
}

const BEGIN: &str = "*** Begin Patch";
const END: &str = "*** End Patch";
const ADD: &str = "*** Add File: ";
const DELETE: &str = "*** Delete File: ";
const UPDATE: &str = "*** Update File: ";
const MOVE: &str = "*** Move to: ";
const END_OF_FILE: &str = "*** End of File";

/// Parse a patch; an error names the line (1-based) and what was expected.
fn parse(text: &str) -> Result<Vec<Op>, String> {
    let mut lines: Vec<&str> = text.trim().lines().collect();
    // A shell heredoc around it (`<<'EOF'` … `EOF`), as models sometimes write it.
    if lines.first().is_some_and(|l| l.trim_start().starts_with("<<")) && lines.len() > 1 {
        lines.remove(0);
        lines.pop();
    }
    if lines.first().map(|l| l.trim()) != Some(BEGIN) {
        return Err(format!("the patch must start with the line {BEGIN:?}"));
    }
    if lines.last().map(|l| l.trim()) != Some(END) {
        return Err(format!("the patch must end with the line {END:?}"));
    }
    let body = &lines[1..lines.len() - 1];
    let mut ops = Vec::new();
    let mut i = 0;
    let at = |i: usize| i + 2;
    while i < body.len() {
        let line = body[i];
        if let Some(path) = line.strip_prefix(ADD) {
            i += 1;
            let mut content = String::new();
            while i < body.len() && !body[i].starts_with("*** ") {
                match body[i].strip_prefix('+') {
                    Some(l) => {
                        content.push_str(l);
                        content.push('\n');
                    }
                    None => return Err(format!("line {}: a line of an added file must start with '+'", at(i))),
                }
                i += 1;
            }
            ops.push(Op::Add {
                path: path.trim().to_string(),
                content,
            });
        } else if let Some(path) = line.strip_prefix(DELETE) {
            ops.push(Op::Delete {
                path: path.trim().to_string(),
            });
            i += 1;
        } else if let Some(path) = line.strip_prefix(UPDATE) {
            i += 1;
            let mut move_to = None;
            if let Some(to) = body.get(i).and_then(|l| l.strip_prefix(MOVE)) {
                move_to = Some(to.trim().to_string());
                i += 1;
            }
            let mut chunks: Vec<Chunk> = Vec::new();
            let mut current: Option<Chunk> = None;
            while i < body.len() && (!body[i].starts_with("*** ") || body[i].trim() == END_OF_FILE) {
                let l = body[i];
                if l.trim() == END_OF_FILE {
                    current.get_or_insert_with(Chunk::default).at_end = true;
                } else if let Some(anchor) = l.strip_prefix("@@") {
                    chunks.extend(current.take());
                    let anchor = anchor.trim();
                    current = Some(Chunk {
                        anchor: (!anchor.is_empty()).then(|| anchor.to_string()),
                        ..Chunk::default()
                    });
                } else {
                    let c = current.get_or_insert_with(Chunk::default);
                    match l.chars().next() {
                        Some(kind @ ('+' | '-' | ' ')) => c.lines.push((kind, l[1..].to_string())),
                        // An empty context line whose space was lost.
                        None => c.lines.push((' ', String::new())),
                        Some(_) => {
                            return Err(format!(
                                "line {}: a changed file's line must start with ' ', '-', '+' or \"@@\"",
                                at(i)
                            ));
                        }
                    }
                }
                i += 1;
            }
            chunks.extend(current.take());
            if chunks.is_empty() && move_to.is_none() {
                return Err(format!("{path}: an Update File section without changes"));
            }
            ops.push(Op::Update {
                path: path.trim().to_string(),
                move_to,
                chunks,
            });
        } else if line.trim().is_empty() {
            i += 1;
        } else {
            return Err(format!(
                "line {}: expected \"{ADD}\", \"{UPDATE}\" or \"{DELETE}\", found {line:?}",
                at(i)
            ));
        }
    }
    if ops.is_empty() {
        return Err("the patch changes no file".into());
    }
    Ok(ops)
}

/// Where `want` occurs in `lines` at or after `from` (at the end only when `at_end`): an
/// exact match first, then ignoring trailing whitespace, then surrounding whitespace, then
/// also typographic punctuation (a model's `–` or `’` for the file's `-` or `'`).
fn find(lines: &[String], want: &[String], from: usize, at_end: bool) -> Option<usize> {
    if want.len() > lines.len() {
        return None;
    }
    let passes: [fn(&str, &str) -> bool; 4] = [
        |a, b| a == b,
        |a, b| a.trim_end() == b.trim_end(),
        |a, b| a.trim() == b.trim(),
        |a, b| plain(a.trim()).eq(plain(b.trim())),
    ];
    for same in passes {
        let matches = |s: usize| lines[s..s + want.len()].iter().zip(want).all(|(a, b)| same(a, b));
        if at_end {
            let s = lines.len() - want.len();
            if s >= from && matches(s) {
                return Some(s);
            }
            continue;
        }
        if let Some(s) = (from..=lines.len() - want.len()).find(|&s| matches(s)) {
            return Some(s);
        }
    }
    None
}

/// `s`'s characters with typographic dashes, quotes and spaces as their ASCII forms.
fn plain(s: &str) -> impl Iterator<Item = char> + '_ {
    s.chars().map(|c| match c {
        '\u{2010}'..='\u{2015}' | '\u{2212}' => '-',
        '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' => '\'',
        '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' => '"',
        '\u{00A0}' | '\u{2002}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
        c => c,
    })
}

/// `text`'s lines without their ends, whether each ended with CRLF, and whether CRLF is the
/// file's usual line end (most of its ended lines), which added lines then get.
fn split_lines(text: &str) -> (Vec<String>, Vec<bool>, bool) {
    let (mut lines, mut crlf) = (Vec::new(), Vec::new());
    for piece in text.split_inclusive('\n') {
        let (line, cr) = match piece.strip_suffix('\n') {
            Some(l) => match l.strip_suffix('\r') {
                Some(l) => (l, true),
                None => (l, false),
            },
            None => (piece, false),
        };
        lines.push(line.to_string());
        crlf.push(cr);
    }
    let ended = text.matches('\n').count();
    let usual = crlf.iter().filter(|c| **c).count() * 2 > ended;
    (lines, crlf, usual)
}

/// `text` with `chunks` applied (`path` names it in errors).
/// Each line keeps its own line end (LF or CRLF); lines a change writes take the file's
/// usual one.
fn apply(path: &str, text: &str, chunks: &[Chunk]) -> Result<String, String> {
    let ends_with_newline = text.is_empty() || text.ends_with('\n');
    let (mut lines, mut crlf, usual) = split_lines(text);
    let mut cursor = 0usize;
    // Each edit: where, how many lines it replaces, its lines and whether each ends CRLF.
    let mut edits: Vec<(usize, usize, Vec<String>, Vec<bool>)> = Vec::new();
    for (k, c) in chunks.iter().enumerate() {
        if let Some(anchor) = &c.anchor {
            let one = [anchor.clone()];
            match find(&lines, &one, cursor, false) {
                Some(i) => cursor = i + 1,
                None => {
                    return Err(format!(
                        "{path}: change {}: its @@ line {anchor:?} is not in the file (after the previous change)",
                        k + 1
                    ));
                }
            }
        }
        let old = c.old();
        if old.is_empty() {
            let at = if c.anchor.is_some() && !c.at_end {
                cursor
            } else {
                lines.len()
            };
            let new = c.replacement(&[]);
            let ends = vec![usual; new.len()];
            edits.push((at, 0, new, ends));
            continue;
        }
        // A blank line around a change (often the one between two files' sections) that
        // the file does not have there is not held against it.
        let trimmed = c.without_blank_edges();
        let found = find(&lines, &old, cursor, c.at_end).map(|s| (s, c)).or_else(|| {
            let t = trimmed.as_ref()?;
            let old = t.old();
            (!old.is_empty())
                .then(|| find(&lines, &old, cursor, t.at_end))
                .flatten()
                .map(|s| (s, t))
        });
        match found {
            Some((s, c)) => {
                let len = c.old().len();
                let ends = c.replacement_ends(&crlf[s..s + len], usual);
                edits.push((s, len, c.replacement(&lines[s..s + len]), ends));
                cursor = s + len;
            }
            None => {
                let mut msg = format!(
                    "{path}: change {}: these lines are not in the file (after the previous change):\n",
                    k + 1
                );
                for l in &old {
                    let _ = writeln!(msg, "  {l}");
                }
                if let Some(first) = old.iter().find(|l| !l.trim().is_empty())
                    && let Some(i) = lines.iter().position(|l| l.trim() == first.trim())
                {
                    let _ = write!(
                        msg,
                        "Its first line is at line {}, but what follows differs: read the file again and copy the lines exactly.",
                        i + 1
                    );
                } else {
                    msg.push_str("Read the file again (read_file) and copy the lines exactly.");
                }
                return Err(msg);
            }
        }
    }
    for (at, len, new, ends) in edits.into_iter().rev() {
        crlf.splice(at..at + len, ends);
        lines.splice(at..at + len, new);
    }
    let mut out = String::with_capacity(text.len());
    for (i, (line, cr)) in lines.iter().zip(&crlf).enumerate() {
        out.push_str(line);
        if i + 1 < lines.len() || ends_with_newline {
            out.push_str(if *cr { "\r\n" } else { "\n" });
        }
    }
    Ok(out)
}

/// One file's part in a patch that applies.
enum Planned {
    Write {
        path: String,
        content: String,
        tag: char,
        added: usize,
        removed: usize,
    },
    Remove {
        path: String,
    },
}

pub(super) fn run(ws: &Workspace, seen: &Seen, a: Args) -> Outcome {
    let ops = match parse(&a.input) {
        Ok(ops) => ops,
        Err(e) => return Outcome::error(format!("the patch was not applied: {e}")),
    };
    let read = |path: &str| -> Result<String, String> {
        match ws.read_bounded(path, FILE_MAX) {
            Ok(Some(b)) => String::from_utf8(b).map_err(|_| format!("{path}: not UTF-8 text")),
            Ok(None) => Err(format!("{path}: larger than {FILE_MAX} bytes")),
            Err(e) => Err(e.0),
        }
    };
    // Everything worked out first: nothing is written unless all of it applies.
    let mut plan = Vec::new();
    let mut warnings = String::new();
    for op in &ops {
        let planned: Result<Vec<Planned>, String> = match op {
            Op::Add { path, content } => Ok(vec![Planned::Write {
                path: path.clone(),
                content: content.clone(),
                tag: 'A',
                added: content.lines().count(),
                removed: 0,
            }]),
            Op::Delete { path } => read(path).map(|_| vec![Planned::Remove { path: path.clone() }]),
            Op::Update { path, move_to, chunks } => read(path).and_then(|old| {
                warnings.push_str(&seen.changed_since(ws, path).unwrap_or_default());
                let new = apply(path, &old, chunks)?;
                let (added, removed) = counts(chunks);
                let mut parts = vec![Planned::Write {
                    path: move_to.clone().unwrap_or_else(|| path.clone()),
                    content: new,
                    tag: 'M',
                    added,
                    removed,
                }];
                if move_to.as_ref().is_some_and(|to| to != path) {
                    parts.push(Planned::Remove { path: path.clone() });
                }
                Ok(parts)
            }),
        };
        match planned {
            Ok(p) => plan.extend(p),
            Err(e) => return Outcome::error(format!("the patch was not applied; no file was changed.\n{e}")),
        }
    }
    // Where a write or removal would be refused (a symlink on the way, say), before any.
    for p in &plan {
        let (Planned::Write { path, .. } | Planned::Remove { path }) = p;
        if let Err(e) = ws.check_write(path) {
            return Outcome::error(format!("the patch was not applied; no file was changed.\n{}", e.0));
        }
    }
    let mut summary = String::new();
    for p in &plan {
        let done = match p {
            Planned::Write {
                path,
                content,
                tag,
                added,
                removed,
            } => ws.write(path, content.as_bytes()).map(|()| {
                seen.record_path(ws, path);
                format!("{tag} {path} (+{added} -{removed})\n")
            }),
            Planned::Remove { path } => ws.remove_file(path).map(|()| format!("D {path}\n")),
        };
        match done {
            Ok(line) => summary.push_str(&line),
            Err(e) => {
                return Outcome::error(format!(
                    "{summary}the patch stopped part-way: {e}\n(the files listed above were changed)"
                ));
            }
        }
    }
    Outcome::ok(format!("{warnings}Success. Updated the following files:\n{summary}"))
}

/// Lines added and removed by `chunks`.
fn counts(chunks: &[Chunk]) -> (usize, usize) {
    let of = |kind: char| chunks.iter().flat_map(|c| &c.lines).filter(|(k, _)| *k == kind).count();
    (of('+'), of('-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::tests::scratch_workspace as ws;

    fn patch(ws: &Workspace, body: &str) -> Outcome {
        run(
            ws,
            &Seen::default(),
            Args {
                input: format!("*** Begin Patch\n{body}*** End Patch\n"),
            },
        )
    }

    fn read(ws: &Workspace, p: &str) -> String {
        std::fs::read_to_string(ws.root().join(p)).unwrap()
    }

    #[test]
    fn adds_updates_moves_and_deletes_in_one_patch() {
        let (_t, w) = ws();
        std::fs::write(
            w.root().join("lib.rs"),
            "fn a() {\n    one();\n}\n\nfn b() {\n    one();\n}\n",
        )
        .unwrap();
        std::fs::write(w.root().join("old.txt"), "bye\n").unwrap();
        std::fs::write(w.root().join("m.txt"), "x\ny\n").unwrap();
        let r = patch(
            &w,
            "*** Add File: docs/new.md\n+# New\n+text\n\
             *** Update File: lib.rs\n@@ fn b() {\n-    one();\n+    two();\n\
             *** Update File: m.txt\n*** Move to: moved/m.txt\n@@\n x\n-y\n+z\n\
             *** Delete File: old.txt\n",
        );
        assert!(r.ok, "{}", r.output);
        assert_eq!(
            r.output,
            "Success. Updated the following files:\nA docs/new.md (+2 -0)\nM lib.rs (+1 -1)\nM moved/m.txt (+1 -1)\nD m.txt\nD old.txt\n"
        );
        assert_eq!(read(&w, "docs/new.md"), "# New\ntext\n");
        // The @@ line put the change in b, not a.
        assert_eq!(
            read(&w, "lib.rs"),
            "fn a() {\n    one();\n}\n\nfn b() {\n    two();\n}\n"
        );
        assert_eq!(read(&w, "moved/m.txt"), "x\nz\n");
        assert!(!w.root().join("m.txt").exists() && !w.root().join("old.txt").exists());
    }

    /// A CRLF file keeps its line ends: the lines a patch leaves alone keep theirs, and the
    /// lines it writes take the file's (a mixed file keeps each untouched line's own).
    #[test]
    fn a_crlf_file_keeps_its_line_ends() {
        let (_t, w) = ws();
        std::fs::write(w.root().join("win.txt"), "one\r\ntwo\r\nthree\r\nfour\r\n").unwrap();
        std::fs::write(w.root().join("mixed.txt"), "a\r\nb\nc\r\nd\r\n").unwrap();
        let r = patch(
            &w,
            "*** Update File: win.txt\n@@\n one\n-two\n+2\n+2b\n three\n\
             *** Update File: mixed.txt\n a\n b\n-c\n+C\n",
        );
        assert!(r.ok, "{}", r.output);
        assert_eq!(read(&w, "win.txt"), "one\r\n2\r\n2b\r\nthree\r\nfour\r\n");
        assert_eq!(read(&w, "mixed.txt"), "a\r\nb\nC\r\nd\r\n");
        // A file without a final line end keeps that too.
        std::fs::write(w.root().join("end.txt"), "x\r\ny").unwrap();
        let r = patch(&w, "*** Update File: end.txt\n-y\n+z\n");
        assert!(r.ok, "{}", r.output);
        assert_eq!(read(&w, "end.txt"), "x\r\nz");
    }

    /// What models commonly get slightly wrong still applies where it is unambiguous: a blank
    /// line between two files' sections (read as an empty context line the file lacks), and
    /// typographic dashes and quotes for the file's ASCII ones.
    #[test]
    fn a_stray_blank_line_and_typographic_punctuation_still_apply() {
        let (_t, w) = ws();
        std::fs::write(w.root().join("a.txt"), "x\nold\ny\n").unwrap();
        std::fs::write(w.root().join("b.txt"), "const s = \"it's a-b\";\nend\n").unwrap();
        let r = patch(
            &w,
            "*** Update File: a.txt\n x\n-old\n+new\n\n\
             *** Update File: b.txt\n-const s = \"it\u{2019}s a\u{2013}b\";\n+const s = \"plain\";\n end\n",
        );
        assert!(r.ok, "{}", r.output);
        assert_eq!(read(&w, "a.txt"), "x\nnew\ny\n");
        assert_eq!(read(&w, "b.txt"), "const s = \"plain\";\nend\n");
        // The blank line is still matched where the file has one.
        std::fs::write(w.root().join("c.txt"), "p\n\nq\n").unwrap();
        let r = patch(&w, "*** Update File: c.txt\n p\n \n-q\n+r\n");
        assert!(r.ok, "{}", r.output);
        assert_eq!(read(&w, "c.txt"), "p\n\nr\n");
    }

    /// A patch whose write would go through a symlink (the file or a directory on the way)
    /// is refused before any file is written: nothing changes, and the model is told where
    /// the link points.
    #[test]
    fn a_patch_through_a_symlink_changes_nothing() {
        let (_t, w) = ws();
        let root = w.root().to_path_buf();
        std::fs::create_dir_all(root.join("hooks")).unwrap();
        std::fs::write(root.join("a.txt"), "a\n").unwrap();
        std::fs::write(root.join("hooks/pre-commit"), "old\n").unwrap();
        std::os::unix::fs::symlink("hooks/pre-commit", root.join("notes.md")).unwrap();
        std::os::unix::fs::symlink("hooks", root.join("docs")).unwrap();
        for (target, says) in [
            ("notes.md", "notes.md is a symlink (to \"hooks/pre-commit\")"),
            ("docs/pre-commit", "docs is a symlink (to \"hooks\")"),
        ] {
            let r = patch(
                &w,
                &format!("*** Update File: a.txt\n@@\n-a\n+b\n*** Update File: {target}\n@@\n-old\n+evil\n"),
            );
            assert!(!r.ok, "{}", r.output);
            assert!(
                r.output.contains("no file was changed") && r.output.contains(says),
                "{}",
                r.output
            );
            assert_eq!(read(&w, "a.txt"), "a\n");
            assert_eq!(read(&w, "hooks/pre-commit"), "old\n");
        }
        let r = patch(&w, "*** Delete File: docs/pre-commit\n");
        assert!(!r.ok, "{}", r.output);
        assert!(root.join("hooks/pre-commit").exists());
    }

    #[test]
    fn context_matches_despite_whitespace_and_end_of_file_anchors() {
        let (_t, w) = ws();
        std::fs::write(w.root().join("f.py"), "def f():   \n    return 1\n\nx = 1\nx = 1\n").unwrap();
        let r = patch(&w, "*** Update File: f.py\n def f():\n-  return 1\n+    return 2\n");
        assert!(r.ok, "{}", r.output);
        let r = patch(&w, "*** Update File: f.py\n@@\n-x = 1\n+x = 2\n*** End of File\n");
        assert!(r.ok, "{}", r.output);
        assert_eq!(read(&w, "f.py"), "def f():   \n    return 2\n\nx = 1\nx = 2\n");
        // A pure addition goes at the end.
        let r = patch(&w, "*** Update File: f.py\n@@\n+y = 3\n");
        assert!(r.ok, "{}", r.output);
        assert!(read(&w, "f.py").ends_with("x = 2\ny = 3\n"));
    }

    #[test]
    fn a_patch_that_does_not_apply_changes_nothing_and_says_why() {
        let (_t, w) = ws();
        std::fs::write(w.root().join("a.txt"), "one\ntwo\n").unwrap();
        let r = patch(&w, "*** Add File: b.txt\n+new\n*** Update File: a.txt\n-three\n+four\n");
        assert!(!r.ok);
        assert!(
            r.output.contains("no file was changed") && r.output.contains("three"),
            "{}",
            r.output
        );
        assert!(!w.root().join("b.txt").exists());
        assert_eq!(read(&w, "a.txt"), "one\ntwo\n");
        let r = patch(&w, "*** Update File: missing.txt\n-a\n+b\n");
        assert!(!r.ok && r.output.contains("missing.txt"), "{}", r.output);
        let r = patch(&w, "*** Frobnicate File: a.txt\n");
        assert!(!r.ok && r.output.contains("line 2"), "{}", r.output);
        let r = run(
            &w,
            &Seen::default(),
            Args {
                input: "--- a/a.txt\n+++ b/a.txt\n".into(),
            },
        );
        assert!(!r.ok && r.output.contains(BEGIN), "{}", r.output);
        // Guarded like every write.
        let r = patch(&w, "*** Add File: .git/hooks/pre-commit\n+evil\n");
        assert!(!r.ok && r.output.contains("repository internals"), "{}", r.output);
    }

    #[test]
    fn a_heredoc_around_the_patch_is_taken_off() {
        let (_t, w) = ws();
        let r = run(
            &w,
            &Seen::default(),
            Args {
                input: "<<'EOF'\n*** Begin Patch\n*** Add File: h.txt\n+hi\n*** End Patch\nEOF\n".into(),
            },
        );
        assert!(r.ok, "{}", r.output);
        assert_eq!(read(&w, "h.txt"), "hi\n");
    }
}
