//! `nacre plan` against worked examples computed by hand (the arithmetic
//! is written out here, not taken from the library), and its data-loss
//! figure against a Monte Carlo simulation of small clusters.

use nacre_plan::estimate::{recovery, Bound};
use nacre_plan::loss::{loss_on, loss_sets, rate_counted, rate_expected, simulate, Units};
use nacre_plan::table::{work, Osds, PgTable};
use nacre_plan::{plan, Description, PlanError};

fn close(what: &str, got: f64, want: f64, rel: f64) {
    assert!(
        (got - want).abs() <= want.abs() * rel,
        "{what}: got {got}, want {want} (within {rel})"
    );
}

const YEAR_S: f64 = 365.25 * 86_400.0;

fn disk_toml() -> &'static str {
    "size_tb = 4, read_iops = 80000, write_iops = 30000, read_mbps = 500, write_mbps = 400, \
     read_lat_us = 100, write_lat_us = 50, afr = 0.02"
}

fn describe(hosts: u32, disks: u32, pool: &str) -> Description {
    Description::parse(&format!(
        "[[hosts]]\ncount = {hosts}\ndisks = {disks}\ndisk = {{ {} }}\n\
         [network]\ngbps = 10\nrtt_us = 50\n[pool]\n{pool}\n",
        disk_toml()
    ))
    .unwrap()
}

/// Down probability of a unit failing at `rate` per year, down `window_s`.
fn p(rate: f64, window_s: f64) -> f64 {
    let t = window_s / YEAR_S;
    rate * t / (1.0 + rate * t)
}

/// Expected distinct items when `draws` are taken evenly at random from
/// `possible`.
fn distinct(possible: f64, draws: f64) -> f64 {
    possible * (1.0 - (-draws / possible).exp())
}

/// Units of `c` with every host's windows given (seconds).
fn units(c: &nacre_plan::Cluster, disk_s: f64, host_s: f64) -> Units {
    Units::of(c, &vec![(disk_s, host_s); c.hosts.len()])
}

