//! The crate's only `unsafe` code: two calls into the operating system that the
//! standard library and the safe crates leave to the caller. Each says why it is
//! sound; everywhere else `unsafe_code` is denied.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes `command`'s child run `enter` after `fork`, right before `exec`.
///
/// Only for a caller that forks while single-threaded (the per-call supervisor,
/// which starts its helper threads after the command is spawned), with an `enter`
/// that makes system calls on data prepared before the fork and touches nothing
/// shared with the parent: the sandbox's Landlock and seccomp entry.
pub(crate) fn before_exec<F>(command: &mut Command, enter: F)
where
    F: FnMut() -> std::io::Result<()> + Send + Sync + 'static,
{
    // SAFETY: `pre_exec` runs `enter` in the forked child before `exec`. The one
    // caller (`sandbox::confine::install`) forks from a single-threaded process, so no
    // lock or allocator state can be held by another thread; `enter` makes only the
    // `landlock_restrict_self`, `prctl` and `seccomp` system calls on data prepared
    // before the fork, and it touches nothing shared with the parent.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(enter);
    }
}

/// Hands every free page of glibc's arenas back to the system (`malloc_trim`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn trim_heap() {
    // SAFETY: `malloc_trim` takes no pointers and only walks glibc's own arenas under
    // their locks; it is safe to call from any thread at any time.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Nothing to hand back outside glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn trim_heap() {}
