//! The kernel sandbox a command runs in: a Landlock domain (files, TCP, signal and
//! abstract-socket scoping) and a seccomp filter (the rest of the network), both
//! entered by the supervisor's thread that starts the command, and only by it
//! ([`Entry::enter_this_thread`], used by `exec::launch`), so that the supervisor's
//! own thread — and the daemon — stay outside the domain the command is in.
//!
//! The ruleset itself is a descriptor: a call's is built by the daemon, while the
//! call's supervisor is being set up, and handed to it ([`build_ruleset`]).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

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

/// A sandbox ready to be entered, and what it puts in force.
pub struct Prepared {
    entry: Entry,
    /// What is in force, for results and the audit log.
    pub description: String,
}

/// A sandbox to enter: the Landlock ruleset as a descriptor (`None` without
/// Landlock) and the seccomp filter (the terminal part always, the network part with
/// the network off).
pub struct Entry {
    ruleset: Option<OwnedFd>,
    seccomp: Option<&'static seccompiler::BpfProgram>,
}

/// Builds the Landlock ruleset and the seccomp filter for `profile`.
pub fn prepare(profile: &Profile) -> Result<Prepared, String> {
    let ruleset = build_ruleset(profile)?;
    let seccomp = Some(filter(!profile.network)?);
    Ok(Prepared { entry: Entry { ruleset, seccomp }, description: describe(profile) })
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
///
/// A ruleset is only read when a process enters it, so one built for a profile is
/// kept ([`KEPT`]) and handed to the next call with the same profile (the same roots
/// and, as private temporary directories are reused, often the same one) for as long
/// as building it again would give the same rules: [`Check::still_holds`]. Otherwise
/// the system part comes from the base [`make_next_base`] made ahead of the call when
/// one is ready and still holds.
pub fn build_ruleset(profile: &Profile) -> Result<Option<OwnedFd>, String> {
    KEPT.build(profile)
}

/// Whether the next call with `profile` would build its ruleset, rather than take one
/// kept: then a base made ahead saves it time.
pub fn wants_base(profile: &Profile) -> bool {
    has_ruleset(profile) && !KEPT.has(profile)
}

/// The rulesets kept for the profiles of recent calls.
static KEPT: KeptRulesets = KeptRulesets::new();

/// How many complete rulesets are kept: a few profiles (sessions with other roots,
/// calls at the same moment, each with its own temporary directory).
const KEEP: usize = 4;

/// Complete rulesets of recent calls, the most recently used last.
struct KeptRulesets(Mutex<Vec<Kept>>);

impl KeptRulesets {
    const fn new() -> KeptRulesets {
        KeptRulesets(Mutex::new(Vec::new()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn has(&self, profile: &Profile) -> bool {
        self.lock().iter().any(|kept| kept.profile == *profile)
    }

    /// [`build_ruleset`] with these kept rulesets.
    fn build(&self, profile: &Profile) -> Result<Option<OwnedFd>, String> {
        if !has_ruleset(profile) {
            return Ok(None);
        }
        // Looked up once for the whole call: the checks and the carving both need it.
        let existing = existing(&profile.protect);
        if let Some(kept) = self.take_copy(profile, &existing) {
            return kept.map(Some);
        }
        let (key, rest) = BaseKey::split(profile);
        let base = match take_base(&key, &existing) {
            Some(base) => base,
            None => Base::make(key, existing.clone(), SETTLE)?,
        };
        let started = SystemTime::now();
        let mut check = base.check;
        let created = finish_ruleset(base.ruleset, &rest, &existing, profile, &mut check)?;
        let fd: Option<OwnedFd> = created.into();
        // A best-effort ruleset the kernel does not take has no descriptor.
        let fd = fd.ok_or_else(|| "landlock was not enforced".to_owned())?;
        check.settled &= check.listed_settled(started, SETTLE);
        if check.settled
            && let Ok(copy) = fd.try_clone()
        {
            let mut kept = self.lock();
            kept.retain(|kept| kept.profile != *profile);
            if kept.len() == KEEP {
                kept.remove(0);
            }
            kept.push(Kept { profile: profile.clone(), ruleset: copy, check });
        }
        Ok(Some(fd))
    }

    /// A copy of the ruleset kept for `profile`, if building it now would give the
    /// same (`existing`: the protected paths that exist now); one that would not is
    /// dropped.
    fn take_copy(
        &self,
        profile: &Profile,
        existing: &[PathBuf],
    ) -> Option<Result<OwnedFd, String>> {
        let mut kept = self.lock();
        let at = kept.iter().position(|kept| kept.profile == *profile)?;
        let found = kept.remove(at);
        if !found.check.still_holds(existing) {
            return None;
        }
        let copy = found.ruleset.try_clone().map_err(|err| format!("landlock: {err}"));
        kept.push(found);
        Some(copy)
    }
}

/// A complete ruleset built for `profile`, and what building it saw. Its descriptor
/// is close-on-exec, like every copy handed out: only the daemon and the supervisor
/// that enters a copy ever hold it, never a command (which could add rules to it).
struct Kept {
    profile: Profile,
    ruleset: OwnedFd,
    check: Check,
}

/// Makes the system part of the next ruleset for a profile like `profile` and keeps
/// it for [`build_ruleset`]: for the blocking pool, once a call has taken its own
/// (and only where the next call would build one: [`wants_base`]).
/// With a protected directory beneath a system one (the service layout's
/// `/etc/toolgate`), that part is a rule for every entry of the directory above, a
/// few hundred microseconds a command would otherwise wait for.
pub fn make_next_base(profile: &Profile) {
    if !has_ruleset(profile) {
        return;
    }
    let (key, _) = BaseKey::split(profile);
    let existing = existing(&key.protect);
    // A base whose listed directories changed just before or while it was made could
    // have missed that change within a timestamp's granularity: not kept.
    if let Ok(base) = Base::make(key, existing, SETTLE)
        && base.check.settled
    {
        *lock_next_base() = Some(base);
    }
}

/// The base made for the next call, if any.
static NEXT_BASE: Mutex<Option<Base>> = Mutex::new(None);

fn lock_next_base() -> std::sync::MutexGuard<'static, Option<Base>> {
    NEXT_BASE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The base made ahead for `key`, if there is one and it still holds (`existing`:
/// the protected paths that exist now).
fn take_base(key: &BaseKey, existing: &[PathBuf]) -> Option<Base> {
    lock_next_base().take().filter(|base| base.key == *key && base.check.still_holds(existing))
}

/// What tells whether building a ruleset now would give the one built then.
#[derive(Default)]
struct Check {
    /// The protected paths that existed (only those were carved out).
    existing: Vec<PathBuf>,
    /// The paths given a rule that did not exist (and so have none).
    missing: Vec<PathBuf>,
    /// The directories carving listed, as they were after it listed them.
    listed: Vec<(PathBuf, Option<DirStamp>)>,
    /// The call's own paths (the roots, the temporary directory, what it may read):
    /// which inode each rule holds.
    identities: Vec<(PathBuf, Identity)>,
    /// Whether every listed directory had last changed well before ([`SETTLE`]) the
    /// ruleset was made, and every identity is one that cannot come back.
    settled: bool,
}

impl Check {
    /// Whether building it now would give the same rules: the same protected paths
    /// exist (`existing` now), every directory it listed is unchanged, no missing
    /// path appeared, and each of the call's own paths is the inode it was.
    fn still_holds(&self, existing: &[PathBuf]) -> bool {
        existing == self.existing
            && self.listed.iter().all(|(dir, stamp)| DirStamp::of(dir) == *stamp)
            && !self.missing.iter().any(|path| path.exists())
            && self.identities.iter().all(|(path, identity)| Identity::of(path) == Some(*identity))
    }

    /// Whether every listed directory had last changed `settle` before `started`.
    fn listed_settled(&self, started: SystemTime, settle: Duration) -> bool {
        self.listed
            .iter()
            .all(|(_, stamp)| stamp.is_some_and(|stamp| stamp.changed() + settle < started))
    }

    /// Notes `paths` (given a rule each) as missing where they do not exist.
    fn note_missing(&mut self, paths: &[PathBuf]) {
        self.missing.extend(paths.iter().filter(|path| !path.exists()).cloned());
    }

    /// Notes the directories carving listed, as they are now.
    fn note_listed(&mut self, dirs: &[PathBuf]) {
        self.listed.extend(dirs.iter().map(|dir| (dir.clone(), DirStamp::of(dir))));
    }
}

/// What a ruleset was made from, apart from the call's own paths: the profile's
/// system directories and device files, the protected paths carved out of them, and
/// the domain's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
struct BaseKey {
    read: Vec<PathBuf>,
    write: Vec<PathBuf>,
    protect: Vec<PathBuf>,
    network: bool,
    abi: i32,
}

/// A profile's paths that are not in its base.
struct Rest {
    read: Vec<PathBuf>,
    write: Vec<PathBuf>,
}

impl BaseKey {
    /// Splits `profile` into its base (the first `profile.base` read and write paths:
    /// the system directories, devices, home and caches every command shares) and the
    /// rest. Rules add up, so a ruleset with both parts allows what one built from the
    /// whole profile does.
    fn split(profile: &Profile) -> (BaseKey, Rest) {
        let (read_base, write_base) = profile.base;
        let cut = |paths: &[PathBuf], at: usize| {
            let at = at.min(paths.len());
            (paths[..at].to_vec(), paths[at..].to_vec())
        };
        let (read, rest_read) = cut(&profile.read, read_base);
        let (write, rest_write) = cut(&profile.write, write_base);
        let key = BaseKey {
            read,
            write,
            protect: profile.protect.clone(),
            network: profile.network,
            abi: profile.landlock_abi.unwrap_or_else(landlock_abi),
        };
        (key, Rest { read: rest_read, write: rest_write })
    }
}

/// A created ruleset holding a profile's system part, and what its carving saw.
struct Base {
    key: BaseKey,
    ruleset: RulesetCreated,
    check: Check,
}

/// How long before a ruleset is made its listed directories must have last changed
/// for it to be kept: far beyond any filesystem's timestamp granularity.
const SETTLE: Duration = Duration::from_secs(2);

impl Base {
    /// `existing`: the protected paths that exist, the only ones carved out.
    fn make(key: BaseKey, existing: Vec<PathBuf>, settle: Duration) -> Result<Base, String> {
        let started = SystemTime::now();
        let all = AccessFs::from_all(WANTED_ABI);
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(all)
            .map_err(|err| format!("landlock: {err}"))?;
        if !key.network {
            ruleset = ruleset
                .handle_access(AccessNet::from_all(WANTED_ABI))
                .map_err(|err| format!("landlock: {err}"))?;
        }
        ruleset = ruleset
            .scope(Scope::Signal | Scope::AbstractUnixSocket)
            .map_err(|err| format!("landlock: {err}"))?;
        let created = ruleset.create().map_err(|err| format!("landlock: {err}"))?;
        let mut check = Check::default();
        check.note_missing(&key.read);
        check.note_missing(&key.write);
        let (read_paths, read_dirs_only) = carve_existing(&key.read, &existing);
        let (write_paths, write_dirs_only) = carve_existing(&key.write, &existing);
        check.note_listed(&read_dirs_only);
        check.note_listed(&write_dirs_only);
        check.existing = existing;
        check.settled = check.listed_settled(started, settle);
        let created =
            add_carved(created, (read_paths, read_dirs_only), (write_paths, write_dirs_only))?;
        Ok(Base { key, ruleset: created, check })
    }
}

/// Which inode a path leads to (following links, as a rule does): its device and
/// number, and when it was born, so that a number freed and given to a new file
/// does not pass for the old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    born: Option<SystemTime>,
}

impl Identity {
    fn of(path: &Path) -> Option<Identity> {
        use std::os::unix::fs::MetadataExt;
        let metadata = std::fs::metadata(path).ok()?;
        Some(Identity { dev: metadata.dev(), ino: metadata.ino(), born: metadata.created().ok() })
    }
}

/// What tells a directory's listing changed: its identity and its modification and
/// change times (an entry added, removed or renamed sets both).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DirStamp {
    dev: u64,
    ino: u64,
    modified: SystemTime,
    /// The status change time.
    status: SystemTime,
}

impl DirStamp {
    fn of(dir: &Path) -> Option<DirStamp> {
        use std::os::unix::fs::MetadataExt;
        let metadata = std::fs::metadata(dir).ok()?;
        let status = SystemTime::UNIX_EPOCH
            + Duration::new(
                u64::try_from(metadata.ctime()).ok()?,
                u32::try_from(metadata.ctime_nsec()).ok()?,
            );
        Some(DirStamp {
            dev: metadata.dev(),
            ino: metadata.ino(),
            modified: metadata.modified().ok()?,
            status,
        })
    }

    /// The last time the directory changed, either way.
    fn changed(&self) -> SystemTime {
        self.modified.max(self.status)
    }
}

/// Adds the per-call part of `profile` (`rest`, carved around the protected paths
/// that exist, and the paths it may read whatever is protected above them) to a
/// ruleset holding its base, noting in `check` what it was made from.
fn finish_ruleset(
    created: RulesetCreated,
    rest: &Rest,
    existing: &[PathBuf],
    profile: &Profile,
    check: &mut Check,
) -> Result<RulesetCreated, String> {
    for path in rest.read.iter().chain(&rest.write).chain(&profile.own_read) {
        match Identity::of(path) {
            Some(identity) => {
                check.settled &= identity.born.is_some();
                check.identities.push((path.clone(), identity));
            }
            None => check.missing.push(path.clone()),
        }
    }
    let (read_paths, read_dirs_only) = carve_existing(&rest.read, existing);
    let (write_paths, write_dirs_only) = carve_existing(&rest.write, existing);
    check.note_listed(&read_dirs_only);
    check.note_listed(&write_dirs_only);
    let mut created =
        add_carved(created, (read_paths, read_dirs_only), (write_paths, write_dirs_only))?;
    let read = AccessFs::from_read(WANTED_ABI);
    for path in &profile.own_read {
        // Protected directories above it do not apply; those beneath it do.
        let beneath: Vec<PathBuf> =
            profile.protect.iter().filter(|guarded| !path.starts_with(guarded)).cloned().collect();
        let (paths, dirs_only) = carve(std::slice::from_ref(path), &beneath);
        check.note_listed(&dirs_only);
        created = created
            .add_rules(path_beneath_rules(paths, read))
            .and_then(|created| created.add_rules(path_beneath_rules(dirs_only, AccessFs::ReadDir)))
            .map_err(|err| format!("landlock: {err}"))?;
    }
    Ok(created)
}

/// Adds carved read paths (read access) and write paths (all access), and the
/// listing of the directories carved around protected paths.
fn add_carved(
    created: RulesetCreated,
    (read_paths, read_dirs_only): (Vec<PathBuf>, Vec<PathBuf>),
    (write_paths, write_dirs_only): (Vec<PathBuf>, Vec<PathBuf>),
) -> Result<RulesetCreated, String> {
    let all = AccessFs::from_all(WANTED_ABI);
    // Beneath the roots and the other writable folders a command makes no device node
    // and drives none (a device node made there by a root command would lead to a
    // disk); the device files granted under `/dev` keep their ioctls (a terminal's).
    let no_devices = all & !(AccessFs::MakeChar | AccessFs::MakeBlock | AccessFs::IoctlDev);
    let read = AccessFs::from_read(WANTED_ABI);
    let (devices, folders): (Vec<PathBuf>, Vec<PathBuf>) =
        write_paths.into_iter().partition(|path| path.starts_with("/dev"));
    created
        .add_rules(path_beneath_rules(read_paths, read))
        .and_then(|created| created.add_rules(path_beneath_rules(devices, all)))
        .and_then(|created| created.add_rules(path_beneath_rules(folders, no_devices)))
        .and_then(|created| {
            created.add_rules(path_beneath_rules(
                read_dirs_only.into_iter().chain(write_dirs_only),
                AccessFs::ReadDir,
            ))
        })
        .map_err(|err| format!("landlock: {err}"))
}

/// The sandbox of a supervised command: its Landlock `ruleset` (from
/// [`build_ruleset`]) and, where it has anything to refuse, the seccomp filter: with
/// `network_off`, for a command on a `terminal` of its own, and wherever Landlock is
/// not in force. A command without a terminal under Landlock holds no terminal and can
/// open none but a pseudo-terminal it makes itself (it starts a session of its own,
/// `/dev/tty` leads nowhere and no `/dev/pts` entry is granted), so `TIOCSTI` has
/// nothing there to reach; attaching a filter costs the kernel a compilation on every
/// start, which such a command is spared.
pub fn entry(ruleset: Option<OwnedFd>, network_off: bool, terminal: bool) -> Result<Entry, String> {
    let needed = network_off || terminal || ruleset.is_none();
    let seccomp = if needed { Some(filter(network_off)?) } else { None };
    Ok(Entry { ruleset, seccomp })
}

/// Makes the calling process (all of it: it must be single-threaded) enter the
/// sandbox, for a process that is about to `exec` its program itself.
pub fn enter_self(prepared: Prepared) -> std::io::Result<()> {
    prepared.entry.enter_this_thread()
}

impl Entry {
    /// Restricts the calling thread, and every process it starts from now on, with
    /// the Landlock ruleset (after `no_new_privs`, which it requires of an
    /// unprivileged caller and which a sandboxed command keeps), then the seccomp
    /// filter. The process's other threads are not affected.
    pub fn enter_this_thread(&self) -> std::io::Result<()> {
        if let Some(ruleset) = &self.ruleset {
            rustix::thread::set_no_new_privs(true)?;
            crate::sys::landlock_restrict_self(ruleset.as_fd())?;
        }
        if let Some(program) = self.seccomp {
            seccompiler::apply_filter(program).map_err(std::io::Error::other)?;
        }
        Ok(())
    }
}

/// A command's seccomp filter, compiled once per process for each setting of the
/// network (the supervisor spawner compiles both before it forks:
/// [`warm_network_filter`]).
fn filter(network_off: bool) -> Result<&'static seccompiler::BpfProgram, String> {
    static WITH_NETWORK: OnceLock<Result<seccompiler::BpfProgram, String>> = OnceLock::new();
    static WITHOUT_NETWORK: OnceLock<Result<seccompiler::BpfProgram, String>> = OnceLock::new();
    let slot = if network_off { &WITHOUT_NETWORK } else { &WITH_NETWORK };
    slot.get_or_init(|| compile_filter(network_off)).as_ref().map_err(Clone::clone)
}

/// Compiles the filters [`filter`] holds, so that processes forked from the caller
/// find them compiled.
pub fn warm_network_filter() {
    let _ = filter(true);
    let _ = filter(false);
}

/// Denies (`EACCES`) the terminal requests that act on a terminal beyond writing to it:
/// `TIOCSTI`, which pushes input into a terminal as if typed (into the shell of the
/// person who started the daemon, were its terminal reachable), and `TIOCLINUX`,
/// which reads and sets a virtual console's selection, whatever the kernel's
/// `dev.tty.legacy_tiocsti` says. With `network_off`, also IP and packet sockets and
/// io_uring (which could open them without the `socket` system call); Unix sockets
/// keep working.
fn compile_filter(network_off: bool) -> Result<seccompiler::BpfProgram, String> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    };
    // The kernel reads an ioctl's request as 32 bits: compare those, so that high
    // bits set in the argument do not slip past.
    let argument_is = |index: u8, value: u64| -> Result<SeccompRule, String> {
        let condition =
            SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
                .map_err(|err| err.to_string())?;
        SeccompRule::new(vec![condition]).map_err(|err| err.to_string())
    };
    let family = |family: i32| u64::try_from(family).map_err(|err| err.to_string());
    let mut rules = vec![(
        libc::SYS_ioctl,
        vec![argument_is(1, libc::TIOCSTI)?, argument_is(1, libc::TIOCLINUX)?],
    )];
    if network_off {
        rules.push((
            libc::SYS_socket,
            vec![
                argument_is(0, family(libc::AF_INET)?)?,
                argument_is(0, family(libc::AF_INET6)?)?,
                argument_is(0, family(libc::AF_PACKET)?)?,
            ],
        ));
        rules.push((libc::SYS_io_uring_setup, vec![]));
    }
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
    carve_existing(allowed, &existing(protected))
}

