//! Just enough HTTP/1.1 to speak to etcd's JSON gateway: one POST per
//! connection (`Connection: close`), a JSON body each way; the answer read
//! whole within a deadline (unary calls), or as a stream of chunks without
//! one (a watch: TCP keepalives find a peer that vanished). Every length
//! read from the peer is bounded.

use std::io::{BufRead, BufReader, Cursor, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Largest response header block accepted.
const HEAD_MAX_BYTES: usize = 64 << 10;
/// Largest unary response body accepted (a range over the whole cluster
/// state: maps of many PGs, every volume record).
pub const BODY_MAX_BYTES: usize = 256 << 20;
/// Largest single chunk of a streamed body.
pub const CHUNK_MAX_BYTES: usize = 64 << 20;
/// A streamed connection's peer that stops answering TCP keepalives is
/// taken for gone after about idle + interval × count seconds.
const KEEPALIVE_IDLE_S: i32 = 5;
const KEEPALIVE_INTERVAL_S: i32 = 2;
const KEEPALIVE_COUNT: i32 = 3;

/// Why a call failed, and whether the request can have reached etcd.
#[derive(Debug)]
pub enum HttpError {
    /// No connection was made: nothing was sent.
    Connect(String),
    /// Sent (or partly): the outcome is unknown.
    Io(String),
    /// The peer answered something that is not HTTP as expected.
    Protocol(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Connect(e) => write!(f, "cannot connect: {e}"),
            HttpError::Io(e) => write!(f, "{e}"),
            HttpError::Protocol(e) => write!(f, "not an etcd answer: {e}"),
        }
    }
}

/// An endpoint: `host:port`, from `http://host:port`.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub host_port: String,
}

impl Endpoint {
    /// Parses one URL of `--etcd`: `http://HOST:PORT` (a trailing `/` is
    /// allowed); TLS is not supported, and said so.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let url = url.trim();
        if url.starts_with("https://") {
            return Err(format!(
                "{url}: TLS to etcd is not supported yet (use http://)"
            ));
        }
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url}: an etcd URL is http://HOST:PORT"))?;
        let host_port = rest.trim_end_matches('/');
        let (host, port) = host_port
            .rsplit_once(':')
            .ok_or_else(|| format!("{url}: no port (http://HOST:PORT)"))?;
        if host.is_empty() || host_port.contains('/') || port.parse::<u16>().is_err() {
            return Err(format!("{url}: an etcd URL is http://HOST:PORT"));
        }
        Ok(Endpoint {
            host_port: host_port.to_string(),
        })
    }

    fn connect(&self, timeout: Duration) -> Result<TcpStream, HttpError> {
        let addrs = (self.host_port.to_socket_addrs())
            .map_err(|e| HttpError::Connect(format!("{}: {e}", self.host_port)))?;
        let mut last = format!("{}: no address", self.host_port);
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    (s.set_write_timeout(Some(timeout)))
                        .map_err(|e| HttpError::Connect(e.to_string()))?;
                    return Ok(s);
                }
                Err(e) => last = format!("{}: {e}", self.host_port),
            }
        }
        Err(HttpError::Connect(last))
    }

    fn send(
        &self,
        path: &str,
        body: &[u8],
        headers: &str,
        timeout: Duration,
    ) -> Result<TcpStream, HttpError> {
        let mut s = self.connect(timeout)?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n",
            self.host_port,
            body.len()
        );
        let sent = (s.write_all(head.as_bytes())).and_then(|()| s.write_all(body));
        sent.map_err(|e| HttpError::Io(format!("{}: sending: {e}", self.host_port)))?;
        Ok(s)
    }

    /// Sends `body` to `path` and reads the whole answer, all within
    /// `timeout`: its status and body.
    pub fn post(
        &self,
        path: &str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<(u16, Vec<u8>), HttpError> {
        let deadline = Instant::now() + timeout;
        let mut s = self.send(path, body, "", timeout)?;
        let mut all = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(HttpError::Io(format!(
                    "{}: no whole answer within {} ms",
                    self.host_port,
                    timeout.as_millis()
                )));
            }
            (s.set_read_timeout(Some(left))).map_err(|e| HttpError::Io(e.to_string()))?;
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(HttpError::Io(format!("{}: {e}", self.host_port))),
            }
            if all.len() > BODY_MAX_BYTES + HEAD_MAX_BYTES {
                return Err(HttpError::Protocol("response too large".into()));
            }
        }
        let mut r = Response::start(BufReader::new(Cursor::new(all)))?;
        Ok((r.status, r.body()?))
    }

    /// Sends `body` to `path` with the extra `headers` (each ending in
    /// CRLF), for an answer that streams: the response once its head has
    /// come (within `timeout`), then read without a deadline (TCP
    /// keepalives end it if the peer vanishes), and the connection, to
    /// shut it down from another thread.
    pub fn post_stream(
        &self,
        path: &str,
        body: &[u8],
        headers: &str,
        timeout: Duration,
    ) -> Result<(Response<TcpStream>, TcpStream), HttpError> {
        let s = self.send(path, body, headers, timeout)?;
        keepalive(&s);
        let conn = s.try_clone().map_err(|e| HttpError::Io(e.to_string()))?;
        (conn.set_read_timeout(Some(timeout))).map_err(|e| HttpError::Io(e.to_string()))?;
        let r = Response::start(BufReader::new(s))?;
        (conn.set_read_timeout(None)).map_err(|e| HttpError::Io(e.to_string()))?;
        Ok((r, conn))
    }
}

