//! An Fn function's warm call through the invoker (`POST /invoke/{fn_id}`) against the same
//! function's FDK called directly over its unix socket (`POST /call`), alternating slices in
//! one run at c=1 and c=K; and its cold start (a new function's first call) against an FDK
//! started by hand and called once. With a Docker Engine, in the same run and the same
//! alternation: the same function made from an image of its own (`fn_image.rs`) through an
//! invoker on Docker, against its FDK called directly on the socket in its container's
//! directory, and that function's cold start (a new function of the same image).

use crate::floor::{FloorKind, FloorProcess};
use crate::load::{measure, median, run_json, with_floor, Samples};
use crate::targets::{Invoker, GUEST};
use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A no-op python function: it sleeps when asked (to hold K containers at once while warming).
const NOOP: &str = "import io, json, time\ndef handler(ctx, data: io.BytesIO = None):\n    body = data.getvalue()\n    if body:\n        time.sleep(json.loads(body).get('sleep', 0))\n    return '{}'\n";

/// Where `scripts/fdk.sh` installs the python FDK.
fn fdk_python() -> PathBuf {
    Path::new(invoker_factory::kinds::FDK_DIR).join("python")
}

/// An FDK serving `NOOP`: a process the benchmark started on its own socket directory, or
/// one in a container, reached on its socket.
struct DirectFdk {
    child: Option<Child>,
    client: reqwest::Client,
    /// Its listener's socket (where the floor reaches it too).
    listener: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl DirectFdk {
    /// Starts the FDK as the invoker's `fn:python` kind does, waits for its listener and calls
    /// it once; returns it with the time all that took.
    async fn start() -> anyhow::Result<(DirectFdk, Duration)> {
        let began = Instant::now();
        let dir = tempfile::Builder::new().prefix("invoker-bench-fn-").tempdir()?;
        std::fs::write(dir.path().join("func.py"), NOOP)?;
        let listener = dir.path().join("lsnr.sock");
        let child = Command::new("/usr/bin/python3")
            .args(["-c", invoker_wire::runtime::FDK_MAIN, "func.py", "handler"])
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("PYTHONPATH", fdk_python())
            .env("FN_FORMAT", "http-stream")
            .env("FN_LISTENER", format!("unix:{}", listener.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the python FDK")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while listener.symlink_metadata().is_err() {
            if Instant::now() > deadline {
                bail!("the FDK made no listener in {}", dir.path().display());
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        let client = reqwest::Client::builder().unix_socket(listener.as_path()).build()?;
        let fdk = DirectFdk { child: Some(child), client, listener, _dir: Some(dir) };
        fdk.call().await?;
        Ok((fdk, began.elapsed()))
    }

    /// The FDK listening at `listener` (a container's).
    fn attach(listener: &Path) -> anyhow::Result<DirectFdk> {
        let client = reqwest::Client::builder().unix_socket(listener).build()?;
        Ok(DirectFdk { child: None, client, listener: listener.to_path_buf(), _dir: None })
    }

    /// One call as the invoker makes it: `Fn-Call-Id` and `Fn-Deadline`, an empty body.
    async fn call(&self) -> anyhow::Result<()> {
        let deadline = humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(60));
        let r = self
            .client
            .post("http://localhost/call")
            .header("fn-call-id", invoker_wire::model::new_activation_id())
            .header("fn-deadline", deadline.to_string())
            .send()
            .await?;
        let status = r.status();
        r.bytes().await?;
        if status != 200 {
            bail!("/call: {status}");
        }
        Ok(())
    }
}

impl Drop for DirectFdk {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn send(http: &reqwest::Client, url: &str, body: Value) -> anyhow::Result<Value> {
    let (user, pass) = GUEST.split_once(':').unwrap_or_default();
    let r = http.post(url).basic_auth(user, Some(pass)).json(&body).send().await?;
    let status = r.status();
    let answer: Value = r.json().await?;
    if status != 200 {
        bail!("{url}: {status} {answer}");
    }
    Ok(answer)
}

/// A new no-op function in `app` (`fn:python` with its code, or an `image` of its own); its
/// `/invoke` URL.
async fn new_function(
    http: &reqwest::Client,
    base: &str,
    app: &str,
    name: &str,
    image: Option<&str>,
) -> anyhow::Result<String> {
    let f = match image {
        None => json!({"name": name, "app_id": app, "image": "fn:python", "code": NOOP}),
        Some(image) => json!({"name": name, "app_id": app, "image": image}),
    };
    let f = send(http, &format!("{base}/v2/fns"), f).await?;
    Ok(format!("{base}/invoke/{}", f["id"].as_str().context("a function id")?))
}

/// An invoker, an app in it and a function whose K containers are warm; its `/invoke` URL.
async fn warm_function(
    http: &reqwest::Client,
    invoker: &Invoker,
    k: usize,
    image: Option<&str>,
) -> anyhow::Result<(String, String)> {
    let app = send(http, &format!("{}/v2/apps", invoker.base), json!({"name": "bench"})).await?;
    let app = app["id"].as_str().context("an app id")?.to_string();
    let url = new_function(http, &invoker.base, &app, "noop", image).await?;
    // K overlapping slow calls leave K warm containers behind.
    let warm: Vec<_> = (0..k).map(|_| call(http, &url, "{\"sleep\": 1.0}")).collect();
    for r in futures_util::future::join_all(warm).await {
        r?;
    }
    Ok((app, url))
}

/// The same function from its own image on Docker: the invoker, its app, the warm function's
/// URL, and its K FDKs reached directly.
struct ImageSide {
    invoker: Invoker,
    app: String,
    url: String,
    directs: Arc<Vec<DirectFdk>>,
    /// The floor in front of the same FDKs.
    floor: FloorProcess,
    runs: Vec<Value>,
    cold: Vec<Duration>,
}

impl ImageSide {
    async fn start(exe: &Path, http: &reqwest::Client, socket: &Path, k: usize) -> anyhow::Result<ImageSide> {
        crate::fn_image::build(socket, NOOP)?;
        let invoker = crate::fn_image::invoker(exe, socket)?;
        let (app, url) = warm_function(http, &invoker, k, Some(crate::fn_image::IMAGE)).await?;
        let directs =
            invoker.sockets_named("lsnr.sock").iter().map(|s| DirectFdk::attach(s)).collect::<Result<Vec<_>, _>>()?;
        anyhow::ensure!(directs.len() == k, "{} warm Fn image containers, expected {k}", directs.len());
        let floor = fn_floor(&directs)?;
        Ok(ImageSide { invoker, app, url, directs: Arc::new(directs), floor, runs: Vec::new(), cold: Vec::new() })
    }
}

/// The floor (`floor.rs`) in front of `fdks`, and its `/invoke` URL.
fn fn_floor(fdks: &[DirectFdk]) -> anyhow::Result<FloorProcess> {
    FloorProcess::start(FloorKind::Fn, &fdks.iter().map(|f| f.listener.clone()).collect::<Vec<_>>())
}

fn floor_url(floor: &FloorProcess) -> String {
    format!("{}/invoke/floor", floor.base)
}

async fn call(http: &reqwest::Client, url: &str, body: &'static str) -> anyhow::Result<()> {
    let (user, pass) = GUEST.split_once(':').unwrap_or_default();
    let r = http.post(url).basic_auth(user, Some(pass)).body(body).send().await?;
    let status = r.status();
    r.bytes().await?;
    if status != 200 {
        bail!("invoke: {status}");
    }
    Ok(())
}

/// The Fn figures: one `run_json` per concurrency (c=1, c=k), and the cold starts; with
/// `docker` (the engine's socket), the same for a function made from an image on Docker.
pub async fn fn_side(
    exe: &Path,
    http: &reqwest::Client,
    k: usize,
    slice: Duration,
    rounds: usize,
    cold: usize,
    docker: Option<&Path>,
) -> anyhow::Result<Value> {
    anyhow::ensure!(fdk_python().exists(), "the python FDK is not installed (scripts/fdk.sh)");
    let invoker = Invoker::start(exe, "fn", "[proxy]\npause_grace = \"0s\"\n")?;
    let (app, url) = warm_function(http, &invoker, k, None).await?;
    let mut image = match docker {
        Some(socket) => Some(ImageSide::start(exe, http, socket, k).await?),
        None => None,
    };
    let mut directs = Vec::new();
    for _ in 0..k {
        directs.push(DirectFdk::start().await?.0);
    }
    let floor = fn_floor(&directs)?;
    let directs = Arc::new(directs);
    let direct_slice = |c: usize, slice: Duration| {
        let d = directs.clone();
        measure(c, slice, move |i| {
            let d = d.clone();
            async move { d[i % d.len()].call().await }
        })
    };
    let invoke_slice = |c: usize, slice: Duration| {
        let (h, u) = (http.clone(), url.clone());
        measure(c, slice, move |_| {
            let (h, u) = (h.clone(), u.clone());
            async move { call(&h, &u, "").await }
        })
    };
    let direct_on = |directs: Arc<Vec<DirectFdk>>, c: usize, slice: Duration| {
        measure(c, slice, move |i| {
            let d = directs.clone();
            async move { d[i % d.len()].call().await }
        })
    };
    let invoke_on = |url: String, c: usize, slice: Duration| {
        let h = http.clone();
        measure(c, slice, move |_| {
            let (h, u) = (h.clone(), url.clone());
            async move { call(&h, &u, "").await }
        })
    };
    let mut levels = vec![1, k];
    levels.dedup();
    let mut runs = Vec::new();
    for c in levels {
        direct_slice(c, Duration::from_millis(300)).await;
        invoke_slice(c, Duration::from_millis(300)).await;
        invoke_on(floor_url(&floor), c, Duration::from_millis(300)).await;
        if let Some(side) = &image {
            direct_on(side.directs.clone(), c, Duration::from_millis(300)).await;
            invoke_on(side.url.clone(), c, Duration::from_millis(300)).await;
            invoke_on(floor_url(&side.floor), c, Duration::from_millis(300)).await;
        }
        let (mut direct, mut invoked, mut floored) = (Samples::default(), Samples::default(), Samples::default());
        let (mut image_direct, mut image_invoked, mut image_floored) =
            (Samples::default(), Samples::default(), Samples::default());
        for _ in 0..rounds {
            direct.add(direct_slice(c, slice).await);
            invoked.add(invoke_slice(c, slice).await);
            floored.add(invoke_on(floor_url(&floor), c, slice).await);
            if let Some(side) = &image {
                image_direct.add(direct_on(side.directs.clone(), c, slice).await);
                image_invoked.add(invoke_on(side.url.clone(), c, slice).await);
                image_floored.add(invoke_on(floor_url(&side.floor), c, slice).await);
            }
        }
        eprintln!(
            "fn (\"direct\": the FDK's /call on its socket; \"invoker\": POST /invoke/{{fn_id}}; the floor: hyper \
             to the same FDKs):"
        );
        let mut run = run_json(c, &mut direct, &mut invoked);
        with_floor(&mut run, &mut floored);
        runs.push(run);
        if let Some(side) = &mut image {
            eprintln!(
                "fn image on docker (\"direct\": the FDK's /call on its container's socket; \"invoker\": /invoke; \
                 the floor: hyper to the same FDKs):"
            );
            let mut run = run_json(c, &mut image_direct, &mut image_invoked);
            with_floor(&mut run, &mut image_floored);
            side.runs.push(run);
        }
    }
    let (mut cold_invoker, mut cold_direct) = (Vec::new(), Vec::new());
    for i in 0..cold {
        let url = new_function(http, &invoker.base, &app, &format!("cold{i}"), None).await?;
        let t = Instant::now();
        call(http, &url, "").await?;
        cold_invoker.push(t.elapsed());
        if let Some(side) = &mut image {
            let url =
                new_function(http, &side.invoker.base, &side.app, &format!("cold{i}"), Some(crate::fn_image::IMAGE))
                    .await?;
            let t = Instant::now();
            call(http, &url, "").await?;
            side.cold.push(t.elapsed());
        }
        cold_direct.push(DirectFdk::start().await?.1);
    }
    let (ci, cd) = (median(cold_invoker), median(cold_direct));
    let ms = |d: Duration| (d.as_secs_f64() * 10_000.0).round() / 10.0;
    eprintln!("fn cold: invoker {:.1} ms, the FDK started and called by hand {:.1} ms", ms(ci), ms(cd));
    let mut figures = json!({
        "fn_added_p50_us_c1": runs[0]["added_p50_us"],
        "fn_rps_ratio_c8": runs.last().map_or(Value::Null, |r| r["rps_ratio"].clone()),
        "fn_floor_ratio_c8": runs.last().map_or(Value::Null, |r| r["floor_ratio"].clone()),
        "cold_fn_python_ms_p50": ms(ci),
        "cold_fn_direct_ms_p50": ms(cd),
        "fn_runs": runs,
    });
    if let Some(side) = image {
        let cold = median(side.cold);
        eprintln!("fn image on docker cold: invoker {:.1} ms (create, start, the FDK's listener, the call)", ms(cold));
        figures["fn_image_docker_added_p50_us_c1"] = side.runs[0]["added_p50_us"].clone();
        figures["fn_image_docker_p50_us_c1"] = side.runs[0]["invoker_p50_us"].clone();
        figures["fn_image_docker_rps_ratio_c8"] = side.runs.last().map_or(Value::Null, |r| r["rps_ratio"].clone());
        figures["fn_image_docker_floor_ratio_c8"] = side.runs.last().map_or(Value::Null, |r| r["floor_ratio"].clone());
        figures["cold_fn_image_docker_ms_p50"] = json!(ms(cold));
        figures["fn_image_docker_runs"] = Value::Array(side.runs);
    }
    Ok(figures)
}
