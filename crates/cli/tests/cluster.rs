//! A cluster on one machine, end to end, on the real binary: `nacre up`
//! in a temporary dir, reached by clients nobody here wrote (nbdinfo,
//! nbdcopy, qemu-img, fio's nbd engine) and by Nacre's own NBD client.
//!
//! The tools come from Debian (libnbd-bin, qemu-utils, fio); scripts/test.sh
//! installs them.

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nacre_io::{rt, AlignedBuf};
use nacre_nbd::client::NbdClient;

fn nacre(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nacre"))
        .args(args)
        .output()
        .expect("run nacre")
}

fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn tool(name: &str) -> Command {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "{name} is missing: run scripts/test.sh, which installs libnbd-bin, qemu-utils and fio"
    );
    Command::new(name)
}

fn run_tool(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run tool");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `nacre up` in the background; killed on drop.
struct Up {
    dir: PathBuf,
    child: Option<Child>,
    args: Vec<String>,
}

impl Up {
    fn start(dir: &Path, extra: &[&str]) -> Up {
        let mut args: Vec<String> = vec!["up".into(), "--dir".into(), dir.to_str().unwrap().into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut u = Up {
            dir: dir.to_path_buf(),
            child: None,
            args,
        };
        u.spawn();
        u
    }

    fn spawn(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_nacre"))
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start nacre up");
        self.child = Some(child);
        let t0 = Instant::now();
        // Ready once this process has written its pid (it does so after
        // everything listens: a socket file or a lease left by a killed
        // predecessor proves nothing), the NBD socket answers and status
        // reports every OSD up and every PG active+clean.
        let pid = self.child.as_ref().unwrap().id().to_string();
        loop {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "nacre up did not come up"
            );
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("nacre up exited: {st}");
            }
            let started =
                std::fs::read_to_string(self.dir.join("nacre.pid")).is_ok_and(|p| p.trim() == pid);
            if started && UnixStream::connect(self.nbd_sock()).is_ok() {
                let out = nacre(&["status", "--dir", self.dir(), "--format", "json"]);
                if out.status.success() {
                    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                    // Every OSD up and every PG peered.
                    if v["osds"]["up"] == v["osds"]["total"]
                        && v["pgs"]["active_clean"] == v["pgs"]["total"]
                    {
                        return;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn dir(&self) -> &str {
        self.dir.to_str().unwrap()
    }

    fn nbd_sock(&self) -> PathBuf {
        self.dir.join("nbd.sock")
    }

    fn uri(&self, vol: &str) -> String {
        format!("nbd+unix:///{vol}?socket={}", self.nbd_sock().display())
    }

    /// SIGTERM and wait: a clean stop.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let st = c.wait().unwrap();
            assert!(st.success(), "nacre up exited with {st} after SIGTERM");
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    fn volume(&self, args: &[&str]) -> String {
        let mut a = vec!["volume"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--dir", self.dir()]);
        ok(nacre(&a))
    }
}

impl Up {
    fn status(&self) -> serde_json::Value {
        let out = ok(nacre(&["status", "--dir", self.dir(), "--format", "json"]));
        serde_json::from_str(&out).unwrap()
    }
}

/// Writes the raw image `img` into the export at `uri`.
fn qemu_convert(img: &Path, uri: &str) {
    run_tool(
        tool("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(img)
            .arg(uri),
    );
}

/// Fails unless the export at `uri` holds `img` (and zeros after it).
fn qemu_compare(img: &Path, uri: &str) {
    run_tool(
        tool("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(img)
            .arg(uri),
    );
}

impl Drop for Up {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn random_file(path: &Path, bytes: usize, seed: u64) {
    let mut x = seed | 1;
    let data: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(path, data).unwrap();
}

#[test]
fn real_nbd_clients_read_back_what_they_wrote() {
    let d = tempfile::tempdir().unwrap();
    let up = Up::start(&d.path().join("c"), &["--osd-size", "768M"]);
    up.volume(&["create", "vm1", "--size", "256M"]);
    let uri = up.uri("vm1");

    let info = run_tool(tool("nbdinfo").arg("--json").arg(&uri));
    let info: serde_json::Value = serde_json::from_str(&info).unwrap();
    let e = &info["exports"][0];
    assert_eq!(e["export-size"], 256 << 20);
    assert_eq!(e["can_flush"], true);
    assert_eq!(e["can_fua"], true);
    assert_eq!(e["can_trim"], true);
    assert_eq!(e["can_zero"], true);
    assert_eq!(e["can_multi_conn"], true);
    assert_eq!(e["block_size_minimum"], 512);
    let list = run_tool(tool("nbdinfo").arg("--list").arg(&uri));
    assert!(list.contains("vm1"), "{list}");

    // qemu-img: a random image into the export and compared back
    let img = d.path().join("rand.img");
    random_file(&img, 24 << 20, 7);
    qemu_convert(&img, &uri);
    qemu_compare(&img, &uri);

    // nbdcopy: the export back into a file
    let back = d.path().join("back.img");
    run_tool(tool("nbdcopy").arg(&uri).arg(&back));
    let a = std::fs::read(&img).unwrap();
    let b = std::fs::read(&back).unwrap();
    assert_eq!(b.len(), 256 << 20);
    assert!(a[..] == b[..a.len()], "nbdcopy read different bytes");
    assert!(
        b[a.len()..].iter().all(|&x| x == 0),
        "unwritten space must read as zeros"
    );

    // fio's nbd engine: random writes of mixed sizes, verified with crc32c
    let out = run_tool(tool("fio").args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bsrange=4k-192k",
        "--size=128M",
        "--iodepth=32",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--do_verify=1",
        "--output-format=json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out[out.find('{').unwrap()..]).unwrap();
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "{out}");
    assert!(job["write"]["io_bytes"].as_u64().unwrap() >= 128 << 20);
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() >= 128 << 20,
        "fio verified nothing"
    );

    // trim gives space back: the volume's objects go away
    let used = |up: &Up| {
        let s = up.status();
        s["capacity"]["objects"].as_f64().unwrap() as u64
    };
    let before = used(&up);
    let u = uri.clone();
    rt::block_on(async move {
        let c = NbdClient::connect(&u).await.unwrap();
        c.trim(0, 256 << 20).await.unwrap();
        c.disconnect().await;
    });
    let after = used(&up);
    assert!(
        before > 0 && after == 0,
        "objects before trim {before}, after {after}"
    );
}

/// 4 KiB of data that only `seed` produces (xorshift), so a log of seeds
/// is enough to check every byte of every acknowledged write.
fn piece(seed: u64) -> AlignedBuf {
    let mut b = AlignedBuf::new(4096);
    let mut x = seed | 1;
    for chunk in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    b
}

/// What a crash may have left at each 4 KiB piece: the last acknowledged
/// write, or the one in flight when the server died.
#[derive(Default)]
struct AckLog {
    acked: HashMap<u64, u64>,
    /// Acknowledgements received, overwrites included.
    acks: usize,
    /// Writes that failed (each ends its writer task).
    errors: usize,
    /// Per writer task: the (offset, seed) it has sent and not seen acked.
    inflight: HashMap<usize, (u64, u64)>,
}

const KILL9_WRITERS: usize = 8;

/// Writes random 4 KiB pieces with FUA at random 4 KiB-aligned offsets
/// below `span_bytes`, from `KILL9_WRITERS` tasks on one connection (each
/// task owns the offsets that are its index modulo the task count, so a
/// piece has at most one write in flight), until stopped or the server
/// dies; logs every acknowledgement.
fn fua_writer(
    uri: String,
    span_bytes: u64,
    seed: u64,
    stop: Arc<Mutex<bool>>,
    log: Arc<Mutex<AckLog>>,
) {
    rt::block_on(async move {
        let c = NbdClient::connect(&uri).await.unwrap();
        let pieces = span_bytes / 4096 / KILL9_WRITERS as u64;
        let mut ws = Vec::new();
        for w in 0..KILL9_WRITERS {
            let (c, stop, log) = (c.clone(), stop.clone(), log.clone());
            ws.push(rt::spawn(async move {
                let mut x = seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                loop {
                    if *stop.lock().unwrap() {
                        return;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let off = ((x % pieces) * KILL9_WRITERS as u64 + w as u64) * 4096;
                    let data_seed = x.rotate_left(17);
                    log.lock().unwrap().inflight.insert(w, (off, data_seed));
                    match c.write(off, piece(data_seed), true).await {
                        Ok(()) => {
                            let mut l = log.lock().unwrap();
                            l.acked.insert(off, data_seed);
                            l.acks += 1;
                            l.inflight.remove(&w);
                        }
                        Err(_) => {
                            // The server died (or gave up on the write).
                            log.lock().unwrap().errors += 1;
                            return;
                        }
                    }
                }
            }));
        }
        for w in ws {
            w.await;
        }
    });
}

/// What a piece read back after a crash says, given the acknowledged seed
/// (`None`: never acknowledged) and the seed in flight at the crash.
enum Found {
    Acked,
    /// The write in flight landed: from now on it is the expected one.
    InFlight(u64),
    Bad(String),
}

fn judge(
    off: u64,
    got: std::io::Result<AlignedBuf>,
    want: Option<u64>,
    inflight: Option<u64>,
) -> Found {
    let got = match got {
        Ok(b) => b,
        Err(e) => return Found::Bad(format!("offset {off}: read failed: {e}")),
    };
    let is = |seed: u64| got[..] == piece(seed)[..];
    match (want, inflight) {
        (Some(w), _) if is(w) => Found::Acked,
        (_, Some(s)) if is(s) => Found::InFlight(s),
        // A first write in flight may not have happened at all.
        (None, Some(_)) if got.iter().all(|&b| b == 0) => Found::Acked,
        (None, _) => Found::Bad(format!(
            "offset {off}: neither zeros nor the write in flight"
        )),
        (Some(w), _) => Found::Bad(format!(
            "offset {off}: not the acknowledged write (seed {w:#x})"
        )),
    }
}

/// Reads every logged piece back (all 4 096 bytes, 16 reads in flight); a
/// piece that was in flight at the kill may hold either version, and from
/// then on the log expects the one found. Returns the pieces that hold
/// neither.
fn verify_acked(uri: &str, log: &mut AckLog) -> Vec<String> {
    let uri = uri.to_string();
    let inflight: HashMap<u64, u64> = log.inflight.values().copied().collect();
    let mut todo: Vec<(u64, Option<u64>)> = log.acked.iter().map(|(&o, &s)| (o, Some(s))).collect();
    todo.extend(
        inflight
            .keys()
            .filter(|o| !log.acked.contains_key(o))
            .map(|&o| (o, None)),
    );
    let found = rt::block_on(async move {
        let c = NbdClient::connect(&uri).await.unwrap();
        let inflight = Rc::new(inflight);
        let tasks: Vec<_> = todo
            .chunks(todo.len().div_ceil(16).max(1))
            .map(|part| {
                let (c, part, inflight) = (c.clone(), part.to_vec(), inflight.clone());
                rt::spawn(async move {
                    let mut out = Vec::new();
                    for (off, want) in part {
                        let got = c.read(off, 4096).await;
                        out.push((off, judge(off, got, want, inflight.get(&off).copied())));
                    }
                    out
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await);
        }
        all
    });
    let mut bad = Vec::new();
    for (off, f) in found {
        match f {
            Found::Acked => {}
            Found::InFlight(s) => {
                log.acked.insert(off, s);
            }
            Found::Bad(why) => bad.push(why),
        }
    }
    log.inflight.clear();
    bad
}

/// `rounds` times on one cluster dir (`NACRE_KILL9_ROUNDS` overrides it,
/// for `scripts/soak.sh kill9`): FUA writers for a few seconds, then
/// `kill -9` of `nacre up`, restart, and every acknowledged byte checked.
fn kill9_rounds(extra: &[&str], rounds: u32, writes_per_round: usize) {
    let rounds = std::env::var("NACRE_KILL9_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(rounds);
    let d = tempfile::tempdir().unwrap();
    let mut args = vec!["--osd-size", "1G"];
    args.extend_from_slice(extra);
    let mut up = Up::start(&d.path().join("c"), &args);
    up.volume(&["create", "vol1", "--size", "512M"]);
    let mut log = AckLog::default();
    let span = 256u64 << 20;
    for round in 0..rounds {
        let log_arc = Arc::new(Mutex::new(std::mem::take(&mut log)));
        let stop = Arc::new(Mutex::new(false));
        let before = log_arc.lock().unwrap().acks;
        let w = {
            let (u, s, l) = (up.uri("vol1"), stop.clone(), log_arc.clone());
            std::thread::spawn(move || fua_writer(u, span, 7 + u64::from(round), s, l))
        };
        let t0 = Instant::now();
        let mut n = 0;
        while t0.elapsed() < Duration::from_secs(60) {
            n = log_arc.lock().unwrap().acks;
            if n >= before + writes_per_round {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        up.kill9();
        *stop.lock().unwrap() = true;
        w.join().unwrap();
        log = Arc::try_unwrap(log_arc).ok().unwrap().into_inner().unwrap();
        assert!(n > before, "round {round}: no write was acknowledged");
        up.spawn();
        let bad = verify_acked(&up.uri("vol1"), &mut log);
        assert!(
            bad.is_empty(),
            "round {round}: {} of {} acknowledged pieces are wrong after kill -9, e.g. {:?}",
            bad.len(),
            log.acked.len(),
            &bad[..bad.len().min(5)]
        );
        let st = up.status();
        assert!(
            st["checks"].as_array().is_some_and(|c| c.is_empty()),
            "round {round}: status reports damage: {}",
            st["checks"]
        );
        eprintln!(
            "kill9 {extra:?} round {}/{rounds}: {} acknowledged this round, all {} pieces read back intact",
            round + 1,
            n - before,
            log.acked.len()
        );
    }
}

/// Polls `nacre status` until `ok` holds (at most 60 s); returns it.
fn status_until(up: &Up, what: &str, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let st = up.status();
        if ok(&st) {
            return st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "status never showed {what}: {st}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `log` holds `n` acknowledgements (a minute at most).
fn wait_acks(log: &Mutex<AckLog>, n: usize) {
    let t0 = Instant::now();
    while log.lock().unwrap().acks < n {
        let l = log.lock().unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "writes stopped at {} acknowledgements ({} errors)",
            l.acks,
            l.errors
        );
        drop(l);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stops writer `w`; no write failed, and every acknowledged piece reads
/// back through `uri`.
fn stop_and_verify(
    w: std::thread::JoinHandle<()>,
    stop: &Mutex<bool>,
    log: &Mutex<AckLog>,
    uri: &str,
    what: &str,
) {
    *stop.lock().unwrap() = true;
    w.join().unwrap();
    *stop.lock().unwrap() = false;
    let mut l = log.lock().unwrap();
    assert_eq!(l.errors, 0, "writes failed while {what}");
    let bad = verify_acked(uri, &mut l);
    assert!(
        bad.is_empty(),
        "{what}: {} acknowledged pieces are wrong: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}

fn osd_pid(up: &Up, id: u32) -> Option<i32> {
    let p = std::fs::read_to_string(up.dir.join(format!("osd.{id}.pid"))).ok()?;
    p.trim().parse().ok()
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with(['Z', 'X']))
    })
}

/// Issue 8: every OSD is a process of its own. `kill -9` of one leaves the
/// cluster serving FUA writes with two of three copies (min_size 2), and
/// status shows it down and the PGs degraded; with `--no-restart` it stays
/// down until `nacre osd start`, then the PGs go clean again and every
/// acknowledged write reads back. By default a killed OSD is restarted.
/// `kill -9` of `nacre up` takes its OSDs with it.
#[test]
fn an_osd_process_killed_leaves_the_cluster_serving() {
    let d = tempfile::tempdir().unwrap();
    // Recovery slow enough (32 objects a second) to be seen.
    let mut up = Up::start(
        &d.path().join("c"),
        &["--osd-size", "1G", "--no-restart", "--recovery-rate", "4M"],
    );
    up.volume(&["create", "vol1", "--size", "512M"]);
    let log = Arc::new(Mutex::new(AckLog::default()));
    let stop = Arc::new(Mutex::new(false));
    let uri = up.uri("vol1");
    let writer = |seed| {
        let (u, s, l) = (uri.clone(), stop.clone(), log.clone());
        std::thread::spawn(move || fua_writer(u, 64 << 20, seed, s, l))
    };
    let acks_after = |n: usize| wait_acks(&log, n);
    let w = writer(11);
    acks_after(500);
    let victim = osd_pid(&up, 1).expect("osd.1.pid");
    // SAFETY: killing a process this test's cluster started.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let at_kill = log.lock().unwrap().acks;
    status_until(&up, "osd.1 down", |st| st["osds"]["up"] == 2);
    // Writes go on, to every PG (each has two copies up).
    acks_after(at_kill + 2000);
    let st = status_until(&up, "every PG degraded", |st| {
        st["pgs"]["degraded"] == st["pgs"]["total"]
    });
    assert_eq!(st["health"], "HEALTH_WARN", "{st}");
    // Not restarted: still down after the restart delay.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(up.status()["osds"]["up"], 2);
    assert!(
        osd_pid(&up, 1).is_none(),
        "the pid file of a dead OSD stays"
    );
    let out = ok(nacre(&["osd", "start", "1", "--dir", up.dir()]));
    assert!(out.contains("osd.1 started"), "{out}");
    // Its PGs serve while it is recovered in the background.
    let st = status_until(&up, "PGs recovering", |st| {
        st["pgs"]["recovering"].as_u64() > Some(0)
    });
    assert!(
        st["pgs"]["recovery_objects_left"].as_u64() > Some(0),
        "{st}"
    );
    assert_eq!(st["health"], "HEALTH_WARN", "{st}");
    let at_back = log.lock().unwrap().acks;
    acks_after(at_back + 500);
    status_until(&up, "HEALTH_OK", |st| st["health"] == "HEALTH_OK");
    let check =
        |w: std::thread::JoinHandle<()>, what: &str| stop_and_verify(w, &stop, &log, &uri, what);
    check(w, "one OSD of three was down");
    let out = nacre(&["osd", "start", "7", "--dir", up.dir()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no osd.7; its OSDs are osd.0, osd.1, osd.2")
    );

    // kill -9 of nacre up: no OSD outlives it.
    let osds: Vec<i32> = (0..3).map(|i| osd_pid(&up, i).unwrap()).collect();
    up.kill9();
    let t0 = Instant::now();
    while osds.iter().any(|&p| alive(p)) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "OSD processes outlived nacre up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Restarted by default.
    up.args.retain(|a| a != "--no-restart");
    up.spawn();
    let w = writer(12);
    let before = osd_pid(&up, 2).unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(before, libc::SIGKILL) };
    status_until(&up, "osd.2 restarted and the PGs clean", |st| {
        st["health"] == "HEALTH_OK" && osd_pid(&up, 2).is_some_and(|p| p != before)
    });
    check(w, "osd.2 restarted");

    // An OSD stopped (SIGSTOP) for longer than its up lease shows down,
    // and up again once it runs (it takes a new lease and boots again).
    let frozen = osd_pid(&up, 1).unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(frozen, libc::SIGSTOP) };
    status_until(&up, "a stopped OSD down", |st| st["osds"]["up"] == 2);
    // SAFETY: as above.
    unsafe { libc::kill(frozen, libc::SIGCONT) };
    status_until(&up, "the resumed OSD up and the PGs clean", |st| {
        st["osds"]["up"] == 3 && st["health"] == "HEALTH_OK"
    });
    assert_eq!(osd_pid(&up, 1), Some(frozen), "it was not restarted");
}

/// `nacre osd out` moves an OSD's PGs to the others while FUA writers run
/// (no write fails, every acknowledged one reads back); the OSD ends up
/// primary of nothing and the PGs clean without it; marking out one more
/// is refused when too few OSDs would be left for the replicas; `nacre osd
/// in` gives it PGs back, and the cluster is clean again.
#[test]
fn an_osd_marked_out_hands_its_pgs_over_and_takes_them_back_in() {
    let d = tempfile::tempdir().unwrap();
    let up = Up::start(
        &d.path().join("c"),
        &["--osds", "4", "--osd-size", "1G", "--recovery-rate", "16M"],
    );
    up.volume(&["create", "vol1", "--size", "512M"]);
    let uri = up.uri("vol1");
    let log = Arc::new(Mutex::new(AckLog::default()));
    let stop = Arc::new(Mutex::new(false));
    let acks_after = |n: usize| wait_acks(&log, n);
    let run = |what: &str, seed: u64, change: &dyn Fn()| {
        let w = {
            let (u, s, l) = (uri.clone(), stop.clone(), log.clone());
            std::thread::spawn(move || fua_writer(u, 64 << 20, seed, s, l))
        };
        let n = log.lock().unwrap().acks;
        acks_after(n + 500);
        change();
        // The PGs move with every copy kept: the OSDs they leave stay in
        // their acting sets until the new ones are complete, so a moving
        // PG is `remapped`, never short of a complete copy. (A write in
        // flight when the epoch changes may have reached some copies and
        // not others: the next peering recovers it onto the rest, so a few
        // PGs — at most one per writer and epoch change — may recover
        // briefly. Without temporary members every PG that moves does.)
        let (remapped, short) = (Cell::new(0), Cell::new(None));
        status_until(&up, "the PGs clean", |st| {
            let pgs = &st["pgs"];
            remapped.set(remapped.get().max(pgs["remapped"].as_u64().unwrap_or(0)));
            if pgs["degraded"].as_u64() > Some(0)
                || pgs["recovering"].as_u64() > Some(KILL9_WRITERS as u64)
            {
                short.set(Some(st.clone()));
            }
            st["health"] == "HEALTH_OK"
        });
        assert!(remapped.get() > 0, "{what}: no PG was seen moving");
        if let Some(st) = short.take() {
            panic!("{what}: PGs were short of a complete copy while they moved: {st}");
        }
        let n = log.lock().unwrap().acks;
        acks_after(n + 1000);
        stop_and_verify(w, &stop, &log, &uri, what);
    };
    run("osd.3 was marked out", 21, &|| {
        let out = ok(nacre(&["osd", "out", "3", "--dir", up.dir()]));
        assert!(out.contains("osd.3 marked out"), "{out}");
    });
    let st = up.status();
    assert_eq!(
        (st["osds"]["in"].as_u64(), st["osds"]["up"].as_u64()),
        (Some(3), Some(4)),
        "{st}"
    );
    let recovered: u64 = (st["osd"].as_array().unwrap().iter())
        .map(|o| o["stats"]["recovered_objects"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        recovered > 0,
        "no object was copied to osd.3's successors: {st}"
    );
    let osd3 = &st["osd"].as_array().unwrap()[3]["stats"]["pg_states"];
    assert!(
        osd3.as_object().is_none_or(|m| m.is_empty()),
        "osd.3 is still primary: {osd3}"
    );
    // Its copies go once the PGs are clean without it.
    let st = status_until(&up, "osd.3's stray copies deleted", |st| {
        st["osd"][3]["stats"]["objects"] == 0
    });
    assert!(
        st["osd"][3]["stats"]["stray_objects_removed"].as_u64() > Some(0),
        "{st}"
    );
    // Two out of four would leave two OSDs for three replicas.
    let out = nacre(&["osd", "out", "2", "--dir", up.dir()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("osd.2 cannot be marked out"), "{err}");
    assert_eq!(up.status()["osds"]["in"], 3);
    let out = nacre(&["osd", "out", "9", "--dir", up.dir()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no osd.9"));
    run("osd.3 was marked in", 22, &|| {
        let out = ok(nacre(&["osd", "in", "3", "--dir", up.dir()]));
        assert!(out.contains("osd.3 marked in"), "{out}");
    });
    let st = up.status();
    assert_eq!(st["osds"]["in"], 4, "{st}");
    let osd3 = &st["osd"].as_array().unwrap()[3]["stats"]["pg_states"];
    assert!(
        osd3.as_object().is_some_and(|m| !m.is_empty()),
        "osd.3 is primary of nothing: {st}"
    );
    // The PGs that moved back left no copy behind.
    three_copies(&up, "vol1");
}

/// Waits until every object of volume `vol` has three copies, no more
/// (stray copies deleted), for a minute at most.
fn three_copies(up: &Up, vol: &str) {
    let t0 = Instant::now();
    loop {
        let v: serde_json::Value =
            serde_json::from_str(&up.volume(&["info", vol, "--format", "json"])).unwrap();
        if v["raw_used_bytes"].as_u64() == v["used_bytes"].as_u64().map(|u| 3 * u) {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "stray copies stay: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An OSD killed and left down is marked out after `--out-delay`: its PGs
/// are recovered onto the others while FUA writers run, and the cluster is
/// healthy with it down (it holds nothing the others lack). Started again,
/// it is marked in and gets its share back. No write fails, every
/// acknowledged one reads back.
#[test]
fn a_dead_osd_is_marked_out_and_in_again_when_it_returns() {
    let d = tempfile::tempdir().unwrap();
    let up = Up::start(
        &d.path().join("c"),
        &[
            "--osds",
            "4",
            "--osd-size",
            "1G",
            "--no-restart",
            "--out-delay",
            "3s",
            "--recovery-rate",
            "16M",
        ],
    );
    up.volume(&["create", "vol1", "--size", "512M"]);
    let uri = up.uri("vol1");
    let log = Arc::new(Mutex::new(AckLog::default()));
    let stop = Arc::new(Mutex::new(false));
    let writer = |seed| {
        let (u, s, l) = (uri.clone(), stop.clone(), log.clone());
        std::thread::spawn(move || fua_writer(u, 64 << 20, seed, s, l))
    };
    let w = writer(31);
    wait_acks(&log, 500);
    // SAFETY: killing a process this test's cluster started.
    unsafe { libc::kill(osd_pid(&up, 2).unwrap(), libc::SIGKILL) };
    let st = status_until(&up, "osd.2 down and in", |st| st["osds"]["up"] == 3);
    assert!(st["checks"].to_string().contains("OSD_DOWN"), "{st}");
    status_until(&up, "osd.2 marked out", |st| st["osds"]["in"] == 3);
    let n = log.lock().unwrap().acks;
    wait_acks(&log, n + 1000);
    let st = status_until(&up, "healthy without osd.2", |st| {
        st["health"] == "HEALTH_OK"
    });
    assert_eq!(st["osds"]["up"], 3, "{st}");
    stop_and_verify(w, &stop, &log, &uri, "osd.2 was down and marked out");
    let w = writer(32);
    let n = log.lock().unwrap().acks;
    wait_acks(&log, n + 300);
    ok(nacre(&["osd", "start", "2", "--dir", up.dir()]));
    status_until(&up, "osd.2 back in and the PGs clean", |st| {
        st["osds"]["in"] == 4 && st["osds"]["up"] == 4 && st["health"] == "HEALTH_OK"
    });
    let n = log.lock().unwrap().acks;
    wait_acks(&log, n + 500);
    stop_and_verify(w, &stop, &log, &uri, "osd.2 came back in");
}

/// Issue 7's procedure: random 4 KiB FUA writes over 256 MiB (most objects
/// get a first write, then a few overwrites), `kill -9`, restart, every
/// acknowledged byte read back; several rounds on the same dir.
#[test]
fn kill9_loses_no_acknowledged_write() {
    kill9_rounds(&[], 3, 6000);
}

/// The same with a small journal, so folds and checkpoints run all the
/// time and the kills land in the middle of them.
#[test]
fn kill9_during_folds_loses_no_acknowledged_write() {
    kill9_rounds(&["--journal-size", "8M"], 3, 4000);
}

/// Data that fails its checksum on the primary is not returned (EIO), and
/// `nacre status` names the OSD that holds it.
#[test]
fn damaged_data_is_refused_and_reported() {
    let d = tempfile::tempdir().unwrap();
    let mut up = Up::start(&d.path().join("c"), &["--osd-size", "256M"]);
    up.volume(&["create", "v", "--size", "16M"]);
    let uri = up.uri("v");
    rt::block_on(async {
        let c = NbdClient::connect(&uri).await.unwrap();
        c.write(0, AlignedBuf::from_slice(&[0x5a; 1 << 20]), true)
            .await
            .unwrap();
    });
    assert_eq!(up.status()["health"], "HEALTH_OK");
    up.stop();
    // Flip one byte in every 4 KiB of that data, on every OSD.
    let mut flipped = 0;
    for id in 0..3 {
        let path = d.path().join(format!("c/osd.{id}.img"));
        let mut img = std::fs::read(&path).unwrap();
        for chunk in img.chunks_mut(4096) {
            if chunk.iter().all(|&b| b == 0x5a) {
                chunk[100] ^= 1;
                flipped += 1;
            }
        }
        std::fs::write(&path, img).unwrap();
    }
    assert!(
        flipped >= 3 * 256,
        "found only {flipped} chunks of the data"
    );
    up.spawn();
    let uri = up.uri("v");
    let r = rt::block_on(async {
        let c = NbdClient::connect(&uri).await.unwrap();
        c.read(4096, 4096).await
    });
    assert!(r.is_err(), "a damaged chunk was returned");
    let st = up.status();
    assert_eq!(st["health"], "HEALTH_ERR", "{st}");
    let checks = st["checks"].as_array().unwrap();
    assert!(
        checks.iter().any(|c| c["code"] == "OSD_DAMAGED"
            && c["message"]
                .as_str()
                .unwrap()
                .contains("reads found it damaged")),
        "{checks:?}"
    );
    let table = ok(nacre(&["status", "--dir", up.dir()]));
    assert!(table.contains("OSD_DAMAGED"), "{table}");
}

#[test]
fn volumes_resize_delete_and_survive_restarts() {
    let d = tempfile::tempdir().unwrap();
    let mut up = Up::start(&d.path().join("c"), &["--osd-size", "512M"]);
    up.volume(&["create", "keep", "--size", "16M"]);
    up.volume(&["create", "gone", "--size", "16M"]);
    // A duplicate says so in the user's terms (no internal layer names),
    // and a missing volume reads the same from every command.
    let dup = nacre(&[
        "volume",
        "create",
        "keep",
        "--size",
        "1M",
        "--dir",
        up.dir(),
    ]);
    let err = String::from_utf8_lossy(&dup.stderr);
    assert!(!dup.status.success());
    assert!(
        err.contains("a volume named \"keep\" already exists") && !err.contains("meta store"),
        "{err}"
    );
    for cmd in [
        &["volume", "info", "nope", "--dir", up.dir()][..],
        &[
            "volume",
            "resize",
            "nope",
            "--size",
            "1M",
            "--dir",
            up.dir(),
        ][..],
    ] {
        let out = nacre(cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("no volume named \"nope\" (`nacre volume ls` lists them)"),
            "{cmd:?}: {err}"
        );
    }
    assert!(!nacre(&[
        "volume",
        "create",
        "bad/name",
        "--size",
        "1M",
        "--dir",
        up.dir()
    ])
    .status
    .success());
    let img = d.path().join("k.img");
    random_file(&img, 16 << 20, 3);
    qemu_convert(&img, &up.uri("keep"));
    qemu_convert(&img, &up.uri("gone"));
    up.volume(&["rm", "gone"]);
    up.volume(&["resize", "keep", "--size", "32M"]);
    let st = up.status();
    for k in ["total_bytes", "used_bytes", "objects"] {
        assert!(
            st["capacity"][k].is_u64(),
            "capacity.{k} = {}",
            st["capacity"][k]
        );
    }
    up.stop();
    // A clean stop leaves no sockets behind.
    let left: Vec<String> = std::fs::read_dir(&up.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sock"))
        .collect();
    assert!(left.is_empty(), "sockets left after a clean stop: {left:?}");
    up.spawn();
    let ls: serde_json::Value =
        serde_json::from_str(&up.volume(&["ls", "--format", "json"])).unwrap();
    let names: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["keep"]);
    assert_eq!(ls[0]["size_bytes"], 32 << 20);
    // The pool by its name, everywhere.
    assert_eq!(ls[0]["pool"], "rbd");
    let info = up.volume(&["info", "keep"]);
    assert!(info.contains("pool     rbd"), "{info}");
    assert!(up
        .volume(&["ls"])
        .lines()
        .nth(1)
        .is_some_and(|l| l.ends_with("  rbd")));
    // the first 16 MiB are the image, the grown part zeros
    let back = d.path().join("back.img");
    run_tool(tool("nbdcopy").arg(up.uri("keep")).arg(&back));
    let b = std::fs::read(&back).unwrap();
    assert_eq!(b.len(), 32 << 20);
    assert!(b[..16 << 20] == std::fs::read(&img).unwrap()[..]);
    assert!(b[16 << 20..].iter().all(|&x| x == 0));
    // shrink, then grow: the cut part reads as zeros
    up.volume(&["resize", "keep", "--size", "8M"]);
    up.volume(&["resize", "keep", "--size", "16M"]);
    run_tool(tool("nbdcopy").arg(up.uri("keep")).arg(&back));
    let b = std::fs::read(&back).unwrap();
    assert!(b[..8 << 20] == std::fs::read(&img).unwrap()[..8 << 20]);
    assert!(
        b[8 << 20..].iter().all(|&x| x == 0),
        "data past a shrink came back"
    );
    // the deleted volume's objects are gone from every OSD
    let s = up.status();
    assert_eq!(
        s["capacity"]["objects"].as_f64().unwrap() as u64,
        3 * 8 * 1024 / 128
    );
    assert_eq!(s["health"], "HEALTH_OK");
    assert!(!nacre(&["volume", "info", "gone", "--dir", up.dir()])
        .status
        .success());
}

fn raw_send(sock: &Path, bytes: &[u8]) -> Vec<u8> {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

#[test]
fn bad_input_harms_nothing_else() {
    let d = tempfile::tempdir().unwrap();
    let up = Up::start(&d.path().join("c"), &["--osd-size", "256M"]);
    up.volume(&["create", "v", "--size", "64M"]);
    let img = d.path().join("v.img");
    random_file(&img, 1 << 20, 9);
    qemu_convert(&img, &up.uri("v"));

    // garbage, a truncated header, and a valid-looking header with a bad
    // checksum on an OSD's port: the connection is closed, nothing answers
    let osd = up.dir.join("osd.0.sock");
    assert!(raw_send(&osd, b"GET / HTTP/1.1\r\n\r\n").is_empty());
    assert!(raw_send(&osd, b"NACR\x01\x02").is_empty());
    let mut h = vec![0u8; 88];
    h[..4].copy_from_slice(b"NACR");
    h[4] = 1;
    h[5] = 2;
    h[72..76].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(raw_send(&osd, &h).is_empty());
    random_file(&d.path().join("junk"), 100_000, 5);
    assert!(raw_send(&osd, &std::fs::read(d.path().join("junk")).unwrap()).is_empty());

    // on the NBD socket: bad client flags, a bad option magic
    let nbd = up.nbd_sock();
    let got = raw_send(&nbd, &[0, 0, 0, 0]);
    assert_eq!(&got[..8], b"NBDMAGIC");
    let mut opt = vec![0, 0, 0, 1];
    opt.extend_from_slice(b"NOTMAGIC\0\0\0\x07\0\0\0\0");
    assert_eq!(
        raw_send(&nbd, &opt).len(),
        18,
        "only the greeting, then close"
    );

    rt::block_on(async {
        // an unknown export is refused, the server stays up
        let e = NbdClient::connect(&format!("nbd+unix:///nope?socket={}", nbd.display())).await;
        assert_eq!(e.err().unwrap().kind(), std::io::ErrorKind::NotFound);
        let c = NbdClient::connect(&up.uri("v")).await.unwrap();
        // oversized, past the end, unaligned: error replies, connection up
        assert_eq!(
            c.read(0, 33 << 20).await.unwrap_err().raw_os_error(),
            Some(22)
        );
        assert_eq!(
            c.read(64 << 20, 4096).await.unwrap_err().raw_os_error(),
            Some(22)
        );
        let w = c.write(64 << 20, AlignedBuf::zeroed(4096), false).await;
        assert_eq!(w.unwrap_err().raw_os_error(), Some(28));
        let w = c.write(100, AlignedBuf::zeroed(4096), false).await;
        assert_eq!(w.unwrap_err().raw_os_error(), Some(22));
        // an unaligned read is served from the enclosing sectors
        let b = c.read(1000, 100).await.unwrap();
        assert_eq!(&b[..], &std::fs::read(&img).unwrap()[1000..1100]);
        c.flush().await.unwrap();
        c.disconnect().await;
    });
    // a client that disconnects in the middle of a write's payload
    let mut s = UnixStream::connect(&nbd).unwrap();
    let mut greet = [0u8; 18];
    s.read_exact(&mut greet).unwrap();
    let mut m = vec![0, 0, 0, 3];
    m.extend_from_slice(b"IHAVEOPT");
    m.extend_from_slice(&1u32.to_be_bytes());
    m.extend_from_slice(&1u32.to_be_bytes());
    m.push(b'v');
    s.write_all(&m).unwrap();
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    let mut req = Vec::new();
    req.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    req.extend_from_slice(&[0, 0, 0, 1]);
    req.extend_from_slice(&5u64.to_be_bytes());
    req.extend_from_slice(&0u64.to_be_bytes());
    req.extend_from_slice(&(1u32 << 20).to_be_bytes());
    req.extend_from_slice(&[0xee; 1000]);
    s.write_all(&req).unwrap();
    drop(s);

    // the cluster is healthy and the data intact
    std::thread::sleep(Duration::from_millis(200));
    qemu_compare(&img, &up.uri("v"));
    let s = up.status();
    assert_eq!(s["health"], "HEALTH_OK");
}

#[test]
fn a_full_cluster_says_enospc_and_recovers() {
    let d = tempfile::tempdir().unwrap();
    let up = Up::start(&d.path().join("c"), &["--osd-size", "192M"]);
    // thin: far larger than the cluster
    up.volume(&["create", "big", "--size", "10G"]);
    let uri = up.uri("big");
    let upr = &up;
    rt::block_on(async move {
        let c = NbdClient::connect(&uri).await.unwrap();
        let mut written = 0u64;
        let err = loop {
            let mut b = AlignedBuf::new(1 << 20);
            b.fill((written >> 20) as u8);
            match c.write(written, b, false).await {
                Ok(()) => written += 1 << 20,
                Err(e) => break e,
            }
            assert!(written < 1 << 30, "192 MiB OSDs took 1 GiB");
        };
        assert_eq!(err.raw_os_error(), Some(28), "{err}");
        assert!(written >= 32 << 20, "only {written} bytes fit");
        // The OSD that refused is full (95% used by default): an error,
        // named; the space kept back lets the copies recover.
        let st = upr.status();
        assert_eq!(st["health"], "HEALTH_ERR", "{st}");
        let full = (st["checks"].as_array().unwrap().iter())
            .find(|c| c["code"] == "OSD_FULL")
            .unwrap_or_else(|| panic!("no OSD_FULL: {st}"));
        assert!(
            full["message"].as_str().unwrap().contains("full at 95%"),
            "{full}"
        );
        // Once the full OSD's heartbeat said so, writes that take new
        // blocks (new objects, whole-object overwrites) are refused before
        // they reach any copy: they end no interval, so the map stays at
        // its epoch however many there are (one failed on a copy would
        // start an epoch each).
        let epoch = |st: &serde_json::Value| {
            (st["osd"].as_array().unwrap().iter())
                .filter_map(|o| o["stats"]["epoch"].as_u64())
                .max()
                .unwrap()
        };
        rt::sleep(Duration::from_millis(2 * 500)).await;
        let before = epoch(&upr.status());
        for k in 0..24u64 {
            let at = (5 << 30) + k * (64 << 20);
            let e = c.write(at, AlignedBuf::zeroed(1 << 20), false).await;
            assert_eq!(e.unwrap_err().raw_os_error(), Some(28), "write {k}");
            // Overwrites of whole objects written before (with what they
            // hold): refused too, or taken (blocks freed by earlier
            // overwrites came back).
            let mut b = AlignedBuf::new(1 << 20);
            b.fill(k as u8);
            if let Err(e) = c.write(k << 20, b, false).await {
                assert_eq!(e.raw_os_error(), Some(28), "overwrite {k}");
            }
        }
        let after = epoch(&upr.status());
        assert!(
            after <= before + 1,
            "48 writes to a full cluster took the map from epoch {before} to {after}"
        );
        // what was acknowledged reads back
        let b = c.read(0, 1 << 20).await.unwrap();
        assert!(b.iter().all(|&x| x == 0));
        let b = c.read(written - (1 << 20), 1 << 20).await.unwrap();
        assert!(b.iter().all(|&x| x == ((written >> 20) - 1) as u8));
        // trim makes room again
        c.trim(0, (written / 2) as u32).await.unwrap();
        let mut ok_after = false;
        for _ in 0..50 {
            if c.write(written, AlignedBuf::zeroed(1 << 20), false)
                .await
                .is_ok()
            {
                ok_after = true;
                break;
            }
            // freed blocks return after the OSDs' next checkpoint
            rt::sleep(Duration::from_millis(200)).await;
        }
        assert!(ok_after, "space did not come back after trim");
        c.disconnect().await;
    });
    // The OSDs are no longer full, and what was refused before they said so
    // ended intervals: wait for the peering. What is left is the warning
    // that the volume is larger than the cluster can hold.
    let only_overcommit = |s: &serde_json::Value| {
        let codes: Vec<&str> = (s["checks"].as_array().unwrap().iter())
            .map(|c| c["code"].as_str().unwrap())
            .collect();
        codes == ["VOLUMES_OVERCOMMITTED"]
    };
    let t0 = Instant::now();
    let mut s = up.status();
    while !only_overcommit(&s) && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
        s = up.status();
    }
    assert!(only_overcommit(&s), "{s}");
    assert_eq!(s["health"], "HEALTH_WARN", "{s}");
}

fn suite_names(v: &serde_json::Value) -> Vec<String> {
    let tests = v.as_array().expect("an array of tests");
    for t in tests {
        assert!(t["ops"].as_u64().unwrap() > 0, "{t}");
    }
    tests
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn bench_and_demo_run_the_whole_suite() {
    // In the order they ran.
    let want = [
        "write-4m-qd16",
        "randwrite-4k-qd128",
        "randwrite-4k-qd1",
        "randread-4k-qd128",
        "randread-4k-qd1",
        "read-4m-qd16",
    ];
    let d = tempfile::tempdir().unwrap();
    let up = Up::start(&d.path().join("c"), &["--osd-size", "512M"]);
    let quick = ["--runtime", "150ms", "--size", "32M", "--format", "json"];
    let mut a = vec!["bench", "--dir", up.dir()];
    a.extend_from_slice(&quick);
    let v: serde_json::Value = serde_json::from_str(&ok(nacre(&a))).unwrap();
    assert_eq!(suite_names(&v["nacre"]), want);
    // the temporary volume is gone again
    let ls: serde_json::Value =
        serde_json::from_str(&up.volume(&["ls", "--format", "json"])).unwrap();
    assert_eq!(ls, serde_json::json!([]));

    up.volume(&["create", "b", "--size", "32M"]);
    let uri = up.uri("b");
    let mut a = vec!["bench", "--nbd", uri.as_str()];
    a.extend_from_slice(&quick);
    let v: serde_json::Value = serde_json::from_str(&ok(nacre(&a))).unwrap();
    assert_eq!(suite_names(&v["nbd"]), want);
    // Now it holds the suite's data: refused without --force, through NBD
    // and through the client library alike.
    for target in [
        &["--nbd", uri.as_str()][..],
        &["--dir", up.dir(), "--volume", "b"],
    ] {
        let mut a = vec!["bench"];
        a.extend_from_slice(target);
        a.extend_from_slice(&quick);
        let out = nacre(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{target:?}: a volume with data was benchmarked"
        );
        assert!(
            err.contains("holds data") && err.contains("--force"),
            "{err}"
        );
        a.push("--force");
        let v: serde_json::Value = serde_json::from_str(&ok(nacre(&a))).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 1);
    }
    assert!(
        !nacre(&["bench", "--nbd", "nbd+unix:///nope?socket=/nonexistent"])
            .status
            .success()
    );

    let demo_dir = d.path().join("demo");
    let mut a = vec!["demo", "--dir", demo_dir.to_str().unwrap()];
    a.extend_from_slice(&quick);
    let v: serde_json::Value = serde_json::from_str(&ok(nacre(&a))).unwrap();
    assert_eq!(suite_names(&v["nacre"]), want);
    assert_eq!(suite_names(&v["local"]), want);
    assert!(!demo_dir.exists(), "demo left its dir behind");
}

/// A relative `--dir` still prints attach URIs that work from anywhere.
#[test]
fn a_relative_dir_prints_absolute_paths() {
    use std::io::BufRead;
    let d = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nacre"))
        .args(["up", "--dir", "rel", "--osd-size", "256M"])
        .current_dir(d.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let attach = std::io::BufReader::new(out)
        .lines()
        .map(|l| l.unwrap())
        .find(|l| l.starts_with("attach:"))
        .expect("nacre up prints how to attach");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    let want = d
        .path()
        .canonicalize()
        .unwrap()
        .join("rel")
        .join("nbd.sock");
    assert!(
        attach.contains(&format!("socket={}", want.display())),
        "{attach} (want {})",
        want.display()
    );
}

/// Options that cannot make a cluster are refused before anything is
/// created, each with a message that says what to do; a second `nacre up`
/// on a running cluster's dir names the one that runs.
#[test]
fn up_refuses_what_cannot_work_and_says_why() {
    let d = tempfile::tempdir().unwrap();
    let x = d.path().join("x");
    let xs = x.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["--osds", "0"], "a cluster needs at least one OSD"),
        (&["--pgs", "0"], "a pool has 1 to 16384 PGs"),
        (
            &["--osds", "2", "--replicas", "3"],
            "must be between 1 and --osds (2)",
        ),
        (&["--osd-size", "1M"], "an OSD store cannot be made"),
        (
            &["--journal-size", "1K"],
            "an OSD store cannot be made: invalid request: journal size 1024",
        ),
    ];
    // A TCP address another program listens on.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nbd = format!("tcp:{}", taken.local_addr().unwrap());
    let port: [(&[&str], &str); 1] = [(&["--nbd", &nbd], "cannot listen there")];
    for (extra, want) in cases.into_iter().chain(port) {
        let mut args = vec!["up", "--dir", xs];
        args.extend_from_slice(extra);
        let out = nacre(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(want),
            "{extra:?}: {err}"
        );
        assert!(!x.exists(), "{extra:?} left {} behind", x.display());
    }
    let file = d.path().join("afile");
    std::fs::write(&file, b"").unwrap();
    let out = nacre(&["up", "--dir", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is a file; give a directory"),
        "{err}"
    );

    let up = Up::start(&d.path().join("c"), &["--osd-size", "256M"]);
    let out = nacre(&["up", "--dir", up.dir(), "--osd-size", "256M"]);
    let err = String::from_utf8_lossy(&out.stderr);
    let pid = up.child.as_ref().unwrap().id();
    assert!(
        !out.status.success()
            && err.contains(&format!(
                "already running in {} (nacre up, pid {pid})",
                up.dir()
            )),
        "{err}"
    );
    // A store cannot grow: another --osd-size on it is refused, and the
    // files stay as they are.
    let mut up = up;
    up.stop();
    let out = nacre(&["up", "--dir", up.dir(), "--osd-size", "512M"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("were made with 256.0 MiB and cannot grow"),
        "{err}"
    );
    let img = std::fs::metadata(d.path().join("c/osd.0.img")).unwrap();
    assert_eq!(img.len(), 256 << 20);
    // Nor can the PG count change.
    let out = nacre(&["up", "--dir", up.dir(), "--pgs", "128"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("has 64 PGs, fixed when it was made"),
        "{err}"
    );
}

/// Ctrl-C during `nacre demo` removes the demo's cluster files and says so.
#[test]
fn an_interrupted_demo_cleans_up() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("demo");
    let child = Command::new(env!("CARGO_BIN_EXE_nacre"))
        .args(["demo", "--runtime", "30s", "--size", "64M", "--dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !dir.join("nbd.sock").exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the demo's cluster did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("SIGINT (Ctrl-C); removed"), "{err}");
    assert!(!dir.exists(), "{} left behind", dir.display());
}

/// One request for a [`Held`] connection.
enum HeldOp {
    Write(u64, u32, u8),
    Read(u64, u32),
}

/// A [`Held`] request's answer: the data read, or the errno.
type HeldReply = std::sync::mpsc::Sender<Result<Vec<u8>, i32>>;

/// An NBD connection held open on its own thread while the test runs
/// commands, as a VM's would be.
struct Held {
    tx: std::sync::mpsc::Sender<(HeldOp, HeldReply)>,
}

impl Held {
    fn open(uri: &str) -> Held {
        let (tx, rx) = std::sync::mpsc::channel::<(HeldOp, HeldReply)>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let uri = uri.to_string();
        std::thread::spawn(move || {
            rt::block_on(async move {
                let c = NbdClient::connect(&uri).await.unwrap();
                ready_tx.send(()).unwrap();
                // Blocking here is fine: this thread serves nothing else.
                while let Ok((op, reply)) = rx.recv() {
                    let r = match op {
                        HeldOp::Write(off, len, fill) => {
                            let mut b = AlignedBuf::new(len as usize);
                            b.fill(fill);
                            c.write(off, b, true).await.map(|_| Vec::new())
                        }
                        HeldOp::Read(off, len) => c.read(off, len).await.map(|b| b.to_vec()),
                    };
                    let _ = reply.send(r.map_err(|e| e.raw_os_error().unwrap_or(-1)));
                }
            })
        });
        ready.recv().unwrap();
        Held { tx }
    }

    fn op(&self, op: HeldOp) -> Result<Vec<u8>, i32> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.tx.send((op, tx)).unwrap();
        rx.recv_timeout(Duration::from_secs(60)).unwrap()
    }
}

/// Issue 9: a volume in use is not deleted or shrunk from under its
/// clients (unless --force, and then they see it at once), a grow after a
/// shrink reads zeros, nothing of a deleted volume survives on any OSD
/// (copies on an OSD that was down are found and reclaimed), volumes show
/// what they hold, and provisioning more than the cluster holds warns.
/// Issue 8: a killed client's waiting requests end with it.
#[test]
fn volumes_in_use_are_not_pulled_from_under_their_clients() {
    let d = tempfile::tempdir().unwrap();
    let up = Up::start(
        &d.path().join("c"),
        &[
            "--osd-size",
            "512M",
            "--reclaim-interval",
            "1s",
            "--no-restart",
        ],
    );
    let fail = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend_from_slice(&["--dir", up.dir()]);
        let out = nacre(&a);
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let objects = |st: &serde_json::Value| st["capacity"]["objects"].as_u64().unwrap();
    up.volume(&["create", "vm", "--size", "32M"]);
    let vm = Held::open(&up.uri("vm"));
    for i in 0..8u64 {
        vm.op(HeldOp::Write(i << 22, 4 << 20, 0xcd)).unwrap();
    }
    // What it holds: 32 MiB, three copies.
    let info: serde_json::Value =
        serde_json::from_str(&up.volume(&["info", "vm", "--format", "json"])).unwrap();
    assert_eq!(info["used_bytes"], 32 << 20, "{info}");
    assert_eq!(info["raw_used_bytes"], 96 << 20, "{info}");
    assert_eq!(
        info["open_connections"].as_array().unwrap().len(),
        1,
        "{info}"
    );
    let ls = up.volume(&["ls"]);
    assert!(ls.contains("32.0 MiB"), "{ls}");

    // Refused while open, naming the connection and the way out.
    for args in [
        &["volume", "rm", "vm"][..],
        &["volume", "resize", "vm", "--size", "8M"],
    ] {
        let err = fail(args);
        assert!(
            err.contains("has 1 open connection")
                && err.contains("NBD client")
                && err.contains("--force"),
            "{args:?}: {err}"
        );
    }
    vm.op(HeldOp::Write(20 << 20, 4096, 0xab)).unwrap();

    // Forced shrink: the open connection sees the new end at once.
    up.volume(&["resize", "vm", "--size", "8M", "--force"]);
    assert_eq!(
        vm.op(HeldOp::Write(20 << 20, 4096, 0xee)),
        Err(libc::ENOSPC)
    );
    vm.op(HeldOp::Write(4 << 20, 4096, 0x11)).unwrap();
    // A grow reads zeros past the old end, on the open connection too.
    up.volume(&["resize", "vm", "--size", "32M"]);
    assert!(vm
        .op(HeldOp::Read(20 << 20, 4096))
        .unwrap()
        .iter()
        .all(|&b| b == 0));
    let back = d.path().join("back.img");
    run_tool(tool("nbdcopy").arg(up.uri("vm")).arg(&back));
    let b = std::fs::read(&back).unwrap();
    assert!(b[..4 << 20].iter().all(|&x| x == 0xcd));
    assert!(b[4 << 20..(4 << 20) + 4096].iter().all(|&x| x == 0x11));
    assert!(b[(4 << 20) + 4096..8 << 20].iter().all(|&x| x == 0xcd));
    assert!(
        b[8 << 20..].iter().all(|&x| x == 0),
        "data past a shrink came back"
    );

    // Provisioning more than 3 × 512 MiB holds at 3 replicas warns.
    up.volume(&["create", "big", "--size", "1G"]);
    let st = up.status();
    assert_eq!(st["health"], "HEALTH_WARN", "{st}");
    assert_eq!(st["checks"][0]["code"], "VOLUMES_OVERCOMMITTED", "{st}");
    up.volume(&["rm", "big"]);
    assert_eq!(up.status()["health"], "HEALTH_OK");

    // Forced delete: the connection is cut, its later I/O fails, no
    // object is left and new connections are refused.
    up.volume(&["rm", "vm", "--force"]);
    assert!(vm.op(HeldOp::Write(0, 4096, 0x22)).is_err());
    assert_eq!(objects(&up.status()), 0);
    assert!(rt::block_on(NbdClient::connect(&up.uri("vm"))).is_err());

    // A delete while an OSD is down leaves copies there; when it is back,
    // peering or the sweep deletes them.
    up.volume(&["create", "o", "--size", "16M"]);
    let img = d.path().join("o.img");
    random_file(&img, 16 << 20, 5);
    qemu_convert(&img, &up.uri("o"));
    let pid = osd_pid(&up, 2).unwrap();
    // SAFETY: signalling a child process of the cluster.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    status_until(&up, "osd.2 down", |st| st["osds"]["up"] == 2);
    up.volume(&["rm", "o"]);
    ok(nacre(&["osd", "start", "2", "--dir", up.dir()]));
    let st = status_until(&up, "no copy of the deleted volume", |st| {
        objects(st) == 0 && st["health"] == "HEALTH_OK"
    });
    // Either may have deleted osd.2's copies (the sweep runs every
    // second): count what is reclaimed from here on from a sweep that
    // ran after they were gone.
    let gone_at = st["orphans"]["last_sweep_unix_s"].as_u64();
    let st = status_until(&up, "a sweep after that", |st| {
        st["orphans"]["last_sweep_unix_s"].as_u64() > gone_at
    });
    let before = st["orphans"]["reclaimed_objects"].as_u64().unwrap();

    // Objects whose volume record is gone (what a purge that missed some
    // copies, or a write racing it, leaves) are found and reclaimed.
    up.volume(&["create", "p", "--size", "16M"]);
    qemu_convert(&img, &up.uri("p"));
    let meta = nacre_meta::remote::Remote::connect(&up.dir.join("meta.sock")).unwrap();
    let p = nacre_meta::map::get_volume(&meta, "p").unwrap().unwrap();
    nacre_meta::map::remove_volume(&meta, "p", p.id).unwrap();
    let st = status_until(&up, "the orphans reclaimed", |st| objects(st) == 0);
    assert_eq!(st["orphans"]["reclaimed_objects"], before + 3 * 128, "{st}");
    assert_eq!(st["health"], "HEALTH_OK", "{st}");
    let table = ok(nacre(&["status", "--dir", up.dir()]));
    assert!(
        table.contains(&format!(
            "{} object copies of deleted volumes reclaimed",
            before + 384
        )),
        "{table}"
    );

    // A client killed while its write waits (two OSDs down: every PG is
    // below min_size) takes its requests with it: the gateway stops
    // retrying them, so the connection is gone long before the write's
    // CLIENT_OP_TIMEOUT_MS (2 min), and the volume is free again.
    up.volume(&["create", "w", "--size", "16M"]);
    for id in [0, 1] {
        let pid = osd_pid(&up, id).unwrap();
        // SAFETY: signalling a child process of the cluster.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    status_until(&up, "one OSD up", |st| st["osds"]["up"] == 1);
    let connections = || {
        let info: serde_json::Value =
            serde_json::from_str(&up.volume(&["info", "w", "--format", "json"])).unwrap();
        info["open_connections"].as_array().unwrap().len()
    };
    let mut vm = tool("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x5a 0 64k", &up.uri("w")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while connections() == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "qemu-io never connected"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert!(vm.try_wait().unwrap().is_none(), "the write did not wait");
    vm.kill().unwrap();
    vm.wait().unwrap();
    let t0 = Instant::now();
    while connections() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the gateway still serves a client killed a minute ago"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for id in ["0", "1"] {
        ok(nacre(&["osd", "start", id, "--dir", up.dir()]));
    }
    status_until(&up, "HEALTH_OK", |st| st["health"] == "HEALTH_OK");
    up.volume(&["rm", "w"]);
}

/// Issue 8: `nacre osd add` under FUA writers gives the new OSD its share
/// of the PGs (it becomes primary of some and holds their objects) while
/// they serve; the copies it took over go from the others, so every object
/// has three copies again; `nacre up` keeps it across a restart, and a
/// restart with a larger `--osds` adds one more. No write fails, every
/// acknowledged one reads back; what cannot work is refused and says why.
#[test]
fn added_osds_take_their_share_while_the_pgs_serve() {
    let d = tempfile::tempdir().unwrap();
    let mut up = Up::start(
        &d.path().join("c"),
        &["--osd-size", "512M", "--recovery-rate", "16M"],
    );
    up.volume(&["create", "vol1", "--size", "256M"]);
    let uri = up.uri("vol1");
    let log = Arc::new(Mutex::new(AckLog::default()));
    let stop = Arc::new(Mutex::new(false));
    let writer = |seed| {
        let (u, s, l) = (uri.clone(), stop.clone(), log.clone());
        std::thread::spawn(move || fua_writer(u, 64 << 20, seed, s, l))
    };
    let w = writer(31);
    let n = log.lock().unwrap().acks;
    wait_acks(&log, n + 500);
    let out = ok(nacre(&["osd", "add", "--dir", up.dir()]));
    assert!(out.contains("osd.3 added (512.0 MiB)"), "{out}");
    let n = log.lock().unwrap().acks;
    wait_acks(&log, n + 1000);
    let st = status_until(&up, "four OSDs in and clean", |st| {
        st["osds"]["in"] == 4 && st["health"] == "HEALTH_OK"
    });
    let osd3 = &st["osd"][3]["stats"];
    assert!(
        osd3["pg_states"].as_object().is_some_and(|m| !m.is_empty())
            && osd3["objects"].as_u64() > Some(0),
        "osd.3 took nothing: {st}"
    );
    three_copies(&up, "vol1");
    stop_and_verify(w, &stop, &log, &uri, "osd.3 was added");

    // Too small a store is refused before anything is made.
    let out = nacre(&["osd", "add", "--dir", up.dir(), "--size", "1M"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cannot be made"),
        "{err}"
    );
    assert!(!up.dir.join("osd.4.img").exists());

    // A restart keeps the four; fewer is refused; more adds.
    up.stop();
    up.spawn();
    assert_eq!(up.status()["osds"]["total"], 4);
    up.stop();
    let out = nacre(&["up", "--dir", up.dir(), "--osds", "3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("has 4 OSDs"), "{err}");
    up.args.extend(["--osds".to_string(), "5".to_string()]);
    up.spawn();
    let st = status_until(&up, "five OSDs clean", |st| {
        st["osds"]["in"] == 5 && st["health"] == "HEALTH_OK"
    });
    assert!(st["osd"][4]["stats"]["objects"].as_u64() > Some(0), "{st}");
    three_copies(&up, "vol1");
    let w = writer(32);
    let n = log.lock().unwrap().acks;
    wait_acks(&log, n + 300);
    stop_and_verify(w, &stop, &log, &uri, "osd.4 was added at a restart");
}

/// Issue 8's scenario with fio's own verifier: `nacre up` with 4 OSDs,
/// size 3, min_size 2; fio writes with `verify=crc32c` through NBD while
/// osd.1 is killed with `kill -9`, started again, and osd.2 is marked
/// out. No write fails, fio's verify pass finds every block (all of each
/// 4 KiB), a second verify-only pass does so again once the cluster is
/// clean, and `nacre status` went degraded → recovering → HEALTH_OK.
#[test]
fn fio_verifies_every_block_through_kill_restart_and_out() {
    let d = tempfile::tempdir().unwrap();
    let up = Up::start(
        &d.path().join("c"),
        &[
            "--osds",
            "4",
            "--osd-size",
            "512M",
            "--no-restart",
            "--recovery-rate",
            "8M",
        ],
    );
    up.volume(&["create", "vol1", "--size", "256M"]);
    let job = |extra: &[&str]| {
        let mut c = tool("fio");
        c.args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={}", up.uri("vol1")),
            "--rw=randwrite",
            "--bs=4k",
            "--size=96M",
            "--iodepth=8",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=json",
        ])
        .args(extra);
        c
    };
    // What status says, sampled while it all happens.
    let seen = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let done = Arc::new(Mutex::new(false));
    let poller = {
        let (seen, done, dir) = (seen.clone(), done.clone(), up.dir().to_string());
        std::thread::spawn(move || {
            while !*done.lock().unwrap() {
                let out = nacre(&["status", "--dir", &dir, "--format", "json"]);
                if let Ok(st) = serde_json::from_slice::<serde_json::Value>(&out.stdout) {
                    let mut s = seen.lock().unwrap();
                    if st["pgs"]["degraded"].as_u64() > Some(0) {
                        s.insert("degraded");
                    }
                    if st["pgs"]["recovering"].as_u64() > Some(0) {
                        s.insert("recovering");
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // About 16 s of writes at 1 500 a second, then fio reads them back.
    let fio = job(&["--rate_iops=1500", "--do_verify=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let pid = osd_pid(&up, 1).unwrap();
    // SAFETY: signalling a child process of the cluster.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    status_until(&up, "osd.1 down", |st| st["osds"]["up"] == 3);
    std::thread::sleep(Duration::from_secs(3));
    ok(nacre(&["osd", "start", "1", "--dir", up.dir()]));
    std::thread::sleep(Duration::from_secs(3));
    ok(nacre(&["osd", "out", "2", "--dir", up.dir()]));
    let out = fio.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "fio failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    assert_eq!(v["jobs"][0]["error"], 0, "{text}");
    assert!(
        v["jobs"][0]["read"]["io_bytes"].as_u64() >= Some(96 << 20),
        "fio verified nothing"
    );
    let st = status_until(&up, "HEALTH_OK", |st| st["health"] == "HEALTH_OK");
    *done.lock().unwrap() = true;
    poller.join().unwrap();
    assert_eq!(st["osds"]["out"], serde_json::json!([2]), "{st}");
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.contains("degraded") && seen.contains("recovering"),
        "status never showed {:?}",
        ["degraded", "recovering"]
            .iter()
            .filter(|s| !seen.contains(*s))
            .collect::<Vec<_>>()
    );
    // Every block again, now that every PG is clean on its new OSDs.
    let text = run_tool(&mut job(&["--verify_only=1"]));
    let v: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap();
    assert_eq!(v["jobs"][0]["error"], 0, "{text}");
    assert!(
        v["jobs"][0]["read"]["io_bytes"].as_u64() >= Some(96 << 20),
        "{text}"
    );
}
