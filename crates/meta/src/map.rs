//! The cluster map as it lives in the meta store: OSDs, pools, PG tables,
//! volumes and liveness, one key each, JSON values.
//!
//! Keys (all under `/nacre/`):
//! - `cluster` — the cluster's id and creation time; its presence means
//!   the map was initialised;
//! - `osd/<id>` — [`OsdRecord`]; `up/osd/<id>` — present while the OSD
//!   holds its lease;
//! - `osdmap` — [`ClusterState`]: the epoch, the OSDs down and out;
//! - `pool/<id>` — [`PoolRecord`]; `pgtable/<pool>` — [`PgTable`];
//!   `pghistory/<pool>/<pg>` — the PG's last active [`Interval`];
//! - `volume/<name>` — [`VolumeRecord`]; `counter/volume` — the last
//!   volume serial handed out (ids are never reused, so an object whose
//!   volume's serial is at most the counter and names no volume is an
//!   orphan); `counter/pool` — the last pool id handed out;
//! - `session/<volume id>/<gateway>.<conn>` — [`SessionRecord`], one per
//!   open client connection, on its gateway's lease;
//! - `orphans` — [`OrphanReport`], what the last sweep for objects of
//!   deleted volumes found; `config` — [`ClusterConfig`];
//! - `scrubbed/<pool>/<pg>` — [`ScrubStamp`], when the PG was last
//!   scrubbed, put by its primary.
//!
//! Every multi-key change is one compare-and-swap transaction, so two
//! admins creating the same volume, or a create racing a delete, cannot
//! both win.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::types::*;
use nacre_types::{PgId, VolumeId, POOL_ID_MAX};

/// Every key of the cluster state starts with this (a backend may keep
/// them under another prefix: `nacre_etcd`'s `--prefix`).
pub const ROOT: &str = "/nacre/";
/// Retries of a compare-and-swap that lost a race.
const CAS_RETRY_MAX: u32 = 32;
pub const VOLUME_NAME_MAX_BYTES: usize = 128;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdRecord {
    pub id: u32,
    /// Wire address: `unix:PATH` or `tcp:HOST:PORT`.
    pub addr: String,
    pub host: String,
    pub rack: String,
    /// Relative capacity (GiB).
    pub weight: u32,
    /// PG logs its store holds: the most PGs it can be given (0: not
    /// recorded, as `nacre up` makes its OSDs, whose stores fit its pool).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pg_logs: u32,
    /// The uuid (hex) of the store `nacre osd init` formatted for it: `osd
    /// run` serves only that store as this OSD (empty: not recorded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub store: String,
    /// Removed from the cluster (`nacre osd rm`): kept so that its id is
    /// never given again, and left out of [`load`]'s OSDs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    pub id: u32,
    pub name: String,
    /// Copies of each object, or shards (`k + m`) in an erasure-coded pool.
    pub size: u8,
    pub min_size: u8,
    pub pg_count: u32,
    /// "osd", "host" or "rack".
    pub failure_domain: String,
    /// Bytes of a volume's object: one store block in a replicated pool,
    /// `k` of them in an erasure-coded one (each shard is one block).
    pub object_bytes: u32,
    /// Erasure coding: each object is cut into `k` data shards and `m`
    /// parity shards, one per slot of its PG (docs/internals/ec.md);
    /// absent: replicated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ec: Option<EcScheme>,
}

/// An erasure-coding scheme: `k` data shards and `m` parity shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcScheme {
    pub k: u8,
    pub m: u8,
}

impl std::fmt::Display for EcScheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}+{}", self.k, self.m)
    }
}

impl std::str::FromStr for EcScheme {
    type Err = String;

    /// `K+M`, within the codec's bounds (2 ≤ K ≤ 16, 1 ≤ M ≤ 4).
    fn from_str(s: &str) -> std::result::Result<EcScheme, String> {
        let bad = || format!("{s:?}: give the scheme as K+M, e.g. 4+2");
        let (k, m) = s.split_once('+').ok_or_else(bad)?;
        let (k, m) = (
            k.trim().parse().map_err(|_| bad())?,
            m.trim().parse().map_err(|_| bad())?,
        );
        let e = EcScheme { k, m };
        e.check()?;
        Ok(e)
    }
}

impl EcScheme {
    pub const K_MAX: u8 = 16;
    pub const M_MAX: u8 = 4;

    pub fn check(&self) -> std::result::Result<(), String> {
        if !(2..=Self::K_MAX).contains(&self.k) || !(1..=Self::M_MAX).contains(&self.m) {
            return Err(format!(
                "erasure coding {self}: K must be within 2..={} and M within 1..={}",
                Self::K_MAX,
                Self::M_MAX
            ));
        }
        Ok(())
    }
}

impl OsdRecord {
    /// OSD `id` at `addr` on a host of its own (`osd{id}`, rack `local`),
    /// as one machine's OSDs are.
    pub fn local(id: u32, addr: String, weight: u32) -> OsdRecord {
        OsdRecord {
            id,
            addr,
            host: format!("osd{id}"),
            rack: "local".into(),
            weight,
            pg_logs: 0,
            store: String::new(),
            removed: false,
        }
    }
}

impl PoolRecord {
    /// The pool `nacre up` makes: pool 1, `rbd`, `size` copies of each
    /// object, `min_size`, `pg_count` PGs, failure domain osd.
    pub fn rbd(size: u8, min_size: u8, pg_count: u32, object_bytes: u32) -> PoolRecord {
        PoolRecord {
            id: 1,
            name: "rbd".into(),
            size,
            min_size,
            pg_count,
            failure_domain: "osd".into(),
            object_bytes,
            ec: None,
        }
    }

    /// Bytes of one object on one OSD: a copy, or a shard (one store
    /// block either way).
    pub fn shard_bytes(&self) -> u32 {
        self.object_bytes / self.ec.map_or(1, |e| u32::from(e.k))
    }

    /// The share of raw space that holds data: `1 / size`, or `k / (k +
    /// m)`.
    pub fn data_fraction(&self) -> f64 {
        match self.ec {
            Some(e) => f64::from(e.k) / f64::from(e.k + e.m),
            None => 1.0 / f64::from(self.size.max(1)),
        }
    }

    /// `3 copies` or `EC 4+2`.
    pub fn scheme(&self) -> String {
        match self.ec {
            Some(e) => format!("EC {e}"),
            None => format!("{} copies", self.size),
        }
    }
}

/// What the cluster agrees on at one epoch besides the PG tables: the
/// OSDs marked down (by the leader) and out (`nacre osd out`, or down for
/// too long). One record for every pool: an epoch is the cluster's, and
/// every message of every PG carries it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    pub epoch: u64,
    pub down: Vec<u32>,
    /// The PG tables place nothing on them.
    pub out: Vec<u32>,
    /// Pools removed (`nacre pool rm`; ids are never given again): an OSD
    /// deletes what it holds of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_pools: Vec<u32>,
    /// OSDs too slow to lead PGs (slow-OSD detection,
    /// `nacre_osd::slow`): a PG's primary is another member up where
    /// there is one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub demoted: Vec<u32>,
}

/// A pool's PG → OSD table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgTable {
    pub pool: u32,
    pub size: u8,
    /// `size` OSD ids per PG, PG by PG, in placement order.
    pub osds: Vec<u32>,
    /// An erasure-coded pool's table: per PG, the slot of its preferred
    /// primary (placement balances them without reordering a row, whose
    /// slots are shards); empty in a replicated pool's, whose primary is
    /// the first member up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lead: Vec<u8>,
    /// Per PG, the *temporary members*: OSDs a table change moved the PG
    /// away from that stay in its acting set, complete and taking every
    /// write, until the members placement gave it instead are complete
    /// (so moving a PG never costs a copy); the leader drops them then
    /// (docs/internals/replication.md §8.3).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub temp: BTreeMap<u32, Vec<u32>>,
}

impl PgTable {
    /// A new table of pool `pool` as placed, without temporary members.
    pub fn new(pool: u32, size: u8, placed: Placed) -> PgTable {
        PgTable {
            pool,
            size,
            osds: placed.osds,
            lead: placed.lead,
            temp: BTreeMap::new(),
        }
    }

    pub fn pg_count(&self) -> u32 {
        (self.osds.len() / self.size as usize) as u32
    }

    /// The OSDs placement gives PG `pg`, up or not.
    pub fn placement(&self, pg: u32) -> &[u32] {
        let s = self.size as usize;
        &self.osds[pg as usize * s..(pg as usize + 1) * s]
    }

    /// PG `pg`'s temporary members that placement does not give it.
    fn temp_of(&self, pg: u32) -> impl Iterator<Item = u32> + '_ {
        (self.temp.get(&pg).into_iter().flatten())
            .copied()
            .filter(move |o| !self.placement(pg).contains(o))
    }

    /// Placement's OSDs and the temporary members, up or not.
    fn members(&self, pg: u32) -> impl Iterator<Item = u32> + '_ {
        self.placement(pg).iter().copied().chain(self.temp_of(pg))
    }

    /// The acting set with the OSDs in `down` down: the placement's OSDs
    /// that are up, in order, then the temporary members that are up; in
    /// a replicated pool's table the first is the primary (an
    /// erasure-coded one's is [`PgTable::primary`]'s, and a position here
    /// is no shard).
    pub fn acting(&self, pg: u32, down: &[u32]) -> Vec<u32> {
        self.members(pg).filter(|o| !down.contains(o)).collect()
    }

    /// Whether `osd` is in PG `pg`'s acting set (without building it).
    pub fn is_acting(&self, pg: u32, osd: u32, down: &[u32]) -> bool {
        self.assigned(pg, osd) && !down.contains(&osd)
    }

    /// Whether placement or a temporary membership gives PG `pg` to
    /// `osd`, up or not: what it holds of a PG it is not assigned is a
    /// stray copy.
    pub fn assigned(&self, pg: u32, osd: u32) -> bool {
        self.members(pg).any(|o| o == osd)
    }

    /// Whether OSD `osd` is in this table at all: placed or a temporary
    /// member.
    pub fn knows(&self, osd: u32) -> bool {
        self.osds.contains(&osd) || self.temp.values().any(|t| t.contains(&osd))
    }

    /// Whether PG `pg`'s acting set is its placement, whole: every OSD
    /// placement gives it up, and no temporary member in it.
    pub fn whole(&self, pg: u32, down: &[u32]) -> bool {
        self.members(pg)
            .all(|o| self.placement(pg).contains(&o) != down.contains(&o))
    }

    /// The first member up; in an erasure-coded pool's table, the first
    /// placed member up from the PG's lead slot on (round the row), then
    /// the temporary members. A member `state` demotes (too slow) only
    /// when every member up is.
    pub fn primary(&self, pg: u32, state: &ClusterState) -> Option<u32> {
        let up = |o: &u32| !state.down.contains(o);
        let lead = |skip_demoted: bool| -> Option<u32> {
            let keep = |o: &u32| up(o) && !(skip_demoted && state.demoted.contains(o));
            let Some(&lead) = self.lead.get(pg as usize) else {
                return self.members(pg).find(keep);
            };
            let row = self.placement(pg);
            let n = row.len();
            (0..n)
                .map(|i| row[(usize::from(lead) + i) % n])
                .chain(self.temp_of(pg))
                .find(keep)
        };
        lead(true).or_else(|| lead(false))
    }
}

