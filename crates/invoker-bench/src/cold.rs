//! Cold starts by how the runtime starts: `n` new actions of each kind, interleaved, each a real
//! cold start (a new action, so a new container), invoke → result as a client sees it, with the
//! record's breakdown (the container's creation, `/init`, `/run`, and what is left: the
//! invoker's own part). Then a burst of simultaneous first calls to as many new python actions.
//! With an engine, the Docker factory's first calls with a stem and without one, each labelled
//! by what its record says served it.

use crate::targets::{invoke, put_action_of, put_action_sized, Invoker, GUEST};
use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// The kinds measured, the key prefix each reports under, and the no-op action of each.
const KINDS: &[(&str, &str, &str)] = &[
    ("python:3", "cold_python", "def main(a):\n    return {}\n"),
    ("python:spawn", "cold_python_spawn", "def main(a):\n    return {}\n"),
    ("nodejs:snapshot", "cold_node", "function main() { return {}; }"),
    ("nodejs:20", "cold_node_plain", "function main() { return {}; }"),
];

/// The invoker's configuration: the default kinds (python forked from the zygote, node
/// running the launcher's script), python started in the container as before the zygote, and
/// node started from the launcher's snapshot; room for every container at once.
const CONFIG: &str = r#"[proxy]
pause_grace = "0s"
[factory.process]
user_memory_mb = 65536
[kinds."python:spawn"]
command = ["{invoker}", "action-runtime", "--listen", "{listen}", "--launcher", "python"]
zygote = false
[kinds."nodejs:snapshot"]
command = ["{invoker}", "action-runtime", "--listen", "{listen}", "--launcher", "nodejs"]
snapshot = true
"#;

/// One first call: the client's time, and the record's parts (ms).
struct Cold {
    total: f64,
    create: f64,
    init: f64,
    run: f64,
}

pub async fn cold_by_kind(exe: &Path, http: &reqwest::Client, n: usize, burst: usize) -> anyhow::Result<Value> {
    let inv = Invoker::start(exe, "cold", CONFIG)?;
    let mut samples: Vec<Vec<Cold>> = KINDS.iter().map(|_| Vec::new()).collect();
    for i in 0..n {
        for (k, (kind, _, code)) in KINDS.iter().enumerate() {
            let name = format!("c{k}x{i}");
            put_action_of(http, &inv.base, &name, kind, code).await?;
            samples[k].push(cold_start(http, &inv, &name).await?);
        }
    }
    let mut out = serde_json::Map::new();
    for ((_, key, _), cold) in KINDS.iter().zip(&samples) {
        let part = |f: fn(&Cold) -> f64| percentile(cold.iter().map(f).collect(), 50.0);
        let (p50, p99) = (part(|c| c.total), percentile(cold.iter().map(|c| c.total).collect(), 99.0));
        let (create, init, run) = (part(|c| c.create), part(|c| c.init), part(|c| c.run));
        let own = part(|c| c.total - c.create - c.init - c.run);
        eprintln!(
            "{key:18} p50 {p50:6.1} ms  p99 {p99:6.1} ms  (create {create:.0}, /init {init:.0}, /run {run:.0}, the rest {own:.1})"
        );
        out.insert(format!("{key}_ms_p50"), json!(round(p50)));
        out.insert(format!("{key}_ms_p99"), json!(round(p99)));
        out.insert(
            format!("{key}_parts_ms_p50"),
            json!({"create": create, "init": init, "run": run, "rest": round(own)}),
        );
    }
    // A burst: first calls to `burst` new python actions at once.
    let names: Vec<String> = (0..burst).map(|i| format!("burst{i}")).collect();
    for name in &names {
        put_action_of(http, &inv.base, name, "python:3", KINDS[0].2).await?;
    }
    let urls: Vec<String> = names.iter().map(|name| inv.url(name, "blocking=true&result=true")).collect();
    let began = Instant::now();
    let calls = urls.iter().map(|url| invoke(http, url, json!({})));
    for r in futures_util::future::join_all(calls).await {
        r?;
    }
    let took = began.elapsed();
    eprintln!("burst of {burst} first calls to {burst} new python actions: all answered in {:.0} ms", ms(took));
    out.insert(format!("cold_python_burst{burst}_ms"), json!(round(ms(took))));
    Ok(Value::Object(out))
}

async fn cold_start(http: &reqwest::Client, inv: &Invoker, name: &str) -> anyhow::Result<Cold> {
    first_call(http, inv, name, "cold").await
}

