"""Several processes with JAX's own runtime: ``jax.distributed`` with CPU collectives (Gloo).

A multi-process run starts the same program once per process (one per host, or several on one
host), each with three environment variables::

    LATENTZOO_COORDINATOR=host0:12355   # process 0's address and a free port, the same everywhere
    LATENTZOO_NUM_PROCESSES=2
    LATENTZOO_PROCESS_ID=0              # 0 .. NUM_PROCESSES - 1, different in each process

and calls :func:`initialize_from_env` before any JAX computation. It calls
``jax.distributed.initialize(coordinator, num_processes, process_id, ...)`` with CPU collectives
set to Gloo (``jax_cpu_collectives_implementation``, JAX 0.10's default, set explicitly) and with
time limits, so that a run whose processes cannot meet, or lose one another, ends instead of
hanging:

- ``LATENTZOO_INIT_TIMEOUT`` (s, default 60): how long a process waits for the coordinator and
  the others to connect (``initialization_timeout``);
- ``LATENTZOO_HEARTBEAT_TIMEOUT`` (s, default 20): how long the coordination service waits for a
  silent process before it declares it dead and JAX ends every other process
  (``heartbeat_timeout_seconds``); also the limit of the shutdown barrier at exit.

Once JAX has joined the processes, :func:`initialize_from_env` starts the peer watch
(:mod:`~latentzoo.inference.distributed.watch`): one TCP connection from each process to process
0 (its port shared by one small broadcast, which starts JAX's backend), which tells within
milliseconds that a process has died, and a local relay through which processes 1.. reach JAX's
coordination service, so that process 0's death is the watch's sentence and not JAX's fatal log.

What happens when something goes wrong (measured with JAX 0.10.2, Gloo over TCP, 2 processes x
2 forced host devices; ``tests/inference/test_distributed_processes.py``):

- bad input that the processes find alike (rows that the processes cannot share equally,
  processes holding different shapes): :class:`~latentzoo.inference.distributed.mesh.CollectiveValueError`
  on every process; :func:`run_main` prints its sentence on process 0 and every process exits
  with status 1 (process 0 last, once the others are gone, since their JAX would abort when its
  service vanished);
- a missing or malformed variable: each process says so in one sentence, status 1;
- no coordinator at ``LATENTZOO_COORDINATOR``: processes 1.. try a TCP connection for
  ``LATENTZOO_INIT_TIMEOUT`` seconds, then one sentence, status 1. Process 0 whose peers never
  come is ended by JAX itself after the time limit (SIGABRT, JAX's fatal log
  "Terminating process because the JAX distributed service detected fatal errors ...
  DEADLINE_EXCEEDED ... RegisterTask"): ``jax.distributed.initialize`` in 0.10 has no way to
  raise a Python exception there;
- a process dies (SIGKILL) in the middle of the run, even while the others wait inside a
  compiled program's collectives: the watch ends every other process with status 1 within a
  fraction of a second (0.11 to 0.47 s in 20 kills on a busy 2-core machine, the heartbeat
  limit being 20 s), with one sentence: process 0 says "Process k of n stopped unexpectedly
  (its connection to process 0 closed); the whole run is stopped." when process k died,
  process 1 says "Process 0 of n (the coordinator) stopped unexpectedly (its connection
  closed); the whole run is stopped." when process 0 died, and the others exit silently.
  Without the watch JAX ended them with its own fatal log of about twenty lines (SIGABRT):
  after the heartbeat limit when a process other than 0 died (13 s measured with a 20 s
  limit), within 0.3 s when process 0 died. A process that kills itself between two of the
  others' collectives gave the same sentence (7 runs); should Gloo's error there ("Connection
  reset by peer") reach :func:`run_main` first, it waits up to 2 s for the watch's sentence
  before it prints its own ("... lost contact with another process ...");
- a failure in one process only (an exception, ``sys.exit(code)``, Ctrl-C): :func:`run_main`
  prints its sentence there ("Interrupted." for Ctrl-C) and the watch stops the other processes
  silently with the same status (1, the code, 130).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, NoReturn

import jax
import numpy as np
from jax.experimental import multihost_utils

from . import watch as _watch
from .mesh import CollectiveValueError
from .watch import PeerWatch

__all__ = [
    "ENV_COORDINATOR",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "ENV_INIT_TIMEOUT",
    "ENV_HEARTBEAT_TIMEOUT",
    "ProcessInfo",
    "DistributedSetupError",
    "read_process_env",
    "initialize_from_env",
    "failure_sentence",
    "leave_together",
    "run_main",
]

ENV_COORDINATOR = "LATENTZOO_COORDINATOR"
ENV_NUM_PROCESSES = "LATENTZOO_NUM_PROCESSES"
ENV_PROCESS_ID = "LATENTZOO_PROCESS_ID"
ENV_INIT_TIMEOUT = "LATENTZOO_INIT_TIMEOUT"
ENV_HEARTBEAT_TIMEOUT = "LATENTZOO_HEARTBEAT_TIMEOUT"
DEFAULT_INIT_TIMEOUT = 60
DEFAULT_HEARTBEAT_TIMEOUT = 20

# signs, in a JAX runtime error, that another process is gone (Gloo and coordination service)
_PEER_SIGNS = ("gloo", "connection reset", "connection refused", "heartbeat", "unavailable",
               "socket closed", "broken pipe", "barrier", "coordination service", "peer")


class ProcessInfo(NamedTuple):
    """This process's place in the run: ``process_id`` of ``num_processes``; ``coordinator`` is
    process 0's ``host:port`` (None in a single-process run); the two time limits in seconds."""

    process_id: int
    num_processes: int
    coordinator: str | None
    init_timeout: int = DEFAULT_INIT_TIMEOUT
    heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT


