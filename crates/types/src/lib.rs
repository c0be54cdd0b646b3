//! Identifiers and limits shared by every Nacre crate.
//!
//! Ids are newtypes so that a block index can never be passed where a volume
//! id is expected. Everything that goes to disk or the wire has a fixed width.

use std::fmt;

pub mod metrics;

/// A volume's identifier, unique within a cluster: its pool's id in the
/// top [`POOL_BITS`] bits, a serial number below (ids are never reused).
/// An object's pool is thus known from its id alone, on every OSD.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct VolumeId(pub u64);

/// Bits of a volume id that name its pool: pool ids are below
/// `1 << POOL_BITS`.
pub const POOL_BITS: u32 = 16;
/// The largest pool id.
pub const POOL_ID_MAX: u32 = (1 << POOL_BITS) - 1;
const SERIAL_BITS: u32 = 64 - POOL_BITS;

impl VolumeId {
    /// Volume `serial` of pool `pool` (`pool <= POOL_ID_MAX`, `serial`
    /// below `1 << 48`).
    pub const fn new(pool: u32, serial: u64) -> VolumeId {
        assert!(pool <= POOL_ID_MAX && serial >> SERIAL_BITS == 0);
        VolumeId(((pool as u64) << SERIAL_BITS) | serial)
    }

    pub const fn pool(self) -> u32 {
        (self.0 >> SERIAL_BITS) as u32
    }

    /// The number the cluster handed out, unique over all pools.
    pub const fn serial(self) -> u64 {
        self.0 & ((1 << SERIAL_BITS) - 1)
    }
}

/// A placement group: PG `pg` of pool `pool`. Shown as Ceph does, the
/// pool in decimal and the PG in hex (`1.1f`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PgId {
    pub pool: u32,
    pub pg: u32,
}

impl PgId {
    pub const fn new(pool: u32, pg: u32) -> PgId {
        PgId { pool, pg }
    }

    /// The PG of `oid` in its pool of `pg_count` PGs.
    pub fn of(oid: ObjectId, pg_count: u32) -> PgId {
        PgId::new(oid.volume.pool(), pg_of(oid, pg_count))
    }

    /// Whether `oid` is in this PG, its pool having `pg_count` PGs (0: no
    /// such pool, and no object is).
    pub fn holds(self, oid: ObjectId, pg_count: u32) -> bool {
        pg_count > 0 && oid.pool() == self.pool && pg_of(oid, pg_count) == self.pg
    }

    /// The PG's key in a store's PG logs.
    pub const fn key(self) -> u64 {
        ((self.pool as u64) << 32) | self.pg as u64
    }

    pub const fn from_key(key: u64) -> PgId {
        PgId::new((key >> 32) as u32, key as u32)
    }
}

impl fmt::Display for PgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:x}", self.pool, self.pg)
    }
}

impl std::str::FromStr for PgId {
    type Err = String;

    /// `POOL.PG`, the PG in hex, as shown.
    fn from_str(s: &str) -> Result<PgId, String> {
        let bad = || format!("{s:?} is no PG id (POOL.PG, the PG in hex: 1.1f)");
        let (pool, pg) = s.split_once('.').ok_or_else(bad)?;
        let ok = |t: &str, hex: bool| {
            !t.is_empty()
                && t.len() <= 8
                && t.bytes().all(|b| {
                    b.is_ascii_digit() || (hex && (b'a'..=b'f').contains(&b.to_ascii_lowercase()))
                })
        };
        if !ok(pool, false) || !ok(pg, true) {
            return Err(bad());
        }
        let pool: u32 = pool.parse().map_err(|_| bad())?;
        let pg = u32::from_str_radix(pg, 16).map_err(|_| bad())?;
        Ok(PgId::new(pool, pg))
    }
}

/// As text, `1.1f`: how operators read and type PG ids.
impl serde::Serialize for PgId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PgId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PgId, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl ObjectId {
    /// The pool the object belongs to (its volume's).
    pub const fn pool(&self) -> u32 {
        self.volume.pool()
    }
}

