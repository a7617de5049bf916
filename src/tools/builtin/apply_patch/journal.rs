//! Changing several files as one: every new content is staged next to its file, a
//! journal in the state directory records the plan, one appended line commits it, and
//! only then are the staged files renamed into place and the deleted files removed.
//!
//! Crash safety rests on one rule: no target is touched before the commit line is on
//! disk. A journal without it is rolled back (its staged files removed: the targets
//! never changed); a journal with it is rolled forward (each staged file still present
//! is renamed, each file to delete is removed, both idempotent). [`recover`] does
//! this at start-up for journals whose writer is gone: a writer holds an exclusive
//! `flock` on its journal for as long as it works, which the kernel releases when the
//! process dies however it dies, so a journal still locked belongs to a live process
//! and is left alone.
//!
//! A journal is written under a hidden name and renamed to `*.journal` once its plan
//! is complete and fsynced, so recovery never mistakes a plan being written for an
//! abandoned one. Staged files are created only after that rename, and their names
//! (which the journal lists) carry the journal's random id, so rolling back can only
//! ever remove files this patch created.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FlockOperation, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::tools::fs::{self, FileStamp};

/// The line that commits a journal.
const COMMIT_LINE: &[u8] = b"commit\n";

/// A journal's file name ends with this; anything else in the directory is either a
/// journal still being written (hidden) or not ours.
const JOURNAL_SUFFIX: &str = ".journal";

/// Prefix of a journal still being written.
const PENDING_PREFIX: &str = ".pending-";

/// Longest part of a target's name copied into its staged file's name.
const STAGED_NAME_PREFIX_BYTES: usize = 64;

/// One file the patch changes.
#[derive(Debug)]
pub struct Change<'a> {
    /// The directory holding the file, opened beneath a root.
    pub dir: BorrowedFd<'a>,
    /// Its absolute path as the kernel sees it (symlinks resolved), for recovery.
    pub dir_path: PathBuf,
    pub name: OsString,
    pub action: Action,
}

#[derive(Debug)]
pub enum Action {
    /// Replace or create the file with these bytes and permission bits (`None`: a new
    /// file's 0644 minus the umask) and owner, when the daemon may give files away.
    Write {
        bytes: Vec<u8>,
        mode: Option<u32>,
        owner: Option<(u32, u32)>,
    },
    Delete,
}

/// What the journal file holds before its commit line.
#[derive(Debug, Serialize, Deserialize)]
struct Plan {
    version: u32,
    pid: u32,
    changes: Vec<PlannedChange>,
}

#[derive(Debug, Serialize, Deserialize)]
struct PlannedChange {
    /// Directory path as bytes (paths need not be UTF-8).
    dir: Vec<u8>,
    name: Vec<u8>,
    /// The staged file's name in `dir`; none for a deletion.
    staged: Option<Vec<u8>>,
}

/// The points a simulated crash can stop at (tests stop at each in turn).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    PlanWritten,
    JournalNamed,
    Staged(usize),
    Committed,
    Applied(usize),
    Synced,
    Done,
}

/// Why a commit did not complete.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// Before the commit point: nothing changed (whatever was staged is removed).
    #[error("{0}")]
    NotApplied(io::Error),
    /// After the commit point some file could not be put in place; the journal is
    /// kept and the next start finishes the job.
    #[error(
        "the patch is committed but could not be completed: {0}; it is finished at the next start"
    )]
    Incomplete(io::Error),
    /// A simulated crash (tests): the process "died" at this step.
    #[error("simulated crash")]
    Crashed,
}

/// The stamps of what was written, one per change (`None` for deletions).
pub type Stamps = Vec<Option<FileStamp>>;

