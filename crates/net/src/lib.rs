//! Connections that speak the wire protocol (`nacre-wire`) on the runtime.
//!
//! - [`FrameReader`] reads frames from a stream: headers through a small
//!   buffer, payloads straight into an aligned buffer that can go to disk
//!   as it is (only the part one receive brought in with the header is
//!   copied, and after a large payload the next header is received alone,
//!   so large frames in a row are not copied at all);
//! - [`FrameSender`] lets any number of tasks queue frames; one writer
//!   task sends everything queued with one gathered write;
//! - [`Conn`] is the client side: request ids, any number of requests in
//!   flight (bounded), replies matched by id;
//! - [`serve`] is the server side: a task per request, bounded per
//!   connection, replies in completion order.
//!
//! A frame that fails validation ends its connection with one log line;
//! every request waiting on it fails with [`NetError::Closed`].
// PERF-CRITICAL

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;

use nacre_io::net::{Addr, Listener, Stream};
use nacre_io::rt;
use nacre_io::sync::{oneshot, Notify, Sender};
use nacre_io::{AlignedBuf, SendBuf, SharedBuf};
use nacre_wire::{Header, WireError, HEADER_BYTES};

/// Receive buffer for headers and small payloads.
const RECV_BUF_BYTES: usize = 64 << 10;
/// After a payload this large, the next header is received alone
/// ([`ByteReader::set_lookahead`]): a stream of large frames (whole-object
/// writes, their replication, large read replies) has its payloads
/// received straight into their own buffers. Smaller frames come many per
/// receive and are copied out of the receive buffer, which costs less
/// than a receive each.
const LARGE_PAYLOAD_BYTES: usize = 32 << 10;
/// Frames sent by one gathered write at most.
const SEND_BATCH_MAX: usize = 256;
/// Bytes queued on a connection before senders wait.
const SEND_QUEUE_MAX_BYTES: usize = 64 << 20;
/// Set in the request ids a connection gives requests sent with none
/// (`Conn::call`).
pub const OWN_ID_BIT: u64 = 1 << 62;
/// Requests in flight on one client connection.
pub const CONN_INFLIGHT_MAX: usize = 1024;
/// How long a request may wait for its reply. A peer that leaves one
/// request unanswered this long is dead or drowning: the connection is torn
/// down, every request on it fails (`Timeout` for the late ones, `Closed`
/// for the rest) and callers reconnect or give up.
pub const RPC_TIMEOUT_MS: u64 = 10_000;
/// Deadlines are checked this many times per timeout (one timer per
/// connection, not one per request).
const DEADLINE_CHECKS_PER_TIMEOUT: u32 = 8;
/// Requests a server handles at once for one connection; beyond it, it
/// stops reading that connection.
pub const SERVE_INFLIGHT_MAX: usize = 512;
/// Payload bytes one listener's connections hold at once (requests read
/// in, replies not yet sent: [`Budget`]).
pub const SERVE_PAYLOAD_MAX_BYTES: usize = 1 << 30;
/// The same per connection (requests running and replies queued): it
/// takes eight connections that never read to hold a listener's whole
/// budget, and the send stall cuts them.
pub const SERVE_CONN_PAYLOAD_MAX_BYTES: usize = 128 << 20;
/// Connections one listener serves at once; more are closed as they come
/// (after the oldest that has not finished its handshake, if any: see
/// [`accept_capped`]).
pub const SERVE_CONNECTIONS_MAX: usize = 1024;
/// Connections one listener serves at once from one IP address (TCP): one
/// host cannot take every slot.
pub const PEER_CONNECTIONS_MAX: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
    #[error("connection closed")]
    Closed,
    #[error("no reply within {0} ms")]
    Timeout(u64),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Protocol(String),
}

/// A frame: a validated header and its payload (if it has one).
pub struct Frame {
    pub h: Header,
    pub payload: Option<AlignedBuf>,
}

/// Buffered reads from a stream: small reads come out of a receive
/// buffer, large ones go straight into their own aligned buffer.
pub struct ByteReader {
    pub stream: Rc<Stream>,
    buf: AlignedBuf,
    start: usize,
    end: usize,
    /// With `Some(k)`, a receive brings the bytes buffered up to `k` at
    /// most, or takes what the read in progress still lacks if that is
    /// more (none beyond it that would then be copied out of the buffer);
    /// `None`: as many as fit.
    lookahead: Option<usize>,
}

impl ByteReader {
    pub fn new(stream: Rc<Stream>) -> Self {
        ByteReader {
            stream,
            buf: AlignedBuf::new(RECV_BUF_BYTES),
            start: 0,
            end: 0,
            lookahead: None,
        }
    }

    /// Limits each receive to what brings the bytes buffered up to `k`, or
    /// what the read in progress still lacks if that is more (`None`: no
    /// limit). A reader expecting a large payload after its next header
    /// sets `Some(header size)`: the header is received alone and the
    /// payload then lands in its own buffer whole, never copied.
    pub fn set_lookahead(&mut self, k: Option<usize>) {
        self.lookahead = k;
    }

    /// Bytes received and not yet consumed.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Receives more bytes, for a read that still lacks `want`; false at
    /// end of stream.
    async fn fill(&mut self, want: usize) -> std::io::Result<bool> {
        if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let buffered = self.end - self.start;
        let max = (self.lookahead).map_or(usize::MAX, |k| k.saturating_sub(buffered).max(want));
        let buf = std::mem::replace(&mut self.buf, AlignedBuf::new(0));
        let (r, b) = self.stream.recv_at_most(buf, self.end, max).await;
        self.buf = b;
        let n = r?;
        self.end += n;
        Ok(n > 0)
    }

