//! The framework's decisions as a pure state machine: master events and the factory's requests
//! go in, calls to send and launch outcomes come out. The driver only carries them out, so the
//! rules (never launch beyond the offers, decline what is not used, suppress when idle, revive
//! on demand, acknowledge every update with a uuid, kill what an earlier run left) are tested
//! here without a master.

use super::offers::{Need, OfferBook, Remaining};
use super::proto::v1::scheduler::{call, Call};
use super::proto::v1::*;
use invoker_ids::{ContainerId, NodeId, NodeStatsUpdate, Time};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Stops the master re-offering declined resources to us for this long.
    pub refuse_seconds: f64,
    /// An offer is held (and counts as free in the node stats) this long, then declined.
    pub offer_hold: Duration,
    /// With nothing launching and no demand for this long, the framework suppresses offers.
    pub suppress_after: Duration,
    /// A launch must be RUNNING within this, offer included, or it fails.
    pub launch_timeout: Duration,
    /// A killed task counts as gone after this even if TASK_KILLED never comes.
    pub kill_timeout: Duration,
    /// Every agent's capacity, when known better than from its offers.
    pub agent_capacity_mb: Option<f64>,
}

/// How to run the action runtime as a task; `{port}` in `command` becomes the task's port.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskTemplate {
    pub command: Vec<String>,
    /// Run through the Docker containerizer with this image; `None` runs `command` with the
    /// Mesos containerizer.
    pub image: Option<String>,
}

#[derive(Clone, Debug)]
pub struct LaunchRequest {
    pub container: ContainerId,
    pub agent: String,
    pub need: Need,
    pub name: String,
    pub template: TaskTemplate,
}

/// What became of a container, for the factory to report.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Started {
        container: ContainerId,
        host: String,
        port: u16,
    },
    LaunchFailed {
        container: ContainerId,
        reason: String,
    },
    /// A running task ended without being asked to (failed, lost with its agent, ...).
    Gone {
        container: ContainerId,
        reason: String,
    },
    Killed {
        container: ContainerId,
    },
}

#[derive(Debug, Default)]
pub struct Step {
    pub calls: Vec<Call>,
    pub outcomes: Vec<Outcome>,
}

#[derive(Clone, Debug, PartialEq)]
enum TaskPhase {
    Launching { deadline: Time },
    Running,
    Killing { deadline: Time },
}

#[derive(Clone, Debug)]
struct Task {
    container: ContainerId,
    agent: String,
    host: String,
    port: u16,
    mem_mb: f64,
    phase: TaskPhase,
    /// While launching: the request and when it was queued, to queue it again if the master
    /// drops the task because its offer was rescinded as we accepted it.
    launch: Option<(LaunchRequest, Time)>,
}

