//! `nacre plan`: reads a cluster description (TOML) and prints what
//! `nacre-plan` estimates for it.

use std::path::PathBuf;

use anyhow::Context;
use nacre_plan::estimate::{Bound, Limited, Recovery};
use nacre_plan::loss::Loss;
use nacre_plan::{Description, Plan};

use crate::Format;

#[derive(clap::Args)]
pub struct PlanArgs {
    /// The cluster description (TOML; `nacre plan --example` prints one
    /// to start from, docs/PLAN.md explains every field).
    #[arg(required_unless_present = "example")]
    file: Option<PathBuf>,
    /// Print an example description and stop.
    #[arg(long)]
    example: bool,
    /// Output: a table for people, or JSON for scripts.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    if a.example {
        print!("{}", nacre_plan::EXAMPLE);
        return Ok(());
    }
    let path = a.file.context("give the description's file")?;
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let cluster = Description::parse(&text)
        .and_then(|d| d.resolve())
        .with_context(|| format!("{}", path.display()))?;
    let plan = nacre_plan::plan(&cluster)?;
    match a.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
        Format::Table => print!("{}", table(&plan)),
    }
    Ok(())
}

fn bound(b: Bound) -> &'static str {
    match b {
        Bound::Disks => "disks",
        Bound::Network => "network",
        Bound::RecoveryRate => "recovery rate",
        Bound::NoRoom => "nowhere to rebuild",
        Bound::NothingLost => "nothing lost",
        Bound::NoCopyLeft => "no copy left",
    }
}

fn limited(l: &Limited, unit: &str) -> String {
    format!("{:.0} {unit} ({})", l.value, bound(l.bound))
}

fn duration(s: f64) -> String {
    let m = (s / 60.0).round() as u64;
    match m {
        0..=119 => format!("{m} min"),
        _ if m < 48 * 60 => format!("{} h {} min", m / 60, m % 60),
        _ => format!("{:.1} days", s / 86_400.0),
    }
}

fn recovery(r: &Recovery) -> String {
    match r.rate_mbps.bound {
        Bound::NoRoom => format!(
            "{:.1} TB wait for the host's return ({}): no room to rebuild it elsewhere",
            r.lost_tb,
            duration(r.window_s)
        ),
        Bound::NothingLost => "held no PG: nothing to rebuild".into(),
        Bound::NoCopyLeft => "one copy per PG: its data is lost".into(),
        _ => format!(
            "{:.1} TB rebuilt at {} ({} PGs: {} primaries, {} OSDs read, {} written): {} with the out delay",
            r.lost_tb,
            limited(&r.rate_mbps, "MB/s"),
            r.pgs,
            r.primaries,
            r.sources,
            r.targets,
            duration(r.window_s)
        ),
    }
}

fn loss(l: &Loss) -> String {
    let how = match l.loss_sets {
        Some(n) => format!("{n} loss sets counted"),
        None => "expected for an even spread".into(),
    };
    format!(
        "{:.2e} per year (MTTDL {:.2e} years; {how})",
        l.annual_probability, l.mttdl_years
    )
}

fn table(p: &Plan) -> String {
    let s = &p.speed;
    let mut rows = vec![
        (
            "cluster",
            format!(
                "{} hosts, {} OSDs, {}, {} PGs ({:.0} per OSD)",
                p.hosts, p.osds, p.scheme, p.pgs, p.pgs_per_osd
            ),
        ),
        (
            "capacity",
            format!(
                "{:.1} TB usable ({:.1} TB raw, {:.1} TB of it placeable)",
                p.capacity.usable_tb, p.capacity.raw_tb, p.capacity.placeable_raw_tb
            ),
        ),
        ("linear write", limited(&s.write_mbps, "MB/s")),
        ("linear read", limited(&s.read_mbps, "MB/s")),
        ("4 KiB write", limited(&s.write_iops, "IOPS")),
        ("4 KiB read", limited(&s.read_iops, "IOPS")),
        (
            "QD1 latency",
            format!(
                "write {:.0} µs, read {:.0} µs",
                s.write_lat_us, s.read_lat_us
            ),
        ),
        ("lost disk", recovery(&p.nacre.disk_recovery)),
        ("lost host", recovery(&p.nacre.host_recovery)),
        ("data loss", loss(&p.nacre.loss)),
    ];
    if let Some(e) = &p.even {
        rows.push(("PGs at random:", String::new()));
        rows.push(("  lost disk", recovery(&e.disk_recovery)));
        rows.push(("  lost host", recovery(&e.host_recovery)));
        rows.push(("  data loss", loss(&e.loss)));
    }
    for w in &p.warnings {
        rows.push(("warning", w.clone()));
    }
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<16} {v}\n"));
    }
    out.push_str(
        "Estimates from the description (docs/PLAN.md has the rules); MB/s = 10^6 bytes/s, TB = 10^12 bytes.\n",
    );
    out
}
