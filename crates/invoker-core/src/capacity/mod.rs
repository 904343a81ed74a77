//! The decision core of one invoker group: seed 002's control loop (Fn's capacity manager),
//! pure and made safe. What the group has (its invokers and their states), what the predictor
//! wants (a target in MB) and the clock go in; what the control plane must do comes out, each
//! decision with its reason. It does no I/O and keeps no clock: the manager and the simulator
//! drive it alike.
//!
//! From the seed: a target above what the group has (or has asked for) reactivates the most
//! recently drained invokers first and provisions only what is still missing, `max_step` at
//! most at once; a target an invoker below what is active drains the most recently added; a
//! drained invoker is removed. What the seed left open, decided here:
//! - **Bounds.** Never more invokers than `max` (draining ones count: they still run), never
//!   fewer active ones than `min` (the target is clamped, and lost invokers are replaced).
//! - **No flapping.** An invoker is drained only when the target stayed below the active count
//!   for `scale_down_after`, and then down to the highest target of that stretch, not the last.
//! - **No work dropped.** An invoker is removed only once it reports nothing in flight, or at
//!   its `drain_deadline` (the seed killed at the deadline whatever it ran; so do we, since the
//!   scheduler ends what a removed invoker held with a record).
//! - **Lost invokers.** One the control plane or etcd lost is forgotten; if the group still
//!   needs it, the next tick provisions another. One asked for that never registers within
//!   `provision_timeout` is removed (the control plane may still hold it) and replaced.
//! - **Failing starts back off.** An invoker that is gone before it registered (it could not
//!   start) holds the group's provisioning for 1 s, then 2, 4, ... up to a minute while starts
//!   keep failing, instead of a start a tick; one that registers ends the back-off.

mod group;
pub mod packing;

pub use group::{BadSetting, ControlPlaneKind, GroupConfig};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// How often a scheduler reports its demand to the capacity manager, at most: the manager's
/// view of a burst is this old at worst, in the invoker and in the fleet simulator alike.
/// 200 ms, not 500: a call that waits for an invoker has a second before it counts as
/// delayed, half of it its container's start; at 500 ms the report's wait alone made most of
/// the quick plane's delayed calls (issue 61: 0.41 against 0.01 % of the 50-function
/// sample's calls, 0.39 against 0.13 % of the 200's), for a put in etcd at most five times a
/// second per scheduler, only while its demand changes.
pub const REPORT_EVERY: Duration = Duration::from_millis(200);

/// The group's bounds and pace (`[capacity.groups.<name>]`).
#[derive(Clone, Debug, PartialEq)]
pub struct GroupSpec {
    pub name: String,
    pub min: u32,
    pub max: u32,
    /// What one invoker offers.
    pub invoker_memory_mb: u64,
    /// Invokers asked for at once at most (Fn: 20).
    pub max_step: u32,
    /// How long the target must stay below the active count before an invoker is drained.
    pub scale_down_after: Duration,
    /// A draining invoker is removed at the latest this long after its drain began (Fn: 50 s).
    pub drain_deadline: Duration,
    /// An invoker asked for that has not registered this long after is given up.
    pub provision_timeout: Duration,
    /// Memory kept beyond any target above zero, so that a rise is served by invokers already
    /// up rather than waiting for new ones (a group at rest still goes down to `min`).
    pub headroom_mb: u64,
    /// How long an invoker's registration may still say what it said before a decision (two of
    /// its publish intervals): a report that it drained, from less than this after its drain
    /// began, is no proof (it may predate the drain); one that it takes no work, from less than
    /// this after it was reactivated, is the drain it has not unpublished yet. Zero where the
    /// reports are the truth at once (the simulator).
    pub settle: Duration,
    /// Which active invoker a shrinking group drains first.
    pub drain_order: DrainOrder,
}

/// The drain order of a group on a plane whose invokers take `lead` to come up: the least busy
/// first on a [`crate::predictor::quick`] plane; the newest first on a slow one, where the
/// newest invoker's calls finishing in place leave their memory free on the others for the
/// rises the plane cannot answer in time (on the fleet scenarios' 1 s plane the least busy
/// first saved nothing, 1.62× either way on 200 functions, and delayed 0.61 % of the calls
/// against 0.50 %), and on a plane that gives back only its newest invoker's memory
/// (`newest_only`).
pub fn drain_order(lead: Duration, newest_only: bool) -> DrainOrder {
    match crate::predictor::quick(lead) && !newest_only {
        true => DrainOrder::LeastBusy,
        false => DrainOrder::Newest,
    }
}

/// Which active invoker a shrinking group drains first (those that take no work always come
/// first). A draining invoker is paid for until its last call ends: on the fleet scenarios'
/// quick planes an eighth of the invoker-seconds went to drains (30,000 a day of 236,000 on
/// the 200-function sample), most of it the calls still running on the newest invoker, which
/// warm affinity keeps as busy as any other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainOrder {
    /// The one whose calls hold the least memory (as its registration last said), the newest
    /// among equals: it has the least to finish, so it goes soonest.
    #[default]
    LeastBusy,
    /// The newest (the highest ordinal): on a slow plane, and on one that gives back only its
    /// newest invoker's memory (a StatefulSet without standby pods), which gains nothing from
    /// draining another.
    Newest,
}

