//! One cgroup v2 per supervised call, where the daemon can create one.
//!
//! A process cannot leave a cgroup by forking, `setsid`, double-forking or killing
//! its parent: membership is inherited and only a write to some `cgroup.procs` moves
//! it. So killing the call's cgroup (`cgroup.kill`) takes every process the call
//! started, even when the per-call supervisor was itself killed or stopped — by the
//! command, or from outside as the OOM killer would.
//!
//! Where: the cgroup v2 hierarchy is found in `/proc/self/mountinfo`, the daemon's own
//! cgroup in `/proc/self/cgroup`. Calls get `<own cgroup>/toolgate/<daemon pid>-<n>`.
//! That works as root, and as a normal user whose cgroup is delegated to it (a
//! systemd unit with `Delegate=yes`, a user session's delegated subtree). Anywhere
//! else (no cgroup v2, a read-only hierarchy, no delegation) [`CallCgroups::get`]
//! says why, and supervision falls back to the supervisor's process-tree walk.
//!
//! Resource limits need the `pids` and `memory` controllers enabled for the
//! `toolgate` directory; they are enabled when the hierarchy offers them.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a kill may take before the cgroup is left behind with a warning. Killed
/// processes leave within milliseconds unless stuck in the kernel.
const KILL_PATIENCE: Duration = Duration::from_secs(10);

/// Where per-call cgroups are created, as found at first use.
#[derive(Debug)]
pub struct CallCgroups {
    /// `<own cgroup>/toolgate`.
    parent: PathBuf,
    /// Controllers enabled for the calls' cgroups (`pids`, `memory`).
    controllers: Vec<String>,
}

static CGROUPS: OnceLock<Result<CallCgroups, String>> = OnceLock::new();
static NEXT_CALL: AtomicU64 = AtomicU64::new(0);

impl CallCgroups {
    /// The per-call cgroup hierarchy, or why there is none. Probed once per process.
    pub fn get() -> Result<&'static CallCgroups, &'static str> {
        CGROUPS.get_or_init(CallCgroups::detect).as_ref().map_err(String::as_str)
    }

    /// The directory call cgroups are created in.
    pub fn parent(&self) -> &Path {
        &self.parent
    }

    /// Whether a controller (`pids`, `memory`) applies to call cgroups.
    pub fn has_controller(&self, name: &str) -> bool {
        self.controllers.iter().any(|controller| controller == name)
    }

    fn detect() -> Result<CallCgroups, String> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|err| format!("cannot read /proc/self/mountinfo: {err}"))?;
        let mount = cgroup2_mount(&mountinfo).ok_or("no cgroup v2 hierarchy is mounted")?;
        let membership = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|err| format!("cannot read /proc/self/cgroup: {err}"))?;
        let own = unified_path(&membership).ok_or("this process has no cgroup v2 membership")?;
        let own_dir = mount.join(own.trim_start_matches('/'));
        let parent = own_dir.join("toolgate");
        match std::fs::create_dir(&parent) {
            Ok(()) => {}
            Err(err) if err.kind() == ErrorKind::AlreadyExists => {}
            Err(err) => {
                return Err(format!(
                    "cannot create cgroups under {} ({err}): cgroup v2 is not delegated to \
                     this user",
                    own_dir.display()
                ));
            }
        }
        if !parent.join("cgroup.procs").exists() {
            return Err(format!("{} is not a cgroup", parent.display()));
        }
        remove_stale(&parent);
        let controllers = enable_controllers(&parent);
        let cgroups = CallCgroups { parent, controllers };
        // A call cgroup must be creatable, enterable by a child and killable.
        cgroups.probe()?;
        Ok(cgroups)
    }

    fn probe(&self) -> Result<(), String> {
        let cgroup = CallCgroup::create_in(self)
            .map_err(|err| format!("cannot create a cgroup in {}: {err}", self.parent.display()))?;
        let kill_file = cgroup.dir.join("cgroup.kill");
        if !kill_file.exists() {
            // Kernels before 5.14: the kill falls back to signalling every member.
            tracing::debug!("cgroup.kill is missing; killing cgroup members one by one");
        }
        drop(cgroup);
        Ok(())
    }
}

