//! Prewarmed ("stem") containers: started for a kind and memory before any action asks, and
//! adopted by the first job of that kind and memory that would otherwise start cold.
//!
//! They are started only when a node has room and no key is blocked waiting for room, so they
//! never take resources from work that waits; they are the last thing evicted to make room.
//! A reactive class sizes itself from the cold starts it failed to prevent. Here the classes'
//! own state; the pool core's decisions about them are in `prewarming.rs`.

use super::types::{PrewarmSpec, StemId};
use invoker_ids::{ContainerId, Time};

#[derive(Debug)]
pub(super) struct Stem {
    pub(super) spec: PrewarmSpec,
    /// How many to keep ready now (fixed, or set by the reactive rule).
    pub(super) target: u32,
    /// Started and not adopted, oldest first.
    pub(super) ready: Vec<ContainerId>,
    pub(super) starting: u32,
    /// Jobs of this class that started cold since the window began.
    pub(super) misses: u32,
    pub(super) window_began: Time,
}

#[derive(Debug, Default)]
pub(super) struct Stems {
    pub(super) classes: Vec<Stem>,
}

impl Stems {
    pub(super) fn new(specs: &[PrewarmSpec]) -> Self {
        let classes = specs
            .iter()
            .map(|spec| Stem {
                spec: spec.clone(),
                target: spec.count,
                ready: Vec::new(),
                starting: 0,
                misses: 0,
                window_began: Time::ZERO,
            })
            .collect();
        Stems { classes }
    }

    fn class(&mut self, stem: StemId) -> Option<&mut Stem> {
        self.classes.get_mut(stem.0 as usize)
    }

    /// A job of this class found no stem container and starts cold.
    pub(super) fn missed(&mut self, stem: StemId) {
        if let Some(class) = self.class(stem) {
            class.misses = class.misses.saturating_add(1);
        }
    }

    /// Every unadopted ready stem container, oldest first within each class.
    pub(super) fn ready(&self) -> impl Iterator<Item = ContainerId> + '_ {
        self.classes.iter().flat_map(|c| c.ready.iter().copied())
    }

    /// Unadopted stem containers: (ready, starting), over every class.
    pub(super) fn totals(&self) -> (usize, usize) {
        self.classes.iter().fold((0, 0), |(r, s), c| (r + c.ready.len(), s + c.starting as usize))
    }

    /// The memory of the unadopted stem containers, ready and starting, over every class.
    pub(super) fn memory_mb(&self) -> u64 {
        self.classes.iter().map(|c| u64::from(c.spec.memory_mb) * (c.ready.len() as u64 + u64::from(c.starting))).sum()
    }

    pub(super) fn take_all_ready(&mut self) -> Vec<ContainerId> {
        self.classes.iter_mut().flat_map(|c| std::mem::take(&mut c.ready)).collect()
    }

    /// Takes `id` out of the ready set (it is being evicted).
    pub(super) fn unready(&mut self, stem: StemId, id: ContainerId) {
        if let Some(class) = self.class(stem) {
            class.ready.retain(|&c| c != id);
        }
    }

    /// A stem container is gone (removed, or died).
    pub(super) fn forget(&mut self, stem: StemId, id: ContainerId, was_starting: bool) {
        if let Some(class) = self.class(stem) {
            if was_starting {
                class.starting -= 1;
            }
            class.ready.retain(|&c| c != id);
        }
    }
}
