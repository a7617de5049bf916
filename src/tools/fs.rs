//! Root confinement, atomic writes and file bookkeeping shared by every tool that
//! takes a path.
//!
//! A session may only touch files inside its roots, and that must hold *after*
//! symlinks are followed. Checking a path and then opening it leaves a window in which
//! a component can be swapped for a symlink pointing elsewhere, so nothing here ever
//! canonicalizes a path and opens the result. Instead every lookup is done by the
//! kernel relative to a file descriptor of the root with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)`: a `..` that climbs above the root, an absolute symlink, or
//! a symlink (also an intermediate directory) leading outside makes the open itself
//! fail with `EXDEV`. Kernels without `openat2` (before 5.6, or behind a seccomp filter
//! answering `ENOSYS`) get a component-by-component walk that opens each name with
//! `O_NOFOLLOW`, reads symlinks itself and refuses the same escapes.
//!
//! Writes go through [`write_atomic`]: a temporary file in the same directory, fsync,
//! rename over the target, fsync of the directory; a reader never sees a partial file.
//! [`FileTracker`] remembers what a session read so that write_file and edit_file can
//! refuse to overwrite a file the model has not seen or that changed behind its back,
//! and [`lock_path`] serialises read-modify-write cycles on one file across sessions.

pub(crate) mod access;
pub mod budget;
pub(crate) mod lexical;
mod lock;
pub mod text;
pub(crate) mod tracker;

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

pub(crate) use access::WalkAccess;
pub use access::{Access, AccessKind, PathRules, Refusal, RuleEffect, RuleHit};
pub use lock::{PathLock, lock_path};
pub use tracker::{FileStamp, FileTracker, content_hash};

use super::{Env, ErrorType, ToolResult};

impl From<FsError> for ToolResult {
    fn from(err: FsError) -> ToolResult {
        ToolResult::failure(err.error_type(), err.to_string())
    }
}

/// Longest path argument accepted, in bytes. This is Linux's `PATH_MAX`: the kernel
/// refuses longer paths anyway, and rejecting them up front keeps megabyte-sized
/// model output out of syscalls and error messages.
pub const MAX_PATH_BYTES: usize = 4096;

/// Symlinks the fallback walk follows in one lookup before giving up with `ELOOP`; the
/// kernel's own limit, so both strategies accept the same paths.
const MAX_SYMLINK_FOLLOWS: usize = 40;

/// How often a lookup is retried when `openat2` answers `EAGAIN` (a concurrent rename
/// somewhere in the filesystem made the kernel unsure the walk stayed beneath the
/// root). Such races are rare and short; a handful of retries separates "busy" from
/// "something keeps renaming", which is then reported as an I/O error.
const MAX_EAGAIN_RETRIES: usize = 16;

/// How many names [`write_atomic`] tries for its temporary file before giving up.
/// Names are random, so a collision is already unlikely; a few retries make it
/// practically impossible without looping forever on a directory that refuses.
const MAX_TEMP_NAME_ATTEMPTS: usize = 16;

/// Longest part of the target's name copied into a temporary file's name, in bytes.
/// Keeps `.{name}.{random}.tmp` under the 255-byte name limit of common filesystems
/// while still telling a human whose temporary file it is.
const TEMP_NAME_PREFIX_BYTES: usize = 64;

/// Longest user-supplied path repeated in an error message, in characters.
const SHOWN_PATH_CHARS: usize = 200;

/// Why a path operation failed, mapped onto the stable error codes.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The path leaves the session roots (directly, through `..`, or through a
    /// symlink). Only ever used for confinement, never for OS permission errors.
    // The message alone: the error code (`access_denied`, `not_found`) says the rest,
    // and every face shows both.
    #[error("{0}")]
    AccessDenied(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0} is a directory")]
    IsDirectory(String),
    /// A directory was required (a walker's starting point) but the path names
    /// something else.
    #[error("{0} is not a directory")]
    NotDirectory(String),
    /// A FIFO, socket or device: reading or replacing one could block or have side
    /// effects, so the file tools refuse them.
    #[error("{0} is not a regular file")]
    NotRegularFile(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    InvalidPath(String),
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
}

impl FsError {
    pub fn error_type(&self) -> ErrorType {
        match self {
            FsError::AccessDenied(_) => ErrorType::AccessDenied,
            FsError::NotFound(_) => ErrorType::NotFound,
            FsError::IsDirectory(_) => ErrorType::IsDirectory,
            FsError::NotDirectory(_) | FsError::InvalidPath(_) => ErrorType::InvalidArguments,
            FsError::TooLarge(_) => ErrorType::TooLarge,
            FsError::NotRegularFile(_) | FsError::Io { .. } => ErrorType::IoError,
        }
    }

    /// Classifies an I/O error on `shown` (a path as the user wrote it): the errors
    /// that have a code of their own get it, everything else is `io_error`.
    pub fn from_io(shown: &str, err: io::Error) -> FsError {
        let shown = shorten(shown);
        match Errno::from_io_error(&err) {
            Some(Errno::NOENT) => FsError::NotFound(format!("{shown} does not exist")),
            Some(Errno::NOTDIR) => FsError::NotFound(format!(
                "{shown} does not exist (a component of the path is not a directory)"
            )),
            Some(Errno::ISDIR) => FsError::IsDirectory(shown),
            Some(Errno::XDEV) => {
                FsError::AccessDenied(format!("{shown} resolves outside the session roots"))
            }
            Some(Errno::NAMETOOLONG) => {
                FsError::InvalidPath(format!("{shown}: a file name in the path is too long"))
            }
            Some(Errno::LOOP) => FsError::Io {
                path: shown,
                source: io::Error::other(
                    "too many levels of symbolic links, or a /proc magic link (not followed)",
                ),
            },
            _ => FsError::Io { path: shown, source: err },
        }
    }

