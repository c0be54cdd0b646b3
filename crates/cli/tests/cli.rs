//! The `nacre` binary end to end: the store benchmark's JSON, format and
//! info, and bad arguments.

use std::process::Command;

fn nacre(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nacre"))
        .args(args)
        .output()
        .expect("run nacre")
}

#[test]
fn store_bench_json_has_every_test_for_store_and_raw() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.img");
    let out = nacre(&[
        "store",
        "bench",
        "--path",
        path.to_str().unwrap(),
        "--size",
        "160M",
        "--runtime",
        "150ms",
        "--block-size",
        "64K",
        "--journal-size",
        "8M",
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let tests = v["tests"].as_array().unwrap();
    let names: Vec<&str> = tests.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "randwrite-4k-qd1",
            "randwrite-4k-qd128",
            "randread-4k-qd1",
            "randread-4k-qd128",
            "write-4m-qd16",
            "read-4m-qd16"
        ]
    );
    for t in tests {
        for side in ["store", "raw"] {
            let s = &t[side];
            assert!(
                s["iops"].as_f64().unwrap() > 0.0,
                "{} {side}: {s}",
                t["name"]
            );
            for k in ["avg", "p50", "p99", "p999"] {
                assert!(
                    s["lat_us"][k].as_f64().unwrap() > 0.0,
                    "{} {side} {k}",
                    t["name"]
                );
            }
            assert!(s["cpu_us_per_op"].as_f64().unwrap() >= 0.0);
        }
        let w = &t["store_work"];
        for k in ["flushes_per_op", "batches_per_op", "folds_per_op"] {
            assert!(w[k].as_f64().unwrap() >= 0.0, "{}: {w}", t["name"]);
        }
        // A durable write at QD1 waits for a flush of its own. (Reads
        // flush nothing of theirs, but a checkpoint may still be running.)
        if t["name"] == "randwrite-4k-qd1" {
            assert!(w["flushes_per_op"].as_f64().unwrap() >= 0.9, "{w}");
        }
    }
    assert!(v["memory"]["index_bytes_per_object"].as_f64().unwrap() > 0.0);
}

