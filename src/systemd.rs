//! Running under systemd: readiness, reload and stop notifications, the watchdog, and
//! listening sockets inherited through socket activation.
//!
//! Every function here is a no-op when the process was not started by systemd
//! (`NOTIFY_SOCKET`, `WATCHDOG_USEC` or `LISTEN_FDS` unset), so the daemon calls them
//! unconditionally. The parsing of the environment protocol is split into pure
//! functions ([`Notifier::from_socket_var`], [`parse_watchdog`], [`parse_listen_env`])
//! so that it can be tested without touching the process environment.
//!
//! The unit files in `systemd/` use `Type=notify` (READY=1 once every listener is
//! bound), `WatchdogSec=` and a `.socket` unit whose sockets are named with
//! `FileDescriptorName=` ([`FD_NAME_NATIVE`], [`FD_NAME_TCP`], [`FD_NAME_MCP_HTTP`]).
//! The variables describing this process are never passed on to commands: the
//! configuration's environment policy excludes them (see `Config::env_policy`).

use std::ffi::OsString;
use std::io;
use std::net::TcpListener;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::{SocketAddr as UnixSocketAddr, UnixDatagram, UnixListener};
use std::path::PathBuf;
use std::time::Duration;

pub use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

/// `FileDescriptorName=` of the native protocol's Unix socket.
pub const FD_NAME_NATIVE: &str = "native";
/// `FileDescriptorName=` of the native HTTP + WebSocket TCP socket.
pub const FD_NAME_TCP: &str = "tcp";
/// `FileDescriptorName=` of the MCP Streamable HTTP TCP socket.
pub const FD_NAME_MCP_HTTP: &str = "mcp_http";

/// The name systemd's own library gives descriptors when `LISTEN_FDNAMES` is absent.
const UNNAMED_FD: &str = "unknown";

/// Upper bound on a notification send. The service manager reads its socket promptly;
/// if it does not, the daemon must not hang on it (the watchdog would then fire, which
/// is the right outcome), so a send gives up after this long.
const NOTIFY_SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// More descriptors than any unit of ours passes; a larger `LISTEN_FDS` is a broken
/// environment, not a request to adopt thousands of descriptors.
const MAX_LISTEN_FDS: u32 = 64;

/// What went wrong with the service manager's environment or inherited sockets.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("invalid {var}={value:?}: {reason}")]
    InvalidEnv { var: &'static str, value: String, reason: String },
    #[error(
        "inherited descriptor #{index} ({name}) is not a listening Unix or TCP stream socket: {source}"
    )]
    NotAListener {
        index: usize,
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("inherited descriptor #{index} ({name}) cannot be made non-blocking: {source}")]
    Nonblocking {
        index: usize,
        name: String,
        #[source]
        source: io::Error,
    },
}

// ---------------------------------------------------------------------------------
// Notifications.

/// Where `NOTIFY_SOCKET` points.
#[derive(Clone, Debug, PartialEq, Eq)]
enum NotifyTarget {
    Path(PathBuf),
    /// An abstract socket (`@name` in the variable).
    Abstract(Vec<u8>),
}

/// Sends state changes to the service manager's notification socket; a disabled
/// notifier (not started by systemd) accepts every call and sends nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notifier {
    target: Option<NotifyTarget>,
}

impl Notifier {
    /// The notifier the process environment describes.
    pub fn from_env() -> Notifier {
        Notifier::from_socket_var(std::env::var_os("NOTIFY_SOCKET"))
    }

    /// A notifier for a `NOTIFY_SOCKET` value: an absolute path, or `@name` for an
    /// abstract socket. Anything else (unset, empty, relative, or a transport this
    /// build does not speak such as `vsock:`) disables notifications.
    pub fn from_socket_var(value: Option<OsString>) -> Notifier {
        let target = value.and_then(|value| {
            let bytes = value.as_bytes();
            match bytes.first() {
                Some(b'/') => Some(NotifyTarget::Path(PathBuf::from(value))),
                Some(b'@') if bytes.len() > 1 => Some(NotifyTarget::Abstract(bytes[1..].to_vec())),
                Some(_) => {
                    tracing::warn!(
                        "NOTIFY_SOCKET={} is not a socket path; systemd notifications are off",
                        value.to_string_lossy()
                    );
                    None
                }
                None => None,
            }
        });
        Notifier { target }
    }

