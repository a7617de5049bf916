//! Per-session event delivery: a bounded buffer until someone subscribes, then fan-out
//! to each subscriber's bounded outbound queue.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use crate::agent::{Event, EventSink};
use crate::protocol::method;
use crate::rpc::jsonrpc;

/// One subscriber: a connection's outbound queue and the subscription id it asked for.
struct Subscriber {
    subscription: String,
    connection: u64,
    outbound: mpsc::Sender<String>,
}

struct Inner {
    /// Events emitted while nobody was subscribed (oldest dropped past the cap).
    buffer: VecDeque<Event>,
    subscribers: Vec<Subscriber>,
}

/// The event sink of one session.
pub struct EventHub {
    inner: Mutex<Inner>,
    capacity: usize,
    /// Events lost to a full buffer or a subscriber that did not keep up.
    dropped: AtomicU64,
}

impl EventHub {
    pub fn new(capacity: usize) -> EventHub {
        EventHub {
            inner: Mutex::new(Inner { buffer: VecDeque::new(), subscribers: Vec::new() }),
            capacity: capacity.max(1),
            dropped: AtomicU64::new(0),
        }
    }

    /// Adds a subscriber and hands it every buffered event first, so that nothing
    /// emitted before the subscription (the subscribe race) is lost.
    pub fn subscribe(&self, subscription: String, connection: u64, outbound: mpsc::Sender<String>) {
        let mut inner = self.lock();
        let backlog: Vec<Event> = inner.buffer.drain(..).collect();
        for event in &backlog {
            let line = render(&subscription, event);
            if outbound.try_send(line).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        inner.subscribers.push(Subscriber { subscription, connection, outbound });
    }

    pub fn unsubscribe(&self, subscription: &str) -> bool {
        let mut inner = self.lock();
        let before = inner.subscribers.len();
        inner.subscribers.retain(|sub| sub.subscription != subscription);
        before != inner.subscribers.len()
    }

    /// Drops every subscription of a connection that went away.
    pub fn unsubscribe_connection(&self, connection: u64) {
        self.lock().subscribers.retain(|sub| sub.connection != connection);
    }

    /// Whether anyone is listening (and so could answer a permission request).
    pub fn has_subscribers(&self) -> bool {
        let mut inner = self.lock();
        inner.subscribers.retain(|sub| !sub.outbound.is_closed());
        !inner.subscribers.is_empty()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Short critical sections without awaits; a poisoned lock still holds a
        // consistent queue.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl EventSink for EventHub {
    fn emit(&self, event: Event) {
        let mut inner = self.lock();
        inner.subscribers.retain(|sub| !sub.outbound.is_closed());
        if inner.subscribers.is_empty() {
            if inner.buffer.len() >= self.capacity {
                inner.buffer.pop_front();
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            inner.buffer.push_back(event);
            return;
        }
        for sub in &inner.subscribers {
            // Never block the call that emits: a subscriber that does not read loses
            // events (counted) rather than stalling the session.
            if sub.outbound.try_send(render(&sub.subscription, &event)).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The `events` notification line (the borrowed twin of `EventsNotification`).
fn render(subscription: &str, event: &Event) -> String {
    #[derive(serde::Serialize)]
    struct Borrowed<'a> {
        subscription: &'a str,
        result: &'a Event,
    }
    jsonrpc::notification(method::EVENTS, &Borrowed { subscription, result: event })
}
