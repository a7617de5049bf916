//! SKELETON: command hooks.
