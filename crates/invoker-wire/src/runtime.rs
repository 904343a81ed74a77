//! The fixed words and places of the runtime protocols, which the factories that start a
//! runtime, the proxy that speaks to it and our own runtime must agree on.

/// The line every OpenWhisk runtime writes on stdout and stderr after each activation.
pub const SENTINEL: &str = SENTINEL_LINE.trim_ascii_end();
/// The sentinel as a runtime writes it, newline included, in one `write(2)`.
pub const SENTINEL_LINE: &str = "XXX_THE_END_OF_A_WHISK_ACTIVATION_XXX\n";

/// The one message for a result that is neither a dictionary nor an array, whichever kind (the
/// runtime's own answer says the same).
pub const NOT_A_RESULT: &str = "The action did not return a dictionary or array.";

/// Ours, not OpenWhisk's: what a `/run` asks for (`Accept`) when its caller takes a stream, and
/// what our runtime answers with when the action streams (its `main` a generator). The body
/// has one line per value the action yielded, [`STREAM_VALUE`] then the value's JSON, as it is
/// yielded, and one last line, [`STREAM_END`] then `{}` (every value was made) or
/// `{"error": ...}` (the action failed after the values before it). Asked without it, our
/// runtime answers a generator's values as one JSON array; OpenWhisk's runtimes ignore it.
pub const STREAM_TYPE: &str = "application/x-invoker-stream";
/// The first byte of a streamed value's line ([`STREAM_TYPE`]).
pub const STREAM_VALUE: u8 = b'>';
/// The first byte of a stream's last line ([`STREAM_TYPE`]).
pub const STREAM_END: u8 = b'=';

/// OpenWhisk's words for a runtime that dropped the connection without an answer (its process
/// exited); our nodejs runtime says the same when the action's process exits.
pub const EXITED_UNEXPECTEDLY: &str = "The action did not produce a valid response and exited unexpectedly.";

/// The named pipes our runtime writes the action's stdout and stderr to when it is given a
/// directory (`action-runtime --output DIR`), made and read by the factory that starts it: an
/// engine's container then sends its output to the invoker without the engine's log path.
pub const OUTPUT_PIPES: [&str; 2] = ["stdout", "stderr"];

/// Where the socket directory is inside a container (Fn's `iofs` mount).
pub const FN_SOCKET_DIR: &str = "/tmp/iofs";

/// The socket (or relative symlink to one) an Fn function makes when it is ready.
pub const FN_LISTENER: &str = "lsnr.sock";

/// What an Fn function is given as `FN_LOGFRAME_NAME`, with `FN_LOGFRAME_HDR` naming
/// `Fn-Call-Id`: Fn's FDKs then write `<name>=<call id>` on stdout and stderr at the start of
/// each call, which tells the invoker whose every line is, however late an engine passes it on.
pub const FN_LOGFRAME_NAME: &str = "invoker_call_id";
/// The header whose value the frames carry.
pub const FN_LOGFRAME_HDR: &str = "Fn-Call-Id";

/// `FN_LISTENER` for a socket directory at `dir` (as the container sees it).
pub fn fn_listener_env(dir: &str) -> (String, String) {
    ("FN_LISTENER".into(), format!("unix:{dir}/{FN_LISTENER}"))
}

/// The port OpenWhisk's runtimes serve on.
pub const OPENWHISK_PORT: u16 = 8080;

/// The `fdk` console script's entry, run by the system's python (the script's own shebang
/// names the interpreter pip ran under): `fdk <file> <handler>`.
pub const FDK_MAIN: &str = "import sys; from fdk.scripts.fdk import main; sys.argv[0] = 'fdk'; main()";

/// The built-in `fn:python` kind's command on every factory: Fn's python FDK on the function's
/// code in `func.py` (its working directory), `{main}` its handler.
pub const FDK_PYTHON_COMMAND: [&str; 5] = ["/usr/bin/python3", "-c", FDK_MAIN, "func.py", "{main}"];
