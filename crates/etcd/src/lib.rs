//! The cluster-state store on etcd v3 (docs/internals/cluster.md *Meta
//! store*): [`Etcd`] implements [`MetaStore`] over etcd's JSON gateway
//! (`/v3/kv/range`, `/v3/kv/txn`, `/v3/watch`, `/v3/lease/*`), which every
//! etcd since 3.4 serves on its client URLs beside gRPC.
//!
//! Why not the `etcd-client` crate (gRPC through tonic): its build needs
//! `protoc`, which a machine with only the Rust toolchain lacks (the
//! README's first command must build there), and tokio, tonic, prost and
//! hyper add minutes to a build on two cores. The JSON gateway is the same
//! API with the same semantics (revisions, compare-and-swap, watches from
//! a revision, leases), and the calls are blocking like the trait: this is
//! the control plane, never the data path.
//!
//! - Keys: every key of the cluster state starts with
//!   [`nacre_meta::map::ROOT`] (`/nacre/`); here it is kept under
//!   `prefix` instead (`--prefix`, default `/nacre/`), so two clusters can
//!   share one etcd. Keys outside the root are refused.
//! - Endpoints: a call goes to the endpoint that answered last; one that
//!   cannot be connected to (nothing was sent) makes it try the next. A
//!   call that was sent is never sent again, whatever came back (etcd
//!   answers `Unavailable` also for a proposal whose fate it does not
//!   know, and a transaction could apply twice): it fails, and the next
//!   call starts at the next endpoint.
//! - Watches: one thread per watch reads etcd's stream, asking for a
//!   member with a leader (one cut off from the others ends the stream).
//!   When the stream breaks (member killed, restarted, cut off; TCP
//!   keepalives find one that vanished), it resumes on the next endpoint
//!   from the revision after the last one it delivered, so no event is
//!   lost or repeated; after [`WATCH_RESUME_MS`] without success the watch
//!   ends with an error. A watch from a compacted revision ends with
//!   `Compacted` (from its first `next`, where the embedded store refuses
//!   the watch itself).
//! - Differences from the embedded store a caller must know: etcd takes
//!   at most 128 operations per transaction (`--max-txn-ops`) and requests
//!   up to 1.5 MiB (`--max-request-bytes`); a `Compare::Value` on a key
//!   that does not exist is false whatever the operator.

mod http;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use nacre_meta::map::ROOT;
use nacre_meta::{
    prefix_end, CmpOp, Compare, Event, EventKind, KeyValue, LeaseId, MetaError, MetaStore,
    OpResult, Range, Result, Revision, Txn, TxnOp, TxnResponse, Watch,
};
use serde_json::{json, Value};

use http::{Endpoint, HttpError};

/// Operations per transaction etcd takes by default (`--max-txn-ops`).
pub const TXN_OPS_MAX: usize = 128;
/// Deadline of one call (connect, send, answer).
pub const ETCD_CALL_TIMEOUT_MS: u64 = 5_000;
/// How long a broken watch keeps trying to resume before it ends.
pub const WATCH_RESUME_MS: u64 = 30_000;
/// Wait between attempts to resume a watch.
const WATCH_RETRY_MS: u64 = 200;
/// Event batches queued per watch before it is ended as too slow.
const WATCH_QUEUE_MAX: usize = 4096;
/// Largest message of a watch stream.
const WATCH_MESSAGE_MAX_BYTES: usize = http::CHUNK_MAX_BYTES;

pub struct Etcd {
    endpoints: Vec<Endpoint>,
    /// The endpoint to try first.
    next: AtomicUsize,
    prefix: String,
    timeout: Duration,
}

impl Etcd {
    /// A store on the etcd at `urls` (comma-separated `http://HOST:PORT`),
    /// its keys under `prefix` (starts and ends with `/`). Fails unless one
    /// endpoint answers.
    pub fn connect(urls: &str, prefix: &str) -> Result<Arc<Etcd>> {
        Self::connect_with(urls, prefix, Duration::from_millis(ETCD_CALL_TIMEOUT_MS))
    }

