//! What a session may open, decided on the path of what is actually opened.
//!
//! Permission rules are first decided on the path a call names, before anything
//! touches the disk. A symlink inside the roots can make that path differ from the
//! file that gets opened (`notenv.txt -> .env`), and a walker opens files no call
//! named at all. So every lookup in this module's parent checks the *resolved* path of
//! the descriptor it opened, after opening and before using it, with [`Access`]:
//!
//! - **toolgate's own files** (configuration, token files, skill and hook files, the
//!   audit log, the state directory): never readable or writable through a tool,
//!   wherever they lie. No rule and no mode lifts this.
//! - **deny and ask rules** on the resolved path ([`PathRules`], implemented by the
//!   permission policy): a deny rule refuses; an ask rule refuses too when the
//!   resolved path is not the one the call named (the question was asked, or not, about
//!   another path). Read rules (`read_file`) bind every tool that returns content or
//!   names; write rules (`edit_file`, `write_file`) bind every write.
//!
//! The check is on the descriptor's real path, the same descriptor that is then read
//! or written, so no rename between check and use can change what it applies to.

use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// What a tool is about to do with a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    /// Return its content or its name.
    Read,
    /// Create, replace or change it.
    Write,
}

/// Whether a rule that binds a path refuses it outright or asks first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleEffect {
    Deny,
    Ask,
}

/// A rule binding a resolved path: its effect and its text as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleHit {
    pub effect: RuleEffect,
    pub rule: String,
}

/// Path rules as the file layer applies them to resolved paths. Implemented by the
/// permission policy; the file layer knows nothing of rule syntax.
pub trait PathRules: Send + Sync {
    /// The first deny rule, else the first ask rule, that binds `access` to the
    /// absolute resolved `path` (root-relative globs are matched under `roots`).
    fn binding_rule(&self, access: AccessKind, path: &Path, roots: &[PathBuf]) -> Option<RuleHit>;

    /// Whether any deny or ask rule could bind `access` at all (lets walkers skip the
    /// per-entry check when nothing is configured).
    fn restricts(&self, access: AccessKind) -> bool;
}

/// Why [`Access::check`] refused a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// One of toolgate's own files (or a directory holding them).
    OwnFile,
    /// A rule binds the resolved path.
    Rule(RuleHit),
}

impl Refusal {
    /// The message for the model; `shown` is the path as the call wrote it and `real`
    /// the path it resolved to.
    pub fn message(&self, shown: &str, real: &Path) -> String {
        let through = if Path::new(shown) == real || real.ends_with(shown) {
            String::new()
        } else {
            format!(" (it resolves to {})", real.display())
        };
        match self {
            Refusal::OwnFile => format!(
                "{shown}{through} is one of toolgate's own files (configuration, tokens, skills, \
                 hooks, audit log or state), which no tool may read or write"
            ),
            Refusal::Rule(RuleHit { effect: RuleEffect::Deny, rule }) => {
                format!("{shown}{through} is denied by the rule {rule}")
            }
            Refusal::Rule(RuleHit { effect: RuleEffect::Ask, rule }) => format!(
                "{shown}{through} falls under the ask rule {rule}; name the file by its real \
                 path so that the question is asked about it"
            ),
        }
    }
}

/// The paths and rules every lookup of a session is checked against. Cheap to clone;
/// clones share their contents, so [`Access::replace`] (a configuration reload) reaches
/// every session at once.
#[derive(Clone, Default)]
pub struct Access {
    inner: Arc<RwLock<Arc<AccessInner>>>,
}

#[derive(Default)]
struct AccessInner {
    /// Absolute paths of toolgate's own files and directories (everything beneath a
    /// directory is covered).
    own: Vec<OwnPath>,
    rules: Option<Arc<dyn PathRules>>,
}

/// One of toolgate's own paths, and whether it is plain ([`super::lexical::is_plain`]),
/// found once rather than at every check.
struct OwnPath {
    path: PathBuf,
    plain: bool,
}

impl fmt::Debug for OwnPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.path.fmt(f)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.snapshot();
        f.debug_struct("Access")
            .field("own", &inner.own)
            .field("rules", &inner.rules.is_some())
            .finish()
    }
}

