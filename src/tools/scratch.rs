//! Per-thread buffers reused from call to call: work that needs a few kilobytes of
//! room only while it runs (a file's bytes while they are rendered, a text while it
//! is escaped into an answer) takes the thread's buffer instead of allocating and
//! freeing a large block every call. Answer lines, written out by another task than
//! the one that made them, come back through [`LINES`] instead.

use std::cell::RefCell;
use std::sync::Mutex;
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

/// Buffers of answer lines, handed back by the writers that sent them and filled by
/// the next answers: a line is made on the core that ran its call and written out
/// from the connection's task, often on the other one, where freeing a block of a few
/// kilobytes goes through the lock of the heap it came from while calls allocate from
/// that heap (and asking for a new one first merges the heap's small free blocks).
pub(crate) static LINES: Spares = Spares::new(32, 32 * 1024);

/// Empty buffers waiting to be filled again: at most `count` of them, none larger than
/// `largest` bytes, so what waits is bounded. Neither side ever waits for the other;
/// when the pool is busy a buffer is allocated or freed as usual.
pub(crate) struct Spares {
    buffers: Mutex<Vec<Vec<u8>>>,
    count: usize,
    largest: usize,
}

impl Spares {
    pub(crate) const fn new(count: usize, largest: usize) -> Spares {
        Spares { buffers: Mutex::new(Vec::new()), count, largest }
    }

    /// An empty buffer with room for at least `capacity` bytes: a spare one that is
    /// not much larger if there is one, else a new one.
    pub(crate) fn take(&self, capacity: usize) -> Vec<u8> {
        // A spare far larger than asked would hold its memory under a short line.
        let fits = |buffer: &Vec<u8>| {
            (capacity..=capacity.max(1024).saturating_mul(4)).contains(&buffer.capacity())
        };
        if capacity <= self.largest
            && let Ok(mut spares) = self.buffers.try_lock()
            && let Some(at) = spares.iter().rposition(fits)
        {
            return spares.swap_remove(at);
        }
        Vec::with_capacity(capacity)
    }

    /// Keeps `buffer` for a later [`Spares::take`], emptied, if it is not too large
    /// and there is room; else it is freed.
    pub(crate) fn give_back(&self, mut buffer: Vec<u8>) {
        if buffer.capacity() == 0 || buffer.capacity() > self.largest {
            return;
        }
        buffer.clear();
        if let Ok(mut spares) = self.buffers.try_lock()
            && spares.len() < self.count
        {
            spares.push(buffer);
        }
    }
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

    #[test]
    fn a_spare_buffer_is_taken_again_when_it_fits_and_the_pool_is_bounded() {
        let spares = Spares::new(2, 8192);
        let line = Vec::with_capacity(5000);
        let address = line.as_ptr();
        spares.give_back(line);
        // Too small a buffer asked: the spare would hold 5000 bytes under it.
        assert_eq!(spares.take(100).capacity(), 100);
        // Larger than the spare: a new one.
        assert!(spares.take(6000).capacity() >= 6000);
        let again = spares.take(4000);
        assert_eq!((again.as_ptr(), again.len()), (address, 0), "the same buffer, empty");
        let other = spares.take(4000);
        assert_ne!(other.as_ptr(), address, "taken once");
        // Written into, it comes back empty.
        let mut written = again;
        written.extend_from_slice(b"an answer");
        spares.give_back(written);
        assert!(spares.take(4000).is_empty());
        // Only `count` wait, and none larger than `largest`.
        spares.give_back(Vec::with_capacity(16_384));
        for _ in 0..3 {
            spares.give_back(Vec::with_capacity(2000));
        }
        assert_eq!(spares.buffers.lock().unwrap().len(), 2);
        assert!(spares.buffers.lock().unwrap().iter().all(|buffer| buffer.capacity() < 8192));
    }
}
