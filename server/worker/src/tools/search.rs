//! `search_files`: a regular expression over the workspace's files. The walk (`ignore`)
//! respects .gitignore and never follows symlinks; every file is opened again through
//! [`Workspace`], so a path swapped meanwhile cannot lead outside.
//!
//! It answers as `rg -n` does: `path:line:text` for a matching line and, with `context`,
//! `path-line-text` for the lines around it and `--` between groups apart; with
//! `files_only`, the matching files with their count of matching lines.

use std::{
    collections::VecDeque,
    io::{BufRead, BufReader, Read},
};

use ignore::overrides::OverrideBuilder;
use serde::Deserialize;

use super::Outcome;
use crate::workspace::Workspace;

const MATCHES_MAX: usize = 200;
/// Bytes of one line shown.
const LINE_SHOWN: usize = 300;
/// Bytes of answer at most (within the model's share of one tool result).
const OUTPUT_MAX: usize = 24 << 10;
/// Files larger than this are skipped.
const FILE_MAX: u64 = 8 << 20;
/// Lines of context around a match at most.
const CONTEXT_MAX: usize = 10;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Args {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    glob: Option<String>,
    #[serde(default)]
    ignore_case: bool,
    #[serde(default)]
    context: Option<usize>,
    #[serde(default)]
    files_only: bool,
}

/// What one search has written, and whether it must stop.
#[derive(Default)]
struct Found {
    out: String,
    matches: usize,
    files: usize,
    /// Why the search stopped early, once it did.
    stopped: Option<String>,
}

impl Found {
    fn answer(mut self) -> Outcome {
        if self.matches == 0 {
            self.out.push_str("no matches\n");
        }
        if let Some(why) = self.stopped.take() {
            self.out.push_str(&why);
        }
        Outcome::ok(self.out)
    }

    fn push(&mut self, line: &str) {
        if self.stopped.is_some() {
            return;
        }
        if self.out.len() + line.len() > OUTPUT_MAX {
            self.stopped = Some(format!(
                "[stopped at {} KiB of answer, after {} matches in {} files: narrow the pattern, path or glob]\n",
                OUTPUT_MAX >> 10,
                self.matches,
                self.files,
            ));
            return;
        }
        self.out.push_str(line);
    }

    fn matched(&mut self) {
        self.matches += 1;
        if self.matches >= MATCHES_MAX && self.stopped.is_none() {
            self.stopped = Some(format!(
                "[stopped after {MATCHES_MAX} matches: narrow the pattern, path or glob, or ask for files_only]\n"
            ));
        }
    }
}

pub(super) fn search(ws: &Workspace, a: Args) -> Outcome {
    let re = match regex::RegexBuilder::new(&a.pattern)
        .case_insensitive(a.ignore_case)
        .size_limit(1 << 20)
        .build()
    {
        Ok(r) => r,
        Err(e) => return Outcome::error(format!("invalid pattern: {e}")),
    };
    let how = How {
        re,
        context: a.context.unwrap_or(0).min(CONTEXT_MAX),
        files_only: a.files_only,
    };
    let mut found = Found::default();
    let base = a.path.as_deref().unwrap_or(".");
    // One file named: search it alone (its path, as given, names it in the answer).
    if let Ok(file) = ws.open_file(base)
        && file.metadata().is_ok_and(|m| m.is_file())
    {
        search_file(file, base, &how, &mut found);
        return found.answer();
    }
    let start = match ws.dir_path(base) {
        Ok(p) => p,
        Err(e) => return Outcome::error(e.0),
    };
    // Hidden files and directories are searched (`.github/`, `.env.example`), `.git` and
    // Berth's own state never; `.gitignore` is respected.
    let mut walk = super::fs::walker(&start);
    if let Some(glob) = &a.glob {
        let mut o = OverrideBuilder::new(&start);
        let built = o.add(glob).and_then(|o| o.build());
        match built {
            Ok(ov) => {
                walk.overrides(ov);
            }
            Err(e) => return Outcome::error(format!("invalid glob: {e}")),
        }
    }
    for entry in walk.build() {
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        let Ok(rel) = entry.path().strip_prefix(ws.root()) else {
            continue;
        };
        let rel = rel.to_string_lossy().into_owned();
        let Ok(file) = ws.open_file(&rel) else { continue };
        search_file(file, &rel, &how, &mut found);
        if found.stopped.is_some() {
            break;
        }
    }
    found.answer()
}

/// How to search: the expression, the lines of context around a match, or only the files.
struct How {
    re: regex::Regex,
    context: usize,
    files_only: bool,
}

