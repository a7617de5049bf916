//! SKELETON: spawning and process-tree supervision, filled in by the run_command work.
