//! The client library: what a gateway (or `nacre bench`) links to reach
//! the cluster.
//!
//! [`Cluster`] holds the map (from the meta store) and one connection per
//! OSD; an object op goes to its PG's primary with the PG table's epoch.
//! A lost connection, a `StaleEpoch` or `NotPrimary` answer (the map is
//! reloaded) and an `Unavailable` one (a PG peering, or below `min_size`)
//! are retried with the same request id, which the primary uses to apply
//! a write at most once, for up to `CLIENT_OP_TIMEOUT_MS`.
//!
//! [`Volume`] stripes a thin block device over objects: byte `x` lives in
//! object `x / object_bytes` at offset `x % object_bytes`. An object that
//! was never written does not exist and reads as zeros; trimming a whole
//! object deletes it, so space comes back.
// PERF-CRITICAL

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use nacre_io::net::Addr;
use nacre_io::{rt, AlignedBuf};
use nacre_meta::map::{self, ClusterMap, PoolRecord, VolumeRecord};
use nacre_meta::{MetaError, MetaStore};
use nacre_net::{Conn, Frame};
use nacre_types::{pg_of, ObjectId, CLIENT_OP_TIMEOUT_MS, SECTOR_BYTES};
use nacre_wire::{Header, Op, Status};

/// Pause before the second attempt of an op; it doubles up to the next.
const RETRY_DELAY: Duration = Duration::from_millis(50);
const RETRY_DELAY_MAX: Duration = Duration::from_millis(1000);
/// Largest single volume I/O (the NBD gateway's limit is lower).
pub const IO_MAX_BYTES: u64 = 64 << 20;
/// Objects deleted at once by a trim.
const TRIM_PARALLEL_MAX: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no space left in the cluster")]
    NoSpace,
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("no volume named {0:?} (`nacre volume ls` lists them)")]
    NoVolume(String),
    #[error("data failed its checksum: {0}")]
    Corrupt(String),
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Meta(#[from] MetaError),
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// A connection to the cluster, on one runtime thread.
pub struct Cluster {
    meta: Arc<dyn MetaStore>,
    map: RefCell<ClusterMap>,
    conns: RefCell<HashMap<u32, Rc<Conn>>>,
    client_id: u64,
    next_request: Cell<u64>,
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into the buffer we pass.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if n == 8 {
        return u64::from_le_bytes(b);
    }
    // Uniqueness, not secrecy, is needed: time and pid do.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

impl Cluster {
    /// Loads the map from `meta`. Connections open on first use.
    pub fn connect(meta: Arc<dyn MetaStore>) -> Result<Rc<Cluster>> {
        let m = map::load(&*meta)?;
        if m.pools.is_empty() {
            return Err(ClientError::Unavailable(
                "the cluster map has no pool".into(),
            ));
        }
        Ok(Rc::new(Cluster {
            meta,
            map: RefCell::new(m),
            conns: RefCell::new(HashMap::new()),
            client_id: random_u64() & !(1 << 63),
            next_request: Cell::new(1),
        }))
    }

    pub fn meta(&self) -> &Arc<dyn MetaStore> {
        &self.meta
    }

    pub fn map(&self) -> ClusterMap {
        self.map.borrow().clone()
    }

    /// The pool volumes are created in (the first one).
    pub fn default_pool(&self) -> PoolRecord {
        self.map.borrow().pools[0].clone()
    }

    fn reload_map(&self) -> Result<()> {
        let m = map::load(&*self.meta)?;
        *self.map.borrow_mut() = m;
        Ok(())
    }

    fn conn(&self, osd: u32) -> Result<Rc<Conn>> {
        if let Some(c) = self.conns.borrow().get(&osd) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let addr: Addr = {
            let m = self.map.borrow();
            let rec = m
                .osd(osd)
                .ok_or_else(|| ClientError::Unavailable(format!("osd.{osd} is not in the map")))?;
            rec.addr
                .parse()
                .map_err(|e| ClientError::Unavailable(format!("osd.{osd} address: {e}")))?
        };
        let c = Conn::connect(&addr)
            .map_err(|e| ClientError::Unavailable(format!("osd.{osd}: {e}")))?;
        self.conns.borrow_mut().insert(osd, c.clone());
        Ok(c)
    }

    /// Sends `h` (for an object of `pool`) to the primary, with retries.
    async fn object_op(
        &self,
        pool: u32,
        mut h: Header,
        payload: Option<&AlignedBuf>,
    ) -> Result<Frame> {
        h.client = self.client_id;
        // One id for all attempts: the primary applies a write once.
        h.request_id = self.next_request.get();
        self.next_request.set(h.request_id + 1);
        let mut last = String::new();
        let until = rt::monotonic() + Duration::from_millis(CLIENT_OP_TIMEOUT_MS);
        let mut delay = Duration::ZERO;
        while rt::monotonic() < until {
            if !delay.is_zero() {
                rt::sleep(delay).await;
            }
            delay = (delay * 2).clamp(RETRY_DELAY, RETRY_DELAY_MAX);
            let (primary, epoch, pg) = {
                let m = self.map.borrow();
                let pm = m.pgmap(pool).ok_or_else(|| {
                    ClientError::Unavailable(format!("pool {pool} has no PG table"))
                })?;
                let pg = pg_of(h.oid, pm.pg_count());
                (pm.primary(pg), pm.epoch, pg)
            };
            let Some(primary) = primary else {
                last = format!("PG {pg}: no OSD of it is up");
                self.reload_map()?;
                continue;
            };
            h.epoch = epoch;
            h.pg = pg;
            let conn = match self.conn(primary) {
                Ok(c) => c,
                Err(e) => {
                    last = e.to_string();
                    self.reload_map()?;
                    continue;
                }
            };
            let body = payload.map(|p| AlignedBuf::from_slice(p));
            match conn.call(h, body).await {
                Ok(f) if f.h.status == Status::StaleEpoch || f.h.status == Status::NotPrimary => {
                    last = format!("osd.{primary}: {:?}", f.h.status);
                    self.reload_map()?;
                }
                Ok(f) if f.h.status == Status::Unavailable => {
                    last = format!("osd.{primary}: unavailable");
                }
                Ok(f) => return Ok(f),
                Err(e) => {
                    last = format!("osd.{primary}: {e}");
                    self.conns.borrow_mut().remove(&primary);
                    self.reload_map()?;
                }
            }
        }
        Err(ClientError::Unavailable(last))
    }
}

fn status_err(s: Status, what: &str) -> ClientError {
    match s {
        Status::NoSpace => ClientError::NoSpace,
        Status::Corrupt => ClientError::Corrupt(what.to_string()),
        Status::Invalid => ClientError::Invalid(what.to_string()),
        s => ClientError::Unavailable(format!("{what}: {s:?}")),
    }
}

/// One piece of a volume I/O: a range inside one object.
#[derive(Clone, Copy, Debug)]
struct Piece {
    block: u64,
    offset: u32,
    len: u32,
    /// Position in the caller's buffer.
    at: usize,
}

fn pieces(offset: u64, len: u64, object_bytes: u32) -> impl Iterator<Item = Piece> {
    let ob = u64::from(object_bytes);
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let block = pos / ob;
        let off = pos % ob;
        let n = (ob - off).min(end - pos);
        let p = Piece {
            block,
            offset: off as u32,
            len: n as u32,
            at: (pos - offset) as usize,
        };
        pos += n;
        Some(p)
    })
}

