//! Fn's routes on the same server and keys as OpenWhisk's: the `v2` API subset a user of Fn
//! needs (apps, functions, HTTP triggers), `POST /invoke/{fn_id}`, and HTTP triggers at
//! `/t/{app}/{source}`. Everything lives in the key's namespace. An Fn function is an action
//! (named `<app>.<fn>`, of a kind with the `fn` protocol), so the pool, limits, records and the
//! scheduler treat it as any other; its document (`DocKind::FnFunction`) holds what Fn's API
//! says of it. Errors are Fn's `{"message": ...}` (`ApiError::into_fn_response`).

pub(super) mod cache;
mod calls;
mod docs;
mod entities;

pub(super) use calls::{invoke, invoke_key_holder, trigger};
pub(super) use entities::{entities, Entities};
