//! `[factory.kubernetes]`: action containers as pods, bound to the node the pool chose.

use super::error::{bad, ConfigError};
use invoker_factory::settings::KubernetesFactoryConfig;

/// An API server's URL as the config gives it: `https://host:port` or `http://host:port`.
pub(super) fn check_api_server(url: Option<&str>, key: &str) -> Result<(), ConfigError> {
    let Some(url) = url else { return Ok(()) };
    let authority = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")).unwrap_or_default();
    if authority.is_empty() || authority.contains(' ') {
        return Err(bad(key, "must be https://host:port or http://host:port"));
    }
    Ok(())
}

/// A DNS-1123 label (what a namespace's name must be).
pub(super) fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The checks of `[factory.kubernetes]`.
pub(super) fn validate(k8s: &KubernetesFactoryConfig) -> Result<(), ConfigError> {
    let key = |k: &str| format!("factory.kubernetes.{k}");
    check_api_server(k8s.api_server.as_deref(), &key("api_server"))?;
    if !dns_label(&k8s.namespace) {
        return Err(bad(&key("namespace"), "must be a DNS-1123 label (a-z, 0-9, '-', at most 63)"));
    }
    if !(k8s.cpus_per_gb > 0.0 && k8s.cpus_per_gb <= 64.0) {
        return Err(bad(&key("cpus_per_gb"), "must be above 0 and at most 64"));
    }
    for (k, d) in [
        ("create_timeout", k8s.create_timeout),
        ("delete_timeout", k8s.delete_timeout),
        ("call_timeout", k8s.call_timeout),
    ] {
        if d.is_zero() {
            return Err(bad(&key(k), "must be positive"));
        }
    }
    if !["Always", "IfNotPresent", "Never"].contains(&k8s.image_pull_policy.as_str()) {
        return Err(bad(&key("image_pull_policy"), "must be Always, IfNotPresent or Never"));
    }
    for (name, kind) in &k8s.kinds {
        // `fn:image` runs the image each function names.
        if kind.image.is_empty() && name != invoker_factory::kinds::FN_IMAGE_KIND {
            return Err(bad(&key(&format!("kinds.\"{name}\".image")), "must be set"));
        }
        if kind.port == Some(0) {
            return Err(bad(&key(&format!("kinds.\"{name}\".port")), "must be 1 to 65535"));
        }
        let plain = |f: &str| !f.is_empty() && !f.contains('/') && f != "." && f != "..";
        if kind.code_file.as_deref().is_some_and(|f| !plain(f)) {
            return Err(bad(&key(&format!("kinds.\"{name}\".code_file")), "must be a plain file name"));
        }
    }
    let bridge = &k8s.fn_bridge;
    if bridge.image.is_empty() || bridge.command.is_empty() {
        return Err(bad(&key("fn_bridge"), "image and command must be set"));
    }
    if !(4..=1024).contains(&bridge.memory_mb) {
        return Err(bad(&key("fn_bridge.memory_mb"), "must be 4 to 1024"));
    }
    Ok(())
}
