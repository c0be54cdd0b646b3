//! `nacre plan` against worked examples computed by hand (the arithmetic
//! is written out here, not taken from the library), and its data-loss
//! figure against a Monte Carlo simulation of small clusters.

use nacre_plan::estimate::{recovery, Bound, Parallel};
use nacre_plan::loss::{rate_counted, rate_expected, simulate, LossSets, Placed, Units};
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

#[test]
fn three_replicas_on_four_hosts_of_six_disks() {
    let c = describe(4, 6, "replicas = 3").resolve().unwrap();
    let p_ = plan(&c).unwrap();
    assert_eq!((p_.hosts, p_.osds, p_.pgs), (4, 24, 800)); // 24 × 100 / 3
    close("pgs per osd", p_.pgs_per_osd, 100.0, 1e-9);
    // 96 TB raw, each host a quarter (under the third a PG may put there).
    close("raw", p_.capacity.raw_tb, 96.0, 1e-9);
    close("placeable", p_.capacity.placeable_raw_tb, 96.0, 1e-9);
    close("usable", p_.capacity.usable_tb, 32.0, 1e-9);
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
    // A lost disk, its 100 PGs spread evenly at random over the 23 other
    // OSDs: 23 × (1 − e^(−100/23)) = 22.70 distinct primaries, each at
    // 100 MiB/s = 2 380.6 MB/s (their disks could read 11 351, the
    // network carry 5 000); 4 TB × 0.7 = 2.8 TB in 1 176.2 s after the
    // 600 s out delay.
    let spread = |others: f64, pgs: f64| others * (1.0 - (-pgs / others).exp());
    let disk = recovery(&c, 0, 1, Parallel::even(&c, 1));
    let disk_rate = spread(23.0, 100.0) * 104.8576;
    close("disk lost TB", disk.lost_tb, 2.8, 1e-9);
    close("disk rate", disk.rate_mbps.value, disk_rate, 1e-9);
    assert_eq!(disk.rate_mbps.bound, Bound::RecoveryRate);
    let disk_window = 600.0 + 2.8e6 / disk_rate;
    close("disk window", disk.window_s, disk_window, 1e-9);
    // A lost host: 16.8 TB, 600 PGs over the 18 OSDs left (17.99 of
    // them): 1 886.4 MB/s.
    let host = recovery(&c, 0, 6, Parallel::even(&c, 6));
    let host_rate = spread(18.0, 600.0) * 104.8576;
    let host_window = 600.0 + 16.8e6 / host_rate;
    close("host window", host.window_s, host_window, 1e-9);
    // The plan's own figures come from Nacre's placement run again
    // without the lost disk: the same arithmetic with its counts.
    let par = p_.disk_recovery.par;
    close(
        "plan disk window",
        p_.disk_recovery.window_s,
        600.0
            + 2.8e6
                / (par.primaries * 104.8576)
                    .min(par.targets * 400.0)
                    .min(5000.0),
        1e-9,
    );
    assert_eq!(par.pgs, 100.0);

    // Data loss, for a placement spreading PGs evenly at random: a disk
    // going down (24 × ν_d) loses data if the two other members of one of
    // its loss sets are down, each by its disk or its host. Its 100 PGs
    // draw 100 pairs from the 3 × 36 = 108 pairs of disks on two other
    // hosts (65.2 distinct expected), 200 (disk, host) covers from 36
    // possible, 100 host pairs from 3. A host going down (4 × ν_h): its
    // 600 PGs draw the same, 6 times over.
    let (pd, ph) = (p(0.02, disk_window), p(0.02, host_window));
    let nu_d = 0.02 / (1.0 + 0.02 * disk_window / YEAR_S);
    let nu_h = 0.02 / (1.0 + 0.02 * host_window / YEAR_S);
    let distinct = |possible: f64, draws: f64| possible * (1.0 - (-draws / possible).exp());
    let covers = |draws: f64| {
        distinct(108.0, draws) * pd * pd
            + distinct(36.0, 2.0 * draws) * pd * ph
            + distinct(3.0, draws) * ph * ph
    };
    let by_hand = 24.0 * nu_d * (1.0 - ph) * covers(100.0) + 4.0 * nu_h * covers(600.0);
    let even = p_.loss_even.clone().unwrap();
    close("expected loss rate", even.rate_per_year, by_hand, 1e-9);
    close("annual probability", even.annual_probability, by_hand, 1e-6);
    assert_eq!(even.method, "expected");
    // On Nacre's own table the loss sets are counted (800 PGs: few).
    assert_eq!(p_.loss.method, "counted");
    assert!(p_.loss.rate_per_year > 0.0 && p_.loss.rate_per_year.is_finite());
}