/// An interval of a PG: the epoch it began in, its acting set and the
/// store each member had then. The leader records, per PG, the last
/// interval that went active (docs/internals/replication.md §5): a member
/// that comes back with another store (a replaced or reformatted disk)
/// holds none of that interval's writes. A member the primary was still
/// recovering in the background is *incomplete*: it took every write of
/// the interval but may lack older ones, so it cannot vouch for the PG's
/// history until the primary reports it recovered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interval {
    pub epoch: u64,
    pub acting: Vec<u32>,
    /// Per member, its store's id (the blockstore's uuid, in hex); empty
    /// in an interval recorded before stores were (any store counts).
    #[serde(default)]
    pub stores: std::collections::BTreeMap<u32, String>,
    /// Members still being recovered when last reported (empty in an
    /// interval recorded before background recovery: every member was
    /// complete).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incomplete: Vec<u32>,
    /// An erasure-coded PG's placement row in the interval: the OSD at
    /// position `s` held shard `s` (empty for a replicated PG).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub row: Vec<u32>,
    /// The member that led it (none in an interval recorded before this
    /// was: its first member, when no OSD was ever demoted). The next
    /// interval waits out its read lease if it did not hear the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<u32>,
}

impl Interval {
    /// Whether OSD `osd`, now running store `store`, is a complete member
    /// with the store it had in this interval: one that holds every write
    /// acknowledged up to the interval's end.
    pub fn holds(&self, osd: u32, store: Option<&String>) -> bool {
        self.acting.contains(&osd)
            && !self.incomplete.contains(&osd)
            && store.is_some()
            && (self.stores.is_empty() || self.stores.get(&osd) == store)
    }

    /// Whether OSD `osd`, running store `store`, is a complete member that
    /// held shard `slot` in this interval (an erasure-coded PG's).
    pub fn holds_slot(&self, osd: u32, slot: usize, store: Option<&String>) -> bool {
        self.row.get(slot) == Some(&osd) && self.holds(osd, store)
    }
}

/// A pool as the leader keeps it and the OSDs route by it: its record,
/// its PG table, and per PG the last interval that went active.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolState {
    pub record: PoolRecord,
    pub table: PgTable,
    #[serde(default)]
    pub last_active: BTreeMap<u32, Interval>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: u64,
    pub name: String,
    pub pool: u32,
    pub size_bytes: u64,
    pub object_bytes: u32,
    pub created_unix_s: u64,
    /// `nacre volume rm` has begun: gateways refuse new connections to it
    /// and cut the open ones; its objects are being deleted.
    #[serde(default)]
    pub deleting: bool,
    /// Bytes from `size_bytes` up to here may still hold data a shrink cut
    /// off and has not deleted yet (0: none). A grow deletes them first, so
    /// the grown part reads zeros.
    #[serde(default)]
    pub stale_until: u64,
}

/// One open client connection to a volume, kept by the gateway that
/// serves it, on the gateway's lease (a dead gateway's sessions vanish).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub volume: String,
    pub volume_id: u64,
    /// Who: the gateway's address and the client's, as far as known.
    pub client: String,
    pub since_unix_s: u64,
    /// The volume size this connection enforces: after a shrink the
    /// gateway lowers it once no I/O admitted at the old size runs.
    pub size_bytes: u64,
}

/// Settings of the cluster as a whole that commands other than the one
/// that runs it read (`nacre up` writes them at every start).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// `nacre status` warns when the volumes' sizes add up to more than
    /// this many times what the cluster can hold (0: never).
    pub overcommit_ratio: f64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            overcommit_ratio: 1.0,
        }
    }
}

pub fn get_config(store: &dyn MetaStore) -> Result<ClusterConfig> {
    store
        .get(CONFIG_KEY)?
        .map_or(Ok(ClusterConfig::default()), |kv| parse(&kv))
}

pub fn put_config(store: &dyn MetaStore, c: &ClusterConfig) -> Result<()> {
    store.put(CONFIG_KEY, json(c), 0)?;
    Ok(())
}

/// When a PG was last scrubbed, and what that scrub found: its primary's
/// schedule rests on it, so that the schedule outlives the primary's
/// restarts and follows the PG to its next primary. Unix seconds; 0:
/// never.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubStamp {
    /// When a primary first planned its scrubs: the first ones come due
    /// a fraction of the intervals after (a fraction fixed per PG, so
    /// that PGs do not all come due together).
    pub first_unix_s: u64,
    /// The last complete scrub, light or deep (a deep one checks all a
    /// light one does), and the last deep one.
    pub light_unix_s: u64,
    pub deep_unix_s: u64,
    /// The last complete scrub's primary, objects compared, objects whose
    /// copies differed and, of them, those it could not repair.
    pub osd: u32,
    pub objects: u64,
    pub inconsistent: u64,
    pub unrepaired: u64,
}

/// What the last sweep for orphaned objects (objects of volumes that no
/// longer exist) found, in `nacre status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrphanReport {
    pub last_sweep_unix_s: u64,
    /// Object copies the sweeps have deleted since the cluster was made.
    pub reclaimed_objects: u64,
    /// Copies the last sweep found but could not delete, and why.
    pub left: Vec<String>,
    /// Objects past live volumes' ends the sweeps have deleted (a shrink
    /// or a delete whose command stopped half-way, finished; data a
    /// write landed past the end).
    #[serde(default)]
    pub trimmed_objects: u64,
    /// Interrupted shrinks and deletes the sweeps have finished.
    #[serde(default)]
    pub finished: u64,
}

/// Everything a client or OSD needs to route ops.
#[derive(Clone, Debug, Default)]
pub struct ClusterMap {
    pub osds: Vec<OsdRecord>,
    /// The ids of OSDs removed from the cluster.
    pub removed: Vec<u32>,
    pub up: Vec<u32>,
    pub pools: Vec<PoolRecord>,
    pub tables: Vec<PgTable>,
    pub state: ClusterState,
    pub revision: Revision,
}

impl ClusterMap {
    pub fn osd(&self, id: u32) -> Option<&OsdRecord> {
        self.osds.iter().find(|o| o.id == id)
    }
    pub fn pool(&self, id: u32) -> Option<&PoolRecord> {
        self.pools.iter().find(|p| p.id == id)
    }
    pub fn pool_named(&self, name: &str) -> Option<&PoolRecord> {
        self.pools.iter().find(|p| p.name == name)
    }
    pub fn table(&self, pool: u32) -> Option<&PgTable> {
        self.tables.iter().find(|p| p.pool == pool)
    }
    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }
    /// The primary of PG `pg` at this epoch, and the pool's PG count; none
    /// if the pool has no table.
    pub fn primary(&self, pg: PgId) -> Option<(Option<u32>, u32)> {
        let t = self.table(pg.pool)?;
        let count = t.pg_count();
        Some((
            (pg.pg < count).then(|| t.primary(pg.pg, &self.state))?,
            count,
        ))
    }
    pub fn is_up(&self, osd: u32) -> bool {
        self.up.contains(&osd)
    }

    /// The id a new OSD gets: one above every OSD's, removed ones too (an
    /// id is never given twice).
    pub fn next_osd_id(&self) -> u32 {
        let ids = self
            .osds
            .iter()
            .map(|o| o.id)
            .chain(self.removed.iter().copied());
        ids.map(|id| id + 1).max().unwrap_or(0)
    }
}

pub fn osd_key(id: u32) -> String {
    format!("{ROOT}osd/{id:05}")
}
pub fn up_key(id: u32) -> String {
    format!("{ROOT}up/osd/{id:05}")
}
fn pool_key(id: u32) -> String {
    format!("{ROOT}pool/{id:05}")
}
/// Present while `nacre pool rm` removes the pool: no volume is created
/// in it from then on.
fn removing_key(pool: u32) -> String {
    format!("{ROOT}pool-removing/{pool:05}")
}
fn table_key(pool: u32) -> String {
    format!("{ROOT}pgtable/{pool:05}")
}
/// Where earlier builds kept a pool's PG table, with the epoch and the
/// OSDs down and out in it (one pool per cluster).
const OLD_TABLES: &str = "/nacre/pgmap/";
fn interval_prefix(pool: u32) -> String {
    format!("{ROOT}pghistory/{pool:05}/")
}
fn interval_key(pool: u32, pg: u32) -> String {
    format!("{}{pg:05}", interval_prefix(pool))
}
const SCRUB_PREFIX: &str = "/nacre/scrubbed/";
fn scrub_prefix(pool: u32) -> String {
    format!("{SCRUB_PREFIX}{pool:05}/")
}
fn scrub_key(pg: PgId) -> String {
    format!("{}{:05}", scrub_prefix(pg.pool), pg.pg)
}
fn volume_key(name: &str) -> String {
    format!("{ROOT}volume/{name}")
}
fn session_prefix(volume_id: u64) -> String {
    format!("{ROOT}session/{volume_id}/")
}
const CLUSTER_KEY: &str = "/nacre/cluster";
const STATE_KEY: &str = "/nacre/osdmap";
/// The last pool id handed out: ids are never reused, so an object whose
/// volume names a pool id at most this one that is not in the map belongs
/// to a removed pool.
const POOL_COUNTER_KEY: &str = "/nacre/counter/pool";
const ORPHANS_KEY: &str = "/nacre/orphans";
const CONFIG_KEY: &str = "/nacre/config";
const VOLUME_COUNTER_KEY: &str = "/nacre/counter/volume";

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("map records serialise")
}

