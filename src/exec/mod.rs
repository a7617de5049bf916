//! Running a command under a per-call supervisor that keeps its whole process tree
//! contained and kills it when the call ends: the daemon side ([`run`]), the
//! supervisor side, the pool of ready supervisors and their spawner, the launch of the
//! command itself, descriptor passing, and terminals.

pub mod cwd;
pub(crate) mod fd_pass;
pub(crate) mod launch;
mod run;
pub(crate) mod spawner;
pub mod terminal;

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub(crate) use run::protect_git;
pub use run::*;

/// Captured command output kept per call (head and tail together).
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// Which stream a chunk of live output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Receives live output of a running call (the agent layer numbers the chunks and
/// turns them into `tool_output` events). Must not block: it is called from the task
/// that reads the child's pipes.
#[derive(Clone)]
pub struct OutputSink(Option<Arc<OutputFn>>);

/// The callback behind an active [`OutputSink`].
type OutputFn = dyn Fn(OutputStream, &str) + Send + Sync;

impl OutputSink {
    /// A sink that drops everything.
    pub fn discard() -> OutputSink {
        OutputSink(None)
    }

    pub fn new(f: impl Fn(OutputStream, &str) + Send + Sync + 'static) -> OutputSink {
        OutputSink(Some(Arc::new(f)))
    }

    pub fn is_active(&self) -> bool {
        self.0.is_some()
    }

    pub fn emit(&self, stream: OutputStream, text: &str) {
        if let Some(f) = &self.0 {
            f(stream, text);
        }
    }
}

impl std::fmt::Debug for OutputSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_active() { "OutputSink(active)" } else { "OutputSink(discard)" })
    }
}
