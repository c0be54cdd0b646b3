//! Pictures of benchmark runs (`nacre bench --plot FILE.svg|.png`): per
//! test, IOPS over time and the p50 and p99 latency over time, one colour
//! per run, so two runs compare by eye.
//!
//! Text needs a TrueType font, loaded from the system (DejaVu Sans, Debian
//! `fonts-dejavu-core`) or from `NACRE_PLOT_FONT`.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;

use crate::suite::SuiteResult;

/// Where a sans-serif TrueType font is looked for.
const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

const WIDTH_PX: u32 = 1400;
const ROW_PX: u32 = 300;
const COLOURS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

fn font() -> anyhow::Result<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    let r = LOADED.get_or_init(|| {
        let given = std::env::var("NACRE_PLOT_FONT").ok();
        let candidates: Vec<String> = given
            .into_iter()
            .chain(FONT_PATHS.iter().map(|s| s.to_string()))
            .collect();
        for p in &candidates {
            if let Ok(bytes) = std::fs::read(p) {
                // Registered once for the process's life.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                    .map_err(|_| format!("{p}: not a TrueType font"));
            }
        }
        Err(format!(
            "plotting needs a TrueType font: install fonts-dejavu-core, or set NACRE_PLOT_FONT to a .ttf file (looked in {})",
            candidates.join(", ")
        ))
    });
    r.clone().map_err(|e| anyhow!(e))
}

fn drew<T, E: std::fmt::Display>(r: Result<T, E>) -> anyhow::Result<T> {
    r.map_err(|e| anyhow!("drawing: {e}"))
}

/// The picture's format, from `path`'s extension.
fn extension(path: &Path) -> anyhow::Result<&'static str> {
    let ext = (path.extension().and_then(|e| e.to_str()))
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "svg" => Ok("svg"),
        "png" => Ok("png"),
        other => bail!(
            "{}: give a .svg or .png file (not {other:?})",
            path.display()
        ),
    }
}

/// Whether a picture can be drawn into `path` (its extension, a font):
/// asked before a run, not after it.
pub fn ready(path: &Path) -> anyhow::Result<()> {
    extension(path)?;
    font()
}

/// Draws `runs` (label, results) into `path`: SVG or PNG by its extension.
pub fn plot(path: &Path, runs: &[(&str, &[SuiteResult])]) -> anyhow::Result<()> {
    let ext = extension(path)?;
    let Some((_, first)) = runs.first() else {
        bail!("nothing to plot");
    };
    if first.is_empty() {
        bail!("nothing to plot: no tests");
    }
    font()?;
    let height = ROW_PX * first.len() as u32;
    match ext {
        "svg" => {
            let root = SVGBackend::new(path, (WIDTH_PX, height)).into_drawing_area();
            draw(&root, runs)?;
            drew(root.present())
        }
        "png" => {
            let root = BitMapBackend::new(path, (WIDTH_PX, height)).into_drawing_area();
            draw(&root, runs)?;
            drew(root.present())
        }
        _ => unreachable!("extension() names svg or png"),
    }
    .with_context(|| format!("writing {}", path.display()))
}

/// A panel with its caption and axes: seconds across, `y` up.
fn panel<'a, DB, Y>(
    area: &'a DrawingArea<DB, Shift>,
    caption: String,
    t_max: f64,
    y: Y,
) -> anyhow::Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y::CoordDescType>>>
where
    DB: DrawingBackend,
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = drew(
        ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..t_max, y),
    )?;
    drew(
        chart
            .configure_mesh()
            .x_desc("seconds")
            .label_style(("sans-serif", 12))
            .light_line_style(TRANSPARENT)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .draw(),
    )?;
    Ok(chart)
}

