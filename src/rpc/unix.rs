//! The Unix domain socket transport: the editor plugins' way in.
//!
//! The socket is 0600, by default in a 0700 directory that toolgate creates; on top
//! of that every peer's uid is checked (SO_PEERCRED) against the daemon's own, and
//! others are refused and logged. One socket speaks two framings, told apart by the
//! first bytes a client sends: an HTTP `GET` starts a WebSocket, anything else is
//! newline-delimited JSON-RPC.
//!
//! Binding never destroys what is at the path: only a stale socket (one nobody
//! listens on) is replaced; a regular file, a directory or a live socket stops the
//! start with an error. Only a directory toolgate creates is given a mode; an existing
//! one is used as it is (it must belong to the daemon's user or root, and not be open
//! to everyone's writes without the sticky bit). The bound socket file is removed when
//! the daemon stops or fails to start, unless another file has taken its place.
//!
//! Connections are admitted by [`crate::admission`]: a connection counts against
//! `max_connections` from its first message on; before that it is pending, and one
//! that sends nothing within [`FIRST_MESSAGE_DEADLINE`] (or is the oldest of a full
//! pending pool when another arrives) is closed, so idle connections cannot lock new
//! clients out. Past `max_connections`, a new client's first message is answered with
//! a "too many connections" error and the connection closed.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::ws;
use crate::admission::{Admission, Busy, Limits, Pools};
use crate::daemon::Daemon;

mod socket;

/// How long a new connection may take to send its first bytes by default. Editor
/// plugins and the CLI speak at once; a connection that stays silent this long is
/// not a client.
pub const FIRST_MESSAGE_DEADLINE: Duration = Duration::from_secs(30);

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot create the socket directory {path}: {source}")]
    Directory { path: PathBuf, source: std::io::Error },
    #[error("the socket directory {0} is owned by another user")]
    ForeignDirectory(PathBuf),
    #[error(
        "the socket directory {path} can be written by every user without the sticky bit \
         (mode {mode:04o}): another user could replace the socket; choose another directory"
    )]
    OpenDirectory { path: PathBuf, mode: u32 },
    #[error("another toolgate is already listening on {0}")]
    InUse(PathBuf),
    #[error(
        "{0} exists and is not a socket; refusing to replace it (choose another --socket path)"
    )]
    NotASocket(PathBuf),
    #[error("cannot tell whether the socket {path} is still in use: {source}")]
    Unknown { path: PathBuf, source: std::io::Error },
    #[error("cannot listen on {path}: {source}")]
    Bind { path: PathBuf, source: std::io::Error },
}

/// The default socket path: `$XDG_RUNTIME_DIR/toolgate/toolgate.sock`, or a per-user
/// directory under the temp dir when the runtime dir is unset.
pub fn default_socket_path() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("toolgate").join("toolgate.sock"),
        None => std::env::temp_dir()
            .join(format!("toolgate-{}", rustix::process::geteuid().as_raw()))
            .join("toolgate.sock"),
    }
}

/// Makes sure the socket's directory exists: created 0700 when missing, else checked
/// and left as it is.
fn prepare_directory(dir: &Path) -> Result<(), SocketError> {
    let directory_error = |source| SocketError::Directory { path: dir.to_path_buf(), source };
    match std::fs::metadata(dir) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            // Every directory created here is toolgate's own: 0700.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(directory_error)?;
            Ok(())
        }
        Err(err) => Err(directory_error(err)),
        Ok(meta) => {
            if !meta.is_dir() {
                return Err(directory_error(std::io::Error::from(
                    std::io::ErrorKind::NotADirectory,
                )));
            }
            let own = rustix::process::geteuid().as_raw();
            if meta.uid() != own && meta.uid() != 0 {
                return Err(SocketError::ForeignDirectory(dir.to_path_buf()));
            }
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o002 != 0 && mode & 0o1000 == 0 {
                return Err(SocketError::OpenDirectory { path: dir.to_path_buf(), mode });
            }
            Ok(())
        }
    }
}

/// Binds the socket (mode 0600), creating its directory if needed (see the module
/// docs: nothing but a stale socket is ever replaced).
pub fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        prepare_directory(dir)?;
    }
    match std::fs::symlink_metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(SocketError::Bind { path: path.to_path_buf(), source }),
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(SocketError::NotASocket(path.to_path_buf()));
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => return Err(SocketError::InUse(path.to_path_buf())),
            // Nobody listens: a socket left by a daemon that died.
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => {
                        return Err(SocketError::Bind { path: path.to_path_buf(), source });
                    }
                }
            }
            Err(source) => return Err(SocketError::Unknown { path: path.to_path_buf(), source }),
        },
    }
    let listener = UnixListener::bind(path)
        .map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })?;
    Ok(listener)
}

/// The socket file a daemon bound, removed when this is dropped (the daemon stopped,
/// or failed to start after binding), unless another file has taken its place.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    identity: Option<(u64, u64)>,
}

