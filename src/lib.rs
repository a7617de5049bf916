//! toolgate: a daemon that hosts a coding agent's tools and executes model-produced
//! tool calls behind a chain of guards.
//!
//! Modules in reading order, from the transport-free core upwards (a module only
//! reaches downwards); see ARCHITECTURE.md for the layer map and its invariants.

pub mod sys;

pub mod tools;

pub mod sandbox;

pub mod exec;

pub mod upstream;

pub mod skills;

pub mod permission;

pub mod hooks;

pub mod agent;

pub mod audit;

pub mod config;

pub mod own_files;

pub mod protocol;

pub mod daemon;

pub mod admission;
pub mod auth;

pub mod rpc;

pub mod systemd;

pub mod server;

pub mod cli;
pub mod mcp;
