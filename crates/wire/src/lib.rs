//! The wire protocol between clients, gateways and OSDs.
//!
//! Every message is one frame: a 96-byte little-endian header followed by
//! `payload_len` bytes of payload. The header carries its own crc32c and the
//! payload's, so a flipped bit on the way is an error, never data. Requests
//! carry a request id chosen by the sender; the reply echoes it, so any
//! number of requests can be in flight on one connection and replies come
//! back in any order. The layout is in `docs/internals/wire.md`.
//!
//! Parsing is a bounds check plus validation of every field that is used to
//! size or dispatch anything: magic, version, op, flags, status, lengths and
//! both checksums. A frame that fails is a [`WireError`]; the connection
//! that sent it is closed (its peer is broken or hostile), nothing else.
//!
//! This crate has no runtime and no I/O.

use nacre_types::{crc32c, ObjectId, PgId, BLOCK_BYTES_MAX, SECTOR_BYTES};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// "NACR" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"NACR");
/// Every frame carries it and a peer of another version is refused: it
/// rises whenever a binary of the last one would misread a cluster of this
/// one (version 6: erasure-coded pools are served, which a binary of 5
/// would take for replicated pools, primary at slot 0; version 7: a PG's
/// primary skips members demoted as slow, which a binary of 6 would not,
/// and heartbeats carry figures). A new op a binary of the last version
/// does not know (`Op::Metrics`, only scrapes send it) does not raise it:
/// that binary refuses the frame, and the cluster runs on.
pub const VERSION: u8 = 7;
pub const HEADER_BYTES: usize = 96;
/// Largest payload of any frame: one whole object.
pub const PAYLOAD_MAX_BYTES: u32 = BLOCK_BYTES_MAX;
/// Largest payload of a control frame (stats).
pub const CONTROL_PAYLOAD_MAX_BYTES: u32 = 64 << 10;

/// `Op::Scrub` kinds (in `length`) an admin sends a PG's primary: scrub
/// it now, light or deep.
pub const SCRUB_START: u32 = 3;
pub const SCRUB_START_DEEP: u32 = 4;
/// The report of the scrub whose ticket (the start's answer, in
/// `obj_version`) is in `obj_version`: no payload while it waits or runs.
pub const SCRUB_REPORT: u32 = 6;

/// Most objects one [`Op::List`] reply names.
pub const LIST_PAGE_MAX: u32 = 4096;
/// Bytes per object of an [`Op::List`] reply: its block, its version.
pub const LIST_ENTRY_BYTES: usize = 16;

/// An [`Op::List`] reply's payload: (block, version) per object.
pub fn encode_list(objects: impl IntoIterator<Item = (u64, u64)>) -> Vec<u8> {
    (objects.into_iter())
        .flat_map(|(b, v)| b.to_le_bytes().into_iter().chain(v.to_le_bytes()))
        .collect()
}

/// The objects of an [`Op::List`] reply's payload (its length is checked
/// with the header: whole entries).
pub fn decode_list(body: &[u8]) -> Vec<(u64, u64)> {
    (body.chunks_exact(LIST_ENTRY_BYTES))
        .map(|e| {
            let word = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().expect("8 bytes"));
            (word(0), word(8))
        })
        .collect()
}

