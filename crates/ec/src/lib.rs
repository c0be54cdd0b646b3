//! Reed–Solomon erasure coding for EC pools: `k` data chunks and `m`
//! parity chunks per stripe, any `k` of the `k + m` enough to rebuild the
//! rest.
//!
//! The code is systematic and its coding matrix is ISA-L's Cauchy matrix
//! (`gf_gen_cauchy1_matrix`: identity over `k` rows, then row `i`, column
//! `j` = 1 / (i ⊕ j)) over GF(2^8) with the polynomial 0x11d: both are
//! part of the on-disk format (a parity chunk on disk is these products),
//! fixed for good. Every `k + m` with 2 ≤ k ≤ 16 and 1 ≤ m ≤ 4 is
//! supported; any `k` rows of a Cauchy matrix are independent, so every
//! pattern of up to `m` lost chunks can be rebuilt.
//!
//! Two engines compute the same bytes: ISA-L, loaded at run time when
//! `libisal.so.2` is installed (SIMD: several GB/s per core), and a
//! pure-Rust one (a 256-entry product table per coefficient), chosen —
//! and logged — only where ISA-L is missing. Golden vectors and property
//! tests hold both to the same bytes.
//!
//! `layout` says where an object's bytes go among its shards (4 KiB units
//! round the data shards), which ranges a read or write touches, and the
//! parity delta of a partial write.

mod gf;
mod isal;
pub mod layout;

pub use layout::{Layout, Piece, ShardRange, UNIT};

use std::sync::atomic::{AtomicBool, Ordering};

pub const K_MIN: usize = 2;
pub const K_MAX: usize = 16;
pub const M_MIN: usize = 1;
pub const M_MAX: usize = 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EcError {
    #[error("erasure code {k}+{m}: k must be {K_MIN}..={K_MAX} and m {M_MIN}..={M_MAX}")]
    Scheme { k: usize, m: usize },
    #[error("ISA-L (libisal.so.2, Debian's libisal2) is not installed")]
    NoIsal,
    #[error("{0}")]
    Shape(String),
    #[error("this ISA-L's Cauchy matrix for {k}+{m} is not the one chunks are written with")]
    Matrix { k: usize, m: usize },
    #[error("{have} chunks left of a {k}+{m} stripe: at least {k} are needed")]
    TooFew { have: usize, k: usize, m: usize },
}

/// Which engine computes the products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Isal,
    Rust,
}

/// A `k + m` code.
pub struct Codec {
    k: usize,
    m: usize,
    /// `(k + m) × k`, row-major: the identity, then the parity rows.
    matrix: Vec<u8>,
    engine: Engine,
    /// ISA-L's tables for the parity rows (with [`Engine::Isal`]).
    parity_tables: Vec<u8>,
}

/// ISA-L's Cauchy matrix for `k + m`, computed here.
fn cauchy1(k: usize, m: usize) -> Vec<u8> {
    let mut a = vec![0u8; (k + m) * k];
    for i in 0..k {
        a[i * k + i] = 1;
    }
    for i in k..k + m {
        for j in 0..k {
            a[i * k + j] = gf::inv((i ^ j) as u8);
        }
    }
    a
}

