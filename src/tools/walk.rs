//! The directory walk shared by `find_files` and `search_code`: a parallel walk by
//! directory descriptors, the gitignore filters, the path glob, a cancel flag the
//! blocking walker threads can poll cheaply, and the bounded per-thread collection that
//! keeps results deterministic.
//!
//! **Nothing below the start is looked up by name.** The start directory is opened
//! beneath a root (`fs::open_dir`); every directory below is opened with
//! `openat(parent, name, O_DIRECTORY | O_NOFOLLOW)` relative to its parent's
//! descriptor, and every file with `openat(dir, name, O_NOFOLLOW)` relative to its
//! directory's. A directory swapped for a symlink between the listing and the open
//! makes the open fail (it is skipped), so a walk can only ever descend into what is
//! really below its start, however the tree changes meanwhile. Symlinks are listed,
//! never followed.
//!
//! Filtering follows ripgrep: `.ignore`, `.gitignore` and `.git/info/exclude` (read
//! through the same descriptors, with the `ignore` crate's gitignore matchers; ignore
//! files of the directories between the session root and the start apply too) and the
//! user's global git excludes; hidden entries opt-in; `.git` directories never walked.
//! Entries the session's [`Access`](super::fs::Access) withholds (toolgate's own files,
//! files bound by read rules) are left out and counted.
//!
//! Entries arrive in an order that changes from run to run. Determinism comes from
//! sorting once at the end; memory stays bounded because each walker thread keeps only
//! the entries that can still be among the first `limit` in path order ([`Prefix`]),
//! while the totals are counted exactly.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read as _};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use globset::{GlobBuilder, GlobMatcher};
use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::Env;
use super::fs::{FileInfo, Resolved, WalkAccess};

/// Largest ignore file read; longer ones are ignored as a whole (no real one is this
/// big, and a hostile one must not cost the walk memory).
const MAX_IGNORE_FILE_BYTES: u64 = 1024 * 1024;

/// The filters a search applies to the tree, as the model chose them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WalkOptions {
    /// Also walk hidden (dot) files and directories.
    pub(crate) hidden: bool,
    /// Do not read `.gitignore`, `.ignore` and git exclude files.
    pub(crate) no_ignore: bool,
}

/// A directory tree to walk: its start opened beneath a root, and what filters it.
pub(crate) struct Tree {
    /// The start directory (`O_PATH`); everything below is opened relative to it.
    dir: Arc<OwnedFd>,
    /// Its real path, inside the roots (for showing and for matching only).
    path: PathBuf,
    options: WalkOptions,
    access: WalkAccess,
    /// Ignore files of the directories from the session root down to the start's
    /// parent.
    parents: Option<Arc<Level>>,
    global: Gitignore,
}

impl Tree {
    /// Prepares a walk of the directory `start` resolved beneath the session roots.
    pub(crate) fn new(env: &Env, start: Resolved, options: WalkOptions) -> Tree {
        let access = env.access.for_walk(&start.path, &env.roots);
        let (parents, global) = if options.no_ignore {
            (None, Gitignore::empty())
        } else {
            (parent_levels(&start), Gitignore::global().0)
        };
        Tree { dir: Arc::new(start.fd), path: start.path, options, access, parents, global }
    }
}

/// What the walk hands a visitor.
pub(crate) enum Visit<'a> {
    /// An entry that is not a directory (directories are walked, not visited).
    Entry(&'a Entry<'a>),
    /// A directory or entry that could not be read.
    Unreadable,
    /// An entry left out because the session may not see it.
    Withheld,
}

/// What kind of entry a [`Visit::Entry`] is. Symlinks are never followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryKind {
    File,
    Symlink,
    Other,
}

/// A non-directory entry: its name, relative to the directory that holds it (open),
/// and its path relative to the start.
pub(crate) struct Entry<'a> {
    dir: BorrowedFd<'a>,
    name: &'a CStr,
    pub(crate) relative: &'a Path,
    pub(crate) kind: EntryKind,
}

