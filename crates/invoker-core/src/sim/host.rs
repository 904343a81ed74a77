//! What the simulators ask of the machine they run on.

use super::scenario::ScenarioError;
use std::path::Path;
use std::time::Duration;

/// What the simulator needs of the machine it runs on, passed in so that the simulator reads no
/// file and no clock itself: the text of a trace's files, and a stopwatch for each run's
/// `wall_ms` (the simulator's own cost, reported beside its virtual-time results).
pub trait Host {
    fn read(&self, path: &Path) -> Result<String, ScenarioError>;
    /// Time since some fixed moment of the host's.
    fn elapsed(&self) -> Duration;
}

/// A host with no files and a stopped clock, for the tests of workloads that read none.
#[cfg(test)]
pub(crate) struct NoFiles;

#[cfg(test)]
impl Host for NoFiles {
    fn read(&self, path: &Path) -> Result<String, ScenarioError> {
        Err(ScenarioError::Trace { path: path.display().to_string(), reason: "no files here".into() })
    }

    fn elapsed(&self) -> Duration {
        Duration::ZERO
    }
}
