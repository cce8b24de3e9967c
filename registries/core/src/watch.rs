//! Watching config files and directories so that every real-world way of changing them
//! is noticed: edits in place, atomic replacement (write a temp file, rename it over the
//! old one), Kubernetes ConfigMap volume symlink swaps (`..data` re-pointed to a new
//! timestamped directory), creation after start and deletion.
//!
//! The trick is to never watch the file's inode: an atomic replace or a symlink swap
//! gives the path a new inode and an inode watch goes silent. A [`PathWatcher`] watches
//! the *parent directory* of a file (non-recursively) or a whole directory tree, and
//! turns every relevant notification into a "something may have changed" tick. Ticks
//! carry no detail on purpose: the consumer re-reads the file and compares contents, so
//! a spurious tick (another file in the same directory changed) costs one read.
//!
//! Bursts are coalesced: [`PathWatcher::changed`] returns once no new notification has
//! arrived for a quiet period ([`DEFAULT_QUIET`], 50 ms), or at the latest
//! [`DEFAULT_MAX_DELAY`] after the first one, so a directory that never stops changing
//! (a log file next to the config) still yields a tick every second. A notification that
//! says a writer is done (a file renamed into place, which is how atomic replacements and
//! ConfigMap `..data` swaps land, or a file closed after writing) ends the wait at once:
//! what it shows is complete, and waiting out the quiet period would only add latency.
//! Waiting uses tokio time.
//!
//! Access notifications (a file was opened, read or closed without writing) are dropped:
//! otherwise the consumer's own re-read would tick again and loop forever.
//!
//! Limits: when watching a file, its parent directory must exist when the watcher starts
//! and stay (it may be empty). When watching a directory, the directory itself must stay;
//! replace its contents, not the directory. A file that is a symlink to somewhere outside
//! its own directory (other than the ConfigMap `..data` layout, which lives in the same
//! directory) is not followed: edits to the link target are not seen.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long the watched path must stay quiet before [`PathWatcher::changed`] returns.
pub const DEFAULT_QUIET: Duration = Duration::from_millis(50);

/// The longest [`PathWatcher::changed`] delays a tick while notifications keep coming.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(1);

/// Why a watch could not be started or stopped working.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The directory that holds the watched file does not exist (the file itself need
    /// not exist yet; its directory must).
    #[error("cannot watch {}: directory {} does not exist", .path.display(), .dir.display())]
    DirMissing {
        /// The path asked for.
        path: PathBuf,
        /// The directory that would have been watched.
        dir: PathBuf,
    },
    /// The directory to watch exists but is not a directory.
    #[error("cannot watch {}: {} is not a directory", .path.display(), .dir.display())]
    NotADirectory {
        /// The path asked for.
        path: PathBuf,
        /// The path that should have been a directory.
        dir: PathBuf,
    },
    /// The path has no parent directory to watch (`/`, or a path ending in `..`).
    #[error("cannot watch {}: it has no parent directory", .path.display())]
    NoParent {
        /// The path asked for.
        path: PathBuf,
    },
    /// The operating system refused the watch (e.g. the inotify watch limit is reached).
    #[error("cannot watch {}: {source}", .path.display())]
    Notify {
        /// The path asked for.
        path: PathBuf,
        /// What notify reported.
        #[source]
        source: notify::Error,
    },
    /// The watcher stopped delivering notifications (its background thread ended).
    #[error("the watcher for {} stopped", .path.display())]
    Stopped {
        /// The watched path.
        path: PathBuf,
    },
}

/// Watches one file (through its parent directory) or one directory tree and reports
/// coalesced "may have changed" ticks. Dropping it stops the watch.
pub struct PathWatcher {
    path: PathBuf,
    rx: mpsc::Receiver<()>,
    /// Set with a tick when the notification said a writer is done (see the module).
    settled: Arc<AtomicBool>,
    quiet: Duration,
    max_delay: Duration,
    // Kept alive for as long as the watch should run; `None` only in tests that feed
    // ticks by hand.
    _watcher: Option<RecommendedWatcher>,
}

impl fmt::Debug for PathWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PathWatcher")
            .field("path", &self.path)
            .field("quiet", &self.quiet)
            .field("max_delay", &self.max_delay)
            .finish_non_exhaustive()
    }
}

