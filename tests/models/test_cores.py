"""distilserve/models/runtime/cores.py: the cores a process may use, on made-up cgroup trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from distilserve.models.runtime import cores


def _tree(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (tmp_path / "proc").write_text(proc)
    return tmp_path / "proc", root


@pytest.mark.parametrize("proc,files,quota", [
    # cgroup v2 in a container (its own folder at the root): docker run --cpus 2.5
    ("0::/\n", {"cpu.max": "250000 100000\n"}, 2.5),
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),
    # v2 on a host: the process's cgroup under the root, its parent limited too
    ("0::/kubepods/pod1/c1\n", {"kubepods/pod1/cpu.max": "300000 100000",
                                "kubepods/pod1/c1/cpu.max": "400000 100000"}, 3.0),
    # v1 (this project's machine): a quota of -1 is none
    ("2:cpuacct:/\n1:cpu:/\n0::/\n", {"cpu/cpu.cfs_quota_us": "-1",
                                     "cpu/cpu.cfs_period_us": "100000"}, None),
    # v1 in a container without a cgroup namespace: its path is the host's, its folder
    # mounted at the root
    ("4:cpu,cpuacct:/docker/abc\n", {"cpu/cpu.cfs_quota_us": "150000",
                                      "cpu/cpu.cfs_period_us": "100000"}, 1.5),
    ("no cgroups here\n", {}, None),
])
def test_cpu_quota_reads_v1_and_v2(tmp_path, proc, files, quota):
    assert cores.cpu_quota(*_tree(tmp_path, proc, files)) == quota


def test_available_cores_is_the_affinity_capped_by_the_quota_rounded_up(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(64)))
    assert cores.available_cores(*_tree(tmp_path, "0::/\n", {"cpu.max": "150000 100000"})) == 2
    assert cores.available_cores(*_tree(tmp_path, "0::/\n", {"cpu.max": "20000 100000"})) == 1
    assert cores.available_cores(*_tree(tmp_path, "0::/\n", {"cpu.max": "max 100000"})) == 64
    assert cores.available_cores(tmp_path / "missing", tmp_path) == 64
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert cores.available_cores(*_tree(tmp_path, "0::/\n", {"cpu.max": "800000 100000"})) == 2


def test_torch_threads_follow_the_quota_unless_omp_num_threads_says(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(cores, "available_cores", lambda: 1)
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        cores.limit_torch_threads()
        assert torch.get_num_threads() == before  # said: left as it is
        monkeypatch.delenv("OMP_NUM_THREADS")
        cores.limit_torch_threads()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