impl Entry<'_> {
    /// Opens the entry for reading, relative to its directory and without following a
    /// symlink. `Ok(None)` when it is (now) not a regular file.
    pub(crate) fn open(&self) -> io::Result<Option<(File, FileInfo)>> {
        let flags =
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(self.dir, self.name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::LOOP) => return Ok(None),
            Err(errno) => return Err(errno.into()),
        };
        let info = super::fs::file_info(&fd)?;
        if info.kind != super::fs::FileKind::File {
            return Ok(None);
        }
        Ok(Some((File::from(fd), info)))
    }
}

/// The ignore files of one directory, chained to the nearest ancestor that had any.
struct Level {
    parent: Option<Arc<Level>>,
    /// `.ignore`, `.gitignore`, `.git/info/exclude`, in that precedence.
    matchers: [Option<Gitignore>; 3],
}

/// Whether `path` (absolute, below the start) is ignored: for each kind of ignore file
/// in precedence order, the deepest directory with a matching pattern decides; then
/// the global excludes.
fn is_ignored(levels: Option<&Arc<Level>>, global: &Gitignore, path: &Path, is_dir: bool) -> bool {
    for kind in 0..3 {
        let mut level = levels;
        while let Some(current) = level {
            if let Some(matcher) = &current.matchers[kind] {
                match matcher.matched(path, is_dir) {
                    Match::Ignore(_) => return true,
                    Match::Whitelist(_) => return false,
                    Match::None => {}
                }
            }
            level = current.parent.as_ref();
        }
    }
    global.matched(path, is_dir).is_ignore()
}

/// Reads the ignore files of the directory `dir` (at `path`) and chains them to
/// `parent`; `parent` itself when it has none.
fn level_for(
    dir: BorrowedFd<'_>,
    path: &Path,
    has_git: bool,
    parent: Option<&Arc<Level>>,
) -> Option<Arc<Level>> {
    let exclude =
        if has_git { read_ignore_at(dir, &[".git", "info", "exclude"], path) } else { None };
    let matchers = [
        read_ignore_at(dir, &[".ignore"], path),
        read_ignore_at(dir, &[".gitignore"], path),
        exclude,
    ];
    if matchers.iter().all(Option::is_none) {
        return parent.cloned();
    }
    Some(Arc::new(Level { parent: parent.cloned(), matchers }))
}

/// Reads the ignore file at `components` below `dir` (each opened without following
/// symlinks) into a matcher rooted at `base`. `None` when there is none (or it is
/// not a small regular file).
fn read_ignore_at(dir: BorrowedFd<'_>, components: &[&str], base: &Path) -> Option<Gitignore> {
    let (last, dirs) = components.split_last()?;
    let mut owned: Option<OwnedFd> = None;
    for name in dirs {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let at = owned.as_ref().map_or(dir, AsFd::as_fd);
        owned = Some(rustix::fs::openat(at, *name, flags, Mode::empty()).ok()?);
    }
    let at = owned.as_ref().map_or(dir, AsFd::as_fd);
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(at, *last, flags, Mode::empty()).ok()?;
    let info = super::fs::file_info(&fd).ok()?;
    if info.kind != super::fs::FileKind::File || info.len > MAX_IGNORE_FILE_BYTES {
        return None;
    }
    let mut text = String::new();
    File::from(fd).take(MAX_IGNORE_FILE_BYTES).read_to_string(&mut text).ok()?;
    let mut builder = GitignoreBuilder::new(base);
    for line in text.lines() {
        // A bad line is skipped, as git and ripgrep do.
        let _ = builder.add_line(None, line);
    }
    builder.build().ok().filter(|matcher| !matcher.is_empty())
}

/// The ignore levels of the directories from the start's root down to the start's
/// parent, each opened below the one before without following symlinks (a swapped
/// component just ends the chain: these only filter).
fn parent_levels(start: &Resolved) -> Option<Arc<Level>> {
    let relative = start.path.strip_prefix(&start.root).ok()?;
    let components: Vec<&OsStr> = relative.iter().collect();
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open(&start.root, flags, Mode::empty()).ok()?;
    let mut path = start.root.clone();
    let mut levels: Option<Arc<Level>> = None;
    for (idx, component) in components.iter().enumerate() {
        let has_git = rustix::fs::statat(&dir, ".git", AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|stat| FileType::from_raw_mode(stat.st_mode) == FileType::Directory);
        levels = level_for(dir.as_fd(), &path, has_git, levels.as_ref());
        if idx + 1 == components.len() {
            break;
        }
        dir = match rustix::fs::openat(&dir, *component, flags, Mode::empty()) {
            Ok(next) => next,
            Err(_) => break,
        };
        path.push(component);
    }
    levels
}

