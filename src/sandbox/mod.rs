//! Containment and confinement of everything toolgate runs.
//!
//! - [`cgroup`]: one cgroup v2 per call where the daemon can create one, so that
//!   nothing a call started survives it, whatever happens to its supervisor.
//! - [`harden`]: the daemon's own protection (not dumpable, secrets wiped from its
//!   environment block) and the capabilities a root daemon's commands lose.

pub mod cgroup;
pub mod harden;

pub use cgroup::{CallCgroup, CallCgroups};
pub use harden::{daemon_environment, harden_daemon};

/// How a call's process tree is held, as reported in results and `toolgate status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Containment {
    /// A cgroup v2 per call: nothing inside can leave it, `cgroup.kill` ends it.
    Cgroup,
    /// The per-call supervisor alone (a subreaper walking the process tree). A
    /// supervisor killed from outside can leave its orphans running.
    Supervisor,
}

impl Containment {
    pub fn as_str(self) -> &'static str {
        match self {
            Containment::Cgroup => "cgroup",
            Containment::Supervisor => "supervisor",
        }
    }

    /// What calls get on this machine, and why when it is not a cgroup.
    pub fn available() -> (Containment, Option<&'static str>) {
        match CallCgroups::get() {
            Ok(_) => (Containment::Cgroup, None),
            Err(reason) => (Containment::Supervisor, Some(reason)),
        }
    }
}
