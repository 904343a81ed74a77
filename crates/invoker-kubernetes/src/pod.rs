//! The action pod, made and read without any I/O: the Pod the factory creates for a container
//! (bound to the node the pool chose, Guaranteed QoS, locked down), and what a Pod the API
//! server shows says about it (pending, ready at an address, failed and why).

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSecurityContext, PodSpec, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext, TCPSocketAction, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

/// The labels every action pod carries; `invoker-id` is what a restart cleans up by.
pub const LABEL_INVOKER: &str = "invoker-id";
pub const LABEL_RUN: &str = "invoker-run";
const LABEL_ACTION: &str = "invoker-action";
const LABEL_KIND: &str = "invoker-kind";
/// The runtime's container in the pod, whose log the factory follows.
pub const CONTAINER: &str = "main";
/// The uid and gid the runtime runs as (nobody), whatever the image says.
const NOBODY: i64 = 65534;
/// Waiting reasons that say the image cannot be had.
const NO_IMAGE: &[&str] = &["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"];
/// Container waiting reasons that will not resolve by waiting.
const HOPELESS: &[&str] =
    &["CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"];

/// How the pods of one kind are made.
#[derive(Clone, Debug)]
pub struct PodTemplate {
    pub image: String,
    /// Empty: the image's entry point.
    pub command: Vec<String>,
    pub port: u16,
    pub pull_policy: String,
    pub tolerations: Vec<Toleration>,
    /// For an Fn kind that takes its code as text: the file it goes to in `/function`.
    pub code_file: Option<String>,
    /// For an Fn kind: how long the function has to make its listener.
    pub start_timeout: std::time::Duration,
}

/// What one pod is made for.
pub struct PodRequest<'a> {
    pub name: &'a str,
    pub node: &'a str,
    pub memory_mb: u32,
    /// `limits.disk`: the writable `/tmp` and `/dev/shm` (the root filesystem is read-only).
    pub disk_mb: u32,
    pub cpus_per_gb: f64,
    pub invoker_id: &'a str,
    pub run: &'a str,
    pub kind: &'a str,
    pub action: &'a str,
}

