# The python:3 zygote of the process factory: one interpreter, started with the invoker, that
# has imported the launcher and everything it uses, and forks a launcher into each new
# container instead of a new interpreter starting there (see src/factory/zygote.rs).
#
# It runs as root, in the invoker's namespaces and cgroup, and reads one JSON request per line
# on stdin, from the invoker only:
#   {"pid": <the container's sandbox, then runtime>, "cgroups": [cgroup.procs files], "uid": n,
#    "work": <its work dir>, "socket": <the runtime's launcher socket>, "wait_ms": n,
#    "env": {...}}
# and answers {"pid": <the child>} or {"error": "..."} on stdout. When stdin ends (the invoker
# is gone) it exits. Its children are reaped by the kernel (SIGCHLD ignored) and outlive it.
# The child that takes a request was most often forked and warmed up before it came (a spare:
# see fork_child), and the next one is forked once the answer is written and the cold start it
# went to has had its few milliseconds (see SPARE_AFTER).
#
# The child, before anything of an action exists, in this order: joins the container's
# cgroups; waits for the runtime (the sandbox has then built the container); enters the container's network, IPC and mount namespaces (the runtime's: its own
# loopback, its own root); joins the container's process group (so pause and removal reach it);
# drops to the container's uid with no supplementary groups, no capabilities and
# no_new_privs; connects to the runtime; keeps no descriptor but stdin/stdout/stderr and fd 3;
# gets the container's environment and nothing else; re-seeds `random`; then waits for the
# runtime's first line (the /init: the entry point and its env) and serves as the launcher.
import ctypes
import fcntl
import gc
import json
import os
import random
import resource
import select
import signal
import socket
import sys
import time

import launcher

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
# The same number on every architecture (the syscall table unified after 5.0).
SYS_PIDFD_GETFD = 438

libc = ctypes.CDLL(None, use_errno=True)
# Resolved here once rather than in each child (ctypes looks a function up at its first use).
for name in ("syscall", "setns", "prctl"):
    getattr(libc, name)


def check(rc, what):
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "%s: %s" % (what, os.strerror(errno)))