/// Applies `changes` all together. `crash_at` is asked at every step whether to stop
/// dead there, as a killed process would (only tests say yes).
pub fn commit(
    journal_dir: &Path,
    changes: &[Change<'_>],
    crash_at: &mut dyn FnMut(Step) -> bool,
) -> Result<Stamps, CommitError> {
    let not_applied = CommitError::NotApplied;
    let id = random_u64();
    let staged_names: Vec<Option<OsString>> = changes
        .iter()
        .enumerate()
        .map(|(idx, change)| match change.action {
            Action::Write { .. } => Some(staged_name(&change.name, id, idx)),
            Action::Delete => None,
        })
        .collect();
    let plan = Plan {
        version: 1,
        pid: std::process::id(),
        changes: changes
            .iter()
            .zip(&staged_names)
            .map(|(change, staged)| PlannedChange {
                dir: change.dir_path.as_os_str().as_bytes().to_vec(),
                name: change.name.as_bytes().to_vec(),
                staged: staged.as_ref().map(|name| name.as_bytes().to_vec()),
            })
            .collect(),
    };
    let mut text = serde_json::to_vec(&plan).map_err(|err| not_applied(io::Error::other(err)))?;
    text.push(b'\n');

    create_journal_dir(journal_dir).map_err(not_applied)?;
    let journal_root = open_dir(journal_dir).map_err(not_applied)?;
    let pending = format!("{PENDING_PREFIX}{id:016x}");
    let final_name = format!("{id:016x}{JOURNAL_SUFFIX}");
    let journal = create_locked(&journal_root, &pending).map_err(not_applied)?;
    let mut journal = std::fs::File::from(journal);
    let written = journal.write_all(&text).and_then(|()| journal.sync_data());
    if let Err(err) = written {
        let _ = rustix::fs::unlinkat(&journal_root, pending.as_str(), AtFlags::empty());
        return Err(not_applied(err));
    }
    if crash_at(Step::PlanWritten) {
        return Err(CommitError::Crashed);
    }
    if let Err(errno) =
        rustix::fs::renameat(&journal_root, pending.as_str(), &journal_root, final_name.as_str())
    {
        let _ = rustix::fs::unlinkat(&journal_root, pending.as_str(), AtFlags::empty());
        return Err(not_applied(errno.into()));
    }
    let abandon = |err: io::Error, staged_so_far: usize| {
        for (change, staged) in changes.iter().zip(&staged_names).take(staged_so_far) {
            if let Some(staged) = staged {
                let _ = rustix::fs::unlinkat(change.dir, staged, AtFlags::empty());
            }
        }
        let _ = rustix::fs::unlinkat(&journal_root, final_name.as_str(), AtFlags::empty());
        not_applied(err)
    };
    if let Err(err) = fsync_dir(journal_root.as_fd()) {
        return Err(abandon(err, 0));
    }
    if crash_at(Step::JournalNamed) {
        return Err(CommitError::Crashed);
    }

    let mut stamps: Stamps = Vec::with_capacity(changes.len());
    for (idx, (change, staged)) in changes.iter().zip(&staged_names).enumerate() {
        let stamp = match (&change.action, staged) {
            (Action::Write { bytes, mode, owner }, Some(staged)) => {
                match stage(change.dir, staged, bytes, *mode, *owner) {
                    Ok(stamp) => Some(stamp),
                    // The failed one removed its own file; the earlier ones go now.
                    Err(err) => return Err(abandon(err, idx)),
                }
            }
            _ => None,
        };
        stamps.push(stamp);
        if crash_at(Step::Staged(idx)) {
            return Err(CommitError::Crashed);
        }
    }

    // The commit point.
    let committed = journal.write_all(COMMIT_LINE).and_then(|()| journal.sync_data());
    if let Err(err) = committed {
        return Err(abandon(err, changes.len()));
    }
    if crash_at(Step::Committed) {
        return Err(CommitError::Crashed);
    }

    let mut failure: Option<io::Error> = None;
    for (idx, (change, staged)) in changes.iter().zip(&staged_names).enumerate() {
        let done = match staged {
            Some(staged) => rustix::fs::renameat(change.dir, staged, change.dir, &change.name),
            None => match rustix::fs::unlinkat(change.dir, &change.name, AtFlags::empty()) {
                Err(Errno::NOENT) => Ok(()),
                other => other,
            },
        };
        if let Err(errno) = done {
            failure.get_or_insert(errno.into());
        }
        if crash_at(Step::Applied(idx)) {
            return Err(CommitError::Crashed);
        }
    }
    if let Some(err) = failure {
        // Keep the journal: the next start retries what is left.
        return Err(CommitError::Incomplete(err));
    }
    sync_dirs(changes.iter().map(|change| (change.dir_path.as_path(), change.dir)));
    if crash_at(Step::Synced) {
        return Err(CommitError::Crashed);
    }
    // Only once every change is durable may the journal go: a journal that vanished
    // early could let a later start miss a half-applied patch after a power loss.
    match rustix::fs::unlinkat(&journal_root, final_name.as_str(), AtFlags::empty()) {
        Ok(()) => {
            if let Err(err) = fsync_dir(journal_root.as_fd()) {
                tracing::warn!(%err, "could not fsync the journal directory");
            }
        }
        Err(errno) => tracing::warn!(%errno, "could not remove a finished patch journal"),
    }
    if crash_at(Step::Done) {
        return Err(CommitError::Crashed);
    }
    drop(journal);
    Ok(stamps)
}

/// What [`recover`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Committed patches finished.
    pub rolled_forward: usize,
    /// Uncommitted patches undone.
    pub rolled_back: usize,
    /// Journals left alone because a live process holds them.
    pub in_use: usize,
}

