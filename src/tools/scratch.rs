//! Per-thread buffers reused from call to call: work that needs a few kilobytes of
//! room only while it runs (a file's bytes while they are rendered, a text while it
//! is escaped into an answer) takes the thread's buffer instead of allocating and
//! freeing a large block every call.

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

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }

    #[test]
    fn a_buffer_is_empty_for_each_use_and_kept_only_up_to_its_bound() {
        with(&BUFFER, 1024, |buffer| buffer.extend_from_slice(&[1; 100]));
        let capacity = with(&BUFFER, 1024, |buffer| {
            assert!(buffer.is_empty());
            buffer.capacity()
        });
        assert!(capacity >= 100, "the buffer was kept");
        with(&BUFFER, 1024, |buffer| buffer.extend_from_slice(&[1; 4096]));
        assert_eq!(with(&BUFFER, 1024, |buffer| buffer.capacity()), 0, "freed past its bound");
        // Reached again from inside: a fresh buffer, the outer one untouched.
        with(&BUFFER, 1024, |outer| {
            outer.push(7);
            with(&BUFFER, 1024, |inner| assert!(inner.is_empty()));
            assert_eq!(outer, &[7]);
        });
    }
}