    fn from_errno(shown: &str, errno: Errno) -> FsError {
        FsError::from_io(shown, io::Error::from(errno))
    }
}

/// What kind of file a path names, as far as the tools care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    File,
    Directory,
    /// A FIFO, socket, device or (only with `O_PATH|O_NOFOLLOW`) a symlink.
    Other,
}

/// The facts about an open file the tools need, read with `fstat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileInfo {
    pub kind: FileKind,
    pub len: u64,
    pub modified: Option<SystemTime>,
    /// The full `st_mode` (type and permission bits).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Hard links to the file (`st_nlink`).
    pub nlink: u64,
}

impl FileInfo {
    /// A regular file with more than one name. Its other names may lie anywhere on the
    /// same file system, outside the roots too, and nothing tells where: such a file is
    /// never read through a tool (see [`refuse_hardlinked`]).
    pub fn is_hardlinked(&self) -> bool {
        self.kind == FileKind::File && self.nlink > 1
    }
}

/// Reads [`FileInfo`] from an open descriptor (`O_PATH` descriptors included).
pub fn file_info(fd: impl AsFd) -> io::Result<FileInfo> {
    let stat = rustix::fs::fstat(fd)?;
    let kind = match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => FileKind::File,
        FileType::Directory => FileKind::Directory,
        _ => FileKind::Other,
    };
    let modified = u64::try_from(stat.st_mtime).ok().and_then(|secs| {
        let nanos = u32::try_from(stat.st_mtime_nsec).unwrap_or(0);
        SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
    });
    Ok(FileInfo {
        kind,
        len: u64::try_from(stat.st_size).unwrap_or(0),
        modified,
        mode: stat.st_mode,
        uid: stat.st_uid,
        gid: stat.st_gid,
        nlink: stat.st_nlink,
    })
}

/// A path opened beneath one of the session roots.
#[derive(Debug)]
pub struct Resolved {
    /// The opened file or directory. [`resolve`] opens with `O_PATH` (enough for
    /// `fstat`, `*at` calls and walkers, no side effects even on a FIFO);
    /// [`open_read`] opens for reading.
    pub fd: OwnedFd,
    /// The absolute path as the kernel sees it (symlinks resolved), inside `root`.
    /// Two spellings of one file give the same path, which makes it the key for
    /// [`FileTracker`] and [`lock_path`].
    pub path: PathBuf,
    /// The root the path was confined to.
    pub root: PathBuf,
    pub kind: FileKind,
    pub is_dir: bool,
    /// What `fstat` said of the descriptor when it was opened.
    pub info: FileInfo,
}

impl Resolved {
    /// The path relative to its root (empty for the root itself); what permission
    /// rules match against.
    pub fn relative(&self) -> &Path {
        self.path.strip_prefix(&self.root).unwrap_or(Path::new(""))
    }
}

/// Whether [`resolve_parent`] may create missing directories on the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParentDirs {
    /// Every directory must exist already (`not_found` otherwise).
    MustExist,
    /// Missing directories are created one component at a time, beneath the root.
    Create,
}

/// The directory that holds (or will hold) a file, opened beneath a root, plus the
/// file's own name. For tools that create or replace a file: every operation is done
/// relative to `dir`, so nothing can redirect it once the directory is open.
#[derive(Debug)]
pub struct ResolvedParent {
    /// The directory, opened with `O_PATH | O_DIRECTORY`.
    pub dir: OwnedFd,
    /// The directory's absolute path as the kernel sees it.
    pub dir_path: PathBuf,
    /// The final component: never empty, `.`, `..`, and never contains `/`.
    pub name: OsString,
    pub root: PathBuf,
}

impl ResolvedParent {
    /// The file's absolute path (`dir_path/name`), the key for [`FileTracker`] and
    /// [`lock_path`].
    pub fn path(&self) -> PathBuf {
        self.dir_path.join(&self.name)
    }
}

/// Opens `path` (relative to the session cwd, or absolute) with `O_PATH`, following
/// symlinks but never leaving the session roots.
///
/// The resolved path is checked against the session's [`Access`] for reading: what a
/// tool resolves, it shows (a file's content, a directory's names).
pub fn resolve(env: &Env, path: &str) -> Result<Resolved, FsError> {
    check_path(path)?;
    let resolved = resolve_at(env, Path::new(path), path, OFlags::PATH, Strategy::Auto)?;
    check_access(env, AccessKind::Read, &resolved.path, path)?;
    Ok(resolved)
}

/// Like [`resolve`] but opens for reading (`O_RDONLY | O_NONBLOCK`, so a FIFO cannot
/// block the open; callers still refuse anything that is not a regular file or a
/// directory).
///
/// Checked like [`resolve`]; a regular file with more than one hard link is refused
/// (see [`refuse_hardlinked`]).
pub fn open_read(env: &Env, path: &str) -> Result<Resolved, FsError> {
    check_path(path)?;
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
    let resolved = resolve_at(env, Path::new(path), path, flags, Strategy::Auto)?;
    check_access(env, AccessKind::Read, &resolved.path, path)?;
    refuse_hardlinked(&resolved.info, path)?;
    Ok(resolved)
}

/// Opens a directory beneath the roots (`None` means the session cwd) with `O_PATH`,
/// for work that must stay in that very directory: a walker reads it and opens
/// everything below relative to it, a command is started in it by descriptor. Its
/// path is only for showing; nothing re-opens it by name.
pub fn open_dir(env: &Env, path: Option<&str>) -> Result<Resolved, FsError> {
    let path = match path {
        None | Some("") => ".",
        Some(path) => path,
    };
    let resolved = resolve(env, path)?;
    if !resolved.is_dir {
        return Err(FsError::NotDirectory(shorten(path)));
    }
    Ok(resolved)
}

