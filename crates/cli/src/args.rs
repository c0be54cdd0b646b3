//! Parsing of sizes and durations given on the command line.

use std::time::Duration;

/// The units a size may carry (binary: K = 1024).
pub const SIZE_UNITS: &str = "B, K/KiB, M/MiB, G/GiB, T/TiB (binary)";

/// "4G", "1.5G", "128K", "64MiB", "512" (bytes). Binary units; a fraction
/// is rounded down to whole bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad =
        || format!("size {s:?}: expected a number and a unit: {SIZE_UNITS}, e.g. 20G or 1.5T");
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(bad());
    }
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        u => return Err(format!("size {s:?}: unknown unit {u:?}; use {SIZE_UNITS}")),
    };
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let mut bytes = whole
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))?;
    if !frac.is_empty() {
        // digits / 10^n of a unit, exactly, in 128 bits.
        let digits: u128 = frac.parse().map_err(|_| bad())?;
        let scale = 10u128.checked_pow(frac.len() as u32).ok_or_else(bad)?;
        let part = digits * (1u128 << shift) / scale;
        bytes = bytes
            .checked_add(part as u64)
            .ok_or_else(|| format!("size {s:?} is too large"))?;
    }
    Ok(bytes)
}

/// A rate in bytes per second: a size ([`parse_size`]) above zero, an
/// optional "/s" after it ("50M", "50M/s").
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let n = parse_size(t.strip_suffix("/s").unwrap_or(t))?;
    if n == 0 {
        return Err(format!("rate {s:?}: must be above zero"));
    }
    Ok(n)
}

/// A fraction above 0 and at most 1 ("0.95"), or a percentage ("95%").
pub fn parse_ratio(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(p) => (p, 100.0),
        None => (t, 1.0),
    };
    let r = num.trim().parse::<f64>().map(|x| x / scale).map_err(|_| {
        format!("ratio {s:?}: expected a fraction like 0.95 or a percentage like 95%")
    })?;
    if !(r > 0.0 && r <= 1.0) {
        return Err(format!("ratio {s:?}: must be above 0 and at most 1 (100%)"));
    }
    Ok(r)
}

/// A factor of 0 or more ("1.5"; 0 turns the check off).
pub fn parse_factor(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 => Ok(f),
        _ => Err(format!(
            "factor {s:?}: expected a number of 0 or more, like 1.5 (0: off)"
        )),
    }
}

/// What the leader does with an OSD slow-OSD detection names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SlowOsdAction {
    /// It leads no PG while another member is up (until calm for 30 s).
    Demote,
    /// Only `nacre status` names it (SLOW_OSD).
    Warn,
}

/// `--nearfull-ratio` and `--full-ratio` together: near full comes first.
pub fn check_ratios(nearfull: f64, full: f64) -> anyhow::Result<(f64, f64)> {
    if nearfull > full {
        anyhow::bail!(
            "--nearfull-ratio {nearfull} is above --full-ratio {full}: an OSD must be near full before it is full"
        );
    }
    Ok((nearfull, full))
}

/// "10s", "500ms", "2m", "10" (seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration_upto(s, 86_400.0)?;
    if d.as_secs_f64() > 86_400.0 {
        return Err(format!("duration {s:?} must be between 0 and 24 hours"));
    }
    Ok(d)
}

/// A time between scheduled tasks: like [`parse_duration`], also in
/// hours (h) and days (d), up to a year.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    parse_duration_upto(s, 365.0 * 86_400.0)
}

