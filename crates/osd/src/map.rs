//! What the leader tells the OSDs (and the simulator's clients) of the
//! cluster: the epoch with the OSDs down and out, every pool with its PG
//! table and per PG the last interval that went active, and when each up
//! OSD came up. Sent as JSON in `Boot`/`GetMap` replies and `Map` pushes.

use std::collections::BTreeMap;

use nacre_io::net::Addr;
use nacre_meta::map::{ClusterState, Interval, PgTable, PoolRecord, PoolState};
use nacre_types::{ObjectId, PgId};
use serde::{Deserialize, Serialize};

/// The cluster map at one epoch, as an OSD uses it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdMap {
    /// The epoch and the OSDs down and out in it.
    pub cluster: ClusterState,
    pub pools: BTreeMap<u32, PoolState>,
    /// Every OSD's wire address (`unix:PATH`, `tcp:HOST:PORT`).
    pub addrs: BTreeMap<u32, String>,
    /// Up OSDs and the epoch each came up in (`up_from`): an incarnation
    /// acts only in epochs from there on.
    pub up_from: BTreeMap<u32, u64>,
    /// The store each OSD booted with since the leader started (its uuid,
    /// in hex): a member of an interval counts only with the same store.
    pub stores: BTreeMap<u32, String>,
    /// OSDs whose stores are full, as their heartbeats say: primaries
    /// refuse writes of new objects to their PGs up front (`NoSpace`)
    /// instead of failing them on that copy, which would end the interval.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub full: std::collections::BTreeSet<u32>,
}

impl OsdMap {
    pub fn epoch(&self) -> u64 {
        self.cluster.epoch
    }

    pub fn table(&self, pool: u32) -> Option<&PgTable> {
        Some(&self.pools.get(&pool)?.table)
    }

    /// Whether `pg` is a PG of this map (its pool exists and has it).
    pub fn has(&self, pg: PgId) -> bool {
        self.table(pg.pool).is_some_and(|t| pg.pg < t.pg_count())
    }