def high(fd):
    """The same open file on a descriptor above the four the child will use."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


def become(request):
    """Turns this fresh child into the container's launcher; returns the entry point."""
    # "0": this process, single-threaded here (v1's tasks file moves it without a grace period).
    for procs in request["cgroups"]:
        fd = os.open(procs, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    runtime = int(request["pid"])
    # The container's process itself, not whatever its pid may later name: every step below
    # goes through this descriptor, and fails if that process is gone.
    pidfd = high(os.pidfd_open(runtime))
    # Forked while the sandbox sets the container up: its namespaces and root are final once
    # the runtime has bound its launcher socket.
    deadline = time.monotonic() + request["wait_ms"] / 1000.0
    while not os.path.exists(request["socket"]):
        if time.monotonic() > deadline:
            raise TimeoutError("the runtime never bound %s" % request["socket"])
        time.sleep(0.0005)
    # The container's stdout and stderr are the runtime's (pipes the invoker reads).
    streams = []
    for n in (1, 2):
        fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, n, 0)
        check(0 if fd >= 0 else -1, "pidfd_getfd %d" % n)
        streams.append(high(fd))
    check(libc.setns(pidfd, CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS), "setns")
    os.setpgid(0, runtime)
    # As a child of the runtime would: its scheduling policy (SCHED_BATCH unless the kind says).
    os.sched_setscheduler(0, os.sched_getscheduler(runtime), os.sched_getparam(runtime))
    os.chdir(request["work"])
    # The container's bound on open files, as the sandbox sets it on the runtime.
    bound = min(int(request["open_files"]), resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (bound, bound))
    uid = int(request["uid"])
    if uid == 0:
        raise PermissionError("refusing to run a container as uid 0")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise PermissionError("could take uid 0 back after dropping it")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    while True:
        try:
            conn.connect(request["socket"])
            break
        except ConnectionRefusedError:
            # Bound but not yet listening.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.0005)
    conn = high(conn.detach())
    for source, target in ((conn, 0), (conn, 3), (streams[0], 1), (streams[1], 2)):
        os.dup2(source, target)
    os.closerange(4, os.sysconf("SC_OPEN_MAX"))
    sys.stdin = open(0, "r", encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    return launcher.wait_for_action()


def child(request):
    try:
        entry = become(request)
    except BaseException as ex:
        os.write(2, ("zygote: container setup failed: %s: %s\n" % (type(ex).__name__, ex)).encode())
        os._exit(126)
    try:
        launcher.serve(entry)
        code = 0
    except SystemExit as ex:
        code = ex.code if isinstance(ex.code, int) else 1
    except BaseException:
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def warm():
    """Touches, while nothing waits, what a request's child would otherwise copy page by page
    as it goes: CPython writes every object it touches (its reference count), and in a fresh
    child each first write copies a page (~0.3 ms for each step below, measured in a child
    forked from this zygote). A collection walks every tracked object; then the steps a
    child takes once: JSON, text files, a socket, the environment."""
    gc.collect()
    json.loads(json.dumps({"pid": 1, "cgroups": ["/"], "env": {"A": "b"}}))
    for f in (open(os.devnull, "r", encoding="utf-8"), open(os.devnull, "w", encoding="utf-8", buffering=1)):
        f.close()
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
    list(os.environ.items())


def fork_child(spare):
    """A child that waits for its request on a pipe; returns (its pid, the pipe's write end,
    the read end of the pipe on which it says it is ready).

    A spare is forked ahead of the next request, so that request waits neither for the fork
    (~1 ms: the zygote's page tables copied) nor for the copies of the pages the child writes:
    it warms up (`warm`) as SCHED_IDLE, on CPU nothing else wants (a cold start in progress
    is never slowed by it), then says it is ready. A request that finds the spare not yet
    ready (a burst: no CPU is idle) goes to a child forked for it, as before spares.
    A child whose zygote is gone reads the end of its pipe and exits: it never outlives the
    zygote unused."""
    readable, writable = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid != 0:
        os.close(readable)
        os.close(ready_w)
        return pid, writable, ready_r
    try:
        os.close(writable)
        os.close(ready_r)
        # Neither the invoker's requests nor its answers: the zygote's alone.
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        if spare:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            warm()
            os.write(ready_w, b"r")
        # A child forked for a request is handed it at once: the zygote does not wait for it
        # to say it is ready (and may have closed its end already).
        os.close(ready_w)
        chunks = []
        while True:
            chunk = os.read(readable, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(readable)
        if not chunks:
            os._exit(0)
        if spare:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        request = json.loads(b"".join(chunks))
    except BaseException:
        os._exit(0)
    child(request)


# How long after an answer the next spare waits to be forked: the cold start the answer went to
# is on its way for a few milliseconds more (the sandbox built, the launcher adopted, `/init`
# and the first `/run`), and the fork (the zygote's page tables copied) and the new child's
# first steps, at normal priority until it sets SCHED_IDLE, took CPU from it on a small
# machine: python's first call 6.2-6.3 ms with the fork at once, 4.9-5.1 ms with it here
# (BENCHMARKS.md, issue 78). A request that comes meanwhile is forked for, as in a burst.
SPARE_AFTER = 0.005


class Requests:
    """The invoker's request lines on fd 0, read without a buffer select() cannot see."""

    def __init__(self, fd):
        self.fd = fd
        self.pending = b""

    def next_line(self):
        """The next line, or None once the invoker closed its end."""
        while b"\n" not in self.pending:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line + b"\n"

    def come_within(self, seconds):
        """Whether a request waits, or comes within `seconds`."""
        return b"\n" in self.pending or bool(select.select([self.fd], [], [], seconds)[0])


def is_ready(ready_r):
    return bool(select.select([ready_r], [], [], 0)[0])


def hand_over(child, line):
    """Writes the request to `child`; its pid, or None if it died meanwhile (a broken pipe)."""
    pid, handoff, ready_r = child
    try:
        os.write(handoff, line)
        return pid
    except BrokenPipeError:
        return None
    finally:
        os.close(handoff)
        os.close(ready_r)


def main():
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    requests = Requests(sys.stdin.fileno())
    answers = sys.stdout.buffer
    try:
        spare = fork_child(spare=True)
    except OSError:
        spare = None
    while True:
        line = requests.next_line()
        if line is None:
            break
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            pid = None
            if spare is not None and is_ready(spare[2]):
                pid, spare = hand_over(spare, line), None
            if pid is None:
                pid = hand_over(fork_child(spare=False), line)
            if pid is None:
                raise OSError("no child took the request")
        except (ValueError, OSError) as ex:
            answer = {"error": "%s: %s" % (type(ex).__name__, ex)}
        else:
            answer = {"pid": pid}
        answers.write(json.dumps(answer).encode() + b"\n")
        answers.flush()
        # The next request's spare, forked after this answer and after SPARE_AFTER: off this
        # one's path, and off the path of the cold start it went to.
        if spare is None and not requests.come_within(SPARE_AFTER):
            try:
                spare = fork_child(spare=True)
            except OSError:
                spare = None


if __name__ == "__main__":
    main()
