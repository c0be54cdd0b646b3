//! What the leader tells the OSDs (and the simulator's clients) of the
//! cluster: the PG table of the pool with the OSDs that are down, when
//! each up OSD came up, and per PG the last interval that went active.
//! Sent as JSON in `Boot`/`GetMap` replies and `Map` pushes.

use std::collections::BTreeMap;

use nacre_io::net::Addr;
use nacre_meta::map::{Interval, PgMap};
use serde::{Deserialize, Serialize};

/// The cluster map at one epoch, as an OSD uses it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdMap {
    pub pgmap: PgMap,
    /// Fewest copies a PG may be active with.
    pub min_size: u8,
    /// Every OSD's wire address (`unix:PATH`, `tcp:HOST:PORT`).
    pub addrs: BTreeMap<u32, String>,
    /// Up OSDs and the epoch each came up in (`up_from`): an incarnation
    /// acts only in epochs from there on.
    pub up_from: BTreeMap<u32, u64>,
    /// The store each OSD booted with since the leader started (its uuid,
    /// in hex): a member of an interval counts only with the same store.
    pub stores: BTreeMap<u32, String>,
    /// Per PG, the last interval that went active: peering needs an answer
    /// from one of its members (docs/internals/replication.md §5.3).
    pub last_active: BTreeMap<u32, Interval>,
    /// OSDs whose stores are full, as their heartbeats say: primaries
    /// refuse writes of new objects to their PGs up front (`NoSpace`)
    /// instead of failing them on that copy, which would end the interval.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub full: std::collections::BTreeSet<u32>,
}

impl OsdMap {
    pub fn epoch(&self) -> u64 {
        self.pgmap.epoch
    }

    pub fn acting(&self, pg: u32) -> Vec<u32> {
        self.pgmap.acting(pg)
    }

    pub fn primary(&self, pg: u32) -> Option<u32> {
        self.pgmap.primary(pg)
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

    /// Parses a map from a peer, checking that it is whole: a PG table of
    /// `size` OSDs per PG, every OSD it names with an address.
    pub fn from_json(b: &[u8]) -> Result<OsdMap, String> {
        let m: OsdMap = serde_json::from_slice(b).map_err(|e| format!("map: {e}"))?;
        let pm = &m.pgmap;
        if pm.size == 0 || pm.osds.is_empty() || !pm.osds.len().is_multiple_of(pm.size as usize) {
            return Err(format!(
                "map: a PG table of {} entries for size {}",
                pm.osds.len(),
                pm.size
            ));
        }
        if let Some(o) = pm.osds.iter().find(|o| m.addr(**o).is_none()) {
            return Err(format!("map: osd.{o} has no valid address"));
        }
        if m.epoch() > nacre_meta::map::EPOCH_MAX {
            return Err(format!("map: epoch {} is past the last one", m.epoch()));
        }
        if let Some((pg, t)) = (pm.temp.iter()).find(|(pg, t)| {
            **pg >= pm.pg_count() || t.is_empty() || t.iter().any(|o| m.addr(*o).is_none())
        }) {
            return Err(format!("map: PG {pg} has temporary members {t:?}"));
        }
        if m.min_size == 0 || m.min_size > pm.size {
            return Err(format!("map: min_size {} of size {}", m.min_size, pm.size));
        }
        if let Some(o) = m.up_from.keys().find(|o| !m.stores.contains_key(o)) {
            return Err(format!("map: osd.{o} is up with no store"));
        }
        Ok(m)
    }
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
    },
    /// A write failed on some copy: the copies may differ, so the interval
    /// must end (a new epoch) and the PG peer again.
    Failed { why: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> OsdMap {
        OsdMap {
            pgmap: PgMap {
                pool: 1,
                epoch: 5,
                size: 2,
                osds: vec![0, 1, 1, 0],
                down: vec![],
                out: vec![],
                temp: Default::default(),
            },
            min_size: 1,
            addrs: [(0, "unix:/tmp/a".into()), (1, "unix:/tmp/b".into())].into(),
            up_from: [(0, 3)].into(),
            stores: [(0, "00".repeat(16))].into(),
            last_active: Default::default(),
            full: Default::default(),
        }
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
        assert!(bad(|m| m.pgmap.osds.push(0)).contains("PG table"));
        assert!(bad(|m| m.pgmap.size = 0).contains("PG table"));
        assert!(bad(|m| {
            m.addrs.remove(&1);
        })
        .contains("osd.1"));
        assert!(bad(|m| m.addrs.insert(1, "nowhere".into()).map_or((), |_| ())).contains("osd.1"));
        assert!(bad(|m| m.min_size = 3).contains("min_size"));
        assert!(bad(|m| {
            m.pgmap.temp.insert(2, vec![0]);
        })
        .contains("PG 2"));
        assert!(bad(|m| {
            m.pgmap.temp.insert(0, vec![7]);
        })
        .contains("temporary"));
        let mut ok = map();
        ok.pgmap.temp.insert(1, vec![0]);
        assert_eq!(OsdMap::from_json(&ok.to_json()).unwrap(), ok);
        assert!(bad(|m| m.pgmap.epoch = u64::MAX).contains("epoch"));
        assert!(bad(|m| {
            m.stores.clear();
        })
        .contains("no store"));
    }
}
