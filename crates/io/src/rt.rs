//! The runtime facade: a single-threaded executor driving one io_uring.
//!
//! One thread owns its tasks, its ring and every buffer in flight (thread per
//! core, DESIGN.md §10). Tasks queue their submissions; the loop submits them
//! all with one `io_uring_enter` per turn, so 128 queued 4 KiB reads cost one
//! system call, and reaps completions without a system call when it can.
//!
//! Invariants:
//! - a buffer given to the kernel is owned by its op slot until the kernel's
//!   completion arrives, even if the future that asked for it was dropped
//!   (the slot becomes an orphan and frees the buffer on completion);
//! - [`block_on`] returns only after every op it started has completed, so no
//!   kernel write can land in freed memory.
//!
//! When io_uring cannot be set up (old kernel, seccomp, `NACRE_NO_URING=1`)
//! the runtime runs without a ring: tasks still work, timers sleep the
//! thread, and devices fall back to plain pread/pwrite (the log says so).
//!
//! **Polling before sleeping.** On a VM a thread asleep in `io_uring_enter`
//! is woken by an interrupt to a halted virtual CPU, some tens of µs; a QD1
//! operation through the gateway, the primary and its replicas is a chain
//! of such wake-ups. So a loop about to sleep first polls its ring for up
//! to [`Spin`]'s budget (`NACRE_SPIN_US`, default
//! [`SPIN_US_DEFAULT`]; 0 never polls), calling `sched_yield` every few µs
//! (offering the CPU to other runnable threads) — but only while its last
//! sleep was no longer than the budget (a daemon with nothing to do never
//! polls) and it was busy less than [`SPIN_LOAD_MAX`] of its last
//! [`SPIN_WINDOW`] (a loaded loop rarely sleeps long and would only burn
//! what its peers need), and never while an fsync is in flight (a kernel
//! worker thread runs it and needs a CPU: [`submit_on_worker`]). Polling
//! changes when a completion is seen, never which: it reads the ring's
//! completion queue and its task-run flag, which the kernel raises for
//! every completion it holds back.
//!
//! [`block_on_virtual`] runs the same code on **virtual time**: [`sleep`]
//! and [`monotonic`] read a clock that only moves when no task is ready and
//! no kernel op is in flight, and then jumps straight to the earliest timer.
//! Timers due at the same instant fire in the order they were set. A
//! simulation of many nodes and hours of timeouts runs as fast as its work,
//! and the same inputs give the same schedule.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use crate::buf::AlignedBuf;

/// Submission queue depth of the ring; more ops than this queue in batches.
const RING_ENTRIES: u32 = 1024;
const MAIN_TASK: usize = usize::MAX;
/// user_data of cancel requests, whose completions carry nothing to deliver.
const CANCEL_TAG: u64 = u64::MAX;

struct ReadyQueue(Mutex<Vec<usize>>);

struct TaskWaker {
    id: usize,
    queued: AtomicBool,
    ready: Arc<ReadyQueue>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.ready.0.lock().expect("ready queue").push(self.id);
        }
    }
}

struct Task {
    future: Option<Pin<Box<dyn Future<Output = ()>>>>,
    waker: Arc<TaskWaker>,
    /// Where it was spawned: named when the runtime finds a deadlock.
    spawned_at: &'static std::panic::Location<'static>,
}

/// What an op owns while the kernel uses it.
pub enum Resources {
    None,
    Buf(AlignedBuf),
    /// A write from a buffer others read too.
    Shared(crate::SharedBuf),
    Bufs(Vec<AlignedBuf>, Vec<libc::iovec>),
    /// A sendmsg: its buffers, their iovecs, and the header pointing at them.
    Msg(Vec<crate::SendBuf>, Vec<libc::iovec>, Box<libc::msghdr>),
    Time(Box<types::Timespec>),
}

enum OpState {
    Waiting(Option<Waker>),
    Done(i32),
    Orphaned,
}

struct OpSlot {
    state: OpState,
    res: Resources,
    /// Run by a kernel worker thread ([`submit_on_worker`]).
    on_worker: bool,
}

struct Reactor {
    ring: RefCell<IoUring>,
    ops: RefCell<Vec<Option<OpSlot>>>,
    free_ops: RefCell<Vec<usize>>,
    inflight: Cell<usize>,
    /// Ops in flight that a kernel worker thread runs.
    on_workers: Cell<usize>,
    spin: Spin,
}

/// The default budget of polling before sleeping (module docs).
pub const SPIN_US_DEFAULT: u64 = 100;
/// A loop busy more than this share of its last window does not poll.
pub const SPIN_LOAD_MAX: f64 = 0.25;
/// The longest polling budget.
pub const SPIN_BUDGET_MAX: Duration = Duration::from_millis(10);
/// The window over which a loop's load is measured.
pub const SPIN_WINDOW: Duration = Duration::from_millis(10);

