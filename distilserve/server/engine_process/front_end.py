"""A front end of the engine process (distilserve/server/engine_process/process.py): a
worker of ``distilserve serve --workers N`` that parses, validates and tokenises here and
runs its models' inputs there. ``EngineClient`` is its one connection to the engine,
shared by its models; each model's ``ProcessRunner`` sends a request's token ids and
builds its Result from the outputs that come back. While the engine process is gone (it
died, and the supervisor starts another) the front end is not ready and refuses requests
as unavailable, until the client has connected again and the engine has loaded. The
front end serves the models the engine serves: as they change there (the engine polls
the repository, loads or unloads a model by request, or a new engine process has read
the repository afresh), here too."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from distilserve.server.core.batching import InputFailed
from distilserve.server.core.refusals import Refusal
from distilserve.server.core.runner import INLINE, ModelUnavailable, Result, assemble, prepare
from distilserve.server.core.tokenisation import TurnTokenizer
from distilserve.server.engine import Engine, read_manifest
from distilserve.server.engine_process import wire
from distilserve.server.service import Service, freeze_long_lived, load_models, put_in_place

log = logging.getLogger("distilserve")

RECONNECT_S = 0.2  # between attempts to reach the engine process
VIA = "through the engine process"  # a front end's models, as its log names them


class Polling:
    """Keeps the running event loop polling its sockets, not sleeping on them, while
    ``waiting()`` and until ``window_s`` after the last ``start()``: a callback always
    ready (one call a turn of the loop) makes the loop poll without waiting, and a loop
    that is not asleep needs no waking, so what arrives meanwhile costs its sender less
    and is read sooner. A window of 0: the loop sleeps as it would."""

    def __init__(self, window_s: float, waiting: Callable[[], bool]):
        self.window_s, self.waiting, self.until, self.polling = window_s, waiting, 0.0, False

    def start(self) -> None:
        if not self.window_s:
            return
        self.until = time.perf_counter() + self.window_s
        if not self.polling:
            self.polling = True
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        if self.waiting() and time.perf_counter() < self.until:
            asyncio.get_running_loop().call_soon(self._turn)
        else:
            self.polling = False


class EngineClient:
    """The connection to the engine process at ``path``: requests sent as frames, each
    reply handed to the request of its id; while replies are awaited, the loop polls for
    ``polling.window_s`` after each request (none until the loader sets it)."""

    def __init__(self, path: str):
        self.path = path
        self.outbox: wire.Outbox | None = None
        self.waiting: dict[int, asyncio.Future] = {}
        self.ids = itertools.count()
        self.connected = asyncio.Event()
        self.lost = asyncio.Event()  # set when a connection ends (cleared by who waits on it)
        # set with lost, and when the engine says its models changed or a reply says a
        # model here is not the one served there
        self.look = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.polling = Polling(0.0, lambda: bool(self.waiting))

    def start(self) -> None:
        self.tasks.append(asyncio.create_task(self._run()))

    async def _run(self) -> None:
        """Connects, hands replies out until the engine process goes, fails what was
        waiting, and connects again."""
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.path)
            except OSError:  # not listening yet, or restarting
                await asyncio.sleep(RECONNECT_S)
                continue
            self.outbox = wire.Outbox(writer)
            self.connected.set()
            try:
                while True:
                    for header, arrays in await wire.read(reader):
                        if "news" in header:  # its models changed: a look at them
                            self.look.set()
                            continue
                        future = self.waiting.pop(header["id"], None)
                        if future is not None and not future.done():
                            future.set_result((header, arrays))
            except (asyncio.IncompleteReadError, ConnectionError):
                log.error("the engine process closed its connection: requests answered 503 "
                          "until it is back")
            except Exception:  # a frame that does not read: connect again, afresh
                log.exception("the engine process's connection failed: requests answered "
                              "503 until it is back")
            finally:
                self.connected.clear()
                self.lost.set()
                self.look.set()
                writer.close()
                gone, self.waiting = self.waiting, {}
                for future in gone.values():
                    if not future.done():
                        future.set_exception(ModelUnavailable("the engine process is gone"))

    async def call(self, header: dict, arrays: list = ()) -> tuple[dict, list[np.ndarray]]:
        """The engine's reply to one request (ModelUnavailable while it is not reachable)."""
        if not self.connected.is_set():
            raise ModelUnavailable("the engine process is not connected: starting or "
                                   "restarting")
        header["id"] = request = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.waiting[request] = future
        self.outbox.send(header, arrays)
        self.polling.start()
        try:
            return await future
        except asyncio.CancelledError:  # the client went away: its inputs leave the queue
            if self.waiting.pop(request, None) is not None and self.connected.is_set():
                self.outbox.send({"op": "cancel", "id": request})
            raise
        finally:
            self.waiting.pop(request, None)


