//! The channel between two processes: a Unix stream socket carrying length-prefixed,
//! versioned frames ([`wire`](super::wire)), and a pool's file descriptor beside a frame
//! (`SCM_RIGHTS`).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::wire::{Message, HEADER_LEN, MAX_BODY};
use crate::error::{Error, Misuse, Result};

/// One end of a channel between two processes (a Unix stream socket): what
/// [`Exporter`](super::Exporter) and [`Importer`](super::Importer) speak over. Make a pair
/// before spawning the other process ([`Channel::pair`], then hand one end's descriptor to
/// the child), or meet at a path ([`Listener::bind`] and [`Channel::connect`]).
///
/// Every message is a frame of a 12-byte header (magic, version, kind, body length) and a
/// body of at most 1 KiB; a frame that is cut short, announces too much, or has another
/// version is refused with [`Misuse::InvalidArgument`] naming it. A peer that has gone (its
/// process ended, or it closed its end) is [`Error::Os`] with `ECONNRESET` (or `EPIPE` when
/// sending), a wait that ran out is `ETIMEDOUT`.
#[derive(Debug)]
pub struct Channel {
    sock: UnixStream,
}

/// A place (a socket path) where one process waits for another to
/// [`connect`](Channel::connect). The path is removed when the listener drops.
#[derive(Debug)]
pub struct Listener {
    listener: UnixListener,
    path: PathBuf,
}

fn os(call: impl Into<String>, err: &std::io::Error) -> Error {
    Error::os(call, err)
}

fn errno(call: impl Into<String>, errno: i32) -> Error {
    Error::Os {
        call: call.into(),
        errno,
    }
}

/// Waits until `fd` is readable (or writable) or `deadline` passes.
fn poll(fd: RawFd, write: bool, deadline: Instant, what: &str) -> Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd {
            fd,
            events: if write { libc::POLLOUT } else { libc::POLLIN },
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd, read and written during the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return Ok(());
        }
        if n == 0 {
            return Err(errno(
                format!("{what}: no answer within {:?}", deadline.elapsed() + left),
                libc::ETIMEDOUT,
            ));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(os(format!("poll ({what})"), &e));
        }
    }
}

impl Channel {
    /// Two connected ends (`socketpair(AF_UNIX, SOCK_STREAM)`), both close-on-exec: give one
    /// to a child with [`into_fd`](Self::into_fd) (clearing close-on-exec for it) and
    /// [`from_fd`](Self::from_fd) there.
    pub fn pair() -> Result<(Channel, Channel)> {
        let (a, b) = UnixStream::pair().map_err(|e| os("socketpair(AF_UNIX)", &e))?;
        Ok((Channel { sock: a }, Channel { sock: b }))
    }

