//! The pool's containers, indexed by id without hashing: an id is a slot index with a
//! generation in its high bits, so a warm dispatch reaches its container in one memory access
//! and a stale id (a removed container's) never finds the slot's new occupant.
//!
//! Each value sits on its own cache line(s); what identifies the occupant (its generation and
//! its mark) sits in a dense array beside them, so that lazily deleted index entries are
//! checked without touching the values.

use invoker_ids::ContainerId;

/// One slot's value, aligned so that a value of up to 64 bytes is one cache line.
#[derive(Debug)]
#[repr(align(64))]
struct Line<T>(Option<T>);

#[derive(Clone, Copy, Debug)]
struct Meta {
    generation: u32,
    /// The pool's idle sequence of the occupant, or `NO_MARK`.
    mark: u64,
}

#[derive(Debug)]
pub(super) struct Slab<T> {
    lines: Vec<Line<T>>,
    meta: Vec<Meta>,
    free: Vec<u32>,
    len: usize,
}

const NO_MARK: u64 = u64::MAX;

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { lines: Vec::new(), meta: Vec::new(), free: Vec::new(), len: 0 }
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
            Some(i) => i as usize,
            None => {
                self.lines.push(Line(None));
                self.meta.push(Meta { generation: 0, mark: NO_MARK });
                self.lines.len() - 1
            }
        };
        self.meta[index].mark = NO_MARK;
        self.lines[index].0 = Some(value);
        join(index, self.meta[index].generation)
    }

    /// The slot of `id` if its occupant is the one `id` names.
    fn index(&self, id: &ContainerId) -> Option<usize> {
        let (index, generation) = split(*id);
        let meta = self.meta.get(index)?;
        (meta.generation == generation && self.lines[index].0.is_some()).then_some(index)
    }

    pub fn get(&self, id: &ContainerId) -> Option<&T> {
        let index = self.index(id)?;
        self.lines[index].0.as_ref()
    }

    pub fn get_mut(&mut self, id: &ContainerId) -> Option<&mut T> {
        let index = self.index(id)?;
        self.lines[index].0.as_mut()
    }

    pub fn remove(&mut self, id: &ContainerId) -> Option<T> {
        let index = self.index(id)?;
        let value = self.lines[index].0.take()?;
        let meta = &mut self.meta[index];
        meta.generation = meta.generation.wrapping_add(1);
        meta.mark = NO_MARK;
        self.free.push(index as u32);
        self.len -= 1;
        Some(value)
    }

    /// Whether the container `id` carries `mark`. Marks are unique over time (the pool's idle
    /// sequence), so a slot's later occupant never matches an entry made for an earlier one.
    pub fn has_mark(&self, id: &ContainerId, mark: u64) -> bool {
        mark != NO_MARK && self.meta.get(split(*id).0).is_some_and(|m| m.mark == mark)
    }

    pub fn set_mark(&mut self, id: &ContainerId, mark: u64) {
        if let Some(index) = self.index(id) {
            self.meta[index].mark = mark;
        }
    }

    /// Clears the mark of `id`; returns whether it had one.
    pub fn take_mark(&mut self, id: &ContainerId) -> bool {
        let Some(index) = self.index(id) else { return false };
        std::mem::replace(&mut self.meta[index].mark, NO_MARK) != NO_MARK
    }

    /// The mark `id` carries, if any.
    pub fn mark(&self, id: &ContainerId) -> Option<u64> {
        self.index(id).map(|index| self.meta[index].mark).filter(|&mark| mark != NO_MARK)
    }

    pub fn is_marked(&self, id: &ContainerId) -> bool {
        self.index(id).is_some_and(|index| self.meta[index].mark != NO_MARK)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.lines.iter().filter_map(|line| line.0.as_ref())
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.lines.iter_mut().filter_map(|line| line.0.as_mut())
    }

    pub fn iter(&self) -> impl Iterator<Item = (ContainerId, &T)> {
        self.lines
            .iter()
            .zip(&self.meta)
            .enumerate()
            .filter_map(|(i, (line, meta))| line.0.as_ref().map(|v| (join(i, meta.generation), v)))
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
