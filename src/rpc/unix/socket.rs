//! A newline-JSON connection's socket, read so that a client waiting for its answer
//! is woken once, by the answer.
//!
//! A Unix stream charges the bytes a client sends to the client's own socket, and
//! taking them out of the daemon's end tells the client's end it has room again: a
//! wake-up of every thread that waits on it, whatever for. A client that sent its
//! request and waits for the answer is such a thread, so reading the request the
//! usual way wakes it for nothing, only to put it back to sleep until the answer
//! comes. On a machine where waking a thread on another core is dear (a virtual
//! machine's idle core) that is most of what a small call costs the two of them.
//!
//! So reads here only look at the bytes ([`MSG_PEEK`]) and leave them in the socket;
//! they are taken out right after the next write, which is the answer: by then the
//! answer has woken the client, and taking its request's bytes out finds nobody
//! waiting. Bytes a read returned and no write followed (a call answered later, from
//! its own task) are taken out at the next read. Every byte is still returned once,
//! in order; only when the client's end learns it has room again moves.
//!
//! Where the kernel allows it, the answer and the take-out go in one system call
//! ([`sys::send_then_take_out`]). As two calls, a client the answer woke could take
//! the processor as the first returned, read its answer, send its next request and
//! wait again, all before the second, which would then wake it for nothing.
//!
//! [`MSG_PEEK`]: rustix::net::RecvFlags::PEEK

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use rustix::net::{RecvFlags, Shutdown};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;
use tokio::task::coop;

use crate::sys;

/// Bytes looked at per read at most, and taken out per `recv`.
const READ_CHUNK: usize = 16 * 1024;

/// The reading and writing halves of one connection's socket.
pub(super) fn halves(stream: UnixStream) -> (Reader, Writer) {
    let socket = Arc::new(Socket { stream, handed_out: AtomicUsize::new(0) });
    (Reader(socket.clone()), Writer(socket))
}

struct Socket {
    stream: UnixStream,
    /// Bytes at the front of the socket that a read already returned.
    handed_out: AtomicUsize,
}

impl Socket {
    /// Writes `buf` (an answer), then takes the bytes reads already returned out of the
    /// socket: both in one system call where the kernel allows it, so that a client
    /// the answer woke cannot run before its request is taken out and wait again.
    fn write_answer(&self, buf: &[u8]) -> io::Result<usize> {
        let written = match self.send_taking_out(buf)? {
            Some(written) => written,
            None => self.stream.try_write(buf)?,
        };
        // The client has been woken by what was just written, if it waited.
        self.take_out_handed_out()?;
        Ok(written)
    }

    /// [`sys::send_then_take_out`] of `buf` and the bytes handed out; `None` when it
    /// did not send (it may still have taken bytes out).
    fn send_taking_out(&self, buf: &[u8]) -> io::Result<Option<usize>> {
        let handed_out = self.handed_out.swap(0, Ordering::Relaxed);
        if handed_out == 0 {
            return Ok(None);
        }
        let mut taken = None;
        let sent = self.stream.try_io(Interest::WRITABLE, || {
            match sys::send_then_take_out(self.stream.as_fd(), buf, handed_out) {
                Some(done) => {
                    taken = done.taken;
                    done.sent.transpose()
                }
                None => Ok(None),
            }
        });
        let left = match taken {
            None => handed_out,
            Some(Ok(taken)) if taken > 0 => handed_out.saturating_sub(taken),
            Some(Ok(_)) => return Err(Self::gone()),
            Some(Err(err)) if err.kind() == io::ErrorKind::WouldBlock => return Err(Self::gone()),
            Some(Err(err)) => return Err(err),
        };
        self.handed_out.fetch_add(left, Ordering::Relaxed);
        sent
    }

    fn gone() -> io::Error {
        // Only this connection reads the socket: what was seen is still there.
        io::Error::other("bytes already read left the socket")
    }

    /// Takes the bytes reads already returned out of the socket.
    fn take_out_handed_out(&self) -> io::Result<()> {
        let mut left = self.handed_out.swap(0, Ordering::Relaxed);
        if left == 0 {
            return Ok(());
        }
        // Room the bytes are dropped into, never read: left as it is, not zeroed.
        let mut sink = [MaybeUninit::<u8>::uninit(); READ_CHUNK];
        while left > 0 {
            let want = left.min(sink.len());
            let ((taken, _), _) =
                rustix::net::recv(&self.stream, &mut sink[..want], RecvFlags::DONTWAIT)?;
            if taken.is_empty() {
                return Err(Self::gone());
            }
            left -= taken.len();
        }
        Ok(())
    }
}

pub(super) struct Reader(Arc<Socket>);

pub(super) struct Writer(Arc<Socket>);