#[test]
fn format_then_info() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.img");
    let p = path.to_str().unwrap();
    let out = nacre(&[
        "store",
        "format",
        "--path",
        p,
        "--size",
        "64M",
        "--block-size",
        "16K",
        "--journal-size",
        "4M",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = nacre(&["store", "info", "--path", p, "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["block_bytes"], 16384);
    assert_eq!(v["objects"], 0);
    assert!(v["open"]["replay_stopped"].is_null());
}

#[test]
fn bad_arguments_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.img");
    let p = p.to_str().unwrap();
    let cases: [(&[&str], &str); 5] = [
        (
            &["store", "bench", "--path", p, "--size", "4X"],
            "unknown unit",
        ),
        (
            &["store", "bench", "--path", p, "--runtime", "1h"],
            "unknown unit",
        ),
        (
            &["store", "format", "--path", p, "--size", "1M"],
            "device too small",
        ),
        (
            &[
                "store",
                "format",
                "--path",
                p,
                "--size",
                "64M",
                "--block-size",
                "3000",
            ],
            "power of two",
        ),
        (&["store", "info", "--path", "/dev/null"], ""),
    ];
    for (args, want) in cases {
        let out = nacre(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A plain file that is not a store.
    std::fs::write(dir.path().join("junk"), vec![0x5a; 1 << 20]).unwrap();
    let junk = dir.path().join("junk");
    let out = nacre(&["store", "info", "--path", junk.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a Nacre store"));
}

/// Log lines carry no colour codes when stderr is not a terminal (a pipe,
/// a file, a test log).
#[test]
fn logs_are_plain_text_when_piped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.img");
    let p = path.to_str().unwrap();
    assert!(nacre(&["store", "format", "--path", p, "--size", "64M"])
        .status
        .success());
    let out = Command::new(env!("CARGO_BIN_EXE_nacre"))
        .args(["store", "info", "--path", p])
        .env("NACRE_NO_URING", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("io_uring disabled"), "{err}");
    assert!(
        !err.contains('\x1b'),
        "colour codes in a piped log: {err:?}"
    );
}

/// Sizes take decimals and say which units they know.
#[test]
fn sizes_take_decimals_and_name_their_units() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.img");
    let p = path.to_str().unwrap();
    let out = nacre(&["store", "format", "--path", p, "--size", "96.5M"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        96 * (1 << 20) + (1 << 19)
    );
    let out = nacre(&["store", "format", "--path", p, "--size", "10X"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("unknown unit") && err.contains("G/GiB"),
        "{err}"
    );
}

/// `nacre plan` on every description in docs/plan (they stay valid), as a
/// table and as JSON; `--example` plans; a bad description names its field.
#[test]
fn plan_answers_for_the_documented_descriptions() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/plan");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        seen += 1;
        let p = path.to_str().unwrap();
        let out = nacre(&["plan", p]);
        assert!(
            out.status.success(),
            "{p}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let table = String::from_utf8(out.stdout).unwrap();
        for row in [
            "capacity",
            "linear write",
            "QD1 latency",
            "lost host",
            "data loss",
        ] {
            assert!(table.contains(row), "{p}: no {row:?} in\n{table}");
        }
        let out = nacre(&["plan", p, "--format", "json"]);
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let prob = v["nacre"]["loss"]["annual_probability"].as_f64().unwrap();
        assert!(prob > 0.0 && prob < 1.0, "{p}: {v}");
        assert!(v["capacity"]["usable_tb"].as_f64().unwrap() > 0.0);
    }
    assert!(seen >= 3, "descriptions in {}", dir.display());

    let example = nacre(&["plan", "--example"]);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("c.toml");
    std::fs::write(&file, &example.stdout).unwrap();
    assert!(nacre(&["plan", file.to_str().unwrap()]).status.success());
    std::fs::write(&file, "[[hosts]]\ncount = 2\ndisks = 1\ndisk = { kind = \"ssd\", size_tb = 1 }\n[network]\ngbps = 10\n[pool]\nreplicas = 3\n").unwrap();
    let out = nacre(&["plan", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs 3 failure domains"), "{err}");
    let out = nacre(&["plan", "/nonexistent.toml"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.toml"));
}

/// A loop device over a file, detached however the test ends.
struct Loop {
    dev: String,
    _dir: tempfile::TempDir,
    backing: std::path::PathBuf,
}

impl Loop {
    fn new(bytes: u64) -> Loop {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("loop.img");
        std::fs::File::create(&backing)
            .unwrap()
            .set_len(bytes)
            .unwrap();
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&backing)
            .output()
            .expect("losetup (Debian: mount)");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop {
            dev: String::from_utf8(out.stdout).unwrap().trim().to_string(),
            _dir: dir,
            backing,
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dev).output();
        let _ = Command::new("losetup").args(["-d", &self.dev]).output();
    }
}

fn check_json(args: &[&str]) -> Result<serde_json::Value, String> {
    let mut all = vec!["disk", "check"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--size", "64M", "--runtime", "150ms", "--format", "json"]);
    let out = nacre(&all);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tests = v["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 8, "{v}");
    for t in tests {
        assert!(t["ops"].as_u64().unwrap() > 0, "{t}");
        assert!(!t["series"].as_array().unwrap().is_empty(), "{t}");
    }
    assert!(v["durable_write_p50_us"].as_f64().unwrap() > 0.0);
    Ok(v)
}

fn digest(path: &std::path::Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(path).unwrap().hash(&mut h);
    h.finish()
}

/// `nacre disk check` on a directory and beside a file (a scratch file,
/// removed; the file untouched), and on a loop device: blank, then holding
/// ext4 (refused, nothing written; mounted, refused even when destructive;
/// destroyed with --destructive, which names it and clears its head),
/// then a DOS and a GPT partition table (each refused, then destroyed),
/// then a Nacre store (refused).
#[test]
fn disk_check_on_files_and_loop_devices() {
    let dir = tempfile::tempdir().unwrap();
    let v = check_json(&[dir.path().to_str().unwrap()]).unwrap();
    assert_eq!(v["block_device"], false);
    assert_eq!(v["immediate_commit"], false);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "scratch left"
    );
    let file = dir.path().join("keep");
    std::fs::write(&file, b"precious").unwrap();
    check_json(&[file.to_str().unwrap()]).unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "scratch left"
    );
    let err = check_json(&["/nonexistent/x"]).unwrap_err();
    assert!(err.contains("/nonexistent/x"), "{err}");

    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the loop-device part of this test needs root (losetup)"
    );
    let lo = Loop::new(160 << 20);
    let head_and_tail = |path: &std::path::Path| {
        let b = std::fs::read(path).unwrap();
        let n = b.len();
        (b[..4 << 20].to_vec(), b[n - (1 << 20)..].to_vec())
    };
    let v = check_json(&[&lo.dev]).unwrap();
    assert_eq!(v["block_device"], true);
    assert!(v["destroyed"].is_null());
    // Its first 4 MiB and last MiB untouched (still zero): written
    // between them only.
    let (head, tail) = head_and_tail(&lo.backing);
    assert!(
        head.iter().chain(&tail).all(|&b| b == 0),
        "the check wrote where signatures live"
    );
    assert!(std::fs::read(&lo.backing).unwrap().iter().any(|&b| b != 0));
    // Where the kernel sends no flush, nothing is told of power-loss
    // protection, and a loop device's own cache cannot be read: fsync
    // stays.
    let name = lo.dev.trim_start_matches("/dev/");
    let wc = format!("/sys/block/{name}/queue/write_cache");
    std::fs::write(&wc, "write through").unwrap();
    let v = check_json(&[&lo.dev]).unwrap();
    assert!(v["behaves_as_plp"].is_null(), "{v}");
    assert_eq!(v["immediate_commit"], false, "{v}");
    // Data past the head, in the last MiB: refused too.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&lo.backing)
            .unwrap();
        f.write_all_at(b"x", (160 << 20) - 100).unwrap();
    }
    let err = check_json(&[&lo.dev]).unwrap_err();
    assert!(err.contains("last MiB"), "{err}");
    let v = check_json(&[&lo.dev, "--destructive"]).unwrap();
    assert!(v["destroyed"].as_str().unwrap().contains("last MiB"), "{v}");

    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F", &lo.dev])
        .output()
        .expect("mkfs.ext4 (Debian: e2fsprogs)");
    assert!(mkfs.status.success());
    let before = digest(&lo.backing);
    let err = check_json(&[&lo.dev]).unwrap_err();
    assert!(
        err.contains("ext2/3/4") && err.contains("--destructive"),
        "{err}"
    );
    assert_eq!(digest(&lo.backing), before, "a refused check wrote");

    let mnt = tempfile::tempdir().unwrap();
    let mount = Command::new("mount")
        .arg(&lo.dev)
        .arg(mnt.path())
        .output()
        .unwrap();
    assert!(
        mount.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&mount.stderr)
    );
    let err = check_json(&[&lo.dev, "--destructive"]).unwrap_err();
    assert!(err.contains("busy"), "{err}");
    assert!(Command::new("umount")
        .arg(mnt.path())
        .status()
        .unwrap()
        .success());

    let v = check_json(&[&lo.dev, "--destructive"]).unwrap();
    assert!(v["destroyed"].as_str().unwrap().contains("ext2/3/4"), "{v}");
    // Its head zeroed: blank again, checked without --destructive.
    check_json(&[&lo.dev]).unwrap();
    // A partition table: a DOS one (a boot sector with an entry in use),
    // a GPT (its header in the second sector): refused, nothing written;
    // named when destroyed, and blank after.
    let mut dos = vec![0u8; 512];
    dos[446 + 4] = 0x83;
    dos[510..].copy_from_slice(&[0x55, 0xaa]);
    for (at, bytes, what) in [
        (0, &dos[..], "a DOS partition table"),
        (512, b"EFI PART", "a GPT"),
    ] {
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&lo.backing);
            f.unwrap().write_all_at(bytes, at).unwrap();
        }
        let before = digest(&lo.backing);
        let err = check_json(&[&lo.dev]).unwrap_err();
        assert!(err.contains(what) && err.contains("--destructive"), "{err}");
        assert_eq!(digest(&lo.backing), before, "a refused check wrote");
        let v = check_json(&[&lo.dev, "--destructive"]).unwrap();
        assert!(v["destroyed"].as_str().unwrap().contains(what), "{v}");
        check_json(&[&lo.dev]).unwrap();
    }
    // Too small an area, too short a test: refused.
    for (flag, value, why) in [
        ("--size", "16M", "--size"),
        ("--runtime", "0s", "--runtime"),
    ] {
        let out = nacre(&["disk", "check", &lo.dev, flag, value]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{err}");
    }

    let out = nacre(&["store", "format", "--path", &lo.dev]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = check_json(&[&lo.dev]).unwrap_err();
    assert!(err.contains("a Nacre store"), "{err}");
}
