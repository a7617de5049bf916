//! Whether a connecting client is something this daemon started: a command, a hook,
//! an upstream server, or anything they started in turn.
//!
//! Such a process runs as the daemon's user, so the Unix socket's uid check admits it,
//! and Landlock (up to ABI 7) does not mediate `connect()` on a pathname socket nor
//! on loopback TCP with the network on. Were it admitted, a command could call tools
//! itself, widen its own sandbox and answer its own approval, or take over a person's
//! named session. So every face refuses such peers when they connect, by where they
//! come from, which a command cannot change:
//! - every process toolgate starts descends from the daemon (the supervisor spawner
//!   and each call's supervisor are its children, and a supervisor is a subreaper: a
//!   process that double-forks or calls `setsid` is still its descendant);
//! - where calls have cgroups, every process of a call is in one beneath the daemon's
//!   `toolgate` cgroup, even after its supervisor was killed from outside.
//!
//! On the Unix socket the peer is the process that connected (`SO_PEERCRED`); its
//! pidfd is taken first and checked alive after the look-up, so that the answer is
//! about that process and not one that took its pid. Over TCP the peer is found by its
//! socket: a loopback connection whose other end is held by one of the daemon's
//! descendants (or a process in a call's cgroup) is refused.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;

/// How many parents are followed at most (a loop in `/proc` cannot happen, but a
/// bound costs nothing).
const MAX_DEPTH: usize = 4096;

/// Whether the process `pid`, which just connected, was started by this daemon
/// (directly or not). A process that cannot be looked at (gone already, `/proc`
/// unreadable) counts as started by it: the connection is refused.
pub fn unix_peer_is_ours(pid: i32) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return true;
    };
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty());
    judge(pid.as_raw_nonzero().get(), pidfd)
}

/// [`unix_peer_is_ours`] with the peer's pidfd (or why there is none). Without
/// `pidfd_open` (kernels before 5.3, or an emulator that does not know the call), the
/// process's start time, read before and after the look-up, tells that its pid was not
/// handed to another meanwhile; any other failure refuses.
fn judge(pid: i32, pidfd: rustix::io::Result<std::os::fd::OwnedFd>) -> bool {
    let same_process: Box<dyn FnOnce() -> bool> = match pidfd {
        // The answer is about the process that connected only if it still lives: then
        // its pid was not handed to another meanwhile.
        Ok(pidfd) => Box::new(move || alive(&pidfd)),
        Err(rustix::io::Errno::NOSYS) => match start_time(pid) {
            Some(started) => Box::new(move || start_time(pid) == Some(started)),
            None => return true,
        },
        Err(_) => return true,
    };
    let ours = descends_from_daemon(pid) || in_a_call_cgroup(pid);
    ours || !same_process()
}

/// When the process `pid` started, in clock ticks since boot (`/proc/PID/stat`'s 22nd
/// field, counted after the command name, which may hold spaces and parentheses).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields 3 onwards; the start time is field 22.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process of `pidfd` has not exited (a pidfd turns readable when it
/// does).
fn alive(pidfd: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsFd;
    let mut fds = [nix::poll::PollFd::new(pidfd.as_fd(), nix::poll::PollFlags::POLLIN)];
    matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(0))
}

/// Whether `pid` has the daemon among its ancestors (the daemon itself, a client of
/// its own as in-process tests are, does not).
fn descends_from_daemon(pid: i32) -> bool {
    let own = std::process::id() as i32;
    let mut current = pid;
    for _ in 0..MAX_DEPTH {
        match parent_of(current) {
            Some(parent) if parent == own => return true,
            Some(parent) if parent > 0 => current = parent,
            _ => return false,
        }
    }
    true
}

/// The parent of `pid`, from `/proc/<pid>/stat` (the field after the state, the
/// command name being the one field that may hold spaces and parentheses).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` is in a call's cgroup of this daemon.
fn in_a_call_cgroup(pid: i32) -> bool {
    let Ok(cgroups) = super::CallCgroups::get() else {
        return false;
    };
    let Ok(membership) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    membership
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .is_some_and(|path| cgroups.is_call_member(Path::new(path)))
}

/// Whether the loopback TCP connection from `peer` to `local` was opened by a process
/// this daemon started: its end of the connection is held by a descendant of the
/// daemon or a process in a call's cgroup. A connection from elsewhere is never one.
pub fn tcp_peer_is_ours(local: SocketAddr, peer: SocketAddr) -> bool {
    // Only this machine's sockets are in its tables: a remote peer is never found.
    let Some(inode) = socket_inode(peer, local) else {
        return false;
    };
    let wanted = format!("socket:[{inode}]");
    descendants().into_iter().any(|pid| holds(pid, &wanted))
}