#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    /// Prefix of this run's task ids: the invoker id and a run number, so that tasks of an
    /// earlier run are told apart from this run's.
    task_prefix: String,
    framework_id: Option<String>,
    book: OfferBook,
    pending: VecDeque<(LaunchRequest, Time)>,
    tasks: BTreeMap<String, Task>,
    /// Largest memory seen per agent (offered plus ours): the node's capacity.
    capacity: BTreeMap<String, f64>,
    suppressed: bool,
    last_busy: Time,
    /// Calls the driver could not queue, sent again at the next tick (see `unsent`).
    resend: Vec<Call>,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, task_prefix: String) -> Self {
        Scheduler {
            config,
            task_prefix,
            framework_id: None,
            book: OfferBook::default(),
            pending: VecDeque::new(),
            tasks: BTreeMap::new(),
            capacity: BTreeMap::new(),
            suppressed: false,
            last_busy: Time::ZERO,
            resend: Vec::new(),
        }
    }

    pub fn framework_id(&self) -> Option<&str> {
        self.framework_id.as_deref()
    }

    pub fn is_suppressed(&self) -> bool {
        self.suppressed
    }

    fn task_id(&self, container: ContainerId) -> String {
        format!("{}.{}", self.task_prefix, container.0)
    }

    fn call(&self, r#type: call::Type) -> Call {
        Call {
            framework_id: self.framework_id.clone().map(|value| FrameworkId { value }),
            r#type: r#type as i32,
            ..Default::default()
        }
    }

    /// The master accepted our subscription (again). Offers held before are void; an implicit
    /// reconciliation makes the master report every task of the framework, so the tasks an
    /// earlier run left are found and killed.
    pub fn subscribed(&mut self, framework_id: String, now: Time, step: &mut Step) {
        self.framework_id = Some(framework_id);
        self.book.take_all();
        self.suppressed = false;
        self.last_busy = now;
        let mut reconcile = self.call(call::Type::Reconcile);
        reconcile.reconcile = Some(call::Reconcile { tasks: vec![] });
        step.calls.push(reconcile);
    }

    pub fn offers(&mut self, offers: &[Offer], now: Time, step: &mut Step) {
        for offer in offers {
            self.book.add(offer, now);
            let seen = self.book.agent(&offer.agent_id.value).map_or(0.0, |a| a.mem_mb());
            self.note_capacity(&offer.agent_id.value, seen);
        }
        self.match_pending(step);
    }

    pub fn rescind(&mut self, offer_id: &str) {
        self.book.rescind(offer_id);
    }

    /// Queues a launch on `agent`; it goes out with the next offer of that agent that holds it.
    pub fn launch(&mut self, request: LaunchRequest, now: Time, step: &mut Step) {
        self.last_busy = now;
        self.pending.push_back((request, now));
        self.revive_if_suppressed(step);
        self.match_pending(step);
    }

    pub fn kill(&mut self, container: ContainerId, now: Time, step: &mut Step) {
        if let Some(i) = self.pending.iter().position(|(r, _)| r.container == container) {
            self.pending.remove(i);
            step.outcomes.push(Outcome::Killed { container });
            return;
        }
        let task_id = self.task_id(container);
        let Some(task) = self.tasks.get_mut(&task_id) else {
            step.outcomes.push(Outcome::Killed { container });
            return;
        };
        task.phase = TaskPhase::Killing { deadline: now + self.config.kill_timeout };
        let agent = task.agent.clone();
        step.calls.push(self.kill_call(task_id, Some(agent)));
    }

    fn kill_call(&self, task_id: String, agent: Option<String>) -> Call {
        let mut kill = self.call(call::Type::Kill);
        kill.kill = Some(call::Kill {
            task_id: TaskId { value: task_id },
            agent_id: agent.map(|value| AgentId { value }),
            kill_policy: None,
        });
        kill
    }

    /// Whether jobs wait for room the offers do not give: demand revives a suppressed framework.
    pub fn demand(&mut self, waiting: bool, now: Time, step: &mut Step) {
        if waiting {
            self.last_busy = now;
            self.revive_if_suppressed(step);
        }
    }

    fn revive_if_suppressed(&mut self, step: &mut Step) {
        if self.suppressed && self.framework_id.is_some() {
            self.suppressed = false;
            let mut revive = self.call(call::Type::Revive);
            revive.revive = Some(call::Revive { roles: vec![] });
            step.calls.push(revive);
        }
    }

    pub fn update(&mut self, status: &TaskStatus, now: Time, step: &mut Step) {
        if let (Some(uuid), Some(agent)) = (&status.uuid, &status.agent_id) {
            let mut ack = self.call(call::Type::Acknowledge);
            ack.acknowledge = Some(call::Acknowledge {
                agent_id: agent.clone(),
                task_id: status.task_id.clone(),
                uuid: uuid.clone(),
            });
            step.calls.push(ack);
        }
        let state = TaskState::try_from(status.state).unwrap_or(TaskState::TaskUnknown);
        let task_id = &status.task_id.value;
        let why = || format!("{} ({})", state.as_str_name(), status.message.as_deref().unwrap_or("no message"));
        let Some(task) = self.tasks.get_mut(task_id) else {
            // A task this run did not launch: an earlier run's, found by reconciliation.
            if !is_terminal(state) {
                let agent = status.agent_id.as_ref().map(|a| a.value.clone());
                step.calls.push(self.kill_call(task_id.clone(), agent));
            }
            return;
        };
        let container = task.container;
        match (&task.phase, state) {
            (TaskPhase::Launching { .. }, TaskState::TaskRunning) if status.healthy != Some(false) => {
                task.phase = TaskPhase::Running;
                task.launch = None;
                let (host, port) = (task.host.clone(), task.port);
                step.outcomes.push(Outcome::Started { container, host, port });
            }
            (_, s) if !is_terminal(s) => {}
            (TaskPhase::Launching { .. }, TaskState::TaskDropped) => {
                // The offer was rescinded as we accepted it: the launch waits for the next one.
                let task = self.tasks.remove(task_id).expect("matched above");
                if let Some(launch) = task.launch {
                    self.pending.push_front(launch);
                    self.match_pending(step);
                }
            }
            (TaskPhase::Launching { .. }, _) => {
                self.tasks.remove(task_id);
                step.outcomes.push(Outcome::LaunchFailed { container, reason: why() });
            }
            (TaskPhase::Running, _) => {
                self.tasks.remove(task_id);
                step.outcomes.push(Outcome::Gone { container, reason: why() });
            }
            (TaskPhase::Killing { .. }, _) => {
                self.tasks.remove(task_id);
                step.outcomes.push(Outcome::Killed { container });
            }
        }
        self.last_busy = now;
    }

    /// The master lost an agent: its offers are void and its tasks are gone.
    pub fn agent_lost(&mut self, agent: &str, step: &mut Step) {
        self.book.take_agent(agent);
        let lost: Vec<String> = self.tasks.iter().filter(|(_, t)| t.agent == agent).map(|(id, _)| id.clone()).collect();
        for task_id in lost {
            let task = self.tasks.remove(&task_id).expect("listed above");
            let container = task.container;
            let reason = format!("agent {agent} was lost");
            step.outcomes.push(match task.phase {
                TaskPhase::Launching { .. } => Outcome::LaunchFailed { container, reason },
                TaskPhase::Running => Outcome::Gone { container, reason },
                TaskPhase::Killing { .. } => Outcome::Killed { container },
            });
        }
    }

    /// A call the driver could not queue (its queue to the master is full): what it was for
    /// fails or is tried again, never silently lost. A launch fails at once (its job is
    /// answered, its reservation released); a kill, reconciliation, acknowledgement or decline
    /// goes out again at the next tick; a revive or suppress that did not go out is undone, so
    /// the next demand or idle tick sends it again.
    pub fn unsent(&mut self, call: Call, step: &mut Step) {
        match call::Type::try_from(call.r#type) {
            Ok(call::Type::Accept) => {
                let launched = call.accept.iter().flat_map(|a| &a.operations).filter_map(|o| o.launch.as_ref());
                for info in launched.flat_map(|l| &l.task_infos) {
                    if let Some(task) = self.tasks.remove(&info.task_id.value) {
                        let reason = "the invoker's queue of calls to the Mesos master is full".to_string();
                        step.outcomes.push(Outcome::LaunchFailed { container: task.container, reason });
                    }
                }
            }
            Ok(call::Type::Revive) => self.suppressed = true,
            Ok(call::Type::Suppress) => self.suppressed = false,
            _ => self.resend.push(call),
        }
    }

    /// Time passed: launches and kills past their deadlines, offers held too long, idleness.
    pub fn tick(&mut self, now: Time, step: &mut Step) {
        step.calls.append(&mut self.resend);
        while let Some((request, since)) = self.pending.front() {
            if *since + self.config.launch_timeout > now {
                break;
            }
            let reason =
                format!("no offer from agent {} held the task within {:?}", request.agent, self.config.launch_timeout);
            step.outcomes.push(Outcome::LaunchFailed { container: request.container, reason });
            self.pending.pop_front();
        }
        let overdue: Vec<String> = self
            .tasks
            .iter()
            .filter(|(_, t)| match t.phase {
                TaskPhase::Launching { deadline } | TaskPhase::Killing { deadline } => deadline <= now,
                TaskPhase::Running => false,
            })
            .map(|(id, _)| id.clone())
            .collect();
        for task_id in overdue {
            let task = self.tasks.remove(&task_id).expect("listed above");
            let container = task.container;
            if let TaskPhase::Launching { .. } = task.phase {
                let reason = format!("the task was not running within {:?}", self.config.launch_timeout);
                step.outcomes.push(Outcome::LaunchFailed { container, reason });
                step.calls.push(self.kill_call(task_id, Some(task.agent)));
            } else {
                step.outcomes.push(Outcome::Killed { container });
            }
        }
        let held_until = now.saturating_sub(self.config.offer_hold);
        let old = self.book.take_older_than(held_until);
        self.decline(old, step);
        let idle = self.pending.is_empty() && now.saturating_sub(self.last_busy) >= self.config.suppress_after;
        if idle && !self.suppressed && self.framework_id.is_some() {
            self.suppressed = true;
            let mut suppress = self.call(call::Type::Suppress);
            suppress.suppress = Some(call::Suppress { roles: vec![] });
            step.calls.push(suppress);
            let all = self.book.take_all();
            self.decline(all, step);
        }
    }

    fn decline(&self, offer_ids: Vec<String>, step: &mut Step) {
        if offer_ids.is_empty() {
            return;
        }
        let mut decline = self.call(call::Type::Decline);
        decline.decline = Some(call::Decline {
            offer_ids: offer_ids.into_iter().map(|value| OfferId { value }).collect(),
            filters: Some(Filters { refuse_seconds: Some(self.config.refuse_seconds) }),
        });
        step.calls.push(decline);
    }

    /// Packs pending launches into the offers of their agents, first come first served; one
    /// ACCEPT per agent with launches, using every offer of that agent.
    fn match_pending(&mut self, step: &mut Step) {
        if self.pending.is_empty() {
            return;
        }
        let agents: Vec<String> = self.book.agents().map(|(a, _)| a.clone()).collect();
        for agent in agents {
            let offers = self.book.agent(&agent).expect("listed above");
            let mut left = Remaining::of(offers);
            let host = offers.hostname.clone();
            let mut launches = Vec::new();
            self.pending.retain(|(request, queued_at)| {
                if request.agent != agent {
                    return true;
                }
                match left.take(&request.need) {
                    Some(port) => {
                        launches.push((request.clone(), *queued_at, port));
                        false
                    }
                    None => true,
                }
            });
            if launches.is_empty() {
                continue;
            }
            let offers = self.book.take_agent(&agent).expect("listed above");
            let mut task_infos = Vec::new();
            for (request, queued_at, port) in launches {
                let task_id = self.task_id(request.container);
                task_infos.push(task_info(&task_id, &agent, &request, port));
                let task = Task {
                    container: request.container,
                    agent: agent.clone(),
                    host: host.clone(),
                    port: port as u16,
                    mem_mb: request.need.mem_mb,
                    phase: TaskPhase::Launching { deadline: queued_at + self.config.launch_timeout },
                    launch: Some((request, queued_at)),
                };
                self.tasks.insert(task_id, task);
            }
            let mut accept = self.call(call::Type::Accept);
            accept.accept = Some(call::Accept {
                offer_ids: offers.offers.iter().map(|o| OfferId { value: o.id.clone() }).collect(),
                operations: vec![offer::Operation {
                    r#type: Some(offer::operation::Type::Launch as i32),
                    launch: Some(offer::operation::Launch { task_infos }),
                }],
                filters: Some(Filters { refuse_seconds: Some(self.config.refuse_seconds) }),
            });
            step.calls.push(accept);
        }
    }

    fn note_capacity(&mut self, agent: &str, offered: f64) {
        let ours: f64 = self.tasks.values().filter(|t| t.agent == agent).map(|t| t.mem_mb).sum();
        let seen = self.capacity.entry(agent.to_string()).or_default();
        *seen = seen.max(offered + ours);
    }

    /// Per agent: what its offers hold now (free), and the most it was ever seen to have.
    pub fn stats(&self, now: Time) -> Vec<NodeStatsUpdate> {
        self.capacity
            .iter()
            .map(|(agent, &capacity)| {
                let free = self.book.agent(agent).map_or(0.0, |a| a.mem_mb());
                NodeStatsUpdate {
                    node: NodeId::new(agent),
                    capacity_mb: capacity.max(self.config.agent_capacity_mb.unwrap_or(0.0)) as u64,
                    free_mb: free as u64,
                    observed_at: now,
                }
            })
            .collect()
    }
}

