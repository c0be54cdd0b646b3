//! Slow-OSD detection: an OSD whose own store writes (its disk as the OSD
//! sees it, with no network in the figure) stand far above its peers' —
//! [`SLOW_FACTOR`] times the median of the OSDs reporting, in each of the
//! last [`LATENCY_WINDOWS_KEPT`] windows of [`LATENCY_WINDOW`] (30 s) —
//! is named, with what was measured. `nacre status` raises `SLOW_OSD`
//! for each.
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
        let ms = |us: f64| format!("{:.1} ms", us / 1000.0);
        let factor = (self.p99_us.iter().zip(&self.median_us))
            .map(|(p, m)| p / m)
            .fold(f64::INFINITY, f64::min);
        format!(
            "osd.{}: its store writes' p99 is {} (the median of {} OSDs: {}), at least {factor:.0}× the median in each of the last {} windows of {} s: a slow or failing disk?",
            self.osd,
            ms(self.p99_us[0]),
            self.osds[0],
            ms(self.median_us[0]),
            self.p99_us.len(),
            LATENCY_WINDOW.as_secs()
        )
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
