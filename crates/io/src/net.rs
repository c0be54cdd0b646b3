//! Stream sockets on the runtime: TCP and unix sockets, with accept, recv
//! and gathered sends through io_uring, and an [`Event`] other threads can
//! fire to wake a task here.
//!
//! Buffers move into the kernel by ownership, as for disks: a receive fills
//! an [`AlignedBuf`] that can go to an O_DIRECT write as it is, and a send
//! takes the frames' buffers and gives them back when the kernel is done.
//! A task blocked in `recv` is released by [`Stream::shutdown`] from any
//! other task (the recv returns 0, end of stream).
//!
//! Networking needs io_uring; without a ring these calls fail with
//! `Unsupported` (the pread fallback exists for disks only).

use std::io;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use io_uring::{opcode, types};

use crate::buf::{AlignedBuf, SendBuf};
use crate::rt::{self, Resources};

/// Longest wait for a TCP connection to be set up (a LAN takes well under
/// a millisecond; one that needs longer is taken for unreachable).
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1_000);

/// Where a service listens: `unix:PATH` or `tcp:HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addr {
    Unix(PathBuf),
    Tcp(String),
}

impl std::str::FromStr for Addr {
    type Err = String;
    fn from_str(s: &str) -> Result<Addr, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("unix: address needs a path".into());
            }
            Ok(Addr::Unix(PathBuf::from(p)))
        } else if let Some(hp) = s.strip_prefix("tcp:") {
            match hp.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {
                    Ok(Addr::Tcp(hp.to_string()))
                }
                _ => Err(format!("tcp address {hp:?} must be HOST:PORT")),
            }
        } else {
            Err(format!("address {s:?} must start with unix: or tcp:"))
        }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
            Addr::Tcp(hp) => write!(f, "tcp:{hp}"),
        }
    }
}

fn need_ring() -> io::Result<()> {
    if rt::has_uring() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "networking needs io_uring (unset NACRE_NO_URING)",
        ))
    }
}

fn set_nodelay(fd: RawFd) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one int; failure (not a TCP socket) is harmless.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// A listening socket.
pub struct Listener {
    fd: OwnedFd,
    tcp: bool,
    local: Addr,
}

impl Listener {
    /// Binds `addr`; a stale unix socket file is replaced.
    pub fn bind(addr: &Addr) -> io::Result<Listener> {
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("listen on {addr}: {e}"));
        match addr {
            Addr::Unix(p) => {
                if p.exists() && UnixStream::connect(p).is_err() {
                    std::fs::remove_file(p).map_err(ctx)?;
                }
                let l = UnixListener::bind(p).map_err(ctx)?;
                Ok(Listener {
                    fd: OwnedFd::from(l),
                    tcp: false,
                    local: addr.clone(),
                })
            }
            Addr::Tcp(hp) => {
                let l = TcpListener::bind(hp.as_str()).map_err(ctx)?;
                let local = Addr::Tcp(l.local_addr()?.to_string());
                Ok(Listener {
                    fd: OwnedFd::from(l),
                    tcp: true,
                    local,
                })
            }
        }
    }

    /// Stops listening: an accept in flight fails, and new connections
    /// are refused (even while the descriptor is still open).
    pub fn shutdown(&self) {
        // SAFETY: shutdown on our own descriptor.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> &Addr {
        &self.local
    }

    pub async fn accept(&self) -> io::Result<Stream> {
        need_ring()?;
        let entry = opcode::Accept::new(
            types::Fd(self.fd.as_raw_fd()),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .flags(libc::SOCK_CLOEXEC)
        .build();
        let (res, _) = rt::submit(entry, Resources::None).await;
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        // SAFETY: accept returned a new descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(res) };
        if self.tcp {
            set_nodelay(fd.as_raw_fd());
        }
        Ok(Stream { fd })
    }
}

/// A connected stream socket.
pub struct Stream {
    fd: OwnedFd,
}