/// Finishes or undoes every patch whose process died mid-way. Journals a live process
/// holds are skipped.
pub fn recover(journal_dir: &Path) -> io::Result<Recovery> {
    let mut report = Recovery::default();
    let entries = match std::fs::read_dir(journal_dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(report),
        Err(err) => return Err(err),
    };
    let root = open_dir(journal_dir)?;
    for entry in entries {
        let name = entry?.file_name();
        let text = name.to_string_lossy();
        let pending = text.starts_with(PENDING_PREFIX);
        if !pending && !text.ends_with(JOURNAL_SUFFIX) {
            continue;
        }
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&root, &name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => continue,
            Err(errno) => return Err(errno.into()),
        };
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                report.in_use += 1;
                continue;
            }
            Err(errno) => return Err(errno.into()),
        }
        if !pending {
            let mut bytes = Vec::new();
            std::fs::File::from(fd.try_clone()?).read_to_end(&mut bytes)?;
            match replay(&bytes) {
                Some(true) => report.rolled_forward += 1,
                Some(false) => report.rolled_back += 1,
                None => tracing::warn!(journal = ?name, "an unreadable patch journal was removed"),
            }
        }
        // A pending journal was never named: nothing was staged for it yet.
        rustix::fs::unlinkat(&root, &name, AtFlags::empty())?;
        drop(fd);
    }
    fsync_dir(root.as_fd())?;
    Ok(report)
}

/// Rolls one journal forward (`Some(true)`) or back (`Some(false)`); `None` when it
/// cannot be read, which only happens to a plan whose write was cut short, before
/// anything was staged.
fn replay(bytes: &[u8]) -> Option<bool> {
    let end = memchr::memchr(b'\n', bytes)?;
    let plan: Plan = serde_json::from_slice(&bytes[..end]).ok()?;
    let committed = &bytes[end + 1..] == COMMIT_LINE;
    let mut dirs: HashMap<PathBuf, OwnedFd> = HashMap::new();
    for change in &plan.changes {
        let dir_path = PathBuf::from(OsStr::from_bytes(&change.dir));
        let dir = match dirs.get(&dir_path) {
            Some(dir) => dir,
            None => match open_real_dir(&dir_path) {
                Ok(dir) => dirs.entry(dir_path.clone()).or_insert(dir),
                Err(err) => {
                    tracing::warn!(dir = %dir_path.display(), %err, "a patched directory is gone");
                    continue;
                }
            },
        };
        let name = OsStr::from_bytes(&change.name);
        let outcome = match (&change.staged, committed) {
            (Some(staged), true) => rustix::fs::renameat(dir, OsStr::from_bytes(staged), dir, name),
            (Some(staged), false) => {
                rustix::fs::unlinkat(dir, OsStr::from_bytes(staged), AtFlags::empty())
            }
            (None, true) => rustix::fs::unlinkat(dir, name, AtFlags::empty()),
            (None, false) => Ok(()),
        };
        match outcome {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(errno) => {
                tracing::warn!(dir = %dir_path.display(), file = ?name, %errno, "recovering a patch");
            }
        }
    }
    sync_dirs(dirs.iter().map(|(path, fd)| (path.as_path(), fd.as_fd())));
    Some(committed)
}

