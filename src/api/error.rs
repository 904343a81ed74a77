//! The one place errors become HTTP statuses. Bodies are OpenWhisk's `{"error", "code"}`.

use crate::activation::IntakeError;
use crate::cluster::fetch::FetchError;
use hyper::header::{self, HeaderValue};
use hyper::StatusCode;
use invoker_http::Response;
use invoker_ids::CreateFailure;
use invoker_store::StoreError;
use invoker_wire::model::{ActivationRecord, Outcome, RecordHead, Rejection, RejectionKind};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("the request is not authorized")]
    Unauthorized,
    #[error("the supplied authentication is not authorized to access '{0}'")]
    Forbidden(String),
    #[error("the requested resource does not exist")]
    NotFound,
    /// A 404 that says what was not found (Fn's `Fn not found`).
    #[error("{0}")]
    NotFoundNamed(String),
    #[error("method {method} is not allowed here; allowed: {allowed}")]
    MethodNotAllowed { method: String, allowed: &'static str },
    #[error("{0}")]
    Conflict(String),
    #[error("the request content exceeds {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    TooMany(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::ActionExists(path) => ApiError::Conflict(format!("resource {path} already exists")),
            // The disk: retrying later may succeed, and nothing was accepted.
            e if e.is_storage() => ApiError::Unavailable(e.to_string()),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<FetchError> for ApiError {
    fn from(e: FetchError) -> Self {
        match e {
            FetchError::NotFound { .. } => ApiError::NotFound,
            // Nothing ran: the scheduler may try another invoker, or the caller again.
            FetchError::UnknownScheduler(_) | FetchError::Unreachable { .. } => ApiError::Unavailable(e.to_string()),
        }
    }
}

impl From<IntakeError> for ApiError {
    fn from(e: IntakeError) -> Self {
        match e {
            IntakeError::NamespaceLimit { .. } | IntakeError::QueueFull(_) => ApiError::TooMany(e.to_string()),
            IntakeError::Gone(why) => ApiError::Conflict(why),
            IntakeError::Draining => ApiError::Unavailable(e.to_string()),
            IntakeError::IdTaken(_) => ApiError::Conflict(e.to_string()),
            IntakeError::Store(s) => s.into(),
        }
    }
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound | ApiError::NotFoundNamed(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn into_response(self) -> Response {
        let body = json!({ "error": self.to_string(), "code": invoker_wire::model::new_activation_id() });
        self.respond(&body)
    }

    /// The same status with Fn's body, `{"message": ...}`, for Fn's routes.
    pub fn into_fn_response(self) -> Response {
        let body = json!({ "message": self.to_string() });
        self.respond(&body)
    }

    fn respond(self, body: &serde_json::Value) -> Response {
        let mut response = invoker_http::json_value(self.status(), body);
        let headers = response.headers_mut();
        if matches!(self, ApiError::Unavailable(_) | ApiError::TooMany(_)) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let ApiError::MethodNotAllowed { allowed, .. } = self {
            headers.insert(header::ALLOW, HeaderValue::from_static(allowed));
        }
        if matches!(self, ApiError::Unauthorized) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"invoker\""));
        }
        response
    }
}

/// The status for a finished activation: `failed` when the action ran and failed; 503 when
/// nothing ran (retrying may help), 400 when it can never fit.
///
/// A whisk error is 503 (safe to retry) only when the record says nothing ran: an activation
/// that may have started (its container or invoker lost under it, an invoker stopped before it
/// ended) is 502 with its whisk-error record, as OpenWhisk answers there, so that a client that
/// retries a 503 never runs an action twice.
pub(super) fn record_status(record: &RecordHead, failed: StatusCode) -> StatusCode {
    match (record.outcome, record.rejection) {
        (Outcome::Success, _) => StatusCode::OK,
        (Outcome::ApplicationError | Outcome::DeveloperError, _) => failed,
        (Outcome::WhiskError, Some(Rejection::NeverFits { .. })) => StatusCode::BAD_REQUEST,
        // Held by the action's own `max-concurrency`: the caller's rate, not the platform's room.
        (Outcome::WhiskError, _) if record.rejection_kind == Some(RejectionKind::Capped) => {
            StatusCode::TOO_MANY_REQUESTS
        }
        (Outcome::WhiskError, _) if record.ran_nothing() => StatusCode::SERVICE_UNAVAILABLE,
        (Outcome::WhiskError, _) => StatusCode::BAD_GATEWAY,
    }
}

