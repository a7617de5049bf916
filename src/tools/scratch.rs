//! Per-thread buffers reused from call to call: work that needs a few kilobytes of
//! room only while it runs (a file's bytes while they are rendered, a text while it
//! is escaped into an answer) takes the thread's buffer instead of allocating and
//! freeing a large block every call. Answer lines, written out by another task than
//! the one that made them, come back through [`LINES`] instead.

use std::sync::Mutex;
use std::time::Duration;

// The per-thread buffer itself is the bottom layer's (JSON text escapes into one).
pub(crate) use crate::wire::scratch::with;

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

/// One large buffer kept while the work that needs it keeps coming, and given back to
/// the system once none has come for its idle time. A block of a megabyte or more is
/// mapped on its own and unmapped when freed (see `sys::give_large_blocks_back`), so
/// each new one costs a page fault per 4 KiB page the first time it is written: for a
/// 10 MiB read, more than the read itself. Kept only a moment, a buffer serves a burst
/// of such work and costs nothing to a daemon that has gone idle.
pub(crate) struct Lingering {
    slot: Mutex<Lingered>,
    /// Larger buffers than this are never kept.
    largest: usize,
    idle: Duration,
}

struct Lingered {
    buffer: Vec<u8>,
    /// Buffers given back so far: the timer frees the buffer only when this has not
    /// moved for a whole idle time.
    uses: u64,
    /// Whether a timer is waiting to free the buffer.
    timed: bool,
}

impl Lingering {
    pub(crate) const fn new(largest: usize, idle: Duration) -> Lingering {
        Lingering {
            slot: Mutex::new(Lingered { buffer: Vec::new(), uses: 0, timed: false }),
            largest,
            idle,
        }
    }

    /// The kept buffer, empty (an empty, unallocated one when there is none, or when
    /// another caller has it).
    pub(crate) fn take(&self) -> Vec<u8> {
        match self.slot.try_lock() {
            Ok(mut slot) => std::mem::take(&mut slot.buffer),
            Err(_) => Vec::new(),
        }
    }

    /// Keeps `buffer`, emptied, for the next [`Lingering::take`] (the larger one when
    /// one is kept already), and starts the timer that frees it once no buffer has
    /// come back for the idle time. Outside a runtime nothing can time it: it is freed.
    pub(crate) fn give_back(&'static self, mut buffer: Vec<u8>) {
        if buffer.capacity() == 0 || buffer.capacity() > self.largest {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        buffer.clear();
        let Ok(mut slot) = self.slot.lock() else {
            return;
        };
        slot.uses += 1;
        if buffer.capacity() > slot.buffer.capacity() {
            // The one kept before goes once the lock is let go.
            buffer = std::mem::replace(&mut slot.buffer, buffer);
        }
        if !slot.timed {
            slot.timed = true;
            runtime.spawn(self.free_when_idle());
        }
        drop(slot);
        drop(buffer);
    }

    /// Frees the kept buffer once no buffer has come back for a whole idle time.
    async fn free_when_idle(&self) {
        loop {
            let seen = self.slot.lock().map_or(0, |slot| slot.uses);
            tokio::time::sleep(self.idle).await;
            let Ok(mut slot) = self.slot.lock() else {
                return;
            };
            if slot.uses == seen {
                slot.timed = false;
                let freed = std::mem::take(&mut slot.buffer);
                drop(slot);
                drop(freed);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

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

    #[tokio::test(start_paused = true)]
    async fn a_lingering_buffer_serves_a_burst_and_is_freed_once_idle() {
        static LARGE: Lingering = Lingering::new(1 << 20, Duration::from_millis(250));
        assert_eq!(LARGE.take().capacity(), 0, "nothing kept at first");
        let mut buffer = Vec::with_capacity(64 * 1024);
        buffer.extend_from_slice(b"a file's bytes");
        let address = buffer.as_ptr();
        LARGE.give_back(buffer);
        // A burst: each use finds the same buffer, empty, and the uses keep it.
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let again = LARGE.take();
            assert_eq!((again.as_ptr(), again.len()), (address, 0));
            // Taken, it is nobody else's.
            assert_eq!(LARGE.take().capacity(), 0);
            LARGE.give_back(again);
        }
        // Of two, the larger is kept.
        LARGE.give_back(Vec::with_capacity(1024));
        let kept = LARGE.take();
        assert_eq!(kept.as_ptr(), address);
        LARGE.give_back(kept);
        LARGE.give_back(Vec::with_capacity(128 * 1024));
        let larger = LARGE.take();
        assert!(larger.capacity() >= 128 * 1024);
        LARGE.give_back(larger);
        // A buffer past the bound is not kept.
        LARGE.give_back(Vec::with_capacity(2 << 20));
        assert!(LARGE.slot.lock().unwrap().buffer.capacity() < 2 << 20);
        // Idle for longer than its idle time: freed, and the timer has ended.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let slot = LARGE.slot.lock().unwrap();
        assert_eq!((slot.buffer.capacity(), slot.timed), (0, false));
    }
}
