//! Single-thread synchronisation: a one-shot channel and a notifier.
//!
//! Both live on one runtime thread (`Rc`, no locks); they are how the group
//! commit hands a result to each waiting writer and how background tasks are
//! woken.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    closed: bool,
}

pub struct Sender<T>(Rc<RefCell<Slot<T>>>);
pub struct Receiver<T>(Rc<RefCell<Slot<T>>>);

/// A channel for exactly one value. The receiver gets `None` if the sender
/// is dropped without sending.
pub fn oneshot<T>() -> (Sender<T>, Receiver<T>) {
    let s = Rc::new(RefCell::new(Slot {
        value: None,
        waker: None,
        closed: false,
    }));
    (Sender(s.clone()), Receiver(s))
}

impl<T> Sender<T> {
    pub fn send(self, v: T) {
        let mut s = self.0.borrow_mut();
        s.value = Some(v);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = self.0.borrow_mut();
        s.closed = true;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Option<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = self.0.borrow_mut();
        if let Some(v) = s.value.take() {
            return Poll::Ready(Some(v));
        }
        if s.closed {
            return Poll::Ready(None);
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[derive(Default)]
struct NotifyState {
    permit: bool,
    waiters: Vec<Waker>,
    generation: u64,
}

/// Wakes tasks waiting for "something changed". A `notify` with nobody
/// waiting leaves one permit, so a wake-up is never lost between a check and
/// the wait that follows it.
#[derive(Clone, Default)]
pub struct Notify(Rc<RefCell<NotifyState>>);

impl Notify {
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes every waiter (or leaves a permit for the next one).
    pub fn notify(&self) {
        let waiters = {
            let mut s = self.0.borrow_mut();
            s.generation += 1;
            if s.waiters.is_empty() {
                s.permit = true;
            }
            std::mem::take(&mut s.waiters)
        };
        for w in waiters {
            w.wake();
        }
    }

    /// Waits for the next `notify` (or consumes a pending permit).
    pub async fn wait(&self) {
        let start = {
            let mut s = self.0.borrow_mut();
            if s.permit {
                s.permit = false;
                return;
            }
            s.generation
        };
        std::future::poll_fn(|cx| {
            let mut s = self.0.borrow_mut();
            if s.generation != start {
                Poll::Ready(())
            } else {
                s.waiters.push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// A flag set once (a stop), that tasks wait for or race their work
/// against. A waiter that goes away takes its waker with it (a gateway
/// races every request's wait against its stop latch).
#[derive(Clone, Default)]
pub struct Latch(Rc<LatchState>);

#[derive(Default)]
struct LatchState {
    set: Cell<bool>,
    next: Cell<u64>,
    waiters: RefCell<std::collections::BTreeMap<u64, Waker>>,
}

impl Latch {
    pub fn set(&self) {
        self.0.set.set(true);
        let waiters = std::mem::take(&mut *self.0.waiters.borrow_mut());
        for w in waiters.into_values() {
            w.wake();
        }
    }

    pub fn is_set(&self) -> bool {
        self.0.set.get()
    }

    /// Returns once the latch is set.
    pub fn wait(&self) -> LatchWait<'_> {
        LatchWait {
            latch: self,
            key: None,
        }
    }

    /// Runs `f` until it ends (`Some`) or the latch is set (`None`; `f`
    /// is dropped).
    pub async fn until<F: Future>(&self, f: F) -> Option<F::Output> {
        let mut f = std::pin::pin!(f);
        let mut set = self.wait();
        std::future::poll_fn(|cx| {
            if let Poll::Ready(v) = f.as_mut().poll(cx) {
                return Poll::Ready(Some(v));
            }
            Pin::new(&mut set).poll(cx).map(|()| None)
        })
        .await
    }
}

/// [`Latch::wait`]: its waker is registered while it waits and removed
/// when it ends or is dropped.
pub struct LatchWait<'a> {
    latch: &'a Latch,
    key: Option<u64>,
}

impl Future for LatchWait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let s = &self.latch.0;
        if s.set.get() {
            return Poll::Ready(());
        }
        let key = *self.key.get_or_insert_with(|| {
            let k = s.next.get();
            s.next.set(k + 1);
            k
        });
        let mut w = s.waiters.borrow_mut();
        match w.get_mut(&key) {
            Some(old) if old.will_wake(cx.waker()) => {}
            _ => {
                w.insert(key, cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

impl Drop for LatchWait<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key {
            self.latch.0.waiters.borrow_mut().remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::{block_on, spawn, yield_now};

    #[test]
    fn a_latch_ends_what_runs_until_it_and_wakes_every_waiter() {
        block_on(async {
            let l = Latch::default();
            let waiters: Vec<_> = (0..3)
                .map(|_| {
                    let l = l.clone();
                    spawn(async move { l.wait().await })
                })
                .collect();
            let l2 = l.clone();
            let cut = spawn(async move { l2.until(std::future::pending::<()>()).await });
            assert_eq!(l.until(async { 5 }).await, Some(5));
            yield_now().await;
            l.set();
            assert_eq!(cut.await, None);
            for w in waiters {
                w.await;
            }
            // Set before: at once.
            assert_eq!(l.until(std::future::pending::<()>()).await, None);
            // A waiter that goes away leaves no waker behind.
            let l = Latch::default();
            for _ in 0..100 {
                assert_eq!(l.until(yield_now()).await, Some(()));
            }
            assert!(l.0.waiters.borrow().is_empty());
        });
    }

    #[test]
    fn oneshot_delivers_or_closes() {
        block_on(async {
            let (tx, rx) = oneshot();
            spawn(async move { tx.send(5) });
            assert_eq!(rx.await, Some(5));
            let (tx, rx) = oneshot::<u8>();
            drop(tx);
            assert_eq!(rx.await, None);
        });
    }

    #[test]
    fn notify_keeps_a_permit() {
        block_on(async {
            let n = Notify::new();
            n.notify();
            n.wait().await; // consumes the permit, does not hang
            let n2 = n.clone();
            let h = spawn(async move { n2.wait().await });
            yield_now().await;
            n.notify();
            h.await;
        });
    }
}
