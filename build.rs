//! Tells the test suites what this machine lacks, so that a suite that needs it shows as
//! ignored rather than passed: `invoker_without_root` (the sandbox, cgroups, a tmpfs),
//! `invoker_without_etcd` (no `etcd` on the `PATH`) and `invoker_without_fdk` (Fn's FDKs not
//! installed). Under `CI=true` none is set: there a missing part fails its tests.

fn main() {
    println!("cargo:rerun-if-env-changed=CI");
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo::rustc-check-cfg=cfg(invoker_without_root)");
    println!("cargo::rustc-check-cfg=cfg(invoker_without_etcd)");
    println!("cargo::rustc-check-cfg=cfg(invoker_without_fdk)");
    if std::env::var("CI").as_deref() != Ok("true") {
        if !is_root() {
            println!("cargo:rustc-cfg=invoker_without_root");
        }
        if !on_path("etcd") {
            println!("cargo:rustc-cfg=invoker_without_etcd");
        }
        // Fn's FDKs, where `scripts/fdk.sh` puts them (`invoker_factory::kinds::FDK_DIR`).
        let fdk = std::path::Path::new("/usr/local/lib/invoker-fdk");
        if fdk.exists() {
            println!("cargo:rerun-if-changed={}", fdk.display());
        } else {
            println!("cargo:rustc-cfg=invoker_without_fdk");
        }
    }
}

/// The effective uid is 0 (from `/proc/self/status`: no crate for one line).
fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|ids| ids.split_whitespace().nth(1)) == Some("0")
}

fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
}