    /// Connects to a [`Listener`] at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<Channel> {
        let path = path.as_ref();
        let sock = UnixStream::connect(path)
            .map_err(|e| os(format!("connect({})", path.display()), &e))?;
        Ok(Channel { sock })
    }

    /// A channel over a connected Unix stream socket.
    pub fn from_stream(sock: UnixStream) -> Channel {
        Channel { sock }
    }

    /// A channel over a descriptor of a connected Unix stream socket (one end of a
    /// [`pair`](Self::pair) that a parent handed down).
    pub fn from_fd(fd: OwnedFd) -> Channel {
        Channel {
            sock: UnixStream::from(fd),
        }
    }

    /// The socket, for a process that hands it on.
    pub fn into_fd(self) -> OwnedFd {
        self.sock.into()
    }

    /// Sends `msg`, with `fd` beside its first byte when given. A peer that has gone is
    /// `EPIPE` (no `SIGPIPE`).
    pub(crate) fn send(
        &self,
        msg: &Message,
        fd: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<()> {
        let frame = msg.encode();
        let deadline = Instant::now() + timeout;
        let mut sent = 0;
        while sent < frame.len() {
            poll(
                self.sock.as_raw_fd(),
                true,
                deadline,
                "sending on the IPC channel",
            )?;
            let rest = &frame[sent..];
            let mut iov = libc::iovec {
                iov_base: rest.as_ptr() as *mut libc::c_void,
                iov_len: rest.len(),
            };
            // Room for one descriptor, aligned for `cmsghdr`.
            let mut control = [0u64; 4];
            // SAFETY: a zeroed msghdr is valid (no name, no control, no iovec).
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_iov = &mut iov;
            m.msg_iovlen = 1;
            if let (Some(fd), 0) = (fd, sent) {
                // SAFETY: CMSG_SPACE is a pure size computation.
                let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) };
                m.msg_control = control.as_mut_ptr().cast();
                m.msg_controllen = space as _;
                // SAFETY: `m` has a control buffer of `space` bytes (within `control`'s 32),
                // so the first header exists and has room for one descriptor.
                unsafe {
                    let h = libc::CMSG_FIRSTHDR(&m);
                    (*h).cmsg_level = libc::SOL_SOCKET;
                    (*h).cmsg_type = libc::SCM_RIGHTS;
                    (*h).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(h).cast::<RawFd>(), fd.as_raw_fd());
                }
            }
            // SAFETY: `m` points to a live iovec over `rest` and (maybe) the control buffer,
            // both alive during the call.
            let n = unsafe { libc::sendmsg(self.sock.as_raw_fd(), &m, libc::MSG_NOSIGNAL) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => continue,
                    _ => {
                        return Err(os(
                            format!("sendmsg({} message on the IPC channel)", msg.name()),
                            &e,
                        ))
                    }
                }
            }
            sent += n as usize;
        }
        Ok(())
    }

    /// Reads into `buf` until it is full: `Ok(n < buf.len())` only when the peer closed its
    /// end after `n` bytes. A descriptor that arrives is kept in `fd` (a second one is
    /// closed and refused).
    fn read_full(
        &self,
        buf: &mut [u8],
        fd: &mut Option<OwnedFd>,
        deadline: Instant,
    ) -> Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            poll(
                self.sock.as_raw_fd(),
                false,
                deadline,
                "waiting on the IPC channel",
            )?;
            let rest = &mut buf[got..];
            let mut iov = libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            };
            let mut control = [0u64; 8];
            // SAFETY: a zeroed msghdr is valid.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_iov = &mut iov;
            m.msg_iovlen = 1;
            m.msg_control = control.as_mut_ptr().cast();
            m.msg_controllen = std::mem::size_of_val(&control) as _;
            // SAFETY: `m` points to live buffers for the data and the control messages.
            let n = unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut m, libc::MSG_CMSG_CLOEXEC) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => continue,
                    std::io::ErrorKind::ConnectionReset => return Ok(got),
                    _ => return Err(os("recvmsg(IPC channel)", &e)),
                }
            }
            // Take every descriptor that came, so that none leaks.
            let mut fds = Vec::new();
            // SAFETY: the kernel filled `m`'s control buffer; CMSG_FIRSTHDR / CMSG_NXTHDR walk
            // it within `msg_controllen`, and each SCM_RIGHTS payload holds whole descriptors
            // now owned by this process.
            unsafe {
                let mut h = libc::CMSG_FIRSTHDR(&m);
                while !h.is_null() {
                    if (*h).cmsg_level == libc::SOL_SOCKET && (*h).cmsg_type == libc::SCM_RIGHTS {
                        let data = libc::CMSG_DATA(h);
                        let bytes = (*h).cmsg_len as usize - (data as usize - h as usize);
                        for i in 0..bytes / std::mem::size_of::<RawFd>() {
                            let raw = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                            fds.push(OwnedFd::from_raw_fd(raw));
                        }
                    }
                    h = libc::CMSG_NXTHDR(&m, h);
                }
            }
            let truncated_control = m.msg_flags & libc::MSG_CTRUNC != 0;
            for f in fds {
                if fd.is_some() {
                    return Err(Misuse::InvalidArgument {
                        op: "ipc::Channel::recv",
                        reason: "more than one file descriptor came with a message".into(),
                    }
                    .into());
                }
                *fd = Some(f);
            }
            if truncated_control {
                return Err(Misuse::InvalidArgument {
                    op: "ipc::Channel::recv",
                    reason: "the descriptors sent with a message did not fit (MSG_CTRUNC)".into(),
                }
                .into());
            }
            if n == 0 {
                return Ok(got);
            }
            got += n as usize;
        }
        Ok(got)
    }

    /// The next message and the descriptor that came with it, waiting at most `timeout`.
    pub(crate) fn recv(&self, timeout: Duration) -> Result<(Message, Option<OwnedFd>)> {
        let deadline = Instant::now() + timeout;
        let mut fd = None;
        let mut head = [0u8; HEADER_LEN];
        let got = self.read_full(&mut head, &mut fd, deadline)?;
        if got == 0 {
            return Err(errno(
                "recvmsg(IPC channel): the peer closed the channel (its process ended or it \
                 dropped its end)",
                libc::ECONNRESET,
            ));
        }
        if got < HEADER_LEN {
            return Err(truncated("header", got, HEADER_LEN));
        }
        let (kind, len) = Message::header(&head)?;
        let mut body = [0u8; MAX_BODY];
        let got = self.read_full(&mut body[..len], &mut fd, deadline)?;
        if got < len {
            return Err(truncated("body", got, len));
        }
        Ok((Message::decode(kind, &body[..len])?, fd))
    }
}

fn truncated(part: &str, got: usize, want: usize) -> Error {
    Misuse::InvalidArgument {
        op: "ipc::Channel::recv",
        reason: format!(
            "truncated message: {got} of {want} {part} bytes, then the peer closed the channel"
        ),
    }
    .into()
}

impl Listener {
    /// Listens at `path` (a socket file; an existing file there is an error).
    pub fn bind(path: impl AsRef<Path>) -> Result<Listener> {
        let path = path.as_ref().to_path_buf();
        let listener =
            UnixListener::bind(&path).map_err(|e| os(format!("bind({})", path.display()), &e))?;
        Ok(Listener { listener, path })
    }

