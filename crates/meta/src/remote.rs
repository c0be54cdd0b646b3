//! The meta store over a unix socket: [`serve`] exposes any [`MetaStore`]
//! (the embedded one, inside `nacre up`), [`Remote`] is the client the CLI
//! uses to reach it.
//!
//! One JSON object per line each way. A watch request turns its connection
//! into a stream of event lines until the client closes it. Requests are
//! bounded in size; a malformed line gets an error line and the connection
//! stays usable.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::types::*;

/// Largest request line accepted (a put carries at most one value).
const LINE_MAX_BYTES: u64 = 4 << 20;
/// Connections served at once.
const CONN_MAX: usize = 64;

#[derive(Serialize, Deserialize)]
enum Request {
    Range(Range),
    Txn(Txn),
    Watch(Range, Revision),
    LeaseGrant(i64),
    LeaseKeepalive(LeaseId),
    LeaseRevoke(LeaseId),
}

#[derive(Serialize, Deserialize)]
enum Response {
    Range(Vec<KeyValue>, Revision),
    Txn(TxnResponse),
    Events(Vec<Event>),
    Lease(LeaseId),
    Ttl(i64),
    Done,
    Error(ErrorKind, String),
}

#[derive(Serialize, Deserialize)]
enum ErrorKind {
    Compacted(Revision, Revision),
    LeaseNotFound(LeaseId),
    Invalid,
    Other,
}

fn to_wire(e: MetaError) -> Response {
    let msg = e.to_string();
    let kind = match e {
        MetaError::Compacted { asked, oldest } => ErrorKind::Compacted(asked, oldest),
        MetaError::LeaseNotFound(id) => ErrorKind::LeaseNotFound(id),
        MetaError::Invalid(_) => ErrorKind::Invalid,
        _ => ErrorKind::Other,
    };
    Response::Error(kind, msg)
}

fn from_wire(kind: ErrorKind, msg: String) -> MetaError {
    match kind {
        ErrorKind::Compacted(asked, oldest) => MetaError::Compacted { asked, oldest },
        ErrorKind::LeaseNotFound(id) => MetaError::LeaseNotFound(id),
        ErrorKind::Invalid => MetaError::Invalid(msg),
        ErrorKind::Other => MetaError::Unavailable(msg),
    }
}

/// Serves `store` on the unix socket `path` from a background thread.
pub fn serve(store: Arc<dyn MetaStore>, path: &Path) -> std::io::Result<()> {
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    let active = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("meta-serve".into())
        .spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { continue };
                use std::sync::atomic::Ordering::SeqCst;
                if active.fetch_add(1, SeqCst) >= CONN_MAX {
                    active.fetch_sub(1, SeqCst);
                    tracing::warn!("meta socket: too many connections, refusing one");
                    continue;
                }
                let store = store.clone();
                let active = active.clone();
                let _ = std::thread::Builder::new()
                    .name("meta-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve_conn(&*store, conn) {
                            tracing::debug!("meta connection ended: {e}");
                        }
                        active.fetch_sub(1, SeqCst);
                    });
            }
        })?;
    Ok(())
}

fn send(w: &mut UnixStream, r: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).expect("responses serialise");
    line.push(b'\n');
    w.write_all(&line)
}

fn serve_conn(store: &dyn MetaStore, conn: UnixStream) -> std::io::Result<()> {
    let mut w = conn.try_clone()?;
    let mut rd = BufReader::new(conn);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut rd)
            .take(LINE_MAX_BYTES)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            send(
                &mut w,
                &Response::Error(ErrorKind::Invalid, "request line too long".into()),
            )?;
            return Ok(());
        }
        let req: Request = match serde_json::from_slice(&line) {
            Ok(r) => r,
            Err(e) => {
                send(
                    &mut w,
                    &Response::Error(ErrorKind::Invalid, format!("bad request: {e}")),
                )?;
                continue;
            }
        };
        let resp = match req {
            Request::Range(r) => store.range(&r).map(|(kvs, rev)| Response::Range(kvs, rev)),
            Request::Txn(t) => store.txn(t).map(Response::Txn),
            Request::LeaseGrant(ttl) => store.lease_grant(ttl).map(Response::Lease),
            Request::LeaseKeepalive(id) => store.lease_keepalive(id).map(Response::Ttl),
            Request::LeaseRevoke(id) => store.lease_revoke(id).map(|_| Response::Done),
            Request::Watch(r, start) => {
                let watch = match store.watch(&r, start) {
                    Ok(w) => w,
                    Err(e) => {
                        send(&mut w, &to_wire(e))?;
                        continue;
                    }
                };
                send(&mut w, &Response::Done)?;
                return stream_watch(watch, w);
            }
        };
        send(&mut w, &resp.unwrap_or_else(to_wire))?;
    }
}