/// The protected paths that exist, each also as it resolves where that differs: a
/// secret reached through a symlink (`~/.ssh` linked into a dotfiles repository, a
/// linked `~/.config`) is cut out where it really is, too.
///
/// Asked for every call, of some sixty paths (the secret locations and toolgate's own
/// files): the answer is kept, with the directories those paths (and what they
/// resolve to) are in, and holds while none of those directories changed, since a
/// path can only appear, go or be replaced by a change to its directory's listing. A
/// directory that had changed just before the look (within a timestamp's
/// granularity) keeps the answer from being kept.
fn existing(protected: &[PathBuf]) -> Vec<PathBuf> {
    let mut kept = FOUND.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(found) = kept.as_ref()
        && found.protected == protected
        && found.still_holds()
    {
        return found.found.clone();
    }
    let started = SystemTime::now();
    let mut dirs: Vec<PathBuf> =
        protected.iter().filter_map(|path| path.parent()).map(Path::to_path_buf).collect();
    dirs.sort();
    dirs.dedup();
    let mut stamps: Vec<(PathBuf, Option<DirStamp>)> = dirs
        .into_iter()
        .map(|dir| {
            let stamp = DirStamp::of(&dir);
            (dir, stamp)
        })
        .collect();
    let found = look_for(protected);
    for path in &found {
        if let Some(dir) = path.parent()
            && !stamps.iter().any(|(known, _)| known == dir)
        {
            stamps.push((dir.to_path_buf(), DirStamp::of(dir)));
        }
    }
    let settled = stamps
        .iter()
        .all(|(_, stamp)| stamp.is_none_or(|stamp| stamp.changed() + SETTLE < started));
    *kept = settled.then(|| {
        let watch = Watch::on(stamps.iter().map(|(dir, _)| dir.as_path()));
        Found { protected: protected.to_vec(), dirs: stamps, found: found.clone(), watch }
    });
    // A change between the look and the watch is caught by the stamps, once.
    if kept.as_ref().is_some_and(|found| !found.stamps_hold()) {
        *kept = None;
    }
    found
}

