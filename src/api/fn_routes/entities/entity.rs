//! What the one path for `/v2/apps`, `/v2/fns` and `/v2/triggers` (`mod.rs`: create, read,
//! update, delete and list, in the key's namespace) asks of each of Fn's entities: its fields,
//! its checks, and what else a write of it changes (a function's action, a trigger's route).

use crate::api::error::ApiError;
use crate::api::fn_routes::docs::{fn_not_found, Docs};
use crate::config::Config;
use invoker_store::DocKind;
use invoker_wire::model::Action;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;

/// What a write may need beyond the namespace's documents.
pub(super) struct Scope {
    /// A function's action is checked as any action `PUT` is.
    pub(super) config: Arc<Config>,
    pub(super) ns: String,
    /// The request's `Host`, in a trigger's endpoint.
    pub(super) host: String,
}

/// An action a write replaced (`now`: what it is now) or deleted: the pool retires its
/// containers once the write is durable.
pub(super) struct Retired {
    pub(super) name: String,
    pub(super) now: Option<Action>,
}

/// Which of the namespace's entities of one kind a listing keeps.
pub(super) type Selector<E> = Box<dyn Fn(&E) -> bool>;

pub(super) trait Entity: Serialize + DeserializeOwned + Send + Sized + 'static {
    const KIND: DocKind;
    /// How Fn's messages name it: "App deleted", "Fn not found: <id>".
    const TITLE: &'static str;
    /// The body of a create or an update. Fn's clients send back the fields they read (`id`,
    /// the times), which are ignored; any other unknown field is refused.
    type Put: DeserializeOwned + Send + 'static;
    /// What a listing selects by.
    type Query: DeserializeOwned;

    fn id(&self) -> &str;
    fn name(&self) -> &str;

    /// Which of the namespace's entities a listing shows; the parent it names must exist.
    fn selector(docs: &Docs, query: Self::Query) -> Result<Selector<Self>, ApiError>;
    /// A new entity from its body, checked against those that exist; what it needs besides its
    /// document (a function's action) is written here, the document after by [`Entity::store`].
    fn create(docs: &Docs, scope: &Scope, put: Self::Put) -> Result<(Self, Vec<Retired>), ApiError>;
    /// The entity with the body's changes (its name and parents are immutable).
    fn update(self, docs: &Docs, scope: &Scope, put: Self::Put) -> Result<(Self, Vec<Retired>), ApiError>;
    /// Deletes it and what depends on it.
    fn delete(self, docs: &Docs) -> Result<Vec<Retired>, ApiError>;

    /// Writes its document.
    fn store(&self, docs: &Docs) -> Result<(), ApiError> {
        docs.put(Self::KIND, self.id(), self)
    }

    /// As Fn shows it (a trigger with the endpoint it answers at).
    fn shown(self, _docs: &Docs, _scope: &Scope) -> Result<Self, ApiError> {
        Ok(self)
    }

    fn read(docs: &Docs, id: &str) -> Result<Self, ApiError> {
        docs.get(Self::KIND, id)?.ok_or_else(|| fn_not_found(Self::TITLE, id))
    }
}
