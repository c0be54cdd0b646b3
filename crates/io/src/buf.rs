//! Aligned, pooled I/O buffers.
//!
//! O_DIRECT needs buffers aligned to the device's sector; io_uring needs them
//! to stay put until the kernel is done. An [`AlignedBuf`] is a heap block
//! aligned to 4 KiB that moves by ownership into an operation and back out.
//! Buffers of power-of-two capacity return to a per-thread pool when dropped,
//! so the data path does not hit the allocator once it is warm.
//!
//! Every byte of every buffer is initialised memory, so handing out `&[u8]`
//! over it is sound: a block fresh from the allocator is zeroed
//! (`alloc_zeroed`, which costs nothing for the large blocks the kernel
//! maps in zeroed), and a pooled one keeps its previous user's bytes. So a
//! buffer from [`AlignedBuf::new`] holds zeros or what a previous user of
//! this thread left in it (never bytes from another process);
//! [`AlignedBuf::zeroed`] clears it.

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every buffer: enough for any device's O_DIRECT.
pub const BUF_ALIGN: usize = 4096;
/// Largest capacity kept in the pool; bigger buffers go back to the allocator.
const POOL_CLASS_MAX_BYTES: usize = 8 << 20;
/// Free buffers kept per size class per thread.
const POOL_PER_CLASS_MAX: usize = 512;
const POOL_CLASSES: usize = 12; // 4 KiB << 0 ..= 4 KiB << 11 (8 MiB)

thread_local! {
    static POOL: RefCell<[Vec<NonNull<u8>>; POOL_CLASSES]> = RefCell::new(Default::default());
}

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: the buffer exclusively owns its heap block; nothing else aliases it.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

fn class_of(cap: usize) -> Option<usize> {
    if cap.is_power_of_two() && (BUF_ALIGN..=POOL_CLASS_MAX_BYTES).contains(&cap) {
        Some((cap / BUF_ALIGN).trailing_zeros() as usize)
    } else {
        None
    }
}

fn capacity_for(len: usize) -> usize {
    let cap = len.max(BUF_ALIGN).div_ceil(BUF_ALIGN) * BUF_ALIGN;
    if cap <= POOL_CLASS_MAX_BYTES {
        cap.next_power_of_two()
    } else {
        cap
    }
}

impl AlignedBuf {
    /// A buffer of `len` bytes with unspecified content.
    pub fn new(len: usize) -> Self {
        let cap = capacity_for(len);
        if let Some(class) = class_of(cap) {
            if let Some(ptr) = POOL.with(|p| p.borrow_mut()[class].pop()) {
                return AlignedBuf { ptr, len, cap };
            }
        }
        let layout = Layout::from_size_align(cap, BUF_ALIGN).expect("buffer layout");
        // SAFETY: layout has a non-zero size. Zeroed, because `Deref` hands
        // out the bytes as `&[u8]`, which must never cover uninitialised
        // memory.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, cap }
    }

    /// A buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        let mut b = Self::new(len);
        b.fill(0);
        b
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::new(data.len());
        b.copy_from_slice(data);
        b
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Changes the visible length; new bytes (if any) are unspecified.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "set_len {len} beyond capacity {}",
            self.cap
        );
        self.len = len;
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(class) = class_of(self.cap) {
            let ptr = self.ptr;
            let kept = POOL
                .try_with(|p| {
                    let mut p = p.borrow_mut();
                    if p[class].len() < POOL_PER_CLASS_MAX {
                        p[class].push(ptr);
                        true
                    } else {
                        false
                    }
                })
                .unwrap_or(false);
            if kept {
                return;
            }
        }
        let layout = Layout::from_size_align(self.cap, BUF_ALIGN).expect("buffer layout");
        // SAFETY: allocated in `new` with this exact layout and not pooled.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len bytes, and all of them are
        // initialised: zeroed at allocation, written only through `&mut`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} of {})", self.len, self.cap)
    }
}

/// A range of a buffer several holders share: one payload sent to several
/// peers (a primary's replication), or split into pieces sent apart (a
/// client's write across objects), without a copy per send or piece.
/// While it is shared nobody can write it (`Rc` gives no `&mut`), so every
/// holder reads the bytes it was given; the last holder of all of it may
/// take the buffer back ([`SharedBuf::into_owned`]).
#[derive(Clone)]
pub struct SharedBuf {
    buf: std::rc::Rc<AlignedBuf>,
    start: usize,
    end: usize,
}

impl SharedBuf {
    /// All of `buf`, shared from now on.
    pub fn new(buf: AlignedBuf) -> Self {
        let end = buf.len();
        SharedBuf {
            buf: std::rc::Rc::new(buf),
            start: 0,
            end,
        }
    }

