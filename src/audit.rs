//! The audit log: one JSON line per call, appended to a file only toolgate's user can
//! read, saying who called what, what was decided and by which rule, and how it ended.
//!
//! Recording must never slow a call down. [`AuditLog::record`] only puts the record on
//! a bounded channel; a dedicated writer thread redacts, encodes and appends it. When
//! the channel is full (the disk is stalled, or calls arrive faster than it can take
//! them), the record is **dropped and counted** rather than making the call wait: a
//! daemon whose tool calls hang on a slow disk is worse than an audit trail with a
//! counted, logged gap. [`AuditLog::dropped`] reports the count (for `daemon/status`)
//! and every power-of-two drop logs a warning.
//!
//! [`AuditLog::flush`] waits until everything queued before it is written and synced
//! to disk; the daemon calls it at shutdown.
//!
//! Arguments are redacted before they are written: any value under a key whose name
//! looks secret ([`looks_secret`]) becomes `"[redacted]"`, at any depth. Secrets inside
//! free text (a command line with a token in it) cannot be recognised and are kept.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Serialize, Serializer};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::tools::ErrorType;

/// Records waiting for the writer. A record is a few hundred bytes to a few KiB, so a
/// full queue holds at most a few MiB, and 4096 calls is far more than a healthy disk
/// ever lets pile up: reaching it means the disk is stuck, not merely slow.
pub const CHANNEL_CAPACITY: usize = 4096;

/// Records the writer encodes before issuing one `write`: bounds the batch buffer
/// while still turning a burst into few system calls.
const MAX_BATCH: usize = 256;

/// How long the writer lets records gather after the first one woke it. Well below
/// what anyone reading the log would notice; at 60,000 calls a second it gathers a
/// few hundred records, inside [`CHANNEL_CAPACITY`].
const COALESCE: std::time::Duration = std::time::Duration::from_millis(2);

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Parts of key names (compared case-insensitively) whose values are never written.
const SECRET_NAME_PARTS: [&str; 7] =
    ["token", "secret", "password", "passwd", "key", "auth", "credential"];

/// Whether a key or variable name looks like it holds a secret. Deliberately broad
/// (`monkey` matches `key`): hiding a harmless value costs little.
pub fn looks_secret(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_NAME_PARTS.iter().any(|part| lower.contains(part))
}

/// Replaces, at any depth, the value of every object key that [`looks_secret`].
pub fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                if looks_secret(key) {
                    *inner = Value::String(REDACTED.to_owned());
                } else {
                    redact(inner);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// One call, as the audit log records it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditRecord {
    /// When the call finished; written as RFC 3339 UTC with milliseconds.
    #[serde(serialize_with = "serialize_ts")]
    pub ts: SystemTime,
    pub session_id: String,
    /// Who called: the peer's uid or the token's name.
    pub client: String,
    pub call_id: String,
    pub tool: String,
    /// The call's arguments (redacted when written).
    pub arguments: Value,
    /// Who decided, and how (the same object as in `tool_call_done` events).
    pub decision: crate::permission::CallDecision,
    /// The rule that decided as `<list>: <rule as written>`, or the deciding layer.
    pub rule: Option<String>,
    pub ok: bool,
    pub error_type: Option<ErrorType>,
    /// Wall time of the whole call, hooks and approval included; written as
    /// `duration_ms` (fractional milliseconds).
    #[serde(rename = "duration_ms", serialize_with = "serialize_duration_ms")]
    pub duration: Duration,
}

fn serialize_ts<S: Serializer>(ts: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339_utc(*ts))
}

fn serialize_duration_ms<S: Serializer>(duration: &Duration, s: S) -> Result<S::Ok, S::Error> {
    // Microsecond resolution is plenty and keeps the numbers short.
    s.serialize_f64((duration.as_secs_f64() * 1_000_000.0).round() / 1000.0)
}

