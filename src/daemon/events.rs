//! Per-session event delivery: a bounded buffer until someone subscribes, then fan-out
//! to each subscriber.
//!
//! Events stay typed here: a subscriber is whatever a face hands in (the native face
//! renders a JSON-RPC notification into its connection's bounded outbound queue), so
//! the daemon knows no wire format.
//!
//! The buffer is bounded twice: by a number of events (configured) and by their
//! approximate size, since one `tool_result` can carry a whole file and a session
//! whose client never subscribes would otherwise keep the last thousand of them.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::Arc;

use crate::agent::{Event, EventSink};

/// Where a face delivers the events of one subscription. Called with the hub's lock
/// held, on the hot path of every call: it must not block (a full queue loses the
/// event, and says so).
pub trait Subscriber: Send + Sync {
    /// Hands one event over; false when it was lost (the subscriber's queue is full).
    fn deliver(&self, subscription: &str, event: &Event) -> bool;
    /// Whether the subscriber is gone (its connection closed).
    fn is_closed(&self) -> bool;
}

/// One subscription: its id, the connection that asked for it, and where its events go.
struct Subscription {
    subscription: String,
    connection: u64,
    outbound: Arc<dyn Subscriber>,
}

struct Inner {
    /// Events emitted while nobody was subscribed, with their approximate sizes
    /// (oldest dropped past either cap).
    buffer: VecDeque<(Event, usize)>,
    /// The sum of the sizes in `buffer`.
    buffered_bytes: usize,
    subscribers: Vec<Subscription>,
}

/// The approximate bytes of buffered events one session may hold while nobody
/// subscribes: room for the lifecycle events of a few dozen small calls (or the last
/// few file reads) made before a client subscribes, which is what the subscribe race
/// needs, while a client that never does costs at most this much. The newest event is
/// always kept, however large (its size is bounded by the tools' output limits).
///
/// Kept small on purpose: every session nobody listens to holds this much once it is
/// busy, and each call then frees the oldest events, long out of the caches. At
/// 256 KiB, 64 such sessions under load held 16 MiB of old output, and a call cost
/// the daemon about a tenth more CPU than at 32 KiB.
pub const EVENT_BUFFER_BYTES: usize = 32 * 1024;

