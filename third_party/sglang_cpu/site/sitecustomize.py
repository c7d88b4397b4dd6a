"""Loaded at interpreter start-up by the SGLang server process (its PYTHONPATH holds this folder).

PyPI's torchvision wheel is built against CUDA torch; beside the CPU torch its import fails with
``operator torchvision::nms does not exist`` when it registers fake kernels. SGLang imports
torchvision at start-up, so we define the two op schemas it expects (``torchvision::nms`` and
``torchvision::qnms``) through ``torch.library`` before torchvision loads. No kernels are
registered: only image models would call them, and they then fail loudly.
"""

try:
    import torch

    _TORCHVISION_LIB = torch.library.Library("torchvision", "DEF")  # kept alive: owns the defs
    _TORCHVISION_LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION_LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
except Exception as exc:  # never block interpreter start-up; torchvision will say what is wrong
    import sys

    print(
        f"[sglang_cpu sitecustomize] could not define torchvision schemas: {exc}", file=sys.stderr
    )