/// Flag: this frame answers the request with the same id.
pub const FLAG_REPLY: u16 = 1;
/// Flag of a `Push`: the object's version has no log entry to go with it
/// (the source's log no longer reaches back to it).
pub const FLAG_UNLOGGED: u16 = 2;
/// Flag of a [`Op::ShardWrite`]: the payload is XORed into the shard's
/// bytes (a parity delta), not written over them.
pub const FLAG_XOR: u16 = 4;
/// Flag of a [`Op::ShardWrite`]: the payload, at offset 0, is the whole
/// shard object at this version, written over it without keeping what it
/// replaces (the primary rebuilt it for a shard whose old bytes failed
/// their checksum, after every other shard took the write).
pub const FLAG_REPLACE: u16 = 8;
const FLAGS_KNOWN: u16 = FLAG_REPLY | FLAG_UNLOGGED | FLAG_XOR | FLAG_REPLACE;
/// Bytes per write named by a [`Op::ShardCommit`]: volume, block,
/// version (u64 each, little-endian).
pub const SHARD_COMMIT_ENTRY_BYTES: usize = 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Client → primary: read `length` bytes at `offset` of the object.
    Read = 1,
    /// Client → primary: write the payload at `offset`.
    Write = 2,
    /// Client → primary: delete the whole object. With `obj_version` not
    /// 0, only if the object is at that version or below (`Stale` if it
    /// is newer, `NotFound` if absent); a `Write` with `obj_version` not 0
    /// likewise applies only to an object that exists at that version or
    /// below. So data listed before a grow ([`Op::List`]) can be deleted
    /// after it without touching what was written since.
    Delete = 3,
    /// Primary → replica: apply a write at `obj_version`.
    RepWrite = 4,
    /// Primary → replica: apply a delete at `obj_version`.
    RepDelete = 5,
    /// Anyone → an OSD: delete every local object of `volume` (volume
    /// removal; sent to every OSD, not replicated).
    PurgeVolume = 6,
    /// Anyone → an OSD: its counters and space, as JSON in the reply.
    Stat = 7,
    /// OSD (in `sender`) → leader: this OSD has started, with the store
    /// whose id is the payload (its uuid, 32 hex digits); the leader marks
    /// it up in a new epoch and replies with the map (JSON).
    Boot = 8,
    /// Anyone → leader: the current map (JSON in the reply).
    GetMap = 9,
    /// Leader → OSD: a newer map (JSON payload).
    Map = 10,
    /// OSD (in `sender`, its `up_from` in `obj_version`) → leader:
    /// heartbeat; `Unavailable` if that incarnation is not up. The reply
    /// carries the leader's epoch.
    Ping = 11,
    /// Primary → leader: an event of PG `pg` in `epoch` (JSON payload:
    /// went active, or a write failed and the interval must end).
    PgEvent = 12,
    /// Primary → OSD: PG `pg`'s log and objects on that OSD (binary, in
    /// the reply), once no older epoch's op of the PG is in flight there.
    PgQuery = 13,
    /// Primary → OSD: the whole of object `oid` and its version (reply).
    Pull = 14,
    /// Primary → replica: recovery; make object `oid` the payload (the
    /// whole object; no payload: absent) at `obj_version`, logging the
    /// entry the header describes (`offset`/`length` its range, `client`
    /// and `request_id` its request) unless [`FLAG_UNLOGGED`] is set. A
    /// shard's (an EC rebuild, unlogged) lands only if the shard holds the
    /// version `offset | length << 32` (0: nothing) there.
    Push = 15,
    /// Primary → replica, at the end of its recovery: make its log of PG
    /// `pg` the authoritative one. Payload: forget count and adopt count
    /// (u32 each), the versions to forget (u64 each: ops the authoritative
    /// history does not hold), then the entries to adopt (64 bytes each,
    /// ascending). Little-endian.
    LogSync = 16,
    /// Supervisor → leader: the process of OSD `sender`, incarnation
    /// `obj_version` (its `up_from`), has exited (its parent reaped it);
    /// the leader marks that incarnation down at once, if it is still up.
    Dead = 17,
    /// Admin → leader: mark OSD `sender` out (`obj_version` 1: its PGs
    /// move to the others) or in again (0). A refusal carries its reason
    /// as UTF-8 text in the payload.
    MarkOut = 18,
    /// Anyone → an OSD: the objects it holds per volume, as JSON in the
    /// reply ([`VolumeUsage`](../nacre_osd/struct.VolumeUsage.html)).
    VolumeUsage = 19,
    /// OSD holding a stray copy of PG `pg` (one placement no longer gives
    /// it) → the PG's primary: is the PG active+clean in `epoch`? `Ok` if
    /// so, and the stray may delete its copy.
    PgClean = 20,
    /// Admin → leader: OSD `sender` (its record already stored) joins the
    /// map at the address in the payload (UTF-8), marked out. A refusal
    /// carries its reason as UTF-8 text.
    AddOsd = 21,
    /// Scrub (`nacre_osd::scrub`), its kind in `length`. Admin → primary:
    /// scrub PG `pg` (`length` 3 light, 4 deep), answered at once with a
    /// ticket in `obj_version`; then (6) the report of that ticket (JSON),
    /// no payload while it waits or runs. Primary → member of the acting
    /// set: list the PG's objects after `oid` (0, from the first if
    /// `offset` is 0), or check the objects named in the payload (1 their
    /// versions and logs, 2 also their bytes); the answer is binary. Or
    /// (5) rewrite its damaged copy of `oid` at `obj_version` with the
    /// payload, that version's bytes from another copy.
    Scrub = 22,
    /// Admin → leader: take OSD `sender` out of the map (`nacre osd rm`);
    /// refused, with the reason as UTF-8 text in the payload, unless it is
    /// down, out, and no PG counts on its copies.
    RmOsd = 23,
    /// Admin → leader: create, change or remove a pool (JSON payload,
    /// `nacre_osd::PoolChange`), in a new epoch; a refusal carries its
    /// reason as UTF-8 text.
    PoolChange = 24,
    /// Client → primary of PG `pg`: the objects of volume `volume` in the
    /// PG at block `block` or above, with their versions, in block order:
    /// at most `length` of them ([`LIST_PAGE_MAX`] at most; a full page
    /// means more may follow). Reply: [`LIST_ENTRY_BYTES`] per object,
    /// its block then its version (u64 each, little-endian). A shrink
    /// deletes what it lists, each delete conditional on the listed
    /// version (see [`Op::Delete`]).
    List = 25,
    /// Primary → member of an erasure-coded PG: `length` bytes at
    /// `offset` of shard object `oid` (its shard in the block index,
    /// `ObjectId::shard`); the reply carries them and the shard's version
    /// (`obj_version`), or `NotFound`.
    ShardRead = 26,
    /// Primary → member: version `obj_version` of shard object `oid`: an
    /// undoable write of the payload at `offset` ([`FLAG_XOR`]: XORed into
    /// what is there, a parity delta), or, `length` 0 and no payload, the
    /// log entry alone (the write changes nothing of this shard). The
    /// entry's client and request are the header's.
    ShardWrite = 27,
    /// Primary → member: delete shard object `oid` at `obj_version`,
    /// logged (a tombstone where it is absent).
    ShardDelete = 28,
    /// Primary → member: the writes and deletes the payload names
    /// committed (every shard has them; [`SHARD_COMMIT_ENTRY_BYTES`]
    /// each): release the writes' undos; what a delete removed may be
    /// read directly again ([`Op::DirectRead`]).
    ShardCommit = 29,
    /// Primary (peering) → member: settle the write of shard object `oid`
    /// that not every shard holds. `offset` [`SETTLE_ROLL_BACK`]: the
    /// write at version `request_id` is undone as version `obj_version`
    /// of this interval (client 0) — the bytes the shard's undo kept for
    /// it written back (not undoably), or the object deleted if that
    /// write made it, or, where the shard holds no such undo, the entry
    /// alone —, then forgotten. `offset` [`SETTLE_DELETE`]: the delete at
    /// `obj_version` (with the header's client and request) is applied
    /// where it is not yet.
    ShardSettle = 30,
    /// Primary → member of an erasure-coded PG: as [`Op::List`], from the
    /// shard objects of its slot this member holds (`oid` names the volume
    /// and the first block, whole): each object by its block, with its
    /// shard's version; at most `length` of them, capped at
    /// [`LIST_PAGE_MAX`]. The primary answers a client's `List` with the
    /// union of its members' (every object has a shard on `m + 1` of
    /// them).
    ShardList = 31,
    /// Primary → member of an erasure-coded PG: the version of shard
    /// object `oid` (reply `obj_version`), or `NotFound`; no data read.
    ShardVersion = 32,
    /// Client → the member of an erasure-coded PG holding the data shard
    /// a range lies in: `length` bytes at `offset` of object `oid` (whole;
    /// the object's offsets, as in a `Read`), read from that shard alone.
    /// Answered only in the client's epoch by a member the PG's primary
    /// named complete in it ([`Op::ShardActive`]), holding its read
    /// lease, with no write of the object in flight or uncommitted there;
    /// otherwise refused (`NotPrimary`: it serves no direct read of the PG
    /// now; `Unavailable`: not of this object, or no lease; `StaleEpoch`),
    /// and the client asks the primary.
    DirectRead = 33,
    /// Primary → complete member of an erasure-coded PG, once the PG is
    /// active in `epoch` (the leader recorded it): this member's shard
    /// holds every acknowledged op of the PG, and may answer
    /// [`Op::DirectRead`]s in this epoch.
    ShardActive = 34,
    /// Admin → an OSD: measure its own store (`nacre osd bench`). `length`
    /// [`BENCH_START`]: write `obj_version` bytes of objects of its own
    /// and read them (no replication), answered at once with a ticket in
    /// `obj_version`, or refused with the reason as UTF-8 text;
    /// [`BENCH_REPORT`]: the report of the ticket in `obj_version` (JSON),
    /// no payload while it runs.
    Bench = 35,
    /// Anyone → an OSD: answered at once with `length` bytes (at most
    /// [`ECHO_REPLY_MAX`]); the request's payload (any, up to an object)
    /// is read and dropped. What `nacre net bench` times.
    Echo = 36,
    /// Admin → an OSD: measure its link to OSD `obj_version` through its
    /// own connection to it ([`Op::Echo`]s: 4 KiB round trips, then a
    /// stream of large messages); answered when done (a few seconds) with
    /// the figures (JSON), or refused with the reason as UTF-8 text.
    NetBench = 37,
    /// Anyone → an OSD: its counters with its latency histograms per op
    /// type since it started (JSON in the reply: what `--metrics`
    /// endpoints export).
    Metrics = 38,
}

