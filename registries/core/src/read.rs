//! Reading watched files (the mock registry file, `--configDir` files, the mesh
//! files) so that no file can hang, exhaust or mislead the control plane. The rules,
//! in one place:
//!
//! - **Regular files only.** The path (symlinks followed) must be a regular file; a
//!   directory, FIFO, socket or device is refused by its type before it is opened
//!   for reading, so `/dev/zero` or a FIFO without a writer never blocks or fills
//!   memory. The file is opened non-blocking and its type checked again on the open
//!   handle, so a path swapped for a FIFO between the two checks cannot block either.
//! - **A size limit** (`--maxConfigFileSize`, default [`DEFAULT_MAX_FILE_SIZE`]): a
//!   larger file is refused by its size, and the read itself stops after `limit + 1`
//!   bytes, so memory stays bounded by the limit whatever the file claims.
//! - **Settled content only.** After the read the path is looked up again: if it now
//!   names another file (an atomic replace), or the size or modification time moved,
//!   or fewer or more bytes came than the size said, a writer was at work and the
//!   read is [`ReadError::Changing`]. Callers re-read a little later.
//! - **Retry.** Every failure other than [`ReadError::Missing`] (a missing file is a
//!   state, reported once) is retried by the caller with a [`Backoff`]:
//!   [`RETRY_INITIAL`] doubling to [`RETRY_MAX`], reset by a good read. A change
//!   notification re-reads at once in between. A transient error (`EMFILE`, `EIO`)
//!   thus heals on its own instead of leaving stale config until the next edit.
//!
//! Reads run on tokio's blocking pool ([`read_watched_file`]), so a slow file system
//! never stalls the runtime, and shutdown does not wait for them (the binary ends its
//! runtime with a deadline).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The default size limit of a watched file: 64 MiB, far above any hand-written
/// config, low enough that a mistake (a log file, a disk image) cannot take gigabytes.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 64 * 1024 * 1024;

/// The command-line flag that sets the size limit, named in errors.
pub const MAX_FILE_SIZE_FLAG: &str = "--maxConfigFileSize";

/// How long a watched file emptied after it had content must stay empty before the
/// emptiness counts: a writer that truncates the file and fills it later
/// (`{ sleep 1; cat good.yaml; } > file`) is not a deletion of everything in it.
pub const EMPTY_SETTLE: Duration = Duration::from_secs(5);

/// Whether a YAML file holds nothing: only whitespace, comments and document markers.
pub fn is_blank(bytes: &[u8]) -> bool {
    bytes.split(|b| *b == b'\n').all(|line| {
        let line = line.trim_ascii();
        line.is_empty() || line.starts_with(b"#") || line == b"---" || line == b"..."
    })
}

/// The first delay before a failed read is retried.
pub const RETRY_INITIAL: Duration = Duration::from_millis(100);

/// The longest delay between retries of a read that keeps failing.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// Why a watched file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Nothing is at the path (or a symlink there dangles). A state, not a failure
    /// to retry: the watch reports the file's creation.
    #[error("{}: the file does not exist", .path.display())]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The path is not a regular file (a directory, FIFO, socket or device). It was
    /// not read.
    #[error("{}: not a regular file (it is {kind}); only regular files are read", .path.display())]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is instead ("a directory", "a FIFO", ...).
        kind: &'static str,
    },
    /// The file is larger than the size limit. At most `limit + 1` bytes were read.
    #[error(
        "{}: the file is larger than the size limit of {limit} bytes (raise it with {MAX_FILE_SIZE_FLAG})",
        .path.display()
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The size limit in bytes.
        limit: u64,
    },
    /// A writer changed the file while it was read (its size or modification time
    /// moved, or the path was replaced): the bytes may be half-written.
    #[error("{}: the file changed while it was read", .path.display())]
    Changing {
        /// The file.
        path: PathBuf,
    },
    /// Any other I/O error (permissions, too many open files, an I/O error).
    #[error("{}: cannot read the file: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl ReadError {
    /// Whether nothing is at the path.
    pub fn is_missing(&self) -> bool {
        matches!(self, ReadError::Missing { .. })
    }

    /// Whether the read raced a writer (re-read soon; not worth an error log).
    pub fn is_changing(&self) -> bool {
        matches!(self, ReadError::Changing { .. })
    }

    /// The message without the leading `path: `, for callers that name the file
    /// themselves.
    pub fn reason(&self) -> String {
        let message = self.to_string();
        let path = match self {
            ReadError::Missing { path }
            | ReadError::NotRegular { path, .. }
            | ReadError::TooLarge { path, .. }
            | ReadError::Changing { path }
            | ReadError::Io { path, .. } => path,
        };
        match message.strip_prefix(&format!("{}: ", path.display())) {
            Some(reason) => reason.to_string(),
            None => message,
        }
    }

    fn io(path: &Path, source: std::io::Error) -> ReadError {
        if source.kind() == std::io::ErrorKind::NotFound {
            ReadError::Missing {
                path: path.to_path_buf(),
            }
        } else {
            ReadError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    }
}

