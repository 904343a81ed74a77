//! An Fn function in a Docker container, as Fn's agent runs one: a fresh socket directory bound
//! at `/tmp/iofs` (mode 0777, on the container's own small disk), the function's code (for a
//! kind that takes it) read-only at `/function`, Fn's environment, the kind's command or the
//! image's entry point, no network; ready when `lsnr.sock` appears (`fn_socket`).

use super::{own_disk, DockerFactory, Live, LABEL_ACTION, LABEL_CONTAINER, LABEL_INVOKER, SOCKET_DIR_MB};
use crate::config::DockerKindConfig;
use crate::factory::fn_socket::ListenerWatch;
use crate::factory::logs::LogBuffer;
use crate::factory::{ContainerFactory as _, ContainerHandle, ContainerSpec, FactoryError, FunctionStart, Transport};
use crate::pool::core::NodeId;
use crate::proxy::protocol::fn_stream;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::CreateContainerOptions;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Where the function's code is, inside the container.
const CODE_DIR: &str = "/function";

impl DockerFactory {
    pub(super) async fn create_function(
        &self,
        spec: &ContainerSpec,
        function: &FunctionStart,
        kind: &DockerKindConfig,
        node: &NodeId,
    ) -> Result<ContainerHandle, FactoryError> {
        let inner = &self.inner;
        let _slot = inner.creates.acquire().await.map_err(|e| FactoryError::Create(e.to_string()))?;
        let dir = self.container_dir(spec.id);
        let code = match &kind.code_file {
            Some(file) => {
                let code = function.code.clone();
                Some((
                    file.clone(),
                    code.ok_or_else(|| FactoryError::Create(format!("the action has no code for {file}")))?,
                ))
            }
            None => None,
        };
        let (at, owner, with_code) = (dir.clone(), inner.owner, code.clone());
        let prepared = tokio::task::spawn_blocking(move || prepare_function_dir(&at, owner, with_code))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        if let Err(e) = prepared {
            self.forget(spec.id).await;
            return Err(FactoryError::Create(format!("{}: {e}", dir.display())));
        }
        let sockets = dir.join("iofs");
        // Set up before the function starts, so that its listener is never missed.
        let watch = match ListenerWatch::on(&sockets) {
            Ok(watch) => watch,
            Err(e) => {
                self.forget(spec.id).await;
                return Err(FactoryError::Create(e.to_string()));
            }
        };
        let body = self.function_body(spec, function, kind, &dir, code.is_some());
        let name = format!("invoker-{}-{}", inner.invoker_id, spec.id.0);
        let options = CreateContainerOptions { name: Some(name), ..Default::default() };
        inner.live.lock().insert(spec.id, Live { docker_id: String::new(), memory_mb: spec.memory_mb });
        self.observe();
        let docker_id = match inner.docker.create_container(Some(options), body).await {
            Ok(c) => c.id,
            Err(e) => {
                self.forget(spec.id).await;
                let no_image = matches!(e, bollard::errors::Error::DockerResponseServerError { status_code: 404, .. });
                let said = format!("image {}: {e}", kind.image);
                return Err(if no_image { FactoryError::Image(said) } else { FactoryError::Create(said) });
            }
        };
        if let Some(live) = inner.live.lock().get_mut(&spec.id) {
            live.docker_id = docker_id.clone();
        }
        if let Err(e) = inner.docker.start_container(&docker_id, None).await {
            self.remove(spec.id).await;
            return Err(FactoryError::Create(e.to_string()));
        }
        let logs = Arc::new(LogBuffer::default());
        self.follow_logs(&docker_id, logs.clone());
        let bound = inner.config.ready_timeout.min(Duration::from_secs(5));
        let ready = tokio::select! {
            ready = watch.ready() => ready.map_err(|e| FactoryError::Create(format!("the function's socket: {e}"))),
            code = self.exited(&docker_id) => {
                Err(FactoryError::Create(format!("the function exited before it was ready (code {code})")))
            }
            () = tokio::time::sleep(bound) => Err(FactoryError::NotReady(bound)),
        };
        match ready {
            Ok(listener) => Ok(ContainerHandle {
                id: spec.id,
                node: node.clone(),
                transport: Transport::Unix(listener),
                logs,
                ready_at: inner.host.now(),
            }),
            Err(e) => {
                self.remove(spec.id).await;
                Err(e)
            }
        }
    }

