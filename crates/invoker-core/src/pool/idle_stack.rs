//! One key's idle containers, most recently used on top (LIFO keeps the warmest container busy
//! and lets the others age out).
//!
//! Entries are deleted lazily: an entry is live while its container's slab mark still equals
//! the entry's sequence, so a container leaving idleness costs no search here. The top entry
//! is kept inline, in the key's own state: with one warm container per action (the common
//! case) a warm activation then pops and pushes without reaching another allocation.

use invoker_ids::ContainerId;

/// Marks `top` empty without the tag an `Option` would add to every key's state.
const EMPTY: (u64, ContainerId) = (u64::MAX, ContainerId(0));

#[derive(Debug)]
pub(super) struct IdleStack {
    top: (u64, ContainerId),
    below: Vec<(u64, ContainerId)>,
    live: u32,
}

impl Default for IdleStack {
    fn default() -> Self {
        IdleStack { top: EMPTY, below: Vec::new(), live: 0 }
    }
}

impl IdleStack {
    pub(super) fn push(&mut self, seq: u64, id: ContainerId, is_live: impl Fn(ContainerId, u64) -> bool) {
        let previous = std::mem::replace(&mut self.top, (seq, id));
        if previous != EMPTY {
            self.below.push(previous);
        }
        self.live += 1;
        if self.below.len() > 2 * self.live as usize + 8 {
            self.below.retain(|&(seq, id)| is_live(id, seq));
        }
    }

    /// The most recently used live container, taken out of the stack; the caller ends its
    /// idleness (clears its mark) and then calls [`IdleStack::ended`].
    pub(super) fn pop(&mut self, is_live: impl Fn(ContainerId, u64) -> bool) -> Option<ContainerId> {
        let (seq, id) = std::mem::replace(&mut self.top, EMPTY);
        if (seq, id) != EMPTY && is_live(id, seq) {
            return Some(id);
        }
        while let Some((seq, id)) = self.below.pop() {
            if is_live(id, seq) {
                return Some(id);
            }
        }
        None
    }

    /// The container [`IdleStack::pop`] would take, left in the stack.
    pub(super) fn peek(&self, is_live: impl Fn(ContainerId, u64) -> bool) -> Option<ContainerId> {
        let top = (self.top != EMPTY).then_some(self.top);
        top.into_iter().chain(self.below.iter().rev().copied()).find(|&(seq, id)| is_live(id, seq)).map(|(_, id)| id)
    }

    /// A live entry's container stopped being idle (its mark was cleared).
    pub(super) fn ended(&mut self) {
        self.live -= 1;
    }

    pub(super) fn live(&self) -> usize {
        self.live as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[test]
    fn pops_the_most_recent_live_entry_and_skips_ended_ones() {
        let marks: RefCell<HashMap<ContainerId, u64>> = RefCell::default();
        let is_live = |id: ContainerId, seq: u64| marks.borrow().get(&id) == Some(&seq);
        let mut stack = IdleStack::default();
        for (seq, id) in [(1, ContainerId(1)), (2, ContainerId(2)), (3, ContainerId(3))] {
            marks.borrow_mut().insert(id, seq);
            stack.push(seq, id, is_live);
        }
        // Container 3 (on top) and 2 leave idleness elsewhere; 2 comes back with a new spell.
        marks.borrow_mut().remove(&ContainerId(3));
        stack.ended();
        marks.borrow_mut().insert(ContainerId(2), 4);
        stack.ended();
        stack.push(4, ContainerId(2), is_live);
        assert_eq!(stack.live(), 2);
        assert_eq!(stack.pop(is_live), Some(ContainerId(2)));
        marks.borrow_mut().remove(&ContainerId(2));
        stack.ended();
        assert_eq!(stack.pop(is_live), Some(ContainerId(1)), "the stale entries of 3 and 2 are skipped");
        marks.borrow_mut().remove(&ContainerId(1));
        stack.ended();
        assert_eq!(stack.pop(is_live), None);
        assert_eq!(stack.live(), 0);
    }

    #[test]
    fn ended_entries_do_not_pile_up() {
        let mut stack = IdleStack::default();
        for seq in 0..1_000 {
            stack.push(seq, ContainerId(1), |_, s| s == seq);
            stack.ended();
        }
        assert!(stack.below.len() <= 10, "compacted to the live entries: {}", stack.below.len());
    }
}
