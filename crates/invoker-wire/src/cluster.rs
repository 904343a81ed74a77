//! What the members of a cluster write in etcd for one another: the key layout (OpenWhisk's
//! scheduler's), an invoker's registration and health, a scheduler's record and demand, and the
//! drain marks. Every reader and writer of those keys (the invokers, the schedulers, the
//! capacity manager, the tests) takes them from here, so they cannot drift apart.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How long an invoker keeps a controller's blocking call before answering 202: beyond the
/// action's own bounds (its `timeout`, the pool's `wait_deadline` for a container, the proxy's
/// `init_timeout`), a margin of 30 s. A scheduler waits for the answer a little longer.
pub fn controller_wait(timeout: Duration, wait_deadline: Duration, init_timeout: Duration) -> Duration {
    timeout + wait_deadline + init_timeout + Duration::from_secs(30)
}

/// The content type of an invoker shim's answer in two parts, a JSON message on each line:
/// OpenWhisk's `ResultMessage` as soon as the result is known, then the
/// `CombinedCompletionAndResultMessage` with the whole record (its logs). A scheduler asks for
/// it with `Accept`; an answer whose record was whole at once is the one message, as JSON.
pub const TWO_PARTS: &str = "application/x-ndjson";

/// The header a scheduler sends with a blocking call whose caller takes a streamed answer: the
/// stream's content type (`application/x-ndjson`, `text/event-stream`). An invoker whose action
/// streams answers with [`STREAMED_ANSWER`], the values framed as the caller reads them, as
/// they come; the scheduler passes the body on and asks for the record once it ended.
pub const STREAM_TO: &str = "x-invoker-stream";

/// The content type of an invoker's streamed answer to a scheduler ([`STREAM_TO`]).
pub const STREAMED_ANSWER: &str = "application/x-invoker-streamed";

/// [`STREAM_TO`]'s value for a caller that takes a function's answer in chunks as the function
/// writes it (an Fn call): the invoker's [`STREAMED_ANSWER`] then carries the bytes as they
/// came and the function's headers in [`STREAM_HEADERS`].
pub const STREAM_AS_WRITTEN: &str = "application/x-invoker-as-written";

/// The header of a [`STREAMED_ANSWER`] that holds the function's own headers, a JSON array of
/// `[name, value]` pairs ([`STREAM_AS_WRITTEN`]).
pub const STREAM_HEADERS: &str = "x-invoker-stream-headers";

/// The header a scheduler sends with a queued (asynchronous) call it keeps until the invoker
/// starts it: the invoker answers as soon as the call is handed to a container, with
/// [`STARTED_LINE`] as the first line of a [`TWO_PARTS`] answer, before `/run` goes out; the
/// record follows as the second. An invoker whose caller is gone before that starts nothing.
pub const REPORT_START: &str = "x-invoker-report-start";

/// The first line of an answer to a [`REPORT_START`] call once it started (then a newline).
pub const STARTED_LINE: &str = "{\"started\":true}";

/// The `host:port` of an `http://host:port` endpoint (etcd's members, a member's `api`), or
/// `None` when it is not one.
pub fn authority(endpoint: &str) -> Option<&str> {
    let authority = endpoint.strip_prefix("http://")?.trim_end_matches('/');
    (!authority.is_empty() && !authority.contains(['/', ' '])).then_some(authority)
}

/// Most activation ids one `POST /v1/internal/records` (a scheduler asking an invoker for the
/// records of activations it wrote guesses for) may name.
pub const MAX_RECORDS_ASKED: usize = 1000;

/// `{prefix}/invokers/{id}`: an invoker's registration.
pub fn invoker_key(prefix: &str, invoker_id: &str) -> String {
    format!("{prefix}/invokers/{invoker_id}")
}

/// `{prefix}/containers/{ns}/{action}/{revision}/invoker/{id}/container/{cid}` (seed 000's
/// layout): a scheduler finds the warm invokers of an action revision with one prefix range.
pub fn container_key(prefix: &str, ns: &str, action: &str, revision: u64, invoker_id: &str, container: u64) -> String {
    format!("{prefix}/containers/{ns}/{action}/{revision}/invoker/{invoker_id}/container/{container}")
}

/// `{prefix}/schedulers/{id}`: a scheduler's address, for invokers fetching its actions.
pub fn scheduler_key(prefix: &str, scheduler_id: &str) -> String {
    format!("{prefix}/schedulers/{scheduler_id}")
}

/// `{prefix}/drain/{id}`: an operator's or the capacity manager's drain of an invoker, or an
/// operator's taking it back ([`DrainMark`]). Outside the invoker's lease: a drain outlives a
/// restart, and every scheduler reads it.
pub fn drain_key(prefix: &str, invoker_id: &str) -> String {
    format!("{prefix}/drain/{invoker_id}")
}

