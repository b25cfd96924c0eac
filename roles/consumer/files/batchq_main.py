# -*- coding: utf-8 -*-
# Copyright: batchq.consumers contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A consumer's program run in this process as `python3 TARGET` runs it: a
fresh __main__ module, sys.argv and sys.path[0] as python3 sets them, its
exit status, and python3's exit steps. Part of batchq-drain, installed beside
it; a preloaded batch runs its program here (batchq_preload.py), in a fork
of the runner.
"""

import builtins
import gc
import importlib.machinery
import os
import sys
import types

import batchq_cpython

# Whether the runner put the batch's sys.path[0] in place (not under -I or -P).
PATH0 = {"set": False}
# The batch's script compiled by the runner, while its file is unchanged:
# each batch would compile it again, as python3 does.
SCRIPT = {"path": None, "identity": None, "code": None}


def python_path_of(target):
    """sys.path[0] of `python3 TARGET`: the script's folder, or the working
    directory for -m; None under -I or -P (Python 3.11+), which add neither."""
    if sys.flags.isolated or getattr(sys.flags, "safe_path", False):
        return None
    if target[0] == "-m":
        return os.getcwd()
    return os.path.dirname(os.path.realpath(target[0]))


def file_identity(path):
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_ino, status.st_size, status.st_mtime_ns


def compile_script(path):
    """Compile the script for the batches to come, unless done for this file;
    a script that fails to compile is left to the batch, to fail as python3 does."""
    identity = file_identity(path)
    if (SCRIPT["path"], SCRIPT["identity"]) == (path, identity):
        return
    try:
        with open(path, "rb") as handle:
            code = compile(handle.read(), path, "exec", dont_inherit=True)
    except Exception:  # pylint: disable=broad-except
        code = None
    SCRIPT.update(path=path, identity=identity, code=code)


def python_exit_status(code):
    """The exit status of SystemExit(code), as the interpreter gives it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write("%s\n" % (code,))
    return 1


def run_as_main(target):
    """Run target, [SCRIPT, ARGS...] or ["-m", MODULE, ARGS...], in this
    process as `python3 TARGET` runs it, and return its exit status: a fresh
    __main__ module, sys.argv, SystemExit, a traceback and 1 for an uncaught
    exception, then non-daemon threads joined, atexit handlers, stdio flushed."""
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    if PATH0["set"]:
        sys.path[0] = python_path_of(target)  # as python3 finds it now: a release symlink may have moved
    try:
        if target[0] == "-m":
            sys.argv = ["-m"] + target[2:]  # runpy puts the module's file in sys.argv[0]
            batchq_cpython.run_module_as_main(target[1])
        else:
            path = os.path.abspath(target[0])
            sys.argv = list(target)
            code = SCRIPT["code"] if SCRIPT["path"] == path else None
            if code is None:
                try:
                    with open(path, "rb") as handle:
                        source = handle.read()
                except OSError as exc:
                    # what python3 says and returns for a script it cannot open
                    sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n"
                                     % (sys.executable, target[0], exc.errno, exc.strerror))
                    return 2
                code = compile(source, path, "exec", dont_inherit=True)
            main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins,
                                 __loader__=importlib.machinery.SourceFileLoader("__main__", path))
            exec(code, main.__dict__)  # pylint: disable=exec-used
        status = 0
    except SystemExit as exc:
        status = python_exit_status(exc.code)
    except BaseException:  # pylint: disable=broad-except
        kind, value, trace = sys.exc_info()
        # from the batch's own frames on, as python3 shows it
        sys.excepthook(kind, value.with_traceback(trace.tb_next), trace.tb_next)
        status = 1
    batchq_cpython.join_threads()
    batchq_cpython.run_exit_handlers()
    # What the interpreter's exit does next: the batch's garbage is collected
    # while its module's globals are still there (a __del__ may use them), then
    # its objects are let go, so that their __del__ runs and a file left open
    # is flushed and closed.
    gc.collect()
    main.__dict__.clear()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            # the interpreter exits 120 when it cannot flush its stdout
            status = 120 if stream is sys.stdout and status == 0 else status
    return status
