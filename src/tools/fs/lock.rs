//! Per-path locks that serialise read-modify-write cycles on one file.
//!
//! edit_file reads a file, changes it and writes it back; two such cycles on one file
//! running at once would lose one of the changes. The lock table is process-wide so
//! that it also covers two sessions editing the same file. It maps a path (as the
//! kernel sees it, see `Resolved::path`) to an async mutex; an entry lives exactly as
//! long as somebody holds or waits for it, so the table never grows with the number of
//! files ever edited.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use tokio::sync::OwnedMutexGuard;

type Table = HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>;

/// The table itself is only touched in short critical sections without an await, so
/// a std mutex is the right tool.
static LOCKS: LazyLock<Mutex<Table>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn table() -> MutexGuard<'static, Table> {
    // A panic while holding the table lock cannot leave it inconsistent (every
    // critical section is a single insert, lookup or remove).
    LOCKS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Exclusive access to one path until dropped. `Send`, so it can be moved into the
/// blocking task doing the I/O: the lock is then released when the work is really
/// over, even if the caller stopped waiting for it (timeout, cancel).
#[derive(Debug)]
pub struct PathLock {
    /// Declared first so it is dropped first, before `entry` checks whether anybody
    /// else still uses the table entry.
    _guard: OwnedMutexGuard<()>,
    _entry: Entry,
}

/// One interest in a table entry; removes the entry when it was the last one.
#[derive(Debug)]
struct Entry {
    path: PathBuf,
    mutex: Arc<tokio::sync::Mutex<()>>,
}

impl Entry {
    fn acquire(path: &Path) -> Entry {
        let mutex = table().entry(path.to_path_buf()).or_default().clone();
        Entry { path: path.to_path_buf(), mutex }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut table = table();
        // Under the table lock nobody can clone the entry, so a count of two (the
        // table's reference and ours) means nobody else holds or awaits it. Should a
        // waiter's clone still be alive here, the entry stays until the next holder
        // of the path leaves, which then sees the count drop.
        if Arc::strong_count(&self.mutex) == 2
            && table.get(&self.path).is_some_and(|mutex| Arc::ptr_eq(mutex, &self.mutex))
        {
            table.remove(&self.path);
        }
    }
}

/// Waits until nobody else holds `path`, then holds it until the guard is dropped.
/// Dropping the future while it waits leaves no trace in the table.
pub async fn lock_path(path: &Path) -> PathLock {
    let entry = Entry::acquire(path);
    let guard = entry.mutex.clone().lock_owned().await;
    PathLock { _guard: guard, _entry: entry }
}

/// Whether the table currently has an entry for `path` (for tests of the cleanup).
#[cfg(test)]
pub(crate) fn is_tracked(path: &Path) -> bool {
    table().contains_key(path)
}
