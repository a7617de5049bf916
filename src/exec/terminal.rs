//! Live input for a running command: a pipe the daemon keeps writing to, or a
//! pseudo-terminal (the command's stdin, stdout and stderr, its controlling terminal).
//!
//! The daemon creates both ends. The command's end travels to the process supervisor
//! over the control socket (`SCM_RIGHTS`, after the working directory) and is closed in
//! the daemon at once, so the command sees end-of-file when the daemon closes its end,
//! and the daemon sees the terminal hang up when the last process holding it is gone.
//! On a terminal the supervisor becomes a session leader (`setsid`) and takes the
//! terminal as its controlling terminal (`TIOCSCTTY`) before it starts the command,
//! which inherits both: no code runs in the child between `fork` and `exec`.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::sync::Mutex;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;

/// The byte that carries the command's end of its live input.
const MARKER: u8 = b'T';

/// The end-of-file character of a terminal in canonical mode (Ctrl-D).
const VEOF: u8 = 0x04;

/// A command's live stdin, shared by the process that runs it and whoever writes to it.
pub struct LiveInput {
    tty: bool,
    /// The daemon's end: the pipe's write end or the terminal's master; `None` once a
    /// pipe's stdin was closed.
    writer: tokio::sync::Mutex<Option<pipe::Sender>>,
    /// The command's end, until it is handed to the supervisor.
    child_end: Mutex<Option<OwnedFd>>,
    /// A terminal's master again, for reading its output (taken by the process) and
    /// for resizing.
    reader: Mutex<Option<OwnedFd>>,
    resize: Option<OwnedFd>,
    /// A terminal's device (`/dev/pts/N`): the one terminal its command's sandbox grants.
    device: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for LiveInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.tty { "LiveInput(terminal)" } else { "LiveInput(pipe)" })
    }
}

impl PartialEq for LiveInput {
    fn eq(&self, other: &LiveInput) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for LiveInput {}

impl LiveInput {
    /// A pipe: the command reads what is written, and end-of-file once it is closed.
    /// Needs a Tokio runtime.
    pub fn pipe() -> io::Result<LiveInput> {
        // Both ends close-on-exec; the command's end becomes its stdin by `dup2`.
        let (read, write) = std::io::pipe()?;
        let write = OwnedFd::from(write);
        set_nonblocking(&write)?;
        Ok(LiveInput {
            tty: false,
            writer: tokio::sync::Mutex::new(Some(pipe::Sender::from_owned_fd(write)?)),
            child_end: Mutex::new(Some(OwnedFd::from(read))),
            reader: Mutex::new(None),
            resize: None,
            device: None,
        })
    }

    /// A pseudo-terminal of `rows` x `cols`. Needs a Tokio runtime.
    pub fn terminal(rows: u16, cols: u16) -> io::Result<LiveInput> {
        use rustix::pty::OpenptFlags;
        let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY)?;
        rustix::pty::grantpt(&master)?;
        rustix::pty::unlockpt(&master)?;
        let slave = rustix::pty::ioctl_tiocgptpeer(
            &master,
            OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC,
        )?;
        set_cloexec(&master)?;
        let device = rustix::pty::ptsname(&master, Vec::new())
            .ok()
            .map(|name| std::path::PathBuf::from(std::ffi::OsString::from_vec(name.into_bytes())));
        rustix::termios::tcsetwinsize(&master, winsize(rows, cols))?;
        set_nonblocking(&master)?;
        let reader = master.try_clone()?;
        let resize = master.try_clone()?;
        Ok(LiveInput {
            tty: true,
            // Tokio's pipe types only read and write the descriptor, which a
            // terminal's master allows as a pipe does (non-blocking, pollable).
            writer: tokio::sync::Mutex::new(Some(pipe::Sender::from_owned_fd_unchecked(master)?)),
            child_end: Mutex::new(Some(slave)),
            reader: Mutex::new(Some(reader)),
            resize: Some(resize),
            device,
        })
    }

    pub fn is_terminal(&self) -> bool {
        self.tty
    }

    /// A terminal's device file (`/dev/pts/N`); `None` for a pipe.
    pub(crate) fn device(&self) -> Option<&std::path::Path> {
        self.device.as_deref()
    }

    /// The command's end, once (the process hands it to its supervisor).
    pub(crate) fn take_child_end(&self) -> Option<OwnedFd> {
        self.child_end.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    /// The terminal's output, once; `None` for a pipe. Reading it fails with `EIO`
    /// once no process holds the terminal any more: its end.
    pub(crate) fn take_output(&self) -> io::Result<Option<pipe::Receiver>> {
        let fd = self.reader.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        fd.map(pipe::Receiver::from_owned_fd_unchecked).transpose()
    }

    /// Writes all of `bytes`, waiting while the command does not read (the caller
    /// bounds the wait).
    pub async fn write(&self, bytes: &[u8]) -> io::Result<()> {
        let mut writer = self.writer.lock().await;
        let Some(sender) = writer.as_mut() else {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "stdin is closed"));
        };
        sender.write_all(bytes).await
    }

    /// Ends the command's input: a pipe is closed; a terminal gets its end-of-file
    /// character (Ctrl-D), which a program reading lines takes as the end.
    pub async fn close(&self) -> io::Result<()> {
        if self.tty {
            return self.write(&[VEOF]).await;
        }
        self.writer.lock().await.take();
        Ok(())
    }

    /// Sets a terminal's size (the command gets `SIGWINCH`). Fails on a pipe.
    pub fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        match &self.resize {
            Some(master) => Ok(rustix::termios::tcsetwinsize(master, winsize(rows, cols))?),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the process has no terminal (start it with tty: true)",
            )),
        }
    }
}

fn winsize(rows: u16, cols: u16) -> rustix::termios::Winsize {
    rustix::termios::Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 }
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}

fn set_cloexec(fd: &OwnedFd) -> io::Result<()> {
    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC)?;
    Ok(())
}

/// Sends the command's end of its live input over the control socket.
pub(crate) fn send_fd(socket: impl AsFd, fd: impl AsFd) -> io::Result<()> {
    super::fd_pass::send(socket, fd, MARKER, "the input descriptor")
}

/// Receives what [`send_fd`] sent (in the supervisor).
pub(crate) fn receive_fd(socket: impl AsFd) -> io::Result<OwnedFd> {
    super::fd_pass::receive(socket, MARKER, "the input descriptor")
}

/// In the supervisor, before it starts the command: a new session whose controlling
/// terminal is `terminal`. The command inherits both, and so is in the terminal's
/// foreground process group: keys such as Ctrl-C reach it.
pub(crate) fn become_terminal_session(terminal: &OwnedFd) -> io::Result<()> {
    rustix::process::ioctl_tiocsctty(terminal)?;
    Ok(())
}

/// In the supervisor, first thing on a terminal: leave the daemon's session.
pub(crate) fn new_session() -> io::Result<()> {
    rustix::process::setsid()?;
    Ok(())
}