/// Refuses a regular file with more than one hard link. Its other names can be
/// anywhere on the same file system (outside the roots, or one of toolgate's own
/// files), and the kernel cannot say where, so reading it could show what lies
/// outside. (Writes replace a file by rename, which never changes the other names.)
pub fn refuse_hardlinked(info: &FileInfo, shown: &str) -> Result<(), FsError> {
    if info.is_hardlinked() {
        return Err(FsError::AccessDenied(format!(
            "{} has {} hard links; files with more than one link are not read through \
             tools, since their other names may lie outside the session roots",
            shorten(shown),
            info.nlink
        )));
    }
    Ok(())
}

/// Checks `access` to the resolved `real` path against the session's [`Access`]
/// (toolgate's own files, deny and ask rules on resolved paths).
pub fn check_access(
    env: &Env,
    access: AccessKind,
    real: &Path,
    shown: &str,
) -> Result<(), FsError> {
    let named = named_path(env, Path::new(shown));
    env.access
        .check(access, real, Some(&named), &env.roots)
        .map_err(|refusal| FsError::AccessDenied(refusal.message(&shorten(shown), real)))
}

/// The absolute path a call names, resolved lexically (what the permission layer
/// decided on).
fn named_path(env: &Env, path: &Path) -> PathBuf {
    if let Some(plain) = lexical::join_plain(&env.cwd, path) {
        return plain;
    }
    let logical = if path.is_absolute() { path.to_path_buf() } else { env.cwd.join(path) };
    Path::new("/").join(normalize_lexically(&logical))
}

/// Opens the directory that holds `path`'s final component, beneath a root, and
/// returns it with the final name, for creating or replacing that file. With
/// [`ParentDirs::Create`], missing directories are created (mode 0755 minus the
/// umask) one component at a time, each `mkdirat` relative to a directory already
/// confined. The final component itself is not looked at (see [`resolve_for_write`]).
pub fn resolve_parent(
    env: &Env,
    path: &str,
    parents: ParentDirs,
) -> Result<ResolvedParent, FsError> {
    check_path(path)?;
    let parent = resolve_parent_at(env, Path::new(path), path, parents, Strategy::Auto)?;
    check_access(env, AccessKind::Write, &parent.path(), path)?;
    Ok(parent)
}

/// The file a write should replace: like [`resolve_parent`], but a final component
/// that is a symlink is followed (confined like any lookup) so that writing through
/// a link inside the roots replaces its target instead of the link. A final
/// component that is a directory is refused. The file itself may not exist yet.
///
/// The file's resolved path is checked against the session's [`Access`] for writing,
/// and for reading too when the file exists (changing a file shows what it held).
pub fn resolve_for_write(
    env: &Env,
    path: &str,
    parents: ParentDirs,
) -> Result<ResolvedParent, FsError> {
    let target = resolve_for_write_unchecked(env, path, parents)?;
    let real = target.path();
    check_access(env, AccessKind::Write, &real, path)?;
    if rustix::fs::statat(&target.dir, &target.name, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
        check_access(env, AccessKind::Read, &real, path)?;
    }
    Ok(target)
}

fn resolve_for_write_unchecked(
    env: &Env,
    path: &str,
    parents: ParentDirs,
) -> Result<ResolvedParent, FsError> {
    check_path(path)?;
    let parent = resolve_parent_at(env, Path::new(path), path, parents, Strategy::Auto)?;
    let stat = match rustix::fs::statat(&parent.dir, &parent.name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(parent),
        Err(errno) => return Err(FsError::from_errno(path, errno)),
    };
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => Err(FsError::IsDirectory(shorten(path))),
        FileType::Symlink => {
            let target = match resolve_at(env, Path::new(path), path, OFlags::PATH, Strategy::Auto)
            {
                Ok(target) => target,
                Err(FsError::NotFound(_)) => {
                    return Err(FsError::NotFound(format!(
                        "{} is a symbolic link to a file that does not exist; write to the \
                         link's target instead",
                        shorten(path)
                    )));
                }
                Err(err) => return Err(err),
            };
            if target.is_dir {
                return Err(FsError::IsDirectory(shorten(path)));
            }
            resolve_parent_at(env, &target.path, path, ParentDirs::MustExist, Strategy::Auto)
        }
        _ => Ok(parent),
    }
}

/// Opens the existing file a [`ResolvedParent`] names, for reading, without following
/// a symlink. `None` when it does not exist.
pub fn open_existing(
    target: &ResolvedParent,
    shown: &str,
) -> Result<Option<(std::fs::File, FileInfo)>, FsError> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(&target.dir, &target.name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(Errno::LOOP) => {
            return Err(FsError::AccessDenied(format!(
                "{} was replaced by a symbolic link while the call ran",
                shorten(shown)
            )));
        }
        Err(errno) => return Err(FsError::from_errno(shown, errno)),
    };
    let info = file_info(&fd).map_err(|err| FsError::from_io(shown, err))?;
    refuse_hardlinked(&info, shown)?;
    match info.kind {
        FileKind::File => Ok(Some((std::fs::File::from(fd), info))),
        FileKind::Directory => Err(FsError::IsDirectory(shorten(shown))),
        FileKind::Other => Err(FsError::NotRegularFile(shorten(shown))),
    }
}

/// Reads a whole file, refusing (with `too_large`) anything longer than `max_bytes`.
/// The size is checked again while reading: a file can grow after its `fstat`.
pub fn read_capped(
    file: impl Read,
    info: &FileInfo,
    max_bytes: u64,
    shown: &str,
) -> Result<Vec<u8>, FsError> {
    let mut bytes = Vec::new();
    read_up_to(file, info, max_bytes.saturating_add(1), max_bytes, shown, &mut bytes)?;
    Ok(bytes)
}

