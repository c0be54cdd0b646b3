//! The NBD gateway: serves every volume of the cluster as an export of
//! the same name.
//!
//! Handshake: fixed newstyle with EXPORT_NAME, INFO, GO, LIST and ABORT;
//! other options get `ERR_UNSUP`, malformed ones `ERR_INVALID`, an
//! unknown export `ERR_UNKNOWN` — the connection stays up in each case.
//! Transmission: simple replies; requests are read as they arrive and run
//! concurrently (bounded per connection), replies go out as they finish.
//!
//! Durability: the cluster acknowledges a write only when every replica
//! has it durable, so FLUSH has nothing left to do and FUA is implied.
//! That is also why CAN_MULTI_CONN is true: a write completed on any
//! connection is already durable for all of them.
//!
//! Alignment: the volume works in 512-byte sectors (advertised as the
//! minimum block size). Unaligned reads are served from the enclosing
//! sectors; unaligned writes and zeroes are refused with EINVAL.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use nacre_client::{ClientError, Cluster, Volume};
use nacre_io::net::{Listener, Stream};
use nacre_io::sync::{Latch, Notify};
use nacre_io::{rt, AlignedBuf};
use nacre_net::{Budget, ByteReader, FrameSender, Inflight, ReadStall};

use crate::metrics::NbdMetrics;
use crate::sessions::Sessions;

use crate::proto::*;

/// Requests running at once per connection; beyond it the gateway stops
/// reading that connection until some finish.
pub const INFLIGHT_MAX: usize = 256;
/// Payload bytes (write data read in, read data waiting to go out) the
/// gateway holds at once over all its connections; requests wait when it
/// is spent (docs/internals/cluster.md *NBD gateway*).
pub const GATEWAY_PAYLOAD_MAX_BYTES: usize = 1 << 30;
/// The same, per connection: one client cannot take the whole budget.
pub const CONN_PAYLOAD_MAX_BYTES: usize = 128 << 20;
/// Connections served at once; more are closed as they arrive.
pub const CONNECTIONS_MAX: usize = 1024;
/// A client must have chosen its export within this of connecting.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// On a stop, the requests already read are given this long to finish and
/// have their replies sent before the connections close.
pub const DRAIN_TIMEOUT_MS: u64 = 30_000;
/// After its last reply on a stop, how long a connection reads what the
/// client still sends before it closes.
const LINGER: Duration = Duration::from_secs(2);
const SECTOR: u64 = 512;

/// Serves NBD on `l` (each open connection a session the cluster sees:
/// [`Sessions`]) until `stop` is set; then accepts no more, closes the
/// connections still in their handshakes, reads no further request, and
/// returns once every request already read has finished and its reply has
/// gone out (the caller bounds that wait: [`DRAIN_TIMEOUT_MS`]).
/// Counted in `metrics`.
pub async fn serve(l: Listener, cluster: Rc<Cluster>, stop: Latch, metrics: Arc<NbdMetrics>) {
    let sessions = match Sessions::start(&cluster) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("nbd: cannot keep sessions in the meta store: {e}");
            return;
        }
    };
    let via = l.local_addr().to_string();
    let budget = Budget::new(GATEWAY_PAYLOAD_MAX_BYTES);
    let (live, ended) = (Rc::new(Cell::new(0usize)), Notify::new());
    let accepting = nacre_net::accept_capped(&l, CONNECTIONS_MAX, |s, admitted| {
        let client = format!("NBD client {} via {via}", s.peer());
        let (cluster, sessions, budget) = (cluster.clone(), sessions.clone(), budget.clone());
        let (stop, live, ended) = (stop.clone(), live.clone(), ended.clone());
        let metrics = metrics.clone();
        live.set(live.get() + 1);
        metrics.connection_opened();
        async move {
            let conn = Conn {
                cluster,
                sessions,
                client,
                budget: &budget,
                metrics: &metrics,
                stop: &stop,
            };
            serve_conn(s, conn, admitted).await;
            metrics.connection_closed();
            live.set(live.get() - 1);
            ended.notify();
        }
    });
    stop.until(accepting).await;
    // Refuse new clients at once (they go to another gateway), not after
    // the drain.
    l.shutdown();
    drop(l);
    if live.get() > 0 {
        tracing::info!(
            "nbd: stopping: {} connections finish their requests",
            live.get()
        );
    }
    while live.get() > 0 {
        ended.wait().await;
    }
}

