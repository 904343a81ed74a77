//! `[kinds]`: the checks of each action kind's runtime (what a kind is lives in
//! `invoker_factory::kinds`, beside the factories that start it).

use super::error::{bad, ConfigError};
use invoker_factory::kinds::{KindConfig, KindPath, RuntimeProtocol};
use invoker_factory::settings::Network;
use std::collections::BTreeMap;
use std::path::Path;

pub(super) fn validate(kinds: &BTreeMap<String, KindConfig>) -> Result<(), ConfigError> {
    for (kind, k) in kinds {
        let key = |field: &str| format!("kinds.\"{kind}\".{field}");
        // An fn kind may be an image's alone (Docker, Kubernetes): its entry point is the function.
        if k.command.is_empty() && k.protocol != RuntimeProtocol::Fn {
            return Err(bad(&key("command"), "must be non-empty"));
        }
        if k.protocol == RuntimeProtocol::Fn && k.network != Network::None {
            return Err(bad(
                &key("network"),
                "an fn kind serves on a unix socket in a directory of its own: its network must be \"none\"",
            ));
        }
        if k.code_file.is_some() && k.protocol.initialises() {
            return Err(bad(&key("code_file"), "only a kind whose protocol takes no code at start (fn) has one"));
        }
        let plain_name = |f: &str| !f.is_empty() && !f.contains(['/', '\0']) && f != "." && f != "..";
        if let Some(file) = k.code_file.as_deref().filter(|f| !plain_name(f)) {
            return Err(bad(&key("code_file"), format!("'{file}' must be a file name, without '/'")));
        }
        if k.protocol.takes_listen_address()
            && k.network != Network::Isolated
            && !k.command.iter().any(|a| a.contains("{listen}"))
        {
            return Err(bad(
                &key("command"),
                "must pass '{listen}' (only a runtime in its own namespace, network = \"isolated\", may \
                 listen on a port of its own choosing)",
            ));
        }
        if k.port == 0 {
            return Err(bad(&key("port"), "must be 1 to 65535"));
        }
        let env_name_ok = |n: &str| !n.is_empty() && !n.contains(['=', '\0']);
        if let Some((name, _)) = k.env.iter().find(|(n, v)| !env_name_ok(n) || v.contains('\0')) {
            return Err(bad(&key("env"), format!("'{name}': a name must be non-empty without '=', no NUL anywhere")));
        }
        let below_root = |p: &Path| p.is_absolute() && p.parent().is_some();
        let wrong = k.paths.iter().flat_map(|p| [p.host(), p.at()]).find(|p| !below_root(p));
        if let Some(path) = wrong {
            return Err(bad(&key("paths"), format!("'{}' must be an absolute path below /", path.display())));
        }
        // The kernel's views the sandbox mounts for the container: a path there would replace
        // what the kernel shows it.
        let reserved = ["/proc", "/dev"];
        let hiding = k.paths.iter().map(KindPath::at).find(|at| reserved.iter().any(|r| at.starts_with(r)));
        if let Some(at) = hiding {
            return Err(bad(&key("paths"), format!("'{}': a path may not be shown in /proc or /dev", at.display())));
        }
        if k.zygote == Some(true) && !k.is_own_python() {
            return Err(bad(
                &key("zygote"),
                "only a kind running the invoker's own runtime with --launcher python has a zygote",
            ));
        }
        if k.snapshot && !k.is_own_nodejs() {
            return Err(bad(
                &key("snapshot"),
                "only a kind running the invoker's own runtime with --launcher nodejs starts from a snapshot",
            ));
        }
        if k.start_timeout.is_some_and(|t| t.is_zero()) {
            return Err(bad(&key("start_timeout"), "must be above 0"));
        }
        if k.max_concurrency == Some(0) {
            return Err(bad(&format!("kinds.\"{kind}\".max_concurrency"), "must be at least 1"));
        }
    }
    Ok(())
}
