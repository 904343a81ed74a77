# The python:3 launcher of the invoker's action runtime (actionloop protocol).
# argv: [launcher.py, main], or [launcher.py, @wait-for-action] when started before the action
# exists (its entry point and environment then come as the first line on stdin, as to a launcher
# the zygote forked; see wait_for_action). The action is __main__.py (or the extracted zip) in the working
# directory. Writes {"ok": true} on fd 3 once the action is loaded, then, for every line on
# stdin (one /run body), one result line on fd 3. Output is flushed before each result so
# the runtime's sentinels follow the action's own lines. A main that returns an iterator (a
# generator) streams: one line per value, ">" then its JSON, written as it is yielded, then
# a last line, "=" then {} or {"error": ...} (invoker_wire::runtime::STREAM_TYPE); a string
# value goes as "$", its length in bytes and a newline, then its bytes (string_frame.rs).
# The zygote (zygote.py) imports this file and calls serve() in each container it forks.
import importlib
import json
import os
from collections.abc import Iterator
import sys
import traceback

out = None

# glibc's setenv (which os.environ uses) keeps every "NAME=value" string it is ever given, in a
# search tree it never prunes: with a new activation id and deadline per run, a warm action
# would leak ~250 bytes per activation and search a growing tree on each. putenv with strings
# this launcher owns replaces the environment's entries in place; os.environ's own mapping is
# kept in step, so the action sees the same values either way, and so do its child processes.
# (PyDLL keeps the GIL across the call: putenv is quick, and releasing and taking it back would
# cost more than the call.)
try:
    import ctypes

    _putenv = ctypes.PyDLL(None, use_errno=True).putenv
    _putenv.restype = ctypes.c_int
    _mapping = os.environ._data
    _encoding = sys.getfilesystemencoding()
except (ImportError, OSError, AttributeError):
    _putenv = None
# Per name: the string the C environment points at, and the one before it, freed a run later
# so that a thread still reading the old value does not read freed memory.
_owned = {}


def set_context(name, value):
    if _putenv is None:
        os.environ[name] = value
        return
    # As os.environ encodes them on POSIX.
    key, val = name.encode(_encoding, "surrogateescape"), value.encode(_encoding, "surrogateescape")
    if _mapping.get(key) == val:
        return
    # (Checked on the str: `b in bytes` first tries b as an int, and raises and clears an error.)
    if "=" in name or "\0" in name or "\0" in value:
        raise ValueError("the run context's %r cannot be an environment variable" % name)
    # ctypes passes a bytes object's own buffer, which lives (and stays put) while _owned holds it.
    entry = key + b"=" + val
    if _putenv(entry) != 0:
        raise OSError(ctypes.get_errno(), "putenv %s" % name)
    _owned[key] = (entry, _owned.get(key, (None,))[0])
    _mapping[key] = val


def reply(obj, mark=""):
    sys.stdout.flush()
    sys.stderr.flush()
    # Written in parts, not joined: a large result is not copied once more.
    if mark:
        out.write(mark)
    out.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
    out.write("\n")
    out.flush()