/// One directory waiting to be read: its name relative to its (open) parent.
struct Job {
    parent: Arc<OwnedFd>,
    name: CString,
    relative: PathBuf,
    levels: Option<Arc<Level>>,
}

/// The shared stack of directories to read, and how many threads are reading one.
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

struct QueueState {
    jobs: Vec<Job>,
    active: usize,
    done: bool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next directory, or `None` when the walk is over (nothing queued and nobody
    /// reading, or stopped).
    fn next(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.done {
                return None;
            }
            if let Some(job) = state.jobs.pop() {
                state.active += 1;
                return Some(job);
            }
            if state.active == 0 {
                state.done = true;
                self.ready.notify_all();
                return None;
            }
            state = self.ready.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Hands over the subdirectories found and marks one directory as read.
    fn finish(&self, found: Vec<Job>) {
        let mut state = self.lock();
        let wake = found.len();
        state.jobs.extend(found);
        state.active -= 1;
        if state.active == 0 && state.jobs.is_empty() {
            state.done = true;
            self.ready.notify_all();
        } else if wake > 1 {
            self.ready.notify_all();
        } else if wake == 1 {
            self.ready.notify_one();
        }
    }

    fn stop(&self) {
        self.lock().done = true;
        self.ready.notify_all();
    }
}

/// Walks `tree` on one thread per core with one `State` per thread, and returns every
/// thread's final state. `visit` sees each non-directory entry, and each entry that
/// was unreadable or withheld. Stops early when `cancel` is raised.
pub(crate) fn walk<State, Make, Visitor>(
    tree: &Tree,
    cancel: &AtomicBool,
    make_state: Make,
    visit: Visitor,
) -> Vec<State>
where
    State: Send,
    Make: Fn() -> State + Sync,
    Visitor: Fn(&mut State, Visit<'_>) + Sync,
{
    let root = Job {
        parent: tree.dir.clone(),
        name: c".".to_owned(),
        relative: PathBuf::new(),
        levels: tree.parents.clone(),
    };
    let queue = Queue {
        state: Mutex::new(QueueState { jobs: vec![root], active: 0, done: false }),
        ready: Condvar::new(),
    };
    let worker = || {
        let mut state = make_state();
        while let Some(job) = queue.next() {
            if cancel.load(Ordering::Relaxed) {
                queue.stop();
                break;
            }
            let found = read_dir(tree, job, cancel, &mut |visit_of| visit(&mut state, visit_of));
            queue.finish(found);
        }
        state
    };
    let threads = thread_count();
    if threads == 1 {
        return vec![worker()];
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(worker)).collect();
        handles
            .into_iter()
            .map(|handle| handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    })
}

/// Reads one directory: visits its entries and returns its subdirectories to walk.
fn read_dir(
    tree: &Tree,
    job: Job,
    cancel: &AtomicBool,
    visit: &mut dyn FnMut(Visit<'_>),
) -> Vec<Job> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir =
        match rustix::fs::openat(job.parent.as_fd(), job.name.as_c_str(), flags, Mode::empty()) {
            Ok(dir) => Arc::new(dir),
            // Swapped for a symlink or a file since it was listed: not ours to walk.
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR | rustix::io::Errno::NOENT) => {
                return Vec::new();
            }
            Err(_) => {
                visit(Visit::Unreadable);
                return Vec::new();
            }
        };
    let mut names: Vec<(CString, FileType)> = Vec::new();
    let mut has_git = false;
    match rustix::fs::Dir::read_from(dir.as_fd()) {
        Ok(reader) => {
            for entry in reader {
                let Ok(entry) = entry else {
                    visit(Visit::Unreadable);
                    break;
                };
                let name = entry.file_name();
                if name == c"." || name == c".." {
                    continue;
                }
                if name == c".git" {
                    has_git = true;
                }
                names.push((name.to_owned(), entry.file_type()));
            }
        }
        Err(_) => {
            visit(Visit::Unreadable);
            return Vec::new();
        }
    }
    let path = tree.path.join(&job.relative);
    let levels = if tree.options.no_ignore {
        None
    } else {
        level_for(dir.as_fd(), &path, has_git, job.levels.as_ref())
    };
    let filtered = levels.is_some() || !tree.global.is_empty();
    let mut found = Vec::new();
    for (name, file_type) in names {
        if cancel.load(Ordering::Relaxed) {
            break;
        }
        let bytes = name.as_bytes();
        if !tree.options.hidden && bytes.first() == Some(&b'.') {
            continue;
        }
        let file_type = match file_type {
            FileType::Unknown => {
                match rustix::fs::statat(dir.as_fd(), name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(stat) => FileType::from_raw_mode(stat.st_mode),
                    Err(_) => continue,
                }
            }
            known => known,
        };
        let is_dir = file_type == FileType::Directory;
        if is_dir && bytes == b".git" {
            continue;
        }
        let relative = job.relative.join(OsStr::from_bytes(bytes));
        if filtered || !tree.access.is_open() {
            let absolute = tree.path.join(&relative);
            if filtered && is_ignored(levels.as_ref(), &tree.global, &absolute, is_dir) {
                continue;
            }
            if tree.access.withholds(&absolute) {
                visit(Visit::Withheld);
                continue;
            }
        }
        if is_dir {
            found.push(Job { parent: dir.clone(), name, relative, levels: levels.clone() });
            continue;
        }
        let kind = match file_type {
            FileType::RegularFile => EntryKind::File,
            FileType::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        };
        let entry = Entry { dir: dir.as_fd(), name: &name, relative: &relative, kind };
        visit(Visit::Entry(&entry));
    }
    found
}

/// Walker threads: one per core the process may use, as ripgrep does.
fn thread_count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// A glob over paths relative to the search root. A pattern without `/` matches the
/// file name at any depth (`*.rs`); a pattern with `/` matches the whole relative path
/// (`src/**/*.rs`). `*` never crosses a `/`; `**` does.
#[derive(Clone, Debug)]
pub(crate) struct PathGlob {
    matcher: GlobMatcher,
    whole_path: bool,
}

impl PathGlob {
    pub(crate) fn new(pattern: &str) -> Result<PathGlob, globset::Error> {
        let pattern = pattern.strip_prefix("./").unwrap_or(pattern);
        let glob = GlobBuilder::new(pattern).literal_separator(true).build()?;
        Ok(PathGlob { matcher: glob.compile_matcher(), whole_path: pattern.contains('/') })
    }

