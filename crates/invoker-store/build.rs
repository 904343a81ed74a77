//! Marks the tests that need root (`invoker_without_root`) as ignored where this build is not
//! root; under `CI=true` nothing is marked (see `invoker-build`).

fn main() {
    invoker_build::mark_without_root();
}
