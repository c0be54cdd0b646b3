//! A cluster on etcd run as separate daemons, the way an operator deploys
//! one (docs/internals/cluster.md *Running on many hosts*): a real
//! 3-member etcd (Debian's `etcd-server`, which `scripts/test.sh`
//! installs), `nacre cluster init`, `nacre osd init` per device, `nacre
//! pool create`, two `nacre mon`, three `nacre osd run`, one `nacre
//! gateway nbd`, each a process of its own. Here every "host" is this
//! machine's loopback; the scenarios across network namespaces come with
//! the harness of issue 10.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
#[path = "../../etcd/tests/common/mod.rs"]
#[allow(dead_code)]
mod etcd;
use common::*;
use etcd::free_port;

/// A real etcd, the daemons of one cluster on it, and `nacre` against it.
struct Daemons {
    procs: Procs,
    cli: EtcdCli,
    etcd: etcd::EtcdCluster,
}

impl Daemons {
    fn new() -> Daemons {
        let etcd = etcd::EtcdCluster::start(3);
        Daemons {
            procs: Procs::new(),
            cli: EtcdCli { urls: etcd.urls() },
            etcd,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.procs.path(name)
    }

    fn ok(&self, args: &[&str]) -> String {
        self.cli.ok(args)
    }

    fn refused(&self, args: &[&str]) -> String {
        self.cli.refused(args)
    }

    fn status(&self) -> serde_json::Value {
        self.cli.status()
    }

    fn status_until(&self, what: &str, ok: impl Fn(&serde_json::Value) -> bool) {
        self.cli.status_until(what, ok)
    }

    /// Starts daemon `name`: `nacre ARGS --etcd URLS`.
    fn spawn(&mut self, name: &str, args: &[&str]) {
        let mut c = Command::new(env!("CARGO_BIN_EXE_nacre"));
        c.args(args).args(["--etcd", &self.cli.urls]);
        self.procs.spawn(name, c);
    }

    fn kill9(&mut self, name: &str) {
        self.procs.kill9(name);
    }

    fn stop(&mut self, name: &str) {
        self.procs.stop(name);
    }
}

fn dev(d: &Daemons, i: usize) -> String {
    d.path(&format!("osd{i}.img")).display().to_string()
}

#[test]
fn a_cluster_on_etcd_keeps_every_acknowledged_write_through_daemon_failures() {
    let mut d = Daemons::new();
    // Made once; a second init under the same prefix is refused.
    assert!(d.ok(&["cluster", "init"]).contains("created cluster"));
    assert!(d.refused(&["cluster", "init"]).contains("exists already"));
    for i in 0..3 {
        let addr = format!("127.0.0.1:{}", free_port());
        let host = format!("h{i}");
        let dev = dev(&d, i);
        let out = d.ok(&[
            "osd", "init", "--dev", &dev, "--size", "1G", "--addr", &addr, "--host", &host,
        ]);
        assert!(out.contains(&format!("osd.{i} of cluster")), "{out}");
    }
    // A device that holds an OSD is not formatted again by mistake.
    let again = d.refused(&["osd", "init", "--dev", &dev(&d, 0), "--addr", "127.0.0.1:1"]);
    assert!(again.contains("holds osd.0 of cluster"), "{again}");
    // Nor one that holds other data (a file system, a partition table).
    let junk = d.path("junk.img");
    let mut bytes = vec![0u8; 1 << 20];
    bytes[1024..1028].copy_from_slice(b"XFSB");
    std::fs::write(&junk, &bytes).unwrap();
    let junk = junk.display().to_string();
    let held = d.refused(&["osd", "init", "--dev", &junk, "--addr", "127.0.0.1:1"]);
    assert!(held.contains("holds data"), "{held}");
    assert!(d
        .refused(&[
            "osd",
            "init",
            "--dev",
            &junk,
            "--addr",
            "127.0.0.1:1",
            "--pg-logs",
            "0"
        ])
        .contains("--pg-logs"));
    // Another cluster under another prefix of the same etcd: its device is
    // refused by this one's.
    // (Its commands say what they made in JSON for scripts.)
    let made: serde_json::Value = serde_json::from_str(
        &d.ok(&["cluster", "init", "--prefix", "/other/", "--format", "json"]),
    )
    .unwrap();
    assert_eq!(made["prefix"], "/other/", "{made}");
    let other = d.path("other.img").display().to_string();
    let osd: serde_json::Value = serde_json::from_str(&d.ok(&[
        "osd",
        "init",
        "--prefix",
        "/other/",
        "--dev",
        &other,
        "--size",
        "1G",
        "--addr",
        "127.0.0.1:1",
        "--format",
        "json",
    ]))
    .unwrap();
    assert_eq!(
        (&osd["osd"], &osd["cluster"]),
        (&0.into(), &made["cluster"]),
        "{osd}"
    );
    let foreign = d.refused(&["osd", "run", "--dev", &other]);
    assert!(foreign.contains("not of this cluster"), "{foreign}");
    // Too few hosts for three copies apart is refused, with why.
    let refused = d.refused(&["pool", "create", "big", "--replicas", "4"]);
    assert!(refused.contains("failure domains"), "{refused}");
    let rbd: serde_json::Value =
        serde_json::from_str(&d.ok(&["pool", "create", "rbd", "--pgs", "32", "--format", "json"]))
            .unwrap();
    assert_eq!(
        (&rbd["name"], &rbd["pgs"], &rbd["replicas"]),
        (&"rbd".into(), &32.into(), &3.into()),
        "{rbd}"
    );
    assert!(d.ok(&["pool", "ls"]).contains("rbd"));

    let mons: Vec<String> = (0..2)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    // Every daemon serves its metrics (osd.0 alone of the OSDs).
    let metrics: Vec<String> = (0..4)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    for (i, a) in mons.iter().enumerate() {
        d.spawn(
            &format!("mon{i}"),
            &["mon", "--addr", a, "--metrics", &metrics[i]],
        );
    }
    for i in 0..3 {
        let dev = dev(&d, i);
        let mut args = vec!["osd", "run", "--dev", &dev];
        if i == 0 {
            args.extend(["--metrics", &metrics[2]]);
        }
        d.spawn(&format!("osd{i}"), &args);
    }
    let sock = d.path("nbd.sock");
    let listen = format!("unix:{}", sock.display());
    d.spawn(
        "gw",
        &[
            "gateway",
            "nbd",
            "--listen",
            &listen,
            "--metrics",
            &metrics[3],
        ],
    );
    d.status_until("HEALTH_OK with a leader", |s| {
        healthy(s) && leader_of(s).is_some()
    });
    d.ok(&["volume", "create", "v", "--size", "256M"]);
    wait_socket(&sock);

    let uri = format!("nbd+unix:///v?socket={}", sock.display());
    let stop = Arc::new(Mutex::new(false));
    let log = Arc::new(Mutex::new(AckLog::default()));
    let writer = {
        let (uri, stop, log) = (uri.clone(), stop.clone(), log.clone());
        std::thread::spawn(move || fua_writer(uri, 64 << 20, 7, stop, log))
    };
    let mut acks = 300;
    wait_acks(&log, acks);
    // One monitor leads, both see the map; osd.0 speaks for itself; the
    // gateway counts the writes it answered.
    let text: Vec<String> = (metrics.iter())
        .map(|a| scrape(&format!("http://{a}/metrics")))
        .collect();
    let leading: Vec<f64> = (text[..2].iter())
        .map(|t| sample(t, "nacre_mon_leader").unwrap())
        .collect();
    assert_eq!(leading.iter().sum::<f64>(), 1.0, "{text:?}");
    // The map's families come from the leader only (once per cluster).
    for (t, &l) in text[..2].iter().zip(&leading) {
        let epoch = sample(t, "nacre_cluster_epoch");
        assert_eq!(epoch.is_some(), l == 1.0, "{t}");
        if l == 1.0 {
            assert!(epoch.unwrap() > 0.0, "{t}");
            assert_eq!(
                sample(t, r#"nacre_pool_pgs{pool="rbd"}"#),
                Some(32.0),
                "{t}"
            );
            assert_eq!(sample(t, r#"nacre_osd_up{osd="2"}"#), Some(1.0), "{t}");
        }
    }
    let osd = &text[2];
    assert!(sample(osd, r#"nacre_osd_ops_total{osd="0",op="write"}"#).is_some_and(|n| n > 0.0));
    assert!(!osd.contains(r#"osd="1""#), "{osd}");
    let written = sample(&text[3], r#"nacre_nbd_requests_total{command="write"}"#).unwrap();
    assert!(written >= 300.0, "{}", text[3]);
    // A second pool while a monitor leads (its leader makes it, in a new
    // epoch), two copies; a writer of its own through everything below.
    let made = d.ok(&[
        "pool",
        "create",
        "fast",
        "--replicas",
        "2",
        "--min-size",
        "1",
        "--pgs",
        "16",
    ]);
    assert!(made.contains("created pool fast (id 2"), "{made}");
    d.status_until("HEALTH_OK with two pools", |s| {
        healthy(s) && s["pools"].as_array().is_some_and(|p| p.len() == 2)
    });
    let w: serde_json::Value = serde_json::from_str(&d.ok(&[
        "volume", "create", "w", "--size", "64M", "--pool", "fast", "--format", "json",
    ]))
    .unwrap();
    assert_eq!(
        (&w["name"], &w["pool"], &w["size_bytes"]),
        (&"w".into(), &"fast".into(), &(64u64 << 20).into()),
        "{w}"
    );
    let uri2 = format!("nbd+unix:///w?socket={}", sock.display());
    let stop2 = Arc::new(Mutex::new(false));
    let log2 = Arc::new(Mutex::new(AckLog::default()));
    let writer2 = {
        let (uri, stop, log) = (uri2.clone(), stop2.clone(), log2.clone());
        std::thread::spawn(move || fua_writer(uri, 32 << 20, 9, stop, log))
    };
    wait_acks(&log2, 100);

    // The elected monitor dies: the other takes over, writes go on.
    let st = d.status();
    let old = leader_of(&st).unwrap();
    let which = mons.iter().position(|a| old.ends_with(a.as_str())).unwrap();
    d.kill9(&format!("mon{which}"));
    d.status_until("another leader", |s| {
        leader_of(s).is_some_and(|l| l != old) && healthy(s)
    });
    acks += 300;
    wait_acks(&log, acks);
    // It comes back as a standby.
    let a = mons[which].clone();
    d.spawn(&format!("mon{which}"), &["mon", "--addr", &a]);

    // The new leader pauses past its lease (SIGSTOP: a long stall, or a
    // partition from etcd): the standby takes over; resumed, the old one
    // steps down instead of answering as leader.
    let st = d.status();
    let old = leader_of(&st).unwrap();
    let paused = 1 - which;
    let pid = d.procs.pid(&format!("mon{paused}"));
    // SAFETY: signals to our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    d.status_until("the standby leading", |s| {
        leader_of(s).is_some_and(|l| l != old) && healthy(s)
    });
    unsafe { libc::kill(pid, libc::SIGCONT) };
    acks += 300;
    wait_acks(&log, acks);
    let t0 = Instant::now();
    while !std::fs::read_to_string(d.path(&format!("mon{paused}.log")))
        .unwrap()
        .contains("leadership lost")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the paused leader did not step down"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ne!(leader_of(&d.status()), Some(old));

    // An OSD dies: two copies of three go on; it comes back and catches up.
    d.kill9("osd1");
    d.status_until("osd.1 down", |s| s["osds"]["up"] == 2);
    acks += 300;
    wait_acks(&log, acks);
    let dev1 = dev(&d, 1);
    d.spawn("osd1", &["osd", "run", "--dev", &dev1]);
    d.status_until("HEALTH_OK after osd.1 is back", healthy);

    // etcd loses its leader member: the cluster keeps serving.
    let e = d.etcd.wait_leader();
    d.etcd.kill(e);
    acks += 300;
    wait_acks(&log, acks);
    d.etcd.run(e);

    stop_and_verify(writer, &stop, &log, &uri, "daemons died and came back");
    stop_and_verify(
        writer2,
        &stop2,
        &log2,
        &uri2,
        "daemons died and came back (pool fast)",
    );
    assert!(log2.lock().unwrap().acks > 100);
    // The benchmark suite through the client library, on a temporary
    // volume it deletes.
    let b: serde_json::Value = serde_json::from_str(&d.ok(&[
        "bench",
        "--size",
        "16M",
        "--runtime",
        "300ms",
        "--format",
        "json",
    ]))
    .unwrap();
    let tests = b["nacre"].as_array().unwrap();
    assert_eq!(tests.len(), 6, "{b}");
    assert!(tests.iter().all(|t| t["ops"].as_u64() > Some(0)), "{b}");
    let vols: serde_json::Value =
        serde_json::from_str(&d.ok(&["volume", "ls", "--format", "json"])).unwrap();
    assert_eq!(vols.as_array().unwrap().len(), 2, "{vols}");
    // Every daemon stops cleanly at SIGTERM.
    for name in ["gw", "osd0", "osd1", "osd2", "mon0", "mon1"] {
        d.stop(name);
    }
}

/// Waits until something listens on the unix socket `p`.
fn wait_socket(p: &Path) {
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(p).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no gateway at {}",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