    /// Waits until `n` bytes (at most the buffer's size) are buffered;
    /// false if the stream ended first with nothing buffered, an
    /// `UnexpectedEof` error if it ended in the middle.
    pub async fn ready(&mut self, n: usize) -> std::io::Result<bool> {
        assert!(n <= RECV_BUF_BYTES, "ready({n}) beyond the receive buffer");
        while self.end - self.start < n {
            if !self.fill(n - (self.end - self.start)).await? {
                if self.end == self.start {
                    return Ok(false);
                }
                return Err(closed_mid_message());
            }
        }
        Ok(true)
    }

    /// The next `n` buffered bytes (call [`ByteReader::ready`] first).
    pub fn peek(&self, n: usize) -> &[u8] {
        &self.buf[self.start..self.start + n]
    }

    pub fn consume(&mut self, n: usize) {
        assert!(n <= self.end - self.start);
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Fills `out` exactly.
    pub async fn read_exact(&mut self, out: &mut [u8]) -> std::io::Result<()> {
        let mut done = 0;
        while done < out.len() {
            if self.buffered() == 0 && !self.fill(out.len() - done).await? {
                return Err(closed_mid_message());
            }
            let n = self.buffered().min(out.len() - done);
            out[done..done + n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.consume(n);
            done += n;
        }
        Ok(())
    }

    /// Reads exactly `len` bytes into a new aligned buffer.
    pub async fn read_buf(&mut self, len: usize) -> std::io::Result<AlignedBuf> {
        let mut p = AlignedBuf::new(len);
        let have = self.buffered().min(len);
        p[..have].copy_from_slice(&self.buf[self.start..self.start + have]);
        self.consume(have);
        if have < len {
            p = self.stream.recv_exact(p, have).await?;
        }
        Ok(p)
    }

    /// Reads and drops `len` bytes.
    pub async fn skip(&mut self, mut len: u64) -> std::io::Result<()> {
        while len > 0 {
            let want = len.min(usize::MAX as u64) as usize;
            if self.buffered() == 0 && !self.fill(want).await? {
                return Err(closed_mid_message());
            }
            let n = (self.buffered() as u64).min(len);
            self.consume(n as usize);
            len -= n;
        }
        Ok(())
    }
}

fn closed_mid_message() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "connection closed mid-message",
    )
}

fn eof_is_closed(e: std::io::Error) -> NetError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        NetError::Closed
    } else {
        NetError::Io(e)
    }
}

/// Reads frames from a stream.
pub struct FrameReader {
    rd: ByteReader,
}

impl FrameReader {
    pub fn new(stream: Rc<Stream>) -> Self {
        FrameReader {
            rd: ByteReader::new(stream),
        }
    }

    /// The next request of a server's connection, with its shares of the
    /// connection's budget `mine` and the listener's `all`, taken for its
    /// payload and the reply `h` says it can get before the payload is
    /// read. Quiet between frames for as long as the peer likes; a frame
    /// that has begun is marked on `stall` until it has arrived.
    pub async fn next_within<H: Handler>(
        &mut self,
        h: &H,
        mine: &Rc<Budget>,
        all: &Rc<Budget>,
        stall: &ReadStall,
    ) -> Result<Option<(Frame, Vec<Permit>)>, NetError> {
        if !self.rd.ready(1).await.map_err(eof_is_closed)? {
            return Ok(None);
        }
        stall.begin();
        if !self.rd.ready(HEADER_BYTES).await.map_err(eof_is_closed)? {
            return Ok(None);
        }
        let head = Header::decode(self.rd.peek(HEADER_BYTES))?;
        self.rd.consume(HEADER_BYTES);
        let len = head.payload_len as usize;
        self.expect_after(len);
        let cost = len + h.reply_bytes_max(&head);
        // Waiting for a share is not the peer's stall.
        stall.end();
        let held = vec![mine.take(cost).await, all.take(cost).await];
        if len == 0 {
            let f = Frame {
                h: head,
                payload: None,
            };
            return Ok(Some((f, held)));
        }
        stall.begin();
        let p = self.rd.read_buf(len).await.map_err(eof_is_closed)?;
        stall.end();
        head.check_payload(&p)?;
        let f = Frame {
            h: head,
            payload: Some(p),
        };
        Ok(Some((f, held)))
    }

    /// Guesses the next frame from this one's payload of `len` bytes: a
    /// large one is likely followed by another.
    fn expect_after(&mut self, len: usize) {
        (self.rd).set_lookahead((len >= LARGE_PAYLOAD_BYTES).then_some(HEADER_BYTES));
    }

    /// The next frame; `None` when the peer closed between frames.
    pub async fn next(&mut self) -> Result<Option<Frame>, NetError> {
        if !self.rd.ready(HEADER_BYTES).await.map_err(eof_is_closed)? {
            return Ok(None);
        }
        let h = Header::decode(self.rd.peek(HEADER_BYTES))?;
        self.rd.consume(HEADER_BYTES);
        let len = h.payload_len as usize;
        self.expect_after(len);
        if len == 0 {
            return Ok(Some(Frame { h, payload: None }));
        }
        let p = self.rd.read_buf(len).await.map_err(eof_is_closed)?;
        h.check_payload(&p)?;
        Ok(Some(Frame {
            h,
            payload: Some(p),
        }))
    }
}

/// Largest head of a queued message (a frame header, an NBD reply header).
pub const HEAD_MAX_BYTES: usize = HEADER_BYTES;

struct Head {
    bytes: [u8; HEAD_MAX_BYTES],
    len: u8,
}

/// A queued message: its head, its payload, and the shares of budgets
/// it holds until it is sent.
type Queued = (Head, Option<SendBuf>, Vec<Permit>);

struct SendQueue {
    frames: VecDeque<Queued>,
    bytes: usize,
    closed: bool,
    /// When the send under way last made progress (`rt::monotonic`), if
    /// one is under way.
    sending_since: Option<std::time::Duration>,
}