impl SocketFile {
    /// Remembers the socket file now at `path` (just bound).
    pub fn bound_at(path: &Path) -> SocketFile {
        let identity = std::fs::symlink_metadata(path).ok().map(|meta| (meta.dev(), meta.ino()));
        SocketFile { path: path.to_path_buf(), identity }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let Ok(meta) = std::fs::symlink_metadata(&self.path) else { return };
        if meta.file_type().is_socket() && self.identity == Some((meta.dev(), meta.ino())) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds like [`bind`] and returns the file's guard with the listener.
pub fn bind_file(path: &Path) -> Result<(UnixListener, SocketFile), SocketError> {
    let listener = bind(path)?;
    Ok((listener, SocketFile::bound_at(path)))
}

/// Accepts connections until shutdown, with `max_connections` connections served at
/// once and the default first-message deadline.
pub async fn serve(
    daemon: Arc<Daemon>,
    listener: UnixListener,
    max_connections: usize,
    max_message_bytes: usize,
) {
    let mut limits = Limits::new(max_connections);
    limits.auth_deadline = FIRST_MESSAGE_DEADLINE;
    serve_with_limits(daemon, listener, limits, max_message_bytes).await;
}

/// Accepts connections until shutdown under `limits` (`auth_deadline` is the time a
/// connection gets to send its first bytes; `header_timeout` is not used here).
pub async fn serve_with_limits(
    daemon: Arc<Daemon>,
    listener: UnixListener,
    limits: Limits,
    max_message_bytes: usize,
) {
    let pools = Pools::new(&limits);
    let own_uid = rustix::process::geteuid().as_raw();
    let shutdown = daemon.shutdown_token().clone();
    loop {
        // A descriptor for the connection first: `accept` must not be what runs out.
        let accepted = tokio::select! {
            accepted = async {
                pools.descriptors().room().await;
                listener.accept().await
            } => accepted,
            () = shutdown.cancelled() => return,
        };
        let (stream, _) = match accepted {
            Ok(pair) => pair,
            Err(err) => {
                tracing::warn!(%err, "accept failed on the unix socket");
                crate::admission::accept_failed(&pools, &err).await;
                continue;
            }
        };
        let (peer_uid, peer_pid) = match stream.peer_cred() {
            Ok(cred) => (cred.uid(), cred.pid()),
            Err(err) => {
                tracing::warn!(%err, "cannot read the peer's credentials; connection refused");
                continue;
            }
        };
        if peer_uid != own_uid {
            tracing::warn!(peer_uid, "connection from another user refused");
            continue;
        }
        // Something this daemon started (a command, a hook, an upstream server) runs
        // as its user too, and is never a client of it.
        if peer_pid.is_none_or(crate::sandbox::peers::unix_peer_is_ours) {
            tracing::warn!(
                peer_pid,
                "connection from a process this daemon started (a command, a hook or a \
                 server) refused"
            );
            continue;
        }
        let admission = pools.admit();
        let daemon = daemon.clone();
        let deadline = limits.auth_deadline;
        daemon.tasks().clone().spawn(async move {
            let identity = format!("uid:{peer_uid}");
            serve_stream(&daemon, stream, identity, max_message_bytes, admission, deadline).await;
        });
    }
}

/// Reads just enough to tell `GET ` from JSON; a client that sends fewer bytes and
/// waits is an NDJSON client with a short first message. Empty at end of input.
async fn first_bytes(stream: &mut UnixStream) -> std::io::Result<Vec<u8>> {
    let mut first = [0u8; 4];
    let mut filled = 0;
    while filled < first.len() {
        let n = stream.read(&mut first[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
        if first[..filled].iter().any(|byte| *byte == b'{' || *byte == b'[' || *byte == b'\n') {
            break;
        }
    }
    Ok(first[..filled].to_vec())
}

/// Serves one accepted stream, choosing the framing from its first bytes.
async fn serve_stream(
    daemon: &Arc<Daemon>,
    mut stream: UnixStream,
    identity: String,
    max: usize,
    admission: Admission,
    deadline: Duration,
) {
    let prefix = tokio::select! {
        read = first_bytes(&mut stream) => match read {
            Ok(prefix) if !prefix.is_empty() => prefix,
            _ => return,
        },
        () = admission.expired(deadline) => {
            tracing::debug!("unix connection closed before its first message");
            return;
        }
    };
    // Held for as long as the connection is served.
    let _slot = match admission.promote() {
        Ok(slot) => slot,
        Err(busy) => {
            refuse(stream, &prefix, busy).await;
            return;
        }
    };
    if prefix.starts_with(b"GET ") {
        let stream = ws::Prefixed::new(prefix.clone(), stream);
        ws::serve_upgrade(daemon, stream, identity, max).await;
    } else {
        let (reader, writer) = socket::halves(stream);
        let reader = ws::Prefixed::new(prefix, reader);
        super::serve_lines(daemon, identity, reader, writer, max).await;
    }
}

/// Tells a client past the cap why it is closed, in its own framing.
async fn refuse(mut stream: UnixStream, prefix: &[u8], busy: Busy) {
    tracing::debug!(%busy, "unix connection past the cap refused");
    let answer = if prefix.starts_with(b"GET ") {
        "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nConnection: close\r\n\
         Content-Length: 0\r\n\r\n"
            .to_owned()
    } else {
        let error = super::jsonrpc::RpcError::new(
            super::jsonrpc::SERVER_BUSY,
            "too many connections; try again when another client has gone",
        );
        let mut line = super::jsonrpc::error_response(&serde_json::Value::Null, &error);
        line.push('\n');
        line
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(answer.as_bytes())).await;
}