/// What serving one connection needs besides its stream.
struct Conn<'a> {
    cluster: Rc<Cluster>,
    sessions: Rc<Sessions>,
    /// Who it is, for the logs.
    client: String,
    budget: &'a Rc<Budget>,
    metrics: &'a Arc<NbdMetrics>,
    stop: &'a Latch,
}

async fn serve_conn(stream: Rc<Stream>, conn: Conn<'_>, admitted: nacre_net::Admitted) {
    let Conn {
        cluster,
        sessions,
        client,
        budget,
        metrics,
        stop,
    } = conn;
    let mut rd = ByteReader::new(stream.clone());
    let opened = Opener {
        cluster: &cluster,
        sessions: &sessions,
        stream: &stream,
        client,
    };
    let limit = Duration::from_millis(HANDSHAKE_TIMEOUT_MS);
    let chosen = stop.until(rt::timeout(limit, handshake(&stream, &mut rd, &opened)));
    match chosen.await {
        None => tracing::info!(
            "nbd: {}: the gateway stops: closed in its handshake",
            opened.client
        ),
        Some(Some(Ok(Some((vol, session))))) => {
            admitted.attach();
            transmission(stream.clone(), rd, vol, (budget, metrics), stop).await;
            drop(session);
        }
        Some(Some(Ok(None))) => {}
        Some(Some(Err(e))) => tracing::info!("nbd: handshake ended: {e}"),
        Some(None) => tracing::info!(
            "nbd: {}: no export chosen within {HANDSHAKE_TIMEOUT_MS} ms: closed",
            opened.client
        ),
    }
    stream.shutdown();
}

/// A registered session, unregistered when dropped (also when the
/// handshake that registered it is cut short).
struct Session<'a> {
    sessions: &'a Rc<Sessions>,
    id: u64,
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if self.id != 0 {
            self.sessions.unregister(self.id);
        }
    }
}

/// Opens the volume a client chose, as a session.
struct Opener<'a> {
    cluster: &'a Rc<Cluster>,
    sessions: &'a Rc<Sessions>,
    stream: &'a Rc<Stream>,
    client: String,
}

impl<'a> Opener<'a> {
    /// The volume, for `INFO` (`session` false) or to serve (`GO`,
    /// `EXPORT_NAME`: registered as a session first).
    fn open(&self, name: &str, session: bool) -> Result<(Rc<Volume>, Session<'a>), ClientError> {
        let vol = Rc::new(Volume::open(self.cluster, name)?);
        let id = match session {
            true => (self.sessions).register(&vol, self.stream, self.client.clone())?,
            false => 0,
        };
        Ok((
            vol,
            Session {
                sessions: self.sessions,
                id,
            },
        ))
    }
}

fn transmission_flags() -> u16 {
    TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_FUA
        | TFLAG_SEND_TRIM
        | TFLAG_SEND_WRITE_ZEROES
        | TFLAG_CAN_MULTI_CONN
}

fn invalid(e: ProtoError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())
}