    /// [`Etcd::connect`], each call's deadline `timeout` (an elected
    /// monitor's keepalives must fail fast, well within its lease).
    pub fn connect_with(urls: &str, prefix: &str, timeout: Duration) -> Result<Arc<Etcd>> {
        let endpoints = (urls.split(',').filter(|u| !u.trim().is_empty()))
            .map(Endpoint::parse)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(MetaError::Invalid)?;
        if endpoints.is_empty() {
            return Err(MetaError::Invalid("no etcd URL given".into()));
        }
        // One path component: two prefixes are then disjoint or equal,
        // never one inside the other (a cluster under /a/ would see one
        // under /a/volume/ as its volumes).
        let name = (prefix.strip_prefix('/').and_then(|p| p.strip_suffix('/')))
            .filter(|n| !n.is_empty() && !n.contains('/'));
        if name.is_none_or(|n| !n.bytes().all(|b| (0x21..0x7f).contains(&b))) {
            return Err(MetaError::Invalid(format!(
                "--prefix {prefix:?}: one path component of printable ASCII between slashes (e.g. /nacre/)"
            )));
        }
        let e = Arc::new(Etcd {
            endpoints,
            next: AtomicUsize::new(0),
            prefix: prefix.to_string(),
            timeout,
        });
        // A read: asking each endpoint in turn is safe (an error that was
        // no refusal moves `next` on).
        let mut last = None;
        for _ in 0..e.endpoints.len() {
            match e.range(&Range::key(&format!("{ROOT}cluster"))) {
                Ok(_) => return Ok(e),
                Err(MetaError::Unavailable(why)) => last = Some(MetaError::Unavailable(why)),
                Err(other) => return Err(other),
            }
        }
        Err(last.expect("at least one endpoint"))
    }

    /// The key prefix this store keeps the cluster state under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn outer_key(&self, k: &str) -> Result<String> {
        match k.strip_prefix(ROOT) {
            Some(rest) => Ok(format!("{}{rest}", self.prefix)),
            None => Err(MetaError::Invalid(format!("key {k:?} is not under {ROOT}"))),
        }
    }

    fn outer_range(&self, r: &Range) -> Result<(String, Option<String>)> {
        let key = self.outer_key(&r.key)?;
        let end = match &r.end {
            None => None,
            Some(e) if *e == prefix_end(ROOT) => Some(prefix_end(&self.prefix)),
            Some(e) => Some(self.outer_key(e)?),
        };
        Ok((key, end))
    }

    fn inner_key(&self, k: &[u8]) -> Result<String> {
        let k = std::str::from_utf8(k).map_err(|_| bad("a key that is not UTF-8"))?;
        match k.strip_prefix(self.prefix.as_str()) {
            Some(rest) => Ok(format!("{ROOT}{rest}")),
            None => Err(bad(&format!("key {k:?} outside {}", self.prefix))),
        }
    }

    fn kv(&self, v: &Value) -> Result<KeyValue> {
        Ok(KeyValue {
            key: self.inner_key(&bytes(v, "key")?)?,
            value: bytes(v, "value")?,
            create_revision: int(v, "create_revision")?,
            mod_revision: int(v, "mod_revision")?,
            version: int(v, "version")?,
            lease: int(v, "lease")?,
        })
    }

    fn kvs(&self, v: &Value) -> Result<Vec<KeyValue>> {
        match v.get("kvs") {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a.iter().map(|kv| self.kv(kv)).collect(),
            Some(_) => Err(bad("kvs is not a list")),
        }
    }

    /// One unary call: the answer's JSON, or the error etcd gave. Sent to
    /// one endpoint at most (the next ones only while none can be
    /// connected to).
    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        let body = serde_json::to_vec(body).expect("JSON serialises");
        let n = self.endpoints.len();
        let first = self.next.load(Ordering::Relaxed) % n;
        let mut last = String::new();
        for i in 0..n {
            let k = (first + i) % n;
            let ep = &self.endpoints[k];
            let (status, b) = match ep.post(path, &body, self.timeout) {
                Ok(r) => r,
                Err(HttpError::Connect(e)) => {
                    last = e;
                    continue;
                }
                Err(e) => {
                    self.next.store(k + 1, Ordering::Relaxed);
                    return Err(MetaError::Unavailable(format!(
                        "etcd {}: {path}: {e}",
                        ep.host_port
                    )));
                }
            };
            let v: Value = serde_json::from_slice(&b).map_err(|e| {
                self.next.store(k + 1, Ordering::Relaxed);
                MetaError::Unavailable(format!("etcd {}: {path}: {e}", ep.host_port))
            })?;
            if status == 200 {
                self.next.store(k, Ordering::Relaxed);
                return Ok(v);
            }
            let err = grpc_error(&v, status);
            if matches!(err, GrpcError::Unavailable(_)) {
                // No leader there, or stopping: the next call tries another.
                self.next.store(k + 1, Ordering::Relaxed);
            }
            return Err(err.into());
        }
        Err(MetaError::Unavailable(format!(
            "no etcd endpoint answered ({last})"
        )))
    }

    /// Opens a watch stream from `start` (0: now) on the first endpoint
    /// from `first` on that takes it: the stream positioned after etcd's
    /// `created` message, that message's revision, and the endpoint's
    /// index.
    fn open_watch(
        &self,
        key: &str,
        end: &Option<String>,
        start: Revision,
        first: usize,
    ) -> Result<(Stream, Revision, usize)> {
        let mut req = json!({ "key": b64(key), "prev_kv": true });
        if let Some(e) = end {
            req["range_end"] = b64(e).into();
        }
        if start > 0 {
            req["start_revision"] = start.to_string().into();
        }
        let body = serde_json::to_vec(&json!({ "create_request": req })).expect("JSON");
        let n = self.endpoints.len();
        let mut last = String::new();
        for i in 0..n {
            let k = (first + i) % n;
            let ep = &self.endpoints[k];
            // A member without a leader ends the stream instead of keeping
            // it open with nothing to say.
            let leader = "Grpc-Metadata-hasleader: true\r\n";
            match ep.post_stream("/v3/watch", &body, leader, self.timeout) {
                Ok((mut r, conn)) if r.status == 200 => {
                    let mut msgs = Messages::default();
                    let created = msgs.next(&mut r).and_then(|m| {
                        let res = m.get("result").ok_or_else(|| watch_error(&m))?;
                        if res.get("created") != Some(&Value::Bool(true)) {
                            return Err(bad("a watch answered without `created`"));
                        }
                        int(&res["header"], "revision")
                    });
                    match created {
                        Ok(rev) => return Ok((Stream { r, conn, msgs }, rev, k)),
                        Err(e) => last = format!("{}: {e}", ep.host_port),
                    }
                }
                Ok((r, _)) => last = format!("{}: HTTP {}", ep.host_port, r.status),
                Err(e) => last = format!("{}: {e}", ep.host_port),
            }
        }
        Err(MetaError::Unavailable(format!(
            "no etcd endpoint took the watch ({last})"
        )))
    }
}

