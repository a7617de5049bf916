//! Passing one open descriptor over a Unix stream socket (`SCM_RIGHTS`), from the
//! daemon to a process supervisor: the working directory and a command's live input
//! travel this way. One byte of data carries each descriptor (a stream socket needs
//! data for ancillary data to ride on); it also tells which descriptor it is.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// Sends `fd` over `socket` with the byte `marker`; `what` names the descriptor in
/// errors.
pub(crate) fn send(socket: impl AsFd, fd: impl AsFd, marker: u8, what: &str) -> io::Result<()> {
    let fds = [fd.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other(format!("no room for {what}")));
    }
    let sent = rustix::net::sendmsg(
        socket,
        &[IoSlice::new(&[marker])],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != 1 {
        return Err(io::Error::other(format!("{what} was not sent")));
    }
    Ok(())
}

/// Receives the descriptor [`send`] sent with `marker` (close-on-exec); `what` names
/// it in errors.
pub(crate) fn receive(socket: impl AsFd, marker: u8, what: &str) -> io::Result<OwnedFd> {
    let not_received = || io::Error::other(format!("{what} was not received"));
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = rustix::net::recvmsg(
        &socket,
        &mut [IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    if received.bytes != 1 || byte[0] != marker {
        return Err(not_received());
    }
    let mut found: Option<OwnedFd> = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            for fd in fds {
                found.get_or_insert(fd);
            }
        }
    }
    found.ok_or_else(not_received)
}