/// Runs the option haggling; `Some(volume)` when the client chose one.
async fn handshake<'a>(
    stream: &Stream,
    rd: &mut ByteReader,
    opener: &Opener<'a>,
) -> std::io::Result<Option<(Rc<Volume>, Session<'a>)>> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    stream.send_bytes(&hello).await?;
    let mut cf = [0u8; 4];
    rd.read_exact(&mut cf).await?;
    let client_flags = parse_client_flags(cf).map_err(invalid)?;
    loop {
        let mut oh = [0u8; 16];
        rd.read_exact(&mut oh).await?;
        let h = match parse_option_header(&oh) {
            Ok(h) => h,
            Err(ProtoError::OptionTooBig(len)) => {
                let opt = u32::from_be_bytes(oh[8..12].try_into().expect("4 bytes"));
                rd.skip(u64::from(len)).await?;
                stream
                    .send_bytes(&option_reply(opt, REP_ERR_TOO_BIG, b"option too large"))
                    .await?;
                continue;
            }
            Err(e) => return Err(invalid(e)),
        };
        let mut data = vec![0u8; h.len as usize];
        rd.read_exact(&mut data).await?;
        match h.option {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&data);
                // This option has no error reply: an unknown export ends
                // the connection, as the protocol prescribes.
                let (vol, id) = opener
                    .open(&name, true)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                let mut b = Vec::with_capacity(134);
                b.extend_from_slice(&vol.size_bytes().to_be_bytes());
                b.extend_from_slice(&transmission_flags().to_be_bytes());
                if client_flags & CLIENT_FLAG_NO_ZEROES == 0 {
                    b.extend_from_slice(&[0u8; 124]);
                }
                stream.send_bytes(&b).await?;
                return Ok(Some((vol, id)));
            }
            OPT_ABORT => {
                stream
                    .send_bytes(&option_reply(h.option, REP_ACK, &[]))
                    .await?;
                return Ok(None);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    stream
                        .send_bytes(&option_reply(
                            h.option,
                            REP_ERR_INVALID,
                            b"LIST takes no data",
                        ))
                        .await?;
                    continue;
                }
                let vols = nacre_meta::map::list_volumes(&**opener.cluster.meta())
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                for v in vols {
                    let mut d = (v.name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(v.name.as_bytes());
                    stream
                        .send_bytes(&option_reply(h.option, REP_SERVER, &d))
                        .await?;
                }
                stream
                    .send_bytes(&option_reply(h.option, REP_ACK, &[]))
                    .await?;
            }
            OPT_INFO | OPT_GO => {
                let go = match parse_go(&data) {
                    Ok(g) => g,
                    Err(e) => {
                        stream
                            .send_bytes(&option_reply(
                                h.option,
                                REP_ERR_INVALID,
                                e.to_string().as_bytes(),
                            ))
                            .await?;
                        continue;
                    }
                };
                let (vol, id) = match opener.open(&go.name, h.option == OPT_GO) {
                    Ok(v) => v,
                    Err(e) => {
                        let msg = format!("export {:?}: {e}", go.name);
                        stream
                            .send_bytes(&option_reply(h.option, REP_ERR_UNKNOWN, msg.as_bytes()))
                            .await?;
                        continue;
                    }
                };
                let sent = async {
                    let mut info = INFO_EXPORT.to_be_bytes().to_vec();
                    info.extend_from_slice(&vol.size_bytes().to_be_bytes());
                    info.extend_from_slice(&transmission_flags().to_be_bytes());
                    stream
                        .send_bytes(&option_reply(h.option, REP_INFO, &info))
                        .await?;
                    if go.infos.contains(&INFO_NAME) {
                        let mut d = INFO_NAME.to_be_bytes().to_vec();
                        d.extend_from_slice(go.name.as_bytes());
                        stream
                            .send_bytes(&option_reply(h.option, REP_INFO, &d))
                            .await?;
                    }
                    if go.infos.contains(&INFO_BLOCK_SIZE) {
                        let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                        d.extend_from_slice(&(SECTOR as u32).to_be_bytes());
                        d.extend_from_slice(&4096u32.to_be_bytes());
                        d.extend_from_slice(&REQUEST_MAX_BYTES.to_be_bytes());
                        stream
                            .send_bytes(&option_reply(h.option, REP_INFO, &d))
                            .await?;
                    }
                    stream
                        .send_bytes(&option_reply(h.option, REP_ACK, &[]))
                        .await
                }
                .await;
                sent?;
                if h.option == OPT_GO {
                    return Ok(Some((vol, id)));
                }
            }
            other => {
                let msg = format!("option {other} is not supported");
                stream
                    .send_bytes(&option_reply(other, REP_ERR_UNSUP, msg.as_bytes()))
                    .await?;
            }
        }
    }
}

