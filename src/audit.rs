//! The audit log: one JSON line per call, appended to a file only toolgate's user can
//! read, saying who called what, what was decided and by which rule, and how it ended.
//!
//! Recording must never slow a call down. [`AuditLog::record`] only puts the record on
//! a bounded channel; a dedicated writer thread redacts, encodes and appends it. When
//! the channel is full (the disk is stalled, or calls arrive faster than it can take
//! them), or the records waiting hold more than [`MAX_QUEUED_BYTES`], the record is
//! **dropped and counted** rather than making the call wait: a daemon whose tool calls
//! hang on a slow disk is worse than an audit trail with a counted, logged gap.
//! [`AuditLog::dropped`] reports the count (for `daemon/status`) and every power-of-two
//! drop logs a warning.
//!
//! [`AuditLog::flush`] waits until everything queued before it is written and synced
//! to disk; the daemon calls it at shutdown.
//!
//! What is written of the arguments is decided in `audit/redact.rs`: secrets redacted
//! by key and by pattern in free text, file contents and oversized values as size and
//! SHA-256. Each record carries the hash of the record before it (`audit/chain.rs`),
//! across rotated files too, so that `toolgate audit verify` names the first record
//! that was changed, removed or inserted.
//!
//! The live file is rotated by size ([`AuditSettings`]): `audit.jsonl` becomes
//! `audit.jsonl.1`, `.1` becomes `.2`, and files beyond `keep_files` are deleted.
//! Several toolgate processes (a daemon and the `toolgate mcp` servers of MCP hosts)
//! may share one log: each batch is appended under an exclusive `flock` of the live
//! file, after reading the hash of its last line, so the chain stays one chain.

mod chain;
mod redact;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{FlockOperation, flock};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

pub use self::chain::{Break, GENESIS, Report, line_hash, rotated, verify};
pub use self::redact::{CONTENT_KEYS, REDACTED, looks_secret, redact, redact_text};
use crate::tools::ErrorType;

/// Records waiting for the writer. Reaching it means the disk is stuck, not merely
/// slow: 4096 calls is far more than a healthy disk ever lets pile up.
pub const CHANNEL_CAPACITY: usize = 4096;

/// What the records waiting for the writer may hold in all (their arguments are
/// summarized only by the writer). A burst of calls carrying megabytes each is
/// dropped and counted beyond it rather than held in memory.
pub const MAX_QUEUED_BYTES: usize = 256 * 1024 * 1024;

/// Records the writer encodes before issuing one `write`: bounds the batch buffer
/// while still turning a burst into few system calls.
const MAX_BATCH: usize = 256;

/// How long the writer lets records gather after the first one woke it. Well below
/// what anyone reading the log would notice; at 60,000 calls a second it gathers a
/// few hundred records, inside [`CHANNEL_CAPACITY`].
const COALESCE: std::time::Duration = std::time::Duration::from_millis(2);

/// What a record's link to the one before adds to its line: `,"prev":"`, the hash in
/// hexadecimal, `"}`.
const LINK_BYTES: usize = 9 + 64 + 2;

/// Written records held for the threads that record to drop (see [`Spent`]).
const SPENT_RECORDS: usize = MAX_BATCH;

/// The largest record (as [`AuditLog::record`] estimates it) handed back to be
/// dropped by a recording thread; larger ones are dropped by the writer.
const SPENT_RECORD_BYTES: usize = 2048;

/// `[audit]`: rotation and the size of what is recorded of a call's arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    /// The live file is rotated before a record would take it past this size.
    pub max_file_bytes: u64,
    /// Rotated files kept next to the live one; older ones are deleted.
    pub keep_files: usize,
    /// Text values longer than this, and arguments larger than this once encoded, are
    /// recorded as their size and SHA-256.
    pub max_arguments_bytes: usize,
}

impl Default for AuditSettings {
    fn default() -> AuditSettings {
        AuditSettings {
            max_file_bytes: 64 * 1024 * 1024,
            keep_files: 4,
            max_arguments_bytes: 16 * 1024,
        }
    }
}

impl AuditSettings {
    /// Checks the values; an error names the key and what is wrong with it.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.max_file_bytes < 4096 {
            return Err(("max_file_bytes", "must be at least 4096".to_owned()));
        }
        if self.max_arguments_bytes < 256 {
            return Err(("max_arguments_bytes", "must be at least 256".to_owned()));
        }
        Ok(())
    }
}

/// One call, as the audit log records it (written by [`Encoded`]).
#[derive(Clone, Debug, PartialEq)]
pub struct AuditRecord {
    /// When the call finished; written as RFC 3339 UTC with milliseconds.
    pub ts: SystemTime,
    pub session_id: Arc<str>,
    /// Who called: the peer's uid or the token's name.
    pub client: Arc<str>,
    pub call_id: Arc<str>,
    pub tool: Arc<str>,
    /// The call's arguments (redacted when written; shared with the call's events).
    pub arguments: Arc<Value>,
    /// Who decided, and how (the same object as in `tool_call_done` events).
    pub decision: crate::permission::CallDecision,
    /// The rule that decided as `<list>: <rule as written>`, or the deciding layer.
    pub rule: Option<Cow<'static, str>>,
    pub ok: bool,
    pub error_type: Option<ErrorType>,
    /// Wall time of the whole call, hooks and approval included; written as
    /// `duration_ms` (fractional milliseconds).
    pub duration: Duration,
    /// The kernel sandbox a command of the call ran in (`sandbox_profile` of its
    /// result, else its `sandbox`); absent for calls that run no command.
    pub sandbox: Option<Value>,
}

/// A record as its line says it, arguments as the log keeps them: redacted while
/// they are written ([`redact::Prepared`]), never copied for it.
struct Encoded<'a> {
    record: &'a AuditRecord,
    arguments: redact::Prepared<'a>,
}

