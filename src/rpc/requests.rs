//! What every face does around one request, written once: the native dispatch core
//! ([`super::Connection`]) and the MCP face's stdio path both run their requests
//! through it.
//!
//! - **First poll here.** A request runs up to its first wait on the task that read
//!   it ([`start`]): most calls (a small read, a listing, a denial) need none, and
//!   their answer comes back with no task, queue or wake-up in between. The first
//!   poll needs no waker of its own: a request that is not done goes on in a task,
//!   whose first poll registers that task's waker with what the request waits on.
//! - **A panic costs the request.** A panic while a request is handled (a bug: a
//!   tool's own panic is already its result) is caught, on the first poll as in the
//!   task that goes on with it ([`Caught`]), and the face answers it as an internal
//!   error; the connection reads on.
//! - **Found by its id while it runs.** A running request's cancel token is
//!   registered under its JSON-RPC id ([`Running`]), so that a cancellation naming
//!   the id reaches it; the registration ends with the request however it ends.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use tokio_util::sync::CancellationToken;

/// A request's handling panicked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Panicked;

/// A request after its first poll.
pub enum Started<F: Future> {
    /// Done on the first poll: its output, or the panic it ended in.
    Done(Result<F::Output, Panicked>),
    /// It waits: the rest of it, its panic still caught, to run in a task of its own.
    Waiting(Caught<Pin<Box<F>>>),
}

/// Runs `work` up to its first wait, right here, with a panic caught (see the module
/// documentation). The future is boxed by the caller, where it stays: handlers'
/// futures are large, and a box goes into a task without their bytes being moved.
pub fn start<F: Future>(mut work: Pin<Box<F>>) -> Started<F> {
    let mut context = Context::from_waker(Waker::noop());
    match std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(&mut context))) {
        Ok(Poll::Ready(output)) => Started::Done(Ok(output)),
        Ok(Poll::Pending) => Started::Waiting(caught(work)),
        Err(_) => Started::Done(Err(Panicked)),
    }
}

pin_project_lite::pin_project! {
    /// A request's future whose panic is its output ([`Panicked`]) rather than the
    /// end of the task running it.
    pub struct Caught<F> {
        #[pin]
        work: F,
    }
}

/// `work` with its panic caught: for a request handed to a task before any poll, and
/// for the rest of one that waits.
pub fn caught<F: Future>(work: F) -> Caught<F> {
    Caught { work }
}

impl<F: Future> Future for Caught<F> {
    type Output = Result<F::Output, Panicked>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let work = self.project().work;
        match std::panic::catch_unwind(AssertUnwindSafe(|| work.poll(context))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => Poll::Ready(Err(Panicked)),
        }
    }
}

/// Which registration of an id is whose: a request that reuses the id of one still
/// running does not end the other's registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u64);

/// The running requests of one connection, by id: what a cancellation naming an id
/// reaches.
pub struct Running<K> {
    entries: Mutex<HashMap<K, (Ticket, CancellationToken)>>,
    next: AtomicU64,
}

impl<K: Eq + Hash + Clone> Default for Running<K> {
    fn default() -> Self {
        Running { entries: Mutex::new(HashMap::new()), next: AtomicU64::new(0) }
    }
}

impl<K: Eq + Hash + Clone> Running<K> {
    fn entries(&self) -> MutexGuard<'_, HashMap<K, (Ticket, CancellationToken)>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers the request `key` with its cancel token until [`Running::finish`]
    /// with the ticket returned (or a cancellation) ends it.
    pub fn insert(&self, key: K, token: CancellationToken) -> Ticket {
        let ticket = Ticket(self.next.fetch_add(1, Ordering::Relaxed));
        self.entries().insert(key, (ticket, token));
        ticket
    }

    /// Registers the request `key` for as long as the guard lives: dropped when the
    /// request ends, however it ends (an unwinding panic included).
    pub fn register(&self, key: K, token: &CancellationToken) -> Registered<'_, K> {
        let ticket = self.insert(key.clone(), token.clone());
        Registered { running: self, key, ticket }
    }

    /// Ends the registration `ticket` of `key`, returning its token; `None` when it
    /// was canceled by id in the meantime (or replaced by a later request's).
    pub fn finish(&self, key: &K, ticket: Ticket) -> Option<CancellationToken> {
        let mut entries = self.entries();
        match entries.get(key) {
            Some((registered, _)) if *registered == ticket => entries.remove(key).map(|e| e.1),
            _ => None,
        }
    }

    /// Cancels the request registered under `key` and ends its registration; false
    /// when none runs under it.
    pub fn cancel(&self, key: &K) -> bool {
        let removed = self.entries().remove(key);
        match removed {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// Whether a request runs under `key`.
    pub fn contains(&self, key: &K) -> bool {
        self.entries().contains_key(key)
    }

    pub fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }
}

/// A request's registration in [`Running`], ended on drop.
pub struct Registered<'a, K: Eq + Hash + Clone> {
    running: &'a Running<K>,
    key: K,
    ticket: Ticket,
}

impl<K: Eq + Hash + Clone> Drop for Registered<'_, K> {
    fn drop(&mut self) {
        self.running.finish(&self.key, self.ticket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bug() -> u32 {
        panic!("a bug in a request's handling")
    }

    #[tokio::test]
    async fn a_panic_is_the_requests_output_on_the_first_poll_and_after_a_wait() {
        let at_once = start(Box::pin(async { bug() }));
        assert!(matches!(at_once, Started::Done(Err(Panicked))));
        let later = start(Box::pin(async {
            tokio::task::yield_now().await;
            bug()
        }));
        let Started::Waiting(rest) = later else { panic!("done without waiting") };
        assert_eq!(tokio::spawn(rest).await.unwrap(), Err(Panicked));
        // Handed to a task before any poll.
        let handed = caught(Box::pin(async { bug() }));
        assert_eq!(tokio::spawn(handed).await.unwrap(), Err(Panicked));
        // A request that does not panic keeps its output.
        assert!(matches!(start(Box::pin(async { 7 })), Started::Done(Ok(7))));
    }

    #[test]
    fn a_request_is_found_by_its_id_while_it_runs_and_gone_however_it_ends() {
        let running = Running::default();
        let token = CancellationToken::new();
        let first = running.register("7", &token);
        assert!(running.contains(&"7"));
        // Unwinding drops it too: the entry goes with a request that panicked.
        let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let _running = first;
            panic!("a bug while the request runs");
        }));
        assert!(panicked.is_err());
        assert!(!running.contains(&"7"), "left behind by a panic");
        // A later request with the same id keeps its entry when an earlier one ends.
        let earlier = running.register("7", &token);
        let later = running.register("7", &token);
        drop(earlier);
        assert!(running.contains(&"7"));
        drop(later);
        assert!(running.is_empty());
    }

    #[test]
    fn a_cancellation_by_id_cancels_the_token_and_ends_the_registration() {
        let running = Running::default();
        let token = CancellationToken::new();
        let ticket = running.insert(3, token.clone());
        assert!(running.cancel(&3));
        assert!(token.is_cancelled());
        // The request, ending, finds it canceled: no answer is due.
        assert!(running.finish(&3, ticket).is_none());
        assert!(!running.cancel(&3), "canceled twice");
        // Not canceled: finishing hands back the token.
        let ticket = running.insert(4, CancellationToken::new());
        assert!(running.finish(&4, ticket).is_some_and(|token| !token.is_cancelled()));
    }
}