/// When a loop polls its ring before sleeping, and for how long (module
/// docs).
struct Spin {
    /// At most this long; zero: never.
    budget: Cell<Duration>,
    /// The last wait, polled or slept: polling pays only if the next one
    /// is about as short.
    last_wait: Cell<Duration>,
    /// When the loop last stopped waiting.
    busy_since: Cell<std::time::Instant>,
    /// Time busy and waiting in the current window.
    window: Cell<(Duration, Duration)>,
    /// Whether the last full window's load was below `SPIN_LOAD_MAX`.
    light: Cell<bool>,
    /// Waits that polling ended, and waits that slept.
    polled: Cell<u64>,
    slept: Cell<u64>,
    /// Waits that would have polled but for an fsync in flight.
    gated: Cell<u64>,
}

impl Spin {
    fn new(budget: Duration) -> Spin {
        Spin {
            budget: Cell::new(budget),
            last_wait: Cell::new(Duration::MAX),
            busy_since: Cell::new(std::time::Instant::now()),
            window: Cell::new((Duration::ZERO, Duration::ZERO)),
            light: Cell::new(true),
            polled: Cell::new(0),
            slept: Cell::new(0),
            gated: Cell::new(0),
        }
    }

    /// The budget from `NACRE_SPIN_US`; what is wrong with it goes to
    /// the log.
    fn from_env() -> Spin {
        let v = std::env::var("NACRE_SPIN_US").ok();
        let (budget, why) = spin_budget_of(v.as_deref());
        if let Some(why) = why {
            tracing::warn!("{why}");
        }
        Spin::new(budget)
    }

    /// Whether a wait beginning now should poll first.
    fn wanted(&self) -> bool {
        let budget = self.budget.get();
        !budget.is_zero() && self.light.get() && self.last_wait.get() <= budget
    }

    /// Accounts a wait from `from` to `to`.
    fn waited(&self, from: std::time::Instant, to: std::time::Instant) {
        let busy = from.saturating_duration_since(self.busy_since.get());
        let wait = to.saturating_duration_since(from);
        self.last_wait.set(wait);
        self.busy_since.set(to);
        let (b, w) = self.window.get();
        let (b, w) = (b + busy, w + wait);
        if b + w >= SPIN_WINDOW {
            self.light
                .set(b.as_secs_f64() < SPIN_LOAD_MAX * (b + w).as_secs_f64());
            self.window.set((Duration::ZERO, Duration::ZERO));
        } else {
            self.window.set((b, w));
        }
    }
}

struct Core {
    tasks: RefCell<Vec<Option<Task>>>,
    free_tasks: RefCell<Vec<usize>>,
    ready: Arc<ReadyQueue>,
    reactor: Option<Reactor>,
    clock: Clock,
}

/// Where [`monotonic`] and [`sleep`] get their time.
enum Clock {
    Real(std::time::Instant),
    Virtual(VirtualClock),
}

#[derive(Default)]
struct VirtualClock {
    now: Cell<Duration>,
    /// (deadline, sequence) of every pending sleep, earliest first.
    timers: RefCell<std::collections::BinaryHeap<std::cmp::Reverse<(Duration, u64)>>>,
    wakers: RefCell<std::collections::HashMap<u64, Waker>>,
    next: Cell<u64>,
}

impl VirtualClock {
    /// Moves the clock to the earliest pending timer and wakes every sleep
    /// due then. False when no timer is pending.
    fn advance(&self) -> bool {
        let Some(std::cmp::Reverse((at, _))) = self.timers.borrow().peek().copied() else {
            return false;
        };
        self.now.set(self.now.get().max(at));
        loop {
            let due = {
                let mut t = self.timers.borrow_mut();
                match t.peek() {
                    Some(std::cmp::Reverse((d, _))) if *d <= self.now.get() => t.pop(),
                    _ => None,
                }
            };
            let Some(std::cmp::Reverse((_, seq))) = due else {
                return true;
            };
            let w = self.wakers.borrow_mut().remove(&seq);
            if let Some(w) = w {
                w.wake();
            }
        }
    }
}

thread_local! {
    static CORE: RefCell<Option<Rc<Core>>> = const { RefCell::new(None) };
}

fn core() -> Rc<Core> {
    CORE.with(|c| c.borrow().clone())
        .expect("nacre runtime: called outside block_on")
}

/// The polling budget `NACRE_SPIN_US` asks for (µs; unset: the default),
/// and, if it is not a number of µs or above [`SPIN_BUDGET_MAX`], why the
/// budget is another.
fn spin_budget_of(v: Option<&str>) -> (Duration, Option<String>) {
    let default = Duration::from_micros(SPIN_US_DEFAULT);
    let Some(v) = v else {
        return (default, None);
    };
    match v.trim().parse::<u64>() {
        Err(_) => (
            default,
            Some(format!(
                "NACRE_SPIN_US={v:?} is not a whole number of µs: polling {SPIN_US_DEFAULT} µs \
                 before sleeping (set it to 0 to never poll)"
            )),
        ),
        Ok(us) if Duration::from_micros(us) > SPIN_BUDGET_MAX => (
            SPIN_BUDGET_MAX,
            Some(format!(
                "NACRE_SPIN_US={us} is above the most, {} µs: polling that long",
                SPIN_BUDGET_MAX.as_micros()
            )),
        ),
        Ok(us) => (Duration::from_micros(us), None),
    }
}