class DistributedSetupError(RuntimeError):
    """The processes could not be joined into one run (a coordinator nobody answers at, JAX
    already started, ...); the message is one sentence."""


def _int(environ, name, default=None, minimum=0) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"{name} is not set.")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}.") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}.")
    return value


def read_process_env(environ: Mapping[str, str] | None = None) -> ProcessInfo:
    """The run's layout from the environment (default ``os.environ``), checked; nothing is
    started. None of the three variables set: a single process. Raises one :class:`ValueError`
    sentence for a partial or malformed set."""
    env = os.environ if environ is None else environ
    names = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
    present = [n for n in names if env.get(n)]
    init_timeout = _int(env, ENV_INIT_TIMEOUT, DEFAULT_INIT_TIMEOUT, 1)
    heartbeat = _int(env, ENV_HEARTBEAT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT, 1)
    if not present:
        return ProcessInfo(0, 1, None, init_timeout, heartbeat)
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise ValueError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; a multi-process "
            f"run needs {ENV_COORDINATOR} (process 0's host:port), {ENV_NUM_PROCESSES} and "
            f"{ENV_PROCESS_ID} in every process."
        )
    coordinator = env[ENV_COORDINATOR]
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{ENV_COORDINATOR} must be host:port (a free port on process 0's host), "
                         f"got {coordinator!r}.")
    n = _int(env, ENV_NUM_PROCESSES, minimum=1)
    pid = _int(env, ENV_PROCESS_ID)
    if pid >= n:
        raise ValueError(f"{ENV_PROCESS_ID}={pid} is not below {ENV_NUM_PROCESSES}={n}; process ids "
                         f"run from 0 to {n - 1}.")
    return ProcessInfo(pid, n, coordinator, init_timeout, heartbeat)