/// A block volume striped over objects.
pub struct Volume {
    cluster: Rc<Cluster>,
    rec: VolumeRecord,
}

impl Volume {
    /// Opens volume `name` (its record is read once, now).
    pub fn open(cluster: &Rc<Cluster>, name: &str) -> Result<Volume> {
        let rec = map::get_volume(&**cluster.meta(), name)?
            .ok_or_else(|| ClientError::NoVolume(name.to_string()))?;
        Ok(Volume {
            cluster: cluster.clone(),
            rec,
        })
    }

    pub fn record(&self) -> &VolumeRecord {
        &self.rec
    }

    pub fn size_bytes(&self) -> u64 {
        self.rec.size_bytes
    }

    fn oid(&self, block: u64) -> ObjectId {
        ObjectId::new(self.rec.id, block)
    }

    /// Checks that `offset..offset+len` is sector-aligned, non-empty, at
    /// most `max_bytes` long and inside the volume.
    fn check(&self, what: &str, offset: u64, len: u64, max_bytes: u64) -> Result<()> {
        let s = u64::from(SECTOR_BYTES);
        if len == 0 || len > max_bytes || !offset.is_multiple_of(s) || !len.is_multiple_of(s) {
            return Err(ClientError::Invalid(format!(
                "{what} {offset}+{len}: must be {s}-byte aligned and at most {max_bytes} bytes"
            )));
        }
        if offset
            .checked_add(len)
            .is_none_or(|e| e > self.rec.size_bytes)
        {
            return Err(ClientError::Invalid(format!(
                "{what} {offset}+{len} past the end of the {}-byte volume",
                self.rec.size_bytes
            )));
        }
        Ok(())
    }