/// The hold (`scale_down_after`) of a group that sets none, on a control plane whose invokers
/// take `lead` to come up (a standby pod's resize where `standby`): a minute (Fn's) where that
/// takes a second or more, and every invoker given back too soon makes the calls of the next
/// rise wait for one; 2 s on a [`crate::predictor::quick`] plane, where an invoker asked for
/// comes while the call that asked still has its second, and holding one longer buys no call a
/// shorter wait; 5 s where the plane is quick only for its standby pods, and an invoker given
/// back past them is asked for again at a slow plane's pace.
///
/// Judged on halves of the shipped samples (functions split by a hash of their names, `invoker
/// simulate --half`; BENCHMARKS.md, issue 79's section): on the local plane (200 ms) 2 s is the
/// longest hold whose cost is within 1.4× the continuous memory floor on half a of the 200
/// functions (1 s 1.36×, 2 s 1.39×, 3 s 1.42×, 5 s 1.48×, each with 0.06 to 0.08 % of the calls
/// delayed over a second); on half b it is 1.36× against 5 s's 1.42× (0.03 and 0.02 %), for 3 %
/// more cold starts. With two standby pods 2 s delayed 2.83 % of the 50 functions' half a
/// (5 s: 0.01 %): there the hold stays 5 s.
pub fn default_hold(lead: Duration, standby: bool) -> Duration {
    match (crate::predictor::quick(lead), standby) {
        (true, false) => Duration::from_secs(2),
        (true, true) => Duration::from_secs(5),
        (false, _) => Duration::from_secs(60),
    }
}

impl GroupConfig {
    /// The group as the core decides for it, under `name`, on a control plane whose invokers
    /// take `lead` to come up (a standby pod's resize where `standby`).
    pub fn spec(&self, name: &str, lead: Duration, standby: bool) -> GroupSpec {
        GroupSpec {
            name: name.to_string(),
            min: self.min,
            max: self.max,
            invoker_memory_mb: self.invoker_memory_mb,
            max_step: self.max_step,
            scale_down_after: self.scale_down_after.unwrap_or_else(|| default_hold(lead, standby)),
            drain_deadline: self.drain_deadline,
            provision_timeout: self.provision_timeout,
            headroom_mb: self.headroom_mb,
            settle: Duration::ZERO,
            drain_order: drain_order(lead, false),
        }
    }
}

/// An invoker of the group, as the core sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Asked for at `since`, not registered yet.
    Provisioning { since: Duration },
    /// Registered, and placed on.
    Active,
    /// Being drained (no new work): removed once idle, or at `deadline`.
    Draining { since: Duration, deadline: Duration },
    /// Asked to stop; still running (it counts against `max`, and its name is not reused)
    /// until the control plane says it is gone.
    Removing,
}

/// What the manager sees of one member in a round: its registration, what the control plane
/// says of its process, and whether its removal finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sighting {
    /// It has a registration (with headroom or not yet).
    pub registered: bool,
    /// The control plane: `Some(true)` it runs, `Some(false)` it exited, `None` unknown.
    pub running: Option<bool>,
    /// The control plane finished stopping it.
    pub stopped: bool,
}

impl MemberState {
    /// Whether a member in this state, seen so, is gone (to be forgotten): one being removed
    /// once stopped and out of etcd (killed: its lease goes in a TTL); one asked for once its
    /// process exited before it registered; a serving or draining one once it is out of etcd
    /// and the control plane does not say it runs (a registration lost while the process runs
    /// is a partition, not a death).
    pub fn gone_when(&self, seen: Sighting) -> bool {
        match self {
            MemberState::Removing => seen.stopped && !seen.registered,
            MemberState::Provisioning { .. } => seen.running == Some(false),
            MemberState::Active | MemberState::Draining { .. } => !seen.registered && seen.running != Some(true),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    /// Its place in the group's order: invokers are named `<group>-<ordinal>`, the lowest
    /// free ordinal first (as a StatefulSet names its pods), and the highest is drained first.
    pub ordinal: u32,
    pub state: MemberState,
    /// An active invoker that does not take work (unhealthy, or drained by an operator) is no
    /// capacity: the group grows past it, and it is the first drained when it shrinks.
    pub serving: bool,
    /// When it was last reactivated (its reports settle for [`GroupSpec::settle`] after).
    pub reactivated_at: Option<Duration>,
    /// The memory its calls hold, as its registration last said ([`Event::Busy`]).
    pub busy_mb: u64,
}

/// What the core learns.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A decision round: the predictor's target for the group.
    Tick { target_mb: u64 },
    /// An invoker of the group registered (came up). One the core did not ask for (a restarted
    /// manager finding what runs) is adopted as active.
    Up { id: String },
    /// The control plane runs an invoker that has not registered (yet): one a manager before
    /// this one asked for. It is counted as being provisioned, so it is not asked for again.
    Starting { id: String },
    /// Whether an active invoker takes work, as its registration last said (within
    /// [`GroupSpec::settle`] of its reactivation, "no" is taken for the drain not yet unpublished).
    Serving { id: String, serving: bool },
    /// The memory an active invoker's calls hold (running and starting containers), as its
    /// registration last said: [`DrainOrder::LeastBusy`] drains the least busy first.
    Busy { id: String, busy_mb: u64 },
    /// A draining invoker's registration says it has drained: nothing in flight. Taken only from
    /// [`GroupSpec::settle`] after its drain began (a report from before the drain is no proof).
    Drained { id: String },
    /// An invoker is gone: the control plane or etcd lost it, or one being removed stopped. It
    /// is forgotten.
    Gone { id: String },
}

/// What the control plane must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start these invokers (the core named them).
    Provision { ids: Vec<String> },
    /// Stop placing on it; it finishes what it holds.
    Drain { id: String },
    /// Take a draining invoker back into service.
    Reactivate { id: String },
    /// Stop it (it is forgotten once [`Event::Gone`]).
    Remove { id: String },
}

/// An action and why it was taken (shown by `GET /v1/capacity`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    pub reason: String,
}

