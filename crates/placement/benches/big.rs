//! Placement at scale: 10 000 OSDs on 500 hosts in 25 racks, 1 000 000 PGs
//! of 3 replicas, host failure domain; then one OSD added. Prints times
//! and moves (a benchmark: it asserts nothing about time).

use std::time::Instant;

use nacre_placement::{min_moves, moves, place, FailureDomain, Osd, Pool};

fn main() {
    let mut osds: Vec<Osd> = (0..10_000u32)
        .map(|i| Osd {
            id: i,
            host: i / 20,
            rack: i / 400,
            weight: 1 + i % 4,
            up: true,
        })
        .collect();
    let pool = Pool {
        pgs: 1_000_000,
        size: 3,
        domain: FailureDomain::Host,
        positional: false,
    };
    let t = Instant::now();
    let first = place(&osds, &pool, None).expect("placeable");
    println!(
        "10 000 OSDs, 1 000 000 PGs x3: first table in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    osds.push(Osd {
        id: 10_000,
        host: 500,
        rack: 25,
        weight: 4,
        up: true,
    });
    let t = Instant::now();
    let second = place(&osds, &pool, Some(&first)).expect("placeable");
    println!(
        "one OSD added: recomputed in {:.2} s, {} replicas moved (minimum {})",
        t.elapsed().as_secs_f64(),
        moves(&first, &second),
        min_moves(&first, &second)
    );
    osds[123].up = false;
    let t = Instant::now();
    let third = place(&osds, &pool, Some(&second)).expect("placeable");
    println!(
        "one OSD down: recomputed in {:.2} s, {} replicas moved (minimum {})",
        t.elapsed().as_secs_f64(),
        moves(&second, &third),
        min_moves(&second, &third)
    );
}