/// Sets how long this thread's loop may poll its ring before sleeping
/// (module docs; zero: never; at most [`SPIN_BUDGET_MAX`]; virtual time
/// never polls). A measurement of a device, not of Nacre, turns it off:
/// polling changes how the kernel's threads that complete some I/O get a
/// CPU.
pub fn set_spin_budget(budget: Duration) {
    let core = core();
    if let (Some(r), Clock::Real(_)) = (&core.reactor, &core.clock) {
        r.spin.budget.set(budget.min(SPIN_BUDGET_MAX));
    }
}

/// True when this thread's runtime has an io_uring.
pub fn has_uring() -> bool {
    core().reactor.is_some()
}

/// The loop's reactor; `spin`: whether it may poll before sleeping (not on
/// virtual time, whose schedule must not depend on how fast the machine is).
fn new_reactor(spin: bool) -> Option<Reactor> {
    if std::env::var_os("NACRE_NO_URING").is_some_and(|v| v != "0") {
        tracing::warn!("io_uring disabled by NACRE_NO_URING: using blocking pread/pwrite");
        return None;
    }
    match new_ring() {
        Ok(ring) => Some(Reactor {
            ring: RefCell::new(ring),
            ops: RefCell::new(Vec::new()),
            free_ops: RefCell::new(Vec::new()),
            inflight: Cell::new(0),
            on_workers: Cell::new(0),
            spin: match spin {
                true => Spin::from_env(),
                false => Spin::new(Duration::ZERO),
            },
        }),
        Err(e) => {
            tracing::warn!("io_uring unavailable ({e}): falling back to blocking pread/pwrite");
            None
        }
    }
}

/// The ring, made so completions cost no interrupt: this thread is its
/// only submitter, and the kernel posts completions only when the loop
/// enters the ring to collect them (`DEFER_TASKRUN`, Linux 6.1), raising
/// a flag in the ring (`TASKRUN_FLAG`) so the loop knows when to. Without
/// these (an older kernel), a plain ring: the kernel then interrupts the
/// thread to post each completion.
fn new_ring() -> std::io::Result<IoUring> {
    let deferred = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .build(RING_ENTRIES);
    match deferred {
        Ok(ring) => Ok(ring),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => IoUring::new(RING_ENTRIES),
        Err(e) => Err(e),
    }
}

/// Runs `f` to completion on this thread, with every task it spawns.
///
/// Tasks still running when `f` finishes are dropped, and the call returns
/// once the kernel has finished every op they had in flight.
pub fn block_on<F: Future>(f: F) -> F::Output {
    start(f, Clock::Real(std::time::Instant::now()))
}

/// Like [`block_on`], on virtual time (see the module docs): for
/// simulations and tests of timeouts.
pub fn block_on_virtual<F: Future>(f: F) -> F::Output {
    start(f, Clock::Virtual(VirtualClock::default()))
}

fn start<F: Future>(f: F, clock: Clock) -> F::Output {
    let core = Rc::new(Core {
        tasks: RefCell::new(Vec::new()),
        free_tasks: RefCell::new(Vec::new()),
        ready: Arc::new(ReadyQueue(Mutex::new(Vec::new()))),
        reactor: new_reactor(matches!(clock, Clock::Real(_))),
        clock,
    });
    CORE.with(|c| {
        let mut c = c.borrow_mut();
        assert!(c.is_none(), "nacre runtime: block_on cannot nest");
        *c = Some(core.clone());
    });
    // Tears the runtime down on return and on unwind alike, so a panicking
    // task leaves no kernel op pointing at freed memory.
    struct Teardown(Rc<Core>);
    impl Drop for Teardown {
        fn drop(&mut self) {
            shutdown(&self.0);
            CORE.with(|c| c.borrow_mut().take());
        }
    }
    let _teardown = Teardown(core.clone());
    run(&core, f)
}

