//! Background processes: commands that outlive the call that started them, owned by
//! a session.
//!
//! A process is started by `run_command` (`background`, `yield_ms`, `tty`, or a
//! timeout with `on_timeout = "background"`) through the same [`process::run`] as any
//! command, so it gets the same supervisor, cgroup and sandbox; only its cancellation
//! token is its own (a child of the session's) instead of the call's. Its output is
//! spooled to disk ([`spool`]) and numbered by byte offset; every chunk is also
//! reported to the session's [`ProcessObserver`] (the `tool_output` events), and so is
//! the end (`process_exited`).
//!
//! The whole tree of a process is killed by `process_kill`, when its session closes
//! (the session's token), when a detached session's wait ends (the same), and at daemon
//! shutdown (every session's token is the shutdown token's child). The task that runs
//! it is tracked by the daemon, which waits for it before it exits.

pub mod spool;
pub mod typed;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::spool::{Page, Spool};
use crate::exec::terminal::LiveInput;
use crate::exec::{self as process, ExitStatus, Outcome, Pids, ProcessError, Spec, Stdin};
use crate::exec::{OutputSink, OutputStream};

/// What `run_command` does when a command outlives its deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Kill the command and everything it started (the classic behaviour).
    #[default]
    Kill,
    /// Keep it running as a background process and answer with its handle.
    Background,
}

/// The bounds and places of a session's background processes (`[limits]`).
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessSettings {
    /// Background processes one session may have running at once.
    pub max_running: usize,
    /// Output kept on disk per process (the oldest is dropped beyond it).
    pub output_bytes: u64,
    /// Output kept on disk per session, all its processes together.
    pub session_output_bytes: u64,
    /// How long a session that owns running processes outlives its connection.
    pub detached_ttl: Duration,
    pub on_timeout: OnTimeout,
    /// Where spools live: the daemon's runtime (or state) directory, never a root.
    pub spool_dir: PathBuf,
}

impl Default for ProcessSettings {
    fn default() -> ProcessSettings {
        ProcessSettings {
            max_running: 8,
            output_bytes: 8 * 1024 * 1024,
            session_output_bytes: 64 * 1024 * 1024,
            detached_ttl: Duration::from_secs(600),
            on_timeout: OnTimeout::Kill,
            spool_dir: std::env::temp_dir()
                .join(format!("toolgate-{}", rustix::process::getuid().as_raw()))
                .join("processes"),
        }
    }
}

/// Where a session's process events go (the agent layer turns them into events).
pub trait ProcessObserver: Send + Sync {
    /// A chunk of output: `seq` counts the process's chunks from 0, `offset` is the
    /// chunk's first byte in the process's spool.
    fn output(&self, process: &Job, seq: u64, offset: u64, stream: OutputStream, text: &str);
    /// The process ended; its whole tree is gone.
    fn exited(&self, process: &Job, exit: &Exit);
}

/// How a background process ended.
#[derive(Clone, Debug)]
pub struct Exit {
    pub status: Option<ExitStatus>,
    pub runtime: Duration,
    /// Why toolgate ended it, when it did (`process_kill`, session closed, ...).
    pub killed: Option<String>,
    /// The command could not be run at all.
    pub error: Option<String>,
    /// What `process::run` returned (shared: an `Exit` is cloned for every read).
    pub outcome: Option<Arc<Outcome>>,
}

/// Where a process is.
#[derive(Clone, Debug)]
enum State {
    Running,
    Exited(Box<Exit>),
}

/// Output progress, watched by readers that wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Progress {
    end: u64,
    exited: bool,
}

/// One background process.
pub struct Job {
    pub id: String,
    pub command: String,
    /// The call that started it.
    pub call_id: Arc<str>,
    pub started_at: SystemTime,
    started: Instant,
    live: Option<Arc<LiveInput>>,
    cancel: CancellationToken,
    pids: Arc<Pids>,
    spool: Mutex<Spool>,
    /// Keeps the session's spool directory until the last of its processes is gone.
    _dir: Arc<SpoolDir>,
    seq: AtomicU64,
    state: Mutex<State>,
    progress: tokio::sync::watch::Sender<Progress>,
    /// Why it is being killed, when toolgate asked.
    kill_reason: Mutex<Option<String>>,
    /// The line typed into it and not yet entered (see [`typed`]).
    pending_line: Mutex<String>,
}

