//! Completing a JavaScript promise from a core future without a second
//! runtime: the future is polled once on the JavaScript thread (which sends
//! the command to the core's driver), and again by whoever wakes it (the
//! driver thread, completing its oneshot). The last poll resolves a
//! deferred, which hands the value to the JavaScript thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

type Boxed = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Task {
    future: Mutex<Option<Boxed>>,
    /// A wake arrived: poll (again).
    notified: AtomicBool,
}

impl Task {
    fn run(self: &Arc<Self>) {
        self.notified.store(true, Ordering::SeqCst);
        loop {
            // Whoever holds the future polls it; a wake meanwhile leaves
            // `notified` set and that poller goes round once more.
            let Ok(mut slot) = self.future.try_lock() else {
                return;
            };
            if !self.notified.swap(false, Ordering::SeqCst) {
                return;
            }
            if let Some(future) = slot.as_mut() {
                let waker = Waker::from(self.clone());
                if future.as_mut().poll(&mut Context::from_waker(&waker)) == Poll::Ready(()) {
                    *slot = None;
                }
            }
            drop(slot);
            if !self.notified.load(Ordering::SeqCst) {
                return;
            }
        }
    }
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        self.run();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.run();
    }
}

/// Runs `future` to completion: polled now, then on every wake.
pub fn spawn(future: impl Future<Output = ()> + Send + 'static) {
    let task = Arc::new(Task {
        future: Mutex::new(Some(Box::pin(future))),
        notified: AtomicBool::new(false),
    });
    task.run();
}