/// The group's counts, as `GET /v1/capacity` and the metrics show them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GroupCounts {
    pub provisioning: u32,
    pub active: u32,
    pub draining: u32,
    pub removing: u32,
}

impl GroupCounts {
    /// Every invoker that runs or may: what `max` bounds.
    pub fn total(&self) -> u32 {
        self.provisioning + self.active + self.draining + self.removing
    }
}

#[derive(Clone)]
pub struct GroupCore {
    spec: GroupSpec,
    members: BTreeMap<String, Member>,
    /// When the target first fell below the active count, and the highest target since.
    low: Option<(Duration, u32)>,
    /// The last target, in invokers.
    target: u32,
    /// Starts that failed in a row, and no provisioning before this.
    failures: u32,
    hold_until: Duration,
}

/// The longest a group's provisioning is held after failed starts.
const MAX_HOLD: Duration = Duration::from_secs(60);

impl GroupCore {
    pub fn new(spec: GroupSpec) -> Self {
        let target = spec.min;
        GroupCore { spec, members: BTreeMap::new(), low: None, target, failures: 0, hold_until: Duration::ZERO }
    }

    pub fn spec(&self) -> &GroupSpec {
        &self.spec
    }

    /// The hold from now on (its plane measured quicker or slower than it was counted; see
    /// [`default_hold`]). A low already seen keeps its start: it drains at its new end.
    pub fn set_scale_down_after(&mut self, hold: Duration) {
        self.spec.scale_down_after = hold;
    }

    /// The drain order from now on (its plane measured quicker or slower: [`drain_order`]).
    pub fn set_drain_order(&mut self, order: DrainOrder) {
        self.spec.drain_order = order;
    }

    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// The last target, in invokers (within `min` and `max`).
    pub fn target(&self) -> u32 {
        self.target
    }

    pub fn counts(&self) -> GroupCounts {
        let mut counts = GroupCounts::default();
        for m in self.members.values() {
            match m.state {
                MemberState::Provisioning { .. } => counts.provisioning += 1,
                MemberState::Active => counts.active += 1,
                MemberState::Draining { .. } => counts.draining += 1,
                MemberState::Removing => counts.removing += 1,
            }
        }
        counts
    }

    /// What the group has or has asked for: its active invokers that take work, and those
    /// being provisioned.
    pub fn have(&self) -> u32 {
        let taking = |m: &&Member| match m.state {
            MemberState::Active => m.serving,
            MemberState::Provisioning { .. } => true,
            _ => false,
        };
        self.members.values().filter(taking).count() as u32
    }

    /// Invokers for `target_mb` and the headroom beside it, within the group's bounds.
    pub fn invokers_for(&self, target_mb: u64) -> u32 {
        let target_mb = if target_mb == 0 { 0 } else { target_mb.saturating_add(self.spec.headroom_mb) };
        let per = self.spec.invoker_memory_mb.max(1);
        let wanted = u32::try_from(target_mb.div_ceil(per)).unwrap_or(u32::MAX);
        wanted.clamp(self.spec.min, self.spec.max)
    }

    pub fn handle(&mut self, event: Event, now: Duration) -> Vec<Decision> {
        let mut out = Vec::new();
        match event {
            Event::Tick { target_mb } => self.tick(target_mb, now, &mut out),
            Event::Up { id } => self.up(id),
            Event::Starting { id } => {
                if !self.members.contains_key(&id) {
                    let ordinal = self.ordinal_of(&id).unwrap_or_else(|| self.free_ordinals(1)[0]);
                    let state = MemberState::Provisioning { since: now };
                    self.members.insert(
                        id.clone(),
                        Member { id, ordinal, state, serving: true, reactivated_at: None, busy_mb: 0 },
                    );
                }
            }
            Event::Serving { id, serving } => {
                let settle = self.spec.settle;
                if let Some(m) = self.members.get_mut(&id).filter(|m| m.state == MemberState::Active) {
                    let settling = m.reactivated_at.is_some_and(|at| now < at + settle);
                    m.serving = serving || settling;
                }
            }
            Event::Busy { id, busy_mb } => {
                if let Some(m) = self.members.get_mut(&id).filter(|m| m.state == MemberState::Active) {
                    m.busy_mb = busy_mb;
                }
            }
            Event::Drained { id } => {
                let settled = |m: &&mut Member| match m.state {
                    MemberState::Draining { since, .. } => now >= since + self.spec.settle,
                    _ => false,
                };
                if let Some(m) = self.members.get_mut(&id).filter(settled) {
                    m.state = MemberState::Removing;
                    out.push(Decision { action: Action::Remove { id }, reason: "drained: nothing in flight".into() });
                }
            }
            Event::Gone { id } => {
                if let Some(MemberState::Provisioning { .. }) = self.members.remove(&id).map(|m| m.state) {
                    self.failed_start(now);
                }
            }
        }
        out
    }

    /// Holds provisioning for twice as long as the last time, from 1 s up to [`MAX_HOLD`].
    fn failed_start(&mut self, now: Duration) {
        self.failures += 1;
        let hold = Duration::from_secs(1 << (self.failures - 1).min(6)).min(MAX_HOLD);
        self.hold_until = now + hold;
    }

    /// Until when provisioning is held after failed starts (the past when it is not).
    pub fn held_until(&self) -> Duration {
        self.hold_until
    }

    fn up(&mut self, id: String) {
        match self.members.get_mut(&id) {
            Some(m) => {
                if matches!(m.state, MemberState::Provisioning { .. }) {
                    m.state = MemberState::Active;
                    self.failures = 0;
                }
            }
            None => {
                let ordinal = self.ordinal_of(&id).unwrap_or_else(|| self.free_ordinals(1)[0]);
                self.members.insert(
                    id.clone(),
                    Member { id, ordinal, state: MemberState::Active, serving: true, reactivated_at: None, busy_mb: 0 },
                );
            }
        }
    }

