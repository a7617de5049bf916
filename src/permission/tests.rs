//! Table-driven tests of the whole engine.