fn stream_watch(watch: Watch, mut w: UnixStream) -> std::io::Result<()> {
    loop {
        match watch.next(Duration::from_secs(1)) {
            Ok(Some(evs)) => send(&mut w, &Response::Events(evs))?,
            // An empty batch doubles as a liveness probe of the client.
            Ok(None) => send(&mut w, &Response::Events(Vec::new()))?,
            Err(e) => return send(&mut w, &to_wire(e)),
        }
    }
}

/// A client of a store served by [`serve`].
pub struct Remote {
    path: PathBuf,
    conn: Mutex<Option<(UnixStream, BufReader<UnixStream>)>>,
}

impl Remote {
    /// Connects to the socket at `path`.
    pub fn connect(path: &Path) -> Result<Remote> {
        let r = Remote {
            path: path.to_path_buf(),
            conn: Mutex::new(None),
        };
        *r.conn.lock().expect("fresh mutex") = Some(r.dial()?);
        Ok(r)
    }

    fn dial(&self) -> Result<(UnixStream, BufReader<UnixStream>)> {
        let s = UnixStream::connect(&self.path)
            .map_err(|e| MetaError::Unavailable(format!("connect {}: {e}", self.path.display())))?;
        let r = s
            .try_clone()
            .map_err(|e| MetaError::Unavailable(e.to_string()))?;
        Ok((s, BufReader::new(r)))
    }

    fn call(&self, req: &Request) -> Result<Response> {
        let mut g = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(self.dial()?);
        }
        let (w, r) = g.as_mut().expect("connected above");
        let res = exchange(w, r, req);
        if res.is_err() {
            // The request may or may not have been applied; never resend
            // it, but do not reuse a broken connection either.
            *g = None;
        }
        match res? {
            Response::Error(k, m) => Err(from_wire(k, m)),
            other => Ok(other),
        }
    }
}

fn exchange(w: &mut UnixStream, r: &mut BufReader<UnixStream>, req: &Request) -> Result<Response> {
    let io = |e: std::io::Error| MetaError::Unavailable(format!("meta socket: {e}"));
    let mut line = serde_json::to_vec(req).expect("requests serialise");
    line.push(b'\n');
    w.write_all(&line).map_err(io)?;
    read_response(r)
}

fn read_response(r: &mut BufReader<UnixStream>) -> Result<Response> {
    let mut line = Vec::new();
    let n = r
        .take(LINE_MAX_BYTES * 4)
        .read_until(b'\n', &mut line)
        .map_err(|e| MetaError::Unavailable(format!("meta socket: {e}")))?;
    if n == 0 || line.last() != Some(&b'\n') {
        return Err(MetaError::Unavailable("meta socket closed".into()));
    }
    serde_json::from_slice(&line).map_err(|e| MetaError::Unavailable(format!("bad response: {e}")))
}

fn unexpected<T>(r: Response) -> Result<T> {
    let what = serde_json::to_string(&r).unwrap_or_default();
    Err(MetaError::Unavailable(format!(
        "unexpected response {what}"
    )))
}

impl MetaStore for Remote {
    fn range(&self, r: &Range) -> Result<(Vec<KeyValue>, Revision)> {
        match self.call(&Request::Range(r.clone()))? {
            Response::Range(kvs, rev) => Ok((kvs, rev)),
            o => unexpected(o),
        }
    }

