//! The seams of the source tree: every crate depends only on crates of the layers below its own
//! ([`CRATE_LAYERS`]), and the invoker's folders import only folders below theirs
//! ([`FOLDER_LAYERS`]); no two files of a crate import each other, directly or through others
//! (tests and `mod tests` blocks aside), so each module can be read, tested and replaced from
//! its own imports downward; and the decision cores (`crates/invoker-core`) depend on nothing
//! that does I/O, so that they stay pure functions of their events.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, with its module path (`src/pool/core/mod.rs` → `pool::core`).
fn files(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<String>, PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut module: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                module.pop();
            }
            out.insert(module, path);
        }
    }
}

/// The code of a file that counts: without its test module (`#[cfg(test)] mod tests`), its
/// comments, and visibility paths (`pub(in crate::api)` grants, it does not import).
fn code_of(source: &str) -> String {
    let mut code = source;
    for marker in ["#[cfg(test)]\nmod tests {", "#[cfg(test)]\npub mod tests {", "#[cfg(test)]\npub(crate) mod tests {"]
    {
        if let Some(i) = code.find(marker) {
            code = &code[..i];
        }
    }
    let mut out = String::with_capacity(code.len());
    for line in code.lines() {
        if !line.trim_start().starts_with("//") {
            out.push_str(line);
            out.push('\n');
        }
    }
    while let Some(i) = out.find("pub(in ") {
        let end = out[i..].find(')').map_or(out.len(), |e| i + e + 1);
        out.replace_range(i..end, "pub");
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Parses one use tree (`a::b`, `a::{b, c::d}`, `super::x`) at the start of `text`, from the
/// module path `base`; every path it names goes to `found`.
fn use_tree(text: &str, base: &[String], found: &mut Vec<Vec<String>>) -> usize {
    let mut path = base.to_vec();
    let mut at = 0;
    loop {
        let rest = &text[at..];
        let ident_len = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        if ident_len > 0 {
            match &rest[..ident_len] {
                "super" => {
                    path.pop();
                }
                "self" => {}
                segment => path.push(segment.to_string()),
            }
            at += ident_len;
        } else if let Some(group) = rest.strip_prefix('{') {
            at += 1;
            let mut inner = group;
            loop {
                let skipped = inner.len() - inner.trim_start_matches([' ', '\n', '\t', ',']).len();
                at += skipped;
                inner = &inner[skipped..];
                if inner.is_empty() {
                    return at;
                }
                if inner.starts_with('}') {
                    return at + 1;
                }
                let used = use_tree(inner, &path, found);
                let to_next = inner[used..].find([',', '}']).map_or(inner.len() - used, |n| n);
                at += used + to_next;
                inner = &inner[used + to_next..];
            }
        } else {
            break;
        }
        match text[at..].strip_prefix("::") {
            Some(_) => at += 2,
            None => break,
        }
    }
    found.push(path);
    at
}

/// Every module path a file names: after `crate::`, `super::` and `self::`, and after the name
/// of a child module it declares (`mod process;` then `process::ProcessFactory`), in paths and
/// use trees alike (`use crate::{a::X, b::{c, d}}`).
fn references(source: &str, module: &[String]) -> Vec<Vec<String>> {
    let code = code_of(source);
    let children: BTreeSet<&str> = code
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("pub ")
                .or_else(|| l.strip_prefix("pub(crate) "))
                .or_else(|| l.strip_prefix("pub(super) "))
                .unwrap_or(l);
            l.strip_prefix("mod ")?.strip_suffix(';')
        })
        .collect();
    let parent = module[..module.len().saturating_sub(1)].to_vec();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find("::") {
        let colons = at + i;
        at = colons + 2;
        let start = code[..colons].rfind(|c: char| !is_ident(c)).map_or(0, |s| s + 1);
        if start == colons || code[..start].ends_with("::") {
            continue;
        }
        let base = match &code[start..colons] {
            "crate" => Vec::new(),
            "super" => parent.clone(),
            "self" => module.to_vec(),
            child if children.contains(child) => [module, &[child.to_string()]].concat(),
            _ => continue,
        };
        at = colons + 2 + use_tree(&code[colons + 2..], &base, &mut found);
    }
    found
}

#[test]
fn no_import_cycle_between_the_files_of_the_project() {
    no_import_cycle_in(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), 21);
}

/// Every crate of the workspace, each on its own (a crate added later is checked as well).
#[test]
fn no_import_cycle_between_the_files_of_any_crate() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let root = entry.unwrap().path();
        let name = root.file_name().unwrap().to_string_lossy().to_string();
        // The core's and the factory API's files import one another; the wire's barely do.
        let at_least = match name.as_str() {
            "invoker-core" => 6,
            "invoker-factory" => 3,
            _ => 0,
        };
        no_import_cycle_in(&root.join("src"), at_least);
        checked.push(name);
    }
    checked.sort();
    assert!(checked.len() >= 3 && checked.contains(&"invoker-factory".to_string()), "{checked:?}");
}