/// What an event costs beyond its variable parts: the tag, ids and numbers.
const EVENT_OVERHEAD: usize = 128;

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
            inner: Mutex::new(Inner {
                buffer: VecDeque::new(),
                buffered_bytes: 0,
                subscribers: Vec::new(),
            }),
            capacity: capacity.max(1),
            dropped: AtomicU64::new(0),
        }
    }

    /// Adds a subscriber and hands it every buffered event first, so that nothing
    /// emitted before the subscription (the subscribe race) is lost.
    pub fn subscribe(&self, subscription: String, connection: u64, outbound: Arc<dyn Subscriber>) {
        let mut inner = self.lock();
        let backlog: Vec<(Event, usize)> = inner.buffer.drain(..).collect();
        inner.buffered_bytes = 0;
        for (event, _) in &backlog {
            if !outbound.deliver(&subscription, event) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        inner.subscribers.push(Subscription { subscription, connection, outbound });
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
        // The oldest events a full buffer lets go are dropped once the lock is released:
        // one may hold the last reference to a call's output, and freeing that must not
        // keep the session's other calls waiting for the hub.
        let mut evicted = Evicted::default();
        let mut inner = self.lock();
        inner.subscribers.retain(|sub| !sub.outbound.is_closed());
        if inner.subscribers.is_empty() {
            let size = approximate_size(&event);
            while !inner.buffer.is_empty()
                && (inner.buffer.len() >= self.capacity
                    || inner.buffered_bytes + size > EVENT_BUFFER_BYTES)
            {
                if let Some((old, dropped_size)) = inner.buffer.pop_front() {
                    inner.buffered_bytes -= dropped_size;
                    evicted.keep(old);
                }
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            inner.buffered_bytes += size;
            inner.buffer.push_back((event, size));
            drop(inner);
            return;
        }
        for sub in &inner.subscribers {
            // Never block the call that emits: a subscriber that does not read loses
            // events (counted) rather than stalling the session.
            if !sub.outbound.deliver(&sub.subscription, &event) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Events taken out of a full buffer, held until the hub's lock is released. An
/// emit evicts a few events at most (a call's result makes room for itself by letting
/// go of the oldest call's start and result), which needs no allocation.
#[derive(Default)]
struct Evicted {
    inline: [Option<Event>; EVICTED_INLINE],
    rest: Vec<Event>,
}

/// Evicted events held without an allocation.
const EVICTED_INLINE: usize = 4;

impl Evicted {
    fn keep(&mut self, event: Event) {
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(event),
            None => self.rest.push(event),
        }
    }
}

/// Roughly the memory an event holds: its strings and JSON values, plus a constant.
/// Cheap (no serialization); only the variable-size parts are counted exactly.
fn approximate_size(event: &Event) -> usize {
    let variable = match event {
        Event::ToolCallStart { arguments, .. } => value_size(arguments.as_ref()),
        Event::ToolOutput { text, .. } => text.len(),
        Event::ProcessExited { process_id, killed, error, .. } => {
            process_id.len()
                + killed.as_ref().map_or(0, String::len)
                + error.as_ref().map_or(0, String::len)
        }
        Event::PermissionRequest { arguments, suggestions, .. } => {
            value_size(arguments) + suggestions.iter().map(String::len).sum::<usize>()
        }
        Event::PermissionResolved { reason, .. } => reason.as_ref().map_or(0, String::len),
        Event::ToolResult { result, .. } => {
            result.content.len()
                + result.error.as_ref().map_or(0, String::len)
                + result
                    .metadata
                    .iter()
                    .map(|(key, value)| key.len() + value_size(value))
                    .sum::<usize>()
                + result.attachments.iter().map(attachment_size).sum::<usize>()
        }
        Event::TodosUpdated { todos, .. } => {
            todos.iter().map(|todo| todo.content.len() + 16).sum::<usize>()
        }
        Event::ToolCallDone { decision, .. } => decision.rule.as_ref().map_or(0, String::len),
        Event::ModeChanged { .. } | Event::ToolsListChanged {} => 0,
    };
    EVENT_OVERHEAD + variable
}

fn value_size(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(text) => text.len() + 8,
        Value::Array(items) => items.iter().map(value_size).sum::<usize>() + 8,
        Value::Object(map) => {
            map.iter().map(|(key, value)| key.len() + value_size(value)).sum::<usize>() + 8
        }
    }
}

fn attachment_size(attachment: &crate::tools::Attachment) -> usize {
    use crate::tools::Attachment;
    match attachment {
        Attachment::Image { data, .. } | Attachment::Audio { data, .. } => data.len(),
        Attachment::Resource { uri, text, .. } => uri.len() + text.len(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::tools::ToolResult;

    /// Keeps what it is handed, up to a capacity.
    struct Collect {
        events: Mutex<Vec<(String, Event)>>,
        capacity: usize,
    }

    impl Collect {
        fn new(capacity: usize) -> Arc<Collect> {
            Arc::new(Collect { events: Mutex::new(Vec::new()), capacity })
        }

        fn take(&self) -> Vec<(String, Event)> {
            std::mem::take(&mut *self.events.lock().unwrap())
        }
    }

    impl Subscriber for Collect {
        fn deliver(&self, subscription: &str, event: &Event) -> bool {
            let mut events = self.events.lock().unwrap();
            if events.len() >= self.capacity {
                return false;
            }
            events.push((subscription.to_owned(), event.clone()));
            true
        }

        fn is_closed(&self) -> bool {
            false
        }
    }

    fn result_event(call_id: &str, content_bytes: usize) -> Event {
        Event::ToolResult {
            session_id: "s1".into(),
            call_id: call_id.into(),
            elapsed_ms: 0.1,
            result: std::sync::Arc::new(ToolResult::success("x".repeat(content_bytes))),
        }
    }

    fn done_event(call_id: &str) -> Event {
        Event::ToolCallDone {
            session_id: "s1".into(),
            call_id: call_id.into(),
            elapsed_ms: 0.1,
            decision: crate::permission::CallDecision::new(
                crate::permission::Outcome::Allow,
                crate::permission::DecidedBy::Rule,
            ),
        }
    }

    /// Subscribes and returns the call ids of the backlog, in order.
    fn backlog(hub: &EventHub) -> Vec<String> {
        let collect = Collect::new(4096);
        hub.subscribe("sub-1".to_owned(), 1, collect.clone());
        collect.take().iter().map(|(_, event)| event.call_id().unwrap().to_owned()).collect()
    }

    #[test]
    fn the_buffer_keeps_the_newest_events_up_to_its_count() {
        let hub = EventHub::new(3);
        for index in 0..5 {
            hub.emit(done_event(&index.to_string()));
        }
        assert_eq!(backlog(&hub), ["2", "3", "4"]);
        assert_eq!(hub.dropped(), 2);
    }

    #[test]
    fn the_buffer_is_bounded_by_size_as_well() {
        let hub = EventHub::new(1024);
        // Each result is a quarter of the budget: at most three fit with the overheads.
        for index in 0..10 {
            hub.emit(result_event(&index.to_string(), EVENT_BUFFER_BYTES / 4));
        }
        assert_eq!(backlog(&hub), ["7", "8", "9"]);
        assert_eq!(hub.dropped(), 7);

        // One event over the whole budget is still kept, alone.
        let hub = EventHub::new(1024);
        hub.emit(done_event("small"));
        hub.emit(result_event("huge", EVENT_BUFFER_BYTES * 2));
        assert_eq!(backlog(&hub), ["huge"]);
    }

    #[test]
    fn a_subscriber_gets_events_as_they_come_and_the_buffer_starts_over() {
        let hub = EventHub::new(1024);
        hub.emit(done_event("before"));
        let collect = Collect::new(16);
        hub.subscribe("sub-9".to_owned(), 7, collect.clone());
        hub.emit(done_event("after"));
        let got = collect.take();
        assert_eq!(
            got.iter().map(|(sub, event)| (sub.as_str(), event.call_id())).collect::<Vec<_>>(),
            [("sub-9", Some("before")), ("sub-9", Some("after"))]
        );
        hub.unsubscribe_connection(7);
        hub.emit(done_event("later"));
        assert_eq!(backlog(&hub), ["later"]);
    }

    #[test]
    fn a_full_subscriber_loses_events_and_they_are_counted() {
        let hub = EventHub::new(1024);
        let collect = Collect::new(1);
        hub.subscribe("sub-1".to_owned(), 1, collect.clone());
        hub.emit(done_event("kept"));
        hub.emit(done_event("lost"));
        assert_eq!(collect.take().len(), 1);
        assert_eq!(hub.dropped(), 1);
    }
}
