# The python:3 launcher of the invoker's action runtime (actionloop protocol).
# argv: [launcher.py, main]. The action is __main__.py (or the extracted zip) in the working
# directory. Writes {"ok": true} on fd 3 once the action is loaded, then, for every line on
# stdin (one /run body), one result line on fd 3. Output is flushed before each result so
# the runtime's sentinels follow the action's own lines.
import json
import os
import sys
import traceback

out = os.fdopen(3, "w")


def reply(obj):
    sys.stdout.flush()
    sys.stderr.flush()
    out.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
    out.flush()


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


try:
    main = load(sys.argv[1] if len(sys.argv) > 1 else "main")
except BaseException as ex:
    traceback.print_exc()
    reply({"error": "Initialization failed: %s: %s" % (type(ex).__name__, ex)})
    sys.exit(1)
reply({"ok": True})

for line in sys.stdin:
    try:
        message = json.loads(line)
        for key, value in message.items():
            if key != "value" and isinstance(value, str):
                os.environ["__OW_" + key.upper()] = value
        result = main(message.get("value", {}))
        if not isinstance(result, (dict, list)):
            result = {"error": "The action did not return a dictionary or array."}
    except BaseException as ex:
        traceback.print_exc()
        result = {"error": "%s: %s" % (type(ex).__name__, ex)}
    try:
        reply(result)
    except (TypeError, ValueError) as ex:
        reply({"error": "The action's result is not JSON: %s" % ex})
