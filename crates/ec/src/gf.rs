//! GF(2^8) with the polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d) and
//! generator 2, as ISA-L computes it: part of the on-disk format (a
//! parity chunk is these products), so it never changes.

const POLY: u16 = 0x11d;

const fn exp_log() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    // exp[510], exp[511] stay 0: never indexed (log sums are at most 508).
    (exp, log)
}

const TABLES: ([u8; 512], [u8; 256]) = exp_log();
const EXP: [u8; 512] = TABLES.0;
const LOG: [u8; 256] = TABLES.1;

pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
}

/// The inverse of `a` (`a` ≠ 0).
pub fn inv(a: u8) -> u8 {
    assert_ne!(a, 0, "0 has no inverse");
    EXP[255 - LOG[a as usize] as usize]
}

/// The 256 products `c · x`, for multiplying a buffer by `c`.
pub fn mul_table(c: u8) -> [u8; 256] {
    let mut t = [0u8; 256];
    for (x, v) in t.iter_mut().enumerate() {
        *v = mul(c, x as u8);
    }
    t
}

/// The inverse of the `n`×`n` matrix `a` (row-major), if it has one
/// (Gauss–Jordan elimination).
pub fn invert(a: &[u8], n: usize) -> Option<Vec<u8>> {
    assert_eq!(a.len(), n * n);
    let mut m = a.to_vec();
    let mut out = vec![0u8; n * n];
    for i in 0..n {
        out[i * n + i] = 1;
    }
    for col in 0..n {
        let pivot = (col..n).find(|&r| m[r * n + col] != 0)?;
        if pivot != col {
            for c in 0..n {
                m.swap(pivot * n + c, col * n + c);
                out.swap(pivot * n + c, col * n + c);
            }
        }
        let p = inv(m[col * n + col]);
        for c in 0..n {
            m[col * n + c] = mul(m[col * n + c], p);
            out[col * n + c] = mul(out[col * n + c], p);
        }
        for r in (0..n).filter(|&r| r != col) {
            let f = m[r * n + col];
            if f == 0 {
                continue;
            }
            for c in 0..n {
                m[r * n + c] ^= mul(f, m[col * n + c]);
                out[r * n + c] ^= mul(f, out[col * n + c]);
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Multiplication the slow way: shift and add, reducing by the
    /// polynomial.
    fn mul_slow(mut a: u8, mut b: u8) -> u8 {
        let mut p = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                p ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= (POLY & 0xff) as u8;
            }
            b >>= 1;
        }
        p
    }

    #[test]
    fn the_tables_agree_with_the_definition() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_slow(a, b), "{a} · {b}");
            }
            if a != 0 {
                assert_eq!(mul(a, inv(a)), 1, "{a}");
            }
        }
    }

    #[test]
    fn inverting_twice_gives_the_matrix_back() {
        let a = [1u8, 2, 3, 4, 5, 6, 7, 8, 10];
        let b = invert(&a, 3).unwrap();
        assert_eq!(invert(&b, 3).unwrap(), a);
        assert!(invert(&[1, 1, 1, 1], 2).is_none());
    }
}