#[test]
fn ec_four_plus_two_across_eight_hosts() {
    let c = describe(8, 6, "ec = \"4+2\"").resolve().unwrap();
    let p_ = plan(&c).unwrap();
    assert_eq!((p_.osds, p_.pgs), (48, 800)); // 48 × 100 / 6
    close("raw", p_.capacity.raw_tb, 192.0, 1e-9);
    close("usable", p_.capacity.usable_tb, 128.0, 1e-9); // × 4/6
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
    // A small write reads and writes 3 shards: 48 disks ÷ (3 × (1/30 000
    // + 1/80 000)) = 349 091; the network carries 10 000 MB/s ÷ (4 096 B
    // × 5) = 488 281.
    let iops = 1.0 / (3.0 * (1.0 / (48.0 * 30_000.0) + 1.0 / (48.0 * 80_000.0)));
    close("write IOPS", p_.speed.write_iops.value, iops, 1e-9);
    // QD1 write: three hops, the old bytes read (100 µs), the write (50),
    // software (50); read: one hop to the shard, 100, 50.
    close(
        "write µs",
        p_.speed.write_lat_us,
        3.0 * 53.2768 + 200.0,
        1e-9,
    );
    close("read µs", p_.speed.read_lat_us, 53.2768 + 150.0, 1e-9);
    // A lost disk: 2.8 TB; its 100 PGs over 47 others (41.0 distinct
    // primaries at 104.86 MB/s = 4 299); reading 4 bytes per byte rebuilt
    // their disks give 41.0 × 500 / 4 = 5 125, the network 8 × 1 250 / 4
    // = 2 500: the network limits.
    let disk = recovery(&c, 0, 1, Parallel::even(&c, 1));
    close("disk rate", disk.rate_mbps.value, 2500.0, 1e-9);
    assert_eq!(disk.rate_mbps.bound, Bound::Network);
    close("disk window", disk.window_s, 600.0 + 2.8e6 / 2500.0, 1e-9);
    // A lost host: 16.8 TB, 7 links left / 4 = 2 187.5 MB/s.
    let host = recovery(&c, 0, 6, Parallel::even(&c, 6));
    close("host window", host.window_s, 600.0 + 16.8e6 / 2187.5, 1e-9);
    // Loss: 3 of a PG's 6 shards down. A trigger's loss sets give C(5, 2)
    // = 10 remainders per PG, over C(7, 2) = 21 host pairs × 36 disk pairs.
    let (dw, hw) = (600.0 + 2.8e6 / 2500.0, 600.0 + 16.8e6 / 2187.5);
    let (pd, ph) = (p(0.02, dw), p(0.02, hw));
    let nu = |w: f64| 0.02 / (1.0 + 0.02 * w / YEAR_S);
    let distinct = |possible: f64, draws: f64| possible * (1.0 - (-draws / possible).exp());
    let covers = |draws: f64| {
        distinct(21.0 * 36.0, draws) * pd * pd
            + distinct(21.0 * 2.0 * 6.0, 2.0 * draws) * pd * ph
            + distinct(21.0, draws) * ph * ph
    };
    let by_hand = 48.0 * nu(dw) * (1.0 - ph) * covers(1000.0) + 8.0 * nu(hw) * covers(6000.0);
    close(
        "expected loss rate",
        p_.loss_even.clone().unwrap().rate_per_year,
        by_hand,
        1e-9,
    );
    assert_eq!(p_.loss.method, "counted");
}

/// The expectation for an even random placement against the count on a
/// random placement made here, on clusters of several shapes.
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
        let u = Units::of(&c, None).unwrap();
        let width = c.scheme.width() as usize;
        // Each PG: `width` distinct hosts at random, a disk on each.
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut rows = Vec::new();
        for _ in 0..c.pgs {
            let mut hs: Vec<u32> = Vec::new();
            while hs.len() < width {
                let h = next(u64::from(hosts)) as u32;
                if !hs.contains(&h) {
                    hs.push(h);
                }
            }
            rows.extend(
                hs.iter()
                    .map(|&h| h * disks + next(u64::from(disks)) as u32),
            );
        }
        let sets = LossSets::of_rows(&rows, width, c.scheme.tolerates(), &u.disk_host);
        let counted = rate_counted(&sets, &u);
        let expected = rate_expected(&c, &u);
        close(&format!("{hosts}×{disks} {pool}"), counted, expected, 0.1);
    }
}

