//! SKELETON: the permission engine.
#![allow(dead_code)]
mod path;
mod shell;