    fn tick(&mut self, target_mb: u64, now: Duration, out: &mut Vec<Decision>) {
        self.give_up_late_provisions(now, out);
        let target = self.invokers_for(target_mb);
        self.target = target;
        let counts = self.counts();
        let have = self.have();
        if target > have {
            self.low = None;
            self.grow(target, have, target_mb, now, out);
        } else if target < counts.active {
            let (since, highest) = *self.low.get_or_insert((now, target));
            let highest = highest.max(target);
            self.low = Some((since, highest));
            if now.saturating_sub(since) >= self.spec.scale_down_after {
                let keep = highest.max(self.spec.min);
                self.shrink(keep, counts.active, now, out);
                self.low = None;
            }
        } else {
            self.low = None;
        }
        self.remove_overdue(now, out);
    }

    /// Reactivates the most recently drained first, then provisions what is still missing.
    fn grow(&mut self, target: u32, mut have: u32, target_mb: u64, now: Duration, out: &mut Vec<Decision>) {
        let mut draining: Vec<&Member> =
            self.members.values().filter(|m| matches!(m.state, MemberState::Draining { .. })).collect();
        draining.sort_by_key(|m| match m.state {
            MemberState::Draining { since, .. } => (std::cmp::Reverse(since), std::cmp::Reverse(m.ordinal)),
            _ => unreachable!(),
        });
        let back: Vec<String> = draining.iter().take((target - have) as usize).map(|m| m.id.clone()).collect();
        for id in back {
            let m = self.members.get_mut(&id).expect("a member");
            m.state = MemberState::Active;
            m.serving = true;
            m.reactivated_at = Some(now);
            let reason = format!(
                "target {target} invokers ({target_mb} MB) above the {have} it had: the most recently drained first"
            );
            have += 1;
            out.push(Decision { action: Action::Reactivate { id }, reason });
        }
        let room = self.spec.max.saturating_sub(self.counts().total());
        let n = (target - have).min(self.spec.max_step).min(room);
        if n == 0 || now < self.hold_until {
            return;
        }
        let ids: Vec<String> =
            self.free_ordinals(n as usize).into_iter().map(|o| format!("{}-{o}", self.spec.name)).collect();
        for id in &ids {
            let ordinal = self.ordinal_of(id).expect("named by the core");
            let state = MemberState::Provisioning { since: now };
            self.members.insert(
                id.clone(),
                Member { id: id.clone(), ordinal, state, serving: true, reactivated_at: None, busy_mb: 0 },
            );
        }
        let reason = format!(
            "target {target} invokers ({target_mb} MB) above the {have} it has{}",
            if target - have > n { format!("; {n} at once at most") } else { String::new() }
        );
        out.push(Decision { action: Action::Provision { ids }, reason });
    }

    /// Drains active invokers down to `keep`, in the group's [`DrainOrder`].
    fn shrink(&mut self, keep: u32, active: u32, now: Duration, out: &mut Vec<Decision>) {
        // Those that take no work first, then the least busy (or none: the order's) and the
        // most recently added among equals.
        let busy = |m: &Member| match self.spec.drain_order {
            DrainOrder::LeastBusy => m.busy_mb,
            DrainOrder::Newest => 0,
        };
        let mut candidates: Vec<(bool, u64, std::cmp::Reverse<u32>, String)> = self
            .members
            .values()
            .filter(|m| m.state == MemberState::Active)
            .map(|m| (m.serving, busy(m), std::cmp::Reverse(m.ordinal), m.id.clone()))
            .collect();
        candidates.sort_unstable();
        let deadline = now + self.spec.drain_deadline;
        for (_, _, _, id) in candidates.into_iter().take(active.saturating_sub(keep) as usize) {
            self.members.get_mut(&id).expect("a member").state = MemberState::Draining { since: now, deadline };
            let reason = format!(
                "the target stayed at {keep} invokers or below for {:?}, under the {active} active",
                self.spec.scale_down_after
            );
            out.push(Decision { action: Action::Drain { id }, reason });
        }
    }

    /// Removes the draining invokers past their deadline (those that drained went at once).
    fn remove_overdue(&mut self, now: Duration, out: &mut Vec<Decision>) {
        let overdue: Vec<String> = self
            .members
            .values()
            .filter(|m| matches!(m.state, MemberState::Draining { deadline, .. } if now >= deadline))
            .map(|m| m.id.clone())
            .collect();
        for id in overdue {
            self.members.get_mut(&id).expect("a member").state = MemberState::Removing;
            let reason = format!("not drained by its drain deadline ({:?})", self.spec.drain_deadline);
            out.push(Decision { action: Action::Remove { id }, reason });
        }
    }

    fn give_up_late_provisions(&mut self, now: Duration, out: &mut Vec<Decision>) {
        let late: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                matches!(m.state, MemberState::Provisioning { since }
                    if now.saturating_sub(since) >= self.spec.provision_timeout)
            })
            .map(|m| m.id.clone())
            .collect();
        for id in late {
            self.failed_start(now);
            self.members.get_mut(&id).expect("a member").state = MemberState::Removing;
            let reason = format!("not registered {:?} after it was asked for", self.spec.provision_timeout);
            out.push(Decision { action: Action::Remove { id }, reason });
        }
    }

    fn ordinal_of(&self, id: &str) -> Option<u32> {
        ordinal_in(&self.spec.name, id)
    }

    fn free_ordinals(&self, n: usize) -> Vec<u32> {
        let used: std::collections::BTreeSet<u32> = self.members.values().map(|m| m.ordinal).collect();
        (0..).filter(|o| !used.contains(o)).take(n).collect()
    }
}