/// The unit of placement and of storage: one block of one volume.
///
/// An object holds at most one store block (`block_bytes`, 128 KiB by default)
/// of data. Ordering is by volume, then by block index, so a listing of a
/// store groups each volume's objects together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ObjectId {
    pub volume: VolumeId,
    pub block: u64,
}

impl ObjectId {
    pub const fn new(volume: u64, block: u64) -> Self {
        ObjectId {
            volume: VolumeId(volume),
            block,
        }
    }

    /// Shard `s` of this object in an erasure-coded pool, as a store keeps
    /// it: `s + 1` in the top byte of the block index (0 there: a whole
    /// object, as a replicated pool keeps it). A volume's block index
    /// stays below 2⁵² (a `u64` of bytes in objects of at least 4 KiB),
    /// so the byte is always free.
    pub const fn shard(self, s: u8) -> ObjectId {
        ObjectId {
            volume: self.volume,
            block: (self.block & BLOCK_INDEX_MASK) | ((s as u64 + 1) << SHARD_SHIFT),
        }
    }

    /// Which shard this is (`None`: a whole object).
    pub const fn shard_index(&self) -> Option<u8> {
        match (self.block >> SHARD_SHIFT) as u8 {
            0 => None,
            s => Some(s - 1),
        }
    }

    /// The object a shard belongs to (itself, for a whole object): what
    /// its PG is computed from.
    pub const fn whole(self) -> ObjectId {
        ObjectId {
            volume: self.volume,
            block: self.block & BLOCK_INDEX_MASK,
        }
    }
}

/// Where a shard's index sits in [`ObjectId::block`].
const SHARD_SHIFT: u32 = 56;
const BLOCK_INDEX_MASK: u64 = (1 << SHARD_SHIFT) - 1;

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}.{:x}", self.volume.0, self.block)
    }
}

/// The smallest unit of a write: offsets and lengths are multiples of it.
pub const SECTOR_BYTES: u32 = 512;
/// The unit of a data checksum: crc32c is kept for every 4 KiB of data.
pub const CSUM_CHUNK_BYTES: u32 = 4096;
/// Smallest and largest store block size, fixed at format time.
pub const BLOCK_BYTES_MIN: u32 = 4096;
pub const BLOCK_BYTES_MAX: u32 = 4 << 20;
/// The default store block size.
pub const BLOCK_BYTES_DEFAULT: u32 = 128 << 10;

/// How often every up OSD heartbeats the leader
/// (docs/internals/replication.md §7).
pub const HEARTBEAT_INTERVAL_MS: u64 = 500;
/// An OSD unheard of for this long is marked down.
pub const HEARTBEAT_GRACE_MS: u64 = 3_000;
/// A primary serves reads only this long after a heartbeat from the
/// leader reached it (a read lease, docs/internals/replication.md §6):
/// shorter than the grace by a margin for clock drift, so that a primary
/// cut off from the leader stops serving reads before the leader can mark
/// it down and let another primary take writes.
pub const READ_LEASE_MS: u64 = 2_000;
const _: () = assert!(READ_LEASE_MS + 1_000 <= HEARTBEAT_GRACE_MS);
/// Objects whose copy on an OSD a read found damaged (a checksum that
/// failed, an error from the device) since it started, at which it asks
/// the leader to mark it out: its disk has shown that it does not keep
/// data, and its PGs move to other OSDs (docs/internals/replication.md
/// §7). Distinct objects, not reads: retries of one read count once.
pub const DAMAGED_OBJECTS_OUT: u64 = 32;
/// An OSD down this long is marked out by the leader (its PGs move to the
/// others), and in again when it comes back; 0 never (`nacre up
/// --out-delay`).
pub const OSD_OUT_DELAY_S: u64 = 600;
/// How long a client op waits on an OSD for its PG to become active
/// (peering) before it is answered `Unavailable` and retried.
pub const PG_WAIT_MS: u64 = 2_000;
/// How long a client keeps retrying one op (through map changes,
/// peering, a PG below `min_size`) before it reports an error.
pub const CLIENT_OP_TIMEOUT_MS: u64 = 120_000;

