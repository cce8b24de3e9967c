//! The one driver behind every watched file: the config directory
//! ([`crate::config::run_config_dir`]), the mock registry file
//! ([`crate::mock_file::run_mock_file`]), the mesh files (`--meshConfig`,
//! `--networksConfig`) and the serving TLS files of the secure port.
//!
//! It has two parts; a user takes the loop and, for one file, the state:
//!
//! - [`follow`], the loop (IO): waits for a change ([`PathWatcher::changed`], one or
//!   several watchers), for the retry timer the last read asked for, or for shutdown,
//!   and then calls [`Reload::reload`]. Shutdown ends it at once, even in the middle
//!   of a read. A watcher that stops ends it with [`WatchError::Stopped`] (the caller
//!   logs what that means for it).
//! - [`WatchedFile`], what one file's reads mean (sans IO apart from
//!   [`WatchedFile::read`], which reads through [`crate::read`]): the backoff of failed
//!   reads, the last content seen (identical bytes do nothing), whether a failure
//!   repeats the last one (so it is logged once), and the emptied-file rule: content
//!   that would empty what is in force applies only once it has stayed so for a settle
//!   period ([`crate::read::EMPTY_SETTLE`] by default), because a writer that truncates
//!   the file and fills it later (`{ sleep 1; cat good.yaml; } > file`) is not a
//!   deletion of everything in it.
//!
//! The config directory uses the loop and [`settle_empty`] per file (it reads many
//! files, with its own listing); the serving TLS files use the loop only (their three
//! files are read together whenever the configuration is rebuilt, and a rebuild that
//! fails waits for the next change).
//!
//! Parsing, applying, logging and metrics stay with each user: they differ per file
//! (what "empty" means, the texts of the logs, the names of the metrics), and the
//! driver hands the user each decision as a value ([`Read`], [`Settle`]) so the user
//! says it in its own words.
//!
//! Where the users differ, the difference is an option:
//! - [`FollowOptions::read_at_start`]: read once before waiting for the first change
//!   (the config directory and the mock file, which then mark their source synced in
//!   [`Reload::started`]), or not (the mesh files and the TLS files, loaded by the
//!   caller at start-up).
//! - [`FileOptions::forget_on_error`]: whether a failed read (other than a writer at
//!   work) forgets the last content and the emptied-file timer (the mock file: the next
//!   good read applies again, and the settle period starts over), or only a missing
//!   file does (the mesh files).
//! - [`FileOptions::empty_settle`]: the settle period of an emptied file.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::read::{Backoff, DEFAULT_MAX_FILE_SIZE, EMPTY_SETTLE, ReadError, read_watched_file};
use crate::watch::{PathWatcher, WatchError};

/// One read-and-apply step of a followed file or directory.
pub trait Reload {
    /// Reads once and applies what changed. Returns when to read again without
    /// waiting for a change (a failed read's retry, the end of a settle period):
    /// `None` to wait for the next change.
    fn reload(&mut self) -> impl Future<Output = Option<Duration>> + Send;

    /// Called once, after the first read, with [`FollowOptions::read_at_start`]: where
    /// a source marks itself synced, whatever the read gave.
    fn started(&mut self) {}
}

/// How [`follow`] starts.
#[derive(Clone, Copy, Debug, Default)]
pub struct FollowOptions {
    /// Read once before waiting for the first change, then call [`Reload::started`].
    /// Off: the first read waits for a change (the caller loaded the file itself).
    pub read_at_start: bool,
}

