use super::*;
use proptest::prelude::*;

fn cluster(hosts: &[(u32, Vec<u32>)]) -> Vec<Osd> {
    // (rack, weights of the host's OSDs) per host.
    let mut osds = Vec::new();
    for (h, (rack, ws)) in hosts.iter().enumerate() {
        for &w in ws {
            osds.push(Osd {
                id: osds.len() as u32,
                host: h as u32,
                rack: *rack,
                weight: w,
                up: true,
            });
        }
    }
    osds
}

fn topology() -> impl Strategy<Value = Vec<(u32, Vec<u32>)>> {
    prop::collection::vec((0u32..4, prop::collection::vec(1u32..5, 1..5)), 4..12)
}

/// Each OSD is primary of a share of the PGs within one
/// of its replicas' share of them.
fn check_primaries(t: &Table) -> Result<(), TestCaseError> {
    let counts = t.counts();
    let total: u64 = counts.values().sum();
    let mut prim: HashMap<u32, u64> = HashMap::new();
    for pg in 0..t.pgs() {
        *prim.entry(t.primary(pg)).or_default() += 1;
    }
    for (&o, &c) in &counts {
        let ideal = c as f64 * f64::from(t.pgs()) / total as f64;
        let p = prim.get(&o).copied().unwrap_or(0) as f64;
        prop_assert!(
            (p - ideal).abs() < 2.0,
            "osd {} is primary of {} PGs, its share is {:.1}",
            o,
            p,
            ideal
        );
    }
    Ok(())
}

/// Adds an OSD of weight `w` on host `host` (`add`), or loses OSD 0, and
/// places `pool` again from `before`.
fn add_or_lose(
    osds: &mut Vec<Osd>,
    add: bool,
    host: u32,
    w: u32,
    pool: &Pool,
    before: &Table,
) -> Result<Table, PlacementError> {
    if add {
        osds.push(Osd {
            id: osds.len() as u32,
            host,
            rack: host % 10,
            weight: w,
            up: true,
        });
    } else {
        osds[0].up = false;
    }
    place(osds, pool, Some(before))
}