/// CRC-32C (Castagnoli) of `data`: the checksum of every data chunk,
/// record and page Nacre writes. Hardware-accelerated (crc-fast).
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// The placement group of `oid` in a pool of `pg_count` PGs: a mixing
/// hash of the id, so a volume's consecutive blocks spread over all PGs.
/// Part of the on-disk contract of every pool: never change it.
pub fn pg_of(oid: ObjectId, pg_count: u32) -> u32 {
    assert!(pg_count > 0, "a pool has at least one PG");
    let oid = oid.whole();
    let mut x = oid.volume.0 ^ oid.block.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x % u64::from(pg_count)) as u32
}

/// A small deterministic generator (splitmix64), so failures and
/// simulations replay from a seed.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in (0, 1).
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    /// A shard's id names its object and its index; its PG is its
    /// object's.
    #[test]
    fn shards_name_their_object() {
        let o = ObjectId::new(7 << 32 | 3, (1 << 52) - 1);
        assert_eq!(o.shard_index(), None);
        for s in [0u8, 1, 15, 19] {
            let x = o.shard(s);
            assert_ne!(x, o);
            assert_eq!((x.shard_index(), x.whole()), (Some(s), o));
            assert_eq!(x.shard(2).shard_index(), Some(2));
            assert_eq!(pg_of(x, 256), pg_of(o, 256));
        }
        assert_ne!(o.shard(0), o.shard(1));
    }

    #[test]
    fn pgs_spread_and_never_change() {
        // golden values: placement of existing data depends on them
        let got: Vec<u32> = (0..4).map(|b| pg_of(ObjectId::new(1, b), 256)).collect();
        assert_eq!(got, [229, 32, 103, 233]);
        let mut counts = vec![0u32; 64];
        for b in 0..64_000 {
            counts[pg_of(ObjectId::new(3, b), 64) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }

    use super::*;

    #[test]
    fn crc32c_matches_the_reference_crate() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        let mut x = 0x1234_5678_u64;
        for len in [0usize, 1, 7, 63, 512, 4096, 65_536 + 3] {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (x >> 33) as u8
                })
                .collect();
            assert_eq!(crc32c(&data), ::crc32c::crc32c(&data), "length {len}");
        }
    }

    /// A volume id carries its pool; a PG id shows and parses as Ceph's
    /// do, and its store key splits back.
    #[test]
    fn volume_and_pg_ids() {
        let v = VolumeId::new(3, 77);
        assert_eq!((v.pool(), v.serial()), (3, 77));
        assert_eq!(VolumeId::new(POOL_ID_MAX, (1 << 48) - 1).0, u64::MAX);
        assert_eq!(VolumeId(5).pool(), 0);
        let pg = PgId::new(2, 0x1f);
        assert_eq!(pg.to_string(), "2.1f");
        assert_eq!("2.1f".parse(), Ok(pg));
        assert_eq!("2.1F".parse(), Ok(pg));
        assert_eq!(PgId::from_key(pg.key()), pg);
        for bad in [
            "",
            "2",
            "2.",
            ".1",
            "x.1",
            "2.g",
            "-1.1",
            "2.1.1",
            "99999999999.1",
            "1.fffffffff",
        ] {
            assert!(bad.parse::<PgId>().is_err(), "{bad}");
        }
        let oid = ObjectId {
            volume: v,
            block: 9,
        };
        assert_eq!(PgId::of(oid, 64), PgId::new(3, pg_of(oid, 64)));
        assert!(PgId::of(oid, 64).holds(oid, 64) && !PgId::new(2, pg_of(oid, 64)).holds(oid, 64));
        assert!(!PgId::of(oid, 64).holds(oid, 0), "no pool, no PG");
    }

    #[test]
    fn object_ids_order_by_volume_then_block() {
        let mut ids = vec![
            ObjectId::new(2, 0),
            ObjectId::new(1, 5),
            ObjectId::new(1, 2),
        ];
        ids.sort();
        assert_eq!(
            ids,
            vec![
                ObjectId::new(1, 2),
                ObjectId::new(1, 5),
                ObjectId::new(2, 0)
            ]
        );
        assert_eq!(ObjectId::new(10, 255).to_string(), "a.ff");
    }
}