impl Access {
    /// `own`: toolgate's own files and directories (absolute; non-canonical spellings
    /// are canonicalized where they exist, and both spellings are kept). `rules`: the
    /// configured deny and ask rules.
    pub fn new(own: Vec<PathBuf>, rules: Option<Arc<dyn PathRules>>) -> Access {
        let own = spellings(own)
            .into_iter()
            .map(|path| OwnPath {
                plain: super::lexical::is_plain(path.as_os_str().as_bytes()),
                path,
            })
            .collect();
        Access { inner: Arc::new(RwLock::new(Arc::new(AccessInner { own, rules }))) }
    }

    /// Replaces what this access (and every clone of it) checks against with what
    /// `other` checks against.
    pub fn replace(&self, other: &Access) {
        let fresh = other.snapshot();
        *self.inner.write().unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
    }

    /// toolgate's own paths as configured (and canonicalized).
    pub fn own_paths(&self) -> Vec<PathBuf> {
        self.snapshot().own.iter().map(|own| own.path.clone()).collect()
    }

    fn snapshot(&self) -> Arc<AccessInner> {
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Whether `access` to the resolved absolute `real` path is allowed. `named` is the
    /// lexically resolved path the call named, when there is one: an ask rule only
    /// refuses when the real path differs from it (the permission layer already asked
    /// about the named path).
    pub fn check(
        &self,
        access: AccessKind,
        real: &Path,
        named: Option<&Path>,
        roots: &[PathBuf],
    ) -> Result<(), Refusal> {
        self.snapshot().check(access, real, named, roots)
    }

    /// A checker for one walk below `base` (a resolved directory): only the own paths
    /// that can lie beneath it are kept, so that the common case costs nothing per
    /// entry.
    pub(crate) fn for_walk(&self, base: &Path, roots: &[PathBuf]) -> WalkAccess {
        let inner = self.snapshot();
        let own = inner
            .own
            .iter()
            .map(|own| &own.path)
            .filter(|own| own.starts_with(base) || base.starts_with(own))
            .cloned()
            .collect();
        let rules = inner.rules.clone().filter(|rules| rules.restricts(AccessKind::Read));
        WalkAccess { own, rules, roots: roots.to_vec() }
    }
}

impl AccessInner {
    fn check(
        &self,
        access: AccessKind,
        real: &Path,
        named: Option<&Path>,
        roots: &[PathBuf],
    ) -> Result<(), Refusal> {
        let real_plain = super::lexical::is_plain(real.as_os_str().as_bytes());
        if self
            .own
            .iter()
            .any(|own| super::lexical::starts_with_as(real, real_plain, &own.path, own.plain))
        {
            return Err(Refusal::OwnFile);
        }
        let Some(rules) = &self.rules else {
            return Ok(());
        };
        match rules.binding_rule(access, real, roots) {
            None => Ok(()),
            Some(hit) if hit.effect == RuleEffect::Ask && named == Some(real) => Ok(()),
            Some(hit) => Err(Refusal::Rule(hit)),
        }
    }
}

/// [`Access`] narrowed to one walk (reads only: walkers return content or names).
pub(crate) struct WalkAccess {
    own: Vec<PathBuf>,
    rules: Option<Arc<dyn PathRules>>,
    roots: Vec<PathBuf>,
}

impl WalkAccess {
    /// Whether nothing can ever be withheld in this walk.
    pub(crate) fn is_open(&self) -> bool {
        self.own.is_empty() && self.rules.is_none()
    }