fn parse<T: for<'a> Deserialize<'a>>(kv: &KeyValue) -> Result<T> {
    serde_json::from_slice(&kv.value)
        .map_err(|e| MetaError::Storage(format!("record {}: {e}", kv.key)))
}

fn put(key: String, value: Vec<u8>) -> TxnOp {
    TxnOp::Put {
        key,
        value,
        lease: 0,
    }
}

/// Seconds since the Unix epoch.
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// True once [`init`] has run against this store.
pub fn initialised(store: &dyn MetaStore) -> Result<bool> {
    Ok(store.get(CLUSTER_KEY)?.is_some())
}

/// A PG table's placement: `size` OSDs per PG and, for an erasure-coded
/// pool, each PG's lead slot ([`PgTable::lead`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub osds: Vec<u32>,
    pub lead: Vec<u8>,
}

/// The pool's PG table on `osds` except those `out`, keeping what it can
/// of `prev` (placement's fewest moves).
pub fn place(
    osds: &[OsdRecord],
    pool: &PoolRecord,
    out: &[u32],
    prev: Option<&PgTable>,
) -> Result<Placed> {
    let domain = match pool.failure_domain.as_str() {
        "osd" => nacre_placement::FailureDomain::Osd,
        "host" => nacre_placement::FailureDomain::Host,
        "rack" => nacre_placement::FailureDomain::Rack,
        d => return Err(MetaError::Invalid(format!("unknown failure domain {d:?}"))),
    };
    if pool.min_size == 0 || pool.min_size > pool.size {
        return Err(MetaError::Invalid(format!(
            "min_size {} must be within 1..={}",
            pool.min_size, pool.size
        )));
    }
    // The first OSD with the same name stands for its host (rack).
    let index = |names: &[&str], n: &str| names.iter().position(|x| *x == n).unwrap_or(0) as u32;
    let hosts: Vec<&str> = osds.iter().map(|o| o.host.as_str()).collect();
    let racks: Vec<&str> = osds.iter().map(|o| o.rack.as_str()).collect();
    let pos: Vec<nacre_placement::Osd> = osds
        .iter()
        .map(|o| nacre_placement::Osd {
            id: o.id,
            host: index(&hosts, &o.host),
            rack: index(&racks, &o.rack),
            weight: o.weight.max(1),
            up: !out.contains(&o.id),
        })
        .collect();
    let p = nacre_placement::Pool {
        pgs: pool.pg_count,
        size: pool.size,
        domain,
        positional: pool.ec.is_some(),
    };
    // A table of another width (the pool's size changed) keeps each PG's
    // first members, as many as fit: a PG that grows gains members, one
    // that shrinks loses its last ones, and nothing else moves.
    let prev = prev.map(|m| {
        let (old, new) = (usize::from(m.size), usize::from(pool.size));
        let osds = (m.osds.chunks(old.max(1)))
            .flat_map(|row| (0..new).map(|k| row.get(k).copied().unwrap_or(u32::MAX)))
            .collect();
        nacre_placement::Table {
            size: pool.size,
            osds,
            // Leads name slots of a table of this width only.
            lead: if m.size == pool.size {
                m.lead.clone()
            } else {
                Vec::new()
            },
        }
    });
    let table = nacre_placement::place(&pos, &p, prev.as_ref())
        .map_err(|e| MetaError::Invalid(format!("placement: {e}")))?;
    Ok(Placed {
        osds: table.osds,
        lead: table.lead,
    })
}

/// Writes a new cluster's map: its OSDs, one pool and that pool's PG table
/// (computed by `nacre-placement`), at epoch 1. Fails if a map exists.
pub fn init(store: &dyn MetaStore, osds: &[OsdRecord], pool: &PoolRecord) -> Result<PgTable> {
    check_pool(pool)?;
    let table = PgTable::new(pool.id, pool.size, place(osds, pool, &[], None)?);
    let state = ClusterState {
        epoch: 1,
        ..ClusterState::default()
    };
    let mut ops = vec![
        put(
            CLUSTER_KEY.into(),
            json(&serde_json::json!({"created_unix_s": now_s()})),
        ),
        put(STATE_KEY.into(), json(&state)),
        put(pool_key(pool.id), json(pool)),
        put(POOL_COUNTER_KEY.into(), json(&pool.id)),
        put(table_key(pool.id), json(&table)),
    ];
    ops.extend(osds.iter().map(|o| put(osd_key(o.id), json(o))));
    let t = Txn {
        compare: vec![Compare::Version(CLUSTER_KEY.into(), CmpOp::Equal, 0)],
        success: ops,
        failure: vec![],
    };
    if !store.txn(t)?.succeeded {
        return Err(MetaError::Invalid("the cluster map already exists".into()));
    }
    Ok(table)
}

/// Checks what a pool record says before it is stored: an id a volume id
/// can carry, a name like a volume's, a size placement can give.
pub fn check_pool(pool: &PoolRecord) -> Result<()> {
    if pool.id == 0 || pool.id > POOL_ID_MAX {
        return Err(MetaError::Invalid(format!(
            "pool id {} must be within 1..={POOL_ID_MAX}",
            pool.id
        )));
    }
    check_name("pool", &pool.name)?;
    if pool.size == 0 || pool.min_size == 0 || pool.min_size > pool.size {
        return Err(MetaError::Invalid(format!(
            "pool {}: size {} and min_size {}: give 1 <= min_size <= size",
            pool.name, pool.size, pool.min_size
        )));
    }
    if let Some(e) = pool.ec {
        e.check()
            .map_err(|why| MetaError::Invalid(format!("pool {}: {why}", pool.name)))?;
        // Below k shards nothing reads back; at k, a write would survive
        // no further loss.
        if pool.size != e.k + e.m || pool.min_size < e.k {
            return Err(MetaError::Invalid(format!(
                "pool {}: erasure coding {e} has {} shards (size {}) and min_size {}: give k <= min_size <= k + m",
                pool.name,
                e.k + e.m,
                pool.size,
                pool.min_size
            )));
        }
        // An op's range (and a read's reply) is at most one frame's
        // payload.
        if pool.object_bytes > nacre_types::BLOCK_BYTES_MAX {
            return Err(MetaError::Invalid(format!(
                "pool {}: erasure coding {e} makes objects of {} bytes, more than {} (use smaller store blocks or a smaller K)",
                pool.name,
                pool.object_bytes,
                nacre_types::BLOCK_BYTES_MAX
            )));
        }
        if !pool.object_bytes.is_multiple_of(u32::from(e.k)) {
            return Err(MetaError::Invalid(format!(
                "pool {}: objects of {} bytes do not split into {} shards",
                pool.name, pool.object_bytes, e.k
            )));
        }
    }
    let b = pool.shard_bytes();
    if !(nacre_types::BLOCK_BYTES_MIN..=nacre_types::BLOCK_BYTES_MAX).contains(&b)
        || !b.is_power_of_two()
    {
        return Err(MetaError::Invalid(format!(
            "pool {}: objects of {b} bytes (a power of two within {}..={})",
            pool.name,
            nacre_types::BLOCK_BYTES_MIN,
            nacre_types::BLOCK_BYTES_MAX
        )));
    }
    if pool.pg_count == 0 || pool.pg_count > PG_COUNT_MAX {
        return Err(MetaError::Invalid(format!(
            "pool {}: {} PGs: give 1..={PG_COUNT_MAX}",
            pool.name, pool.pg_count
        )));
    }
    Ok(())
}

/// The most PGs a pool may have.
pub const PG_COUNT_MAX: u32 = 1 << 16;

/// Reads the whole map.
pub fn load(store: &dyn MetaStore) -> Result<ClusterMap> {
    let t = Txn {
        success: vec![
            TxnOp::Get(Range::prefix(&format!("{ROOT}osd/"))),
            TxnOp::Get(Range::prefix(&format!("{ROOT}up/osd/"))),
            TxnOp::Get(Range::prefix(&format!("{ROOT}pool/"))),
            TxnOp::Get(Range::prefix(&format!("{ROOT}pgtable/"))),
            TxnOp::Get(Range::key(STATE_KEY)),
            TxnOp::Get(Range::prefix(OLD_TABLES)),
        ],
        ..Txn::default()
    };
    let r = store.txn(t)?;
    let mut got = r.results.into_iter().map(|x| match x {
        OpResult::Get(kvs) => kvs,
        _ => Vec::new(),
    });
    let mut next = || got.next().unwrap_or_default();
    let all: Vec<OsdRecord> = next().iter().map(parse).collect::<Result<_>>()?;
    let (gone, osds): (Vec<OsdRecord>, Vec<OsdRecord>) = all.into_iter().partition(|o| o.removed);
    let removed = gone.iter().map(|o| o.id).collect();
    let up = next()
        .iter()
        .filter_map(|kv| kv.key.rsplit('/').next()?.parse().ok())
        .collect();
    let pools = next().iter().map(parse).collect::<Result<_>>()?;
    let tables = next().iter().map(parse).collect::<Result<_>>()?;
    let state = (next().first()).map_or(Ok(ClusterState::default()), parse)?;
    if !next().is_empty() {
        return Err(MetaError::Storage(
            "this cluster map was written by an earlier build of Nacre (one pool, its epoch in the PG table), which this one does not read: make the cluster anew".into(),
        ));
    }
    Ok(ClusterMap {
        osds,
        removed,
        up,
        pools,
        tables,
        state,
        revision: r.revision,
    })
}

/// Epochs stay below this: a PG's versions are `epoch << 32 | seq`.
pub const EPOCH_MAX: u64 = u32::MAX as u64;

pub fn check_volume_name(name: &str) -> Result<()> {
    check_name("volume", name)
}

/// A volume's or pool's name: 1..=128 of `[A-Za-z0-9._-]`, not starting
/// with `.`.
fn check_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= VOLUME_NAME_MAX_BYTES
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(MetaError::Invalid(format!(
            "{what} name {name:?}: 1..={VOLUME_NAME_MAX_BYTES} of [A-Za-z0-9._-], not starting with '.'"
        )))
    }
}

