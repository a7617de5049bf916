//! toolgate: a daemon that hosts a coding agent's tools and executes model-produced
//! tool calls behind a chain of guards.
//!
//! Modules in reading order, from the transport-free core upwards (a module only
//! reaches downwards); see ARCHITECTURE.md for the layer map and its invariants.
//!
//! Two builds: the default feature `daemon` is everything (the daemon, its faces and
//! tools, the `toolgate` command); `--no-default-features --features client` is the
//! typed client of the native API ([`rpc::api`]) and the protocol's wire types
//! ([`protocol`], [`wire`]) alone, for programs that talk to a daemon.

#[cfg(feature = "daemon")]
pub mod sys;

#[cfg(feature = "client")]
pub mod wire;

#[cfg(feature = "daemon")]
pub mod tools;

#[cfg(feature = "daemon")]
pub mod sandbox;

#[cfg(feature = "daemon")]
pub mod exec;

#[cfg(feature = "daemon")]
pub mod upstream;

#[cfg(feature = "daemon")]
pub mod skills;

#[cfg(feature = "daemon")]
pub mod permission;

#[cfg(feature = "daemon")]
pub mod hooks;

#[cfg(feature = "daemon")]
pub mod agent;

#[cfg(feature = "daemon")]
pub mod audit;

#[cfg(feature = "daemon")]
pub mod config;

#[cfg(feature = "daemon")]
pub mod own_files;

#[cfg(feature = "client")]
pub mod protocol;

#[cfg(feature = "daemon")]
pub mod daemon;

#[cfg(feature = "daemon")]
pub mod admission;
#[cfg(feature = "daemon")]
pub mod auth;

#[cfg(feature = "daemon")]
pub mod rpc;

/// The native face, in the client-only build: its typed client alone.
#[cfg(all(feature = "client", not(feature = "daemon")))]
pub mod rpc {
    pub mod api;
}

#[cfg(feature = "daemon")]
pub mod systemd;

#[cfg(feature = "daemon")]
pub mod server;

#[cfg(feature = "daemon")]
pub mod cli;
#[cfg(feature = "daemon")]
pub mod mcp;
