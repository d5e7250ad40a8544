"""The ``distilserve`` command (argument parsing; the work is in models/ and server/)."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import sys
from collections.abc import Callable
from pathlib import Path

from distilserve.models import families
from distilserve.models.io import CheckpointError
from distilserve.models.tasks import POOLINGS, TASKS
from distilserve.training import DEFAULT_STEPS as OBJECTIVES  # the families distillation knows

WORKER_READY_S = 120  # how long a new worker of --workers N may take to load (see serve_workers)

DESCRIPTION = """Serves compact, distilled text encoders (BERT, DistilBERT, TinyBERT, MiniLM,
MobileBERT, MiniALBERT, F-ALBERT, CMOW): embeddings (OpenAI-compatible too),
classification and NER over HTTP, on the CPU or a GPU.

  distilserve serve                      the embedded default on http://127.0.0.1:8000
  distilserve new bert --preset minilm-l6 --output ckpt/minilm
  distilserve export ckpt/minilm --output repo/minilm --format onnx
  distilserve serve --model-repository repo

'distilserve COMMAND --help' describes each command."""


@contextlib.contextmanager
def status(label: str):
    """A live status line on stderr; yields a progress(step) function that also logs."""
    from rich.console import Console

    console = Console(stderr=True)
    with console.status(label) as line:
        def progress(step: str) -> None:
            line.update(step)
            console.log(step)

        yield progress


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``low`` (argparse's one-line error
    otherwise)."""
    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is less than {low}")
        return value
    return whole


