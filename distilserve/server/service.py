"""The service, whatever the transport: its settings, metrics and engines, and its model
repository, built (the embedded default), loaded, kept in step with its folders
(DISTILSERVE_POLL_SECONDS) and loaded or unloaded by request (Triton's explicit model
control). The app (distilserve/server/app.py) owns one for its lifespan."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from distilserve.models.io.manifest import FILE as MANIFEST
from distilserve.server.core.refusals import Refusal
from distilserve.server.engine import Engine, ModelLoadError, folder_version, on_daemon_thread, open_engine
from distilserve.server.metrics import Metrics
from distilserve.server.settings import Settings

log = logging.getLogger("distilserve")


@dataclass
class Service:
    """Everything the routes need, owned by the app's lifespan."""

    settings: Settings
    metrics: Metrics
    engines: dict[str, Engine] = field(default_factory=dict)
    # the thread the PyTorch models run on when on the CPU, in turn (distilserve/server/engine.py)
    cpu_thread: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="torch-cpu"))
    failures: dict[str, str] = field(default_factory=dict)  # why, as clients read it: said
    # each model folder's version when it was loaded (or failed): folder_version
    versions: dict[str, str] = field(default_factory=dict)
    ready: bool = False
    draining: bool = False
    status: str = "starting"  # what is being built or loaded, for /ready
    repository: Path | None = None  # the one served, once known (the default once built)
    # changes to what is served, one at a time: loads and unloads by request
    # (DISTILSERVE_MODEL_CONTROL=explicit) and the repository read again (polls, SIGHUP)
    controlling: asyncio.Lock = field(default_factory=asyncio.Lock)
    # a front end's loads and unloads by request, ``await elsewhere(op, name)``: carried out
    # by the engine process its models run in (None: here)
    elsewhere: Callable[[str, str], Awaitable[None]] | None = None
    # called once what is served may have changed (a model loaded, replaced or unloaded, a
    # folder failed) by polling or by request: the engine process tells its front ends
    on_change: Callable[[], None] | None = None

    # the repository read again on SIGHUP (reread_soon), while under way
    rereading: set[asyncio.Task] = field(default_factory=set)

    def not_served(self, name: str, error: Exception) -> None:
        """The model folder ``name`` logged and listed as failed, for the reason ``error``
        gives."""
        why = failure(error)
        log.error("model %s not served: %s", name, why)
        self.failures[name] = self.said(why)

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def reread_soon(self, why: str) -> None:
        """The repository read again (reread), as ``why`` (SIGHUP) asks: unless models are
        loaded by request, or it is not read yet."""
        if not self.ready or self.repository is None or \
                self.settings.model_control == "explicit":
            log.warning("%s: the model repository is not read again (%s)", why,
                        "models are loaded by request" if self.ready else self.status)
            return
        log.info("%s: reading the model repository %s again", why, self.repository)
        task = asyncio.create_task(reread(self, self.repository))
        self.rereading.add(task)
        task.add_done_callback(self.rereading.discard)

    def unloaded(self) -> list[str]:
        """The repository's model folders neither served nor failed: added since the
        repository was read, or unloaded by request."""
        if self.repository is None or not self.repository.is_dir():
            return []
        return [folder.name for folder in model_folders(self.repository)
                if folder.name not in self.engines and folder.name not in self.failures]

    def nothing_to_serve(self) -> str | None:
        """Why a repository that has been read serves no model (None where it serves one,
        or where models are loaded by request): for /ready's 503 and the start's log."""
        if self.engines or self.settings.model_control == "explicit":
            return None
        why = "no model folder in the model repository" if not self.failures else (
            "no model in the model repository loaded (failed: "
            + ", ".join(sorted(self.failures)) + ")")
        if self.repository is not None and (self.repository / MANIFEST).is_file():
            why += ("; the repository is itself a model folder (it has a manifest.json): "
                    "serve the folder that holds it, a folder per model")
        return why

    def _controlled(self, name: str) -> Path:
        """The folder of the model ``name`` of the repository, to load or unload by
        request: refused unless DISTILSERVE_MODEL_CONTROL is explicit, unavailable while
        the repository is read, not found for a name that is not one of its folders
        (nothing outside it is ever read)."""
        if self.settings.model_control != "explicit":
            raise Refusal("bad_request", "loading and unloading models by request needs "
                          "DISTILSERVE_MODEL_CONTROL=explicit (the service serves its "
                          "repository as it is, or as DISTILSERVE_POLL_SECONDS finds it)")
        if self.draining or not self.ready:
            raise Refusal("unavailable", "the service is shutting down" if self.draining
                          else "the model repository is still being read; retry shortly",
                          retry_after=2)
        folders = {folder.name: folder for folder in model_folders(self.repository)}
        if name not in folders:
            raise Refusal("not_found", f"no model folder {name!r} in the repository; "
                          f"folders: {', '.join(folders) or 'none'}")
        return folders[name]

    async def load(self, name: str) -> None:
        """Triton's explicit model control: the repository's folder ``name`` loaded and
        served, in place of the one served before (which finishes what was queued for it).
        One that fails to load is refused with the reason, listed UNAVAILABLE unless the
        one before is still served."""
        folder = self._controlled(name)
        if self.elsewhere is not None:
            await self.elsewhere("load", name)
            return
        async with self.controlling:
            try:
                engine = await _open(self, folder)
            except Exception as e:
                log.error("model %s not loaded by request: %s", name, failure(e))
                if name not in self.engines:
                    self.failures[name] = self.said(failure(e))
                    self.changed()
                raise Refusal("bad_request", f"model {name!r} failed to load: "
                              f"{self.said(failure(e))}") from None
            await put_in_place(self, engine)
            self.changed()
            freeze_long_lived(thaw=True)

    def names(self) -> tuple[dict[str, str], list[str]]:
        """(alias -> the served model it names, what is wrong with the names: aliases), of
        the models served now."""
        return aliases(self.settings.aliases(), {name: engine.manifest.aliases
                                                 for name, engine in self.engines.items()})

    def aliases(self) -> dict[str, str]:
        return self.names()[0]

    def said(self, why: str) -> str:
        """``why`` as clients may read it: without the repository's path (the model's
        folder named within it, as the log does not)."""
        if self.repository is None:
            return why
        for root in {str(self.repository), str(self.repository.resolve())}:
            why = why.replace(root + os.sep, "")
        return why

    async def unload(self, name: str) -> None:
        """Triton's explicit model control: the model ``name`` no longer served (what was
        queued for it answered first); one not served is not found."""
        self._controlled(name)
        if self.elsewhere is not None:
            await self.elsewhere("unload", name)
            return
        async with self.controlling:
            gone = self.engines.pop(name, None)
            if gone is None:
                raise Refusal("not_found", f"model {name!r} is not served")
            log.info("model %s unloaded by request", name)
            self.changed()
            await gone.stop()
            freeze_long_lived(thaw=True)


