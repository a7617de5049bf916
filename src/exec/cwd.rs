//! A command's working directory, handed over as an open directory rather than a
//! name.
//!
//! The daemon opens the directory beneath a root (`tools::fs::open_dir`) and sends the
//! descriptor to the process supervisor over their control socket (`SCM_RIGHTS`); the
//! supervisor `fchdir`s into it before it starts the command. No one looks the name
//! up again, so swapping a directory for a symlink after the check cannot move the
//! command anywhere else.

use std::io;
use std::os::fd::AsFd;

/// The one byte of data that carries the descriptor (a stream socket needs data for
/// ancillary data to ride on).
const MARKER: u8 = b'D';

/// Sends `dir` over the Unix stream `socket`, ahead of anything else written to it.
pub fn send_dir(socket: impl AsFd, dir: impl AsFd) -> io::Result<()> {
    crate::exec::fd_pass::send(socket, dir, MARKER, "the working directory")
}

/// Receives the directory [`send_dir`] sent on `socket` and makes it the current
/// directory of this process.
pub fn enter_received_dir(socket: impl AsFd) -> io::Result<()> {
    let dir = crate::exec::fd_pass::receive(socket, MARKER, "the working directory")?;
    rustix::process::fchdir(&dir)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::IoSliceMut;
    use std::mem::MaybeUninit;
    use std::os::fd::OwnedFd;

    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

    use super::*;

    #[test]
    fn a_directory_sent_is_entered() {
        let dir = tempfile::tempdir().unwrap_or_else(|err| panic!("{err}"));
        let (left, right) =
            std::os::unix::net::UnixStream::pair().unwrap_or_else(|err| panic!("{err}"));
        let opened = std::fs::File::open(dir.path()).unwrap_or_else(|err| panic!("{err}"));
        send_dir(&left, &opened).unwrap_or_else(|err| panic!("{err}"));
        // Entering changes the test process's cwd: do it in a child-like way by
        // receiving the descriptor only and checking it names the directory.
        let mut byte = [0u8; 1];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = rustix::net::recvmsg(
            &right,
            &mut [IoSliceMut::new(&mut byte)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
        .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((received.bytes, byte[0]), (1, MARKER));
        let fds: Vec<OwnedFd> = control
            .drain()
            .filter_map(|message| match message {
                RecvAncillaryMessage::ScmRights(fds) => Some(fds.collect::<Vec<_>>()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(fds.len(), 1);
        let sent = rustix::fs::fstat(&opened).unwrap_or_else(|err| panic!("{err}"));
        let got = rustix::fs::fstat(&fds[0]).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!((sent.st_dev, sent.st_ino), (got.st_dev, got.st_ino));
    }
}
