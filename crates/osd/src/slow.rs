//! Slow-OSD detection: an OSD whose own store writes (its disk as the OSD
//! sees it, with no network in the figure) stand far above its peers' —
//! [`SLOW_FACTOR`] times the median of the OSDs reporting, in each of the
//! last [`LATENCY_WINDOWS_KEPT`] windows of [`LATENCY_WINDOW`] (30 s in
//! all) — is named, with what was measured. `nacre status` raises
//! `SLOW_OSD` for each. Slow links ([`slow_links`], `SLOW_LINK`) are found
//! the same way from the OSDs' pings of each other.
//!
//! Every OSD is compared with all the others (one class: the map has no
//! device classes yet), so a cluster of mixed disks names its slowest
//! kind; a figure under [`SLOW_FLOOR_US`] is never slow (5× of 50 µs is
//! no disk anyone would replace).

use serde::{Deserialize, Serialize};

use crate::stats::{LATENCY_WINDOW, LATENCY_WINDOWS_KEPT};

pub const SLOW_FACTOR: f64 = 5.0;
/// A store write p99 below this (µs) is never slow.
pub const SLOW_FLOOR_US: f64 = 1000.0;
/// Fewest OSDs reporting a window for a median to be taken of it.
pub const SLOW_OSDS_MIN: usize = 3;

/// An OSD named slow, with what was measured: its store writes' p99 in
/// each window (newest first), the median of the OSDs reporting each,
/// and how many did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlowOsd {
    pub osd: u32,
    pub p99_us: Vec<f64>,
    pub median_us: Vec<f64>,
    pub osds: Vec<usize>,
}

impl SlowOsd {
    /// What `nacre status` says of it.
    pub fn message(&self) -> String {
        format!(
            "osd.{}: its store writes' p99 is {} {}: a slow or failing disk?",
            self.osd,
            ms(self.p99_us[0]),
            standing_out(&self.p99_us, &self.median_us, self.osds[0], "OSDs"),
        )
    }
}

fn ms(us: f64) -> String {
    format!("{:.1} ms", us / 1000.0)
}

/// How `figures` stood out of `medians` (the newest of `n` `what`)
/// window by window, for a health check's message.
fn standing_out(figures: &[f64], medians: &[f64], n: usize, what: &str) -> String {
    let factor = (figures.iter().zip(medians))
        .map(|(p, m)| p / m)
        .fold(f64::INFINITY, f64::min);
    format!(
        "(the median of {n} {what}: {}), at least {factor:.0}× the median in each of the last {} windows of {} s",
        ms(medians[0]),
        figures.len(),
        LATENCY_WINDOW.as_secs()
    )
}

/// The median of `v` (the mean of the middle two of an even count), or
/// None if it is empty.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The median of each kept window over the OSDs reporting it, and how
/// many did; None if a window had fewer than [`SLOW_OSDS_MIN`].
fn medians(reports: &[(u32, Vec<Option<f64>>)]) -> Option<Vec<(f64, usize)>> {
    let mut medians = Vec::new();
    for k in 0..LATENCY_WINDOWS_KEPT {
        let got: Vec<f64> = (reports.iter())
            .filter_map(|(_, w)| w.get(k).copied().flatten())
            .collect();
        let n = got.len();
        if n < SLOW_OSDS_MIN {
            return None;
        }
        medians.push((median(got)?, n));
    }
    Some(medians)
}

/// The OSDs among `reports` that stood out in at least one kept window:
/// a demoted OSD stays demoted while it is among them (so one hovering
/// about the bar is not demoted and restored in turn), and is restored
/// once it stood out in none — or nothing can be judged (an idle OSD, too
/// few OSDs reporting): a demotion is for an OSD seen slow, not unseen.
pub fn restless_osds(reports: &[(u32, Vec<Option<f64>>)]) -> Vec<u32> {
    let Some(medians) = medians(reports) else {
        return Vec::new();
    };
    (reports.iter())
        .filter(|(_, w)| {
            (medians.iter().enumerate()).any(|(k, &(m, _))| {
                w.get(k)
                    .copied()
                    .flatten()
                    .is_some_and(|p| p >= SLOW_FLOOR_US && p >= SLOW_FACTOR * m)
            })
        })
        .map(|(id, _)| *id)
        .collect()
}

