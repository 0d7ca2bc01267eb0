"""Ctrl-C during a long library call raises ``KeyboardInterrupt``, even when the first one is lost.

Python runs the SIGINT handler (``signal.default_int_handler``, which raises
``KeyboardInterrupt``) in the main thread, between bytecodes, wherever the interpreter happens to
be. JAX registers a garbage-collector callback (``jax._src.lib._xla_gc_callback``) and Python
*prints and drops* any exception raised inside a ``gc`` callback ("Exception ignored in:
<function _xla_gc_callback ...> KeyboardInterrupt"). A sampler's progress loop allocates many
small arrays, so the collector runs often, and a Ctrl-C that lands in that callback is lost: the
fit runs on as if nothing had been pressed (measured: with the collector made to run often, three
of three interrupts of ``RankFactorSVC.fit`` were lost; in the test suite, under load, one in a
few).

:func:`keyboard_interrupts_kept` guards a call. While it is active, SIGINT is recorded as well as
raised; if the guarded block has not unwound half a second after a recorded SIGINT, the interrupt
is raised again in the main thread (``PyThreadState_SetAsyncExc``), and again every half second until
the block unwinds. Inside a compiled XLA call Python cannot run at all; the exception then comes
when the call returns (for a progress-bar loop, after the current sweep). The guard changes
nothing where the SIGINT handler is not Python's default one (the user's own handler is left
alone) or outside the main thread, and it restores the handler on the way out, cancelling a
re-raise that has not been delivered yet. An error that ends the block after a recorded SIGINT is
raised as ``KeyboardInterrupt`` (the error as its cause): library code can turn the interrupt
into an error of its own, as jaxlib's compiled-function cache does (jax 0.12). Guards nest (the
inner one does nothing).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import signal
import threading
from collections.abc import Iterator

__all__ = ["keyboard_interrupts_kept", "interruptible"]

RESEND_AFTER_S = 0.5  # how long a raised KeyboardInterrupt may take to unwind the guarded block

_active = threading.local()


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in the thread ``thread_id`` at its next bytecode (``None`` cancels)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exc) if exc else None)


@contextlib.contextmanager
def keyboard_interrupts_kept() -> Iterator[None]:
    """Run a block so that a Ctrl-C raises ``KeyboardInterrupt`` out of it (module docstring)."""
    main = threading.main_thread()
    if (threading.current_thread() is not main or getattr(_active, "on", False)
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    pressed = threading.Event()
    done = threading.Event()
    lock = threading.Lock()  # a re-raise and the block's end never interleave

    def handler(signum, frame):
        pressed.set()
        raise KeyboardInterrupt

    def resend():
        pressed.wait()
        while not done.wait(RESEND_AFTER_S):
            with lock:
                if done.is_set():
                    return
                _set_async_exc(main.ident, KeyboardInterrupt)

    _active.on = True
    previous = signal.signal(signal.SIGINT, handler)
    watcher = threading.Thread(target=resend, name="latentzoo-interrupt", daemon=True)
    watcher.start()
    try:
        yield
    except Exception as err:
        if pressed.is_set():
            # Ctrl-C was pressed and library code turned its KeyboardInterrupt into an error of
            # its own (jaxlib's compiled-function cache reports an exception raised in a key's
            # __eq__ as a new ValueError carrying only its text): still the interrupt
            raise KeyboardInterrupt from err
        raise
    finally:
        with lock:
            done.set()
            _set_async_exc(main.ident, None)  # a re-raise not yet delivered is cancelled
        pressed.set()  # lets the watcher see `done` and end
        signal.signal(signal.SIGINT, previous)
        _active.on = False


def interruptible(method):
    """Decorator: run ``method`` under :func:`keyboard_interrupts_kept` (estimators' ``fit``)."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with keyboard_interrupts_kept():
            return method(*args, **kwargs)

    return wrapper