/// An open watch stream: the response, its connection (to shut it down
/// from the thread that drops the watch), and what was read of it.
struct Stream {
    r: http::Response<std::net::TcpStream>,
    conn: std::net::TcpStream,
    msgs: Messages,
}

/// The JSON messages of a watch stream, however etcd cut them into chunks.
#[derive(Default)]
struct Messages {
    buf: Vec<u8>,
}

impl Messages {
    fn next<R: std::io::Read>(&mut self, r: &mut http::Response<R>) -> Result<Value> {
        loop {
            let mut it = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Value>();
            match it.next() {
                Some(Ok(v)) => {
                    let used = it.byte_offset();
                    self.buf.drain(..used);
                    return Ok(v);
                }
                Some(Err(e)) if !e.is_eof() => return Err(bad(&format!("watch stream: {e}"))),
                _ => {}
            }
            match r.chunk() {
                Ok(Some(c)) if self.buf.len() + c.len() > WATCH_MESSAGE_MAX_BYTES => {
                    return Err(bad("a watch message too large"))
                }
                Ok(Some(c)) => self.buf.extend_from_slice(&c),
                Ok(None) => return Err(MetaError::Unavailable("the watch stream ended".into())),
                Err(e) => return Err(MetaError::Unavailable(format!("watch stream: {e}"))),
            }
        }
    }
}

/// What a watch thread shares with its [`Watch`]'s cancel.
struct WatchStop {
    stopped: AtomicBool,
    stream: Mutex<Option<std::net::TcpStream>>,
}