/// A send that has made no progress for this long closes its connection:
/// the peer stopped reading, and what is queued for it would stay in
/// memory for as long as it wanted.
pub const SEND_STALL_MS: u64 = 60_000;
/// A message whose first bytes arrived must arrive whole within this, or
/// its connection is closed (a peer that trickles or stops mid-message
/// holds a buffer and a slot for nothing). Between messages a connection
/// may stay quiet for as long as it likes.
pub const MESSAGE_STALL_MS: u64 = 30_000;

/// Payload bytes a server holds at once, shared by its connections: a
/// request takes its share before its payload is read (and for the reply
/// it will send), and gives it back once its reply has been sent. A
/// connection that must wait for a share stops reading, so a peer that
/// sends faster than replies drain, or never reads its replies, holds at
/// most the budget, never more.
pub struct Budget {
    cap: usize,
    used: Cell<usize>,
    freed: Notify,
}

/// A share of a [`Budget`], given back when dropped.
pub struct Permit {
    budget: Rc<Budget>,
    n: usize,
}

impl Permit {
    /// Gives back all of the share beyond `n` bytes (a reply smaller than
    /// the most it could have been).
    pub fn shrink(&mut self, n: usize) {
        if n < self.n {
            self.budget.used.set(self.budget.used.get() - (self.n - n));
            self.n = n;
            self.budget.freed.notify();
        }
    }
}

/// Closes a connection whose message, once begun, does not arrive whole
/// within [`MESSAGE_STALL_MS`]: the reader marks when a message begins and
/// when it has it; a task per connection looks every quarter of the limit
/// (one timer per connection, none per message).
#[derive(Clone, Default)]
pub struct ReadStall(Rc<Cell<Option<std::time::Duration>>>);

impl ReadStall {
    /// Starts watching `stream` (until it is gone); the handle to mark
    /// messages with.
    pub fn watch(stream: &Rc<Stream>) -> ReadStall {
        let me = ReadStall::default();
        let (since, stream) = (me.0.clone(), Rc::downgrade(stream));
        rt::spawn(async move {
            let stall = std::time::Duration::from_millis(MESSAGE_STALL_MS);
            loop {
                rt::sleep(stall / 4).await;
                let Some(s) = stream.upgrade() else { return };
                if since
                    .get()
                    .is_some_and(|t| rt::monotonic().saturating_sub(t) > stall)
                {
                    tracing::warn!(
                        "closing a connection {}: a message stalled for {MESSAGE_STALL_MS} ms",
                        s.peer()
                    );
                    s.shutdown();
                    return;
                }
            }
        });
        me
    }

    /// A message has begun arriving.
    pub fn begin(&self) {
        if self.0.get().is_none() {
            self.0.set(Some(rt::monotonic()));
        }
    }

    /// It has arrived whole.
    pub fn end(&self) {
        self.0.set(None);
    }
}

impl Budget {
    pub fn new(cap: usize) -> Rc<Budget> {
        Rc::new(Budget {
            cap,
            used: Cell::new(0),
            freed: Notify::new(),
        })
    }

    /// Takes `n` bytes, waiting while they are spent (a request larger
    /// than the whole budget takes all of it, and so runs alone).
    pub async fn take(self: &Rc<Self>, n: usize) -> Permit {
        let n = n.min(self.cap);
        while self.used.get() + n > self.cap {
            self.freed.wait().await;
        }
        self.used.set(self.used.get() + n);
        Permit {
            budget: self.clone(),
            n,
        }
    }

    /// Bytes taken now.
    pub fn used(&self) -> usize {
        self.used.get()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.n > 0 {
            self.budget.used.set(self.budget.used.get() - self.n);
            self.budget.freed.notify();
        }
    }
}

/// Queues frames from many tasks; a writer task sends them in batches.
#[derive(Clone)]
pub struct FrameSender {
    q: Rc<RefCell<SendQueue>>,
    kick: Notify,
    drained: Notify,
}

impl FrameSender {
    /// Starts the writer task for `stream`.
    pub fn start(stream: Rc<Stream>) -> FrameSender {
        let s = FrameSender {
            q: Rc::new(RefCell::new(SendQueue {
                frames: VecDeque::new(),
                bytes: 0,
                closed: false,
                sending_since: None,
            })),
            kick: Notify::new(),
            drained: Notify::new(),
        };
        rt::spawn(s.clone().watchdog(Rc::downgrade(&stream)));
        rt::spawn(s.clone().writer(stream));
        s
    }