impl PathWatcher {
    /// Starts watching `path`.
    ///
    /// - `recursive == false`: `path` is a file, which may not exist yet. Its parent
    ///   directory is watched (non-recursively), so replacing, creating, deleting or
    ///   symlink-swapping the file is seen. The parent directory must exist.
    /// - `recursive == true`: `path` is a directory, watched with all its
    ///   subdirectories. It must exist.
    ///
    /// Starting a watch needs no runtime (notify runs its own thread);
    /// [`PathWatcher::changed`] needs a tokio runtime with time enabled.
    pub fn watch(path: &Path, recursive: bool) -> Result<PathWatcher, WatchError> {
        let dir = if recursive {
            path.to_path_buf()
        } else {
            parent_dir(path)?
        };
        match std::fs::metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(WatchError::NotADirectory {
                    path: path.to_path_buf(),
                    dir,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(WatchError::DirMissing {
                    path: path.to_path_buf(),
                    dir,
                });
            }
            Err(e) => {
                return Err(WatchError::Notify {
                    path: path.to_path_buf(),
                    source: notify::Error::io(e),
                });
            }
        }
        // One pending tick is enough: the consumer re-reads everything on a tick.
        let (tx, rx) = mpsc::channel(1);
        let settled = Arc::new(AtomicBool::new(false));
        let settled_tx = settled.clone();
        let shown = path.display().to_string();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<Event>| match event {
                Ok(event) if !is_relevant(&event) => {}
                Ok(event) => {
                    if is_settling(&event) {
                        settled_tx.store(true, Ordering::Release);
                    }
                    let _ = tx.try_send(());
                }
                Err(e) => {
                    // An error may mean lost events (e.g. a queue overflow): re-read to be sure.
                    tracing::warn!(path = %shown, error = %e, "file watch error; re-reading");
                    let _ = tx.try_send(());
                }
            })
            .map_err(|source| WatchError::Notify {
                path: path.to_path_buf(),
                source,
            })?;
        let mode = if recursive {
            RecursiveMode::Recursive
        } else {
            RecursiveMode::NonRecursive
        };
        watcher
            .watch(&dir, mode)
            .map_err(|source| WatchError::Notify {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(PathWatcher {
            path: path.to_path_buf(),
            rx,
            settled,
            quiet: DEFAULT_QUIET,
            max_delay: DEFAULT_MAX_DELAY,
            _watcher: Some(watcher),
        })
    }

    /// Sets the quiet period and the maximum delay of the burst coalescing.
    pub fn with_debounce(mut self, quiet: Duration, max_delay: Duration) -> PathWatcher {
        self.quiet = quiet;
        self.max_delay = max_delay.max(quiet);
        self
    }

    /// A watcher fed by hand (each send is a notification), for tests of the
    /// debounce and of the watchers' consumers.
    #[cfg(test)]
    pub(crate) fn manual(path: &Path) -> (mpsc::Sender<()>, PathWatcher) {
        let (tx, rx) = mpsc::channel(1);
        let watcher = PathWatcher {
            path: path.to_path_buf(),
            rx,
            settled: Arc::default(),
            quiet: DEFAULT_QUIET,
            max_delay: DEFAULT_MAX_DELAY,
            _watcher: None,
        };
        (tx, watcher)
    }

    /// The path given to [`PathWatcher::watch`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits until the watched path may have changed and the burst of notifications
    /// has settled. `None` when the watcher stopped and no change is pending.
    pub async fn changed(&mut self) -> Option<()> {
        self.rx.recv().await?;
        let deadline = Instant::now() + self.max_delay;
        loop {
            if self.settled.swap(false, Ordering::AcqRel) {
                // A writer is done: report now, and drop the tick of the same burst
                // that may be queued behind this one.
                let _ = self.rx.try_recv();
                return Some(());
            }
            let quiet_until = (Instant::now() + self.quiet).min(deadline);
            match tokio::time::timeout_at(quiet_until, self.rx.recv()).await {
                // More notifications: keep waiting for quiet, unless the deadline passed.
                Ok(Some(())) if Instant::now() < deadline => {}
                // Deadline reached, quiet period over, or the watcher stopped: report the
                // change seen so far (a stopped watcher reports `None` next time).
                Ok(Some(())) | Ok(None) | Err(_) => return Some(()),
            }
        }
    }
}

/// The directory holding `path`, `.` for a bare file name.
fn parent_dir(path: &Path) -> Result<PathBuf, WatchError> {
    if path.file_name().is_none() {
        return Err(WatchError::NoParent {
            path: path.to_path_buf(),
        });
    }
    match path.parent() {
        None => Err(WatchError::NoParent {
            path: path.to_path_buf(),
        }),
        Some(p) if p.as_os_str().is_empty() => Ok(PathBuf::from(".")),
        Some(p) => Ok(p.to_path_buf()),
    }
}

/// Whether a notification says a writer is done: a name moved into place (an atomic
/// replace, a ConfigMap `..data` swap) or a file closed after writing.
fn is_settling(event: &Event) -> bool {
    matches!(
        event.kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both))
    )
}