    async fn read_piece(&self, p: Piece) -> Result<Option<AlignedBuf>> {
        let mut h = Header::request(Op::Read, 0, self.oid(p.block));
        h.offset = p.offset;
        h.length = p.len;
        let f = self.cluster.object_op(self.rec.pool, h, None).await?;
        match f.h.status {
            Status::Ok => Ok(f.payload),
            Status::NotFound => Ok(None),
            s => Err(status_err(s, &format!("read {}", self.oid(p.block)))),
        }
    }

    /// Reads `len` bytes at `offset`; unwritten ranges are zeros.
    pub async fn read(self: &Rc<Self>, offset: u64, len: u64) -> Result<AlignedBuf> {
        self.check("read", offset, len, IO_MAX_BYTES)?;
        let ps: Vec<Piece> = pieces(offset, len, self.rec.object_bytes).collect();
        if let [p] = ps[..] {
            return Ok(match self.read_piece(p).await? {
                Some(b) => b,
                None => AlignedBuf::zeroed(len as usize),
            });
        }
        let tasks: Vec<_> = (ps.iter())
            .map(|&p| {
                let me = self.clone();
                rt::spawn(async move { (p, me.read_piece(p).await) })
            })
            .collect();
        let mut out = AlignedBuf::new(len as usize);
        for t in tasks {
            let (p, r) = t.await;
            let dst = &mut out[p.at..p.at + p.len as usize];
            match r? {
                Some(b) => dst.copy_from_slice(&b),
                None => dst.fill(0),
            }
        }
        Ok(out)
    }

    async fn write_piece(&self, p: Piece, data: AlignedBuf) -> Result<()> {
        let mut h = Header::request(Op::Write, 0, self.oid(p.block)).with_payload(&data);
        h.offset = p.offset;
        h.length = p.len;
        let f = self
            .cluster
            .object_op(self.rec.pool, h, Some(&data))
            .await?;
        match f.h.status {
            Status::Ok => Ok(()),
            s => Err(status_err(s, &format!("write {}", self.oid(p.block)))),
        }
    }

