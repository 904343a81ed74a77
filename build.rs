//! Tells the test suites what this machine lacks, so that a suite that needs it shows as
//! ignored rather than passed: `invoker_without_root` (the sandbox, cgroups, a tmpfs),
//! `invoker_without_etcd` (no `etcd` on the `PATH`) and `invoker_without_fdk` (Fn's FDKs not
//! installed). Under `CI=true` none is set: there a missing part fails its tests.

fn main() {
    invoker_build::mark_without_root();
    invoker_build::mark_unless("invoker_without_etcd", || invoker_build::on_path("etcd"));
    // Fn's FDKs, where `scripts/fdk.sh` puts them (`invoker_factory::kinds::FDK_DIR`).
    let fdk = std::path::Path::new("/usr/local/lib/invoker-fdk");
    if fdk.exists() {
        println!("cargo:rerun-if-changed={}", fdk.display());
    }
    invoker_build::mark_unless("invoker_without_fdk", || fdk.exists());
}
