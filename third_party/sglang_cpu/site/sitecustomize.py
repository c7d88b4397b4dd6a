"""Loaded at interpreter start-up by the SGLang server's processes (their PYTHONPATH holds this
folder).

PyPI's torchvision wheel is built against CUDA torch; beside the CPU torch its import fails with
``operator torchvision::nms does not exist`` when it registers fake kernels. SGLang imports
torchvision at start-up, so we define the two op schemas it expects (``torchvision::nms`` and
``torchvision::qnms``) through ``torch.library`` before torchvision loads. No kernels are
registered: only image models would call them, and they then fail loudly.

The schemas are defined when torchvision is first imported, not at start-up: the server's helper
processes that never import it (multiprocessing's resource tracker) then do not import torch.

SGLang also forces multiprocessing's ``spawn`` start method (CUDA cannot survive a fork), so its
scheduler and detokenizer processes each import torch, transformers and SGLang again. On a CPU
there is no CUDA context to lose, so here its ``set_start_method("spawn")`` starts them by
``fork`` instead: they inherit the imported modules (a tiny server's start took about 25 s of CPU
with spawn, 9 s with fork). ``RUBRIC_RL_SGLANG_START_METHOD`` (default ``fork``) names the
method to use instead; ``spawn`` keeps SGLang's own.
"""

import os
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


def _start_children_by(method: str) -> None:
    """Replaces a ``spawn`` asked of ``multiprocessing.set_start_method`` by `method`, saying so
    in the server log each time."""
    import multiprocessing

    original = multiprocessing.set_start_method

    def set_start_method(asked, force=False):
        if asked == "spawn":
            print(
                f"[sglang_cpu sitecustomize] start method {method} instead of spawn",
                file=sys.stderr,
            )
            asked = method
        return original(asked, force=force)

    multiprocessing.set_start_method = set_start_method


_START_METHOD = os.environ.get("RUBRIC_RL_SGLANG_START_METHOD", "fork")
if _START_METHOD != "spawn":
    _start_children_by(_START_METHOD)