fn is_terminal(state: TaskState) -> bool {
    !matches!(state, TaskState::TaskStaging | TaskState::TaskStarting | TaskState::TaskRunning | TaskState::TaskKilling)
}

fn task_info(task_id: &str, agent: &str, request: &LaunchRequest, port: u64) -> TaskInfo {
    let scalar = |name: &str, value: f64| Resource {
        name: name.into(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value }),
        ..Default::default()
    };
    let ports = Resource {
        name: "ports".into(),
        r#type: value::Type::Ranges as i32,
        ranges: Some(value::Ranges { range: vec![value::Range { begin: port, end: port }] }),
        ..Default::default()
    };
    let argv: Vec<String> = request.template.command.iter().map(|a| a.replace("{port}", &port.to_string())).collect();
    let command = CommandInfo {
        shell: Some(false),
        value: argv.first().cloned(),
        arguments: argv,
        environment: Some(Environment {
            variables: vec![environment::Variable { name: "PORT".into(), value: Some(port.to_string()) }],
        }),
        user: None,
    };
    let container = request.template.image.as_ref().map(|image| ContainerInfo {
        r#type: container_info::Type::Docker as i32,
        docker: Some(container_info::DockerInfo {
            image: image.clone(),
            network: Some(container_info::docker_info::Network::Host as i32),
            ..Default::default()
        }),
        hostname: None,
    });
    TaskInfo {
        name: request.name.clone(),
        task_id: TaskId { value: task_id.into() },
        agent_id: AgentId { value: agent.into() },
        resources: vec![scalar("cpus", request.need.cpus), scalar("mem", request.need.mem_mb), ports],
        command: Some(command),
        container,
        labels: None,
        kill_policy: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offers::tests::offer;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn scheduler() -> Scheduler {
        let config = SchedulerConfig {
            refuse_seconds: 1.0,
            offer_hold: S(5),
            suppress_after: S(30),
            launch_timeout: S(20),
            kill_timeout: S(10),
            agent_capacity_mb: None,
        };
        let mut s = Scheduler::new(config, "inv.1".into());
        let mut step = Step::default();
        s.subscribed("fw".into(), S(0), &mut step);
        s
    }

    fn launch(container: u64, agent: &str, mem_mb: f64) -> LaunchRequest {
        LaunchRequest {
            container: ContainerId(container),
            agent: agent.into(),
            need: Need { cpus: 0.25, mem_mb },
            name: format!("c{container}"),
            template: TaskTemplate {
                command: vec!["/invoker".into(), "--listen".into(), "0.0.0.0:{port}".into()],
                image: None,
            },
        }
    }

    fn of_type(step: &Step, t: call::Type) -> Vec<&Call> {
        step.calls.iter().filter(|c| c.r#type == t as i32).collect()
    }

    fn status(task: &str, agent: &str, state: TaskState, uuid: Option<u8>) -> TaskStatus {
        TaskStatus {
            task_id: TaskId { value: task.into() },
            state: state as i32,
            agent_id: Some(AgentId { value: agent.into() }),
            uuid: uuid.map(|u| vec![u]),
            ..Default::default()
        }
    }

    #[test]
    fn subscribing_reconciles_and_an_earlier_runs_task_is_killed() {
        let mut s = Scheduler::new(scheduler().config.clone(), "inv.2".into());
        let mut step = Step::default();
        s.subscribed("fw".into(), S(0), &mut step);
        let reconcile = of_type(&step, call::Type::Reconcile);
        assert_eq!(reconcile.len(), 1);
        assert_eq!(reconcile[0].framework_id.as_ref().unwrap().value, "fw");
        assert!(reconcile[0].reconcile.as_ref().unwrap().tasks.is_empty(), "implicit: every task of ours");

        let mut step = Step::default();
        s.update(&status("inv.1.7", "a", TaskState::TaskRunning, None), S(1), &mut step);
        let kill = of_type(&step, call::Type::Kill);
        assert_eq!(kill[0].kill.as_ref().unwrap().task_id.value, "inv.1.7", "the earlier run's task");
        let mut step = Step::default();
        s.update(&status("inv.1.8", "a", TaskState::TaskFinished, None), S(1), &mut step);
        assert!(step.calls.is_empty(), "a finished task needs no kill");
    }

    #[test]
    fn launches_wait_for_their_agents_offers_and_never_take_more_than_they_hold() {
        let mut s = scheduler();
        let mut step = Step::default();
        for c in 1..=3 {
            s.launch(launch(c, "a", 256.0), S(1), &mut step);
        }
        s.offers(&[offer("ob", "b", 4.0, 4096.0, (1, 100))], S(1), &mut step);
        assert!(of_type(&step, call::Type::Accept).is_empty(), "agent b is not where they were placed");

        s.offers(&[offer("oa1", "a", 2.0, 600.0, (31000, 31010))], S(2), &mut step);
        let accepts = of_type(&step, call::Type::Accept);
        assert_eq!(accepts.len(), 1);
        let accept = accepts[0].accept.as_ref().unwrap();
        assert_eq!(accept.offer_ids, vec![OfferId { value: "oa1".into() }]);
        let tasks = &accept.operations[0].launch.as_ref().unwrap().task_infos;
        assert_eq!(tasks.len(), 2, "600 MB hold two tasks of 256 MB, not three");
        let mem: f64 =
            tasks.iter().flat_map(|t| &t.resources).filter(|r| r.name == "mem").map(|r| r.scalar.unwrap().value).sum();
        assert!(mem <= 600.0);
        let ports: Vec<u64> = tasks
            .iter()
            .flat_map(|t| &t.resources)
            .filter(|r| r.name == "ports")
            .map(|r| r.ranges.as_ref().unwrap().range[0].begin)
            .collect();
        assert_eq!(ports, vec![31000, 31001], "a port each, from the offer");
        assert_eq!(tasks[0].command.as_ref().unwrap().arguments[2], "0.0.0.0:31000");
        assert_eq!(tasks[0].task_id.value, "inv.1.1");

        let mut step = Step::default();
        s.offers(&[offer("oa2", "a", 1.0, 300.0, (31020, 31020))], S(3), &mut step);
        let tasks = &of_type(&step, call::Type::Accept)[0].accept.as_ref().unwrap().operations[0]
            .launch
            .as_ref()
            .unwrap()
            .task_infos;
        assert_eq!(tasks.len(), 1, "the third, with the next offer of agent a");
    }

    #[test]
    fn updates_start_or_fail_a_launch_and_every_uuid_is_acknowledged() {
        let mut s = scheduler();
        let mut step = Step::default();
        s.launch(launch(1, "a", 128.0), S(1), &mut step);
        s.launch(launch(2, "a", 128.0), S(1), &mut step);
        s.offers(&[offer("o", "a", 1.0, 512.0, (31000, 31010))], S(1), &mut step);
        let mut step = Step::default();
        s.update(&status("inv.1.1", "a", TaskState::TaskStaging, Some(1)), S(2), &mut step);
        assert!(step.outcomes.is_empty());
        s.update(&status("inv.1.1", "a", TaskState::TaskRunning, Some(2)), S(2), &mut step);
        s.update(&status("inv.1.2", "a", TaskState::TaskFailed, Some(3)), S(2), &mut step);
        let acks = of_type(&step, call::Type::Acknowledge);
        assert_eq!(
            acks.iter().map(|c| c.acknowledge.as_ref().unwrap().uuid.clone()).collect::<Vec<_>>(),
            vec![vec![1], vec![2], vec![3]]
        );
        assert_eq!(
            step.outcomes[0],
            Outcome::Started { container: ContainerId(1), host: "a.host".into(), port: 31000 }
        );
        assert!(
            matches!(&step.outcomes[1], Outcome::LaunchFailed { container: ContainerId(2), reason } if reason.contains("TASK_FAILED"))
        );

        let mut step = Step::default();
        s.update(&status("inv.1.1", "a", TaskState::TaskLost, None), S(3), &mut step);
        assert!(step.calls.is_empty(), "no uuid, no acknowledgement");
        assert!(matches!(&step.outcomes[0], Outcome::Gone { container: ContainerId(1), .. }));
    }

    #[test]
    fn a_task_dropped_for_an_offer_rescinded_as_it_was_accepted_goes_out_with_the_next() {
        let mut s = scheduler();
        let mut step = Step::default();
        s.launch(launch(1, "a", 128.0), S(1), &mut step);
        s.offers(&[offer("o1", "a", 1.0, 512.0, (31000, 31010))], S(1), &mut step);
        let mut step = Step::default();
        s.update(&status("inv.1.1", "a", TaskState::TaskDropped, Some(1)), S(2), &mut step);
        assert!(step.outcomes.is_empty(), "not a failure: the launch waits again");
        s.offers(&[offer("o2", "a", 1.0, 512.0, (31000, 31010))], S(3), &mut step);
        let accept = of_type(&step, call::Type::Accept);
        assert_eq!(accept[0].accept.as_ref().unwrap().offer_ids, vec![OfferId { value: "o2".into() }]);
        let mut step = Step::default();
        s.tick(S(21), &mut step);
        assert!(matches!(&step.outcomes[0], Outcome::LaunchFailed { .. }), "still within the first deadline");
    }

    #[test]
    fn a_rescinded_offer_is_not_used() {
        let mut s = scheduler();
        let mut step = Step::default();
        s.offers(&[offer("o", "a", 1.0, 512.0, (31000, 31010))], S(1), &mut step);
        s.rescind("o");
        s.launch(launch(1, "a", 128.0), S(1), &mut step);
        assert!(of_type(&step, call::Type::Accept).is_empty());
        assert_eq!(s.stats(S(1))[0].free_mb, 0);
    }

    #[test]
    fn unused_offers_are_declined_and_an_idle_framework_suppresses_until_demand() {
        let mut s = scheduler();
        let mut step = Step::default();
        s.offers(&[offer("o1", "a", 1.0, 512.0, (1, 2))], S(1), &mut step);
        assert_eq!(s.stats(S(1))[0].free_mb, 512, "held offers are the node's free memory");
        s.tick(S(5), &mut step);
        assert!(of_type(&step, call::Type::Decline).is_empty(), "held for 5 s");
        s.tick(S(6), &mut step);
        let decline = of_type(&step, call::Type::Decline)[0].decline.as_ref().unwrap();
        assert_eq!(decline.offer_ids, vec![OfferId { value: "o1".into() }]);
        assert_eq!(decline.filters.as_ref().unwrap().refuse_seconds, Some(1.0));

        let mut step = Step::default();
        s.offers(&[offer("o2", "a", 1.0, 512.0, (1, 2))], S(29), &mut step);
        s.tick(S(30), &mut step);
        assert_eq!(of_type(&step, call::Type::Suppress).len(), 1, "idle for 30 s");
        assert_eq!(
            of_type(&step, call::Type::Decline)[0].decline.as_ref().unwrap().offer_ids.len(),
            1,
            "and nothing held"
        );
        assert!(s.is_suppressed());
        let mut step = Step::default();
        s.tick(S(40), &mut step);
        s.demand(false, S(40), &mut step);
        assert!(step.calls.is_empty(), "suppressed once");
        s.demand(true, S(41), &mut step);
        assert_eq!(of_type(&step, call::Type::Revive).len(), 1, "work waits: revive");
        assert!(!s.is_suppressed());
    }

    #[test]
    fn a_lost_agent_fails_its_launches_and_loses_its_tasks() {
        let mut s = scheduler();
        let mut step = Step::default();
        s.launch(launch(1, "a", 128.0), S(1), &mut step);
        s.launch(launch(2, "a", 128.0), S(1), &mut step);
        s.offers(&[offer("o", "a", 1.0, 512.0, (31000, 31010))], S(1), &mut step);
        s.update(&status("inv.1.1", "a", TaskState::TaskRunning, None), S(2), &mut step);
        let mut step = Step::default();
        s.agent_lost("a", &mut step);
        assert!(
            matches!(&step.outcomes[0], Outcome::Gone { container: ContainerId(1), reason } if reason.contains("lost"))
        );
        assert!(matches!(&step.outcomes[1], Outcome::LaunchFailed { container: ContainerId(2), .. }));
    }

    #[test]
    fn kills_are_confirmed_by_the_master_or_by_a_deadline() {
        let mut s = scheduler();
        let mut step = Step::default();
        for c in 1..=2 {
            s.launch(launch(c, "a", 128.0), S(1), &mut step);
        }
        s.offers(&[offer("o", "a", 1.0, 512.0, (31000, 31010))], S(1), &mut step);
        s.update(&status("inv.1.1", "a", TaskState::TaskRunning, None), S(2), &mut step);
        s.update(&status("inv.1.2", "a", TaskState::TaskRunning, None), S(2), &mut step);
        let mut step = Step::default();
        s.kill(ContainerId(1), S(3), &mut step);
        s.kill(ContainerId(2), S(3), &mut step);
        assert_eq!(of_type(&step, call::Type::Kill).len(), 2);
        assert!(step.outcomes.is_empty(), "not until the master confirms");
        s.update(&status("inv.1.1", "a", TaskState::TaskKilled, None), S(4), &mut step);
        assert_eq!(step.outcomes, vec![Outcome::Killed { container: ContainerId(1) }]);
        s.tick(S(13), &mut step);
        assert_eq!(step.outcomes[1], Outcome::Killed { container: ContainerId(2) }, "after the 10 s bound");
        let mut step = Step::default();
        s.launch(launch(3, "b", 128.0), S(14), &mut step);
        s.kill(ContainerId(3), S(14), &mut step);
        assert_eq!(step.outcomes, vec![Outcome::Killed { container: ContainerId(3) }], "never launched");
    }

    #[test]
    fn a_call_that_could_not_be_queued_fails_its_launches_or_goes_out_again() {
        let mut s = scheduler();
        let mut step = Step::default();
        s.subscribed("fw".into(), Time::ZERO, &mut step);
        s.launch(launch(1, "a", 256.0), Time::ZERO, &mut step);
        let mut step = Step::default();
        s.offers(&[offer("o1", "a", 1.0, 1024.0, (31000, 31010))], Time::ZERO, &mut step);
        let accept = of_type(&step, call::Type::Accept)[0].clone();
        let mut step = Step::default();
        s.unsent(accept, &mut step);
        assert!(
            matches!(&step.outcomes[..], [Outcome::LaunchFailed { container, .. }] if *container == ContainerId(1)),
            "{:?}",
            step.outcomes
        );
        let kill = s.kill_call("t".into(), None);
        s.unsent(kill, &mut step);
        let mut step = Step::default();
        s.tick(Time::from_secs(1), &mut step);
        assert_eq!(of_type(&step, call::Type::Kill).len(), 1, "the kill goes out again");
        let mut step = Step::default();
        s.tick(Time::from_secs(2), &mut step);
        assert!(of_type(&step, call::Type::Kill).is_empty(), "once");
    }

    #[test]
    fn a_launch_without_an_offer_fails_at_its_deadline() {
        let mut s = scheduler();
        let mut step = Step::default();
        s.launch(launch(1, "gone", 128.0), S(1), &mut step);
        s.tick(S(20), &mut step);
        assert!(step.outcomes.is_empty());
        s.tick(S(21), &mut step);
        assert!(matches!(&step.outcomes[0], Outcome::LaunchFailed { container: ContainerId(1), .. }));
    }

    #[test]
    fn an_agents_capacity_is_the_most_it_was_seen_to_hold() {
        let mut s = scheduler();
        let mut step = Step::default();
        s.offers(&[offer("o1", "a", 1.0, 1024.0, (31000, 31010))], S(1), &mut step);
        s.launch(launch(1, "a", 256.0), S(1), &mut step);
        s.offers(&[offer("o2", "a", 1.0, 768.0, (31000, 31010))], S(2), &mut step);
        let stats = s.stats(S(2));
        assert_eq!((stats[0].capacity_mb, stats[0].free_mb), (1024, 768), "768 offered + 256 ours");
        s.config.agent_capacity_mb = Some(4096.0);
        assert_eq!(s.stats(S(2))[0].capacity_mb, 4096, "configured, where offers show less");
    }
}