/// A label value: at most 63 of `[A-Za-z0-9._-]`, starting and ending alphanumeric.
pub fn label_value(s: &str) -> String {
    let cleaned: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    let cut: String = cleaned.chars().take(63).collect();
    cut.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

/// A pod name unique over the invoker's runs: `inv-<invoker>-<run>-<container>`, a DNS-1123
/// subdomain whatever the invoker id holds.
pub fn pod_name(invoker_id: &str, run: &str, container: u64) -> String {
    let invoker: String = invoker_id
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    format!("inv-{}-{run}-{container}", invoker.trim_matches('-'))
}

pub fn build_pod(template: &PodTemplate, r: &PodRequest<'_>) -> Pod {
    let labels = BTreeMap::from([
        (LABEL_INVOKER.to_string(), label_value(r.invoker_id)),
        (LABEL_RUN.to_string(), label_value(r.run)),
        (LABEL_ACTION.to_string(), label_value(r.action)),
        (LABEL_KIND.to_string(), label_value(r.kind)),
    ]);
    let millicpu = ((f64::from(r.memory_mb) / 1024.0 * r.cpus_per_gb * 1000.0).round() as u64).max(10);
    let disk = Quantity(format!("{}Mi", r.disk_mb));
    // Requests equal limits: Guaranteed QoS, the last to be evicted, and what the offers count.
    // The kubelet places by the ephemeral-storage request and evicts a pod past its limit.
    let resources = BTreeMap::from([
        ("memory".to_string(), Quantity(format!("{}Mi", r.memory_mb))),
        ("cpu".to_string(), Quantity(format!("{millicpu}m"))),
        ("ephemeral-storage".to_string(), disk.clone()),
    ]);
    let listen = format!("$(POD_IP):$({PORT_VAR})");
    let command: Vec<String> = template.command.iter().map(|a| a.replace("{listen}", &listen)).collect();
    let env = vec![
        EnvVar { name: PORT_VAR.into(), value: Some(template.port.to_string()), ..Default::default() },
        EnvVar {
            name: "POD_IP".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector { field_path: "status.podIP".into(), ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let container = Container {
        name: CONTAINER.into(),
        image: Some(template.image.clone()),
        image_pull_policy: Some(template.pull_policy.clone()),
        command: (!command.is_empty()).then_some(command),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: i32::from(template.port),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(resources.clone()),
            limits: Some(resources),
            ..Default::default()
        }),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction { port: IntOrString::String("http".into()), ..Default::default() }),
            period_seconds: Some(1),
            failure_threshold: Some(1),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount { name: "tmp".into(), mount_path: "/tmp".into(), ..Default::default() },
            VolumeMount { name: "shm".into(), mount_path: "/dev/shm".into(), ..Default::default() },
        ]),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta { name: Some(r.name.to_string()), labels: Some(labels), ..Default::default() },
        spec: Some(PodSpec {
            // Bound here: the pool placed it, within what the node offers, as a scheduler would.
            node_name: Some(r.node.to_string()),
            containers: vec![container],
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(0),
            tolerations: (!template.tolerations.is_empty()).then(|| template.tolerations.clone()),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(NOBODY),
                run_as_group: Some(NOBODY),
                seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
                ..Default::default()
            }),
            // `/dev/shm` in memory (counted in the memory limit), as a container runtime makes it,
            // but of the action's size rather than the runtime's 64 MB.
            volumes: Some(vec![
                Volume {
                    name: "tmp".into(),
                    empty_dir: Some(EmptyDirVolumeSource { size_limit: Some(disk.clone()), ..Default::default() }),
                    ..Default::default()
                },
                Volume {
                    name: "shm".into(),
                    empty_dir: Some(EmptyDirVolumeSource { medium: Some("Memory".into()), size_limit: Some(disk) }),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The variable holding the runtime's port (`{listen}` is `$(POD_IP):$(PORT)`).
const PORT_VAR: &str = "PORT";

/// The annotation an Fn function's code travels in, shown to it as a file by the downward API.
pub const CODE_ANNOTATION: &str = "invoker.dev/code";
/// The most code an Fn function may have on Kubernetes: a pod's annotations are 256 KiB at most.
pub const CODE_MAX_BYTES: usize = 200 * 1024;
/// The bridge's container in an Fn pod.
pub const BRIDGE: &str = "fn-bridge";
/// Where the function's code is, inside its container.
const CODE_DIR: &str = "/function";

/// An Fn function's pod: the function in `main` (its log is the one followed), its socket
/// directory an in-memory `emptyDir` at `/tmp/iofs` that `invoker fn-bridge` shares beside it
/// and offers on the pod's port once the function is ready (the pod is Ready then, not
/// before); its code, for a kind that takes it, a read-only file in `/function` from the pod's
/// own annotation; a function with an image of its own (`fn:image`) runs that image's entry
/// point, pulled as the kind's `image_pull_policy` says. The bridge's memory comes out of the
/// action's: the pod holds no more than the pool reserved. Everything else (binding, QoS,
/// lockdown, labels) as any action pod.
pub fn build_function_pod(
    template: &PodTemplate,
    r: &PodRequest<'_>,
    function: &invoker_factory::contract::FunctionStart,
    bridge: &invoker_factory::settings::FnBridgeConfig,
) -> Pod {
    use invoker_wire::runtime::{FN_LISTENER as LISTENER, FN_SOCKET_DIR as SOCKET_DIR};
    let mut pod = build_pod(template, &PodRequest { memory_mb: r.memory_mb.saturating_sub(bridge.memory_mb), ..*r });
    let spec = pod.spec.as_mut().expect("built with a spec");
    let mut bridge_container = spec.containers[0].clone();
    let main = &mut spec.containers[0];
    let command: Vec<String> = template.command.iter().map(|a| a.replace("{main}", &function.main)).collect();
    main.command = (!command.is_empty()).then_some(command);
    if let Some(image) = &function.image {
        main.image = Some(image.clone());
        main.command = None;
    }
    let mut env: Vec<EnvVar> = function
        .env
        .iter()
        .map(|(k, v)| EnvVar { name: k.clone(), value: Some(v.clone()), ..Default::default() })
        .collect();
    env.push(EnvVar {
        name: "FN_LISTENER".into(),
        value: Some(format!("unix:{SOCKET_DIR}/{LISTENER}")),
        ..Default::default()
    });
    main.env = Some(env);
    main.ports = None;
    main.readiness_probe = None;
    let iofs = VolumeMount { name: "iofs".into(), mount_path: SOCKET_DIR.into(), ..Default::default() };
    let mounts = main.volume_mounts.get_or_insert_with(Vec::new);
    mounts.push(iofs.clone());
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.push(Volume {
        name: "iofs".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity("1Mi".into())),
        }),
        ..Default::default()
    });
    if let (Some(file), Some(code)) = (&template.code_file, &function.code) {
        main.working_dir = Some(CODE_DIR.into());
        mounts.push(VolumeMount {
            name: "function".into(),
            mount_path: CODE_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "function".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: file.clone(),
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.annotations['{CODE_ANNOTATION}']"),
                        ..Default::default()
                    }),
                    mode: Some(0o444),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
        pod.metadata.annotations = Some(BTreeMap::from([(CODE_ANNOTATION.to_string(), code.clone())]));
    }
    // The bridge: the runtime container's port, probe and lockdown, its own command and memory.
    bridge_container.name = BRIDGE.into();
    bridge_container.image = Some(bridge.image.clone());
    let timeout = humantime::format_duration(template.start_timeout).to_string();
    let listen = format!("$(POD_IP):$({PORT_VAR})");
    let mut command = bridge.command.clone();
    command.extend(["--dir", SOCKET_DIR, "--listen", &listen, "--start-timeout", &timeout].map(String::from));
    bridge_container.command = Some(command);
    bridge_container.volume_mounts = Some(vec![iofs]);
    bridge_container.termination_message_policy = Some("FallbackToLogsOnError".into());
    let small = BTreeMap::from([
        ("memory".to_string(), Quantity(format!("{}Mi", bridge.memory_mb))),
        ("cpu".to_string(), Quantity("10m".into())),
        ("ephemeral-storage".to_string(), Quantity("1Mi".into())),
    ]);
    bridge_container.resources =
        Some(ResourceRequirements { requests: Some(small.clone()), limits: Some(small), ..Default::default() });
    // After the function: a kubelet starts them in order, so the bridge's wait for the
    // listener begins once the function runs.
    spec.containers.push(bridge_container);
    pod
}

/// What the API server's copy of a pod says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Not yet Ready (scheduling, pulling, starting).
    Pending,
    /// Ready, its runtime at this address (the pod's IP and its container's port).
    Ready(SocketAddr),
    /// The kubelet refused it for want of a resource (`OutOfmemory`, `OutOfcpu`).
    Refused(String),
    /// Its image cannot be pulled.
    NoImage(String),
    /// It failed, ended, or cannot start (a crash).
    Failed(String),
    /// No such pod.
    Gone,
}

