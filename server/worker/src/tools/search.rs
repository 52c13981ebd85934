//! `search_files`: a regular expression over the workspace's files. The walk (`ignore`)
//! respects .gitignore and never follows symlinks; every file is opened again through
//! [`Workspace`], so a path swapped meanwhile cannot lead outside.

use std::io::{BufRead, BufReader, Read};

use ignore::overrides::OverrideBuilder;
use serde::Deserialize;

use super::Outcome;
use crate::workspace::Workspace;

const MATCHES_MAX: usize = 200;
/// Bytes of one matching line shown.
const LINE_SHOWN: usize = 300;
/// Files larger than this are skipped.
const FILE_MAX: u64 = 8 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Args {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    glob: Option<String>,
}

pub(super) fn search(ws: &Workspace, a: Args) -> Outcome {
    let re = match regex::RegexBuilder::new(&a.pattern).size_limit(1 << 20).build() {
        Ok(r) => r,
        Err(e) => return Outcome::error(format!("invalid pattern: {e}")),
    };
    let base = a.path.as_deref().unwrap_or(".");
    // One file named: search it alone (its path, as given, names it in the answer).
    if let Ok(file) = ws.open_file(base)
        && file.metadata().is_ok_and(|m| m.is_file())
    {
        let mut out = String::new();
        search_file(file, base, &re, &mut out, &mut 0);
        if out.is_empty() {
            out.push_str("no matches\n");
        }
        return Outcome::ok(out);
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
    let mut out = String::new();
    let mut count = 0usize;
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
        if search_file(file, &rel, &re, &mut out, &mut count) {
            break;
        }
    }
    if count == 0 {
        out.push_str("no matches\n");
    }
    Outcome::ok(out)
}

/// Search one file (named `rel` in the answer) for `re`, appending `path:line:text` lines to
/// `out`; true once `count` reaches the most matches shown (the note is written then).
fn search_file(file: std::fs::File, rel: &str, re: &regex::Regex, out: &mut String, count: &mut usize) -> bool {
    if file.metadata().map(|m| m.len()).unwrap_or(u64::MAX) > FILE_MAX {
        return false;
    }
    let mut reader = BufReader::new(file.take(FILE_MAX));
    let mut line = Vec::new();
    let mut n = 0usize;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
        n += 1;
        if line.contains(&0) {
            return false; // binary
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if re.is_match(text) {
            let shown = berth_protocol::text::prefix(text, LINE_SHOWN);
            out.push_str(&format!("{rel}:{n}:{shown}\n"));
            *count += 1;
            if *count >= MATCHES_MAX {
                out.push_str(&format!(
                    "[stopped after {MATCHES_MAX} matches: narrow the pattern, path or glob]\n"
                ));
                return true;
            }
        }
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
            pattern: "need+le".into(),
            path: path.map(Into::into),
            glob: glob.map(Into::into),
        };
        let r = search(&ws, args(None, None));
        assert_eq!(r.output, "src/a.rs:2:// needle here\nsrc/b.txt:1:needle too\n");
        let r = search(&ws, args(Some("*.rs"), None));
        assert_eq!(r.output, "src/a.rs:2:// needle here\n");
        assert!(!search(&ws, args(None, Some("out"))).ok);
        assert!(!search(&ws, args(None, Some(".."))).ok);
        let bad = search(
            &ws,
            Args {
                pattern: "(".into(),
                path: None,
                glob: None,
            },
        );
        assert!(bad.output.starts_with("invalid pattern"));
    }
}