#[test]
fn three_replicas_on_four_hosts_of_six_disks() {
    let c = describe(4, 6, "replicas = 3").resolve().unwrap();
    let p_ = plan(&c).unwrap();
    assert_eq!((p_.hosts, p_.osds, p_.pgs), (4, 24, 800)); // 24 × 100 / 3
    close("pgs per osd", p_.pgs_per_osd, 100.0, 1e-9);
    // 96 TB raw, each host a quarter (under the third a PG may put there).
    close("raw", p_.capacity.raw_tb, 96.0, 1e-9);
    close("placeable", p_.capacity.placeable_raw_tb, 96.0, 1e-6);
    close("usable", p_.capacity.usable_tb, 32.0, 1e-6);
    // Writes: disks 24 × 400 / 3 = 3 200 MB/s; network: 4 links × 1 250
    // MB/s in, every byte in 3 times → 1 666.7: the network limits.
    close("write MB/s", p_.speed.write_mbps.value, 5000.0 / 3.0, 1e-9);
    assert_eq!(p_.speed.write_mbps.bound, Bound::Network);
    // Reads: disks 12 000, network 5 000 out.
    close("read MB/s", p_.speed.read_mbps.value, 5000.0, 1e-9);
    // Random writes: 24 × 30 000 / 3 = 240 000 (network: 5 000 MB/s ÷
    // (4 096 B × 3) = 406 901).
    close("write IOPS", p_.speed.write_iops.value, 240_000.0, 1e-9);
    assert_eq!(p_.speed.write_iops.bound, Bound::Disks);
    // Random reads: disks 1 920 000, network 5 000 MB/s ÷ 4 096 B.
    close("read IOPS", p_.speed.read_iops.value, 5e9 / 4096.0, 1e-9);
    // QD1: a hop is 50 µs + 4 096 B at 1 250 MB/s (3.2768 µs); a write two
    // hops + 50 µs disk + 50 µs software, a read one hop + 100 + 50.
    close(
        "write µs",
        p_.speed.write_lat_us,
        2.0 * 53.2768 + 100.0,
        1e-9,
    );
    close("read µs", p_.speed.read_lat_us, 53.2768 + 150.0, 1e-9);

    // Data loss for PGs spread evenly at random, a disk down 30 min and a
    // host 2 h: a disk going down (24 × ν_d) loses data if the two other
    // members of one of its loss sets are down, each by its disk or its
    // host. Its 100 PGs draw 100 pairs from the 3 × 36 = 108 pairs of
    // disks on two other hosts (65.2 distinct expected), 200 (disk, host)
    // covers from 36 possible, 100 host pairs from 3. A host going down
    // (4 × ν_h): its 600 PGs draw the same, 6 times over.
    let (dw, hw) = (1800.0, 7200.0);
    let (pd, ph) = (p(0.02, dw), p(0.02, hw));
    let nu_d = 0.02 / (1.0 + 0.02 * dw / YEAR_S);
    let nu_h = 0.02 / (1.0 + 0.02 * hw / YEAR_S);
    let covers = |draws: f64| {
        distinct(108.0, draws) * pd * pd
            + distinct(36.0, 2.0 * draws) * pd * ph
            + distinct(3.0, draws) * ph * ph
    };
    let by_hand = 24.0 * nu_d * (1.0 - ph) * covers(100.0) + 4.0 * nu_h * covers(600.0);
    close(
        "expected loss rate",
        rate_expected(&c, &units(&c, dw, hw)),
        by_hand,
        1e-9,
    );
    // Both tables' losses are counted (few loss sets), with positive rates.
    assert_eq!(p_.nacre.loss.method, "counted");
    assert!(p_.nacre.loss.rate_per_year > 0.0 && p_.nacre.loss.rate_per_year < 1e-6);
    let even = p_.even.unwrap();
    assert_eq!(even.loss.method, "counted");
    // Every recovery rebuilds the lost slots: 100 PGs of a disk, 600 of
    // a host, 2.8 and 16.8 TB.
    for r in [&p_.nacre.disk_recovery, &even.disk_recovery] {
        close("disk lost TB", r.lost_tb, 2.8, 1e-9);
    }
    close("host lost TB", p_.nacre.host_recovery.lost_tb, 16.8, 1e-9);
    assert_eq!(p_.nacre.disk_recovery.pgs, 100);
    assert_eq!(p_.nacre.host_recovery.pgs, 600);
}

#[test]
fn ec_four_plus_two_across_eight_hosts() {
    let c = describe(8, 6, "ec = \"4+2\"").resolve().unwrap();
    let p_ = plan(&c).unwrap();
    assert_eq!((p_.osds, p_.pgs), (48, 800)); // 48 × 100 / 6
    close("raw", p_.capacity.raw_tb, 192.0, 1e-9);
    close("usable", p_.capacity.usable_tb, 128.0, 1e-6); // × 4/6
                                                         // Writes: disks 48 × 400 × 4/6 = 12 800; network 8 × 1 250 = 10 000
                                                         // in, each byte in 1 + 5/4 times → 4 444.4.
    close(
        "write MB/s",
        p_.speed.write_mbps.value,
        10_000.0 / 2.25,
        1e-9,
    );
    assert_eq!(p_.speed.write_mbps.bound, Bound::Network);
    // Reads through the primary: out 1 + 3/4 per byte → 5 714.3 (disks
    // 24 000).
    close("read MB/s", p_.speed.read_mbps.value, 10_000.0 / 1.75, 1e-9);
    // A small write: 6 writes (data, 2 parity, 3 log entries) and 4 reads
    // (the old bytes twice, 2 parities): 1 / (6 / 1 440 000 + 4 /
    // 3 840 000) = 192 000; the network carries 10 000 MB/s ÷ (4 096 B ×
    // 5) = 488 281.
    let iops = 1.0 / (6.0 / (48.0 * 30_000.0) + 4.0 / (48.0 * 80_000.0));
    close("write IOPS", p_.speed.write_iops.value, iops, 1e-9);
    close("write IOPS", p_.speed.write_iops.value, 192_000.0, 1e-9);
    // QD1 write: three hops, the old bytes read (100 µs), the parity's
    // old units read (100), the write (50), software (50); a read: one
    // hop to the shard, 100, 50.
    close(
        "write µs",
        p_.speed.write_lat_us,
        3.0 * 53.2768 + 300.0,
        1e-9,
    );
    close("read µs", p_.speed.read_lat_us, 53.2768 + 150.0, 1e-9);
    // Loss: 3 of a PG's 6 shards down. A trigger's loss sets give C(5, 2)
    // = 10 remainders per PG, over C(7, 2) = 21 host pairs × 36 disk pairs.
    let (dw, hw) = (3600.0, 4.0 * 3600.0);
    let (pd, ph) = (p(0.02, dw), p(0.02, hw));
    let nu = |w: f64| 0.02 / (1.0 + 0.02 * w / YEAR_S);
    let covers = |draws: f64| {
        distinct(21.0 * 36.0, draws) * pd * pd
            + distinct(21.0 * 2.0 * 6.0, 2.0 * draws) * pd * ph
            + distinct(21.0, draws) * ph * ph
    };
    let by_hand = 48.0 * nu(dw) * (1.0 - ph) * covers(1000.0) + 8.0 * nu(hw) * covers(6000.0);
    close(
        "expected loss rate",
        rate_expected(&c, &units(&c, dw, hw)),
        by_hand,
        1e-9,
    );
    assert_eq!(p_.nacre.loss.method, "counted");
}

