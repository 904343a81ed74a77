//! Runs the real `invoker` binary for end-to-end tests: its own data directory, invoker id and
//! loopback port, and an HTTP client with the guest key.
#![allow(dead_code)]

pub mod etcd;
pub mod fn_cli;
#[cfg(feature = "kubernetes")]
pub mod kube_api;
pub mod otlp;
pub mod own_lines;
pub mod partition;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Polls `check` every 50 ms until it gives `Ok`, for at most `bound`, and returns what it gave;
/// past `bound`, panics naming `what` and the last `Err` (the state last seen). The one wait of
/// the tests: a condition awaited, never a fixed sleep standing in for one.
pub async fn eventually<T, F, Fut>(bound: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + bound;
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(last) => last,
        };
        assert!(Instant::now() < deadline, "not within {bound:?}: {what} (last seen: {last})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `Ok` when `holds`, else the `Err` [`eventually`] keeps polling on (with nothing more to say).
/// Reads server-sent events from `response` until `until` holds for the events so far.
pub async fn events_until(
    response: &mut reqwest::Response,
    bound: Duration,
    until: impl Fn(&[(String, Value)]) -> bool,
) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    let mut buffer = String::new();
    let deadline = tokio::time::Instant::now() + bound;
    while !until(&events) {
        let chunk = tokio::time::timeout_at(deadline, response.chunk()).await;
        let chunk = chunk.unwrap_or_else(|_| panic!("not within {bound:?}: {events:#?}")).unwrap().unwrap();
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let kind = block.lines().find_map(|l| l.strip_prefix("event: ")).map(str::to_string);
            let data = block.lines().find_map(|l| l.strip_prefix("data: "));
            if let (Some(kind), Some(data)) = (kind, data) {
                events.push((kind, serde_json::from_str(data).unwrap()));
            }
        }
    }
    events
}

pub fn done(holds: bool) -> Result<(), String> {
    if holds {
        Ok(())
    } else {
        Err("not yet".into())
    }
}

pub const GUEST: &str =
    "23bc46b1-71f6-4ed5-8c54-816aa4f8c502:123zO3xZCLrMN6v2BKK1dXYFpXlPkccOFqm12CdAsMgRU4VrNZ9lyGVCGuMDGIwP";

/// A second namespace's key, for tests of what one tenant can reach of another's.
pub const OTHER: &str = "11111111-2222-3333-4444-555555555555:other-secret-key";

/// True as root; otherwise says the test is skipped, or fails it under `CI=true` (where the
/// tests run as root and the sandbox must be tried).
pub fn root_or_skip() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(std::env::var("CI").as_deref() != Ok("true"), "the sandbox's tests need root under CI");
    eprintln!("skipped: the process factory's isolation needs root");
    false
}

pub struct Invoker {
    pub child: Child,
    pub base: String,
    pub dir: PathBuf,
    pub invoker_id: String,
    /// The admin key the invoker printed at start.
    pub admin: String,
    http: reqwest::Client,
}

impl Invoker {
    /// For a scheduler: waits until it lists an invoker with a node of some capacity (one that
    /// registered and published its headroom).
    pub async fn until_an_invoker_serves(&self) {
        eventually(Duration::from_secs(30), "the scheduler sees an invoker with room", || async {
            let (_, list) = self.get_url("/v1/invokers").await;
            let seen =
                list.as_array().is_some_and(|l| l.iter().any(|i| i["nodes"][0]["capacity_mb"].as_u64() > Some(0)));
            done(seen).map_err(|_| list.to_string())
        })
        .await
    }

    /// Starts the invoker with `extra` TOML appended to a config naming `invoker_id`.
    pub fn start(dir: &Path, invoker_id: &str, extra: &str) -> Invoker {
        Self::start_command(dir, invoker_id, extra, &[])
    }

    /// A cluster of one invoker (`invoker_id`) and one scheduler (`s1`) over the etcd at
    /// `etcd_url`, `controller` their key, each with a directory under `dir`; once the scheduler
    /// sees the invoker with room.
    pub async fn invoker_and_scheduler(
        dir: &Path,
        etcd_url: &str,
        controller: &str,
        invoker_id: &str,
    ) -> (Invoker, Invoker) {
        Self::invoker_and_scheduler_with_env(dir, etcd_url, controller, invoker_id, &[]).await
    }

