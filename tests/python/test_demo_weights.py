"""The main job (examples/mv3/demo.py) with torchvision's pretrained weights from the torch hub cache.

Nothing is downloaded: a state dict is written into a temporary TORCH_HOME under the file name that
torchvision's DEFAULT weights use, the way a download elsewhere would have left it. The weights in
that file are random (seeded); what is checked is that the demo finds and uses the cached file and
says so, and that its program still matches PyTorch eager with those weights.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch
import torchvision

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "mv3"))
import demo  # noqa: E402

CLASSIFY = os.path.join(ROOT, "build", "examples", "mv3", "classify")


def _cache_file(name: str) -> str:
    w = torchvision.models.get_model_weights(name).DEFAULT
    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(w.url))


def test_hub_cached_weights_found_only_when_present(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    assert demo.hub_cached_weights("mobilenet_v3_small") is None
    path = _cache_file("mobilenet_v3_small")
    assert path.startswith(str(tmp_path))
    os.makedirs(os.path.dirname(path))
    torch.manual_seed(0)
    torch.save(torchvision.models.mobilenet_v3_small(weights=None).state_dict(), path)
    hit = demo.hub_cached_weights("mobilenet_v3_small")
    assert hit == (path, "MobileNet_V3_Small_Weights.IMAGENET1K_V1")
    assert demo.hub_cached_weights("resnet18") is None  # another model's file is not there


@pytest.mark.skipif(not os.access(CLASSIFY, os.X_OK), reason="build/examples/mv3/classify not built")
def test_demo_uses_the_hub_cache_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    path = _cache_file("mobilenet_v3_small")
    os.makedirs(os.path.dirname(path))
    torch.manual_seed(1)
    model = torchvision.models.mobilenet_v3_small(weights=None).eval()
    demo.random_weights(["mobilenet_v3_small"], str(tmp_path / "w"), demo.photo_paths().values())
    model.load_state_dict(torch.load(tmp_path / "w" / "mobilenet_v3_small.pth", weights_only=True))
    torch.save(model.state_dict(), path)
    rc = demo.main(["--models", "mobilenet_v3_small", "--backends", "portable", "--runs", "1",
                    "--out-dir", str(tmp_path / "out"), "--classify", CLASSIFY])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "using torchvision's pretrained weights MobileNet_V3_Small_Weights.IMAGENET1K_V1 from the torch hub cache" in out
    assert "RANDOM" not in out
    assert os.path.realpath(tmp_path / "out" / "weights" / "mobilenet_v3_small.pth") == os.path.realpath(path)


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", "other_model"])
def test_unusable_cache_file_is_named_and_not_used(tmp_path, monkeypatch, content):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    path = _cache_file("mobilenet_v3_small")
    os.makedirs(os.path.dirname(path))
    if content == "other_model":
        torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    else:
        with open(path, "wb") as f:
            f.write(content)
    assert demo.hub_cached_weights("mobilenet_v3_small")[0] == path  # found by name ...
    why = demo.usable_state_dict("mobilenet_v3_small", path)  # ... but refused, saying why
    assert why and len(why) < 200, why