/// The slow OSDs among `reports`: each OSD's store write p99 per window,
/// newest first ([`crate::OsdReport::store_write_us_p99`]).
pub fn slow_osds(reports: &[(u32, Vec<Option<f64>>)]) -> Vec<SlowOsd> {
    let Some(medians) = medians(reports) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (osd, w) in reports {
        let mut p99 = Vec::new();
        for (k, &(m, _)) in medians.iter().enumerate() {
            match w.get(k).copied().flatten() {
                Some(p) if p >= SLOW_FLOOR_US && p >= SLOW_FACTOR * m => p99.push(p),
                _ => break,
            }
        }
        if p99.len() == LATENCY_WINDOWS_KEPT {
            out.push(SlowOsd {
                osd: *osd,
                p99_us: p99,
                median_us: medians.iter().map(|m| m.0).collect(),
                osds: medians.iter().map(|m| m.1).collect(),
            });
        }
    }
    out
}

/// An OSD's pings: per peer, the median round trip of each kept window,
/// newest first ([`crate::OsdReport::peer_ping_us_p50`]).
pub type PeerPings = Vec<(u32, Vec<Option<f64>>)>;

/// A link's median ping round trip below this (µs) is never slow.
pub const SLOW_LINK_FLOOR_US: f64 = 1000.0;
/// Fewest host pairs measured in a window for a median to be taken of it.
pub const SLOW_LINKS_MIN: usize = 3;

/// A link between two hosts named slow, with what was measured: in each
/// kept window (newest first), the median of the round trips of the OSD
/// pairs across it, the median of all links', and how many links.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlowLink {
    pub hosts: [String; 2],
    pub rtt_us: Vec<f64>,
    pub median_us: Vec<f64>,
    pub links: Vec<usize>,
}

impl SlowLink {
    /// What `nacre status` says of it.
    pub fn message(&self) -> String {
        format!(
            "the link between hosts {} and {}: the OSDs' pings across it take {} {}: a slow or lossy network path?",
            self.hosts[0],
            self.hosts[1],
            ms(self.rtt_us[0]),
            standing_out(&self.rtt_us, &self.median_us, self.links[0], "links"),
        )
    }
}