fn run<F: Future>(core: &Rc<Core>, f: F) -> F::Output {
    let mut f = pin!(f);
    let main_waker = Arc::new(TaskWaker {
        id: MAIN_TASK,
        queued: AtomicBool::new(true),
        ready: core.ready.clone(),
    });
    let waker = Waker::from(main_waker.clone());
    let mut cx = Context::from_waker(&waker);
    let mut batch = vec![MAIN_TASK];
    loop {
        for id in batch.drain(..) {
            if id == MAIN_TASK {
                main_waker.queued.store(false, Ordering::Release);
                if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                    return v;
                }
            } else {
                run_task(core, id);
            }
        }
        std::mem::swap(&mut batch, &mut core.ready.0.lock().expect("ready queue"));
        let mut idle = batch.is_empty();
        if let Clock::Virtual(vc) = &core.clock {
            // Time moves only when nothing else can: no task ready, no
            // kernel op in flight.
            let io = core.reactor.as_ref().is_some_and(|r| r.inflight.get() > 0);
            // A timer whose sleep was dropped wakes nobody: go on to the next.
            while idle && !io && vc.advance() {
                std::mem::swap(&mut batch, &mut core.ready.0.lock().expect("ready queue"));
                idle = batch.is_empty();
            }
        }
        match &core.reactor {
            Some(r) if r.inflight.get() > 0 || idle => {
                if idle && r.inflight.get() == 0 {
                    panic!(
                        "nacre runtime: deadlock, no task ready and no I/O in flight; {}",
                        waiting_tasks(core)
                    );
                }
                r.submit_and_reap(idle);
                if idle {
                    std::mem::swap(&mut batch, &mut core.ready.0.lock().expect("ready queue"));
                }
            }
            None if idle => panic!(
                "nacre runtime: deadlock, no task ready; {}",
                waiting_tasks(core)
            ),
            _ => {}
        }
    }
}

/// What a deadlock leaves waiting: the main future and, counted by where
/// they were spawned, the tasks.
fn waiting_tasks(core: &Rc<Core>) -> String {
    let mut at: std::collections::BTreeMap<String, usize> = Default::default();
    for t in core.tasks.borrow().iter().flatten() {
        *at.entry(t.spawned_at.to_string()).or_default() += 1;
    }
    let tasks: Vec<String> = at
        .into_iter()
        .map(|(l, n)| format!("{n} spawned at {l}"))
        .collect();
    format!("waiting: the main future and tasks [{}]", tasks.join(", "))
}

fn run_task(core: &Rc<Core>, id: usize) {
    let (mut fut, waker) = {
        let mut tasks = core.tasks.borrow_mut();
        let Some(Some(task)) = tasks.get_mut(id) else {
            return;
        };
        let Some(fut) = task.future.take() else {
            return;
        };
        task.waker.queued.store(false, Ordering::Release);
        (fut, task.waker.clone())
    };
    let w = Waker::from(waker);
    let mut cx = Context::from_waker(&w);
    let done = fut.as_mut().poll(&mut cx).is_ready();
    let mut tasks = core.tasks.borrow_mut();
    if done {
        tasks[id] = None;
        core.free_tasks.borrow_mut().push(id);
    } else if let Some(Some(task)) = tasks.get_mut(id) {
        task.future = Some(fut);
    }
}

fn shutdown(core: &Rc<Core>) {
    // Drop every task (outside the borrow: their destructors may touch the core).
    let tasks: Vec<_> = core.tasks.borrow_mut().drain(..).collect();
    drop(tasks);
    if let Some(r) = &core.reactor {
        // Ask the kernel to cancel what is still in flight (timers, mostly);
        // file I/O that cannot be cancelled simply completes.
        let ids: Vec<usize> = (r.ops.borrow().iter().enumerate())
            .filter_map(|(i, s)| s.as_ref().map(|_| i))
            .collect();
        for id in ids {
            let entry = opcode::AsyncCancel::new(id as u64)
                .build()
                .user_data(CANCEL_TAG);
            let mut ring = r.ring.borrow_mut();
            // SAFETY: a cancel request points at no memory.
            while unsafe { ring.submission().push(&entry) }.is_err() {
                ring.submit().expect("io_uring submit with a full queue");
            }
        }
        while r.inflight.get() > 0 {
            r.submit_and_reap(true);
        }
    }
}

struct JoinState<T> {
    value: Option<T>,
    waker: Option<Waker>,
}

/// A spawned future and where its result goes. The future is polled where
/// the task's box holds it: an `async` wrapper would move it from its
/// captures into its await slot on the first poll, a copy of all of it
/// (a few KiB for some) per task.
struct Joined<F: Future> {
    f: F,
    state: Rc<RefCell<JoinState<F::Output>>>,
}

impl<F: Future> Future for Joined<F> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // SAFETY: `f` is pinned with `self` (structural pinning): it is
        // never moved out, `Joined` has no `Drop` and is not `Unpin` unless
        // `F` is.
        let this = unsafe { self.get_unchecked_mut() };
        let f = unsafe { Pin::new_unchecked(&mut this.f) };
        let Poll::Ready(v) = f.poll(cx) else {
            return Poll::Pending;
        };
        let mut s = this.state.borrow_mut();
        s.value = Some(v);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        Poll::Ready(())
    }
}

/// Awaits a spawned task's result. Dropping it detaches the task.
pub struct JoinHandle<T>(Rc<RefCell<JoinState<T>>>);

