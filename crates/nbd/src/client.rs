//! A small NBD client (fixed newstyle, OPT_GO, simple replies, pipelined
//! requests), so `nacre bench --nbd URI` can measure any NBD server —
//! Nacre's gateway or another system's — through the same code path.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::rc::Rc;

use nacre_io::net::Stream;
use nacre_io::sync::{oneshot, Sender};
use nacre_io::{rt, AlignedBuf};
use nacre_net::{ByteReader, FrameSender};

use crate::proto::*;

type Reply = Result<Option<AlignedBuf>, io::Error>;
/// Requests awaiting a reply: cookie → (command, read length, waiter).
type Pending = Rc<RefCell<HashMap<u64, (u16, u32, Sender<Reply>)>>>;

pub struct NbdClient {
    tx: FrameSender,
    stream: Rc<Stream>,
    pending: Pending,
    next: Cell<u64>,
    pub size_bytes: u64,
    pub flags: u16,
}

fn proto_err(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

impl NbdClient {
    /// Connects to `uri` and selects its export with OPT_GO.
    pub async fn connect(uri: &str) -> io::Result<Rc<NbdClient>> {
        let u = parse_uri(uri).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let stream = Rc::new(Stream::connect(&u.addr)?);
        let mut rd = ByteReader::new(stream.clone());
        let mut hello = [0u8; 18];
        rd.read_exact(&mut hello).await?;
        if hello[..8] != NBDMAGIC.to_be_bytes() || hello[8..16] != IHAVEOPT.to_be_bytes() {
            return Err(proto_err("not an NBD newstyle server"));
        }
        let sflags = u16::from_be_bytes([hello[16], hello[17]]);
        if sflags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(proto_err("server does not speak fixed newstyle"));
        }
        let cflags = CLIENT_FLAG_FIXED_NEWSTYLE | (u32::from(sflags & FLAG_NO_ZEROES));
        let mut go = Vec::new();
        go.extend_from_slice(&cflags.to_be_bytes());
        go.extend_from_slice(&IHAVEOPT.to_be_bytes());
        go.extend_from_slice(&OPT_GO.to_be_bytes());
        go.extend_from_slice(&(4 + u.export.len() as u32 + 2 + 2).to_be_bytes());
        go.extend_from_slice(&(u.export.len() as u32).to_be_bytes());
        go.extend_from_slice(u.export.as_bytes());
        go.extend_from_slice(&1u16.to_be_bytes());
        go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        stream.send_bytes(&go).await?;
        let mut size = None;
        loop {
            let mut h = [0u8; 20];
            rd.read_exact(&mut h).await?;
            if h[..8] != OPT_REPLY_MAGIC.to_be_bytes() {
                return Err(proto_err("bad option reply magic"));
            }
            let kind = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
            let len = u32::from_be_bytes(h[16..20].try_into().expect("4 bytes"));
            if len > OPTION_MAX_BYTES {
                return Err(proto_err("option reply too large"));
            }
            let mut data = vec![0u8; len as usize];
            rd.read_exact(&mut data).await?;
            match kind {
                REP_ACK => break,
                REP_INFO if data.len() >= 12 && data[..2] == INFO_EXPORT.to_be_bytes() => {
                    let s = u64::from_be_bytes(data[2..10].try_into().expect("8 bytes"));
                    let f = u16::from_be_bytes([data[10], data[11]]);
                    size = Some((s, f));
                }
                REP_INFO => {}
                k if k & (1 << 31) != 0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("export {:?}: {}", u.export, String::from_utf8_lossy(&data)),
                    ))
                }
                k => return Err(proto_err(format!("unexpected option reply {k}"))),
            }
        }
        let (size_bytes, flags) = size.ok_or_else(|| proto_err("server sent no export info"))?;
        let c = Rc::new(NbdClient {
            tx: FrameSender::start(stream.clone()),
            stream,
            pending: Rc::new(RefCell::new(HashMap::new())),
            next: Cell::new(1),
            size_bytes,
            flags,
        });
        rt::spawn(reply_reader(rd, c.pending.clone(), c.tx.clone()));
        Ok(c)
    }

    async fn call(
        &self,
        kind: u16,
        flags: u16,
        offset: u64,
        len: u32,
        data: Option<AlignedBuf>,
    ) -> Reply {
        let cookie = self.next.get();
        self.next.set(cookie + 1);
        let (tx, rx) = oneshot();
        self.pending.borrow_mut().insert(cookie, (kind, len, tx));
        let r = Request {
            flags,
            kind,
            cookie,
            offset,
            len,
        };
        if self.tx.send_raw(&encode_request(&r), data).await.is_err() {
            self.pending.borrow_mut().remove(&cookie);
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "NBD connection closed",
            ));
        }
        rx.await.unwrap_or_else(|| {
            Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "NBD connection closed",
            ))
        })
    }

    pub async fn read(&self, offset: u64, len: u32) -> io::Result<AlignedBuf> {
        self.call(CMD_READ, 0, offset, len, None)
            .await?
            .ok_or_else(|| proto_err("read reply without data"))
    }

    pub async fn write(&self, offset: u64, data: AlignedBuf, fua: bool) -> io::Result<()> {
        let len = data.len() as u32;
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.call(CMD_WRITE, flags, offset, len, Some(data))
            .await
            .map(drop)
    }

    pub async fn flush(&self) -> io::Result<()> {
        self.call(CMD_FLUSH, 0, 0, 0, None).await.map(drop)
    }

    pub async fn trim(&self, offset: u64, len: u32) -> io::Result<()> {
        self.call(CMD_TRIM, 0, offset, len, None).await.map(drop)
    }

    pub async fn write_zeroes(&self, offset: u64, len: u32) -> io::Result<()> {
        self.call(CMD_WRITE_ZEROES, 0, offset, len, None)
            .await
            .map(drop)
    }

    /// Sends DISC and closes.
    pub async fn disconnect(&self) {
        let r = Request {
            flags: 0,
            kind: CMD_DISC,
            cookie: 0,
            offset: 0,
            len: 0,
        };
        let _ = self.tx.send_raw(&encode_request(&r), None).await;
        self.tx.flush().await;
        self.stream.shutdown();
    }
}

async fn reply_reader(mut rd: ByteReader, pending: Pending, tx: FrameSender) {
    let why = loop {
        let mut h = [0u8; 16];
        if let Err(e) = rd.read_exact(&mut h).await {
            break e.to_string();
        }
        if h[..4] != SIMPLE_REPLY_MAGIC.to_be_bytes() {
            break "bad reply magic".to_string();
        }
        let err = u32::from_be_bytes(h[4..8].try_into().expect("4 bytes"));
        let cookie = u64::from_be_bytes(h[8..16].try_into().expect("8 bytes"));
        let Some((kind, len, w)) = pending.borrow_mut().remove(&cookie) else {
            break format!("reply for unknown cookie {cookie}");
        };
        if err != 0 {
            w.send(Err(io::Error::from_raw_os_error(err as i32)));
            continue;
        }
        if kind != CMD_READ {
            w.send(Ok(None));
            continue;
        }
        match rd.read_buf(len as usize).await {
            Ok(b) => w.send(Ok(Some(b))),
            Err(e) => break e.to_string(),
        }
    };
    tracing::debug!("nbd client: connection ended: {why}");
    rd.stream.shutdown();
    tx.close();
    let waiters: Vec<_> = pending.borrow_mut().drain().collect();
    for (_, (_, _, w)) in waiters {
        w.send(Err(io::Error::new(
            io::ErrorKind::BrokenPipe,
            "NBD connection closed",
        )));
    }
}