impl Codec {
    /// The `k + m` code with the fastest engine this machine has.
    pub fn new(k: usize, m: usize) -> Result<Codec, EcError> {
        let engine = if isal::get().is_some() {
            Engine::Isal
        } else {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "ISA-L (libisal.so.2) not found: erasure coding runs on the pure-Rust code, \
                     several times slower (Debian: apt-get install libisal2)"
                );
            }
            Engine::Rust
        };
        Codec::with_engine(k, m, engine)
    }

    /// The `k + m` code on `engine` (`NoIsal` if ISA-L is asked for and
    /// missing).
    pub fn with_engine(k: usize, m: usize, engine: Engine) -> Result<Codec, EcError> {
        if !(K_MIN..=K_MAX).contains(&k) || !(M_MIN..=M_MAX).contains(&m) {
            return Err(EcError::Scheme { k, m });
        }
        let matrix = cauchy1(k, m);
        let parity_tables = match engine {
            Engine::Isal => {
                let lib = isal::get().ok_or(EcError::NoIsal)?;
                // The matrix is the on-disk format: a library that made
                // another would write chunks nothing else could read.
                if lib.cauchy1(k, m) != matrix {
                    return Err(EcError::Matrix { k, m });
                }
                lib.tables(k, &matrix[k * k..])
            }
            Engine::Rust => Vec::new(),
        };
        Ok(Codec {
            k,
            m,
            matrix,
            engine,
            parity_tables,
        })
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn m(&self) -> usize {
        self.m
    }

    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The coding matrix, `(k + m) × k` row-major.
    pub fn matrix(&self) -> &[u8] {
        &self.matrix
    }

    /// Computes the `m` parity chunks of the `k` data chunks (all of one
    /// length).
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), EcError> {
        let len = self.check(data, parity.len(), self.m, parity.iter().map(|p| p.len()))?;
        match self.engine {
            Engine::Isal => {
                isal::get()
                    .expect("ISA-L was loaded")
                    .apply(len, &self.parity_tables, data, parity)
            }
            Engine::Rust => apply_rust(self.k, &self.matrix[self.k * self.k..], data, parity),
        }
        Ok(())
    }

    /// Brings the parity chunks up to date after data chunk `index`
    /// changed: `delta` is the old bytes XOR the new ones (of the range
    /// the parity slices cover).
    pub fn update(
        &self,
        index: usize,
        delta: &[u8],
        parity: &mut [&mut [u8]],
    ) -> Result<(), EcError> {
        if index >= self.k {
            return Err(EcError::Shape(format!("data chunk {index} of {}", self.k)));
        }
        if parity.len() != self.m || parity.iter().any(|p| p.len() != delta.len()) {
            return Err(EcError::Shape(format!(
                "{} parity chunks for {} (each as long as the delta, {} bytes)",
                parity.len(),
                self.m,
                delta.len()
            )));
        }
        check_len(delta.len())?;
        match self.engine {
            Engine::Isal => isal::get().expect("ISA-L was loaded").update(
                self.k,
                index,
                &self.parity_tables,
                delta,
                parity,
            ),
            Engine::Rust => {
                for (r, p) in parity.iter_mut().enumerate() {
                    let t = gf::mul_table(self.matrix[(self.k + r) * self.k + index]);
                    for (b, &d) in p.iter_mut().zip(delta) {
                        *b ^= t[d as usize];
                    }
                }
            }
        }
        Ok(())
    }

    /// Rebuilds chunks `want` (indices into the stripe: `0..k` data,
    /// `k..k+m` parity) into `out` from the chunks present (`chunks[i]`,
    /// `None` where lost; at least `k` present, all of one length).
    pub fn reconstruct(
        &self,
        chunks: &[Option<&[u8]>],
        want: &[usize],
        out: &mut [&mut [u8]],
    ) -> Result<(), EcError> {
        let (k, n) = (self.k, self.k + self.m);
        if chunks.len() != n || want.len() != out.len() || want.iter().any(|&w| w >= n) {
            return Err(EcError::Shape(format!(
                "{} chunks of a {k}+{} stripe, {} wanted into {} buffers",
                chunks.len(),
                self.m,
                want.len(),
                out.len()
            )));
        }
        let present: Vec<usize> = (0..n).filter(|&i| chunks[i].is_some()).take(k).collect();
        if present.len() < k {
            return Err(EcError::TooFew {
                have: present.len(),
                k,
                m: self.m,
            });
        }
        let src: Vec<&[u8]> = present
            .iter()
            .map(|&i| chunks[i].expect("present"))
            .collect();
        self.check(&src, out.len(), want.len(), out.iter().map(|o| o.len()))?;
        // The rows of the present chunks, inverted, map them to the data.
        let sub: Vec<u8> = (present.iter())
            .flat_map(|&i| self.matrix[i * k..(i + 1) * k].iter().copied())
            .collect();
        let decode = gf::invert(&sub, k).expect("any k rows of a Cauchy code are independent");
        // A wanted chunk's row in terms of the present ones: its row of
        // the coding matrix times the inverse.
        let mut rows = vec![0u8; want.len() * k];
        for (w, &idx) in want.iter().enumerate() {
            for c in 0..k {
                let mut v = 0u8;
                for j in 0..k {
                    v ^= gf::mul(self.matrix[idx * k + j], decode[j * k + c]);
                }
                rows[w * k + c] = v;
            }
        }
        match self.engine {
            Engine::Isal => {
                let lib = isal::get().expect("ISA-L was loaded");
                let len = src[0].len();
                lib.apply(len, &lib.tables(k, &rows), &src, out);
            }
            Engine::Rust => apply_rust(k, &rows, &src, out),
        }
        Ok(())
    }

    /// Checks `k` sources of one length and `n` (= `want`) destinations
    /// of that length; the length.
    fn check(
        &self,
        src: &[&[u8]],
        n: usize,
        want: usize,
        dst_lens: impl Iterator<Item = usize>,
    ) -> Result<usize, EcError> {
        let len = src.first().map_or(0, |s| s.len());
        if src.len() != self.k || n != want || src.iter().any(|s| s.len() != len) {
            return Err(EcError::Shape(format!(
                "{} sources for k = {}, {n} destinations for {want}, lengths {:?}",
                src.len(),
                self.k,
                src.iter().map(|s| s.len()).collect::<Vec<_>>()
            )));
        }
        if let Some(l) = dst_lens.into_iter().find(|&l| l != len) {
            return Err(EcError::Shape(format!(
                "a destination of {l} bytes for sources of {len}"
            )));
        }
        check_len(len)?;
        Ok(len)
    }
}

/// The longest chunk: ISA-L takes lengths as C `int` (a longer one would
/// wrap and leave parity unwritten).
pub const CHUNK_BYTES_MAX: usize = i32::MAX as usize;

fn check_len(len: usize) -> Result<(), EcError> {
    if len > CHUNK_BYTES_MAX {
        return Err(EcError::Shape(format!(
            "chunks of {len} bytes: at most {CHUNK_BYTES_MAX}"
        )));
    }
    Ok(())
}

/// `dst[i] = Σ_j rows[i][j] · src[j]`, a product table per coefficient.
fn apply_rust(k: usize, rows: &[u8], src: &[&[u8]], dst: &mut [&mut [u8]]) {
    for (i, d) in dst.iter_mut().enumerate() {
        d.fill(0);
        for (j, s) in src.iter().enumerate() {
            let c = rows[i * k + j];
            match c {
                0 => {}
                1 => d.iter_mut().zip(s.iter()).for_each(|(b, &x)| *b ^= x),
                _ => {
                    let t = gf::mul_table(c);
                    d.iter_mut()
                        .zip(s.iter())
                        .for_each(|(b, &x)| *b ^= t[x as usize]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