impl<T> Future for JoinHandle<T> {
    type Output = T;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut s = self.0.borrow_mut();
        match s.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Awaits every task of `tasks` (each runs to its end, whatever the
/// others gave); their results, in order. To stop at an error without
/// leaving tasks running, collect the results into a `Result`.
pub async fn join_all<T>(tasks: Vec<JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}

/// Runs `f` as a task on this thread's runtime.
#[track_caller]
pub fn spawn<F: Future + 'static>(f: F) -> JoinHandle<F::Output> {
    let core = core();
    let state = Rc::new(RefCell::new(JoinState {
        value: None,
        waker: None,
    }));
    let wrapped = Joined {
        f,
        state: state.clone(),
    };
    let id = core.free_tasks.borrow_mut().pop();
    let mut tasks = core.tasks.borrow_mut();
    let id = id.unwrap_or_else(|| {
        tasks.push(None);
        tasks.len() - 1
    });
    let waker = Arc::new(TaskWaker {
        id,
        queued: AtomicBool::new(true),
        ready: core.ready.clone(),
    });
    tasks[id] = Some(Task {
        future: Some(Box::pin(wrapped)),
        waker,
        spawned_at: std::panic::Location::caller(),
    });
    core.ready.0.lock().expect("ready queue").push(id);
    JoinHandle(state)
}

/// Lets other ready tasks run before continuing.
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// Time since the runtime started: real (monotonic) under [`block_on`],
/// virtual under [`block_on_virtual`].
pub fn monotonic() -> Duration {
    match &core().clock {
        Clock::Real(t0) => t0.elapsed(),
        Clock::Virtual(vc) => vc.now.get(),
    }
}

/// True when [`sleep`] waits without blocking the thread (an io_uring
/// timer, or virtual time): timeouts can run beside other tasks.
pub fn has_timers() -> bool {
    let c = core();
    matches!(c.clock, Clock::Virtual(_)) || c.reactor.is_some()
}

/// A sleep on virtual time: registered on first poll, done once the
/// clock has passed its deadline.
async fn virtual_sleep(d: Duration) {
    let c = core();
    let Clock::Virtual(vc) = &c.clock else {
        unreachable!("virtual sleep on a real clock")
    };
    let deadline = vc.now.get() + d;
    if d.is_zero() {
        return;
    }
    let seq = vc.next.get();
    vc.next.set(seq + 1);
    vc.timers
        .borrow_mut()
        .push(std::cmp::Reverse((deadline, seq)));
    std::future::poll_fn(|cx| {
        if vc.now.get() >= deadline {
            Poll::Ready(())
        } else {
            vc.wakers.borrow_mut().insert(seq, cx.waker().clone());
            Poll::Pending
        }
    })
    .await
}

/// Sleeps for `d` (an io_uring timeout; a thread sleep without a ring;
/// virtual under [`block_on_virtual`]).
pub async fn sleep(d: Duration) {
    if matches!(core().clock, Clock::Virtual(_)) {
        return virtual_sleep(d).await;
    }
    if !has_uring() {
        std::thread::sleep(d);
        return;
    }
    let ts = Box::new(
        types::Timespec::new()
            .sec(d.as_secs())
            .nsec(d.subsec_nanos()),
    );
    let entry = opcode::Timeout::new(&*ts as *const types::Timespec).build();
    let (res, _) = submit(entry, Resources::Time(ts)).await;
    debug_assert!(res == -libc::ETIME || res >= 0, "timeout failed: {res}");
}

/// `f`'s output, or `None` if `d` passes first (`f` is then dropped).
pub async fn timeout<F: Future>(d: Duration, f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut timer = Box::pin(sleep(d));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await
}

impl Reactor {
    /// Submits what is queued and takes the completions; with `wait`,
    /// sleeps until there is one. Enters the kernel only for a reason:
    /// entries to submit, a wait, or completions the kernel holds back
    /// (the ring's task-run flag; an overflowed completion queue).
    fn submit_and_reap(&self, wait: bool) {
        let mut ring = self.ring.borrow_mut();
        // A wait: polled first if that is wanted and no fsync is in flight;
        // it sleeps unless polling found a completion.
        let t0 = (wait && ring.completion().is_empty()).then(std::time::Instant::now);
        let mut wait = wait;
        if let Some(t0) = t0 {
            let s = &self.spin;
            let polled = match (s.wanted(), self.on_workers.get() > 0) {
                (true, false) => self.poll(&mut ring, t0),
                (true, true) => {
                    s.gated.set(s.gated.get() + 1);
                    false
                }
                (false, _) => false,
            };
            let c = if polled { &s.polled } else { &s.slept };
            c.set(c.get() + 1);
            wait = !polled;
        }
        let want = usize::from(wait && ring.completion().is_empty());
        let sq = ring.submission();
        let enter = want > 0 || !sq.is_empty() || sq.taskrun() || sq.cq_overflow();
        drop(sq);
        if enter {
            entered(ring.submit_and_wait(want));
        }
        if let Some(t0) = t0 {
            self.spin.waited(t0, std::time::Instant::now());
        }
        let mut ops = self.ops.borrow_mut();
        for cqe in ring.completion() {
            if cqe.user_data() == CANCEL_TAG {
                continue;
            }
            let id = cqe.user_data() as usize;
            let slot = ops[id].as_mut().expect("completion for a free op slot");
            if slot.on_worker {
                self.on_workers.set(self.on_workers.get() - 1);
            }
            match std::mem::replace(&mut slot.state, OpState::Done(cqe.result())) {
                OpState::Waiting(w) => {
                    if let Some(w) = w {
                        w.wake();
                    }
                }
                OpState::Orphaned => {
                    ops[id] = None;
                    self.free_ops.borrow_mut().push(id);
                    self.inflight.set(self.inflight.get() - 1);
                }
                OpState::Done(_) => unreachable!("second completion for one op"),
            }
        }
    }