    /// `relative` is the path relative to the search root.
    pub(crate) fn is_match(&self, relative: &Path) -> bool {
        if self.whole_path {
            return self.matcher.is_match(relative);
        }
        let bytes = relative.as_os_str().as_bytes();
        let name = match memchr::memrchr(b'/', bytes) {
            Some(slash) => &bytes[slash + 1..],
            None => bytes,
        };
        self.matcher.is_match(Path::new(OsStr::from_bytes(name)))
    }
}

/// A mirror of the call's cancellation token in an atomic flag, so the blocking walker
/// threads can poll it on every entry and every match without taking the token's lock.
///
/// Dropping the `CancelFlag` also raises the flag: when the tool's future is dropped
/// (the registry returned `canceled` or `timeout`, or the caller went away) nobody will
/// read the walk's result, so the blocking work must stop too.
pub(crate) struct CancelFlag {
    flag: Arc<AtomicBool>,
    _watcher: AbortOnDropHandle<()>,
}

impl CancelFlag {
    /// Starts mirroring `token`. Must be called inside the Tokio runtime.
    pub(crate) fn watch(token: &CancellationToken) -> CancelFlag {
        let flag = Arc::new(AtomicBool::new(token.is_cancelled()));
        let watcher_flag = flag.clone();
        let token = token.clone();
        let watcher = tokio::spawn(async move {
            token.cancelled().await;
            watcher_flag.store(true, Ordering::Relaxed);
        });
        CancelFlag { flag, _watcher: AbortOnDropHandle::new(watcher) }
    }