/// The forms a circle took before (issue 45): a parent that names its child's item while the
/// child imports the parent's, and paths inside use groups; and one behind a test module
/// declared at the top of a file (`#[cfg(test)] mod tests;`, its code in a file of its own),
/// which the scan once took for the start of an inline test module and read nothing after,
/// so that the pool core's own circles went unseen. Each is found.
#[test]
fn the_scan_finds_a_circle_through_a_child_module_or_a_use_group() {
    let cases: [&[(&str, &str)]; 5] = [
        &[("a/mod.rs", "mod b;\npub use b::Thing;\npub struct Shared;\n"), ("a/b.rs", "use super::Shared;\n")],
        &[
            ("a/mod.rs", "#[cfg(test)]\nmod tests;\nmod b;\npub use b::Thing;\npub struct Shared;\n"),
            ("a/b.rs", "use super::Shared;\n"),
        ],
        &[("a/mod.rs", "pub mod b;\nfn f() { self::b::g() }\n"), ("a/b.rs", "use super::super::a::Shared;\n")],
        &[
            ("x.rs", "use crate::{y::Y, z};\n"),
            ("y.rs", "use crate::{w::{self, W}};\n"),
            ("w.rs", "pub(crate) fn f() { crate::x::g() }\n"),
        ],
        &[("x.rs", "use crate::y::{self, Y};\n"), ("y.rs", "use crate::x;\n")],
    ];
    for files in cases {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        assert!(import_cycle_in(dir.path()).0.is_some(), "a circle in {files:?} was not found");
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("a")).unwrap();
    std::fs::write(dir.path().join("a/mod.rs"), "mod b;\nmod shared;\npub use b::Thing;\n// super::b\n").unwrap();
    std::fs::write(dir.path().join("a/b.rs"), "use super::shared::Shared;\npub(in crate::a) fn f() {}\n").unwrap();
    std::fs::write(
        dir.path().join("a/shared.rs"),
        "pub struct Shared;\n#[cfg(test)]\nmod tests { use super::super::b; }\n",
    )
    .unwrap();
    assert_eq!(import_cycle_in(dir.path()).0, None, "a tree without a circle");
}

/// The layers the crates' manifests say: the shared names (`invoker-ids`) depend on nothing of
/// ours; the wire, the factory API and the backends that make containers (Docker, Mesos) name
/// a container through them and never depend on the decision cores (only Kubernetes' control
/// plane does, for the capacity manager's contract), nor on the invoker.
#[test]
fn the_crates_depend_down_the_layers_only() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    assert!(dependencies_of(&crates.join("invoker-ids")).iter().all(|d| !d.starts_with("invoker")));
    for krate in ["invoker-wire", "invoker-factory", "invoker-docker", "invoker-mesos"] {
        let named = dependencies_of(&crates.join(krate));
        assert!(named.contains(&"invoker-ids".to_string()), "{krate}: the dependencies were read: {named:?}");
        assert!(!named.iter().any(|d| d == "invoker-core" || d == "invoker"), "{krate} depends on {named:?}");
    }
}

/// The workspace's layers, lowest first: a crate depends only on crates of layers below its own,
/// and every crate has its place (a crate added later must be given one).
const CRATE_LAYERS: &[&[&str]] = &[
    // The names and the HTTP pieces everything shares.
    &["invoker-ids", "invoker-http", "invoker-build"],
    // What is said (the wire) and what is decided (the pure cores).
    &["invoker-wire", "invoker-core"],
    // The parts: spans, the store, the live view, the action runtime, the factory contract.
    &["invoker-telemetry", "invoker-store", "invoker-live", "invoker-runtime", "invoker-factory"],
    // Built on the parts: metrics, etcd, the backends.
    &["invoker-metrics", "invoker-etcd", "invoker-process", "invoker-docker", "invoker-mesos", "invoker-kubernetes"],
    // An accepted activation and its end.
    &["invoker-job"],
    // The cluster's two programs besides the invoker, and the replay that drives them all.
    &["invoker-scheduler", "invoker-capacity", "invoker-replay"],
    // The invoker: the API, the config, the two actors, the intake, the assembly.
    &["invoker"],
    // What measures it.
    &["invoker-bench"],
];

fn layer_of(krate: &str) -> usize {
    CRATE_LAYERS.iter().position(|l| l.contains(&krate)).unwrap_or_else(|| panic!("{krate} has no layer"))
}