fn parse_duration_upto(s: &str, max_secs: f64) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("duration {s:?}: expected a number with ms/s/m"))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        "h" if max_secs > 86_400.0 => n * 3600.0,
        "d" if max_secs > 86_400.0 => n * 86_400.0,
        u => return Err(format!("duration {s:?}: unknown unit {u:?}")),
    };
    if !(0.0..=max_secs).contains(&secs) {
        return Err(format!(
            "duration {s:?} must be between 0 and {} days",
            max_secs / 86_400.0
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A wire address: `tcp:HOST:PORT`, `unix:PATH`, or `HOST:PORT` (TCP).
pub fn parse_addr(s: &str) -> Result<nacre_io::net::Addr, String> {
    let t = s.trim();
    if t.starts_with("tcp:") || t.starts_with("unix:") {
        t.parse()
    } else {
        format!("tcp:{t}").parse()
    }
}

/// A `--metrics` address: HOST:PORT that resolves (an HTTP endpoint; port
/// 0 picks a free one).
pub fn parse_metrics_addr(s: &str) -> Result<String, String> {
    use std::net::ToSocketAddrs;
    let t = s.trim();
    let resolved = t
        .to_socket_addrs()
        .map_err(|e| format!("{t:?} is not HOST:PORT (e.g. 127.0.0.1:9283 or [::]:9283): {e}"))?;
    if resolved.count() == 0 {
        return Err(format!("{t:?} names no address"));
    }
    Ok(t.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn metrics_addresses() {
        assert!(super::parse_metrics_addr("127.0.0.1:9283").is_ok());
        assert!(super::parse_metrics_addr("[::1]:0").is_ok());
        for bad in ["9283", "unix:/tmp/x", "127.0.0.1", "127.0.0.1:99999", ""] {
            assert!(super::parse_metrics_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn addresses() {
        use nacre_io::net::Addr;
        assert_eq!(
            super::parse_addr("10.0.0.1:6800"),
            Ok(Addr::Tcp("10.0.0.1:6800".into()))
        );
        assert_eq!(super::parse_addr("tcp:h:1"), Ok(Addr::Tcp("h:1".into())));
        assert_eq!(
            super::parse_addr("unix:/run/x"),
            Ok(Addr::Unix("/run/x".into()))
        );
        assert!(super::parse_addr("10.0.0.1").is_err());
        assert!(super::parse_addr("h:99999").is_err());
    }

    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("128K"), Ok(128 << 10));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("0.5k"), Ok(512));
        assert_eq!(parse_size(".25M"), Ok(256 << 10));
        assert!(parse_size("1.2.3G").is_err());
        assert!(parse_size("10X").unwrap_err().contains("K/KiB"));
        assert!(parse_size("G").unwrap_err().contains("e.g. 20G"));
        assert!(parse_size("").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("50M"), Ok(50 << 20));
        assert_eq!(parse_rate("50M/s"), Ok(50 << 20));
        assert!(parse_rate("0").unwrap_err().contains("above zero"));
        assert!(parse_rate("fast").is_err());
    }

    #[test]
    fn ratios() {
        assert_eq!(parse_ratio("0.95"), Ok(0.95));
        assert_eq!(parse_ratio("85%"), Ok(0.85));
        assert_eq!(parse_ratio("1"), Ok(1.0));
        assert!(parse_ratio("0").unwrap_err().contains("above 0"));
        assert!(parse_ratio("120%").is_err());
        assert!(parse_ratio("NaN").is_err());
        assert!(parse_ratio("most").unwrap_err().contains("fraction"));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("1h").is_err());
        assert_eq!(parse_interval("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_interval("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_interval("0"), Ok(Duration::ZERO));
        assert!(parse_interval("400d").is_err());
        assert!(parse_duration("x").is_err());
    }
}

/// When and how fast each OSD scrubs its PGs (`nacre_osd::ScrubConfig`).
#[derive(clap::Args, Clone, Debug)]
pub struct ScrubArgs {
    /// Time between light scrubs of a PG (its copies' versions and logs
    /// compared), e.g. 24h; 0 never (`nacre pg scrub` still does).
    #[arg(long, value_parser = parse_interval, default_value = "24h")]
    pub scrub_interval: Duration,
    /// Time between deep scrubs of a PG (every copy read whole, each
    /// 4 KiB checked against its checksum, the bytes compared), e.g. 7d;
    /// 0 never.
    #[arg(long, value_parser = parse_interval, default_value = "7d")]
    pub deep_scrub_interval: Duration,
    /// Bytes per second an OSD's deep scrubs read, over every copy, e.g.
    /// 50M.
    #[arg(long, value_parser = parse_rate, default_value = "50M")]
    pub scrub_rate: u64,
}

impl ScrubArgs {
    pub fn config(&self) -> nacre_osd::ScrubConfig {
        nacre_osd::ScrubConfig {
            interval: self.scrub_interval,
            deep_interval: self.deep_scrub_interval,
            bytes_per_s: self.scrub_rate,
        }
    }
}

/// The `nacre osd run` flags that give `s`.
pub fn scrub_flags(s: &nacre_osd::ScrubConfig) -> Vec<String> {
    vec![
        "--scrub-interval".into(),
        format!("{}", s.interval.as_secs_f64()),
        "--deep-scrub-interval".into(),
        format!("{}", s.deep_interval.as_secs_f64()),
        "--scrub-rate".into(),
        s.bytes_per_s.to_string(),
    ]
}
