//! The one place that confines paths to a workspace. Every tool (and later every file
//! read answered for a client) opens, reads, writes and lists through [`Workspace`].
//!
//! Resolution happens inside the kernel relative to a directory handle of the workspace
//! root (`cap-std`: `openat2` with `RESOLVE_BENEATH` where available, otherwise a
//! component-by-component walk with `O_NOFOLLOW`). So `..`, absolute paths elsewhere and
//! symlinks that lead out are refused at the moment of use: there is no separate check a
//! swapped-in symlink could slip past.
//!
//! The model's tools go through the methods here that take its `&str` paths, and those keep
//! it away from two places inside the workspace (a prompt-injected model must not read or
//! plant what it should not): Berth's own state (`.berth/`: a data directory with
//! credentials, the workspace's skills and MCP configuration) is neither read nor written,
//! and neither are repository internals (any `.git`: hooks and configuration run code
//! later, and the configuration may hold credentials). The check is made on the path as given and again, after the open, on the path
//! the kernel actually opened (`/proc/self/fd`), so a symlink inside the workspace that
//! points there does not get round it. Berth reads its own files under `.berth/` with
//! [`Workspace::read_private`] and [`Workspace::list_private`].

use std::{
    ffi::OsStr,
    io::{self, Read},
    os::fd::{AsFd, AsRawFd},
    path::{Component, Path, PathBuf},
};

use cap_std::{ambient_authority, fs::Dir};

/// Paths on this machine that hold Berth's own credentials and settings (`berth login`'s
/// credential, data directories, the configuration and the files it names): never read or
/// listed for the model or for clients, even where a workspace holds them (one served from a
/// home directory). Set once, when the worker starts ([`keep_out`]).
static SECRETS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();

/// Keep the workspaces away from `secrets` (absolute paths, each by its real path where it
/// exists). One that holds a served workspace is not kept out (it would close the
/// workspace itself); the workspace's files there stay open, as its own.
pub(crate) fn keep_out(secrets: &[PathBuf], workspaces: &[PathBuf]) {
    let kept: Vec<PathBuf> = secrets
        .iter()
        .filter(|s| !workspaces.iter().any(|w| w.starts_with(s)))
        .cloned()
        .collect();
    if SECRETS.set(kept).is_err() {
        tracing::debug!("the paths kept out of the workspaces were set already");
    }
}

/// Whether the real path `real` is one of Berth's own secrets, or lies under one.
pub(crate) fn is_secret(real: &Path) -> bool {
    SECRETS.get().is_some_and(|s| s.iter().any(|p| real.starts_with(p)))
}

/// Why a path was refused or an operation on it failed: a sentence the model reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct PathError(pub String);

impl PathError {
    /// Whether the path named nothing (as [`fs_error`] words it).
    pub(crate) fn is_not_found(&self) -> bool {
        self.0.ends_with(": no such file or directory")
    }
}

pub(crate) struct Workspace {
    root: PathBuf,
    dir: Dir,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace").field("root", &self.root).finish()
    }
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: &'static str,
    pub size: u64,
}

/// Berth's private directory in a workspace.
pub(crate) const PRIVATE_DIR: &str = ".berth";

/// What a tool does to a path, for [`Workspace`]'s guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// Why the model may not do `access` to the relative path `rel` (lexically normalized), if
/// it may not.
fn refused(rel: &Path, access: Access) -> Option<&'static str> {
    for c in rel.components() {
        let Component::Normal(c) = c else { continue };
        if named(c, PRIVATE_DIR) {
            return Some("Berth's private state (.berth/) is not open to tools");
        }
        if named(c, ".git") {
            // Read, its configuration would reach the model, the provider and the session's
            // history, and it may hold credentials (a remote's URL, an `extraheader`).
            return Some(match access {
                Access::Read => "repository internals (.git) are not read by tools: use git through the shell",
                Access::Write => "repository internals (.git) are not written by tools",
            });
        }
    }
    None
}

/// Whether the relative path `rel` lies in a repository's internals (any `.git` on the way).
fn in_git(rel: &Path) -> bool {
    rel.components()
        .any(|c| matches!(c, Component::Normal(c) if named(c, ".git")))
}

/// Whether the path component `c` is `name`, as a case-insensitive file system may take it.
fn named(c: &OsStr, name: &str) -> bool {
    c.as_encoded_bytes().eq_ignore_ascii_case(name.as_bytes())
}

/// The kernel's name for what `fd` is (None where `/proc` cannot say).
fn kernel_path(fd: impl AsFd) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd())).ok()
}

/// `rel` in `dir` opened for `access` (reading, or writing without creating or truncating),
/// non-blocking: opening a FIFO would otherwise wait for the other end.
fn open_nonblocking(dir: &Dir, rel: &Path, access: Access) -> io::Result<std::fs::File> {
    use cap_std::fs::OpenOptionsExt;
    let mut options = cap_std::fs::OpenOptions::new();
    match access {
        Access::Read => options.read(true),
        Access::Write => options.write(true),
    };
    options.custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    Ok(dir.open_with(rel, &options)?.into_std())
}