/// Whether a notification may mean a content change. Opening, reading and closing a
/// file without writing do not (and the consumer's own re-read must not tick).
fn is_relevant(event: &Event) -> bool {
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, RemoveKind};
    use std::fs;
    #[cfg(unix)]
    use std::os::unix::fs::symlink;

    const WAIT: Duration = Duration::from_secs(10);

    fn manual(path: &Path) -> (mpsc::Sender<()>, PathWatcher) {
        PathWatcher::manual(path)
    }

    async fn expect_change(w: &mut PathWatcher, what: &str) {
        match tokio::time::timeout(WAIT, w.changed()).await {
            Ok(Some(())) => {}
            Ok(None) => panic!("{what}: watcher stopped"),
            Err(_) => panic!("{what}: no change seen within {WAIT:?}"),
        }
    }

    #[tokio::test]
    async fn sees_an_in_place_edit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mock.yaml");
        fs::write(&file, "a").unwrap();
        let mut w = PathWatcher::watch(&file, false).unwrap();
        {
            use std::io::Write;
            let mut f = fs::OpenOptions::new().append(true).open(&file).unwrap();
            f.write_all(b"b").unwrap();
        }
        expect_change(&mut w, "in-place edit").await;
    }

    #[tokio::test]
    async fn sees_an_atomic_rename_over() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mock.yaml");
        fs::write(&file, "a").unwrap();
        let tmp = dir.path().join(".mock.yaml.tmp");
        fs::write(&tmp, "b").unwrap();
        let mut w = PathWatcher::watch(&file, false).unwrap();
        fs::rename(&tmp, &file).unwrap();
        expect_change(&mut w, "rename over").await;
        // The watch survives the inode change: a second replacement is seen too.
        fs::write(&tmp, "c").unwrap();
        fs::rename(&tmp, &file).unwrap();
        expect_change(&mut w, "second rename over").await;
        assert_eq!(fs::read_to_string(&file).unwrap(), "c");
    }

    #[tokio::test]
    async fn sees_creation_after_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("later.yaml");
        let mut w = PathWatcher::watch(&file, false).unwrap();
        fs::write(&file, "a").unwrap();
        expect_change(&mut w, "creation").await;
    }

    #[tokio::test]
    async fn sees_deletion() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mock.yaml");
        fs::write(&file, "a").unwrap();
        let mut w = PathWatcher::watch(&file, false).unwrap();
        fs::remove_file(&file).unwrap();
        expect_change(&mut w, "deletion").await;
        // And a re-creation after the deletion.
        fs::write(&file, "b").unwrap();
        expect_change(&mut w, "re-creation").await;
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn sees_a_configmap_symlink_swap() {
        // The layout kubelet writes for a ConfigMap volume:
        //   ..2026_01/mock.yaml, ..data -> ..2026_01, mock.yaml -> ..data/mock.yaml
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::create_dir(root.join("..2026_01")).unwrap();
        fs::write(root.join("..2026_01/mock.yaml"), "old").unwrap();
        symlink("..2026_01", root.join("..data")).unwrap();
        symlink("..data/mock.yaml", root.join("mock.yaml")).unwrap();
        let file = root.join("mock.yaml");
        let mut w = PathWatcher::watch(&file, false).unwrap();

        // kubelet: write the new timestamped dir, point a temp symlink at it, rename the
        // temp symlink over `..data`, remove the old dir.
        fs::create_dir(root.join("..2026_02")).unwrap();
        fs::write(root.join("..2026_02/mock.yaml"), "new").unwrap();
        symlink("..2026_02", root.join("..data_tmp")).unwrap();
        fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        fs::remove_dir_all(root.join("..2026_01")).unwrap();
        expect_change(&mut w, "configmap swap").await;
        assert_eq!(fs::read_to_string(&file).unwrap(), "new");
    }

    #[tokio::test]
    async fn recursive_watch_sees_nested_changes() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        let mut w = PathWatcher::watch(dir.path(), true).unwrap();
        fs::write(dir.path().join("sub/vs.yaml"), "a").unwrap();
        expect_change(&mut w, "nested file").await;
    }

    #[test]
    fn a_missing_directory_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nope/mock.yaml");
        let err = PathWatcher::watch(&file, false).unwrap_err();
        assert!(matches!(err, WatchError::DirMissing { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("nope/mock.yaml") && msg.contains("does not exist"),
            "{msg}"
        );

        let err = PathWatcher::watch(&dir.path().join("nope"), true).unwrap_err();
        assert!(matches!(err, WatchError::DirMissing { .. }), "{err:?}");

        let file = dir.path().join("f");
        fs::write(&file, "").unwrap();
        let err = PathWatcher::watch(&file.join("mock.yaml"), false).unwrap_err();
        assert!(matches!(err, WatchError::NotADirectory { .. }), "{err:?}");
        assert!(err.to_string().contains("is not a directory"), "{err}");

        let err = PathWatcher::watch(Path::new("/"), false).unwrap_err();
        assert!(matches!(err, WatchError::NoParent { .. }), "{err:?}");
    }

    #[test]
    fn bare_file_names_watch_the_current_directory() {
        assert_eq!(
            parent_dir(Path::new("mock.yaml")).unwrap(),
            PathBuf::from(".")
        );
        assert_eq!(
            parent_dir(Path::new("/etc/m/mock.yaml")).unwrap(),
            PathBuf::from("/etc/m")
        );
    }

    #[test]
    fn reads_do_not_tick_but_writes_do() {
        let ev = |kind| Event::new(kind);
        assert!(!is_relevant(&ev(EventKind::Access(AccessKind::Open(
            AccessMode::Any
        )))));
        assert!(!is_relevant(&ev(EventKind::Access(AccessKind::Close(
            AccessMode::Read
        )))));
        assert!(!is_relevant(&ev(EventKind::Access(AccessKind::Read))));
        assert!(is_relevant(&ev(EventKind::Access(AccessKind::Close(
            AccessMode::Write
        )))));
        assert!(is_relevant(&ev(EventKind::Modify(ModifyKind::Name(
            RenameMode::To
        )))));
        assert!(is_relevant(&ev(EventKind::Create(CreateKind::File))));
        assert!(is_relevant(&ev(EventKind::Remove(RemoveKind::File))));
        assert!(is_relevant(&ev(EventKind::Other)));
    }

    #[tokio::test(start_paused = true)]
    async fn bursts_coalesce_until_quiet() {
        let (tx, mut w) = manual(Path::new("x"));
        let start = Instant::now();
        let feeder = tokio::spawn(async move {
            for _ in 0..5 {
                let _ = tx.try_send(());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tx
        });
        assert_eq!(w.changed().await, Some(()));
        // Last tick at 80 ms, then 50 ms of quiet.
        assert_eq!(start.elapsed(), Duration::from_millis(130));
        let tx = feeder.await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_secs(5), w.changed())
                .await
                .is_err(),
            "one burst, one change"
        );
        drop(tx);
        assert_eq!(w.changed().await, None, "a stopped watcher reports None");
    }

    #[tokio::test(start_paused = true)]
    async fn a_writer_done_ends_the_wait_at_once() {
        let (tx, mut w) = manual(Path::new("x"));
        let settled = w.settled.clone();
        let start = Instant::now();
        let feeder = tokio::spawn(async move {
            let _ = tx.try_send(());
            tokio::time::sleep(Duration::from_millis(20)).await;
            // What the notify callback does for a rename into place.
            settled.store(true, Ordering::Release);
            let _ = tx.try_send(());
            tx
        });
        assert_eq!(w.changed().await, Some(()));
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(20),
            "no quiet period after it"
        );
        let _tx = feeder.await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_secs(5), w.changed())
                .await
                .is_err(),
            "the burst's queued tick went with it"
        );
    }

    #[test]
    fn renames_into_place_and_closes_after_writing_settle() {
        let event = |kind| Event::new(kind);
        assert!(is_settling(&event(EventKind::Modify(ModifyKind::Name(
            RenameMode::To
        )))));
        assert!(is_settling(&event(EventKind::Modify(ModifyKind::Name(
            RenameMode::Both
        )))));
        assert!(is_settling(&event(EventKind::Access(AccessKind::Close(
            AccessMode::Write
        )))));
        assert!(!is_settling(&event(EventKind::Modify(ModifyKind::Name(
            RenameMode::From
        )))));
        assert!(!is_settling(&event(EventKind::Modify(ModifyKind::Data(
            notify::event::DataChange::Content
        )))));
        assert!(!is_settling(&event(EventKind::Create(CreateKind::File))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_never_ending_burst_still_ticks_at_the_max_delay() {
        let (tx, mut w) = manual(Path::new("x"));
        let start = Instant::now();
        tokio::spawn(async move {
            loop {
                if tx.try_send(()).is_err() && tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        assert_eq!(w.changed().await, Some(()));
        let elapsed = start.elapsed();
        assert!(
            elapsed >= DEFAULT_MAX_DELAY && elapsed < DEFAULT_MAX_DELAY + DEFAULT_QUIET,
            "{elapsed:?}"
        );
        assert_eq!(w.changed().await, Some(()));
    }
}
