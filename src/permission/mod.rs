//! SKELETON: the permission engine.
