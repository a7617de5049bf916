//! A per-thread buffer reused from call to call: work that needs a few kilobytes of room
//! only while it runs (a text while it is escaped into an answer, a file's bytes while
//! they are rendered) takes the thread's buffer instead of allocating and freeing a
//! large block every call.

use std::cell::RefCell;
use std::thread::LocalKey;

/// A buffer [`with`] can empty and measure.
pub(crate) trait Buffer: Default {
    fn clear(&mut self);
    fn capacity(&self) -> usize;
}

impl Buffer for Vec<u8> {
    fn clear(&mut self) {
        Vec::clear(self);
    }

    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }
}

impl Buffer for String {
    fn clear(&mut self) {
        String::clear(self);
    }

    fn capacity(&self) -> usize {
        String::capacity(self)
    }
}

/// Runs `work` with the thread's buffer in `cell`, empty. Afterwards the buffer is
/// emptied again, and freed when it grew past `keep` bytes, so a thread holds at most
/// that much between calls. Should `work` reach the same buffer again, it gets a
/// fresh one instead.
pub(crate) fn with<B: Buffer, R>(
    cell: &'static LocalKey<RefCell<B>>,
    keep: usize,
    work: impl FnOnce(&mut B) -> R,
) -> R {
    cell.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffer) => {
            buffer.clear();
            let out = work(&mut buffer);
            buffer.clear();
            if buffer.capacity() > keep {
                *buffer = B::default();
            }
            out
        }
        Err(_) => work(&mut B::default()),
    })
}