pub fn pod_state(pod: Option<&Pod>) -> PodState {
    let Some(pod) = pod else { return PodState::Gone };
    if pod.metadata.deletion_timestamp.is_some() {
        return PodState::Gone;
    }
    let Some(status) = pod.status.as_ref() else { return PodState::Pending };
    let why = || {
        let reason = status.reason.clone().unwrap_or_default();
        let message = status.message.clone().unwrap_or_default();
        format!("{reason}: {message}").trim_matches([' ', ':']).to_string()
    };
    match status.phase.as_deref() {
        Some("Failed") if status.reason.as_deref().is_some_and(|r| r.starts_with("OutOf")) => {
            return PodState::Refused(why())
        }
        Some("Failed") => return PodState::Failed(format!("the pod failed ({})", why())),
        Some("Succeeded") => return PodState::Failed("the pod's runtime exited".into()),
        _ => {}
    }
    for c in status.container_statuses.iter().flatten() {
        let state = c.state.as_ref();
        if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
            let reason = w.reason.as_deref().unwrap_or_default();
            let said = || format!("{reason}: {}", w.message.as_deref().unwrap_or_default());
            if NO_IMAGE.contains(&reason) {
                return PodState::NoImage(said());
            }
            if HOPELESS.contains(&reason) {
                return PodState::Failed(said());
            }
        }
        if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            let reason = t.reason.as_deref().unwrap_or("Terminated");
            let who = if c.name == CONTAINER { "the runtime".to_string() } else { format!("its {}", c.name) };
            let said = t.message.as_deref().map(|m| format!(": {}", m.trim())).unwrap_or_default();
            return PodState::Failed(format!("{who} exited ({reason}, exit code {}){said}", t.exit_code));
        }
    }
    let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
    let ip = status.pod_ip.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok());
    // The runtime's port, or (an Fn pod) its bridge's: the one container that has one.
    let port = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.ports.as_ref().is_some_and(|p| !p.is_empty())))
        .and_then(|c| c.ports.as_ref()?.first())
        .and_then(|p| u16::try_from(p.container_port).ok());
    match (ready, ip, port) {
        (true, Some(ip), Some(port)) => PodState::Ready(SocketAddr::new(ip, port)),
        _ => PodState::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> PodTemplate {
        PodTemplate {
            image: "invoker-python:latest".into(),
            command: vec!["/invoker".into(), "action-runtime".into(), "--listen".into(), "{listen}".into()],
            port: 8080,
            pull_policy: "IfNotPresent".into(),
            tolerations: Vec::new(),
            code_file: None,
            start_timeout: std::time::Duration::from_secs(5),
        }
    }

    fn request() -> PodRequest<'static> {
        PodRequest {
            name: "inv-x-1-7",
            node: "n1",
            memory_mb: 256,
            disk_mb: 64,
            cpus_per_gb: 1.0,
            invoker_id: "Invoker 0",
            run: "1",
            kind: "python:3",
            action: "guest/hello world",
        }
    }

    #[test]
    fn the_pod_is_bound_guaranteed_and_locked_down() {
        let pod = build_pod(&template(), &request());
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.security_context.as_ref().unwrap().run_as_non_root, Some(true));
        let c = &spec.containers[0];
        let r = c.resources.as_ref().unwrap();
        assert_eq!(r.requests, r.limits, "Guaranteed QoS");
        assert_eq!(r.limits.as_ref().unwrap()["memory"], Quantity("256Mi".into()));
        assert_eq!(r.limits.as_ref().unwrap()["cpu"], Quantity("250m".into()));
        assert_eq!(r.limits.as_ref().unwrap()["ephemeral-storage"], Quantity("64Mi".into()));
        let volumes = spec.volumes.as_ref().unwrap();
        let sizes: Vec<_> =
            volumes.iter().map(|v| v.empty_dir.as_ref().and_then(|e| e.size_limit.clone()).unwrap()).collect();
        assert_eq!(sizes, [Quantity("64Mi".into()), Quantity("64Mi".into())], "/tmp and /dev/shm within the disk");
        let mounts: Vec<_> = c.volume_mounts.as_ref().unwrap().iter().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(mounts, ["/tmp", "/dev/shm"]);
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!((sc.allow_privilege_escalation, sc.read_only_root_filesystem), (Some(false), Some(true)));
        assert_eq!(sc.capabilities.as_ref().unwrap().drop, Some(vec!["ALL".to_string()]));
        assert_eq!(c.command.as_ref().unwrap()[3], "$(POD_IP):$(PORT)");
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels["invoker-id"], "Invoker_0");
        assert_eq!(labels["invoker-action"], "guest_hello_world");
    }

    #[test]
    fn an_fn_pods_address_is_its_bridges_and_a_bridge_that_ended_says_why() {
        let function = invoker_factory::contract::FunctionStart {
            code: Some("def handler(ctx, data=None):\n    return 'hi'\n".into()),
            main: "handler".into(),
            env: vec![("FN_FORMAT".into(), "http-stream".into())],
            image: None,
        };
        let template = PodTemplate {
            command: vec!["python3".into(), "-m".into(), "fdk".into(), "func.py".into(), "{main}".into()],
            code_file: Some("func.py".into()),
            ..template()
        };
        let mut pod =
            build_function_pod(&template, &request(), &function, &invoker_factory::settings::FnBridgeConfig::default());
        let spec = pod.spec.as_ref().unwrap();
        let (main, bridge) = (&spec.containers[0], &spec.containers[1]);
        assert_eq!(main.command.as_ref().unwrap()[4], "handler");
        assert!(main.ports.is_none() && main.readiness_probe.is_none());
        let listener = main.env.as_ref().unwrap().iter().find(|e| e.name == "FN_LISTENER").unwrap();
        assert_eq!(listener.value.as_deref(), Some("unix:/tmp/iofs/lsnr.sock"));
        assert_eq!(bridge.command.as_ref().unwrap()[..2], ["/invoker".to_string(), "fn-bridge".to_string()]);
        assert_eq!(bridge.command.as_ref().unwrap().last().map(String::as_str), Some("5s"));
        let memory = |c: &Container| c.resources.as_ref().unwrap().limits.as_ref().unwrap()["memory"].clone();
        assert_eq!((memory(main), memory(bridge)), (Quantity("240Mi".into()), Quantity("16Mi".into())));
        pod.status = Some(
            serde_json::from_value(serde_json::json!({"phase": "Running", "podIP": "10.0.0.9",
                "conditions": [{"type": "Ready", "status": "True"}]}))
            .unwrap(),
        );
        assert_eq!(pod_state(Some(&pod)), PodState::Ready("10.0.0.9:8080".parse().unwrap()));
        pod.status = Some(
            serde_json::from_value(serde_json::json!({"phase": "Running", "containerStatuses": [
                {"name": "main", "ready": false, "restartCount": 0, "image": "x", "imageID": "", "state": {"running": {}}},
                {"name": "fn-bridge", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
                 "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "Error: lsnr.sock links out\n"}}}]}))
            .unwrap(),
        );
        let PodState::Failed(why) = pod_state(Some(&pod)) else { panic!("failed") };
        assert_eq!(why, "its fn-bridge exited (Error, exit code 1): Error: lsnr.sock links out");
    }

    #[test]
    fn names_and_labels_are_what_the_api_server_accepts() {
        assert_eq!(pod_name("Invoker_0.A", "17", 3), "inv-invoker-0-a-17-3");
        assert_eq!(label_value("-_a/b_-"), "a_b");
        assert_eq!(label_value(&"x".repeat(100)).len(), 63);
    }

    fn pod_with(status: serde_json::Value) -> Pod {
        let mut pod = build_pod(&template(), &request());
        pod.status = Some(serde_json::from_value(status).unwrap());
        pod
    }

    #[test]
    fn a_pods_state_is_read_from_its_status() {
        assert_eq!(pod_state(None), PodState::Gone);
        assert_eq!(pod_state(Some(&pod_with(serde_json::json!({"phase": "Pending"})))), PodState::Pending);
        let ready = serde_json::json!({"phase": "Running", "podIP": "10.0.0.5",
            "conditions": [{"type": "Ready", "status": "True"}]});
        assert_eq!(pod_state(Some(&pod_with(ready))), PodState::Ready("10.0.0.5:8080".parse().unwrap()));
        let not_ready = serde_json::json!({"phase": "Running", "podIP": "10.0.0.5",
            "conditions": [{"type": "Ready", "status": "False"}]});
        assert_eq!(pod_state(Some(&pod_with(not_ready))), PodState::Pending);
        let refused = serde_json::json!({"phase": "Failed", "reason": "OutOfmemory", "message": "no room"});
        assert_eq!(pod_state(Some(&pod_with(refused))), PodState::Refused("OutOfmemory: no room".into()));
        let pull = serde_json::json!({"phase": "Pending", "containerStatuses": [{"name": "main", "ready": false,
            "restartCount": 0, "image": "x", "imageID": "", "state": {"waiting": {"reason": "ErrImagePull", "message": "denied"}}}]});
        assert!(matches!(pod_state(Some(&pod_with(pull))), PodState::NoImage(m) if m.contains("ErrImagePull")));
        let evicted = serde_json::json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"});
        assert!(matches!(pod_state(Some(&pod_with(evicted))), PodState::Failed(m) if m.contains("Evicted")));
    }
}