    /// Resolves with the exit code once the container stopped (polled: a start that fails is
    /// seen within 100 ms).
    async fn exited(&self, docker_id: &str) -> i64 {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let state = self.inner.docker.inspect_container(docker_id, None).await.ok().and_then(|c| c.state);
            if let Some(state) = state.filter(|s| s.running == Some(false)) {
                return state.exit_code.unwrap_or(-1);
            }
        }
    }

    fn function_body(
        &self,
        spec: &ContainerSpec,
        function: &FunctionStart,
        kind: &DockerKindConfig,
        dir: &Path,
        with_code: bool,
    ) -> ContainerCreateBody {
        let c = &self.inner.config;
        let memory = i64::from(spec.memory_mb) * 1024 * 1024;
        let mut binds = vec![format!("{}:{}", dir.join("iofs").display(), fn_stream::SOCKET_DIR)];
        if with_code {
            binds.push(format!("{}:{CODE_DIR}:ro", dir.join("code").display()));
        }
        let host = HostConfig {
            memory: Some(memory),
            memory_swap: Some(memory),
            cpu_shares: Some((i64::from(spec.memory_mb) * 4).max(2)),
            pids_limit: Some(c.pids_limit),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".into(),
                format!("rw,exec,nosuid,nodev,mode=1777,size={}m", spec.disk_mb),
            )])),
            shm_size: Some(i64::from(spec.disk_mb) * 1024 * 1024),
            security_opt: Some(vec!["no-new-privileges".into()]),
            cap_drop: Some(vec!["ALL".into()]),
            network_mode: Some("none".into()),
            binds: Some(binds),
            ..Default::default()
        };
        let labels = HashMap::from([
            (LABEL_INVOKER.to_string(), self.inner.invoker_id.clone()),
            (LABEL_CONTAINER.to_string(), spec.id.0.to_string()),
            (LABEL_ACTION.to_string(), spec.action_path.clone()),
        ]);
        let cmd = (!kind.command.is_empty())
            .then(|| kind.command.iter().map(|a| a.replace("{main}", &function.main)).collect());
        let (listener, listening) = fn_stream::listener_env(fn_stream::SOCKET_DIR);
        let mut env: Vec<String> = function.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        env.push(format!("{listener}={listening}"));
        ContainerCreateBody {
            image: Some(kind.image.clone()),
            cmd,
            user: Some(c.user.clone()),
            labels: Some(labels),
            env: Some(env),
            working_dir: with_code.then(|| CODE_DIR.into()),
            network_disabled: Some(true),
            host_config: Some(host),
            ..Default::default()
        }
    }
}

/// The container's directory on a disk of its own (the socket directory's megabyte, and the
/// code's size): `iofs`, open to the function's user as Fn's agent makes it, and `code` with the
/// function's file.
fn prepare_function_dir(dir: &Path, owner: (u32, u32), code: Option<(String, String)>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let code_mb = code.as_ref().map_or(0, |(_, text)| text.len().div_ceil(1024 * 1024) as u32);
    own_disk::mount_on(dir, SOCKET_DIR_MB + code_mb, owner, 0o700)?;
    let sockets = dir.join("iofs");
    std::fs::create_dir(&sockets)?;
    std::fs::set_permissions(&sockets, std::fs::Permissions::from_mode(0o777))?;
    if let Some((file, text)) = code {
        let code_dir = dir.join("code");
        std::fs::create_dir(&code_dir)?;
        let path = code_dir.join(file);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        std::fs::set_permissions(&code_dir, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}