/// The mount point of the cgroup v2 hierarchy in a `/proc/self/mountinfo` text.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let fstype = after.split_whitespace().next()?;
        if fstype != "cgroup2" {
            return None;
        }
        let mount_point = before.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\NNN` octal.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let octal = bytes.get(index + 1..index + 4).filter(|digits| {
            bytes[index] == b'\\' && digits.iter().all(|digit| (b'0'..=b'7').contains(digit))
        });
        match octal {
            Some(digits) => {
                let value =
                    digits.iter().fold(0u32, |acc, digit| acc * 8 + u32::from(digit - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                index += 4;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v2 path in a `/proc/self/cgroup` text (the `0::PATH` line).
fn unified_path(membership: &str) -> Option<&str> {
    membership
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .filter(|path| path.starts_with('/'))
}

/// Enables `pids` and `memory` for the calls where the hierarchy offers them to the
/// `toolgate` directory. Nothing above it is changed: a controller that the daemon's
/// own cgroup does not hand down stays off (and the limits with it).
fn enable_controllers(parent: &Path) -> Vec<String> {
    let offered = std::fs::read_to_string(parent.join("cgroup.controllers")).unwrap_or_default();
    ["pids", "memory"]
        .into_iter()
        .filter(|controller| offered.split_whitespace().any(|name| name == *controller))
        .filter(|controller| {
            std::fs::write(parent.join("cgroup.subtree_control"), format!("+{controller}")).is_ok()
        })
        .map(str::to_owned)
        .collect()
}

/// Kills and removes call cgroups left by daemons that are gone (`<pid>-<n>` whose
/// pid no longer exists): whatever is still in them escaped a dead daemon.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, _)) = name.to_str().and_then(|name| name.split_once('-')) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let cgroup = CallCgroup { dir: entry.path(), removed: false };
        drop(cgroup);
    }
}

/// One call's cgroup. Dropping it kills everything in it and removes it.
#[derive(Debug)]
pub struct CallCgroup {
    dir: PathBuf,
    removed: bool,
}

impl CallCgroup {
    /// A new, empty cgroup for one call; `None` when per-call cgroups are unavailable
    /// (see [`CallCgroups::get`]).
    pub fn create() -> Option<std::io::Result<CallCgroup>> {
        let cgroups = CallCgroups::get().ok()?;
        Some(CallCgroup::create_in(cgroups))
    }

    fn create_in(cgroups: &CallCgroups) -> std::io::Result<CallCgroup> {
        let name = format!("{}-{}", std::process::id(), NEXT_CALL.fetch_add(1, Ordering::Relaxed));
        let dir = cgroups.parent.join(name);
        std::fs::create_dir(&dir)?;
        Ok(CallCgroup { dir, removed: false })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sets a limit file (`pids.max`, `memory.max`).
    pub fn set_limit(&self, file: &str, value: &str) -> std::io::Result<()> {
        std::fs::write(self.dir.join(file), value)
    }

    /// Reads one counter of a key-value file (`pids.events` `max`, `memory.events`
    /// `oom_kill`); 0 when absent.
    pub fn counter(&self, file: &str, key: &str) -> u64 {
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|text| {
                text.lines().find_map(|line| {
                    let (name, value) = line.split_once(' ')?;
                    (name == key).then(|| value.trim().parse().ok()).flatten()
                })
            })
            .unwrap_or(0)
    }

    /// SIGKILLs every process in the cgroup, at once, without waiting.
    pub fn kill(&self) {
        if self.removed {
            return;
        }
        match std::fs::write(self.dir.join("cgroup.kill"), "1") {
            Ok(()) => {}
            Err(err) if err.kind() == ErrorKind::NotFound => self.kill_members(),
            Err(err) => {
                tracing::debug!(%err, dir = %self.dir.display(), "cgroup.kill failed");
                self.kill_members();
            }
        }
    }

    /// The kill for kernels without `cgroup.kill`: every member, again and again (a
    /// forking process may add members between reading the list and killing).
    fn kill_members(&self) {
        let Ok(text) = std::fs::read_to_string(self.dir.join("cgroup.procs")) else {
            return;
        };
        for pid in text.split_whitespace().filter_map(|pid| pid.parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Whether no live process is left in the cgroup.
    pub fn is_empty(&self) -> bool {
        match std::fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(text) => text.lines().any(|line| line.trim() == "populated 0"),
            Err(_) => std::fs::read_to_string(self.dir.join("cgroup.procs"))
                .map_or(true, |text| text.trim().is_empty()),
        }
    }

    /// Kills everything in the cgroup, waits until it is empty and removes it.
    pub fn kill_and_remove(&mut self) {
        if self.removed {
            return;
        }
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            if self.is_empty() {
                break;
            }
            self.kill();
            if start.elapsed() > KILL_PATIENCE {
                tracing::warn!(dir = %self.dir.display(), "processes of a call's cgroup did not die");
                return;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        loop {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => break,
                Err(err) if err.kind() == ErrorKind::NotFound => break,
                // Emptied a moment ago: the kernel may still be releasing it.
                Err(_) if start.elapsed() < KILL_PATIENCE => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(err) => {
                    tracing::warn!(%err, dir = %self.dir.display(), "cannot remove a call's cgroup");
                    break;
                }
            }
        }
        self.removed = true;
    }
}

impl Drop for CallCgroup {
    fn drop(&mut self) {
        self.kill_and_remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_unified_mount_and_path() {
        let mountinfo = "24 30 0:22 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                         35 30 0:31 / /sys/fs/cgroup/uni\\040fied rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(mountinfo), Some(PathBuf::from("/sys/fs/cgroup/uni fied")));
        assert_eq!(cgroup2_mount("24 30 0:22 / /proc rw - proc proc rw\n"), None);
        assert_eq!(
            unified_path("4:memory:/x\n0::/user.slice/a.scope\n"),
            Some("/user.slice/a.scope")
        );
        assert_eq!(unified_path("4:memory:/x\n"), None);
    }
}
