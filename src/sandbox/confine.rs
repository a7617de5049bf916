//! The kernel sandbox a command runs in: a Landlock domain (files, TCP, signal and
//! abstract-socket scoping) and a seccomp filter (the rest of the network), both
//! entered by the command's process between `fork` and `exec`, so that the
//! supervisor — and the daemon — stay outside the domain the command is in.
//!
//! Entering between `fork` and `exec` is `pre_exec`, which is `sys::before_exec`. The
//! ruleset itself is a descriptor: a call's is built by the daemon, while the call's
//! supervisor is being set up, and handed to it ([`build_ruleset`]).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope, path_beneath_rules,
};

use super::Profile;

/// The newest Landlock ABI this build asks for; the running kernel may give less
/// (best effort: every right the kernel knows is used).
const WANTED_ABI: ABI = ABI::V6;

/// What the running kernel offers, probed once: the Landlock ABI in force (0 when
/// Landlock is missing or disabled).
pub fn landlock_abi() -> i32 {
    static ABI_IN_FORCE: OnceLock<i32> = OnceLock::new();
    *ABI_IN_FORCE.get_or_init(|| {
        // Restricting a throwaway thread is the one way the crate reports the
        // kernel's ABI; the restriction ends with the thread.
        std::thread::spawn(|| {
            let status = Ruleset::default()
                .handle_access(AccessFs::Execute)
                .and_then(|ruleset| ruleset.create())
                .and_then(RulesetCreated::restrict_self);
            match status {
                Ok(status) => match status.landlock {
                    LandlockStatus::Available { effective_abi, kernel_abi } => {
                        kernel_abi.unwrap_or(effective_abi as i32)
                    }
                    _ => 0,
                },
                Err(_) => 0,
            }
        })
        .join()
        .unwrap_or(0)
    })
}

/// A sandbox ready to be entered: the Landlock ruleset as a descriptor (`None`
/// without Landlock) and the seccomp filter (`None` with the network on).
pub struct Prepared {
    ruleset: Option<OwnedFd>,
    seccomp: Option<&'static seccompiler::BpfProgram>,
    /// What is in force, for results and the audit log.
    pub description: String,
}

/// Builds the Landlock ruleset and the seccomp filter for `profile`.
pub fn prepare(profile: &Profile) -> Result<Prepared, String> {
    let ruleset = build_ruleset(profile)?;
    let seccomp = if profile.network { None } else { Some(network_filter()?) };
    Ok(Prepared { ruleset, seccomp, description: describe(profile) })
}

/// What `profile` puts in force on this kernel, for results and the audit log.
pub fn describe(profile: &Profile) -> String {
    let abi = profile.landlock_abi.unwrap_or_else(landlock_abi);
    let mut parts = Vec::new();
    if abi > 0 {
        parts.push(format!("landlock v{abi}"));
    }
    if !profile.network {
        parts.push(if abi >= 4 {
            "network off (landlock tcp, seccomp)".to_owned()
        } else {
            "network off (seccomp)".to_owned()
        });
    }
    if parts.is_empty() { "none".to_owned() } else { parts.join(", ") }
}

/// Whether `profile` has a Landlock ruleset on this kernel ([`build_ruleset`] gives
/// one).
pub fn has_ruleset(profile: &Profile) -> bool {
    profile.landlock_abi.unwrap_or_else(landlock_abi) > 0
}

/// Builds `profile`'s Landlock ruleset: a descriptor that any process holding it can
/// enter ([`install`]), `None` where the kernel has no Landlock. Building it does not
/// restrict the caller, so the daemon builds a call's ruleset while the call's
/// supervisor sets itself up, and hands it over.
pub fn build_ruleset(profile: &Profile) -> Result<Option<OwnedFd>, String> {
    if !has_ruleset(profile) {
        return Ok(None);
    }
    let all = AccessFs::from_all(WANTED_ABI);
    let read = AccessFs::from_read(WANTED_ABI);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(|err| format!("landlock: {err}"))?;
    if !profile.network {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(WANTED_ABI))
            .map_err(|err| format!("landlock: {err}"))?;
    }
    ruleset = ruleset
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(|err| format!("landlock: {err}"))?;
    let mut created = ruleset.create().map_err(|err| format!("landlock: {err}"))?;
    let (read_paths, read_dirs_only) = carve(&profile.read, &profile.protect);
    let (write_paths, write_dirs_only) = carve(&profile.write, &profile.protect);
    created = created
        .add_rules(path_beneath_rules(read_paths, read))
        .and_then(|created| created.add_rules(path_beneath_rules(write_paths, all)))
        .and_then(|created| {
            created.add_rules(path_beneath_rules(
                read_dirs_only.into_iter().chain(write_dirs_only),
                AccessFs::ReadDir,
            ))
        })
        .map_err(|err| format!("landlock: {err}"))?;
    for path in &profile.own_read {
        // Protected directories above it do not apply; those beneath it do.
        let beneath: Vec<PathBuf> =
            profile.protect.iter().filter(|guarded| !path.starts_with(guarded)).cloned().collect();
        let (paths, dirs_only) = carve(std::slice::from_ref(path), &beneath);
        created = created
            .add_rules(path_beneath_rules(paths, read))
            .and_then(|created| created.add_rules(path_beneath_rules(dirs_only, AccessFs::ReadDir)))
            .map_err(|err| format!("landlock: {err}"))?;
    }
    // A best-effort ruleset the kernel does not take has no descriptor.
    let fd: Option<OwnedFd> = created.into();
    fd.map(Some).ok_or_else(|| "landlock was not enforced".to_owned())
}