    /// Closes the connection when a send has made no progress for
    /// [`SEND_STALL_MS`]. Holds the stream weakly: a closed connection's
    /// socket goes at once, not at the next look.
    async fn watchdog(self, stream: std::rc::Weak<Stream>) {
        let stall = std::time::Duration::from_millis(SEND_STALL_MS);
        loop {
            rt::sleep(stall / 4).await;
            let (closed, since) = {
                let q = self.q.borrow();
                (q.closed, q.sending_since)
            };
            let Some(stream) = stream.upgrade().filter(|_| !closed) else {
                return;
            };
            if since.is_some_and(|t| rt::monotonic().saturating_sub(t) > stall) {
                tracing::warn!(
                    "closing a connection {}: a send made no progress for {SEND_STALL_MS} ms (the peer does not read)",
                    stream.peer()
                );
                // The send under way fails, and the writer closes the rest.
                stream.shutdown();
                return;
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.q.borrow().closed
    }

    /// Queues a frame (its payload owned or shared); waits while the
    /// queue is over its byte limit, holding `permits` (shrunk to the
    /// frame's size) until the frame is sent.
    pub async fn send_held(
        &self,
        h: Header,
        payload: Option<SendBuf>,
        permits: Vec<Permit>,
    ) -> Result<(), NetError> {
        let mut head = Head {
            bytes: [0; HEAD_MAX_BYTES],
            len: HEADER_BYTES as u8,
        };
        h.encode(&mut head.bytes);
        self.send_head(head, payload, Vec::new(), permits).await
    }

    /// Queues `head` (at most [`HEAD_MAX_BYTES`]) and a payload, for
    /// protocols other than the wire protocol (NBD replies).
    pub async fn send_raw(&self, head: &[u8], payload: Option<AlignedBuf>) -> Result<(), NetError> {
        self.send_raw_parts_held(head, payload.into_iter().collect(), Vec::new())
            .await
    }

    /// [`FrameSender::send_raw`] with a payload in parts, sent back to
    /// back from their own buffers (a read of several objects, not
    /// assembled by copying), holding `permits` (shrunk to the message's
    /// size) until all of it is sent.
    pub async fn send_raw_parts_held(
        &self,
        head: &[u8],
        parts: Vec<AlignedBuf>,
        permits: Vec<Permit>,
    ) -> Result<(), NetError> {
        let mut h = Head {
            bytes: [0; HEAD_MAX_BYTES],
            len: head.len() as u8,
        };
        h.bytes[..head.len()].copy_from_slice(head);
        let mut parts = parts.into_iter().map(SendBuf::from);
        let first = parts.next();
        self.send_head(h, first, parts.collect(), permits).await
    }

    /// Queues `head` and its payload (`payload`, then the parts in `more`)
    /// as one message: nothing queued by others comes between its parts.
    async fn send_head(
        &self,
        head: Head,
        payload: Option<SendBuf>,
        more: Vec<SendBuf>,
        mut permits: Vec<Permit>,
    ) -> Result<(), NetError> {
        // Held while queued for what the message is, not for the most it
        // could have been.
        let size = usize::from(head.len)
            + payload.as_ref().map_or(0, |p| p.len())
            + more.iter().map(|p| p.len()).sum::<usize>();
        for p in &mut permits {
            p.shrink(size);
        }
        loop {
            let (closed, full) = {
                let q = self.q.borrow();
                (q.closed, q.bytes >= SEND_QUEUE_MAX_BYTES)
            };
            if closed {
                return Err(NetError::Closed);
            }
            if !full {
                break;
            }
            self.drained.wait().await;
        }
        let mut q = self.q.borrow_mut();
        q.bytes += size;
        q.frames.push_back((head, payload, Vec::new()));
        for p in more {
            let bare = Head {
                bytes: [0; HEAD_MAX_BYTES],
                len: 0,
            };
            q.frames.push_back((bare, Some(p), Vec::new()));
        }
        // The shares go with the message's last part: they come back once
        // all of it is sent.
        q.frames.back_mut().expect("queued above").2 = permits;
        drop(q);
        self.kick.notify();
        Ok(())
    }

    /// Waits until everything queued has been sent (or the stream failed).
    pub async fn flush(&self) {
        while self.q.borrow().bytes > 0 && !self.is_closed() {
            self.drained.wait().await;
        }
    }

    /// Stops the writer; queued frames are dropped (with the budget
    /// shares they held).
    pub fn close(&self) {
        let dropped = {
            let mut q = self.q.borrow_mut();
            q.closed = true;
            q.bytes = 0;
            std::mem::take(&mut q.frames)
        };
        // Their payloads and budget shares go now, not when the last
        // sender handle does.
        drop(dropped);
        self.kick.notify();
        self.drained.notify();
    }

    async fn writer(self, stream: Rc<Stream>) {
        loop {
            let batch: Vec<Queued> = {
                let mut q = self.q.borrow_mut();
                if q.closed {
                    break;
                }
                let n = q.frames.len().min(SEND_BATCH_MAX);
                q.frames.drain(..n).collect()
            };
            if batch.is_empty() {
                self.kick.wait().await;
                continue;
            }
            // Runs of heads between payloads are gathered into one buffer;
            // payloads go out from their own buffers without a copy.
            let mut parts = Vec::with_capacity(batch.len() * 2);
            let mut bytes = 0;
            let mut heads: Vec<u8> = Vec::with_capacity(batch.len() * HEAD_MAX_BYTES);
            let mut permits = Vec::new();
            for (h, p, held) in batch {
                permits.extend(held);
                heads.extend_from_slice(&h.bytes[..usize::from(h.len)]);
                bytes += usize::from(h.len) + p.as_ref().map_or(0, |p| p.len());
                if let Some(p) = p {
                    let n = heads.len();
                    if n > 0 {
                        parts.push((AlignedBuf::from_slice(&heads).into(), 0, n));
                        heads.clear();
                    }
                    let plen = p.len();
                    parts.push((p, 0, plen));
                }
            }
            if !heads.is_empty() {
                let n = heads.len();
                parts.push((AlignedBuf::from_slice(&heads).into(), 0, n));
            }
            self.q.borrow_mut().sending_since = Some(rt::monotonic());
            let q = self.q.clone();
            let progress = move || q.borrow_mut().sending_since = Some(rt::monotonic());
            let sent = stream.send_all_noting(parts, progress).await;
            self.q.borrow_mut().sending_since = None;
            // Sent or failed: either way their shares go back.
            drop(permits);
            if let Err(e) = sent {
                tracing::debug!("send failed: {e}");
                stream.shutdown();
                self.close();
                break;
            }
            let mut q = self.q.borrow_mut();
            // (Closed meanwhile: the count was reset with the queue.)
            q.bytes = q.bytes.saturating_sub(bytes);
            drop(q);
            self.drained.notify();
        }
    }
}

type Waiter = Sender<Result<Frame, NetError>>;

/// A request waiting for its reply, and when it stops waiting.
struct Pending {
    waiter: Waiter,
    /// On the runtime's clock (`rt::monotonic`, virtual in simulations).
    deadline: std::time::Duration,
}

/// Requests awaiting their replies, by the sender's client id and request
/// id (a reply echoes both): two clients' requests forwarded over one
/// connection (a primary's sub-ops carry each client's own ids, for the
/// replicas' retry cache) may share a request id, never both.
type PendingMap = Rc<RefCell<HashMap<(u64, u64), Pending>>>;

/// The client side of a connection: requests out, replies matched by id,
/// each with a deadline (`RPC_TIMEOUT_MS` unless connected with another).
pub struct Conn {
    tx: FrameSender,
    pending: PendingMap,
    timeout: std::time::Duration,
    slots: Notify,
    next_id: Cell<u64>,
    stream: Rc<Stream>,
    pub peer: Addr,
}

impl Conn {
    /// Connects to `addr` and starts the reply reader.
    pub fn connect(addr: &Addr) -> Result<Rc<Conn>, NetError> {
        Self::connect_with_timeout(addr, std::time::Duration::from_millis(RPC_TIMEOUT_MS))
    }

    /// Like [`Conn::connect`], with another deadline for every request.
    /// Deadlines need timers that do not block the thread (io_uring, or
    /// virtual time); without them requests wait for their reply or for
    /// the connection to close.
    pub fn connect_with_timeout(
        addr: &Addr,
        timeout: std::time::Duration,
    ) -> Result<Rc<Conn>, NetError> {
        let stream = Rc::new(Stream::connect(addr)?);
        let c = Rc::new(Conn {
            tx: FrameSender::start(stream.clone()),
            pending: Rc::new(RefCell::new(HashMap::new())),
            timeout,
            slots: Notify::new(),
            next_id: Cell::new(1),
            stream: stream.clone(),
            peer: addr.clone(),
        });
        rt::spawn(reply_reader(
            FrameReader::new(stream),
            c.pending.clone(),
            c.tx.clone(),
            c.slots.clone(),
            addr.clone(),
        ));
        if rt::has_timers() {
            rt::spawn(deadline_watch(Rc::downgrade(&c)));
        }
        Ok(c)
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Closes the connection; requests in flight fail with `Closed`.
    pub fn close(&self) {
        self.stream.shutdown();
        self.tx.close();
    }

    /// Sends a request and waits for the reply. A `request_id` of 0 is
    /// replaced by one of the connection's own (which have bit 62 set);
    /// callers that choose ids (for idempotent retries) keep below 2^62.
    pub async fn call(&self, h: Header, payload: Option<AlignedBuf>) -> Result<Frame, NetError> {
        self.call_with(h, payload.map(SendBuf::from)).await
    }

    /// [`Conn::call`] with a payload shared with other holders: it is
    /// sent from where it is, not copied.
    pub async fn call_shared(
        &self,
        h: Header,
        payload: Option<SharedBuf>,
    ) -> Result<Frame, NetError> {
        self.call_with(h, payload.map(SendBuf::Shared)).await
    }

    async fn call_with(&self, mut h: Header, payload: Option<SendBuf>) -> Result<Frame, NetError> {
        while self.pending.borrow().len() >= CONN_INFLIGHT_MAX {
            if self.is_closed() {
                return Err(NetError::Closed);
            }
            self.slots.wait().await;
        }
        if h.request_id == 0 {
            h.request_id = self.next_id.get() | OWN_ID_BIT;
            self.next_id.set(self.next_id.get() + 1);
        }
        let id = (h.client, h.request_id);
        // The same request twice at once (a retry forwarded while the
        // first attempt still runs): the second waits for the first's
        // reply, which would otherwise be taken for its own.
        while self.pending.borrow().contains_key(&id) {
            if self.is_closed() {
                return Err(NetError::Closed);
            }
            self.slots.wait().await;
        }
        let (tx, rx) = oneshot();
        let deadline = rt::monotonic() + self.timeout;
        self.pending.borrow_mut().insert(
            id,
            Pending {
                waiter: tx,
                deadline,
            },
        );
        // Dropped (a caller that stopped waiting, say through
        // `rt::timeout`) before its frame is queued, the
        // request must not wait in `pending` for a reply that never comes
        // (its deadline would tear the connection down).
        struct Unsent<'a>(&'a PendingMap, (u64, u64), bool, &'a Notify);
        impl Drop for Unsent<'_> {
            fn drop(&mut self) {
                if self.2 {
                    self.0.borrow_mut().remove(&self.1);
                    // A duplicate may wait for this id to be free.
                    self.3.notify();
                }
            }
        }
        let mut unsent = Unsent(&self.pending, id, true, &self.slots);
        self.tx.send_held(h, payload, Vec::new()).await?;
        unsent.2 = false;
        let f = rx.await.unwrap_or(Err(NetError::Closed))?;
        if f.h.op != h.op {
            return Err(NetError::Protocol(format!(
                "reply to {:?} came back as {:?}",
                h.op, f.h.op
            )));
        }
        Ok(f)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close();
    }
}

/// Fails the requests of `conn` whose deadline passed, and tears the
/// connection down with them (its peer is not answering). Ends with the
/// connection.
async fn deadline_watch(conn: std::rc::Weak<Conn>) {
    let every = match conn.upgrade() {
        Some(c) => c.timeout / DEADLINE_CHECKS_PER_TIMEOUT,
        None => return,
    };
    loop {
        rt::sleep(every).await;
        let Some(c) = conn.upgrade() else { return };
        if c.is_closed() {
            return;
        }
        let now = rt::monotonic();
        let late: Vec<Waiter> = {
            let mut p = c.pending.borrow_mut();
            let ids: Vec<(u64, u64)> = p
                .iter()
                .filter(|(_, w)| w.deadline <= now)
                .map(|(&id, _)| id)
                .collect();
            ids.iter()
                .filter_map(|id| p.remove(id))
                .map(|w| w.waiter)
                .collect()
        };
        if late.is_empty() {
            continue;
        }
        let ms = c.timeout.as_millis() as u64;
        tracing::warn!(
            "{}: {} requests unanswered after {ms} ms; closing the connection",
            c.peer,
            late.len()
        );
        for w in late {
            w.send(Err(NetError::Timeout(ms)));
        }
        c.close();
        c.slots.notify();
        return;
    }
}

async fn reply_reader(
    mut rd: FrameReader,
    pending: PendingMap,
    tx: FrameSender,
    slots: Notify,
    peer: Addr,
) {
    let why = loop {
        match rd.next().await {
            Ok(Some(f)) if f.h.reply => {
                let w = pending.borrow_mut().remove(&(f.h.client, f.h.request_id));
                match w {
                    Some(w) => w.waiter.send(Ok(f)),
                    None => break format!("reply to unknown request {}", f.h.request_id),
                }
                slots.notify();
            }
            Ok(Some(f)) => break format!("unexpected request {:?} on a client connection", f.h.op),
            Ok(None) => break String::new(),
            Err(e) => break e.to_string(),
        }
    };
    if !why.is_empty() && !tx.is_closed() {
        tracing::warn!("{peer}: closing connection: {why}");
    }
    rd.rd.stream.shutdown();
    tx.close();
    let waiters: Vec<Waiter> = pending
        .borrow_mut()
        .drain()
        .map(|(_, w)| w.waiter)
        .collect();
    for w in waiters {
        w.send(Err(NetError::Closed));
    }
    slots.notify();
}

/// A request/reply channel to one peer (a [`Conn`] over a socket, or a
/// simulated link).
pub trait Rpc: 'static {
    /// Sends a request and waits for its reply, within the channel's
    /// deadline.
    fn call(
        &self,
        h: Header,
        payload: Option<AlignedBuf>,
    ) -> impl std::future::Future<Output = Result<Frame, NetError>>;
    /// [`Rpc::call`] with a payload shared with other sends (a primary's
    /// to each replica): sent without a copy where the channel can.
    fn call_shared(
        &self,
        h: Header,
        payload: Option<SharedBuf>,
    ) -> impl std::future::Future<Output = Result<Frame, NetError>>;
    fn is_closed(&self) -> bool;
}

/// How a node reaches its peers: [`Sockets`] in a cluster, an in-process
/// network with injected faults in the simulator.
pub trait Transport: 'static {
    type Conn: Rpc;
    fn connect(&self, addr: &Addr) -> Result<Rc<Self::Conn>, NetError>;
}

