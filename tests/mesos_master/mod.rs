//! A fake Mesos master for the Mesos factory's tests: no Mesos master can run on this machine,
//! so this one speaks the same v1 scheduler HTTP API (protobuf calls, a RecordIO event stream,
//! `Mesos-Stream-Id`, 307 from a master that is not the leader) over loopback HTTP.
//!
//! It holds agents with resources, offers what is free on its own schedule, checks every
//! ACCEPT against the offers it names (and counts what it refuses), and runs launched tasks as
//! local processes of the task's command, so activations run end to end. Tests can rescind
//! offers, lose an agent, fail a task, move the leadership to its second address, and cut the
//! event stream.
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use invoker_mesos::prost::Message;
use invoker_mesos::proto::v1::scheduler::{call, event, Call, Event};
use invoker_mesos::proto::v1::*;
use invoker_mesos::recordio::frame;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What the master did, for tests to assert on.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    pub subscribes: u32,
    pub accepts: u32,
    /// ACCEPTs refused: an offer not outstanding, or tasks needing more than the offers held.
    pub refused: u32,
    pub declined_offers: u32,
    pub offers_sent: u32,
    pub suppresses: u32,
    pub revives: u32,
    pub acknowledged: u32,
    pub kills: u32,
    pub reconciles: u32,
    pub launched: u32,
}

pub struct AgentSpec {
    pub id: &'static str,
    pub cpus: f64,
    pub mem_mb: f64,
    pub ports: (u64, u64),
}

struct Agent {
    cpus: f64,
    mem_mb: f64,
    ports: (u64, u64),
    used_cpus: f64,
    used_mem: f64,
    used_ports: BTreeSet<u64>,
    lost: bool,
}

struct OfferRec {
    agent: String,
    cpus: f64,
    mem_mb: f64,
    ports: Vec<u64>,
}

struct TaskRec {
    agent: String,
    cpus: f64,
    mem_mb: f64,
    port: u64,
    state: TaskState,
    /// Stops the task's process; the watcher then reports the given state.
    stop: Option<oneshot::Sender<TaskState>>,
}

struct State {
    agents: BTreeMap<String, Agent>,
    offers: BTreeMap<String, OfferRec>,
    tasks: BTreeMap<String, TaskRec>,
    frameworks: BTreeSet<String>,
    stream: Option<(String, mpsc::Sender<Bytes>)>,
    leader: usize,
    ports: [u16; 2],
    suppressed: bool,
    counts: Counts,
    next: u64,
    heartbeat_seconds: f64,
    /// Offers carry at most this much memory each (partial offers), if set.
    offer_cap_mb: Option<f64>,
    /// The stream stays open but carries nothing, heartbeats included, until a new subscription.
    silent: bool,
}

#[derive(Clone)]
pub struct FakeMaster {
    state: Arc<Mutex<State>>,
}

