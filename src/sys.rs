//! The crate's only `unsafe` code: calls into the operating system and the C library
//! that the standard library and the safe crates leave to the caller. Each says why
//! it is sound; everywhere else `unsafe_code` is denied.

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

/// Makes glibc's allocator give large blocks back when they are freed: a block of
/// 1 MiB or more gets a mapping of its own (unmapped when freed), and a heap gives
/// back a free top past 4 MiB. glibc otherwise raises both thresholds after the first
/// large free, and a thread's arena then keeps a freed large request for good
/// (`malloc_trim` does not reach the top of a thread's arena). Called once, first
/// thing in `main`, before any other thread exists.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn give_large_blocks_back() {
    // SAFETY: `mallopt` takes two integers and only sets parameters of glibc's
    // allocator; it is called before any other thread exists, so no allocation runs
    // concurrently with the change.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 4 << 20);
    }
}

/// Nothing to set outside glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn give_large_blocks_back() {}

/// Nothing to hand back outside glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn trim_heap() {}
