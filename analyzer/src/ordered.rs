//! Work on a trace's blocks in parallel, results taken in trace order,
//! without a barrier between groups of blocks.
//!
//! Both passes unwind or read blocks independently, but apply their
//! results in trace order (the timeline, the profile builder). Doing a
//! chunk of blocks at a time left a worker idle at the end of every chunk
//! until the slowest block of it was done, and the in-order step ran
//! beside the next chunk only. Here every worker takes the next block as
//! soon as it is free, and whichever worker finds the next result in
//! order ready applies it (one at a time), then goes back to blocks.

use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Results done but not yet consumed, from index `next` on.
struct Ready<T> {
    /// The index the consumer takes next.
    next: usize,
    /// `slots[k]` is the result of index `next + k`, once done.
    slots: VecDeque<Option<T>>,
}

impl<T> Ready<T> {
    fn take_next(&mut self) -> Option<(usize, T)> {
        if !matches!(self.slots.front(), Some(Some(_))) {
            return None;
        }
        let item = self.slots.pop_front().flatten()?;
        let index = self.next;
        self.next += 1;
        Some((index, item))
    }

    fn next_is_ready(&self) -> bool {
        matches!(self.slots.front(), Some(Some(_)))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run `work` on every index of `0..n` on the threads of the current
/// rayon pool, and hand each result to `consume` in index order. At most
/// `window` indices past the last one consumed are worked on or waiting,
/// which bounds the memory held by results. With one thread this is
/// `work(0)`, `consume(0)`, `work(1)`, `consume(1)`, ...
pub(crate) fn for_each_in_order<T: Send>(
    n: usize,
    window: usize,
    work: impl Fn(usize) -> T + Sync,
    consume: impl FnMut(usize, T) + Send,
) {
    let window = window.max(1);
    let claimed = AtomicUsize::new(0);
    let ready = Mutex::new(Ready {
        next: 0,
        slots: VecDeque::with_capacity(window),
    });
    let advanced = Condvar::new();
    // Set when `work` or `consume` panicked: the others stop instead of
    // waiting for a result that will not come, and the panic goes on.
    let failed = AtomicBool::new(false);
    let consumer = Mutex::new(consume);
    // Consume what is ready in order, unless another worker is at it;
    // look again after letting go, for a result put in meanwhile by a
    // worker that found the consumer busy.
    let drain = || loop {
        let Ok(mut consume) = consumer.try_lock() else {
            return;
        };
        while let Some((index, item)) = lock(&ready).take_next() {
            consume(index, item);
            advanced.notify_all();
        }
        drop(consume);
        if !lock(&ready).next_is_ready() {
            return;
        }
    };
    let work_on = || loop {
        let index = claimed.fetch_add(1, Ordering::Relaxed);
        if index >= n || failed.load(Ordering::SeqCst) {
            return;
        }
        {
            let mut r = lock(&ready);
            // The result at `next` is being worked on by another worker
            // (this one claimed a later index), so the wait ends.
            while index >= r.next + window {
                if failed.load(Ordering::SeqCst) {
                    return;
                }
                r = advanced.wait(r).unwrap_or_else(|e| e.into_inner());
            }
        }
        let item = work(index);
        {
            let mut r = lock(&ready);
            let k = index - r.next;
            if r.slots.len() <= k {
                r.slots.resize_with(k + 1, || None);
            }
            r.slots[k] = Some(item);
        }
        drain();
    };
    let worker = || {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(work_on)) {
            failed.store(true, Ordering::SeqCst);
            // Under the lock, so that no waiter misses it between its
            // check and its wait.
            let _r = lock(&ready);
            advanced.notify_all();
            drop(_r);
            resume_unwind(panic);
        }
    };
    if rayon::current_num_threads() <= 1 || n <= 1 {
        worker();
    } else {
        rayon::broadcast(|_| worker());
    }
    // Every index was consumed (nothing panicked, or the panic went on
    // above): each result is put before its worker drains, and a drain
    // that finds the consumer busy leaves it to the busy one, which looks
    // again before it returns.
    debug_assert_eq!(lock(&ready).next, n);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(threads: usize, n: usize, window: usize) -> Vec<usize> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut seen = Vec::new();
        pool.install(|| {
            for_each_in_order(
                n,
                window,
                |i| {
                    // Uneven work, so that results come out of order.
                    let mut x = i as u64;
                    for _ in 0..(i % 7) * 1000 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    (i, x)
                },
                |index, (i, _)| {
                    assert_eq!(index, i);
                    seen.push(i);
                },
            )
        });
        seen
    }

    #[test]
    fn every_result_is_consumed_once_in_order() {
        for threads in [1, 2, 4] {
            for window in [1, 2, 8] {
                for n in [0, 1, 2, 3, 50] {
                    assert_eq!(
                        run(threads, n, window),
                        (0..n).collect::<Vec<_>>(),
                        "{threads} threads, window {window}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_panic_in_work_goes_on_instead_of_hanging() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let one_done = AtomicBool::new(false);
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            pool.install(|| {
                for_each_in_order(
                    100,
                    2,
                    |i| {
                        // Index 0 panics once index 1 is done, when the
                        // other worker goes on to index 2, past the
                        // window, to wait for index 0.
                        if i == 0 {
                            while !one_done.load(Ordering::SeqCst) {
                                std::thread::yield_now();
                            }
                            panic!("block 0");
                        }
                        if i == 1 {
                            one_done.store(true, Ordering::SeqCst);
                        }
                        i
                    },
                    |_, _| {},
                )
            })
        }));
        assert!(result.is_err());
    }

    #[test]
    fn no_more_than_the_window_is_waiting() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let consumed = AtomicUsize::new(0);
        let worst = AtomicUsize::new(0);
        pool.install(|| {
            for_each_in_order(
                200,
                3,
                |i| {
                    let ahead = i - consumed.load(Ordering::SeqCst);
                    worst.fetch_max(ahead, Ordering::SeqCst);
                    i
                },
                |_, _| {
                    consumed.fetch_add(1, Ordering::SeqCst);
                },
            )
        });
        // The consumer moves `next` on just before it consumes.
        assert!(worst.load(Ordering::SeqCst) <= 3);
    }
}
