import json
import socket
import stat
import sys
from pathlib import Path

import pytest
import torch

from distilserve.models import families
from distilserve.models.io import checkpoint
from distilserve.server.cli import main
from tests.conftest import unallocated_port


def test_new_list_prints_every_family_and_preset(capsys):
    assert main(["new", "--list"]) == 0
    out = capsys.readouterr().out
    for family in families.FAMILIES:
        assert family in out
    for preset in ["bert-base", "tinybert-4l", "minilm-l6", "mobilebert", "distilbert",
                   "minialbert-128", "minialbert-312", "minialbert-768",
                   "minialbert-768-noadapter", "albert-base", "lr-albert", "falbert",
                   "albert-large", "lr-albert-large", "falbert-large",
                   "cmow-hybrid-bidi", "tiny"]:
        assert preset in out


def test_new_writes_a_loadable_checkpoint(tmp_path, capsys):
    assert main(["new", "falbert", "--output", str(tmp_path), "--task", "ner",
                 "--labels", "O,B-PER,I-PER"]) == 0
    ckpt = checkpoint.load(tmp_path)
    assert (ckpt.family, ckpt.task, ckpt.labels) == ("falbert", "ner", ["O", "B-PER", "I-PER"])
    for name in ["config.json", "model.safetensors", "tokenizer.json", "vocab.txt"]:
        assert (tmp_path / name).exists()


def test_new_writes_into_the_folder_it_is_given_in_place(tmp_path, monkeypatch, capsys):
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert main(["new", "cmow", "--output", "."]) == 0
    inode = (tmp_path / "here").stat().st_ino
    assert main(["new", "bert", "--output", ".", "--force"]) == 0
    assert checkpoint.load(tmp_path / "here").family == "bert"
    assert (tmp_path / "here").stat().st_ino == inode  # the same folder: the shell's stays
    assert [p.name for p in tmp_path.iterdir()] == ["here"]


def test_new_replaces_a_folder_that_holds_files_only_with_force(tmp_path, capsys):
    out = tmp_path / "ck"
    assert main(["new", "bert", "--output", str(out), "--task", "classify",
                 "--labels", "no,yes"]) == 0
    (out / "kept.txt").write_text("the user's")
    assert main(["new", "cmow", "--output", str(out)]) == 2
    assert f"distilserve new: {out} already holds files" in capsys.readouterr().err
    assert checkpoint.load(out).family == "bert" and (out / "kept.txt").exists()

    assert main(["new", "cmow", "--output", str(out), "--force"]) == 0
    assert checkpoint.load(out).family == "cmow" and not (out / "kept.txt").exists()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("no checkpoint")
    assert main(["new", "cmow", "--output", str(tmp_path / "notes"), "--force"]) == 2
    assert "holds files but no checkpoint (config.json)" in capsys.readouterr().err
    assert (tmp_path / "notes" / "todo.txt").exists()
    folder = stat.S_IMODE(out.stat().st_mode)  # safetensors' own 0600 not kept
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == folder & 0o666


def test_new_with_an_unknown_preset_fails_clearly(tmp_path, capsys):
    assert main(["new", "cmow", "--preset", "huge", "--output", str(tmp_path)]) == 1
    assert "unknown preset 'huge'" in capsys.readouterr().err


@pytest.mark.parametrize("task,labels,words", [
    ("classify", "good,bad,good", "distinct"),
    ("ner", "O,,B-PER", "distinct"),
    ("embed", "a,b", "not embed"),
])
def test_new_refuses_labels_it_could_not_serve(tmp_path, capsys, task, labels, words):
    out = tmp_path / "m"
    assert main(["new", "bert", "--output", str(out), "--task", task, "--labels", labels]) == 1
    assert words in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is visible")