class ProcessRunner:
    """A model's runner in the engine process: tokenises here, runs there."""

    def __init__(self, model: Engine, client: EngineClient, served: dict):
        self.model, self.client = model, client
        self.served = served  # the engine's entry of it (``models``' answer)
        self.version = served["version"]  # which version of the folder the engine serves
        self.described = served["described"]
        self.batch_limits = tuple(served["batch_limits"])  # the engine's, which batches
        self.depth, self.max_queue = served["depth"], served["max_queue"]
        self.tokenizer = TurnTokenizer(model.text, INLINE)  # the requests of a turn together

    def describe(self) -> dict:
        return self.described

    async def start(self, warmup: bool = True) -> None:
        pass  # the engine process warmed its models up

    async def stop(self) -> None:
        pass

    async def infer(self, texts: list, truncation: str | None,
                    windows: tuple[int, int] | None = None, iterations: int | None = None,
                    priority: int = 0) -> Result:
        """As LocalRunner.infer: the texts tokenised here, all of them, and run there."""
        inputs = await prepare(self.model, texts, truncation, windows, self.max_queue,
                               self.tokenizer.tokenize)
        encodings = inputs.encodings
        header, arrays = await self.client.call(
            {"op": "infer", "model": self.model.name, "version": self.version,
             "iterations": iterations, "priority": priority,
             "lengths": [len(e.ids) for e in encodings]}, wire.token_ids(encodings))
        if header.get("stale"):  # (a 503 to retry) removed, or another version, there
            self.client.look.set()
        try:  # (a QueueFull: counted by the engine, in the same metrics)
            wire.raise_failure(header)
        except InputFailed as e:  # a window: its input's
            if inputs.owners is None:
                raise
            raise type(e)(inputs.owners[e.index], *e.facts) from None
        raw = wire.unpack_outputs(arrays, header["pairs"])
        return assemble(self.model, inputs, raw, encodings, header["waited"],
                        header["running"], self.described["device"])


def loader(path: str):
    """The app's loader (create_app's ``loader``) of a front end of the engine process at
    ``path``: waits until the engine has loaded its models (the front end's /ready says
    what it is doing meanwhile), then serves each as an engine here with a
    ProcessRunner, and follows the engine's models as they change (Follower); while it
    awaits the engine's replies it polls (DISTILSERVE_ENGINE_POLL_US) where the engine runs
    its models on a device, not on the CPU, whose cores a polling front end would take
    from the model."""
    async def load(service: Service) -> None:
        client = EngineClient(path)
        client.start()  # (for the process's life)
        state = await engine_ready(client, service)
        if any(m["described"]["device"] != "cpu" for m in state["models"]):
            client.polling.window_s = service.settings.engine_poll_us / 1e6
        service.failures.update(state["failures"])
        if state["repository"] is not None:
            service.repository = Path(state["repository"])
        served = {m["name"]: m for m in state["models"]}
        follower = Follower(client, service)
        await load_models(service, [Path(m["folder"]) for m in state["models"]],
                          lambda folder: follower.open(served[folder.name]), VIA)
        service.elsewhere = follower.control
        client.lost.clear()
        client.look.clear()
        client.tasks.append(asyncio.create_task(follower.follow()))

    return load