/// Each crate's own dependencies (the workspace's) are in layers below its own.
#[test]
fn every_crate_depends_on_lower_layers_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates: Vec<(String, PathBuf)> = vec![("invoker".into(), root.to_path_buf())];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let path = entry.unwrap().path();
        crates.push((path.file_name().unwrap().to_string_lossy().into_owned(), path));
    }
    assert!(crates.len() >= 21, "the crates were read: {crates:?}");
    for (krate, path) in &crates {
        let own = layer_of(krate);
        for dependency in dependencies_of(path).iter().filter(|d| *d == "invoker" || d.starts_with("invoker-")) {
            assert!(layer_of(dependency) < own, "{krate} (layer {own}) depends on {dependency}, not below it");
        }
    }
}

/// The invoker crate's own folders, lowest first: a folder imports only folders of layers
/// below its own (`crate::...`), so that the intake never names the pool nor a backend the
/// API. `main.rs` and `lib.rs` stand above them all.
const FOLDER_LAYERS: &[&[&str]] =
    &[&["config", "sim"], &["factory", "activation"], &["proxy"], &["pool"], &["cluster"], &["api"], &["app", "fuzz"]];

/// Every import of a folder (its first module) that does not go to a lower layer, as
/// `(from, to)`, and how many imports went from one folder to another.
fn upward_imports(root: &Path, layers: &[&[&str]]) -> (Vec<(String, String)>, usize) {
    let mut modules = BTreeMap::new();
    files(root, root, &mut modules);
    let layer = |folder: &str| layers.iter().position(|l| l.contains(&folder));
    let (mut upward, mut across) = (Vec::new(), 0);
    for (module, path) in &modules {
        let Some(folder) = module.first() else { continue };
        let own = layer(folder).unwrap_or_else(|| panic!("the folder {folder} has no layer"));
        let source = std::fs::read_to_string(path).unwrap();
        for reference in references(&source, module) {
            let Some(target) = reference.first().filter(|t| *t != folder) else { continue };
            across += 1;
            if layer(target).is_some_and(|theirs| theirs >= own) {
                upward.push((module.join("::"), reference.join("::")));
            }
        }
    }
    (upward, across)
}

#[test]
fn the_invokers_folders_import_down_the_layers_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (upward, across) = upward_imports(&root, FOLDER_LAYERS);
    assert_eq!(upward, Vec::<(String, String)>::new());
    assert!(across >= 50, "the scan found the imports between folders: {across}");
}

/// The rule finds an import up the layers, in a path and in a use group.
#[test]
fn the_folder_rule_finds_an_import_up_the_layers() {
    let dir = tempfile::tempdir().unwrap();
    for (file, text) in [
        ("low/mod.rs", "pub mod inner;\n"),
        ("low/inner.rs", "use crate::{high::Thing, low::Other};\n"),
        ("high.rs", "use crate::low::inner;\n"),
    ] {
        let path = dir.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let pair = |from: &str, to: &str| vec![(from.to_string(), to.to_string())];
    assert_eq!(upward_imports(dir.path(), &[&["low"], &["high"]]), (pair("low::inner", "high::Thing"), 2));
    assert_eq!(upward_imports(dir.path(), &[&["high"], &["low"]]), (pair("high", "low::inner"), 2));
}

/// The crates `invoker-wire` may not depend on: it is data and the rules of its shape.
#[test]
fn the_wire_depends_on_no_runtime_server_or_store() {
    let wire = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/invoker-wire");
    let named = dependencies_of(&wire);
    assert!(named.contains(&"serde".to_string()), "the dependencies were read: {named:?}");
    for name in &named {
        assert!(
            !IO_CRATES.contains(&name.as_str()) && !name.starts_with("tokio") && name != "invoker",
            "invoker-wire depends on {name}"
        );
    }
}

/// The factory API: a backend's building blocks may do I/O (sockets, mounts, namespaces), but
/// they reach no server, store or engine, so that a backend built on them cannot either except
/// through its own crate.
#[test]
fn the_factory_api_depends_on_no_server_store_or_engine() {
    let api = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/invoker-factory");
    let named = dependencies_of(&api);
    assert!(named.contains(&"invoker-ids".to_string()), "the dependencies were read: {named:?}");
    for name in &named {
        let engine = ["actix", "actix-rt", "hyper", "hyper-util", "redb", "reqwest", "bollard", "kube", "prost"];
        assert!(!engine.contains(&name.as_str()) && name != "invoker", "invoker-factory depends on {name}");
    }
}

/// Each heavy backend is a crate of its own that the invoker depends on only through its
/// feature: the default build (the README's first command) compiles none of them, nor their
/// clients (bollard, kube, prost), and a plain `cargo build` or `cargo test` in the workspace
/// does not build them as members either.
#[test]
fn the_default_build_compiles_no_backend() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let section = |name: &str| {
        let start = manifest.find(&format!("\n[{name}]")).unwrap_or_else(|| panic!("[{name}]"));
        manifest[start + name.len() + 3..].split("\n[").next().unwrap().to_string()
    };
    let (features, dependencies, workspace) = (section("features"), section("dependencies"), section("workspace"));
    assert!(features.lines().any(|l| l.trim() == "default = []"), "no default feature: {features}");
    let default_members = workspace.lines().find(|l| l.starts_with("default-members")).unwrap();
    for (backend, feature, clients) in [
        ("invoker-docker", "docker", &["bollard"][..]),
        ("invoker-kubernetes", "kubernetes", &["kube", "k8s-openapi"][..]),
        ("invoker-mesos", "mesos", &["prost", "protox"][..]),
    ] {
        assert!(root.join("crates").join(backend).join("Cargo.toml").is_file(), "{backend} is a crate");
        let line = dependencies.lines().find(|l| l.starts_with(&format!("{backend} "))).unwrap();
        assert!(line.contains("optional = true"), "{line}");
        let enabling = features.lines().find(|l| l.starts_with(&format!("{feature} "))).unwrap();
        assert!(enabling.contains(&format!("dep:{backend}")), "{enabling}");
        assert!(!default_members.contains(backend), "{default_members}");
        for client in clients {
            assert!(!dependencies.lines().any(|l| l.starts_with(&format!("{client} "))), "the invoker names {client}");
        }
    }
}

