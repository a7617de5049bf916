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
//! `toolgate` directory; they are enabled when the hierarchy offers them. On a hybrid
//! hierarchy, where a controller is bound to cgroup v1 (so v2 cannot have it), a call
//! with a limit also gets a cgroup in that v1 hierarchy, which carries the limit.

use std::io::ErrorKind;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a kill may take before the cgroup is left behind with a warning. Killed
/// processes leave within milliseconds unless stuck in the kernel.
const KILL_PATIENCE: Duration = Duration::from_secs(10);

/// The most memory still charged to a call's cgroup once its processes are gone for
/// it to be another call's ([`CallCgroup::reusable`]).
const REUSABLE_CHARGE: u64 = 1024 * 1024;

/// Where per-call cgroups are created, as found at first use.
#[derive(Debug)]
pub struct CallCgroups {
    /// `<own cgroup>/toolgate`.
    parent: PathBuf,
    /// The same, as a process's membership names it (relative to the hierarchy's
    /// mount point, from `/`).
    parent_in_hierarchy: PathBuf,
    /// Controllers enabled for the calls' cgroups (`pids`, `memory`).
    controllers: Vec<String>,
    /// `<own v1 cgroup>/toolgate` of each controller (`pids`, `memory`) bound to cgroup
    /// v1 on a hybrid hierarchy (so cgroup v2 cannot have it): a call with a limit also
    /// gets a cgroup there, which carries the limit.
    v1: Vec<(&'static str, PathBuf)>,
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

    /// Whether a cgroup v2 membership (the `0::` path of `/proc/<pid>/cgroup`) is one of
    /// the calls' cgroups (or beneath one).
    pub fn is_call_member(&self, membership: &Path) -> bool {
        membership.starts_with(&self.parent_in_hierarchy) && membership != self.parent_in_hierarchy
    }

    /// Whether a controller (`pids`, `memory`) applies to call cgroups.
    pub fn has_controller(&self, name: &str) -> bool {
        self.controllers.iter().any(|controller| controller == name)
            || self.v1.iter().any(|(controller, _)| *controller == name)
    }

    /// Whether a call with these limits needs cgroups in the v1 hierarchies (see
    /// [`CallCgroup::create`]).
    pub fn needs_v1(&self, max_processes: u64, max_memory_mb: u64) -> bool {
        self.v1.iter().any(|(controller, _)| match *controller {
            "pids" => max_processes > 0,
            _ => max_memory_mb > 0,
        })
    }

    /// The controllers that apply to call cgroups, for `toolgate status`.
    pub fn controllers(&self) -> Vec<String> {
        let mut controllers = self.controllers.clone();
        controllers
            .extend(self.v1.iter().map(|(controller, _)| format!("{controller} (cgroup v1)")));
        controllers
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
        hand_down_controllers(&own_dir, &parent);
        let controllers = enable_controllers(&parent);
        let v1 = ["pids", "memory"]
            .into_iter()
            .filter(|name| !controllers.iter().any(|controller| controller == name))
            .filter_map(|name| Some((name, v1_parent(&mountinfo, &membership, name)?)))
            .collect();
        let parent_in_hierarchy = Path::new("/").join(own.trim_start_matches('/')).join("toolgate");
        let cgroups = CallCgroups { parent, parent_in_hierarchy, controllers, v1 };
        // A call cgroup must be creatable, enterable by a child and killable.
        cgroups.probe()?;
        Ok(cgroups)
    }

    fn probe(&self) -> Result<(), String> {
        let cgroup = CallCgroup::create_in(self, true)
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

/// The mount point of the cgroup v1 hierarchy that carries `controller`.
fn cgroup1_mount(mountinfo: &str, controller: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let mut fields = after.split_whitespace();
        if fields.next()? != "cgroup" {
            return None;
        }
        let options = fields.nth(1)?;
        if !options.split(',').any(|option| option == controller) {
            return None;
        }
        let mount_point = before.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

/// The cgroup v1 path of `controller` in a `/proc/self/cgroup` text (`N:pids:PATH`).
fn v1_path<'a>(membership: &'a str, controller: &str) -> Option<&'a str> {
    membership.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let _id = fields.next()?;
        let controllers = fields.next()?;
        let path = fields.next()?;
        (controllers.split(',').any(|name| name == controller) && path.starts_with('/'))
            .then_some(path)
    })
}

/// The file that carries a v1 controller's limit.
fn v1_limit_file(controller: &str) -> &'static str {
    if controller == "pids" { "pids.max" } else { "memory.limit_in_bytes" }
}