    /// As [`Self::invoker_and_scheduler`], with `env` added to both processes' environment.
    pub async fn invoker_and_scheduler_with_env(
        dir: &Path,
        etcd_url: &str,
        controller: &str,
        invoker_id: &str,
        env: &[(&str, &str)],
    ) -> (Invoker, Invoker) {
        let keys = format!(
            "[cluster]\netcd = [\"{etcd_url}\"]\nlease_ttl = \"3s\"\npublish_interval = \"100ms\"\n\
             controller_key = \"{controller}\"\n[admin]\ncontroller_keys = [\"{controller}\"]\n"
        );
        let (invoker_dir, scheduler_dir) = (dir.join("invoker"), dir.join("scheduler"));
        std::fs::create_dir_all(&invoker_dir).unwrap();
        std::fs::create_dir_all(&scheduler_dir).unwrap();
        let invoker = Invoker::start_with_env(&invoker_dir, invoker_id, &keys, &[], env);
        let scheduler = Invoker::start_with_env(
            &scheduler_dir,
            "scheduler",
            &format!("{keys}[scheduler]\nid = \"s1\"\nrefresh_interval = \"50ms\"\n"),
            &["scheduler"],
            env,
        );
        scheduler.until_an_invoker_serves().await;
        (invoker, scheduler)
    }

    /// `invoker scheduler` with `extra` as its config (its id is `[scheduler] id`); the same
    /// handle, since it serves the same REST API.
    pub fn start_scheduler(dir: &Path, extra: &str) -> Invoker {
        Self::start_command(dir, "scheduler", extra, &["scheduler"])
    }

    /// The binary with `subcommand` (none: the invoker), on a free port.
    pub fn start_command(dir: &Path, invoker_id: &str, extra: &str, subcommand: &[&str]) -> Invoker {
        Self::start_with_env(dir, invoker_id, extra, subcommand, &[])
    }

