//! The walk for untracked files, as `git status -uall` lists them.

use std::{
    ffi::{CStr, CString, OsStr},
    ops::Range,
    os::{fd::OwnedFd, unix::ffi::OsStrExt},
    path::Path,
    rc::Rc,
};

use berth_protocol::RpcError;
use gix::bstr::ByteSlice;
use ignore::{
    Match,
    gitignore::{Gitignore, GitignoreBuilder, gitconfig_excludes_path},
};
use rustix::fs::{AtFlags, FileType, OFlags};

use super::{broken, index::Index};

/// Paths relative to the workspace root, as bytes.
pub(super) type RelPaths = Vec<Vec<u8>>;

/// The `.gitignore` rules in force in one directory: its own file's, then its parents'.
pub(super) struct Rules {
    own: Gitignore,
    parent: Option<Rc<Rules>>,
}

/// The walk for untracked files: what it has found so far, and what it consults.
pub(super) struct Untracked<'a> {
    root: &'a Path,
    index: &'a Index,
    /// `info/exclude`, then the user's global excludes: consulted after every `.gitignore`.
    excludes: [Gitignore; 2],
    found: Vec<Vec<u8>>,
    attributes: Vec<Vec<u8>>,
}

/// A directory being walked: its child directories not yet entered.
pub(super) struct Level {
    dir: rustix::fs::Dir,
    /// Its path relative to the root, with a trailing `/` (empty for the root).
    rel: Vec<u8>,
    /// The index entries beneath it (a contiguous run: the index is sorted by path).
    beneath: Range<usize>,
    rules: Option<Rc<Rules>>,
    subdirs: Vec<CString>,
}

impl Untracked<'_> {
    /// Whether `rel` is ignored by the rules in force, as git decides: the deepest
    /// `.gitignore` with an opinion, then `info/exclude`, then the global excludes.
    fn ignored(&self, rules: Option<&Rc<Rules>>, rel: &[u8], is_dir: bool) -> bool {
        let path = self.root.join(OsStr::from_bytes(rel));
        let chain = std::iter::successors(rules, |r| r.parent.as_ref()).map(|r| &r.own);
        for rules in chain.chain(&self.excludes) {
            match rules.matched(&path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
    }

    /// The index entries in `within` beneath directory `prefix` (which ends with `/`).
    fn beneath(&self, within: &Range<usize>, prefix: &[u8]) -> Range<usize> {
        let file = &self.index.file;
        let entries = &file.entries()[within.clone()];
        let lo = entries.partition_point(|e| e.path(file).as_bytes() < prefix);
        let len = entries[lo..].partition_point(|e| e.path(file).as_bytes().starts_with(prefix));
        within.start + lo..within.start + lo + len
    }

    fn tracked(&self, within: &Range<usize>, path: &[u8]) -> bool {
        self.entry(within, path).is_some()
    }

    fn entry(&self, within: &Range<usize>, path: &[u8]) -> Option<&gix::index::Entry> {
        let file = &self.index.file;
        let entries = &file.entries()[within.clone()];
        let at = entries.binary_search_by(|e| e.path(file).as_bytes().cmp(path)).ok()?;
        Some(&entries[at])
    }

    /// Whether the directory `path` is a submodule the index tracks (a directory where the
    /// index has a file is walked: its files are untracked, as git lists them).
    fn submodule(&self, within: &Range<usize>, path: &[u8]) -> bool {
        self.entry(within, path)
            .is_some_and(|e| e.mode == gix::index::entry::Mode::COMMIT)
    }

    /// Read one directory: its untracked files are recorded, its subdirectories that are
    /// not ignored are returned to be entered. A directory holding `.git` (other than the
    /// root) is a nested repository: one entry, `rel`, never entered.
    fn read(
        &mut self,
        fd: OwnedFd,
        rel: Vec<u8>,
        beneath: Range<usize>,
        rules: Option<Rc<Rules>>,
    ) -> Result<Level, RpcError> {
        let mut dir = rustix::fs::Dir::new(fd).map_err(walk_error)?;
        let mut names = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(walk_error)?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::Unknown => rustix::fs::statat(dir.fd().map_err(walk_error)?, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| FileType::from_raw_mode(st.st_mode))
                    .map_err(walk_error)?,
                kind => kind,
            };
            names.push((name.to_owned(), kind));
        }
        let mut level = Level {
            dir,
            rel,
            beneath,
            rules,
            subdirs: Vec::new(),
        };
        let kind_of = |n: &CStr| {
            names
                .iter()
                .find(|(name, _)| name.as_c_str() == n)
                .map(|(_, kind)| *kind)
        };
        // Nested, as git decides it: a directory the index has no file in, whose `.git` is a
        // repository (a directory with `HEAD` and `objects`) or a `gitdir:` file.
        if !level.rel.is_empty()
            && level.beneath.is_empty()
            && kind_of(c".git").is_some_and(|kind| nested_repository(&level.dir, kind))
        {
            self.found.push(std::mem::take(&mut level.rel));
            return Ok(level);
        }
        // A `.gitignore` that is a symlink is not read, as git does not read it.
        if kind_of(c".gitignore") == Some(FileType::RegularFile) {
            let dir = self.root.join(OsStr::from_bytes(&level.rel));
            level.rules = Some(Rc::new(Rules {
                own: ignore_rules(&dir, &dir.join(".gitignore")),
                parent: level.rules.take(),
            }));
        }
        let mut path = level.rel.clone();
        for (name, kind) in names {
            if name.as_c_str() == c".git" {
                continue;
            }
            path.truncate(level.rel.len());
            path.extend_from_slice(name.to_bytes());
            if kind == FileType::Directory {
                // A tracked submodule is the index's entry, never walked.
                if !self.submodule(&level.beneath, &path) && !self.ignored(level.rules.as_ref(), &path, true) {
                    level.subdirs.push(name);
                }
                continue;
            }
            // Git lists files and symlinks only: a FIFO or a socket (`app.sock`) is not one.
            if !matches!(kind, FileType::RegularFile | FileType::Symlink) {
                continue;
            }
            if name.as_c_str() == c".gitattributes" && kind == FileType::RegularFile {
                self.attributes.push(path.clone());
            }
            // Only untracked files are matched against the ignore rules, as in git.
            if !self.tracked(&level.beneath, &path) && !self.ignored(level.rules.as_ref(), &path, false) {
                self.found.push(path.clone());
            }
        }
        Ok(level)
    }
}