/// What `process_read` returns.
#[derive(Clone, Debug)]
pub struct Read {
    pub page: Page,
    /// Bytes written so far.
    pub end: u64,
    pub exit: Option<Exit>,
}

impl Job {
    pub fn is_running(&self) -> bool {
        matches!(*self.lock_state(), State::Running)
    }

    pub fn has_terminal(&self) -> bool {
        self.live.as_ref().is_some_and(|live| live.is_terminal())
    }

    pub fn exit(&self) -> Option<Exit> {
        match &*self.lock_state() {
            State::Running => None,
            State::Exited(exit) => Some(Exit::clone(exit)),
        }
    }

    pub fn runtime(&self) -> Duration {
        match &*self.lock_state() {
            State::Running => self.started.elapsed(),
            State::Exited(exit) => exit.runtime,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.pids.command()
    }

    /// Bytes of output so far.
    pub fn output_bytes(&self) -> u64 {
        self.progress.borrow().end
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_spool(&self) -> std::sync::MutexGuard<'_, Spool> {
        self.spool.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A page of output from `offset` (negative: from the end). With `wait`, and
    /// nothing to return yet while the process runs, waits that long for output or
    /// the end (or until `cancel`).
    pub async fn read(
        &self,
        offset: i64,
        limit: usize,
        wait: Duration,
        cancel: &CancellationToken,
    ) -> std::io::Result<Read> {
        let mut watch = self.progress.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let progress = *watch.borrow_and_update();
            let from = if offset < 0 { 0 } else { offset.unsigned_abs() };
            let nothing_new = offset >= 0 && from >= progress.end;
            if !nothing_new || progress.exited || wait.is_zero() {
                break;
            }
            tokio::select! {
                changed = watch.changed() => if changed.is_err() { break },
                () = tokio::time::sleep_until(deadline) => break,
                () = cancel.cancelled() => break,
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        let (page, end) = {
            let spool = self.lock_spool();
            (spool.read(offset, limit)?, spool.end())
        };
        Ok(Read { page, end, exit: self.exit() })
    }

    /// What `input` would make the process read, after the line typed so far (and on
    /// a terminal, with its line editing): what the permission rules judge.
    pub fn typed(&self, input: &str) -> Result<typed::Typed, typed::Unmodelled> {
        let pending = self.pending_line.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        typed::type_input(&pending, input, self.has_terminal())
    }

    /// Notes what was written, for the next [`Job::typed`]. Input the model does not
    /// follow (let through by a rule allowing raw input) leaves the line unknown; the
    /// next input is judged from an empty line.
    fn note_typed(&self, input: &[u8]) {
        let text = String::from_utf8_lossy(input);
        let next = self.typed(&text).map(|typed| typed.pending).unwrap_or_default();
        *self.pending_line.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = next;
    }

    /// Writes to the process's stdin (or terminal).
    pub async fn write(&self, input: &[u8], close: bool) -> Result<(), String> {
        if !self.is_running() {
            return Err(format!("process {} has exited", self.id));
        }
        let Some(live) = &self.live else {
            return Err(format!(
                "process {} has no open stdin (it was started without background, yield_ms or tty)",
                self.id
            ));
        };
        if !input.is_empty() {
            live.write(input).await.map_err(|err| format!("writing to {}: {err}", self.id))?;
            self.note_typed(input);
        }
        if close {
            live.close().await.map_err(|err| format!("closing {}'s stdin: {err}", self.id))?;
        }
        Ok(())
    }

    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), String> {
        match &self.live {
            Some(live) if self.is_running() => {
                live.resize(rows, cols).map_err(|err| err.to_string())
            }
            Some(_) => Err(format!("process {} has exited", self.id)),
            None => Err(format!("process {} has no terminal (start it with tty: true)", self.id)),
        }
    }

    /// Kills the whole tree; returns once it is gone.
    pub async fn kill(&self, reason: &str) {
        self.kill_reason
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert_with(|| reason.to_owned());
        self.cancel.cancel();
        self.wait().await;
    }

    /// Sends a signal to the command itself (its tree follows when it exits).
    pub fn signal(&self, signal: rustix::process::Signal) -> bool {
        self.is_running() && self.pids.signal_command(signal)
    }

    /// Waits until the process and its tree are gone.
    pub async fn wait(&self) {
        let mut watch = self.progress.subscribe();
        while !watch.borrow_and_update().exited {
            if watch.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits at most `timeout` (or until `cancel`); true when it has exited.
    pub async fn wait_for(&self, timeout: Duration, cancel: &CancellationToken) -> bool {
        tokio::select! {
            () = self.wait() => true,
            () = tokio::time::sleep(timeout) => !self.is_running(),
            () = cancel.cancelled() => !self.is_running(),
        }
    }

    fn append(&self, observer: &dyn ProcessObserver, stream: OutputStream, text: &str) {
        let offset = {
            let mut spool = self.lock_spool();
            let offset = spool.end();
            if let Err(err) = spool.append(text.as_bytes()) {
                tracing::warn!(%err, process = %self.id, "cannot spool a background process's output");
            }
            offset
        };
        let end = offset + text.len() as u64;
        self.progress.send_modify(|progress| progress.end = end);
        observer.output(self, self.seq.fetch_add(1, Ordering::Relaxed), offset, stream, text);
    }

    fn finish(&self, result: Result<Outcome, ProcessError>) -> Exit {
        let killed =
            self.kill_reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let exit = match result {
            Ok(outcome) => Exit {
                status: outcome.status,
                runtime: outcome.duration,
                killed: killed.or_else(|| outcome.canceled.then(|| "killed".to_owned())),
                error: None,
                outcome: Some(Arc::new(outcome)),
            },
            Err(err) => Exit {
                status: None,
                runtime: self.started.elapsed(),
                killed,
                error: Some(err.to_string()),
                outcome: None,
            },
        };
        *self.lock_state() = State::Exited(Box::new(exit.clone()));
        self.progress.send_modify(|progress| progress.exited = true);
        exit
    }
}

/// Why a process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "this session already runs {0} background processes, the limit ([limits] max_background_processes); wait for one to end or stop one with process_kill"
    )]
    TooManyRunning(usize),
    #[error(
        "this session's processes already keep {kept} bytes of output and a new one would keep up to {more} more, beyond the limit of {limit} bytes ([limits] session_process_output_bytes); stop a running process with process_kill"
    )]
    OutputLimit { kept: u64, more: u64, limit: u64 },
    #[error("cannot create the output spool in {}: {source}", dir.display())]
    Spool { dir: PathBuf, source: std::io::Error },
    #[error("the session is closing")]
    Closing,
}