/// Reads the watched file at `path` under the rules of the module, on tokio's
/// blocking pool. Needs a tokio runtime.
pub async fn read_watched_file(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let owned = path.to_path_buf();
    match tokio::task::spawn_blocking(move || read_watched_file_blocking(&owned, limit)).await {
        Ok(read) => read,
        Err(e) => Err(ReadError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        }),
    }
}

/// [`read_watched_file`] on the calling thread, for callers already on a blocking
/// thread (the config directory reader).
pub fn read_watched_file_blocking(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    // The type first, by path: a FIFO or device is refused before it is opened
    // (opening some devices has effects of its own).
    let meta = std::fs::metadata(path).map_err(|e| ReadError::io(path, e))?;
    check_file(path, &meta, limit)?;
    let mut file = open_nonblocking(path).map_err(|e| ReadError::io(path, e))?;
    // Again on the open handle: the path may have been swapped in between.
    let before = file.metadata().map_err(|e| ReadError::io(path, e))?;
    check_file(path, &before, limit)?;
    let bytes = read_limited(&mut file, before.len(), limit).ok_or(ReadError::TooLarge {
        path: path.to_path_buf(),
        limit,
    })?;
    let bytes = bytes.map_err(|e| ReadError::io(path, e))?;
    let after = match std::fs::metadata(path) {
        Ok(after) => after,
        // Deleted or renamed away during the read: what was read is no longer the file.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ReadError::Changing {
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(ReadError::io(path, e)),
    };
    if Stamp::of(&before) != Stamp::of(&after) || bytes.len() as u64 != before.len() {
        return Err(ReadError::Changing {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

/// Refuses what is not a regular file, and a regular file over the limit.
fn check_file(path: &Path, meta: &std::fs::Metadata, limit: u64) -> Result<(), ReadError> {
    if let Some(kind) = not_regular(meta) {
        return Err(ReadError::NotRegular {
            path: path.to_path_buf(),
            kind,
        });
    }
    if meta.len() > limit {
        return Err(ReadError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    Ok(())
}

/// What a non-regular file is, for the message; `None` for a regular file.
fn not_regular(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("a FIFO");
        }
        if t.is_socket() {
            return Some("a socket");
        }
        if t.is_char_device() {
            return Some("a character device");
        }
        if t.is_block_device() {
            return Some("a block device");
        }
    }
    Some("not a file")
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a FIFO does not wait for a writer. No effect on the reads of
    // a regular file, the only kind read.
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

/// Reads at most `limit + 1` bytes: `None` when there were more than `limit`. The
/// buffer starts at the expected size (capped by the limit).
fn read_limited(
    reader: &mut impl Read,
    expected: u64,
    limit: u64,
) -> Option<std::io::Result<Vec<u8>>> {
    let capacity = usize::try_from(expected.min(limit).saturating_add(1)).unwrap_or(0);
    let mut bytes = Vec::with_capacity(capacity);
    if let Err(e) = reader.take(limit.saturating_add(1)).read_to_end(&mut bytes) {
        return Some(Err(e));
    }
    if bytes.len() as u64 > limit {
        return None;
    }
    Some(Ok(bytes))
}

/// What identifies one version of a file: which file it is, its size and its
/// modification time.
#[derive(Debug, PartialEq, Eq)]
struct Stamp {
    #[cfg(unix)]
    dev_ino: (u64, u64),
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt;
        Stamp {
            #[cfg(unix)]
            dev_ino: (meta.dev(), meta.ino()),
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }
}

/// Retry delays for a read that keeps failing: `initial`, doubled per failure up to
/// `max`; [`Backoff::reset`] after a success.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Default for Backoff {
    /// [`RETRY_INITIAL`] doubling to [`RETRY_MAX`].
    fn default() -> Backoff {
        Backoff::new(RETRY_INITIAL, RETRY_MAX)
    }
}

impl Backoff {
    /// Delays from `initial`, doubling, capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay before the next retry; the one after it is twice as long.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (delay * 2).min(self.max);
        delay
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn blank_files_hold_only_whitespace_comments_and_markers() {
        assert!(super::is_blank(b""));
        assert!(super::is_blank(b"  \n# services: []\n---\n\t\n"));
        assert!(!super::is_blank(b"# header\nservices: []\n"));
    }

    use super::*;
    use std::fs;

    /// Reads on the runtime with a deadline, so a read that blocks fails the test
    /// instead of hanging it.
    async fn read_within(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
        tokio::time::timeout(Duration::from_secs(10), read_watched_file(path, limit))
            .await
            .expect("the read must not block")
    }

    #[tokio::test]
    async fn reads_a_regular_file_and_names_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.yaml");
        let err = read_within(&path, 100).await.unwrap_err();
        assert!(err.is_missing(), "{err:?}");
        fs::write(&path, "abc").unwrap();
        assert_eq!(read_within(&path, 100).await.unwrap(), b"abc");
        assert_eq!(read_within(&path, 3).await.unwrap(), b"abc", "at the limit");
        fs::write(&path, "").unwrap();
        assert_eq!(read_within(&path, 100).await.unwrap(), b"");
    }

    #[tokio::test]
    async fn devices_are_refused_without_reading() {
        // The old read of /dev/zero never returned and grew by a gigabyte a second.
        let err = read_within(Path::new("/dev/zero"), DEFAULT_MAX_FILE_SIZE)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ReadError::NotRegular {
                    kind: "a character device",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "/dev/zero: not a regular file (it is a character device); only regular files are read"
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo.yaml");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let err = read_within(&path, 100).await.unwrap_err();
        assert!(
            matches!(err, ReadError::NotRegular { kind: "a FIFO", .. }),
            "{err:?}"
        );
        // Even the open that follows the type check does not wait for a writer.
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::task::spawn_blocking(move || open_nonblocking(&path)),
        )
        .await
        .expect("opening a FIFO must not block")
        .unwrap()
        .unwrap();
    }

    #[tokio::test]
    async fn a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_within(dir.path(), 100).await.unwrap_err();
        assert!(
            matches!(
                err,
                ReadError::NotRegular {
                    kind: "a directory",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_file_over_the_limit_is_refused_naming_the_limit_and_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.yaml");
        fs::write(&path, "x".repeat(101)).unwrap();
        let err = read_within(&path, 100).await.unwrap_err();
        assert!(
            matches!(err, ReadError::TooLarge { limit: 100, .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("larger than the size limit of 100 bytes")
                && msg.contains("--maxConfigFileSize")
                && msg.contains("big.yaml"),
            "{msg}"
        );
        // A sparse file of a gigabyte is refused by its size, without reading it.
        let sparse = dir.path().join("sparse.yaml");
        fs::File::create(&sparse).unwrap().set_len(1 << 30).unwrap();
        let err = read_within(&sparse, 1024).await.unwrap_err();
        assert!(matches!(err, ReadError::TooLarge { .. }), "{err:?}");
    }

    #[test]
    fn the_read_stops_after_limit_plus_one_byte() {
        // An endless source (what a device looks like): the read must end, holding at
        // most limit + 1 bytes, even when the size said the file was small.
        let mut endless = std::io::repeat(b'a');
        assert!(read_limited(&mut endless, 0, 1000).is_none());
        let mut counted = Counting(std::io::repeat(b'a'), 0);
        assert!(read_limited(&mut counted, 10, 1000).is_none());
        assert!(counted.1 <= 1001, "read {} bytes", counted.1);
        let mut short: &[u8] = b"abc";
        assert_eq!(read_limited(&mut short, 3, 3).unwrap().unwrap(), b"abc");
    }

    struct Counting<R>(R, u64);

    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1 += n as u64;
            Ok(n)
        }
    }

    #[test]
    fn a_write_or_a_replacement_changes_the_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.yaml");
        fs::write(&path, "abc").unwrap();
        let first = Stamp::of(&fs::metadata(&path).unwrap());
        assert_eq!(first, Stamp::of(&fs::metadata(&path).unwrap()));
        {
            use std::io::Write;
            let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
            f.write_all(b"d").unwrap();
        }
        let grown = Stamp::of(&fs::metadata(&path).unwrap());
        assert_ne!(first, grown, "size moved");
        // Same size, another inode: an atomic replacement.
        let tmp = dir.path().join("f.tmp");
        fs::write(&tmp, "abcd").unwrap();
        fs::rename(&tmp, &path).unwrap();
        assert_ne!(grown, Stamp::of(&fs::metadata(&path).unwrap()), "replaced");
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<Duration> = (0..11).map(|_| b.next_delay()).collect();
        assert_eq!(delays[0], Duration::from_millis(100));
        assert_eq!(delays[1], Duration::from_millis(200));
        assert_eq!(delays[8], Duration::from_millis(25_600));
        assert_eq!(delays[9], RETRY_MAX);
        assert_eq!(delays[10], RETRY_MAX);
        b.reset();
        assert_eq!(b.next_delay(), RETRY_INITIAL);
    }
}
