//! Fn's own command-line client, `fn` (`../shared/tools/fn-cli/fn`, built unchanged from
//! fnproject/cli), with a home of its own (its contexts live there) and nothing of the test's
//! environment but what a test gives it.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The client, beside the project (`.ci/run` runs with `../shared` there).
pub fn client() -> PathBuf {
    let fn_cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/fn-cli/fn");
    assert!(fn_cli.is_file(), "Fn's client is not at {}", fn_cli.display());
    fn_cli
}

pub struct Fn {
    pub home: tempfile::TempDir,
    /// Variables beyond `HOME` and `PATH` (the engine for `fn build`, a proxy).
    env: Vec<(String, String)>,
}

/// What one command did: its exit code, stdout and stderr.
pub struct Ran {
    pub code: i32,
    pub out: String,
    pub err: String,
}

impl Ran {
    pub fn ok(self) -> String {
        assert_eq!(self.code, 0, "stdout: {}\nstderr: {}", self.out, self.err);
        self.out
    }

    pub fn json(self) -> Value {
        let out = self.ok();
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
    }
}

impl Fn {
    pub fn new() -> Fn {
        let home = tempfile::Builder::new().prefix("invoker-fn-home-").tempdir().unwrap();
        Fn { home, env: Vec::new() }
    }

    /// The client with these variables too.
    pub fn with_env(mut self, env: &[(&str, &str)]) -> Fn {
        self.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    pub fn run(&self, args: &[&str], stdin: &[u8]) -> Ran {
        self.run_in(self.home.path(), args, stdin)
    }

    /// The command in `dir` (where `fn init` writes and `fn deploy` reads a function).
    pub fn run_in(&self, dir: &Path, args: &[&str], stdin: &[u8]) -> Ran {
        use std::io::Write as _;
        let mut child = Command::new(client())
            .args(args)
            .current_dir(dir)
            .env_clear()
            .env("HOME", self.home.path())
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("fn starts");
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let done = child.wait_with_output().unwrap();
        Ran {
            code: done.status.code().unwrap_or(-1),
            out: String::from_utf8_lossy(&done.stdout).into_owned(),
            err: String::from_utf8_lossy(&done.stderr).into_owned(),
        }
    }

    pub fn ok(&self, args: &[&str]) -> String {
        self.run(args, b"").ok()
    }

    /// A context named `name` for the invoker at `base`, with `key` as its token and `registry`
    /// as the prefix of the images it builds, in use.
    pub fn use_context(&self, name: &str, base: &str, key: &str, registry: &str) {
        self.ok(&["create", "context", name, "--api-url", base, "--provider", "default", "--registry", registry]);
        self.ok(&["use", "context", name]);
        self.ok(&["update", "context", "token", key]);
    }
}
