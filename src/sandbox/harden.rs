//! What keeps a command away from the daemon's secrets, memory and descriptors.
//!
//! Every `/proc/<pid>/{environ,mem,fd/N,...}` access, `process_vm_readv`,
//! `pidfd_getfd` and `ptrace` is a *ptrace access check*. For a process that is not
//! dumpable it fails unless the caller has `CAP_SYS_PTRACE`, same user or not. So:
//!
//! - the daemon and each supervisor make themselves not dumpable
//!   ([`make_not_dumpable`]);
//! - a root daemon's commands lose `CAP_SYS_PTRACE` and the other capabilities that
//!   reach into another process or the kernel ([`drop_reaching_capabilities`]: raw
//!   I/O on `/dev/mem` and `/proc/kcore`, module loading, BPF and perf probes, and
//!   `CAP_SYS_ADMIN`, which grants several of those), from the bounding set as well,
//!   so a setuid or file-capability binary cannot bring them back;
//! - secret-looking variables are wiped from the daemon's environment block at start-up
//!   ([`scrub_secret_environment`]), so even a reader that gets past the check (root
//!   with the capability, outside toolgate) finds no values there. Children still get
//!   what the configuration lets them inherit: from a snapshot kept in memory
//!   ([`daemon_environment`]).

use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use rustix::thread::CapabilitySet;

/// The daemon's environment as it was at start-up, before secrets were wiped.
static SNAPSHOT: OnceLock<Vec<(String, String)>> = OnceLock::new();

/// The capabilities a root daemon's commands never have: those that reach into other
/// processes or the kernel, make device nodes (a block device made inside a root
/// leads to the disk beneath every root) or configure the network (a TUN device sends
/// packets past `network = false`), and the rest that no build needs and that act on
/// the whole machine (its clock, its kernel log, its consoles, process accounting,
/// the audit subsystem, wake alarms and suspend, immutable files, scheduling above
/// others, checkpoint/restore). A build keeps what it needs as root: owning and
/// reading files, changing users, binding low ports, `chroot`, file capabilities.
pub const DROPPED_CAPABILITIES: CapabilitySet = CapabilitySet::SYS_PTRACE
    .union(CapabilitySet::SYS_RAWIO)
    .union(CapabilitySet::SYS_MODULE)
    .union(CapabilitySet::SYS_ADMIN)
    .union(CapabilitySet::BPF)
    .union(CapabilitySet::PERFMON)
    .union(CapabilitySet::MAC_ADMIN)
    .union(CapabilitySet::MAC_OVERRIDE)
    .union(CapabilitySet::SYS_BOOT)
    .union(CapabilitySet::MKNOD)
    .union(CapabilitySet::NET_ADMIN)
    .union(CapabilitySet::SYS_TIME)
    .union(CapabilitySet::SYSLOG)
    .union(CapabilitySet::SYS_TTY_CONFIG)
    .union(CapabilitySet::SYS_PACCT)
    .union(CapabilitySet::AUDIT_CONTROL)
    .union(CapabilitySet::AUDIT_READ)
    .union(CapabilitySet::WAKE_ALARM)
    .union(CapabilitySet::BLOCK_SUSPEND)
    .union(CapabilitySet::LINUX_IMMUTABLE)
    .union(CapabilitySet::SYS_NICE)
    .union(CapabilitySet::CHECKPOINT_RESTORE);

/// Hardens the daemon process itself (`inherits`: whether the default environment
/// policy passes a variable on to commands); call first thing in a command that serves (one
/// thread only: the environment is edited). Wipes from the environment block the
/// values of the variables the default environment policy never passes on
/// (`*TOKEN*`, `*SECRET*`, `*KEY*`, `*PASSWORD*`, ...) and makes the process not
/// dumpable. Returns what failed: a failure makes a break-in easier, it does not make
/// the service wrong, so the caller logs it and goes on.
pub fn harden_daemon(inherits: impl Fn(&str) -> bool) -> Vec<String> {
    let mut notes = Vec::new();
    match scrub_secret_environment(|name| !inherits(name)) {
        Ok(_) => {}
        Err(err) => notes.push(format!("could not wipe secrets from the environment block: {err}")),
    }
    if let Err(err) = make_not_dumpable() {
        notes.push(format!("could not make the daemon non-dumpable: {err}"));
    }
    notes
}

/// `prctl(PR_SET_DUMPABLE, 0)`: no core dumps, and no ptrace access (so no
/// `/proc/<pid>/environ`, `mem` or `fd/N`) without `CAP_SYS_PTRACE`.
pub fn make_not_dumpable() -> std::io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(std::io::Error::from)
}

/// The environment children inherit from: the start-up snapshot when the daemon was
/// hardened, else (library users, tests) the live environment.
pub fn daemon_environment() -> Vec<(String, String)> {
    match SNAPSHOT.get() {
        Some(vars) => vars.clone(),
        None => std::env::vars_os()
            .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
            .collect(),
    }
}