/// Reads a file as it was at its `fstat`: a regular file of known size is read up to
/// that size, which spares the last read that would only find its end (what was
/// appended since is not part of the snapshot). Files that report no size (procfs
/// and the like) are read to their end. For reading only: a read-modify-write must
/// use [`read_capped`], which keeps what was appended.
pub fn read_snapshot(
    file: impl Read,
    info: &FileInfo,
    max_bytes: u64,
    shown: &str,
) -> Result<Vec<u8>, FsError> {
    let mut bytes = Vec::new();
    read_snapshot_into(file, info, max_bytes, shown, &mut bytes)?;
    Ok(bytes)
}

/// [`read_snapshot`] into `bytes` (cleared first), for a caller that reuses a buffer.
pub fn read_snapshot_into(
    file: impl Read,
    info: &FileInfo,
    max_bytes: u64,
    shown: &str,
    bytes: &mut Vec<u8>,
) -> Result<(), FsError> {
    let limit = if info.len > 0 { info.len } else { max_bytes.saturating_add(1) };
    read_up_to(file, info, limit, max_bytes, shown, bytes)
}

fn read_up_to(
    mut file: impl Read,
    info: &FileInfo,
    limit: u64,
    max_bytes: u64,
    shown: &str,
    bytes: &mut Vec<u8>,
) -> Result<(), FsError> {
    let too_large = || {
        FsError::TooLarge(format!(
            "{} is larger than the read limit of {max_bytes} bytes; search it with \
             search_code instead of reading it whole",
            shorten(shown)
        ))
    };
    if info.len > max_bytes {
        return Err(too_large());
    }
    bytes.clear();
    bytes.reserve(usize::try_from(info.len).unwrap_or(0));
    (&mut file).take(limit).read_to_end(bytes).map_err(|err| FsError::from_io(shown, err))?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > max_bytes {
        return Err(too_large());
    }
    Ok(())
}

/// The current stamp of an open file, for comparing with what a session recorded. A
/// file over `max_bytes` is not hashed (it cannot have been read in full either);
/// its stamp then compares by length and mtime.
pub fn current_stamp(
    file: impl Read,
    info: &FileInfo,
    max_bytes: u64,
    shown: &str,
) -> Result<FileStamp, FsError> {
    if info.len > max_bytes {
        return Ok(FileStamp { modified: info.modified, len: info.len, hash: None });
    }
    let bytes = read_capped(file, info, max_bytes, shown)?;
    Ok(FileStamp::of(info, &bytes))
}

/// Writes `bytes` to `dir/name` atomically: a temporary file is created next to the
/// target with `O_EXCL | O_NOFOLLOW` under a random name, written in full, given
/// `mode` (permission bits; `None` means 0644 minus the umask, for new files),
/// fsynced, renamed over the target, and the directory is fsynced. On any failure the
/// temporary file is removed and the target is untouched, so no reader ever sees a
/// partial file. Returns the stamp of what was written.
///
/// Replacing by rename gives the target a new inode: other hard links to the old
/// file keep the old content. That is the price of never exposing a torn file.
pub fn write_atomic(
    dir: impl AsFd,
    name: &OsStr,
    bytes: &[u8],
    mode: Option<u32>,
) -> io::Result<FileStamp> {
    write_atomic_inner(dir.as_fd(), name, bytes, mode, None)
}

/// [`write_atomic`] for replacing an existing file: keeps its permission bits and,
/// where the daemon is allowed to, its owner and group (a daemon running as root must
/// not turn a user's file into root's). Set-id and sticky bits are dropped on
/// purpose: new content should not silently inherit privileges.
pub fn write_atomic_replacing(
    dir: impl AsFd,
    name: &OsStr,
    bytes: &[u8],
    existing: &FileInfo,
) -> io::Result<FileStamp> {
    let mode = existing.mode & 0o777;
    write_atomic_inner(dir.as_fd(), name, bytes, Some(mode), Some((existing.uid, existing.gid)))
}

/// The write path shared by the tools that change a file: resolves the target beneath
/// the roots, takes the file's path lock, and runs `work` on the blocking pool with the
/// lock held until it is over (even if nobody waits for the result any more), so two
/// read-modify-write cycles on one file never interleave.
pub async fn with_write_lock<T, F>(
    env: &Arc<Env>,
    path: &str,
    parents: ParentDirs,
    work: F,
) -> Result<T, FsError>
where
    F: FnOnce(&ResolvedParent) -> Result<T, FsError> + Send + 'static,
    T: Send + 'static,
{
    let resolve_env = env.clone();
    let path = path.to_owned();
    let target = blocking(move || resolve_for_write(&resolve_env, &path, parents)).await?;
    let lock = lock_path(&target.path()).await;
    blocking(move || {
        let _lock = lock;
        work(&target)
    })
    .await
}

/// Runs blocking filesystem work off the async threads. A panic inside is re-raised
/// here so that the registry's panic guard reports it like any other tool panic.
pub async fn blocking<T, F>(work: F) -> Result<T, FsError>
where
    F: FnOnce() -> Result<T, FsError> + Send + 'static,
    T: Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(res) => res,
        Err(err) => match err.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(_) => Err(FsError::Io {
                path: String::new(),
                source: io::Error::other("the runtime is shutting down"),
            }),
        },
    }
}

/// A user-supplied path cut to a readable length for messages.
pub fn shorten(path: &str) -> String {
    if path.chars().count() <= SHOWN_PATH_CHARS {
        return path.to_owned();
    }
    let head: String = path.chars().take(SHOWN_PATH_CHARS).collect();
    format!("{head}…")
}

impl FileStamp {
    /// The stamp of `bytes` as read from (or written to) a file with `info`.
    pub fn of(info: &FileInfo, bytes: &[u8]) -> FileStamp {
        FileStamp { modified: info.modified, len: info.len, hash: Some(content_hash(bytes)) }
    }
}

/// Why a write must not go ahead, per the session's [`FileTracker`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staleness {
    /// The session read (or wrote) this content: go ahead.
    Fresh,
    /// The file exists but this session never read it.
    NeverRead,
    /// The file changed since the session last read or wrote it.
    Changed,
}