impl Serialize for Encoded<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let record = self.record;
        let mut line = s.serialize_struct("AuditRecord", 12)?;
        // The time goes straight into the line, without a string of its own.
        line.serialize_field("ts", &Rfc3339(record.ts))?;
        line.serialize_field("session_id", &*record.session_id)?;
        line.serialize_field("client", &*record.client)?;
        line.serialize_field("call_id", &*record.call_id)?;
        line.serialize_field("tool", &*record.tool)?;
        line.serialize_field("arguments", &self.arguments)?;
        line.serialize_field("decision", &record.decision)?;
        line.serialize_field("rule", &record.rule)?;
        line.serialize_field("ok", &record.ok)?;
        line.serialize_field("error_type", &record.error_type)?;
        // Microsecond resolution is plenty and keeps the numbers short.
        let duration_ms = (record.duration.as_secs_f64() * 1_000_000.0).round() / 1000.0;
        line.serialize_field("duration_ms", &duration_ms)?;
        match &record.sandbox {
            Some(sandbox) => line.serialize_field("sandbox", sandbox)?,
            None => line.skip_field("sandbox")?,
        }
        line.end()
    }
}

/// Formats a time as RFC 3339 in UTC with milliseconds (`2026-01-31T09:05:00.250Z`).
/// Times before 1970 are clamped to the epoch.
pub fn rfc3339_utc(ts: SystemTime) -> String {
    Rfc3339(ts).to_string()
}

/// A time shown as [`rfc3339_utc`] writes it.
struct Rfc3339(SystemTime);

impl Rfc3339 {
    /// Year, month, day, hour, minute, second and millisecond, in UTC.
    fn fields(&self) -> [u64; 7] {
        let since_epoch = self.0.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since_epoch.as_secs();
        let (year, month, day) = civil_from_days(secs / 86_400);
        let secs_of_day = secs % 86_400;
        [
            year,
            month,
            day,
            secs_of_day / 3600,
            secs_of_day % 3600 / 60,
            secs_of_day % 60,
            u64::from(since_epoch.subsec_millis()),
        ]
    }

    /// The text, its digits put in place one by one: every record's line has one, and
    /// the formatting machinery took more than the rest of the line's fields. `None`
    /// past the year 9999, where the year takes more than four digits.
    fn fixed(&self) -> Option<[u8; 24]> {
        /// Where each of [`Rfc3339::fields`] goes.
        const PLACES: [std::ops::Range<usize>; 7] =
            [0..4, 5..7, 8..10, 11..13, 14..16, 17..19, 20..23];
        let fields = self.fields();
        if fields[0] > 9999 {
            return None;
        }
        let mut text = *b"0000-00-00T00:00:00.000Z";
        for (place, mut value) in PLACES.into_iter().zip(fields) {
            for digit in text[place].iter_mut().rev() {
                // Below ten: one ASCII digit.
                *digit = b'0' + (value % 10) as u8;
                value /= 10;
            }
        }
        Some(text)
    }

    /// The same text through the formatting machinery, for years of any length.
    fn formatted(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [year, month, day, hour, minute, second, millis] = self.fields();
        write!(f, "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millis:03}Z")
    }
}

impl std::fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.fixed() {
            Some(text) => f.write_str(std::str::from_utf8(&text).map_err(|_| std::fmt::Error)?),
            None => self.formatted(f),
        }
    }
}

/// Serialized as one string, straight from [`Rfc3339::fixed`] where it applies.
impl Serialize for Rfc3339 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.fixed() {
            Some(text) => match std::str::from_utf8(&text) {
                Ok(text) => s.serialize_str(text),
                Err(err) => Err(serde::ser::Error::custom(err)),
            },
            None => s.collect_str(self),
        }
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, restricted to non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Why the audit log could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot create the audit log directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open the audit log {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the audit log writer: {0}")]
    Spawn(#[source] io::Error),
    #[error("writing the audit log {} failed: {message}", path.display())]
    Write { path: PathBuf, message: String },
    #[error("the audit log writer has stopped")]
    Stopped,
}

enum Message {
    /// A record, and what [`AuditLog::record`] counted it as in the queue.
    Record(Box<AuditRecord>, usize),
    /// Answered once everything queued before it is written and synced.
    Flush(oneshot::Sender<Result<(), String>>),
}

/// A handle on the audit log; cheap to clone, every clone feeds the same writer. The
/// writer thread ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct AuditLog {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    tx: mpsc::Sender<Message>,
    dropped: AtomicU64,
    /// Bytes the queued records hold (approximately), against [`MAX_QUEUED_BYTES`].
    queued: Arc<AtomicUsize>,
    spent: Arc<Spent>,
    path: PathBuf,
}

/// Records the writer has written, handed back to be dropped where records are made.
///
/// A record's memory comes from the heap of the thread that built it (the call's
/// arguments, the record's box). Freed by the writer thread, which makes nothing of
/// those sizes, nearly every block would go back through that heap's lock, taken
/// while calls allocate from it on their own thread. [`AuditLog::record`] instead drops
/// one written record as it queues the next one: the blocks it frees are those the
/// next call allocates again, taken from the thread's own cache without a lock.
/// Small records only ([`SPENT_RECORD_BYTES`]) and at most [`SPENT_RECORDS`] of them
/// wait here; the writer drops the others itself.
#[derive(Debug, Default)]
struct Spent(Mutex<VecDeque<Box<AuditRecord>>>);

impl Spent {
    /// One written record, if there is one and the writer is not handing some back
    /// right now (a call never waits for it).
    fn take(&self) -> Option<Box<AuditRecord>> {
        self.0.try_lock().ok()?.pop_front()
    }

    /// Hands written records back; those beyond the bound are dropped here.
    #[expect(clippy::vec_box, reason = "the box is the block to free on a call's thread")]
    fn give_back(&self, records: &mut Vec<Box<AuditRecord>>) {
        if let Ok(mut spent) = self.0.lock() {
            let room = SPENT_RECORDS.saturating_sub(spent.len());
            let kept = records.len().min(room);
            spent.extend(records.drain(..kept));
        }
        records.clear();
    }
}