/// The rules of the ignore file `file`, for paths relative to `root`, as git matches them
/// (a file that cannot be read has none). Git's patterns have no `{a,b}` alternation, while
/// the `ignore` crate's globs do: a brace outside a `[…]` class is escaped so that it
/// matches itself (`*.{tmp,bak}` ignores a file of that very name, as git does, and
/// `{{cookiecutter.slug}}/` a directory of that name).
fn ignore_rules(root: &Path, file: &Path) -> Gitignore {
    let Ok(text) = std::fs::read(file) else {
        return Gitignore::empty();
    };
    let mut rules = GitignoreBuilder::new(root);
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        let line = String::from_utf8_lossy(line);
        let line = line.strip_suffix('\r').unwrap_or(&line);
        // A leading byte-order mark is not part of the first pattern.
        let line = if i == 0 {
            line.trim_start_matches('\u{feff}')
        } else {
            line
        };
        let _ = rules.add_line(Some(file.to_path_buf()), &literal_braces(line));
    }
    rules.build().unwrap_or_else(|_| Gitignore::empty())
}

/// `line` with each brace outside a character class (and not escaped already) escaped.
fn literal_braces(line: &str) -> std::borrow::Cow<'_, str> {
    if !line.contains(['{', '}']) {
        return line.into();
    }
    let mut out = String::with_capacity(line.len() + 4);
    let mut chars = line.chars();
    let mut class = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                out.push(c);
                out.extend(chars.next());
            }
            '[' if !class => {
                class = true;
                out.push(c);
            }
            ']' if class => {
                class = false;
                out.push(c);
            }
            '{' | '}' if !class => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out.into()
}

/// Whether the `.git` of kind `kind` in `dir` makes it a repository of its own.
fn nested_repository(dir: &rustix::fs::Dir, kind: FileType) -> bool {
    use std::io::Read;
    let Ok(fd) = dir.fd() else { return false };
    let is = |path: &CStr, want: FileType| {
        rustix::fs::statat(fd, path, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == want)
    };
    match kind {
        FileType::Directory => is(c".git/HEAD", FileType::RegularFile) && is(c".git/objects", FileType::Directory),
        FileType::RegularFile => {
            let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
            let Ok(file) = rustix::fs::openat(fd, c".git", flags, rustix::fs::Mode::empty()) else {
                return false;
            };
            let mut head = [0u8; 8];
            std::fs::File::from(file).read_exact(&mut head).is_ok() && &head == b"gitdir: "
        }
        _ => false,
    }
}

pub(super) fn walk_error(e: rustix::io::Errno) -> RpcError {
    broken(std::io::Error::from(e))
}

/// Files that are neither tracked nor ignored (sorted), as `git status -uall` lists them,
/// and the `.gitattributes` files seen on the way. A nested repository is one entry
/// (`dir/`), never entered.
///
/// Each directory is read once through a descriptor opened beneath its parent's without
/// following symlinks; a file is looked up only among the index entries of its own
/// directory, and only untracked files are matched against the ignore rules.
/// `excludes_file`: `core.excludesFile` as the repository's configuration sets it (None:
/// git's default, `$XDG_CONFIG_HOME/git/ignore`).
pub(super) fn untracked(
    root: &Path,
    exclude_file: &Path,
    excludes_file: Option<&Path>,
    index: &Index,
) -> Result<(RelPaths, RelPaths), RpcError> {
    // A missing `info/exclude` excludes nothing.
    let exclude = ignore_rules(root, exclude_file);
    let global = match excludes_file.map(Path::to_path_buf).or_else(gitconfig_excludes_path) {
        Some(file) => ignore_rules(root, &file),
        None => Gitignore::empty(),
    };
    let mut walk = Untracked {
        root,
        index,
        excludes: [exclude, global],
        found: Vec::new(),
        attributes: Vec::new(),
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = rustix::fs::open(root, flags, rustix::fs::Mode::empty()).map_err(walk_error)?;
    let mut stack = vec![walk.read(fd, Vec::new(), 0..index.file.entries().len(), None)?];
    while let Some(top) = stack.last_mut() {
        let Some(name) = top.subdirs.pop() else {
            stack.pop();
            continue;
        };
        let fd = match rustix::fs::openat(
            top.dir.fd().map_err(walk_error)?,
            &*name,
            flags | OFlags::NOFOLLOW,
            rustix::fs::Mode::empty(),
        ) {
            Ok(fd) => fd,
            // A directory the worker may not read (a volume owned by another user) is left
            // out, as git leaves it out with a warning; one gone meanwhile has nothing.
            Err(rustix::io::Errno::ACCESS | rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(walk_error(e)),
        };
        let mut rel = top.rel.clone();
        rel.extend_from_slice(name.to_bytes());
        rel.push(b'/');
        let beneath = walk.beneath(&top.beneath, &rel);
        let rules = top.rules.clone();
        let level = walk.read(fd, rel, beneath, rules)?;
        stack.push(level);
    }
    walk.found.sort();
    Ok((walk.found, walk.attributes))
}