/// Real connections (unix or TCP sockets).
#[derive(Clone, Copy, Debug, Default)]
pub struct Sockets;

impl Transport for Sockets {
    type Conn = Conn;
    fn connect(&self, addr: &Addr) -> Result<Rc<Conn>, NetError> {
        Conn::connect(addr)
    }
}

impl Rpc for Conn {
    async fn call(&self, h: Header, payload: Option<AlignedBuf>) -> Result<Frame, NetError> {
        Conn::call(self, h, payload).await
    }
    async fn call_shared(&self, h: Header, payload: Option<SharedBuf>) -> Result<Frame, NetError> {
        Conn::call_shared(self, h, payload).await
    }
    fn is_closed(&self) -> bool {
        Conn::is_closed(self)
    }
}

/// What a server does with each request.
pub trait Handler: 'static {
    /// Handles one request; returns the reply header and payload.
    fn handle(
        self: Rc<Self>,
        f: Frame,
    ) -> impl std::future::Future<Output = (Header, Option<AlignedBuf>)>;

    /// The largest reply payload request `h` can get, taken from the
    /// listener's [`Budget`] with its own payload before it is read (by
    /// default the largest any frame carries).
    fn reply_bytes_max(&self, _h: &Header) -> usize {
        nacre_wire::PAYLOAD_MAX_BYTES as usize
    }
}

