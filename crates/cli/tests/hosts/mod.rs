//! Hosts as network namespaces on this machine, for the cluster tests that
//! need several hosts with their own addresses (issue 10's harness).
//!
//! - A bridge in the root namespace with the first address of a /24 of
//!   its own (the test process reaches every host through it), and one
//!   namespace per host, joined to the bridge by a veth pair, its address
//!   `.10 + i`.
//! - A daemon runs in its host's namespace (`ip netns exec`, which execs:
//!   the child's pid is the daemon's), logging to `DIR/NAME.log`.
//! - `cut(host)` takes the host's link down (it reaches nothing, nothing
//!   reaches it), `heal` brings it back; `kill_host` kills every process
//!   in the namespace, as a power cut of that host.
//! - Everything is torn down when the `Net` is dropped, even when the test
//!   failed; the logs of a failed run are kept (the path is printed), and
//!   their ends printed (`common::Procs`).
//!
//! Needs root (namespaces, links); names carry the test process's pid, and
//! leftovers of a killed run are removed at the next start.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use crate::common::Procs;

/// One scenario at a time: they load the two cores enough on their own.
pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub struct Host {
    pub name: String,
    pub ns: String,
    pub ip: String,
    /// The root namespace's end of its veth pair.
    veth: String,
}

pub struct Net {
    tag: String,
    bridge: String,
    pub hosts: Vec<Host>,
    pub procs: Procs,
    /// The host each daemon runs on.
    on: HashMap<String, usize>,
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(args: &[&str]) {
    if let Err(e) = sh(args) {
        panic!("{e}");
    }
}

/// Removes namespaces and links of earlier runs whose process is gone, and
/// this process's own (a `Net` that failed while being made: one `Net` at
/// a time runs, under [`ONE_AT_A_TIME`]).
fn sweep_leftovers() {
    let me = std::process::id() as i32;
    // SAFETY: signal 0 only asks whether the process exists.
    let gone = |p: i32| p == me || unsafe { libc::kill(p, 0) } != 0;
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let name = l.split_whitespace().next().unwrap_or("");
        if let Some(pid) = name.strip_prefix("nh").and_then(|r| r.split('h').next()) {
            if pid.parse::<i32>().is_ok_and(gone) {
                kill_all_in(name);
                let _ = sh(&["ip", "netns", "del", name]);
            }
        }
    }
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let name = l.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or("");
        if let Some(pid) = name.strip_prefix("nb").or_else(|| name.strip_prefix("nv")) {
            let pid = pid.split('v').next().unwrap_or("");
            if pid.parse::<i32>().is_ok_and(gone) {
                let _ = sh(&["ip", "link", "del", name]);
            }
        }
    }
}

