//! `nacre net bench`: the links between the OSDs' hosts, measured through
//! the OSDs' own connections (an OSD of each host measures its link to an
//! OSD of every other host: `nacre_osd`'s `Op::NetBench`), as matrices,
//! with the slow links named.

use std::collections::BTreeMap;

use nacre_client::Cluster;
use nacre_io::rt;
use nacre_osd::LinkReport;

use crate::at::At;
use crate::osd_bench::OUTLIER_FACTOR;
use crate::Format;
use nacre_osd::slow::median;

/// Fewest links a median is taken over.
const SLOW_LINKS_MIN: usize = 3;

#[derive(clap::Subcommand)]
pub enum NetCmd {
    /// Measure the network between every pair of OSD hosts through the
    /// OSDs' own connections, one pair at a time: 4 KiB round trips one at
    /// a time (latency) and a stream of 1 MiB messages, 8 in flight
    /// (throughput one way), from one OSD of each host (its lowest up) to
    /// one of every other. Prints a matrix of each and names the slow
    /// links: a round trip twice the median of all, or half its throughput
    /// (three links at least). Exits non-zero if a link could not be
    /// measured.
    Bench {
        #[command(flatten)]
        at: At,
        /// Output: tables for people, or JSON for scripts.
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
    },
}

pub fn run(cmd: NetCmd) -> anyhow::Result<()> {
    match cmd {
        NetCmd::Bench { at, format } => bench(&at, format),
    }
}

/// Why each link stands out: its round trip (p50) at least
/// [`OUTLIER_FACTOR`] times the median of all, or its throughput that
/// many times below (with at least [`SLOW_LINKS_MIN`] links).
pub fn slow_links(links: &[&LinkReport]) -> Vec<Vec<String>> {
    let mut why = vec![Vec::new(); links.len()];
    if links.len() < SLOW_LINKS_MIN {
        return why;
    }
    let rtt = median(links.iter().map(|l| l.rtt_p50_us as f64).collect());
    let mbs = median(links.iter().map(|l| l.mb_per_s).collect());
    for (w, l) in why.iter_mut().zip(links) {
        if let Some(m) = rtt.filter(|&m| m > 0.0) {
            let x = l.rtt_p50_us as f64 / m;
            if x >= OUTLIER_FACTOR {
                w.push(format!("round trip {x:.1}× the median"));
            }
        }
        if let Some(m) = mbs.filter(|_| l.mb_per_s > 0.0) {
            let x = m / l.mb_per_s;
            if x >= OUTLIER_FACTOR {
                w.push(format!("throughput {x:.1}× below the median"));
            }
        }
    }
    why
}

/// Each host with an OSD up, and the OSD that speaks for it (its lowest).
pub type Hosts = BTreeMap<String, u32>;
/// Each link measured: from host, to host, the report or why not.
pub type Measured = Vec<(String, String, Result<LinkReport, String>)>;

/// Measures every link between two hosts with an OSD up, one at a time
/// (`progress`: a line on stderr for each).
pub fn measure(at: &At, progress: bool) -> anyhow::Result<(Hosts, Measured)> {
    let meta = at.meta()?;
    rt::block_on(async {
        let c = Cluster::connect(meta)?;
        let m = c.map();
        // The lowest OSD up on each host.
        let mut hosts = Hosts::new();
        for o in m.osds.iter().filter(|o| m.is_up(o.id)) {
            let id = hosts.entry(o.host.clone()).or_insert(o.id);
            *id = (*id).min(o.id);
        }
        anyhow::ensure!(
            hosts.len() >= 2,
            "{} host(s) with an OSD up: no link to measure",
            hosts.len()
        );
        let mut out = Vec::new();
        for (a, &from) in &hosts {
            for (b, &to) in hosts.iter().filter(|(b, _)| *b != a) {
                if progress {
                    eprintln!("nacre net bench: {a} (osd.{from}) → {b} (osd.{to})");
                }
                let r = (c.net_bench(from, to).await.map_err(|e| e.to_string()))
                    .and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string()));
                out.push((a.clone(), b.clone(), r));
            }
        }
        Ok((hosts, out))
    })
}

/// The hosts that stand out: a host's median round trip over the links
/// it is an end of at least [`OUTLIER_FACTOR`] times the median of the
/// hosts' medians, or its median throughput that many times below (with
/// at least three hosts). One slow host is an end of 2 (n − 1) of the
/// n (n − 1) links, enough to drag the links' own median on a small
/// cluster: the hosts' medians keep it apart.
pub fn slow_hosts(links: &[(&String, &String, &LinkReport)]) -> Vec<(String, Vec<String>)> {
    let mut per: BTreeMap<&String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for (a, b, r) in links {
        for h in [a, b] {
            let e = per.entry(h).or_default();
            e.0.push(r.rtt_p50_us as f64);
            e.1.push(r.mb_per_s);
        }
    }
    if per.len() < SLOW_LINKS_MIN {
        return Vec::new();
    }
    let host: Vec<(&String, f64, f64)> = (per.into_iter())
        .filter_map(|(h, (rtt, mbs))| Some((h, median(rtt)?, median(mbs)?)))
        .collect();
    let rtt = median(host.iter().map(|h| h.1).collect());
    let mbs = median(host.iter().map(|h| h.2).collect());
    let mut out = Vec::new();
    for (h, r, m) in host {
        let mut why = Vec::new();
        if let Some(mr) = rtt.filter(|&x| x > 0.0 && r / x >= OUTLIER_FACTOR) {
            why.push(format!("round trip {:.1}× the hosts' median", r / mr));
        }
        if let Some(mm) = mbs.filter(|&x| m > 0.0 && x / m >= OUTLIER_FACTOR) {
            why.push(format!("throughput {:.1}× below the hosts' median", mm / m));
        }
        if !why.is_empty() {
            out.push((h.clone(), why));
        }
    }
    out
}