impl Found {
    /// Whether the answer still holds: no directory holding a protected path changed.
    /// Where the directories are watched, that is one read of the watch (no event);
    /// elsewhere, each directory's stamp.
    fn still_holds(&self) -> bool {
        match &self.watch {
            Some(watch) => watch.quiet(),
            None => self.stamps_hold(),
        }
    }

    fn stamps_hold(&self) -> bool {
        self.dirs.iter().all(|(dir, stamp)| DirStamp::of(dir) == *stamp)
    }
}

/// An inotify watch on directories: any entry created, removed or moved in one of
/// them, or the directory itself removed or moved, is an event. A directory that does
/// not exist is watched through its nearest existing ancestor, where its creation
/// shows.
struct Watch {
    fd: OwnedFd,
}

impl Watch {
    fn on<'a>(dirs: impl Iterator<Item = &'a Path>) -> Option<Watch> {
        use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).ok()?;
        let flags = WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF
            | WatchFlags::ONLYDIR;
        for dir in dirs {
            let watched = dir.ancestors().find(|candidate| candidate.is_dir())?;
            inotify::add_watch(&fd, watched, flags).ok()?;
        }
        Some(Watch { fd })
    }

    /// Whether nothing happened since the watch began (or since the last event was
    /// read: once an event came, the caller drops the watch).
    fn quiet(&self) -> bool {
        let mut buffer = [0u8; 256];
        matches!(rustix::io::read(&self.fd, &mut buffer), Err(rustix::io::Errno::AGAIN))
    }
}