fn kill_all_in(ns: &str) {
    let out = Command::new("ip").args(["netns", "pids", ns]).output();
    if let Ok(out) = out {
        for p in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(p) = p.parse::<i32>() {
                // SAFETY: a process in a namespace this test made.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
    }
}

impl Net {
    /// `n` hosts named `names` (or h0, h1, … when fewer names are given).
    pub fn new(names: &[&str]) -> Net {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "the multi-host tests make network namespaces: run them as root"
        );
        sweep_leftovers();
        let pid = std::process::id();
        let tag = format!("{pid}");
        let subnet = format!("10.{}.{}", 100 + (pid >> 8) % 100, pid % 256);
        let bridge = format!("nb{tag}");
        // Made before anything it tears down exists: a step that fails
        // part-way leaves nothing behind.
        let mut net = Net {
            tag: tag.clone(),
            bridge: bridge.clone(),
            hosts: Vec::new(),
            procs: Procs::new(),
            on: HashMap::new(),
        };
        must(&["ip", "link", "add", &bridge, "type", "bridge"]);
        let bridge_ip = format!("{subnet}.1/24");
        must(&["ip", "addr", "add", &bridge_ip, "dev", &bridge]);
        must(&["ip", "link", "set", &bridge, "up"]);
        for (i, name) in names.iter().enumerate() {
            let ns = format!("nh{tag}h{i}");
            let veth = format!("nv{tag}v{i}");
            let peer = format!("np{tag}v{i}");
            let ip = format!("{subnet}.{}", 10 + i);
            must(&["ip", "netns", "add", &ns]);
            net.hosts.push(Host {
                name: name.to_string(),
                ns: ns.clone(),
                ip: ip.clone(),
                veth: veth.clone(),
            });
            must(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer,
            ]);
            must(&["ip", "link", "set", &peer, "netns", &ns]);
            must(&["ip", "link", "set", &veth, "master", &bridge]);
            must(&["ip", "link", "set", &veth, "up"]);
            let inside = |args: &[&str]| {
                let mut a = vec!["ip", "netns", "exec", &ns];
                a.extend_from_slice(args);
                must(&a);
            };
            inside(&["ip", "link", "set", &peer, "name", "eth0"]);
            inside(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
            inside(&["ip", "link", "set", "eth0", "up"]);
            inside(&["ip", "link", "set", "lo", "up"]);
        }
        net
    }

    pub fn host(&self, name: &str) -> usize {
        (self.hosts.iter().position(|h| h.name == name)).unwrap_or_else(|| panic!("no host {name}"))
    }

    pub fn ip(&self, name: &str) -> &str {
        &self.hosts[self.host(name)].ip
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.procs.path(name)
    }

    /// `program args` in host `host`'s namespace.
    pub fn command(&self, host: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[self.host(host)].ns, program]);
        c
    }

    /// Starts daemon `name` on `host`: `program args`, logging to
    /// DIR/NAME.log.
    pub fn spawn(&mut self, name: &str, host: &str, program: &str, args: &[&str]) {
        let mut c = self.command(host, program);
        c.args(args);
        self.procs.spawn(name, c);
        self.on.insert(name.into(), self.host(host));
    }

    /// [`Net::spawn`] with environment variables set for it.
    pub fn spawn_env(
        &mut self,
        name: &str,
        host: &str,
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) {
        let mut c = self.command(host, program);
        c.args(args).envs(env.iter().copied());
        self.procs.spawn(name, c);
        self.on.insert(name.into(), self.host(host));
    }

    pub fn runs(&self, name: &str) -> bool {
        self.procs.runs(name)
    }

    pub fn kill9(&mut self, name: &str) {
        self.procs.kill9(name);
    }

    /// SIGTERM to `name`; it must exit cleanly within a minute.
    pub fn stop(&mut self, name: &str) {
        self.procs.stop(name);
    }

    /// Every process of `host` dies at once (SIGKILL), as at a power cut
    /// of that host; returns the daemons that ran there.
    pub fn kill_host(&mut self, host: &str) -> Vec<String> {
        let h = self.host(host);
        kill_all_in(&self.hosts[h].ns);
        let names: Vec<String> = (self.on.iter())
            .filter(|(n, i)| **i == h && self.procs.runs(n))
            .map(|(n, _)| n.clone())
            .collect();
        for n in &names {
            self.procs.reap(n);
        }
        names
    }

    /// Cuts `host` off the network: its link goes down.
    pub fn cut(&self, host: &str) {
        must(&[
            "ip",
            "link",
            "set",
            &self.hosts[self.host(host)].veth,
            "down",
        ]);
    }

    pub fn heal(&self, host: &str) {
        must(&["ip", "link", "set", &self.hosts[self.host(host)].veth, "up"]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            kill_all_in(&h.ns);
            let _ = sh(&["ip", "netns", "del", &h.ns]);
            let _ = sh(&["ip", "link", "del", &h.veth]);
        }
        let _ = sh(&["ip", "link", "del", &self.bridge]);
        // `procs` drops next: it reaps the daemons, and on a failed test
        // prints and keeps their logs.
    }
}
