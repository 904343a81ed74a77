//! An Fn function made from an image of its own, as `fn deploy --local` makes one, on an
//! invoker with the Docker factory: the image built from the Dockerfile Fn's client writes for
//! `--runtime python` (fn 0.6.63) on Fn's build and run images (`scripts/fn-images.sh`), the
//! function made through `/v2/fns` with that image, K containers kept warm.

use crate::targets::Invoker;
use anyhow::{bail, Context as _};
use std::path::Path;
use std::process::Command;

/// What `fn build` writes for a python function with a `requirements.txt`.
const DOCKERFILE: &str = "FROM fnproject/python:3.12-dev as build-stage
WORKDIR /function
ADD requirements.txt /function/
RUN pip3 install --target /python/ --no-cache --no-cache-dir -r requirements.txt &&\\
    rm -fr ~/.cache/pip /tmp* requirements.txt func.yaml Dockerfile .venv &&\\
    chmod -R o+r /python
ADD . /function/
RUN rm -fr /function/.pip_cache
FROM fnproject/python:3.12
WORKDIR /function
COPY --from=build-stage /python /python
COPY --from=build-stage /function /function
RUN chmod -R o+r /function
ENV PYTHONPATH=/function:/python
ENTRYPOINT [\"/python/bin/fdk\", \"/function/func.py\", \"handler\"]
";

/// The image, named after the guest namespace (the engine's local builds run only for theirs).
pub const IMAGE: &str = "guest/invoker-bench-fn:0.0.1";

/// Builds [`IMAGE`] from `code` with the engine at `socket`.
pub fn build(socket: &Path, code: &str) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("invoker-bench-fn-image-").tempdir()?;
    std::fs::write(dir.path().join("func.py"), code)?;
    std::fs::write(dir.path().join("requirements.txt"), "fdk\n")?;
    std::fs::write(dir.path().join("Dockerfile"), DOCKERFILE)?;
    let built = Command::new("docker")
        .args(["-H", &format!("unix://{}", socket.display()), "build", "-q", "-t", IMAGE])
        .arg(dir.path())
        .output()
        .context("running the docker client (docker.io installs it)")?;
    if !built.status.success() {
        bail!(
            "docker build of {IMAGE} (scripts/build-images.sh makes Fn's images): {}",
            String::from_utf8_lossy(&built.stderr)
        );
    }
    Ok(())
}

/// An invoker on the Docker factory at `socket`, as the rest of the benchmark configures one.
pub fn invoker(exe: &Path, socket: &Path) -> anyhow::Result<Invoker> {
    let config = format!(
        "[factory]\nkind = \"docker\"\n[factory.docker]\nsocket = \"{}\"\n[proxy]\npause_grace = \"0s\"\n",
        socket.display()
    );
    Invoker::start(exe, "fn-image", &config)
}
