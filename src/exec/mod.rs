//! Running a command under a per-call supervisor that keeps its whole process tree
//! contained and kills it when the call ends: the daemon side ([`run`]), the
//! supervisor side, the pool of ready supervisors and their spawner, the launch of the
//! command itself, descriptor passing, and terminals.

pub(crate) mod fd_pass;
pub(crate) mod launch;
mod run;
pub(crate) mod spawner;
pub mod terminal;

pub use run::*;
