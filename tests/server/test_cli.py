import pytest

from models import checkpoint
from server.cli import main


def test_new_list_prints_every_family_and_preset(capsys):
    assert main(["new", "--list"]) == 0
    out = capsys.readouterr().out
    for family in checkpoint.FAMILIES:
        assert family in out
    for preset in ["bert-base", "tinybert-4l", "minilm-l6", "mobilebert", "distilbert",
                   "minialbert-128", "minialbert-312", "minialbert-768",
                   "minialbert-768-noadapter", "albert-base", "lr-albert", "falbert",
                   "cmow-hybrid-bidi", "tiny"]:
        assert preset in out


def test_new_writes_a_loadable_checkpoint(tmp_path, capsys):
    assert main(["new", "falbert", "--output", str(tmp_path), "--task", "ner",
                 "--labels", "O,B-PER,I-PER"]) == 0
    ckpt = checkpoint.load(tmp_path)
    assert (ckpt.family, ckpt.task, ckpt.labels) == ("falbert", "ner", ["O", "B-PER", "I-PER"])
    for name in ["config.json", "model.safetensors", "tokenizer.json", "vocab.txt"]:
        assert (tmp_path / name).exists()


def test_new_with_an_unknown_preset_fails_clearly(tmp_path, capsys):
    assert main(["new", "cmow", "--preset", "huge", "--output", str(tmp_path)]) == 1
    assert "unknown preset 'huge'" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is visible")
def test_serve_on_cuda_without_a_gpu_is_one_line_before_anything_loads(tmp_path, capsys):
    assert main(["serve", "--model-repository", str(tmp_path), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no GPU is visible" in err


def test_serve_refuses_an_unknown_device_in_one_line(tmp_path, capsys):
    assert main(["serve", "--model-repository", str(tmp_path), "--device", "tpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown device 'tpu'" in err