/// Bytes of the figures an [`Op::Ping`] may carry: the p99 of the OSD's
/// own store writes in each of its last three latency windows, newest
/// first, in µs (u32 each, little-endian; 0: none).
pub const PING_FIGURES_BYTES: u32 = 12;

/// Largest reply an [`Op::Echo`] asks for.
pub const ECHO_REPLY_MAX: u32 = 4096;

/// [`Op::Bench`] kinds, in `length`.
pub const BENCH_START: u32 = 1;
pub const BENCH_REPORT: u32 = 2;

/// [`Op::ShardSettle`] kinds, in `offset`.
pub const SETTLE_ROLL_BACK: u32 = 0;
pub const SETTLE_DELETE: u32 = 1;

impl Op {
    pub fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::Delete,
            4 => Op::RepWrite,
            5 => Op::RepDelete,
            6 => Op::PurgeVolume,
            7 => Op::Stat,
            8 => Op::Boot,
            9 => Op::GetMap,
            10 => Op::Map,
            11 => Op::Ping,
            12 => Op::PgEvent,
            13 => Op::PgQuery,
            14 => Op::Pull,
            15 => Op::Push,
            16 => Op::LogSync,
            17 => Op::Dead,
            18 => Op::MarkOut,
            19 => Op::VolumeUsage,
            20 => Op::PgClean,
            21 => Op::AddOsd,
            22 => Op::Scrub,
            23 => Op::RmOsd,
            24 => Op::PoolChange,
            25 => Op::List,
            26 => Op::ShardRead,
            27 => Op::ShardWrite,
            28 => Op::ShardDelete,
            29 => Op::ShardCommit,
            30 => Op::ShardSettle,
            31 => Op::ShardList,
            32 => Op::ShardVersion,
            33 => Op::DirectRead,
            34 => Op::ShardActive,
            35 => Op::Bench,
            36 => Op::Echo,
            37 => Op::NetBench,
            38 => Op::Metrics,
            _ => return None,
        })
    }

    /// Client ops and sub-ops: they name one object, are routed by its
    /// placement group and carry data ranges.
    pub fn is_object_op(self) -> bool {
        matches!(
            self,
            Op::Read
                | Op::Write
                | Op::Delete
                | Op::RepWrite
                | Op::RepDelete
                | Op::ShardRead
                | Op::ShardWrite
                | Op::ShardDelete
                | Op::DirectRead
        )
    }
}