class BuildCancelled(Exception):
    """Raised into the default's build (through its progress) when the service stops."""


async def build_and_load(service: Service, repository: Path | None) -> None:
    """Builds the embedded default when no repository is named, then loads it."""
    if repository is None:
        from distilserve.server.embedded_default import ensure_default_repository, is_built

        if not is_built(service.settings.cache_dir):  # said before the port opens
            service.status = "building the embedded default"  # the build then says where

        def hear(text: str) -> None:
            if service.draining:  # shutting down: stop building (the next start resumes)
                raise BuildCancelled("the service is shutting down")
            service.status = f"building the embedded default: {text}"

        try:
            repository = await on_daemon_thread(  # it trains two models
                ensure_default_repository, service.settings.cache_dir, hear)
        except BuildCancelled:
            return
        except Exception as e:
            service.status = f"building the embedded default failed: {type(e).__name__}: {e}"
            log.exception("building the embedded default failed: serving nothing, never ready")
            return
    await load_repository(service, repository)
    if service.settings.poll_seconds:  # a repository of the user's: kept in step
        await poll_repository(service, repository, service.settings.poll_seconds)


def aliases(setting: dict[str, str], claimed: dict[str, list[str]]
            ) -> tuple[dict[str, str], list[str]]:
    """(alias -> model, what is wrong): the names models answer to besides their own, from
    DISTILSERVE_MODEL_ALIASES (``setting``, alias -> model) and the models' manifests
    (``claimed``, model -> its aliases). A name that is a model's own, or that two models
    claim, names no model by alias, and is said to be wrong with the models claiming it;
    so is an alias in the setting for a model that is not there."""
    by_name: dict[str, set[str]] = {}
    for model, names in claimed.items():
        for name in names:
            by_name.setdefault(name, set()).add(model)
    wrong = [f"DISTILSERVE_MODEL_ALIASES: {alias!r} names {model!r}, which is not a model "
             f"folder of the repository" for alias, model in setting.items()
             if model not in claimed]
    for alias, model in setting.items():
        if model in claimed:
            by_name.setdefault(alias, set()).add(model)
    table = {}
    for name, models in sorted(by_name.items()):
        if name in claimed and models != {name}:
            wrong.append(f"the name {name!r} is the model {name!r} and an alias of "
                         f"{', '.join(sorted(models - {name}))}")
        elif len(models) > 1:
            wrong.append(f"the name {name!r} is an alias of {' and '.join(sorted(models))}")
        elif name not in claimed:
            table[name] = next(iter(models))
    return table, wrong


def model_folders(repository: Path) -> list[Path]:
    """The model folders of a repository, by name: hidden folders left out, and lost+found
    (a file system's own, at the root of a volume mounted as the repository)."""
    return sorted(p for p in repository.iterdir() if p.is_dir()
                  and not p.name.startswith(".") and p.name != "lost+found")


