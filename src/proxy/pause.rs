//! Pausing an idle container (OpenWhisk's Ready → Pausing → Paused) and resuming it on the
//! next run.

use super::record::build_record;
use super::{ContainerProxy, ProxyReport, ProxyState};
use crate::factory::ContainerFactory;
use crate::model::Outcome;
use actix::prelude::*;
use serde_json::json;

/// Pausing an idle container (OpenWhisk's Ready → Pausing → Paused) when the pool's core says
/// so, and resuming it (Resuming) before the next run the core sends; runs that arrive while it
/// pauses or resumes wait (parked) until it runs again. A paused container uses no CPU;
/// resuming costs one factory call.
impl ContainerProxy {
    /// Only an idle, ready container pauses; the core never asks for another.
    pub(super) fn pause(&mut self, ctx: &mut Context<Self>) {
        if self.state != ProxyState::Ready || self.running > 0 {
            return;
        }
        let Some(handle) = self.handle.clone() else { return };
        self.state = ProxyState::Pausing;
        let factory = self.ctx.factory.clone();
        let fut = async move { factory.pause(&handle).await };
        ctx.spawn(fut.into_actor(self).map(|paused, act, ctx| {
            if act.state != ProxyState::Pausing {
                return;
            }
            match paused {
                Ok(()) => {
                    act.state = ProxyState::Paused;
                    if act.resume_wanted || !act.parked.is_empty() {
                        act.resume(ctx);
                    }
                }
                Err(e) => {
                    tracing::warn!(container = act.spec.id.0, "pause failed, the container stays unpaused: {e}");
                    act.release_parked(ctx);
                }
            }
        }));
    }

    /// Resumes a paused container; one that is still pausing resumes once it has paused.
    pub(super) fn resume(&mut self, ctx: &mut Context<Self>) {
        match self.state {
            ProxyState::Paused => {}
            ProxyState::Pausing => {
                self.resume_wanted = true;
                return;
            }
            _ => return,
        }
        let Some(handle) = self.handle.clone() else { return };
        self.resume_wanted = false;
        self.state = ProxyState::Resuming;
        let factory = self.ctx.factory.clone();
        let fut = async move { factory.resume(&handle).await };
        ctx.spawn(fut.into_actor(self).map(|resumed, act, ctx| match resumed {
            Ok(()) => act.release_parked(ctx),
            Err(e) => act.fail_parked(&e.to_string()),
        }));
    }

    fn release_parked(&mut self, ctx: &mut Context<Self>) {
        self.state = if self.running > 0 { ProxyState::Running } else { ProxyState::Ready };
        for (job, run, began) in std::mem::take(&mut self.parked) {
            self.dispatch(job, run, began, ctx);
        }
    }

    /// A container that cannot be resumed ran nothing: its parked runs get whisk-error
    /// records (safe to retry) and the container is given up.
    fn fail_parked(&mut self, reason: &str) {
        self.ctx.discards.discarded(self.spec.id.0, &self.spec.action_path, "resume failed", reason);
        let container = self.spec.id;
        for (job, run, began) in std::mem::take(&mut self.parked) {
            self.running -= 1;
            let fields = self.record_fields(&run, began);
            let result = json!({ "error": format!("the container could not be resumed: {reason}") });
            let record = build_record(&run, fields, Outcome::WhiskError, result, Vec::new(), false);
            run.completion.finish(record);
            self.report(ProxyReport::Finished { container, job, reusable: false });
        }
    }
}
