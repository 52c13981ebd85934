//! The one place that confines paths to a workspace. Every tool (and every file read
//! answered for a client) opens, reads, writes and lists through [`Workspace`].
//!
//! Resolution happens inside the kernel relative to a directory handle of the workspace
//! root (`cap-std`: `openat2` with `RESOLVE_BENEATH` where available, otherwise a
//! component-by-component walk with `O_NOFOLLOW`). So `..`, absolute paths elsewhere and
//! symlinks that lead out are refused at the moment of use: there is no separate check a
//! swapped-in symlink could slip past.

use std::{
    io,
    path::{Path, PathBuf},
};

use cap_std::{ambient_authority, fs::Dir};

pub(crate) struct Workspace {
    root: PathBuf,
    dir: Dir,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace").field("root", &self.root).finish()
    }
}

impl Workspace {
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

/// Client paths (`files.*`): exact relative bytes; a symlink as the last component is a
/// leaf, never followed; symlinks on the way are followed only while they stay inside.
impl Workspace {
    /// Metadata of `rel` without following its last component.
    pub(crate) fn lstat(&self, rel: &Path) -> Result<cap_std::fs::Metadata, OpenError> {
        self.dir.symlink_metadata(rel).map_err(OpenError::from_io)
    }

    /// Open the regular file `rel` for reading.
    pub(crate) fn open_regular(&self, rel: &Path) -> Result<Opened<std::fs::File>, OpenError> {
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
        let meta = dir.dir_metadata().map_err(OpenError::Io)?;
        Ok(Opened { handle: dir, meta })
    }
}

#[cfg(test)]
mod tests {
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
    }
}