impl WatchStop {
    fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        if let Some(s) = self.stream.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Etcd {
    /// Reads `w`'s messages into `tx` until the watch is dropped, resuming
    /// a broken stream after `last`, the newest revision delivered; `at`
    /// is the endpoint the stream is on.
    #[allow(clippy::too_many_arguments)]
    fn watch_loop(
        self: Arc<Self>,
        key: String,
        end: Option<String>,
        mut w: Stream,
        mut at: usize,
        mut last: Revision,
        tx: SyncSender<Result<Vec<Event>>>,
        stop: Arc<WatchStop>,
    ) {
        loop {
            *stop.stream.lock().unwrap_or_else(|p| p.into_inner()) = w.conn.try_clone().ok();
            if stop.stopped.load(Ordering::Relaxed) {
                return;
            }
            let why = loop {
                // Broken, or cut mid-message: resumed after what was
                // delivered.
                let m = match w.msgs.next(&mut w.r) {
                    Ok(m) => m,
                    Err(e) => break e.to_string(),
                };
                let Some(res) = m.get("result") else {
                    break watch_error(&m).to_string();
                };
                if res.get("canceled") == Some(&Value::Bool(true)) {
                    let oldest = int(res, "compact_revision").unwrap_or(0);
                    if oldest == 0 {
                        // Its member lost its leader (or stops): elsewhere.
                        break format!(
                            "cancelled: {}",
                            (res.get("cancel_reason").and_then(Value::as_str)).unwrap_or("?")
                        );
                    }
                    let e = MetaError::Compacted {
                        asked: last + 1,
                        oldest,
                    };
                    let _ = tx.try_send(Err(e));
                    return;
                }
                let batch = match self.events(res) {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.try_send(Err(e));
                        return;
                    }
                };
                // etcd never splits one revision over two messages.
                if let Some(rev) = batch.iter().map(|e| e.kv.mod_revision).max() {
                    last = last.max(rev);
                }
                if batch.is_empty() {
                    continue;
                }
                match tx.try_send(Ok(batch)) {
                    Ok(()) => {}
                    Err(TrySendError::Full(_)) => {
                        tracing::warn!("etcd: dropping a watch of {key} (too slow)");
                        return;
                    }
                    Err(TrySendError::Disconnected(_)) => return,
                }
            };
            if stop.stopped.load(Ordering::Relaxed) {
                return;
            }
            // Resume after the last revision delivered, from the next
            // endpoint on.
            tracing::debug!("etcd: watch of {key} resumes after revision {last} ({why})");
            let until = Instant::now() + Duration::from_millis(WATCH_RESUME_MS);
            (w, at) = loop {
                std::thread::sleep(Duration::from_millis(WATCH_RETRY_MS));
                if stop.stopped.load(Ordering::Relaxed) {
                    return;
                }
                match self.open_watch(&key, &end, last + 1, at + 1) {
                    Ok((w, _, k)) => break (w, k),
                    Err(e) if Instant::now() >= until => {
                        let _ = tx.try_send(Err(MetaError::WatchEnded(format!(
                            "etcd unreachable for {WATCH_RESUME_MS} ms: {e}"
                        ))));
                        return;
                    }
                    Err(_) => {}
                }
            };
        }
    }

    fn events(&self, res: &Value) -> Result<Vec<Event>> {
        let Some(Value::Array(evs)) = res.get("events") else {
            return Ok(Vec::new());
        };
        evs.iter()
            .map(|e| {
                let kv = e.get("kv").ok_or_else(|| bad("an event without kv"))?;
                match e.get("type").and_then(Value::as_str) {
                    None | Some("PUT") => Ok(Event {
                        kind: EventKind::Put,
                        kv: self.kv(kv)?,
                    }),
                    Some("DELETE") => {
                        // The deleted entry, at the deleting revision.
                        let mut old = match e.get("prev_kv") {
                            Some(p) => self.kv(p)?,
                            None => self.kv(kv)?,
                        };
                        old.mod_revision = int(kv, "mod_revision")?;
                        Ok(Event {
                            kind: EventKind::Delete,
                            kv: old,
                        })
                    }
                    Some(t) => Err(bad(&format!("event type {t}"))),
                }
            })
            .collect()
    }
}

impl MetaStore for Etcd {
    fn txn_ops_max(&self) -> usize {
        TXN_OPS_MAX
    }

    fn range(&self, r: &Range) -> Result<(Vec<KeyValue>, Revision)> {
        let (key, end) = self.outer_range(r)?;
        let mut req = json!({ "key": b64(&key) });
        if let Some(e) = end {
            req["range_end"] = b64(&e).into();
        }
        let v = self.call("/v3/kv/range", &req)?;
        Ok((self.kvs(&v)?, int(&v["header"], "revision")?))
    }