/// Follows `watchers` until `shutdown` completes, calling `reloader` on every change
/// (of any of the watchers) and whenever the last reload asked to read again.
///
/// Returns `Ok(())` at shutdown, and [`WatchError::Stopped`] naming the watched path
/// when a watcher stops delivering changes (with no watchers, it waits for shutdown).
/// The watchers should be started before the caller's first read, so that a change in
/// between is not lost.
pub async fn follow<R: Reload>(
    watchers: &mut [PathWatcher],
    reloader: &mut R,
    options: FollowOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WatchError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut again = None;
    if options.read_at_start {
        again = tokio::select! {
            () = &mut shutdown => return Ok(()),
            next = reloader.reload() => next,
        };
        reloader.started();
    }
    loop {
        let retry = async {
            match again {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = retry => {}
            stopped = changed(watchers) => if let Some(path) = stopped {
                return Err(WatchError::Stopped { path });
            },
        }
        again = tokio::select! {
            () = &mut shutdown => return Ok(()),
            next = reloader.reload() => next,
        };
    }
}

/// Waits for a change of any of `watchers`: `None` on a change, the path of a watcher
/// that stopped otherwise. Never returns without watchers.
async fn changed(watchers: &mut [PathWatcher]) -> Option<PathBuf> {
    match watchers {
        [] => std::future::pending().await,
        [one] => match one.changed().await {
            Some(()) => None,
            None => Some(one.path().to_path_buf()),
        },
        many => {
            type Tick<'a> = std::pin::Pin<Box<dyn Future<Output = Option<PathBuf>> + Send + 'a>>;
            let mut ticks: Vec<Tick<'_>> = many
                .iter_mut()
                .map(|w| {
                    Box::pin(async move {
                        match w.changed().await {
                            Some(()) => None,
                            None => Some(w.path().to_path_buf()),
                        }
                    }) as Tick<'_>
                })
                .collect();
            std::future::poll_fn(|cx| {
                for tick in &mut ticks {
                    if let std::task::Poll::Ready(stopped) = tick.as_mut().poll(cx) {
                        return std::task::Poll::Ready(stopped);
                    }
                }
                std::task::Poll::Pending
            })
            .await
        }
    }
}

/// How a [`WatchedFile`] reads and remembers.
#[derive(Clone, Copy, Debug)]
pub struct FileOptions {
    /// The size limit of the file in bytes (`--maxConfigFileSize`).
    pub max_file_size: u64,
    /// How long content that would empty what is in force must stay before it applies.
    pub empty_settle: Duration,
    /// On: a failed read (other than [`Read::Changing`]) forgets the last content and
    /// the emptied-file timer, so the next good read applies again even when its
    /// bytes are the same, and an emptied file's settle period starts over. Off: only
    /// a missing file forgets them.
    pub forget_on_error: bool,
}

impl Default for FileOptions {
    /// [`DEFAULT_MAX_FILE_SIZE`], [`EMPTY_SETTLE`], forgetting only on a missing file.
    fn default() -> FileOptions {
        FileOptions {
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            empty_settle: EMPTY_SETTLE,
            forget_on_error: false,
        }
    }
}

/// What one read of a [`WatchedFile`] means for its user.
#[derive(Debug)]
pub enum Read {
    /// The bytes of the last read, and no emptied file is pending: nothing to do.
    Unchanged,
    /// New bytes ([`WatchedFile::content`]): parse them, then ask
    /// [`WatchedFile::settle`] whether to apply (or call
    /// [`WatchedFile::clear_emptied`] when they do not parse).
    Content,
    /// A writer was at work during the read: read again after `delay` (its next write
    /// also notifies). Nothing is forgotten.
    Changing {
        /// The read error.
        error: ReadError,
        /// When to read again.
        delay: Duration,
    },
    /// Nothing is at the path. A state, not retried: the watch reports its creation.
    Missing {
        /// The read error.
        error: ReadError,
        /// The last read failed with the same message (log it once).
        repeated: bool,
        /// The last read before this one had content (the file was deleted).
        had_content: bool,
    },
    /// Any other failure (not a regular file, over the size limit, an I/O error): read
    /// again after `delay`, backing off.
    Failed {
        /// The read error.
        error: ReadError,
        /// The last read failed with the same message (log it once).
        repeated: bool,
        /// When to read again.
        delay: Duration,
    },
}

/// Whether parsed content applies now ([`WatchedFile::settle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// It does not empty what is in force: apply it.
    Apply,
    /// It empties what is in force and has not stayed so for the settle period: keep
    /// what is in force and read again after `remaining`.
    Wait {
        /// How long the file has been empty (zero on the first empty read).
        waited: Duration,
        /// How long it must stay empty still.
        remaining: Duration,
    },
    /// It empties what is in force and has stayed so for the settle period: apply it.
    Settled,
}