/// Stores what changed of the leader's map since `prev` (what it stored
/// last; `None`: read from the store first), in as few transactions as the
/// store allows: each PG's last active interval that changed, under a key
/// of its own (a PG event writes a few hundred bytes, whatever the PG
/// count), then the PG tables and pool records that changed and the
/// cluster state, together and last, so a table is stored only after the
/// intervals it was made with and with the out list it was placed for
/// (when more pools change at once than one transaction takes, in an
/// order any prefix of which loads). A pool is deleted only if `prev` had
/// it: one this leader never knew of is left alone.
///
/// `fence` guards every write: an elected leader passes the compare that
/// says it still holds its election key, so one that lost it stores
/// nothing (`NotLeader`). A store that takes few operations per
/// transaction (etcd: 128) gets several; a change cut short fails, and the
/// leader that made it refuses it (an interval stored as active that never
/// went active only makes a later peering wait for one of its members:
/// replication.md §5.3).
pub fn save_map(
    store: &dyn MetaStore,
    state: &ClusterState,
    pools: &BTreeMap<u32, PoolState>,
    prev: Option<(&ClusterState, &BTreeMap<u32, PoolState>)>,
    fence: &[Compare],
) -> Result<()> {
    let loaded;
    let (prev_state, prev_pools) = match prev {
        Some(p) => p,
        None => {
            let m = load(store)?;
            loaded = (m.state.clone(), pools_of(store, &m)?);
            (&loaded.0, &loaded.1)
        }
    };
    // Only a pool the leader knew and dropped, or one the state says was
    // removed, is deleted, never one it merely does not know (written
    // while it was not looking).
    let removed: Vec<u32> = (prev_pools.keys().copied())
        .filter(|id| !pools.contains_key(id))
        .filter(|id| prev.is_some() || state.removed_pools.contains(id))
        .collect();
    let mut ops = Vec::new();
    for (id, p) in pools {
        let was = prev_pools.get(id).map(|p| &p.last_active);
        for (pg, iv) in &p.last_active {
            if was.is_none_or(|w| w.get(pg) != Some(iv)) {
                ops.push(put(interval_key(*id, *pg), json(iv)));
            }
        }
        ops.extend(
            (was.into_iter().flat_map(|w| w.keys()))
                .filter(|pg| !p.last_active.contains_key(pg))
                .map(|pg| TxnOp::Delete(Range::key(&interval_key(*id, *pg)))),
        );
    }
    // In an order any prefix of which is a map that loads: a pool's table
    // before its record (a table without a record is not read), its
    // record deleted before the rest; the cluster state last.
    let mut last = Vec::new();
    for (id, p) in pools {
        let was = prev_pools.get(id);
        if was.is_none_or(|w| w.table != p.table) {
            last.push(put(table_key(*id), json(&p.table)));
        }
        if was.is_none_or(|w| w.record != p.record) {
            last.push(put(pool_key(*id), json(&p.record)));
        }
    }
    for id in removed {
        last.push(TxnOp::Delete(Range::key(&pool_key(id))));
        last.push(TxnOp::Delete(Range::key(&removing_key(id))));
        last.push(TxnOp::Delete(Range::key(&table_key(id))));
        last.push(TxnOp::Delete(Range::prefix(&interval_prefix(id))));
        last.push(TxnOp::Delete(Range::prefix(&scrub_prefix(id))));
    }
    if prev_state != state {
        last.push(put(STATE_KEY.into(), json(state)));
    }
    let per = store.txn_ops_max().max(1);
    // The cluster state and the tables together if they fit (etcd's 128
    // operations: a hundred pools changing at once); if not, in order,
    // the state alone last.
    let split = if last.len() <= per {
        ops.len()
    } else {
        ops.len() + last.len() - 1
    };
    ops.extend(last);
    let mut start = 0;
    while start < ops.len() {
        let end = if start < split {
            split.min(start + per)
        } else {
            ops.len()
        };
        let t = Txn {
            compare: fence.to_vec(),
            success: ops[start..end].to_vec(),
            failure: vec![],
        };
        if !store.txn(t)?.succeeded {
            return Err(MetaError::NotLeader);
        }
        start = end;
    }
    Ok(())
}

/// Every pool as stored: record, PG table and history.
pub fn load_pools(store: &dyn MetaStore) -> Result<BTreeMap<u32, PoolState>> {
    pools_of(store, &load(store)?)
}

/// Every pool of `m` (as loaded) with its history.
pub fn pools_of(store: &dyn MetaStore, m: &ClusterMap) -> Result<BTreeMap<u32, PoolState>> {
    let mut pools = BTreeMap::new();
    for r in &m.pools {
        let table = (m.table(r.id).cloned())
            .ok_or_else(|| MetaError::Storage(format!("pool {} has no PG table", r.name)))?;
        pools.insert(
            r.id,
            PoolState {
                record: r.clone(),
                table,
                last_active: load_history(store, r.id)?,
            },
        );
    }
    Ok(pools)
}

/// The key an elected monitor holds under its lease while it leads; its
/// value is the leader's wire address, a space, and a nonce of that term.
pub const MON_LEADER_KEY: &str = "/nacre/mon/leader";

/// The address in [`MON_LEADER_KEY`]'s value.
pub fn leader_addr_of(value: &[u8]) -> Option<String> {
    let v = std::str::from_utf8(value).ok()?;
    Some(v.split_once(' ').map_or(v, |(a, _)| a).to_string())
}

/// Present from `nacre osd init` until the OSD first booted and asked to be
/// marked in.
pub fn fresh_key(id: u32) -> String {
    format!("{ROOT}fresh/osd/{id:05}")
}

/// Creates an empty cluster (no OSD, no pool) with id `uuid`; fails if one
/// exists under this store's root.
pub fn init_cluster(store: &dyn MetaStore, uuid: &str) -> Result<()> {
    let t = Txn {
        compare: vec![Compare::Version(CLUSTER_KEY.into(), CmpOp::Equal, 0)],
        success: vec![put(
            CLUSTER_KEY.into(),
            json(&serde_json::json!({"created_unix_s": now_s(), "uuid": uuid})),
        )],
        failure: vec![TxnOp::Get(Range::key(CLUSTER_KEY))],
    };
    let r = store.txn(t)?;
    if !r.succeeded {
        let was = cluster_uuid(store)?.unwrap_or_else(|| "without an id".into());
        return Err(MetaError::Invalid(format!(
            "a cluster exists already: {was}"
        )));
    }
    Ok(())
}

/// The id of the cluster (`None` for one made by `nacre up`, which has
/// none; an error if there is no cluster).
pub fn cluster_uuid(store: &dyn MetaStore) -> Result<Option<String>> {
    let kv = (store.get(CLUSTER_KEY)?).ok_or_else(|| {
        MetaError::Invalid("no cluster here (nacre cluster init makes one)".into())
    })?;
    let v: serde_json::Value = parse(&kv)?;
    Ok(v["uuid"].as_str().map(str::to_string))
}

