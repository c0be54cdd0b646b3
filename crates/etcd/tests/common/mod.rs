//! Real etcd members for the tests: Debian's `etcd` (package
//! `etcd-server`, which `scripts/test.sh` installs), each on free loopback
//! ports with its data in a temporary dir, killed when dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Member {
    pub name: String,
    pub client: u16,
    pub peer: u16,
    child: Option<Child>,
}

pub struct EtcdCluster {
    pub dir: tempfile::TempDir,
    pub members: Vec<Member>,
}

/// A loopback port nothing listens on now and that this process has not
/// handed out before. The listener is dropped before the daemon that will
/// use the port binds it, so two ports asked for before any daemon starts
/// could be the same one; remembering them rules that out (it once put an
/// OSD and a monitor's metrics on one port).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

impl EtcdCluster {
    /// Starts `n` members as one cluster and waits until it has a leader.
    pub fn start(n: usize) -> EtcdCluster {
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: free_port(),
                peer: free_port(),
                child: None,
            })
            .collect();
        let mut c = EtcdCluster { dir, members };
        for i in 0..n {
            c.run(i);
        }
        c.wait_leader();
        c
    }

    fn initial(&self) -> String {
        (self.members.iter())
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts member `i` (again: its data dir is kept).
    pub fn run(&mut self, i: usize) {
        let initial = self.initial();
        let data = self.dir.path().join(&self.members[i].name);
        let log = std::fs::File::create(
            self.dir
                .path()
                .join(format!("{}.log", self.members[i].name)),
        )
        .unwrap();
        let m = &mut self.members[i];
        assert!(m.child.is_none(), "{} runs", m.name);
        let child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(&data)
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{}", m.client),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{}", m.client),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", m.peer),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", m.peer),
                "--initial-cluster",
                &initial,
                "--initial-cluster-state",
                "new",
                "--heartbeat-interval",
                "50",
                "--election-timeout",
                "500",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd runs (Debian package etcd-server; scripts/test.sh installs it)");
        m.child = Some(child);
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn urls(&self) -> String {
        (self.members.iter())
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the member that is the leader, once there is one.
    pub fn wait_leader(&self) -> usize {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            for (i, m) in self.members.iter().enumerate() {
                if m.child.is_none() {
                    continue;
                }
                if let Some(v) = post(m.client, "/v3/maintenance/status", "{}") {
                    let me = v["header"]["member_id"].as_str().map(str::to_string);
                    let leader = v["leader"].as_str().map(str::to_string);
                    if me.is_some() && me == leader {
                        return i;
                    }
                }
            }
            assert!(Instant::now() < until, "no etcd leader within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Compacts the key space up to `rev` (through member 0).
    pub fn compact(&self, rev: i64) {
        let m = self.members.iter().find(|m| m.child.is_some()).unwrap();
        let body = format!("{{\"revision\":\"{rev}\",\"physical\":true}}");
        post(m.client, "/v3/kv/compaction", &body).expect("compaction");
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A POST to a member's gateway; its JSON answer if it gave one.
pub fn post(port: u16, path: &str, body: &str) -> Option<serde_json::Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    // Chunked or not: the JSON object is the one between the outer braces.
    let start = body.find('{')?;
    let end = body.rfind('}')?;
    serde_json::from_str(&body[start..=end]).ok()
}