impl AsyncRead for Reader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let socket = &*self.0;
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        // A socket that always has bytes must still let the other tasks run.
        let coop = ready!(coop::poll_proceed(cx));
        socket.take_out_handed_out()?;
        let room = buf.remaining().min(READ_CHUNK);
        loop {
            ready!(socket.stream.poll_read_ready(cx))?;
            // A read that leaves nothing behind makes the socket wait for the next
            // bytes (`WouldBlock` from inside `try_io` does that, against the
            // readiness seen before the read, so bytes arriving meanwhile still
            // count), as tokio's own reads do on a short read.
            let mut short = None;
            let peeked = socket.stream.try_io(Interest::READABLE, || {
                let flags = RecvFlags::PEEK | RecvFlags::DONTWAIT;
                let seen = sys::recv_into(socket.stream.as_fd(), buf, room, flags)?;
                if seen > 0 && seen < room {
                    short = Some(seen);
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(seen)
            });
            let seen = match (peeked, short) {
                (_, Some(seen)) | (Ok(seen), None) => seen,
                (Err(err), None) if err.kind() == io::ErrorKind::WouldBlock => continue,
                (Err(err), None) => return Poll::Ready(Err(err)),
            };
            socket.handed_out.store(seen, Ordering::Relaxed);
            coop.made_progress();
            return Poll::Ready(Ok(()));
        }
    }
}