/// A session's background processes.
pub struct Processes {
    settings: ProcessSettings,
    /// This session's spool directory (created on first use, removed with the last
    /// process that uses it).
    dir: Arc<SpoolDir>,
    observer: Arc<dyn ProcessObserver>,
    /// The session's token: every process's token is its child.
    cancel: CancellationToken,
    tasks: TaskTracker,
    table: Mutex<Table>,
    next: AtomicU64,
}

/// The processes of a session, and the starts under way: a start reserves its slot in
/// the same critical section that counts (see [`Processes::start`]).
#[derive(Default)]
struct Table {
    jobs: BTreeMap<u64, Arc<Job>>,
    /// Starts that passed the limits and have not yet been inserted (or given up).
    reserved: usize,
}

impl Table {
    /// Running processes, the reserved starts among them.
    fn running(&self) -> usize {
        self.jobs.values().filter(|job| job.is_running()).count() + self.reserved
    }

    /// Processes whose spool bound counts against the session's, the reserved starts
    /// among them.
    fn kept(&self) -> usize {
        self.jobs.len() + self.reserved
    }
}

/// A slot reserved by [`Processes::start`]: given back on drop unless the start
/// [inserted](Reservation::insert) its process.
struct Reservation<'a> {
    processes: &'a Processes,
    number: u64,
    held: bool,
}

