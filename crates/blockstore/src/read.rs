//! The read path. PERF-CRITICAL.
//!
//! A read finds the object's block and the journal overlays newer than it,
//! reads each piece from where it lives, and verifies every byte it returns
//! against its crc32c (the 4 KiB chunks of the block, the chunks of each
//! overlay's journal data). A read whose data was moved by maintenance while
//! it ran (the epoch changed) is retried (`Busy` if it kept moving); a
//! mismatch with no such move is `Corrupt` — wrong bytes are never
//! returned.

use nacre_io::{AlignedBuf, BlockDev};
use nacre_types::{ObjectId, CSUM_CHUNK_BYTES, SECTOR_BYTES};

use crate::error::{Error, Result};
use crate::format::{page_crc, PAGE_BYTES, PAGE_NEVER_WRITTEN};
use crate::index::Overlay;
use crate::state::{Inner, READ_RETRY_MAX};

const CHUNK: u32 = CSUM_CHUNK_BYTES;

fn chunk_floor(v: u32) -> u32 {
    v / CHUNK * CHUNK
}

fn chunk_ceil(v: u32) -> u32 {
    v.div_ceil(CHUNK) * CHUNK
}

impl<D: BlockDev + 'static> Inner<D> {
    pub(crate) async fn read(&self, oid: ObjectId, offset: u32, len: u32) -> Result<AlignedBuf> {
        self.check_range(offset, len)?;
        for _ in 0..READ_RETRY_MAX {
            let epoch = self.epoch.get();
            let plan = {
                let st = self.st.borrow();
                let block = st.index.block_of(&oid).ok_or(Error::NotFound(oid))?;
                if st.ckpt.folds.get(&block).is_some_and(|c| c.writing) {
                    None
                } else {
                    let end = offset + len;
                    let ovs: Vec<Overlay> = st
                        .index
                        .pending
                        .get(&oid)
                        .map(|p| {
                            p.overlays
                                .iter()
                                .filter(|o| o.offset < end && offset < o.offset + o.len)
                                .cloned()
                                .collect()
                        })
                        .unwrap_or_default();
                    Some((block, ovs))
                }
            };
            let Some((block, ovs)) = plan else {
                self.flush_done.wait().await;
                continue;
            };
            let r = self.read_pieces(block, &ovs, offset, len).await;
            if self.epoch.get() == epoch {
                return r;
            }
            // What it read (or failed to: a checksum over moved data) says
            // nothing.
            self.st.borrow_mut().stats.read_retries += 1;
        }
        Err(Error::Busy(format!(
            "object {oid}: data kept moving under the read"
        )))
    }

    async fn read_pieces(
        &self,
        block: u32,
        ovs: &[Overlay],
        offset: u32,
        len: u32,
    ) -> Result<AlignedBuf> {
        let (a0, a1) = (chunk_floor(offset), chunk_ceil(offset + len));
        if ovs.is_empty() {
            let buf = self.read_block_range(block, a0, a1 - a0).await?;
            if a0 == offset && a1 - a0 == len {
                return Ok(buf);
            }
            let skip = (offset - a0) as usize;
            return Ok(AlignedBuf::from_slice(&buf[skip..skip + len as usize]));
        }
        // Which piece supplies each sector: the newest overlay covering it,
        // else the block.
        const BASE: usize = usize::MAX;
        let first = offset / SECTOR_BYTES;
        let mut src = vec![BASE; (len / SECTOR_BYTES) as usize];
        for (i, o) in ovs.iter().enumerate() {
            let s0 = (o.offset / SECTOR_BYTES).max(first);
            let s1 = ((o.offset + o.len) / SECTOR_BYTES).min(first + src.len() as u32);
            for s in s0..s1 {
                src[(s - first) as usize] = i;
            }
        }
        let mut out = AlignedBuf::new(len as usize);
        let sector = SECTOR_BYTES as usize;
        if src.contains(&BASE) {
            let buf = self.read_block_range(block, a0, a1 - a0).await?;
            let skip = (offset - a0) as usize;
            for (k, _) in src.iter().enumerate().filter(|(_, &s)| s == BASE) {
                out[k * sector..(k + 1) * sector]
                    .copy_from_slice(&buf[skip + k * sector..skip + (k + 1) * sector]);
            }
        }
        for (i, o) in ovs.iter().enumerate() {
            let Some(k0) = src.iter().position(|&s| s == i) else {
                continue;
            };
            let k1 = src.iter().rposition(|&s| s == i).expect("found above") + 1;
            // Byte range inside the overlay that this read needs.
            let need0 = offset + k0 as u32 * SECTOR_BYTES - o.offset;
            let need1 = offset + k1 as u32 * SECTOR_BYTES - o.offset;
            let (data, from) = self.read_overlay(o, need0, need1 - need0).await?;
            for k in k0..k1 {
                if src[k] == i {
                    let at = (offset + k as u32 * SECTOR_BYTES - o.offset - from) as usize;
                    out[k * sector..(k + 1) * sector].copy_from_slice(&data[at..at + sector]);
                }
            }
        }
        Ok(out)
    }

    /// Reads `[off, off + len)` of a block (chunk-aligned) and verifies it.
    pub(crate) async fn read_block_range(
        &self,
        block: u32,
        off: u32,
        len: u32,
    ) -> Result<AlignedBuf> {
        let pos = self.g.block_offset(block) + u64::from(off);
        let buf = self.dev.read_at(AlignedBuf::new(len as usize), pos).await?;
        let csums = self.block_csums(block).await?;
        for (i, chunk) in buf.chunks(CHUNK as usize).enumerate() {
            let c = (off / CHUNK) as usize + i;
            let crc = nacre_types::crc32c(chunk);
            if crc != csums[c] {
                tracing::debug!(
                    "block {block} chunk {c}: crc {crc:08x}, expected {:08x}; starts {:02x?}",
                    csums[c],
                    &chunk[..16]
                );
                return Err(Error::Corrupt(format!(
                    "data block {block}, bytes {}..{}",
                    c as u32 * CHUNK,
                    (c as u32 + 1) * CHUNK
                )));
            }
        }
        Ok(buf)
    }

    /// Reads the chunks of an overlay's journal data that cover
    /// `[need_off, need_off + need_len)` (relative to the overlay), verified.
    /// Returns the data and the overlay offset it starts at. Data the index
    /// still holds in memory (the overlay cache) is taken from there, and
    /// verified against the same write-time checksums as the journal's.
    pub(crate) async fn read_overlay(
        &self,
        o: &Overlay,
        need_off: u32,
        need_len: u32,
    ) -> Result<(AlignedBuf, u32)> {
        let from = chunk_floor(need_off);
        let to = chunk_ceil(need_off + need_len).min(o.len);
        let cached = (o.data.as_deref()).filter(|d| d.len() == o.len as usize);
        let buf = match cached {
            Some(d) => {
                self.st.borrow_mut().stats.overlay_cache_reads += 1;
                AlignedBuf::from_slice(&d[from as usize..to as usize])
            }
            None => {
                let align = self.dev.align_bytes().max(SECTOR_BYTES);
                let read_len = (to - from).div_ceil(align) * align;
                let jpos = o.data_pos + u64::from(from);
                let phys = self.g.journal_offset + jpos % self.g.journal_bytes;
                let mut buf = (self.dev)
                    .read_at(AlignedBuf::new(read_len as usize), phys)
                    .await?;
                buf.set_len((to - from) as usize);
                buf
            }
        };
        for (i, chunk) in buf.chunks(CHUNK as usize).enumerate() {
            let c = (from / CHUNK) as usize + i;
            if nacre_types::crc32c(chunk) != o.csums[c] {
                return Err(Error::Corrupt(format!(
                    "journal data at {}, overlay bytes {}..",
                    o.data_pos,
                    c as u32 * CHUNK
                )));
            }
        }
        Ok((buf, from))
    }

    /// The block's checksums, loading its checksum-table page if needed.
    pub(crate) async fn block_csums(&self, block: u32) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(self.g.csums_per_block() as usize);
        loop {
            if self.st.borrow().csum.get(&self.g, block, &mut out) {
                return Ok(out);
            }
            self.ensure_csum_page(self.g.csum_page_of(block).0).await?;
        }
    }

    /// Loads checksum-table page `page` into the cache unless it is there.
    pub(crate) async fn ensure_csum_page(&self, page: u32) -> Result<()> {
        loop {
            let meta = {
                let st = self.st.borrow();
                if st.csum.has_page(page) {
                    return Ok(());
                }
                st.csum.metas[page as usize]
            };
            self.load_csum_page(page, meta).await?;
        }
    }

    async fn load_csum_page(&self, page: u32, meta: crate::format::PageMeta) -> Result<()> {
        let bytes = if meta.crc.get() == PAGE_NEVER_WRITTEN {
            AlignedBuf::zeroed(PAGE_BYTES as usize)
        } else {
            let pos = self.g.csumtab_page_pos(page, meta.copy.get());
            let b = self
                .dev
                .read_at(AlignedBuf::new(PAGE_BYTES as usize), pos)
                .await?;
            if page_crc(&b) != meta.crc.get() {
                return Err(Error::Corrupt(format!("checksum-table page {page}")));
            }
            b
        };
        let mut st = self.st.borrow_mut();
        // A checkpoint that committed while we read may have moved the page;
        // then what we read is stale and the caller looks again.
        if st.csum.metas[page as usize] == meta {
            st.csum.insert_page(page, &bytes);
        }
        Ok(())
    }
}