def initialize_from_env(environ: Mapping[str, str] | None = None) -> ProcessInfo:
    """Join this process to the run described by the environment (:func:`read_process_env`):
    ``jax.distributed.initialize`` with Gloo CPU collectives and the time limits of the module
    docstring, then the peer watch (:mod:`~latentzoo.inference.distributed.watch`; processes 1..
    reach the coordinator through its relay). Call it first, before any JAX computation; it
    starts JAX's backend (one small broadcast). A single-process layout (no variables, or one
    process) starts nothing. Raises :class:`ValueError` for a bad environment and
    :class:`DistributedSetupError` (one sentence) when the processes cannot be joined."""
    info = read_process_env(environ)
    if info.num_processes == 1 or jax.distributed.is_initialized():
        return info
    host, port = _host_port(info.coordinator)
    if info.process_id != 0:
        # JAX 0.10 ends the process with a fatal log (SIGABRT) when the coordinator never
        # answers; a plain TCP connection first turns the common case into one sentence.
        _wait_for_coordinator(info)
    watch = PeerWatch(info.process_id, info.num_processes)
    # processes 1.. reach JAX's service through the watch's relay (see watch.py: so that process
    # 0's death is the watch's sentence, not JAX's fatal log)
    address = info.coordinator if info.process_id == 0 else watch.relay(host, port)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            address, info.num_processes, info.process_id,
            initialization_timeout=info.init_timeout,
            heartbeat_timeout_seconds=info.heartbeat_timeout,
            shutdown_timeout_seconds=info.heartbeat_timeout,
        )
    except RuntimeError as exc:
        text = str(exc)
        if "must be called before" in text:
            raise DistributedSetupError(
                "initialize_from_env() must run before any JAX computation, and JAX has already "
                "started in this process."
            ) from None
        if info.process_id == 0:
            what = (f"the other {info.num_processes - 1} process(es) did not all connect to it at "
                    f"{info.coordinator} within {info.init_timeout} s")
        else:
            what = (f"it could not join the coordinator (process 0) at {info.coordinator} within "
                    f"{info.init_timeout} s")
        raise DistributedSetupError(
            f"Process {info.process_id} of {info.num_processes} gave up: {what} "
            f"({_first_line(text)})."
        ) from None
    _start_watch(watch, info, host)
    return info


def _host_port(coordinator: str) -> tuple[str, int]:
    host, _, port = coordinator.rpartition(":")
    return host.strip("[]"), int(port)


def _start_watch(watch: PeerWatch, info: ProcessInfo, host: str) -> None:
    """Process 0 listens, its port reaches the others (one broadcast: this starts JAX's backend),
    they connect; one sentence when they cannot."""
    try:
        port = watch.listen() if info.process_id == 0 else 0
        port = int(multihost_utils.broadcast_one_to_all(np.int32(port)))
        if info.process_id == 0:
            missing = watch.wait_for_peers(info.init_timeout)
        else:
            watch.connect(host, port, info.init_timeout)
            missing = []
    except (OSError, RuntimeError) as exc:
        raise DistributedSetupError(
            f"Process {info.process_id} of {info.num_processes} could not start its watch of "
            f"the other processes ({_first_line(exc)})."
        ) from None
    if missing:
        raise DistributedSetupError(
            f"Process 0 of {info.num_processes} gave up: process(es) "
            f"{', '.join(map(str, missing))} did not connect to its watch within "
            f"{info.init_timeout} s."
        )
    watch.start()


def _wait_for_coordinator(info: ProcessInfo) -> None:
    """Return once process 0's coordinator accepts TCP connections; one sentence after
    ``info.init_timeout`` seconds of trying."""
    host, port = _host_port(info.coordinator)
    deadline = time.monotonic() + info.init_timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise DistributedSetupError(
                    f"Process {info.process_id} of {info.num_processes} could not reach the "
                    f"coordinator (process 0) at {info.coordinator} within {info.init_timeout} s "
                    f"({exc.strerror or exc}); start process 0 with the same "
                    f"{ENV_COORDINATOR}, on that host."
                ) from None
            time.sleep(0.2)