    /// The path it listens at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next process that connects, waiting at most `timeout` (`ETIMEDOUT`).
    pub fn accept(&self, timeout: Duration) -> Result<Channel> {
        let deadline = Instant::now() + timeout;
        poll(
            self.listener.as_raw_fd(),
            false,
            deadline,
            "waiting for a process to connect",
        )?;
        let (sock, _) = self
            .listener
            .accept()
            .map_err(|e| os(format!("accept({})", self.path.display()), &e))?;
        Ok(Channel { sock })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::handles::event::IPC_EVENT_HANDLE_LEN;

    const T: Duration = Duration::from_secs(5);

    fn reason(e: Error) -> String {
        match e {
            Error::Misuse(Misuse::InvalidArgument { reason, .. }) => reason,
            e => panic!("unexpected error {e:?}"),
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Unix sockets and SCM_RIGHTS: system calls Miri does not model"
    )]
    fn messages_and_a_descriptor_cross_the_channel() {
        let (a, b) = Channel::pair().unwrap();
        let m = Message::Pass {
            generation: 3,
            event: [1; IPC_EVENT_HANDLE_LEN],
        };
        a.send(&m, None, T).unwrap();
        let (got, fd) = b.recv(T).unwrap();
        assert_eq!(got, m);
        assert!(fd.is_none());
        // A descriptor: one end of another socket pair, which must still work at the far
        // side.
        let (x, mut y) = UnixStream::pair().unwrap();
        let x: OwnedFd = x.into();
        a.send(
            &Message::Closed { generation: 4 },
            Some(x.as_fd_borrowed()),
            T,
        )
        .unwrap();
        drop(x);
        let (got, fd) = b.recv(T).unwrap();
        assert_eq!(got, Message::Closed { generation: 4 });
        let mut x = UnixStream::from(fd.expect("the descriptor was lost"));
        x.write_all(b"hi").unwrap();
        let mut buf = [0; 2];
        std::io::Read::read_exact(&mut y, &mut buf).unwrap();
        assert_eq!(&buf, b"hi");
    }

    trait AsFd {
        fn as_fd_borrowed(&self) -> BorrowedFd<'_>;
    }
    impl AsFd for OwnedFd {
        fn as_fd_borrowed(&self) -> BorrowedFd<'_> {
            std::os::fd::AsFd::as_fd(self)
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Unix sockets and SCM_RIGHTS: system calls Miri does not model"
    )]
    fn a_truncated_message_a_closed_peer_and_a_timeout_are_exact_errors() {
        // Cut in the header.
        let (a, b) = UnixStream::pair().unwrap();
        let frame = Message::Closed { generation: 1 }.encode();
        (&a).write_all(&frame[..5]).unwrap();
        drop(a);
        let r = reason(Channel::from_stream(b).recv(T).unwrap_err());
        assert_eq!(
            r,
            "truncated message: 5 of 12 header bytes, then the peer closed the channel"
        );
        // Cut in the body.
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&frame[..15]).unwrap();
        drop(a);
        let r = reason(Channel::from_stream(b).recv(T).unwrap_err());
        assert_eq!(
            r,
            "truncated message: 3 of 8 body bytes, then the peer closed the channel"
        );
        // Garbage.
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&[0x5a; 64]).unwrap();
        let r = reason(Channel::from_stream(b).recv(T).unwrap_err());
        assert!(r.starts_with("not a cuda-mem IPC message"), "{r}");
        // The peer gone between messages.
        let (a, b) = Channel::pair().unwrap();
        drop(a);
        match b.recv(T).unwrap_err() {
            Error::Os { errno, call } => {
                assert_eq!(errno, libc::ECONNRESET);
                assert!(call.contains("the peer closed the channel"), "{call}");
            }
            e => panic!("{e:?}"),
        }
        // Sending to a peer that has gone: EPIPE, and no SIGPIPE kills the test.
        let (a, b) = Channel::pair().unwrap();
        drop(b);
        match a
            .send(&Message::Closed { generation: 1 }, None, T)
            .unwrap_err()
        {
            Error::Os { errno, .. } => assert_eq!(errno, libc::EPIPE),
            e => panic!("{e:?}"),
        }
        // Nothing comes.
        let (_a, b) = Channel::pair().unwrap();
        match b.recv(Duration::from_millis(20)).unwrap_err() {
            Error::Os { errno, .. } => assert_eq!(errno, libc::ETIMEDOUT),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Unix sockets and SCM_RIGHTS: system calls Miri does not model"
    )]
    fn a_listener_meets_a_connecting_process_and_removes_its_path() {
        let path = std::env::temp_dir().join(format!("cuda-mem-ipc-test-{}", std::process::id()));
        let l = Listener::bind(&path).unwrap();
        let c = Channel::connect(&path).unwrap();
        let s = l.accept(T).unwrap();
        c.send(&Message::Refused { code: 0 }, None, T).unwrap();
        assert_eq!(s.recv(T).unwrap().0, Message::Refused { code: 0 });
        drop(l);
        assert!(!path.exists());
    }
}
