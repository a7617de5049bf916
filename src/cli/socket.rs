//! Which socket the client commands connect to when none is given.

use std::path::{Path, PathBuf};

use tokio::net::UnixStream;

use super::ClientError;

/// Where the client looks for a daemon, in order: the configured (per-user) socket,
/// then the system one.
pub fn socket_candidates(configured: PathBuf, system: &Path) -> Vec<PathBuf> {
    let mut candidates = vec![configured];
    if !candidates.iter().any(|path| path == system) {
        candidates.push(system.to_path_buf());
    }
    candidates
}

/// Connects to the first candidate a daemon listens on. A candidate with nothing
/// behind it (no file, or a stale socket) passes to the next; any other failure (a
/// permission error, say) is the answer. When none listens, the error names the first.
pub async fn connect_first(candidates: Vec<PathBuf>) -> Result<UnixStream, ClientError> {
    let mut first_error = None;
    for path in candidates {
        match UnixStream::connect(&path).await {
            Ok(stream) => return Ok(stream),
            Err(error) => {
                let absent = matches!(
                    error.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                );
                let error = ClientError::Connect { path, error };
                if !absent {
                    return Err(error);
                }
                first_error.get_or_insert(error);
            }
        }
    }
    Err(first_error.unwrap_or(ClientError::Closed))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test fixtures fail loudly")]

    use tokio::net::UnixListener;

    use super::*;

    #[test]
    fn the_configured_socket_comes_before_the_system_one() {
        let system = Path::new("/run/toolgate/toolgate.sock");
        assert_eq!(
            socket_candidates(PathBuf::from("/run/user/1000/toolgate/toolgate.sock"), system),
            vec![
                PathBuf::from("/run/user/1000/toolgate/toolgate.sock"),
                PathBuf::from("/run/toolgate/toolgate.sock")
            ]
        );
        assert_eq!(socket_candidates(system.to_path_buf(), system), vec![system.to_path_buf()]);
    }

    /// Accepts one connection and returns which listener took it.
    async fn who_answers(user: &Path, system: &Path) -> Result<PathBuf, ClientError> {
        let stream = connect_first(socket_candidates(user.to_path_buf(), system)).await?;
        Ok(stream.peer_addr().unwrap().as_pathname().unwrap().to_path_buf())
    }

    #[tokio::test]
    async fn the_system_socket_answers_when_no_user_daemon_runs() {
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("user.sock");
        let system = dir.path().join("system.sock");

        // Nobody listens anywhere: the error names the user's socket.
        match who_answers(&user, &system).await {
            Err(ClientError::Connect { path, .. }) => assert_eq!(path, user),
            other => panic!("expected a connect error, got {other:?}"),
        }

        let _system_listener = UnixListener::bind(&system).unwrap();
        assert_eq!(who_answers(&user, &system).await.unwrap(), system);

        // A stale user socket (bound, then its daemon gone) is passed over too.
        drop(UnixListener::bind(&user).unwrap());
        assert!(user.exists());
        assert_eq!(who_answers(&user, &system).await.unwrap(), system);

        // A user daemon wins.
        std::fs::remove_file(&user).unwrap();
        let _user_listener = UnixListener::bind(&user).unwrap();
        assert_eq!(who_answers(&user, &system).await.unwrap(), user);
    }
}
