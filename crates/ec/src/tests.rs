use super::*;
use proptest::prelude::*;

/// Deterministic bytes for data chunk `j` of `len` (xorshift).
pub(crate) fn chunk(j: usize, len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed ^ (j as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn encode_with(c: &Codec, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let len = data[0].len();
    let mut parity = vec![vec![0u8; len]; c.m()];
    let src: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let mut dst: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
    c.encode(&src, &mut dst).unwrap();
    parity
}

/// The engines to hold to the same bytes: the pure-Rust one always,
/// ISA-L where installed (the test command installs it, and sets
/// `NACRE_REQUIRE_ISAL` so that its absence fails instead of skipping).
fn engines() -> Vec<Engine> {
    let mut e = vec![Engine::Rust];
    if isal::get().is_some() {
        e.push(Engine::Isal);
    } else {
        assert!(
            std::env::var_os("NACRE_REQUIRE_ISAL").is_none(),
            "NACRE_REQUIRE_ISAL is set and libisal.so.2 cannot be loaded"
        );
    }
    e
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The on-disk format: these parity bytes, for these data bytes, never
/// change (computed once by both engines, which agreed).
#[test]
fn golden_vectors() {
    let golden: [(usize, usize, &[&str]); 3] = [
        (
            4,
            2,
            &[
                "02ecabd0b1cbb39b9a60ea68db5cf4d6",
                "78f07b49e3aa2ed2f00097a34ed0c3eb",
            ],
        ),
        (
            8,
            3,
            &[
                "e185563b2dba099e104d9f1cbe64a934",
                "1b36123b2adb042640dcb3af94b817cc",
                "b12f1f5535d25a39e153030dc6f36afc",
            ],
        ),
        (
            16,
            4,
            &[
                "08a68c10259b9d172d3339d1c99f8c85",
                "70d72112cfcef7b23bd9c0288a25dbb9",
                "6b431d27d6387a8e4e37e4b24065e556",
                "990b50c324249f1763eb0889572e5574",
            ],
        ),
    ];
    for (k, m, want) in golden {
        let data: Vec<Vec<u8>> = (0..k).map(|j| chunk(j, 16, 1)).collect();
        for e in engines() {
            let got = encode_with(&Codec::with_engine(k, m, e).unwrap(), &data);
            let got: Vec<String> = got.iter().map(|p| hex(p)).collect();
            assert_eq!(got, want, "{k}+{m} on {e:?}");
        }
    }
}

/// FNV-1a, to pin long parity chunks in a line.
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The same on chunks long enough for ISA-L's SIMD kernels and an odd
/// tail (4 099 bytes), pinned by a hash of each parity chunk.
#[test]
fn golden_vectors_long() {
    let golden: [(usize, usize, &[u64]); 2] = [(4, 2, &GOLDEN_4_2), (8, 3, &GOLDEN_8_3)];
    for (k, m, want) in golden {
        let data: Vec<Vec<u8>> = (0..k).map(|j| chunk(j, 4099, 2)).collect();
        for e in engines() {
            let got = encode_with(&Codec::with_engine(k, m, e).unwrap(), &data);
            let got: Vec<u64> = got.iter().map(|p| fnv(p)).collect();
            assert_eq!(got, want, "{k}+{m} on {e:?}");
        }
    }
}

/// Our Cauchy matrix is ISA-L's, for every supported scheme.
#[test]
fn the_matrix_is_isal_s() {
    let Some(lib) = isal::get() else {
        engines(); // fails if ISA-L is required
        return;
    };
    for k in K_MIN..=K_MAX {
        for m in M_MIN..=M_MAX {
            assert_eq!(cauchy1(k, m), lib.cauchy1(k, m), "{k}+{m}");
        }
    }
}

/// Every lost pattern of up to `m` chunks of every supported scheme is
/// rebuilt, to the same bytes by both engines.
#[test]
fn every_erasure_pattern_of_every_scheme_is_rebuilt() {
    const LEN: usize = 100;
    let engines = engines();
    for k in K_MIN..=K_MAX {
        for m in M_MIN..=M_MAX {
            let n = k + m;
            // Long enough for ISA-L's SIMD kernels and their tails (it
            // takes its scalar code below 64 bytes).
            let data: Vec<Vec<u8>> = (0..k).map(|j| chunk(j, LEN, (k * 10 + m) as u64)).collect();
            let codecs: Vec<Codec> = (engines.iter())
                .map(|&e| Codec::with_engine(k, m, e).unwrap())
                .collect();
            let parity = encode_with(&codecs[0], &data);
            let stripe: Vec<&[u8]> = data.iter().chain(&parity).map(|c| c.as_slice()).collect();
            for lost in 1..=m {
                // Every subset of `lost` indices, in order.
                let mut idx: Vec<usize> = (0..lost).collect();
                loop {
                    let chunks: Vec<Option<&[u8]>> = (0..n)
                        .map(|i| (!idx.contains(&i)).then_some(stripe[i]))
                        .collect();
                    for c in &codecs {
                        let mut out = vec![vec![0u8; LEN]; lost];
                        let mut dst: Vec<&mut [u8]> =
                            out.iter_mut().map(|o| o.as_mut_slice()).collect();
                        c.reconstruct(&chunks, &idx, &mut dst).unwrap();
                        for (w, &i) in idx.iter().enumerate() {
                            assert_eq!(
                                out[w],
                                stripe[i],
                                "{k}+{m} lost {idx:?} on {:?}",
                                c.engine()
                            );
                        }
                    }
                    // Next subset.
                    let Some(p) = (0..lost).rev().find(|&p| idx[p] < n - lost + p) else {
                        break;
                    };
                    idx[p] += 1;
                    for q in p + 1..lost {
                        idx[q] = idx[q - 1] + 1;
                    }
                }
            }
        }
    }
}

/// Zero-length chunks are a no-op on both engines; a wanted index past
/// the stripe is refused.
#[test]
fn empty_chunks_and_bad_indices() {
    for e in engines() {
        let c = Codec::with_engine(4, 2, e).unwrap();
        let empty: Vec<Vec<u8>> = vec![Vec::new(); 4];
        assert_eq!(encode_with(&c, &empty), vec![Vec::<u8>::new(); 2]);
        let chunks: Vec<Option<&[u8]>> = vec![Some(&[][..]); 6];
        let mut out = [Vec::<u8>::new()];
        let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|x| x.as_mut_slice()).collect();
        c.reconstruct(&chunks, &[0], &mut dst).unwrap();
        assert!(matches!(
            c.reconstruct(&chunks, &[6], &mut dst),
            Err(EcError::Shape(_))
        ));
    }
}

#[test]
fn bad_shapes_are_refused() {
    // Chunks beyond a C int (ISA-L's length type) are refused, not wrapped.
    assert!(check_len(CHUNK_BYTES_MAX).is_ok());
    assert!(matches!(
        check_len(CHUNK_BYTES_MAX + 1),
        Err(EcError::Shape(_))
    ));
    assert_eq!(Codec::new(1, 2).err(), Some(EcError::Scheme { k: 1, m: 2 }));
    assert_eq!(
        Codec::new(17, 2).err(),
        Some(EcError::Scheme { k: 17, m: 2 })
    );
    assert_eq!(Codec::new(4, 0).err(), Some(EcError::Scheme { k: 4, m: 0 }));
    assert_eq!(Codec::new(4, 5).err(), Some(EcError::Scheme { k: 4, m: 5 }));
    for e in engines() {
        let c = Codec::with_engine(4, 2, e).unwrap();
        let d = [vec![0u8; 8], vec![0u8; 8], vec![0u8; 8], vec![0u8; 7]];
        let src: Vec<&[u8]> = d.iter().map(|x| x.as_slice()).collect();
        let mut p = [vec![0u8; 8], vec![0u8; 8]];
        let mut dst: Vec<&mut [u8]> = p.iter_mut().map(|x| x.as_mut_slice()).collect();
        assert!(matches!(c.encode(&src, &mut dst), Err(EcError::Shape(_))));
        assert!(matches!(
            c.encode(&src[..3], &mut dst),
            Err(EcError::Shape(_))
        ));
        let chunks = [
            Some(&[0u8; 8][..]),
            None,
            None,
            None,
            Some(&[0u8; 8][..]),
            Some(&[0u8; 8][..]),
        ];
        let mut out = [vec![0u8; 8]];
        let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|x| x.as_mut_slice()).collect();
        assert_eq!(
            c.reconstruct(&chunks, &[1], &mut dst),
            Err(EcError::TooFew {
                have: 3,
                k: 4,
                m: 2
            })
        );
        let mut parity = [vec![0u8; 8], vec![0u8; 8]];
        let mut dst: Vec<&mut [u8]> = parity.iter_mut().map(|x| x.as_mut_slice()).collect();
        assert!(matches!(
            c.update(4, &[0u8; 8], &mut dst),
            Err(EcError::Shape(_))
        ));
        assert!(matches!(
            c.update(0, &[0u8; 9], &mut dst),
            Err(EcError::Shape(_))
        ));
    }
}

/// Where ISA-L is installed it is the engine chosen.
#[test]
fn isal_is_chosen_where_installed() {
    let want = if engines().contains(&Engine::Isal) {
        Engine::Isal
    } else {
        Engine::Rust
    };
    assert_eq!(Codec::new(4, 2).unwrap().engine(), want);
}

fn scheme() -> impl Strategy<Value = (usize, usize)> {
    (K_MIN..=K_MAX, M_MIN..=M_MAX)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// Both engines encode any data to the same parity.
    #[test]
    fn the_engines_agree((k, m) in scheme(), len in 1usize..600, seed in any::<u64>()) {
        let data: Vec<Vec<u8>> = (0..k).map(|j| chunk(j, len, seed)).collect();
        let all: Vec<Vec<Vec<u8>>> = engines()
            .into_iter()
            .map(|e| encode_with(&Codec::with_engine(k, m, e).unwrap(), &data))
            .collect();
        prop_assert!(all.windows(2).all(|w| w[0] == w[1]));
    }

    /// Updating the parity by the delta of one data chunk gives the
    /// parity of the new data, on either engine.
    #[test]
    fn a_delta_update_equals_encoding_anew((k, m) in scheme(), len in 1usize..600, seed in any::<u64>(), which in any::<prop::sample::Index>()) {
        let mut data: Vec<Vec<u8>> = (0..k).map(|j| chunk(j, len, seed)).collect();
        let j = which.index(k);
        for e in engines() {
            let c = Codec::with_engine(k, m, e).unwrap();
            let mut parity = encode_with(&c, &data);
            let new = chunk(j + 100, len, seed);
            let delta: Vec<u8> = data[j].iter().zip(&new).map(|(a, b)| a ^ b).collect();
            let mut dst: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
            c.update(j, &delta, &mut dst).unwrap();
            let old = std::mem::replace(&mut data[j], new);
            prop_assert_eq!(&parity, &encode_with(&c, &data), "{}+{} chunk {} on {:?}", k, m, j, e);
            data[j] = old;
        }
    }

    /// Any `k` survivors rebuild every lost chunk, data or parity.
    #[test]
    fn any_k_survivors_rebuild_the_rest((k, m) in scheme(), len in 1usize..300, seed in any::<u64>(), lost_seed in any::<u64>()) {
        let n = k + m;
        let data: Vec<Vec<u8>> = (0..k).map(|j| chunk(j, len, seed)).collect();
        for e in engines() {
            let c = Codec::with_engine(k, m, e).unwrap();
            let parity = encode_with(&c, &data);
            let stripe: Vec<&[u8]> = data.iter().chain(&parity).map(|x| x.as_slice()).collect();
            // Up to m distinct lost indices.
            let mut lost: Vec<usize> = (0..m).map(|i| (lost_seed.rotate_left(i as u32 * 8) as usize) % n).collect();
            lost.sort_unstable();
            lost.dedup();
            let chunks: Vec<Option<&[u8]>> = (0..n).map(|i| (!lost.contains(&i)).then_some(stripe[i])).collect();
            let mut out = vec![vec![0u8; len]; lost.len()];
            let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|o| o.as_mut_slice()).collect();
            c.reconstruct(&chunks, &lost, &mut dst).unwrap();
            for (w, &i) in lost.iter().enumerate() {
                prop_assert_eq!(&out[w][..], stripe[i]);
            }
        }
    }
}

/// [`golden_vectors_long`]'s parity hashes (both engines agreed).
const GOLDEN_4_2: [u64; 2] = [0xa42a_3923_3842_43ac, 0xfc0f_1d99_9f9d_ad23];
const GOLDEN_8_3: [u64; 3] = [
    0x48b8_f148_016d_191d,
    0x1c2d_10bb_f8c2_78fa,
    0x74f9_35d5_7c7f_35fb,
];
