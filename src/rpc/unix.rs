//! The Unix domain socket transport: the editor plugins' way in.
//!
//! The socket lives in a 0700 directory and is itself 0600; on top of that every peer's
//! uid is checked (SO_PEERCRED) against the daemon's own, and others are refused and
//! logged. One socket speaks two framings, told apart by the first bytes a client sends:
//! an HTTP `GET` starts a WebSocket, anything else is newline-delimited JSON-RPC.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use super::ws;
use crate::daemon::Daemon;

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot create the socket directory {path}: {source}")]
    Directory { path: PathBuf, source: std::io::Error },
    #[error("the socket directory {0} is owned by another user")]
    ForeignDirectory(PathBuf),
    #[error("another toolgate is already listening on {0}")]
    InUse(PathBuf),
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

/// Creates the private directory and binds the socket (mode 0600). A stale socket file
/// left by a dead daemon is replaced; a live one is an error.
pub fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| SocketError::Directory { path: dir.to_path_buf(), source })?;
        let meta = std::fs::metadata(dir)
            .map_err(|source| SocketError::Directory { path: dir.to_path_buf(), source })?;
        if meta.uid() != rustix::process::geteuid().as_raw() {
            return Err(SocketError::ForeignDirectory(dir.to_path_buf()));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|source| SocketError::Directory { path: dir.to_path_buf(), source })?;
        }
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(SocketError::InUse(path.to_path_buf()));
        }
        let _ = std::fs::remove_file(path);
    }
    let listener = UnixListener::bind(path)
        .map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|source| SocketError::Bind { path: path.to_path_buf(), source })?;
    Ok(listener)
}

/// Accepts connections until shutdown. `max_connections` caps live connections (a
/// client past the cap waits in the kernel backlog).
pub async fn serve(
    daemon: Arc<Daemon>,
    listener: UnixListener,
    max_connections: usize,
    max_message_bytes: usize,
) {
    let limiter = Arc::new(Semaphore::new(max_connections.max(1)));
    let own_uid = rustix::process::geteuid().as_raw();
    let shutdown = daemon.shutdown_token().clone();
    loop {
        let permit = tokio::select! {
            permit = limiter.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
            () = shutdown.cancelled() => return,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return,
        };
        let (stream, _) = match accepted {
            Ok(pair) => pair,
            Err(err) => {
                // EMFILE and friends: log, breathe, and keep serving.
                tracing::warn!(%err, "accept failed on the unix socket");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let peer_uid = match stream.peer_cred() {
            Ok(cred) => cred.uid(),
            Err(err) => {
                tracing::warn!(%err, "cannot read the peer's credentials; connection refused");
                continue;
            }
        };
        if peer_uid != own_uid {
            tracing::warn!(peer_uid, "connection from another user refused");
            continue;
        }
        let daemon = daemon.clone();
        daemon.tasks().clone().spawn(async move {
            serve_stream(&daemon, stream, format!("uid:{peer_uid}"), max_message_bytes).await;
            drop(permit);
        });
    }
}

/// Serves one accepted stream, choosing the framing from its first bytes.
async fn serve_stream(daemon: &Arc<Daemon>, mut stream: UnixStream, identity: String, max: usize) {
    let mut first = [0u8; 4];
    let mut filled = 0;
    // Read just enough to tell `GET ` from JSON; a client that sends fewer bytes and
    // waits is an NDJSON client with a short first message.
    while filled < first.len() {
        match stream.read(&mut first[filled..]).await {
            Ok(0) => break,
            Ok(n) => {
                filled += n;
                if first[..filled]
                    .iter()
                    .any(|byte| *byte == b'{' || *byte == b'[' || *byte == b'\n')
                {
                    break;
                }
            }
            Err(_) => return,
        }
    }
    let prefix = first[..filled].to_vec();
    let stream = ws::Prefixed::new(prefix.clone(), stream);
    if prefix.starts_with(b"GET ") {
        ws::serve_upgrade(daemon, stream, identity, max).await;
    } else {
        let (reader, writer) = tokio::io::split(stream);
        super::serve_lines(daemon, identity, reader, writer, max).await;
    }
}