    pub fn disabled() -> Notifier {
        Notifier { target: None }
    }

    pub fn is_enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends one datagram with every state, one per line.
    pub fn notify(&self, states: &[NotifyState<'_>]) -> io::Result<()> {
        let Some(target) = &self.target else {
            return Ok(());
        };
        let message: String = states.iter().map(|state| format!("{state}\n")).collect();
        let socket = UnixDatagram::unbound()?;
        socket.set_write_timeout(Some(NOTIFY_SEND_TIMEOUT))?;
        match target {
            NotifyTarget::Path(path) => socket.connect(path)?,
            NotifyTarget::Abstract(name) => {
                socket.connect_addr(&abstract_addr(name)?)?;
            }
        }
        let sent = socket.send(message.as_bytes())?;
        if sent != message.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "notification truncated"));
        }
        Ok(())
    }

    /// `READY=1`: every listener is bound and requests are served.
    pub fn ready(&self) -> io::Result<()> {
        self.notify(&[NotifyState::Ready])
    }

    /// `RELOADING=1` with `MONOTONIC_USEC`, which systemd 253+ requires with it. Send
    /// [`Notifier::ready`] once the new configuration is in effect.
    pub fn reloading(&self) -> io::Result<()> {
        if !self.is_enabled() {
            return Ok(());
        }
        self.notify(&[NotifyState::Reloading, NotifyState::monotonic_usec_now()?])
    }

    /// `STOPPING=1`: shutdown has begun.
    pub fn stopping(&self) -> io::Result<()> {
        self.notify(&[NotifyState::Stopping])
    }

    /// `WATCHDOG=1`: the daemon is alive.
    pub fn watchdog(&self) -> io::Result<()> {
        self.notify(&[NotifyState::Watchdog])
    }

    /// `STATUS=...`: a one-line status `systemctl status` shows.
    pub fn status(&self, text: &str) -> io::Result<()> {
        self.notify(&[NotifyState::Status(text)])
    }
}

#[cfg(target_os = "linux")]
fn abstract_addr(name: &[u8]) -> io::Result<UnixSocketAddr> {
    use std::os::linux::net::SocketAddrExt as _;
    UnixSocketAddr::from_abstract_name(name)
}

#[cfg(not(target_os = "linux"))]
fn abstract_addr(_name: &[u8]) -> io::Result<UnixSocketAddr> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "abstract sockets exist only on Linux"))
}

/// Tells systemd the daemon is ready (no-op outside systemd).
pub fn notify_ready() -> io::Result<()> {
    Notifier::from_env().ready()
}

/// Tells systemd the configuration is being reloaded; follow with [`notify_ready`].
pub fn notify_reloading() -> io::Result<()> {
    Notifier::from_env().reloading()
}

/// Tells systemd the daemon is stopping.
pub fn notify_stopping() -> io::Result<()> {
    Notifier::from_env().stopping()
}

// ---------------------------------------------------------------------------------
// Watchdog.

/// The watchdog interval systemd expects pings within, from `WATCHDOG_USEC` and
/// `WATCHDOG_PID`; `None` when there is no watchdog for this process.
pub fn watchdog_interval() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    parse_watchdog(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// The watchdog protocol: `WATCHDOG_USEC` is a positive number of microseconds, and
/// applies to this process unless `WATCHDOG_PID` names another one. Malformed values
/// mean no watchdog, as in systemd's own `sd_watchdog_enabled`.
pub fn parse_watchdog(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|usec| *usec > 0)?;
    if let Some(pid) = pid.filter(|pid| !pid.is_empty())
        && pid.trim().parse::<u32>().ok()? != own_pid
    {
        return None;
    }
    Some(Duration::from_micros(usec))
}

