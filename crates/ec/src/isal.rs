//! ISA-L's erasure-code functions, loaded at run time (`dlopen` of
//! `libisal.so.2`, Debian's `libisal2`): no build-time or link-time
//! dependency, and a machine without it runs the pure-Rust code.

use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

type InitTables = unsafe extern "C" fn(c_int, c_int, *mut u8, *mut u8);
type EncodeData = unsafe extern "C" fn(c_int, c_int, c_int, *mut u8, *mut *mut u8, *mut *mut u8);
type EncodeUpdate =
    unsafe extern "C" fn(c_int, c_int, c_int, c_int, *mut u8, *mut u8, *mut *mut u8);
type GenCauchy = unsafe extern "C" fn(*mut u8, c_int, c_int);

/// The functions used, from the loaded library.
pub struct Isal {
    init_tables: InitTables,
    encode_data: EncodeData,
    encode_update: EncodeUpdate,
    gen_cauchy1: GenCauchy,
}

/// Names the library is looked for under: the ABI these signatures are
/// for (not an unversioned name, which a future ABI could take).
const LIBRARIES: [&CStr; 1] = [c"libisal.so.2"];

/// ISA-L if this machine has it (looked for once).
pub fn get() -> Option<&'static Isal> {
    static LIB: OnceLock<Option<Isal>> = OnceLock::new();
    LIB.get_or_init(load).as_ref()
}

fn load() -> Option<Isal> {
    // SAFETY: dlopen and dlsym with NUL-terminated names; the handle is
    // never closed, so the function pointers stay valid for the process.
    unsafe {
        let h = LIBRARIES
            .iter()
            .map(|n| libc::dlopen(n.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL))
            .find(|h| !h.is_null())?;
        let sym = |name: &CStr| -> Option<*mut c_void> {
            let p = libc::dlsym(h, name.as_ptr());
            (!p.is_null()).then_some(p)
        };
        Some(Isal {
            init_tables: std::mem::transmute::<*mut c_void, InitTables>(sym(c"ec_init_tables")?),
            encode_data: std::mem::transmute::<*mut c_void, EncodeData>(sym(c"ec_encode_data")?),
            encode_update: std::mem::transmute::<*mut c_void, EncodeUpdate>(sym(
                c"ec_encode_data_update",
            )?),
            gen_cauchy1: std::mem::transmute::<*mut c_void, GenCauchy>(sym(
                c"gf_gen_cauchy1_matrix",
            )?),
        })
    }
}

impl Isal {
    /// The expanded tables ISA-L multiplies with for `rows` (each `k`
    /// coefficients): 32 bytes per coefficient.
    pub fn tables(&self, k: usize, rows: &[u8]) -> Vec<u8> {
        let n = rows.len() / k;
        let mut t = vec![0u8; 32 * k * n];
        let mut r = rows.to_vec();
        // SAFETY: `r` holds n·k coefficients and `t` 32·k·n bytes, as the
        // function reads and writes.
        unsafe { (self.init_tables)(k as c_int, n as c_int, r.as_mut_ptr(), t.as_mut_ptr()) };
        t
    }

    /// `dst[i] = Σ_j rows[i][j] · src[j]` over `len` bytes, `tables` from
    /// [`Isal::tables`] for those rows.
    pub fn apply(&self, len: usize, tables: &[u8], src: &[&[u8]], dst: &mut [&mut [u8]]) {
        let (k, n) = (src.len(), dst.len());
        assert_eq!(tables.len(), 32 * k * n);
        assert!(src.iter().all(|s| s.len() >= len) && dst.iter().all(|d| d.len() >= len));
        let mut s: Vec<*mut u8> = src.iter().map(|s| s.as_ptr() as *mut u8).collect();
        let mut d: Vec<*mut u8> = dst.iter_mut().map(|d| d.as_mut_ptr()).collect();
        // SAFETY: k sources and n destinations of at least `len` bytes
        // each, tables for k·n coefficients (asserted above); ISA-L only
        // reads the sources.
        unsafe {
            (self.encode_data)(
                len as c_int,
                k as c_int,
                n as c_int,
                tables.as_ptr() as *mut u8,
                s.as_mut_ptr(),
                d.as_mut_ptr(),
            )
        };
    }

    /// `dst[i] ^= rows[i][index] · delta` over `len` bytes (`tables` for
    /// all `k` columns of the rows).
    pub fn update(
        &self,
        k: usize,
        index: usize,
        tables: &[u8],
        delta: &[u8],
        dst: &mut [&mut [u8]],
    ) {
        let (len, n) = (delta.len(), dst.len());
        assert_eq!(tables.len(), 32 * k * n);
        assert!(index < k && dst.iter().all(|d| d.len() >= len));
        let mut d: Vec<*mut u8> = dst.iter_mut().map(|d| d.as_mut_ptr()).collect();
        // SAFETY: as in `apply`, one source of `len` bytes.
        unsafe {
            (self.encode_update)(
                len as c_int,
                k as c_int,
                n as c_int,
                index as c_int,
                tables.as_ptr() as *mut u8,
                delta.as_ptr() as *mut u8,
                d.as_mut_ptr(),
            )
        };
    }

    /// ISA-L's own Cauchy matrix of `k + m` rows (to check ours against).
    pub fn cauchy1(&self, k: usize, m: usize) -> Vec<u8> {
        let mut a = vec![0u8; (k + m) * k];
        // SAFETY: (k+m)·k bytes, as the function writes.
        unsafe { (self.gen_cauchy1)(a.as_mut_ptr(), (k + m) as c_int, k as c_int) };
        a
    }
}
