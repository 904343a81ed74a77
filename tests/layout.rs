//! The seams of the source tree: no two files of a crate import each other, directly or through
//! others (tests and `mod tests` blocks aside), so each module can be read, tested and replaced
//! from its own imports downward; and the decision cores (`crates/invoker-core`) depend on
//! nothing that does I/O, so that they stay pure functions of their events.

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

/// The module paths a file names after `crate::` or `super::` (the first path of a group).
fn references(source: &str, module: &[String]) -> Vec<Vec<String>> {
    let code = match source.find("#[cfg(test)]\nmod tests") {
        Some(i) => &source[..i],
        None => source,
    };
    let mut found = Vec::new();
    // `super` of `a/b.rs` and of `a/b/mod.rs` (both module `a::b`) is `a`.
    let parent = module[..module.len().saturating_sub(1)].to_vec();
    for (prefix, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut rest = code;
        while let Some(i) = rest.find(prefix) {
            let preceded_by_ident = rest[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_');
            rest = &rest[i + prefix.len()..];
            if preceded_by_ident {
                continue;
            }
            let mut path = base.clone();
            let mut tail = rest;
            loop {
                let end = tail
                    .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(tail.len());
                if end == 0 {
                    break;
                }
                path.push(tail[..end].to_string());
                tail = &tail[end..];
                match tail.strip_prefix("::") {
                    Some(t) => tail = t,
                    None => break,
                }
            }
            found.push(path);
        }
    }
    found
}

#[test]
fn no_import_cycle_between_the_files_of_the_project() {
    no_import_cycle_in(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), 20);
}

#[test]
fn no_import_cycle_between_the_files_of_the_core() {
    no_import_cycle_in(&Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/invoker-core/src"), 5);
}

/// The crates the core may not depend on (an async runtime, actors, HTTP, storage, processes and
/// system calls), and what its sources may not name (files, sockets, processes, threads, clocks).
#[test]
fn the_core_depends_on_nothing_that_does_io() {
    let core = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/invoker-core");
    let manifest = std::fs::read_to_string(core.join("Cargo.toml")).unwrap();
    let dependencies = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    let named: Vec<&str> = dependencies
        .lines()
        .filter_map(|l| l.split('=').next().map(str::trim))
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect();
    assert!(named.contains(&"serde"), "the dependencies were read: {named:?}");
    let io = ["tokio", "actix", "actix-rt", "hyper", "hyper-util", "redb", "reqwest", "bollard", "kube", "nix", "libc"];
    for name in &named {
        assert!(!io.contains(name) && !name.starts_with("tokio"), "invoker-core depends on {name}, which does I/O");
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
    for module in modules.keys() {
        if let Some(cycle) = visit(module, &edges, &mut Vec::new(), &mut done) {
            panic!("an import cycle: {}", cycle.join(" → "));
        }
    }
    assert!(edges.len() > at_least, "the scan found the imports: {} files import others", edges.len());
}