/// The value of a drain key. An operator's activation is a mark too (`drained: false`), not a
/// missing key: a key missing is what an etcd that restarted empty shows, and the invoker then
/// puts back the operator's drain it kept ([`registry::Registrar`]), where a deleted key would
/// have let the drained invoker take work again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainMark {
    /// False: the operator took the drain back.
    #[serde(default = "drained_by_default")]
    pub drained: bool,
    /// When it was written (ms since the epoch, the writer's clock).
    #[serde(default)]
    pub since: u64,
    /// `capacity` for the capacity manager's, which it keeps itself; anything else is an
    /// operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

fn drained_by_default() -> bool {
    true
}

impl DrainMark {
    pub fn operator(drained: bool, since: u64) -> Self {
        DrainMark { drained, since, by: Some("operator".into()) }
    }

    pub fn capacity(since: u64) -> Self {
        DrainMark { drained: true, since, by: Some("capacity".into()) }
    }

    /// What a key's value says; one that does not decode still drains (a drain key has always
    /// meant a drain, whatever its value).
    pub fn read(value: &str) -> Self {
        serde_json::from_str(value).unwrap_or(DrainMark { drained: true, since: 0, by: None })
    }

    pub fn by_operator(&self) -> bool {
        self.by.as_deref() != Some("capacity")
    }

    pub fn to_value(&self) -> String {
        serde_json::to_string(self).expect("a drain mark serialises")
    }
}

/// `{prefix}/demand/{scheduler_id}`: what one scheduler needs of the fleet, under a lease of
/// its own (a scheduler that dies takes its report with it).
pub fn demand_key(prefix: &str, scheduler_id: &str) -> String {
    format!("{prefix}/demand/{scheduler_id}")
}

/// `{prefix}/provisioned/{invoker}/`: the provisioned containers schedulers ask of an invoker,
/// one key per scheduler and action ([`provisioned_key`]), each under its scheduler's lease.
pub fn provisioned_prefix(prefix: &str, invoker_id: &str) -> String {
    format!("{prefix}/provisioned/{invoker_id}/")
}

/// `{prefix}/provisioned/{invoker}/{scheduler}/{ns}/{name}`, the namespace and the name
/// percent-encoded (neither holds a `/` then).
pub fn provisioned_key(prefix: &str, invoker_id: &str, scheduler_id: &str, ns: &str, name: &str) -> String {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let (ns, name) = (utf8_percent_encode(ns, NON_ALPHANUMERIC), utf8_percent_encode(name, NON_ALPHANUMERIC));
    format!("{}{scheduler_id}/{ns}/{name}", provisioned_prefix(prefix, invoker_id))
}

/// What one scheduler asks of one invoker for one action: `count` containers of the action at
/// `revision` (a [`cluster_revision`]) kept provisioned there.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProvisionedEntry {
    pub revision: u64,
    pub count: u32,
}

/// A key under [`provisioned_prefix`] read back: the scheduler, the namespace and the name.
pub fn parse_provisioned_key(rest: &str) -> Option<(String, String, String)> {
    let mut parts = rest.split('/');
    let (scheduler, ns, name) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8().ok().map(|s| s.into_owned());
    Some((scheduler.to_string(), decode(ns)?, decode(name)?))
}

/// `{prefix}/capacity/leader`: the active capacity manager, under its lease.
pub fn capacity_leader_key(prefix: &str) -> String {
    format!("{prefix}/capacity/leader")
}

/// Memory a scheduler needs for the actions of one tag set (their `invoker-resources`; none:
/// the untagged invokers).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Needs {
    /// Of the activations sent to invokers and not yet answered.
    pub in_flight_mb: u64,
    /// Of those waiting for an invoker with room.
    pub waiting_mb: u64,
    /// Of those refused for lack of room since the report before.
    pub refused_mb: u64,
    /// The same activations (in flight, waiting, refused) by the memory one takes, in MB: how
    /// many. Each must fit whole on one invoker, so what they take is counted by packing them,
    /// not by their megabytes (`invoker_core::capacity::packing`). Absent from a report of a
    /// scheduler before it: counted by memory then. On the wire a list of `[mb, calls]` pairs:
    /// a map's keys are strings in JSON, and serde's `flatten` (in [`TagNeeds`]) reads no
    /// number from one.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty", with = "pairs")]
    pub calls_by_mb: std::collections::BTreeMap<u64, u64>,
}

/// A map of numbers as a list of pairs.
mod pairs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(map: &BTreeMap<u64, u64>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(map.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u64, u64>, D::Error> {
        Ok(Vec::<(u64, u64)>::deserialize(d)?.into_iter().collect())
    }
}

impl Needs {
    pub fn total_mb(&self) -> u64 {
        self.in_flight_mb + self.waiting_mb + self.refused_mb
    }
}

/// The value of a scheduler's demand key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DemandReport {
    pub scheduler: String,
    /// When it was written (the scheduler's clock, ms since the epoch).
    pub at_ms: u64,
    pub needs: Vec<TagNeeds>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagNeeds {
    pub tags: Vec<String>,
    #[serde(flatten)]
    pub needs: Needs,
}

/// The value of a scheduler's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerRecord {
    pub id: String,
    /// Where its API answers (the internal route invokers fetch actions from).
    pub api: String,
    /// As an invoker's: which process of which boot holds the id.
    pub boot_id: String,
    pub pid: u32,
}