/// Keeps a snapshot of the environment, then overwrites (with NUL bytes) the value of
/// every variable whose name `is_secret` matches in the process's original
/// environment block, the memory `/proc/<pid>/environ` shows. Returns how many values
/// were wiped. Must run while the process has one thread.
///
/// The block is written through `/proc/self/mem`, which a process may always do to
/// itself; the C library's `environ` points into the same bytes, so the variables
/// read as empty afterwards.
pub fn scrub_secret_environment(is_secret: impl Fn(&str) -> bool) -> std::io::Result<usize> {
    let vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .collect();
    if !vars.iter().any(|(name, _)| is_secret(name)) {
        let _ = SNAPSHOT.set(vars);
        return Ok(0);
    }
    let _ = SNAPSHOT.set(vars);
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let (start, end) = environment_block(&stat).ok_or_else(|| {
        std::io::Error::new(ErrorKind::InvalidData, "no env_start in /proc/self/stat")
    })?;
    let mem = std::fs::OpenOptions::new().read(true).write(true).open("/proc/self/mem")?;
    let len = usize::try_from(end.saturating_sub(start))
        .map_err(|_| std::io::Error::new(ErrorKind::InvalidData, "environment block too large"))?;
    let mut block = vec![0u8; len];
    mem.read_exact_at(&mut block, start)?;
    let mut wiped = 0;
    for (offset, len) in secret_values(&block, &is_secret) {
        mem.write_all_at(&vec![0u8; len], start + offset as u64)?;
        wiped += 1;
    }
    Ok(wiped)
}

/// `env_start` and `env_end` (fields 50 and 51) of a `/proc/<pid>/stat` text.
fn environment_block(stat: &str) -> Option<(u64, u64)> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace().skip(50 - 3);
    let start = fields.next()?.parse().ok()?;
    let end = fields.next()?.parse().ok()?;
    (start > 0 && end > start).then_some((start, end))
}

/// The (offset, length) of every secret variable's value in an environment block.
fn secret_values(block: &[u8], is_secret: &impl Fn(&str) -> bool) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut offset = 0;
    for entry in block.split(|byte| *byte == 0) {
        if let Some(eq) = entry.iter().position(|byte| *byte == b'=') {
            let name = String::from_utf8_lossy(&entry[..eq]);
            let value_len = entry.len() - eq - 1;
            if value_len > 0 && is_secret(&name) {
                found.push((offset + eq + 1, value_len));
            }
        }
        offset += entry.len() + 1;
    }
    found
}

/// Removes [`DROPPED_CAPABILITIES`] from this process's bounding, inheritable,
/// permitted, effective and ambient sets. For a process without capabilities (a
/// normal user's) there is nothing to do. Everything it starts afterwards runs
/// without them, setuid binaries included.
pub fn drop_reaching_capabilities() -> std::io::Result<()> {
    let current = rustix::thread::capabilities(None).map_err(std::io::Error::from)?;
    let holds_any = !(current.permitted & DROPPED_CAPABILITIES).is_empty()
        || !(current.inheritable & DROPPED_CAPABILITIES).is_empty();
    let bounding_has_any = DROPPED_CAPABILITIES
        .iter()
        .any(|cap| rustix::thread::capability_is_in_bounding_set(cap).unwrap_or(false));
    if !holds_any && !bounding_has_any {
        return Ok(());
    }
    if bounding_has_any {
        for cap in DROPPED_CAPABILITIES.iter() {
            match rustix::thread::remove_capability_from_bounding_set(cap) {
                Ok(()) => {}
                // A capability the running kernel does not know.
                Err(rustix::io::Errno::INVAL) => {}
                // Without CAP_SETPCAP the bounding set cannot shrink; permitted and
                // effective still do below, and such a process cannot regain them
                // through exec unless a file capability grants them.
                Err(rustix::io::Errno::PERM) => break,
                Err(err) => return Err(err.into()),
            }
        }
    }
    // The ambient set holds only what permitted and inheritable both hold: dropping
    // them from those below drops them from it too.
    let sets = rustix::thread::CapabilitySets {
        effective: current.effective - DROPPED_CAPABILITIES,
        permitted: current.permitted - DROPPED_CAPABILITIES,
        inheritable: current.inheritable - DROPPED_CAPABILITIES,
    };
    rustix::thread::set_capabilities(None, sets).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_values_of_secret_variables_in_a_block() {
        let block = b"PATH=/bin\0GITHUB_TOKEN=ghp_x\0EMPTY_TOKEN=\0HOME=/root\0";
        let is_secret = |name: &str| name.contains("TOKEN");
        let found = secret_values(block, &is_secret);
        assert_eq!(found, vec![(23, 5)]);
        assert_eq!(&block[23..28], b"ghp_x");
    }

    #[test]
    fn reads_the_environment_block_from_stat() {
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[50 - 3] = "1000".to_owned();
        fields[51 - 3] = "2000".to_owned();
        let stat = format!("42 (a (weird) name) {}", fields.join(" "));
        assert_eq!(environment_block(&stat), Some((1000, 2000)));
    }
}