/// Starts pinging the watchdog if systemd asked for it; the task ends when `cancel`
/// fires. The caller owns the handle and awaits it at shutdown.
pub fn spawn_watchdog(cancel: CancellationToken) -> Option<tokio::task::JoinHandle<()>> {
    let interval = watchdog_interval()?;
    let notifier = Notifier::from_env();
    if !notifier.is_enabled() {
        return None;
    }
    Some(tokio::spawn(run_watchdog(notifier, interval, cancel)))
}

/// Sends `WATCHDOG=1` every half `interval` (systemd's advice, leaving room for a late
/// tick) until `cancel` fires. Pinging from a runtime task means a wedged runtime stops
/// the pings and systemd restarts the daemon.
pub async fn run_watchdog(notifier: Notifier, interval: Duration, cancel: CancellationToken) {
    let period = (interval / 2).max(Duration::from_millis(1));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = ticker.tick() => {
                if let Err(err) = notifier.watchdog() {
                    tracing::warn!("watchdog ping failed: {err}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Socket activation.

/// A listening socket inherited from the service manager, non-blocking, close-on-exec.
#[derive(Debug)]
pub enum Inherited {
    Unix { name: String, listener: UnixListener },
    Tcp { name: String, listener: TcpListener },
}

impl Inherited {
    /// The socket's `FileDescriptorName=` (`"unknown"` when systemd gave none).
    pub fn name(&self) -> &str {
        match self {
            Inherited::Unix { name, .. } | Inherited::Tcp { name, .. } => name,
        }
    }
}

/// Takes the listening sockets systemd passed (socket activation), in order.
///
/// Afterwards `LISTEN_FDS` and `LISTEN_PID` are removed from the environment (by the
/// `listenfd` crate), so a child could not adopt the descriptors even if it saw them.
/// Changing the environment is only sound while the process has a single thread:
/// **call this in `main` before the async runtime starts.** `LISTEN_FDNAMES` stays
/// (this crate cannot remove variables without `unsafe`); it is meaningless without
/// the other two and is kept from commands by the environment policy.
pub fn inherited_listeners() -> Result<Vec<Inherited>, SystemdError> {
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    let names = std::env::var("LISTEN_FDNAMES").ok();
    let parsed =
        parse_listen_env(pid.as_deref(), fds.as_deref(), names.as_deref(), std::process::id());
    // Always let listenfd consume (and unset) the variables, even if they are broken.
    let mut fds = listenfd::ListenFd::from_env();
    let names = parsed?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    if fds.len() != names.len() {
        return Err(SystemdError::InvalidEnv {
            var: "LISTEN_FDS",
            value: fds.len().to_string(),
            reason: format!("{} descriptors named in LISTEN_FDNAMES", names.len()),
        });
    }
    let mut listeners = Vec::with_capacity(names.len());
    for (index, name) in names.into_iter().enumerate() {
        let inherited = match fds.take_unix_listener(index) {
            Ok(Some(listener)) => Inherited::Unix { name, listener },
            Ok(None) => continue,
            Err(_) => match fds.take_tcp_listener(index) {
                Ok(Some(listener)) => Inherited::Tcp { name, listener },
                Ok(None) => continue,
                Err(source) => return Err(SystemdError::NotAListener { index, name, source }),
            },
        };
        let nonblocking = match &inherited {
            Inherited::Unix { listener, .. } => listener.set_nonblocking(true),
            Inherited::Tcp { listener, .. } => listener.set_nonblocking(true),
        };
        if let Err(source) = nonblocking {
            let name = inherited.name().to_owned();
            return Err(SystemdError::Nonblocking { index, name, source });
        }
        listeners.push(inherited);
    }
    Ok(listeners)
}

/// The socket-activation protocol: the names of the descriptors (starting at fd 3)
/// passed to this process, one per descriptor. No descriptors when `LISTEN_FDS` is
/// unset or `LISTEN_PID` names another process; a missing `LISTEN_PID` is accepted,
/// as `listenfd` does (tools that proxy activation, such as `systemfd`, omit it).
/// Without `LISTEN_FDNAMES` every descriptor is named `"unknown"`.
pub fn parse_listen_env(
    pid: Option<&str>,
    fds: Option<&str>,
    names: Option<&str>,
    own_pid: u32,
) -> Result<Vec<String>, SystemdError> {
    let Some(fds) = fds else {
        return Ok(Vec::new());
    };
    if let Some(pid) = pid.filter(|pid| !pid.is_empty()) {
        let parsed: u32 = pid.trim().parse().map_err(|_| SystemdError::InvalidEnv {
            var: "LISTEN_PID",
            value: pid.to_owned(),
            reason: "not a process id".to_owned(),
        })?;
        if parsed != own_pid {
            return Ok(Vec::new());
        }
    }
    let count: u32 = fds.trim().parse().map_err(|_| SystemdError::InvalidEnv {
        var: "LISTEN_FDS",
        value: fds.to_owned(),
        reason: "not a number".to_owned(),
    })?;
    if count > MAX_LISTEN_FDS {
        return Err(SystemdError::InvalidEnv {
            var: "LISTEN_FDS",
            value: fds.to_owned(),
            reason: format!("more than {MAX_LISTEN_FDS} descriptors"),
        });
    }
    let count = count as usize;
    let names: Vec<String> = match names {
        None => vec![UNNAMED_FD.to_owned(); count],
        Some(_) if count == 0 => Vec::new(),
        Some(list) => list.split(':').map(str::to_owned).collect(),
    };
    if names.len() != count {
        return Err(SystemdError::InvalidEnv {
            var: "LISTEN_FDNAMES",
            value: names.join(":"),
            reason: format!("{} names for {count} descriptors", names.len()),
        });
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStringExt as _;

    use super::*;

    /// Generous: only reached when something is broken.
    const SAFETY_TIMEOUT: Duration = Duration::from_secs(30);

    fn receiver() -> (tempfile::TempDir, UnixDatagram, Notifier) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket.set_read_timeout(Some(SAFETY_TIMEOUT)).unwrap();
        let notifier = Notifier::from_socket_var(Some(path.into_os_string()));
        assert!(notifier.is_enabled());
        (dir, socket, notifier)
    }

    fn recv(socket: &UnixDatagram) -> String {
        let mut buf = vec![0u8; 4096];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn ready_stopping_and_status_arrive_as_datagrams() {
        let (_dir, socket, notifier) = receiver();
        notifier.ready().unwrap();
        assert_eq!(recv(&socket), "READY=1\n");
        notifier.status("serving 2 sessions").unwrap();
        assert_eq!(recv(&socket), "STATUS=serving 2 sessions\n");
        notifier.stopping().unwrap();
        assert_eq!(recv(&socket), "STOPPING=1\n");
        notifier.watchdog().unwrap();
        assert_eq!(recv(&socket), "WATCHDOG=1\n");
    }

    #[test]
    fn reloading_carries_the_monotonic_clock() {
        let (_dir, socket, notifier) = receiver();
        notifier.reloading().unwrap();
        let message = recv(&socket);
        let lines: Vec<&str> = message.lines().collect();
        assert_eq!(lines.len(), 2, "{message:?}");
        assert_eq!(lines[0], "RELOADING=1");
        let usec: u64 = lines[1].strip_prefix("MONOTONIC_USEC=").unwrap().parse().unwrap();
        assert!(usec > 0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn abstract_sockets_are_supported() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("toolgate-test-{}-{:?}", std::process::id(), std::time::Instant::now());
        let addr = UnixSocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        socket.set_read_timeout(Some(SAFETY_TIMEOUT)).unwrap();
        let notifier = Notifier::from_socket_var(Some(OsString::from(format!("@{name}"))));
        notifier.ready().unwrap();
        assert_eq!(recv(&socket), "READY=1\n");
    }

    #[test]
    fn without_a_socket_every_notification_is_a_no_op() {
        let values = [None, Some(""), Some("relative/notify"), Some("vsock:2:1234"), Some("@")];
        for value in values {
            let notifier = Notifier::from_socket_var(value.map(OsString::from));
            assert!(!notifier.is_enabled(), "{value:?}");
            notifier.ready().unwrap();
            notifier.reloading().unwrap();
            notifier.stopping().unwrap();
            notifier.watchdog().unwrap();
        }
        let non_utf8 = OsString::from_vec(vec![b'/', 0xff, b'x']);
        assert!(Notifier::from_socket_var(Some(non_utf8)).is_enabled());
    }

    #[test]
    fn a_vanished_socket_is_an_error_not_a_hang() {
        let (dir, socket, notifier) = receiver();
        drop(socket);
        std::fs::remove_file(dir.path().join("notify.sock")).unwrap();
        assert!(notifier.ready().is_err());
    }

    #[tokio::test]
    async fn the_watchdog_pings_until_canceled() {
        let (_dir, socket, notifier) = receiver();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run_watchdog(notifier, Duration::from_millis(20), cancel.clone()));
        let pings = tokio::task::spawn_blocking(move || {
            let pings: Vec<String> = (0..3).map(|_| recv(&socket)).collect();
            (pings, socket)
        })
        .await
        .unwrap();
        assert_eq!(pings.0, ["WATCHDOG=1\n"; 3]);
        cancel.cancel();
        tokio::time::timeout(SAFETY_TIMEOUT, task).await.unwrap().unwrap();
    }

    #[test]
    fn watchdog_environment_parsing() {
        let usec = Some("30000000");
        assert_eq!(parse_watchdog(usec, None, 7), Some(Duration::from_secs(30)));
        assert_eq!(parse_watchdog(usec, Some("7"), 7), Some(Duration::from_secs(30)));
        assert_eq!(parse_watchdog(usec, Some(""), 7), Some(Duration::from_secs(30)));
        assert_eq!(parse_watchdog(usec, Some("8"), 7), None);
        assert_eq!(parse_watchdog(usec, Some("x"), 7), None);
        assert_eq!(parse_watchdog(None, Some("7"), 7), None);
        assert_eq!(parse_watchdog(Some("0"), None, 7), None);
        assert_eq!(parse_watchdog(Some("-5"), None, 7), None);
        assert_eq!(parse_watchdog(Some("soon"), None, 7), None);
    }

    #[test]
    fn listen_environment_parsing() {
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let ok = |pid, fds, fdnames| parse_listen_env(pid, fds, fdnames, 42).unwrap();
        assert_eq!(ok(None, None, None), names(&[]));
        assert_eq!(ok(Some("42"), None, Some("native")), names(&[]));
        assert_eq!(ok(Some("42"), Some("1"), Some("native")), names(&["native"]));
        assert_eq!(
            ok(Some("42"), Some("3"), Some("native:tcp:mcp_http")),
            names(&["native", "tcp", "mcp_http"])
        );
        assert_eq!(ok(Some("42"), Some("2"), None), names(&["unknown", "unknown"]));
        assert_eq!(ok(None, Some("1"), Some("native")), names(&["native"]));
        assert_eq!(ok(Some("41"), Some("1"), Some("native")), names(&[]));
        assert_eq!(ok(Some("42"), Some("0"), Some("")), names(&[]));
        assert_eq!(ok(Some("42"), Some("2"), Some("a:")), names(&["a", ""]));

        let err =
            |pid, fds, fdnames| parse_listen_env(pid, fds, fdnames, 42).unwrap_err().to_string();
        assert_eq!(
            err(Some("me"), Some("1"), None),
            r#"invalid LISTEN_PID="me": not a process id"#
        );
        assert_eq!(err(Some("42"), Some("one"), None), r#"invalid LISTEN_FDS="one": not a number"#);
        assert_eq!(
            err(Some("42"), Some("2"), Some("native")),
            r#"invalid LISTEN_FDNAMES="native": 1 names for 2 descriptors"#
        );
        assert_eq!(
            err(Some("42"), Some("100000"), None),
            r#"invalid LISTEN_FDS="100000": more than 64 descriptors"#
        );
    }

    #[test]
    fn no_activation_means_no_listeners() {
        // The test process is not socket-activated (tests/systemd_activation.rs covers
        // a process that is).
        assert!(inherited_listeners().unwrap().is_empty());
    }
}