/// Registers a new OSD, its id the lowest above every id in use; returns
/// the record.
pub fn register_osd(store: &dyn MetaStore, mut rec: OsdRecord) -> Result<OsdRecord> {
    for _ in 0..CAS_RETRY_MAX {
        rec.id = load(store)?.next_osd_id();
        match add_osd(store, &rec) {
            Ok(()) => return Ok(rec),
            Err(MetaError::Invalid(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(MetaError::Invalid(
        "OSD ids kept being taken; try again".into(),
    ))
}

/// Creates `pool` with its PG table over the OSDs registered now (those
/// not out), giving it the next pool id; for a cluster with no leader
/// running (a monitor or `nacre up` adds pools through theirs: the
/// transaction fails if a monitor holds the leader key). The name must be
/// new.
pub fn create_pool(store: &dyn MetaStore, pool: &PoolRecord) -> Result<PoolState> {
    cluster_uuid(store)?;
    for _ in 0..CAS_RETRY_MAX {
        let m = load(store)?;
        let counter = store.get(POOL_COUNTER_KEY)?;
        let last: u32 = counter.as_ref().map_or(Ok(0), parse)?;
        let pool = PoolRecord {
            id: last + 1,
            ..pool.clone()
        };
        check_pool(&pool)?;
        if m.pool_named(&pool.name).is_some() {
            return Err(MetaError::Invalid(format!(
                "a pool named {:?} exists already (`nacre pool ls` lists them)",
                pool.name
            )));
        }
        check_pg_logs(&m, &pool)?;
        let table = PgTable::new(
            pool.id,
            pool.size,
            place(&m.osds, &pool, &m.state.out, None)?,
        );
        // A new epoch: a map with the pool is never one without it at the
        // same epoch (an OSD still on the old one answers `StaleEpoch`, not
        // that the pool does not exist).
        let state = ClusterState {
            epoch: m.state.epoch + 1,
            ..m.state.clone()
        };
        let t = Txn {
            compare: vec![
                Compare::ModRevision(
                    POOL_COUNTER_KEY.into(),
                    CmpOp::Equal,
                    counter.map_or(0, |kv| kv.mod_revision),
                ),
                // The state it was placed with and bumps is still the
                // stored one.
                Compare::ModRevision(STATE_KEY.into(), CmpOp::Less, m.revision + 1),
                Compare::Version(pool_key(pool.id), CmpOp::Equal, 0),
                Compare::Version(MON_LEADER_KEY.into(), CmpOp::Equal, 0),
            ],
            success: vec![
                put(pool_key(pool.id), json(&pool)),
                put(table_key(pool.id), json(&table)),
                put(POOL_COUNTER_KEY.into(), json(&pool.id)),
                put(STATE_KEY.into(), json(&state)),
            ],
            failure: vec![],
        };
        if store.txn(t)?.succeeded {
            return Ok(PoolState {
                record: pool,
                table,
                last_active: BTreeMap::new(),
            });
        }
        if store.get(MON_LEADER_KEY)?.is_some() {
            return Err(MetaError::Invalid(
                "a monitor leads the cluster now: its leader makes pools".into(),
            ));
        }
    }
    Err(MetaError::Unavailable(
        "pool create kept losing races".into(),
    ))
}

/// Marks pool `pool` as being removed if no volume names it: from then on
/// no volume is created in it (`create_volume` compares the mark absent).
/// The check and the mark are one transaction on the volume counter, so a
/// volume created between them makes it fail and be tried again. Returns
/// the volumes that name the pool (then nothing is marked).
pub fn mark_pool_removing(store: &dyn MetaStore, pool: u32) -> Result<Vec<String>> {
    for _ in 0..CAS_RETRY_MAX {
        let counter = store.get(VOLUME_COUNTER_KEY)?;
        let using: Vec<String> = (list_volumes(store)?.into_iter())
            .filter(|v| v.pool == pool)
            .map(|v| v.name)
            .collect();
        if !using.is_empty() {
            return Ok(using);
        }
        let t = Txn {
            compare: vec![Compare::ModRevision(
                VOLUME_COUNTER_KEY.into(),
                CmpOp::Equal,
                counter.map_or(0, |kv| kv.mod_revision),
            )],
            success: vec![put(removing_key(pool), json(&now_s()))],
            failure: vec![],
        };
        if store.txn(t)?.succeeded {
            return Ok(Vec::new());
        }
    }
    Err(MetaError::Unavailable("volumes kept being created".into()))
}

/// Takes the next pool id from the meta store's counter (ids are never
/// given twice, even to a pool whose creation then fails), for a pool a
/// running leader creates.
pub fn reserve_pool_id(store: &dyn MetaStore) -> Result<u32> {
    for _ in 0..CAS_RETRY_MAX {
        let counter = store.get(POOL_COUNTER_KEY)?;
        let last: u32 = counter.as_ref().map_or(Ok(0), parse)?;
        if last >= POOL_ID_MAX {
            return Err(MetaError::Invalid(format!(
                "every pool id up to {POOL_ID_MAX} has been given"
            )));
        }
        let t = Txn {
            compare: vec![Compare::ModRevision(
                POOL_COUNTER_KEY.into(),
                CmpOp::Equal,
                counter.map_or(0, |kv| kv.mod_revision),
            )],
            success: vec![put(POOL_COUNTER_KEY.into(), json(&(last + 1)))],
            failure: vec![],
        };
        if store.txn(t)?.succeeded {
            return Ok(last + 1);
        }
    }
    Err(MetaError::Unavailable("pool id kept being taken".into()))
}

/// Most PGs over every pool: the map a leader sends each OSD (`Boot`,
/// `Map`), with a table entry and an interval of a few hundred bytes per
/// PG, must fit one frame (4 MiB).
pub const PGS_TOTAL_MAX: u32 = 16_384;

/// The PGs of `pool` and of the other pools (`others` of them) together,
/// refused past [`PGS_TOTAL_MAX`].
pub fn check_pg_total(others: u32, pool: &PoolRecord) -> Result<u32> {
    let all = others + pool.pg_count;
    if all > PGS_TOTAL_MAX {
        return Err(MetaError::Invalid(format!(
            "{} PGs: the pools would have {all} in all, more than {PGS_TOTAL_MAX} (the map every OSD is sent must fit a frame)",
            pool.pg_count
        )));
    }
    Ok(all)
}

/// Refuses a pool whose PGs, with every other pool's, would not all fit
/// the PG log slots of some OSD's store, or the map's frame.
pub fn check_pg_logs(m: &ClusterMap, pool: &PoolRecord) -> Result<()> {
    let others: u32 = (m.pools.iter())
        .filter(|p| p.id != pool.id)
        .map(|p| p.pg_count)
        .sum();
    let all = check_pg_total(others, pool)?;
    if let Some(o) = (m.osds.iter()).find(|o| o.pg_logs != 0 && o.pg_logs < all) {
        return Err(MetaError::Invalid(format!(
            "{} PGs in all: osd.{}'s store holds the logs of {} PGs at most (nacre osd init --pg-logs)",
            all, o.id, o.pg_logs
        )));
    }
    Ok(())
}

/// The last pool id handed out (0: none yet).
pub fn last_pool_id(store: &dyn MetaStore) -> Result<u32> {
    store.get(POOL_COUNTER_KEY)?.map_or(Ok(0), |kv| parse(&kv))
}

/// Registers OSD `rec` in the map; its id must be new.
/// Marks OSD `id`'s record removed (`nacre osd rm`, once the leader took
/// it out of the map).
pub fn retire_osd(store: &dyn MetaStore, id: u32) -> Result<()> {
    let kv =
        (store.get(&osd_key(id))?).ok_or_else(|| MetaError::Invalid(format!("no osd.{id}")))?;
    let mut rec: OsdRecord = parse(&kv)?;
    rec.removed = true;
    store.txn(Txn {
        success: vec![put(osd_key(id), json(&rec))],
        ..Txn::default()
    })?;
    Ok(())
}

pub fn add_osd(store: &dyn MetaStore, rec: &OsdRecord) -> Result<()> {
    let t = Txn {
        compare: vec![Compare::Version(osd_key(rec.id), CmpOp::Equal, 0)],
        success: vec![put(osd_key(rec.id), json(rec))],
        failure: vec![],
    };
    if !store.txn(t)?.succeeded {
        return Err(MetaError::Invalid(format!("osd.{} exists already", rec.id)));
    }
    Ok(())
}

/// Gives OSDs that are in but hold no PG of any pool (added while the
/// cluster was stopped) their share: new tables with placement's fewest
/// moves, in a new epoch. Returns the PG copies that moved (0: none had
/// to).
pub fn place_new_osds(store: &dyn MetaStore) -> Result<usize> {
    let m = load(store)?;
    let unplaced = (m.osds.iter())
        .any(|o| !m.state.out.contains(&o.id) && !m.tables.iter().any(|t| t.osds.contains(&o.id)));
    if !unplaced {
        return Ok(0);
    }
    let mut ops = Vec::new();
    let mut moved = 0;
    for pool in &m.pools {
        let t = (m.table(pool.id))
            .ok_or_else(|| MetaError::Invalid(format!("pool {} has no PG table", pool.name)))?;
        let placed = place(&m.osds, pool, &m.state.out, Some(t))?;
        moved += (placed.osds.iter().zip(&t.osds))
            .filter(|(a, b)| a != b)
            .count();
        // No OSD is up yet: there is no copy to keep as a temporary member.
        let next = PgTable::new(t.pool, t.size, placed);
        ops.push(put(table_key(pool.id), json(&next)));
    }
    let state = ClusterState {
        epoch: m.state.epoch + 1,
        ..m.state.clone()
    };
    ops.push(put(STATE_KEY.into(), json(&state)));
    store.txn(Txn {
        success: ops,
        ..Txn::default()
    })?;
    Ok(moved)
}

/// Marks out the OSDs that `nacre osd init` registered while no leader
/// ran and that have not booted yet (their [`fresh_key`] is there) and are
/// neither in a PG table nor out, in a new epoch: a leader that starts
/// gives them their share only when they boot and ask to be marked in (an
/// OSD never started holds no PG meanwhile). Returns their ids.
pub fn out_new_osds(store: &dyn MetaStore, fence: &[Compare]) -> Result<Vec<u32>> {
    let m = load(store)?;
    let new: Vec<u32> = (unbooted(store, &m)?.into_iter())
        .filter(|id| !m.state.out.contains(id))
        .collect();
    if new.is_empty() {
        return Ok(new);
    }
    let mut state = ClusterState {
        epoch: m.state.epoch + 1,
        ..m.state.clone()
    };
    state.out.extend(&new);
    state.out.sort_unstable();
    let t = Txn {
        compare: fence.to_vec(),
        success: vec![put(STATE_KEY.into(), json(&state))],
        failure: vec![],
    };
    if !store.txn(t)?.succeeded {
        return Err(MetaError::NotLeader);
    }
    Ok(new)
}

/// The OSDs of `m` that `nacre osd init` registered and that have not
/// booted yet (their [`fresh_key`] is there) and are in no PG table.
fn unbooted(store: &dyn MetaStore, m: &ClusterMap) -> Result<Vec<u32>> {
    let (fresh, _) = store.range(&Range::prefix(&format!("{ROOT}fresh/osd/")))?;
    let fresh: Vec<u32> = (fresh.iter())
        .filter_map(|kv| kv.key.rsplit('/').next()?.parse().ok())
        .collect();
    Ok((m.osds.iter())
        .map(|o| o.id)
        .filter(|id| fresh.contains(id))
        .filter(|&id| !m.tables.iter().any(|t| t.knows(id)))
        .collect())
}

/// The OSDs of `m` that are out: marked out, or registered and not yet
/// booted (a leader marks those out when it starts, and in when they first
/// boot). Sorted.
pub fn out_osds(store: &dyn MetaStore, m: &ClusterMap) -> Result<Vec<u32>> {
    let mut out = m.state.out.clone();
    out.extend(unbooted(store, m)?);
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The leader's history of pool `pool` (empty for a new pool): per PG,
/// the last interval that went active.
pub fn load_history(store: &dyn MetaStore, pool: u32) -> Result<BTreeMap<u32, Interval>> {
    let mut h = BTreeMap::new();
    let (kvs, _) = store.range(&Range::prefix(&interval_prefix(pool)))?;
    for kv in kvs {
        let pg = kv.key[interval_prefix(pool).len()..]
            .parse()
            .map_err(|_| MetaError::Storage(format!("record {}: not a PG key", kv.key)))?;
        h.insert(pg, parse(&kv)?);
    }
    Ok(h)
}

/// Every PG's [`ScrubStamp`] (those of pools no longer in the map too).
/// A stamp only advises a schedule: one that does not parse is skipped
/// (and logged), and the next scrub of its PG writes it anew.
pub fn scrub_stamps(store: &dyn MetaStore) -> Result<BTreeMap<PgId, ScrubStamp>> {
    let (kvs, _) = store.range(&Range::prefix(SCRUB_PREFIX))?;
    let mut s = BTreeMap::new();
    for kv in kvs {
        let pg = (kv.key[SCRUB_PREFIX.len()..].split_once('/'))
            .and_then(|(pool, pg)| Some(PgId::new(pool.parse().ok()?, pg.parse().ok()?)));
        match (pg, parse(&kv)) {
            (Some(pg), Ok(stamp)) => {
                s.insert(pg, stamp);
            }
            (_, r) => tracing::warn!("scrub stamp {} skipped: {:?}", kv.key, r.err()),
        }
    }
    Ok(s)
}

/// Changes PG `pg`'s [`ScrubStamp`] by `f` (from the default if it has
/// none or one that does not parse), compare-and-swap; `f` returning
/// `false` leaves it as it is. Returns the stamp as it stands.
pub fn update_scrub_stamp(
    store: &dyn MetaStore,
    pg: PgId,
    f: impl Fn(&mut ScrubStamp) -> bool,
) -> Result<ScrubStamp> {
    let key = scrub_key(pg);
    for _ in 0..CAS_RETRY_MAX {
        let kv = store.get(&key)?;
        let mut s: ScrubStamp = kv
            .as_ref()
            .and_then(|kv| parse(kv).ok())
            .unwrap_or_default();
        if !f(&mut s) {
            return Ok(s);
        }
        let t = Txn {
            compare: vec![Compare::ModRevision(
                key.clone(),
                CmpOp::Equal,
                kv.map_or(0, |kv| kv.mod_revision),
            )],
            success: vec![put(key.clone(), json(&s))],
            failure: vec![],
        };
        if store.txn(t)?.succeeded {
            return Ok(s);
        }
    }
    Err(MetaError::Unavailable(format!(
        "scrub stamp of PG {pg} kept changing"
    )))
}

pub fn get_volume(store: &dyn MetaStore, name: &str) -> Result<Option<VolumeRecord>> {
    check_volume_name(name)?;
    store
        .get(&volume_key(name))?
        .map(|kv| parse(&kv))
        .transpose()
}

pub fn list_volumes(store: &dyn MetaStore) -> Result<Vec<VolumeRecord>> {
    let (kvs, _) = store.range(&Range::prefix(&format!("{ROOT}volume/")))?;
    kvs.iter().map(parse).collect()
}

/// The serial number ([`VolumeId::serial`]) of the last volume id handed
/// out (0: none yet).
pub fn last_volume_id(store: &dyn MetaStore) -> Result<u64> {
    store
        .get(VOLUME_COUNTER_KEY)?
        .map_or(Ok(0), |kv| parse(&kv))
}

/// The open connections to volume `volume_id`.
pub fn list_sessions(store: &dyn MetaStore, volume_id: u64) -> Result<Vec<SessionRecord>> {
    let (kvs, _) = store.range(&Range::prefix(&session_prefix(volume_id)))?;
    kvs.iter().map(parse).collect()
}

/// Records (or updates) session `conn` of gateway `gateway` on `lease`.
pub fn put_session(
    store: &dyn MetaStore,
    gateway: &str,
    conn: u64,
    s: &SessionRecord,
    lease: LeaseId,
) -> Result<()> {
    let key = format!("{}{gateway}.{conn}", session_prefix(s.volume_id));
    store.put(&key, json(s), lease)?;
    Ok(())
}

pub fn delete_session(
    store: &dyn MetaStore,
    gateway: &str,
    conn: u64,
    volume_id: u64,
) -> Result<()> {
    let key = format!("{}{gateway}.{conn}", session_prefix(volume_id));
    store.delete(&Range::key(&key))?;
    Ok(())
}

pub fn get_orphans(store: &dyn MetaStore) -> Result<OrphanReport> {
    store
        .get(ORPHANS_KEY)?
        .map_or(Ok(OrphanReport::default()), |kv| parse(&kv))
}

pub fn put_orphans(store: &dyn MetaStore, r: &OrphanReport) -> Result<()> {
    store.put(ORPHANS_KEY, json(r), 0)?;
    Ok(())
}

/// The key prefix of volume records, for watches.
pub fn volume_prefix() -> String {
    format!("{ROOT}volume/")
}

/// Creates a volume with a fresh id; fails if the name is taken.
pub fn create_volume(
    store: &dyn MetaStore,
    name: &str,
    pool: &PoolRecord,
    size_bytes: u64,
) -> Result<VolumeRecord> {
    check_volume_name(name)?;
    for _ in 0..CAS_RETRY_MAX {
        let counter = store.get(VOLUME_COUNTER_KEY)?;
        let last: u64 = match &counter {
            Some(kv) => parse(kv)?,
            None => 0,
        };
        let v = VolumeRecord {
            id: VolumeId::new(pool.id, last + 1).0,
            name: name.to_string(),
            pool: pool.id,
            size_bytes,
            object_bytes: pool.object_bytes,
            created_unix_s: now_s(),
            deleting: false,
            stale_until: 0,
        };
        let t = Txn {
            compare: vec![
                Compare::Version(volume_key(name), CmpOp::Equal, 0),
                // The pool is still there and not being removed (a `pool
                // rm` may have raced).
                Compare::Version(pool_key(pool.id), CmpOp::Greater, 0),
                Compare::Version(removing_key(pool.id), CmpOp::Equal, 0),
                Compare::ModRevision(
                    VOLUME_COUNTER_KEY.into(),
                    CmpOp::Equal,
                    counter.map_or(0, |kv| kv.mod_revision),
                ),
            ],
            success: vec![
                put(volume_key(name), json(&v)),
                put(VOLUME_COUNTER_KEY.into(), json(&(last + 1))),
            ],
            failure: vec![TxnOp::Get(Range::key(&volume_key(name)))],
        };
        let r = store.txn(t)?;
        if r.succeeded {
            return Ok(v);
        }
        if matches!(r.results.first(), Some(OpResult::Get(kvs)) if !kvs.is_empty()) {
            return Err(MetaError::Invalid(format!(
                "a volume named {name:?} already exists (`nacre volume ls` lists them)"
            )));
        }
        if store.get(&pool_key(pool.id))?.is_none() || store.get(&removing_key(pool.id))?.is_some()
        {
            return Err(MetaError::Invalid(format!(
                "pool {} is removed or being removed",
                pool.name
            )));
        }
    }
    Err(MetaError::Unavailable(
        "volume create kept losing races".into(),
    ))
}

/// Changes a volume's record with `f` (compare-and-swap on its revision).
pub fn update_volume(
    store: &dyn MetaStore,
    name: &str,
    f: impl Fn(&mut VolumeRecord) -> Result<()>,
) -> Result<VolumeRecord> {
    check_volume_name(name)?;
    for _ in 0..CAS_RETRY_MAX {
        let kv = store
            .get(&volume_key(name))?
            .ok_or_else(|| MetaError::Invalid(format!("no volume {name:?}")))?;
        let mut v: VolumeRecord = parse(&kv)?;
        f(&mut v)?;
        let t = Txn {
            compare: vec![Compare::ModRevision(
                volume_key(name),
                CmpOp::Equal,
                kv.mod_revision,
            )],
            success: vec![put(volume_key(name), json(&v))],
            failure: vec![],
        };
        if store.txn(t)?.succeeded {
            return Ok(v);
        }
    }
    Err(MetaError::Unavailable(
        "volume update kept losing races".into(),
    ))
}

/// Removes the volume's record if it is still the one with id `id`.
pub fn remove_volume(store: &dyn MetaStore, name: &str, id: u64) -> Result<()> {
    // Already gone: the sweep finished the delete (ids are never reused,
    // so a volume created since under the name is found below).
    let Some(kv) = store.get(&volume_key(name))? else {
        return Ok(());
    };
    let v: VolumeRecord = parse(&kv)?;
    if v.id != id {
        return Err(MetaError::Invalid(format!(
            "volume {name:?} was replaced meanwhile"
        )));
    }
    let t = Txn {
        compare: vec![Compare::ModRevision(
            volume_key(name),
            CmpOp::Equal,
            kv.mod_revision,
        )],
        success: vec![TxnOp::Delete(Range::key(&volume_key(name)))],
        failure: vec![],
    };
    if !store.txn(t)?.succeeded {
        return Err(MetaError::Unavailable(
            "volume changed during delete; retry".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state with `ids` down.
    fn down(ids: &[u32]) -> ClusterState {
        ClusterState {
            down: ids.to_vec(),
            ..ClusterState::default()
        }
    }
    use crate::embedded::Embedded;

    /// Temporary members follow placement's OSDs in the acting set, count
    /// while up, and keep the PG from being whole.
    #[test]
    fn temporary_members_join_the_acting_set_after_placement() {
        let mut m = PgTable {
            pool: 1,
            size: 2,
            osds: vec![0, 1, 2, 3],
            lead: Vec::new(),
            temp: BTreeMap::new(),
        };
        assert!(m.whole(0, &[]) && m.whole(1, &[]));
        m.temp.insert(0, vec![4, 1]);
        assert_eq!(
            m.acting(0, &[]),
            vec![0, 1, 4],
            "placement first, no repeat"
        );
        assert!(!m.whole(0, &[]) && m.whole(1, &[]));
        assert!(m.assigned(0, 4) && m.is_acting(0, 4, &[]) && !m.assigned(1, 4));
        assert_eq!(m.acting(0, &[4]), vec![0, 1]);
        assert!(m.whole(0, &[4]), "a temporary member down is no member");
        assert!(m.assigned(0, 4) && !m.is_acting(0, 4, &[4]));
        assert_eq!(
            (m.acting(0, &[0, 1]), m.primary(0, &down(&[0, 1]))),
            (vec![4], Some(4))
        );
        assert!(!m.whole(0, &[1]));
        assert!(m.knows(4) && m.knows(3) && !m.knows(5));
    }

    fn osds(n: u32) -> Vec<OsdRecord> {
        (0..n)
            .map(|id| OsdRecord {
                id,
                addr: format!("unix:/tmp/osd.{id}.sock"),
                host: "h".into(),
                rack: "r".into(),
                weight: 4,
                pg_logs: 0,
                store: String::new(),
                removed: false,
            })
            .collect()
    }

    fn pool() -> PoolRecord {
        PoolRecord {
            id: 1,
            name: "rbd".into(),
            size: 3,
            min_size: 2,
            pg_count: 64,
            failure_domain: "osd".into(),
            object_bytes: 128 << 10,
            ec: None,
        }
    }

    /// Only what changed is stored: a PG event writes one key, the cluster
    /// state and tables only when they change; `None` reads what is stored
    /// and writes the difference; a removed pool's keys go.
    /// Scrub stamps update by CAS and read back; a record that does not
    /// parse (or a key that names no PG) is skipped by the reader and
    /// overwritten by the next update, harming no other stamp.
    #[test]
    fn scrub_stamps_read_back_and_a_bad_one_is_skipped_then_rewritten() {
        let d = tempfile::tempdir().unwrap();
        let s = Embedded::open(d.path()).unwrap();
        let (a, b) = (PgId::new(1, 2), PgId::new(1, 3));
        let set = |st: &mut ScrubStamp| {
            st.light_unix_s = 100;
            true
        };
        update_scrub_stamp(&*s, a, set).unwrap();
        s.put(&scrub_key(b), b"{not json".to_vec(), 0).unwrap();
        s.put(&format!("{SCRUB_PREFIX}junk"), b"{}".to_vec(), 0)
            .unwrap();
        let got = scrub_stamps(&*s).unwrap();
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![a]);
        assert_eq!(got[&a].light_unix_s, 100);
        let st = update_scrub_stamp(&*s, b, set).unwrap();
        assert_eq!(st.light_unix_s, 100);
        assert_eq!(scrub_stamps(&*s).unwrap().len(), 2);
        // `f` declining leaves it as it is.
        let st = update_scrub_stamp(&*s, a, |st| {
            st.light_unix_s = 7;
            false
        })
        .unwrap();
        assert_eq!(
            (st.light_unix_s, scrub_stamps(&*s).unwrap()[&a].light_unix_s),
            (7, 100)
        );
    }

    #[test]
    fn the_map_is_saved_by_difference_and_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let s = Embedded::open(d.path()).unwrap();
        init(&*s, &osds(4), &pool()).unwrap();
        let iv = |epoch| Interval {
            epoch,
            acting: vec![0, 1, 2],
            ..Interval::default()
        };
        let state = load(&*s).unwrap().state;
        let mut pools = load_pools(&*s).unwrap();
        assert_eq!(state.epoch, 1);
        assert!(pools[&1].last_active.is_empty());
        let p = pools.get_mut(&1).unwrap();
        p.last_active.insert(3, iv(2));
        p.last_active.insert(7, iv(2));
        save_map(&*s, &state, &pools, None, &[]).unwrap();
        assert_eq!(load_pools(&*s).unwrap(), pools);
        let mut p2 = pools.clone();
        let p = p2.get_mut(&1).unwrap();
        p.last_active.insert(7, iv(5));
        p.last_active.remove(&3);
        p.last_active.insert(9, iv(5));
        let rev = s.range(&Range::prefix("/")).unwrap().1;
        let table = s.get(&table_key(1)).unwrap().unwrap().version;
        let st = s.get(STATE_KEY).unwrap().unwrap().version;
        save_map(&*s, &state, &p2, Some((&state, &pools)), &[]).unwrap();
        assert_eq!(load_pools(&*s).unwrap(), p2);
        // One transaction; the table and the state (unchanged) not written.
        assert_eq!(s.range(&Range::prefix("/")).unwrap().1, rev + 1);
        assert_eq!(s.get(&table_key(1)).unwrap().unwrap().version, table);
        assert_eq!(s.get(STATE_KEY).unwrap().unwrap().version, st);
        save_map(&*s, &state, &p2, Some((&state, &p2)), &[]).unwrap();
        assert_eq!(
            s.range(&Range::prefix("/")).unwrap().1,
            rev + 1,
            "nothing changed"
        );
        // A new epoch with osd.3 down, read back.
        let next = ClusterState {
            epoch: 2,
            down: vec![3],
            ..ClusterState::default()
        };
        save_map(&*s, &next, &p2, None, &[]).unwrap();
        assert_eq!(load(&*s).unwrap().state, next);
        assert_eq!(s.get(&table_key(1)).unwrap().unwrap().version, table);
        // A second pool, then the first removed: its keys go.
        let mut p3 = p2.clone();
        let mut two = p2[&1].clone();
        two.record.id = 2;
        two.record.name = "two".into();
        two.table.pool = 2;
        p3.insert(2, two);
        save_map(&*s, &next, &p3, Some((&next, &p2)), &[]).unwrap();
        assert_eq!(load_pools(&*s).unwrap(), p3);
        // A pool the leader does not know (none before it) is kept...
        save_map(&*s, &next, &p2, None, &[]).unwrap();
        assert_eq!(load_pools(&*s).unwrap(), p3);
        // ... one it knew and dropped goes.
        let all = p3.clone();
        p3.remove(&1);
        save_map(&*s, &next, &p3, Some((&next, &all)), &[]).unwrap();
        assert_eq!(load_pools(&*s).unwrap(), p3);
        assert!(s
            .range(&Range::prefix(&interval_prefix(1)))
            .unwrap()
            .0
            .is_empty());
        assert!(s.get(&table_key(1)).unwrap().is_none());
        // A map of an earlier build is refused, not misread.
        s.put("/nacre/pgmap/00001", b"{}".to_vec(), 0).unwrap();
        assert!(matches!(load(&*s), Err(MetaError::Storage(e)) if e.contains("earlier build")));
    }

    /// A store that takes at most `max` operations per transaction, as
    /// etcd does.
    struct Narrow {
        inner: std::sync::Arc<Embedded>,
        max: usize,
        txns: std::sync::atomic::AtomicUsize,
        /// Transactions taken before the store stops answering.
        fail_after: usize,
    }

    impl MetaStore for Narrow {
        fn range(&self, r: &Range) -> Result<(Vec<KeyValue>, crate::Revision)> {
            self.inner.range(r)
        }
        fn txn(&self, t: Txn) -> Result<crate::TxnResponse> {
            assert!(t.success.len() <= self.max, "{} ops", t.success.len());
            let n = self.txns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n >= self.fail_after {
                return Err(MetaError::Unavailable("cut".into()));
            }
            self.inner.txn(t)
        }
        fn watch(&self, r: &Range, start: crate::Revision) -> Result<crate::Watch> {
            self.inner.watch(r, start)
        }
        fn lease_grant(&self, ttl_s: i64) -> Result<crate::LeaseId> {
            self.inner.lease_grant(ttl_s)
        }
        fn lease_keepalive(&self, id: crate::LeaseId) -> Result<i64> {
            self.inner.lease_keepalive(id)
        }
        fn lease_revoke(&self, id: crate::LeaseId) -> Result<()> {
            self.inner.lease_revoke(id)
        }
        fn txn_ops_max(&self) -> usize {
            self.max
        }
    }

    /// A leader that no longer holds its election key stores nothing; a
    /// store with a small transaction limit gets the change in pieces, the
    /// PG table and cluster state last, together.
    #[test]
    fn a_fenced_save_stores_nothing_and_a_narrow_store_gets_pieces() {
        let d = tempfile::tempdir().unwrap();
        let inner = Embedded::open(d.path()).unwrap();
        init(&*inner, &osds(4), &pool()).unwrap();
        let s = Narrow {
            inner,
            max: 6,
            txns: 0.into(),
            fail_after: usize::MAX,
        };
        let state = load(&s).unwrap().state;
        let pools = load_pools(&s).unwrap();
        let mut next_pools = pools.clone();
        for p in 0..12 {
            next_pools.get_mut(&1).unwrap().last_active.insert(
                p,
                Interval {
                    epoch: 2,
                    acting: vec![0, 1, 2],
                    ..Interval::default()
                },
            );
        }
        next_pools
            .get_mut(&1)
            .unwrap()
            .table
            .temp
            .insert(0, vec![3]);
        let next = ClusterState {
            epoch: 2,
            ..state.clone()
        };
        s.put(MON_LEADER_KEY, b"tcp:a:1 x".to_vec(), 0).unwrap();
        let fence = |v: &[u8]| {
            vec![Compare::Value(
                MON_LEADER_KEY.into(),
                CmpOp::Equal,
                v.to_vec(),
            )]
        };
        let prev = Some((&state, &pools));
        // Another leader's key: nothing is written.
        assert!(matches!(
            save_map(&s, &next, &next_pools, prev, &fence(b"tcp:b:1 y")),
            Err(MetaError::NotLeader)
        ));
        assert_eq!(load_pools(&s).unwrap(), pools);
        assert_eq!(load(&s).unwrap().epoch(), 1);
        // Its own: 12 intervals, then the table and state together: 3
        // transactions of <= 6.
        let before = s.txns.load(std::sync::atomic::Ordering::Relaxed);
        save_map(&s, &next, &next_pools, prev, &fence(b"tcp:a:1 x")).unwrap();
        assert_eq!(
            s.txns.load(std::sync::atomic::Ordering::Relaxed) - before,
            3
        );
        assert_eq!(load_pools(&s).unwrap(), next_pools);
        assert_eq!(load(&s).unwrap().epoch(), 2);
        assert_eq!(leader_addr_of(b"tcp:a:1 x").as_deref(), Some("tcp:a:1"));
    }

    /// More pools changing than one transaction takes: whatever prefix of
    /// the change is stored when the store stops answering, the map loads
    /// (a new pool's table goes before its record, a removed one's record
    /// first), and the whole change lands when none is cut.
    #[test]
    fn a_change_cut_anywhere_leaves_a_map_that_loads() {
        for cut in 0..8 {
            let d = tempfile::tempdir().unwrap();
            let inner = Embedded::open(d.path()).unwrap();
            init(&*inner, &osds(4), &pool()).unwrap();
            let s = Narrow {
                inner,
                max: 7,
                txns: 0.into(),
                fail_after: usize::MAX,
            };
            let state = load(&s).unwrap().state;
            let pools = load_pools(&s).unwrap();
            // Pool 1 goes, pools 2..=5 come: 12 operations in pieces of 7,
            // one cut between a table and its record.
            let mut next_pools = BTreeMap::new();
            for id in 2..=5 {
                let mut p = pools[&1].clone();
                p.record.id = id;
                p.record.name = format!("p{id}");
                p.table.pool = id;
                next_pools.insert(id, p);
            }
            let next = ClusterState {
                epoch: 2,
                out: vec![3],
                ..state.clone()
            };
            let before = s.txns.load(std::sync::atomic::Ordering::Relaxed);
            let s = Narrow {
                fail_after: before + cut,
                ..s
            };
            let r = save_map(&s, &next, &next_pools, Some((&state, &pools)), &[]);
            let got = load_pools(&*s.inner).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
            let got_state = load(&*s.inner).unwrap().state;
            if r.is_ok() {
                assert_eq!((got, got_state), (next_pools.clone(), next.clone()));
            } else {
                assert!(got.keys().all(|id| *id <= 5), "cut {cut}: {got:?}");
                assert!(got_state == state || got_state == next, "cut {cut}");
            }
        }
    }

    /// A pool marked for removal takes no new volume (and one with a
    /// volume is not marked); a removed pool's keys go even from a save
    /// that read the store first; another size keeps each PG's first
    /// members.
    #[test]
    fn pools_are_removed_whole_and_resized_in_place() {
        let d = tempfile::tempdir().unwrap();
        let s = Embedded::open(d.path()).unwrap();
        init(&*s, &osds(5), &pool()).unwrap();
        create_volume(&*s, "v", &pool(), 1 << 20).unwrap();
        assert_eq!(mark_pool_removing(&*s, 1).unwrap(), vec!["v".to_string()]);
        create_volume(&*s, "w", &pool(), 1 << 20).unwrap();
        for name in ["v", "w"] {
            let id = get_volume(&*s, name).unwrap().unwrap().id;
            remove_volume(&*s, name, id).unwrap();
        }
        assert!(mark_pool_removing(&*s, 1).unwrap().is_empty());
        assert!(create_volume(&*s, "x", &pool(), 1 << 20).is_err());
        // The leader dropped it, and its save was cut: the next one, from
        // what is stored, deletes it.
        let mut state = load(&*s).unwrap().state;
        state.removed_pools.push(1);
        save_map(&*s, &state, &BTreeMap::new(), None, &[]).unwrap();
        assert!(load_pools(&*s).unwrap().is_empty());
        assert!(s.get(&table_key(1)).unwrap().is_none());
        assert!(s.get(&removing_key(1)).unwrap().is_none());
        // 3 copies → 4 and → 2: every PG keeps its first members.
        let t = place(&osds(5), &pool(), &[], None).unwrap().osds;
        for size in [4, 2] {
            let p = PoolRecord {
                size,
                min_size: 2,
                ..pool()
            };
            let n = place(
                &osds(5),
                &p,
                &[],
                Some(&PgTable {
                    pool: 1,
                    size: 3,
                    osds: t.clone(),
                    lead: Vec::new(),
                    temp: BTreeMap::new(),
                }),
            )
            .unwrap()
            .osds;
            let kept = |pg: usize| {
                let (old, new) = (
                    &t[pg * 3..pg * 3 + 3],
                    &n[pg * size as usize..][..size as usize],
                );
                old.iter().filter(|o| new.contains(o)).count()
            };
            let kept: usize = (0..64).map(kept).sum();
            // (Laid out from scratch, 155 and 78 of them stay.)
            let all = 64 * usize::from(size.min(3));
            assert!(
                kept + 6 >= all,
                "{size} copies: {kept} of the old members kept"
            );
        }
    }

    #[test]
    fn init_load_and_volumes() {
        let d = tempfile::tempdir().unwrap();
        let s = Embedded::open(d.path()).unwrap();
        assert!(!initialised(&*s).unwrap());
        let pg = init(&*s, &osds(4), &pool()).unwrap();
        assert!(init(&*s, &osds(4), &pool()).is_err());
        let m = load(&*s).unwrap();
        assert_eq!(m.osds.len(), 4);
        assert_eq!(m.table(1).unwrap(), &pg);
        for p in 0..pg.pg_count() {
            let a = pg.acting(p, &[]);
            assert_eq!(a.len(), 3);
            assert!(a[0] != a[1] && a[1] != a[2] && a[0] != a[2]);
            assert!(a.iter().all(|&o| pg.is_acting(p, o, &[])));
            assert!(!pg.is_acting(p, a[0], &[a[0]]) && pg.primary(p, &down(&[a[0]])) == Some(a[1]));
        }
        let v = create_volume(&*s, "vm-1", &pool(), 1 << 30).unwrap();
        let w = create_volume(&*s, "vm-2", &pool(), 1 << 30).unwrap();
        assert_ne!(v.id, w.id);
        // Ids carry the pool, serials count up from 1.
        assert_eq!((VolumeId(v.id).pool(), VolumeId(v.id).serial()), (1, 1));
        assert_eq!(last_volume_id(&*s).unwrap(), 2);
        assert!(create_volume(&*s, "vm-1", &pool(), 1).is_err());
        assert!(create_volume(&*s, "../x", &pool(), 1).is_err());
        assert!(create_volume(&*s, "", &pool(), 1).is_err());
        let r = update_volume(&*s, "vm-1", |v| {
            v.size_bytes = 2 << 30;
            Ok(())
        })
        .unwrap();
        assert_eq!(
            get_volume(&*s, "vm-1").unwrap().unwrap().size_bytes,
            r.size_bytes
        );
        assert!(remove_volume(&*s, "vm-1", w.id).is_err());
        remove_volume(&*s, "vm-1", v.id).unwrap();
        assert_eq!(list_volumes(&*s).unwrap().len(), 1);
        // ids are never reused
        let x = create_volume(&*s, "vm-1", &pool(), 1).unwrap();
        assert!(x.id > w.id);
        let bad = PoolRecord {
            min_size: 4,
            ..pool()
        };
        let d2 = tempfile::tempdir().unwrap();
        let s2 = Embedded::open(d2.path()).unwrap();
        assert!(init(&*s2, &osds(4), &bad).is_err());
        assert!(
            init(&*s2, &osds(2), &pool()).is_err(),
            "3 replicas need 3 OSDs"
        );
    }

    fn ec_pool(k: u8, m: u8) -> PoolRecord {
        PoolRecord {
            name: "ec".into(),
            size: k + m,
            min_size: k + 1,
            object_bytes: u32::from(k) * (128 << 10),
            ec: Some(EcScheme { k, m }),
            ..pool()
        }
    }

    /// An erasure-coded pool's record: a scheme within the codec's bounds,
    /// `k + m` shards, `k <= min_size`, objects of `k` store blocks.
    #[test]
    fn ec_pools_are_checked() {
        for (k, m) in [(2, 1), (4, 2), (6, 3), (16, 4)] {
            check_pool(&ec_pool(k, m)).unwrap();
        }
        let bad = |p: PoolRecord| check_pool(&p).unwrap_err().to_string();
        assert!(bad(ec_pool(1, 2)).contains("K must be within 2..=16"));
        assert!(bad(ec_pool(4, 5)).contains("M within 1..=4"));
        assert!(bad(PoolRecord {
            size: 5,
            ..ec_pool(4, 2)
        })
        .contains("6 shards"));
        assert!(bad(PoolRecord {
            min_size: 3,
            ..ec_pool(4, 2)
        })
        .contains("k <= min_size"));
        check_pool(&PoolRecord {
            min_size: 4,
            ..ec_pool(4, 2)
        })
        .unwrap();
        let odd = PoolRecord {
            object_bytes: (512 << 10) + 2,
            ..ec_pool(4, 2)
        };
        assert!(bad(odd).contains("do not split"));
        let unaligned = PoolRecord {
            object_bytes: 3 * (128 << 10),
            ..ec_pool(4, 2)
        };
        assert!(bad(unaligned).contains("power of two"));
        // 8 × 1 MiB shards: objects past what a frame carries.
        let huge = PoolRecord {
            object_bytes: 8 << 20,
            ..ec_pool(8, 2)
        };
        let e = bad(huge);
        assert!(e.contains("more than 4194304"), "{e}");
        assert_eq!(ec_pool(4, 2).shard_bytes(), 128 << 10);
        assert_eq!(ec_pool(4, 2).scheme(), "EC 4+2");
        assert!((ec_pool(4, 2).data_fraction() - 4.0 / 6.0).abs() < 1e-9);
        assert!((pool().data_fraction() - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!("4+2".parse::<EcScheme>(), Ok(EcScheme { k: 4, m: 2 }));
        for s in ["4-2", "4+", "+2", "1+1", "17+1", "4+0", "a+b", ""] {
            assert!(s.parse::<EcScheme>().is_err(), "{s:?}");
        }
    }

    /// An erasure-coded pool's table keeps its rows in slot order and names
    /// each PG's primary slot; the primary is the first member up from it,
    /// round the row. A table stored before leads existed reads back
    /// without them.
    #[test]
    fn an_ec_pools_primary_comes_from_its_lead_slot() {
        let p = ec_pool(4, 2);
        let t = PgTable::new(p.id, p.size, place(&osds(8), &p, &[], None).unwrap());
        assert_eq!(t.lead.len(), 64);
        let mut leads = std::collections::BTreeSet::new();
        for pg in 0..64 {
            let (row, lead) = (t.placement(pg).to_vec(), usize::from(t.lead[pg as usize]));
            leads.insert(lead);
            assert_eq!(t.primary(pg, &down(&[])), Some(row[lead]));
            let next = row[(lead + 1) % 6];
            assert_eq!(t.primary(pg, &down(&[row[lead]])), Some(next));
            assert_eq!(t.primary(pg, &down(&row)), None);
            // A demoted member leads only when every member up is.
            let slow = |d: &[u32]| ClusterState {
                demoted: d.to_vec(),
                ..ClusterState::default()
            };
            assert_eq!(t.primary(pg, &slow(&[row[lead]])), Some(next));
            assert_eq!(t.primary(pg, &slow(&row[..5])), Some(row[5]));
            assert_eq!(t.primary(pg, &slow(&row)), Some(row[lead]));
        }
        assert!(leads.len() > 1, "every PG led from one slot: {leads:?}");
        // Stored beside a replicated pool, and read back as it was.
        let d = tempfile::tempdir().unwrap();
        let s = Embedded::open(d.path()).unwrap();
        init(&*s, &osds(8), &pool()).unwrap();
        let made = create_pool(&*s, &p).unwrap();
        assert_eq!(made.record.ec, p.ec);
        let m = load(&*s).unwrap();
        assert_eq!(m.pool_named(&p.name).unwrap().ec, p.ec);
        assert_eq!(m.table(made.record.id).unwrap().lead.len(), 64);
        let old = r#"{"pool":1,"size":2,"osds":[0,1,1,0]}"#;
        let t: PgTable = serde_json::from_str(old).unwrap();
        assert!(t.lead.is_empty());
        assert_eq!(t.primary(1, &down(&[])), Some(1));
        let rec: PoolRecord =
            serde_json::from_str(&serde_json::to_string(&pool()).unwrap()).unwrap();
        assert_eq!(rec.ec, None);
        assert!(!serde_json::to_string(&pool()).unwrap().contains("\"ec\""));
    }
}