/// Makes `command`'s process enter the sandbox right before `exec`: the Landlock
/// `ruleset` (from [`build_ruleset`]) and, with `network_off`, the seccomp filter.
pub fn install(
    command: &mut std::process::Command,
    ruleset: Option<OwnedFd>,
    network_off: bool,
) -> Result<(), String> {
    let seccomp = if network_off { Some(network_filter()?) } else { None };
    crate::sys::before_exec(command, move || enter_domain(ruleset.as_ref(), seccomp));
    Ok(())
}

/// Makes the calling process (all of it: it must be single-threaded) enter the
/// sandbox, for a process that is about to `exec` its program itself.
pub fn enter_self(prepared: Prepared) -> std::io::Result<()> {
    enter_domain(prepared.ruleset.as_ref(), prepared.seccomp)
}

/// Restricts the calling thread with the Landlock ruleset (after `no_new_privs`, which
/// it requires of an unprivileged caller and which a sandboxed command keeps), then
/// the seccomp filter.
fn enter_domain(
    ruleset: Option<&OwnedFd>,
    seccomp: Option<&seccompiler::BpfProgram>,
) -> std::io::Result<()> {
    if let Some(ruleset) = ruleset {
        rustix::thread::set_no_new_privs(true)?;
        crate::sys::landlock_restrict_self(ruleset.as_fd())?;
    }
    if let Some(program) = seccomp {
        seccompiler::apply_filter(program).map_err(std::io::Error::other)?;
    }
    Ok(())
}

/// The seccomp filter of a command without the network, compiled once per process
/// (the supervisor spawner compiles it before it forks: [`warm_network_filter`]).
fn network_filter() -> Result<&'static seccompiler::BpfProgram, String> {
    static FILTER: OnceLock<Result<seccompiler::BpfProgram, String>> = OnceLock::new();
    FILTER.get_or_init(compile_network_filter).as_ref().map_err(Clone::clone)
}

/// Compiles the filter [`network_filter`] holds, so that processes forked from the
/// caller find it compiled.
pub fn warm_network_filter() {
    let _ = network_filter();
}

/// Denies IP and packet sockets (`EACCES`) and io_uring (which could open them
/// without the `socket` system call). Unix sockets keep working.
fn compile_network_filter() -> Result<seccompiler::BpfProgram, String> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    };
    let domain_is = |family: i32| -> Result<SeccompRule, String> {
        let condition = SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            u64::try_from(family).map_err(|err| err.to_string())?,
        )
        .map_err(|err| err.to_string())?;
        SeccompRule::new(vec![condition]).map_err(|err| err.to_string())
    };
    let rules = vec![
        (
            libc::SYS_socket,
            vec![
                domain_is(libc::AF_INET)?,
                domain_is(libc::AF_INET6)?,
                domain_is(libc::AF_PACKET)?,
            ],
        ),
        (libc::SYS_io_uring_setup, vec![]),
    ];
    let arch = std::env::consts::ARCH.try_into().map_err(|err| format!("seccomp: {err:?}"))?;
    let filter = SeccompFilter::new(
        rules.into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(u32::try_from(libc::EACCES).unwrap_or(13)),
        arch,
    )
    .map_err(|err| format!("seccomp: {err}"))?;
    filter.try_into().map_err(|err: seccompiler::BackendError| format!("seccomp: {err}"))
}

/// Splits allowed paths around protected ones. A protected path beneath an allowed
/// directory is cut out: the directory is replaced by its entries (recursively along
/// the way to the protected path), and the directories along that way keep only
/// their listing. Returns (paths with full access, directories with listing only).
/// Protected paths that do not exist have nothing to protect yet and are skipped.
fn carve(allowed: &[PathBuf], protected: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let protected: Vec<PathBuf> =
        protected.iter().filter(|path| path.symlink_metadata().is_ok()).cloned().collect();
    let mut full = Vec::new();
    let mut listing = Vec::new();
    for path in allowed {
        carve_one(path, &protected, 0, &mut full, &mut listing);
    }
    (full, listing)
}

fn carve_one(
    path: &Path,
    protected: &[PathBuf],
    depth: usize,
    full: &mut Vec<PathBuf>,
    listing: &mut Vec<PathBuf>,
) {
    if protected.iter().any(|guarded| path.starts_with(guarded)) {
        return;
    }
    let inside: Vec<&PathBuf> =
        protected.iter().filter(|guarded| guarded.starts_with(path)).collect();
    if inside.is_empty() || depth > 32 || !path.is_dir() {
        full.push(path.to_owned());
        return;
    }
    listing.push(path.to_owned());
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    for entry in entries.flatten() {
        carve_one(&entry.path(), protected, depth + 1, full, listing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carving_leaves_out_only_the_protected_path() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let root = dir.path();
        for sub in ["a/config/toolgate", "a/config/other", "a/work", "b"] {
            std::fs::create_dir_all(root.join(sub)).unwrap_or_else(|err| panic!("{err}"));
        }
        let guarded = root.join("a/config/toolgate");
        let (mut full, mut listing) = carve(&[root.join("a"), root.join("b")], &[guarded]);
        full.sort();
        listing.sort();
        assert_eq!(full, vec![root.join("a/config/other"), root.join("a/work"), root.join("b")]);
        assert_eq!(listing, vec![root.join("a"), root.join("a/config")]);
        let (full, listing) = carve(&[root.join("a/config/toolgate/x")], &[root.join("a/config")]);
        assert!(full.is_empty() && listing.is_empty());
    }
}
