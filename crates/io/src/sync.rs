//! Single-thread synchronisation: a one-shot channel and a notifier.
//!
//! Both live on one runtime thread (`Rc`, no locks); they are how the group
//! commit hands a result to each waiting writer and how background tasks are
//! woken.

use std::cell::RefCell;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::{block_on, spawn, yield_now};

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
