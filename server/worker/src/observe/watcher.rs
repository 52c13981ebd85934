//! One native watcher for the whole worker process, shared by every `files.watch`.
//!
//! A `notify` watcher is one inotify instance and one thread. Per `files.watch` that meant a
//! thread per open watch, and past the kernel's `max_user_instances` (128 by default) every
//! further watch silently fell back to polling. Here one watcher serves them all: each
//! watched directory is registered with the wakers of the watches that want it, and an
//! event wakes the watches of the path it names and of that path's parent.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
};

use notify::Watcher;
use tokio::sync::Notify;

type Wakers = HashMap<PathBuf, Vec<(u64, Arc<Notify>)>>;

struct Shared {
    /// Taken around `watch`/`unwatch` (which wait for notify's thread) but never while
    /// `wakers` is held, which notify's thread takes to deliver an event.
    watcher: Mutex<notify::RecommendedWatcher>,
    wakers: Arc<Mutex<Wakers>>,
    next: std::sync::atomic::AtomicU64,
}

/// The process's watcher, created on first use; `None` if it could not be (no inotify).
fn shared() -> Option<&'static Shared> {
    static SHARED: OnceLock<Option<Shared>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let wakers: Arc<Mutex<Wakers>> = Arc::default();
            let deliver = wakers.clone();
            let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let Ok(event) = event else { return };
                let wakers = deliver.lock().expect("wakers lock");
                for path in &event.paths {
                    // A child's event concerns its directory; the directory's own (removed,
                    // renamed, its times) concerns the directory.
                    for dir in [Some(path.as_path()), path.parent()].into_iter().flatten() {
                        for (_, wake) in wakers.get(dir).into_iter().flatten() {
                            wake.notify_one();
                        }
                    }
                }
            });
            match watcher {
                Ok(w) => Some(Shared {
                    watcher: Mutex::new(w),
                    wakers,
                    next: Default::default(),
                }),
                Err(e) => {
                    tracing::info!(error = %e, "native file notifications unavailable");
                    None
                }
            }
        })
        .as_ref()
}

/// A directory watched for one `files.watch`; dropping it stops watching (the directory is
/// unwatched when its last registration goes).
pub(crate) struct Registration {
    shared: &'static Shared,
    path: PathBuf,
    id: u64,
}

/// Watch `dir` (non-recursively): `wake` is notified on any event in it or on it.
pub(crate) fn register(dir: &Path, wake: Arc<Notify>) -> notify::Result<Registration> {
    let shared = shared().ok_or_else(|| notify::Error::generic("native file notifications unavailable"))?;
    let id = shared.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut watcher = shared.watcher.lock().expect("watcher lock");
    shared
        .wakers
        .lock()
        .expect("wakers lock")
        .entry(dir.to_path_buf())
        .or_default()
        .push((id, wake));
    let registration = Registration {
        shared,
        path: dir.to_path_buf(),
        id,
    };
    // Every time, not only for the first registration of the path: a directory removed and
    // made again under the same name is a new inode, which the old kernel watch does not see.
    if let Err(e) = watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
        drop(watcher);
        drop(registration);
        return Err(e);
    }
    Ok(registration)
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut watcher = self.shared.watcher.lock().expect("watcher lock");
        let last = {
            let mut wakers = self.shared.wakers.lock().expect("wakers lock");
            let Some(list) = wakers.get_mut(&self.path) else { return };
            list.retain(|(id, _)| *id != self.id);
            let last = list.is_empty();
            if last {
                wakers.remove(&self.path);
            }
            last
        };
        if last {
            // Fails harmlessly when the kernel already dropped the watch (directory removed).
            let _ = watcher.unwatch(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// inotify instances this process holds.
    fn inotify_instances() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().contains("inotify"))
            .count()
    }

    #[tokio::test]
    async fn many_watches_share_one_instance_and_each_hears_its_own_directory() {
        let root = tempfile::tempdir().unwrap();
        // More than the kernel's default max_user_instances (128), which one instance per
        // watch would exceed.
        let dirs: Vec<PathBuf> = (0..150).map(|i| root.path().join(format!("d{i}"))).collect();
        let mut watches = Vec::new();
        for dir in &dirs {
            std::fs::create_dir(dir).unwrap();
            let wake = Arc::new(Notify::new());
            watches.push((register(dir, wake.clone()).expect("watch"), wake));
        }
        // Two watches of one directory: both hear it, and one going away leaves the other.
        let twin = Arc::new(Notify::new());
        let twin_registration = register(&dirs[0], twin.clone()).expect("second watch of d0");
        assert_eq!(inotify_instances(), 1, "one inotify instance for every watch");

        for (i, dir) in dirs.iter().enumerate() {
            std::fs::write(dir.join("new"), b"x").unwrap();
            tokio::time::timeout(Duration::from_secs(10), watches[i].1.notified())
                .await
                .unwrap_or_else(|_| panic!("the watch of d{i} hears a file created in it"));
        }
        tokio::time::timeout(Duration::from_secs(10), twin.notified())
            .await
            .expect("the second watch of d0 heard it too");

        drop(watches.remove(0));
        std::fs::write(dirs[0].join("again"), b"y").unwrap();
        tokio::time::timeout(Duration::from_secs(10), twin.notified())
            .await
            .expect("d0 is still watched while one watch of it is open");
        drop(twin_registration);

        // A directory removed and made again under its name is watched again by a new watch.
        let last = dirs.last().unwrap();
        let (old, old_wake) = watches.pop().unwrap();
        std::fs::remove_dir_all(last).unwrap();
        tokio::time::timeout(Duration::from_secs(10), old_wake.notified())
            .await
            .expect("the removal is heard");
        std::fs::create_dir(last).unwrap();
        let wake = Arc::new(Notify::new());
        let _renewed = register(last, wake.clone()).expect("watch of the new directory");
        drop(old);
        std::fs::write(last.join("new"), b"z").unwrap();
        tokio::time::timeout(Duration::from_secs(10), wake.notified())
            .await
            .expect("the new directory's watch hears a file created in it");
    }
}