/// The inode of the TCP socket bound to `local` and connected to `remote`, from the
/// kernel's tables (`/proc/net/tcp` and `tcp6`): a client's IPv4 socket connected to
/// a listener on `[::]` is seen there with IPv4-mapped addresses, and is in `tcp`.
fn socket_inode(local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    let as_v4 = |address: SocketAddr| match address {
        SocketAddr::V6(v6) => {
            v6.ip().to_ipv4_mapped().map_or(address, |ip| SocketAddr::new(ip.into(), v6.port()))
        }
        v4 => v4,
    };
    let mut candidates = vec![(local, remote)];
    let mapped = (as_v4(local), as_v4(remote));
    if mapped != (local, remote) && mapped.0.is_ipv4() && mapped.1.is_ipv4() {
        candidates.push(mapped);
    }
    candidates.into_iter().find_map(|(local, remote)| {
        let table = if local.is_ipv4() { "/proc/net/tcp" } else { "/proc/net/tcp6" };
        let text = std::fs::read_to_string(table).ok()?;
        let (want_local, want_remote) = (hex_address(local), hex_address(remote));
        text.lines().skip(1).find_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, found_local, found_remote) = (fields.next(), fields.next()?, fields.next()?);
            (found_local == want_local && found_remote == want_remote)
                .then(|| fields.nth(6)?.parse().ok())
                .flatten()
        })
    })
}

/// An address as the kernel's TCP tables write it: the address's bytes as 32-bit
/// words in host order, in hex, then the port in hex.
fn hex_address(address: SocketAddr) -> String {
    let words: Vec<u8> = match address {
        SocketAddr::V4(v4) => v4.ip().octets().to_vec(),
        SocketAddr::V6(v6) => v6.ip().octets().to_vec(),
    };
    let mut out = String::new();
    for word in words.chunks(4) {
        let value = u32::from_ne_bytes([word[0], word[1], word[2], word[3]]);
        out.push_str(&format!("{value:08X}"));
    }
    out.push_str(&format!(":{:04X}", address.port()));
    out
}

/// Every process this daemon started that is still running: its descendants (every
/// thread's children, recursively), and the processes of its calls' cgroups.
fn descendants() -> Vec<i32> {
    let own = std::process::id() as i32;
    let mut seen: HashSet<i32> = HashSet::new();
    if Path::new(&format!("/proc/{own}/task/{own}/children")).exists() {
        let mut queue = vec![own];
        while let Some(pid) = queue.pop() {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
            for task in tasks.flatten() {
                let children =
                    std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                for child in children.split_whitespace().filter_map(|child| child.parse().ok()) {
                    if seen.insert(child) {
                        queue.push(child);
                    }
                }
            }
        }
    } else {
        // A kernel without the children files: every process's parent, from `/proc`.
        let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
        let pids: Vec<i32> =
            pids.filter_map(|entry| entry.file_name().to_str()?.parse().ok()).collect();
        seen.extend(pids.into_iter().filter(|&pid| pid != own && descends_from_daemon(pid)));
    }
    if let Ok(cgroups) = super::CallCgroups::get()
        && let Ok(calls) = std::fs::read_dir(cgroups.parent())
    {
        for call in calls.flatten() {
            let procs =
                std::fs::read_to_string(call.path().join("cgroup.procs")).unwrap_or_default();
            seen.extend(procs.split_whitespace().filter_map(|pid| pid.parse::<i32>().ok()));
        }
    }
    seen.into_iter().collect()
}

/// Whether `pid` holds a descriptor that is `wanted` (`socket:[inode]`).
fn holds(pid: i32, wanted: &str) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == wanted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_written_as_the_kernel_tables_write_them() {
        let v4: SocketAddr = "127.0.0.1:8080".parse().unwrap_or_else(|err| panic!("{err}"));
        let expected =
            if cfg!(target_endian = "little") { "0100007F:1F90" } else { "7F000001:1F90" };
        assert_eq!(hex_address(v4), expected);
        let v6: SocketAddr = "[::1]:443".parse().unwrap_or_else(|err| panic!("{err}"));
        let last = if cfg!(target_endian = "little") { "01000000" } else { "00000001" };
        assert_eq!(hex_address(v6), format!("000000000000000000000000{last}:01BB"));
    }

    #[test]
    fn this_process_and_its_children_are_ours_and_the_parent_is_not() {
        assert!(!descends_from_daemon(std::process::id() as i32));
        let parent = parent_of(std::process::id() as i32).unwrap_or_default();
        assert!(parent > 0);
        assert!(!descends_from_daemon(parent));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap_or_else(|err| panic!("{err}"));
        assert!(unix_peer_is_ours(child.id() as i32));
        assert!(descendants().contains(&(child.id() as i32)));
        // Without pidfd_open, judged the same by the start time.
        let without = || Err(rustix::io::Errno::NOSYS);
        assert!(judge(child.id() as i32, without()));
        assert!(!judge(parent, without()), "the parent refused without pidfd_open");
        assert!(judge(parent, Err(rustix::io::Errno::PERM)), "another failure admitted");
        let _ = child.kill();
        let _ = child.wait();
    }
}
