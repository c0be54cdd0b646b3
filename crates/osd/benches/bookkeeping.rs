//! What an OSD's per-op bookkeeping costs: the store write timing that
//! slow-OSD detection compares (a latency window and a histogram), and
//! the op counting the metrics export (by type: count, bytes, status,
//! latency). Each is timed over millions of calls on one thread, as the
//! OSD's reactor makes them; a replicated write makes each once per copy.
//! Prints ns per call and the share of a replicated 4 KiB write's CPU
//! (`--cpu-us-per-write`, default 122: what `scripts/ab-4k.sh`
//! measured, docs/BENCHMARKS.md).
//! A benchmark: it asserts nothing about time.

use std::hint::black_box;
use std::time::Instant;

use nacre_io::rt;
use nacre_osd::OsdStats;
use nacre_wire::{Op, Status};

const CALLS: u32 = 2_000_000;

fn per_call(mut f: impl FnMut(u32)) -> f64 {
    for i in 0..CALLS / 10 {
        f(i);
    }
    let t = Instant::now();
    for i in 0..CALLS {
        f(i);
    }
    t.elapsed().as_nanos() as f64 / f64::from(CALLS)
}

fn main() {
    let cpu_us: f64 = (std::env::args()
        .skip_while(|a| a != "--cpu-us-per-write")
        .nth(1))
    .map(|v| v.parse().expect("--cpu-us-per-write takes µs"))
    .unwrap_or(122.0);
    rt::block_on(async {
        let s = OsdStats::default();
        let clock = per_call(|_| {
            black_box(rt::monotonic());
        });
        let store = per_call(|_| {
            let t0 = rt::monotonic();
            s.store_write_done(black_box(t0));
        });
        let ops = per_call(|i| {
            let c = s.op_started(black_box(if i % 3 == 0 { Op::Write } else { Op::RepWrite }));
            c.done(Status::Ok, 4096, 0);
        });
        println!("bookkeeping per call, one thread ({CALLS} calls each):");
        println!("  runtime clock read                 {clock:>7.1} ns");
        println!("  store write timed (slow-OSD)        {store:>7.1} ns");
        println!("  op counted by type (metrics)        {ops:>7.1} ns");
        // A replicated write at 3 copies: one client op and two replica
        // ops answered, three store writes timed.
        let per_write = 3.0 * (store + ops);
        println!(
            "per replicated 4 KiB write (3 copies): {:.2} µs = {:.2}% of {cpu_us} µs of CPU per write",
            per_write / 1000.0,
            100.0 * per_write / 1000.0 / cpu_us
        );
    });
}