/// Turns on TCP keepalives with short intervals (best effort: without
/// them a vanished peer is noticed later, not never: the caller's own
/// checks still run).
fn keepalive(s: &TcpStream) {
    let fd = s.as_raw_fd();
    let set = |level: i32, name: i32, v: i32| {
        // SAFETY: setsockopt on our own socket, with a valid int.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&v as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_S);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_COUNT);
}

pub struct Response<R: Read> {
    pub status: u16,
    chunked: bool,
    length: Option<usize>,
    reader: BufReader<R>,
    done: bool,
}

impl<R: Read> Response<R> {
    pub(crate) fn start(mut reader: BufReader<R>) -> Result<Response<R>, HttpError> {
        let (status, chunked, length) = read_head(&mut reader)?;
        Ok(Response {
            status,
            chunked,
            length,
            reader,
            done: false,
        })
    }

    /// The whole body (bounded by [`BODY_MAX_BYTES`]).
    pub fn body(&mut self) -> Result<Vec<u8>, HttpError> {
        let mut out = Vec::new();
        if self.chunked {
            while let Some(c) = self.chunk()? {
                if out.len() + c.len() > BODY_MAX_BYTES {
                    return Err(HttpError::Protocol("response body too large".into()));
                }
                out.extend_from_slice(&c);
            }
            return Ok(out);
        }
        match self.length {
            Some(n) if n > BODY_MAX_BYTES => {
                Err(HttpError::Protocol(format!("response body of {n} bytes")))
            }
            Some(n) => {
                out.resize(n, 0);
                (self.reader.read_exact(&mut out)).map_err(|e| HttpError::Io(e.to_string()))?;
                Ok(out)
            }
            None => {
                let mut r = (&mut self.reader).take(BODY_MAX_BYTES as u64 + 1);
                (r.read_to_end(&mut out)).map_err(|e| HttpError::Io(e.to_string()))?;
                if out.len() > BODY_MAX_BYTES {
                    return Err(HttpError::Protocol("response body too large".into()));
                }
                Ok(out)
            }
        }
    }

    /// The next chunk of a chunked body; `None` at its end.
    pub fn chunk(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
        if self.done {
            return Ok(None);
        }
        let line = read_line(&mut self.reader)?;
        let size = line.split(';').next().unwrap_or("").trim();
        let n = usize::from_str_radix(size, 16)
            .map_err(|_| HttpError::Protocol(format!("chunk size {line:?}")))?;
        if n > CHUNK_MAX_BYTES {
            return Err(HttpError::Protocol(format!("a chunk of {n} bytes")));
        }
        if n == 0 {
            self.done = true;
            return Ok(None);
        }
        let mut c = vec![0; n + 2];
        (self.reader.read_exact(&mut c)).map_err(|e| HttpError::Io(e.to_string()))?;
        if &c[n..] != b"\r\n" {
            return Err(HttpError::Protocol("a chunk not followed by CRLF".into()));
        }
        c.truncate(n);
        Ok(Some(c))
    }
}

fn read_line(r: &mut impl BufRead) -> Result<String, HttpError> {
    let mut line = Vec::new();
    let n = (r.take(HEAD_MAX_BYTES as u64).read_until(b'\n', &mut line))
        .map_err(|e| HttpError::Io(e.to_string()))?;
    if n == 0 {
        return Err(HttpError::Io("connection closed".into()));
    }
    if line.last() != Some(&b'\n') {
        return Err(HttpError::Protocol("a line too long".into()));
    }
    let s = String::from_utf8(line).map_err(|_| HttpError::Protocol("not UTF-8".into()))?;
    Ok(s.trim_end_matches(['\r', '\n']).to_string())
}

/// The status line and headers: status, chunked, content length.
fn read_head(r: &mut impl BufRead) -> Result<(u16, bool, Option<usize>), HttpError> {
    let status_line = read_line(r)?;
    let mut parts = status_line.split_whitespace();
    let status = match (parts.next(), parts.next()) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => code.parse::<u16>().ok(),
        _ => None,
    }
    .ok_or_else(|| HttpError::Protocol(format!("status line {status_line:?}")))?;
    let (mut chunked, mut length, mut total) = (false, None, 0);
    loop {
        let line = read_line(r)?;
        total += line.len();
        if total > HEAD_MAX_BYTES {
            return Err(HttpError::Protocol("headers too long".into()));
        }
        if line.is_empty() {
            return Ok((status, chunked, length));
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(HttpError::Protocol(format!("header {line:?}")));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            let n = value.parse::<usize>();
            length = Some(n.map_err(|_| HttpError::Protocol(format!("content length {value:?}")))?);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Endpoint, Response};
    use std::io::{BufReader, Cursor};

    #[test]
    fn endpoints_parse_and_refuse_what_is_not_http() {
        assert_eq!(
            Endpoint::parse("http://10.0.0.1:2379").unwrap().host_port,
            "10.0.0.1:2379"
        );
        assert_eq!(
            Endpoint::parse(" http://etcd-a:2379/ ").unwrap().host_port,
            "etcd-a:2379"
        );
        for bad in [
            "10.0.0.1:2379",
            "http://h",
            "http://h:x",
            "http://:1",
            "http://h:1/v3",
            "ftp://h:1",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
        assert!(Endpoint::parse("https://h:2379")
            .unwrap_err()
            .contains("TLS"));
    }

    fn response(raw: &[u8]) -> Result<Vec<u8>, super::HttpError> {
        Response::start(BufReader::new(Cursor::new(raw.to_vec()))).and_then(|mut r| r.body())
    }

    /// Chunked and sized bodies decode; a bad chunk size, a chunk without
    /// its CRLF, a huge chunk or length, and a non-HTTP answer are refused.
    #[test]
    fn bodies_decode_and_bad_ones_are_refused() {
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n2\r\n\":\r\n2\r\n1}\r\n0\r\n\r\n";
        assert_eq!(response(chunked).unwrap(), b"{\"a\":1}");
        let sized = b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(response(sized).unwrap(), b"{}");
        for bad in [
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffff\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n",
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        ] {
            assert!(response(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