/// The series' labels, in a box.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> anyhow::Result<()> {
    drew(
        chart
            .configure_series_labels()
            .label_font(("sans-serif", 12))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw(),
    )
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[(&str, &[SuiteResult])],
) -> anyhow::Result<()> {
    drew(root.fill(&WHITE))?;
    let tests: Vec<&str> = runs[0].1.iter().map(|r| r.name.as_str()).collect();
    let panels = root.split_evenly((tests.len(), 2));
    for (i, name) in tests.iter().enumerate() {
        let of = |results: &[SuiteResult]| results.iter().find(|r| r.name == *name).cloned();
        let found: Vec<(usize, &str, SuiteResult)> = (runs.iter().enumerate())
            .filter_map(|(k, (label, rs))| of(rs).map(|r| (k, *label, r)))
            .collect();
        let t_max = (found.iter())
            .flat_map(|(_, _, r)| r.series.iter().map(|s| s.t_s))
            .fold(0.1, f64::max);
        // IOPS over time.
        let iops_max = (found.iter())
            .flat_map(|(_, _, r)| r.series.iter().map(|s| s.iops))
            .fold(1.0, f64::max);
        let mut chart = panel(
            &panels[2 * i],
            format!("{name}: IOPS"),
            t_max,
            0.0..iops_max * 1.1,
        )?;
        for (k, label, r) in &found {
            let c = COLOURS[k % COLOURS.len()];
            let points = r.series.iter().map(|s| (s.t_s, s.iops));
            drew(chart.draw_series(LineSeries::new(points, c.stroke_width(2))))?
                .label(*label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
        }
        legend(&mut chart)?;
        // Latency over time, p50 and p99, on a log scale (intervals in
        // which nothing completed have none).
        let lats = || {
            (found.iter())
                .flat_map(|(_, _, r)| r.series.iter())
                .flat_map(|s| [s.p50_us, s.p99_us])
                .filter(|&v| v > 0.0)
        };
        let lo = lats().fold(f64::INFINITY, f64::min);
        let hi = lats().fold(0.0, f64::max);
        let (lo, hi) = if lo.is_finite() && hi > 0.0 {
            (lo * 0.8, hi * 1.25)
        } else {
            (1.0, 10.0)
        };
        let mut chart = panel(
            &panels[2 * i + 1],
            format!("{name}: latency p50, p99 (µs)"),
            t_max,
            (lo..hi).log_scale(),
        )?;
        for (k, label, r) in &found {
            let c = COLOURS[k % COLOURS.len()];
            for (pct, width, get) in [
                (
                    "p50",
                    2,
                    (|s: &crate::stats::Sample| s.p50_us) as fn(&_) -> f64,
                ),
                ("p99", 1, |s: &crate::stats::Sample| s.p99_us),
            ] {
                let points: Vec<(f64, f64)> = (r.series.iter())
                    .map(|s| (s.t_s, get(s)))
                    .filter(|p| p.1 > 0.0)
                    .collect();
                let style = if pct == "p50" {
                    c.stroke_width(width)
                } else {
                    c.mix(0.5).stroke_width(width)
                };
                drew(chart.draw_series(LineSeries::new(points, style)))?
                    .label(format!("{label} {pct}"))
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
            }
        }
        legend(&mut chart)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Sample, Summary};

    fn run(scale: f64) -> Vec<SuiteResult> {
        ["randwrite-4k-qd1", "read-4m-qd16"]
            .iter()
            .map(|name| SuiteResult {
                name: name.to_string(),
                summary: Summary::default(),
                series: (1..=20)
                    .map(|i| Sample {
                        t_s: f64::from(i) * 0.5,
                        iops: scale * 1000.0 * (1.0 + f64::from(i % 3)),
                        p50_us: 100.0 / scale,
                        p99_us: if i == 7 { 0.0 } else { 400.0 / scale },
                        max_us: 900.0,
                    })
                    .collect(),
            })
            .collect()
    }

    /// Every tag opened is closed, in order (enough to catch a truncated
    /// or interleaved file).
    fn well_formed_xml(s: &str) -> Result<usize, String> {
        let mut stack: Vec<String> = Vec::new();
        let mut tags = 0;
        let mut rest = s;
        while let Some(open) = rest.find('<') {
            let close = rest[open..].find('>').ok_or("an unclosed <")? + open;
            let tag = &rest[open + 1..close];
            rest = &rest[close + 1..];
            if tag.starts_with('?') || tag.starts_with('!') {
                continue;
            }
            tags += 1;
            if let Some(name) = tag.strip_prefix('/') {
                match stack.pop() {
                    Some(top) if top == name.trim() => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
            } else if !tag.ends_with('/') {
                let name = tag.split_whitespace().next().unwrap_or("").to_string();
                stack.push(name);
            }
        }
        if stack.is_empty() {
            Ok(tags)
        } else {
            Err(format!("unclosed: {stack:?}"))
        }
    }

    #[test]
    fn plots_two_runs_as_svg_and_png() {
        let dir = tempfile::tempdir().unwrap();
        let (new, old) = (run(1.0), run(0.7));
        let runs: [(&str, &[SuiteResult]); 2] = [("new", &new), ("old", &old)];
        let svg = dir.path().join("runs.svg");
        plot(&svg, &runs).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("<svg") && text.contains("randwrite-4k-qd1: IOPS"));
        let tags = well_formed_xml(&text).unwrap();
        assert!(tags > 50, "{tags} tags");
        assert!(
            text.matches("<polyline").count() >= 2 * 2 * 3,
            "a line per run and figure"
        );

        let png = dir.path().join("runs.png");
        plot(&png, &runs).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let reader = decoder.read_info().unwrap();
        assert_eq!(
            (reader.info().width, reader.info().height),
            (WIDTH_PX, 2 * ROW_PX)
        );

        let err = plot(&dir.path().join("runs.gif"), &runs).unwrap_err();
        assert!(format!("{err:#}").contains(".svg or .png"), "{err:#}");
        assert!(plot(&svg, &[]).is_err());
    }
}
