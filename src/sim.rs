//! The simulators' host: they live in `invoker-core` (`invoker_core::sim`), pure, and this
//! module gives them what they may not do themselves: it reads the scenario and the trace files,
//! writes the synthetic trace, and keeps the stopwatch for each run's `wall_ms`.
//!
//! `invoker simulate --scenario scenarios/<name>.toml`

pub use invoker_core::sim::{fleet, scenario, workload, Host, SIM_KIND};
use scenario::{Scenario, ScenarioError};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// The files of this machine, and its monotonic clock.
pub struct Machine {
    started: Instant,
}

impl Default for Machine {
    fn default() -> Self {
        Machine { started: Instant::now() }
    }
}

impl Host for Machine {
    fn read(&self, path: &Path) -> Result<String, ScenarioError> {
        std::fs::read_to_string(path)
            .map_err(|e| ScenarioError::Trace { path: path.display().to_string(), reason: e.to_string() })
    }

    fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Reads a scenario file (unknown keys refused, as in the invoker's own config); a trace
/// directory is resolved against the scenario's own folder.
pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ScenarioError::Read { path: path.display().to_string(), reason: e.to_string() })?;
    let scenario: Scenario =
        toml::from_str(&text).map_err(|e| ScenarioError::Parse(e.to_string(), path.display().to_string()))?;
    scenario.checked(path)
}

/// Runs a scenario to the end on this machine and returns its JSON summary.
pub fn run(scenario: &Scenario) -> Result<Value, ScenarioError> {
    invoker_core::sim::run(scenario, &Machine::default())
}

/// A synthetic fleet of `functions` functions (its trace written into `dir` from
/// [`workload::synthetic_trace`]) on one 16 GiB node, with the fixed, greedy-dual and hybrid
/// keep-alive policies; and the calls of its whole day.
pub fn synthetic_fleet(dir: &Path, functions: u32) -> Result<(Scenario, u64), ScenarioError> {
    let (files, calls) = workload::synthetic_trace(functions, 42);
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text)
            .map_err(|e| ScenarioError::Trace { path: path.display().to_string(), reason: e.to_string() })?;
    }
    let text = format!(
        "name = \"synthetic-{functions}\"\nnode_sizes_mb = [16384]\n\
         [[compare_keep_alive]]\nname = \"fixed-10m\"\nkeep_alive = \"fixed\"\n\
         [[compare_keep_alive]]\nname = \"greedy_dual\"\nkeep_alive = \"greedy_dual\"\n\
         [[compare_keep_alive]]\nname = \"hybrid\"\nkeep_alive = \"hybrid\"\n\
         [cluster]\nnodes = 1\nnode_memory_mb = 16384\nstart_latency = \"500ms\"\nstats_every = \"1s\"\n\
         [workload]\nkind = \"trace\"\ndir = \".\"\nfunctions = {functions}\n"
    );
    let path = dir.join("synthetic.toml");
    std::fs::write(&path, text)
        .map_err(|e| ScenarioError::Read { path: path.display().to_string(), reason: e.to_string() })?;
    Ok((load(&path)?, calls))
}
