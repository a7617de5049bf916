//! SKELETON: the agent layer.