impl Staleness {
    /// Compares what the session saw of `path` with its current state.
    pub fn check(tracker: &FileTracker, path: &Path, current: &FileStamp) -> Staleness {
        match tracker.get(path) {
            None => Staleness::NeverRead,
            Some(seen) if seen.matches(current) => Staleness::Fresh,
            Some(_) => Staleness::Changed,
        }
    }

    /// The message for the model, or `None` when fresh.
    pub fn message(self, shown: &str) -> Option<String> {
        let shown = shorten(shown);
        match self {
            Staleness::Fresh => None,
            Staleness::NeverRead => Some(format!(
                "{shown} exists and has not been read in this session; read it with \
                 read_file first"
            )),
            Staleness::Changed => Some(format!(
                "{shown} has changed since it was last read in this session; read it again \
                 with read_file before changing it"
            )),
        }
    }
}

// ---------------------------------------------------------------------------------
// Confinement internals.

/// Which mechanism confines a lookup. `Walk` exists for kernels without `openat2`,
/// and so that tests can exercise it on kernels that have one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// `openat2`, falling back to the walk once the kernel answers `ENOSYS`.
    Auto,
    /// Always the component-by-component walk.
    Walk,
}

/// Set once `openat2` answered `ENOSYS`, so later lookups go straight to the walk.
static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

/// Rejects paths no tool should ever pass to the kernel.
fn check_path(path: &str) -> Result<(), FsError> {
    if path.is_empty() {
        return Err(FsError::InvalidPath("the path is empty".to_owned()));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(FsError::InvalidPath(format!(
            "the path is {} bytes long; the limit is {MAX_PATH_BYTES}",
            path.len()
        )));
    }
    if path.contains('\0') {
        return Err(FsError::InvalidPath(format!(
            "the path {:?} contains a NUL byte",
            shorten(path)
        )));
    }
    Ok(())
}

/// A path split into the root it falls under and the rest, still unresolved.
struct Located<'env> {
    root: &'env Path,
    /// Relative to `root`; may contain `..` (the kernel resolves it, confined).
    rel: PathBuf,
    /// The path ended in `/` or `/.`: it must name a directory.
    wants_dir: bool,
}

/// Picks the root a path falls under, lexically and without touching the
/// filesystem: that is only a choice of starting point, the kernel does the checking.
/// With nested roots the outermost wins, since it admits everything the inner ones do.
/// A relative path that reaches a *different* root only through `..` starts in the
/// cwd's root and is denied there; an absolute path into the other root works.
fn locate<'env>(env: &'env Env, path: &Path, shown: &str) -> Result<Located<'env>, FsError> {
    let logical = if path.is_absolute() { path.to_path_buf() } else { env.cwd.join(path) };
    let root = env
        .roots
        .iter()
        .filter(|root| logical.starts_with(root))
        .min_by_key(|root| root.components().count())
        .ok_or_else(|| {
            FsError::AccessDenied(format!("{} is outside the session roots", shorten(shown)))
        })?;
    let rel = logical.strip_prefix(root).map(Path::to_path_buf).unwrap_or_default();
    let bytes = path.as_os_str().as_bytes();
    let wants_dir = bytes.ends_with(b"/") || bytes.ends_with(b"/.") || bytes == b".";
    Ok(Located { root, rel, wants_dir })
}

fn open_root(root: &Path, shown: &str) -> Result<OwnedFd, FsError> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    rustix::fs::open(root, flags, Mode::empty()).map_err(|errno| FsError::Io {
        path: shorten(shown),
        source: io::Error::new(
            io::Error::from(errno).kind(),
            format!("the session root {} cannot be opened: {errno}", root.display()),
        ),
    })
}

/// The error for a file that is not there: `shown` as the caller wrote it and, when
/// that is relative, the absolute path it named.
pub fn missing(shown: &str, absolute: &Path) -> FsError {
    let message = format!("{} does not exist", shorten(shown));
    if Path::new(shown).is_relative() {
        let looked = shorten(&absolute.display().to_string());
        FsError::NotFound(format!("{message} (looked for {looked})"))
    } else {
        FsError::NotFound(message)
    }
}

/// A relative path that does not exist: the error says where it was looked for (the
/// session's working directory it resolved against), which the caller may not know.
fn where_looked(env: &Env, path: &Path, err: FsError) -> FsError {
    match err {
        FsError::NotFound(message) if path.is_relative() => {
            let looked = shorten(&env.cwd.join(path).display().to_string());
            FsError::NotFound(format!("{message} (looked for {looked})"))
        }
        other => other,
    }
}

fn resolve_at(
    env: &Env,
    path: &Path,
    shown: &str,
    flags: OFlags,
    strategy: Strategy,
) -> Result<Resolved, FsError> {
    resolve_at_inner(env, path, shown, flags, strategy).map_err(|err| where_looked(env, path, err))
}

fn resolve_at_inner(
    env: &Env,
    path: &Path,
    shown: &str,
    flags: OFlags,
    strategy: Strategy,
) -> Result<Resolved, FsError> {
    if strategy == Strategy::Auto
        && let Some(resolved) = resolve_plain(env, path, shown, flags)?
    {
        return Ok(resolved);
    }
    let located = locate(env, path, shown)?;
    let (fd, route) = match open_direct(&located, flags, strategy) {
        Some(opened) => opened.map(|fd| (fd, Route::Direct)),
        None => {
            let root_fd = open_root(located.root, shown)?;
            open_beneath(root_fd.as_fd(), &located.rel, flags, strategy)
        }
    }
    .map_err(|errno| FsError::from_errno(shown, errno))?;
    let info = file_info(&fd).map_err(|err| FsError::from_io(shown, err))?;
    let is_dir = info.kind == FileKind::Directory;
    if located.wants_dir && !is_dir {
        return Err(FsError::from_errno(shown, Errno::NOTDIR));
    }
    let path = real_path(fd.as_fd(), located.root, &located.rel, route, shown)?;
    Ok(Resolved { fd, path, root: located.root.to_path_buf(), kind: info.kind, is_dir, info })
}