impl Reservation<'_> {
    /// Puts the process in the table in place of the reservation, in one step.
    fn insert(mut self, job: Arc<Job>) {
        let mut table = self.processes.lock();
        table.reserved -= 1;
        table.jobs.insert(self.number, job);
        self.held = false;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.held {
            self.processes.lock().reserved -= 1;
        }
    }
}

impl Processes {
    pub fn new(
        settings: ProcessSettings,
        session_id: &str,
        observer: Arc<dyn ProcessObserver>,
        cancel: CancellationToken,
        tasks: TaskTracker,
    ) -> Processes {
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| remove_stale_spools(&settings.spool_dir));
        let dir = settings.spool_dir.join(format!("{}-{session_id}", std::process::id()));
        Processes {
            settings,
            dir: Arc::new(SpoolDir(dir)),
            observer,
            cancel,
            tasks,
            table: Mutex::new(Table::default()),
            next: AtomicU64::new(1),
        }
    }

    pub fn settings(&self) -> &ProcessSettings {
        &self.settings
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Job>> {
        self.lock().jobs.values().find(|job| job.id == id).cloned()
    }

    /// Every process, oldest first.
    pub fn list(&self) -> Vec<Arc<Job>> {
        self.lock().jobs.values().cloned().collect()
    }

    pub fn running(&self) -> usize {
        self.lock().jobs.values().filter(|job| job.is_running()).count()
    }

    /// Forgets an exited process (its spool is deleted).
    pub fn forget(&self, id: &str) {
        self.lock().jobs.retain(|_, job| job.id != id || job.is_running());
    }

    /// Starts `spec` as a background process: its own cancellation (a child of the
    /// session's), no deadline, output to the spool and the observer. `live` is its
    /// stdin or terminal, if any.
    ///
    /// The limits are checked and the new process's slot reserved under one lock of
    /// the table, so starts that race each other are counted with each other: however
    /// many arrive at once, no more than `max_running` run. A start that fails after
    /// that gives its slot back.
    pub fn start(
        &self,
        mut spec: Spec,
        command: &str,
        call_id: &str,
        live: Option<Arc<LiveInput>>,
    ) -> Result<Arc<Job>, StartError> {
        if self.cancel.is_cancelled() {
            return Err(StartError::Closing);
        }
        let reservation = {
            let mut table = self.lock();
            if table.running() >= self.settings.max_running {
                return Err(StartError::TooManyRunning(self.settings.max_running));
            }
            let per_process = self.settings.output_bytes;
            let limit = self.settings.session_output_bytes;
            // Exited processes give way first, oldest first.
            loop {
                let kept = per_process.saturating_mul(table.kept() as u64);
                if kept.saturating_add(per_process) <= limit {
                    break;
                }
                let oldest_exited =
                    table.jobs.iter().find(|(_, job)| !job.is_running()).map(|(number, _)| *number);
                match oldest_exited {
                    Some(number) => {
                        table.jobs.remove(&number);
                    }
                    None => {
                        return Err(StartError::OutputLimit { kept, more: per_process, limit });
                    }
                }
            }
            table.reserved += 1;
            Reservation {
                processes: self,
                number: self.next.fetch_add(1, Ordering::Relaxed),
                held: true,
            }
        };
        let id = format!("p{}", reservation.number);
        let dir = &self.dir.0;
        create_private_dir(dir).map_err(|source| StartError::Spool { dir: dir.clone(), source })?;
        let spool = Spool::create(dir, &id, self.settings.output_bytes)
            .map_err(|source| StartError::Spool { dir: dir.clone(), source })?;
        let cancel = self.cancel.child_token();
        let pids = Arc::new(Pids::default());
        let job = Arc::new(Job {
            id,
            command: command.to_owned(),
            call_id: call_id.into(),
            started_at: SystemTime::now(),
            started: Instant::now(),
            live: live.clone(),
            cancel: cancel.clone(),
            pids: pids.clone(),
            spool: Mutex::new(spool),
            _dir: self.dir.clone(),
            seq: AtomicU64::new(0),
            state: Mutex::new(State::Running),
            progress: tokio::sync::watch::Sender::new(Progress::default()),
            kill_reason: Mutex::new(None),
            pending_line: Mutex::new(String::new()),
        });
        spec.cancel = cancel;
        spec.timeout = None;
        spec.pids = Some(pids);
        if let Some(live) = live {
            spec.stdin = Stdin::Live(live);
        }
        let sink_job = Arc::downgrade(&job);
        let observer = self.observer.clone();
        spec.output = OutputSink::new(move |stream, text| {
            if let Some(job) = sink_job.upgrade() {
                job.append(observer.as_ref(), stream, text);
            }
        });
        reservation.insert(job.clone());
        let running = job.clone();
        let observer = self.observer.clone();
        let session_cancel = self.cancel.clone();
        self.tasks.spawn(async move {
            let result = process::run(spec).await;
            if session_cancel.is_cancelled() {
                running
                    .kill_reason
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get_or_insert_with(|| "its session ended".to_owned());
            }
            let exit = running.finish(result);
            observer.exited(&running, &exit);
        });
        Ok(job)
    }

    /// Kills every running process (the session is closing); returns once they are
    /// gone.
    pub async fn kill_all(&self, reason: &str) {
        let jobs = self.list();
        futures::future::join_all(jobs.iter().map(|job| job.kill(reason))).await;
    }
}