async fn transmission(
    stream: Rc<Stream>,
    mut rd: ByteReader,
    vol: Rc<Volume>,
    (budget, metrics): (&Rc<Budget>, &Arc<NbdMetrics>),
    stop: &Latch,
) {
    let tx = FrameSender::start(stream.clone());
    let inflight = Inflight::new(INFLIGHT_MAX);
    let mine = Budget::new(CONN_PAYLOAD_MAX_BYTES);
    let name = vol.record().name.clone();
    let stall = ReadStall::watch(&stream);
    // Whether the client said goodbye, or the gateway stops (then its
    // requests still finish).
    let mut disc = false;
    loop {
        inflight.slot().await;
        if stop.is_set() {
            disc = true;
            break;
        }
        // Quiet between requests for as long as the client likes (an idle
        // VM disk); once a request has begun, it arrives within the stall
        // limit (header and data), or the stall watch closes the
        // connection.
        let header = async {
            if !rd.ready(1).await? {
                return Ok(false);
            }
            stall.begin();
            rd.ready(REQUEST_HEADER_BYTES).await
        };
        // (A stop cuts the wait short; the reader is not used after it.)
        match stop.until(header).await {
            None => {
                stall.end();
                disc = true;
                break;
            }
            Some(Ok(true)) => {}
            Some(Ok(false)) => break,
            Some(Err(e)) => {
                tracing::info!("nbd {name}: connection lost: {e}");
                break;
            }
        }
        let req = match parse_request(rd.peek(REQUEST_HEADER_BYTES)) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("nbd {name}: closing connection: {e}");
                break;
            }
        };
        rd.consume(REQUEST_HEADER_BYTES);
        // Its share of the budgets, for the data it brings or will get
        // back, before any of that is read or allocated.
        let cost = match req.kind {
            CMD_READ | CMD_WRITE if req.len <= REQUEST_MAX_BYTES => req.len as usize,
            _ => 0,
        };
        // Waiting for a share is not the client's stall.
        stall.end();
        let held = vec![mine.take(cost).await, budget.take(cost).await];
        stall.begin();
        let mut data = None;
        match req.kind {
            CMD_DISC => {
                // Its requests may take their time to finish now.
                stall.end();
                disc = true;
                break;
            }
            CMD_WRITE if req.len > DISCARD_MAX_BYTES => {
                tracing::warn!("nbd {name}: closing connection: write of {} bytes", req.len);
                break;
            }
            CMD_WRITE if req.len > REQUEST_MAX_BYTES => {
                if rd.skip(u64::from(req.len)).await.is_err() {
                    break;
                }
                stall.end();
                metrics.answered(req.kind, EOVERFLOW, 0, Duration::ZERO);
                let _ = tx
                    .send_raw(&simple_reply(EOVERFLOW, req.cookie), None)
                    .await;
                continue;
            }
            CMD_WRITE => match rd.read_buf(req.len as usize).await {
                Ok(b) => data = Some(b),
                Err(e) => {
                    tracing::info!("nbd {name}: connection lost mid-write: {e}");
                    break;
                }
            },
            _ => {}
        }
        stall.end();
        let (vol, tx) = (vol.clone(), tx.clone());
        let (counted, metrics) = (metrics.request_began(), metrics.clone());
        inflight.spawn(async move {
            let t0 = rt::monotonic();
            let (err, payload) = match handle(&vol, req, data).await {
                Ok(p) => (0, p),
                Err(e) => (e, Vec::new()),
            };
            let moved = match req.kind {
                CMD_READ | CMD_WRITE if err == 0 => u64::from(req.len),
                _ => 0,
            };
            // Counted before it is sent: an acknowledged write is counted.
            metrics.answered(req.kind, err, moved, rt::monotonic().saturating_sub(t0));
            // Both shares go with the reply until it is sent.
            let reply = simple_reply(err, req.cookie);
            let _ = tx.send_raw_parts_held(&reply, payload, held).await;
            drop(counted);
        });
    }
    if !disc {
        // The client is gone (or the gateway cut it off): its requests
        // stop retrying; each ends once its attempts in flight have.
        vol.abandon();
    }
    inflight.drain(&tx).await;
    if stop.is_set() {
        // Stopping: the client may still be sending. Close the sending
        // side and read what comes until it closes its own (bounded), so
        // that the replies are not lost to a reset sent over data left
        // unread. (Straight from the socket: the reader's receive was cut
        // short by the stop and took its buffer with it.)
        stream.shutdown_write();
        let discard = async {
            let mut b = AlignedBuf::new(64 << 10);
            loop {
                let (r, back) = stream.recv(b, 0).await;
                b = back;
                if !matches!(r, Ok(n) if n > 0) {
                    break;
                }
            }
        };
        let _ = rt::timeout(LINGER, discard).await;
    }
}