    /// The bytes `range` of this one (relative to its start), sharing
    /// the same buffer.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Self {
        assert!(
            range.start <= range.end && range.end <= self.end - self.start,
            "slice {range:?} outside a shared buffer of {} bytes",
            self.end - self.start
        );
        SharedBuf {
            buf: self.buf.clone(),
            start: self.start + range.start,
            end: self.start + range.end,
        }
    }

    /// The bytes as a buffer of their own: the buffer itself when nobody
    /// else holds it and the range is all of it, else a copy.
    pub fn into_owned(self) -> AlignedBuf {
        if self.start == 0 && self.end == self.buf.len() {
            match std::rc::Rc::try_unwrap(self.buf) {
                Ok(b) => return b,
                Err(rc) => return AlignedBuf::from_slice(&rc),
            }
        }
        AlignedBuf::from_slice(&self)
    }
}

impl Deref for SharedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }
}

/// A buffer handed to a send: owned, or a range of one shared with other
/// holders ([`SharedBuf`]).
pub enum SendBuf {
    Owned(AlignedBuf),
    Shared(SharedBuf),
}

impl SendBuf {
    /// The bytes as a buffer of their own (see [`SharedBuf::into_owned`]).
    pub fn into_owned(self) -> AlignedBuf {
        match self {
            SendBuf::Owned(b) => b,
            SendBuf::Shared(b) => b.into_owned(),
        }
    }
}

impl Deref for SendBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            SendBuf::Owned(b) => b,
            SendBuf::Shared(b) => b,
        }
    }
}

impl From<AlignedBuf> for SendBuf {
    fn from(b: AlignedBuf) -> Self {
        SendBuf::Owned(b)
    }
}

impl From<SharedBuf> for SendBuf {
    fn from(b: SharedBuf) -> Self {
        SendBuf::Shared(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_pooled() {
        let a = AlignedBuf::zeroed(5000);
        assert_eq!(a.len(), 5000);
        assert_eq!(a.capacity(), 8192);
        assert_eq!(a.as_ptr() as usize % BUF_ALIGN, 0);
        assert!(a.iter().all(|&b| b == 0));
        let p = a.as_ptr();
        drop(a);
        let b = AlignedBuf::new(8000);
        assert_eq!(b.as_ptr(), p, "a dropped buffer is reused");
        let big = AlignedBuf::new(9 << 20);
        assert_eq!(big.as_ptr() as usize % BUF_ALIGN, 0);
    }

    /// A buffer fresh from the allocator is initialised (zeros), even where
    /// the allocator recycles memory a previous owner filled: `Deref` must
    /// never show uninitialised bytes. Runs on its own thread so that the
    /// pool is empty.
    #[test]
    fn fresh_buffers_are_initialised() {
        std::thread::spawn(|| {
            for _ in 0..64 {
                let layout = Layout::from_size_align(16384, BUF_ALIGN).unwrap();
                // SAFETY: non-zero size; freed right after with the same layout.
                unsafe {
                    let p = alloc::alloc(layout);
                    std::ptr::write_bytes(p, 0xa5, 16384);
                    // Keep the stores: a write right before a free is dead.
                    std::hint::black_box(std::slice::from_raw_parts(p, 16384));
                    alloc::dealloc(p, layout);
                }
                let b = AlignedBuf::new(16384);
                assert!(
                    b.iter().all(|&x| x == 0),
                    "a fresh buffer shows stale bytes"
                );
                // Keep it out of the pool so the next round allocates again.
                std::mem::forget(b);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn shared_buffers_slice_without_copying_and_give_back_their_buffer() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let b = AlignedBuf::from_slice(&bytes);
        let at = b.as_ptr();
        let s = SharedBuf::new(b);
        let part = s.slice(1000..3000);
        assert_eq!(&part[..], &bytes[1000..3000]);
        let inner = part.slice(500..600);
        assert_eq!(&inner[..], &bytes[1500..1600]);
        // Parts read the same memory: nothing was copied.
        assert_eq!(part.as_ptr(), at.wrapping_add(1000));
        // Held elsewhere, or a part: a copy of its own.
        let copy = part.into_owned();
        assert_eq!(&copy[..], &bytes[1000..3000]);
        assert_ne!(copy.as_ptr(), at.wrapping_add(1000));
        let held = s.clone();
        assert_eq!(&held.clone().into_owned()[..], &bytes[..]);
        drop(inner);
        drop(held);
        // The last holder of all of it gets the buffer itself back.
        let back = s.into_owned();
        assert_eq!(back.as_ptr(), at);
        assert_eq!(&back[..], &bytes[..]);
    }

    #[test]
    #[should_panic(expected = "outside a shared buffer")]
    fn a_slice_past_the_end_of_a_shared_buffer_is_refused() {
        let s = SharedBuf::new(AlignedBuf::zeroed(100));
        let _ = s.slice(50..101);
    }
}
