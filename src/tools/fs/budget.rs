//! One memory budget for the read-only work that runs at once.
//!
//! A line-oriented search holds a whole line in memory, and a multiline search a whole
//! file. Each search thread's buffer is capped (by the session's read limit), and each
//! thread reserves that cap here for as long as it searches, so however many searches
//! run concurrently, their buffers together stay within [`READ_BUDGET_BYTES`]. A thread
//! that finds the budget spent waits for another to finish (or for its call to be
//! canceled).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Bytes all concurrent search buffers may hold together.
pub const READ_BUDGET_BYTES: u64 = 256 * 1024 * 1024;

/// How often a waiting thread looks at its cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(20);

/// A pool of bytes handed out in reservations.
pub struct MemoryBudget {
    used: Mutex<u64>,
    freed: Condvar,
    capacity: u64,
}

/// The process-wide budget of read-only work.
pub static READ_BUDGET: MemoryBudget = MemoryBudget::new(READ_BUDGET_BYTES);

impl MemoryBudget {
    pub const fn new(capacity: u64) -> MemoryBudget {
        MemoryBudget { used: Mutex::new(0), freed: Condvar::new(), capacity }
    }

    /// Reserves `bytes` (at most the whole budget), waiting while the budget is spent.
    /// `None` when `cancel` is raised first.
    pub fn reserve(&self, bytes: u64, cancel: &AtomicBool) -> Option<Reservation<'_>> {
        let bytes = bytes.min(self.capacity);
        let mut used = self.used.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while *used + bytes > self.capacity {
            if cancel.load(Ordering::Relaxed) {
                return None;
            }
            used = self
                .freed
                .wait_timeout(used, CANCEL_POLL)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        *used += bytes;
        Some(Reservation { budget: self, bytes })
    }

    /// Bytes reserved right now.
    pub fn used(&self) -> u64 {
        *self.used.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Bytes held from a [`MemoryBudget`] until dropped.
pub struct Reservation<'b> {
    budget: &'b MemoryBudget,
    bytes: u64,
}

impl Reservation<'_> {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *used -= self.bytes;
        self.budget.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_budget_waits_until_a_reservation_is_dropped() {
        let budget = MemoryBudget::new(100);
        let cancel = AtomicBool::new(false);
        let first = budget.reserve(70, &cancel);
        assert_eq!(budget.used(), 70);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| budget.reserve(50, &cancel).map(|r| r.bytes()));
            // The waiter cannot get its bytes until the first reservation goes.
            while budget.used() != 70 {
                std::thread::yield_now();
            }
            drop(first);
            assert_eq!(waiter.join().ok().flatten(), Some(50));
        });
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_canceled_wait_gives_up_and_oversized_asks_are_capped() {
        let budget = MemoryBudget::new(100);
        let cancel = AtomicBool::new(false);
        let all = budget.reserve(1000, &cancel);
        assert_eq!(all.as_ref().map(Reservation::bytes), Some(100));
        cancel.store(true, Ordering::Relaxed);
        assert!(budget.reserve(1, &cancel).is_none());
    }
}