/// A new action's first call, which must have started as `start_kind` says (`cold`: a container
/// created for it; `prewarm`: a stem adopted, whose creation was before the call).
async fn first_call(http: &reqwest::Client, inv: &Invoker, name: &str, start_kind: &str) -> anyhow::Result<Cold> {
    let (user, pass) = GUEST.split_once(':').unwrap_or_default();
    let began = Instant::now();
    let r = http.post(inv.url(name, "blocking=true")).basic_auth(user, Some(pass)).json(&json!({})).send().await?;
    let record: Value = r.json().await?;
    let total = ms(began.elapsed());
    if record["response"]["statusCode"] != 0 {
        bail!("{name}: {record}");
    }
    let annotation = |key: &str| {
        record["annotations"].as_array().and_then(|a| a.iter().find(|x| x["key"] == key)).map(|x| x["value"].clone())
    };
    if annotation("startKind") != Some(json!(start_kind)) {
        bail!("{name} did not start as {start_kind}: {record}");
    }
    let number = |v: Option<Value>| v.and_then(|v| v.as_f64()).context("an annotation is missing");
    let create = match start_kind {
        "cold" => number(annotation("createTime"))?,
        _ => 0.0,
    };
    let init = number(annotation("initTime"))?;
    let duration = record["duration"].as_f64().context("no duration")?;
    Ok(Cold { total, create, init, run: (duration - init).max(0.0) })
}

/// The Docker factory's first call of an OpenWhisk python action, from a stem and without one:
/// one invoker keeps a stem of `python:3` at 128 MB (`[[pool.prewarm]]`, one); each round a new
/// 128 MB action's first call adopts it (its record says `startKind: prewarm`), and a new 256 MB
/// action's, which no stem of its size serves, creates its container (`cold`). The stem is
/// refilled before the next round, so every stem call finds one.
pub async fn cold_docker(exe: &Path, http: &reqwest::Client, n: usize, socket: &Path) -> anyhow::Result<Value> {
    let config = format!(
        "[proxy]\npause_grace = \"0s\"\n[factory]\nkind = \"docker\"\n[factory.docker]\nsocket = \"{}\"\n\
         [[pool.prewarm]]\nkind = \"python:3\"\nmemory_mb = 128\ncount = 1\n",
        socket.display()
    );
    let inv = Invoker::start(exe, "cold-docker", &config)?;
    let code = KINDS[0].2;
    let (mut stem, mut none) = (Vec::new(), Vec::new());
    for i in 0..n {
        stem_ready(http, &inv).await?;
        let name = format!("ds{i}");
        put_action_sized(http, &inv.base, &name, "python:3", code, 128).await?;
        stem.push(first_call(http, &inv, &name, "prewarm").await?);
        let name = format!("dn{i}");
        put_action_sized(http, &inv.base, &name, "python:3", code, 256).await?;
        none.push(first_call(http, &inv, &name, "cold").await?);
    }
    let mut out = serde_json::Map::new();
    for (key, cold) in [("cold_docker_stem", &stem), ("cold_docker_none", &none)] {
        let part = |f: fn(&Cold) -> f64| percentile(cold.iter().map(f).collect(), 50.0);
        let p50 = part(|c| c.total);
        let (create, init, run) = (part(|c| c.create), part(|c| c.init), part(|c| c.run));
        let own = part(|c| c.total - c.create - c.init - c.run);
        eprintln!("{key:23} p50 {p50:6.1} ms  (create {create:.0}, /init {init:.0}, /run {run:.0}, the rest {own:.1})");
        out.insert(format!("{key}_ms_p50"), json!(round(p50)));
        out.insert(
            format!("{key}_parts_ms_p50"),
            json!({"create": create, "init": init, "run": run, "rest": round(own)}),
        );
    }
    Ok(Value::Object(out))
}

/// Waits (at most 60 s) until the invoker holds a ready stem (started, not starting).
async fn stem_ready(http: &reqwest::Client, inv: &Invoker) -> anyhow::Result<()> {
    let (user, pass) = inv.admin.split_once(':').unwrap_or_default();
    let began = Instant::now();
    loop {
        let pool: Value =
            http.get(format!("{}/v1/pool", inv.base)).basic_auth(user, Some(pass)).send().await?.json().await?;
        // `prewarm` counts the stems starting too: nothing starting means this one is ready.
        if pool["prewarm"].as_u64().unwrap_or(0) >= 1 && pool["starting"] == 0 {
            return Ok(());
        }
        if began.elapsed() > Duration::from_secs(60) {
            bail!("no stem ready after 60 s: {pool}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn round(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}