def stream_values(values):
    """Writes each value as it is yielded; returns how the stream ended. A full pipe blocks the
    write, and so the generator: the reader sets the pace."""
    try:
        for value in values:
            if type(value) is str:
                # "$", its length, then its bytes as they are: the runtime escapes what needs it
                # (a scan there; json.dumps, or even str.isprintable, would cost a large string
                # a hundred times its encoding here). Encoded before anything is written, so a
                # string that is not UTF-8 leaves no frame half written.
                data = value.encode("utf-8")
                out.write("$%d\n" % len(data))
                out.flush()
                out.buffer.write(data)
                out.buffer.flush()
                continue
            # In parts, not joined: a large value is not copied twice more.
            out.write(">")
            out.write(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
            out.write("\n")
            out.flush()
        return {}
    except Exception as ex:
        print(traceback.format_exc(), file=sys.stderr)
        if isinstance(ex, (TypeError, ValueError)) and "JSON" in str(ex):
            return {"error": "a yielded value is not JSON: %s" % ex}
        return {"error": str(ex)}


def load(entry):
    sys.path.insert(0, os.getcwd())
    namespace = {"__name__": "__main__", "__file__": os.path.abspath("__main__.py")}
    with open("__main__.py", "r", encoding="utf-8") as f:
        code = compile(f.read(), "__main__.py", "exec")
    exec(code, namespace)
    fn = namespace.get(entry)
    if not callable(fn):
        raise NameError("the action has no function named '%s'" % entry)
    return fn


class Tagged(object):
    """A text stream whose lines start with the running activation's id while one is set: when
    runs overlap on one container (the invoker asks with tag_logs), the invoker gives each line
    to the run that wrote it. One process runs one activation at a time, but several share the
    container's pipes: each line goes whole, in one write, so that no other process's output
    lands inside it."""

    # A line longer than this goes out in parts rather than wait in memory for its end.
    LONGEST = 64 * 1024

    def __init__(self, stream):
        self._stream = stream
        self._pending = ""
        self.tag = ""

    def write(self, text):
        if not self.tag:
            return self._stream.write(text)
        pending = self._pending + text
        end = pending.rfind("\n") + 1
        if end == 0 and len(pending) > self.LONGEST:
            end = len(pending)
        if end > 0:
            lines = pending[:end].splitlines(True)
            self._stream.write("".join(self.tag + line for line in lines))
        self._pending = pending[end:]
        return len(text)

    def end_run(self):
        """Writes what the run left of an unfinished line, ended, so that the runtime's
        sentinel starts a line."""
        if self.tag and self._pending:
            self._stream.write(self.tag + self._pending + "\n")
        self._pending = ""
        self.tag = ""

    def __getattr__(self, name):
        return getattr(self._stream, name)


def serve(entry):
    """Loads the action, acknowledges it, then answers one result line per stdin line, as
    OpenWhisk's python launcher does: an exception is an application error holding str() of it
    (its traceback goes to stderr); SystemExit ends the process (a developer error)."""
    global out
    out = os.fdopen(3, "w")
    try:
        main = load(entry)
    except BaseException as ex:
        traceback.print_exc()
        reply({"error": "Initialization failed: %s: %s" % (type(ex).__name__, ex)})
        sys.exit(1)
    reply({"ok": True})

    tagged = None
    for line in sys.stdin:
        try:
            message = json.loads(line)
            # The line is let go before the action runs: a large call's parameters are not
            # held twice while it does.
            line = None
            for key, value in message.items():
                if key != "value" and isinstance(value, str):
                    set_context("__OW_" + key.upper(), value)
            if message.get("tag_logs") is True and isinstance(message.get("activation_id"), str):
                if tagged is None:
                    tagged = (Tagged(sys.stdout), Tagged(sys.stderr))
                    sys.stdout, sys.stderr = tagged
                for stream in tagged:
                    stream.tag = message["activation_id"] + " "
            # Anything but a dict or a list goes to the runtime as it is: the runtime answers it
            # as a developer error, with the one message every kind gives.
            result = main(message.get("value", {}))
        except Exception as ex:
            print(traceback.format_exc(), file=sys.stderr)
            result = {"error": str(ex)}
        streamed = isinstance(result, Iterator)
        if streamed:
            result = stream_values(result)
        if tagged is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            for tagged_stream in tagged:
                tagged_stream.end_run()
        if streamed:
            reply(result, "=")
            continue
        try:
            reply(result)
        except (TypeError, ValueError) as ex:
            print("The action's result is not JSON: %s" % ex, file=sys.stderr)
            reply(None)


def wait_for_action():
    """A launcher started before its action exists (forked by the zygote, or started with the
    runtime): the runtime's first line, at /init once the code is written, names the entry
    point and the action's environment. Returns the entry point."""
    first = json.loads(sys.stdin.readline() or "{}")
    for key, value in first.get("env", {}).items():
        os.environ[key] = value
    # The work directory was read before the action's files (a zip's modules) were there.
    importlib.invalidate_caches()
    return first.get("main") or "main"


if __name__ == "__main__":
    if sys.argv[1:] == ["@wait-for-action"]:
        serve(wait_for_action())
    else:
        serve(sys.argv[1] if len(sys.argv) > 1 else "main")