fn check_domains(osds: &[Osd], pool: &Pool, t: &Table) -> Result<(), TestCaseError> {
    let by_id: HashMap<u32, &Osd> = osds.iter().map(|o| (o.id, o)).collect();
    for pg in 0..pool.pgs {
        let mut ds: Vec<u32> = t
            .pg(pg)
            .iter()
            .map(|id| domain_of(by_id[id], pool.domain))
            .collect();
        prop_assert!(t
            .pg(pg)
            .iter()
            .all(|id| by_id[id].up && by_id[id].weight > 0));
        ds.sort_unstable();
        ds.dedup();
        prop_assert_eq!(
            ds.len(),
            pool.size as usize,
            "PG {} shares a failure domain: {:?}",
            pg,
            t.pg(pg)
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn replicas_in_distinct_domains_and_balanced(hosts in topology(), pgs in 64u32..600, size in 1u8..4, dom in 0u8..2) {
        let osds = cluster(&hosts);
        let domain = if dom == 0 { FailureDomain::Osd } else { FailureDomain::Host };
        let pool = Pool { pgs, size, domain, positional: false };
        let t = place(&osds, &pool, None).unwrap();
        check_domains(&osds, &pool, &t)?;
        let target = targets(&osds, &pool);
        let counts = t.counts();
        let total: u64 = target.iter().sum();
        prop_assert_eq!(total, u64::from(pgs) * u64::from(size));
        for (i, o) in osds.iter().enumerate() {
            let c = *counts.get(&o.id).unwrap_or(&0) as i64;
            prop_assert!((c - target[i] as i64).abs() <= 1, "osd {} has {} replicas, target {}", o.id, c, target[i]);
        }
        check_primaries(&t)?;
    }

    #[test]
    fn primaries_stay_balanced_and_mostly_put_after_a_change(hosts in topology(), pgs in 128u32..600, w in 1u32..5) {
        let mut osds = cluster(&hosts);
        let pool = Pool { pgs, size: 3, domain: FailureDomain::Osd, positional: false };
        prop_assume!(osds.len() > 4);
        let before = place(&osds, &pool, None).unwrap();
        osds.push(Osd { id: osds.len() as u32, host: 99, rack: 9, weight: w, up: true });
        let after = place(&osds, &pool, Some(&before)).unwrap();
        check_primaries(&after)?;
        // Primaries change only where the new OSD took a replica (maybe
        // the primary's) or where balance hands it one; each hand-over may
        // shift others along its path (a loose bound: three per replica
        // the new OSD took).
        let kept = (0..pgs).filter(|&pg| after.primary(pg) == before.primary(pg)).count() as u32;
        let new_share = after.counts().get(&(osds.len() as u32 - 1)).copied().unwrap_or(0) as u32;
        prop_assert!(pgs - kept <= 3 * new_share + 3, "kept {} of {} primaries; the new OSD holds {}", kept, pgs, new_share);
    }

    /// Moves stay near the minimum the counts allow (`min_moves`, which
    /// ignores failure domains): evening counts out can take chains of
    /// moves where the freed slots sit in PGs the OSDs short of replicas
    /// already hold, hence half again, not a quarter (seen: 104 for a
    /// minimum of 80).
    #[test]
    fn adding_or_removing_an_osd_moves_little(hosts in topology(), pgs in 128u32..600, add in any::<bool>(), w in 1u32..5) {
        let mut osds = cluster(&hosts);
        let pool = Pool { pgs, size: 3, domain: FailureDomain::Osd, positional: false };
        prop_assume!(osds.len() > 4);
        let before = place(&osds, &pool, None).unwrap();
        if add {
            osds.push(Osd { id: osds.len() as u32, host: 99, rack: 9, weight: w, up: true });
        } else {
            osds[0].up = false;
        }
        let after = place(&osds, &pool, Some(&before)).unwrap();
        check_domains(&osds, &pool, &after)?;
        let (moved, min) = (moves(&before, &after), min_moves(&before, &after));
        prop_assert!(moved >= min);
        prop_assert!(moved <= move_bound(min), "moved {} replicas, the minimum is {}", moved, min);
    }

    /// After an OSD is added or lost, every OSD holds within one of its
    /// target (or within what a fresh table manages, where the topology
    /// allows no better), failure domains honoured.
    #[test]
    fn a_change_keeps_every_osd_near_its_target(hosts in topology(), pgs in 64u32..600, size in 2u8..4, dom in 0u8..2, add in any::<bool>(), w in 1u32..5, host in 0u32..14) {
        let mut osds = cluster(&hosts);
        let domain = if dom == 0 { FailureDomain::Osd } else { FailureDomain::Host };
        let pool = Pool { pgs, size, domain, positional: false };
        let before = place(&osds, &pool, None);
        prop_assume!(before.is_ok());
        let before = before.unwrap();
        // On a host of its own or beside others.
        let after = add_or_lose(&mut osds, add, host.min(hosts.len() as u32), w, &pool, &before);
        prop_assume!(after.is_ok());
        let after = after.unwrap();
        check_domains(&osds, &pool, &after)?;
        let fresh = place(&osds, &pool, None).unwrap();
        let target = targets(&osds, &pool);
        let off = |t: &Table| -> Vec<i64> {
            let c = t.counts();
            (0..osds.len()).map(|i| (*c.get(&osds[i].id).unwrap_or(&0) as i64 - target[i] as i64).abs()).collect()
        };
        let allowed = off(&fresh).into_iter().max().unwrap_or(0).max(1);
        let got = off(&after);
        prop_assert!(got.iter().all(|&d| d <= allowed), "off target by {:?} (a fresh table: within {}); targets {:?}", got, allowed, target);
    }

    /// A positional (erasure-coded) table never reorders a row: after an
    /// OSD is added or lost, every OSD that stays in a PG keeps its slot
    /// (its shard), and the primaries, named by slot, stay balanced.
    #[test]
    fn positional_rows_keep_their_slots(hosts in topology(), pgs in 64u32..400, size in 3u8..7, dom in 0u8..2, add in any::<bool>(), w in 1u32..5) {
        let mut osds = cluster(&hosts);
        let domain = if dom == 0 { FailureDomain::Osd } else { FailureDomain::Host };
        let pool = Pool { pgs, size, domain, positional: true };
        let before = place(&osds, &pool, None);
        prop_assume!(before.is_ok());
        let before = before.unwrap();
        prop_assert_eq!(before.lead.len(), pgs as usize);
        check_domains(&osds, &pool, &before)?;
        check_primaries(&before)?;
        let after = add_or_lose(&mut osds, add, 99, w, &pool, &before);
        prop_assume!(after.is_ok());
        let after = after.unwrap();
        check_domains(&osds, &pool, &after)?;
        check_primaries(&after)?;
        // So shards rebuilt are replicas moved: near the minimum where
        // domains are OSDs (as `adding_or_removing_an_osd_moves_little`).
        let rebuilt = (0..pgs)
            .map(|pg| before.pg(pg).iter().zip(after.pg(pg)).filter(|(a, b)| a != b).count() as u64)
            .sum::<u64>();
        prop_assert_eq!(rebuilt, moves(&before, &after));
        let min = min_moves(&before, &after);
        prop_assert!(domain == FailureDomain::Host || rebuilt <= move_bound(min), "rebuilt {} shards, the minimum is {}", rebuilt, min);
        for pg in 0..pgs {
            prop_assert!(after.lead_of(pg) < size as usize);
            for (slot, o) in before.pg(pg).iter().enumerate() {
                if let Some(now) = after.pg(pg).iter().position(|x| x == o) {
                    prop_assert_eq!(now, slot, "PG {} moved osd {} from slot {} to {}", pg, o, slot, now);
                }
            }
        }
    }

    #[test]
    fn deterministic(hosts in topology(), pgs in 1u32..200) {
        let osds = cluster(&hosts);
        let pool = Pool { pgs, size: 2, domain: FailureDomain::Host, positional: false };
        prop_assert_eq!(place(&osds, &pool, None).unwrap(), place(&osds, &pool, None).unwrap());
    }
}

#[test]
fn weights_are_honoured_and_heavy_domains_capped() {
    // One host far heavier than the rest cannot hold two replicas of a PG.
    let osds = cluster(&[(0, vec![100]), (0, vec![1]), (0, vec![1]), (0, vec![2])]);
    let pool = Pool {
        pgs: 400,
        size: 2,
        domain: FailureDomain::Host,
        positional: false,
    };
    let t = place(&osds, &pool, None).unwrap();
    let c = t.counts();
    assert_eq!(c[&0], 400, "the heavy host holds one replica of every PG");
    assert_eq!(c[&1] + c[&2] + c[&3], 400);
    assert!(c[&3] > c[&1] && c[&3] > c[&2], "{c:?}");
}

#[test]
fn impossible_pools_are_refused() {
    let osds = cluster(&[(0, vec![1, 1, 1]), (0, vec![1])]);
    let host3 = Pool {
        pgs: 8,
        size: 3,
        domain: FailureDomain::Host,
        positional: false,
    };
    assert_eq!(
        place(&osds, &host3, None),
        Err(PlacementError::TooFewDomains { need: 3, have: 2 })
    );
    assert!(place(
        &osds,
        &Pool {
            pgs: 0,
            size: 1,
            domain: FailureDomain::Osd,
            positional: false,
        },
        None
    )
    .is_err());
    let rack2 = Pool {
        pgs: 8,
        size: 2,
        domain: FailureDomain::Rack,
        positional: false,
    };
    assert!(matches!(
        place(&osds, &rack2, None),
        Err(PlacementError::TooFewDomains { .. })
    ));
}

/// The one-machine default (3 OSDs, 3 replicas): every OSD holds every PG,
/// and each is primary of a third of them.
#[test]
fn three_osds_three_replicas_share_the_primaries() {
    let osds = cluster(&[(0, vec![1]), (0, vec![1]), (0, vec![1])]);
    let pool = Pool {
        pgs: 64,
        size: 3,
        domain: FailureDomain::Osd,
        positional: false,
    };
    let t = place(&osds, &pool, None).unwrap();
    let mut prim = [0u32; 3];
    for pg in 0..64 {
        prim[t.pg(pg)[0] as usize] += 1;
    }
    assert!(prim.iter().all(|&p| (21..=22).contains(&p)), "{prim:?}");
}

/// The case the cluster test met (issue 10's scenario 5): four hosts of
/// two OSDs, then a fifth host whose two OSDs join one after the other.
/// The fifth host ends with its share, and what moved went to it.
#[test]
fn a_host_whose_osds_join_one_by_one_takes_its_share() {
    let mk = |n: u32| -> Vec<Osd> {
        (0..n)
            .map(|i| Osd {
                id: i,
                host: i / 2,
                rack: 0,
                weight: 1024,
                up: true,
            })
            .collect()
    };
    let pool = Pool {
        pgs: 64,
        size: 3,
        domain: FailureDomain::Host,
        positional: false,
    };
    let t0 = place(&mk(8), &pool, None).unwrap();
    let t1 = place(&mk(9), &pool, Some(&t0)).unwrap();
    let t2 = place(&mk(10), &pool, Some(&t1)).unwrap();
    let on_new = t2.osds.iter().filter(|&&o| o >= 8).count() as u64;
    assert_eq!(on_new, 38, "{:?}", t2.counts());
    // What moved in all went to the new host, but for the first OSD's
    // surplus handed to its neighbour.
    assert!(moves(&t0, &t2) <= on_new + 2, "{} moves", moves(&t0, &t2));
}

/// The most replicas (or shards: a positional table's rebuilds) a table
/// may move after a change whose count-based minimum is `min`. The
/// minimum counts only what each OSD must gain; a replica that must enter
/// a PG where no slot is free (an OSD whose share grew, one that must be
/// in every PG) displaces another, which must then gain elsewhere, and a
/// positional row is never reordered. Measured on 2026-11-27, 12 000 random
/// cases each: up to 1.63× the minimum (positional) and 1.67×
/// (replicated); the bound of `min + min / 2 + 3` the tests had before
/// failed about one run in four at 3 000 cases.
fn move_bound(min: u64) -> u64 {
    2 * min + 3
}

/// Found by `positional_rows_keep_their_slots` in CI (2026-11-27): ten
/// OSDs of weights 1–4 on seven hosts, 99 PGs of 5 shards placed by OSD,
/// the first OSD (weight 1) lost: the three of weight 4 must then be in
/// every PG, and 40 shards are rebuilt where the count-based minimum is
/// 24 (which `min + min / 2 + 3` refused).
#[test]
fn an_osd_in_every_pg_forces_displacements() {
    let hosts: Vec<(u32, Vec<u32>)> = vec![
        (0, vec![1, 4, 4, 1]),
        (0, vec![4]),
        (0, vec![1]),
        (0, vec![1]),
        (0, vec![1]),
        (0, vec![2]),
        (0, vec![2]),
    ];
    let mut osds = cluster(&hosts);
    let pool = Pool {
        pgs: 99,
        size: 5,
        domain: FailureDomain::Osd,
        positional: true,
    };
    let before = place(&osds, &pool, None).unwrap();
    let after = add_or_lose(&mut osds, false, 99, 1, &pool, &before).unwrap();
    let rebuilt = moves(&before, &after);
    let min = min_moves(&before, &after);
    assert!(
        rebuilt >= min && rebuilt <= move_bound(min),
        "rebuilt {rebuilt}, minimum {min}"
    );
    for id in [1, 2, 4] {
        assert_eq!(after.counts()[&id], 99, "osd {id}");
    }
    for pg in 0..99 {
        for (slot, o) in before.pg(pg).iter().enumerate() {
            if let Some(now) = after.pg(pg).iter().position(|x| x == o) {
                assert_eq!(now, slot, "PG {pg} moved osd {o}");
            }
        }
    }
}
