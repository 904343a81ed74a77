//! One activation's trace in this process, and the W3C `traceparent` it takes and passes on.

use super::sampling::{exporting, head_sampled, TARGET};
use invoker_wire::model::ActivationMeta;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing::field::Empty;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header (and the key of an `ActivationMessage`'s `traceContext`) that carries it.
pub const HEADER: &str = "traceparent";

/// A W3C `traceparent` (`00-<trace id>-<parent id>-<flags>`), checked as the recommendation
/// says: one that does not hold is ignored (the activation starts a trace of its own), never
/// a reason to refuse a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceParent(String);

impl TraceParent {
    /// `None` for a value that is not a valid `traceparent` of version 00 (or a later version
    /// read as 00, as the recommendation asks).
    pub fn parse(value: &str) -> Option<TraceParent> {
        let value = value.trim();
        let mut parts = value.split('-');
        let (version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let valid = hex(version, 2)
            && version != "ff"
            && (version != "00" || parts.next().is_none())
            && hex(trace, 32)
            && trace.bytes().any(|b| b != b'0')
            && hex(parent, 16)
            && parent.bytes().any(|b| b != b'0')
            && hex(flags, 2);
        valid.then(|| TraceParent(format!("00-{trace}-{parent}-{flags}")))
    }

    /// The one `traceparent` among `headers`; none when it is missing, repeated or invalid.
    pub fn of_headers<'h>(headers: impl Iterator<Item = (&'h str, &'h str)>) -> Option<TraceParent> {
        let mut found = headers.filter(|(name, _)| name.eq_ignore_ascii_case(HEADER));
        match (found.next(), found.next()) {
            (Some((_, value)), None) => TraceParent::parse(value),
            _ => None,
        }
    }

    fn of(context: &SpanContext) -> Option<TraceParent> {
        context.is_valid().then(|| {
            let flags = context.trace_flags().to_u8() & 1;
            TraceParent(format!("00-{}-{}-{flags:02x}", context.trace_id(), context.span_id()))
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its flags say the trace is sampled.
    pub fn sampled(&self) -> bool {
        let flags = self.0.rsplit('-').next().unwrap_or_default();
        u8::from_str_radix(flags, 16).is_ok_and(|f| f & 1 == 1)
    }

    fn context(&self) -> opentelemetry::Context {
        let field = |i: usize| self.0.split('-').nth(i).unwrap_or_default();
        let trace_id = TraceId::from_hex(field(1)).unwrap_or(TraceId::INVALID);
        let span_id = SpanId::from_hex(field(2)).unwrap_or(SpanId::INVALID);
        let flags = u8::from_str_radix(field(3), 16).unwrap_or(0) & 1;
        let remote = SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, TraceState::default());
        opentelemetry::Context::new().with_remote_span_context(remote)
    }
}

/// An activation's trace in this process: its span (a child of the caller's `traceparent` or
/// of the scheduler's hand-over), which its stages' spans hang from; the caller's `traceparent`,
/// passed on unchanged when this process records no span; the span of its wait in the queue;
/// and what the action is given. Boxed, and none at all for an activation with no trace
/// (tracing off, no caller's `traceparent`): a job carries a pointer's width of it.
#[derive(Debug, Default)]
pub struct ActivationTrace(Option<Box<Traced>>);

#[derive(Debug)]
struct Traced {
    span: Span,
    given: Option<TraceParent>,
    queued: Span,
    to_action: Option<TraceParent>,
}

/// What [`ActivationTrace::span`] is when there is no trace.
static NO_SPAN: Span = Span::none();

impl ActivationTrace {
    /// Opens the activation's span; `process` names who runs it here (the invoker's or the
    /// scheduler's id).
    pub fn begin(given: Option<TraceParent>, meta: &ActivationMeta, process: &str) -> ActivationTrace {
        let state = |span: Span, given: Option<TraceParent>| {
            let to_action = given.clone();
            ActivationTrace(Some(Box::new(Traced { span, given, queued: Span::none(), to_action })))
        };
        // The caller's flag decides for its trace; a trace that starts here is drawn. Sampled
        // out, no span is made (it would export nothing), and what is passed on is the
        // caller's as it came.
        let sampled = match &given {
            Some(parent) => parent.sampled(),
            None => head_sampled(),
        };
        if !sampled || !exporting() {
            return match given {
                None => ActivationTrace(None),
                given => state(Span::none(), given),
            };
        }
        let span = tracing::info_span!(
            target: TARGET,
            "activation",
            "otel.kind" = "server",
            namespace = %meta.namespace,
            action = %meta.name,
            activation_id = %meta.activation_id,
            process,
            invoker = Empty,
            node = Empty,
            container = Empty,
            start = Empty,
            capped = Empty,
            outcome = Empty,
            retry_of = Empty,
            attempt = Empty,
            "otel.status_code" = Empty,
            "otel.status_description" = Empty,
        );
        if let Some(parent) = &given {
            let _ = span.set_parent(parent.context());
        }
        state(span, given)
    }

    /// The activation's span here; disabled when tracing is off or its trace sampled out, and
    /// then its stages get none either ([`crate::stage_span!`]).
    pub fn span(&self) -> &Span {
        self.0.as_ref().map_or(&NO_SPAN, |t| &t.span)
    }

    /// What to pass on from `stage` (one of this activation's spans) to the next process or
    /// the action: `stage`'s own context where it records, else the caller's as it came.
    pub fn pass_on(&self, stage: &Span) -> Option<TraceParent> {
        let given = self.0.as_ref()?.given.clone();
        if stage.is_disabled() {
            return given;
        }
        TraceParent::of(&stage.context().span().span_context().clone()).or(given)
    }

    /// Opens (a span) or closes (none) the wait in the queue.
    pub fn set_queued(&mut self, span: Span) {
        if let Some(t) = &mut self.0 {
            t.queued = span;
        }
    }

    /// The wait in the queue, while it lasts.
    pub fn queued(&self) -> &Span {
        self.0.as_ref().map_or(&NO_SPAN, |t| &t.queued)
    }

    /// What the action is given as its `traceparent`.
    pub fn to_action(&self) -> Option<&TraceParent> {
        self.0.as_ref()?.to_action.as_ref()
    }

    pub fn set_to_action(&mut self, traceparent: Option<TraceParent>) {
        if let Some(t) = &mut self.0 {
            t.to_action = traceparent;
        }
    }
}

impl ActivationTrace {
    /// Says on the activation's span how it ended; anything but a success marks it failed.
    pub fn ended(&self, record: &invoker_wire::model::EncodedRecord) {
        let span = self.span();
        if span.is_disabled() {
            return;
        }
        let outcome = record.head().outcome;
        span.record("outcome", outcome.status());
        if outcome != invoker_wire::model::Outcome::Success {
            failed(span, record.error().as_deref().unwrap_or(outcome.status()));
        }
    }
}

/// Marks `span` as failed, saying why (`otel.status_code` is how the bridge sets the status).
pub fn failed(span: &Span, reason: &str) {
    if !span.is_disabled() {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", reason);
    }
}

#[cfg(test)]
mod tests {
    use super::TraceParent;

    #[test]
    fn a_traceparent_is_taken_only_as_the_recommendation_writes_it() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(TraceParent::parse(good).unwrap().as_str(), good);
        assert!(TraceParent::parse(good).unwrap().sampled());
        assert!(!TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02").unwrap().sampled());
        // A later version is read as 00, its extra fields dropped.
        assert_eq!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what").unwrap().as_str(),
            good
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1g",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad}");
        }
    }
}