/// [`resolve_at`] for the common case: a plain path ([`lexical`]) strictly below a
/// root, opened the direct way. Its absolute path is then its real path, and the
/// lookup costs one allocation. `None` when the path is not plain, lies below no root
/// (the general way gives the refusal), or crossed a symbolic link.
fn resolve_plain(
    env: &Env,
    path: &Path,
    shown: &str,
    flags: OFlags,
) -> Result<Option<Resolved>, FsError> {
    let Some(absolute) = lexical::join_plain(&env.cwd, path) else {
        return Ok(None);
    };
    // The outermost root, as `locate` picks it: of plain roots that are prefixes of
    // one path, the shortest. (A root that is not plain, `/`, goes the general way.)
    if !env.roots.iter().all(|root| lexical::is_plain(root.as_os_str().as_bytes())) {
        return Ok(None);
    }
    let root = env
        .roots
        .iter()
        .filter(|root| lexical::strictly_below(&absolute, root))
        .min_by_key(|root| root.as_os_str().len());
    let Some(root) = root else {
        return Ok(None);
    };
    let fd = match open_direct_at(&absolute, flags) {
        None => return Ok(None),
        Some(opened) => opened.map_err(|errno| FsError::from_errno(shown, errno))?,
    };
    let info = file_info(&fd).map_err(|err| FsError::from_io(shown, err))?;
    let is_dir = info.kind == FileKind::Directory;
    Ok(Some(Resolved { fd, path: absolute, root: root.clone(), kind: info.kind, is_dir, info }))
}

fn resolve_parent_at(
    env: &Env,
    path: &Path,
    shown: &str,
    parents: ParentDirs,
    strategy: Strategy,
) -> Result<ResolvedParent, FsError> {
    resolve_parent_at_inner(env, path, shown, parents, strategy)
        .map_err(|err| where_looked(env, path, err))
}

fn resolve_parent_at_inner(
    env: &Env,
    path: &Path,
    shown: &str,
    parents: ParentDirs,
    strategy: Strategy,
) -> Result<ResolvedParent, FsError> {
    let (parent, name) = split_final(path, shown)?;
    let located = locate(env, &parent, shown)?;
    let flags = OFlags::PATH | OFlags::DIRECTORY;
    let opened = match open_direct(&located, flags, strategy) {
        Some(Ok(fd)) => Ok((fd, Route::Direct)),
        Some(Err(errno)) if errno != Errno::NOENT || parents != ParentDirs::Create => Err(errno),
        _ => {
            let root_fd = open_root(located.root, shown)?;
            match open_beneath(root_fd.as_fd(), &located.rel, flags, strategy) {
                Err(Errno::NOENT) if parents == ParentDirs::Create => {
                    create_beneath(root_fd.as_fd(), &located.rel, strategy)
                }
                other => other,
            }
        }
    };
    let (dir, route) = opened.map_err(|errno| FsError::from_errno(shown, errno))?;
    let dir_path = real_path(dir.as_fd(), located.root, &located.rel, route, shown)?;
    Ok(ResolvedParent { dir, dir_path, name, root: located.root.to_path_buf() })
}

/// Splits off the final component, which must be a real name.
fn split_final(path: &Path, shown: &str) -> Result<(PathBuf, OsString), FsError> {
    let bytes = path.as_os_str().as_bytes();
    let (parent, name) = match bytes.iter().rposition(|&byte| byte == b'/') {
        Some(idx) => (&bytes[..=idx], &bytes[idx + 1..]),
        None => (&b"."[..], bytes),
    };
    if name.is_empty() || name == b"." || name == b".." {
        return Err(FsError::InvalidPath(format!("{} does not name a file", shorten(shown))));
    }
    Ok((PathBuf::from(OsStr::from_bytes(parent)), OsString::from_vec(name.to_vec())))
}

/// How a lookup reached its descriptor, which tells how to learn its real path.
#[derive(Debug)]
enum Route {
    /// [`open_direct`] crossed no symbolic link and no `..`: the path is the real one,
    /// and the kernel need not be asked.
    Direct,
    /// `openat2` beneath the root (which may have followed symbolic links): only the
    /// kernel knows where it ended.
    Followed,
    /// The walk did the work and took this path (symlinks resolved).
    Walked(PathBuf),
}

/// The fast path of a lookup: a path below its root with no `..` and no symbolic
/// link, opened by its absolute name with `RESOLVE_NO_SYMLINKS`. The root is
/// canonical, so the walk crosses no link above it either, and without `..` and links
/// it can only go down from the root: the result is beneath the root, and the path is
/// the real one, with no root descriptor to open and no kernel path to read back.
///
/// `None` when the path does not qualify or crossed a link (`ELOOP`): then the
/// confined lookup from a root descriptor decides. Any other error is the answer.
fn open_direct(
    located: &Located<'_>,
    flags: OFlags,
    strategy: Strategy,
) -> Option<rustix::io::Result<OwnedFd>> {
    if strategy != Strategy::Auto
        || OPENAT2_MISSING.load(Ordering::Relaxed)
        || located.rel.components().any(|part| part == Component::ParentDir)
    {
        return None;
    }
    open_direct_at(&located.root.join(&located.rel), flags)
}

/// [`open_direct`] of a path below its (canonical) root with no `..`, by its absolute
/// name. `None` when a symbolic link was crossed or `openat2` cannot be used.
fn open_direct_at(absolute: &Path, flags: OFlags) -> Option<rustix::io::Result<OwnedFd>> {
    if OPENAT2_MISSING.load(Ordering::Relaxed) {
        return None;
    }
    let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let cwd = rustix::fs::CWD;
    match rustix::fs::openat2(cwd, absolute, flags | OFlags::CLOEXEC, Mode::empty(), resolve) {
        Ok(fd) => Some(Ok(fd)),
        Err(Errno::LOOP | Errno::AGAIN | Errno::XDEV | Errno::NOSYS) => None,
        Err(errno) => Some(Err(errno)),
    }
}

