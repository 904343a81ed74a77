//! The docs stay honest: every relative link in `README.md`, `BENCHMARKS.md` and `docs/`
//! resolves to a file of the repository, every key of the default config is in the
//! configuration page, and every route in the API's reference.

use std::path::{Path, PathBuf};

fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages
}

/// The targets of a page's markdown links, `[text](target)`.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            found.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    found
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with('#') {
                continue;
            }
            let file = target.split('#').next().unwrap_or_default();
            if file.is_empty() || file.contains(' ') {
                continue;
            }
            if !page.parent().unwrap().join(file).exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links that resolve to nothing:\n{}", broken.join("\n"));
}

/// Every key `config/default.toml` sets, as `(section, key)`: a table's keys under its dotted
/// path, an array of tables' under `name[]`.
fn default_keys() -> Vec<(String, String)> {
    fn walk(table: &toml::Table, prefix: &str, keys: &mut Vec<(String, String)>) {
        for (key, value) in table {
            let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            match value {
                toml::Value::Table(inner) => walk(inner, &path, keys),
                toml::Value::Array(items) if items.iter().all(toml::Value::is_table) && !items.is_empty() => {
                    for item in items.iter().filter_map(toml::Value::as_table) {
                        walk(item, &format!("{path}[]"), keys);
                    }
                }
                _ => keys.push((if prefix.is_empty() { "(top)".into() } else { prefix.to_string() }, key.clone())),
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("config/default.toml")).unwrap();
    let mut keys = Vec::new();
    walk(&text.parse::<toml::Table>().unwrap(), "", &mut keys);
    keys
}

#[test]
fn every_key_of_the_default_config_is_in_the_configuration_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/configuration.md")).unwrap();
    let missing: Vec<String> = default_keys()
        .into_iter()
        .filter(|(section, key)| !page.contains(&format!("| `{section}` | `{key}` |")))
        .map(|(section, key)| format!("{section}.{key}"))
        .collect();
    assert!(missing.is_empty(), "keys of config/default.toml not in docs/configuration.md: {missing:?}");
}

/// Every route the API answers (the paths `src/api/mod.rs` and `src/api/server.rs` match, and
/// the parts of a namespace's routes) appears in its reference page: `docs/api.md`, or Fn's
/// routes in `docs/fn.md`.
#[test]
fn every_route_is_in_its_reference_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let (api, fn_page) = (read("docs/api.md"), read("docs/fn.md"));
    let mut missing = Vec::new();
    let mut routes = 0;
    for source in ["src/api/mod.rs", "src/api/server.rs"] {
        let code = read(source);
        // Path literals: "/v1/pool", "/api/v1/namespaces/", ...
        for literal in code.split('"').skip(1).step_by(2) {
            let is_path = literal.starts_with('/') && literal.len() > 1 && !literal.contains([' ', '{']);
            if !is_path || literal.starts_with("/ui/app.") {
                continue;
            }
            routes += 1;
            let route = literal.trim_end_matches('/');
            if !api.contains(route) && !fn_page.contains(route) {
                missing.push(format!("{source}: {literal}"));
            }
        }
        // A namespace's routes: `[ns, "actions", name]`, `[ns, "deadletters", id, "redrive"]`.
        for pattern in code.split("[ns, ").skip(1) {
            let pattern = pattern.split(']').next().unwrap_or_default();
            for part in pattern.split('"').skip(1).step_by(2) {
                routes += 1;
                if !api.contains(&format!("/{part}")) {
                    missing.push(format!("{source}: namespaces/{{ns}}/.../{part}"));
                }
            }
        }
    }
    assert!(routes > 20, "the routes were read: {routes}");
    assert!(missing.is_empty(), "routes not in docs/api.md or docs/fn.md:\n{}", missing.join("\n"));
}
