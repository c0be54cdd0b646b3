//! Where an object's bytes live among its shards (docs/internals/ec.md,
//! *Layout*): an object of `k` shard blocks is cut into 4 KiB *units*;
//! unit `u` goes to data shard `u mod k` at offset `(u div k) · 4 KiB` of
//! that shard, and *stripe* `s` is units `s·k .. s·k + k` with its `m`
//! parity units at offset `s · 4 KiB` of the parity shards. So a range of
//! the object touches, on each data shard, one contiguous range (the
//! stripes it spans are consecutive), and the parity of the stripes it
//! spans is one contiguous range of each parity shard: one read or write
//! per shard for any range. Part of the on-disk format, like the codec.

use crate::{Codec, EcError};

/// Bytes of a unit: what one stripe puts on each shard.
pub const UNIT: u32 = 4096;

/// A contiguous range of one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardRange {
    pub shard: usize,
    pub offset: u32,
    pub len: u32,
}

impl ShardRange {
    pub fn end(&self) -> u32 {
        self.offset + self.len
    }
}

/// A piece of an object's range that lies in one unit: `len` bytes at
/// `object` in the object, at `offset` of data shard `shard`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub object: u32,
    pub shard: usize,
    pub offset: u32,
    pub len: u32,
}

/// The layout of one pool's objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub k: usize,
    pub m: usize,
    /// Bytes of each shard of an object (a store block), a multiple of
    /// [`UNIT`].
    pub shard_bytes: u32,
}

impl Layout {
    pub fn new(k: usize, m: usize, shard_bytes: u32) -> Result<Layout, EcError> {
        if !(crate::K_MIN..=crate::K_MAX).contains(&k)
            || !(crate::M_MIN..=crate::M_MAX).contains(&m)
        {
            return Err(EcError::Scheme { k, m });
        }
        if shard_bytes == 0 || !shard_bytes.is_multiple_of(UNIT) {
            return Err(EcError::Shape(format!(
                "shards of {shard_bytes} bytes: a multiple of {UNIT}"
            )));
        }
        if u64::from(shard_bytes) * k as u64 > u64::from(u32::MAX) {
            return Err(EcError::Shape(format!(
                "objects of {k} shards of {shard_bytes} bytes"
            )));
        }
        Ok(Layout { k, m, shard_bytes })
    }

    /// Bytes of an object: `k` shards.
    pub fn object_bytes(&self) -> u32 {
        self.shard_bytes * self.k as u32
    }

    /// Data shard and offset in it of byte `at` of the object.
    pub fn locate(&self, at: u32) -> (usize, u32) {
        let u = at / UNIT;
        let k = self.k as u32;
        ((u % k) as usize, (u / k) * UNIT + at % UNIT)
    }

    /// Byte `at` of data shard `shard` as a byte of the object.
    pub fn object_offset(&self, shard: usize, at: u32) -> u32 {
        ((at / UNIT) * self.k as u32 + shard as u32) * UNIT + at % UNIT
    }

    fn check(&self, offset: u32, len: u32) -> Result<(), EcError> {
        if len == 0 || u64::from(offset) + u64::from(len) > u64::from(self.object_bytes()) {
            return Err(EcError::Shape(format!(
                "{len} bytes at {offset} of a {}-byte object",
                self.object_bytes()
            )));
        }
        Ok(())
    }

    /// The pieces of `offset..offset + len` of the object, unit by unit,
    /// in object order.
    pub fn pieces(&self, offset: u32, len: u32) -> Result<Vec<Piece>, EcError> {
        self.check(offset, len)?;
        let end = offset + len;
        let mut out = Vec::with_capacity(len.div_ceil(UNIT) as usize + 1);
        let mut at = offset;
        while at < end {
            let n = (UNIT - at % UNIT).min(end - at);
            let (shard, off) = self.locate(at);
            out.push(Piece {
                object: at,
                shard,
                offset: off,
                len: n,
            });
            at += n;
        }
        Ok(out)
    }