/// Search one file (named `rel` in the answer), writing what it finds to `found`.
fn search_file(file: std::fs::File, rel: &str, how: &How, found: &mut Found) {
    if file.metadata().map(|m| m.len()).unwrap_or(u64::MAX) > FILE_MAX {
        return;
    }
    let mut reader = BufReader::new(file.take(FILE_MAX));
    let mut line = Vec::new();
    let mut n = 0usize;
    // The lines before the current one not yet shown (with context), and how many lines
    // after the last match are still to be shown.
    let mut before: VecDeque<(usize, String)> = VecDeque::new();
    let mut after = 0usize;
    let mut last_shown = 0usize;
    let mut in_file = 0usize;
    let mut group = String::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        n += 1;
        if line.contains(&0) {
            return; // binary: nothing of it shown
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if how.re.is_match(text) {
            in_file += 1;
            if in_file == 1 {
                found.files += 1;
            }
            if how.files_only {
                continue;
            }
            // A group apart from the last one shown is set off by `--`.
            let first = before.front().map_or(n, |(m, _)| *m);
            if how.context > 0 && last_shown > 0 && first > last_shown + 1 {
                group.push_str("--\n");
            }
            for (m, t) in before.drain(..) {
                group.push_str(&format!("{rel}-{m}-{t}\n"));
            }
            group.push_str(&format!(
                "{rel}:{n}:{}\n",
                berth_protocol::text::prefix(text, LINE_SHOWN)
            ));
            found.push(&std::mem::take(&mut group));
            found.matched();
            last_shown = n;
            after = how.context;
        } else if after > 0 {
            after -= 1;
            found.push(&format!(
                "{rel}-{n}-{}\n",
                berth_protocol::text::prefix(text, LINE_SHOWN)
            ));
            last_shown = n;
        } else if how.context > 0 {
            before.push_back((n, berth_protocol::text::prefix(text, LINE_SHOWN).to_string()));
            if before.len() > how.context {
                before.pop_front();
            }
        }
        if found.stopped.is_some() {
            break;
        }
    }
    if how.files_only && in_file > 0 {
        found.matches += in_file;
        let s = if in_file == 1 { "" } else { "s" };
        found.push(&format!("{rel}: {in_file} matching line{s}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn respects_gitignore_globs_and_stays_inside() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("ws");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(root.join("target")).unwrap();
        std::fs::write(root.join(".gitignore"), "target/\n").unwrap();
        std::fs::write(root.join("src/a.rs"), "fn main() {}\n// needle here\n").unwrap();
        std::fs::write(root.join("src/b.txt"), "needle too\n").unwrap();
        std::fs::write(root.join("target/c.rs"), "needle ignored\n").unwrap();
        std::fs::create_dir_all(t.path().join("outside")).unwrap();
        std::fs::write(t.path().join("outside/d.rs"), "needle outside\n").unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), root.join("out")).unwrap();
        let ws = Workspace::open(&root).unwrap();
        let args = |glob: Option<&str>, path: Option<&str>| Args {
            path: path.map(Into::into),
            glob: glob.map(Into::into),
            ..pattern("need+le")
        };
        let r = search(&ws, args(None, None));
        assert_eq!(r.output, "src/a.rs:2:// needle here\nsrc/b.txt:1:needle too\n");
        let r = search(&ws, args(Some("*.rs"), None));
        assert_eq!(r.output, "src/a.rs:2:// needle here\n");
        assert!(!search(&ws, args(None, Some("out"))).ok);
        assert!(!search(&ws, args(None, Some(".."))).ok);
        let bad = search(&ws, pattern("("));
        assert!(bad.output.starts_with("invalid pattern"));
    }

    fn pattern(p: &str) -> Args {
        Args {
            pattern: p.into(),
            path: None,
            glob: None,
            ignore_case: false,
            context: None,
            files_only: false,
        }
    }

    /// Case folded on request; lines around each match with `context` (as `rg -C`: `-` for
    /// context, `:` for a match, `--` between groups apart); only the files with
    /// `files_only`; and an answer that stops within its size, saying so.
    #[test]
    fn ignore_case_context_files_only_and_a_bounded_answer() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let text: String = (1..=20)
            .map(|i| {
                if i == 5 || i == 6 || i == 15 {
                    format!("Hit {i}\n")
                } else {
                    format!("line {i}\n")
                }
            })
            .collect();
        std::fs::write(root.join("a.txt"), &text).unwrap();
        std::fs::write(root.join("b.txt"), "hit\nhit\nmiss\n").unwrap();
        let ws = Workspace::open(root).unwrap();
        assert_eq!(search(&ws, pattern("hit")).output, "b.txt:1:hit\nb.txt:2:hit\n");
        let folded = search(
            &ws,
            Args {
                ignore_case: true,
                ..pattern("hit")
            },
        );
        assert_eq!(folded.output.lines().count(), 5, "{}", folded.output);
        let around = search(
            &ws,
            Args {
                context: Some(1),
                path: Some("a.txt".into()),
                ..pattern("Hit")
            },
        );
        assert_eq!(
            around.output,
            "a.txt-4-line 4\na.txt:5:Hit 5\na.txt:6:Hit 6\na.txt-7-line 7\n--\na.txt-14-line 14\na.txt:15:Hit 15\na.txt-16-line 16\n"
        );
        let files = search(
            &ws,
            Args {
                ignore_case: true,
                files_only: true,
                ..pattern("hit")
            },
        );
        assert_eq!(files.output, "a.txt: 3 matching lines\nb.txt: 2 matching lines\n");
        // Long matching lines: the answer stops within its bound and says where.
        let long: String = (0..150).map(|i| format!("needle {i} {}\n", "x".repeat(290))).collect();
        std::fs::write(root.join("c.txt"), long).unwrap();
        let big = search(&ws, pattern("needle"));
        assert!(big.output.len() <= OUTPUT_MAX + 200, "{}", big.output.len());
        assert!(
            big.output.ends_with("narrow the pattern, path or glob]\n"),
            "{}",
            &big.output[big.output.len() - 200..]
        );
        assert!(big.output.contains("[stopped at 24 KiB of answer, after "));
    }
}
