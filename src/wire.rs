//! The wire types every layer shares: what a tool declares and the result every call
//! becomes, a session's mode and why a call was decided, the events a session emits,
//! what `daemon/status` shows of an upstream server and of the daemon's listeners.
//!
//! The bottom layer: serde, serde_json and schemars only, reaching no other module, so
//! that the client-only build (`--no-default-features --features client`) compiles it
//! with `protocol` and the typed client. The modules that give these types their
//! behaviour (`tools`, `permission`, `agent`, `upstream`) re-export them, and add
//! their own `impl` blocks.

mod decision;
mod event;
pub mod facts;
pub mod json_text;
pub mod metadata;
pub(crate) mod scratch;
mod status;
mod tool;
mod upstream;

pub use decision::{CallDecision, DecidedBy, Explanation, Layer, Mode, Outcome, RuleList};
pub use event::{ApprovalDecision, ApprovalScope, Event};
pub use facts::Facts;
pub use metadata::Metadata;
pub use status::Listener;
pub use tool::{
    Attachment, Definition, ErrorType, OutputStream, Safety, Todo, TodoStatus, ToolResult,
};
pub use upstream::{UpstreamState, UpstreamStatus};