/// Fn's answer for a finished call: `Ok` when the function answered (its own status and body
/// go back), else Fn's status and message: 504 for a deadline (the function's or ours) or a
/// container that never became ready, 502 for a failed function or container, 400 for what
/// can never fit, 503 when nothing ran and a retry may. A function's own `image` that cannot be
/// had is Fn's "Failed to pull image" (502), and one it may not run 403.
pub(super) fn fn_record_status(record: &ActivationRecord, image: Option<&str>) -> Result<(), (StatusCode, String)> {
    let error = || record.response.result.error().unwrap_or_else(|| "function failed".to_string());
    let timed_out = record.annotation("timeout") == Some(&serde_json::Value::Bool(true));
    let fdk = "please ensure you are using the latest fdk and check the logs";
    match (record.outcome(), record.rejection) {
        (Outcome::Success, _) => Ok(()),
        (Outcome::ApplicationError | Outcome::DeveloperError, _) if timed_out => {
            Err((StatusCode::GATEWAY_TIMEOUT, "Timed out".into()))
        }
        (Outcome::ApplicationError | Outcome::DeveloperError, _) => Err((StatusCode::BAD_GATEWAY, error())),
        (Outcome::WhiskError, Some(Rejection::CreateFailed(CreateFailure::Image))) if image.is_some() => Err((
            StatusCode::BAD_GATEWAY,
            format!(
                "Failed to pull image '{}': the engine has it not and could not pull it",
                image.unwrap_or_default()
            ),
        )),
        (Outcome::WhiskError, Some(Rejection::CreateFailed(CreateFailure::ImageNotOwned))) => Err((
            StatusCode::FORBIDDEN,
            format!("Image '{}': {}", image.unwrap_or_default(), error().trim_end_matches("; nothing ran")),
        )),
        (Outcome::WhiskError, Some(Rejection::CreateFailed(CreateFailure::NotReady))) => {
            Err((StatusCode::GATEWAY_TIMEOUT, format!("Container initialization timed out, {fdk}")))
        }
        (Outcome::WhiskError, _) if record.rejection_kind() == Some(RejectionKind::CreateFailed) => {
            Err((StatusCode::BAD_GATEWAY, format!("Container failed to initialize, {fdk}")))
        }
        (Outcome::WhiskError, Some(Rejection::NeverFits { .. })) => Err((StatusCode::BAD_REQUEST, error())),
        (Outcome::WhiskError, _) if record.ran_nothing() => Err((StatusCode::SERVICE_UNAVAILABLE, error())),
        // It may have started: never "retry me".
        (Outcome::WhiskError, _) => Err((StatusCode::BAD_GATEWAY, error())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use invoker_wire::model::ActivationMeta;

    fn meta() -> ActivationMeta {
        ActivationMeta::for_test("0123456789abcdef0123456789abcdef")
    }

    #[test]
    fn a_whisk_error_is_503_only_when_nothing_ran() {
        let refused = ActivationRecord::rejected(&meta(), Rejection::Deadline, 5, 10);
        assert_eq!(record_status(&RecordHead::of(&refused), StatusCode::BAD_GATEWAY), StatusCode::SERVICE_UNAVAILABLE);
        // Read back from the store or sent by an invoker: the annotation says it.
        let read_back = ActivationRecord { rejection: None, ..refused };
        assert_eq!(
            record_status(&RecordHead::of(&read_back), StatusCode::BAD_GATEWAY),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let lost = ActivationRecord::rejected(&meta(), Rejection::ContainerLost, 5, 10);
        assert_eq!(
            record_status(&RecordHead::of(&lost), StatusCode::BAD_GATEWAY),
            StatusCode::BAD_GATEWAY,
            "it may have run"
        );
        let stopped = ActivationRecord::whisk_error(&meta(), "the invoker stopped before this activation finished", 10);
        assert_eq!(record_status(&RecordHead::of(&stopped), StatusCode::BAD_GATEWAY), StatusCode::BAD_GATEWAY);
        assert_eq!(fn_record_status(&stopped, None).unwrap_err().0, StatusCode::BAD_GATEWAY);
        assert_eq!(fn_record_status(&read_back, None).unwrap_err().0, StatusCode::SERVICE_UNAVAILABLE);
    }

    /// Fn's words for a container that failed to start, from the typed rejection and from a
    /// record read back (where only the annotation tells it).
    #[test]
    fn fn_tells_a_failed_container_from_the_rejection_however_the_record_came() {
        let failed = ActivationRecord::rejected(&meta(), Rejection::CreateFailed(CreateFailure::Failed), 5, 10);
        let read_back = ActivationRecord { rejection: None, ..failed.clone() };
        for record in [&failed, &read_back] {
            let (status, message) = fn_record_status(record, None).unwrap_err();
            assert_eq!(status, StatusCode::BAD_GATEWAY);
            assert!(message.starts_with("Container failed to initialize"), "{message}");
        }
        assert_eq!(read_back.rejection_kind(), Some(RejectionKind::CreateFailed));
        let slow = ActivationRecord::rejected(&meta(), Rejection::CreateFailed(CreateFailure::NotReady), 5, 10);
        assert_eq!(fn_record_status(&slow, None).unwrap_err().0, StatusCode::GATEWAY_TIMEOUT);
    }

    /// A function's own image: Fn's words when it cannot be had, and a 4xx naming the rule
    /// when it is another namespace's local build.
    #[test]
    fn fn_names_the_image_it_could_not_have_or_may_not_run() {
        let missing = ActivationRecord::rejected(&meta(), Rejection::CreateFailed(CreateFailure::Image), 5, 10);
        let (status, message) = fn_record_status(&missing, Some("none/such:1")).unwrap_err();
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert!(message.starts_with("Failed to pull image 'none/such:1': "), "{message}");
        let theirs = ActivationRecord::rejected(&meta(), Rejection::CreateFailed(CreateFailure::ImageNotOwned), 5, 10);
        let (status, message) = fn_record_status(&theirs, Some("other/f:0.0.2")).unwrap_err();
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(message.starts_with("Image 'other/f:0.0.2': ") && message.contains("namespace"), "{message}");
    }
}
