//! `[admin]` and `[namespaces]`: the API keys, each the key of one principal.

use super::error::{bad, ConfigError};
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};

/// `[admin]`: the keys that are not a namespace's.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// The key of the admin routes (`/v1/pool`, `/metrics`, `/health`'s details), `uuid:secret`.
    /// When unset, one is generated at first start and kept in the store.
    pub key: Option<String>,
    /// Keys that may submit an `ActivationMessage` for any namespace and subject through the
    /// shim (a controller, the cluster's scheduler). Every other key submits only for its own.
    pub controller_keys: Vec<String>,
}

/// Every namespace name is an entity name, and every key is `uuid:secret` and one principal's.
pub(super) fn validate_keys(namespaces: &BTreeMap<String, String>, admin: &AdminConfig) -> Result<(), ConfigError> {
    let mut seen = HashSet::new();
    for (ns, key) in namespaces {
        invoker_wire::model::validate_entity_name("namespaces", ns).map_err(|r| bad(&format!("namespaces.{ns}"), r))?;
        check_key(&format!("namespaces.{ns}"), key, &mut seen)?;
    }
    if let Some(key) = &admin.key {
        check_key("admin.key", key, &mut seen)?;
    }
    for (i, key) in admin.controller_keys.iter().enumerate() {
        check_key(&format!("admin.controller_keys[{i}]"), key, &mut seen)?;
    }
    Ok(())
}

/// An API key is `uuid:secret`, and belongs to one principal only: a key shared by two
/// namespaces (or a namespace and the admin) would make one of them the other.
fn check_key<'a>(at: &str, key: &'a str, seen: &mut HashSet<&'a str>) -> Result<(), ConfigError> {
    match key.split_once(':') {
        Some((uuid, secret)) if !uuid.is_empty() && !secret.is_empty() => {}
        _ => return Err(bad(at, "an API key is 'uuid:secret'")),
    }
    if !seen.insert(key) {
        return Err(bad(at, "this key is already another namespace's or the admin's"));
    }
    Ok(())
}