impl AuditLog {
    /// An audit log that records nothing (`audit_log = false`).
    pub fn disabled() -> AuditLog {
        AuditLog { inner: None }
    }

    /// Opens the configured log: `None` is a disabled one.
    pub fn open_configured(
        path: Option<&Path>,
        settings: &AuditSettings,
    ) -> Result<AuditLog, AuditError> {
        match path {
            Some(path) => AuditLog::open(path, settings),
            None => Ok(AuditLog::disabled()),
        }
    }

    /// Opens (creating it and its directories if needed) the log at `path` and starts
    /// its writer thread. Missing directories are created with mode 0700 and the file
    /// with 0600; an existing file readable by others is narrowed to 0600. A symlink
    /// at `path` is refused, so nobody can redirect the log by planting one.
    pub fn open(path: &Path, settings: &AuditSettings) -> Result<AuditLog, AuditError> {
        let (log, writer) = AuditLog::with_writer(path, settings, CHANNEL_CAPACITY)?;
        std::thread::Builder::new()
            .name("toolgate-audit".to_owned())
            .spawn(move || {
                writer.run();
            })
            .map_err(AuditError::Spawn)?;
        Ok(log)
    }

    /// The handle and its not yet started writer.
    fn with_writer(
        path: &Path,
        settings: &AuditSettings,
        capacity: usize,
    ) -> Result<(AuditLog, Writer), AuditError> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| AuditError::CreateDir { path: dir.to_owned(), source })?;
        }
        let file =
            open_file(path).map_err(|source| AuditError::Open { path: path.to_owned(), source })?;
        let (tx, rx) = mpsc::channel(capacity);
        let queued = Arc::new(AtomicUsize::new(0));
        let spent = Arc::new(Spent::default());
        let inner = Inner {
            tx,
            dropped: AtomicU64::new(0),
            queued: queued.clone(),
            spent: spent.clone(),
            path: path.to_owned(),
        };
        let writer = Writer {
            rx,
            queued,
            spent,
            path: path.to_owned(),
            settings: settings.clone(),
            file,
            known_len: 0,
            last_hash: None,
            failure: None,
        };
        Ok((AuditLog { inner: Some(Arc::new(inner)) }, writer))
    }

    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// The log's file, when enabled.
    pub fn path(&self) -> Option<&Path> {
        self.inner.as_ref().map(|inner| inner.path.as_path())
    }

    /// Queues one record without waiting. A full queue drops it (see the module
    /// documentation for why).
    pub fn record(&self, record: AuditRecord) {
        let Some(inner) = &self.inner else {
            return;
        };
        drop(inner.spent.take());
        let size = redact::approximate_size(&record.arguments) + 512;
        let before = inner.queued.fetch_add(size, Ordering::Relaxed);
        let outcome = if before.saturating_add(size) > MAX_QUEUED_BYTES {
            Err("the queue holds too many bytes")
        } else {
            inner.tx.try_send(Message::Record(Box::new(record), size)).map_err(|err| match err {
                mpsc::error::TrySendError::Full(_) => "the queue is full",
                mpsc::error::TrySendError::Closed(_) => "the writer has stopped",
            })
        };
        if let Err(reason) = outcome {
            inner.queued.fetch_sub(size, Ordering::Relaxed);
            let dropped = inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(
                    path = %inner.path.display(),
                    dropped,
                    "audit record dropped: {reason}"
                );
            }
        }
    }

    /// Records dropped so far because the queue was full or the writer had stopped.
    pub fn dropped(&self) -> u64 {
        self.inner.as_ref().map_or(0, |inner| inner.dropped.load(Ordering::Relaxed))
    }

    /// Waits until every record queued before this call is written and synced to
    /// disk. Reports a write failure that happened since the previous flush.
    pub async fn flush(&self) -> Result<(), AuditError> {
        let Some(inner) = &self.inner else {
            return Ok(());
        };
        let (tx, rx) = oneshot::channel();
        inner.tx.send(Message::Flush(tx)).await.map_err(|_| AuditError::Stopped)?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(AuditError::Write { path: inner.path.clone(), message }),
            Err(_) => Err(AuditError::Stopped),
        }
    }
}

/// Opens the live file for appending (and reading its tail): created 0600, never
/// through a symlink, narrowed to 0600 when others could read it.
fn open_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let permissions = file.metadata()?.permissions();
    if permissions.mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(file)
}

/// Device and inode: what tells whether a path still names an open file.
type FileId = (u64, u64);

fn file_id(file: &File) -> io::Result<FileId> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

fn path_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path).ok().map(|meta| (meta.dev(), meta.ino()))
}

/// How long the writer waits for the lock before appending without it.
const LOCK_PATIENCE: Duration = Duration::from_secs(2);

