//! Generates the Mesos protocol types from `proto/` with protox (pure Rust, so a fresh machine
//! needs no protoc) and prost.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(["mesos/v1/scheduler/scheduler.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(files)?;
    Ok(())
}