/// The slow links between the hosts of `reports`: each OSD with its
/// pings' median round trip to each peer per window, newest first
/// ([`crate::OsdReport::peer_ping_us_p50`]); `host_of` names each OSD's
/// host. A link's figure in a window is the median over the OSD pairs
/// across it (either way); it is slow when that stands
/// [`SLOW_FACTOR`] times above the median of the links measured, and
/// above [`SLOW_LINK_FLOOR_US`], in every kept window. OSDs on the same
/// host are no link. (A host whose every link is slow drags the median
/// along when it has half of them: on three hosts it is not named.)
pub fn slow_links(
    reports: &[(u32, PeerPings)],
    host_of: impl Fn(u32) -> Option<String>,
) -> Vec<SlowLink> {
    use std::collections::BTreeMap;
    let mut across: BTreeMap<[String; 2], Vec<Vec<f64>>> = BTreeMap::new();
    for (osd, peers) in reports {
        let Some(a) = host_of(*osd) else { continue };
        for (peer, w) in peers {
            let Some(b) = host_of(*peer).filter(|b| *b != a) else {
                continue;
            };
            let mut key = [a.clone(), b];
            key.sort();
            let windows = across
                .entry(key)
                .or_insert_with(|| vec![Vec::new(); LATENCY_WINDOWS_KEPT]);
            for (k, v) in w.iter().take(LATENCY_WINDOWS_KEPT).enumerate() {
                windows[k].extend(*v);
            }
        }
    }
    let figures: Vec<([String; 2], Vec<Option<f64>>)> = (across.into_iter())
        .map(|(hosts, w)| (hosts, w.into_iter().map(median).collect()))
        .collect();
    let mut baselines = Vec::new();
    for k in 0..LATENCY_WINDOWS_KEPT {
        let got: Vec<f64> = figures.iter().filter_map(|(_, w)| w[k]).collect();
        if got.len() < SLOW_LINKS_MIN {
            return Vec::new();
        }
        let n = got.len();
        baselines.push((median(got).expect("not empty"), n));
    }
    let mut out = Vec::new();
    for (hosts, w) in figures {
        let rtt: Vec<f64> = (w.iter().zip(&baselines))
            .map_while(|(f, &(m, _))| {
                f.filter(|&f| f >= SLOW_LINK_FLOOR_US && f >= SLOW_FACTOR * m)
            })
            .collect();
        if rtt.len() == LATENCY_WINDOWS_KEPT {
            out.push(SlowLink {
                hosts,
                rtt_us: rtt,
                median_us: baselines.iter().map(|b| b.0).collect(),
                links: baselines.iter().map(|b| b.1).collect(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four hosts of one OSD each, and a fifth OSD beside osd.0: the link
    /// between hosts a and b is slow in every window (either way, and
    /// from osd.4 too); a link slow in one window only, and a slow pair of
    /// OSDs on one host, are not; fewer than three links name nothing.
    #[test]
    fn a_link_is_slow_when_its_pings_stand_out_in_every_window() {
        let host = |o: u32| Some(["a", "b", "c", "d", "a"][o as usize].to_string());
        let w = |v: f64| vec![Some(v); 3];
        let normal = |peers: &[u32]| -> Vec<(u32, Vec<Option<f64>>)> {
            peers.iter().map(|&p| (p, w(100.0))).collect()
        };
        let mut rs = vec![
            (0, normal(&[2, 3])),
            (1, normal(&[2, 3])),
            (2, normal(&[0, 1, 3])),
            (3, normal(&[0, 1, 2])),
            (4, normal(&[2])),
        ];
        rs[0].1.push((1, w(20_000.0)));
        rs[1].1.push((0, w(30_000.0)));
        rs[4].1.push((1, w(25_000.0)));
        // Slow in one window only.
        rs[2].1[2] = (3, vec![Some(20_000.0), Some(100.0), Some(100.0)]);
        // Two OSDs of host a: no link.
        rs[4].1.push((0, w(50_000.0)));
        let s = slow_links(&rs, host);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].hosts, ["a".to_string(), "b".to_string()]);
        assert_eq!(s[0].rtt_us, vec![25_000.0; 3]);
        assert_eq!(s[0].links, vec![6; 3]);
        assert!(
            s[0].message().contains("hosts a and b"),
            "{}",
            s[0].message()
        );
        // Below the floor: nothing.
        let mut low = rs.clone();
        for (_, peers) in &mut low {
            for (_, w) in peers {
                for v in w.iter_mut().flatten() {
                    *v = v.min(900.0);
                }
            }
        }
        assert!(slow_links(&low, host).is_empty());
        // Two hosts only: one link, nothing to stand out from.
        let two = |o: u32| Some(["a", "b", "a", "b", "a"][o as usize].to_string());
        assert!(slow_links(&rs, two).is_empty());
        // A window unmeasured: none.
        let mut gap = rs.clone();
        gap[0].1.last_mut().unwrap().1[1] = None;
        gap[1].1.last_mut().unwrap().1[1] = None;
        gap[4].1[1].1[1] = None;
        assert!(slow_links(&gap, host).is_empty());
    }

    /// An OSD is slow when it stood out in every kept window, above the
    /// floor; not for one window, not below the floor, not among fewer
    /// than three OSDs reporting.
    #[test]
    fn an_osd_is_slow_when_it_stands_out_in_every_window() {
        let w = |v: [f64; 3]| v.iter().map(|&x| Some(x)).collect::<Vec<_>>();
        let rs = vec![
            (0, w([400.0, 500.0, 450.0])),
            (1, w([500.0, 400.0, 480.0])),
            (2, w([20_000.0, 30_000.0, 25_000.0])),
            (3, w([600.0, 20_000.0, 500.0])),
            (4, w([450.0, 450.0, 450.0])),
        ];
        let s = slow_osds(&rs);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].osd, 2);
        assert_eq!(s[0].median_us, vec![500.0, 500.0, 480.0]);
        assert_eq!(s[0].osds, vec![5, 5, 5]);
        assert!(s[0].message().contains("osd.2") && s[0].message().contains("20.0 ms"));
        // Below the floor nothing is slow, however far apart.
        let low = vec![(0, w([50.0; 3])), (1, w([60.0; 3])), (2, w([900.0; 3]))];
        assert!(slow_osds(&low).is_empty());
        // Two OSDs: no median to stand out from; a window missing: none.
        assert!(slow_osds(&rs[1..3]).is_empty());
        let mut gap = rs.clone();
        gap[2].1[1] = None;
        assert!(slow_osds(&gap).is_empty());
        // Restless: standing out in a window at least (osd.3 in one).
        assert_eq!(restless_osds(&rs), vec![2, 3]);
        assert_eq!(restless_osds(&gap), vec![2, 3]);
        // Nothing to judge: none.
        assert!(restless_osds(&rs[1..3]).is_empty());
    }
}