/// Takes the exclusive lock of the live file. Other toolgate processes hold it for one
/// append; anything holding it longer (a command running `flock` on the log) must not
/// stall the writer, and with it the daemon's shutdown, so after [`LOCK_PATIENCE`] the
/// append goes ahead without it (and may fork the chain, which verification shows).
fn lock_exclusive(file: &File, path: &Path) -> io::Result<()> {
    let start = std::time::Instant::now();
    loop {
        match flock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(err) if err == rustix::io::Errno::WOULDBLOCK => {}
            Err(err) => return Err(err.into()),
        }
        if start.elapsed() >= LOCK_PATIENCE {
            tracing::warn!(
                path = %path.display(),
                "the audit log has been locked by another process for {LOCK_PATIENCE:?}; \
                 appending without the lock"
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The writer thread's state.
struct Writer {
    rx: mpsc::Receiver<Message>,
    queued: Arc<AtomicUsize>,
    /// Where written records go back to (see [`Spent`]).
    spent: Arc<Spent>,
    path: PathBuf,
    settings: AuditSettings,
    /// The live file as this writer last opened it.
    file: File,
    /// The file's length after this writer's last append, and the hash of the record
    /// it appended last: what the file must still end with unless someone else wrote.
    known_len: u64,
    last_hash: Option<[u8; 32]>,
    /// The first write failure since the last flush, reported to that flush.
    failure: Option<String>,
}

impl Writer {
    /// Runs until every [`AuditLog`] handle is gone, then syncs once more. Returns how
    /// many times it paused to let records gather.
    fn run(mut self) -> u64 {
        let mut lines = Vec::new();
        let mut written = Vec::new();
        let mut flushes = Vec::new();
        let mut pauses = 0;
        // The last batch was cut at `MAX_BATCH`: more records are waiting already.
        let mut behind = false;
        while let Some(first) = self.rx.blocking_recv() {
            // A record wakes the writer; the records of the next few milliseconds then
            // join it in one write. Senders find nobody waiting meanwhile, so a busy
            // daemon wakes this thread a few hundred times a second at most instead of
            // once per call. A flush is never delayed, and neither is a record found
            // waiting behind a full batch: pausing then would cap the writer at one
            // batch per pause (and a pause lasts longer than asked on a loaded
            // machine), however fast the calls come.
            if matches!(first, Message::Record(..)) && !behind {
                std::thread::sleep(COALESCE);
                pauses += 1;
            }
            let mut next = Some(first);
            let mut n_taken = 0;
            while let Some(message) = next.take() {
                match message {
                    Message::Record(record, size) => {
                        if let Some(line) = self.encode(&record, size) {
                            lines.push(line);
                        }
                        self.queued.fetch_sub(size, Ordering::Relaxed);
                        if size <= SPENT_RECORD_BYTES {
                            written.push(record);
                        }
                    }
                    Message::Flush(reply) => flushes.push(reply),
                }
                n_taken += 1;
                if n_taken < MAX_BATCH {
                    next = self.rx.try_recv().ok();
                }
            }
            behind = n_taken == MAX_BATCH;
            if !lines.is_empty() {
                if let Err(err) = self.append(&mut lines) {
                    // What the file ends with is unknown now: trust its tail next time.
                    self.last_hash = None;
                    self.fail(format!("{err}"));
                }
                lines.clear();
            }
            self.spent.give_back(&mut written);
            if !flushes.is_empty() {
                if let Err(err) = self.file.sync_data() {
                    self.fail(format!("sync: {err}"));
                }
                let outcome = match self.failure.take() {
                    Some(message) => Err(message),
                    None => Ok(()),
                };
                for reply in flushes.drain(..) {
                    let _ = reply.send(outcome.clone());
                }
            }
        }
        if let Err(err) = self.file.sync_data() {
            tracing::warn!(path = %self.path.display(), "audit log sync at close failed: {err}");
        }
        pauses
    }

    /// The record as JSON without its closing brace (the chain link goes there).
    /// `size` is what the record was estimated to take when queued: the line starts
    /// with that much room (and the link's), rather than growing as it is written.
    fn encode(&mut self, record: &AuditRecord, size: usize) -> Option<Vec<u8>> {
        let arguments = redact::prepare(&record.arguments, self.settings.max_arguments_bytes);
        let mut line = Vec::with_capacity(size.min(self.settings.max_arguments_bytes + 1024) + 96);
        match serde_json::to_writer(&mut line, &Encoded { record, arguments }) {
            Ok(()) if line.last() == Some(&b'}') => {
                line.pop();
                Some(line)
            }
            Ok(()) => None,
            Err(err) => {
                self.fail(format!("cannot encode the record of call {}: {err}", record.call_id));
                None
            }
        }
    }

    /// Appends the records (each without its closing brace) under the lock, linking
    /// each to the one before and rotating the file when it is full.
    fn append(&mut self, lines: &mut [Vec<u8>]) -> io::Result<()> {
        let (mut prev, mut len) = self.lock()?;
        let outcome = self.append_locked(lines, &mut prev, &mut len);
        let _ = flock(&self.file, FlockOperation::Unlock);
        if outcome.is_ok() {
            self.known_len = len;
            self.last_hash = Some(prev);
        }
        outcome
    }

    fn append_locked(
        &mut self,
        lines: &mut [Vec<u8>],
        prev: &mut [u8; 32],
        len: &mut u64,
    ) -> io::Result<()> {
        // Each line, its link (`,"prev":"` 64 digits `"}`) and its newline, at once.
        let batch_len = lines.iter().map(|line| line.len() + LINK_BYTES + 1).sum();
        let mut pending: Vec<u8> = Vec::with_capacity(batch_len);
        for line in lines.iter_mut() {
            line.extend_from_slice(b",\"prev\":\"");
            redact::push_hex(line, prev);
            line.extend_from_slice(b"\"}");
            let size = u64::try_from(line.len() + 1).unwrap_or(u64::MAX);
            let used = *len + u64::try_from(pending.len()).unwrap_or(u64::MAX);
            if used > 0 && used.saturating_add(size) > self.settings.max_file_bytes {
                self.file.write_all(&pending)?;
                pending.clear();
                self.rotate()?;
                // Another process may have written to the new file first.
                let (tail_prev, tail_len) = self.tail()?;
                *len = tail_len;
                if tail_len > 0 {
                    *prev = tail_prev;
                    // The link was written with the old hash: redo it.
                    let cut = line.len() - (64 + 2);
                    line.truncate(cut);
                    redact::push_hex(line, prev);
                    line.extend_from_slice(b"\"}");
                }
            }
            *prev = chain::line_hash(line);
            pending.extend_from_slice(line);
            pending.push(b'\n');
        }
        self.file.write_all(&pending)?;
        *len += u64::try_from(pending.len()).unwrap_or(u64::MAX);
        Ok(())
    }

    /// Takes the exclusive lock on the live file, reopening it when the path no longer
    /// names the file held, and returns the hash the next record links to and the
    /// file's length.
    fn lock(&mut self) -> io::Result<([u8; 32], u64)> {
        let mut tampered = false;
        loop {
            lock_exclusive(&self.file, &self.path)?;
            let held = file_id(&self.file)?;
            if path_id(&self.path) == Some(held) {
                break;
            }
            // The path names another file now. Rotation by another toolgate process
            // sharing the log moved ours to `.1` (or further, while this one was
            // idle); anything else replaced or removed the log (e.g. `sed -i`). A
            // file rotated so often that it was deleted looks like a removal.
            let rotated_away = (1..=self.settings.keep_files)
                .any(|idx| path_id(&rotated(&self.path, idx)) == Some(held));
            if !rotated_away && self.last_hash.is_some() {
                tampered = true;
            }
            let _ = flock(&self.file, FlockOperation::Unlock);
            self.file = open_file(&self.path)?;
            self.known_len = 0;
        }
        let len = self.file.metadata()?.len();
        if let Some(last) = self.last_hash {
            if len < self.known_len {
                tampered = true;
            } else if !tampered && len == self.known_len && len > 0 {
                // Nobody wrote since this writer did: the common case, no read.
                return Ok((last, len));
            }
            if tampered {
                tracing::warn!(
                    path = %self.path.display(),
                    "the audit log was truncated, replaced or removed since this process \
                     last wrote to it; the next record links to the last record written \
                     here, so `toolgate audit verify` shows where"
                );
                return Ok((last, self.end_line(len)?));
            }
        }
        self.tail()
    }

    /// The hash of the live file's last line (of the newest rotated file when the live
    /// one is empty, [`GENESIS`] when there is none) and the live file's length. A
    /// last line cut short is ended first, so that no record is glued to it.
    fn tail(&mut self) -> io::Result<([u8; 32], u64)> {
        match chain::tail(&self.file)? {
            chain::Tail::Line { hash, complete } => {
                let len = self.file.metadata()?.len();
                let len = if complete { len } else { self.end_line(len)? };
                Ok((hash, len))
            }
            chain::Tail::Empty => {
                let previous = rotated(&self.path, 1);
                let hash = match File::open(&previous) {
                    Ok(file) => match chain::tail(&file)? {
                        chain::Tail::Line { hash, .. } => hash,
                        chain::Tail::Empty => GENESIS,
                    },
                    Err(err) if err.kind() == io::ErrorKind::NotFound => GENESIS,
                    Err(err) => return Err(err),
                };
                Ok((hash, 0))
            }
        }
    }

    /// Ends a last line that has no newline; returns the file's new length.
    fn end_line(&mut self, len: u64) -> io::Result<u64> {
        if len == 0 {
            return Ok(0);
        }
        let mut last = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&self.file, &mut last, len - 1)?;
        if last[0] == b'\n' {
            return Ok(len);
        }
        self.file.write_all(b"\n")?;
        Ok(len + 1)
    }

    /// Rotates the live file (this writer holds its lock): `.k` becomes `.k+1`, the
    /// live file `.1`, files beyond `keep_files` go, and a new live file is opened and
    /// locked.
    fn rotate(&mut self) -> io::Result<()> {
        let keep = self.settings.keep_files;
        if keep == 0 {
            std::fs::remove_file(&self.path)?;
        } else {
            for idx in (1..keep).rev() {
                let from = rotated(&self.path, idx);
                if from.exists() {
                    std::fs::rename(&from, rotated(&self.path, idx + 1))?;
                }
            }
            std::fs::rename(&self.path, rotated(&self.path, 1))?;
        }
        let mut extra = keep + 1;
        while std::fs::symlink_metadata(rotated(&self.path, extra)).is_ok() {
            std::fs::remove_file(rotated(&self.path, extra))?;
            extra += 1;
        }
        let file = open_file(&self.path)?;
        lock_exclusive(&file, &self.path)?;
        // Dropping the old handle releases its lock; waiting writers then find that
        // the path names the new file and follow it.
        self.file = file;
        tracing::info!(path = %self.path.display(), "audit log rotated");
        Ok(())
    }

    fn fail(&mut self, message: String) {
        tracing::warn!(path = %self.path.display(), "audit log: {message}");
        if self.failure.is_none() {
            self.failure = Some(message);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn record(call_id: &str, arguments: Value) -> AuditRecord {
        AuditRecord {
            ts: UNIX_EPOCH + Duration::from_millis(1_700_000_000_250),
            session_id: "s1".into(),
            client: "uid:1000".into(),
            call_id: call_id.into(),
            tool: "run_command".into(),
            arguments: Arc::new(arguments),
            decision: crate::permission::CallDecision {
                outcome: crate::permission::Outcome::Allow,
                decided_by: crate::permission::DecidedBy::Person,
                asked: true,
                layer: Some(crate::permission::Layer::Mode),
                rule: None,
                list: None,
            },
            rule: Some("allow: run_command(git status:*)".into()),
            ok: false,
            error_type: Some(ErrorType::CommandFailed),
            duration: Duration::from_micros(12_345),
            sandbox: None,
        }
    }

    fn read_lines(path: &Path) -> Vec<Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let cases = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400, "2000-02-29T00:00:00.000Z"),
            (1_700_000_000, "2023-11-14T22:13:20.000Z"),
            (1_709_164_799, "2024-02-28T23:59:59.000Z"),
            (4_107_542_400, "2100-03-01T00:00:00.000Z"),
            (253_402_300_799, "9999-12-31T23:59:59.000Z"),
        ];
        for (secs, expected) in cases {
            assert_eq!(rfc3339_utc(UNIX_EPOCH + Duration::from_secs(secs)), expected, "{secs}");
        }
        let with_millis = UNIX_EPOCH + Duration::from_millis(1_700_000_000_007);
        assert_eq!(rfc3339_utc(with_millis), "2023-11-14T22:13:20.007Z");
        let before_epoch = UNIX_EPOCH - Duration::from_secs(10);
        assert_eq!(rfc3339_utc(before_epoch), "1970-01-01T00:00:00.000Z");
        // Past the year 9999 the year grows a digit.
        let far = UNIX_EPOCH + Duration::from_millis(253_402_300_800_042);
        assert_eq!(rfc3339_utc(far), "10000-01-01T00:00:00.042Z");
        // In a record's line the time is the same string.
        for (ts, expected) in
            [(with_millis, "2023-11-14T22:13:20.007Z"), (far, "10000-01-01T00:00:00.042Z")]
        {
            assert_eq!(serde_json::to_string(&Rfc3339(ts)).unwrap(), format!("\"{expected}\""));
        }
    }

    /// What the formatting machinery writes, to check the digits put in place by hand.
    struct Formatted(SystemTime);

    impl std::fmt::Display for Formatted {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            Rfc3339(self.0).formatted(f)
        }
    }

    proptest::proptest! {
        #[test]
        fn fixed_width_times_match_the_formatted_ones(millis in 0u64..253_402_300_800_000) {
            let ts = UNIX_EPOCH + Duration::from_millis(millis);
            proptest::prop_assert_eq!(rfc3339_utc(ts), Formatted(ts).to_string());
        }
    }

    #[tokio::test]
    async fn records_are_appended_as_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state").join("toolgate").join("audit.jsonl");
        let log = AuditLog::open(&path, &AuditSettings::default()).unwrap();
        log.record(record("1", json!({"command": "git status", "token": "abc"})));
        log.record(record("2", json!({"path": "src/main.rs"})));
        log.flush().await.unwrap();
        drop(log);

        // A second open appends rather than truncating.
        let log = AuditLog::open(&path, &AuditSettings::default()).unwrap();
        log.record(record("3", json!({})));
        log.flush().await.unwrap();

        let lines = read_lines(&path);
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            json!({
                "ts": "2023-11-14T22:13:20.250Z",
                "session_id": "s1",
                "client": "uid:1000",
                "call_id": "1",
                "tool": "run_command",
                "arguments": {"command": "git status", "token": "[redacted]"},
                "decision": {
                    "outcome": "allow", "decided_by": "person", "asked": true, "layer": "mode"
                },
                "rule": "allow: run_command(git status:*)",
                "ok": false,
                "error_type": "command_failed",
                "duration_ms": 12.345,
                "prev": redact::hex(&GENESIS),
            })
        );
        let ids: Vec<&str> = lines.iter().map(|l| l["call_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["1", "2", "3"]);
    }

    #[tokio::test]
    async fn success_without_rule_writes_nulls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, &AuditSettings::default()).unwrap();
        let mut rec = record("9", json!({"path": "a"}));
        rec.ok = true;
        rec.error_type = None;
        rec.rule = None;
        log.record(rec);
        log.flush().await.unwrap();
        let line = &read_lines(&path)[0];
        assert_eq!(line["rule"], Value::Null);
        assert_eq!(line["error_type"], Value::Null);
        assert_eq!(line["ok"], json!(true));
    }

    #[tokio::test]
    async fn flush_at_shutdown_writes_everything_queued() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, &AuditSettings::default()).unwrap();
        let n_records = 2000;
        let clones: Vec<AuditLog> = (0..4).map(|_| log.clone()).collect();
        for idx in 0..n_records {
            clones[idx % clones.len()].record(record(&idx.to_string(), json!({"i": idx})));
        }
        log.flush().await.unwrap();
        assert_eq!(log.dropped(), 0);
        let lines = read_lines(&path);
        assert_eq!(lines.len(), n_records);
        for (idx, line) in lines.iter().enumerate() {
            assert_eq!(line["arguments"]["i"], json!(idx));
        }
    }

    #[test]
    fn file_is_private_and_directories_are_0700() {
        let dir = tempfile::tempdir().unwrap();
        let parent = dir.path().join("a").join("b");
        let path = parent.join("audit.jsonl");
        let _log = AuditLog::open(&path, &AuditSettings::default()).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&parent), 0o700);
        assert_eq!(mode(&dir.path().join("a")), 0o700);

        // An existing file others could read is narrowed.
        let loose = dir.path().join("loose.jsonl");
        std::fs::write(&loose, "").unwrap();
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
        let _log = AuditLog::open(&loose, &AuditSettings::default()).unwrap();
        assert_eq!(mode(&loose), 0o600);
    }

    #[test]
    fn a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        let link = dir.path().join("audit.jsonl");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = AuditLog::open(&link, &AuditSettings::default()).unwrap_err();
        assert!(matches!(err, AuditError::Open { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        // The writer is not running yet, so nothing leaves the queue.
        let (log, writer) = AuditLog::with_writer(&path, &AuditSettings::default(), 3).unwrap();
        for idx in 0..8 {
            log.record(record(&idx.to_string(), json!({})));
        }
        assert_eq!(log.dropped(), 5);
        std::thread::spawn(move || writer.run());
        log.flush().await.unwrap();
        let ids: Vec<String> =
            read_lines(&path).iter().map(|l| l["call_id"].as_str().unwrap().to_owned()).collect();
        assert_eq!(ids, ["0", "1", "2"]);
    }

    #[tokio::test]
    async fn a_writer_behind_does_not_pause_between_batches() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let count = 4 * MAX_BATCH;
        let (log, writer) =
            AuditLog::with_writer(&path, &AuditSettings::default(), count + 1).unwrap();
        for idx in 0..count {
            log.record(record(&idx.to_string(), json!({})));
        }
        let running = std::thread::spawn(move || writer.run());
        log.flush().await.unwrap();
        drop(log);
        // One pause for the first record; the batches behind it follow at once.
        assert_eq!(running.join().unwrap(), 1);
        assert_eq!(read_lines(&path).len(), count);
        verified(&path);
    }

    fn spent(log: &AuditLog) -> usize {
        log.inner.as_ref().unwrap().spent.0.lock().unwrap().len()
    }

    #[tokio::test]
    async fn written_records_are_dropped_by_the_next_record_not_by_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        // The writer starts once all three are queued: none comes back before the
        // next is recorded.
        let (log, writer) = AuditLog::with_writer(&path, &AuditSettings::default(), 8).unwrap();
        let arguments = Arc::new(json!({"path": "src/main.rs"}));
        log.record(AuditRecord { arguments: arguments.clone(), ..record("1", json!({})) });
        log.record(record("2", json!({"path": "a"})));
        log.record(record("big", json!({"content": "x".repeat(SPENT_RECORD_BYTES)})));
        std::thread::spawn(move || writer.run());
        log.flush().await.unwrap();
        // The small records came back written; the big one was dropped by the writer.
        assert_eq!(spent(&log), 2);
        assert_eq!(Arc::strong_count(&arguments), 2, "the first record waits to be dropped");
        log.record(record("3", json!({})));
        assert_eq!(Arc::strong_count(&arguments), 1, "recording the next one dropped it");
        log.flush().await.unwrap();
        assert_eq!(spent(&log), 2);
        assert_eq!(read_lines(&path).len(), 4);
    }

    #[tokio::test]
    async fn written_records_wait_to_be_dropped_up_to_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let count = SPENT_RECORDS + 40;
        let (log, writer) =
            AuditLog::with_writer(&path, &AuditSettings::default(), count + 1).unwrap();
        for idx in 0..count {
            log.record(record(&idx.to_string(), json!({})));
        }
        std::thread::spawn(move || writer.run());
        log.flush().await.unwrap();
        assert_eq!(spent(&log), SPENT_RECORDS);
        assert_eq!(read_lines(&path).len(), count);
    }

    #[tokio::test]
    async fn a_disabled_log_is_a_no_op() {
        let log = AuditLog::open_configured(None, &AuditSettings::default()).unwrap();
        assert!(!log.is_enabled());
        log.record(record("1", json!({})));
        log.flush().await.unwrap();
        assert_eq!(log.dropped(), 0);
        assert_eq!(log.path(), None);
    }

    #[tokio::test]
    async fn flush_after_the_writer_stopped_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (log, writer) =
            AuditLog::with_writer(&dir.path().join("audit.jsonl"), &AuditSettings::default(), 4)
                .unwrap();
        drop(writer);
        assert!(matches!(log.flush().await, Err(AuditError::Stopped)));
        log.record(record("1", json!({})));
        assert_eq!(log.dropped(), 1);
    }

    fn settings(max_file_bytes: u64, keep_files: usize) -> AuditSettings {
        AuditSettings { max_file_bytes, keep_files, ..AuditSettings::default() }
    }

    fn verified(path: &Path) -> Report {
        let report = verify(path).unwrap();
        assert_eq!(report.broken, None, "{report:?}");
        report
    }

    #[tokio::test]
    async fn records_are_chained_across_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        for round in 0..3 {
            let log = AuditLog::open(&path, &AuditSettings::default()).unwrap();
            for idx in 0..5 {
                log.record(record(&format!("{round}-{idx}"), json!({"i": idx})));
            }
            log.flush().await.unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 15);
        let first: Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(first["prev"], json!(redact::hex(&GENESIS)));
        for pair in lines.windows(2) {
            let next: Value = serde_json::from_str(pair[1]).unwrap();
            assert_eq!(next["prev"], json!(redact::hex(&line_hash(pair[0].as_bytes()))));
        }
        let report = verified(&path);
        assert_eq!((report.records, report.starts_after), (15, None));
    }

    #[tokio::test]
    async fn verify_names_the_first_changed_removed_or_inserted_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, &AuditSettings::default()).unwrap();
        for idx in 0..6 {
            log.record(record(&idx.to_string(), json!({"command": format!("step {idx}")})));
        }
        log.flush().await.unwrap();
        drop(log);
        let original = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = original.lines().collect();
        let write = |lines: &[&str]| {
            std::fs::write(&path, lines.iter().map(|line| format!("{line}\n")).collect::<String>())
                .unwrap();
        };

        // A record edited: the record after it no longer links.
        let edited = lines[2].replace("step 2", "step X");
        write(&[lines[0], lines[1], &edited, lines[3], lines[4], lines[5]]);
        let broken = verify(&path).unwrap().broken.unwrap();
        assert_eq!(broken.line, Some(4), "{broken}");
        assert!(broken.to_string().contains("call \"3\""), "{broken}");

        // A record removed (what `sed -i '/marker/d'` does).
        write(&[lines[0], lines[1], lines[3], lines[4], lines[5]]);
        assert_eq!(verify(&path).unwrap().broken.unwrap().line, Some(3));

        // A record inserted.
        write(&[lines[0], lines[1], lines[1], lines[2], lines[3], lines[4], lines[5]]);
        assert_eq!(verify(&path).unwrap().broken.unwrap().line, Some(3));

        // Not a record at all, and a cut-off last line.
        write(&[lines[0], "junk", lines[2]]);
        assert_eq!(verify(&path).unwrap().broken.unwrap().line, Some(2));
        std::fs::write(&path, format!("{}\n{}", lines[0], &lines[1][..20])).unwrap();
        let broken = verify(&path).unwrap().broken.unwrap();
        assert_eq!(broken.line, Some(2));
        assert!(broken.reason.contains("incomplete"), "{broken}");

        write(&lines);
        assert_eq!(verified(&path).records, 6);
    }

    #[tokio::test]
    async fn a_log_replaced_or_truncated_under_a_running_writer_shows_the_gap() {
        for how in ["replace", "truncate"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("audit.jsonl");
            let log = AuditLog::open(&path, &AuditSettings::default()).unwrap();
            for idx in 0..3 {
                log.record(record(&idx.to_string(), json!({"command": format!("step {idx}")})));
            }
            log.flush().await.unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            let kept: String = text.lines().take(2).map(|line| format!("{line}\n")).collect();
            if how == "replace" {
                // As `sed -i '$d'` does: a new file renamed over the log.
                let tmp = dir.path().join("sedtmp");
                std::fs::write(&tmp, &kept).unwrap();
                std::fs::rename(&tmp, &path).unwrap();
            } else {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .unwrap()
                    .set_len(u64::try_from(kept.len()).unwrap())
                    .unwrap();
            }
            assert_eq!(verified(&path).records, 2, "{how}: the tail was cut cleanly");
            log.record(record("after", json!({})));
            log.flush().await.unwrap();
            let broken =
                verify(&path).unwrap().broken.unwrap_or_else(|| panic!("{how}: not detected"));
            assert_eq!(broken.line, Some(3), "{how}: {broken}");
            assert!(broken.reason.contains("call \"after\""), "{how}: {broken}");
        }
    }

    #[tokio::test]
    async fn rotation_keeps_n_files_and_the_chain_runs_across_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, &settings(4096, 2)).unwrap();
        for idx in 0..60 {
            log.record(record(&idx.to_string(), json!({"command": "x".repeat(200)})));
            if idx % 7 == 0 {
                log.flush().await.unwrap();
            }
        }
        log.flush().await.unwrap();
        assert!(rotated(&path, 1).exists() && rotated(&path, 2).exists());
        assert!(!rotated(&path, 3).exists(), "only keep_files rotated files stay");
        for file in [path.clone(), rotated(&path, 1), rotated(&path, 2)] {
            let len = std::fs::metadata(&file).unwrap().len();
            assert!(len <= 4096, "{} is {len} bytes", file.display());
        }
        let report = verified(&path);
        assert_eq!(report.files, [rotated(&path, 2), rotated(&path, 1), path.clone()]);
        assert!(report.starts_after.is_some(), "the oldest records were rotated away");
        // The newest record is the last one written.
        let text = std::fs::read_to_string(&path).unwrap();
        let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["call_id"], json!("59"));

        // A record changed in a rotated file is found there.
        let older = rotated(&path, 1);
        let text = std::fs::read_to_string(&older).unwrap();
        std::fs::write(&older, text.replacen("\"ok\":false", "\"ok\":true", 1)).unwrap();
        let broken = verify(&path).unwrap().broken.unwrap();
        assert_eq!(broken.file, older, "{broken}");
        assert_eq!(broken.line, Some(2), "{broken}");
    }

    #[tokio::test]
    async fn a_rotated_file_missing_below_a_kept_one_is_a_break() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, &settings(4096, 3)).unwrap();
        for idx in 0..80 {
            log.record(record(&idx.to_string(), json!({"command": "x".repeat(200)})));
            if idx % 7 == 0 {
                log.flush().await.unwrap();
            }
        }
        log.flush().await.unwrap();
        assert!(rotated(&path, 3).exists());
        // Names that are not this log's rotated files are no gap.
        for name in ["audit.jsonl.05", "audit.jsonl.9.tmp", "audit.jsonl.x", "other.jsonl.9"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        assert_eq!(verified(&path).files.len(), 4);

        std::fs::remove_file(rotated(&path, 2)).unwrap();
        let report = verify(&path).unwrap();
        let broken = report.broken.unwrap();
        assert_eq!((&broken.file, broken.line), (&rotated(&path, 2), None), "{broken}");
        assert!(broken.reason.contains(&rotated(&path, 3).display().to_string()), "{broken}");
        assert_eq!(report.files, [rotated(&path, 3)]);
        assert!(report.records > 0);

        // The oldest file gone whole looks like rotation.
        std::fs::remove_file(rotated(&path, 3)).unwrap();
        let report = verified(&path);
        assert_eq!(report.files, [rotated(&path, 1), path.clone()]);
        assert!(report.starts_after.is_some());
    }

    #[tokio::test]
    async fn writers_of_two_processes_share_one_chain() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let first = AuditLog::open(&path, &settings(8192, 3)).unwrap();
        let second = AuditLog::open(&path, &settings(8192, 3)).unwrap();
        for idx in 0..80 {
            let log = if idx % 2 == 0 { &first } else { &second };
            log.record(record(&idx.to_string(), json!({"command": "y".repeat(100)})));
            log.flush().await.unwrap();
        }
        let report = verified(&path);
        assert!(report.records > 20, "{report:?}");
    }

    #[tokio::test]
    async fn a_huge_denied_write_adds_a_small_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, &AuditSettings::default()).unwrap();
        let content = "A".repeat(8 * 1024 * 1024);
        let mut rec = record("big", json!({"path": "big.bin", "content": content}));
        rec.tool = "write_file".into();
        log.record(rec);
        // Arguments that are not even JSON, far above the limit.
        log.record(record("junk", Value::String("{".repeat(15 * 1024 * 1024))));
        log.flush().await.unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len < 4096, "the log grew by {len} bytes");
        let lines = read_lines(&path);
        let recorded = lines[0]["arguments"]["content"].as_str().unwrap();
        assert!(recorded.starts_with("[8388608 bytes, sha256:"), "{recorded}");
        let junk = lines[1]["arguments"].as_str().unwrap();
        assert!(junk.starts_with("[15728640 bytes, sha256:"), "{junk}");
    }

    #[tokio::test]
    async fn a_lock_held_by_someone_else_does_not_stall_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path, &AuditSettings::default()).unwrap();
        let holder = File::open(&path).unwrap();
        flock(&holder, FlockOperation::LockExclusive).unwrap();
        log.record(record("1", json!({})));
        log.flush().await.unwrap();
        assert_eq!(read_lines(&path).len(), 1);
        drop(holder);
        log.record(record("2", json!({})));
        log.flush().await.unwrap();
        assert_eq!(verified(&path).records, 2);
    }

    #[test]
    fn settings_are_checked() {
        assert_eq!(AuditSettings::default().validate(), Ok(()));
        assert_eq!(settings(100, 1).validate().unwrap_err().0, "max_file_bytes");
        let small = AuditSettings { max_arguments_bytes: 10, ..AuditSettings::default() };
        assert_eq!(small.validate().unwrap_err().0, "max_arguments_bytes");
    }
}