async def load_repository(service: Service, repository: Path) -> None:
    """Loads and warms every model folder here."""
    if not repository.is_dir():
        log.error("model repository %s is not a folder: serving nothing, never ready",
                  repository)
        return

    service.repository = repository
    folders = model_folders(repository)
    service.versions = {folder.name: folder_version(folder) for folder in folders}
    await load_models(service, folders, lambda folder: _open(service, folder))


def _open(service: Service, folder: Path):
    return open_engine(folder.name, folder, service.settings, service.metrics,
                       service.cpu_thread)


async def poll_repository(service: Service, repository: Path, every: float) -> None:
    """Triton's poll mode: every ``every`` seconds, the repository's folders as they are now
    are served (reread)."""
    while True:
        await asyncio.sleep(every)
        await reread(service, repository)


async def reread(service: Service, repository: Path) -> None:
    """The repository's folders as they are now served (sync_repository), and said where
    that changed what is served or failed (Service.on_change)."""
    async with service.controlling:  # (a poll beside a SIGHUP's: one after the other)
        served = list(service.engines.items()), dict(service.failures)
        try:
            changed = await sync_repository(service, repository)
        except Exception:  # e.g. the repository unmounted for a moment: try again later
            log.exception("reading the model repository %s again failed", repository)
            return
        if changed:  # the models unloaded can be freed, the ones loaded frozen with the rest
            freeze_long_lived(thaw=True)
        if (list(service.engines.items()), service.failures) != served:
            service.changed()


async def sync_repository(service: Service, repository: Path) -> bool:
    """Serves the repository's folders as they are now: a folder removed is unloaded (its
    queued inputs answered first); one added, or exported again, is loaded and then takes
    the place of the one before (which finishes what was queued for it). A folder that fails
    to load leaves the one before it served, if any, and is tried again once any of its
    files changes. True where a model was unloaded or replaced, or a new one loaded."""
    folders = {folder.name: folder for folder in model_folders(repository)}
    changed = False
    for name in sorted(set(service.versions) - set(folders)):
        del service.versions[name]
        service.failures.pop(name, None)
        if (gone := service.engines.pop(name, None)) is not None:
            log.info("model %s left the repository: unloaded", name)
            await gone.stop()
            changed = True
    for name, folder in folders.items():
        version = folder_version(folder)
        if name in service.versions and service.versions[name] == version:
            continue
        service.versions[name] = version
        try:
            engine = await _open(service, folder)
        except Exception as e:
            if name in service.engines:
                log.error("model %s not reloaded, the one loaded before still served: %s",
                          name, failure(e))
            else:
                service.not_served(name, e)
            continue
        await put_in_place(service, engine)
        changed = True
    return changed


async def put_in_place(service: Service, engine: Engine, via: str = "") -> None:
    """``engine`` served under its name, in place of the one served before, which
    finishes what was queued for it (a reload: by polling or by request); ``via``: as
    announce's."""
    before = service.engines.get(engine.name)
    service.engines[engine.name] = engine
    service.failures.pop(engine.name, None)
    announce(engine, "reloaded" if before else "serving", via)
    if before is not None:
        await before.stop()


def failure(error: Exception) -> str:
    """Why a model folder is not served, in a line."""
    return str(error) if isinstance(error, ModelLoadError) else f"{type(error).__name__}: {error}"


def freeze_long_lived(thaw: bool = False) -> None:
    """The libraries and models loaded so far are millions of long-lived objects: a full
    garbage collection walking them all stalls every request in flight; frozen, it skips
    them. ``thaw``: unfreeze first, so that models unloaded since can be collected (frozen,
    they never would be)."""
    if thaw:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


def announce(engine: Engine, how: str, via: str = "") -> None:
    """Logs that ``engine`` is served now (``how``: serving, reloaded); ``via``: where its
    model runs when not in this process (``through the engine process``), so that a log
    of several processes tells the one copy of a model from its front ends."""
    info = engine.describe()
    log.info("%s %s%s (%s, %s, %s on %s in %s: %s)", how, engine.name, via and f" {via}",
             engine.task, engine.family, info["backend"], info["device"], info["dtype"],
             info["dtype_reason"])


async def load_models(service: Service, folders: list[Path], open_folder, via: str = "") -> None:
    """Opens every folder's engine (``await open_folder(folder)``, loaded and warmed); a
    folder that fails is logged and left out. Then the service is ready. ``via``: as
    announce's."""
    for n, folder in enumerate(folders, 1):
        service.status = f"loading {folder.name} ({n} of {len(folders)})"
        try:
            engine = await open_folder(folder)
        except Exception as e:  # a broken folder, or a model that loads but cannot run
            service.not_served(folder.name, e)
            continue
        service.engines[folder.name] = engine
        announce(engine, "serving", via)
    if (nothing := service.nothing_to_serve()) is not None:
        log.error("serving nothing, not ready: %s (%s)", nothing, service.repository)
    for wrong in service.names()[1]:
        log.error("%s: that name answers for no model", wrong)
    freeze_long_lived()
    service.status = "ready"
    service.ready = True
