//! The sentinel lines our runtime writes on stdout and stderr after each run, so that the
//! invoker knows where a run's lines end.

use invoker_wire::runtime::SENTINEL_LINE;
use std::io::Write as _;

/// One `write(2)` per stream: `writeln!` on the unbuffered stderr would make two. `tag`: the
/// activation id that starts the run's lines, when they are tagged.
pub(super) fn write_sentinels(tag: Option<&str>) {
    let line = match tag {
        Some(id) => std::borrow::Cow::Owned(format!("{id} {SENTINEL_LINE}")),
        None => std::borrow::Cow::Borrowed(SENTINEL_LINE),
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
