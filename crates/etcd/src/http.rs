//! Just enough HTTP/1.1 to speak to etcd's JSON gateway: one POST per
//! connection (`Connection: close`), a JSON body each way, the response
//! body either whole (unary calls) or as a stream of JSON messages (a
//! watch). Every read and write has a deadline; every length read from the
//! peer is bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Largest response header block accepted.
const HEAD_MAX_BYTES: usize = 64 << 10;
/// Largest unary response body accepted (a range over the whole cluster
/// state: maps of many PGs, every volume record).
pub const BODY_MAX_BYTES: usize = 256 << 20;
/// Largest single chunk of a streamed body.
const CHUNK_MAX_BYTES: usize = 64 << 20;

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
                    s.set_read_timeout(Some(timeout))
                        .and_then(|()| s.set_write_timeout(Some(timeout)))
                        .map_err(|e| HttpError::Connect(e.to_string()))?;
                    return Ok(s);
                }
                Err(e) => last = format!("{}: {e}", self.host_port),
            }
        }
        Err(HttpError::Connect(last))
    }

    /// Sends `body` to `path`; the response's status, and a reader at the
    /// start of its body (`chunked`: whether it is chunked).
    pub fn post(&self, path: &str, body: &[u8], timeout: Duration) -> Result<Response, HttpError> {
        let mut s = self.connect(timeout)?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.host_port,
            body.len()
        );
        let sent = s
            .write_all(head.as_bytes())
            .and_then(|()| s.write_all(body));
        sent.map_err(|e| HttpError::Io(format!("{}: sending: {e}", self.host_port)))?;
        let stream = s.try_clone().map_err(|e| HttpError::Io(e.to_string()))?;
        let mut r = BufReader::new(s);
        let (status, chunked, length) = read_head(&mut r)?;
        Ok(Response {
            status,
            chunked,
            length,
            reader: r,
            stream,
            done: false,
        })
    }
}

pub struct Response {
    pub status: u16,
    chunked: bool,
    length: Option<usize>,
    reader: BufReader<TcpStream>,
    /// The connection, to shut it down from another thread.
    pub stream: TcpStream,
    done: bool,
}

impl Response {
    /// The whole body (bounded by [`BODY_MAX_BYTES`]).
    pub fn body(mut self) -> Result<Vec<u8>, HttpError> {
        if self.chunked {
            let mut out = Vec::new();
            while let Some(c) = self.chunk()? {
                if out.len() + c.len() > BODY_MAX_BYTES {
                    return Err(HttpError::Protocol("response body too large".into()));
                }
                out.extend_from_slice(&c);
            }
            return Ok(out);
        }
        let mut out = Vec::new();
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

    /// Sets how long a read of the stream may wait (a watch waits for
    /// events longer than a call waits for its answer).
    pub fn set_read_timeout(&self, t: Option<Duration>) {
        let _ = self.stream.set_read_timeout(t);
    }
}

fn read_line(r: &mut BufReader<TcpStream>) -> Result<String, HttpError> {
    let mut line = Vec::new();
    let n = (r
        .by_ref()
        .take(HEAD_MAX_BYTES as u64)
        .read_until(b'\n', &mut line))
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
fn read_head(r: &mut BufReader<TcpStream>) -> Result<(u16, bool, Option<usize>), HttpError> {
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
    use super::Endpoint;

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
}