    /// Every PG of every pool.
    pub fn pgs(&self) -> impl Iterator<Item = PgId> + '_ {
        (self.pools.iter()).flat_map(|(id, p)| (0..p.table.pg_count()).map(|pg| PgId::new(*id, pg)))
    }

    /// The PG of `oid`, if its pool is in the map.
    pub fn pg_of(&self, oid: ObjectId) -> Option<PgId> {
        Some(PgId::of(oid, self.table(oid.pool())?.pg_count()))
    }

    /// PG `pg`'s table, if `pg` is a PG of this map.
    fn table_of(&self, pg: PgId) -> Option<&PgTable> {
        self.table(pg.pool).filter(|t| pg.pg < t.pg_count())
    }

    /// The acting set (empty for a PG not in the map).
    pub fn acting(&self, pg: PgId) -> Vec<u32> {
        (self.table_of(pg)).map_or(Vec::new(), |t| t.acting(pg.pg, &self.cluster.down))
    }

    pub fn primary(&self, pg: PgId) -> Option<u32> {
        self.table_of(pg)?.primary(pg.pg, &self.cluster)
    }

    pub fn is_acting(&self, pg: PgId, osd: u32) -> bool {
        (self.table_of(pg)).is_some_and(|t| t.is_acting(pg.pg, osd, &self.cluster.down))
    }

    /// Whether placement or a temporary membership gives `pg` to `osd`.
    pub fn assigned(&self, pg: PgId, osd: u32) -> bool {
        self.table_of(pg).is_some_and(|t| t.assigned(pg.pg, osd))
    }

    /// Whether `pg`'s acting set is its placement, whole.
    pub fn whole(&self, pg: PgId) -> bool {
        (self.table_of(pg)).is_some_and(|t| t.whole(pg.pg, &self.cluster.down))
    }

    /// The OSDs placement gives `pg`, up or not.
    pub fn placement(&self, pg: PgId) -> &[u32] {
        self.table_of(pg).map_or(&[], |t| t.placement(pg.pg))
    }

    /// PGs of `pool` (0: no such pool).
    pub fn pg_count(&self, pool: u32) -> u32 {
        self.table(pool).map_or(0, |t| t.pg_count())
    }

    /// Copies a PG of `pool` keeps (0: no such pool).
    pub fn size(&self, pool: u32) -> u8 {
        self.pools.get(&pool).map_or(0, |p| p.table.size)
    }

    /// Fewest copies a PG of `pool` may be active with.
    pub fn min_size(&self, pool: u32) -> u8 {
        self.pools.get(&pool).map_or(0, |p| p.record.min_size)
    }

    pub fn last_active(&self, pg: PgId) -> Option<&Interval> {
        self.pools.get(&pg.pool)?.last_active.get(&pg.pg)
    }

    pub fn is_up(&self, osd: u32) -> bool {
        self.up_from.contains_key(&osd)
    }

    /// Whether OSD `osd` is up with the store it had in `interval`.
    pub fn holds(&self, interval: &Interval, osd: u32) -> bool {
        self.is_up(osd) && interval.holds(osd, self.stores.get(&osd))
    }

    pub fn addr(&self, osd: u32) -> Option<Addr> {
        self.addrs.get(&osd)?.parse().ok()
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("maps serialise")
    }

    /// Parses a map from a peer, checking that it is whole: per pool a PG
    /// table of `size` OSDs per PG as its record says, every OSD it names
    /// with an address.
    pub fn from_json(b: &[u8]) -> Result<OsdMap, String> {
        let m: OsdMap = serde_json::from_slice(b).map_err(|e| format!("map: {e}"))?;
        if m.epoch() > nacre_meta::map::EPOCH_MAX {
            return Err(format!("map: epoch {} is past the last one", m.epoch()));
        }
        for (id, p) in &m.pools {
            m.check_pool(*id, p)
                .map_err(|e| format!("map: pool {id}: {e}"))?;
        }
        if let Some(o) = m.up_from.keys().find(|o| !m.stores.contains_key(o)) {
            return Err(format!("map: osd.{o} is up with no store"));
        }
        Ok(m)
    }

    fn check_pool(&self, id: u32, p: &PoolState) -> Result<(), String> {
        let (r, t) = (&p.record, &p.table);
        if r.id != id || t.pool != id {
            return Err(format!(
                "record of pool {} and table of pool {}",
                r.id, t.pool
            ));
        }
        nacre_meta::map::check_pool(r).map_err(|e| e.to_string())?;
        if t.size != r.size || t.osds.len() != r.pg_count as usize * r.size as usize {
            return Err(format!(
                "a PG table of {} entries for {} PGs of size {}",
                t.osds.len(),
                r.pg_count,
                r.size
            ));
        }
        if let Some(o) = t.osds.iter().find(|o| self.addr(**o).is_none()) {
            return Err(format!("osd.{o} has no valid address"));
        }
        if let Some((pg, v)) = (t.temp.iter()).find(|(pg, v)| {
            **pg >= t.pg_count() || v.is_empty() || v.iter().any(|o| self.addr(*o).is_none())
        }) {
            return Err(format!("PG {pg} has temporary members {v:?}"));
        }
        if let Some(pg) = p.last_active.keys().find(|pg| **pg >= t.pg_count()) {
            return Err(format!("an interval of PG {pg}, past the table"));
        }
        // An erasure-coded pool's table names each PG's lead slot; a
        // replicated one's none.
        let leads = if r.ec.is_some() {
            r.pg_count as usize
        } else {
            0
        };
        if t.lead.len() != leads || t.lead.iter().any(|&s| s >= t.size) {
            return Err(format!(
                "{} lead slots for {leads} PGs of size {}",
                t.lead.len(),
                t.size
            ));
        }
        Ok(())
    }
}

/// What an admin asks the leader to do to the pools (`Op::PoolChange`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolChange {
    /// A new pool, its id already taken from the meta store's counter
    /// (ids are never given twice): placed over the OSDs that are in.
    Create(PoolRecord),
    /// Pool `id` keeps `size` copies (a new table: the PGs move, keeping
    /// their complete copies as temporary members meanwhile) and is
    /// active with `min_size`; `None` leaves one as it is.
    Set {
        id: u32,
        size: Option<u8>,
        min_size: Option<u8>,
    },
    /// Pool `id` goes (its volumes gone first): its PGs stop, and every
    /// OSD deletes what it holds of it.
    Remove { id: u32 },
}