    /// As [`Self::start_command`], with `env` added to the binary's environment.
    pub fn start_with_env(
        dir: &Path,
        invoker_id: &str,
        extra: &str,
        subcommand: &[&str],
        env: &[(&str, &str)],
    ) -> Invoker {
        let config = dir.join("invoker.toml");
        std::fs::write(&config, format!("invoker_id = \"{invoker_id}\"\n{extra}")).unwrap();
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("stderr.log")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_invoker"))
            .args(subcommand)
            .arg("--config")
            .arg(&config)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.join("data"))
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut addr = None;
        let mut admin = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(key) = line.strip_prefix("admin auth: ") {
                admin = key.to_string();
            }
            if let Some(a) = line.strip_prefix("listening on ") {
                addr = Some(a.to_string());
                break;
            }
        }
        let addr = addr.unwrap_or_else(|| panic!("the invoker did not start: {}", Self::stderr_of(dir)));
        // Keep draining stdout so the invoker never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Invoker {
            child,
            base: format!("http://{addr}"),
            dir: dir.to_path_buf(),
            invoker_id: invoker_id.into(),
            admin,
            http: reqwest::Client::new(),
        }
    }

    pub fn stderr_of(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        Self::stderr_of(&self.dir)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}/api/v1/namespaces/_/{path}", self.base)
    }

    pub async fn put_action(&self, name: &str, body: Value) {
        let (status, text) = self.try_put_action(name, body).await;
        assert_eq!(status, 200, "create {name}: {text}");
    }

    /// A `PUT` of an action that may be refused: its status and body.
    pub async fn try_put_action(&self, name: &str, body: Value) -> (u16, String) {
        let r = self.http.put(self.url(&format!("actions/{name}"))).basic_auth_key().json(&body).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// Invokes `name` and returns the status and the JSON body.
    pub async fn invoke(&self, name: &str, query: &str, params: Value) -> (u16, Value) {
        let url = self.url(&format!("actions/{name}?{query}"));
        let r = self.http.post(url).basic_auth_key().json(&params).send().await.unwrap();
        let status = r.status().as_u16();
        assert!(r.headers().contains_key("x-openwhisk-activation-id"));
        (status, r.json().await.unwrap())
    }

    /// A blocking invoke's status and body, which may be a refusal (no activation id).
    pub async fn try_invoke(&self, name: &str, params: Value) -> (u16, Value) {
        let url = self.url(&format!("actions/{name}?blocking=true"));
        let r = self.http.post(url).basic_auth_key().json(&params).send().await.unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.http.get(self.url(path)).basic_auth_key().send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Any request to `path` (from the server's root) with `key` (`user:pass`), `headers` and
    /// `body`: its status, headers and body.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        key: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        let (user, pass) = key.split_once(':').unwrap();
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method, format!("{}{path}", self.base)).basic_auth(user, Some(pass));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let r = request.body(body).send().await.unwrap();
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        (status, headers, r.bytes().await.unwrap().to_vec())
    }

    /// Fn function `name` of app `app_id` made from `image`, and called once through
    /// `/invoke/{fn_id}` with no body: the call's status, headers and body.
    pub async fn call_new_fn_of_image(
        &self,
        app_id: &Value,
        name: &str,
        image: &str,
    ) -> (u16, reqwest::header::HeaderMap, String) {
        let f = json!({"name": name, "app_id": app_id, "image": image, "memory": 256});
        let (status, function) = self.send_json("POST", "/v2/fns", f).await;
        assert_eq!(status, 200, "{function}");
        let path = format!("/invoke/{}", function["id"].as_str().unwrap());
        let (status, headers, body) = self.send("POST", &path, GUEST, &[], Vec::new()).await;
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }

    /// A JSON request as the guest: its status and JSON body (`Null` when not JSON).
    pub async fn send_json(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let body = if body.is_null() { Vec::new() } else { body.to_string().into_bytes() };
        let (status, _, bytes) = self.send(method, path, GUEST, &[("content-type", "application/json")], body).await;
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// GET of an admin route (`/v1/pool`, `/health`), with the admin key.
    pub async fn get_url(&self, path: &str) -> (u16, Value) {
        let (user, pass) = self.admin.split_once(':').expect("the invoker printed its admin key");
        let r = self.http.get(format!("{}{path}", self.base)).basic_auth(user, Some(pass)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// The stems `/v1/pool` shows ready (`state: prewarm`), once nothing is starting; else
    /// the pool as it is (for `eventually`).
    pub async fn ready_stems(&self) -> Result<Vec<u64>, String> {
        let (_, pool) = self.get_url("/v1/pool").await;
        let containers = pool["containers"].as_array().cloned().unwrap_or_default();
        let stems: Vec<u64> =
            containers.iter().filter(|c| c["state"] == "prewarm").filter_map(|c| c["id"].as_u64()).collect();
        match (stems.is_empty(), pool["starting"] == 0) {
            (false, true) => Ok(stems),
            _ => Err(pool.to_string()),
        }
    }

    /// The first calls of the new actions `names` at once, where `stem` is the one stem ready
    /// for them: one takes it (`startKind: prewarm`, nothing created on its path) and the
    /// other starts cold, never the two on one container. Answers the stem's call's record.
    pub async fn first_calls_at_one_stem(&self, stem: &[u64], names: [&str; 2]) -> Value {
        let (one, two) = tokio::join!(
            self.invoke(names[0], "blocking=true", json!({})),
            self.invoke(names[1], "blocking=true", json!({}))
        );
        let records = [one, two].map(|(status, record)| {
            assert_eq!(status, 200, "{record}");
            record
        });
        let annotation = |record: &Value, key: &str| {
            let annotations = record["annotations"].as_array().cloned().unwrap_or_default();
            annotations.into_iter().find(|a| a["key"] == key).map_or(Value::Null, |a| a["value"].clone())
        };
        let kinds: Vec<Value> = records.iter().map(|r| annotation(r, "startKind")).collect();
        assert!(kinds.contains(&json!("prewarm")) && kinds.contains(&json!("cold")), "one took the stem: {kinds:?}");
        let [one, two] = records;
        let taken = if annotation(&one, "startKind") == "prewarm" { one } else { two };
        assert_eq!(json!(stem), json!([annotation(&taken, "containerId")]), "the stem that was ready");
        assert!(annotation(&taken, "createTime").is_null(), "nothing was created on its path: {taken}");
        taken
    }

    /// POST of an admin route, with the admin key.
    pub async fn post_url(&self, path: &str) -> (u16, Value) {
        let (user, pass) = self.admin.split_once(':').expect("the invoker printed its admin key");
        let r = self.http.post(format!("{}{path}", self.base)).basic_auth(user, Some(pass)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Polls for a record until it exists (bounded).
    pub async fn record(&self, id: &str) -> Value {
        eventually(Duration::from_secs(30), &format!("a record for {id}"), || async {
            let (status, body) = self.get(&format!("activations/{id}")).await;
            if status == 200 {
                Ok(body)
            } else {
                Err(format!("{status} {body}"))
            }
        })
        .await
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// Waits (bounded) for the invoker to exit.
    pub fn wait_exit(&mut self, bound: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the invoker did not exit within {bound:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Invoker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

trait GuestAuth {
    fn basic_auth_key(self) -> Self;
}

impl GuestAuth for reqwest::RequestBuilder {
    fn basic_auth_key(self) -> Self {
        let (user, pass) = GUEST.split_once(':').unwrap();
        self.basic_auth(user, Some(pass))
    }
}

/// True while `pid` is a live process (a zombie has already stopped running).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()), Some("Z" | "X")),
        Err(_) => false,
    }
}

/// Waits (bounded) until none of `pids` is alive; returns those still alive.
pub fn wait_gone(pids: &[u32], bound: Duration) -> Vec<u32> {
    let deadline = Instant::now() + bound;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether anything listens on TCP `port` in the test's (the host's) network namespace.
pub fn host_listens_on(port: u16) -> bool {
    let hex = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        text.lines().any(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.len() > 3 && fields[1].ends_with(&hex) && fields[3] == "0A"
        })
    })
}

pub fn python(code: &str) -> Value {
    json!({ "exec": { "kind": "python:3", "code": code } })
}

/// Writes up to 200 MB into `a.dir` in 1 MB steps and says how far it got and why it stopped;
/// the file goes again, so the next call starts on an empty disk.
pub const DISK_FILLER: &str = r#"import errno, os
def main(a):
    target = os.path.join(a['dir'], 'fill')
    written, stopped = 0, None
    st = os.statvfs(a['dir'])
    try:
        with open(target, 'wb', buffering=0) as f:
            for _ in range(200):
                written += f.write(b'x' * (1 << 20))
    except OSError as e:
        stopped = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        if os.path.exists(target):
            os.remove(target)
    return {'written': written, 'stopped': stopped, 'size': st.f_blocks * st.f_frsize}
"#;

/// A small filesystem (a tmpfs) mounted on a directory for a test that fills a disk; detached
/// when dropped. Needs root: `None` without it (a failure under `CI=true`, where tests run as
/// root).
pub struct SmallDisk(PathBuf);

impl SmallDisk {
    pub fn mount(dir: &Path, size_mb: u32) -> Option<SmallDisk> {
        if !nix::unistd::geteuid().is_root() {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "a small disk needs root under CI");
            eprintln!("skipped: mounting a small disk needs root");
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        let options = format!("size={size_mb}m,mode=0711");
        nix::mount::mount(Some("tmpfs"), dir, Some("tmpfs"), nix::mount::MsFlags::empty(), Some(options.as_str()))
            .unwrap();
        Some(SmallDisk(dir.to_path_buf()))
    }

    /// Fills all but `spare_bytes` of it with a ballast file, whose path it returns.
    pub fn fill(&self, spare_bytes: u64) -> PathBuf {
        let free = nix::sys::statvfs::statvfs(&self.0).unwrap();
        let available = free.blocks_available() as u64 * free.fragment_size() as u64;
        // A new file each time: a second fill adds to the first.
        let ballast = (0..).map(|n| self.0.join(format!("ballast{n}"))).find(|p| !p.exists()).unwrap();
        let mut file = std::fs::File::create(&ballast).unwrap();
        let mut left = available.saturating_sub(spare_bytes);
        // The invoker writes too: a full disk before the target is as good.
        while left > 0 {
            let chunk = left.min(1 << 20) as usize;
            if std::io::Write::write_all(&mut file, &vec![0u8; chunk]).is_err() {
                break;
            }
            left -= chunk as u64;
        }
        ballast
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The most of `runs` (start, end) that overlapped at once; a run ending when another starts
/// did not overlap it.
pub fn most_at_once(runs: impl IntoIterator<Item = (f64, f64)>) -> usize {
    let mut edges: Vec<(f64, i32)> = runs.into_iter().flat_map(|(start, end)| [(start, 1), (end, -1)]).collect();
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}
