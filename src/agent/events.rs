//! The lifecycle events one session emits, and the sink they go to.
//!
//! Events are wire types (they go to clients as they are), so they live in one enum with
//! a `type` tag, defined in `crate::wire`. The agent layer only emits; the daemon
//! decides where events go (buffered until a client subscribes, bounded).

// Events and the answers to permission requests are defined in the bottom layer, which
// the client-only build compiles too.
pub use crate::wire::{ApprovalDecision, ApprovalScope, Event};

/// Where a session's events go. Implementations must not block (they are called on
/// the hot path of every call) and must be bounded.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: Event);
}

/// Drops every event (for callers that only want results).
#[derive(Debug, Default)]
pub struct NullSink;

impl EventSink for NullSink {
    fn emit(&self, _event: Event) {}
}