def _first_line(text: str, limit: int = 200) -> str:
    line = next((s.strip() for s in str(text).splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _where() -> tuple[int, int]:
    try:
        return jax.process_index(), jax.process_count()
    except Exception:  # JAX could not start: say nothing about the layout
        return 0, 1


def failure_sentence(exc: BaseException) -> str:
    """One sentence for an exception that ends a (multi-process) run."""
    if isinstance(exc, KeyboardInterrupt):
        return "Interrupted."
    text = str(exc)
    if _peer_gone(exc):
        p, n = _where()
        return (f"Process {p} of {n} lost contact with another process, which has probably died "
                f"({_first_line(text)}); the whole run is stopped.")
    if isinstance(exc, (ValueError, DistributedSetupError)) and text:
        return _first_line(text, 1000)
    return f"{type(exc).__name__}: {_first_line(text, 1000)}"


def leave_together(me: int | None = None) -> None:
    """After bad input that every process found: wait for all of them, then let process 0, which
    hosts JAX's coordination service, leave last. Were it first, the others' coordination
    clients would see the service vanish and JAX would end them with a fatal log (SIGABRT)
    before they reach their own exit. Each process says "bye" to the peer watch
    (:mod:`~latentzoo.inference.distributed.watch`), so that its exit is not taken for a death;
    process 0 then waits until the others are gone (at most one second). ``me``: this process's
    index (default ``jax.process_index()``)."""
    me = jax.process_index() if me is None else me
    try:
        multihost_utils.sync_global_devices("latentzoo: leaving after bad input")
    except Exception:  # noqa: BLE001 (a peer already gone: leave anyway)
        return
    watch = _watch.current()
    if watch is not None:
        watch.leave()
    if me == 0:
        if watch is not None:
            watch.wait_gone(1.0)
        else:
            time.sleep(1.0)


def _peer_gone(exc: BaseException) -> bool:
    return isinstance(exc, jax.errors.JaxRuntimeError) and any(s in str(exc).lower() for s in _PEER_SIGNS)


def _leave(status: int, watch: PeerWatch | None, stop_others: bool) -> NoReturn:
    if watch is not None and stop_others:
        watch.stop_run(status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_main(main: Callable[[], Any]) -> NoReturn:
    """Run a program's ``main()`` so that a failure ends this process at once with one sentence
    on stderr and a non-zero status, never a hang.

    A :class:`~latentzoo.inference.distributed.mesh.CollectiveValueError` (bad input that every
    process found alike) is printed by process 0 only, and the processes then leave together,
    process 0 last (one barrier, then process 0 waits for the others to go); any other failure is
    printed by the process it happened in, which then stops the other processes through the peer
    watch (:mod:`~latentzoo.inference.distributed.watch`; they exit with the same status,
    silently). An error that says another process is gone first gives the watch up to two
    seconds to end the run with its own sentence, which names the process. The process then
    leaves with ``os._exit`` (status 1, 130 on Ctrl-C, a ``SystemExit``'s own code), skipping
    JAX's shutdown barrier, which would wait for processes that may be gone. A normal return
    exits with status 0 through the usual shutdown (every process says "bye" to the watch and
    waits for the others there).
    """
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            watch = _watch.current()
            if watch is not None:
                watch.take_over()
            _leave(exc.code if isinstance(exc.code, int) else 1, watch, stop_others=True)
    except BaseException as exc:  # noqa: BLE001 (the point is to end the process, whatever it was)
        watch = _watch.current()
        collective = isinstance(exc, CollectiveValueError)
        if watch is not None and _peer_gone(exc):
            watch.defer()
        if watch is not None:
            watch.take_over()
        me, count = _where()
        if not (collective and me != 0):
            print(failure_sentence(exc), file=sys.stderr, flush=True)
        sys.stdout.flush()
        if collective and count > 1:
            leave_together(me)
        _leave(130 if isinstance(exc, KeyboardInterrupt) else 1, watch, stop_others=not collective)
    sys.stdout.flush()
    sys.exit(0)