/// `rel` with `.` and `..` resolved lexically (the caller has refused climbs above the root).
fn normalized(rel: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(c) => out.push(c),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

impl Workspace {
    /// Refuse `access` to the model's `path` (relative `rel`) by its name.
    fn guard(&self, path: &str, rel: &Path, access: Access) -> Result<(), PathError> {
        match refused(&normalized(rel), access) {
            Some(why) => Err(PathError(format!("{path}: {why}"))),
            None => Ok(()),
        }
    }

    /// Refuse `access` to what `fd` (just opened for the model's `path`) really is: the
    /// kernel's name for it, so a symlink inside the workspace that leads to a guarded place
    /// is refused too. Where `/proc` cannot say, the check by name stands alone.
    fn guard_opened(&self, path: &str, fd: impl AsFd, access: Access) -> Result<(), PathError> {
        let Some(real) = kernel_path(fd) else {
            return Ok(());
        };
        if is_secret(&real) {
            return Err(PathError(format!(
                "{path}: holds Berth's own credentials or settings, which are not open to tools"
            )));
        }
        match real.strip_prefix(&self.root) {
            Ok(rel) => match refused(rel, access) {
                Some(why) => Err(PathError(format!("{path}: {why}"))),
                None => Ok(()),
            },
            // Opened beneath the root, so always under it; anything else is not the model's.
            Err(_) => Err(outside(path)),
        }
    }

    /// Open the workspace rooted at `root` (canonicalized, so absolute paths under it are
    /// recognised).
    pub(crate) fn open(root: &Path) -> io::Result<Workspace> {
        let root = root.canonicalize()?;
        let dir = Dir::open_ambient_dir(&root, ambient_authority())?;
        Ok(Workspace { root, dir })
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The model's path as a path relative to the root. Absolute paths must lie under the
    /// root; a path whose `..` climbs above the root is refused here already (the kernel
    /// would refuse it too; this gives the clearer message).
    pub(crate) fn relative(&self, path: &str) -> Result<PathBuf, PathError> {
        if path.contains('\0') {
            return Err(PathError(format!("{path:?}: a path cannot contain NUL")));
        }
        let p = Path::new(path);
        let rel = if p.is_absolute() {
            match p.strip_prefix(&self.root) {
                Ok(r) => r.to_path_buf(),
                Err(_) => return Err(outside(path)),
            }
        } else {
            p.to_path_buf()
        };
        let mut depth = 0usize;
        for c in rel.components() {
            match c {
                Component::Normal(_) => depth += 1,
                Component::CurDir => {}
                Component::ParentDir if depth > 0 => depth -= 1,
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => return Err(outside(path)),
            }
        }
        if rel.as_os_str().is_empty() {
            return Ok(PathBuf::from("."));
        }
        Ok(rel)
    }

    /// The model's path as a normalized relative path (`.` and `..` resolved), the key a
    /// tool remembers a file by.
    pub(crate) fn normalized(&self, path: &str) -> Result<PathBuf, PathError> {
        Ok(normalized(&self.relative(path)?))
    }

    /// Remove the model's file `path` (never a directory; never Berth's state or a
    /// repository's internals).
    pub(crate) fn remove_file(&self, path: &str) -> Result<(), PathError> {
        let rel = normalized(&self.relative(path)?);
        self.guard(path, &rel, Access::Write)?;
        let name = rel
            .file_name()
            .ok_or_else(|| PathError(format!("{path}: is a directory")))?;
        let dir = self
            .dir_for_write(path, rel.parent(), false)?
            .ok_or_else(|| PathError(format!("{path}: No such file or directory")))?;
        dir.remove_file(name).map_err(|e| fs_error(path, &e))
    }

    /// Whether [`Workspace::write`] of `path` would be refused, and why (without writing or
    /// creating anything): for a change of several files worked out before any is written.
    pub(crate) fn check_write(&self, path: &str) -> Result<(), PathError> {
        let rel = normalized(&self.relative(path)?);
        let Some(name) = rel.file_name() else {
            return Err(PathError(format!("{path}: is a directory")));
        };
        self.guard(path, &rel, Access::Write)?;
        // Directories still to be created hold no symlink.
        let Some(dir) = self.dir_for_write(path, rel.parent(), false)? else {
            return Ok(());
        };
        match dir.symlink_metadata(name) {
            Ok(m) if m.file_type().is_symlink() => Err(symlink_refused(path, &dir, name)),
            _ => Ok(()),
        }
    }

    /// Open a file for the model to read, confined to the workspace (and not Berth's).
    pub(crate) fn open_file(&self, path: &str) -> Result<std::fs::File, PathError> {
        self.open_to(path, Access::Read)
    }

    /// The regular file at the model's `path`, opened for reading if the model may `access`
    /// it (by its name and by what it really is).
    fn open_to(&self, path: &str, access: Access) -> Result<std::fs::File, PathError> {
        let rel = self.relative(path)?;
        self.guard(path, &rel, access)?;
        let file = open_nonblocking(&self.dir, &rel, access).map_err(|e| fs_error(path, &e))?;
        self.regular_file(path, file, access)
    }

    /// `file`, just opened for the model's `path`, if the model may `access` what it really
    /// is and it is a regular file.
    fn regular_file(&self, path: &str, file: std::fs::File, access: Access) -> Result<std::fs::File, PathError> {
        self.guard_opened(path, &file, access)?;
        let meta = file.metadata().map_err(|e| fs_error(path, &e))?;
        if meta.is_dir() {
            return Err(PathError(format!("{path}: is a directory")));
        }
        if !meta.is_file() {
            return Err(PathError(format!("{path}: is not a regular file")));
        }
        Ok(file)
    }

    /// Read at most `max` bytes of a file for the model (`None` if it is longer).
    pub(crate) fn read_bounded(&self, path: &str, max: u64) -> Result<Option<Vec<u8>>, PathError> {
        read_at_most(path, self.open_file(path)?, max)
    }

    /// Berth's own read of its file `path` under `.berth/` (a skill, the MCP configuration):
    /// at most `max` bytes (`None` if it is longer).
    pub(crate) fn read_private(&self, path: &str, max: u64) -> Result<Option<Vec<u8>>, PathError> {
        let rel = self.private_relative(path)?;
        let file = self.dir.open(&rel).map_err(|e| fs_error(path, &e))?.into_std();
        self.guard_private(path, &file)?;
        read_at_most(path, file, max)
    }

    /// Berth's own listing of its directory `path` under `.berth/`.
    pub(crate) fn list_private(&self, path: &str) -> Result<Vec<Entry>, PathError> {
        let rel = self.private_relative(path)?;
        let dir = self.dir.open_dir(&rel).map_err(|e| fs_error(path, &e))?;
        self.guard_private(path, &dir)?;
        entries(path, &dir)
    }

    /// Refuse what `fd`, opened for Berth's own read of `path`, really is unless it is under
    /// `.berth/` and not in a repository's internals: a skill's `SKILL.md` that a repository
    /// made a symlink to `.git/config` would otherwise reach the model through `read_skill`
    /// (and its first line every client through `skill.list`).
    fn guard_private(&self, path: &str, fd: impl AsFd) -> Result<(), PathError> {
        let Some(real) = kernel_path(fd) else {
            return Ok(());
        };
        let private = real
            .strip_prefix(&self.root)
            .is_ok_and(|rel| rel.starts_with(PRIVATE_DIR) && !in_git(rel));
        if private {
            Ok(())
        } else {
            Err(PathError(format!(
                "{path}: leads out of {PRIVATE_DIR}/ (through a symlink)"
            )))
        }
    }

    fn private_relative(&self, path: &str) -> Result<PathBuf, PathError> {
        let rel = self.relative(path)?;
        if !normalized(&rel).starts_with(PRIVATE_DIR) {
            return Err(PathError(format!("{path}: not under {PRIVATE_DIR}/")));
        }
        Ok(rel)
    }

    /// Write a whole file for the model (creating missing parent directories), confined to
    /// the workspace, never into Berth's state or a repository's internals.
    ///
    /// The path is resolved lexically first (`a/../b` is `b`), so a `..` never climbs out of
    /// a symlinked directory. Each parent is opened, or created and opened, under the one
    /// before and checked as what it really is before anything is created in it; the file
    /// is opened without following a symlink and checked before it is truncated. A name
    /// that is a symlink is not written (the model is told where it points): nothing is
    /// written or created through a symlink, so a dangling one cannot plant a file under
    /// `.git` or `.berth`, and an approved write is of the file it names.
    pub(crate) fn write(&self, path: &str, contents: &[u8]) -> Result<(), PathError> {
        let rel = normalized(&self.relative(path)?);
        let Some(name) = rel.file_name() else {
            return Err(PathError(format!("{path}: is a directory")));
        };
        self.guard(path, &rel, Access::Write)?;
        let dir = self
            .dir_for_write(path, rel.parent(), true)?
            .ok_or_else(|| PathError(format!("{path}: its directory could not be created")))?;
        let mut file = self.open_for_write(path, &dir, name)?;
        file.set_len(0).map_err(|e| fs_error(path, &e))?;
        io::Write::write_all(&mut file, contents).map_err(|e| fs_error(path, &e))
    }

    /// The directory `parent` (normalized, relative to the root) for a write of the model's
    /// `path`: each component opened under the one before, never through a symlink (the
    /// model is told where it points), or created there when missing (with `create`; else
    /// None), and checked as what it really is before the next is opened or created in it.
    fn dir_for_write(&self, path: &str, parent: Option<&Path>, create: bool) -> Result<Option<Dir>, PathError> {
        let mut dir = self.dir.try_clone().map_err(|e| fs_error(path, &e))?;
        for c in parent.into_iter().flat_map(Path::components) {
            let Component::Normal(name) = c else { continue };
            let next = match open_dir_nofollow(&dir, name) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound && !create => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match dir.create_dir(name) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(fs_error(path, &e)),
                    }
                    // A name that exists but does not open (a dangling symlink) fails here.
                    open_dir_nofollow(&dir, name).map_err(|e| refused_dir(path, &dir, name, &e))?
                }
                Err(e) => return Err(refused_dir(path, &dir, name, &e)),
            };
            self.guard_opened(path, &next, Access::Write)?;
            dir = next;
        }
        Ok(Some(dir))
    }

    /// `name` in `dir` opened for writing (created if missing, never truncated here) and
    /// checked as what it really is; a regular file only.
    fn open_for_write(&self, path: &str, dir: &Dir, name: &OsStr) -> Result<std::fs::File, PathError> {
        use rustix::fs::{Mode, OFlags};
        // Non-blocking: opening a FIFO for writing would otherwise wait for a reader.
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let file = match rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o666)) {
            Ok(fd) => std::fs::File::from(fd),
            // The name is a symlink: never written through, so that what a person approves
            // ("write notes.md") is the file written, not one the link leads to (a hook
            // under a `core.hooksPath` in the worktree, say).
            Err(rustix::io::Errno::LOOP) => {
                // One that leads out of the workspace, into a guarded place or to what is
                // not a file is refused for that; the model is told where others point.
                match open_nonblocking(dir, Path::new(name), Access::Write) {
                    Ok(file) => drop(self.regular_file(path, file, Access::Write)?),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(fs_error(path, &e)),
                }
                return Err(symlink_refused(path, dir, name));
            }
            Err(e) => return Err(fs_error(path, &e.into())),
        };
        self.regular_file(path, file, Access::Write)
    }

    /// A directory's entries for the model, sorted by name (symlinks are entries, never
    /// followed).
    pub(crate) fn list(&self, path: &str) -> Result<Vec<Entry>, PathError> {
        let rel = self.relative(path)?;
        self.guard(path, &rel, Access::Read)?;
        let dir = self.dir.open_dir(&rel).map_err(|e| fs_error(path, &e))?;
        self.guard_opened(path, &dir, Access::Read)?;
        entries(path, &dir)
    }

    /// Check that `path` names a directory inside the workspace the model may read; returns
    /// its absolute path (for walkers, whose every file is then opened again through
    /// [`Workspace::open_file`]).
    pub(crate) fn dir_path(&self, path: &str) -> Result<PathBuf, PathError> {
        let rel = self.relative(path)?;
        self.guard(path, &rel, Access::Read)?;
        let dir = self.dir.open_dir(&rel).map_err(|e| fs_error(path, &e))?;
        self.guard_opened(path, &dir, Access::Read)?;
        // The directory's real path (checked inside the workspace above): a walk from `a/..`
        // or through a symlinked directory then names what it meets as what it is, so the
        // paths kept out of reach are recognised there too.
        Ok(kernel_path(&dir).unwrap_or_else(|| self.root.join(normalized(&rel))))
    }
}

