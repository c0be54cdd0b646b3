//! What the cluster tests share: a writer that logs every acknowledged
//! FUA write through NBD, and the check of every logged byte.

#![allow(dead_code)]

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nacre_io::{rt, AlignedBuf};
use nacre_nbd::client::NbdClient;

/// `name` from Debian's packages, which the tests need (a clear message
/// if it is missing).
pub fn tool(name: &str) -> std::process::Command {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "{name} is missing: run scripts/test.sh, which installs libnbd-bin, qemu-utils and fio"
    );
    std::process::Command::new(name)
}

/// A running fio, killed if dropped before [`stop_fio`] (a failed test
/// must not leave it running: it would hold the test harness's output
/// open). fio forks a process per job: the whole process group goes.
pub struct Fio(Option<std::process::Child>);

impl Drop for Fio {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // SAFETY: signalling the process group this test started
            // (`process_group(0)`: fio leads it).
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.wait();
        }
    }
}

/// fio through NBD at `uri` until stopped ([`stop_fio`]): random 4 KiB
/// writes to `offset..offset+size`, each block read back and checked
/// (crc32c) as it goes (`verify_backlog`), at most `iops` a second; its
/// JSON report goes to `out`.
pub fn start_fio(uri: &str, offset: u64, size: u64, iops: u32, out: &std::path::Path) -> Fio {
    let child = tool("fio")
        .args([
            "--name=verify",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            &format!("--offset={offset}"),
            &format!("--size={size}"),
            "--iodepth=4",
            "--verify=crc32c",
            "--verify_backlog=32",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--time_based=1",
            // Longer than any test; a bound should the test be killed.
            "--runtime=1800",
            &format!("--rate_iops={iops}"),
            "--output-format=json",
            &format!("--output={}", out.display()),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(out.with_extension("stderr")).expect("fio's stderr file"))
        .process_group(0)
        .spawn()
        .expect("start fio");
    Fio(Some(child))
}

/// Stops fio (SIGINT: it ends its jobs and writes its report); it failed
/// no I/O, and wrote and verified something. Returns (written, verified)
/// bytes, and the longest any one read or write took.
pub fn stop_fio(mut fio: Fio, out: &std::path::Path, what: &str) -> (u64, u64, Duration) {
    let mut fio = fio.0.take().expect("fio runs");
    if fio.try_wait().unwrap().is_none() {
        // SAFETY: signalling a child of this test.
        unsafe { libc::kill(fio.id() as i32, libc::SIGINT) };
    }
    fio.wait().unwrap();
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let v: serde_json::Value = text
        .find('{')
        .and_then(|i| serde_json::from_str(&text[i..]).ok())
        .unwrap_or_else(|| panic!("{what}: fio left no report: {text}"));
    let j = &v["jobs"][0];
    assert_eq!(j["error"], 0, "{what}: fio saw an error: {text}");
    let (w, r) = (
        j["write"]["io_bytes"].as_u64().unwrap_or(0),
        j["read"]["io_bytes"].as_u64().unwrap_or(0),
    );
    assert!(
        w > 0 && r > 0,
        "{what}: fio wrote {w} and verified {r} bytes"
    );
    let longest = ["read", "write"]
        .iter()
        .filter_map(|d| j[d]["lat_ns"]["max"].as_u64())
        .max()
        .unwrap_or(0);
    (w, r, Duration::from_nanos(longest))
}

/// 4 KiB of data that only `seed` produces (xorshift), so a log of seeds
/// is enough to check every byte of every acknowledged write.
pub fn piece(seed: u64) -> AlignedBuf {
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
pub struct AckLog {
    pub acked: HashMap<u64, u64>,
    /// Acknowledgements received, overwrites included.
    pub acks: usize,
    /// Writes that failed (each ends its writer task): when (wall clock,
    /// to match against the daemons' logs), where, and the error.
    pub errors: Vec<String>,
    /// Per writer task: the (offset, seed) it has sent and not seen acked.
    pub inflight: HashMap<usize, (u64, u64)>,
    /// When the last acknowledgement came, and the longest time without
    /// one since [`AckLog::restart_gaps`] (the longest pause every writer
    /// task saw at once).
    pub last_ack: Option<Instant>,
    pub longest_gap: Duration,
}

impl AckLog {
    pub fn restart_gaps(&mut self) {
        self.last_ack = Some(Instant::now());
        self.longest_gap = Duration::ZERO;
    }
}

pub const KILL9_WRITERS: usize = 8;

/// Writes random 4 KiB pieces with FUA at random 4 KiB-aligned offsets
/// below `span_bytes`, from `KILL9_WRITERS` tasks on one connection (each
/// task owns the offsets that are its index modulo the task count, so a
/// piece has at most one write in flight), until stopped or the server
/// dies; logs every acknowledgement.
pub fn fua_writer(
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
                            let now = Instant::now();
                            if let Some(t) = l.last_ack.replace(now) {
                                l.longest_gap = l.longest_gap.max(now - t);
                            }
                        }
                        Err(e) => {
                            // The server died (or gave up on the write).
                            let at = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .unwrap_or_default();
                            log.lock().unwrap().errors.push(format!(
                                "{}.{:03} s since the epoch: write at offset {off}: {e}",
                                at.as_secs(),
                                at.subsec_millis()
                            ));
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
pub enum Found {
    Acked,
    /// The write in flight landed: from now on it is the expected one.
    InFlight(u64),
    Bad(String),
}

pub fn judge(
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
        // Never written, or a first write in flight that did not happen.
        (None, _) if got.iter().all(|&b| b == 0) => Found::Acked,
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
pub fn verify_acked(uri: &str, log: &mut AckLog) -> Vec<String> {
    verify_pieces(uri, log, &[])
}

/// [`verify_acked`], and the pieces at `also` (4 KiB-aligned) too: each
/// holds its acknowledged write, or zeros if it has none.
pub fn verify_pieces(uri: &str, log: &mut AckLog, also: &[u64]) -> Vec<String> {
    let uri = uri.to_string();
    let inflight: HashMap<u64, u64> = log.inflight.values().copied().collect();
    let mut todo: Vec<(u64, Option<u64>)> = log.acked.iter().map(|(&o, &s)| (o, Some(s))).collect();
    let unacked = inflight
        .keys()
        .chain(also)
        .filter(|o| !log.acked.contains_key(o));
    let unacked: std::collections::BTreeSet<u64> = unacked.copied().collect();
    todo.extend(unacked.into_iter().map(|o| (o, None)));
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

/// Waits until `log` holds `n` acknowledgements (a minute at most).
pub fn wait_acks(log: &Mutex<AckLog>, n: usize) {
    let t0 = Instant::now();
    while log.lock().unwrap().acks < n {
        let l = log.lock().unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "writes stopped at {} acknowledgements (errors: {:?})",
            l.acks,
            l.errors
        );
        drop(l);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stops writer `w`; no write failed, and every acknowledged piece reads
/// back through `uri`.
pub fn stop_and_verify(
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
    assert!(
        l.errors.is_empty(),
        "writes failed while {what}: {:?}",
        l.errors
    );
    let bad = verify_acked(uri, &mut l);
    assert!(
        bad.is_empty(),
        "{what}: {} acknowledged pieces are wrong: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}

/// Daemons of a test, each a child process logging to `DIR/NAME.log`:
/// all killed when dropped; on a failed test the end of every log is
/// printed and the directory kept.
pub struct Procs {
    pub dir: std::path::PathBuf,
    tmp: Option<tempfile::TempDir>,
    procs: HashMap<String, std::process::Child>,
}

impl Procs {
    pub fn new() -> Procs {
        let tmp = tempfile::tempdir().unwrap();
        Procs {
            dir: tmp.path().to_path_buf(),
            tmp: Some(tmp),
            procs: HashMap::new(),
        }
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(name)
    }

    /// Starts `cmd` as daemon `name` (NACRE_LOG=info), its output to
    /// DIR/NAME.log.
    pub fn spawn(&mut self, name: &str, mut cmd: std::process::Command) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(&format!("{name}.log")))
            .unwrap();
        // They die with the test's thread, however it ends.
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .env("NACRE_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        assert!(
            self.procs.insert(name.into(), child).is_none(),
            "{name} runs"
        );
    }

    pub fn runs(&self, name: &str) -> bool {
        self.procs.contains_key(name)
    }

    pub fn pid(&self, name: &str) -> i32 {
        self.procs[name].id() as i32
    }

    /// Sends `sig` to `name` and forgets it (its child handle returned).
    pub fn signal(&mut self, name: &str, sig: i32) -> std::process::Child {
        let c = (self.procs.remove(name)).unwrap_or_else(|| panic!("{name} is not running"));
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(c.id() as i32, sig) };
        c
    }

    pub fn kill9(&mut self, name: &str) {
        let _ = self.signal(name, libc::SIGKILL).wait();
    }

    /// Forgets `name`, which died with its host; reaps it.
    pub fn reap(&mut self, name: &str) {
        if let Some(mut c) = self.procs.remove(name) {
            let _ = c.wait();
        }
    }

    /// SIGTERM to `name`; it must exit cleanly within a minute.
    pub fn stop(&mut self, name: &str) {
        let mut c = self.signal(name, libc::SIGTERM);
        let t0 = Instant::now();
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                assert!(st.success(), "{name} ended {st} at SIGTERM");
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{name} still runs a minute after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in self.procs.values_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    let s = std::fs::read_to_string(&p).unwrap_or_default();
                    let tail: Vec<&str> = s.lines().rev().take(30).collect();
                    eprintln!("==== {}", p.display());
                    for l in tail.iter().rev() {
                        eprintln!("{l}");
                    }
                }
            }
            if let Some(t) = self.tmp.take() {
                eprintln!("logs of the failed run kept in {}", t.keep().display());
            }
        }
    }
}

/// `nacre` against the cluster on the etcd at `urls`.
pub struct EtcdCli {
    pub urls: String,
}

impl EtcdCli {
    /// `nacre ARGS --etcd URLS`.
    pub fn nacre(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_nacre"))
            .args(args)
            .args(["--etcd", &self.urls])
            .output()
            .unwrap()
    }

    /// Its stdout; the test fails with its stderr if it failed.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.nacre(args);
        assert!(
            out.status.success(),
            "nacre {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Its stderr; the test fails if it succeeded.
    pub fn refused(&self, args: &[&str]) -> String {
        let out = self.nacre(args);
        assert!(!out.status.success(), "nacre {args:?} was not refused");
        String::from_utf8(out.stderr).unwrap()
    }

    pub fn status(&self) -> serde_json::Value {
        let out = self.nacre(&["status", "--format", "json"]);
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// Waits (two minutes at most) until `nacre status` shows `what`.
    pub fn status_until(&self, what: &str, ok: impl Fn(&serde_json::Value) -> bool) {
        let t0 = Instant::now();
        loop {
            let st = self.status();
            if ok(&st) {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "status never showed {what}: {st}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

pub fn healthy(st: &serde_json::Value) -> bool {
    st["health"] == "HEALTH_OK"
}

pub fn leader_of(st: &serde_json::Value) -> Option<String> {
    st["leader"].as_str().map(str::to_string)
}

/// The text of a metrics endpoint, fetched with curl.
pub fn scrape(url: &str) -> String {
    let out = tool("curl")
        .args(["-sSf", "--max-time", "20", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The value of the sample `series` (its name and labels as written) in
/// Prometheus text.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    (text.lines())
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}
