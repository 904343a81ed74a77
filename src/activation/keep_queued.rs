//! A blocking call that no invoker had room for within the scheduler's `wait_for_room`, kept
//! in the durable queue rather than refused: journaled as a queued call under the id it was
//! accepted with (a restart runs it), its caller answered 202 with that id, and run when an
//! invoker has room, within its maximum event age. OpenWhisk answers a blocking call that
//! outlasts its wait the same way, and keeps the activation in Kafka; a fleet that grows
//! within seconds or minutes should not fail the calls that came before it grew.

use invoker_job::queue::QueueCounts;
use invoker_job::runner::{KeepQueued, Kept};
use invoker_job::{CallRequest, Queued, RunJob};
use invoker_store::{QueuedCall, Store};
use std::sync::Arc;
use std::time::Duration;

/// The intake's durable queue as a runner sees it: the store, the queue's bounds, and the
/// default maximum event age (an action's annotation sets its own).
pub struct QueueKeeper {
    pub store: Arc<dyn Store>,
    pub counts: QueueCounts,
    pub max_event_age: Duration,
}

impl KeepQueued for QueueKeeper {
    fn keep(&self, mut run: RunJob) -> Kept {
        let meta = &run.meta;
        let expires_at = invoker_job::queue::expires_at(&run.action, self.max_event_age, meta.accepted_at);
        let call = QueuedCall {
            meta: (**meta).clone(),
            params: run.params.clone(),
            request: run.request.as_deref().map(CallRequest::to_queued),
            api_key: run.api_key.clone(),
            transaction_id: run.transaction_id.clone(),
            expires_at,
            // One run, as its caller asked for: a blocking call has no retry policy, nor
            // destinations.
            attempt: 1,
            max_attempts: 1,
            retry_of: None,
            not_before: 0,
            on_success: None,
            on_failure: None,
        };
        // Strings, numbers and JSON values: encoding cannot fail.
        let json = serde_json::to_vec(&call).expect("a queued call serialises");
        let ticket = match self.counts.admit(&meta.namespace, json.len() as u64, meta.accepted_at, false) {
            Ok(ticket) => ticket,
            Err(full) => return Kept::NotTaken(run, full.to_string()),
        };
        if let Err(e) = self.store.enqueue(&call, &json, false) {
            return Kept::NotTaken(run, format!("it could not be kept in the queue: {e}"));
        }
        run.queued = Some(Queued { ticket, expires_at });
        // Its caller has its 202: nobody takes a stream any more.
        run.stream = None;
        run.completion = run.completion.keep_queued();
        Kept::Queued(run)
    }
}