/// Formats a time as RFC 3339 in UTC with milliseconds (`2026-01-31T09:05:00.250Z`).
/// Times before 1970 are clamped to the epoch.
pub fn rfc3339_utc(ts: SystemTime) -> String {
    let since_epoch = ts.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since_epoch.as_secs();
    let (year, month, day) = civil_from_days(secs / 86_400);
    let secs_of_day = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs_of_day / 3600,
        secs_of_day % 3600 / 60,
        secs_of_day % 60,
        since_epoch.subsec_millis()
    )
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
    Record(Box<AuditRecord>),
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
    path: PathBuf,
}

impl AuditLog {
    /// An audit log that records nothing (`audit_log = false`).
    pub fn disabled() -> AuditLog {
        AuditLog { inner: None }
    }

    /// Opens the configured log: `None` is a disabled one.
    pub fn open_configured(path: Option<&Path>) -> Result<AuditLog, AuditError> {
        match path {
            Some(path) => AuditLog::open(path),
            None => Ok(AuditLog::disabled()),
        }
    }

    /// Opens (creating it and its directories if needed) the log at `path` and starts
    /// its writer thread. Missing directories are created with mode 0700 and the file
    /// with 0600; an existing file readable by others is narrowed to 0600. A symlink
    /// at `path` is refused, so nobody can redirect the log by planting one.
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        let (log, writer) = AuditLog::with_writer(path, CHANNEL_CAPACITY)?;
        std::thread::Builder::new()
            .name("toolgate-audit".to_owned())
            .spawn(move || writer.run())
            .map_err(AuditError::Spawn)?;
        Ok(log)
    }

    /// The handle and its not yet started writer.
    fn with_writer(path: &Path, capacity: usize) -> Result<(AuditLog, Writer), AuditError> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| AuditError::CreateDir { path: dir.to_owned(), source })?;
        }
        let open_err = |source| AuditError::Open { path: path.to_owned(), source };
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(open_err)?;
        let permissions = file.metadata().map_err(open_err)?.permissions();
        if permissions.mode() & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(open_err)?;
        }
        let (tx, rx) = mpsc::channel(capacity);
        let inner = Inner { tx, dropped: AtomicU64::new(0), path: path.to_owned() };
        let writer = Writer { rx, file, path: path.to_owned(), failure: None };
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
        if let Err(err) = inner.tx.try_send(Message::Record(Box::new(record))) {
            let dropped = inner.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                let reason = match err {
                    mpsc::error::TrySendError::Full(_) => "the queue is full",
                    mpsc::error::TrySendError::Closed(_) => "the writer has stopped",
                };
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

/// The writer thread's state.
struct Writer {
    rx: mpsc::Receiver<Message>,
    file: File,
    path: PathBuf,
    /// The first write failure since the last flush, reported to that flush.
    failure: Option<String>,
}

impl Writer {
    /// Runs until every [`AuditLog`] handle is gone, then syncs once more.
    fn run(mut self) {
        let mut buf = Vec::new();
        let mut flushes = Vec::new();
        while let Some(first) = self.rx.blocking_recv() {
            // A record wakes the writer; the records of the next few milliseconds then
            // join it in one write. Senders find nobody waiting meanwhile, so a busy
            // daemon wakes this thread a few hundred times a second at most instead of
            // once per call. A flush is never delayed.
            if matches!(first, Message::Record(_)) {
                std::thread::sleep(COALESCE);
            }
            let mut next = Some(first);
            let mut n_taken = 0;
            while let Some(message) = next.take() {
                match message {
                    Message::Record(record) => self.encode(*record, &mut buf),
                    Message::Flush(reply) => flushes.push(reply),
                }
                n_taken += 1;
                if n_taken < MAX_BATCH {
                    next = self.rx.try_recv().ok();
                }
            }
            if !buf.is_empty() {
                if let Err(err) = self.file.write_all(&buf) {
                    self.fail(format!("{err}"));
                }
                buf.clear();
            }
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
    }

    fn encode(&mut self, mut record: AuditRecord, buf: &mut Vec<u8>) {
        redact(&mut record.arguments);
        let start = buf.len();
        match serde_json::to_writer(&mut *buf, &record) {
            Ok(()) => buf.push(b'\n'),
            Err(err) => {
                buf.truncate(start);
                self.fail(format!("cannot encode the record of call {}: {err}", record.call_id));
            }
        }
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
            session_id: "s1".to_owned(),
            client: "uid:1000".to_owned(),
            call_id: call_id.to_owned(),
            tool: "run_command".to_owned(),
            arguments,
            decision: crate::permission::CallDecision {
                outcome: crate::permission::Outcome::Allow,
                decided_by: crate::permission::DecidedBy::Person,
                asked: true,
                layer: Some(crate::permission::Layer::Mode),
                rule: None,
                list: None,
            },
            rule: Some("allow: run_command(git status:*)".to_owned()),
            ok: false,
            error_type: Some(ErrorType::CommandFailed),
            duration: Duration::from_micros(12_345),
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
    }

    #[test]
    fn redaction_reaches_nested_values_and_keeps_the_rest() {
        let mut args = json!({
            "command": "deploy",
            "env": {"GITHUB_TOKEN": "ghp_x", "PATH": "/bin", "nested": [{"ApiKey": 7}]},
            "Authorization": {"scheme": "Bearer", "value": "x"},
            "db_password": null,
            "items": [{"client_secret": "s", "name": "n"}, "plain"],
            "credentials_file": "/x",
        });
        redact(&mut args);
        assert_eq!(
            args,
            json!({
                "command": "deploy",
                "env": {"GITHUB_TOKEN": "[redacted]", "PATH": "/bin", "nested": [{"ApiKey": "[redacted]"}]},
                "Authorization": "[redacted]",
                "db_password": "[redacted]",
                "items": [{"client_secret": "[redacted]", "name": "n"}, "plain"],
                "credentials_file": "[redacted]",
            })
        );
    }

    #[tokio::test]
    async fn records_are_appended_as_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state").join("toolgate").join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        log.record(record("1", json!({"command": "git status", "token": "abc"})));
        log.record(record("2", json!({"path": "src/main.rs"})));
        log.flush().await.unwrap();
        drop(log);

        // A second open appends rather than truncating.
        let log = AuditLog::open(&path).unwrap();
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
            })
        );
        let ids: Vec<&str> = lines.iter().map(|l| l["call_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["1", "2", "3"]);
    }

    #[tokio::test]
    async fn success_without_rule_writes_nulls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
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
        let log = AuditLog::open(&path).unwrap();
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
        let _log = AuditLog::open(&path).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&parent), 0o700);
        assert_eq!(mode(&dir.path().join("a")), 0o700);

        // An existing file others could read is narrowed.
        let loose = dir.path().join("loose.jsonl");
        std::fs::write(&loose, "").unwrap();
        std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
        let _log = AuditLog::open(&loose).unwrap();
        assert_eq!(mode(&loose), 0o600);
    }

    #[test]
    fn a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        let link = dir.path().join("audit.jsonl");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = AuditLog::open(&link).unwrap_err();
        assert!(matches!(err, AuditError::Open { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        // The writer is not running yet, so nothing leaves the queue.
        let (log, writer) = AuditLog::with_writer(&path, 3).unwrap();
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
    async fn a_disabled_log_is_a_no_op() {
        let log = AuditLog::open_configured(None).unwrap();
        assert!(!log.is_enabled());
        log.record(record("1", json!({})));
        log.flush().await.unwrap();
        assert_eq!(log.dropped(), 0);
        assert_eq!(log.path(), None);
    }

    #[tokio::test]
    async fn flush_after_the_writer_stopped_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (log, writer) = AuditLog::with_writer(&dir.path().join("audit.jsonl"), 4).unwrap();
        drop(writer);
        assert!(matches!(log.flush().await, Err(AuditError::Stopped)));
        log.record(record("1", json!({})));
        assert_eq!(log.dropped(), 1);
    }
}