/// The emptied-file rule alone: since when content has been empty, and whether that
/// has lasted `period` at `now`. Starts the timer on the first empty read.
pub fn settle_empty(since: &mut Option<Instant>, now: Instant, period: Duration) -> Settle {
    let since = *since.get_or_insert(now);
    let waited = now.duration_since(since);
    if waited < period {
        Settle::Wait {
            waited,
            remaining: period - waited,
        }
    } else {
        Settle::Settled
    }
}

/// The reading state of one watched file: see the module.
#[derive(Debug)]
pub struct WatchedFile {
    path: PathBuf,
    options: FileOptions,
    /// The bytes of the last read that gave content.
    last: Option<Vec<u8>>,
    /// The message of the last failed read, until a read succeeds.
    failure: Option<String>,
    /// Since when the file's content has emptied what is in force.
    empty_since: Option<Instant>,
    backoff: Backoff,
}

impl WatchedFile {
    /// A file not read yet.
    pub fn new(path: PathBuf, options: FileOptions) -> WatchedFile {
        WatchedFile {
            path,
            options,
            last: None,
            failure: None,
            empty_since: None,
            backoff: Backoff::default(),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The options it was made with.
    pub fn options(&self) -> &FileOptions {
        &self.options
    }

    /// Reads the file under the rules of [`crate::read`] (on tokio's blocking pool)
    /// and says what the read means ([`WatchedFile::step`]).
    pub async fn read(&mut self) -> Read {
        let read = read_watched_file(&self.path, self.options.max_file_size).await;
        self.step(read)
    }

    /// What the outcome of a read means, remembering it.
    pub fn step(&mut self, read: Result<Vec<u8>, ReadError>) -> Read {
        match read {
            Ok(bytes) => {
                self.backoff.reset();
                self.failure = None;
                if self.last.as_ref() == Some(&bytes) && self.empty_since.is_none() {
                    return Read::Unchanged;
                }
                self.last = Some(bytes);
                Read::Content
            }
            Err(error) if error.is_changing() => Read::Changing {
                error,
                delay: self.backoff.next_delay(),
            },
            Err(error) => {
                let missing = error.is_missing();
                let had_content = self.last.is_some();
                if missing || self.options.forget_on_error {
                    self.last = None;
                    self.empty_since = None;
                }
                let message = error.to_string();
                let repeated = self.failure.as_deref() == Some(message.as_str());
                self.failure = Some(message);
                if missing {
                    Read::Missing {
                        error,
                        repeated,
                        had_content,
                    }
                } else {
                    Read::Failed {
                        error,
                        repeated,
                        delay: self.backoff.next_delay(),
                    }
                }
            }
        }
    }

    /// The bytes of the last [`Read::Content`].
    pub fn content(&self) -> &[u8] {
        self.last.as_deref().unwrap_or_default()
    }

    /// Whether the content just read applies now, given whether it `empties` what is
    /// in force (the user's judgement: no services while the registry holds some, a
    /// blank file after one with content, ...). Content that does not empty it ends a
    /// pending wait.
    pub fn settle(&mut self, empties: bool, now: Instant) -> Settle {
        if !empties {
            self.empty_since = None;
            return Settle::Apply;
        }
        let settle = settle_empty(&mut self.empty_since, now, self.options.empty_settle);
        if settle == Settle::Settled {
            self.empty_since = None;
        }
        settle
    }

    /// Ends a pending wait of an emptied file (its content did not parse).
    pub fn clear_emptied(&mut self) {
        self.empty_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn missing() -> ReadError {
        ReadError::Missing {
            path: PathBuf::from("f.yaml"),
        }
    }

    fn changing() -> ReadError {
        ReadError::Changing {
            path: PathBuf::from("f.yaml"),
        }
    }

    fn io() -> ReadError {
        ReadError::Io {
            path: PathBuf::from("f.yaml"),
            source: std::io::Error::other("EMFILE"),
        }
    }

    fn file(forget_on_error: bool) -> WatchedFile {
        WatchedFile::new(
            PathBuf::from("f.yaml"),
            FileOptions {
                forget_on_error,
                ..FileOptions::default()
            },
        )
    }

    #[test]
    fn identical_bytes_do_nothing_and_new_ones_are_content() {
        let mut f = file(false);
        assert!(matches!(f.step(Ok(b"a".to_vec())), Read::Content));
        assert_eq!(f.content(), b"a");
        assert!(matches!(f.step(Ok(b"a".to_vec())), Read::Unchanged));
        assert!(matches!(f.step(Ok(b"b".to_vec())), Read::Content));
        assert_eq!(f.content(), b"b");
    }

    #[test]
    fn failures_back_off_are_logged_once_and_a_success_resets_them() {
        let mut f = file(false);
        let delays: Vec<(Duration, bool)> = (0..3)
            .map(|_| match f.step(Err(io())) {
                Read::Failed {
                    delay, repeated, ..
                } => (delay, repeated),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            delays,
            [
                (Duration::from_millis(100), false),
                (Duration::from_millis(200), true),
                (Duration::from_millis(400), true),
            ]
        );
        assert!(matches!(
            f.step(Err(changing())),
            Read::Changing { delay, .. } if delay == Duration::from_millis(800)
        ));
        assert!(matches!(f.step(Ok(b"a".to_vec())), Read::Content));
        assert!(matches!(
            f.step(Err(io())),
            Read::Failed { delay, repeated: false, .. } if delay == Duration::from_millis(100)
        ));
    }

    #[test]
    fn a_missing_file_forgets_the_content_and_says_whether_it_had_some() {
        let mut f = file(false);
        assert!(matches!(
            f.step(Err(missing())),
            Read::Missing {
                repeated: false,
                had_content: false,
                ..
            }
        ));
        assert!(matches!(
            f.step(Err(missing())),
            Read::Missing { repeated: true, .. }
        ));
        assert!(matches!(f.step(Ok(b"a".to_vec())), Read::Content));
        assert!(matches!(
            f.step(Err(missing())),
            Read::Missing {
                repeated: false,
                had_content: true,
                ..
            }
        ));
        assert!(
            matches!(f.step(Ok(b"a".to_vec())), Read::Content),
            "re-created with the same bytes: applied again"
        );
    }

    #[test]
    fn forget_on_error_decides_whether_a_failure_forgets_the_content() {
        let mut keep = file(false);
        let mut forget = file(true);
        for f in [&mut keep, &mut forget] {
            assert!(matches!(f.step(Ok(b"a".to_vec())), Read::Content));
            assert!(matches!(f.step(Err(io())), Read::Failed { .. }));
        }
        assert!(matches!(keep.step(Ok(b"a".to_vec())), Read::Unchanged));
        assert!(matches!(forget.step(Ok(b"a".to_vec())), Read::Content));
        // A writer at work forgets nothing either way.
        assert!(matches!(
            forget.step(Err(changing())),
            Read::Changing { .. }
        ));
        assert!(matches!(forget.step(Ok(b"a".to_vec())), Read::Unchanged));
    }

    #[tokio::test(start_paused = true)]
    async fn emptied_content_applies_only_after_the_settle_period() {
        let mut f = file(false);
        let t0 = Instant::now();
        assert_eq!(f.settle(false, t0), Settle::Apply);
        assert_eq!(
            f.settle(true, t0),
            Settle::Wait {
                waited: Duration::ZERO,
                remaining: EMPTY_SETTLE
            }
        );
        // Pending: the same bytes are read again rather than skipped.
        assert!(matches!(f.step(Ok(Vec::new())), Read::Content));
        assert!(matches!(f.step(Ok(Vec::new())), Read::Content));
        let t4 = t0 + Duration::from_secs(4);
        assert_eq!(
            f.settle(true, t4),
            Settle::Wait {
                waited: Duration::from_secs(4),
                remaining: Duration::from_secs(1)
            },
            "the period runs from the first empty read"
        );
        assert_eq!(f.settle(true, t0 + EMPTY_SETTLE), Settle::Settled);
        assert!(matches!(f.step(Ok(Vec::new())), Read::Unchanged));
        // Content in between ends the wait; the next emptiness starts over.
        assert!(matches!(f.settle(true, t4), Settle::Wait { .. }));
        assert_eq!(f.settle(false, t4), Settle::Apply);
        assert_eq!(
            f.settle(true, t4 + EMPTY_SETTLE / 2),
            Settle::Wait {
                waited: Duration::ZERO,
                remaining: EMPTY_SETTLE
            }
        );
        f.clear_emptied();
        assert!(matches!(
            f.settle(true, t4 + EMPTY_SETTLE),
            Settle::Wait { waited, .. } if waited.is_zero()
        ));
    }

    /// Counts reloads and answers each with the next of `answers` (then `None`).
    struct Counting {
        reloads: Arc<AtomicUsize>,
        started: Arc<AtomicUsize>,
        answers: Vec<Option<Duration>>,
    }

    impl Reload for Counting {
        async fn reload(&mut self) -> Option<Duration> {
            let n = self.reloads.fetch_add(1, Ordering::SeqCst);
            self.answers.get(n).copied().flatten()
        }

        fn started(&mut self) {
            self.started.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting(answers: Vec<Option<Duration>>) -> (Counting, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let reloads = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(AtomicUsize::new(0));
        let c = Counting {
            reloads: reloads.clone(),
            started: started.clone(),
            answers,
        };
        (c, reloads, started)
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_reads_at_start_then_on_changes_and_on_its_retry_timer() {
        let (tick, watcher) = PathWatcher::manual(Path::new("dir/f.yaml"));
        let (mut reloader, reloads, started) = counting(vec![
            None,
            Some(Duration::from_secs(3)),
            Some(Duration::from_secs(1)),
        ]);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut watchers = [watcher];
            follow(
                &mut watchers,
                &mut reloader,
                FollowOptions {
                    read_at_start: true,
                },
                async {
                    let _ = stopped.await;
                },
            )
            .await
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(reloads.load(Ordering::SeqCst), 1, "the read at start only");
        assert_eq!(started.load(Ordering::SeqCst), 1);

        tick.send(()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(reloads.load(Ordering::SeqCst), 2, "a change");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(reloads.load(Ordering::SeqCst), 3, "the retry asked for");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(reloads.load(Ordering::SeqCst), 4, "and the next one");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(reloads.load(Ordering::SeqCst), 4, "no retry asked: waits");

        stop.send(()).unwrap();
        assert!(task.await.unwrap().is_ok());
        assert_eq!(started.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_read_at_start_the_loop_waits_for_a_change_of_any_watcher() {
        let (_a, first) = PathWatcher::manual(Path::new("dir/cert.pem"));
        let (b, second) = PathWatcher::manual(Path::new("dir/key.pem"));
        let (mut reloader, reloads, started) = counting(Vec::new());
        let task = tokio::spawn(async move {
            let mut watchers = [first, second];
            follow(
                &mut watchers,
                &mut reloader,
                FollowOptions::default(),
                std::future::pending(),
            )
            .await
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(reloads.load(Ordering::SeqCst), 0);
        b.send(()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(reloads.load(Ordering::SeqCst), 1);
        assert_eq!(started.load(Ordering::SeqCst), 0);

        // A watcher that stops ends the loop, naming its path.
        drop(b);
        let err = task.await.unwrap().unwrap_err();
        assert!(
            matches!(&err, WatchError::Stopped { path } if path == Path::new("dir/key.pem")),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_the_loop_in_the_middle_of_a_reload() {
        struct Stuck;
        impl Reload for Stuck {
            async fn reload(&mut self) -> Option<Duration> {
                std::future::pending().await
            }
        }
        let (_tick, watcher) = PathWatcher::manual(Path::new("dir/f.yaml"));
        let mut watchers = [watcher];
        let result = follow(
            &mut watchers,
            &mut Stuck,
            FollowOptions {
                read_at_start: true,
            },
            tokio::time::sleep(Duration::from_secs(1)),
        )
        .await;
        assert!(result.is_ok());
    }
}