/// Outcome of a request, in the reply's `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    Ok = 0,
    /// The object does not exist (a read of it is all zeros to a volume).
    NotFound = 1,
    /// The request's epoch is not the OSD's; the reply carries the OSD's.
    StaleEpoch = 2,
    /// This OSD is not the primary of the request's PG.
    NotPrimary = 3,
    NoSpace = 4,
    /// The request breaks a rule (range, alignment): a client bug.
    Invalid = 5,
    /// Stored data failed its checksum on every copy tried.
    Corrupt = 6,
    /// The OSD cannot serve now (disk error, replica unreachable); retry.
    Unavailable = 7,
    /// The write's version is older than the stored one.
    Stale = 8,
}

impl Status {
    pub fn from_u32(v: u32) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::StaleEpoch,
            3 => Status::NotPrimary,
            4 => Status::NoSpace,
            5 => Status::Invalid,
            6 => Status::Corrupt,
            7 => Status::Unavailable,
            8 => Status::Stale,
            _ => return None,
        })
    }
}

/// The frame header as it is on the wire.
#[repr(C)]
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Clone, Copy, Debug, Default)]
pub struct RawHeader {
    pub magic: U32,
    pub version: u8,
    pub op: u8,
    pub flags: U16,
    pub status: U32,
    pub pg: U32,
    /// The pool of `pg` (with `pg`, the [`PgId`]).
    pub pool: U32,
    /// Zero.
    pub reserved: U32,
    pub request_id: U64,
    /// The client's id, so that `(client, request_id)` names one write
    /// across reconnects and retries.
    pub client: U64,
    pub volume: U64,
    pub block: U64,
    pub offset: U32,
    pub length: U32,
    pub epoch: U64,
    pub obj_version: U64,
    pub payload_len: U32,
    pub payload_crc: U32,
    /// The OSD that sends a sub-operation; [`SENDER_CLIENT`] otherwise.
    pub sender: U32,
    pub header_crc: U32,
}