/// Recovery on tables written by hand: who paces, reads, writes and
/// carries what, and the busiest of them sets the time.
#[test]
fn recovery_on_a_table_written_by_hand() {
    // 4 hosts of one 4 TB disk, 2 replicas, 4 PGs: each OSD holds 2 slots
    // of 1.4 TB (4 TB × 0.7 / 2).
    let c = describe(4, 1, "replicas = 2\npgs = 4").resolve().unwrap();
    let osds = Osds::of(&c);
    let before = PgTable::from_rows(2, vec![0, 1, 1, 2, 2, 3, 3, 0]);
    // OSD 0 lost: PG 0 [0, 1] becomes [2, 1] (2 leads, pulling from 1),
    // PG 3 [3, 0] becomes [3, 1] (3 leads and pushes to 1).
    let after = PgTable::from_rows(2, vec![2, 1, 1, 2, 2, 3, 3, 1]);
    let w = work(&c, &osds, &before, &after, &[0]);
    assert_eq!((w.pgs, w.primaries, w.sources, w.targets), (2, 2, 2, 2));
    // Each primary paces one slot, 1.4e6 MB at 104.8576 MB/s = 13 351 s;
    // a source reads 1.4e6 MB at 500 (2 800 s), a target writes it at
    // 400 (3 500 s), a link carries it at 1 250 (1 120 s).
    close("primary", w.primary_s, 1.4e6 / 104.8576, 1e-9);
    close("source", w.source_s, 1.4e6 / 500.0, 1e-9);
    close("target", w.target_s, 1.4e6 / 400.0, 1e-9);
    close("network", w.network_s, 1.4e6 / 1250.0, 1e-9);
    let r = recovery(&c, 4.0, Some(&w));
    assert_eq!(r.rate_mbps.bound, Bound::RecoveryRate);
    close("window", r.window_s, 600.0 + 1.4e6 / 104.8576, 1e-9);
    close("rate", r.rate_mbps.value, 2.8e6 / (1.4e6 / 104.8576), 1e-9);
    // Nowhere to go, and a disk with nothing on it.
    assert_eq!(recovery(&c, 4.0, None).rate_mbps.bound, Bound::NoRoom);
    close(
        "no room",
        recovery(&c, 4.0, None).window_s,
        48.0 * 3600.0,
        1e-9,
    );
    let untouched = work(&c, &osds, &before, &before, &[]);
    assert_eq!(
        recovery(&c, 4.0, Some(&untouched)).rate_mbps.bound,
        Bound::NothingLost
    );

    // EC 2+1 on the same hosts, 1 PG [0, 1, 2] → [3, 1, 2]: OSD 3 leads,
    // reads 2 shards (of 2.8 TB: the slot is OSD 0's only one) from 1 and
    // 2 and paces 3 blocks per block rebuilt.
    let c = describe(4, 1, "ec = \"2+1\"\npgs = 1").resolve().unwrap();
    let before = PgTable::from_rows(3, vec![0, 1, 2]);
    let after = PgTable::from_rows(3, vec![3, 1, 2]);
    let w = work(&c, &osds, &before, &after, &[0]);
    close("EC primary", w.primary_s, 3.0 * 2.8e6 / 104.8576, 1e-9);
    // Each survivor reads one shard's worth; OSD 3's host takes in two.
    close("EC source", w.source_s, 2.8e6 / 500.0, 1e-9);
    close("EC network", w.network_s, 2.0 * 2.8e6 / 1250.0, 1e-9);
}