impl FakeMaster {
    /// Starts the master on two loopback addresses (the first leads) with these agents,
    /// offering what is free every `offer_every`.
    pub async fn start(agents: Vec<AgentSpec>, offer_every: Duration) -> FakeMaster {
        let listeners = [
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        ];
        let ports = [listeners[0].local_addr().unwrap().port(), listeners[1].local_addr().unwrap().port()];
        let agents = agents
            .into_iter()
            .map(|a| {
                let agent = Agent {
                    cpus: a.cpus,
                    mem_mb: a.mem_mb,
                    ports: a.ports,
                    used_cpus: 0.0,
                    used_mem: 0.0,
                    used_ports: BTreeSet::new(),
                    lost: false,
                };
                (a.id.to_string(), agent)
            })
            .collect();
        let master = FakeMaster {
            state: Arc::new(Mutex::new(State {
                agents,
                offers: BTreeMap::new(),
                tasks: BTreeMap::new(),
                frameworks: BTreeSet::new(),
                stream: None,
                leader: 0,
                ports,
                suppressed: false,
                counts: Counts::default(),
                next: 0,
                heartbeat_seconds: 1.0,
                offer_cap_mb: None,
                silent: false,
            })),
        };
        for (i, listener) in listeners.into_iter().enumerate() {
            let m = master.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let m = m.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req| {
                            let m = m.clone();
                            async move { Ok::<_, Infallible>(m.handle(i, req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
        }
        let m = master.clone();
        tokio::spawn(async move {
            let mut ticks = 0u64;
            loop {
                tokio::time::sleep(offer_every).await;
                ticks += 1;
                m.send_offers();
                let heartbeat = m.state.lock().heartbeat_seconds;
                if (ticks as f64 * offer_every.as_secs_f64()) % heartbeat < offer_every.as_secs_f64() {
                    m.send(event(event::Type::Heartbeat));
                }
            }
        });
        master
    }

    pub fn url(&self, index: usize) -> String {
        format!("http://127.0.0.1:{}", self.state.lock().ports[index])
    }

    pub fn counts(&self) -> Counts {
        self.state.lock().counts.clone()
    }

    /// Tasks running now, by agent.
    pub fn running(&self) -> BTreeMap<String, usize> {
        let state = self.state.lock();
        let mut out = BTreeMap::new();
        for t in state.tasks.values().filter(|t| t.state == TaskState::TaskRunning) {
            *out.entry(t.agent.clone()).or_default() += 1;
        }
        out
    }

    /// Memory used by running tasks per agent never exceeds the agent's: checked by tests.
    pub fn within_capacity(&self) -> bool {
        let state = self.state.lock();
        state.agents.values().all(|a| a.used_mem <= a.mem_mb + 1e-9 && a.used_cpus <= a.cpus + 1e-9)
    }

    pub fn frameworks(&self) -> usize {
        self.state.lock().frameworks.len()
    }

    pub fn task_ids(&self) -> Vec<String> {
        self.state.lock().tasks.keys().cloned().collect()
    }

    /// Rescinds every outstanding offer; returns how many.
    pub fn rescind_all(&self) -> usize {
        let ids: Vec<String> = std::mem::take(&mut self.state.lock().offers).into_keys().collect();
        let n = ids.len();
        self.rescind(ids);
        n
    }

    /// Tells the framework that offers it may hold are void (they are out of the state already).
    fn rescind(&self, ids: Vec<String>) {
        for id in ids {
            let mut e = event(event::Type::Rescind);
            e.rescind = Some(event::Rescind { offer_id: OfferId { value: id } });
            self.send(e);
        }
    }

    /// Each offer then carries at most `mb` of memory: an agent's resources come in pieces, one
    /// more with each round of offers.
    pub fn cap_offers(&self, mb: f64) {
        self.state.lock().offer_cap_mb = Some(mb);
    }

    /// Stops (or resumes) offering, so that a rescinded offer is not replaced at once.
    pub fn pause_offers(&self, paused: bool) {
        self.state.lock().suppressed = paused;
    }

    /// The agent is gone: its tasks die, its offers are rescinded, the framework is told.
    pub fn lose_agent(&self, agent: &str) {
        let mut stops = Vec::new();
        let offers: Vec<String>;
        {
            let mut state = self.state.lock();
            state.agents.get_mut(agent).unwrap().lost = true;
            offers = state.offers.iter().filter(|(_, o)| o.agent == agent).map(|(id, _)| id.clone()).collect();
            for id in &offers {
                state.offers.remove(id);
            }
            for t in state.tasks.values_mut().filter(|t| t.agent == agent) {
                stops.extend(t.stop.take().map(|s| (s, TaskState::TaskLost)));
            }
        }
        self.rescind(offers);
        let mut e = event(event::Type::Failure);
        e.failure = Some(event::Failure { agent_id: Some(AgentId { value: agent.into() }), ..Default::default() });
        self.send(e);
        for (stop, state) in stops {
            let _ = stop.send(state);
        }
    }

    /// Kills a task's process as if it crashed: TASK_FAILED.
    pub fn fail_task(&self, task_id: &str) {
        let stop = self.state.lock().tasks.get_mut(task_id).and_then(|t| t.stop.take());
        if let Some(stop) = stop {
            let _ = stop.send(TaskState::TaskFailed);
        }
    }

    /// The other address becomes the leader; this one answers 307 and its stream ends.
    pub fn fail_over(&self) {
        let mut state = self.state.lock();
        state.leader = 1 - state.leader;
        state.stream = None;
    }

    /// Keeps the event stream open but sends nothing on it, heartbeats included.
    pub fn go_silent(&self) {
        self.state.lock().silent = true;
    }

    /// Ends the event stream without a leader change.
    pub fn drop_stream(&self) {
        self.state.lock().stream = None;
    }

    fn send(&self, e: Event) {
        let state = self.state.lock();
        let sender = state.stream.as_ref().filter(|_| !state.silent).map(|(_, tx)| tx.clone());
        drop(state);
        if let Some(tx) = sender {
            let _ = tx.try_send(Bytes::from(frame(&e.encode_to_vec())));
        }
    }

    fn update(&self, task_id: &str, agent: &str, state: TaskState, message: &str, with_uuid: bool) {
        let uuid = with_uuid.then(|| {
            let mut s = self.state.lock();
            s.next += 1;
            s.next.to_be_bytes().to_vec()
        });
        let mut e = event(event::Type::Update);
        e.update = Some(event::Update {
            status: TaskStatus {
                task_id: TaskId { value: task_id.into() },
                state: state as i32,
                message: Some(message.into()),
                agent_id: Some(AgentId { value: agent.into() }),
                uuid,
                ..Default::default()
            },
        });
        self.send(e);
    }

    /// A new offer per agent of what is free and not offered yet (capped by `cap_offers`).
    fn send_offers(&self) {
        let mut offers = Vec::new();
        {
            let mut state = self.state.lock();
            if state.stream.is_none() || state.suppressed {
                return;
            }
            let framework = state.frameworks.iter().next_back().cloned().unwrap_or_default();
            let cap = state.offer_cap_mb;
            let mut made = Vec::new();
            for (id, a) in &state.agents {
                if a.lost {
                    continue;
                }
                // What is neither used by tasks nor already in an outstanding offer.
                let offered = state.offers.values().filter(|o| &o.agent == id);
                let (mut cpus, mut mem) = (a.cpus - a.used_cpus, a.mem_mb - a.used_mem);
                let mut taken: BTreeSet<u64> = a.used_ports.clone();
                for o in offered {
                    cpus -= o.cpus;
                    mem -= o.mem_mb;
                    taken.extend(o.ports.iter().copied());
                }
                let mut ports: Vec<u64> = (a.ports.0..=a.ports.1).filter(|p| !taken.contains(p)).collect();
                if mem < 1.0 || cpus < 0.01 || ports.is_empty() {
                    continue;
                }
                if let Some(cap) = cap.filter(|&cap| cap < mem) {
                    // A partial offer: a slice of what is free, the rest in later offers.
                    cpus *= cap / mem;
                    mem = cap;
                    ports.truncate(5);
                }
                made.push((id.clone(), cpus, mem, ports));
            }
            for (agent, cpus, mem, ports) in made {
                state.next += 1;
                let offer_id = format!("offer-{}", state.next);
                offers.push(Offer {
                    id: OfferId { value: offer_id.clone() },
                    framework_id: FrameworkId { value: framework.clone() },
                    agent_id: AgentId { value: agent.clone() },
                    hostname: "127.0.0.1".into(),
                    resources: vec![
                        scalar("cpus", cpus),
                        scalar("mem", mem),
                        Resource {
                            name: "ports".into(),
                            r#type: value::Type::Ranges as i32,
                            ranges: Some(value::Ranges {
                                range: ports.iter().map(|&p| value::Range { begin: p, end: p }).collect(),
                            }),
                            ..Default::default()
                        },
                    ],
                });
                state.offers.insert(offer_id, OfferRec { agent, cpus, mem_mb: mem, ports });
                state.counts.offers_sent += 1;
            }
        }
        if !offers.is_empty() {
            let mut e = event(event::Type::Offers);
            e.offers = Some(event::Offers { offers });
            self.send(e);
        }
    }

    async fn handle(&self, index: usize, req: Request<Incoming>) -> Response<Body> {
        let (leader, leader_port) = {
            let s = self.state.lock();
            (s.leader, s.ports[s.leader])
        };
        if index != leader {
            return Response::builder()
                .status(StatusCode::TEMPORARY_REDIRECT)
                .header("location", format!("127.0.0.1:{leader_port}"))
                .body(empty())
                .unwrap();
        }
        if req.uri().path() != "/api/v1/scheduler" {
            return status(StatusCode::NOT_FOUND, "no such endpoint");
        }
        let stream_id = req.headers().get("mesos-stream-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return status(StatusCode::BAD_REQUEST, "unreadable body"),
        };
        let Ok(call) = Call::decode(body) else { return status(StatusCode::BAD_REQUEST, "not a Call") };
        if call.r#type == call::Type::Subscribe as i32 {
            return self.subscribe(call);
        }
        let current = self.state.lock().stream.as_ref().map(|(id, _)| id.clone());
        if current.is_none() || current != stream_id {
            return status(StatusCode::FORBIDDEN, "not subscribed with this Mesos-Stream-Id");
        }
        match call::Type::try_from(call.r#type) {
            Ok(call::Type::Accept) => self.accept(call.accept.unwrap_or_default()),
            Ok(call::Type::Decline) => {
                let mut state = self.state.lock();
                for id in call.decline.unwrap_or_default().offer_ids {
                    if state.offers.remove(&id.value).is_some() {
                        state.counts.declined_offers += 1;
                    }
                }
            }
            Ok(call::Type::Kill) => {
                let task_id = call.kill.map(|k| k.task_id.value).unwrap_or_default();
                let stop = {
                    let mut state = self.state.lock();
                    state.counts.kills += 1;
                    state.tasks.get_mut(&task_id).and_then(|t| t.stop.take())
                };
                if let Some(stop) = stop {
                    let _ = stop.send(TaskState::TaskKilled);
                }
            }
            Ok(call::Type::Acknowledge) => self.state.lock().counts.acknowledged += 1,
            Ok(call::Type::Reconcile) => {
                let tasks: Vec<(String, String, TaskState)> = {
                    let mut state = self.state.lock();
                    state.counts.reconciles += 1;
                    state.tasks.iter().map(|(id, t)| (id.clone(), t.agent.clone(), t.state)).collect()
                };
                for (id, agent, state) in tasks {
                    self.update(&id, &agent, state, "reconciliation", false);
                }
            }
            Ok(call::Type::Suppress) => {
                let mut state = self.state.lock();
                state.suppressed = true;
                state.counts.suppresses += 1;
            }
            Ok(call::Type::Revive) => {
                let mut state = self.state.lock();
                state.suppressed = false;
                state.counts.revives += 1;
            }
            _ => return status(StatusCode::BAD_REQUEST, "unsupported call"),
        }
        Response::builder().status(StatusCode::ACCEPTED).body(empty()).unwrap()
    }

    fn subscribe(&self, call: Call) -> Response<Body> {
        let (tx, rx) = mpsc::channel::<Bytes>(1024);
        let (stream_id, framework_id, heartbeat) = {
            let mut state = self.state.lock();
            state.counts.subscribes += 1;
            state.next += 1;
            let asked = call.subscribe.and_then(|s| s.framework_info.id).map(|id| id.value);
            let framework_id = match asked {
                Some(id) if state.frameworks.contains(&id) => id,
                _ => format!("framework-{}", state.next),
            };
            state.frameworks.insert(framework_id.clone());
            let stream_id = format!("stream-{}", state.next);
            state.stream = Some((stream_id.clone(), tx.clone()));
            state.offers.clear();
            state.suppressed = false;
            state.silent = false;
            (stream_id, framework_id, state.heartbeat_seconds)
        };
        let mut e = event(event::Type::Subscribed);
        e.subscribed = Some(event::Subscribed {
            framework_id: FrameworkId { value: framework_id },
            heartbeat_interval_seconds: Some(heartbeat),
        });
        let _ = tx.try_send(Bytes::from(frame(&e.encode_to_vec())));
        drop(tx);
        // The stream ends when the master drops its sender (a new subscription, a failover).
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
        });
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/x-protobuf")
            .header("mesos-stream-id", stream_id)
            .body(BodyExt::boxed_unsync(StreamBody::new(frames)))
            .unwrap()
    }

    fn accept(&self, accept: call::Accept) {
        let tasks: Vec<TaskInfo> =
            accept.operations.into_iter().filter_map(|o| o.launch).flat_map(|l| l.task_infos).collect();
        let verdict = {
            let mut state = self.state.lock();
            state.counts.accepts += 1;
            let ids: Vec<String> = accept.offer_ids.iter().map(|o| o.value.clone()).collect();
            let offers: Vec<&OfferRec> = ids.iter().filter_map(|id| state.offers.get(id)).collect();
            let agents: BTreeSet<&String> = offers.iter().map(|o| &o.agent).collect();
            let (cpus, mem): (f64, f64) = offers.iter().fold((0.0, 0.0), |(c, m), o| (c + o.cpus, m + o.mem_mb));
            let offered_ports: BTreeSet<u64> = offers.iter().flat_map(|o| o.ports.iter().copied()).collect();
            let need = |name: &str| -> f64 {
                tasks
                    .iter()
                    .flat_map(|t| &t.resources)
                    .filter(|r| r.name == name)
                    .filter_map(|r| r.scalar)
                    .map(|s| s.value)
                    .sum()
            };
            let ports: Vec<u64> = tasks.iter().flat_map(task_ports).collect();
            let ports_ok = ports.iter().all(|p| offered_ports.contains(p))
                && ports.iter().collect::<BTreeSet<_>>().len() == ports.len();
            let valid_offers = offers.len() == ids.len() && agents.len() == 1;
            let fits = need("cpus") <= cpus + 1e-9 && need("mem") <= mem + 1e-9 && ports_ok;
            let agent = agents.iter().next().map(|a| a.to_string());
            for id in &ids {
                state.offers.remove(id);
            }
            match (valid_offers && fits, agent) {
                (true, Some(agent)) => Ok(agent),
                _ => {
                    state.counts.refused += 1;
                    Err(if valid_offers {
                        "the tasks need more than the offers hold"
                    } else {
                        "an offer is no longer valid"
                    })
                }
            }
        };
        match verdict {
            Ok(agent) => {
                for task in tasks {
                    self.launch(&agent, task);
                }
            }
            Err(why) => {
                for task in tasks {
                    let state = if why.contains("offer") { TaskState::TaskDropped } else { TaskState::TaskError };
                    self.update(&task.task_id.value, &task.agent_id.value, state, why, true);
                }
            }
        }
    }

    fn launch(&self, agent: &str, task: TaskInfo) {
        let resource = |name: &str| {
            task.resources.iter().filter(|r| r.name == name).filter_map(|r| r.scalar).map(|s| s.value).sum::<f64>()
        };
        let (cpus, mem) = (resource("cpus"), resource("mem"));
        let port = task_ports(&task).first().copied().unwrap_or(0);
        let task_id = task.task_id.value.clone();
        let command = task.command.unwrap_or_default();
        let (stop_tx, stop_rx) = oneshot::channel();
        {
            let mut state = self.state.lock();
            let a = state.agents.get_mut(agent).unwrap();
            a.used_cpus += cpus;
            a.used_mem += mem;
            a.used_ports.insert(port);
            state.counts.launched += 1;
            let rec = TaskRec {
                agent: agent.into(),
                cpus,
                mem_mb: mem,
                port,
                state: TaskState::TaskStaging,
                stop: Some(stop_tx),
            };
            state.tasks.insert(task_id.clone(), rec);
        }
        self.update(&task_id, agent, TaskState::TaskStaging, "staging", true);
        let mut argv = command.arguments.clone();
        if argv.is_empty() {
            argv.push(command.value.clone().unwrap_or_default());
        }
        // The task's sandbox, as an agent makes one (and removes with the task).
        let sandbox = tempfile::Builder::new().prefix("fake-mesos-sandbox-").tempdir().unwrap();
        let mut process = tokio::process::Command::new(&argv[0]);
        process
            .args(&argv[1..])
            .current_dir(sandbox.path())
            .env("MESOS_SANDBOX", sandbox.path())
            .env("TMPDIR", sandbox.path())
            .kill_on_drop(true)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        for v in command.environment.map(|e| e.variables).unwrap_or_default() {
            process.env(v.name, v.value.unwrap_or_default());
        }
        let spawned = process.spawn();
        let master = self.clone();
        let agent = agent.to_string();
        tokio::spawn(async move {
            let mut child = match spawned {
                Ok(child) => child,
                Err(e) => return master.finish(&task_id, &agent, TaskState::TaskFailed, &e.to_string()),
            };
            master.set_state(&task_id, TaskState::TaskRunning);
            master.update(&task_id, &agent, TaskState::TaskRunning, "running", true);
            let ended = tokio::select! {
                status = child.wait() => (TaskState::TaskFailed, format!("the process exited: {status:?}")),
                asked = stop_rx => {
                    let _ = child.kill().await;
                    (asked.unwrap_or(TaskState::TaskKilled), "stopped".to_string())
                }
            };
            master.finish(&task_id, &agent, ended.0, &ended.1);
            drop(sandbox);
        });
    }

    fn set_state(&self, task_id: &str, to: TaskState) {
        if let Some(t) = self.state.lock().tasks.get_mut(task_id) {
            t.state = to;
        }
    }

    /// A task ended: its resources are free again and the framework hears of it.
    fn finish(&self, task_id: &str, agent: &str, to: TaskState, message: &str) {
        {
            let mut state = self.state.lock();
            let Some(t) = state.tasks.get_mut(task_id) else { return };
            t.state = to;
            let (cpus, mem, port) = (t.cpus, t.mem_mb, t.port);
            if let Some(a) = state.agents.get_mut(agent) {
                a.used_cpus -= cpus;
                a.used_mem -= mem;
                a.used_ports.remove(&port);
            }
        }
        self.update(task_id, agent, to, message, true);
    }
}

fn task_ports(task: &TaskInfo) -> Vec<u64> {
    task.resources
        .iter()
        .filter(|r| r.name == "ports")
        .flat_map(|r| r.ranges.iter().flat_map(|rs| rs.range.iter()))
        .flat_map(|r| r.begin..=r.end)
        .collect()
}

fn scalar(name: &str, value: f64) -> Resource {
    Resource {
        name: name.into(),
        r#type: value::Type::Scalar as i32,
        scalar: Some(value::Scalar { value }),
        ..Default::default()
    }
}

fn event(t: event::Type) -> Event {
    Event { r#type: Some(t as i32), ..Default::default() }
}

fn empty() -> Body {
    Full::new(Bytes::new()).boxed_unsync()
}

fn status(code: StatusCode, message: &str) -> Response<Body> {
    Response::builder().status(code).body(Full::new(Bytes::from(message.to_string())).boxed_unsync()).unwrap()
}