    /// Submits what is queued, then polls the ring for up to the spin
    /// budget from `t0`: whether a completion came (posted, or held back
    /// by the kernel for the next enter).
    fn poll(&self, ring: &mut IoUring, t0: std::time::Instant) -> bool {
        // Entries left unsubmitted would be waited for in vain: sleep
        // instead (the sleeping enter submits them).
        if !ring.submission().is_empty() && !entered(ring.submit()) {
            return false;
        }
        let mut turns = 0u32;
        loop {
            let sq = ring.submission();
            if sq.taskrun() || sq.cq_overflow() {
                return true;
            }
            drop(sq);
            if !ring.completion().is_empty() {
                return true;
            }
            turns += 1;
            if turns.is_multiple_of(64) {
                if t0.elapsed() > self.spin.budget.get() {
                    return false;
                }
                // Another thread of this CPU that has work runs first.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// Whether `io_uring_enter` entered: interrupted or busy (the completion
/// queue full) is for the next turn to retry; anything else is a bug.
fn entered(r: std::io::Result<usize>) -> bool {
    match r {
        Ok(_) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => false,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => false,
        Err(e) => panic!("io_uring_enter failed: {e}"),
    }
}

/// One submitted io_uring operation; resolves to the kernel's result and the
/// resources it owned.
pub struct Op {
    id: usize,
    finished: bool,
}

/// Queues `entry` for submission on the next loop turn.
///
/// The entry's pointers must point into `res` (heap memory that does not
/// move when `res` moves), which the op keeps alive until completion.
pub fn submit(entry: squeue::Entry, res: Resources) -> Op {
    submit_to(entry, res, false)
}

/// [`submit`] for an op the kernel hands to one of its worker threads (an
/// fsync: it cannot complete without blocking). While one is in flight the
/// loop sleeps rather than polls: the worker needs a CPU of the few there
/// are, and polling would compete with it for one.
pub fn submit_on_worker(entry: squeue::Entry, res: Resources) -> Op {
    submit_to(entry, res, true)
}

fn submit_to(entry: squeue::Entry, res: Resources, on_worker: bool) -> Op {
    let core = core();
    let r = core
        .reactor
        .as_ref()
        .expect("nacre runtime: io_uring op submitted without a ring");
    let id = {
        let mut ops = r.ops.borrow_mut();
        let slot = OpSlot {
            state: OpState::Waiting(None),
            res,
            on_worker,
        };
        match r.free_ops.borrow_mut().pop() {
            Some(id) => {
                ops[id] = Some(slot);
                id
            }
            None => {
                ops.push(Some(slot));
                ops.len() - 1
            }
        }
    };
    r.inflight.set(r.inflight.get() + 1);
    r.on_workers
        .set(r.on_workers.get() + usize::from(on_worker));
    let entry = entry.user_data(id as u64);
    let mut ring = r.ring.borrow_mut();
    loop {
        // SAFETY: the entry's buffers are owned by the op slot until the
        // completion is reaped (see module invariants).
        if unsafe { ring.submission().push(&entry) }.is_ok() {
            break;
        }
        ring.submit().expect("io_uring submit with a full queue");
    }
    Op {
        id,
        finished: false,
    }
}

impl Future for Op {
    type Output = (i32, Resources);
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let core = core();
        let r = core.reactor.as_ref().expect("op without a ring");
        let mut ops = r.ops.borrow_mut();
        let slot = ops[self.id].as_mut().expect("polled a free op");
        match &mut slot.state {
            OpState::Done(res) => {
                let res = *res;
                let slot = ops[self.id].take().expect("op slot");
                r.free_ops.borrow_mut().push(self.id);
                r.inflight.set(r.inflight.get() - 1);
                self.finished = true;
                Poll::Ready((res, slot.res))
            }
            OpState::Waiting(w) => {
                match w {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *w = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            OpState::Orphaned => unreachable!("polled an orphaned op"),
        }
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let Some(core) = CORE.with(|c| c.borrow().clone()) else {
            return;
        };
        let Some(r) = core.reactor.as_ref() else {
            return;
        };
        let mut ops = r.ops.borrow_mut();
        let Some(slot) = ops[self.id].as_mut() else {
            return;
        };
        if matches!(slot.state, OpState::Done(_)) {
            ops[self.id] = None;
            r.free_ops.borrow_mut().push(self.id);
            r.inflight.set(r.inflight.get() - 1);
        } else {
            slot.state = OpState::Orphaned;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sleep of zero is over at once and leaves no timer behind (such a
    /// timer would wake nobody); time goes on to the next one.
    #[test]
    fn virtual_time_after_a_zero_sleep() {
        block_on_virtual(async {
            // Due at once: done at its first poll, its timer still set.
            sleep(Duration::ZERO).await;
            sleep(Duration::from_secs(2)).await;
            assert_eq!(monotonic(), Duration::from_secs(2));
        });
    }

    /// Virtual time: hours of sleeps take no wall time, wake in deadline
    /// order (ties in the order they were set), and `monotonic` follows.
    #[test]
    fn virtual_time_jumps_to_the_next_timer_in_order() {
        let t0 = std::time::Instant::now();
        let order = block_on_virtual(async {
            let order = Rc::new(RefCell::new(Vec::new()));
            let mut hs = Vec::new();
            for (name, secs) in [("c", 3600u64), ("a", 5), ("b", 5), ("d", 1)] {
                let o = order.clone();
                hs.push(spawn(async move {
                    sleep(Duration::from_secs(secs)).await;
                    o.borrow_mut().push((name, monotonic().as_secs()));
                }));
            }
            for h in hs {
                h.await;
            }
            assert_eq!(monotonic(), Duration::from_secs(3600));
            assert!(has_timers());
            Rc::try_unwrap(order).unwrap().into_inner()
        });
        assert_eq!(order, [("d", 1), ("a", 5), ("b", 5), ("c", 3600)]);
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "virtual sleeps took wall time"
        );
    }

    #[test]
    fn tasks_run_and_join() {
        let v = block_on(async {
            let a = spawn(async { 1 + 1 });
            let b = spawn(async {
                yield_now().await;
                40
            });
            a.await + b.await
        });
        assert_eq!(v, 42);
    }

    #[test]
    fn sleeps_complete() {
        let t = std::time::Instant::now();
        block_on(async {
            let s = spawn(sleep(Duration::from_millis(20)));
            sleep(Duration::from_millis(5)).await;
            s.await;
        });
        assert!(t.elapsed() >= Duration::from_millis(20));
    }

    /// A completion reaches its task while other tasks keep the loop busy
    /// (it never sleeps in the kernel, where completions are otherwise
    /// collected): the loop enters the ring when the kernel flags work.
    #[test]
    fn completions_arrive_while_the_loop_never_idles() {
        let t = std::time::Instant::now();
        let turns = block_on(async {
            let done = Rc::new(Cell::new(false));
            let d = done.clone();
            drop(spawn(async move {
                sleep(Duration::from_millis(10)).await;
                d.set(true);
            }));
            let mut turns = 0u64;
            while !done.get() && t.elapsed() < Duration::from_secs(5) {
                yield_now().await;
                turns += 1;
            }
            assert!(done.get(), "the timer's completion never arrived");
            turns
        });
        assert!(turns > 0);
    }

    /// On a kernel that has them (Linux 6.1 on), the ring is made with
    /// `SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG` (the three are asked
    /// for together, and only a kernel without them gets a plain ring), so
    /// `completions_arrive_while_the_loop_never_idles` exercises the
    /// deferred ring, not the fallback.
    #[test]
    fn the_ring_is_deferred_where_the_kernel_can() {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut v = release
            .trim()
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        let deferred = block_on(async {
            let c = core();
            let r = c.reactor.as_ref().expect("a ring");
            let deferred = r.ring.borrow().params().is_setup_single_issuer();
            deferred
        });
        if (major, minor) >= (6, 1) {
            assert!(deferred, "a plain ring on Linux {}", release.trim());
        }
    }

    /// Waits this thread's runtime ended by polling, that slept, and that
    /// would have polled but for an fsync.
    fn waits() -> (u64, u64, u64) {
        let c = core();
        let s = &c.reactor.as_ref().expect("a ring").spin;
        (s.polled.get(), s.slept.get(), s.gated.get())
    }

    /// `NACRE_SPIN_US`: unset, the default; a number of µs, that; one
    /// above the most, the most; anything else, the default — the last
    /// two with a message naming the variable, the value and the budget
    /// used.
    #[test]
    fn the_spin_budget_from_the_environment() {
        let us = Duration::from_micros;
        assert_eq!(spin_budget_of(None), (us(SPIN_US_DEFAULT), None));
        assert_eq!(spin_budget_of(Some("0")), (Duration::ZERO, None));
        assert_eq!(spin_budget_of(Some(" 250 ")), (us(250), None));
        let (b, why) = spin_budget_of(Some("99999999"));
        assert_eq!(b, SPIN_BUDGET_MAX);
        let why = why.expect("a message");
        assert!(
            why.contains("NACRE_SPIN_US=99999999") && why.contains("10000 µs"),
            "{why}"
        );
        for bad in ["abc", "-5", "1.5", "", "100us"] {
            let (b, why) = spin_budget_of(Some(bad));
            assert_eq!(b, us(SPIN_US_DEFAULT), "{bad:?}");
            let why = why.expect("a message");
            assert!(why.contains(&format!("NACRE_SPIN_US={bad:?}")), "{why}");
            assert!(why.contains("not a whole number"), "{why}");
        }
    }

    /// Polling finds a completion the kernel holds back: a 20 µs timer,
    /// submitted, is seen by `Reactor::poll` within a budget of 1 s (its
    /// completion posted only when the loop enters the ring, which the
    /// ring's task-run flag asks for), and its sleep then ends.
    #[test]
    fn polling_finds_a_held_back_completion() {
        block_on(async {
            set_spin_budget(Duration::from_millis(10));
            let mut s = pin!(sleep(Duration::from_micros(20)));
            let w = Waker::noop();
            assert!(s.as_mut().poll(&mut Context::from_waker(w)).is_pending());
            let c = core();
            let r = c.reactor.as_ref().expect("a ring");
            // `poll` counts its budget from the instant it is given: one a
            // second ahead gives a loaded machine a second's grace.
            let ahead = std::time::Instant::now() + Duration::from_secs(1);
            let found = r.poll(&mut r.ring.borrow_mut(), ahead);
            assert!(found, "the timer's completion was not seen by polling");
            s.await;
        });
    }

    /// 200 short sleeps under a polling budget: their timers' completions
    /// are found by polling the ring (the kernel holds them back and flags
    /// the ring), and each sleep ends. Without a budget nothing polls.
    #[test]
    fn a_loop_about_to_sleep_polls_its_ring_first() {
        for (budget, polls) in [(Duration::from_millis(5), true), (Duration::ZERO, false)] {
            let (polled, slept) = block_on(async {
                set_spin_budget(budget);
                for _ in 0..200 {
                    sleep(Duration::from_micros(20)).await;
                }
                let (polled, slept, _) = waits();
                (polled, slept)
            });
            assert!(
                polled + slept >= 200,
                "{polled} + {slept} waits for 200 sleeps"
            );
            // How many polls depends on the machine's load (a preempted
            // loop counts as busy); some do.
            match polls {
                true => assert!(polled >= 1, "none of {slept} waits polled"),
                false => assert_eq!(polled, 0),
            }
        }
    }

    /// While an fsync is in flight the loop sleeps instead of polling (the
    /// kernel worker running it needs a CPU): a loop whose waits would
    /// otherwise poll (short sleeps before) sleeps through 50 fsyncs.
    #[test]
    fn a_loop_waiting_for_an_fsync_sleeps() {
        use crate::{BlockDev, FileDev, OpenFlags};
        let dir = tempfile::tempdir().unwrap();
        let (polled, slept) = block_on(async {
            set_spin_budget(SPIN_BUDGET_MAX);
            let flags = OpenFlags {
                create_bytes: Some(1 << 20),
                ..OpenFlags::default()
            };
            let dev = FileDev::open(&dir.path().join("f"), &flags).unwrap();
            assert!(dev.uses_uring());
            // Short sleeps until the loop would poll (a loaded machine may
            // take a few).
            let wanted = || core().reactor.as_ref().expect("a ring").spin.wanted();
            let mut n = 0;
            while !wanted() && n < 10_000 {
                sleep(Duration::from_micros(20)).await;
                n += 1;
            }
            assert!(wanted(), "the loop never wanted to poll");
            let (p0, s0, g0) = waits();
            for _ in 0..50 {
                dev.sync().await.unwrap();
            }
            let (p1, s1, g1) = waits();
            // The first fsync's wait came after short sleeps: it would
            // have polled but for the fsync.
            assert!(g1 > g0, "no wait reached the fsync gate");
            (p1 - p0, s1 - s0)
        });
        assert_eq!(polled, 0, "polled with an fsync in flight");
        assert!(slept > 0);
    }

    /// When polling is wanted: only after a wait no longer than the budget,
    /// and only while the loop's last window was light.
    #[test]
    fn polling_pays_only_after_short_waits_of_a_light_loop() {
        let us = Duration::from_micros;
        let s = Spin::new(us(100));
        assert!(!s.wanted(), "nothing waited yet");
        let t = s.busy_since.get();
        // Busy 10 µs, then a wait of 50 µs: polling pays next time.
        s.waited(t + us(10), t + us(60));
        assert!(s.wanted());
        // A wait of 1 ms: the loop has little to do, it sleeps.
        s.waited(t + us(70), t + us(1070));
        assert!(!s.wanted());
        // A window busy 80% of the time: no polling, however short the waits.
        let mut at = t + us(1070);
        for _ in 0..200 {
            s.waited(at + us(80), at + us(100));
            at += us(100);
        }
        assert!(!s.wanted());
        // Light again: busy 10%, short waits.
        for _ in 0..200 {
            s.waited(at + us(10), at + us(100));
            at += us(100);
        }
        assert!(s.wanted());
        assert!(!Spin::new(Duration::ZERO).wanted());
    }

    #[test]
    fn runtime_is_fresh_each_time() {
        block_on(async {
            // A detached task that never finishes is dropped at shutdown.
            drop(spawn(sleep(Duration::from_secs(3600))));
        });
        assert_eq!(block_on(async { 7 }), 7);
    }
}