    fn txn(&self, t: Txn) -> Result<TxnResponse> {
        let compare = (t.compare.iter())
            .map(|c| self.compare(c))
            .collect::<Result<Vec<_>>>()?;
        let ops = |ops: &[TxnOp]| ops.iter().map(|o| self.op(o)).collect::<Result<Vec<_>>>();
        let req = json!({
            "compare": compare,
            "success": ops(&t.success)?,
            "failure": ops(&t.failure)?,
        });
        let v = match self.call("/v3/kv/txn", &req) {
            // A put under a lease that ended: as the embedded store says.
            Err(MetaError::Invalid(m)) if m.contains("lease not found") => {
                let lease = (t.success.iter().chain(&t.failure))
                    .find_map(|o| match o {
                        TxnOp::Put { lease, .. } if *lease != 0 => Some(*lease),
                        _ => None,
                    })
                    .unwrap_or(0);
                return Err(MetaError::LeaseNotFound(lease));
            }
            r => r?,
        };
        let succeeded = v.get("succeeded") == Some(&Value::Bool(true));
        let asked = if succeeded { &t.success } else { &t.failure };
        let answers = match v.get("responses") {
            None => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(bad("responses is not a list")),
        };
        if answers.len() != asked.len() {
            return Err(bad(&format!(
                "{} answers to {} operations",
                answers.len(),
                asked.len()
            )));
        }
        let results = (asked.iter().zip(&answers))
            .map(|(op, a)| match op {
                TxnOp::Put { .. } => Ok(OpResult::Put),
                TxnOp::Delete(_) => {
                    let d = a
                        .get("response_delete_range")
                        .ok_or_else(|| bad("no delete answer"))?;
                    Ok(OpResult::Delete(int(d, "deleted")? as u64))
                }
                TxnOp::Get(_) => {
                    let g = a
                        .get("response_range")
                        .ok_or_else(|| bad("no range answer"))?;
                    Ok(OpResult::Get(self.kvs(g)?))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(TxnResponse {
            succeeded,
            revision: int(&v["header"], "revision")?,
            results,
        })
    }

    fn watch(&self, r: &Range, start: Revision) -> Result<Watch> {
        let (key, end) = self.outer_range(r)?;
        let first = self.next.load(Ordering::Relaxed);
        let (w, created, at) = self.open_watch(&key, &end, start, first)?;
        let last = if start > 0 { start - 1 } else { created };
        let (tx, rx) = sync_channel(WATCH_QUEUE_MAX);
        let stop = Arc::new(WatchStop {
            stopped: AtomicBool::new(false),
            stream: Mutex::new(None),
        });
        let me = Arc::new(Etcd {
            endpoints: self.endpoints.clone(),
            next: AtomicUsize::new(self.next.load(Ordering::Relaxed)),
            prefix: self.prefix.clone(),
            timeout: self.timeout,
        });
        let s = stop.clone();
        std::thread::Builder::new()
            .name("etcd-watch".into())
            .spawn(move || me.watch_loop(key, end, w, at, last, tx, s))
            .map_err(|e| MetaError::Unavailable(format!("spawning a watch thread: {e}")))?;
        Ok(Watch::new(rx, Some(Box::new(move || stop.stop()))))
    }

    fn lease_grant(&self, ttl_s: i64) -> Result<LeaseId> {
        let v = self.call("/v3/lease/grant", &json!({ "TTL": ttl_s.to_string() }))?;
        match int(&v, "ID")? {
            0 => Err(bad("a lease granted without an id")),
            id => Ok(id),
        }
    }

    fn lease_keepalive(&self, id: LeaseId) -> Result<i64> {
        let v = self.call("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?;
        // etcd answers a lease it does not know with a TTL of 0 (left out).
        match int(&v["result"], "TTL")? {
            ttl if ttl > 0 => Ok(ttl),
            _ => Err(MetaError::LeaseNotFound(id)),
        }
    }

    fn lease_revoke(&self, id: LeaseId) -> Result<()> {
        match self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() })) {
            Err(MetaError::Invalid(m)) if m.contains("lease not found") => {
                Err(MetaError::LeaseNotFound(id))
            }
            r => r.map(|_| ()),
        }
    }
}

impl Etcd {
    fn compare(&self, c: &Compare) -> Result<Value> {
        let key = b64(&self.outer_key(c.key())?);
        let result = |op: &CmpOp| match op {
            CmpOp::Equal => "EQUAL",
            CmpOp::NotEqual => "NOT_EQUAL",
            CmpOp::Less => "LESS",
            CmpOp::Greater => "GREATER",
        };
        Ok(match c {
            Compare::Version(_, op, x) => {
                json!({ "key": key, "result": result(op), "target": "VERSION", "version": x.to_string() })
            }
            Compare::CreateRevision(_, op, x) => {
                json!({ "key": key, "result": result(op), "target": "CREATE", "create_revision": x.to_string() })
            }
            Compare::ModRevision(_, op, x) => {
                json!({ "key": key, "result": result(op), "target": "MOD", "mod_revision": x.to_string() })
            }
            Compare::Value(_, op, x) => {
                json!({ "key": key, "result": result(op), "target": "VALUE", "value": B64.encode(x) })
            }
        })
    }