/// `name` in `dir` opened as a directory, never through a symlink.
fn open_dir_nofollow(dir: &Dir, name: &OsStr) -> io::Result<Dir> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::empty()).map_err(io::Error::from)?;
    Ok(Dir::from_std_file(std::fs::File::from(fd)))
}

/// The model's write of `path` refused at `name` in `dir`, a symlink: where it points
/// (one that leads out of the workspace is refused as such, its target unsaid).
fn symlink_refused(path: &str, dir: &Dir, name: &OsStr) -> PathError {
    if let Err(e) = dir.metadata(name)
        && e.kind() != io::ErrorKind::NotFound
    {
        return fs_error(path, &e);
    }
    let target = rustix::fs::readlinkat(dir, name, Vec::new())
        .map(|t| t.to_string_lossy().into_owned())
        .unwrap_or_default();
    PathError(format!(
        "{path}: {} is a symlink (to {target:?}); write the path it points to instead",
        name.to_string_lossy()
    ))
}

/// Why the directory `name` in `dir` on the way to `path` did not open: a symlink is named
/// as such, anything else as the error.
fn refused_dir(path: &str, dir: &Dir, name: &OsStr, e: &io::Error) -> PathError {
    match dir.symlink_metadata(name) {
        Ok(m) if m.file_type().is_symlink() => symlink_refused(path, dir, name),
        _ => fs_error(path, e),
    }
}