/// What a primary tells the leader about one of its PGs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PgEvent {
    /// Peering finished: every member of the acting set holds the
    /// authoritative history, except those in `incomplete`, which the
    /// primary recovers in the background (it reports again, with fewer,
    /// as they finish); `clean` if the set is whole (`size` OSDs) and
    /// complete. The leader records the interval before the primary takes
    /// writes.
    Active {
        clean: bool,
        #[serde(default)]
        incomplete: Vec<u32>,
        /// The OSDs that answered this epoch's peering (in this epoch, so
        /// they serve no read of an older one); empty when reporting again.
        #[serde(default)]
        heard: Vec<u32>,
    },
    /// A write failed on some copy: the copies may differ, so the interval
    /// must end (a new epoch) and the PG peer again.
    Failed { why: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> OsdMap {
        let record = nacre_meta::map::PoolRecord {
            id: 1,
            name: "rbd".into(),
            size: 2,
            min_size: 1,
            pg_count: 2,
            failure_domain: "osd".into(),
            object_bytes: 4096,
            ec: None,
        };
        let table = PgTable::new(
            1,
            2,
            nacre_meta::map::Placed {
                osds: vec![0, 1, 1, 0],
                lead: Vec::new(),
            },
        );
        OsdMap {
            cluster: ClusterState {
                epoch: 5,
                ..ClusterState::default()
            },
            pools: [(
                1,
                PoolState {
                    record,
                    table,
                    last_active: Default::default(),
                },
            )]
            .into(),
            addrs: [(0, "unix:/tmp/a".into()), (1, "unix:/tmp/b".into())].into(),
            up_from: [(0, 3)].into(),
            stores: [(0, "00".repeat(16))].into(),
            full: Default::default(),
        }
    }

    fn pool(m: &mut OsdMap) -> &mut PoolState {
        m.pools.get_mut(&1).unwrap()
    }

    /// A map from a peer is taken only whole and possible.
    #[test]
    fn maps_roundtrip_and_bad_ones_are_refused() {
        let m = map();
        assert_eq!(OsdMap::from_json(&m.to_json()).unwrap(), m);
        assert!(OsdMap::from_json(b"{").is_err());
        let bad = |f: fn(&mut OsdMap)| {
            let mut m = map();
            f(&mut m);
            OsdMap::from_json(&m.to_json()).unwrap_err()
        };
        assert!(bad(|m| pool(m).table.osds.push(0)).contains("PG table"));
        assert!(bad(|m| pool(m).table.size = 0).contains("PG table"));
        assert!(bad(|m| pool(m).record.pg_count = 3).contains("PG table"));
        assert!(bad(|m| pool(m).table.pool = 2).contains("table of pool 2"));
        assert!(bad(|m| {
            m.addrs.remove(&1);
        })
        .contains("osd.1"));
        assert!(bad(|m| m.addrs.insert(1, "nowhere".into()).map_or((), |_| ())).contains("osd.1"));
        assert!(bad(|m| pool(m).record.min_size = 3).contains("min_size"));
        // Lead slots only in an erasure-coded pool's table, one per PG,
        // inside the row.
        assert!(bad(|m| pool(m).table.lead = vec![0, 1]).contains("lead slots"));
        let ec = |m: &mut OsdMap| {
            let p = pool(m);
            p.record.ec = Some(nacre_meta::map::EcScheme { k: 2, m: 0 });
        };
        assert!(bad(ec).contains("M within"));
        fn ec21(m: &mut OsdMap, lead: Vec<u8>) {
            let p = pool(m);
            p.record = nacre_meta::map::PoolRecord {
                size: 3,
                min_size: 2,
                object_bytes: 8192,
                ec: Some(nacre_meta::map::EcScheme { k: 2, m: 1 }),
                ..p.record.clone()
            };
            p.table.size = 3;
            p.table.osds = vec![0, 1, 0, 1, 0, 1];
            p.table.lead = lead;
        }
        assert!(bad(|m| ec21(m, vec![0])).contains("lead slots"));
        assert!(bad(|m| ec21(m, vec![0, 3])).contains("lead slots"));
        assert!(bad(|m| {
            pool(m).table.temp.insert(2, vec![0]);
        })
        .contains("PG 2"));
        assert!(bad(|m| {
            pool(m).table.temp.insert(0, vec![7]);
        })
        .contains("temporary"));
        assert!(bad(|m| {
            pool(m).last_active.insert(2, Interval::default());
        })
        .contains("PG 2"));
        let mut ok = map();
        pool(&mut ok).table.temp.insert(1, vec![0]);
        assert_eq!(OsdMap::from_json(&ok.to_json()).unwrap(), ok);
        assert!(bad(|m| m.cluster.epoch = u64::MAX).contains("epoch"));
        assert!(bad(|m| {
            m.stores.clear();
        })
        .contains("no store"));
        // Routing by PG id: a PG of another pool, or past the table, has
        // no members.
        let m = map();
        assert_eq!(m.acting(PgId::new(1, 1)), vec![1, 0]);
        assert!(m.acting(PgId::new(2, 1)).is_empty() && m.acting(PgId::new(1, 2)).is_empty());
        assert_eq!(m.primary(PgId::new(1, 0)), Some(0));
        assert!(!m.has(PgId::new(1, 2)) && m.has(PgId::new(1, 1)));
        assert_eq!(m.pgs().count(), 2);
    }
}
