//! The record of an activation that ran (or was meant to run) on a container: OpenWhisk's
//! annotations (`waitTime`, `initTime`, `startKind`, ...) from what the proxy measured.

use invoker_ids::ContainerId;
use invoker_job::RunJob;
use invoker_wire::model::{ActivationRecord, ActivationResponse, KeyValue, Outcome, StartKind};
use serde_json::json;

/// What the proxy measured of one run, taken when it began.
pub(super) struct RecordFields {
    pub container: ContainerId,
    pub start_kind: StartKind,
    pub create_ms: Option<u64>,
    pub init_ms: Option<u64>,
    pub wait_ms: u64,
    /// When it began, on the wall clock and on the monotonic one (its duration's).
    pub start: u64,
    pub began: std::time::Instant,
}

pub(super) fn build_record(
    run: &RunJob,
    f: RecordFields,
    outcome: Outcome,
    result: invoker_wire::result_json::ResultJson,
    logs: Vec<String>,
    timed_out: bool,
) -> ActivationRecord {
    // Measured, not read off the wall clock twice: a clock set in between changes neither.
    let duration = f.began.elapsed().as_millis() as u64;
    let end = f.start + duration;
    let mut annotations = run.meta.base_annotations();
    annotations.push(KeyValue { key: "timeout".into(), value: json!(timed_out) });
    annotations.push(KeyValue { key: "waitTime".into(), value: json!(f.wait_ms) });
    if let Some(init) = f.init_ms {
        annotations.push(KeyValue { key: "initTime".into(), value: json!(init) });
    }
    annotations.push(KeyValue { key: "containerId".into(), value: json!(f.container.0) });
    annotations.push(KeyValue { key: "startKind".into(), value: json!(f.start_kind) });
    if let Some(create) = f.create_ms {
        annotations.push(KeyValue { key: "createTime".into(), value: json!(create) });
    }
    ActivationRecord {
        namespace: run.meta.namespace.clone(),
        name: run.meta.name.clone(),
        version: run.meta.version.clone(),
        subject: run.meta.subject.clone(),
        activation_id: run.meta.activation_id.clone(),
        start: f.start,
        end,
        duration,
        status_code: outcome.status_code(),
        // Sized when it is encoded, once, as it is finished.
        response: ActivationResponse::without_size(outcome, result),
        logs,
        annotations,
        publish: false,
        rejection: None,
    }
}