/// The `sender` of a request that does not come from an OSD.
pub const SENDER_CLIENT: u32 = u32::MAX;

const _: () = assert!(std::mem::size_of::<RawHeader>() == HEADER_BYTES);

/// A validated header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub op: Op,
    pub reply: bool,
    /// [`FLAG_UNLOGGED`] (a `Push` without a log entry).
    pub unlogged: bool,
    /// [`FLAG_XOR`] (a `ShardWrite` of a parity delta).
    pub xor: bool,
    /// [`FLAG_REPLACE`] (a `ShardWrite` of a whole shard, no undo kept).
    pub replace: bool,
    pub status: Status,
    /// The PG the frame is about: its number and its pool.
    pub pg: u32,
    pub pool: u32,
    pub request_id: u64,
    pub client: u64,
    pub oid: ObjectId,
    pub offset: u32,
    pub length: u32,
    pub epoch: u64,
    pub obj_version: u64,
    pub payload_len: u32,
    pub payload_crc: u32,
    /// The OSD sending a sub-op (its client and request id are those of
    /// the client op it replicates); `SENDER_CLIENT` for a client.
    pub sender: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("short header: {0} bytes")]
    Short(usize),
    #[error("bad magic {0:#010x}")]
    Magic(u32),
    #[error("protocol version {0} not supported (this build speaks {VERSION})")]
    Version(u8),
    #[error("header checksum mismatch")]
    HeaderCrc,
    #[error("reserved header field is {0:#x}, not zero")]
    Reserved(u32),
    #[error("unknown op {0}")]
    Op(u8),
    #[error("unknown flags {0:#x}")]
    Flags(u16),
    #[error("unknown status {0}")]
    Status(u32),
    #[error("{op:?}: payload of {len} bytes is not allowed ({why})")]
    PayloadLen { op: Op, len: u32, why: &'static str },
    #[error("{op:?}: range {offset}+{length} is not sector-aligned inside one object")]
    Range { op: Op, offset: u32, length: u32 },
    #[error("payload checksum mismatch")]
    PayloadCrc,
}

impl Header {
    /// A request header for `op` on `oid`.
    pub fn request(op: Op, request_id: u64, oid: ObjectId) -> Header {
        Header {
            op,
            reply: false,
            unlogged: false,
            xor: false,
            replace: false,
            status: Status::Ok,
            pg: 0,
            pool: oid.pool(),
            request_id,
            client: 0,
            oid,
            offset: 0,
            length: 0,
            epoch: 0,
            obj_version: 0,
            payload_len: 0,
            payload_crc: 0,
            sender: SENDER_CLIENT,
        }
    }

    /// The PG the frame is about.
    pub fn pg_id(&self) -> PgId {
        PgId::new(self.pool, self.pg)
    }

    /// Addresses the frame to PG `pg`.
    pub fn with_pg(mut self, pg: PgId) -> Header {
        self.pool = pg.pool;
        self.pg = pg.pg;
        self
    }