/// The expectation for an even random placement against the count on
/// random tables, on clusters of several shapes.
#[test]
fn expected_covers_agree_with_a_random_placement() {
    for (hosts, disks, pool, seed) in [
        (12, 4, "replicas = 3", 1u64),
        (10, 3, "replicas = 2", 2),
        (9, 4, "ec = \"4+2\"", 3),
        (20, 2, "replicas = 3\npgs = 4000", 4),
        (6, 8, "replicas = 3\npgs = 100", 5),
    ] {
        let c = describe(hosts, disks, pool).resolve().unwrap();
        let u = units(&c, 3600.0, 7200.0);
        let t = PgTable::random(&c, seed);
        let sets = loss_sets(&t, c.scheme.tolerates(), &u.disk_host).unwrap();
        let counted = rate_counted(&sets, &u);
        let expected = rate_expected(&c, &u);
        close(&format!("{hosts}×{disks} {pool}"), counted, expected, 0.1);
    }
}

/// A cluster whose failure rates are raised until a simulation sees
/// thousands of losses, with windows short enough that the model's
/// neglected terms (a further factor of the down probability) stay small.
fn fragile(hosts: u32, disks: u32, pool: &str) -> nacre_plan::Cluster {
    let text = format!(
        "[[hosts]]\ncount = {hosts}\ndisks = {disks}\n\
         disk = {{ kind = \"ssd\", size_tb = 1, afr = 10 }}\n\
         [network]\ngbps = 10\n[pool]\n{pool}\n\
         [failures]\nhost_afr = 10\n"
    );
    Description::parse(&text).unwrap().resolve().unwrap()
}

/// The loss figure on `table` against a simulation of the same process on
/// its rows (which shares nothing with the arithmetic but the figures).
fn check_against_simulation(
    c: &nacre_plan::Cluster,
    table: &PgTable,
    window_s: (f64, f64),
    years: u64,
    seed: u64,
) {
    let u = units(c, window_s.0, window_s.1);
    let model = loss_on(c, table, &u).unwrap();
    assert_eq!(model.method, "counted");
    let sim = simulate(table, c.scheme.tolerates(), &u, years, seed);
    let rate = sim.losses as f64 / years as f64;
    let sigma = (sim.losses as f64).sqrt() / years as f64;
    // The largest down probability bounds the model's neglected terms.
    let p_max = p(10.0, window_s.0.max(window_s.1));
    let slack = 4.0 * sigma + 3.0 * p_max * rate;
    assert!(
        sim.losses > 1000,
        "too few losses simulated to compare: {sim:?}"
    );
    assert!(
        (model.rate_per_year - rate).abs() <= slack,
        "{}: model {} losses/year, simulated {rate} ± {sigma} over {years} years ({sim:?}), p_max {p_max}",
        c.scheme.label(),
        model.rate_per_year
    );
    let years_rate = sim.years_with_loss as f64 / years as f64;
    let years_sigma = (years_rate * (1.0 - years_rate) / years as f64).sqrt();
    assert!(
        (model.annual_probability - years_rate).abs()
            <= 4.0 * years_sigma + 3.0 * p_max * years_rate,
        "annual probability {} vs simulated {years_rate}",
        model.annual_probability
    );
}

