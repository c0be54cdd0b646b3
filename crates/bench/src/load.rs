//! Closed-loop load: `qd` workers, each issuing one op after another until
//! the deadline, every op timed. Ops get a sequence number from which they
//! derive their (deterministic, pseudo-random) position.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nacre_io::rt;

use crate::stats::{process_cpu, Recorder, Sample, Series, Summary};

/// Runs `op` from `qd` workers for `runtime` (all ops in flight at the
/// deadline finish and count). `op` returns the bytes it moved.
pub async fn run_for<Op, Fut>(qd: usize, runtime: Duration, op: Op) -> anyhow::Result<Summary>
where
    Op: Fn(u64) -> Fut + 'static,
    Fut: Future<Output = anyhow::Result<u64>> + 'static,
{
    Ok(run_for_series(qd, runtime, op).await?.0)
}

/// [`run_for`], with the run's time series.
pub async fn run_for_series<Op, Fut>(
    qd: usize,
    runtime: Duration,
    op: Op,
) -> anyhow::Result<(Summary, Vec<Sample>)>
where
    Op: Fn(u64) -> Fut + 'static,
    Fut: Future<Output = anyhow::Result<u64>> + 'static,
{
    let op = Rc::new(op);
    let rec = Rc::new(RefCell::new(Recorder::new()));
    let series = Rc::new(RefCell::new(Series::new(runtime)));
    let seq = Rc::new(Cell::new(0u64));
    let cpu0 = process_cpu();
    let t0 = Instant::now();
    let deadline = t0 + runtime;
    let mut workers = Vec::with_capacity(qd);
    for _ in 0..qd {
        let (op, rec, seq, series) = (op.clone(), rec.clone(), seq.clone(), series.clone());
        workers.push(rt::spawn(async move {
            while Instant::now() < deadline {
                let n = seq.get();
                seq.set(n + 1);
                let t = Instant::now();
                let bytes = op(n).await?;
                let done = Instant::now();
                rec.borrow_mut().record(done - t, bytes);
                series.borrow_mut().record(done - t0, done - t);
            }
            Ok::<(), anyhow::Error>(())
        }));
    }
    for w in workers {
        w.await?;
    }
    let elapsed = t0.elapsed();
    let cpu = process_cpu().saturating_sub(cpu0);
    let s = rec.borrow().summary(elapsed, cpu);
    let samples =
        std::mem::replace(&mut *series.borrow_mut(), Series::new(runtime)).finish(elapsed);
    Ok((s, samples))
}

/// Runs futures as tasks and waits for all of them; the first error wins.
pub async fn join_all<T: 'static>(
    futs: Vec<impl Future<Output = anyhow::Result<T>> + 'static>,
) -> anyhow::Result<Vec<T>> {
    let handles: Vec<_> = futs.into_iter().map(rt::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await?);
    }
    Ok(out)
}

/// A pseudo-random u64 for op `n` of stream `stream` (splitmix64).
pub fn mix(stream: u64, n: u64) -> u64 {
    let mut z = n
        .wrapping_add(stream.wrapping_mul(0xa076_1d64_78bd_642f))
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_until_deadline_with_all_workers() {
        let s = rt::block_on(run_for(4, Duration::from_millis(30), |_| async {
            rt::sleep(Duration::from_millis(1)).await;
            Ok(4096)
        }))
        .unwrap();
        assert!(s.ops >= 4 * 10, "ops {}", s.ops);
        assert!(s.lat_us.p50 >= 1000.0);
        assert_ne!(mix(1, 1), mix(1, 2));
        assert_ne!(mix(1, 1), mix(2, 1));
    }
}