    fn op(&self, o: &TxnOp) -> Result<Value> {
        let range = |r: &Range| -> Result<Value> {
            let (key, end) = self.outer_range(r)?;
            let mut v = json!({ "key": b64(&key) });
            if let Some(e) = end {
                v["range_end"] = b64(&e).into();
            }
            Ok(v)
        };
        Ok(match o {
            TxnOp::Put { key, value, lease } => json!({ "request_put": {
                "key": b64(&self.outer_key(key)?),
                "value": B64.encode(value),
                "lease": lease.to_string(),
            }}),
            TxnOp::Delete(r) => json!({ "request_delete_range": range(r)? }),
            TxnOp::Get(r) => json!({ "request_range": range(r)? }),
        })
    }
}

fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

fn bad(what: &str) -> MetaError {
    MetaError::Unavailable(format!("etcd answered what it should not: {what}"))
}

/// An int64 field of etcd's JSON (a string, as proto3 JSON writes them; a
/// number is taken too); absent is 0, as in proto3.
fn int(v: &Value, field: &str) -> Result<i64> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s.parse().map_err(|_| bad(&format!("{field} {s:?}"))),
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| bad(&format!("{field} {n}"))),
        Some(x) => Err(bad(&format!("{field} {x}"))),
    }
}

/// A bytes field (base64); absent is empty.
fn bytes(v: &Value, field: &str) -> Result<Vec<u8>> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => B64
            .decode(s)
            .map_err(|_| bad(&format!("{field}: not base64"))),
        Some(x) => Err(bad(&format!("{field} {x}"))),
    }
}

/// An error etcd's gateway answered: `{"code": N, "message": ...}` with
/// gRPC's codes.
#[derive(Debug)]
enum GrpcError {
    /// No leader, or the member is stopping (14), or the call ran out of
    /// time inside etcd (4).
    Unavailable(String),
    Invalid(String),
    Other(String),
}

impl std::fmt::Display for GrpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrpcError::Unavailable(m) | GrpcError::Invalid(m) | GrpcError::Other(m) => {
                f.write_str(m)
            }
        }
    }
}

impl From<GrpcError> for MetaError {
    fn from(e: GrpcError) -> MetaError {
        match e {
            GrpcError::Unavailable(m) => MetaError::Unavailable(format!("etcd: {m}")),
            GrpcError::Invalid(m) => MetaError::Invalid(format!("etcd: {m}")),
            GrpcError::Other(m) => MetaError::Storage(format!("etcd: {m}")),
        }
    }
}

fn grpc_error(v: &Value, status: u16) -> GrpcError {
    let msg = (v.get("message").or_else(|| v.get("error")))
        .and_then(Value::as_str)
        .map_or_else(|| format!("HTTP {status}: {v}"), str::to_string);
    match v.get("code").and_then(Value::as_i64) {
        Some(4 | 14) => GrpcError::Unavailable(msg),
        Some(3 | 5 | 9 | 11) => GrpcError::Invalid(msg),
        _ if status >= 500 => GrpcError::Unavailable(msg),
        _ => GrpcError::Other(msg),
    }
}

fn watch_error(m: &Value) -> MetaError {
    match m.get("error") {
        Some(e) => grpc_error(e, 200).into(),
        None => bad(&format!("watch message {m}")),
    }
}

#[cfg(test)]
mod tests {
    use super::Messages;
    use std::io::{BufReader, Cursor};

    /// Messages come whole however the chunks cut them, several in one
    /// chunk or one over several; a stream that ends mid-message is an
    /// error, not a message.
    #[test]
    fn watch_messages_come_whole_across_chunks() {
        let body = b"{\"a\":1}\n{\"b\":[1,\n2]}\n{\"c\":3}";
        let mut raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for piece in [&body[..3], &body[3..12], &body[12..14], &body[14..]] {
            raw.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            raw.extend_from_slice(piece);
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"3\r\n{\"d\r\n0\r\n\r\n");
        let mut r = crate::http::Response::start(BufReader::new(Cursor::new(raw))).unwrap();
        let mut m = Messages::default();
        assert_eq!(m.next(&mut r).unwrap()["a"], 1);
        assert_eq!(m.next(&mut r).unwrap()["b"][1], 2);
        assert_eq!(m.next(&mut r).unwrap()["c"], 3);
        assert!(m.next(&mut r).is_err());
    }
}