/// Rates high enough for a simulation to see thousands of losses, windows
/// short enough that the model's neglected terms (a further factor of the
/// down probability) stay under the simulation's noise.
fn fragile(hosts: u32, disks: u32, pool: &str, afr: f64, out_min: f64) -> nacre_plan::Cluster {
    let text = format!(
        "[[hosts]]\ncount = {hosts}\ndisks = {disks}\n\
         disk = {{ kind = \"ssd\", size_tb = 0.001, afr = {afr} }}\n\
         [network]\ngbps = 10\n[pool]\n{pool}\n\
         [failures]\nhost_afr = {afr}\nout_delay_min = {out_min}\n"
    );
    Description::parse(&text).unwrap().resolve().unwrap()
}

fn check_against_simulation(c: &nacre_plan::Cluster, years: u64, seed: u64) {
    let p_ = plan(c).unwrap();
    assert_eq!(p_.loss.method, "counted");
    let placed = Placed::of(c).unwrap();
    let sets = placed.loss_sets(c.scheme.tolerates()).unwrap();
    let u = Units::of(c, Some(&placed)).unwrap();
    let sim = simulate(&sets, &u, years, seed);
    let rate = sim.losses as f64 / years as f64;
    let sigma = (sim.losses as f64).sqrt() / years as f64;
    // The largest down probability bounds the model's neglected terms.
    let p_max = (0..u.disk_host.len())
        .map(|d| p(u.disk_rate[d], u.disk_window_years[d] * YEAR_S))
        .chain((0..u.host_rate.len()).map(|h| p(u.host_rate[h], u.host_window_years[h] * YEAR_S)))
        .fold(0.0, f64::max);
    let slack = 4.0 * sigma + 3.0 * p_max * rate;
    assert!(
        sim.losses > 1000,
        "too few losses simulated to compare: {sim:?}"
    );
    assert!(
        (p_.loss.rate_per_year - rate).abs() <= slack,
        "{}: model {} losses/year, simulated {rate} ± {sigma} over {years} years ({sim:?}), p_max {p_max}",
        p_.scheme,
        p_.loss.rate_per_year
    );
    // And the probability of a year with a loss.
    let years_rate = sim.years_with_loss as f64 / years as f64;
    let years_sigma = (years_rate * (1.0 - years_rate) / years as f64).sqrt();
    assert!(
        (p_.loss.annual_probability - years_rate).abs()
            <= 4.0 * years_sigma + 3.0 * p_max * years_rate,
        "annual probability {} vs simulated {years_rate}",
        p_.loss.annual_probability
    );
}

#[test]
fn the_loss_figure_matches_a_simulation_two_replicas() {
    check_against_simulation(&fragile(5, 2, "replicas = 2", 10.0, 30.0), 40_000, 1);
}

#[test]
fn the_loss_figure_matches_a_simulation_three_replicas_and_osd_domain() {
    // Three replicas on two hosts: a PG may put two copies on one host.
    check_against_simulation(
        &fragile(
            2,
            4,
            "replicas = 3\nfailure_domain = \"osd\"\npgs = 64",
            10.0,
            60.0,
        ),
        20_000,
        2,
    );
    check_against_simulation(&fragile(4, 2, "replicas = 3", 10.0, 300.0), 20_000, 3);
}

#[test]
fn the_loss_figure_matches_a_simulation_ec() {
    check_against_simulation(&fragile(4, 2, "ec = \"2+1\"", 10.0, 30.0), 40_000, 4);
}

#[test]
fn more_pgs_more_loss_sets_but_faster_recovery() {
    // Spread at random, with the same windows, few PGs give fewer loss
    // sets; but few OSDs rebuild a lost disk at once, so its window is
    // longer (which here costs more than the loss sets save).
    let few = describe(12, 4, "replicas = 3\npgs = 32").resolve().unwrap();
    let many = describe(12, 4, "replicas = 3\npgs = 1600")
        .resolve()
        .unwrap();
    let u = Units::of(&many, None).unwrap();
    assert!(rate_expected(&few, &u) < rate_expected(&many, &u));
    let window = |c| recovery(c, 0, 1, Parallel::even(c, 1)).window_s;
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
    assert!(p_.loss.annual_probability > 0.0 && p_.loss.annual_probability < 1e-3);
}
