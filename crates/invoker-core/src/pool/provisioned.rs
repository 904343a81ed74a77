//! Provisioned containers: an action's `provisioned-concurrency`, kept created and initialised
//! at all times, so that its first calls after any idle spell find them warm.
//!
//! A provisioned container is an ordinary container of its key (it takes the key's jobs like
//! any other) marked so that nothing of the pool's own takes it away: the keep-alive policy
//! never sees its idle spells (so never expires or evicts it), an action's own idle bound does
//! not end it, and a claim for room does not retire it. It goes only when its key is retired
//! (deleted or replaced), the count is lowered, the pool drains, or it fails (a run that leaves
//! it unusable, a crash); then another is started in its place. Starts that fail back off
//! (1 s, doubling to 5 minutes), so a broken action does not churn containers.
//!
//! Here what a key keeps of its provisioning; the pool core's decisions are in
//! `provisioning.rs`.
//!
//! Placed where there is room, as any start: evicting idle containers of other keys (never
//! provisioned ones) when that alone makes it fit, and otherwise tried again at every tick
//! and stats update.

use invoker_ids::{ContainerId, Time};

/// What a key keeps of its provisioning. The ids are kept here rather than as a flag on each
/// container, which is one cache line already; a key without provisioning has none to search.
#[derive(Debug, Default)]
pub(super) struct Provisioned {
    /// How many to keep.
    pub(super) target: u32,
    /// Its provisioned containers starting or ready, not retiring.
    ids: Vec<ContainerId>,
    /// Starts in a row that failed, and when the next may be tried.
    pub(super) failures: u32,
    pub(super) retry_at: Option<Time>,
}

impl Provisioned {
    pub(super) fn holds(&self, id: ContainerId) -> bool {
        self.ids.contains(&id)
    }

    pub(super) fn ids(&self) -> impl Iterator<Item = ContainerId> + '_ {
        self.ids.iter().copied()
    }

    pub(super) fn add(&mut self, id: ContainerId) {
        self.ids.push(id);
    }

    /// Whether it keeps any, or still holds some (so its key is never forgotten).
    pub(super) fn keeps_any(&self) -> bool {
        self.target > 0 || !self.ids.is_empty()
    }

    pub(super) fn up(&self) -> u32 {
        self.ids.len() as u32
    }

    pub(super) fn drop_id(&mut self, id: ContainerId) {
        self.ids.retain(|&held| held != id);
    }
}
