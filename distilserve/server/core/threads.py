"""Threads for work off the model's thread: loading, training, a GPU's warm-up, and work
a stopping service abandons."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor


async def on_own_thread(fn, *args):
    """``fn(*args)`` on a new thread, which ends with it (asyncio.to_thread's threads stay).

    For PyTorch work off the thread the models run on (loading, training, the GPU
    warm-up): its CPU thread pool (OpenMP) keeps a team of threads for every thread that
    has run a parallel operation, for as long as that thread lives, and once the teams hold
    more threads than there are cores, idle ones sleep at once rather than wait for the
    next operation, so that every small operation of a forward pass waits for them to wake."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="load")
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
    finally:
        pool.shutdown(wait=False)  # its thread ends once fn returns


DAEMON_THREAD = "abandonable"  # on_daemon_thread's threads' name


async def on_daemon_thread(fn, *args):
    """``fn(*args)`` on a new thread, as ``on_own_thread``, that the process does not wait
    for at exit: work that a stopping service abandons (the embedded default's build, which
    stops itself at its next step, while an export in between runs for seconds)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def run():
        try:
            outcome = (done.set_result, fn(*args))
        except BaseException as e:
            outcome = (done.set_exception, e)

        def settle():
            if not done.done():  # (cancelled: the service stopped waiting)
                outcome[0](outcome[1])

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody waits for it any more
            pass

    threading.Thread(target=run, daemon=True, name=DAEMON_THREAD).start()
    return await done


def leave_an_abandoned_build() -> None:
    """Exits at once where the embedded default's build was stopped mid-step: its thread
    (``on_daemon_thread``) may be inside PyTorch, which the interpreter's finalisation
    would abort ("terminate called without an active exception"); the exit's clean-up (the
    half-built folder removed: distilserve.server.embedded_default) runs first."""
    import atexit
    import logging
    import os

    if any(t.name == DAEMON_THREAD and t.is_alive() for t in threading.enumerate()):
        logging.shutdown()
        atexit._run_exitfuncs()
        os._exit(0)