/// Accepts connections on `l` forever, serving each with `h`: at most
/// [`SERVE_CONNECTIONS_MAX`] at once, their payloads within one
/// [`SERVE_PAYLOAD_MAX_BYTES`] budget.
pub async fn serve<H: Handler>(l: Listener, h: Rc<H>) {
    let budget = Budget::new(SERVE_PAYLOAD_MAX_BYTES);
    accept_capped(&l, SERVE_CONNECTIONS_MAX, |s, admitted| {
        // A frame connection has no handshake: it holds its slot at once.
        admitted.attach();
        let (h, budget) = (h.clone(), budget.clone());
        async move { serve_conn(s, h, &budget).await }
    })
    .await
}

/// A connection's place among a listener's ([`accept_capped`]).
pub struct Admitted {
    attached: Rc<Cell<bool>>,
}

impl Admitted {
    /// The connection has finished its handshake (chosen what it serves):
    /// from now on it is never closed to make room for another.
    pub fn attach(&self) {
        self.attached.set(true);
    }
}

/// One open connection of a listener.
struct Slot {
    stream: Rc<Stream>,
    peer: Option<std::net::IpAddr>,
    attached: Rc<Cell<bool>>,
}

/// Accepts connections on `l` forever and runs `serve` on each, at most
/// `max` at once and [`PEER_CONNECTIONS_MAX`] from one IP address. When
/// `max` are open, a new one takes the place of the oldest that has not
/// finished its handshake (so a flood of connections that never finish
/// theirs cannot keep a real client out for longer than its own
/// handshake); if every one has, the new one is closed. One warning per
/// burst.
pub async fn accept_capped<F, Fut>(l: &Listener, max: usize, mut serve: F)
where
    F: FnMut(Rc<Stream>, Admitted) -> Fut,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let open: Rc<RefCell<BTreeMap<u64, Slot>>> = Rc::default();
    let mut next = 0u64;
    let mut refused = 0u64;
    loop {
        match l.accept().await {
            Ok(s) => {
                let peer = s
                    .peer()
                    .parse::<std::net::SocketAddr>()
                    .ok()
                    .map(|a| a.ip());
                let from_peer = |o: &BTreeMap<u64, Slot>| {
                    peer.map_or(0, |p| o.values().filter(|c| c.peer == Some(p)).count())
                };
                let why = {
                    let mut o = open.borrow_mut();
                    if from_peer(&o) >= PEER_CONNECTIONS_MAX {
                        Some(format!(
                            "{PEER_CONNECTIONS_MAX} connections from one address"
                        ))
                    } else if o.len() >= max {
                        let oldest = (o.iter()).find(|(_, c)| !c.attached.get()).map(|(&k, _)| k);
                        match oldest.and_then(|k| o.remove(&k)) {
                            Some(c) => {
                                tracing::info!(
                                    "{}: {max} connections open: closed the oldest still in its handshake ({}) for a new one",
                                    l.local_addr(),
                                    c.stream.peer()
                                );
                                c.stream.shutdown();
                                None
                            }
                            None => Some(format!("{max} connections open")),
                        }
                    } else {
                        None
                    }
                };
                if let Some(why) = why {
                    if refused == 0 {
                        tracing::warn!(
                            "{}: {why}: closing new ones ({} first)",
                            l.local_addr(),
                            s.peer()
                        );
                    }
                    refused += 1;
                    s.shutdown();
                    continue;
                }
                if std::mem::take(&mut refused) > 0 {
                    tracing::warn!("{}: connections accepted again", l.local_addr());
                }
                let s = Rc::new(s);
                let attached = Rc::new(Cell::new(false));
                let key = next;
                next += 1;
                let slot = Slot {
                    stream: s.clone(),
                    peer,
                    attached: attached.clone(),
                };
                open.borrow_mut().insert(key, slot);
                let (conn, open) = (serve(s, Admitted { attached }), open.clone());
                rt::spawn(async move {
                    conn.await;
                    open.borrow_mut().remove(&key);
                });
            }
            Err(e) => {
                tracing::warn!("accept on {}: {e}", l.local_addr());
                rt::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// The request tasks of one server connection: at most `max` at once
/// (the reader waits for a slot before taking the next request), and a
/// drain that lets their replies go out before the connection closes.
pub struct Inflight {
    count: Rc<Cell<usize>>,
    done: Notify,
    max: usize,
}

impl Inflight {
    pub fn new(max: usize) -> Inflight {
        Inflight {
            count: Rc::new(Cell::new(0)),
            done: Notify::new(),
            max,
        }
    }

    /// Waits until fewer than `max` tasks run.
    pub async fn slot(&self) {
        while self.count.get() >= self.max {
            self.done.wait().await;
        }
    }

    /// Runs `f` as a task counted against the limit.
    pub fn spawn(&self, f: impl std::future::Future<Output = ()> + 'static) {
        self.count.set(self.count.get() + 1);
        let (count, done) = (self.count.clone(), self.done.clone());
        // Boxed before it is wrapped: a request's future is large (a few
        // KiB), and each move of it by value is a copy of all of it.
        let f = Box::pin(f);
        rt::spawn(async move {
            f.await;
            count.set(count.get() - 1);
            done.notify();
        });
    }

    /// Waits for every task (unless `tx` failed), sends what they queued
    /// and closes `tx`.
    pub async fn drain(&self, tx: &FrameSender) {
        while self.count.get() > 0 && !tx.is_closed() {
            self.done.wait().await;
        }
        tx.flush().await;
        tx.close();
    }
}

/// Serves one connection until it closes or sends a bad frame, its
/// payloads within `budget` (the listener's) and a budget of its own.
async fn serve_conn<H: Handler>(stream: Rc<Stream>, h: Rc<H>, budget: &Rc<Budget>) {
    let tx = FrameSender::start(stream.clone());
    let mut rd = FrameReader::new(stream.clone());
    let inflight = Inflight::new(SERVE_INFLIGHT_MAX);
    let mine = Budget::new(SERVE_CONN_PAYLOAD_MAX_BYTES);
    let stall = ReadStall::watch(&stream);
    loop {
        inflight.slot().await;
        let (f, held) = match rd.next_within(&*h, &mine, budget, &stall).await {
            Ok(Some((f, held))) if !f.h.reply => (f, held),
            Ok(Some((f, _))) => {
                tracing::warn!(
                    "closing connection: a reply ({:?}) sent to a server",
                    f.h.op
                );
                break;
            }
            Ok(None) => break,
            Err(NetError::Closed) => break,
            Err(e) => {
                tracing::warn!("closing connection: {e}");
                break;
            }
        };
        // The handler's future goes to the heap once, where it is made:
        // the task around it stays small, and spawning it copies little.
        let handling = Box::pin(h.clone().handle(f));
        let tx = tx.clone();
        inflight.spawn(async move {
            let (rh, payload) = handling.await;
            let _ = tx.send_held(rh, payload.map(SendBuf::from), held).await;
        });
    }
    inflight.drain(&tx).await;
    stream.shutdown();
}

#[cfg(test)]
mod tests {
    use super::*;
    use nacre_types::ObjectId;
    use nacre_wire::Op;
    use std::time::Duration;

    fn frame(n: usize, fill: u8) -> Vec<u8> {
        let payload = vec![fill; n];
        let op = if n == 0 { Op::Stat } else { Op::Write };
        let mut h = Header::request(op, n as u64, ObjectId::default()).with_payload(&payload);
        h.length = n as u32;
        let mut out = vec![0; HEADER_BYTES];
        h.encode(&mut out);
        out.extend_from_slice(&payload);
        out
    }

    /// The two ends of a unix socket connection in `d`.
    async fn connected(d: &tempfile::TempDir) -> (Stream, Stream) {
        let addr = Addr::Unix(d.path().join("s.sock"));
        let l = Listener::bind(&addr).unwrap();
        let tx = Stream::connect(&addr).unwrap();
        (tx, l.accept().await.unwrap())
    }

    /// After a large payload the next header is received alone, so the
    /// payload behind it goes straight into its own buffer; frames of
    /// every size in between still come out whole and in order.
    #[test]
    fn after_a_large_payload_the_next_header_is_received_alone() {
        let d = tempfile::tempdir().unwrap();
        rt::block_on(async {
            let (tx, rx) = connected(&d).await;
            let big = 128 << 10;
            // The last frame fits in any socket's buffer whole (it must be
            // there before the reader looks), and is still far larger
            // than a header.
            let sizes = [big, 4096, 0, 512, big, 40 << 10];
            let (sent_tx, sent_rx) = oneshot();
            let sender = rt::spawn(async move {
                for (i, &n) in sizes.iter().enumerate() {
                    tx.send_bytes(&frame(n, i as u8)).await.unwrap();
                }
                sent_tx.send(());
                tx
            });
            let mut r = FrameReader::new(Rc::new(rx));
            let read = async {
                for (i, &n) in sizes[..5].iter().enumerate() {
                    let f = r.next().await.unwrap().unwrap();
                    assert_eq!(f.h.payload_len as usize, n);
                    let p = f.payload.map(|p| p.to_vec()).unwrap_or_default();
                    assert_eq!(p, vec![i as u8; n], "frame {i}");
                }
                // The last frame is all in the socket; only its header is
                // taken.
                sent_rx.await.unwrap();
                assert!(r.rd.ready(1).await.unwrap());
                assert_eq!(r.rd.buffered(), HEADER_BYTES);
                let f = r.next().await.unwrap().unwrap();
                assert_eq!(f.payload.unwrap().to_vec(), vec![5; 40 << 10]);
            };
            rt::timeout(Duration::from_secs(60), read)
                .await
                .expect("frames arrive");
            drop(sender.await);
        });
    }

    /// A message in parts goes out whole: its head, then its parts in
    /// order, with nothing from other senders in between, also when the
    /// sender's writer takes it in two batches (more than
    /// `SEND_BATCH_MAX` parts are queued at once); and the budget share
    /// it holds stays taken until its last part is sent.
    #[test]
    fn a_message_in_parts_is_sent_whole() {
        let d = tempfile::tempdir().unwrap();
        rt::block_on(async {
            let (out, rx) = connected(&d).await;
            let tx = FrameSender::start(Rc::new(out));
            // Sender s, message m: head [s, m, parts, 0xee], then `parts`
            // parts of 4096 + 512 * i bytes, each filled with s ^ m ^ i.
            // No sender waits between messages: all of them (over 1 000
            // parts) are queued before the writer takes its first batch.
            let mut senders = Vec::new();
            for s in 0..4u8 {
                let tx = tx.clone();
                senders.push(rt::spawn(async move {
                    for m in 0..100u8 {
                        let n = 1 + (m % 5) as usize;
                        let parts = (0..n)
                            .map(|i| AlignedBuf::from_slice(&vec![s ^ m ^ i as u8; 4096 + 512 * i]))
                            .collect();
                        let head = [s, m, n as u8, 0xee];
                        tx.send_raw_parts_held(&head, parts, Vec::new())
                            .await
                            .unwrap();
                    }
                }));
            }
            let mut rd = ByteReader::new(Rc::new(rx));
            let read = async {
                let mut next = [0u8; 4];
                let mut seen = [0u8; 4];
                for _ in 0..400 {
                    rd.read_exact(&mut next).await.unwrap();
                    let [s, m, n, mark] = next;
                    assert_eq!(mark, 0xee, "a head where one is due");
                    assert_eq!(m, seen[s as usize], "sender {s}'s messages in order");
                    seen[s as usize] += 1;
                    for i in 0..n as usize {
                        let mut part = vec![0; 4096 + 512 * i];
                        rd.read_exact(&mut part).await.unwrap();
                        assert!(
                            part.iter().all(|&b| b == s ^ m ^ i as u8),
                            "{s}/{m} part {i}"
                        );
                    }
                }
                assert_eq!(seen, [100; 4]);
                rt::join_all(senders).await;

                // One message of 300 parts of 16 KiB (4.8 MB: two batches,
                // far more than a socket holds) with a budget share: it is
                // still held after 270 parts were read, while the second
                // batch is being sent; it comes back once all are.
                let budget = Budget::new(8 << 20);
                let share = budget.take(5 << 20).await;
                let parts = (0..300)
                    .map(|i| AlignedBuf::from_slice(&[i as u8; 16 << 10]))
                    .collect();
                tx.send_raw_parts_held(&[0xab], parts, vec![share])
                    .await
                    .unwrap();
                let mut head = [0u8; 1];
                rd.read_exact(&mut head).await.unwrap();
                assert_eq!(head, [0xab]);
                let mut part = vec![0; 16 << 10];
                for i in 0..300 {
                    if i == 270 {
                        assert!(
                            budget.used() > 0,
                            "share returned before the last part was sent"
                        );
                    }
                    rd.read_exact(&mut part).await.unwrap();
                    assert!(part.iter().all(|&b| b == i as u8), "part {i}");
                }
                tx.flush().await;
                assert_eq!(budget.used(), 0, "share kept after the message was sent");
            };
            rt::timeout(Duration::from_secs(60), read)
                .await
                .expect("messages arrive");
        });
    }
}
