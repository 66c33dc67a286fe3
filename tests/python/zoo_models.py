"""The model zoo of the load-after-compile test (tests/python/test_zoo_load.py, issue 22):
image-classification architectures from torchvision and timm (pinned in requirements.txt) that
people export, built with random weights (seeded) and fed a small random image.

Each entry is (architecture, library, constructor keyword arguments, input side). The default
zoo (ZOO) uses 64x64 inputs, or the size a model needs (the constructor's img_size for models
whose attention or patch grid is fixed at construction), so that it fits the CI budget. FULL
(KILN_ZOO_FULL=1) adds larger models, and runs every model at its library's default input size
(224x224, or timm's pretrained_cfg input_size).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Arch:
    """One architecture: `name` as its library spells it, `library` "torchvision" or "timm",
    `kwargs` for the constructor (torchvision.models.<name>(weights=None, **kwargs) or
    timm.create_model(name, pretrained=False, **kwargs)), `size` the input's height and width."""
    name: str
    library: str
    kwargs: dict = field(default_factory=dict, hash=False)
    size: int = 64


def _tv(name, **kw):
    return Arch(name, "torchvision", kw)


def _timm(name, size=64, **kw):
    return Arch(name, "timm", kw, size)


#: the default zoo (36 architectures); img_size / window_size adapt models whose attention grid is
#: fixed at construction to the small input
ZOO = [
    # torchvision
    _tv("resnet18"),
    _tv("mobilenet_v2"),
    _tv("mobilenet_v3_small"),
    _tv("squeezenet1_1"),
    _tv("shufflenet_v2_x0_5"),
    _tv("mnasnet0_5"),
    _tv("efficientnet_b0"),
    _tv("regnet_x_400mf"),
    _tv("googlenet", aux_logits=False, init_weights=True),
    # timm: convolutional
    _timm("convnext_atto"),
    _timm("regnety_002"),
    _timm("tf_efficientnet_b0"),  # TensorFlow "SAME" padding
    _timm("ghostnet_050"),
    _timm("mobilenetv4_conv_small"),
    _timm("lcnet_050"),
    _timm("repvgg_a0"),
    _timm("resnest14d"),
    _timm("inception_next_atto"),
    _timm("starnet_s1"),
    _timm("hgnetv2_b0"),
    _timm("dla34"),
    _timm("cs3darknet_s"),
    _timm("hrnet_w18_small"),
    _timm("poolformerv2_s12"),
    # timm: hybrid and attention
    _timm("efficientformerv2_s0", img_size=64),
    _timm("mobilevit_xxs"),
    _timm("mobilevitv2_050"),
    _timm("fastvit_t8"),
    _timm("efficientvit_b0"),
    _timm("edgenext_xx_small"),
    _timm("levit_128s", img_size=64),
    _timm("pvt_v2_b0"),
    _timm("vit_tiny_patch16_224", img_size=64),
    _timm("deit_tiny_patch16_224", img_size=64),
    _timm("swin_tiny_patch4_window7_224", img_size=64, window_size=4),
    _timm("eva02_tiny_patch14_224", size=56, img_size=56),
]

#: added by KILN_ZOO_FULL=1
FULL_EXTRA = [
    _tv("densenet121"),
    _tv("regnet_y_400mf"),
    _tv("convnext_tiny"),
    _tv("swin_t"),
    _tv("mobilenet_v3_large"),
    _timm("convnextv2_atto"),
    _timm("regnetx_002"),
    _timm("efficientnet_lite0"),
    _timm("mixnet_s"),
    _timm("ghostnetv2_100"),
    _timm("mobilenetv3_small_050"),
    _timm("mobileone_s0"),
    _timm("rexnet_100"),
    _timm("gernet_s"),
    _timm("semnasnet_050"),
    _timm("tinynet_e"),
    _timm("xcit_nano_12_p16_224", img_size=64),
    _timm("cait_xxs24_224", img_size=64),
    _timm("nest_tiny", img_size=64),
    _timm("maxvit_nano_rw_256", img_size=64),
    _timm("coat_lite_tiny", img_size=64),
]

#: constructor arguments that only adapt a model to the small input (dropped by full_size)
_SIZE_KWARGS = ("img_size", "window_size")


def full_size(arch: Arch) -> Arch:
    """`arch` at its library's default input size (timm: pretrained_cfg input_size; torchvision: 224)."""
    kw = {k: v for k, v in arch.kwargs.items() if k not in _SIZE_KWARGS}
    size = 224
    if arch.library == "timm":
        import timm
        size = int(timm.get_pretrained_cfg(arch.name).input_size[-1])
    return Arch(arch.name, arch.library, kw, size)


def zoo(full: bool = False) -> list[Arch]:
    """The architectures to test: ZOO, or (full) ZOO + FULL_EXTRA at their default input sizes."""
    return [full_size(a) for a in ZOO + FULL_EXTRA] if full else list(ZOO)


def build(arch: Arch, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model in eval mode with random weights (torch.manual_seed(seed) before construction:
    each library's own initialization) and an input of shape [1, 3, size, size] drawn from N(0, 1)
    with its own seeded generator."""
    torch.manual_seed(seed)
    if arch.library == "torchvision":
        import torchvision.models as tvm
        model = getattr(tvm, arch.name)(weights=None, **arch.kwargs)
    elif arch.library == "timm":
        import timm
        model = timm.create_model(arch.name, pretrained=False, **arch.kwargs)
    else:
        raise ValueError(f"unknown library {arch.library!r} for {arch.name}")
    x = torch.randn(1, 3, arch.size, arch.size, generator=torch.Generator().manual_seed(seed + 1))
    return model.eval(), x