const IO_CRATES: [&str; 11] =
    ["tokio", "actix", "actix-rt", "hyper", "hyper-util", "redb", "reqwest", "bollard", "kube", "nix", "libc"];

/// The names under `[dependencies]` of a crate's manifest (none without the section).
fn dependencies_of(krate: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
    let Some(section) = manifest.split("\n[dependencies]").nth(1) else { return Vec::new() };
    let dependencies = section.split("\n[").next().unwrap_or_default();
    dependencies
        .lines()
        .filter_map(|l| l.split('=').next().map(|name| name.trim().trim_end_matches(".workspace")))
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .map(String::from)
        .collect()
}

/// The crates the core may not depend on (an async runtime, actors, HTTP, storage, processes and
/// system calls), and what its sources may not name (files, sockets, processes, threads, clocks).
#[test]
fn the_core_depends_on_nothing_that_does_io() {
    let core = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/invoker-core");
    let named = dependencies_of(&core);
    assert!(named.contains(&"serde".to_string()), "the dependencies were read: {named:?}");
    for name in &named {
        assert!(
            !IO_CRATES.contains(&name.as_str()) && !name.starts_with("tokio"),
            "invoker-core depends on {name}, which does I/O"
        );
    }
    let mut sources = BTreeMap::new();
    files(&core.join("src"), &core.join("src"), &mut sources);
    for path in sources.values() {
        let source = std::fs::read_to_string(path).unwrap();
        for banned in ["std::fs", "std::net", "std::process", "std::thread", "Instant::now", "SystemTime"] {
            assert!(
                !source.contains(banned),
                "{} names {banned}: the core reads no clock and does no I/O",
                path.display()
            );
        }
    }
}

fn no_import_cycle_in(root: &Path, at_least: usize) {
    let (cycle, importing) = import_cycle_in(root);
    if let Some(cycle) = cycle {
        panic!("an import cycle: {}", cycle.join(" → "));
    }
    assert!(importing >= at_least, "the scan found the imports: {importing} files import others");
}

/// The first import cycle among the files under `root`, and how many files import another.
fn import_cycle_in(root: &Path) -> (Option<Vec<String>>, usize) {
    let mut modules = BTreeMap::new();
    files(root, root, &mut modules);
    modules.retain(|m, _| m.first().is_none_or(|first| first != "bin"));
    let mut edges: BTreeMap<&Vec<String>, BTreeSet<&Vec<String>>> = BTreeMap::new();
    for (module, path) in &modules {
        let source = std::fs::read_to_string(path).unwrap();
        for reference in references(&source, module) {
            let target =
                (1..=reference.len()).rev().find_map(|n| modules.get_key_value(&reference[..n]).map(|(k, _)| k));
            if let Some(target) = target.filter(|t| *t != module) {
                edges.entry(module).or_default().insert(target);
            }
        }
    }
    // A depth-first search that reports the first cycle it closes.
    fn visit<'a>(
        node: &'a Vec<String>,
        edges: &BTreeMap<&'a Vec<String>, BTreeSet<&'a Vec<String>>>,
        stack: &mut Vec<&'a Vec<String>>,
        done: &mut BTreeSet<&'a Vec<String>>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|n| *n == node) {
            return Some(stack[i..].iter().chain([&node]).map(|m| m.join("::")).collect());
        }
        if !done.insert(node) {
            return None;
        }
        stack.push(node);
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    let cycle = modules.keys().find_map(|module| visit(module, &edges, &mut Vec::new(), &mut done));
    (cycle, edges.len())
}