    /// Whether the entry at the absolute `path` must be left out. Ask rules withhold
    /// too: nobody was asked about a file a search happens to reach.
    pub(crate) fn withholds(&self, path: &Path) -> bool {
        if self.own.iter().any(|own| path.starts_with(own)) {
            return true;
        }
        self.rules
            .as_ref()
            .is_some_and(|rules| rules.binding_rule(AccessKind::Read, path, &self.roots).is_some())
    }
}

/// Each path as given plus its canonical spelling when it exists and differs (a
/// configured `~/.config` may be a symlink; the kernel reports real paths).
fn spellings(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut out = Vec::with_capacity(paths.len());
    for path in paths {
        if !path.is_absolute() {
            continue;
        }
        if let Ok(real) = std::fs::canonicalize(&path)
            && real != path
        {
            out.push(real);
        }
        out.push(path);
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    struct DenyEnv;

    impl PathRules for DenyEnv {
        fn binding_rule(
            &self,
            _access: AccessKind,
            path: &Path,
            _roots: &[PathBuf],
        ) -> Option<RuleHit> {
            let name = path.file_name()?.to_str()?;
            match name {
                ".env" => Some(RuleHit { effect: RuleEffect::Deny, rule: "deny .env".into() }),
                "ask.txt" => Some(RuleHit { effect: RuleEffect::Ask, rule: "ask it".into() }),
                _ => None,
            }
        }

        fn restricts(&self, _access: AccessKind) -> bool {
            true
        }
    }

    #[test]
    fn own_paths_cover_everything_beneath_them() {
        let access = Access::new(vec![PathBuf::from("/w/home/.config/toolgate")], None);
        let roots = [PathBuf::from("/w")];
        let check = |path: &str| access.check(AccessKind::Read, Path::new(path), None, &roots);
        assert_eq!(check("/w/home/.config/toolgate/tokens"), Err(Refusal::OwnFile));
        assert_eq!(check("/w/home/.config/toolgate"), Err(Refusal::OwnFile));
        assert_eq!(check("/w/home/.config/toolgatex"), Ok(()));
        assert_eq!(check("/w/home/.config"), Ok(()));
        // Spellings that are not plain, of the own path or of the path checked, are
        // compared by components: the same paths are covered.
        let access = Access::new(vec![PathBuf::from("/w/home//.config/./toolgate/")], None);
        let check = |path: &str| access.check(AccessKind::Read, Path::new(path), None, &roots);
        assert_eq!(check("/w/home/.config/toolgate/tokens"), Err(Refusal::OwnFile));
        assert_eq!(check("/w/home/.config//toolgate/tokens"), Err(Refusal::OwnFile));
        assert_eq!(check("/w/home/.config/toolgatex"), Ok(()));
    }

    #[test]
    fn ask_rules_refuse_only_a_path_nobody_was_asked_about() {
        let access = Access::new(Vec::new(), Some(Arc::new(DenyEnv)));
        let roots = [PathBuf::from("/w")];
        let real = Path::new("/w/ask.txt");
        assert_eq!(access.check(AccessKind::Read, real, Some(real), &roots), Ok(()));
        let link = Path::new("/w/link.txt");
        assert!(matches!(
            access.check(AccessKind::Read, real, Some(link), &roots),
            Err(Refusal::Rule(RuleHit { effect: RuleEffect::Ask, .. }))
        ));
        let env = Path::new("/w/.env");
        assert!(matches!(
            access.check(AccessKind::Read, env, Some(env), &roots),
            Err(Refusal::Rule(RuleHit { effect: RuleEffect::Deny, .. }))
        ));
    }

    #[test]
    fn replace_reaches_every_clone() {
        let access = Access::default();
        let session = access.clone();
        access.replace(&Access::new(vec![PathBuf::from("/state")], None));
        let roots = [PathBuf::from("/")];
        assert_eq!(
            session.check(AccessKind::Write, Path::new("/state/x"), None, &roots),
            Err(Refusal::OwnFile)
        );
    }

    #[test]
    fn a_walk_keeps_only_the_own_paths_it_can_reach() {
        let access = Access::new(vec![PathBuf::from("/a/own"), PathBuf::from("/b/own")], None);
        let walk = access.for_walk(Path::new("/a"), &[PathBuf::from("/a")]);
        assert!(!walk.is_open());
        assert!(walk.withholds(Path::new("/a/own/x")));
        assert!(!walk.withholds(Path::new("/a/other")));
        assert!(access.for_walk(Path::new("/c"), &[PathBuf::from("/c")]).is_open());
        assert!(!access.for_walk(Path::new("/a/own/deep"), &[]).is_open());
    }
}
