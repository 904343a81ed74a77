//! Events in virtual time, for the simulators: the earliest first, and those due at one time in
//! the order they were scheduled, so that a run is the same every time.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::time::Duration;

pub struct Timeline<E> {
    seq: u64,
    heap: BinaryHeap<Reverse<Entry<E>>>,
}

struct Entry<E> {
    at: Duration,
    seq: u64,
    ev: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl<E> Default for Timeline<E> {
    fn default() -> Self {
        Timeline { seq: 0, heap: BinaryHeap::new() }
    }
}

impl<E> Timeline<E> {
    /// `ev` is due at `at`.
    pub fn at(&mut self, at: Duration, ev: E) {
        self.seq += 1;
        self.heap.push(Reverse(Entry { at, seq: self.seq, ev }));
    }

    /// The next event due, and when.
    pub fn next(&mut self) -> Option<(Duration, E)> {
        self.heap.pop().map(|Reverse(e)| (e.at, e.ev))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_first_and_ties_in_the_order_scheduled() {
        let mut t = Timeline::default();
        let ms = Duration::from_millis;
        t.at(ms(5), "b");
        t.at(ms(1), "a");
        t.at(ms(5), "c");
        let order: Vec<_> = std::iter::from_fn(|| t.next()).collect();
        assert_eq!(order, [(ms(1), "a"), (ms(5), "b"), (ms(5), "c")]);
    }
}
