"""The peer watch: a process of a multi-process run that dies ends the whole run at once, with
one sentence.

Why. JAX 0.10's coordination service learns that a process died only from its missing
heartbeats (``LATENTZOO_HEARTBEAT_TIMEOUT``, 20 s by default) and then ends every other process
with its own fatal log of several lines (SIGABRT); when process 0, which hosts the service, dies,
the other processes' JAX clients see the service vanish within milliseconds and end with the same
log. A process killed while the others waited inside a compiled program (in a collective) used to
end the run that way. JAX's public API has no hook to replace that log.

How. Plain TCP beside JAX's own connections, started by
:func:`~latentzoo.inference.distributed.processes.initialize_from_env` (several processes only):

- Process 0 listens on a free port (all interfaces; the port reaches the others through one
  small broadcast) and every other process connects to it once and says its id. The kernel
  closes a process's sockets the moment it ends, SIGKILL included, so the other end's blocking
  read returns at once. A connection that closes without a word first ("bye": leaving normally;
  "stop S": ending the run with status S) is a process that died.
- Process 0, seeing process k's connection close so: tells the others to stop, prints one
  sentence ("Process k of n stopped unexpectedly ..."), waits (at most :data:`HOLD` seconds) for
  them to go and exits with status 1, last, so that none of them sees JAX's service vanish.
- Any other process, told to stop: exits with the status given, silently (the sentence is
  process 0's, or the failing process's own). Seeing process 0's connection close without a
  word: process 1 prints "Process 0 of n (the coordinator) stopped unexpectedly ...", and every
  such process exits with status 1.
- Processes 1.. reach JAX's coordination service through a relay of their own (a local port
  whose bytes are copied to and from the coordinator's). When the service's end of a connection
  closes, the relay passes that on only after process 0 said "bye"; when process 0 died, it never
  does, and the watch ends the process first. Without the relay, JAX's client would see the
  service vanish and end the process with its fatal log before the watch's sentence.

A process leaving normally says "bye" (at interpreter exit, through ``atexit``, and in
:func:`~latentzoo.inference.distributed.processes.leave_together`). One that fails in
:func:`~latentzoo.inference.distributed.processes.run_main` says "stop S" after its own sentence
(S its status: 1, 130 after Ctrl-C, a ``SystemExit``'s code), and the others end silently with
status S; an exception that nothing caught (a program without ``run_main``) does the same with
status 1 at interpreter exit, after Python's traceback. Either way no process is reported as
dead. A process that is alive but stuck keeps its connections open: the watch does not see it,
JAX's heartbeat limit remains the bound there.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time

__all__ = ["HOLD", "PeerWatch", "current"]

#: Seconds to wait for the other processes to go (process 0, ending the run), and for a word from
#: process 0 when JAX's connection to the service closes (the relay).
HOLD = 2.0

_current: PeerWatch | None = None


def current() -> PeerWatch | None:
    """This process's started watch, or None (a single-process run, or none started yet)."""
    return _current


def _thread(target, *args) -> None:
    threading.Thread(target=target, args=args, daemon=True, name="latentzoo-peer-watch").start()


