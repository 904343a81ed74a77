//! The warm path's one hand-off: which container a job of each key may be handed straight to,
//! by its caller, without waiting for the core to decide (Fn's agent hands a call to an idle
//! container's token the same way).
//!
//! The core stays the one owner of what runs where. It names, per key, the container an
//! arrival would be dispatched to at once with nothing else to do (no resume, no start, no
//! refusal): [`PoolCore::offer`]. After every event it says which keys' offers may have
//! changed ([`PoolCore::take_offer_changes`]), so a caller can keep a table of them that is
//! never stale when it is read. A caller that takes an offer hands its job to the container
//! and tells the core with [`Event::Taken`], before any other event: the core counts the job
//! as one it dispatched there itself. The property tests hold the table to the core's own
//! answer after every event, and a taken container to busy.

use super::dirty_offers::Dirty;
use super::{Effect, Effects, Event, Job, KeyId, Owner, Phase, PoolCore};
use invoker_ids::{ContainerId, Time};
use smallvec::SmallVec;

/// What an event touched before the core handled it: the key of its job or container (a
/// removed container's key is gone with it after), and the largest node's capacity.
pub(super) struct Before {
    key: Option<KeyId>,
    largest: Option<u64>,
}

impl PoolCore {
    /// The container a job of `key` arriving now would be dispatched to at once, with nothing
    /// else to do: the key's free container that [`Event::Arrived`] would take, when it is not
    /// paused (a resume is the proxy's to order), the key is below its cap and the pool takes
    /// work. `None`: the job goes through the core.
    pub fn offer(&self, key: KeyId) -> Option<ContainerId> {
        if self.draining {
            return None;
        }
        let k = self.keys.get(&key)?;
        if !k.below_cap() {
            return None;
        }
        if let Some(largest) = self.nodes.largest_capacity_mb() {
            if u64::from(k.memory_mb) + self.config.buffer_mb > largest {
                return None;
            }
        }
        let containers = &self.containers;
        let free =
            k.partial.last().map(|&(_, c)| c).or_else(|| k.idle.peek(|id, seq| containers.has_mark(&id, seq)))?;
        (!containers[&free].paused).then_some(free)
    }

    /// The keys whose offer may have changed since the last call, each with its offer now.
    pub fn take_offer_changes(&mut self) -> SmallVec<[(KeyId, Option<ContainerId>); 2]> {
        let Dirty { mut keys, all } = std::mem::take(&mut self.offers);
        if all {
            keys.extend(self.keys.keys().copied().filter(|k| !keys.contains(k)).collect::<Vec<_>>());
        }
        keys.into_iter().map(|key| (key, self.offer(key))).collect()
    }

    fn key_of(&self, container: ContainerId) -> Option<KeyId> {
        match self.containers.get(&container)?.owner {
            Owner::Key(key) => Some(key),
            Owner::Stem(_) => None,
        }
    }

    pub(super) fn offers_before(&self, event: &Event) -> Before {
        let key = match event {
            Event::Arrived(job) | Event::Taken { job, .. } => Some(job.key),
            Event::Started { container, .. } | Event::Finished { container, .. } | Event::Removed(container) => {
                self.key_of(*container)
            }
            Event::Retire(key) => Some(*key),
            Event::Provision(provision) => Some(provision.key),
            Event::NodeStats(_) | Event::Tick | Event::Drain | Event::ShedIdle => None,
        };
        Before { key, largest: self.nodes.largest_capacity_mb() }
    }

    /// Marks what the event and its effects touched: its key, every container's an effect
    /// names, and every key when the pool drains or the largest node changed.
    pub(super) fn offers_after(&mut self, before: Before, fx: &Effects) {
        if self.draining || before.largest != self.nodes.largest_capacity_mb() {
            self.offers.all = true;
        }
        if let Some(key) = before.key {
            self.offers.mark(key);
        }
        for effect in fx {
            let key = match *effect {
                Effect::Create { owner: Owner::Key(key), .. } => Some(key),
                Effect::Create { .. } | Effect::Reject { .. } => None,
                Effect::Dispatch { container, .. }
                | Effect::Pause { container }
                | Effect::Resume { container }
                | Effect::Remove { container } => self.key_of(container),
            };
            if let Some(key) = key {
                self.offers.mark(key);
            }
        }
    }

    /// A job its caller handed to `container` itself: counted as an arrival dispatched there.
    /// A caller that takes only the offers as last said never hands a job to a container that
    /// could not take it; were one to, the job is not counted (its end is then an unknown
    /// job's, ignored) rather than a decision taken on a container the caller already used.
    pub(super) fn on_taken(&mut self, job: Job, container: ContainerId, now: Time, fx: &mut Effects) {
        self.keep_alive.arrived(job.key, now);
        self.keys.entry(job.key).or_default().arrived(&job);
        let ours = self.containers.get(&container).is_some_and(|c| {
            c.owner == Owner::Key(job.key) && matches!(c.phase, Phase::Ready) && !c.retiring && !c.paused
        });
        debug_assert!(ours, "a job taken to {container:?}, which the core did not offer");
        if !ours {
            return;
        }
        self.dispatch(container, job.id, now, fx);
        self.settle(container, now);
    }
}