def test_serve_on_cuda_without_a_gpu_is_one_line_before_anything_loads(tmp_path, capsys):
    assert main(["serve", "--model-repository", str(tmp_path), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no GPU is visible" in err


def test_serve_refuses_an_unknown_device_in_one_line(tmp_path, capsys):
    assert main(["serve", "--model-repository", str(tmp_path), "--device", "tpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown device 'tpu'" in err


@pytest.mark.parametrize("command", ["serve", "ray"])
def test_a_cache_that_cannot_hold_the_default_is_refused_in_one_line(command, tmp_path,
                                                                      capsys, monkeypatch):
    (tmp_path / "a-file").touch()
    monkeypatch.setenv("DISTILSERVE_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    assert main([command]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"distilserve {command}: cannot build the embedded default in "
                   f"{tmp_path / 'a-file' / 'cache'} (DISTILSERVE_CACHE_DIR): Not a directory")


def test_export_int8_prints_the_agreement_figures(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "repo" / "m"
    assert main(["export", tiny_checkpoints["bert", "embed"], "--output", str(out),
                 "--quantize", "int8"]) == 0
    printed = capsys.readouterr().out
    assert "int8 vs fp32: " in printed and "min_cosine" in printed
    assert "(bert embed, mean pooling, max_length 128, backend onnx" in printed
    assert (out / "model.int8.onnx").exists()


def test_every_flag_of_every_command_has_help(capsys):
    import argparse

    from distilserve.server.cli import parser

    p = parser()
    assert "argument parsing" not in p.description.lower()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        assert command.description, name
        for action in command._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"{name} {action.option_strings or action.dest}"


def test_an_output_that_cannot_be_written_is_a_one_line_error(tiny_checkpoints, tmp_path,
                                                             capsys):
    (tmp_path / "file").write_text("")  # a file, where a folder would be made
    out = tmp_path / "file" / "m"
    assert main(["new", "bert", "--output", str(out)]) == 1
    assert main(["export", tiny_checkpoints["cmow", "embed"], "--output", str(out / "x")]) == 1
    err = [line for line in capsys.readouterr().err.splitlines()  # less export's progress
           if line.startswith("distilserve")]
    assert [line.split(":")[0] for line in err] == ["distilserve new", "distilserve export"]
    assert all(str(tmp_path / "file") in line for line in err)


@pytest.mark.parametrize("length", ["0", "-3"])
def test_export_refuses_a_max_length_under_one(tiny_checkpoints, tmp_path, capsys, length):
    assert main(["export", tiny_checkpoints["cmow", "embed"], "--output", str(tmp_path / "m"),
                 "--max-length", length]) == 1
    assert f"--max-length must be a number of tokens, at least 1, not {length}" in (
        capsys.readouterr().err)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("family", ["bert", "cmow"])
def test_export_refuses_a_max_length_past_the_models_positions(tiny_checkpoints, tmp_path,
                                                               capsys, family):
    """The tiny presets' position embeddings cover 128 tokens: 129 is refused, not cut."""
    source, out = tiny_checkpoints[family, "embed"], tmp_path / "m"
    assert main(["export", source, "--output", str(out), "--max-length", "129"]) == 1
    assert ("--max-length 129 is more than the model takes: its position embeddings cover "
            "128 tokens (max_position_embeddings)") in capsys.readouterr().err
    assert not out.exists()
    assert main(["export", source, "--output", str(out), "--max-length", "128"]) == 0
    assert json.loads((out / "manifest.json").read_text())["max_length"] == 128


@pytest.mark.parametrize("task,least", [("embed", 3), ("classify", 5)])
def test_export_refuses_a_max_length_that_leaves_no_text(tiny_checkpoints, tmp_path, capsys,
                                                         task, least):
    """[CLS] and [SEP] around a text, three tokens around a pair (classify, qa), and a token
    of each text: under that, a folder at 1 was written and not served (its warm-up's input
    'too long'), one at 2 served every text as [CLS] [SEP]."""
    source, out = tiny_checkpoints["bert", task], tmp_path / "m"
    assert main(["export", source, "--output", str(out), "--max-length", str(least - 1)]) == 1
    assert (f"--max-length {least - 1} leaves no token of text beside the special tokens "
            f"around each input (task {task}): at least {least}") in capsys.readouterr().err
    assert not out.exists()
    assert main(["export", source, "--output", str(out), "--max-length", str(least)]) == 0


def test_export_onto_an_existing_model_folder_needs_force(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "repo" / "m"
    source = tiny_checkpoints["cmow", "embed"]
    assert main(["export", source, "--output", str(out)]) == 0
    before = (out / "manifest.json").read_text()
    assert main(["export", source, "--output", str(out), "--format", "torch"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert (out / "manifest.json").read_text() == before  # untouched
    assert main(["export", source, "--output", str(out), "--format", "torch", "--force"]) == 0
    assert '"backend": "torch"' in (out / "manifest.json").read_text()
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]  # nothing left beside it


@pytest.fixture
def ray_repository(exports, tiny_checkpoints, tmp_path) -> Path:
    """A repository of one model (its folder beside one without a manifest)."""
    exports(tiny_checkpoints["bert", "embed"], tmp_path / "repo" / "embed", "onnx", check=False)
    (tmp_path / "repo" / "notes").mkdir()
    return tmp_path / "repo"


@pytest.fixture
def no_ray(monkeypatch):
    """Ray's calls that ``distilserve ray`` makes, each a failure here; the list returned
    is for a test to record in the calls it lets through."""
    ray = pytest.importorskip("ray")
    serve = pytest.importorskip("ray.serve")

    from distilserve.server import ray_serve

    calls = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for module, name in ((ray_serve, "init_local"), (ray, "init"), (ray, "cluster_resources"),
                         (ray, "shutdown"), (serve, "start"), (serve, "run"),
                         (serve, "shutdown"), (serve, "delete")):
        monkeypatch.setattr(module, name, lambda *_, name=name, **__: pytest.fail(name))
    return calls


def test_ray_refuses_half_an_autoscaling_range_before_starting_ray(capsys, tmp_path):
    assert main(["ray", "--model-repository", str(tmp_path), "--min-replicas", "1"]) == 2
    assert "autoscaling needs both min_replicas and max_replicas" in capsys.readouterr().err
    assert main(["ray", "--model-repository", str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_ray_refuses_a_repository_of_no_model_before_starting_ray(no_ray, capsys, tmp_path):
    (tmp_path / "notes").mkdir()  # a folder, but no model's
    assert main(["ray", "--model-repository", str(tmp_path)]) == 2
    assert f"distilserve ray: model repository {tmp_path} holds no model folders" in (
        capsys.readouterr().err)


def test_ray_refuses_replicas_a_local_instance_cannot_place(no_ray, ray_repository, capsys,
                                                           monkeypatch):
    import ray

    from distilserve.server import ray_serve

    monkeypatch.setattr(ray_serve, "init_local", lambda **_: no_ray.append("init"))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "shutdown", lambda: no_ray.append("shutdown"))
    assert main(["ray", "--model-repository", str(ray_repository), "--replicas", "3",
                 "--port", str(unallocated_port())]) == 2
    assert capsys.readouterr().err.strip().endswith(  # (after the log's line on notes/)
        "distilserve ray: the replicas reserve 3 CPUs (1 model, 3 replicas each, 1 CPU a "
        "replica) and Ray has 2, so one would wait for them forever: --replica-cpus 0.66 "
        "fits them, or fewer replicas")
    assert no_ray == ["init", "shutdown"]  # and Serve never started


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_ray_refuses_a_cluster_address_that_takes_no_connection(scheme, no_ray, ray_repository,
                                                                capsys, monkeypatch):
    address = f"{scheme}127.0.0.1:{unallocated_port()}"  # nothing listens there
    monkeypatch.setenv("RAY_ADDRESS", address)
    assert main(["ray", "--model-repository", str(ray_repository)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"distilserve ray: no Ray cluster at {address}: Connection refused")


def test_ray_says_why_a_model_did_not_deploy_and_removes_the_instance(
        no_ray, ray_repository, capsys, monkeypatch):
    import ray
    from ray import serve

    from distilserve.server import ray_serve

    monkeypatch.setattr(ray_serve, "init_local", lambda **_: no_ray.append("init"))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    monkeypatch.setattr(serve, "start", lambda **_: no_ray.append("start"))
    monkeypatch.setattr(serve, "shutdown", lambda: no_ray.append("serve.shutdown"))

    def run(app, **_):
        raise RuntimeError("Deploying application distilserve failed: Failed to update the "
                           "deployments ['embed'].")

    monkeypatch.setattr(serve, "run", run)
    monkeypatch.setattr(serve, "status", lambda: FakeServeStatus({"distilserve": FAILED_APP}))
    assert main(["ray", "--model-repository", str(ray_repository),
                 "--port", str(unallocated_port())]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "distilserve ray: not deployed: model embed: InvalidProtobuf: [ONNXRuntimeError] : 7 "
        ": INVALID_PROTOBUF : Load model from repo/embed/model.onnx failed:Protobuf parsing "
        "failed.")
    assert no_ray == ["init", "start", "serve.shutdown"]


class FakeServeStatus:
    def __init__(self, applications):
        self.applications = applications


class FakeStatus:
    def __init__(self, status, message="", deployments=None):
        self.status, self.message, self.deployments = status, message, deployments or {}


FAILED_APP = FakeStatus("DEPLOY_FAILED", "Failed to update the deployments ['embed'].", {
    "ingress": FakeStatus("HEALTHY"),
    # as Ray Serve writes it: the replica's traceback, its last line the error
    "embed": FakeStatus("DEPLOY_FAILED", (
        "The deployment failed to start 3 times in a row. This may be due to a problem with "
        "its constructor or initial health check failing. See controller logs for details. "
        "Error:\n  File \"onnxruntime_inference_collection.py\", line 778, in "
        "_create_inference_session\n    sess = C.InferenceSession(...)\n"
        "onnxruntime.capi.onnxruntime_pybind11_state.InvalidProtobuf: [ONNXRuntimeError] : 7 "
        ": INVALID_PROTOBUF : Load model from repo/embed/model.onnx failed:Protobuf parsing "
        "failed.\n"))})


def test_deploy_failures_name_each_model_and_its_error():
    from distilserve.server.ray_serve import deploy_failures

    assert deploy_failures(FAILED_APP) == [
        "model embed: InvalidProtobuf: [ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model "
        "from repo/embed/model.onnx failed:Protobuf parsing failed."]
    plain = FakeStatus("DEPLOY_FAILED", "", {"m": FakeStatus("DEPLOY_FAILED", "went away")})
    assert deploy_failures(plain) == ["model m: went away"]
    assert deploy_failures(FakeStatus("DEPLOY_FAILED", "the graph failed")) == ["the graph failed"]


@pytest.mark.parametrize("flag", ["--port", "--grpc-port"])
def test_ray_refuses_a_port_in_use_before_starting_ray(flag, capsys, ray_repository, no_ray):
    tmp_path = ray_repository
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        ports = {"--port": unallocated_port(), "--grpc-port": unallocated_port(), flag: port}
        assert main(["ray", "--model-repository", str(tmp_path),
                     *(str(a) for item in ports.items() for a in item)]) == 2
    assert f"distilserve ray: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.parametrize("args,words", [
    (["--device", "tpu"], "--device: unknown device 'tpu' (cpu, cuda, cuda:N or auto)"),
    (["--backends", "onnx,foo"], "--backends: unknown foo (of torch,torchscript,onnx,onnx-int8)"),
    (["--models", "bert tiny,gpt"], "--models: no model or preset gpt (of bert tiny, "),
    (["--students", "nowhere"], "--students: nowhere is not a folder"),
    (["--dtype", "bf16", "--backends", "torch,onnx,onnx-int8"], "--backends onnx,onnx-int8: "
     "ONNX Runtime runs fp32 on the CPU, not bf16 on cpu (the torch and torchscript "
     "backends do)"),
])
def test_bench_refuses_what_it_cannot_measure_before_measuring(args, words, capsys, tmp_path):
    assert main(["bench", "--quick", "--output", str(tmp_path / "out"), *args]) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command,args,words", [
    ("bench", ["--batch-size", "0"], "argument --batch-size: 0 is less than 1"),
    ("bench", ["--threads", "-1"], "argument --threads: -1 is less than 0"),
    ("bench", ["--repeats", "x"], "argument --repeats: 'x' is not a whole number"),
    ("distill", ["bert", "--steps", "0"], "argument --steps: 0 is less than 1"),
    ("distill", ["bert", "--lr", "nan"], "argument --lr: nan is not a finite number over 0"),
    ("distill", ["bert", "--sentences", "999"], "argument --sentences: 999 is less than 1000"),
])
def test_numbers_out_of_range_are_argparses_one_line_error(command, args, words, capsys,
                                                           tmp_path):
    with pytest.raises(SystemExit) as exited:
        main([command, "--output", str(tmp_path / "out"), *args])
    assert exited.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.parametrize("command", ["serve", "ray"])
@pytest.mark.parametrize("port", ["0", "65536"])
def test_a_port_out_of_range_is_a_one_line_error(command, port, capsys, tmp_path,
                                                  monkeypatch):
    from distilserve.server import ray_serve

    monkeypatch.setattr(ray_serve, "init_local", lambda **_: pytest.fail("Ray started"))
    assert main([command, "--model-repository", str(tmp_path), "--port", port]) == 2
    assert capsys.readouterr().err.startswith(f"distilserve {command}: port: Input should be")


@pytest.mark.parametrize("variable,value,words", [
    # inf: the model's thread would fail to sleep and the service never become ready;
    # 1e12: it would sleep for 31 years
    ("MAX_WAIT_MS", "inf", "max_wait_ms: Input should be less than or equal to 60000"),
    ("MAX_WAIT_MS", "1e12", "max_wait_ms: Input should be less than or equal to 60000"),
    # a secret not filled in: the service would run without a key
    ("API_KEY", "", "api_key: set but empty: unset DISTILSERVE_API_KEY"),
    ("API_KEY", " \n", "api_key: set but empty"),
    # every batch of spans would fail to send, each logged
    ("OTLP_ENDPOINT", "otel:4318", "otlp_endpoint: 'otel:4318' is not an http"),
    # an ONNX Runtime session would start that many threads: minutes to load a model
    ("THREADS", "100000", "threads: Input should be less than or equal to 1024"),
    # the repository would be read without a pause: a core busy
    ("POLL_SECONDS", "1e-6", "poll_seconds: 1e-06 s: 0 (never) or at least 0.1"),
    # Kubernetes' link to a Service named distilserve, set in its namespace's pods
    ("PORT", "tcp://10.0.0.11:80", "port: 'tcp://10.0.0.11:80' is the address Kubernetes "
     "gives a Service's pods, not a port"),
    # both binds would go through: the service would start and answer no HTTP request
    ("GRPC_PORT", "8000", "grpc_port 8000 is the HTTP port too: gRPC needs a port of its own"),
])
def test_settings_past_what_could_work_are_refused_in_one_line(variable, value, words,
                                                                monkeypatch):
    """(the settings themselves: serve and ray print Refused's line and exit 2, as for
    the ports above)"""
    from pydantic import ValidationError

    from distilserve.server.cli import Refused
    from distilserve.server.settings import Settings

    monkeypatch.setenv(f"DISTILSERVE_{variable}", value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    line = str(Refused.invalid(refused.value))
    assert line.startswith(words) and "\n" not in line


def test_a_variable_that_is_no_setting_is_named_with_the_closest_one():
    from distilserve.server.settings import unknown_variables

    assert unknown_variables({"DISTILSERVE_APIKEY": "k", "distilserve_port": "1",
                              "DISTILSERVE_MAX_BATCH": "8", "DISTILSERVE_LOAD_NER": "x",
                              "DISTILSERVE_DEVICE": "cpu", "HOME": "/root",
                              # Kubernetes' links to Services named distilserve(-gpu)
                              "DISTILSERVE_SERVICE_HOST": "10.0.0.1",
                              "DISTILSERVE_SERVICE_PORT_GRPC": "8001",
                              "DISTILSERVE_PORT_80_TCP_ADDR": "10.0.0.1",
                              "DISTILSERVE_GPU_PORT": "tcp://10.0.0.2:80"}) == [
        "DISTILSERVE_APIKEY is not a setting: ignored (did you mean DISTILSERVE_API_KEY?)",
        "DISTILSERVE_LOAD_NER is not a setting: ignored",
        "DISTILSERVE_MAX_BATCH is not a setting: ignored (did you mean "
        "DISTILSERVE_MAX_BATCH_SIZE?)"]


@pytest.mark.parametrize("engine, workers, device, shared", [
    ("auto", 1, "auto", False), ("auto", 4, "cpu", False),
    ("auto", 4, "auto", torch.cuda.is_available()),  # a GPU: shared
    ("shared", 1, "cpu", True), ("shared", 4, "auto", True), ("per-worker", 4, "auto", False)])
def test_where_the_models_run_with_several_workers(engine, workers, device, shared):
    from distilserve.models.runtime.cores import available_cores
    from distilserve.server.cli.serve import engine_shared
    from distilserve.server.settings import Settings

    settings = Settings(engine=engine, workers=workers, device=device)
    assert engine_shared(settings) is shared
    # the engine process runs every model: all the cores (else a worker's share of them)
    resolved = Settings(engine="shared" if shared else "per-worker", workers=workers)
    assert resolved.model_threads() == max(1, available_cores() // (1 if shared else workers))


def test_whitespace_around_an_api_key_is_not_part_of_it():
    """(a key read from a file ends in a newline, which no Authorization header holds)"""
    from distilserve.server.settings import Settings

    assert Settings(api_key="sekret\n").api_key.get_secret_value() == "sekret"


@pytest.mark.parametrize("command", ["serve", "ray"])
def test_a_grpc_port_without_the_grpc_extra_is_refused_before_anything_starts(
        command, capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc_tools", None)  # not installed: imports fail
    assert main([command, "--model-repository", str(tmp_path), "--grpc-port", "9000"]) == 2
    assert f"distilserve {command}: --grpc-port needs the grpc extra" in capsys.readouterr().err


def test_a_student_that_cannot_learn_from_the_teacher_is_one_line(capsys, tmp_path,
                                                                    monkeypatch):
    from distilserve.training import distill

    def refuse(opts, progress):
        raise ValueError("minialbert preset 'tiny' takes at most 128 tokens")

    monkeypatch.setattr(distill, "distill", refuse)
    assert main(["distill", "minialbert", "--preset", "tiny", "--output",
                 str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "distilserve distill: minialbert preset 'tiny' takes at most 128 tokens"


def _distilled_into(default: Path, monkeypatch) -> None:
    """``distill`` made to save a tiny student at once, and ``default`` the repository that
    --add-to-default adds it to."""
    from distilserve.server import embedded_default
    from distilserve.training import distill

    def trained(opts, progress):
        checkpoint.save(checkpoint.new("minialbert", "tiny"), opts.output)
        return {"parameters": 1, "fidelity": {"spearman": 0.5, "top10_overlap": 0.5,
                                              "sentences": 10}}

    monkeypatch.setattr(distill, "distill", trained)
    monkeypatch.setattr(embedded_default, "ensure_default_repository", lambda cache: default)


def test_a_student_added_to_the_default_is_served_at_most_its_positions(capsys, tmp_path,
                                                                        monkeypatch):
    """--add-to-default exports the student at 256 tokens, or at its positions where they
    are fewer (the tiny preset's 128)."""
    _distilled_into(tmp_path / "default", monkeypatch)
    assert main(["distill", "minialbert", "--preset", "tiny", "--output",
                 str(tmp_path / "s"), "--add-to-default"]) == 0
    assert "added to the default repository as 'minialbert'" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "default" / "minialbert" / "manifest.json").read_text())
    assert (manifest["family"], manifest["max_length"]) == ("minialbert", 128)


def test_a_student_its_export_refuses_is_kept_and_said_in_a_line(capsys, tmp_path,
                                                                 monkeypatch):
    from distilserve.models import export

    def refuse(*args, **kwargs):
        raise export.ExportError("max abs diff vs PyTorch 0.5 over tolerance")

    _distilled_into(tmp_path / "default", monkeypatch)
    monkeypatch.setattr(export, "export", refuse)
    assert main(["distill", "minialbert", "--preset", "tiny", "--output",
                 str(tmp_path / "s"), "--add-to-default"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"distilserve distill: the student is saved in {tmp_path / 's'}, and not added to the "
        "default repository: max abs diff vs PyTorch 0.5 over tolerance")
    assert (tmp_path / "s" / "config.json").exists()


def test_distill_does_not_write_over_a_checkpoint_it_did_not_start(capsys, tmp_path):
    assert main(["new", "bert", "--output", str(tmp_path / "mine")]) == 0
    assert main(["distill", "bert", "--output", str(tmp_path / "mine")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"{tmp_path / 'mine'} holds a checkpoint that is no distillation to resume (it has no "
        "distill_state.pt): name another folder")


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("example.internal", False)])
def test_a_host_other_than_loopback_without_a_key_is_warned_of(host, loopback, caplog):
    """``serve`` and ``ray`` warn at start that every route is open where the host is
    reachable from elsewhere (0.0.0.0, the image's) and no DISTILSERVE_API_KEY is set."""
    from distilserve.server.cli import common
    from distilserve.server.settings import Settings

    assert common.loopback(host) is loopback
    with caplog.at_level("WARNING", logger="distilserve"):
        common.warn_if_open(Settings(host=host), "inference")
        common.warn_if_open(Settings(host=host, api_key="sekret"), "inference")
    said = [r.getMessage() for r in caplog.records]
    shown = f"[{host}]" if ":" in host else host
    assert said == ([] if loopback else [
        f"no DISTILSERVE_API_KEY: every route (inference) is open to whoever reaches {shown}; "
        "set a key, or put the service behind a proxy that authenticates"])


def test_ray_warns_of_an_open_host_before_starting_ray(no_ray, capsys, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="distilserve"):
        assert main(["ray", "--model-repository", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert any("every route (inference, /metrics) is open to whoever reaches 0.0.0.0"
               in r.getMessage() for r in caplog.records)


def test_version_is_the_installed_distributions(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"distilserve {metadata.version('distilserve')}\n"


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["new", "--list"],
                                  ["serve", "--help"]])
def test_help_and_the_list_of_presets_import_neither_torch_nor_transformers(argv):
    """What the CLI prints of itself comes without the heavy imports, as fast as Python
    starts: the families' files are read for their presets, not imported."""
    import subprocess

    probe = ("import sys; from distilserve.server.cli import main\n"
             "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             "print(sorted({'torch', 'transformers', 'onnxruntime'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True,
                          text=True, check=True)
    assert done.stdout.splitlines()[-1] == "[]", done.stdout[-500:]


def test_the_preset_names_read_from_the_files_are_the_presets():
    for family in families.REGISTRY.values():
        assert family.preset_names == list(family.presets), family.name


def test_aliases_are_read_from_the_setting_and_the_manifests_and_clashes_said():
    from distilserve.server.service import aliases

    table, wrong = aliases({"ada": "embed", "gone": "nowhere"},
                           {"embed": ["text-embedding-3-small"], "other": ["cls"]})
    assert table == {"ada": "embed", "text-embedding-3-small": "embed", "cls": "other"}
    assert wrong == ["DISTILSERVE_MODEL_ALIASES: 'gone' names 'nowhere', which is not a "
                     "model folder of the repository"]
    table, wrong = aliases({"embed": "other"}, {"embed": [], "other": ["x"], "third": ["x"]})
    assert table == {}
    assert wrong == ["the name 'embed' is the model 'embed' and an alias of other",
                     "the name 'x' is an alias of other and third"]


def test_serve_refuses_a_name_two_models_would_answer_to(exports, tiny_checkpoints, tmp_path,
                                                         capsys, monkeypatch):
    for name in ("a", "b"):
        exports(tiny_checkpoints["cmow", "embed"], tmp_path / name, "onnx",
                aliases=["text-embedding-3-small"])
    assert main(["serve", "--model-repository", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'text-embedding-3-small' is an alias of a and b" in err
    monkeypatch.setenv("DISTILSERVE_MODEL_ALIASES", "ada=c")
    assert main(["serve", "--model-repository", str(tmp_path)]) == 2
    assert "'ada' names 'c', which is not a model folder" in capsys.readouterr().err


@pytest.mark.parametrize("soft, hard, set_to, warned", [
    (1024, 1_048_576, 2048 + 1024, False),  # a shell's: raised to what the service needs
    (1024, "unlimited", 2048 + 1024, False),
    (200, 200, None, True),  # no room: said, where connections past it failed unsaid
    (1024, 2000, 2000, True),  # as far as it goes
    (65_536, 65_536, None, False),  # enough already
    ("unlimited", "unlimited", None, False)])
def test_serve_raises_the_soft_limit_of_open_files_to_what_its_connections_need(
        monkeypatch, caplog, soft, hard, set_to, warned):
    import resource

    from distilserve.server.cli.common import open_files_for

    def limit(value):
        return resource.RLIM_INFINITY if value == "unlimited" else value

    set_to_ = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit(soft), limit(hard)))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: set_to_.append(limits))
    open_files_for(2048)
    assert set_to_ == ([] if set_to is None else [(set_to, limit(hard))])
    said = [r.getMessage() for r in caplog.records if r.name == "distilserve"]
    assert bool(said) is warned
    if warned:
        assert said[0].startswith(f"open files: at most {set_to or soft} (the hard limit), "
                                  "for DISTILSERVE_MAX_CONNECTIONS 2048 clients")