    fn txn(&self, t: Txn) -> Result<TxnResponse> {
        match self.call(&Request::Txn(t))? {
            Response::Txn(t) => Ok(t),
            o => unexpected(o),
        }
    }

    fn watch(&self, r: &Range, start: Revision) -> Result<Watch> {
        let (mut w, mut rd) = self.dial()?;
        match exchange(&mut w, &mut rd, &Request::Watch(r.clone(), start))? {
            Response::Done => {}
            Response::Error(k, m) => return Err(from_wire(k, m)),
            o => return unexpected(o),
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(16);
        let closer = w
            .try_clone()
            .map_err(|e| MetaError::Unavailable(e.to_string()))?;
        std::thread::Builder::new()
            .name("meta-watch".into())
            .spawn(move || loop {
                let item = match read_response(&mut rd) {
                    Ok(Response::Events(evs)) if evs.is_empty() => continue,
                    Ok(Response::Events(evs)) => Ok(evs),
                    Ok(Response::Error(k, m)) => Err(from_wire(k, m)),
                    Ok(o) => unexpected(o),
                    Err(e) => Err(MetaError::WatchEnded(e.to_string())),
                };
                let end = item.is_err();
                if tx.send(item).is_err() || end {
                    return;
                }
            })
            .map_err(|e| MetaError::Unavailable(e.to_string()))?;
        drop(w);
        Ok(Watch {
            rx,
            cancel: Some(Box::new(move || {
                let _ = closer.shutdown(std::net::Shutdown::Both);
            })),
        })
    }

    fn lease_grant(&self, ttl_s: i64) -> Result<LeaseId> {
        match self.call(&Request::LeaseGrant(ttl_s))? {
            Response::Lease(id) => Ok(id),
            o => unexpected(o),
        }
    }

    fn lease_keepalive(&self, id: LeaseId) -> Result<i64> {
        match self.call(&Request::LeaseKeepalive(id))? {
            Response::Ttl(t) => Ok(t),
            o => unexpected(o),
        }
    }

    fn lease_revoke(&self, id: LeaseId) -> Result<()> {
        match self.call(&Request::LeaseRevoke(id))? {
            Response::Done => Ok(()),
            o => unexpected(o),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::Embedded;

    #[test]
    fn remote_matches_embedded() {
        let d = tempfile::tempdir().unwrap();
        let e = Embedded::open(&d.path().join("m")).unwrap();
        let sock = d.path().join("meta.sock");
        serve(e.clone(), &sock).unwrap();
        let r = Remote::connect(&sock).unwrap();
        let w = r.watch(&Range::prefix("/v/"), 0).unwrap();
        assert_eq!(r.put("/v/a", b"1".to_vec(), 0).unwrap(), 1);
        assert_eq!(e.get("/v/a").unwrap().unwrap().value, b"1");
        let t = Txn {
            compare: vec![Compare::Version("/v/a".into(), CmpOp::Equal, 0)],
            success: vec![],
            failure: vec![TxnOp::Get(Range::prefix("/v/"))],
        };
        let resp = r.txn(t).unwrap();
        assert!(!resp.succeeded);
        let evs = w.next(Duration::from_secs(5)).unwrap().unwrap();
        assert_eq!(evs[0].kv.key, "/v/a");
        let l = r.lease_grant(30).unwrap();
        assert_eq!(r.lease_keepalive(l).unwrap(), 30);
        r.lease_revoke(l).unwrap();
        assert!(matches!(
            r.lease_keepalive(l),
            Err(MetaError::LeaseNotFound(_))
        ));
        // a garbage line gets an error and the connection keeps working
        let mut raw = UnixStream::connect(&sock).unwrap();
        raw.write_all(b"{not json\n").unwrap();
        let mut rd = BufReader::new(raw.try_clone().unwrap());
        assert!(matches!(
            read_response(&mut rd).unwrap(),
            Response::Error(..)
        ));
        assert_eq!(r.range(&Range::prefix("/v/")).unwrap().0.len(), 1);
    }
}
