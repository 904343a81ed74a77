//! The pool core's decisions about provisioned containers (`provisioned.rs` says what they
//! are and what a key keeps of them): starting them where they fit, replacing them, backing off
//! failed starts, letting the surplus go when the count is lowered.

use super::nodes::Placement;
use super::types::{KeyId, Provision};
use super::{Ahead, Effects, Phase, PoolCore};
use invoker_ids::{ContainerId, Time};
use std::time::Duration;

/// The first wait after a provisioned container failed to start; it doubles with each
/// failure in a row...
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// ...up to this.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

impl PoolCore {
    pub(super) fn on_provision(&mut self, p: Provision, now: Time, fx: &mut Effects) {
        if self.draining {
            return;
        }
        let key = self.keys.entry(p.key).or_default();
        if key.retired {
            return; // a revision gone for good keeps nothing
        }
        key.shape(p.memory_mb, p.concurrency, p.max_running, p.tenant);
        let before = key.provisioned.target;
        key.provisioned.target = p.count;
        if p.count < before {
            self.release_provisioned(p.key, now, fx);
        }
        self.provision(p.key, now, fx);
        self.gc_key(p.key);
    }

    /// Starts the key's missing provisioned containers where they fit; what does not fit now is
    /// tried again at the next tick or stats update.
    pub(super) fn provision(&mut self, key_id: KeyId, now: Time, fx: &mut Effects) {
        loop {
            let Some(key) = self.keys.get(&key_id) else { return };
            let p = &key.provisioned;
            if self.draining || key.retired || p.up() >= p.target || key.memory_mb == 0 {
                self.provisioning.remove(&key_id);
                return;
            }
            if p.retry_at.is_some_and(|at| at > now) {
                self.provisioning.insert(key_id, false);
                return;
            }
            let memory_mb = key.memory_mb;
            match self.nodes.place(memory_mb, now, self.claimed_against(Some(key_id))) {
                Placement::On(node) => {
                    self.create_for_key(key_id, node, now, Ahead::Provisioned, fx);
                }
                Placement::NoRoom => {
                    self.make_room(key_id, memory_mb, now, fx);
                    self.provisioning.insert(key_id, true);
                    return;
                }
                Placement::StartsCapped => {
                    self.provisioning.insert(key_id, true);
                    return;
                }
            }
        }
    }

    /// Every key still short of its provisioned containers, tried again.
    pub(super) fn provision_wanting(&mut self, now: Time, fx: &mut Effects) {
        if self.provisioning.is_empty() {
            return;
        }
        for key in std::mem::take(&mut self.provisioning).into_keys() {
            self.provision(key, now, fx);
        }
    }

    /// A provisioned container stopped being one (retired, removed, or its start failed): its
    /// key starts another when it may.
    pub(super) fn provisioned_gone(&mut self, key_id: KeyId, id: ContainerId, start_failed: bool, now: Time) {
        let Some(key) = self.keys.get_mut(&key_id) else { return };
        let p = &mut key.provisioned;
        p.drop_id(id);
        if start_failed {
            p.failures = p.failures.saturating_add(1);
            let backoff = FIRST_BACKOFF.saturating_mul(1 << p.failures.min(16).saturating_sub(1)).min(MAX_BACKOFF);
            p.retry_at = Some(now + backoff);
        }
        self.provisioning.insert(key_id, false);
    }

    /// Whether a key waits for room for its provisioned containers: stems and pre-warms then
    /// start nothing, as while jobs wait for room.
    pub(super) fn provisions_want_room(&self) -> bool {
        self.provisioning.values().any(|&room| room)
    }

    /// A provisioned container of the key is up: its failures in a row end. One the key no
    /// longer needs (its count was lowered while it started) becomes an ordinary container.
    pub(super) fn provisioned_started(&mut self, key_id: KeyId, id: ContainerId) {
        let Some(key) = self.keys.get_mut(&key_id) else { return };
        let p = &mut key.provisioned;
        p.failures = 0;
        p.retry_at = None;
        if p.up() > p.target {
            p.drop_id(id);
        }
    }

    /// The count was lowered: the surplus stops being provisioned, idle ones first (removed
    /// now); a busy one becomes an ordinary container, kept as the keep-alive policy says.
    fn release_provisioned(&mut self, key_id: KeyId, now: Time, fx: &mut Effects) {
        let Some(key) = self.keys.get(&key_id) else { return };
        let mut surplus = key.provisioned.up().saturating_sub(key.provisioned.target);
        if surplus == 0 {
            return;
        }
        let containers = &self.containers;
        let mut mine: Vec<(bool, ContainerId)> = key
            .provisioned
            .ids()
            .filter(|id| containers.get(id).is_some_and(|c| c.phase == Phase::Ready))
            .map(|id| (!containers.is_marked(&id), id))
            .collect();
        mine.sort(); // idle ones (not busy) first
        for (busy, id) in mine {
            if surplus == 0 {
                break;
            }
            surplus -= 1;
            if busy {
                self.keys.get_mut(&key_id).expect("checked above").provisioned.drop_id(id);
            } else {
                self.retire(id, now, fx);
            }
        }
    }
}
