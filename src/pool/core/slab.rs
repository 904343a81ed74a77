//! The pool's containers, indexed by id without hashing: an id is a slot index with a
//! generation in its high bits, so a warm dispatch reaches its container in one memory access
//! and a stale id (a removed container's) never finds the slot's new occupant.

use super::types::ContainerId;

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

#[derive(Debug)]
pub(super) struct Slab<T> {
    slots: Vec<Slot<T>>,
    /// One number per slot, dense beside the slots: the pool's idle sequence of the container
    /// in the slot, or `NO_MARK`. Lazily deleted index entries are checked against it without
    /// touching the (large, cold) containers themselves.
    marks: Vec<u64>,
    free: Vec<u32>,
    len: usize,
}

const NO_MARK: u64 = u64::MAX;

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { slots: Vec::new(), marks: Vec::new(), free: Vec::new(), len: 0 }
    }
}

/// Slot `i` of generation `g` is id `g << 32 | (i + 1)`: the first containers are 1, 2, 3...
fn join(index: usize, generation: u32) -> ContainerId {
    ContainerId((u64::from(generation) << 32) | (index as u64 + 1))
}

fn split(id: ContainerId) -> (usize, u32) {
    (((id.0 & 0xFFFF_FFFF) as usize).wrapping_sub(1), (id.0 >> 32) as u32)
}

impl<T> Slab<T> {
    /// Stores `value` under a new id. Ids start at 1, as the records and process names show them.
    pub fn insert(&mut self, value: T) -> ContainerId {
        self.len += 1;
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, value: None });
                self.marks.push(NO_MARK);
                (self.slots.len() - 1) as u32
            }
        };
        self.marks[index as usize] = NO_MARK;
        let slot = &mut self.slots[index as usize];
        slot.value = Some(value);
        join(index as usize, slot.generation)
    }

    pub fn get(&self, id: &ContainerId) -> Option<&T> {
        let (index, generation) = split(*id);
        self.slots.get(index).filter(|s| s.generation == generation).and_then(|s| s.value.as_ref())
    }

    pub fn get_mut(&mut self, id: &ContainerId) -> Option<&mut T> {
        let (index, generation) = split(*id);
        self.slots.get_mut(index).filter(|s| s.generation == generation).and_then(|s| s.value.as_mut())
    }

    pub fn remove(&mut self, id: &ContainerId) -> Option<T> {
        let (index, generation) = split(*id);
        let slot = self.slots.get_mut(index).filter(|s| s.generation == generation)?;
        let value = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.marks[index] = NO_MARK;
        self.free.push(index as u32);
        self.len -= 1;
        Some(value)
    }

    /// Whether the container `id` carries `mark`. Marks are unique over time (the pool's idle
    /// sequence), so a slot's later occupant never matches an entry made for an earlier one.
    pub fn has_mark(&self, id: &ContainerId, mark: u64) -> bool {
        mark != NO_MARK && self.marks.get(split(*id).0) == Some(&mark)
    }

    pub fn set_mark(&mut self, id: &ContainerId, mark: u64) {
        if self.get(id).is_some() {
            self.marks[split(*id).0] = mark;
        }
    }

    /// Clears the mark of `id`; returns whether it had one.
    pub fn take_mark(&mut self, id: &ContainerId) -> bool {
        if self.get(id).is_none() {
            return false;
        }
        let mark = &mut self.marks[split(*id).0];
        std::mem::replace(mark, NO_MARK) != NO_MARK
    }

    pub fn is_marked(&self, id: &ContainerId) -> bool {
        self.get(id).is_some() && self.marks[split(*id).0] != NO_MARK
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.value.as_ref())
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().filter_map(|s| s.value.as_mut())
    }

    pub fn iter(&self) -> impl Iterator<Item = (ContainerId, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| s.value.as_ref().map(|v| (join(i, s.generation), v)))
    }
}

impl<T> std::ops::Index<&ContainerId> for Slab<T> {
    type Output = T;

    fn index(&self, id: &ContainerId) -> &T {
        self.get(id).expect("a live container id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_id_never_reaches_the_slots_next_occupant() {
        let mut slab = Slab::default();
        let a = slab.insert("a");
        assert_eq!(a, ContainerId(1), "the first id is 1");
        assert_eq!(slab.get(&ContainerId(0)), None);
        assert_eq!(slab.remove(&a), Some("a"));
        let b = slab.insert("b");
        assert_ne!(a, b);
        assert_eq!(slab.get(&a), None);
        assert_eq!(slab.get(&b), Some(&"b"));
        assert_eq!(slab.remove(&a), None);
        assert_eq!(slab.len(), 1);
        assert_eq!(slab.iter().map(|(id, v)| (id, *v)).collect::<Vec<_>>(), vec![(b, "b")]);
    }

    #[test]
    fn marks_belong_to_one_occupant() {
        let mut slab = Slab::default();
        let a = slab.insert("a");
        slab.set_mark(&a, 7);
        assert!(slab.has_mark(&a, 7) && slab.is_marked(&a));
        slab.remove(&a);
        let b = slab.insert("b");
        assert!(!slab.has_mark(&b, 7), "the next occupant starts unmarked");
        slab.set_mark(&b, 8);
        assert!(slab.take_mark(&b));
        assert!(!slab.take_mark(&b));
        assert!(!slab.is_marked(&b));
    }
}
