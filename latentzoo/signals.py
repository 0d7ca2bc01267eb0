"""Signals while a command runs: SIGINT and SIGTERM become :class:`Interrupted`, which unwinds like
Ctrl-C so that staging folders are removed on the way out; a watchdog ends the process with one
sentence where the handler cannot run (inside a compilation) or its exception was lost (inside a
callback whose exceptions Python only prints); what an interrupted run leaves behind (frames,
progress bars) is cleared before the command's sentence. Used by :mod:`latentzoo.cli`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
import typing

__all__ = ["Interrupted", "SignalGuard", "interrupt_on_signals", "release_interrupted_frames",
           "interrupt_in", "close_progress_bars"]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: unwinds like Ctrl-C, so staging folders are removed on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class SignalGuard(typing.NamedTuple):
    """What :func:`interrupt_on_signals` hands a command.

    ``check()`` raises :class:`Interrupted` for a signal whose exception was lost: Python's
    handler raised it inside a callback whose exceptions are only printed ("Exception ignored in
    _xla_gc_callback", seen with CVQ's VB after SIGINT), and the fit then ran to its end. A command
    calls it before it writes. ``disarm()`` is called once the files are in place: from then on
    either signal ends the process at once with the system's default action (the files are
    complete, and an exception raised during the interpreter's shutdown would only print
    "Exception ignored"). ``pending()`` returns the :class:`Interrupted` of a signal that arrived
    (None if none did): an error raised after it is the signal's doing, even where library code
    turned the handler's exception into an error of its own without a cause to follow (jaxlib's
    compiled-function cache reports an exception from a key's ``__eq__`` as a new error carrying
    only its text: seen on Python 3.13 with jax 0.12).
    """

    check: typing.Callable[[], None]
    disarm: typing.Callable[[], None]
    pending: typing.Callable[[], "Interrupted | None"] = lambda: None


@contextlib.contextmanager
def interrupt_on_signals():
    """Turn SIGTERM (and SIGINT) into :class:`Interrupted` while a command runs (main thread);
    yields a :class:`SignalGuard`."""
    if threading.current_thread() is not threading.main_thread():
        yield SignalGuard(lambda: None, lambda: None)
        return

    done = threading.Event()
    received: list[int] = []

    def handler(signum, frame):
        received.append(signum)
        raise Interrupted(signum)

    def pending():
        return Interrupted(received[0]) if received else None

    def check():
        stop = pending()
        if stop is not None:
            raise stop

    def disarm():
        received.clear()  # the files are complete: a lost signal from here on changes nothing
        for s in previous:
            signal.signal(s, signal.SIG_DFL)

    # A watchdog for the stretches where the handler cannot run: a compilation that does not
    # return to Python (NumPyro's NUTS under jax 0.12 did not for over a minute). The C-level
    # handler writes each signal's number to a pipe; if the command has not unwound 4 s later
    # (the handler did not run, or JAX swallowed its exception inside a compilation: seen on
    # Python 3.13), the watchdog says so in the same sentence and ends the process (the
    # checkpoint stays).
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watchdog():
        while True:
            try:
                data = os.read(read_fd, 1)
            except OSError:
                return
            if not data:
                return
            if data[0] not in (signal.SIGINT, signal.SIGTERM):
                continue
            if done.wait(4.0):  # the command unwound (the handler's exception was not lost)
                return
            name = signal.Signals(data[0]).name
            # on a line of its own: a progress bar may have left the cursor at the end of its line
            print(f"\nlatentzoo: interrupted ({name}) while XLA was compiling or running; nothing "
                  "was written", file=sys.stderr, flush=True)
            os._exit(128 + data[0])

    threading.Thread(target=watchdog, daemon=True).start()
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield SignalGuard(check, disarm, pending)
        check()  # a command that ran to its end over a lost signal still reports it
    finally:
        done.set()
        for s, h in previous.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(old_fd)
        os.close(write_fd)
        os.close(read_fd)


def release_interrupted_frames(err: BaseException) -> None:
    """Free the frames an interrupt unwound through, with their destructors' errors silenced.

    A signal can arrive inside a constructor (a progress bar half-built: tqdm's ``__del__`` then
    raises ``AttributeError``), and the object is freed only when the traceback is: after the
    CLI's sentence, which would then be followed by an "Exception ignored in ..." traceback. The
    traceback chain is dropped and collected here, before the sentence, and any destructor error
    raised meanwhile is not the user's concern.
    """
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        seen = set()
        while err is not None and id(err) not in seen:
            seen.add(id(err))
            err.__traceback__ = None
            err = err.__cause__ or err.__context__
        gc.collect()
    finally:
        sys.unraisablehook = hook


def interrupt_in(err):
    """The KeyboardInterrupt in ``err``'s chain of causes and contexts, or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def close_progress_bars() -> None:
    """End the progress bars an interrupted run left open (tqdm's, NumPyro's and the CAVI
    driver's), so that the sentence after them starts a line of its own: a bar redraws with a
    carriage return and no newline, and the sentence used to land at the end of the bar's line."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover (a dependency of NumPyro)
        return
    for bar in list(getattr(tqdm, "_instances", ())):
        with contextlib.suppress(Exception):
            bar.close()