/// The last answer of [`existing`] and what it was made from.
struct Found {
    protected: Vec<PathBuf>,
    /// The directories the protected paths (and what they resolve to) are in, as they
    /// were before the look.
    dirs: Vec<(PathBuf, Option<DirStamp>)>,
    found: Vec<PathBuf>,
    /// Those directories watched, where the kernel lets them be.
    watch: Option<Watch>,
}

static FOUND: Mutex<Option<Found>> = Mutex::new(None);

/// [`existing`], looked up now.
fn look_for(protected: &[PathBuf]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut resolved_elsewhere = false;
    for path in protected {
        if path.symlink_metadata().is_err() {
            continue;
        }
        found.push(path.clone());
        if let Ok(resolved) = std::fs::canonicalize(path)
            && resolved != *path
        {
            found.push(resolved);
            resolved_elsewhere = true;
        }
    }
    if resolved_elsewhere {
        found.sort();
        found.dedup();
    }
    found
}

/// [`carve`] around protected paths known to exist.
fn carve_existing(allowed: &[PathBuf], protected: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut full = Vec::new();
    let mut listing = Vec::new();
    for path in allowed {
        carve_one(path, protected, 0, &mut full, &mut listing);
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

    /// A tree with a protected directory beneath a "system" one, its profile, and
    /// that profile split with `sys` as the system part.
    fn carved_tree() -> (tempfile::TempDir, Profile, BaseKey, Rest) {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let root = dir.path();
        for sub in ["sys/guarded", "sys/sub", "work", "other"] {
            std::fs::create_dir_all(root.join(sub)).unwrap_or_else(|err| panic!("{err}"));
        }
        for file in ["sys/keep.txt", "sys/guarded/secret.txt", "other/outside.txt"] {
            std::fs::write(root.join(file), "x").unwrap_or_else(|err| panic!("{err}"));
        }
        let profile = Profile {
            read: vec![root.join("sys")],
            write: vec![root.join("work")],
            protect: vec![root.join("sys/guarded"), root.join("sys/later")],
            network: true,
            base: (1, 0),
            ..Default::default()
        };
        let (key, rest) = BaseKey::split(&profile);
        // Whatever the filesystem's timestamp granularity, the tree is older than the
        // base made next.
        std::thread::sleep(Duration::from_millis(50));
        (dir, profile, key, rest)
    }

    #[test]
    fn a_base_made_ahead_holds_only_while_what_it_was_carved_from_is_unchanged() {
        let (dir, _profile, key, rest) = carved_tree();
        let root = dir.path();
        assert_eq!(key.read, vec![root.join("sys")]);
        assert_eq!((rest.read.len(), rest.write, key.write.len()), (0, vec![root.join("work")], 0));
        let made = || {
            Base::make(key.clone(), existing(&key.protect), Duration::ZERO)
                .unwrap_or_else(|err| panic!("{err}"))
        };
        let holds = |base: &Base| base.check.still_holds(&existing(&base.key.protect));

        let base = made();
        assert!(base.check.settled && holds(&base));
        assert_eq!(base.check.listed.len(), 1, "only sys was listed: {:?}", base.check.listed);
        // An entry added beside the protected directory must be in the next ruleset.
        std::fs::write(root.join("sys/new.txt"), "x").unwrap_or_else(|err| panic!("{err}"));
        assert!(!holds(&base));

        std::thread::sleep(Duration::from_millis(50));
        let base = made();
        assert!(holds(&base));
        // A protected path that appears must be carved out.
        std::fs::create_dir(root.join("sys/later")).unwrap_or_else(|err| panic!("{err}"));
        assert!(!holds(&base));

        // Changed too recently to be trusted ahead of time.
        let fresh = Base::make(key.clone(), existing(&key.protect), SETTLE)
            .unwrap_or_else(|err| panic!("{err}"));
        assert!(!fresh.check.settled);

        // A system path that did not exist must get its rule once it does.
        let mut with_missing = key.clone();
        with_missing.read.push(root.join("opt"));
        std::thread::sleep(Duration::from_millis(50));
        let base = Base::make(with_missing, existing(&key.protect), Duration::ZERO)
            .unwrap_or_else(|err| panic!("{err}"));
        assert!(holds(&base));
        std::fs::create_dir(root.join("opt")).unwrap_or_else(|err| panic!("{err}"));
        assert!(!holds(&base));
    }

    #[test]
    fn a_ruleset_finished_from_a_base_allows_what_the_profile_allows_and_no_more() {
        if landlock_abi() == 0 {
            eprintln!("skipped: this kernel has no Landlock");
            return;
        }
        let (dir, profile, key, rest) = carved_tree();
        let root = dir.path().to_owned();
        let existing = existing(&profile.protect);
        let base =
            Base::make(key, existing.clone(), Duration::ZERO).unwrap_or_else(|err| panic!("{err}"));
        let mut check = base.check;
        let created = finish_ruleset(base.ruleset, &rest, &existing, &profile, &mut check)
            .unwrap_or_else(|err| panic!("{err}"));
        let ruleset: Option<OwnedFd> = created.into();
        let ruleset = ruleset.unwrap_or_else(|| panic!("no ruleset"));
        // Landlock restricts the calling thread (and what it starts) only.
        let seen = std::thread::spawn(move || {
            rustix::thread::set_no_new_privs(true).unwrap_or_else(|err| panic!("{err}"));
            crate::sys::landlock_restrict_self(ruleset.as_fd())
                .unwrap_or_else(|err| panic!("{err}"));
            let read = |path: &str| std::fs::read_to_string(root.join(path)).is_ok();
            (
                read("sys/keep.txt"),
                std::fs::read_dir(root.join("sys")).is_ok(),
                read("sys/guarded/secret.txt"),
                read("other/outside.txt"),
                std::fs::write(root.join("work/made.txt"), "y").is_ok(),
                std::fs::write(root.join("sys/made.txt"), "y").is_ok(),
            )
        })
        .join()
        .unwrap_or_else(|_| panic!("the restricted thread panicked"));
        assert_eq!(seen, (true, true, false, false, true, false));
    }

    /// What a thread restricted by `ruleset` can do: for each of `writes`, whether it
    /// can create a file there, and for each of `reads`, whether it can read it.
    fn can(ruleset: OwnedFd, writes: &[PathBuf], reads: &[PathBuf]) -> (Vec<bool>, Vec<bool>) {
        let (writes, reads) = (writes.to_vec(), reads.to_vec());
        std::thread::spawn(move || {
            rustix::thread::set_no_new_privs(true).unwrap_or_else(|err| panic!("{err}"));
            crate::sys::landlock_restrict_self(ruleset.as_fd())
                .unwrap_or_else(|err| panic!("{err}"));
            let wrote = writes.iter().map(|dir| std::fs::write(dir.join("made"), "y").is_ok());
            let read = reads.iter().map(|path| std::fs::read_to_string(path).is_ok());
            (wrote.collect(), read.collect())
        })
        .join()
        .unwrap_or_else(|_| panic!("the restricted thread panicked"))
    }

    #[test]
    fn a_kept_ruleset_is_handed_out_only_while_building_it_again_would_give_the_same() {
        if landlock_abi() == 0 {
            eprintln!("skipped: this kernel has no Landlock");
            return;
        }
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let root = dir.path().to_owned();
        for sub in ["work/inner", "tmp", "aside"] {
            std::fs::create_dir_all(root.join(sub)).unwrap_or_else(|err| panic!("{err}"));
        }
        if Identity::of(&root).is_none_or(|identity| identity.born.is_none()) {
            eprintln!("skipped: this file system does not tell when a file was born");
            return;
        }
        let (work, tmp) = (root.join("work"), root.join("tmp"));
        let secret = work.join("inner/secret");
        let profile = Profile {
            read: vec![root.join("work")],
            write: vec![work.clone(), tmp.clone()],
            protect: vec![secret.clone()],
            network: true,
            ..Default::default()
        };
        let kept = KeptRulesets::new();
        let build = || {
            kept.build(&profile)
                .unwrap_or_else(|err| panic!("{err}"))
                .unwrap_or_else(|| panic!("no ruleset"))
        };
        // Built, kept, and the copy handed out next allows what the profile allows.
        let first = build();
        assert!(kept.has(&profile));
        assert_eq!(can(first, &[work.clone(), tmp.clone()], &[]).0, [true, true]);
        let again = build();
        assert!(kept.has(&profile));
        assert_eq!(can(again, &[work.clone(), tmp.clone()], &[]).0, [true, true]);

        // The temporary directory replaced by another (the old one moved aside): the
        // rules held the old one's inode, so a kept ruleset would let the command
        // write to the old one and not to the new one.
        std::fs::rename(&tmp, root.join("aside/tmp")).unwrap_or_else(|err| panic!("{err}"));
        std::fs::create_dir(&tmp).unwrap_or_else(|err| panic!("{err}"));
        let rebuilt = build();
        assert_eq!(can(rebuilt, &[tmp.clone(), root.join("aside/tmp")], &[]).0, [true, false]);

        // A protected path that appears inside a root is cut out of the next ruleset.
        std::fs::write(&secret, "s").unwrap_or_else(|err| panic!("{err}"));
        let carved = build();
        assert_eq!(can(carved, &[], std::slice::from_ref(&secret)).1, [false]);
        // Carved from a directory that just changed: used, but not kept.
        assert!(!kept.has(&profile));
    }

    #[test]
    fn a_protected_path_that_appears_in_a_settled_directory_is_seen_at_once() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".config")).unwrap_or_else(|err| panic!("{err}"));
        let protected = vec![home.join(".aws"), home.join(".config/gh"), home.join(".netrc")];
        // Older than the settling time: the answer is kept, watched.
        std::thread::sleep(SETTLE + Duration::from_millis(100));
        assert!(existing(&protected).is_empty());
        assert!(existing(&protected).is_empty());
        std::fs::write(home.join(".netrc"), "machine x").unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(existing(&protected), vec![home.join(".netrc")]);
        std::fs::create_dir(home.join(".config/gh")).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(existing(&protected), vec![home.join(".config/gh"), home.join(".netrc")]);
        std::fs::remove_file(home.join(".netrc")).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(existing(&protected), vec![home.join(".config/gh")]);
    }

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
