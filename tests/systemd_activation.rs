//! Socket activation and readiness through the real environment protocol.
//!
//! The test re-runs its own binary under `systemd-socket-activate`, which binds the
//! sockets, waits for a first connection, then executes the command with `LISTEN_FDS`,
//! `LISTEN_PID` and `LISTEN_FDNAMES` set and the sockets at fd 3 onwards, exactly as
//! systemd does for a `.socket` unit. In that child, [`ACTIVATED_VAR`] is set and the
//! same test plays the activated daemon.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;
use toolgate::systemd::{self, Inherited};

/// Set in the re-run child.
const ACTIVATED_VAR: &str = "TOOLGATE_TEST_ACTIVATED";

/// Generous: only reached when something is broken.
const SAFETY_TIMEOUT: Duration = Duration::from_secs(60);

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/bin".into(), "/bin".into()])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

#[test]
fn an_activated_process_adopts_its_named_listeners() {
    if std::env::var_os(ACTIVATED_VAR).is_some() {
        return activated_child().unwrap();
    }
    let activate = find_program("systemd-socket-activate").unwrap_or_else(|| {
        panic!("systemd-socket-activate not found: install the `systemd` package (apt-get install -y systemd)")
    });
    let dir = tempfile::tempdir().unwrap();
    let native = dir.path().join("native.sock");
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(SAFETY_TIMEOUT)).unwrap();

    // systemd-socket-activate cannot bind port 0, so a free port is picked first; if
    // another process takes it in between, binding fails and another port is tried.
    let mut attempt = 0;
    let (child, conn) = loop {
        attempt += 1;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = Command::new(&activate)
            .arg(format!("--listen={}", native.display()))
            .arg(format!("--listen=127.0.0.1:{port}"))
            .arg("--fdname=native:tcp")
            .arg(format!("--setenv={ACTIVATED_VAR}=1"))
            .arg(format!("--setenv=NOTIFY_SOCKET={}", notify_path.display()))
            .arg(std::env::current_exe().unwrap())
            .args(["an_activated_process_adopts_its_named_listeners", "--exact", "--nocapture"])
            .args(["--test-threads=1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The first connection makes systemd-socket-activate start the child.
        match connect_when_bound(&native, &mut child).unwrap() {
            Some(conn) => break (child, conn),
            None => {
                let output = child.wait_with_output().unwrap();
                let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
                assert!(attempt < 5, "systemd-socket-activate failed: {stderr}");
                let _ = std::fs::remove_file(&native);
            }
        }
    };
    conn.set_read_timeout(Some(SAFETY_TIMEOUT)).unwrap();
    let mut reader = BufReader::new(conn);
    let mut report = String::new();
    reader.read_line(&mut report).unwrap();

    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).unwrap();
    assert_eq!(std::str::from_utf8(&buf[..n]).unwrap(), "READY=1\n");

    // "native unix <path>|tcp tcp <addr>|env clean"
    let parts: Vec<&str> = report.trim_end().split('|').collect();
    assert_eq!(parts.len(), 3, "report: {report:?}");
    assert_eq!(parts[0], format!("native unix {}", native.display()));
    let tcp_addr = parts[1].strip_prefix("tcp tcp ").unwrap_or_else(|| panic!("{report:?}"));
    assert!(tcp_addr.starts_with("127.0.0.1:"), "{tcp_addr}");
    assert_eq!(parts[2], "env clean");

    // The TCP listener really is the child's: it answers there.
    let mut tcp = TcpStream::connect(tcp_addr).unwrap();
    tcp.set_read_timeout(Some(SAFETY_TIMEOUT)).unwrap();
    let mut greeting = String::new();
    tcp.read_to_string(&mut greeting).unwrap();
    assert_eq!(greeting, "hello over tcp\n");

    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the activated child failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Connects once systemd-socket-activate has bound the socket; `None` if it exited
/// first (it could not bind).
fn connect_when_bound(path: &Path, activator: &mut Child) -> anyhow::Result<Option<UnixStream>> {
    let deadline = std::time::Instant::now() + SAFETY_TIMEOUT;
    loop {
        match UnixStream::connect(path) {
            Ok(stream) => return Ok(Some(stream)),
            Err(_) if activator.try_wait()?.is_some() => return Ok(None),
            Err(err) if std::time::Instant::now() > deadline => {
                anyhow::bail!("{} never accepted connections: {err}", path.display())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The activated side: adopt the listeners, report them over the native socket's
/// pending connection, greet one TCP client, exit.
fn activated_child() -> anyhow::Result<()> {
    let listeners = systemd::inherited_listeners()?;
    let env_clean =
        std::env::var_os("LISTEN_FDS").is_none() && std::env::var_os("LISTEN_PID").is_none();
    systemd::notify_ready()?;

    let mut native = None;
    let mut tcp = None;
    let mut report = Vec::new();
    for listener in listeners {
        match listener {
            Inherited::Unix { name, listener } => {
                let addr = listener.local_addr()?;
                let path = addr.as_pathname().context("an unnamed Unix socket")?;
                report.push(format!("{name} unix {}", path.display()));
                native = Some(listener);
            }
            Inherited::Tcp { name, listener } => {
                report.push(format!("{name} tcp {}", listener.local_addr()?));
                tcp = Some(listener);
            }
        }
    }
    report.push(if env_clean { "env clean".to_owned() } else { "env dirty".to_owned() });

    // The listeners were handed over non-blocking; this side waits.
    let native = native.context("no Unix listener inherited")?;
    native.set_nonblocking(false)?;
    let (mut conn, _) = native.accept()?;
    writeln!(conn, "{}", report.join("|"))?;

    let tcp = tcp.context("no TCP listener inherited")?;
    tcp.set_nonblocking(false)?;
    let (mut client, _) = tcp.accept()?;
    client.write_all(b"hello over tcp\n")?;
    Ok(())
}
