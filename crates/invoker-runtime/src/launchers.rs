//! The launchers the runtime runs an action's code with, compiled into the binary. The process
//! factory uses them too: its warm python zygote (`zygote.py`, which forks a `python.py` launcher
//! per container) and its V8 startup snapshot of `nodejs.js`.

pub const PYTHON: &str = include_str!("launchers/python.py");
pub const NODEJS: &str = include_str!("launchers/nodejs.js");
pub const ZYGOTE: &str = include_str!("launchers/zygote.py");
