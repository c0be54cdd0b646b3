//! Erasure-coding throughput on one core, ISA-L beside the pure-Rust
//! engine: encode (data bytes in per second), rebuild of two lost data
//! chunks (or one, for m = 1; bytes of the stripe's data per second), and
//! a parity update for one changed data chunk (bytes of the change per
//! second). 128 KiB chunks (an object); each figure from ~0.3 s of
//! repetitions. A benchmark: it asserts nothing about time.
//!
//!   cargo bench -p nacre-ec

use std::time::{Duration, Instant};

use nacre_ec::{Codec, Engine};

const CHUNK: usize = 128 << 10;
const RUN: Duration = Duration::from_millis(300);

/// Runs `f` for about [`RUN`]; GB/s for `bytes` per call.
fn rate(bytes: usize, mut f: impl FnMut()) -> f64 {
    f();
    let (t0, mut n) = (Instant::now(), 0u64);
    while t0.elapsed() < RUN {
        f();
        n += 1;
    }
    (n as f64 * bytes as f64) / t0.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let engines: Vec<Engine> = [Engine::Isal, Engine::Rust]
        .into_iter()
        .filter(|&e| Codec::with_engine(4, 2, e).is_ok())
        .collect();
    println!("| scheme | engine | encode GB/s | rebuild GB/s | update GB/s |");
    println!("| --- | --- | ---: | ---: | ---: |");
    for (k, m) in [(4, 2), (6, 3), (8, 3), (16, 4)] {
        let data: Vec<Vec<u8>> = (0..k)
            .map(|j| (0..CHUNK).map(|b| (b * 7 + j * 131 + 1) as u8).collect())
            .collect();
        for &e in &engines {
            let c = Codec::with_engine(k, m, e).unwrap();
            let src: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            let mut parity = vec![vec![0u8; CHUNK]; m];
            let encode = rate(k * CHUNK, || {
                let mut dst: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
                c.encode(&src, &mut dst).unwrap();
            });
            // Lost: the first one or two data chunks.
            let lost = m.min(2);
            let mut chunks: Vec<Option<&[u8]>> = (data.iter().map(|d| Some(d.as_slice())))
                .chain(parity.iter().map(|p| Some(p.as_slice())))
                .collect();
            for c in chunks.iter_mut().take(lost) {
                *c = None;
            }
            let want: Vec<usize> = (0..lost).collect();
            let mut out = vec![vec![0u8; CHUNK]; lost];
            let rebuild = rate(k * CHUNK, || {
                let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|o| o.as_mut_slice()).collect();
                c.reconstruct(&chunks, &want, &mut dst).unwrap();
            });
            assert_eq!(out[0], data[0], "{k}+{m} {e:?}: rebuilt wrong");
            let delta = vec![0x5au8; CHUNK];
            let mut p2 = parity.clone();
            let update = rate(CHUNK, || {
                let mut dst: Vec<&mut [u8]> = p2.iter_mut().map(|p| p.as_mut_slice()).collect();
                c.update(1, &delta, &mut dst).unwrap();
            });
            println!("| {k}+{m} | {e:?} | {encode:.2} | {rebuild:.2} | {update:.2} |");
        }
    }
}