/// A session's spool directory, removed when the last holder (the session's table or
/// one of its processes) is dropped; by then every spool file in it is gone, since
/// each is deleted with its process, which drops its spool before this.
struct SpoolDir(PathBuf);

impl Drop for SpoolDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Removes the spools of daemons that died without cleaning up (a SIGKILL runs no
/// destructor): `<pid>-<session>` directories whose daemon is gone.
fn remove_stale_spools(spool_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(spool_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Creates `dir` (and its parents) with the leaf owner-only.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        }
        Err(err) => Err(err),
    }
}

/// Parses a signal name for `process_kill` (`TERM`, `SIGTERM`, `int`, ...).
pub fn parse_signal(name: &str) -> Option<rustix::process::Signal> {
    use rustix::process::Signal;
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    Some(match bare {
        "KILL" => Signal::KILL,
        "TERM" => Signal::TERM,
        "INT" => Signal::INT,
        "HUP" => Signal::HUP,
        "QUIT" => Signal::QUIT,
        "USR1" => Signal::USR1,
        "USR2" => Signal::USR2,
        "STOP" => Signal::STOP,
        "CONT" => Signal::CONT,
        "WINCH" => Signal::WINCH,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Program;

    struct Unobserved;

    impl ProcessObserver for Unobserved {
        fn output(&self, _: &Job, _: u64, _: u64, _: OutputStream, _: &str) {}
        fn exited(&self, _: &Job, _: &Exit) {}
    }

    #[test]
    fn a_start_that_fails_gives_its_reserved_slot_back() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the spool directory's parent should be: every spool fails.
        let blocker = dir.path().join("not-a-directory");
        std::fs::write(&blocker, "").unwrap();
        let settings = ProcessSettings {
            max_running: 1,
            output_bytes: 100,
            session_output_bytes: 100,
            spool_dir: blocker.join("processes"),
            ..ProcessSettings::default()
        };
        let processes = Processes::new(
            settings,
            "s1",
            Arc::new(Unobserved),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        // Each start fills both limits while it runs; a slot kept by a failed start
        // would make the next one a limit error instead of the spool's.
        for _ in 0..3 {
            let spec = Spec::new(Program::Shell("true".to_owned()), dir.path());
            let err = processes.start(spec, "true", "c1", None).err().unwrap();
            assert!(matches!(err, StartError::Spool { .. }), "{err}");
        }
        assert_eq!(processes.lock().reserved, 0);
        assert!(processes.list().is_empty());
    }
}