/// The revision an action of `scheduler` travels under: its store's revision is a counter of
/// that store only, so two schedulers' `guest/hello` (or one scheduler's before and after its
/// data was wiped) would share containers on an invoker under it. This one names the
/// scheduler, the revision and the time of the update (FNV-1a, stable across processes), and
/// has its top bit set, so it never equals an invoker's own store's counter either.
pub fn cluster_revision(scheduler_id: &str, revision: u64, updated_ms: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let parts = [scheduler_id.as_bytes(), &[0], &revision.to_le_bytes(), &updated_ms.to_le_bytes()];
    for byte in parts.into_iter().flatten() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash | 1 << 63
}

/// What one node of an invoker can take now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeHeadroom {
    pub node: String,
    /// The largest container it could launch now.
    pub launchable_mb: u64,
    pub free_mb: u64,
    pub capacity_mb: u64,
    /// Held by idle containers, which the invoker removes when it needs the room.
    #[serde(default)]
    pub idle_mb: u64,
}

/// The value of an invoker's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvokerRecord {
    pub id: String,
    /// Where its API answers (the shim, `POST /v1/activations`).
    pub api: String,
    pub tags: Vec<String>,
    pub health: Health,
    pub nodes: Vec<NodeHeadroom>,
    /// Which run of which machine holds the id: a restart on the same machine after a crash
    /// takes over a key its dead predecessor's lease still holds.
    pub boot_id: String,
    pub pid: u32,
}

impl InvokerRecord {
    /// The largest container any of its nodes could launch now.
    pub fn launchable_mb(&self) -> u64 {
        self.nodes.iter().map(|n| n.launchable_mb).max().unwrap_or(0)
    }

    /// The largest container any of its nodes could hold once its idle containers there are
    /// removed: what a scheduler may send it. Without the idle memory, a cluster whose invokers
    /// filled up with warm containers would take no new action until they expired.
    pub fn room_mb(&self) -> u64 {
        self.nodes.iter().map(|n| n.launchable_mb + n.idle_mb).max().unwrap_or(0)
    }

    /// The memory its calls hold (running and starting containers): its nodes' memory neither
    /// free nor idle.
    pub fn busy_mb(&self) -> u64 {
        self.nodes.iter().map(|n| n.capacity_mb.saturating_sub(n.free_mb + n.idle_mb)).sum()
    }
}

/// What the invoker can take, as `/health`, its cluster registration and the schedulers
/// reading it say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    Healthy,
    /// Work waits and no node can launch even the smallest action, even with its idle
    /// containers removed; or the cluster refused creations several times in a row.
    Overloaded,
    /// Container creations failed several times in a row (not for want of room), or the store
    /// cannot write.
    Unhealthy,
    Draining,
    /// An operator's drain (its key in etcd) that has nothing left running.
    Drained,
}

impl Health {
    pub fn as_str(&self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Overloaded => "overloaded",
            Health::Unhealthy => "unhealthy",
            Health::Draining => "draining",
            Health::Drained => "drained",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DrainMark;

    #[test]
    fn a_drain_key_drains_unless_it_says_the_operator_took_it_back() {
        assert!(DrainMark::read("{}").drained && DrainMark::read("{}").by_operator(), "an older operator's drain");
        assert!(DrainMark::read("not json").drained);
        let capacity = DrainMark::read(r#"{"since":1,"by":"capacity"}"#);
        assert!(capacity.drained && !capacity.by_operator());
        let back = DrainMark::read(&DrainMark::operator(false, 5).to_value());
        assert_eq!(back, DrainMark::operator(false, 5));
        assert!(!back.drained && back.by_operator());
    }

    /// A demand report with its calls by size reads back as it was written (through the
    /// `flatten` of `TagNeeds`), and one without them (a scheduler before them) reads too.
    #[test]
    fn a_demand_report_with_its_calls_by_size_reads_back() {
        use super::{DemandReport, Needs, TagNeeds};
        let needs = Needs { in_flight_mb: 1065, calls_by_mb: [(213, 5)].into(), ..Default::default() };
        let report = DemandReport { scheduler: "s".into(), at_ms: 1, needs: vec![TagNeeds { tags: vec![], needs }] };
        let text = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<DemandReport>(&text).unwrap(), report, "{text}");
        let before =
            r#"{"scheduler":"s","at_ms":1,"needs":[{"tags":[],"in_flight_mb":5,"waiting_mb":0,"refused_mb":0}]}"#;
        let read = serde_json::from_str::<DemandReport>(before).unwrap();
        assert!(read.needs[0].needs.calls_by_mb.is_empty());
    }
}
