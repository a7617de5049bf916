//! The hash chain that makes the audit log tamper-evident, and its verification.
//!
//! Every record ends with `"prev":"<hex>"`, the SHA-256 of the previous record's line
//! (its bytes without the newline). The very first record of a log carries
//! [`GENESIS`]. The chain runs on across rotation: the first record of a new live file
//! carries the hash of the last record of the file that was just rotated out. Editing,
//! inserting or deleting a record therefore breaks the link of the record after it,
//! and [`verify`] names that record.
//!
//! A rotated file missing below one that is kept (`audit.jsonl.1` gone while `.2` is
//! there) is a gap in the chain too, and [`verify`] names the missing file: rotation
//! only ever deletes the oldest files.
//!
//! What the chain cannot show: records removed from the end of the newest file while
//! no daemon is running (the daemon that wrote them notices while it runs, and keeps
//! chaining from the record it wrote, so the next record shows the gap), and records
//! removed from the start of the oldest file, or the oldest file itself
//! (indistinguishable from a rotation that deleted them).

use std::fs::File;
use std::io::{self, BufRead as _, BufReader};
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::redact::hex;

/// `prev` of the first record of a log.
pub const GENESIS: [u8; 32] = [0; 32];

/// The hash that links the next record to this line (without its newline).
pub fn line_hash(line: &[u8]) -> [u8; 32] {
    Sha256::digest(line).into()
}

/// The `n`-th rotated file of the log at `path` (`audit.jsonl.1`, `.2`, ...).
pub fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// What the last line of a file links to.
pub(super) enum Tail {
    /// The file is empty.
    Empty,
    /// The hash of its last line; `complete` is false when the line has no newline
    /// yet (a write cut short), so that a writer must end it first.
    Line { hash: [u8; 32], complete: bool },
}

/// Reads backwards from the end of `file` to its last line.
pub(super) fn tail(file: &File) -> io::Result<Tail> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(Tail::Empty);
    }
    let mut last = [0u8; 1];
    file.read_exact_at(&mut last, len - 1)?;
    let complete = last[0] == b'\n';
    let end = if complete { len - 1 } else { len };
    // Look for the newline before the last line, a growing window at a time.
    let mut window: u64 = 64 * 1024;
    loop {
        let start = end.saturating_sub(window);
        let mut buf = vec![0u8; usize::try_from(end - start).unwrap_or(usize::MAX)];
        file.read_exact_at(&mut buf, start)?;
        match memchr::memrchr(b'\n', &buf) {
            Some(pos) => return Ok(Tail::Line { hash: line_hash(&buf[pos + 1..]), complete }),
            None if start == 0 => return Ok(Tail::Line { hash: line_hash(&buf), complete }),
            None => window = window.saturating_mul(4),
        }
    }
}

/// The file and line where the chain breaks, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Break {
    pub file: PathBuf,
    /// 1-based; `None` when the whole file is missing.
    pub line: Option<usize>,
    pub reason: String,
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file.display(), self.reason),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
    }
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The files read, oldest first.
    pub files: Vec<PathBuf>,
    /// Records whose link was checked and held.
    pub records: usize,
    /// The first record's `prev` when it is not [`GENESIS`]: older records were
    /// rotated away (or removed from the start).
    pub starts_after: Option<String>,
    /// The first broken record; `None` when the whole chain holds.
    pub broken: Option<Break>,
}