fn bench(at: &At, format: Format) -> anyhow::Result<()> {
    let (hosts, measured) = measure(at, format == Format::Table)?;
    let done: Vec<(&String, &String, &LinkReport)> = (measured.iter())
        .filter_map(|(a, b, r)| r.as_ref().ok().map(|r| (a, b, r)))
        .collect();
    let why = slow_links(&done.iter().map(|d| d.2).collect::<Vec<_>>());
    let hosts_slow = slow_hosts(&done);
    let failed: Vec<(&String, &String, &String)> = (measured.iter())
        .filter_map(|(a, b, r)| r.as_ref().err().map(|e| (a, b, e)))
        .collect();
    match format {
        Format::Json => {
            let v = serde_json::json!({
                "hosts": hosts.iter().map(|(h, o)| serde_json::json!({"host": h, "osd": o})).collect::<Vec<_>>(),
                "links": done.iter().zip(&why).map(|((a, b, r), w)| serde_json::json!({
                    "from_host": a,
                    "to_host": b,
                    "report": r,
                    "slow": w,
                })).collect::<Vec<_>>(),
                "slow_hosts": hosts_slow.iter().map(|(h, w)| serde_json::json!({"host": h, "slow": w})).collect::<Vec<_>>(),
                "failed": failed.iter().map(|(a, b, e)| serde_json::json!({
                    "from_host": a, "to_host": b, "error": e,
                })).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        Format::Table => {
            let cell = |a: &str, b: &str, f: &dyn Fn(&LinkReport) -> String| -> String {
                if a == b {
                    return "-".into();
                }
                (done
                    .iter()
                    .find(|(x, y, _)| x.as_str() == a && y.as_str() == b))
                .map_or("failed".into(), |(_, _, r)| f(r))
            };
            let matrix = |title: &str, f: &dyn Fn(&LinkReport) -> String| {
                println!("{title}, from (row) to (column):");
                print!("{:<14}", "");
                for b in hosts.keys() {
                    print!(" {b:>12}");
                }
                println!();
                for a in hosts.keys() {
                    print!("{a:<14}");
                    for b in hosts.keys() {
                        print!(" {:>12}", cell(a, b, f));
                    }
                    println!();
                }
                println!();
            };
            matrix("4 KiB round trip p50 µs (p99)", &|r| {
                format!("{} ({})", r.rtt_p50_us, r.rtt_p99_us)
            });
            matrix("throughput MB/s (1 MiB messages, 8 in flight)", &|r| {
                format!("{:.0}", r.mb_per_s)
            });
            let slow: Vec<String> = (done.iter().zip(&why))
                .filter(|(_, w)| !w.is_empty())
                .map(|((a, b, _), w)| format!("{a} → {b}: {}", w.join(", ")))
                .collect();
            if done.len() < SLOW_LINKS_MIN {
                println!("(fewer than {SLOW_LINKS_MIN} links: none named slow)");
            } else if slow.is_empty() && hosts_slow.is_empty() {
                println!("no slow link");
            } else {
                for (h, w) in &hosts_slow {
                    println!("SLOW HOST {h}: {}", w.join(", "));
                }
                if !slow.is_empty() {
                    println!("SLOW LINKS:");
                    for s in slow {
                        println!("  {s}");
                    }
                }
            }
            for (a, b, e) in &failed {
                println!("{a} → {b} failed: {e}");
            }
        }
    }
    anyhow::ensure!(
        failed.is_empty(),
        "links not measured: {}",
        (failed.iter())
            .map(|(a, b, e)| format!("{a} → {b}: {e}"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(rtt: u64, mbs: f64) -> LinkReport {
        LinkReport {
            rtt_p50_us: rtt,
            mb_per_s: mbs,
            ..LinkReport::default()
        }
    }

    /// A link whose round trip is twice the median, or whose throughput
    /// is half of it, is named with the ratio; the others, and any set of
    /// fewer than three links, are not.
    #[test]
    fn slow_links_are_far_from_the_median() {
        let ls = [
            link(80, 1000.0),
            link(90, 1100.0),
            link(400, 1050.0),
            link(85, 300.0),
        ];
        let refs: Vec<&LinkReport> = ls.iter().collect();
        let why = slow_links(&refs);
        assert!(why[0].is_empty() && why[1].is_empty(), "{why:?}");
        assert_eq!(why[2], vec!["round trip 4.6× the median"]);
        assert_eq!(why[3], vec!["throughput 3.4× below the median"]);
        assert!(slow_links(&refs[..2]).iter().all(Vec::is_empty));
    }

    /// One slow host among four drags the links' median (half the links
    /// are its own): named by the hosts' medians.
    #[test]
    fn a_slow_host_is_named_by_the_hosts_medians() {
        let names: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        let mut ls = Vec::new();
        for a in &names {
            for b in names.iter().filter(|b| *b != a) {
                let slow = a == "d" || b == "d";
                ls.push((a, b, link(if slow { 300 } else { 100 }, 1000.0)));
            }
        }
        let refs: Vec<(&String, &String, &LinkReport)> =
            ls.iter().map(|(a, b, l)| (*a, *b, l)).collect();
        let links: Vec<&LinkReport> = refs.iter().map(|r| r.2).collect();
        assert!(
            slow_links(&links).iter().all(Vec::is_empty),
            "the links' median is dragged"
        );
        let hosts = slow_hosts(&refs);
        assert_eq!(
            hosts,
            vec![(
                "d".to_string(),
                vec!["round trip 3.0× the hosts' median".to_string()]
            )]
        );
    }
}