/// Writes a staged file: created fresh (never following or reusing anything),
/// given its mode and owner, written and fsynced. Removed again on failure.
fn stage(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    bytes: &[u8],
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
) -> io::Result<FileStamp> {
    let flags = OFlags::WRONLY
        | OFlags::CREATE
        | OFlags::EXCL
        | OFlags::NOFOLLOW
        | OFlags::NOCTTY
        | OFlags::CLOEXEC;
    // Private until the final mode is set; new files get the usual 0644 minus umask.
    let create_mode = if mode.is_some() { 0o600 } else { 0o644 };
    let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(create_mode))?;
    let mut file = std::fs::File::from(fd);
    let written = (|| -> io::Result<FileStamp> {
        // As for single-file writes (special mode bits included).
        fs::keep_owner_and_mode(&file, mode, owner)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        let info = fs::file_info(&file)?;
        Ok(FileStamp::of(&info, bytes))
    })();
    if written.is_err() {
        let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
    }
    written
}

/// `.{name}.{id}.{idx}.patch.tmp`: hidden, recognisably temporary, unique to this
/// journal and change.
fn staged_name(name: &OsStr, id: u64, idx: usize) -> OsString {
    let bytes = name.as_bytes();
    let mut staged = b".".to_vec();
    staged.extend_from_slice(&bytes[..bytes.len().min(STAGED_NAME_PREFIX_BYTES)]);
    staged.extend_from_slice(format!(".{id:016x}.{idx}.patch.tmp").as_bytes());
    OsString::from_vec(staged)
}

fn create_journal_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(rustix::fs::open(dir, flags, Mode::empty())?)
}

/// Opens a directory recorded in a journal: a real path (symlinks were resolved when
/// it was planned), so any symbolic link met now means it was swapped since, and the
/// path is refused rather than followed.
fn open_real_dir(dir: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(rustix::fs::CWD, dir, flags, Mode::empty(), resolve) {
        Err(Errno::NOSYS) => Ok(rustix::fs::open(dir, flags | OFlags::NOFOLLOW, Mode::empty())?),
        other => Ok(other?),
    }
}

fn create_locked(dir: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?;
    // Nobody else can know the name yet, so this never waits.
    rustix::fs::flock(&fd, FlockOperation::LockExclusive)?;
    Ok(fd)
}

fn fsync_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, ".", flags, Mode::empty())?;
    Ok(rustix::fs::fsync(fd)?)
}

/// Fsyncs each distinct directory once; a failure is logged (the renames happened).
fn sync_dirs<'a>(dirs: impl Iterator<Item = (&'a Path, BorrowedFd<'a>)>) {
    let mut seen: Vec<&Path> = Vec::new();
    for (path, fd) in dirs {
        if seen.contains(&path) {
            continue;
        }
        seen.push(path);
        if let Err(err) = fsync_dir(fd) {
            tracing::warn!(dir = %path.display(), %err, "could not fsync a patched directory");
        }
    }
}

/// Hard to predict and never repeating within the process.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or(0);
    hasher.write_u128(nanos);
    hasher.finish()
}