def _nodelay(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # pragma: no cover
        pass


def _forever() -> None:
    """Block this thread; another one is ending the process (``os._exit``)."""
    while True:
        time.sleep(3600)


class PeerWatch:
    """One process's end of the watch (see the module docstring): process 0 with a connection to
    every other process, each other process with one to process 0."""

    def __init__(self, process_id: int, num_processes: int):
        self.me, self.n = process_id, num_processes
        self.ending = threading.Event()  # set by whoever ends this process
        self._end = threading.Lock()  # taken, never released, by whoever ends this process
        self._state = threading.Condition()
        self._socks: dict[int, socket.socket] = {}  # peer -> connection
        self._said: dict[int, str] = {}  # peer -> "bye" / "stop"
        self._closed: set[int] = set()
        self._send = threading.Lock()
        self._left = False

    # -- joining ----------------------------------------------------------------------------
    def listen(self) -> int:
        """Process 0: accept the others' connections (in a thread); the port."""
        if socket.has_dualstack_ipv6():
            server = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            server = socket.create_server(("", 0))
        self._server = server
        _thread(self._accept, server)
        return server.getsockname()[1]

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                sock, _ = server.accept()
            except OSError:  # closed by wait_for_peers
                return
            _nodelay(sock)
            _thread(self._read, sock, None)

    def wait_for_peers(self, timeout: float) -> list[int]:
        """Process 0: block until every other process has connected, then stop listening; the
        processes that did not connect."""
        with self._state:
            self._state.wait_for(lambda: len(self._socks) == self.n - 1, timeout)
            missing = sorted(set(range(1, self.n)) - set(self._socks))
        for close in (lambda: self._server.shutdown(socket.SHUT_RDWR), self._server.close):
            try:
                close()
            except OSError:
                pass
        return missing

    def connect(self, host: str, port: int, timeout: float) -> None:
        """Processes 1..: connect to process 0's watch and say this process's id."""
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.settimeout(None)
        _nodelay(sock)
        sock.sendall(f"hello {self.me}\n".encode())
        with self._state:
            self._socks[0] = sock
        _thread(self._read, sock, 0)

    def start(self) -> PeerWatch:
        """Make this the process's watch; say "bye" at interpreter exit."""
        global _current
        _current = self
        atexit.register(self._at_exit)
        return self

    # -- reading ----------------------------------------------------------------------------
    def _read(self, sock: socket.socket, peer: int | None) -> None:
        try:
            for line in sock.makefile("r", encoding="ascii", errors="replace"):
                words = line.split()
                if peer is None:  # process 0: the first line names the process
                    with self._state:
                        if (len(words) != 2 or words[0] != "hello" or not words[1].isdigit()
                                or not 0 < int(words[1]) < self.n or int(words[1]) in self._socks):
                            break  # not one of ours
                        peer = int(words[1])
                        self._socks[peer] = sock
                        self._state.notify_all()
                elif words[:1] in (["bye"], ["stop"]):
                    with self._state:
                        self._said[peer] = words[0]
                        self._state.notify_all()
                    if words[0] == "stop":
                        self._end_run(int(words[1]) if words[1:] and words[1].isdigit() else 1)
        except OSError:  # reset by the peer's end: as closed
            pass
        if peer is None:
            sock.close()
            return
        with self._state:
            self._closed.add(peer)
            self._state.notify_all()
            word = self._said.get(peer)
        if word is None:
            self._lost(peer)

    def _lost(self, peer: int) -> None:
        if self.me == 0:
            sentence = (f"Process {peer} of {self.n} stopped unexpectedly (its connection to "
                        f"process 0 closed); the whole run is stopped.")
        elif self.me == 1:
            sentence = (f"Process 0 of {self.n} (the coordinator) stopped unexpectedly (its "
                        f"connection closed); the whole run is stopped.")
        else:
            sentence = None
        self._end_run(1, sentence)

    def _end_run(self, status: int, sentence: str | None = None) -> None:
        if not self.claim():
            return  # another thread is ending this process
        if self.me == 0:
            self._tell(f"stop {status}")
        if sentence:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 (leaving anyway)
                    pass
            try:
                os.write(2, (sentence + "\n").encode())
            except OSError:
                pass
        if self.me == 0:
            self.wait_gone(HOLD)
        os._exit(status)

    # -- what the process's own code calls --------------------------------------------------
    def take_over(self) -> None:
        """Take the right to end this process (print, stop the others, exit); never returns
        when the watch already has it, since it is then ending the process itself."""
        if not self.claim():
            _forever()

    def claim(self) -> bool:
        """Take the right to end this process; False when another thread already has it (it is
        ending the process: do not print, do not exit on your own)."""
        if not self._end.acquire(blocking=False):
            return False
        self.ending.set()
        with self._state:
            self._state.notify_all()
        return True

    def defer(self, timeout: float = HOLD) -> None:
        """Give the watch up to ``timeout`` s to end the process (a peer found dead or told to
        stop); never returns when it does. For an error that says a peer is gone, so that the
        watch's sentence, which names the process, is the one printed."""
        if self.ending.wait(timeout):
            _forever()

    def stop_run(self, status: int) -> None:
        """After :meth:`take_over` and this process's own sentence: end the other processes silently
        with ``status`` (process 0 tells each and waits for them to go, at most :data:`HOLD`
        s; the others tell process 0, which passes it on). The caller then exits."""
        self._tell(f"stop {status}")
        if self.me == 0:
            self.wait_gone(HOLD)

    def leave(self) -> None:
        """Say "bye" to the other processes: this process's end is expected (normal exit, or
        bad input that every process found and leaves on)."""
        if not self._left:
            self._left = True
            self._tell("bye")

    def wait_gone(self, timeout: float) -> bool:
        """Block until every connected peer's connection has closed, at most ``timeout`` s."""
        with self._state:
            return self._state.wait_for(lambda: self._closed >= set(self._socks), timeout)

    def _tell(self, word: str) -> None:
        with self._state:
            socks = [s for p, s in self._socks.items() if p not in self._closed]
        with self._send:
            for sock in socks:
                try:
                    sock.sendall((word + "\n").encode())
                except OSError:
                    pass

    def _at_exit(self) -> None:
        if getattr(sys, "last_value", None) is None:
            self.leave()  # a normal end
            return
        # an exception nobody caught ended the program (its traceback is out): stop the run
        # and leave now, without JAX's shutdown barrier, which would wait for the others
        if self.claim():
            self.stop_run(1)
            os._exit(1)

    # -- the relay to JAX's coordination service (processes 1..) ----------------------------
    def relay(self, host: str, port: int) -> str:
        """A local ``host:port`` whose connections are copied to and from ``host:port`` (the
        coordinator); pass it to ``jax.distributed.initialize`` in place of the coordinator."""
        server = socket.create_server(("127.0.0.1", 0))
        _thread(self._relay_accept, server, host, port)
        return f"127.0.0.1:{server.getsockname()[1]}"

    def _relay_accept(self, server: socket.socket, host: str, port: int) -> None:
        while True:
            try:
                down, _ = server.accept()
            except OSError:  # pragma: no cover
                return
            try:
                up = socket.create_connection((host, port), timeout=10.0)
                up.settimeout(None)
            except OSError:
                down.close()
                continue
            _nodelay(down)
            _nodelay(up)
            link = {"client_closed": False, "done": 0, "lock": threading.Lock()}
            _thread(self._pump, down, up, link, False)
            _thread(self._pump, up, down, link, True)

    def _pump(self, src: socket.socket, dst: socket.socket, link: dict, from_service: bool) -> None:
        """Copy ``src`` to ``dst`` until one of them ends; then, unless JAX's client ended it,
        ask :meth:`_service_closed` before the client may see anything."""
        service_ended = from_service  # which end stopped the copy: src, unless a write to dst fails
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            try:
                dst.sendall(data)
            except OSError:
                service_ended = not from_service
                break
        if not service_ended:
            link["client_closed"] = True
        elif not link["client_closed"]:
            self._service_closed()
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with link["lock"]:
            link["done"] += 1
            last = link["done"] == 2
        if last:
            src.close()
            dst.close()

    def _service_closed(self) -> None:
        """The service's end of a JAX connection closed: pass it on if process 0 said "bye" (or,
        with no word within :data:`HOLD` s, as it would be without the relay); never when process
        0 died or the run is stopping, since the watch is ending this process."""
        with self._state:
            if 0 not in self._socks:
                return  # no watch yet
            self._state.wait_for(lambda: 0 in self._said or 0 in self._closed or self.ending.is_set(),
                                 HOLD)
            word = self._said.get(0)
        if word == "bye" and not self.ending.is_set():
            return
        if word == "stop" or 0 in self._closed or self.ending.is_set():
            _forever()