    /// The reply to this request, with `status` and no payload.
    pub fn reply(&self, status: Status) -> Header {
        Header {
            reply: true,
            status,
            payload_len: 0,
            payload_crc: 0,
            ..*self
        }
    }

    /// Whether this reply names what `req` asked about: its op, object
    /// and range. Replies are matched to requests by id alone, and a
    /// reply made with [`Header::reply`] always does; one that does not
    /// answers something else, and its data is not the request's.
    pub fn answers(&self, req: &Header) -> bool {
        self.reply
            && self.op == req.op
            && self.oid == req.oid
            && self.offset == req.offset
            && self.length == req.length
    }

    /// Sets the payload length and checksum from `payload`.
    pub fn with_payload(mut self, payload: &[u8]) -> Header {
        self.payload_len = payload.len() as u32;
        self.payload_crc = crc32c(payload);
        self
    }

    /// Serialises into `out` (exactly [`HEADER_BYTES`]), checksum included.
    pub fn encode(&self, out: &mut [u8]) {
        let mut raw = RawHeader {
            magic: MAGIC.into(),
            version: VERSION,
            op: self.op as u8,
            flags: ((if self.reply { FLAG_REPLY } else { 0 })
                | (if self.unlogged { FLAG_UNLOGGED } else { 0 })
                | (if self.xor { FLAG_XOR } else { 0 })
                | (if self.replace { FLAG_REPLACE } else { 0 }))
            .into(),
            status: (self.status as u32).into(),
            pg: self.pg.into(),
            pool: self.pool.into(),
            reserved: 0.into(),
            request_id: self.request_id.into(),
            client: self.client.into(),
            volume: self.oid.volume.0.into(),
            block: self.oid.block.into(),
            offset: self.offset.into(),
            length: self.length.into(),
            epoch: self.epoch.into(),
            obj_version: self.obj_version.into(),
            payload_len: self.payload_len.into(),
            payload_crc: self.payload_crc.into(),
            sender: self.sender.into(),
            header_crc: 0.into(),
        };
        raw.header_crc = crc32c(&raw.as_bytes()[..HEADER_BYTES - 4]).into();
        out[..HEADER_BYTES].copy_from_slice(raw.as_bytes());
        debug_assert_eq!(Header::decode(&out[..HEADER_BYTES]).as_ref(), Ok(self));
    }

    /// Parses and validates a header; the payload is checked separately by
    /// [`Header::check_payload`] once it has arrived.
    pub fn decode(bytes: &[u8]) -> Result<Header, WireError> {
        let raw = RawHeader::read_from_prefix(bytes)
            .map_err(|_| WireError::Short(bytes.len()))?
            .0;
        if raw.magic.get() != MAGIC {
            return Err(WireError::Magic(raw.magic.get()));
        }
        if raw.version != VERSION {
            return Err(WireError::Version(raw.version));
        }
        if crc32c(&raw.as_bytes()[..HEADER_BYTES - 4]) != raw.header_crc.get() {
            return Err(WireError::HeaderCrc);
        }
        if raw.reserved.get() != 0 {
            return Err(WireError::Reserved(raw.reserved.get()));
        }
        let op = Op::from_u8(raw.op).ok_or(WireError::Op(raw.op))?;
        let flags = raw.flags.get();
        if flags & !FLAGS_KNOWN != 0 {
            return Err(WireError::Flags(flags));
        }
        let status =
            Status::from_u32(raw.status.get()).ok_or(WireError::Status(raw.status.get()))?;
        let h = Header {
            op,
            reply: flags & FLAG_REPLY != 0,
            unlogged: flags & FLAG_UNLOGGED != 0,
            xor: flags & FLAG_XOR != 0,
            replace: flags & FLAG_REPLACE != 0,
            status,
            pg: raw.pg.get(),
            pool: raw.pool.get(),
            request_id: raw.request_id.get(),
            client: raw.client.get(),
            oid: ObjectId::new(raw.volume.get(), raw.block.get()),
            offset: raw.offset.get(),
            length: raw.length.get(),
            epoch: raw.epoch.get(),
            obj_version: raw.obj_version.get(),
            payload_len: raw.payload_len.get(),
            payload_crc: raw.payload_crc.get(),
            sender: raw.sender.get(),
        };
        h.check_shape()?;
        Ok(h)
    }