impl AsyncWrite for Writer {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let socket = &*self.0;
        let coop = ready!(coop::poll_proceed(cx));
        loop {
            ready!(socket.stream.poll_write_ready(cx))?;
            match socket.write_answer(buf) {
                Ok(written) => {
                    coop.made_progress();
                    return Poll::Ready(Ok(written));
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                Err(err) => return Poll::Ready(Err(err)),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(rustix::net::shutdown(&self.0.stream, Shutdown::Write).map_err(Into::into))
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// What the daemon's end of the socket still holds, looked at from a copy of it.
    fn queued(socket: &OwnedFd) -> Vec<u8> {
        let mut seen = vec![0; 1 << 16];
        match rustix::net::recv(socket, &mut seen[..], RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok((n, _)) => seen[..n].to_vec(),
            Err(rustix::io::Errno::AGAIN) => Vec::new(),
            Err(err) => panic!("peek failed: {err}"),
        }
    }

    async fn read_some(reader: &mut Reader) -> Vec<u8> {
        let mut buf = Vec::with_capacity(4096);
        reader.read_buf(&mut buf).await.expect("read");
        buf
    }

    #[tokio::test]
    async fn a_request_leaves_the_socket_once_its_answer_is_written_and_is_read_once() {
        let (daemon_end, mut client) = UnixStream::pair().expect("pair");
        let copy = daemon_end.as_fd().try_clone_to_owned().expect("dup");
        let (mut reader, mut writer) = halves(daemon_end);

        client.write_all(b"one\ntwo\n").await.expect("send");
        assert_eq!(read_some(&mut reader).await, b"one\ntwo\n");
        // Read, but still in the socket: the client's end has not been told it has room.
        assert_eq!(queued(&copy), b"one\ntwo\n");

        writer.write_all(b"answer\n").await.expect("answer");
        assert!(queued(&copy).is_empty(), "taken out once the answer went");
        let mut answer = [0; 7];
        client.read_exact(&mut answer).await.expect("answer read");
        assert_eq!(&answer, b"answer\n");

        // Bytes no answer followed are taken out by the next read, never returned twice.
        client.write_all(b"three\n").await.expect("send");
        assert_eq!(read_some(&mut reader).await, b"three\n");
        client.write_all(b"four\n").await.expect("send");
        assert_eq!(read_some(&mut reader).await, b"four\n");
        assert_eq!(queued(&copy), b"four\n");

        // An answer too long to go with the take-out in one call goes the usual way:
        // sent, then the request taken out.
        let long = vec![b'z'; sys::PAIRED_SEND_BYTES + 1];
        writer.write_all(&long).await.expect("long answer");
        assert!(queued(&copy).is_empty(), "taken out after a long answer too");
        let mut answer = vec![0; long.len()];
        client.read_exact(&mut answer).await.expect("long answer read");
        assert_eq!(answer, long);

        // The end of input reads as one.
        drop(client);
        assert!(read_some(&mut reader).await.is_empty());
        assert!(queued(&copy).is_empty());
    }

    /// Whether this kernel lets the process set up an `io_uring`, asked directly.
    fn io_uring_allowed() -> bool {
        io_uring::IoUring::new(2).is_ok()
    }

    #[tokio::test]
    async fn where_the_kernel_allows_the_answer_and_the_take_out_are_one_call() {
        let (daemon_end, mut client) = UnixStream::pair().expect("pair");
        client.write_all(b"request\n").await.expect("send");
        daemon_end.readable().await.expect("readable");
        assert_eq!(queued(&daemon_end.as_fd().try_clone_to_owned().expect("dup")), b"request\n");

        let done = sys::send_then_take_out(daemon_end.as_fd(), b"answer\n", 8);
        let Some(done) = done else {
            assert!(!io_uring_allowed(), "io_uring is allowed, yet the pair was not submitted");
            eprintln!(
                "skipped: this kernel or its filters refuse io_uring; answers go the usual way"
            );
            return;
        };
        assert_eq!(done.sent.expect("send submitted").expect("sent"), 7);
        assert_eq!(done.taken.expect("take-out submitted").expect("taken"), 8);
        assert!(queued(&daemon_end.as_fd().try_clone_to_owned().expect("dup")).is_empty());
        let mut answer = [0; 7];
        client.read_exact(&mut answer).await.expect("answer read");
        assert_eq!(&answer, b"answer\n");

        // Too long for one paired call: left to the usual calls.
        let long = vec![b'x'; sys::PAIRED_SEND_BYTES + 1];
        assert!(sys::send_then_take_out(daemon_end.as_fd(), &long, 1).is_none());
        // Nothing to take out is said so, and waited for by neither part.
        let done = sys::send_then_take_out(daemon_end.as_fd(), b"more\n", 1).expect("ring");
        assert_eq!(done.sent.expect("send submitted").expect("sent"), 5);
        let taken = done.taken.expect("take-out submitted").expect_err("nothing to take out");
        assert_eq!(taken.kind(), io::ErrorKind::WouldBlock);
        // Nor is a full socket: the send says so instead of waiting for room.
        let chunk = [b'y'; 16 * 1024];
        while rustix::net::send(&daemon_end, &chunk, rustix::net::SendFlags::DONTWAIT).is_ok() {}
        client.write_all(b"r\n").await.expect("send");
        daemon_end.readable().await.expect("readable");
        let done = sys::send_then_take_out(daemon_end.as_fd(), b"late\n", 2).expect("ring");
        let sent = done.sent.expect("send submitted").expect_err("the socket is full");
        assert_eq!(sent.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(done.taken.expect("take-out submitted").expect("taken"), 2);
    }

    #[test]
    fn a_thread_the_kernel_refuses_io_uring_answers_the_usual_way() {
        // A seccomp filter, as a service manager may install, makes `io_uring_setup`
        // fail with EPERM for one thread (filters bind only the thread installing them).
        let refused = std::thread::spawn(|| {
            let filter = seccompiler::SeccompFilter::new(
                [(libc::SYS_io_uring_setup, vec![])].into_iter().collect(),
                seccompiler::SeccompAction::Allow,
                seccompiler::SeccompAction::Errno(libc::EPERM as u32),
                std::env::consts::ARCH.try_into().expect("arch"),
            )
            .expect("filter");
            let program: seccompiler::BpfProgram = filter.try_into().expect("program");
            rustix::thread::set_no_new_privs(true).expect("no_new_privs");
            seccompiler::apply_filter(&program).expect("seccomp");
            assert!(!io_uring_allowed(), "the filter did not refuse io_uring");

            let (daemon_end, mut client) = std::os::unix::net::UnixStream::pair().expect("pair");
            std::io::Write::write_all(&mut client, b"req\n").expect("send");
            let done = sys::send_then_take_out(daemon_end.as_fd(), b"answer\n", 4);
            // Nothing done: the caller sends and takes out itself.
            assert!(done.is_none());
            let copy = daemon_end.as_fd().try_clone_to_owned().expect("dup");
            assert_eq!(queued(&copy), b"req\n");

            // So a connection served on this thread reads, answers and takes out as ever.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                daemon_end.set_nonblocking(true).expect("nonblocking");
                let (mut reader, mut writer) =
                    halves(UnixStream::from_std(daemon_end).expect("register"));
                assert_eq!(read_some(&mut reader).await, b"req\n");
                writer.write_all(b"answer\n").await.expect("answer");
                assert!(queued(&copy).is_empty(), "taken out once the answer went");
            });
            let mut answer = [0; 7];
            std::io::Read::read_exact(&mut client, &mut answer).expect("answer read");
            assert_eq!(&answer, b"answer\n");
        });
        refused.join().expect("the refused thread's checks");
    }

    #[tokio::test]
    async fn a_long_stream_arrives_whole_and_in_order_between_answers() {
        let (daemon_end, mut client) = UnixStream::pair().expect("pair");
        let (mut reader, mut writer) = halves(daemon_end);
        let sent: Vec<u8> =
            (0..20_000).flat_map(|n| format!("{{\"line\":{n}}}\n").into_bytes()).collect();
        assert!(sent.len() > 8 * READ_CHUNK);
        let sending = {
            let sent = sent.clone();
            tokio::spawn(async move {
                client.write_all(&sent).await.expect("send");
                client.shutdown().await.expect("shutdown");
                let mut answers = Vec::new();
                client.read_to_end(&mut answers).await.expect("answers");
                answers
            })
        };
        let mut received = Vec::new();
        let mut answers = 0;
        for reads in 0.. {
            let mut buf = Vec::with_capacity(64 * 1024);
            if reader.read_buf(&mut buf).await.expect("read") == 0 {
                break;
            }
            assert!(buf.len() <= READ_CHUNK);
            received.extend_from_slice(&buf);
            // An answer after every other read, as a connection answering some calls
            // at once and others later would write.
            if reads % 2 == 0 {
                writer.write_all(b"ok\n").await.expect("answer");
                answers += 1;
            }
        }
        assert_eq!(received, sent);
        drop(writer);
        drop(reader);
        assert_eq!(sending.await.expect("client"), b"ok\n".repeat(answers));
    }
}