/// Nacre's tables (seed None) and random ones, 2 and 3 replicas, by
/// host and by OSD (a PG may then hold two copies on one host, which a
/// host failure takes together), EC 2+1 and 2+2.
#[test]
fn the_loss_figure_matches_a_simulation() {
    type Case = (u32, u32, &'static str, Option<u64>, (f64, f64), u64);
    let cases: [Case; 8] = [
        (5, 2, "replicas = 2", None, (1800.0, 3600.0), 40_000),
        (5, 2, "replicas = 2", Some(9), (1800.0, 3600.0), 40_000),
        (4, 2, "replicas = 3", None, (18_000.0, 36_000.0), 20_000),
        (
            4,
            2,
            "replicas = 3\nfailure_domain = \"osd\"\npgs = 64",
            None,
            (3600.0, 3600.0),
            20_000,
        ),
        (
            4,
            2,
            "replicas = 3\nfailure_domain = \"osd\"\npgs = 64",
            Some(5),
            (3600.0, 3600.0),
            20_000,
        ),
        (4, 2, "ec = \"2+1\"", None, (1800.0, 3600.0), 40_000),
        (
            6,
            1,
            "ec = \"2+2\"\npgs = 30",
            Some(7),
            (18_000.0, 18_000.0),
            20_000,
        ),
        (
            6,
            1,
            "ec = \"2+2\"\npgs = 30",
            None,
            (18_000.0, 18_000.0),
            20_000,
        ),
    ];
    for (i, (hosts, disks, pool, seed, windows, years)) in cases.into_iter().enumerate() {
        let c = fragile(hosts, disks, pool);
        let t = match seed {
            Some(s) => PgTable::random(&c, s),
            None => PgTable::nacre(&c).unwrap(),
        };
        check_against_simulation(&c, &t, windows, years, i as u64 + 1);
    }
}

#[test]
fn more_pgs_more_loss_sets_but_faster_recovery() {
    // Spread at random, with the same windows, few PGs give fewer loss
    // sets; but few OSDs rebuild a lost disk at once, so its window is
    // longer.
    let few = describe(12, 4, "replicas = 3\npgs = 32").resolve().unwrap();
    let many = describe(12, 4, "replicas = 3\npgs = 1600")
        .resolve()
        .unwrap();
    let u = units(&many, 3600.0, 7200.0);
    assert!(rate_expected(&few, &u) < rate_expected(&many, &u));
    let window = |c| plan(c).unwrap().even.unwrap().disk_recovery.window_s;
    assert!(window(&few) > window(&many));
}

#[test]
fn an_uneven_cluster_cannot_fill_its_biggest_host() {
    // Three replicas by host: one host of 10 disks beside two of 1 can hold
    // only as many replicas as the other two together.
    let text = format!(
        "[[hosts]]\ncount = 1\ndisks = 10\ndisk = {{ {d} }}\n\
         [[hosts]]\ncount = 2\ndisks = 1\ndisk = {{ {d} }}\n\
         [network]\ngbps = 10\n[pool]\nreplicas = 3\n",
        d = disk_toml()
    );
    let c = Description::parse(&text).unwrap().resolve().unwrap();
    let p_ = plan(&c).unwrap();
    close("raw", p_.capacity.raw_tb, 48.0, 1e-9);
    // Each host holds one copy of everything: 4 TB of data.
    close("usable", p_.capacity.usable_tb, 4.0, 1e-6);
}

#[test]
fn bad_descriptions_are_refused_with_the_field_named() {
    let refused = |text: &str, needle: &str| match Description::parse(text)
        .and_then(|d| d.resolve())
    {
        Err(PlanError::Invalid(why)) => assert!(why.contains(needle), "{why:?} lacks {needle:?}"),
        Ok(_) => panic!("accepted: {text}"),
    };
    let base = |hosts: &str, pool: &str| format!("{hosts}\n[network]\ngbps = 10\n[pool]\n{pool}\n");
    let host = "[[hosts]]\ncount = 4\ndisks = 2\ndisk = { kind = \"nvme\", size_tb = 2 }";
    refused(&base(host, "replicas = 5"), "needs 5 failure domains");
    refused(&base(host, "replicas = 0"), "pool.replicas");
    refused(&base(host, "replicas = 3\nec = \"2+1\""), "either");
    refused(&base(host, "ec = \"4\""), "k+m");
    refused(&base(host, "ec = \"0+1\""), "k must be");
    refused(&base(host, "replicas = 2\nfill = 1.5"), "pool.fill");
    refused(&base(host, "replicas = 2\npgs = 0"), "pool.pgs");
    refused(&base(host, "replicas = 2\nbogus = 1"), "bogus");
    refused(
        &base(
            "[[hosts]]\ncount = 2\ndisks = 2\ndisk = { size_tb = 2 }",
            "replicas = 2",
        ),
        "hosts[0].disk.read_iops is not given",
    );
    refused(
        &base(
            "[[hosts]]\ncount = 2\ndisks = 2\ndisk = { kind = \"hdd\", size_tb = -1 }",
            "replicas = 2",
        ),
        "hosts[0].disk.size_tb",
    );
    refused(
        &base(
            "[[hosts]]\ncount = 2\ndisks = 0\ndisk = { kind = \"hdd\", size_tb = 1 }",
            "replicas = 2",
        ),
        "hosts[0]",
    );
    refused(
        &base(
            "[[hosts]]\ncount = 2\ndisks = 2\ndisk = { kind = \"floppy\", size_tb = 1 }",
            "replicas = 2",
        ),
        "floppy",
    );
    refused("[network]\ngbps = 10\n[pool]\nreplicas = 2\nhosts = []", "");
    refused(
        &base(host, "replicas = 2\n[failures]\nhost_afr = -0.1"),
        "host_afr",
    );
    refused(
        &base(
            "[[hosts]]\ncount = 200\ndisks = 1000\ndisk = { kind = \"hdd\", size_tb = 1 }",
            "replicas = 2",
        ),
        "200000 OSDs",
    );
    refused(&base(host, "replicas = 3\npgs = 2000000"), "slots");
    let groups = (0..65).map(|_| host).collect::<Vec<_>>().join("\n");
    refused(&base(&groups, "replicas = 2"), "65 [[hosts]] groups");
    refused(
        &format!("{host}\n[network]\ngbps = 0\n[pool]\nreplicas = 2\n"),
        "network.gbps",
    );
}

#[test]
fn the_example_plans() {
    let c = Description::parse(nacre_plan::EXAMPLE)
        .unwrap()
        .resolve()
        .unwrap();
    let p_ = plan(&c).unwrap();
    assert_eq!(p_.osds, 24);
    assert!(p_.nacre.loss.annual_probability > 0.0 && p_.nacre.loss.annual_probability < 1e-3);
}

/// A description written as TOML (what `nacre plan --from-cluster`
/// prints) reads back as the same cluster: every example and a
/// description with every optional field given.
#[test]
fn a_description_written_as_toml_reads_back_the_same() {
    let full = "[[hosts]]\ncount = 2\ndisks = 3\ndisk = { kind = \"desktop-ssd\", size_tb = 1.92, \
                read_iops = 81234.5, write_iops = 20000, read_mbps = 510, write_mbps = 450.25, \
                read_lat_us = 95, write_lat_us = 1400, afr = 0.03 }\n\n\
                [[hosts]]\ncount = 1\ndisks = 4\ndisk = { kind = \"hdd\", size_tb = 8 }\n\n\
                [network]\ngbps = 25\nrtt_us = 42.5\n\n\
                [pool]\nec = \"4+2\"\nfailure_domain = \"osd\"\npgs = 256\nfill = 0.5\n\n\
                [failures]\ndisk_afr = 0.02\nhost_afr = 0.01\nout_delay_min = 5\n\
                recovery_mbps_per_osd = 200\nhost_repair_hours = 24\n";
    let mut texts = vec![full.to_string(), nacre_plan::EXAMPLE.to_string()];
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/plan");
    for e in std::fs::read_dir(dir).unwrap() {
        texts.push(std::fs::read_to_string(e.unwrap().path()).unwrap());
    }
    assert!(texts.len() >= 4);
    for t in texts {
        let d = Description::parse(&t).unwrap();
        let again =
            Description::parse(&d.to_toml()).unwrap_or_else(|e| panic!("{e}\n{}", d.to_toml()));
        assert_eq!(format!("{d:?}"), format!("{again:?}"), "{}", d.to_toml());
    }
}
