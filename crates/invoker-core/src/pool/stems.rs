//! Prewarmed ("stem") containers: started for a kind and memory before any action asks, and
//! adopted by the first job of that kind and memory that would otherwise start cold.
//!
//! They are started only when a node has room and no key is blocked waiting for room, so they
//! never take resources from work that waits; they are the last thing evicted to make room.
//! A reactive class sizes itself from the cold starts it failed to prevent.

use super::nodes::Placement;
use super::{Container, ContainerId, Effects, KeyId, Owner, Phase, PoolCore, PrewarmSpec, StemId, Time};

#[derive(Debug)]
struct Stem {
    spec: PrewarmSpec,
    /// How many to keep ready now (fixed, or set by the reactive rule).
    target: u32,
    /// Started and not adopted, oldest first.
    ready: Vec<ContainerId>,
    starting: u32,
    /// Jobs of this class that started cold since the window began.
    misses: u32,
    window_began: Time,
}

#[derive(Debug, Default)]
pub(super) struct Stems {
    classes: Vec<Stem>,
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

impl PoolCore {
    /// Gives `key` a ready stem container of its class, if there is one, and starts its
    /// replacement. The container is then the key's, ready and empty: `fill` hands it work.
    pub(super) fn adopt_stem(&mut self, key_id: KeyId, stem: StemId, now: Time, fx: &mut Effects) -> bool {
        let key = self.keys.get_mut(&key_id).expect("adopting key exists");
        let Some(class) = self.stems.classes.get_mut(stem.0 as usize) else { return false };
        if class.spec.memory_mb != key.memory_mb {
            return false;
        }
        let Some(id) = class.ready.pop() else { return false };
        key.containers += 1;
        let c: &mut Container = self.containers.get_mut(&id).expect("a ready stem container exists");
        c.owner = Owner::Key(key_id);
        self.warm_generation += 1;
        self.fill(id, now, fx);
        self.settle(id, now);
        self.replenish_stems(now, fx);
        true
    }

    pub(super) fn on_stem_started(
        &mut self,
        id: ContainerId,
        stem: StemId,
        ok: bool,
        at: Time,
        now: Time,
        fx: &mut Effects,
    ) {
        let c = self.containers.get_mut(&id).expect("checked by the caller");
        let (node, memory_mb) = (c.node.clone(), c.memory_mb);
        self.nodes.start_finished(&node);
        self.stems.classes[stem.0 as usize].starting -= 1;
        if ok {
            c.phase = Phase::Ready;
            self.nodes.confirm_started(&node, id, at);
            if self.draining {
                self.retire(id, now, fx);
                return;
            }
            self.stems.classes[stem.0 as usize].ready.push(id);
        } else {
            // Not replaced at once: a factory that keeps failing would be asked again and
            // again. The next tick tries again.
            self.containers.remove(&id);
            self.nodes.release(&node, id, memory_mb, false, now);
        }
        // Blocked keys may adopt it now, or use the room a failed start left.
        self.retry_blocked(now, fx);
    }

    /// Applies the reactive rule to every class whose window has passed, and removes ready
    /// stem containers above a lowered target.
    pub(super) fn resize_stems(&mut self, now: Time, fx: &mut Effects) {
        let mut surplus = Vec::new();
        for class in &mut self.stems.classes {
            let Some(r) = &class.spec.reactive else { continue };
            if now < class.window_began + r.window {
                continue;
            }
            let wanted = r.min.saturating_add((class.misses / r.threshold.max(1)).saturating_mul(r.increment));
            class.target = wanted.clamp(r.min, r.max);
            class.misses = 0;
            class.window_began = now;
            let keep = class.target as usize;
            if class.ready.len() > keep {
                surplus.extend(class.ready.drain(..class.ready.len() - keep));
            }
        }
        for id in surplus {
            self.retire(id, now, fx);
        }
    }

    /// Starts stem containers up to each class's target, while nodes have room and no key is
    /// blocked waiting for room (prewarms never take resources from waiting work, or from
    /// provisioned containers that wait for it).
    pub(super) fn replenish_stems(&mut self, now: Time, fx: &mut Effects) {
        for index in 0..self.stems.classes.len() {
            loop {
                let class = &self.stems.classes[index];
                if self.draining || self.room_wanted() {
                    return;
                }
                if class.ready.len() as u32 + class.starting >= class.target {
                    break;
                }
                let memory_mb = class.spec.memory_mb;
                let Placement::On(node) = self.nodes.place(memory_mb, now, self.claimed_against(None)) else { return };
                self.stems.classes[index].starting += 1;
                let stem = StemId(index as u32);
                self.create(Owner::Stem(stem), memory_mb, node, now, super::Ahead::No, fx);
            }
        }
    }
}