    /// The flag itself, to move into the blocking task.
    pub(crate) fn shared(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }
}

impl Drop for CancelFlag {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::Relaxed);
    }
}

/// A relative path as a sort key: its bytes with every `/` replaced by NUL (which no
/// file name contains). Plain byte comparison of keys then orders paths component by
/// component, like `Path`'s own ordering (`a/b` before `a.txt`), at the cost of a
/// `memcmp` instead of parsing components on every comparison.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PathKey(Box<[u8]>);

impl PathKey {
    pub(crate) fn new(relative: &Path) -> PathKey {
        let bytes = relative.as_os_str().as_bytes();
        PathKey(bytes.iter().map(|&byte| if byte == b'/' { 0 } else { byte }).collect())
    }

    /// Whether `relative` sorts before this key (without building its key).
    fn is_after(&self, relative: &Path) -> bool {
        let bytes =
            relative.as_os_str().as_bytes().iter().map(|&byte| if byte == b'/' { 0 } else { byte });
        bytes.cmp(self.0.iter().copied()) == std::cmp::Ordering::Less
    }

    /// Appends the path with `/` separators; a name that is not UTF-8 is shown lossily
    /// rather than dropped.
    pub(crate) fn push_to(&self, out: &mut String) {
        for (idx, component) in self.0.split(|&byte| byte == 0).enumerate() {
            if idx > 0 {
                out.push('/');
            }
            out.push_str(&String::from_utf8_lossy(component));
        }
    }
}

/// The entries that can still be among the first `limit` output lines in path order.
///
/// Each entry carries a weight: the number of output lines it will produce. After
/// every insert, the entry with the greatest path is dropped while the others alone
/// already fill `limit` lines, so memory stays near `limit` lines whatever the size of
/// the tree. Because a thread's prefix can only lose entries that are also beyond the
/// global prefix, merging the threads' prefixes gives exactly the global one.
#[derive(Debug)]
pub(crate) struct Prefix<T> {
    limit: usize,
    /// Sum of the weights of `items`.
    weight: usize,
    items: BTreeMap<PathKey, (T, usize)>,
}

impl<T> Prefix<T> {
    pub(crate) fn new(limit: usize) -> Prefix<T> {
        Prefix { limit, weight: 0, items: BTreeMap::new() }
    }

    /// Whether an entry at `relative` could still be part of the first `limit` lines.
    /// Once this is false for a path it stays false, so the caller may skip the work
    /// of rendering that entry.
    pub(crate) fn wants(&self, relative: &Path) -> bool {
        self.weight < self.limit
            || self.items.last_key_value().is_some_and(|(last, _)| last.is_after(relative))
    }

    /// Adds an entry (paths are unique within a walk) and drops what can no longer be
    /// in the prefix.
    pub(crate) fn insert(&mut self, key: PathKey, item: T, weight: usize) {
        if let Some((_, old_weight)) = self.items.insert(key, (item, weight)) {
            self.weight -= old_weight;
        }
        self.weight += weight;
        while let Some(last) = self.items.last_entry() {
            let last_weight = last.get().1;
            if self.weight - last_weight < self.limit {
                break;
            }
            last.remove();
            self.weight -= last_weight;
        }
    }

    /// Folds other threads' prefixes into one, starting from the largest.
    pub(crate) fn merge_all(
        prefixes: impl IntoIterator<Item = Prefix<T>>,
        limit: usize,
    ) -> Prefix<T> {
        let mut prefixes: Vec<Prefix<T>> = prefixes.into_iter().collect();
        prefixes.sort_by_key(|prefix| std::cmp::Reverse(prefix.items.len()));
        let mut prefixes = prefixes.into_iter();
        let mut merged = prefixes.next().unwrap_or_else(|| Prefix::new(limit));
        for other in prefixes {
            for (key, (item, weight)) in other.items {
                if merged.weight < merged.limit
                    || merged.items.last_key_value().is_some_and(|(last, _)| key < *last)
                {
                    merged.insert(key, item, weight);
                }
            }
        }
        merged
    }

