"""Loaded at interpreter start-up by the SGLang server's processes (their PYTHONPATH holds this
folder).

PyPI's torchvision wheel is built against CUDA torch; beside the CPU torch its import fails with
``operator torchvision::nms does not exist`` when it registers fake kernels. SGLang imports
torchvision at start-up, so we define the two op schemas it expects (``torchvision::nms`` and
``torchvision::qnms``) through ``torch.library`` before torchvision loads. No kernels are
registered: only image models would call them, and they then fail loudly.

The schemas are defined when torchvision is first imported, not at start-up: the server's helper
processes that never import it (multiprocessing's resource tracker) then do not import torch.
"""

import sys

_TORCHVISION_LIB = None  # kept alive once defined: it owns the definitions


def _define_torchvision_schemas() -> None:
    global _TORCHVISION_LIB
    try:
        import torch

        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _TORCHVISION_LIB = lib
    except Exception as exc:  # never block the import; torchvision will say what is wrong
        print(
            f"[sglang_cpu sitecustomize] could not define torchvision schemas: {exc}",
            file=sys.stderr,
        )


class _BeforeTorchvision:
    """A meta-path finder that finds nothing: on the first ``import torchvision`` it defines the
    schemas, removes itself, and leaves the import to the regular finders."""

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        _define_torchvision_schemas()
        return None


sys.meta_path.insert(0, _BeforeTorchvision())