    /// Writes `data` at `offset`; returns once every replica has it durable.
    pub async fn write(self: &Rc<Self>, offset: u64, data: AlignedBuf) -> Result<()> {
        self.check("write", offset, data.len() as u64, IO_MAX_BYTES)?;
        let ps: Vec<Piece> = pieces(offset, data.len() as u64, self.rec.object_bytes).collect();
        if let [p] = ps[..] {
            return self.write_piece(p, data).await;
        }
        let tasks: Vec<_> = (ps.iter())
            .map(|&p| {
                let me = self.clone();
                let part = AlignedBuf::from_slice(&data[p.at..p.at + p.len as usize]);
                rt::spawn(async move { me.write_piece(p, part).await })
            })
            .collect();
        let mut first_err = None;
        for t in tasks {
            if let Err(e) = t.await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    async fn delete_object(&self, block: u64) -> Result<()> {
        let h = Header::request(Op::Delete, 0, self.oid(block));
        let f = self.cluster.object_op(self.rec.pool, h, None).await?;
        match f.h.status {
            Status::Ok | Status::NotFound => Ok(()),
            s => Err(status_err(s, &format!("delete {}", self.oid(block)))),
        }
    }

    /// Makes `offset..offset+len` read as zeros. Whole objects are deleted
    /// (their space returns); the partial ends are written with zeros.
    pub async fn zero(self: &Rc<Self>, offset: u64, len: u64) -> Result<()> {
        self.check("zero", offset, len, u64::MAX)?;
        let ob = self.rec.object_bytes;
        let ps: Vec<Piece> = pieces(offset, len, ob).collect();
        for chunk in ps.chunks(TRIM_PARALLEL_MAX) {
            let tasks: Vec<_> = chunk
                .iter()
                .map(|&p| {
                    let me = self.clone();
                    rt::spawn(async move {
                        if p.offset == 0 && p.len == ob {
                            me.delete_object(p.block).await
                        } else {
                            me.write_piece(p, AlignedBuf::zeroed(p.len as usize)).await
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await?;
            }
        }
        Ok(())
    }
}

/// Volume administration (create, resize, delete), for the CLI and tests.
impl Cluster {
    pub fn create_volume(&self, name: &str, size_bytes: u64) -> Result<VolumeRecord> {
        check_size(size_bytes)?;
        Ok(map::create_volume(
            &*self.meta,
            name,
            &self.default_pool(),
            size_bytes,
        )?)
    }

    /// Changes the size. Shrinking deletes the data past the new end, so a
    /// later grow reads zeros there.
    pub async fn resize_volume(
        self: &Rc<Self>,
        name: &str,
        size_bytes: u64,
    ) -> Result<VolumeRecord> {
        check_size(size_bytes)?;
        let old = map::get_volume(&*self.meta, name)?
            .ok_or_else(|| ClientError::NoVolume(name.to_string()))?;
        // Publish the new size first, so no gateway writes past it once its
        // next open sees the record; then drop the data a shrink cut off.
        let rec = map::update_volume(&*self.meta, name, |r| {
            r.size_bytes = size_bytes;
            Ok(())
        })?;
        if size_bytes < old.size_bytes {
            let v = Rc::new(Volume {
                cluster: self.clone(),
                rec: old.clone(),
            });
            v.zero(size_bytes, old.size_bytes - size_bytes).await?;
        }
        Ok(rec)
    }

    /// Deletes a volume: its objects on every OSD, then its record.
    pub async fn delete_volume(&self, name: &str) -> Result<()> {
        let rec = map::get_volume(&*self.meta, name)?
            .ok_or_else(|| ClientError::NoVolume(name.to_string()))?;
        let osds: Vec<u32> = self.map.borrow().osds.iter().map(|o| o.id).collect();
        for osd in osds {
            let h = Header::request(Op::PurgeVolume, 0, ObjectId::new(rec.id, 0));
            let f = self
                .conn(osd)?
                .call(h, None)
                .await
                .map_err(|e| ClientError::Unavailable(format!("osd.{osd}: {e}")))?;
            if f.h.status != Status::Ok {
                return Err(status_err(f.h.status, &format!("purge on osd.{osd}")));
            }
        }
        Ok(map::remove_volume(&*self.meta, name, rec.id)?)
    }

    /// Every OSD's counters and space (`None` for an OSD that did not answer).
    pub async fn osd_stats(&self) -> Vec<(u32, Option<serde_json::Value>)> {
        let osds: Vec<u32> = self.map.borrow().osds.iter().map(|o| o.id).collect();
        let mut out = Vec::new();
        for osd in osds {
            let h = Header::request(Op::Stat, 0, ObjectId::default());
            let r = match self.conn(osd) {
                Ok(c) => c.call(h, None).await.ok(),
                Err(_) => None,
            };
            let v = r
                .and_then(|f| f.payload)
                .and_then(|p| serde_json::from_slice(&p).ok());
            out.push((osd, v));
        }
        out
    }
}

fn check_size(size_bytes: u64) -> Result<()> {
    let s = u64::from(SECTOR_BYTES);
    if size_bytes == 0 || !size_bytes.is_multiple_of(s) || size_bytes > 1 << 60 {
        return Err(ClientError::Invalid(format!(
            "volume size {size_bytes}: a positive multiple of {s} up to 1 EiB"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_range() {
        let ps: Vec<Piece> = pieces(100 * 1024, 300 * 1024, 128 * 1024).collect();
        let spans: Vec<(u64, u32, u32, usize)> = ps
            .iter()
            .map(|p| (p.block, p.offset, p.len, p.at))
            .collect();
        assert_eq!(
            spans,
            [
                (0, 102_400, 28_672, 0),
                (1, 0, 131_072, 28_672),
                (2, 0, 131_072, 159_744),
                (3, 0, 16_384, 290_816)
            ]
        );
        assert_eq!(pieces(0, 4096, 4096).count(), 1);
    }
}