impl Stream {
    /// Connects to `addr` (a blocking connect: loopback and unix sockets
    /// answer at once).
    pub fn connect(addr: &Addr) -> io::Result<Stream> {
        let ctx = |e: io::Error| io::Error::new(e.kind(), format!("connect to {addr}: {e}"));
        let fd = match addr {
            Addr::Unix(p) => OwnedFd::from(UnixStream::connect(p).map_err(ctx)?),
            Addr::Tcp(hp) => {
                let sa = hp
                    .to_socket_addrs()
                    .map_err(ctx)?
                    .next()
                    .ok_or_else(|| ctx(io::Error::other("no address")))?;
                // Blocking, but bounded: a host that is gone (no ARP answer,
                // no RST) would otherwise hold the thread for the kernel's
                // SYN retries, minutes.
                let s = TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT).map_err(ctx)?;
                s.set_nodelay(true)?;
                OwnedFd::from(s)
            }
        };
        Ok(Stream { fd })
    }

    /// Wraps a connected socket.
    pub fn from_fd(fd: OwnedFd) -> Stream {
        Stream { fd }
    }

    pub fn into_fd(self) -> RawFd {
        self.fd.into_raw_fd()
    }

    /// Receives into `buf[start..]`; returns the byte count (0 = end of
    /// stream) and the buffer.
    pub async fn recv(&self, buf: AlignedBuf, start: usize) -> (io::Result<usize>, AlignedBuf) {
        self.recv_at_most(buf, start, usize::MAX).await
    }

    /// [`Stream::recv`] of at most `max` bytes (at least 1).
    pub async fn recv_at_most(
        &self,
        mut buf: AlignedBuf,
        start: usize,
        max: usize,
    ) -> (io::Result<usize>, AlignedBuf) {
        if let Err(e) = need_ring() {
            return (Err(e), buf);
        }
        assert!(start < buf.len(), "recv into a full buffer");
        assert!(max > 0, "recv of nothing");
        // SAFETY: the pointer stays inside the buffer, which the op owns.
        let ptr = unsafe { buf.as_mut_ptr().add(start) };
        let n = (buf.len() - start).min(max).min(u32::MAX as usize) as u32;
        let entry = opcode::Recv::new(types::Fd(self.fd.as_raw_fd()), ptr, n).build();
        let (res, r) = rt::submit(entry, Resources::Buf(buf)).await;
        let Resources::Buf(buf) = r else {
            unreachable!("recv returned other resources")
        };
        if res < 0 {
            (Err(io::Error::from_raw_os_error(-res)), buf)
        } else {
            (Ok(res as usize), buf)
        }
    }

    /// Fills `buf[start..]` completely; end of stream first is an error.
    pub async fn recv_exact(
        &self,
        mut buf: AlignedBuf,
        mut start: usize,
    ) -> io::Result<AlignedBuf> {
        while start < buf.len() {
            let (r, b) = self.recv(buf, start).await;
            buf = b;
            match r? {
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed mid-message",
                    ))
                }
                n => start += n,
            }
        }
        Ok(buf)
    }

    /// Sends every byte of `parts` (each `(buffer, start, end)`) with
    /// gathered writes.
    pub async fn send_all(&self, parts: Vec<(SendBuf, usize, usize)>) -> io::Result<()> {
        self.send_all_noting(parts, || {}).await
    }

    /// [`Stream::send_all`], calling `progress` after each write that
    /// sent something (a watchdog tells a slow peer from one that stopped).
    pub async fn send_all_noting(
        &self,
        parts: Vec<(SendBuf, usize, usize)>,
        mut progress: impl FnMut(),
    ) -> io::Result<()> {
        need_ring()?;
        let mut iov = Vec::with_capacity(parts.len());
        let mut bufs = Vec::with_capacity(parts.len());
        for (b, s, e) in parts {
            assert!(s <= e && e <= b.len(), "send range {s}..{e} outside buffer");
            if e > s {
                iov.push(libc::iovec {
                    // SAFETY: inside the buffer, which the op owns.
                    iov_base: unsafe { b.as_ptr().add(s) } as *mut libc::c_void,
                    iov_len: e - s,
                });
            }
            bufs.push(b);
        }
        let mut first = 0;
        while first < iov.len() {
            let cnt = (iov.len() - first).min(libc::UIO_MAXIOV as usize);
            // SAFETY: an all-zero msghdr is valid (no name, no control).
            let mut hdr: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
            // SAFETY: iovecs live in the Vec the op owns; its heap block
            // does not move when the Vec moves, nor does the boxed header.
            hdr.msg_iov = unsafe { iov.as_mut_ptr().add(first) };
            hdr.msg_iovlen = cnt;
            // MSG_NOSIGNAL: a peer that went away is an EPIPE, not a signal.
            let entry = opcode::SendMsg::new(types::Fd(self.fd.as_raw_fd()), &*hdr)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build();
            let (res, r) = rt::submit(entry, Resources::Msg(bufs, iov, hdr)).await;
            let Resources::Msg(b, v, _) = r else {
                unreachable!("sendmsg returned other resources")
            };
            bufs = b;
            iov = v;
            if res < 0 {
                return Err(io::Error::from_raw_os_error(-res));
            }
            if res == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "peer stopped reading",
                ));
            }
            progress();
            let mut n = res as usize;
            while n > 0 {
                let v = &mut iov[first];
                if n >= v.iov_len {
                    n -= v.iov_len;
                    first += 1;
                } else {
                    // SAFETY: advancing inside the same buffer.
                    v.iov_base = unsafe { (v.iov_base as *mut u8).add(n) } as *mut libc::c_void;
                    v.iov_len -= n;
                    n = 0;
                }
            }
        }
        Ok(())
    }

    /// Sends a small message (copied into a buffer first): handshakes and
    /// other control traffic, not payloads.
    pub async fn send_bytes(&self, bytes: &[u8]) -> io::Result<()> {
        let b = AlignedBuf::from_slice(bytes).into();
        self.send_all(vec![(b, 0, bytes.len())]).await
    }

    /// The peer's address for messages: `HOST:PORT` over TCP, else "on a
    /// unix socket".
    pub fn peer(&self) -> String {
        // SAFETY: the TcpStream borrows our descriptor for one call and is
        // never dropped (ManuallyDrop), so the descriptor stays ours.
        let s = std::mem::ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(self.fd.as_raw_fd()) });
        s.peer_addr()
            .map_or_else(|_| "on a unix socket".into(), |a| a.to_string())
    }

    /// Ends the connection both ways; pending and later recvs return 0.
    pub fn shutdown(&self) {
        // SAFETY: shutdown on our own descriptor.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// Ends the sending side (the peer reads to the end of what was
    /// sent, then end of stream); receiving goes on.
    pub fn shutdown_write(&self) {
        // SAFETY: shutdown on our own descriptor.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_WR) };
    }
}

