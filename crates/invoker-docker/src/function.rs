//! An Fn function in a Docker container, as Fn's agent runs one: a fresh socket directory bound
//! at `/tmp/iofs` (mode 0777, on the container's own small disk), the function's code (for a
//! kind that takes it) read-only at `/function`, Fn's environment, the kind's command or the
//! image's entry point, no network; ready when `lsnr.sock` appears (`fn_socket`).

use super::{own_disk, DockerFactory, SOCKET_DIR_MB};
use bollard::models::{ContainerCreateBody, HostConfig};
use invoker_factory::contract::{ContainerHandle, ContainerSpec, FunctionStart, Transport};
use invoker_factory::error::{CreateError, FactoryError};
use invoker_factory::fn_socket::ListenerWatch;
use invoker_factory::logs::LogBuffer;
use invoker_factory::settings::DockerKindConfig;
use invoker_ids::NodeId;
use invoker_wire::runtime::{fn_listener_env, FN_SOCKET_DIR};
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
        let _slot = inner.creates.acquire().await.map_err(|_| CreateError::Stopped("its create slots closed"))?;
        let dir = self.container_dir(spec.id);
        let code = match &kind.code_file {
            Some(file) => {
                let code = function.code.clone();
                Some((file.clone(), code.ok_or_else(|| CreateError::NoCode(file.clone()))?))
            }
            None => None,
        };
        let (at, owner, with_code) = (dir.clone(), inner.owner, code.clone());
        let prepared = tokio::task::spawn_blocking(move || prepare_function_dir(&at, owner, with_code))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        if let Err(e) = prepared {
            self.forget(spec.id).await;
            return Err(CreateError::Path { path: dir, source: e }.into());
        }
        let sockets = dir.join("iofs");
        // Set up before the function starts, so that its listener is never missed.
        let watch = match ListenerWatch::on(&sockets) {
            Ok(watch) => watch,
            Err(e) => {
                self.forget(spec.id).await;
                return Err(CreateError::Socket(e).into());
            }
        };
        let image = match &function.image {
            // Run by its id: a tag moved after the check changes nothing.
            Some(own) => match self.own_image(own, spec.namespace()).await {
                Ok(id) => id,
                Err(e) => {
                    self.forget(spec.id).await;
                    return Err(e);
                }
            },
            None => kind.image.clone(),
        };
        let body = self.function_body(spec, function, kind, &image, &dir, code.is_some());
        let docker_id = self.create_and_start(spec, &image, body).await?;
        let logs = Arc::new(LogBuffer::default());
        self.follow_logs(&docker_id, logs.clone());
        let bound = inner.config.ready_timeout.min(Duration::from_secs(5));
        let ready = tokio::select! {
            ready = watch.ready() => ready.map_err(|e| CreateError::Socket(e).into()),
            code = self.exited(&docker_id) => {
                Err(CreateError::Exited { what: "function", status: format!("code {code}") }.into())
            }
            () = tokio::time::sleep(bound) => Err(FactoryError::NotReady(bound)),
        };
        match ready {
            Ok(listener) => Ok(ContainerHandle {
                id: spec.id,
                node: node.clone(),
                transport: Transport::Unix(Arc::new(listener)),
                peer: Arc::new(invoker_factory::peer::Peer { cgroup_name: Some(docker_id), ..Default::default() }),
                logs,
                ready_at: self.count_ready(spec).await?,
            }),
            Err(e) => {
                self.remove(spec.id).await;
                Err(e)
            }
        }
    }

    /// A function's own image on the engine, as its id: pulled when the engine lacks it, within
    /// the create's bound; one that cannot be had is the call's failure, in Fn's words. An
    /// image no registry gave the engine (no digest) is run only for a namespace that
    /// `local_images` lets run it: else one tenant could run another's build, and read it.
    async fn own_image(&self, image: &str, namespace: &str) -> Result<String, FactoryError> {
        let docker = &self.inner.docker;
        let held = match docker.inspect_image(image).await {
            Ok(held) => held,
            Err(_) => {
                self.pull(image).await?;
                docker
                    .inspect_image(image)
                    .await
                    .map_err(|e| FactoryError::Image(format!("Failed to pull image '{image}': {e}")))?
            }
        };
        let local = held.repo_digests.as_ref().is_none_or(|digests| digests.is_empty());
        let allowed = self.inner.config.local_images.allows(image, namespace);
        if local && !allowed {
            return Err(FactoryError::ImageNotOwned { image: image.into(), namespace: namespace.into() });
        }
        held.id.ok_or_else(|| FactoryError::Image(format!("Image '{image}' has no id on the engine")))
    }

    async fn pull(&self, image: &str) -> Result<(), FactoryError> {
        let docker = &self.inner.docker;
        let options = bollard::query_parameters::CreateImageOptionsBuilder::new().from_image(image).build();
        let pull = async {
            let mut progress = docker.create_image(Some(options), None, None);
            while let Some(step) = futures_util::StreamExt::next(&mut progress).await {
                step?;
            }
            Ok::<(), bollard::errors::Error>(())
        };
        let bound = self.inner.config.ready_timeout;
        match tokio::time::timeout(bound, pull).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(FactoryError::Image(format!("Failed to pull image '{image}': {e}"))),
            Err(_) => Err(FactoryError::Image(format!("Failed to pull image '{image}': no image within {bound:?}"))),
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
        image: &str,
        dir: &Path,
        with_code: bool,
    ) -> ContainerCreateBody {
        let mut binds = vec![format!("{}:{}", dir.join("iofs").display(), FN_SOCKET_DIR)];
        if with_code {
            binds.push(format!("{}:{CODE_DIR}:ro", dir.join("code").display()));
        }
        let host = HostConfig { binds: Some(binds), ..self.limited_host(spec) };
        let cmd = (!kind.command.is_empty())
            .then(|| kind.command.iter().map(|a| a.replace("{main}", &function.main)).collect());
        let (listener, listening) = fn_listener_env(FN_SOCKET_DIR);
        let mut env: Vec<String> = function.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        env.push(format!("{listener}={listening}"));
        ContainerCreateBody {
            image: Some(image.to_string()),
            cmd,
            user: Some(self.inner.config.user.clone()),
            labels: Some(self.labels(spec)),
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