/// Opens `rel` beneath `root`. Returns the descriptor and how it was reached. Errors
/// follow `openat2`: `EXDEV` for any attempt to leave the root. (Paths without links
/// or `..` never get here: [`open_direct`] takes them.)
fn open_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlags,
    strategy: Strategy,
) -> rustix::io::Result<(OwnedFd, Route)> {
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    let strategy = if OPENAT2_MISSING.load(Ordering::Relaxed) { Strategy::Walk } else { strategy };
    if strategy == Strategy::Auto {
        let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        let mut retries = 0;
        loop {
            match rustix::fs::openat2(root, rel, flags | OFlags::CLOEXEC, Mode::empty(), resolve) {
                Ok(fd) => return Ok((fd, Route::Followed)),
                Err(Errno::AGAIN) if retries < MAX_EAGAIN_RETRIES => retries += 1,
                Err(Errno::NOSYS) => {
                    OPENAT2_MISSING.store(true, Ordering::Relaxed);
                    break;
                }
                Err(errno) => return Err(errno),
            }
        }
    }
    walk_beneath(root, rel, flags).map(|(fd, walked)| (fd, Route::Walked(walked)))
}

/// The absolute path of a descriptor opened beneath `root` by way of `route`.
fn real_path(
    fd: BorrowedFd<'_>,
    root: &Path,
    rel: &Path,
    route: Route,
    shown: &str,
) -> Result<PathBuf, FsError> {
    match route {
        Route::Direct => Ok(root.join(normalize_lexically(rel))),
        Route::Followed => kernel_path(fd, root, &normalize_lexically(rel), shown),
        Route::Walked(walked) => kernel_path(fd, root, &walked, shown),
    }
}

/// The `openat2`-less lookup: one component at a time, each opened with
/// `O_PATH | O_NOFOLLOW` relative to the directory before it, `..` handled from our
/// own stack of open directories (so it can never climb above the root), and symlinks
/// read with `readlinkat` and spliced into the remaining components. Absolute
/// symlinks are refused, as `RESOLVE_BENEATH` refuses them.
///
/// Unlike `openat2`, this cannot notice a directory being moved out of the root while
/// the walk holds it; [`kernel_path`] catches that afterwards when `/proc` is there.
fn walk_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlags,
) -> rustix::io::Result<(OwnedFd, PathBuf)> {
    let component_flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut pending: VecDeque<OsString> = split_components(rel.as_os_str().as_bytes());
    if rel.is_absolute() {
        return Err(Errno::XDEV);
    }
    // `dirs[i]` is the directory reached after `names[..i]`; `dirs[0]` is the root.
    let mut dirs: Vec<OwnedFd> =
        vec![rustix::fs::openat(root, ".", component_flags, Mode::empty())?];
    let mut names: Vec<OsString> = Vec::new();
    // The final component when it is not a directory: its parent is `dirs.last()`.
    let mut leaf: Option<(OwnedFd, OsString)> = None;
    let mut follows = 0;
    while let Some(name) = pending.pop_front() {
        if leaf.is_some() {
            // Something follows a non-directory.
            return Err(Errno::NOTDIR);
        }
        match name.as_bytes() {
            b"." => continue,
            b".." => {
                if names.pop().is_none() {
                    return Err(Errno::XDEV);
                }
                dirs.pop();
                continue;
            }
            _ => {}
        }
        let parent = dirs.last().ok_or(Errno::XDEV)?;
        let fd = rustix::fs::openat(parent, &name, component_flags, Mode::empty())?;
        let stat = rustix::fs::fstat(&fd)?;
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Symlink => {
                if pending.is_empty() && flags.contains(OFlags::NOFOLLOW) {
                    return Err(Errno::LOOP);
                }
                follows += 1;
                if follows > MAX_SYMLINK_FOLLOWS {
                    return Err(Errno::LOOP);
                }
                let target = rustix::fs::readlinkat(&fd, "", Vec::new())?;
                let target = target.as_bytes();
                if target.first() == Some(&b'/') {
                    return Err(Errno::XDEV);
                }
                for component in split_components(target).into_iter().rev() {
                    pending.push_front(component);
                }
            }
            FileType::Directory => {
                dirs.push(fd);
                names.push(name);
            }
            _ => leaf = Some((fd, name)),
        }
    }
    let mut walked: PathBuf = names.iter().collect();
    let fd = match leaf {
        Some((fd, name)) => {
            walked.push(&name);
            if flags.contains(OFlags::DIRECTORY) {
                return Err(Errno::NOTDIR);
            }
            if flags.contains(OFlags::PATH) {
                fd
            } else {
                // Reopen for real I/O relative to the confined parent; O_NOFOLLOW
                // refuses a symlink swapped in since the component was checked.
                let parent = dirs.last().ok_or(Errno::XDEV)?;
                rustix::fs::openat(
                    parent,
                    &name,
                    flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?
            }
        }
        None => {
            let dir = dirs.pop().ok_or(Errno::XDEV)?;
            if flags.contains(OFlags::PATH) {
                dir
            } else {
                rustix::fs::openat(&dir, ".", flags | OFlags::CLOEXEC, Mode::empty())?
            }
        }
    };
    Ok((fd, walked))
}

/// Splits a path into its non-empty components (`.` and `..` kept).
fn split_components(bytes: &[u8]) -> VecDeque<OsString> {
    bytes
        .split(|&byte| byte == b'/')
        .filter(|component| !component.is_empty())
        .map(|component| OsString::from_vec(component.to_vec()))
        .collect()
}

