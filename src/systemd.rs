//! systemd integration.