async def engine_ready(client: EngineClient, service: Service) -> dict:
    """The engine's models once it has loaded them (``models``' answer); meanwhile the
    service's status says what the engine is doing."""
    while True:
        await client.connected.wait()
        try:
            state, _ = await client.call({"op": "models"})
        except ModelUnavailable:
            continue
        if state["ready"]:
            return state
        service.status = f"the engine process: {state['status']}"
        await asyncio.sleep(RECONNECT_S)


class Follower:
    """The front end's models kept the engine process's: not ready while the engine
    process is gone, and ready again, serving what the one that replaces it loaded, once
    it has; and as the engine's models change (it polls the repository, or loads and
    unloads by request), the same here, looked at when the engine says they changed, or
    that a model here is not its own (a request sent as it changed). A load or unload by
    request here is the engine's (``control``)."""

    def __init__(self, client: EngineClient, service: Service):
        self.client, self.service = client, service
        self.lock = asyncio.Lock()  # one look at a time

    async def open(self, served: dict) -> Engine:
        """The engine here of a model the engine process serves (an entry of ``models``'
        answer), its inputs run there. A folder changed since the engine process read it
        is said in the log: its tokenisation here is of the folder as it is now."""
        folder = Path(served["folder"])
        engine = await asyncio.to_thread(
            Engine, folder.name, folder, read_manifest(folder), self.service.settings,
            self.service.metrics, runner=lambda engine: ProcessRunner(
                engine, self.client, served))
        if engine.version != served["version"]:
            log.warning("model %s: its folder changed after the engine process read it; the "
                        "engine serves it as it was until it reads it again (a poll, SIGHUP "
                        "or a load by request)", engine.name)
        return engine

    async def follow(self) -> None:
        client, service = self.client, self.service
        while True:
            await client.look.wait()
            client.look.clear()
            if client.lost.is_set():
                client.lost.clear()
                service.ready, service.status = False, "the engine process is restarting"
                await self.in_step(await engine_ready(client, service))
                service.ready, service.status = True, "ready"
                continue
            with contextlib.suppress(ModelUnavailable):  # (gone: lost is set)
                await self.in_step()

    async def control(self, op: str, name: str) -> None:
        """Service.load or Service.unload (``op``) of the model ``name``, carried out by
        the engine process (its Refusal raised here); done once this front end serves
        what the engine serves after it."""
        try:
            header, _ = await self.client.call({"op": op, "model": name})
            try:
                wire.raise_failure(header)
            finally:  # (a load that failed is the engine's failure, said here too)
                await self.in_step()
        except ModelUnavailable as e:
            raise Refusal("unavailable", f"model {name!r}: the engine process that would "
                          f"{op} it is unavailable ({e}); retry shortly", retry_after=2) from None

    async def in_step(self, state: dict | None = None) -> None:
        """Serves here what the engine process serves (``models``' answer, asked for
        where not given): a model it no longer serves dropped; one it serves newly, or in
        another version or way (another entry), opened here and put in the place of the
        one before; one as before kept (a folder loaded again unchanged, or the same
        repository read by an engine process started again). Its failures are the front
        end's; a model that fails to open here is not served, and is opened again at the
        next look."""
        async with self.lock:
            if state is None:
                state, _ = await self.client.call({"op": "models"})
                if not state["ready"]:
                    return
            service = self.service
            served = {m["name"]: m for m in state["models"]}
            service.failures, changed = dict(state["failures"]), False
            for name in sorted(set(service.engines) - set(served)):
                del service.engines[name]
                log.info("model %s no longer served by the engine process", name)
                changed = True
            for name, model in served.items():
                before = service.engines.get(name)
                if before is not None and before.runner.served == model:
                    continue
                try:
                    engine = await self.open(model)
                except Exception as e:
                    service.engines.pop(name, None)  # (the engine would refuse its requests)
                    service.not_served(name, e)
                    continue
                await put_in_place(service, engine, VIA)
                changed = True
            if changed:
                freeze_long_lived(thaw=True)
