//! The Grafana dashboard in `dashboards/` against what the binaries export: every query names
//! metrics that an invoker, a scheduler or a capacity manager (the real binaries, scraped at
//! `/metrics` with the admin key) serves, and every label a query groups or matches by is one
//! its metric carries.

mod support;

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use support::etcd::EtcdServer;
use support::Invoker;

const CONTROLLER: &str = "c0ffee00-0000-4000-8000-00000000da5b:the-dashboard-tests-controller-secret";

/// Every query of the dashboard's panels (rows' nested panels too).
fn queries(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"].as_array().expect("panels").iter().collect();
    while let Some(panel) = panels.pop() {
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push(target["expr"].as_str().expect("a target's expr").to_string());
        }
    }
    out
}

/// PromQL's words that are not metric names.
const WORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
];

/// The metric names a query reads, and the labels it groups or matches by, per metric (a
/// `by (...)` counts for every metric of the query).
fn read_by(query: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut metrics, mut labels) = (BTreeSet::new(), BTreeSet::new());
    let chars: Vec<char> = query.chars().collect();
    let mut i = 0;
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i += 1 + chars[i + 1..].iter().position(|&c| c == '"').expect("a closed string") + 1;
        } else if c == '[' {
            i += chars[i..].iter().position(|&c| c == ']').expect("a closed range") + 1;
        } else if c == '{' {
            let end = i + chars[i..].iter().position(|&c| c == '}').expect("closed matchers");
            let inside: String = chars[i + 1..end].iter().collect();
            for matcher in inside.split(',').filter(|m| !m.trim().is_empty()) {
                let name = matcher.split(['=', '!', '~']).next().unwrap().trim();
                labels.insert(name.to_string());
            }
            i = end + 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && word(chars[i]) {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            if name == "by" || name == "without" {
                let open = i + chars[i..].iter().position(|&c| c == '(').expect("by (...)");
                let close = open + chars[open..].iter().position(|&c| c == ')').expect("by (...)");
                let inside: String = chars[open + 1..close].iter().collect();
                labels.extend(inside.split(',').map(|l| l.trim().to_string()).filter(|l| !l.is_empty()));
                i = close + 1;
            } else if next != Some(&'(') && !WORDS.contains(&name.as_str()) {
                metrics.insert(name);
            }
        } else {
            i += 1;
        }
    }
    labels.remove("le");
    labels.remove("job");
    labels.remove("instance");
    (metrics, labels)
}

/// Every series name in a scrape (a counter's `_total`, a histogram's `_bucket`, `_sum` and
/// `_count` as they are written), with the labels its samples carry.
fn exported(scrape: &str, into: &mut BTreeMap<String, BTreeSet<String>>) {
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            let names: Vec<String> = match kind {
                "counter" => vec![format!("{name}_total")],
                "histogram" => ["_bucket", "_sum", "_count"].iter().map(|s| format!("{name}{s}")).collect(),
                _ => vec![name.to_string()],
            };
            for n in names {
                into.entry(n).or_default();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap();
            let labels = line.split_once('{').and_then(|(_, l)| l.split_once('}')).map_or("", |(l, _)| l);
            let entry = into.entry(name.to_string()).or_default();
            for label in labels.split(',').filter_map(|l| l.split_once('=')) {
                entry.insert(label.0.trim().to_string());
            }
        }
    }
}

/// Kills the invokers a manager started (its pid files in this directory) at the test's end.
struct Fleet(std::path::PathBuf);

impl Drop for Fleet {
    fn drop(&mut self) {
        for entry in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            let pid = std::fs::read_to_string(entry.path()).unwrap_or_default();
            if let Some(Ok(pid)) = pid.split_whitespace().next().map(str::parse::<i32>) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

async fn scrape(at: &Invoker) -> String {
    let (status, _, body) = at.send("GET", "/metrics", &at.admin, &[], Vec::new()).await;
    let body = String::from_utf8(body).unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

#[test]
fn queries_are_read_as_promql_reads_them() {
    let (metrics, labels) = read_by(
        r#"histogram_quantile(0.99, sum by (le, group) (rate(a_bucket{job=~"$job",start="cold"}[5m]))) / sum(b_total)"#,
    );
    assert_eq!(metrics, BTreeSet::from(["a_bucket".to_string(), "b_total".to_string()]));
    assert_eq!(labels, BTreeSet::from(["group".to_string(), "start".to_string()]));
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(invoker_without_etcd, ignore = "needs an etcd binary (scripts/etcd.sh installs one)")]
async fn every_query_of_the_dashboard_names_what_the_binaries_export() {
    let Some(etcd) = EtcdServer::start() else { return };
    let dir = tempfile::Builder::new().prefix("invoker-dashboard-").tempdir().unwrap();
    let invoker_id = format!("dashboard-{}", std::process::id());
    let (invoker, scheduler) = Invoker::invoker_and_scheduler(dir.path(), &etcd.url(), CONTROLLER, &invoker_id).await;
    // A family shows in a scrape once it has a sample: one activation through the scheduler,
    // and one that no invoker can take (a tag none has).
    let code = "def main(a):\n    return a";
    scheduler.put_action("hello", json!({"exec": {"kind": "python:3", "code": code}})).await;
    assert_eq!(scheduler.invoke("hello", "blocking=true", json!({})).await.0, 200);
    let tagged = json!({"exec": {"kind": "python:3", "code": code},
                        "annotations": [{"key": "invoker-resources", "value": ["tpu"]}]});
    scheduler.put_action("nowhere", tagged).await;
    assert_eq!(scheduler.try_invoke("nowhere", json!({})).await.0, 503);
    let manager_dir = dir.path().join("capacity");
    std::fs::create_dir_all(&manager_dir).unwrap();
    let manager_config = format!(
        "[cluster]\netcd = [\"{}\"]\ncontroller_key = \"{CONTROLLER}\"\n[admin]\ncontroller_keys = [\"{CONTROLLER}\"]\n\
         [capacity.groups.default]\nmin = 1\nmax = 1\ninvoker_memory_mb = 256\n",
        etcd.url()
    );
    let manager = Invoker::start_command(&manager_dir, "capacity", &manager_config, &["capacity"]);
    let _fleet = Fleet(manager_dir.join("data/invokers"));
    support::eventually(std::time::Duration::from_secs(30), "the manager decided", || async {
        let scraped = scrape(&manager).await;
        support::done(scraped.contains("capacity_decisions_total{")).map_err(|_| scraped)
    })
    .await;

    let mut series = BTreeMap::new();
    for process in [&invoker, &scheduler, &manager] {
        exported(&scrape(process).await, &mut series);
    }
    let mut checked = 0;
    for entry in std::fs::read_dir("dashboards").unwrap() {
        let path = entry.unwrap().path();
        let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for query in queries(&dashboard) {
            let (metrics, labels) = read_by(&query);
            assert!(!metrics.is_empty(), "{}: {query} names no metric", path.display());
            for metric in &metrics {
                let carried = series.get(metric).unwrap_or_else(|| {
                    panic!("{}: {query} reads {metric}, which no binary exports: {:?}", path.display(), series.keys())
                });
                // A label is checked where the family has samples to show its labels.
                if !carried.is_empty() {
                    for label in &labels {
                        assert!(
                            metrics.iter().any(|m| series[m].contains(label)),
                            "{}: {query} uses label {label}, which {metric} does not carry ({carried:?})",
                            path.display()
                        );
                    }
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked} queries checked");
}