    /// The kept entries in path order.
    pub(crate) fn into_sorted(self) -> impl Iterator<Item = (PathKey, T)> {
        self.items.into_iter().map(|(key, (item, _))| (key, item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths<T>(prefix: Prefix<T>) -> Vec<String> {
        prefix
            .into_sorted()
            .map(|(key, _)| {
                let mut shown = String::new();
                key.push_to(&mut shown);
                shown
            })
            .collect()
    }

    fn key(path: &str) -> PathKey {
        PathKey::new(Path::new(path))
    }

    #[test]
    fn path_keys_order_like_paths() {
        let mut names =
            vec!["a.txt", "a/b", "a/b/c", "a-b/c", "a/b.rs", "b", "a", "ab/c", "é/x", "z"];
        let mut by_key = names.clone();
        by_key.sort_by_key(|name| key(name));
        names.sort_by(|left, right| Path::new(left).cmp(Path::new(right)));
        assert_eq!(by_key, names);
        for left in &names {
            for right in &names {
                assert_eq!(
                    key(right).is_after(Path::new(left)),
                    Path::new(left) < Path::new(right),
                    "{left} {right}"
                );
            }
        }
    }

    #[test]
    fn prefix_keeps_the_first_entries_in_path_order() {
        let mut prefix = Prefix::new(3);
        for name in ["e", "b", "d", "a", "f", "c"] {
            if prefix.wants(Path::new(name)) {
                prefix.insert(key(name), (), 1);
            }
        }
        assert_eq!(paths(prefix), ["a", "b", "c"]);
    }

    #[test]
    fn prefix_keeps_a_heavy_entry_that_overlaps_the_limit() {
        // "a" fills 2 of 3 lines, "b" (5 lines) is needed for the third line, "c" is
        // never shown.
        let mut prefix = Prefix::new(3);
        prefix.insert(key("c"), (), 1);
        prefix.insert(key("b"), (), 5);
        prefix.insert(key("a"), (), 2);
        assert!(!prefix.wants(Path::new("d")));
        assert_eq!(paths(prefix), ["a", "b"]);
    }

    #[test]
    fn merged_prefixes_equal_the_prefix_of_everything() {
        let names: Vec<String> =
            (0..200).map(|n| format!("dir{}/file{}", n % 7, (n * 37) % 101)).collect();
        let mut expected: Vec<String> = names.clone();
        expected.sort_by(|left, right| Path::new(left).cmp(Path::new(right)));
        expected.dedup();
        expected.truncate(25);

        let mut shards: Vec<Prefix<()>> = (0..4).map(|_| Prefix::new(25)).collect();
        let mut seen = std::collections::HashSet::new();
        for (idx, name) in names.iter().enumerate() {
            if !seen.insert(name.clone()) {
                continue;
            }
            let shard = &mut shards[idx % 4];
            if shard.wants(Path::new(name)) {
                shard.insert(key(name), (), 1);
            }
        }
        assert_eq!(paths(Prefix::merge_all(shards, 25)), expected);
    }

    #[test]
    fn glob_without_slash_matches_the_file_name_at_any_depth() {
        let glob = PathGlob::new("*.rs").unwrap();
        assert!(glob.is_match(Path::new("a/b/c.rs")));
        assert!(glob.is_match(Path::new("c.rs")));
        assert!(!glob.is_match(Path::new("a/b/c.rsx")));
        assert!(!glob.is_match(Path::new("a.rs/c.txt")));
        let name = PathGlob::new("Cargo.toml").unwrap();
        assert!(name.is_match(Path::new("crates/x/Cargo.toml")));
        assert!(!name.is_match(Path::new("crates/x/Cargo.toml.orig")));
    }

    #[test]
    fn glob_with_slash_matches_the_relative_path() {
        let glob = PathGlob::new("src/*.rs").unwrap();
        assert!(glob.is_match(Path::new("src/main.rs")));
        assert!(!glob.is_match(Path::new("src/deep/main.rs")));
        let deep = PathGlob::new("./src/**/*.rs").unwrap();
        assert!(deep.is_match(Path::new("src/deep/main.rs")));
        assert!(deep.is_match(Path::new("src/main.rs")));
    }
}