/// `<own v1 cgroup>/toolgate` of `controller`, created, where that controller is bound
/// to cgroup v1 and the daemon may create cgroups there.
fn v1_parent(mountinfo: &str, membership: &str, controller: &str) -> Option<PathBuf> {
    let mount = cgroup1_mount(mountinfo, controller)?;
    let own = v1_path(membership, controller)?;
    let parent = mount.join(own.trim_start_matches('/')).join("toolgate");
    match std::fs::create_dir(&parent) {
        Ok(()) => {}
        Err(err) if err.kind() == ErrorKind::AlreadyExists => {}
        Err(err) => {
            tracing::debug!(%err, dir = %parent.display(), "no cgroup v1 {controller} controller for calls");
            return None;
        }
    }
    if !parent.join(v1_limit_file(controller)).exists() {
        return None;
    }
    remove_stale(&parent);
    Some(parent)
}

/// The cgroup v2 path in a `/proc/self/cgroup` text (the `0::PATH` line).
fn unified_path(membership: &str) -> Option<&str> {
    membership
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .filter(|path| path.starts_with('/'))
}

/// The controllers a cgroup directory offers (its `cgroup.controllers`).
fn offered(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("cgroup.controllers"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Makes the daemon's own cgroup hand `pids` and `memory` down to `toolgate` when it
/// has them but does not (a systemd unit with `Delegate=yes` gets its cgroup with
/// the controllers and nothing enabled below it). cgroup v2 lets a cgroup enable
/// controllers for its children only while it holds no process itself, so a daemon
/// alone in its cgroup first moves into a leaf `daemon` beside `toolgate`. A daemon
/// sharing its cgroup with other processes (a login session's scope) leaves it as it
/// is: the limits then stay off, and `toolgate status` shows the controllers missing.
fn hand_down_controllers(own_dir: &Path, parent: &Path) {
    let have = offered(own_dir);
    let below = offered(parent);
    let missing: Vec<&str> = ["pids", "memory"]
        .into_iter()
        .filter(|name| have.iter().any(|c| c == name) && !below.iter().any(|c| c == name))
        .collect();
    if missing.is_empty() {
        return;
    }
    let enable = || -> std::io::Result<()> {
        for name in &missing {
            std::fs::write(own_dir.join("cgroup.subtree_control"), format!("+{name}"))?;
        }
        Ok(())
    };
    match enable() {
        Ok(()) => {}
        // EBUSY: processes in the cgroup itself.
        Err(err) if err.raw_os_error() == Some(libc::EBUSY) && alone_in(own_dir) => {
            let leaf = own_dir.join("daemon");
            let moved = match std::fs::create_dir(&leaf) {
                Ok(()) => Ok(()),
                Err(err) if err.kind() == ErrorKind::AlreadyExists => Ok(()),
                Err(err) => Err(err),
            }
            .and_then(|()| std::fs::write(leaf.join("cgroup.procs"), "0"))
            .and_then(|()| enable());
            match moved {
                Ok(()) => tracing::info!(
                    leaf = %leaf.display(),
                    "moved the daemon into a leaf of its delegated cgroup to enable {} for calls",
                    missing.join(" and ")
                ),
                Err(err) => {
                    tracing::warn!(%err, "cannot enable {} for calls", missing.join(" and "))
                }
            }
        }
        Err(err) => {
            tracing::debug!(%err, "the daemon's cgroup does not hand down {}", missing.join(" and "));
        }
    }
}

/// Whether this process is the only one in the cgroup `dir`.
fn alone_in(dir: &Path) -> bool {
    let own = std::process::id().to_string();
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .is_ok_and(|procs| procs.split_whitespace().all(|pid| pid == own))
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
        drop(CallCgroup::at(entry.path(), None, Vec::new()));
    }
}

/// One call's cgroup. Dropping it kills everything in it and removes it.
#[derive(Debug)]
pub struct CallCgroup {
    dir: PathBuf,
    /// The directory opened (`O_PATH`) when it was made: the supervisor is born in
    /// it through this, and it tells whether the directory is still the one made.
    handle: Option<OwnedFd>,
    /// The call's cgroups in the v1 hierarchies (`pids`, `memory`), on a hybrid
    /// hierarchy.
    v1: Vec<(&'static str, PathBuf)>,
    /// Whether a limit was set ([`CallCgroup::set_limit`]).
    limited: AtomicBool,
    /// Whether it was killed ([`CallCgroup::kill`]).
    killed: AtomicBool,
    removed: bool,
}

impl CallCgroup {
    /// A new, empty cgroup for one call; `None` when per-call cgroups are unavailable
    /// (see [`CallCgroups::get`]). `in_v1`: the call has a limit that a v1 hierarchy
    /// carries ([`CallCgroups::needs_v1`]), so it also gets a cgroup in each v1
    /// hierarchy. Without one it gets none: entering a cgroup of a hierarchy costs the
    /// supervisor a wait for the kernel (an RCU grace period, often milliseconds),
    /// which the v2 cgroup alone avoids by being entered at `clone`.
    pub fn create(in_v1: bool) -> Option<std::io::Result<CallCgroup>> {
        let cgroups = CallCgroups::get().ok()?;
        Some(CallCgroup::create_in(cgroups, in_v1))
    }

    fn create_in(cgroups: &CallCgroups, in_v1: bool) -> std::io::Result<CallCgroup> {
        let name = format!("{}-{}", std::process::id(), NEXT_CALL.fetch_add(1, Ordering::Relaxed));
        let dir = cgroups.parent.join(&name);
        std::fs::create_dir(&dir)?;
        let v1_parents = cgroups.v1.iter().filter(|_| in_v1);
        let v1 = v1_parents
            .filter_map(|(controller, parent)| {
                let dir = parent.join(&name);
                match std::fs::create_dir(&dir) {
                    Ok(()) => Some((*controller, dir)),
                    Err(err) => {
                        tracing::warn!(%err, dir = %dir.display(), "cannot create the call's {controller} cgroup");
                        None
                    }
                }
            })
            .collect();
        let handle = rustix::fs::open(
            &dir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok();
        Ok(CallCgroup::at(dir, handle, v1))
    }

    /// The call cgroup at `dir`, neither limited nor killed yet.
    fn at(dir: PathBuf, handle: Option<OwnedFd>, v1: Vec<(&'static str, PathBuf)>) -> CallCgroup {
        CallCgroup {
            dir,
            handle,
            v1,
            limited: AtomicBool::new(false),
            killed: AtomicBool::new(false),
            removed: false,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory as opened when it was made (`O_PATH`), for `clone3`'s
    /// `CLONE_INTO_CGROUP`.
    pub fn handle(&self) -> Option<BorrowedFd<'_>> {
        self.handle.as_ref().map(AsFd::as_fd)
    }

    /// Whether the cgroup made is still there: not removed behind the daemon's back
    /// (a removed cgroup directory has no files left, even if something else now has
    /// its name).
    pub fn still_there(&self) -> bool {
        match &self.handle {
            Some(handle) => {
                rustix::fs::statat(handle, "cgroup.procs", rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok()
            }
            None => self.dir.is_dir(),
        }
    }

    /// Every cgroup directory the call's supervisor enters: the v2 one, and the v1
    /// ones on a hybrid hierarchy.
    pub fn dirs(&self) -> Vec<&Path> {
        std::iter::once(self.dir.as_path())
            .chain(self.v1.iter().map(|(_, dir)| dir.as_path()))
            .collect()
    }

    /// The call's v1 cgroup of `controller`, if it has one.
    fn v1_dir(&self, controller: &str) -> Option<&Path> {
        self.v1.iter().find(|(name, _)| *name == controller).map(|(_, dir)| dir.as_path())
    }

    /// Where a controller's files (`pids.max`, `memory.events`) are.
    fn dir_of(&self, file: &str) -> &Path {
        let controller = file.split('.').next().unwrap_or_default();
        self.v1_dir(controller).unwrap_or(&self.dir)
    }

    /// Sets the call's process limit (`pids.max`, in v2 or v1 alike).
    pub fn limit_processes(&self, max: u64) -> std::io::Result<()> {
        self.limited.store(true, Ordering::Relaxed);
        std::fs::write(self.dir_of("pids.max").join("pids.max"), max.to_string())
    }

    /// Sets the call's memory limit: `memory.max` in v2, and in a v1 hierarchy
    /// `memory.limit_in_bytes` (with swap counted, `memory.memsw.limit_in_bytes` too,
    /// so that the command cannot hold more by swapping).
    pub fn limit_memory(&self, bytes: u64) -> std::io::Result<()> {
        self.limited.store(true, Ordering::Relaxed);
        match self.v1_dir("memory") {
            None => std::fs::write(self.dir.join("memory.max"), bytes.to_string()),
            Some(dir) => {
                std::fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string())?;
                let swap = dir.join("memory.memsw.limit_in_bytes");
                if swap.exists() {
                    std::fs::write(swap, bytes.to_string())?;
                }
                Ok(())
            }
        }
    }

    /// How many processes were killed at the memory limit (`memory.events` in v2,
    /// `memory.oom_control` in v1).
    pub fn oom_kills(&self) -> u64 {
        match self.v1_dir("memory") {
            None => self.counter("memory.events", "oom_kill"),
            Some(_) => self.counter("memory.oom_control", "oom_kill"),
        }
    }

    /// How many times starting a process failed at the process limit.
    pub fn process_limit_hits(&self) -> u64 {
        self.counter("pids.events", "max")
    }

    /// Whether, its call over, it can be another call's as if made for it: never
    /// given a limit, never killed (some kernels go on killing what is born in a
    /// cgroup once killed), in no v1 hierarchy, still there, with no process left, no
    /// limit's event counted (an OOM kill counts even without a limit), and next to
    /// nothing still charged to it (a later call's memory limit would count what a
    /// command left in the page cache).
    pub fn reusable(&self) -> bool {
        // A controller's files are only there where it is enabled.
        let has = |name: &str| CallCgroups::get().is_ok_and(|cgroups| cgroups.has_controller(name));
        !self.removed
            && self.v1.is_empty()
            && !self.limited.load(Ordering::Relaxed)
            && !self.killed.load(Ordering::Relaxed)
            && self.still_there()
            && self.is_empty()
            && (!has("memory")
                || (self.counter("memory.events", "oom_kill") == 0
                    && self.counter_file("memory.current") <= REUSABLE_CHARGE))
            && (!has("pids") || self.counter("pids.events", "max") == 0)
    }

    /// The number a one-value file holds (`memory.current`); 0 when absent.
    fn counter_file(&self, file: &str) -> u64 {
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Reads one counter of a key-value file (`pids.events` `max`, `memory.events`
    /// `oom_kill`); 0 when absent.
    fn counter(&self, file: &str, key: &str) -> u64 {
        std::fs::read_to_string(self.dir_of(file).join(file))
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
        self.killed.store(true, Ordering::Relaxed);
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

    /// Kills everything in the cgroup, waits until it is empty and removes it. Returns
    /// whether it was found empty (its processes are all gone; it is removed unless
    /// the kernel refused).
    pub fn kill_and_remove(&mut self) -> bool {
        if self.removed {
            return true;
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
                return false;
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
        for (_, dir) in &self.v1 {
            // Its members were the v2 cgroup's: all gone now.
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(err) if err.kind() == ErrorKind::NotFound => break,
                    Err(_) if start.elapsed() < KILL_PATIENCE => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(err) => {
                        tracing::warn!(%err, dir = %dir.display(), "cannot remove a call's v1 cgroup");
                        break;
                    }
                }
            }
        }
        self.removed = true;
        true
    }
}

impl Drop for CallCgroup {
    fn drop(&mut self) {
        let _ = self.kill_and_remove();
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

    #[test]
    fn finds_a_v1_controller_of_a_hybrid_hierarchy() {
        let mountinfo = "40 30 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n\
                         41 30 0:36 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        assert_eq!(cgroup1_mount(mountinfo, "pids"), Some(PathBuf::from("/sys/fs/cgroup/pids")));
        assert_eq!(cgroup1_mount(mountinfo, "memory"), None);
        let membership = "8:pids:/a/b\n2:cpu,cpuacct:/c\n0::/\n";
        assert_eq!(v1_path(membership, "pids"), Some("/a/b"));
        assert_eq!(v1_path(membership, "cpuacct"), Some("/c"));
        assert_eq!(v1_path(membership, "memory"), None);
    }

    #[test]
    fn a_cgroup_removed_behind_its_back_is_no_longer_there_even_if_its_name_is_taken() {
        let Some(made) = CallCgroup::create(false) else {
            eprintln!("skipped: no per-call cgroups here ({:?})", CallCgroups::get().err());
            return;
        };
        let cgroup = made.unwrap_or_else(|err| panic!("{err}"));
        assert!(cgroup.handle().is_some() && cgroup.still_there());
        std::fs::remove_dir(cgroup.dir()).unwrap_or_else(|err| panic!("{err}"));
        assert!(!cgroup.still_there());
        // Another cgroup at the same name is not the one made.
        std::fs::create_dir(cgroup.dir()).unwrap_or_else(|err| panic!("{err}"));
        assert!(!cgroup.still_there());
        std::fs::remove_dir(cgroup.dir()).unwrap_or_else(|err| panic!("{err}"));
    }
}