/// The ordinal of invoker `id` in group `group` (`<group>-<n>` → n); `None`: not one of its.
pub fn ordinal_in(group: &str, id: &str) -> Option<u32> {
    id.strip_prefix(group)?.strip_prefix('-')?.parse().ok()
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Provision { ids } => write!(f, "provision {}", ids.join(", ")),
            Action::Drain { id } => write!(f, "drain {id}"),
            Action::Reactivate { id } => write!(f, "reactivate {id}"),
            Action::Remove { id } => write!(f, "remove {id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MB: u64 = 1024;

    fn spec() -> GroupSpec {
        GroupSpec {
            name: "g".into(),
            min: 1,
            max: 50,
            invoker_memory_mb: MB,
            max_step: 20,
            scale_down_after: Duration::from_secs(60),
            drain_deadline: Duration::from_secs(50),
            provision_timeout: Duration::from_secs(30),
            headroom_mb: 0,
            settle: Duration::ZERO,
            drain_order: DrainOrder::LeastBusy,
        }
    }

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// A group that sets no hold gets its plane's: 2 s where invokers come within half a
    /// second, 5 s where only standby pods do, a minute where they take longer; one it sets is
    /// kept on any plane.
    #[test]
    fn a_group_without_a_hold_gets_its_planes() {
        let unset = GroupConfig::default();
        assert_eq!(unset.spec("g", Duration::from_millis(200), false).scale_down_after, s(2));
        assert_eq!(unset.spec("g", Duration::from_millis(300), true).scale_down_after, s(5));
        assert_eq!(unset.spec("g", Duration::from_secs(1), false).scale_down_after, s(60));
        assert_eq!(unset.spec("g", s(10), true).scale_down_after, s(60));
        let set = GroupConfig { scale_down_after: Some(s(30)), ..GroupConfig::default() };
        assert_eq!(set.spec("g", Duration::from_millis(200), false).scale_down_after, s(30));
        assert_eq!(set.spec("g", s(10), false).scale_down_after, s(30));
    }

    /// Every state against every sighting: what runs and is registered is never forgotten; one
    /// being removed only once stopped and unregistered; one asked for only once it exited.
    #[test]
    fn who_is_gone_every_state_against_every_sighting() {
        let states = [
            MemberState::Provisioning { since: s(1) },
            MemberState::Active,
            MemberState::Draining { since: s(1), deadline: s(9) },
            MemberState::Removing,
        ];
        for state in states {
            for registered in [false, true] {
                for running in [None, Some(false), Some(true)] {
                    for stopped in [false, true] {
                        let gone = state.gone_when(Sighting { registered, running, stopped });
                        if registered && running == Some(true) {
                            assert!(!gone, "{state:?} registered and running is not gone");
                        }
                        match state {
                            MemberState::Removing => assert_eq!(gone, stopped && !registered, "{state:?}"),
                            MemberState::Provisioning { .. } => assert_eq!(gone, running == Some(false)),
                            _ => assert_eq!(gone, !registered && running != Some(true), "{state:?}"),
                        }
                    }
                }
            }
        }
    }

    /// Reports lag decisions by `settle`: a drained report from before it is not taken, nor a
    /// "takes no work" from a reactivated invoker that has not unpublished its drain yet.
    #[test]
    fn reports_within_settle_of_a_decision_are_not_taken() {
        let mut g = GroupCore::new(GroupSpec { min: 1, max: 2, settle: s(1), scale_down_after: s(0), ..spec() });
        let d = g.handle(Event::Tick { target_mb: 2 * MB }, s(0));
        let ids: Vec<String> = match &d[0].action {
            Action::Provision { ids } => ids.clone(),
            other => panic!("{other:?}"),
        };
        for id in &ids {
            g.handle(Event::Up { id: id.clone() }, s(1));
        }
        let drained = g.handle(Event::Tick { target_mb: 0 }, s(2));
        let Action::Drain { id } = &drained[0].action else { panic!("{drained:?}") };
        let id = id.clone();
        assert!(g.handle(Event::Drained { id: id.clone() }, s(2) + Duration::from_millis(500)).is_empty(), "too soon");
        // Reactivated before it was trusted drained: its old "no work" is the drain's.
        let back = g.handle(Event::Tick { target_mb: 2 * MB }, s(2) + Duration::from_millis(600));
        assert!(matches!(&back[0].action, Action::Reactivate { id: back_id } if *back_id == id), "{back:?}");
        g.handle(Event::Serving { id: id.clone(), serving: false }, s(3));
        assert_eq!(g.have(), 2, "settling: still counted as taking work");
        g.handle(Event::Serving { id: id.clone(), serving: false }, s(4));
        assert_eq!(g.have(), 1, "past settle, a report that it takes no work is taken");
        // A drained report from after settle is taken.
        let mut g = GroupCore::new(GroupSpec { min: 1, max: 2, settle: s(1), scale_down_after: s(0), ..spec() });
        for id in &ids {
            g.handle(Event::Up { id: id.clone() }, s(0));
        }
        let drained = g.handle(Event::Tick { target_mb: 0 }, s(1));
        let Action::Drain { id } = &drained[0].action else { panic!("{drained:?}") };
        let removed = g.handle(Event::Drained { id: id.clone() }, s(2));
        assert!(matches!(&removed[0].action, Action::Remove { .. }), "{removed:?}");
    }

    fn provisioned(decisions: &[Decision]) -> Vec<String> {
        decisions
            .iter()
            .flat_map(|d| match &d.action {
                Action::Provision { ids } => ids.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    fn actions(decisions: &[Decision]) -> Vec<Action> {
        decisions.iter().map(|d| d.action.clone()).collect()
    }

    /// A group with `n` active invokers, `g-0` to `g-{n-1}`.
    fn group_of(n: u32) -> GroupCore {
        let mut g = GroupCore::new(spec());
        let ids = provisioned(&g.handle(Event::Tick { target_mb: u64::from(n) * MB }, s(0)));
        assert_eq!(ids.len() as u32, n);
        for id in ids {
            g.handle(Event::Up { id }, s(1));
        }
        g
    }

    #[test]
    fn headroom_adds_invokers_beside_a_target_and_none_at_rest() {
        let mut g = GroupCore::new(GroupSpec { min: 0, headroom_mb: MB / 2, ..spec() });
        assert!(provisioned(&g.handle(Event::Tick { target_mb: 0 }, s(0))).is_empty(), "at rest: min");
        // 1.5 invokers' worth of demand and half an invoker beside it: two.
        let ids = provisioned(&g.handle(Event::Tick { target_mb: MB + MB / 2 }, s(1)));
        assert_eq!(ids, ["g-0", "g-1"]);
        let ids = provisioned(&g.handle(Event::Tick { target_mb: 2 * MB }, s(2)));
        assert_eq!(ids, ["g-2"], "a full two: a third for the headroom");
        assert_eq!(g.invokers_for(0), 0);
    }

    #[test]
    fn a_burst_is_answered_in_one_tick_within_max_step() {
        let mut g = group_of(1);
        let ids = provisioned(&g.handle(Event::Tick { target_mb: 10 * MB }, s(2)));
        assert_eq!(ids, (1..10).map(|o| format!("g-{o}")).collect::<Vec<_>>(), "nine more at once");
        let ids = provisioned(&g.handle(Event::Tick { target_mb: 60 * MB }, s(3)));
        assert_eq!(ids.len(), 20, "20 at once at most");
        let ids = provisioned(&g.handle(Event::Tick { target_mb: 60 * MB }, s(4)));
        assert_eq!(ids.len(), 20, "never past max: 10 + 20 + 20 = 50");
        assert!(provisioned(&g.handle(Event::Tick { target_mb: 60 * MB }, s(5))).is_empty());
        assert_eq!(g.counts().total(), 50);
        assert_eq!(g.target(), 50);
    }

    #[test]
    fn the_most_recently_added_is_drained_after_scale_down_after_and_only_to_the_stretchs_peak() {
        let mut g = group_of(6);
        assert!(g.handle(Event::Tick { target_mb: 2 * MB }, s(10)).is_empty());
        assert!(g.handle(Event::Tick { target_mb: 4 * MB }, s(40)).is_empty(), "a bump in the stretch");
        assert!(g.handle(Event::Tick { target_mb: 2 * MB }, s(69)).is_empty(), "not yet 60 s");
        let drained = actions(&g.handle(Event::Tick { target_mb: 2 * MB }, s(70)));
        let expected: Vec<Action> = ["g-5", "g-4"].iter().map(|id| Action::Drain { id: id.to_string() }).collect();
        assert_eq!(drained, expected, "down to 4, the stretch's peak, the highest ordinals first");
        assert_eq!(g.counts(), GroupCounts { provisioning: 0, active: 4, draining: 2, removing: 0 });
    }

    #[test]
    fn a_draining_invoker_is_removed_when_idle_or_at_its_deadline() {
        let mut g = group_of(3);
        assert!(g.handle(Event::Drained { id: "g-2".into() }, s(5)).is_empty(), "not draining: nothing to do");
        g.handle(Event::Tick { target_mb: MB }, s(10));
        let drained = actions(&g.handle(Event::Tick { target_mb: MB }, s(70)));
        assert_eq!(drained.len(), 2, "{drained:?}");
        let removed = actions(&g.handle(Event::Drained { id: "g-2".into() }, s(80)));
        assert_eq!(removed, vec![Action::Remove { id: "g-2".into() }]);
        assert!(g.handle(Event::Tick { target_mb: MB }, s(119)).is_empty(), "g-1 still busy, before its deadline");
        let removed = actions(&g.handle(Event::Tick { target_mb: MB }, s(120)));
        assert_eq!(removed, vec![Action::Remove { id: "g-1".into() }], "at its deadline");
        assert_eq!(g.counts(), GroupCounts { provisioning: 0, active: 1, draining: 0, removing: 2 });
        g.handle(Event::Up { id: "g-1".into() }, s(121));
        assert_eq!(g.counts().removing, 2, "still registered while it stops: not taken back");
        for id in ["g-1", "g-2"] {
            g.handle(Event::Gone { id: id.into() }, s(125));
        }
        assert_eq!(g.counts(), GroupCounts { provisioning: 0, active: 1, draining: 0, removing: 0 });
    }

    #[test]
    fn the_most_recently_drained_is_reactivated_before_anything_is_provisioned() {
        let mut g = group_of(4);
        g.spec.drain_deadline = Duration::from_secs(300);
        g.handle(Event::Tick { target_mb: 3 * MB }, s(10));
        assert_eq!(
            actions(&g.handle(Event::Tick { target_mb: 3 * MB }, s(70))),
            vec![Action::Drain { id: "g-3".into() }]
        );
        g.handle(Event::Tick { target_mb: 2 * MB }, s(71));
        assert_eq!(
            actions(&g.handle(Event::Tick { target_mb: 2 * MB }, s(131))),
            vec![Action::Drain { id: "g-2".into() }]
        );
        let back = actions(&g.handle(Event::Tick { target_mb: 5 * MB }, s(132)));
        assert_eq!(
            back,
            vec![
                Action::Reactivate { id: "g-2".into() },
                Action::Reactivate { id: "g-3".into() },
                Action::Provision { ids: vec!["g-4".into()] }
            ]
        );
    }

    #[test]
    fn a_lost_invoker_is_replaced_and_a_late_one_given_up() {
        let mut g = group_of(2);
        g.handle(Event::Gone { id: "g-0".into() }, s(5));
        assert_eq!(provisioned(&g.handle(Event::Tick { target_mb: 2 * MB }, s(6))), vec!["g-0".to_string()]);
        // It never registers: given up after provision_timeout, and another asked for (not
        // under its name while it may still run).
        assert!(g.handle(Event::Tick { target_mb: 2 * MB }, s(35)).is_empty());
        let d = actions(&g.handle(Event::Tick { target_mb: 2 * MB }, s(36)));
        assert_eq!(d, vec![Action::Remove { id: "g-0".into() }], "a failed start: held a second");
        let d = actions(&g.handle(Event::Tick { target_mb: 2 * MB }, s(37)));
        assert_eq!(d, vec![Action::Provision { ids: vec!["g-2".into()] }]);
    }

    #[test]
    fn an_invoker_that_takes_no_work_is_no_capacity_and_the_first_drained() {
        let mut g = group_of(3);
        g.handle(Event::Serving { id: "g-0".into(), serving: false }, s(2));
        let ids = provisioned(&g.handle(Event::Tick { target_mb: 3 * MB }, s(3)));
        assert_eq!(ids, vec!["g-3".to_string()], "two serve: one more");
        g.handle(Event::Up { id: "g-3".into() }, s(4));
        assert!(g.handle(Event::Tick { target_mb: 3 * MB }, s(5)).is_empty());
        let drained = actions(&g.handle(Event::Tick { target_mb: 3 * MB }, s(65)));
        assert_eq!(drained, vec![Action::Drain { id: "g-0".into() }], "the one that takes no work, not g-3");
    }

    #[test]
    fn a_quick_plane_drains_the_least_busy_and_a_slow_or_newest_only_one_the_newest() {
        assert_eq!(drain_order(Duration::from_millis(200), false), DrainOrder::LeastBusy);
        assert_eq!(drain_order(Duration::from_millis(200), true), DrainOrder::Newest);
        assert_eq!(drain_order(Duration::from_secs(1), false), DrainOrder::Newest);
        let quick = GroupConfig::default().spec("g", Duration::from_millis(200), false);
        assert_eq!(quick.drain_order, DrainOrder::LeastBusy);
    }

    #[test]
    fn the_least_busy_is_drained_first_unless_the_plane_gives_back_only_the_newest() {
        for (order, expected) in [(DrainOrder::LeastBusy, ["g-3", "g-1"]), (DrainOrder::Newest, ["g-4", "g-3"])] {
            let mut g = group_of(5);
            g.spec.drain_order = order;
            for (id, busy_mb) in [("g-0", 300), ("g-1", 0), ("g-2", 512), ("g-3", 0), ("g-4", 700)] {
                g.handle(Event::Busy { id: id.into(), busy_mb }, s(2));
            }
            assert!(g.handle(Event::Tick { target_mb: 3 * MB }, s(3)).is_empty());
            let drained = actions(&g.handle(Event::Tick { target_mb: 3 * MB }, s(63)));
            let expected: Vec<Action> = expected.iter().map(|id| Action::Drain { id: id.to_string() }).collect();
            assert_eq!(drained, expected, "{order:?}: the idle ones, the newest of them first");
        }
    }

    #[test]
    fn starts_that_fail_back_off_and_one_that_comes_up_ends_it() {
        let mut g = GroupCore::new(spec());
        let asked = |g: &mut GroupCore, at: u64| provisioned(&g.handle(Event::Tick { target_mb: MB }, s(at)));
        let mut at = 0;
        let mut holds = Vec::new();
        for _ in 0..8 {
            let ids = asked(&mut g, at);
            assert_eq!(ids.len(), 1, "at {at}");
            g.handle(Event::Gone { id: ids[0].clone() }, s(at));
            let next = (at..at + 100).find(|t| !asked(&mut g.clone(), *t).is_empty()).unwrap();
            holds.push(next - at);
            at = next;
        }
        assert_eq!(holds, vec![1, 2, 4, 8, 16, 32, 60, 60], "doubling, a minute at most");
        let ids = asked(&mut g, at);
        g.handle(Event::Up { id: ids[0].clone() }, s(at));
        g.handle(Event::Gone { id: ids[0].clone() }, s(at + 1));
        assert_eq!(asked(&mut g, at + 1).len(), 1, "lost after it came up: replaced at once");
    }

    #[test]
    fn a_restarted_manager_adopts_what_runs() {
        let mut g = GroupCore::new(spec());
        for id in ["g-0", "g-3", "other"] {
            g.handle(Event::Up { id: id.into() }, s(0));
        }
        assert_eq!(g.counts().active, 3);
        let ids = provisioned(&g.handle(Event::Tick { target_mb: 5 * MB }, s(1)));
        assert_eq!(ids, vec!["g-2".to_string(), "g-4".to_string()], "the free ordinals ('other' took 1)");
        g.handle(Event::Starting { id: "g-5".into() }, s(2));
        assert_eq!(g.counts(), GroupCounts { provisioning: 3, active: 3, draining: 0, removing: 0 });
        assert!(provisioned(&g.handle(Event::Tick { target_mb: 6 * MB }, s(3))).is_empty(), "g-5 counts");
    }

    #[test]
    fn constant_demand_decides_nothing_after_the_fleet_is_up() {
        let mut g = group_of(1);
        let mut decisions = Vec::new();
        for t in 0..2000u64 {
            let now = Duration::from_millis(2000 + t * 500);
            for d in g.handle(Event::Tick { target_mb: 7 * MB + 100 }, now) {
                if let Action::Provision { ids } = &d.action {
                    for id in ids {
                        g.handle(Event::Up { id: id.clone() }, now);
                    }
                }
                decisions.push(d);
            }
        }
        assert_eq!(actions(&decisions), vec![Action::Provision { ids: (1..8).map(|o| format!("g-{o}")).collect() }]);
    }

    #[derive(Clone, Debug)]
    enum Step {
        Tick(u64),
        Up(usize),
        Drained(usize),
        Serving(usize, bool),
        Busy(usize, u64),
        Gone(usize),
    }

    fn step() -> impl Strategy<Value = (Step, u64)> {
        let step = prop_oneof![
            4 => (0u64..80 * MB).prop_map(Step::Tick),
            // Low targets too, so that groups shrink.
            2 => (0u64..4 * MB).prop_map(Step::Tick),
            3 => any::<prop::sample::Index>().prop_map(|i| Step::Up(i.index(1 << 16))),
            2 => any::<prop::sample::Index>().prop_map(|i| Step::Drained(i.index(1 << 16))),
            1 => any::<prop::sample::Index>().prop_map(|i| Step::Gone(i.index(1 << 16))),
            1 => (any::<prop::sample::Index>(), any::<bool>()).prop_map(|(i, b)| Step::Serving(i.index(1 << 16), b)),
            2 => (any::<prop::sample::Index>(), 0u64..2 * MB).prop_map(|(i, mb)| Step::Busy(i.index(1 << 16), mb)),
        ];
        (step, 0u64..20_000)
    }

    proptest! {
        #[test]
        fn bounds_drains_and_removals_hold_whatever_happens(
            min in 0u32..4, extra in 0u32..12, max_step in 1u32..6, settle_ms in prop_oneof![Just(0u64), 1u64..3_000],
            steps in prop::collection::vec(step(), 1..300),
        ) {
            let settle = Duration::from_millis(settle_ms);
            let spec = GroupSpec { min, max: min + extra.max(1), max_step, settle, ..spec() };
            let mut g = GroupCore::new(spec.clone());
            let mut now = Duration::ZERO;
            for (step, dt_ms) in steps {
                now += Duration::from_millis(dt_ms);
                let before: BTreeMap<String, Member> = g.members.clone();
                let pick = |i: usize| {
                    let ids: Vec<&String> = before.keys().collect();
                    (!ids.is_empty()).then(|| ids[i % ids.len()].clone())
                };
                let event = match step {
                    Step::Tick(target_mb) => Event::Tick { target_mb },
                    // Only invokers the core asked for come up (adoption is its own test).
                    Step::Up(i) => match pick(i) { Some(id) => Event::Up { id }, None => continue },
                    Step::Drained(i) => match pick(i) { Some(id) => Event::Drained { id }, None => continue },
                    Step::Gone(i) => match pick(i) { Some(id) => Event::Gone { id }, None => continue },
                    Step::Serving(i, serving) => match pick(i) { Some(id) => Event::Serving { id, serving }, None => continue },
                    Step::Busy(i, busy_mb) => match pick(i) { Some(id) => Event::Busy { id, busy_mb }, None => continue },
                };
                let is_tick = matches!(event, Event::Tick { .. });
                let reported_drained = match &event { Event::Drained { id } => Some(id.clone()), _ => None };
                let decisions = g.handle(event, now);
                let counts = g.counts();
                prop_assert!(counts.total() <= spec.max, "above max: {counts:?}");
                let mut drained = 0;
                let mut provisioned = 0;
                for d in &decisions {
                    match &d.action {
                        Action::Remove { id } => {
                            let m = &before[id];
                            let ok = match m.state {
                                MemberState::Draining { deadline, .. } => reported_drained.as_ref() == Some(id) || now >= deadline,
                                MemberState::Provisioning { since } => now.saturating_sub(since) >= spec.provision_timeout,
                                MemberState::Active | MemberState::Removing => false,
                            };
                            prop_assert!(ok, "removed with work in flight before its deadline: {m:?}");
                        }
                        Action::Drain { id } => {
                            drained += 1;
                            // Never one busier than an invoker kept that serves as it does.
                            let m = &before[id];
                            let kept = g.members().filter(|k| k.state == MemberState::Active && k.serving == m.serving);
                            for k in kept {
                                prop_assert!(m.busy_mb <= k.busy_mb, "drained {m:?} before the less busy {k:?}");
                            }
                        }
                        Action::Provision { ids } => {
                            provisioned += ids.len() as u32;
                            prop_assert!(ids.len() as u32 <= spec.max_step);
                        }
                        Action::Reactivate { .. } => {}
                    }
                }
                if provisioned > 0 {
                    prop_assert_eq!(counts.draining, 0, "provisioned while an invoker was draining");
                }
                prop_assert!(drained == 0 || provisioned == 0, "drained and provisioned at once");
                if drained > 0 {
                    prop_assert!(counts.active >= spec.min, "drained below min");
                }
                if is_tick {
                    let have = counts.active + counts.provisioning;
                    // Short of min only while it asks for max_step, while stopping ones fill max,
                    // or while failed starts hold provisioning.
                    prop_assert!(
                        have >= spec.min
                            || provisioned == spec.max_step
                            || counts.total() == spec.max
                            || now < g.held_until(),
                        "below min after a tick: {counts:?}"
                    );
                }
            }
        }
    }
}
