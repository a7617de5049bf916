//! The directory walk shared by `find_files` and `search_code`: root confinement of the
//! search path, the walker configuration (ignore files, hidden files, no symlinks), the
//! path glob, a cancel flag the blocking walker threads can poll cheaply, and the
//! bounded per-thread collection that keeps results deterministic.
//!
//! Both tools walk with the `ignore` crate's parallel walker, so entries arrive in an
//! order that changes from run to run. Determinism comes from sorting once at the end;
//! memory stays bounded because each walker thread keeps only the entries that can
//! still be among the first `limit` in path order ([`Prefix`]), while the totals are
//! counted exactly.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use globset::{GlobBuilder, GlobMatcher};
use ignore::{
    DirEntry, ParallelVisitor, ParallelVisitorBuilder, WalkBuilder, WalkParallel, WalkState,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::{Env, FsError};

/// Confines the search root: `None` is the session cwd; the path must stay inside
/// the roots after following symlinks (checked race-free by `fs::resolve`). A file is
/// accepted too (search_code searches a single file); find_files checks for a
/// directory itself. Returns the path as the kernel resolved it.
pub(crate) fn confined_dir(env: &Env, path: Option<&str>) -> Result<PathBuf, FsError> {
    let path = match path {
        None | Some("") => ".",
        Some(path) => path,
    };
    Ok(super::fs::resolve(env, path)?.path)
}

/// The filters a search applies to the tree, as the model chose them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WalkOptions {
    /// Also walk hidden (dot) files and directories.
    pub(crate) hidden: bool,
    /// Do not read `.gitignore`, `.ignore` and git exclude files.
    pub(crate) no_ignore: bool,
}

/// A walker over `root` with the rules both search tools share:
/// - `.gitignore`, `.ignore` and `.git/info/exclude` are respected, also outside a git
///   repository (a model rarely knows whether the directory is one);
/// - hidden entries are skipped unless asked for;
/// - symlinks are not followed, so nothing outside the root is reached through a link;
/// - the base for global gitignore patterns is `root`, never the daemon's cwd;
/// - one walker thread per available core.
pub(crate) fn walk_builder(root: &Path, options: WalkOptions) -> WalkBuilder {
    let mut builder = WalkBuilder::new(root);
    builder
        .current_dir(root)
        .follow_links(false)
        .hidden(!options.hidden)
        .require_git(false)
        .threads(thread_count());
    if options.no_ignore {
        builder.ignore(false).git_ignore(false).git_exclude(false).git_global(false).parents(false);
    }
    builder
}

/// Walker threads: one per core the process may use, as ripgrep does. The `ignore`
/// crate's automatic choice caps at 12, which would idle larger machines.
fn thread_count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Whether a directory entry below the root is a `.git` directory. Its contents are
/// git's object store, never what a search is after, even with `hidden: true`.
pub(crate) fn is_git_dir(entry: &DirEntry) -> bool {
    entry.depth() > 0
        && entry.file_name() == OsStr::new(".git")
        && entry.file_type().is_some_and(|file_type| file_type.is_dir())
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

/// `path` relative to `root`, for a path the walker built by joining names onto
/// `root`. A plain byte comparison: `Path::strip_prefix` parses both paths into
/// components, which showed up as the largest single cost of walking a big tree.
pub(crate) fn relative_to<'p>(root: &Path, path: &'p Path) -> Option<&'p Path> {
    let root = root.as_os_str().as_bytes();
    let rest = path.as_os_str().as_bytes().strip_prefix(root)?;
    let rest = match rest.strip_prefix(b"/") {
        Some(below) => below,
        None if rest.is_empty() || root.ends_with(b"/") => rest,
        None => return None,
    };
    Some(Path::new(OsStr::from_bytes(rest)))
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

/// Runs a parallel walk with one `State` per walker thread and returns every thread's
/// final state. `visit` sees each entry (or walk error) with its thread's state.
pub(crate) fn run_parallel<State, Make, Visit>(
    walk: WalkParallel,
    make_state: Make,
    visit: Visit,
) -> Vec<State>
where
    State: Send,
    Make: Fn() -> State + Sync,
    Visit: Fn(&mut State, Result<DirEntry, ignore::Error>) -> WalkState + Sync,
{
    let finished = Mutex::new(Vec::new());
    let mut builder =
        VisitorBuilder { make_state: &make_state, visit: &visit, finished: &finished };
    walk.visit(&mut builder);
    finished.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct VisitorBuilder<'s, State, Make, Visit> {
    make_state: &'s Make,
    visit: &'s Visit,
    finished: &'s Mutex<Vec<State>>,
}

impl<'s, State, Make, Visit> ParallelVisitorBuilder<'s> for VisitorBuilder<'s, State, Make, Visit>
where
    State: Send + 's,
    Make: Fn() -> State + Sync,
    Visit: Fn(&mut State, Result<DirEntry, ignore::Error>) -> WalkState + Sync,
{
    fn build(&mut self) -> Box<dyn ParallelVisitor + 's> {
        Box::new(Visitor {
            state: Some((self.make_state)()),
            visit: self.visit,
            finished: self.finished,
        })
    }
}

/// One walker thread's visitor. Its state is handed back when the walk drops it.
struct Visitor<'s, State, Visit> {
    state: Option<State>,
    visit: &'s Visit,
    finished: &'s Mutex<Vec<State>>,
}

impl<State, Visit> ParallelVisitor for Visitor<'_, State, Visit>
where
    State: Send,
    Visit: Fn(&mut State, Result<DirEntry, ignore::Error>) -> WalkState + Sync,
{
    fn visit(&mut self, entry: Result<DirEntry, ignore::Error>) -> WalkState {
        match &mut self.state {
            Some(state) => (self.visit)(state, entry),
            None => WalkState::Quit,
        }
    }
}

impl<State, Visit> Drop for Visitor<'_, State, Visit> {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            // A poisoned lock means another visitor panicked while pushing; the
            // vector is still consistent, so keep this thread's results too.
            self.finished.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(state);
        }
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

    #[test]
    fn relative_to_strips_whole_components_only() {
        let root = Path::new("/tmp/root");
        assert_eq!(relative_to(root, Path::new("/tmp/root/a/b.rs")), Some(Path::new("a/b.rs")));
        assert_eq!(relative_to(root, Path::new("/tmp/root")), Some(Path::new("")));
        assert_eq!(relative_to(root, Path::new("/tmp/rootx/a")), None);
        assert_eq!(relative_to(root, Path::new("/tmp/other/a")), None);
        assert_eq!(
            relative_to(Path::new("/"), Path::new("/etc/hosts")),
            Some(Path::new("etc/hosts"))
        );
    }
}