/// Opens the directory `rel` beneath `root`, creating missing components. Each
/// prefix is opened beneath the root (so a symlink in the way is confined like any
/// lookup) and a missing one is made with `mkdirat` relative to its confined parent.
fn create_beneath(
    root: BorrowedFd<'_>,
    rel: &Path,
    strategy: Strategy,
) -> rustix::io::Result<(OwnedFd, Route)> {
    let flags = OFlags::PATH | OFlags::DIRECTORY;
    let components = split_components(rel.as_os_str().as_bytes());
    let mut prefix = PathBuf::new();
    let mut opened = open_beneath(root, Path::new("."), flags, strategy)?;
    for component in components {
        prefix.push(&component);
        match open_beneath(root, &prefix, flags, strategy) {
            Ok(next) => opened = next,
            Err(Errno::NOENT) if component != ".." && component != "." => {
                match rustix::fs::mkdirat(&opened.0, &component, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(errno) => return Err(errno),
                }
                opened = open_beneath(root, &prefix, flags, strategy)?;
            }
            Err(errno) => return Err(errno),
        }
    }
    Ok(opened)
}

/// `rel` with `.` dropped and `..` applied lexically: the real path when no symbolic
/// link was crossed, otherwise only a fallback name for when neither `/proc` nor the
/// walk can say where a descriptor points.
fn normalize_lexically(rel: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in rel.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => out.push(name),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The absolute path of an open descriptor as the kernel sees it
/// (`/proc/self/fd/N`), checked once more to be inside `root` (defence in depth for
/// the walk, which cannot see a concurrent move). Without `/proc`, `root/fallback`.
fn kernel_path(
    fd: BorrowedFd<'_>,
    root: &Path,
    fallback: &Path,
    shown: &str,
) -> Result<PathBuf, FsError> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    match std::fs::read_link(link) {
        Ok(path) if path.is_absolute() && !path.as_os_str().as_bytes().ends_with(b" (deleted)") => {
            if path.starts_with(root) {
                Ok(path)
            } else {
                Err(FsError::AccessDenied(format!(
                    "{} resolves outside the session roots",
                    shorten(shown)
                )))
            }
        }
        _ => Ok(root.join(fallback)),
    }
}

// ---------------------------------------------------------------------------------
// Atomic writes.

/// Removes the temporary file unless the write got as far as the rename.
struct TempFile<'dir> {
    dir: BorrowedFd<'dir>,
    name: OsString,
    armed: bool,
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Err(errno) = rustix::fs::unlinkat(self.dir, &self.name, AtFlags::empty())
        {
            tracing::warn!(name = ?self.name, %errno, "could not remove a temporary file");
        }
    }
}

/// Gives a new file (one that replaces another) the owner and mode of the one it
/// replaces. The owner is best effort: only a privileged daemon may give a file away,
/// and a file owned by us is still better than no write at all.
pub(crate) fn keep_owner_and_mode(
    file: &std::fs::File,
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        let same = uid == rustix::process::geteuid().as_raw()
            && gid == rustix::process::getegid().as_raw();
        if !same {
            let _ = rustix::fs::fchown(
                file,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            );
        }
    }
    if let Some(mode) = mode {
        rustix::fs::fchmod(file, Mode::from_raw_mode(mode & 0o7777))?;
    }
    Ok(())
}

fn write_atomic_inner(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    bytes: &[u8],
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
) -> io::Result<FileStamp> {
    let (fd, temp) = create_temp(dir, name, mode)?;
    let mut guard = TempFile { dir, name: temp, armed: true };
    let mut file = std::fs::File::from(fd);
    keep_owner_and_mode(&file, mode, owner)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    let info = file_info(&file)?;
    let stamp = FileStamp::of(&info, bytes);
    rustix::fs::renameat(dir, &guard.name, dir, name)?;
    guard.armed = false;
    // The rename is what makes the new content visible; fsyncing the directory makes
    // it survive a crash. Failing that is reported in the log, not as a failed write:
    // the file has been replaced either way.
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, ".", dir_flags, Mode::empty()).and_then(rustix::fs::fsync) {
        Ok(()) => {}
        Err(errno) => tracing::warn!(%errno, "could not fsync a directory after a rename"),
    }
    Ok(stamp)
}

/// Creates a fresh temporary file next to `name`, never following or reusing
/// anything that is already there.
fn create_temp(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    mode: Option<u32>,
) -> io::Result<(OwnedFd, OsString)> {
    // Private until the final mode is set; new files get the usual 0644 minus umask.
    let create_mode = if mode.is_some() { 0o600 } else { 0o644 };
    let flags = OFlags::WRONLY
        | OFlags::CREATE
        | OFlags::EXCL
        | OFlags::NOFOLLOW
        | OFlags::NOCTTY
        | OFlags::CLOEXEC;
    let prefix = &name.as_bytes()[..name.len().min(TEMP_NAME_PREFIX_BYTES)];
    let mut last = Errno::EXIST;
    for _ in 0..MAX_TEMP_NAME_ATTEMPTS {
        let mut temp = b".".to_vec();
        temp.extend_from_slice(prefix);
        temp.extend_from_slice(format!(".{:016x}.tmp", random_u64()).as_bytes());
        let temp = OsString::from_vec(temp);
        match rustix::fs::openat(dir, &temp, flags, Mode::from_raw_mode(create_mode)) {
            Ok(fd) => return Ok((fd, temp)),
            Err(Errno::EXIST) => last = Errno::EXIST,
            Err(errno) => return Err(errno.into()),
        }
    }
    Err(last.into())
}

/// A value for temporary names that is hard to predict and never repeats within the
/// process: the std's randomly keyed hasher over a counter and the clock.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or(0);
    hasher.write_u128(nanos);
    hasher.finish()
}

#[cfg(test)]
mod tests;