/// Checks the chain of the log at `path` across its rotated files, oldest first: every
/// rotated file up to the highest number there is, so that one missing below a kept
/// one is reported as the break it is.
///
/// The files are opened under a shared lock on the live file, so that no writer
/// rotates them or is half-way through a line meanwhile; reading the live file stops at
/// its length at that moment.
pub fn verify(path: &Path) -> io::Result<Report> {
    let live = File::open(path)?;
    // A writer holds the lock for one append; whatever holds it longer is waited for
    // two seconds at most (reading may then meet a line still being written).
    let start = std::time::Instant::now();
    loop {
        match rustix::fs::flock(&live, rustix::fs::FlockOperation::NonBlockingLockShared) {
            Ok(()) => break,
            Err(err) if err == rustix::io::Errno::WOULDBLOCK => {}
            Err(err) => return Err(err.into()),
        }
        if start.elapsed() >= std::time::Duration::from_secs(2) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let same = std::fs::metadata(path)
        .map(|meta| {
            live.metadata().is_ok_and(|held| held.dev() == meta.dev() && held.ino() == meta.ino())
        })
        .unwrap_or(false);
    if !same {
        return Err(io::Error::other(format!(
            "{} was rotated while it was being opened; run the verification again",
            path.display()
        )));
    }
    // Every file is opened, and the live file's length taken, under the lock; the
    // reading happens after it is released, so writers wait only for the opening.
    // A rotation afterwards renames files, but what was opened stays what it was.
    // `None`: a rotated file missing below the oldest one kept, where reading stops.
    let mut opened: Vec<(PathBuf, Option<Box<dyn io::Read>>)> = Vec::new();
    for idx in (1..=highest_rotated(path)?).rev() {
        let file = rotated(path, idx);
        match File::open(&file) {
            Ok(handle) => opened.push((file, Some(Box::new(handle)))),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                opened.push((file, None));
                break;
            }
            Err(err) => return Err(err),
        }
    }
    if opened.last().is_none_or(|(_, reader)| reader.is_some()) {
        let live_len = live.metadata()?.len();
        let reader = io::Read::take(live.try_clone()?, live_len);
        opened.push((path.to_owned(), Some(Box::new(reader))));
    }
    rustix::fs::flock(&live, rustix::fs::FlockOperation::Unlock)?;

    let files: Vec<PathBuf> = opened
        .iter()
        .filter(|(_, reader)| reader.is_some())
        .map(|(file, _)| file.clone())
        .collect();
    let mut report = Report { files, records: 0, starts_after: None, broken: None };
    let mut expected: Option<[u8; 32]> = None;
    let mut older: Option<PathBuf> = None;
    for (file, reader) in opened {
        let Some(reader) = reader else {
            // The highest number is always there, so an older file is.
            let kept = older
                .as_deref()
                .map_or_else(String::new, |older| format!(", though {} is kept", older.display()));
            report.broken = Some(Break {
                file,
                line: None,
                reason: format!(
                    "missing{kept}: rotation only deletes the oldest files, so this one was \
                     removed, and the records it held with it"
                ),
            });
            return Ok(report);
        };
        older = Some(file.clone());
        let mut reader = BufReader::new(reader);
        let mut line = Vec::new();
        let mut number = 0;
        loop {
            line.clear();
            if reader.read_until(b'\n', &mut line)? == 0 {
                break;
            }
            number += 1;
            let at = |reason: String| Break { file: file.clone(), line: Some(number), reason };
            if line.last() != Some(&b'\n') {
                report.broken = Some(at("the last record is incomplete (no newline)".into()));
                return Ok(report);
            }
            line.pop();
            let record: Value = match serde_json::from_slice(&line) {
                Ok(value @ Value::Object(_)) => value,
                _ => {
                    report.broken = Some(at("not a JSON record".into()));
                    return Ok(report);
                }
            };
            let name = describe(&record);
            let Some(prev) = record.get("prev").and_then(Value::as_str) else {
                report.broken = Some(at(format!("record {name} has no \"prev\" hash")));
                return Ok(report);
            };
            match expected {
                Some(hash) if prev != hex(&hash) => {
                    report.broken = Some(at(format!(
                        "record {name} does not follow the record before it: its prev is \
                         {prev}, the record before it hashes to {}; a record was changed, \
                         removed or inserted here",
                        hex(&hash)
                    )));
                    return Ok(report);
                }
                Some(_) => {}
                None if prev != hex(&GENESIS) => report.starts_after = Some(prev.to_owned()),
                None => {}
            }
            expected = Some(line_hash(&line));
            report.records += 1;
        }
    }
    Ok(report)
}

/// The highest `n` for which the log at `path` has a rotated file `<path>.<n>` (0 when
/// it has none), found by listing its directory: numbers below it that have no file
/// are gaps.
fn highest_rotated(path: &Path) -> io::Result<usize> {
    let Some(name) = path.file_name() else {
        return Ok(0);
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut prefix = name.to_owned();
    prefix.push(".");
    let prefix = prefix.as_encoded_bytes();
    let mut highest = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let entry_name = entry.file_name();
        let Some(number) = entry_name.as_encoded_bytes().strip_prefix(prefix) else {
            continue;
        };
        // Exactly as `rotated` writes it: digits, no leading zero.
        if number.first().is_none_or(|first| *first == b'0')
            || !number.iter().all(u8::is_ascii_digit)
        {
            continue;
        }
        if let Some(number) = std::str::from_utf8(number).ok().and_then(|text| text.parse().ok()) {
            highest = highest.max(number);
        }
    }
    Ok(highest)
}

/// Names a record for a person: its call id and time.
fn describe(record: &Value) -> String {
    let call = record.get("call_id").and_then(Value::as_str).unwrap_or("?");
    let ts = record.get("ts").and_then(Value::as_str).unwrap_or("?");
    format!("(call {call:?} at {ts})")
}
