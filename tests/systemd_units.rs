//! The unit files in `systemd/` are checked with systemd's own analyzer: they must
//! parse without a single warning, and the system service must keep an exposure of
//! 1.3 or below in `systemd-analyze security` while delegating its cgroup subtree.
//!
//! These tests need `systemd-analyze` (Debian package `systemd`). Without it they
//! fail: a hardening regression must not pass silently on a machine that cannot see it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The exposure `systemd-analyze security` may report for the system service at most.
const MAX_EXPOSURE: f64 = 1.3;

const SYSTEM_UNITS: [&str; 4] =
    ["toolgate.service", "toolgate.socket", "toolgate-tcp.socket", "toolgate-mcp-http.socket"];
const USER_UNITS: [&str; 2] = ["toolgate.service", "toolgate.socket"];

fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd")
}

fn systemd_analyze() -> Command {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/bin".into(), "/bin".into()])
        .map(|dir| dir.join("systemd-analyze"))
        .find(|candidate| candidate.is_file());
    match found {
        Some(program) => Command::new(program),
        None => panic!(
            "systemd-analyze not found: install the Debian package `systemd` \
             (apt-get install -y systemd) to check the unit files"
        ),
    }
}

fn describe(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The number in `→ Overall exposure level for NAME: 1.3 OK`.
fn parse_exposure(report: &str) -> Option<f64> {
    let line = report.lines().find(|line| line.contains("Overall exposure level"))?;
    let (_, rest) = line.rsplit_once(": ")?;
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn the_system_service_exposure_is_at_most_1_3() {
    let output = systemd_analyze()
        .args(["security", "--offline=true", "--no-pager"])
        .arg(units_dir().join("toolgate.service"))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    let exposure = parse_exposure(&report)
        .unwrap_or_else(|| panic!("no exposure in the report:\n{}", describe(&output)));
    println!("systemd-analyze security: exposure {exposure}");
    assert!(exposure <= MAX_EXPOSURE, "exposure {exposure} > {MAX_EXPOSURE}:\n{report}");
}

/// Copies units into a scratch directory with `ExecStart=` pointing at the binary
/// this build produced (verify checks that the program exists).
fn staged_units(
    subdir: &str,
    names: &[&str],
) -> std::io::Result<(tempfile::TempDir, Vec<PathBuf>)> {
    let dir = tempfile::tempdir()?;
    let binary = env!("CARGO_BIN_EXE_toolgate");
    let mut paths = Vec::new();
    for name in names {
        let text = std::fs::read_to_string(units_dir().join(subdir).join(name))?;
        let path = dir.path().join(name);
        std::fs::write(&path, text.replace("/usr/local/bin/toolgate", binary))?;
        paths.push(path);
    }
    Ok((dir, paths))
}

#[test]
fn the_system_units_verify_cleanly() {
    let (_dir, paths) = staged_units("", &SYSTEM_UNITS).unwrap();
    let output = systemd_analyze().args(["verify", "--no-pager"]).args(&paths).output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert!(output.stderr.is_empty() && output.stdout.is_empty(), "{}", describe(&output));
}

#[test]
fn the_user_units_verify_cleanly() {
    let (dir, paths) = staged_units("user", &USER_UNITS).unwrap();
    // A user manager needs a runtime directory to exist, even offline.
    let runtime = dir.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();
    let output = systemd_analyze()
        .args(["--user", "verify", "--no-pager"])
        .args(&paths)
        .env("XDG_RUNTIME_DIR", &runtime)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert!(output.stderr.is_empty() && output.stdout.is_empty(), "{}", describe(&output));
}

#[test]
fn socket_units_name_their_descriptors_as_the_daemon_expects() {
    let expected = [
        ("toolgate.socket", toolgate::systemd::FD_NAME_NATIVE),
        ("toolgate-tcp.socket", toolgate::systemd::FD_NAME_TCP),
        ("toolgate-mcp-http.socket", toolgate::systemd::FD_NAME_MCP_HTTP),
        ("user/toolgate.socket", toolgate::systemd::FD_NAME_NATIVE),
    ];
    for (unit, name) in expected {
        let text = std::fs::read_to_string(units_dir().join(unit)).unwrap();
        let line = format!("FileDescriptorName={name}");
        assert!(text.lines().any(|l| l.trim() == line), "{unit} lacks {line}");
    }
}

/// Every call's cgroup lives in the service's own subtree: the units delegate it, and
/// nothing makes the cgroup file system read-only for the service.
#[test]
fn the_services_delegate_their_cgroup_subtree() {
    for unit in ["toolgate.service", "user/toolgate.service"] {
        let text = std::fs::read_to_string(units_dir().join(unit)).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert!(lines.contains(&"Delegate=yes"), "{unit} lacks Delegate=yes");
        assert!(
            !lines.iter().any(|line| line.starts_with("ProtectControlGroups=")
                && *line != "ProtectControlGroups=no"),
            "{unit}: ProtectControlGroups= makes the delegated subtree read-only"
        );
    }
}

#[test]
fn exposure_parsing() {
    let report = "  NAME  DESCRIPTION  EXPOSURE\n✗ PrivateNetwork= ... 0.5\n\n\
                  → Overall exposure level for toolgate.service: 1.3 OK 🙂\n";
    assert_eq!(parse_exposure(report), Some(1.3));
    assert_eq!(parse_exposure("nothing here"), None);
}