fn read_at_most(path: &str, file: std::fs::File, max: u64) -> Result<Option<Vec<u8>>, PathError> {
    let mut buf = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| fs_error(path, &e))?;
    Ok((buf.len() as u64 <= max).then_some(buf))
}

/// The entries of `dir` (the model's `path`), sorted by name.
fn entries(path: &str, dir: &Dir) -> Result<Vec<Entry>, PathError> {
    let mut out = Vec::new();
    for e in dir.entries().map_err(|e| fs_error(path, &e))? {
        let e = e.map_err(|e| fs_error(path, &e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let (kind, size) = match e.metadata() {
            Ok(m) => {
                let ft = m.file_type();
                let kind = if ft.is_symlink() {
                    "symlink"
                } else if ft.is_dir() {
                    "dir"
                } else if ft.is_file() {
                    "file"
                } else {
                    "other"
                };
                (kind, if ft.is_file() { m.len() } else { 0 })
            }
            Err(_) => ("other", 0),
        };
        out.push(Entry { name, kind, size });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn outside(path: &str) -> PathError {
    PathError(format!(
        "{path}: outside the workspace (paths are relative to the workspace root)"
    ))
}

/// A filesystem error as the model should read it; escapes say so plainly.
fn fs_error(path: &str, e: &io::Error) -> PathError {
    // cap-std reports a resolution that would leave the root as PermissionDenied
    // ("a path led outside of the filesystem"); openat2 reports EXDEV.
    let escape = e.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error())
        || e.to_string().contains("outside of the filesystem");
    if escape {
        return PathError(format!(
            "{path}: leads outside the workspace (through `..` or a symlink)"
        ));
    }
    match e.kind() {
        io::ErrorKind::NotFound => PathError(format!("{path}: no such file or directory")),
        io::ErrorKind::PermissionDenied => PathError(format!("{path}: permission denied")),
        _ => PathError(format!("{path}: {e}")),
    }
}

/// A file or directory opened for a client (`files.*`): the handle, and the metadata that
/// proves it is what the path named when it was looked up without following its last
/// component.
pub(crate) struct Opened<T> {
    pub(crate) handle: T,
    pub(crate) meta: cap_std::fs::Metadata,
}

/// Why a client's path could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// Nothing there.
    Absent,
    /// The last component is a symlink (a leaf: never followed).
    Symlink,
    /// Not the kind asked for (a directory for a file, a device, …).
    WrongKind,
    /// Resolution would leave the workspace (`..`, or a symlink on the way).
    Outside,
    /// What was opened lies in a repository's `.git` or in Berth's `.berth`, however the
    /// path led there (a symlink on the way, say): never listed or read for clients.
    Private,
    /// The path changed between the lookup and the open.
    Raced,
    Io(io::Error),
}

impl OpenError {
    fn from_io(e: io::Error) -> OpenError {
        if e.raw_os_error() == Some(rustix::io::Errno::XDEV.raw_os_error())
            || e.to_string().contains("outside of the filesystem")
        {
            return OpenError::Outside;
        }
        match e.kind() {
            io::ErrorKind::NotFound => OpenError::Absent,
            _ if e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) => OpenError::Absent,
            _ => OpenError::Io(e),
        }
    }
}

/// What [`Workspace::not_private`] keeps closed.
#[derive(Clone, Copy)]
enum Private {
    /// Any `.git` and Berth's `.berth`.
    All,
    /// Any `.git` only.
    Git,
}

/// Client paths (`files.*`): exact relative bytes; a symlink as the last component is a
/// leaf, never followed; symlinks on the way are followed only while they stay inside.
impl Workspace {
    /// Metadata of `rel` without following its last component.
    pub(crate) fn lstat(&self, rel: &Path) -> Result<cap_std::fs::Metadata, OpenError> {
        self.dir.symlink_metadata(rel).map_err(OpenError::from_io)
    }

    /// The target of the symlink `rel` (never followed).
    pub(crate) fn read_link(&self, rel: &Path) -> Result<PathBuf, OpenError> {
        self.dir.read_link_contents(rel).map_err(OpenError::from_io)
    }

    /// Open the regular file `rel` for reading.
    pub(crate) fn open_regular(&self, rel: &Path) -> Result<Opened<std::fs::File>, OpenError> {
        self.open_regular_in(rel, Private::All)
    }

    /// [`Workspace::open_regular`] for git's comparison of a tracked file with its blob:
    /// one under `.berth/` too (a project may commit its skills), never one in a `.git`.
    pub(crate) fn open_tracked(&self, rel: &Path) -> Result<Opened<std::fs::File>, OpenError> {
        self.open_regular_in(rel, Private::Git)
    }

    /// Whether `rel` names a place closed to clients (in a `.git` or `.berth`), by name.
    pub(crate) fn is_private(rel: &Path) -> bool {
        refused(&normalized(rel), Access::Write).is_some()
    }

    fn open_regular_in(&self, rel: &Path, private: Private) -> Result<Opened<std::fs::File>, OpenError> {
        use cap_std::fs::MetadataExt;
        let before = self.lstat(rel)?;
        if before.file_type().is_symlink() {
            return Err(OpenError::Symlink);
        }
        if !before.is_file() {
            return Err(OpenError::WrongKind);
        }
        let file = self.dir.open(rel).map_err(OpenError::from_io)?.into_std();
        let meta = cap_std::fs::Metadata::from_file(&file).map_err(OpenError::Io)?;
        // The open followed whatever is at the path now: it must be what lstat saw.
        if (meta.dev(), meta.ino()) != (before.dev(), before.ino()) {
            return Err(OpenError::Raced);
        }
        self.not_private(&file, private)?;
        Ok(Opened { handle: file, meta })
    }

    /// Open the directory `rel` (`.` for the root).
    pub(crate) fn open_directory(&self, rel: &Path) -> Result<Opened<Dir>, OpenError> {
        use cap_std::fs::MetadataExt;
        let dir = if rel == Path::new(".") {
            self.dir.try_clone().map_err(OpenError::Io)?
        } else {
            let before = self.lstat(rel)?;
            if before.file_type().is_symlink() {
                return Err(OpenError::Symlink);
            }
            if !before.is_dir() {
                return Err(OpenError::WrongKind);
            }
            let dir = self.dir.open_dir(rel).map_err(OpenError::from_io)?;
            let now = dir.dir_metadata().map_err(OpenError::Io)?;
            if (now.dev(), now.ino()) != (before.dev(), before.ino()) {
                return Err(OpenError::Raced);
            }
            dir
        };
        self.not_private(&dir, Private::All)?;
        let meta = dir.dir_metadata().map_err(OpenError::Io)?;
        Ok(Opened { handle: dir, meta })
    }

    /// Refuse what `fd` (opened for a client) really is when it lies in a `.git` or a
    /// `.berth` (the kernel's name for it, as [`Workspace::guard_opened`] reads it).
    fn not_private(&self, fd: impl AsFd, private: Private) -> Result<(), OpenError> {
        let Some(real) = kernel_path(fd) else {
            return Ok(());
        };
        if is_secret(&real) {
            return Err(OpenError::Private);
        }
        // Opened beneath the root (cap-std saw to that); a kernel name elsewhere (the
        // workspace moved since it was opened, say) says nothing about the name inside it.
        let Ok(rel) = real.strip_prefix(&self.root) else {
            return Ok(());
        };
        // Closed to clients: what is closed to the model's writes (any `.git`, and `.berth`).
        let closed = match private {
            Private::All => refused(rel, Access::Write).is_some(),
            Private::Git => in_git(rel),
        };
        if closed { Err(OpenError::Private) } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn setup() -> (tempfile::TempDir, Workspace, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "SECRET").unwrap();
        std::fs::write(ws.join("sub/inside.txt"), "inside").unwrap();
        let w = Workspace::open(&ws).unwrap();
        (tmp, w, outside)
    }

    fn read(w: &Workspace, p: &str) -> Result<String, PathError> {
        w.read_bounded(p, 1 << 20)
            .map(|b| String::from_utf8(b.unwrap()).unwrap())
    }

    #[test]
    fn relative_paths_and_absolute_paths_under_the_root_resolve() {
        let (_t, w, _) = setup();
        assert_eq!(read(&w, "sub/inside.txt").unwrap(), "inside");
        assert_eq!(read(&w, "./sub/../sub/inside.txt").unwrap(), "inside");
        let abs = w.root().join("sub/inside.txt");
        assert_eq!(read(&w, abs.to_str().unwrap()).unwrap(), "inside");
        assert_eq!(w.relative("").unwrap(), PathBuf::from("."));
    }

    #[test]
    fn dot_dot_and_absolute_paths_outside_are_refused() {
        let (_t, w, outside) = setup();
        for p in ["../outside/secret", "sub/../../outside/secret", "/etc/passwd"] {
            let e = read(&w, p).unwrap_err();
            assert!(e.0.contains("outside the workspace"), "{p}: {e}");
        }
        let abs = outside.join("secret");
        assert!(read(&w, abs.to_str().unwrap()).is_err());
        assert!(w.write("../escape.txt", b"x").is_err());
        assert!(!outside.parent().unwrap().join("escape.txt").exists());
    }

    #[test]
    fn symlinks_leaving_the_workspace_are_refused_for_read_write_and_list() {
        let (_t, w, outside) = setup();
        symlink(outside.join("secret"), w.root().join("link")).unwrap();
        symlink(&outside, w.root().join("outdir")).unwrap();
        symlink("sub/inside.txt", w.root().join("good")).unwrap();
        let e = read(&w, "link").unwrap_err();
        assert!(e.0.contains("outside the workspace"), "{e}");
        assert!(read(&w, "outdir/secret").is_err());
        assert!(w.list("outdir").is_err());
        for (p, e) in [
            ("outdir/new.txt", w.write("outdir/new.txt", b"x")),
            ("link", w.write("link", b"overwritten")),
            ("outdir/deep/new.txt", w.write("outdir/deep/new.txt", b"x")),
        ] {
            let e = e.unwrap_err();
            assert!(e.0.contains("outside the workspace"), "{p}: {e}");
        }
        assert!(!outside.join("new.txt").exists());
        assert_eq!(std::fs::read_to_string(outside.join("secret")).unwrap(), "SECRET");
        // A symlink that stays inside is fine.
        assert_eq!(read(&w, "good").unwrap(), "inside");
        assert!(w.dir_path("outdir").is_err());
        assert!(w.dir_path("sub").is_ok());
    }

    #[test]
    fn a_symlink_swapped_in_during_reads_never_leaks_the_outside() {
        let (_t, w, outside) = setup();
        let root = w.root().to_path_buf();
        std::fs::write(root.join("plain"), "inside").unwrap();
        symlink(outside.join("secret"), root.join("evil")).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            let root = root.clone();
            std::thread::spawn(move || {
                // Alternate `target` between a regular file and a symlink to outside, atomically.
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::fs::hard_link(root.join("plain"), root.join("tmp-file")).ok();
                    std::fs::rename(root.join("tmp-file"), root.join("target")).ok();
                    symlink(outside.join("secret"), root.join("tmp-link")).ok();
                    std::fs::rename(root.join("tmp-link"), root.join("target")).ok();
                }
            })
        };
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..3000 {
            match read(&w, "target") {
                Ok(s) => {
                    assert_eq!(s, "inside");
                    ok += 1;
                }
                Err(_) => refused += 1,
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        assert!(ok + refused == 3000);
    }

    #[test]
    fn list_sorts_and_marks_kinds() {
        let (_t, w, _) = setup();
        std::fs::write(w.root().join("a.txt"), "12345").unwrap();
        symlink("a.txt", w.root().join("b")).unwrap();
        let entries = w.list(".").unwrap();
        let names: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.kind, e.size)).collect();
        assert_eq!(names, [("a.txt", "file", 5), ("b", "symlink", 0), ("sub", "dir", 0)]);
        assert!(w.list("a.txt").is_err());
    }

    #[test]
    fn berths_state_and_git_internals_are_closed_to_tools() {
        let (_t, w, _) = setup();
        let root = w.root().to_path_buf();
        std::fs::create_dir_all(root.join(".berth/run")).unwrap();
        std::fs::write(root.join(".berth/run/token"), "berth_secret").unwrap();
        std::fs::create_dir_all(root.join(".berth/skills/s")).unwrap();
        std::fs::write(root.join(".berth/skills/s/SKILL.md"), "skill").unwrap();
        std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
        std::fs::write(root.join(".git/config"), "[core]").unwrap();
        std::fs::create_dir_all(root.join("vendor/lib/.git")).unwrap();
        // Aliases inside the workspace: a directory symlink and a file symlink.
        symlink(".berth", root.join("state")).unwrap();
        symlink(".berth/run/token", root.join("token-link")).unwrap();
        symlink(".git", root.join("gitdir")).unwrap();
        symlink(".git/config", root.join("config-link")).unwrap();

        for p in [
            ".berth/run/token",
            "./.berth/run/token",
            "sub/../.berth/run/token",
            ".BERTH/run/token",
            "state/run/token",
            "token-link",
        ] {
            let e = read(&w, p).unwrap_err();
            assert!(e.0.contains("private state"), "{p}: {e}");
            assert!(w.read_bounded(p, 100).is_err(), "{p}");
        }
        for p in [".berth", ".berth/run", "state", "state/run"] {
            assert!(w.list(p).is_err(), "{p}");
            assert!(w.dir_path(p).is_err(), "{p}");
        }
        for p in [
            ".berth/run/token",
            "state/new",
            "token-link",
            ".git/hooks/pre-commit",
            ".git/config",
            "gitdir/hooks/post-checkout",
            "config-link",
            "vendor/lib/.git/config",
            ".git",
        ] {
            assert!(w.write(p, b"#!/bin/sh\nevil").is_err(), "{p}");
        }
        assert_eq!(
            std::fs::read_to_string(root.join(".berth/run/token")).unwrap(),
            "berth_secret"
        );
        assert_eq!(std::fs::read_to_string(root.join(".git/config")).unwrap(), "[core]");
        assert!(!root.join(".git/hooks/pre-commit").exists());
        assert!(!root.join(".git/hooks/post-checkout").exists());
        // Nor are git's files read (nor sent out of the workspace by `attach_file`), by any
        // name.
        for p in [
            ".git/config",
            "./.GIT/config",
            "gitdir/config",
            "config-link",
            "vendor/lib/.git/../.git/config",
            "token-link",
            ".berth/run/token",
        ] {
            assert!(w.read_bounded(p, 100).is_err(), "{p}");
            assert!(read(&w, p).is_err(), "{p}");
        }
        for p in [".git", ".git/hooks", "gitdir", "vendor/lib/.git"] {
            assert!(w.list(p).is_err(), "{p}");
            assert!(w.dir_path(p).is_err(), "{p}");
        }
        w.write("sub/send.txt", b"ok").unwrap();
        assert_eq!(w.read_bounded("sub/send.txt", 100).unwrap().unwrap(), b"ok");
        w.write("sub/new.txt", b"ok").unwrap();
        w.write("top.txt", b"ok").unwrap();
        assert_eq!(read(&w, "sub/new.txt").unwrap(), "ok");
        // Berth itself reads its own files there.
        assert_eq!(
            w.read_private(".berth/skills/s/SKILL.md", 100).unwrap().unwrap(),
            b"skill"
        );
        assert_eq!(w.list_private(".berth/skills").unwrap()[0].name, "s");
        assert!(w.read_private("sub/inside.txt", 100).is_err());
    }

    /// Berth's own reads under `.berth/` (skills, the MCP configuration) do not follow a
    /// symlink a repository committed there out of `.berth/` (into `.git/config`, say); a
    /// link within `.berth/` is followed.
    #[test]
    fn private_reads_do_not_follow_symlinks_out_of_berths_directory() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/config"), "[remote] url = https://token@host/r").unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(root.join(".berth/skills/cfg")).unwrap();
        std::fs::create_dir_all(root.join(".berth/skills/ok")).unwrap();
        std::fs::write(root.join(".berth/skills/ok/SKILL.md"), "fine").unwrap();
        std::os::unix::fs::symlink("../../../.git/config", root.join(".berth/skills/cfg/SKILL.md")).unwrap();
        std::os::unix::fs::symlink("../../src", root.join(".berth/skills/up")).unwrap();
        std::os::unix::fs::symlink("ok/SKILL.md", root.join(".berth/skills/alias.md")).unwrap();
        let w = Workspace::open(root).unwrap();
        let e = w.read_private(".berth/skills/cfg/SKILL.md", 1000).unwrap_err();
        assert!(e.0.contains("leads out of .berth/"), "{e}");
        assert!(w.list_private(".berth/skills/up").is_err());
        assert_eq!(w.read_private(".berth/skills/alias.md", 100).unwrap().unwrap(), b"fine");
    }

    /// Nothing is created through a symlink or under a symlinked directory that leads into
    /// `.git` or `.berth`: a dangling link to a missing file there, a `..` after a link, a
    /// new directory under a link. Nor is a link to a file elsewhere in the workspace
    /// written through: the model is told to write the file it points to.
    #[test]
    fn writes_never_create_anything_through_a_symlink_into_guarded_places() {
        let (_t, w, _) = setup();
        let root = w.root().to_path_buf();
        std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(root.join(".berth")).unwrap();
        symlink(".git/commondir", root.join("notes.md")).unwrap();
        symlink(".berth/planted", root.join("plant")).unwrap();
        symlink("sub/missing.txt", root.join("dangling")).unwrap();
        symlink(".git/hooks", root.join("gl")).unwrap();
        symlink("sub/inside.txt", root.join("good")).unwrap();
        for p in ["notes.md", "plant", "gl/x/f", "gl/pre-commit", "dangling"] {
            assert!(w.write(p, b"../evil").is_err(), "{p}");
        }
        assert!(!root.join(".git/commondir").exists());
        assert!(!root.join(".berth/planted").exists());
        assert!(!root.join(".git/hooks/x").exists());
        assert!(!root.join(".git/hooks/pre-commit").exists());
        assert!(!root.join("sub/missing.txt").exists());
        let e = w.write("dangling", b"x").unwrap_err();
        assert!(e.0.contains("is a symlink (to \"sub/missing.txt\")"), "{e}");
        // `..` is resolved on the path as given: `gl/../d/f` is `d/f` at the root, not
        // `.git/d/f` through the link.
        w.write("gl/../d/f", b"ok").unwrap();
        assert_eq!(std::fs::read_to_string(root.join("d/f")).unwrap(), "ok");
        assert!(!root.join(".git/d").exists());
        // Nor a directory link on the way, for a write or a removal.
        symlink("sub", root.join("subl")).unwrap();
        let e = w.write("subl/new.txt", b"x").unwrap_err();
        assert!(e.0.contains("subl is a symlink (to \"sub\")"), "{e}");
        assert!(!root.join("sub/new.txt").exists());
        assert!(w.check_write("subl/new.txt").is_err() && w.check_write("fresh/dir/new.txt").is_ok());
        // Nor a link to a file inside: the write names the file it changes.
        w.write("sub/inside.txt", b"before").unwrap();
        let e = w.write("good", b"through").unwrap_err();
        assert!(e.0.contains("is a symlink (to \"sub/inside.txt\")"), "{e}");
        assert_eq!(std::fs::read_to_string(root.join("sub/inside.txt")).unwrap(), "before");
        assert!(
            std::fs::symlink_metadata(root.join("good"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        // A shorter write truncates; a directory or a FIFO is not written.
        w.write("sub/inside.txt", b"x").unwrap();
        assert_eq!(std::fs::read_to_string(root.join("sub/inside.txt")).unwrap(), "x");
        assert!(w.write("sub", b"x").is_err());
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert!(w.write("fifo", b"x").is_err());
        symlink("fifo", root.join("fifo-link")).unwrap();
        assert!(w.write("fifo-link", b"x").is_err());
        // Nor is one read (it would wait for a writer forever).
        assert!(read(&w, "fifo").is_err());
        assert!(read(&w, "fifo-link").is_err());
    }
}

#[cfg(test)]
mod client_opens {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn client_opens_refuse_escapes_and_leaf_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let ws_dir = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(ws_dir.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "SECRET").unwrap();
        std::fs::write(ws_dir.join("sub/inside.txt"), "inside").unwrap();
        symlink(outside.join("secret"), ws_dir.join("leak")).unwrap();
        symlink(&outside, ws_dir.join("outdir")).unwrap();
        symlink("sub", ws_dir.join("subdir-link")).unwrap();
        let w = Workspace::open(&ws_dir).unwrap();
        let opened = w.open_regular(Path::new("sub/inside.txt")).unwrap();
        assert_eq!(opened.meta.len(), 6);
        assert!(matches!(w.open_regular(Path::new("leak")), Err(OpenError::Symlink)));
        assert!(matches!(
            w.open_regular(Path::new("outdir/secret")),
            Err(OpenError::Outside)
        ));
        assert!(matches!(
            w.open_regular(Path::new("../outside/secret")),
            Err(OpenError::Outside)
        ));
        assert!(matches!(w.open_regular(Path::new("missing")), Err(OpenError::Absent)));
        assert!(matches!(w.open_regular(Path::new("sub")), Err(OpenError::WrongKind)));
        assert!(w.open_directory(Path::new("sub")).is_ok());
        assert!(matches!(
            w.open_directory(Path::new("subdir-link")),
            Err(OpenError::Symlink)
        ));
        assert!(matches!(w.open_directory(Path::new("outdir")), Err(OpenError::Symlink)));
        // Through a symlink on the way, a repository's or Berth's directory stays closed.
        std::fs::create_dir_all(ws_dir.join(".git/hooks")).unwrap();
        std::fs::write(ws_dir.join(".git/config"), "[remote] url = https://token@host/").unwrap();
        std::fs::create_dir_all(ws_dir.join(".berth")).unwrap();
        std::fs::write(ws_dir.join(".berth/mcp.json"), "{}").unwrap();
        symlink(".git", ws_dir.join("g")).unwrap();
        symlink(".berth", ws_dir.join("b")).unwrap();
        for p in ["g/config", "b/mcp.json", ".git/config", ".GIT/config"] {
            assert!(
                matches!(
                    w.open_regular(Path::new(p)),
                    Err(OpenError::Private | OpenError::Absent)
                ),
                "{p}"
            );
        }
        for p in ["g/hooks", ".git", ".berth"] {
            assert!(
                matches!(
                    w.open_directory(Path::new(p)),
                    Err(OpenError::Private | OpenError::Symlink)
                ),
                "{p}"
            );
        }
        assert!(w.open_regular(Path::new("subdir-link/inside.txt")).is_ok());
    }
}
