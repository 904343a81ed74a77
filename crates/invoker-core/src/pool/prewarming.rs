//! The pool core's decisions about prewarmed ("stem") containers (`stems.rs` keeps the
//! classes): adopting one for a job that would start cold, starting replacements, and sizing a
//! reactive class.

use super::nodes::Placement;
use super::types::{KeyId, Owner, StemId};
use super::{Container, Effects, Phase, PoolCore};
use invoker_ids::{ContainerId, Time};

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
