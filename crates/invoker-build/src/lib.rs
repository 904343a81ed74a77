//! What the workspace's build scripts share: telling a crate's tests what this machine lacks, so
//! that a test that needs it shows as ignored rather than passed. Each mark is a `cfg`
//! (`invoker_without_root`, ...) a test names in `cfg_attr(..., ignore = "why")`. Under
//! `CI=true` no mark is set: there a missing part fails its tests.

#![forbid(unsafe_code)]

/// Declares `cfg(name)` and sets it when `present` is false (and this is not CI).
pub fn mark_unless(name: &str, present: impl FnOnce() -> bool) {
    println!("cargo:rerun-if-env-changed=CI");
    println!("cargo::rustc-check-cfg=cfg({name})");
    if std::env::var("CI").as_deref() != Ok("true") && !present() {
        println!("cargo:rustc-cfg={name}");
    }
}

/// `invoker_without_root`: the build is not root (no mounts, cgroups or namespaces).
pub fn mark_without_root() {
    mark_unless("invoker_without_root", is_root);
}

/// The effective uid is 0 (from `/proc/self/status`: no crate for one line).
pub fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().nth(1)) == Some("0")
}

/// Whether `program` is a file in a directory of the `PATH`.
pub fn on_path(program: &str) -> bool {
    println!("cargo:rerun-if-env-changed=PATH");
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
}