    /// The range of each data shard that `offset..offset + len` of the
    /// object touches (one per shard touched, by shard): what a read of
    /// it reads, and what a write of it writes on the data shards.
    pub fn data_ranges(&self, offset: u32, len: u32) -> Result<Vec<ShardRange>, EcError> {
        let mut out: Vec<Option<ShardRange>> = vec![None; self.k];
        for p in self.pieces(offset, len)? {
            let r = out[p.shard].get_or_insert(ShardRange {
                shard: p.shard,
                offset: p.offset,
                len: 0,
            });
            debug_assert!(
                r.len == 0 || r.end() == p.offset,
                "a shard's pieces are consecutive"
            );
            r.len = p.offset + p.len - r.offset;
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// The range of each parity shard that a write of `offset..offset +
    /// len` changes: the bytes it writes when it lies in one unit, else
    /// the whole units of the stripes it spans.
    pub fn parity_range(&self, offset: u32, len: u32) -> Result<(u32, u32), EcError> {
        self.check(offset, len)?;
        let (first, last) = (offset / UNIT, (offset + len - 1) / UNIT);
        if first == last {
            return Ok((self.locate(offset).1, len));
        }
        let k = self.k as u32;
        let (s1, s2) = (first / k, last / k);
        Ok((s1 * UNIT, (s2 - s1 + 1) * UNIT))
    }

    /// Whether `offset..offset + len` covers whole stripes only (each row
    /// of `k` units it touches, all of it): the parity of those stripes is
    /// then the code of the new bytes alone, with nothing to read.
    pub fn whole_stripes(&self, offset: u32, len: u32) -> bool {
        let row = self.k as u32 * UNIT;
        len > 0 && offset.is_multiple_of(row) && len.is_multiple_of(row)
    }

    /// The data shards' buffers of a write: for each range of
    /// [`Layout::data_ranges`], the bytes of `data` (written at `offset`
    /// of the object) that go there.
    pub fn scatter(&self, offset: u32, data: &[u8]) -> Result<Vec<(ShardRange, Vec<u8>)>, EcError> {
        let len = u32::try_from(data.len()).map_err(|_| EcError::Shape("huge write".into()))?;
        let ranges = self.data_ranges(offset, len)?;
        let mut bufs: Vec<Vec<u8>> = ranges.iter().map(|r| vec![0; r.len as usize]).collect();
        let slot = |shard: usize| {
            ranges
                .iter()
                .position(|r| r.shard == shard)
                .expect("touched")
        };
        for p in self.pieces(offset, len)? {
            let i = slot(p.shard);
            let at = (p.offset - ranges[i].offset) as usize;
            let from = (p.object - offset) as usize;
            bufs[i][at..at + p.len as usize].copy_from_slice(&data[from..from + p.len as usize]);
        }
        Ok(ranges.into_iter().zip(bufs).collect())
    }

    /// The object's bytes `offset..offset + out.len()` from the data
    /// shards' buffers of [`Layout::data_ranges`] (`shards[i]` holds
    /// range `i`): the inverse of [`Layout::scatter`].
    pub fn gather(
        &self,
        offset: u32,
        shards: &[(ShardRange, &[u8])],
        out: &mut [u8],
    ) -> Result<(), EcError> {
        let len = u32::try_from(out.len()).map_err(|_| EcError::Shape("huge read".into()))?;
        if let Some((r, b)) = shards.iter().find(|(r, b)| b.len() < r.len as usize) {
            return Err(EcError::Shape(format!("{} bytes for {r:?}", b.len())));
        }
        for p in self.pieces(offset, len)? {
            let (r, b) = shards
                .iter()
                .find(|(r, _)| {
                    r.shard == p.shard && r.offset <= p.offset && p.offset + p.len <= r.end()
                })
                .ok_or_else(|| EcError::Shape(format!("no buffer holds {p:?}")))?;
            let at = (p.offset - r.offset) as usize;
            let to = (p.object - offset) as usize;
            out[to..to + p.len as usize].copy_from_slice(&b[at..at + p.len as usize]);
        }
        Ok(())
    }

    /// The `k + m` shards of a whole object: its data shards, then the
    /// parity computed from them (a full-stripe write: nothing to read).
    pub fn split(&self, codec: &Codec, object: &[u8]) -> Result<Vec<Vec<u8>>, EcError> {
        if object.len() != self.object_bytes() as usize {
            return Err(EcError::Shape(format!(
                "{} bytes for a {}-byte object",
                object.len(),
                self.object_bytes()
            )));
        }
        let mut shards: Vec<Vec<u8>> = (self.scatter(0, object)?.into_iter())
            .map(|(_, b)| b)
            .collect();
        let mut parity = vec![vec![0u8; self.shard_bytes as usize]; self.m];
        {
            let data: Vec<&[u8]> = shards.iter().map(|s| &s[..]).collect();
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
            codec.encode(&data, &mut p)?;
        }
        shards.extend(parity);
        Ok(shards)
    }

    /// What a write of `new` over `old` (the object's bytes at `offset`
    /// before it) adds into each parity shard's [`Layout::parity_range`]:
    /// `m` buffers to XOR into the parity there.
    pub fn parity_delta(
        &self,
        codec: &Codec,
        offset: u32,
        old: &[u8],
        new: &[u8],
    ) -> Result<Vec<Vec<u8>>, EcError> {
        if old.len() != new.len() || codec.k() != self.k || codec.m() != self.m {
            return Err(EcError::Shape(format!(
                "a delta of {} old and {} new bytes, code {}+{} for layout {}+{}",
                old.len(),
                new.len(),
                codec.k(),
                codec.m(),
                self.k,
                self.m
            )));
        }
        let len = u32::try_from(new.len()).map_err(|_| EcError::Shape("huge write".into()))?;
        let (p0, plen) = self.parity_range(offset, len)?;
        let mut out = vec![vec![0u8; plen as usize]; self.m];
        let mut delta = Vec::with_capacity(UNIT as usize);
        for p in self.pieces(offset, len)? {
            let from = (p.object - offset) as usize;
            let n = p.len as usize;
            delta.clear();
            delta.extend(
                old[from..from + n]
                    .iter()
                    .zip(&new[from..from + n])
                    .map(|(a, b)| a ^ b),
            );
            let at = (p.offset - p0) as usize;
            let mut parity: Vec<&mut [u8]> = out.iter_mut().map(|b| &mut b[at..at + n]).collect();
            codec.update(p.shard, &delta, &mut parity)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Engine;
    use proptest::prelude::*;

    /// The codec tests' generator (xorshift).
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        crate::tests::chunk(0, n, seed)
    }

    /// A write of whole stripes: its parity range is the stripes it
    /// writes, and the delta over zeros is the parity the code gives the
    /// new bytes (what a shard must hold there, whatever was before).
    #[test]
    fn a_write_of_whole_stripes_needs_no_old_bytes() {
        let l = Layout::new(4, 2, 32 << 10).unwrap();
        let codec = Codec::new(4, 2).unwrap();
        assert!(l.whole_stripes(0, 16384) && l.whole_stripes(16384, 32768));
        assert!(!l.whole_stripes(4096, 16384) && !l.whole_stripes(0, 12288));
        assert!(!l.whole_stripes(0, 0));
        let object = bytes(3, l.object_bytes() as usize);
        let shards = l.split(&codec, &object).unwrap();
        let (off, len) = (16384u32, 32768u32);
        assert_eq!(l.parity_range(off, len).unwrap(), (4096, 8192));
        let new = &object[off as usize..(off + len) as usize];
        let parity = l
            .parity_delta(&codec, off, &vec![0; len as usize], new)
            .unwrap();
        for (j, p) in parity.iter().enumerate() {
            assert_eq!(&p[..], &shards[4 + j][4096..4096 + 8192], "parity {j}");
        }
    }

    /// Units go round the data shards; a shard's units are consecutive
    /// stripes.
    #[test]
    fn units_go_round_the_data_shards() {
        let l = Layout::new(4, 2, 32 << 10).unwrap();
        assert_eq!(l.object_bytes(), 128 << 10);
        assert_eq!(l.locate(0), (0, 0));
        assert_eq!(l.locate(4096 + 7), (1, 7));
        assert_eq!(l.locate(4 * 4096), (0, 4096));
        assert_eq!(l.locate(7 * 4096 + 100), (3, 4096 + 100));
        for at in (0..l.object_bytes()).step_by(509) {
            let (s, o) = l.locate(at);
            assert_eq!(l.object_offset(s, o), at);
        }
        // Units 3..=10: shard 3 gets units 3 and 7 (stripes 0 and 1), shard
        // 0 units 4 and 8 (stripes 1 and 2): contiguous on each shard.
        let r = l.data_ranges(3 * 4096, 8 * 4096).unwrap();
        assert_eq!(
            r,
            vec![
                ShardRange {
                    shard: 0,
                    offset: 4096,
                    len: 8192
                },
                ShardRange {
                    shard: 1,
                    offset: 4096,
                    len: 8192
                },
                ShardRange {
                    shard: 2,
                    offset: 4096,
                    len: 8192
                },
                ShardRange {
                    shard: 3,
                    offset: 0,
                    len: 8192
                },
            ]
        );
        assert_eq!(l.parity_range(3 * 4096, 8 * 4096).unwrap(), (0, 3 * 4096));
        assert_eq!(
            l.parity_range(5 * 4096 + 512, 1024).unwrap(),
            (4096 + 512, 1024)
        );
        assert!(l.pieces(l.object_bytes() - 1, 2).is_err());
        // A buffer shorter than its range, or a piece no buffer holds.
        let r = ShardRange {
            shard: 1,
            offset: 0,
            len: 4096,
        };
        let mut out = [0u8; 4096];
        assert!(l.gather(4096, &[(r, &[0u8; 100][..])], &mut out).is_err());
        assert!(l.gather(0, &[(r, &[0u8; 4096][..])], &mut out).is_err());
        l.gather(4096, &[(r, &[7u8; 4096][..])], &mut out).unwrap();
        assert_eq!(out, [7u8; 4096]);
        assert!(l.pieces(0, 0).is_err());
        assert!(Layout::new(1, 2, 4096).is_err());
        assert!(Layout::new(4, 5, 4096).is_err());
        assert!(Layout::new(4, 2, 1000).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        /// Scatter and gather are inverse; each data shard gets one
        /// contiguous range; parity deltas added to the old parity give
        /// the new object's parity; and any range of any `m` lost shards
        /// is rebuilt from the same range of `k` others.
        #[test]
        fn a_partial_write_updates_parity_by_delta(
            k in 2usize..=16, m in 1usize..=4, units in 1u32..=8,
            start in any::<u32>(), len in 1u32..40_000, seed in any::<u64>(), lost in any::<u64>(),
        ) {
            let l = Layout::new(k, m, units * UNIT).unwrap();
            let ob = l.object_bytes();
            let offset = start % ob;
            let len = len.min(ob - offset);
            // Both engines (ISA-L where installed): pieces of odd sizes at
            // odd offsets go through each one's update.
            let codec = match seed % 2 {
                0 => Codec::new(k, m).unwrap(),
                _ => Codec::with_engine(k, m, Engine::Rust).unwrap(),
            };
            let old = bytes(seed, ob as usize);
            let data = bytes(seed ^ 0x55, len as usize);
            let mut new = old.clone();
            new[offset as usize..(offset + len) as usize].copy_from_slice(&data);

            let parts = l.scatter(offset, &data).unwrap();
            let mut back = vec![0u8; len as usize];
            let refs: Vec<(ShardRange, &[u8])> = parts.iter().map(|(r, b)| (*r, &b[..])).collect();
            l.gather(offset, &refs, &mut back).unwrap();
            prop_assert_eq!(&back, &data);
            let mut touched: Vec<usize> = parts.iter().map(|(r, _)| r.shard).collect();
            touched.dedup();
            prop_assert_eq!(touched.len(), parts.len(), "one range per shard");

            let before = l.split(&codec, &old).unwrap();
            let after = l.split(&codec, &new).unwrap();
            // The data shards change exactly where the write's ranges are.
            for (r, b) in &parts {
                prop_assert_eq!(&after[r.shard][r.offset as usize..r.end() as usize], &b[..]);
            }
            let (p0, plen) = l.parity_range(offset, len).unwrap();
            let delta = l.parity_delta(&codec, offset, &old[offset as usize..(offset + len) as usize], &data).unwrap();
            for i in 0..m {
                let mut p = before[k + i].clone();
                for (x, d) in p[p0 as usize..(p0 + plen) as usize].iter_mut().zip(&delta[i]) {
                    *x ^= d;
                }
                prop_assert_eq!(&p, &after[k + i], "parity {} after the delta", i);
            }

            // Rebuild the ranges read from up to m lost shards.
            let gone: Vec<usize> = (0..k + m).filter(|s| lost >> (s % 64) & 1 == 1).take(m).collect();
            for (r, _) in &parts {
                let (a, b) = (r.offset as usize, r.end() as usize);
                let chunks: Vec<Option<&[u8]>> = (0..k + m)
                    .map(|s| (!gone.contains(&s)).then(|| &after[s][a..b]))
                    .collect();
                let mut out = vec![0u8; b - a];
                codec.reconstruct(&chunks, &[r.shard], &mut [&mut out[..]]).unwrap();
                prop_assert_eq!(&out[..], &after[r.shard][a..b]);
            }
        }
    }
}