fn errno(e: ClientError) -> u32 {
    match e {
        ClientError::NoSpace => ENOSPC,
        ClientError::Invalid(_) => EINVAL,
        // No one is there to read it.
        ClientError::Abandoned => EIO,
        other => {
            tracing::warn!("nbd: I/O error: {other}");
            EIO
        }
    }
}

fn aligned(offset: u64, len: u32) -> bool {
    offset.is_multiple_of(SECTOR) && u64::from(len).is_multiple_of(SECTOR)
}

/// Runs one request; `Ok(payload)` (in parts, sent back to back; none
/// for most requests) or an NBD errno.
async fn handle(
    vol: &Rc<Volume>,
    r: Request,
    data: Option<AlignedBuf>,
) -> Result<Vec<AlignedBuf>, u32> {
    // Counted until it ends, against the size it was checked with: a
    // shrink waits for it before deleting what lies past the new end.
    let _admitted = vol.admit();
    let size = vol.size_bytes();
    let end = r.offset.checked_add(u64::from(r.len)).ok_or(EINVAL)?;
    let past_end = end > size;
    match r.kind {
        CMD_READ => {
            if r.len > REQUEST_MAX_BYTES || past_end {
                return Err(EINVAL);
            }
            if r.len == 0 {
                return Ok(Vec::new());
            }
            if aligned(r.offset, r.len) {
                return (vol.read_parts(r.offset, u64::from(r.len)).await).map_err(errno);
            }
            let a0 = r.offset / SECTOR * SECTOR;
            let a1 = end.div_ceil(SECTOR) * SECTOR;
            let b = vol.read(a0, a1 - a0).await.map_err(errno)?;
            let s = (r.offset - a0) as usize;
            Ok(vec![AlignedBuf::from_slice(&b[s..s + r.len as usize])])
        }
        CMD_WRITE => {
            let data = data.expect("write payload read with the request");
            if past_end {
                return Err(ENOSPC);
            }
            if r.len == 0 {
                return Ok(Vec::new());
            }
            if !aligned(r.offset, r.len) {
                return Err(EINVAL);
            }
            vol.write(r.offset, data)
                .await
                .map(|_| Vec::new())
                .map_err(errno)
        }
        CMD_FLUSH => Ok(Vec::new()),
        CMD_TRIM => {
            if past_end {
                return Err(EINVAL);
            }
            // Advisory: free the whole objects inside the range.
            let ob = u64::from(vol.record().object_bytes);
            let (s, e) = (
                r.offset.div_ceil(ob) * ob,
                (end / ob * ob).min(size / SECTOR * SECTOR),
            );
            if s < e {
                vol.zero(s, e - s).await.map_err(errno)?;
            }
            Ok(Vec::new())
        }
        CMD_WRITE_ZEROES => {
            if past_end {
                return Err(ENOSPC);
            }
            if r.len == 0 {
                return Ok(Vec::new());
            }
            if !aligned(r.offset, r.len) {
                return Err(EINVAL);
            }
            vol.zero(r.offset, u64::from(r.len))
                .await
                .map(|_| Vec::new())
                .map_err(errno)
        }
        _ => Err(EINVAL),
    }
}