def positive(text: str) -> float:
    """An argparse type: a finite number over 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number over 0")
    return value


class Refused(Exception):
    """What a command was given and cannot run: main() prints ``distilserve COMMAND:
    message``, one line, and exits 2."""

    @classmethod
    def invalid(cls, error) -> Refused:
        """A setting that does not validate (pydantic's ValidationError): its first error."""
        first = error.errors()[0]
        where = f"{first['loc'][0]}: " if first["loc"] else ""
        said = first["ctx"]["error"] if first["type"] == "value_error" else first["msg"]
        return cls(f"{where}{said}")  # (a validator's own words, without "Value error, ")


def cmd_new(args: argparse.Namespace) -> int:
    if args.list:  # (without torch: the families' files are read, not imported)
        for name, family in families.REGISTRY.items():
            print(f"{name}: {', '.join(family.preset_names)}")
        return 0
    from distilserve.models.io import checkpoint

    if not args.family or not args.output:
        raise Refused("FAMILY and --output are required (or --list)")
    labels = [x.strip() for x in args.labels.split(",")] if args.labels is not None else None
    ckpt = checkpoint.new(args.family, args.preset, args.task, labels, seed=args.seed)
    out = checkpoint.save(ckpt, args.output)
    print(f"wrote {args.family}/{args.preset} ({args.task}, "
          f"{ckpt.num_parameters() / 1e6:.2f}M parameters) to {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from distilserve.models import export

    with status("exporting") as progress:
        try:
            manifest = export.export(args.checkpoint, args.output, args.format, args.loop,
                                     args.quantize, args.task, args.max_length, progress,
                                     force=args.force, relevant_label=args.relevant_label,
                                     pooling=args.pooling,
                                     token_embeddings=args.token_embeddings,
                                     aliases=args.alias)
        except export.ExportError as e:
            print(f"distilserve export: {e}", file=sys.stderr)
            return 1
    parity = manifest.parity
    print(f"max abs diff vs PyTorch: {parity['max_abs_diff']:.3g}, "
          f"{parity['max_scaled_diff']:.3g} of the output's scale "
          f"(tolerance {parity['tolerance']}, shapes {parity['shapes']})")
    if manifest.quantization:
        q = manifest.quantization
        figures = {k: v for k, v in q.items() if isinstance(v, float)}
        print("int8 vs fp32: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items())
              + f" ({len(q['kept_fp32'])} MatMuls kept in fp32)")
    pooled = (f", {manifest.pooling} pooling" if manifest.pooling else "") + (
        " of its token embeddings" if manifest.token_embeddings else "") + (
        f", prompts {', '.join(manifest.prompts)}" if manifest.prompts else "")
    print(f"wrote {args.output} ({manifest.family} {manifest.task}{pooled}, max_length "
          f"{manifest.max_length}, backend {manifest.backend}, artifact {manifest.artifact})")
    return 0


def _loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or localhost): reachable from this machine
    only."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from pydantic import ValidationError

    from distilserve.server import logs
    from distilserve.server.app import create_app
    from distilserve.server.connections import Config, Server
    from distilserve.server.settings import Settings

    overrides = {k: v for k, v in (("model_repository", args.model_repository),
                                   ("host", args.host), ("port", args.port),
                                   ("device", args.device), ("dtype", args.dtype),
                                   ("workers", args.workers), ("grpc_port", args.grpc_port))
                 if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as e:
        raise Refused.invalid(e) from None
    if settings.device.startswith("cuda"):
        from distilserve.models.runtime.base import BackendError
        from distilserve.models.runtime.torch_device import resolve_device

        try:
            resolve_device(settings.device)
        except BackendError as e:
            raise Refused(f"every model: {e}") from None
    if settings.grpc_port is not None:
        require("--grpc-port")
    if settings.otlp_endpoint:
        require("DISTILSERVE_OTLP_ENDPOINT")
    if settings.token_ids != "model":
        require("DISTILSERVE_TOKEN_IDS")
    repository = settings.model_repository
    if repository is not None and not repository.is_dir():
        raise Refused(f"model repository {repository} is not a folder")
    if repository is not None:
        check_names(repository, settings)
    port = settings.port
    try:  # the ports first: a port in use is a one-line error before anything loads
        sock = listening_socket(settings.host, port)
        if settings.grpc_port is not None:  # bound again by the app (each worker's)
            port = settings.grpc_port
            listening_socket(settings.host, port).close()
    except OSError as e:
        raise Refused(f"cannot listen on {settings.host}:{port}: {e.strerror or e}") from None
    log_config = logs.configure(settings.log_format)
    say = logging.getLogger("distilserve").info
    if repository is None:
        from distilserve.server import embedded_default

        say("serving the embedded default%s", "" if embedded_default.is_built(settings.cache_dir)
            else "; it is built on this first start (a few minutes; /ready says how far along)")
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    say("listening on http://%s:%d%s", host, settings.port, "" if settings.grpc_port is None
        else f", gRPC on {host}:{settings.grpc_port}")
    if not settings.bearer_key() and not _loopback(settings.host):
        logging.getLogger("distilserve").warning(
            "no DISTILSERVE_API_KEY: every route (inference, /metrics, model loading) is "
            "open to whoever reaches %s; set a key, or put the service behind a proxy that "
            "authenticates", host)
    # the app builds the embedded default (no repository) and loads the models in the
    # background, with the port open: /health answers at once, /ready when they are loaded
    common = dict(settings=settings, host=settings.host, port=settings.port, log_level="info",
                  access_log=settings.access_log, timeout_graceful_shutdown=30,
                  log_config=log_config)
    if settings.workers == 1:
        Server(Config(create_app(settings, repository), **common)).run(sockets=[sock])
        leave_an_abandoned_build()
        return 0
    return serve_workers(settings, overrides, sock, common)


def leave_an_abandoned_build() -> None:
    """Exits at once where the embedded default's build was stopped mid-step: its thread
    (distilserve.server.engine.on_daemon_thread) may be inside PyTorch, which the interpreter's
    finalisation would abort ("terminate called without an active exception"); the exit's
    clean-up (the half-built folder removed: distilserve.server.embedded_default) runs first."""
    import atexit
    import logging
    import os
    import threading

    from distilserve.server.engine import DAEMON_THREAD

    if any(t.name == DAEMON_THREAD and t.is_alive() for t in threading.enumerate()):
        logging.shutdown()
        atexit._run_exitfuncs()
        os._exit(0)


def check_names(repository, settings) -> None:
    """Refuses a repository where one name would be two models' (a folder's and an alias,
    or an alias of two), or DISTILSERVE_MODEL_ALIASES names no folder; a folder whose
    manifest cannot be read is left to its load, which says why."""
    from distilserve.models.io.manifest import FILE, Manifest, ManifestError
    from distilserve.server.app import aliases, model_folders

    claimed = {}
    for folder in model_folders(repository):
        try:
            claimed[folder.name] = Manifest.read(folder).aliases if (folder / FILE).is_file() \
                else []
        except ManifestError:
            claimed[folder.name] = []
    if wrong := aliases(settings.aliases(), claimed)[1]:
        raise Refused("; ".join(wrong))


def serve_workers(settings, overrides: dict, sock, common: dict) -> int:
    """N worker processes on one port (uvicorn's supervisor: it restarts a worker that
    dies and, on SIGTERM, drains every worker). Each worker builds its app from the
    DISTILSERVE_* variables set here; their metrics meet in one folder."""
    import os
    import shutil
    import tempfile

    from distilserve.server.connections import Config, Workers

    for key, value in overrides.items():
        os.environ[f"DISTILSERVE_{key.upper()}"] = str(value)
    metrics = tempfile.mkdtemp(prefix="distilserve-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics
    try:
        # a new worker loads its models before it is ready (distilserve.server.app.app_from_environment):
        # SIGHUP's restart waits this long for each (uvicorn's 5 s, which a worker loading
        # on a busy machine overran, aborted it); a hung worker is found as late
        config = Config("distilserve.server.app:app_from_environment", factory=True,
                        workers=settings.workers, timeout_worker_healthcheck=WORKER_READY_S,
                        **common)
        Workers(config, sockets=[sock]).run()
    finally:
        shutil.rmtree(metrics, ignore_errors=True)
    return 0


# what each optional feature needs: (the extra that installs it, the modules it imports)
EXTRAS = {"--grpc-port": ("grpc", ("grpc_health", "grpc_reflection", "grpc_tools",
                                   "tritonclient.grpc")),
          "distilserve ray": ("ray", ("ray.serve",)),
          "DISTILSERVE_OTLP_ENDPOINT": ("otlp", ("opentelemetry.sdk.trace",
                                                 "opentelemetry.exporter.otlp.proto.http")),
          "DISTILSERVE_TOKEN_IDS": ("token-ids", ("bpe_openai",))}


def require(feature: str) -> None:
    """A one-line refusal of ``feature`` (one of EXTRAS) where its extra is not
    installed."""
    import importlib

    extra, modules = EXTRAS[feature]
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise Refused(f"{feature} needs the {extra} extra (pip install -c constraints.txt "
                          f"'distilserve[{extra}]'): {e}") from None


def cmd_ray(args: argparse.Namespace) -> int:
    import logging
    import os
    import signal
    import threading

    from pydantic import ValidationError

    from distilserve.server import logs
    from distilserve.server.settings import Settings

    require("distilserve ray")
    try:
        settings = Settings(**{k: v for k, v in (("model_repository", args.model_repository),
                                                 ("host", args.host), ("port", args.port),
                                                 ("grpc_port", args.grpc_port))
                               if v is not None})
        from distilserve.server.ray_serve import Scaling

        scaling = Scaling(**{k: v for k, v in vars(args).items()
                             if k in Scaling.model_fields and v is not None})
    except ValidationError as e:
        raise Refused.invalid(e) from None
    if settings.grpc_port is not None:
        require("--grpc-port")
    logging.basicConfig(level=logging.INFO, format=logs.TEXT)
    repository = settings.model_repository
    if repository is None:  # the embedded default, built here first (on the first run)
        from distilserve.server.embedded_default import ensure_default_repository

        with status("building the embedded default") as progress:
            repository = ensure_default_repository(settings.cache_dir, progress)
    if not repository.is_dir():
        raise Refused(f"model repository {repository} is not a folder")
    import ray
    from ray import serve

    from distilserve.server.ray_serve import GRPC_SERVICERS, application, init_local

    local = not (args.address or os.environ.get("RAY_ADDRESS"))
    if local:  # its ports here: one in use is a one-line error before Ray starts
        for port in filter(None, (settings.port, settings.grpc_port)):
            try:
                listening_socket(settings.host, port).close()
            except OSError as e:
                raise Refused(f"cannot listen on {settings.host}:{port}: "
                              f"{e.strerror or e}") from None
        init_local(grpc_host=settings.host)
    else:
        ray.init(address=args.address)
    grpc = {} if settings.grpc_port is None else {"grpc_options": {
        "port": settings.grpc_port, "grpc_servicer_functions": GRPC_SERVICERS}}
    serve.start(http_options={"host": settings.host, "port": settings.port}, **grpc)
    serve.run(application(repository, settings, scaling), name="distilserve",
              route_prefix="/")
    grpc_at = "" if not grpc else f" and grpc://{settings.host}:{settings.grpc_port}"
    print(f"distilserve on Ray Serve at http://{settings.host}:{settings.port}{grpc_at} (Ctrl-C or "
          "SIGTERM removes the application)", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1):
        pass
    print("removing the application", flush=True)
    serve.delete("distilserve")
    if local:  # a cluster's Serve keeps running for its other applications
        serve.shutdown()
    return 0


def listening_socket(host: str, port: int):
    """A bound socket on host:port (as uvicorn binds: SO_REUSEADDR, IPv6 for a ':' host)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def cmd_bench(args: argparse.Namespace) -> int:
    from distilserve.bench import harness
    from distilserve.models.runtime.base import BackendError, check_device
    from distilserve.models.runtime.torch_device import resolve_device

    try:  # as the service's: cpu, cuda, cuda:N or auto (a GPU where one is visible)
        device = resolve_device(check_device(args.device))
    except BackendError as e:
        raise Refused(f"--device: {e}") from None
    args.device = "cpu" if device.type == "cpu" else args.device.replace("auto", "cuda")
    if args.cuda_graphs and args.device == "cpu":
        raise Refused("--cuda-graphs needs a GPU (--device cuda)")
    if args.backends and (unknown := set(args.backends.split(",")) - set(harness.BACKENDS)):
        raise Refused(f"--backends: unknown {', '.join(sorted(unknown))} (of "
                      f"{','.join(harness.BACKENDS)})")
    if args.students and not args.students.is_dir():
        raise Refused(f"--students: {args.students} is not a folder")
    training = args.training  # its own defaults: the papers fine-tune shorter batches
    opts = harness.Options(output=args.output,
                           batch_size=args.batch_size or (32 if training else 256),
                           length=args.length or (128 if training else 64),
                           batches=args.batches, repeats=args.repeats, threads=args.threads,
                           device=args.device, dtype=args.dtype, cuda_graphs=args.cuda_graphs,
                           depths=args.depths, training=training)
    if args.device != "cpu" or args.dtype != "fp32":  # ONNX Runtime: fp32 on the CPU only
        opts.backends = ("torch", "torchscript")
    if args.quick:
        opts.rows = list(harness.QUICK_ROWS)
        opts.training_rows = list(harness.QUICK_TRAINING_ROWS)
        opts.backends = ("onnx",) if args.device == "cpu" else ("torch",)
        opts.batch_size, opts.length, opts.repeats, opts.latency_runs = 8, 16, 2, 5
    if args.backends:
        opts.backends = tuple(args.backends.split(","))
    if args.students:
        opts.rows += harness.student_rows(args.students)
    if args.models:
        wanted = {m.strip() for m in args.models.split(",")}
        rows = opts.training_rows if training else opts.rows
        if unknown := wanted - {n for r in rows for n in (r.name, r.preset)}:
            raise Refused(f"--models: no model or preset {', '.join(sorted(unknown))} (of "
                          f"{', '.join(r.name for r in rows)})")
        chosen = [r for r in rows if r.name in wanted or r.preset in wanted]
        if training:
            opts.training_rows = chosen
        else:
            opts.rows = chosen
    with status("bench") as progress:
        results = harness.measure_all(opts, progress)
    failed = [r["key"] for r in results if "error" in r]
    print(f"{len(results)} measurements in {opts.output} (REPORT.md, results.json, charts)"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def cmd_distill(args: argparse.Namespace) -> int:
    from distilserve.models import export
    from distilserve.models.runtime.cores import limit_torch_threads
    from distilserve.server.settings import Settings
    from distilserve.training import distill

    limit_torch_threads()  # in a container: its CPU limit, not the node's cores

    if args.any_depth and args.family not in ("minialbert", "falbert"):
        raise Refused(f"--any-depth is for the recursive families (minialbert, falbert), "
                      f"not {args.family}")
    opts = distill.Options(family=args.family, output=args.output, preset=args.preset,
                           steps=args.steps, seed=args.seed, batch_size=args.batch_size,
                           lr=args.lr, teacher=args.teacher, cache_dir=Settings().cache_dir,
                           any_depth=args.any_depth)
    with status("distilling") as progress:
        try:
            record = distill.distill(opts, progress)
        except ValueError as e:  # a preset that cannot learn from this teacher
            raise Refused(str(e)) from None
        fid = record["fidelity"]
        print(f"{args.family} student ({record['parameters'] / 1e6:.1f}M parameters) in "
              f"{args.output}: Spearman {fid['spearman']:.3f}, top-10 overlap "
              f"{fid['top10_overlap']:.3f} on {fid['sentences']} held-out sentences")
        if "fidelity_by_depth" in record:
            print("Spearman by depth: " + ", ".join(
                f"{depth} {f['spearman']:.3f}" for depth, f in record["fidelity_by_depth"].items()))
        if args.add_to_default:
            from distilserve.server.embedded_default import ensure_default_repository

            target = ensure_default_repository(Settings().cache_dir) / args.family
            # CMOW's matrix products grow with length (norm ~1e3 at 60 tokens, ~1e16 at
            # 250, then they swamp the embedding): served at the length it was trained on
            length = opts.max_length if args.family == "cmow" else 256
            export.export(args.output, target, "onnx", max_length=length, progress=progress,
                          force=True)
            print(f"added to the default repository as {args.family!r}: {target}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="distilserve", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    tasks = list(TASKS)

    new = sub.add_parser("new", help="write a checkpoint of a family with fresh weights",
                         description="Writes a checkpoint (config.json, model.safetensors, "
                         "tokenizer files) of a model family at a size preset, with fresh "
                         "weights.")
    new.add_argument("family", nargs="?", choices=families.FAMILIES, help="model family")
    new.add_argument("--output", "-o", help="folder to write the checkpoint to")
    new.add_argument("--preset", default="tiny",
                     help="size preset, one of the family's (see --list; default tiny)")
    new.add_argument("--task", default="embed", choices=tasks,
                     help="task head: sentence embedding, sequence or token classification, "
                     "extractive question answering or fill-mask (qa, fill-mask: the "
                     "transformers families)")
    new.add_argument("--labels", help="comma-separated labels for classify and ner")
    new.add_argument("--seed", type=int, default=0, help="seed of the fresh weights")
    new.add_argument("--list", action="store_true", help="print families and presets")
    new.set_defaults(func=cmd_new)

    exp = sub.add_parser("export", help="export a checkpoint into a servable model folder",
                         description="Exports a checkpoint into a model folder (manifest, "
                         "checkpoint, artifact), checks the artifact against PyTorch at "
                         "unseen shapes and fp16/bf16 against fp32, and refuses to write "
                         "anything servable when the check fails.")
    exp.add_argument("checkpoint", help="checkpoint folder (config.json and weights)")
    exp.add_argument("--output", "-o", required=True,
                     help="the model folder to write, REPO/NAME (served as NAME)")
    exp.add_argument("--format", default="onnx", choices=["onnx", "torchscript", "torch"],
                     help="artifact: ONNX Runtime, TorchScript, or the PyTorch checkpoint "
                     "itself (default onnx)")
    exp.add_argument("--loop", default="unroll", choices=["unroll", "keep"],
                     help="MiniALBERT and F-ALBERT: write the iterations out, or keep one "
                     "layer in a loop (default unroll)")
    exp.add_argument("--quantize", choices=["int8"],
                     help="ONNX only: also write a dynamically quantised int8 model and "
                     "serve it")
    exp.add_argument("--task", choices=tasks,
                     help="serve the checkpoint for this task (default: the one its config "
                     "names; a ...ForMaskedLM is an embedding model unless fill-mask)")
    exp.add_argument("--max-length", type=int,
                     help="longest input in tokens (default: the length a "
                     "sentence-transformers model was trained for, else the model's maximum)")
    exp.add_argument("--pooling", choices=[*POOLINGS, "splade"],
                     help="an embedding model's pooling of its tokens (default: what its "
                     "sentence-transformers files say, else mean); splade: a masked-language "
                     "model's SPLADE embedding, also served sparse at /embed_sparse")
    exp.add_argument("--token-embeddings", action="store_true",
                     help="an embedding model: the artifact gives every token's vector, "
                     "served by TEI's /embed_all, and the service pools them for the other "
                     "embedding routes")
    exp.add_argument("--relevant-label",
                     help="a classification model used as a cross-encoder by /v1/rerank: "
                     "the label whose probability is relevance (default: the second of two)")
    exp.add_argument("--alias", action="append", metavar="NAME",
                     help="a name the model answers to besides its folder's, e.g. an OpenAI "
                     "model name its clients send (repeat for more)")
    exp.add_argument("--force", action="store_true",
                     help="replace an existing model folder (once the new one is complete)")
    exp.set_defaults(func=cmd_export)

    serve = sub.add_parser("serve", help="serve a model repository over HTTP",
                           description="Serves every model folder of a repository over "
                           "HTTP. Every flag has a DISTILSERVE_* environment twin; "
                           "distilserve/server/settings.py lists the others (limits, batching, API key).")
    serve.add_argument("--model-repository", type=Path,
                       help="folder of model folders (DISTILSERVE_MODEL_REPOSITORY); "
                       "default: the embedded default, built on first run")
    serve.add_argument("--host", help="DISTILSERVE_HOST (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="DISTILSERVE_PORT (default 8000)")
    serve.add_argument("--workers", type=int,
                       help="DISTILSERVE_WORKERS: processes serving the port, each with its "
                       "own copy of every model (default 1)")
    serve.add_argument("--grpc-port", type=int,
                       help="DISTILSERVE_GRPC_PORT: also serve gRPC on this port, not "
                       "--port's: the Open Inference Protocol (tritonclient.grpc, KServe), "
                       "Text Embeddings Inference's tei.v1, health checks and reflection; "
                       "default: none")
    serve.add_argument("--device", help="DISTILSERVE_DEVICE: cpu, cuda, cuda:N or auto "
                       "(default: a GPU when one is visible)")
    serve.add_argument("--dtype", help="DISTILSERVE_DTYPE: auto, fp32, fp16 or bf16 "
                       "(default auto: fp16 or bf16 on a GPU, bf16 on a CPU with bf16 "
                       "matrix units, fp32 otherwise)")
    serve.set_defaults(func=cmd_serve)

    ray = sub.add_parser("ray", help="serve a model repository on Ray Serve",
                         description="Deploys a model repository as a Ray Serve application "
                         "(one deployment per model, the same HTTP API) on a new local Ray "
                         "instance or on a cluster (--address), and removes it on Ctrl-C or "
                         "SIGTERM. Other settings: DISTILSERVE_* variables.")
    ray.add_argument("--model-repository", type=Path,
                     help="folder of model folders, readable by every Ray node (default: "
                     "the embedded default, built here on first run)")
    ray.add_argument("--address", help="Ray cluster to join (auto, HOST:PORT or "
                     "ray://HOST:10001; default RAY_ADDRESS, or a new local instance)")
    ray.add_argument("--host", help="Ray Serve's HTTP host, DISTILSERVE_HOST (default "
                     "127.0.0.1)")
    ray.add_argument("--port", type=int, help="Ray Serve's HTTP port, DISTILSERVE_PORT "
                     "(default 8000)")
    ray.add_argument("--grpc-port", type=int,
                     help="DISTILSERVE_GRPC_PORT: Ray Serve's gRPC port, serving the Open "
                     "Inference Protocol, Text Embeddings Inference's tei.v1 and health "
                     "checks as `distilserve serve --grpc-port` does; default: none")
    ray.add_argument("--replicas", type=int, help="replicas per model (default 1)")
    ray.add_argument("--min-replicas", type=int, help="autoscale each model from this many "
                     "replicas (with --max-replicas)")
    ray.add_argument("--max-replicas", type=int, help="autoscale up to this many replicas")
    ray.add_argument("--target-ongoing", type=float, help="autoscaling target: requests "
                     "ongoing (queued or running) per replica (default 64)")
    ray.add_argument("--max-ongoing", type=int, help="requests a replica takes at once, "
                     "sharing its batches (default 256)")
    ray.add_argument("--replica-cpus", type=float, help="CPUs per replica (default 1)")
    ray.add_argument("--replica-gpus", type=float, help="GPUs per replica (default 0)")
    ray.set_defaults(func=cmd_ray)

    dist = sub.add_parser("distill", help="distil the teacher into a student of a family",
                          description="Distils all-MiniLM-L6-v2 (or --teacher) into a "
                          "student with the family's paper objective, on sentences from "
                          "installed docstrings; saves and resumes every 200 steps.")
    dist.add_argument("family", choices=list(OBJECTIVES),
                      help="the student's family")
    dist.add_argument("--output", "-o", type=Path, required=True,
                      help="folder for the student checkpoint (resumed if it holds one)")
    dist.add_argument("--preset", help="student size (default: one that aligns with MiniLM)")
    dist.add_argument("--steps", type=at_least(1),
                      help="training steps (default: the family's, "
                      + ", ".join(f"{f} {n}" for f, n in OBJECTIVES.items()) + ")")
    dist.add_argument("--seed", type=int, default=0, help="seed of data order and weights")
    dist.add_argument("--batch-size", type=at_least(1), default=32,
                      help="sentences per step")
    dist.add_argument("--lr", type=positive, default=3e-4, help="peak learning rate")
    dist.add_argument("--teacher", type=Path, help="a local checkpoint (default: MiniLM)")
    dist.add_argument("--any-depth", action="store_true",
                      help="minialbert, falbert: train every depth, 1 to the student's, to "
                      "give embeddings (the output loss at every iteration's exit), for "
                      "requests that choose fewer iterations")
    dist.add_argument("--add-to-default", action="store_true",
                      help="export the student into the default repository as FAMILY")
    dist.set_defaults(func=cmd_distill)

    bench = sub.add_parser("bench", help="throughput, latency and memory of every family",
                           description="Measures every paper-size model x backend x loop "
                           "form, each in its own process, and writes results.json, "
                           "REPORT.md and charts; resumes where it stopped.")
    bench.add_argument("--output", type=Path, default=Path("bench-results"),
                       help="folder for results, report and charts (default bench-results; "
                       "the committed report is bench/)")
    bench.add_argument("--quick", action="store_true",
                       help="tiny presets, one backend, seconds: checks the harness")
    bench.add_argument("--batch-size", type=at_least(1),
                       help="sentences per batch (default 256; --training 32)")
    bench.add_argument("--length", type=at_least(1),
                       help="tokens per sentence (default 64; --training 128)")
    bench.add_argument("--batches", type=at_least(1), default=1, help="batches per timed run")
    bench.add_argument("--repeats", type=at_least(1), default=3,
                       help="timed runs (median reported)")
    bench.add_argument("--threads", type=at_least(0), default=0,
                       help="intra-op threads (0: all cores)")
    bench.add_argument("--device", default="cpu",
                       help="cpu, or cuda[:N]: the torch and torchscript backends on a "
                       "GPU (auto: a GPU where one is visible)")
    bench.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16"],
                       help="compute dtype (fp16 and bf16: the torch and TorchScript "
                       "backends; bf16 on the CPU where it has bf16 matrix units)")
    bench.add_argument("--cuda-graphs", action="store_true",
                       help="on a GPU, run each timed shape from a CUDA graph (one launch "
                       "per batch, as DISTILSERVE_CUDA_GRAPH_TOKENS serves small batches)")
    bench.add_argument("--backends", help="comma-separated: torch,torchscript,onnx,onnx-int8")
    bench.add_argument("--models", help="comma-separated model names or presets")
    bench.add_argument("--students", type=Path,
                       help="also measure the distilled students in this folder")
    bench.add_argument("--training", action="store_true",
                       help="fine-tuning steps instead (forward, a classification head's "
                       "loss, backward, AdamW): the ALBERTs by reuses, and the speed table's "
                       "rows, with sentences/s and memory told apart (parameters, "
                       "activations, the step's peak)")
    bench.add_argument("--depths", action="store_true",
                       help="also measure the recursive models at every depth a request may "
                       "choose (iterations 1 to theirs): the loop kept (onnx, torchscript) "
                       "and the checkpoint (torch), with a student's fidelity at each")
    bench.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except Refused as e:
        print(f"distilserve {args.command}: {e}", file=sys.stderr)
        return 2
    except CheckpointError as e:
        print(f"distilserve {args.command}: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a file or folder named that cannot be read or written
        where = f"{e.filename}: " if e.filename else ""
        print(f"distilserve {args.command}: {where}{e.strerror or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