    /// Checks that the lengths fit the op, so the receiver can size its
    /// buffer from them.
    fn check_shape(&self) -> Result<(), WireError> {
        let op = self.op;
        let len = self.payload_len;
        let bad = |why| Err(WireError::PayloadLen { op, len, why });
        if len > PAYLOAD_MAX_BYTES {
            return bad("larger than an object");
        }
        if self.replace
            && (op != Op::ShardWrite || self.xor || self.offset != 0 || self.length == 0)
        {
            return bad("a replacing shard write is a whole shard's bytes");
        }
        let ranged = matches!(
            op,
            Op::Read | Op::Write | Op::RepWrite | Op::ShardRead | Op::DirectRead
        ) || (op == Op::ShardWrite && self.length != 0);
        if ranged
            && (self.length == 0
                || !self.offset.is_multiple_of(SECTOR_BYTES)
                || !self.length.is_multiple_of(SECTOR_BYTES)
                || u64::from(self.offset) + u64::from(self.length) > u64::from(BLOCK_BYTES_MAX))
        {
            return Err(WireError::Range {
                op,
                offset: self.offset,
                length: self.length,
            });
        }
        let carries_data = match (op, self.reply) {
            (Op::Write | Op::RepWrite, false) => true,
            (Op::ShardWrite, false) => self.length != 0,
            (Op::Read | Op::ShardRead | Op::DirectRead, true) => self.status == Status::Ok,
            (Op::ShardCommit, false) => {
                if len > CONTROL_PAYLOAD_MAX_BYTES
                    || len == 0
                    || !(len as usize).is_multiple_of(SHARD_COMMIT_ENTRY_BYTES)
                {
                    return bad("not a list of committed writes");
                }
                return Ok(());
            }
            // A statistics report, a leader's reason for a refusal, a
            // scrub's objects and findings.
            (
                Op::Stat
                | Op::MarkOut
                | Op::AddOsd
                | Op::Scrub
                | Op::RmOsd
                | Op::PoolChange
                | Op::Bench
                | Op::NetBench
                | Op::Metrics,
                true,
            )
            | (Op::AddOsd | Op::PoolChange, false) => {
                if len > CONTROL_PAYLOAD_MAX_BYTES {
                    return bad("larger than a control payload");
                }
                return Ok(());
            }
            // Maps, PG events and logs, whole objects of recovery: sized
            // by their payload (bounded above), parsed by the receiver.
            // (A PG query may name the objects it asks about.)
            (Op::List | Op::ShardList, true) => {
                if len as usize > LIST_PAGE_MAX as usize * LIST_ENTRY_BYTES
                    || !(len as usize).is_multiple_of(LIST_ENTRY_BYTES)
                {
                    return bad("not a page of listed objects");
                }
                return Ok(());
            }
            (Op::Ping, false) => {
                if len != 0 && len != PING_FIGURES_BYTES {
                    return bad("not a heartbeat's figures");
                }
                return Ok(());
            }
            // A link's measure: any payload out, a small one back.
            (Op::Echo, false) => return Ok(()),
            (Op::Echo, true) => {
                if len > ECHO_REPLY_MAX {
                    return bad("larger than an echo");
                }
                return Ok(());
            }
            (Op::Boot | Op::GetMap | Op::PgQuery | Op::Pull | Op::VolumeUsage, true)
            | (
                Op::Boot | Op::Map | Op::PgEvent | Op::Push | Op::LogSync | Op::PgQuery | Op::Scrub,
                false,
            ) => return Ok(()),
            _ => false,
        };
        match (carries_data, len == self.length) {
            (true, true) => Ok(()),
            (true, false) => bad("must equal the range length"),
            (false, _) if len == 0 => Ok(()),
            (false, _) => bad("this frame carries no payload"),
        }
    }

    /// Verifies a received payload against the header.
    pub fn check_payload(&self, payload: &[u8]) -> Result<(), WireError> {
        if payload.len() != self.payload_len as usize {
            return Err(WireError::PayloadLen {
                op: self.op,
                len: payload.len() as u32,
                why: "differs from the header",
            });
        }
        if crc32c(payload) != self.payload_crc {
            return Err(WireError::PayloadCrc);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