/// A wake-up another thread can fire (an eventfd read through the ring).
pub struct Event {
    fd: OwnedFd,
}

impl Event {
    pub fn new() -> io::Result<Event> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: we own the new descriptor.
        Ok(Event {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Fires the event; callable from any thread.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to our eventfd.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }

    /// Waits until the event has been fired (at least once since the last wait).
    pub async fn wait(&self) -> io::Result<()> {
        need_ring()?;
        let mut buf = AlignedBuf::new(8);
        let entry = opcode::Read::new(types::Fd(self.fd.as_raw_fd()), buf.as_mut_ptr(), 8).build();
        let (res, _) = rt::submit(entry, Resources::Buf(buf)).await;
        if res < 0 {
            return Err(io::Error::from_raw_os_error(-res));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::{block_on, spawn};

    #[test]
    fn addr_parses() {
        assert_eq!("unix:/a/b".parse::<Addr>(), Ok(Addr::Unix("/a/b".into())));
        assert_eq!(
            "tcp:127.0.0.1:80".parse::<Addr>(),
            Ok(Addr::Tcp("127.0.0.1:80".into()))
        );
        assert!("tcp:nohost".parse::<Addr>().is_err());
        assert!("tcp:h:99999".parse::<Addr>().is_err());
        assert!("/path".parse::<Addr>().is_err());
        assert!("unix:".parse::<Addr>().is_err());
    }

    fn echo(addr: Addr) {
        block_on(async move {
            let l = Listener::bind(&addr).unwrap();
            let local = l.local_addr().clone();
            let server = spawn(async move {
                let s = l.accept().await.unwrap();
                let mut buf = AlignedBuf::new(100_000);
                let mut got = 0;
                loop {
                    let (r, b) = s.recv(buf, got).await;
                    buf = b;
                    match r.unwrap() {
                        0 => break,
                        n => got += n,
                    }
                    if got == buf.len() {
                        break;
                    }
                }
                s.send_all(vec![(buf.into(), 0, got)]).await.unwrap();
                got
            });
            let c = Stream::connect(&local).unwrap();
            let a = AlignedBuf::from_slice(&[7u8; 60_000]);
            // The second part shared, as a primary shares a payload between
            // its replicas' sends: it goes out as it is and stays whole.
            let b = crate::SharedBuf::new(AlignedBuf::from_slice(&[9u8; 40_000]));
            c.send_all(vec![(a.into(), 0, 60_000), (b.clone().into(), 0, 40_000)])
                .await
                .unwrap();
            assert!(b.iter().all(|&x| x == 9));
            let back = c.recv_exact(AlignedBuf::new(100_000), 0).await.unwrap();
            assert!(back[..60_000].iter().all(|&x| x == 7));
            assert!(back[60_000..].iter().all(|&x| x == 9));
            assert_eq!(server.await, 100_000);
        });
    }

    #[test]
    fn tcp_and_unix_echo() {
        echo("tcp:127.0.0.1:0".parse().unwrap());
        let dir = tempfile::tempdir().unwrap();
        echo(Addr::Unix(dir.path().join("s.sock")));
    }

    #[test]
    fn shutdown_releases_a_blocked_recv() {
        block_on(async {
            let (a, _b) = UnixStream::pair().unwrap();
            let s = std::rc::Rc::new(Stream::from_fd(OwnedFd::from(a)));
            let s2 = s.clone();
            let h = spawn(async move { s2.recv(AlignedBuf::new(10), 0).await.0.unwrap() });
            crate::rt::yield_now().await;
            s.shutdown();
            assert_eq!(h.await, 0);
        });
    }

    #[test]
    fn event_wakes_from_another_thread() {
        block_on(async {
            let ev = std::sync::Arc::new(Event::new().unwrap());
            let e2 = ev.clone();
            let t = std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(10));
                e2.signal();
            });
            ev.wait().await.unwrap();
            t.join().unwrap();
        });
    }
}
