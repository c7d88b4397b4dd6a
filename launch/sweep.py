"""Sweeps: configs × variants × grid overrides × seeds -> one run (and workdir) each.

    # 3 seeds of ARISE and its ablations, 2 at a time on this machine (seed by seed: --order):
    python launch/sweep.py --root runs/arise --config configs/arise.py \\
        --variant "" --variant no_skills --variant outcome_only --seeds 0,1,2 --jobs 2
    # a learning-rate grid, printed one command per line for a cluster launcher:
    python launch/sweep.py --root /shared/runs --config configs/grpo.py:gpu \\
        --grid optim.lr=1e-6,3e-6 --seeds 0,1,2 --print

Each run is ``python -m rubric_rl.launch --config=<file>[:<variant>] --workdir=<wd>
--config.train.seed=<k> [--config.<key>=<value> ...]`` with

    <wd> = <root>/<config>[-<variant slug>][-<grid slug>]/seed<k>

(``launch/aggregate.py`` groups runs by that parent directory). ``--variant`` values use the
configs' own syntax (``smoke,no_skills``), crossed with every ``--config``; a ``--config`` may
also carry its variant (``configs/arise.py:smoke``). ``--grid key=v1,v2`` overrides are crossed
with each other and named in the slug; ``--set key=value`` overrides apply to every run and are
NOT in the slug. ``{seed}`` in a variant or an override is the run's seed, ``{next_seed}`` the next
seed of ``--seeds`` (cyclically: ``frozen_rubrics=runs/p/arise-protocol/seed{next_seed}`` pairs each
seed with another seed's ARISE run); the group name keeps the placeholders. A run is skipped when
finished (``SWEEP_DONE.json`` written after exit 0, or a checkpoint at its ``train.steps``) unless
``--force``, which moves its workdir aside to ``<wd>.replaced-<UTC time>`` (never deletes it;
aggregation skips it) and starts afresh; a run with checkpoints but unfinished is continued with
``--resume``. A sweep never touches a workdir a live run holds: ``--force`` on one is refused,
naming the holder's pid, before any run starts. Local runs log to ``<wd>/launch.log``.

Local runs share one persistent XLA compilation cache (``--jax_cache``, default
``<root>/jax_cache``; ``off`` for none; an explicit ``JAX_COMPILATION_CACHE_DIR`` in the
environment is kept): the arms of a sweep compile the same programs (the train step for each
shape bucket, the engine's prefill and decode), so only the first run pays for each. A cached
executable is what the compiler produced for the same program, so results do not change (the
test suite relies on the same). ``--print`` leaves the environment to the launcher.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence

from rubric_rl.analysis import FINISHED_MARKER, checkpoint_steps, is_finished
from rubric_rl.runs.run_dir import RunDirError, lock_holder, set_aside

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED_KEY = "train.seed"  # configs/common.py: c.train.seed
SEED_PLACEHOLDER = "{seed}"
# The next seed of the sweep's --seeds list, cyclically (the last one's is the first): a run of
# ANOTHER seed (ARISE's frozen-rubrics arm takes its rubric set from another seed's run).
NEXT_SEED_PLACEHOLDER = "{next_seed}"
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
MAX_SLUG = 64


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a sweep."""

    config: str  # "configs/arise.py" or "configs/arise.py:smoke,no_skills"
    seed: int
    overrides: tuple[tuple[str, str], ...]  # grid + --set, in order
    workdir: str

    def command(self, python: str = "python", resume: bool = False) -> list[str]:
        cmd = [python, "-m", "rubric_rl.launch", f"--config={self.config}"]
        cmd += [f"--workdir={self.workdir}", f"--config.{SEED_KEY}={self.seed}"]
        cmd += [f"--config.{k}={v}" for k, v in self.overrides]
        if resume:
            cmd.append("--resume")
        return cmd


def slug(text: str) -> str:
    """A directory-safe name: ``,`` -> ``+``, ``=`` -> ``_``, other unsafe runs -> ``_``; names
    longer than MAX_SLUG keep a prefix and a hash of the whole (e.g. frozen_rubrics=<long path>)."""
    s = _UNSAFE.sub("_", text.replace(",", "+").replace("=", "_")).strip("_")
    if len(s) > MAX_SLUG:
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        s = f"{s[: MAX_SLUG - 9]}~{digest}"
    return s


def parse_assignment(text: str, flag: str) -> tuple[str, str]:
    if "=" not in text:
        raise ValueError(f"{flag} {text!r}: expected key=value")
    k, v = text.split("=", 1)
    k = k.strip().removeprefix("--").removeprefix("config.")
    if not k:
        raise ValueError(f"{flag} {text!r}: empty key")
    return k, v.strip()


def parse_grid(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``["optim.lr=1e-4,3e-4"]`` -> ``[("optim.lr", ["1e-4", "3e-4"])]``."""
    out = []
    for item in items:
        k, v = parse_assignment(item, "--grid")
        values = [x.strip() for x in v.split(",") if x.strip()]
        if not values:
            raise ValueError(f"--grid {item!r}: no values")
        if k in [g[0] for g in out]:
            raise ValueError(f"--grid {k!r} given twice")
        out.append((k, values))
    return out


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-2"`` (inclusive)."""
    try:
        if re.fullmatch(r"\d+-\d+", text.strip()):
            lo, hi = (int(x) for x in text.split("-"))
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected e.g. 0,1,2 or 0-2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: need distinct seeds")
    if min(seeds) < 0:  # seed-1 would match no seed<k> directory: aggregate/archive never see it
        raise ValueError(f"--seeds {text!r}: seeds must be >= 0")
    return seeds


def expand(
    root: str,
    configs: Sequence[str],
    variants: Sequence[str] = (),
    seeds: Sequence[int] = (0,),
    grid: Sequence[tuple[str, Sequence[str]]] = (),
    fixed: Sequence[tuple[str, str]] = (),
) -> list[RunSpec]:
    """Every (config, variant, grid point, seed), in that nesting order (seed innermost)."""
    if SEED_KEY in [k for k, _ in grid] + [k for k, _ in fixed]:
        raise ValueError(f"set seeds with --seeds, not an override of {SEED_KEY}")
    runs, seen = [], {}
    for cfg in configs:
        path, _, own = cfg.partition(":")
        if not path.endswith(".py"):
            raise ValueError(f"--config {cfg!r}: expected configs/<name>.py[:variant]")
        if own and variants:
            raise ValueError(f"--config {cfg!r} carries a variant; don't also pass --variant")
        name = os.path.splitext(os.path.basename(path))[0]
        for variant in list(variants) or [own]:
            spec = f"{path}:{variant}" if variant else path
            for point in itertools.product(*[[(k, v) for v in vs] for k, vs in grid]):
                parts = [name]
                if variant:
                    parts.append(slug(variant))
                if point:
                    parts.append(slug("+".join(f"{k}_{v}" for k, v in point)))
                group = "-".join(parts)
                for i, seed in enumerate(seeds):
                    wd = os.path.join(root, group, f"seed{seed}")
                    if wd in seen:
                        raise ValueError(f"runs {seen[wd]} and {spec} share workdir {wd}")
                    seen[wd] = spec
                    nxt = seeds[(i + 1) % len(seeds)]
                    overrides = tuple((k, with_seed(v, seed, nxt)) for k, v in (*point, *fixed))
                    runs.append(RunSpec(with_seed(spec, seed, nxt), int(seed), overrides, wd))
    return runs


def seed_major(runs: Sequence[RunSpec]) -> list[RunSpec]:
    """The runs ordered seed by seed (every arm of the first seed, then the next seed; the arms
    in ``expand``'s order within a seed), as the protocols run them: whenever a session stops,
    the seeds that finished are complete across arms, and a seed's arms share the machine."""
    order = {s: i for i, s in enumerate(dict.fromkeys(r.seed for r in runs))}
    return sorted(runs, key=lambda r: order[r.seed])  # stable: expand's order within a seed


def with_seed(text: str, seed: int, next_seed: int | None = None) -> str:
    """``text`` with ``{seed}`` replaced by the run's seed (a variant or override that names
    another run of the same seed) and ``{next_seed}`` by ``next_seed``, the next seed of the
    sweep (one that names another seed's run: ``frozen_rubrics=runs/p/arise/seed{next_seed}``,
    the frozen-rubrics ablation). The group name keeps the placeholders, so every seed is one
    group."""
    if NEXT_SEED_PLACEHOLDER in text:
        if next_seed is None:
            raise ValueError(f"{text!r}: {NEXT_SEED_PLACEHOLDER} needs the sweep's next seed")
        text = text.replace(NEXT_SEED_PLACEHOLDER, str(next_seed))
    return text.replace(SEED_PLACEHOLDER, str(seed))


def needs_resume(workdir: str) -> bool:
    return bool(checkpoint_steps(workdir))


def plan(runs: Sequence[RunSpec], force: bool = False) -> tuple[list[RunSpec], list[RunSpec]]:
    """(to run, skipped as finished)."""
    todo, done = [], []
    for r in runs:
        (todo if force or not is_finished(r.workdir) else done).append(r)
    return todo, done


def refuse_live(runs: Sequence[RunSpec]) -> None:
    """Raises ``RunDirError`` listing every run whose workdir a live process holds (its pid):
    ``--force`` would otherwise move a running run's files from under it."""
    live = [(r.workdir, h) for r in runs if (h := lock_holder(r.workdir)) is not None]
    if live:
        lines = "\n".join(f"  {wd}: {holder}" for wd, holder in live)
        raise RunDirError(
            f"--force: {len(live)} run(s) are live; nothing was moved or started:\n{lines}\n"
            "wait for them to finish or stop them, then run the sweep again"
        )


def print_commands(runs: Sequence[RunSpec], force: bool, python: str = "python") -> list[str]:
    """One shell line per run to launch (finished runs skipped unless forced). A forced run that
    has a workdir is moved aside first by ``rubric_rl.runs.run_dir --set-aside``, which refuses (and
    so stops the line) when the run is live by the time the line runs."""
    todo, _ = plan(runs, force)
    if force:
        refuse_live(todo)
    lines = []
    for r in todo:
        if force and os.path.exists(r.workdir):
            aside = shlex.join([python, "-m", "rubric_rl.runs.run_dir", "--set-aside", r.workdir])
            lines.append(f"{aside} && " + shlex.join(r.command(python)))
        else:
            lines.append(shlex.join(r.command(python, resume=needs_resume(r.workdir))))
    return lines


def _start(run: RunSpec, force: bool, python: str, env: dict[str, str]) -> subprocess.Popen:
    if force:
        moved = set_aside(run.workdir)  # RunDirError when it went live since refuse_live
        if moved:
            print(f"[sweep] moved aside: {run.workdir} -> {moved}", flush=True)
    os.makedirs(run.workdir, exist_ok=True)
    cmd = run.command(python, resume=needs_resume(run.workdir))
    log = open(os.path.join(run.workdir, "launch.log"), "ab")
    log.write(f"$ {shlex.join(cmd)}\n".encode())
    log.flush()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc._sweep = (run, cmd, log, time.time())  # type: ignore[attr-defined]
    return proc


def _finish(proc: subprocess.Popen) -> int:
    run, cmd, log, t0 = proc._sweep  # type: ignore[attr-defined]
    log.close()
    rc = proc.returncode
    if rc == 0:
        marker = {"command": cmd, "returncode": rc, "seconds": round(time.time() - t0, 1)}
        with open(os.path.join(run.workdir, FINISHED_MARKER), "w") as f:
            json.dump(marker, f)
    print(f"[sweep] {'done' if rc == 0 else f'FAILED rc={rc}'}: {run.workdir}", flush=True)
    return rc


CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def with_jax_cache(env: dict[str, str], cache: str | None) -> dict[str, str]:
    """``env`` with the runs' compilation cache: ``cache`` (a directory, created), ``"off"`` (no
    cache: the variable removed), or None (the environment's own setting, unchanged)."""
    env = dict(env)
    if cache == "off":
        env.pop(CACHE_ENV, None)
    elif cache is not None:
        os.makedirs(cache, exist_ok=True)
        env[CACHE_ENV] = os.path.abspath(cache)
    return env


def run_local(
    runs: Sequence[RunSpec],
    jobs: int = 1,
    force: bool = False,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    jax_cache: str | None = None,
) -> dict[str, int]:
    """Runs the unfinished runs, ``jobs`` at a time; returns {workdir: return code}.
    ``jax_cache``: the runs' shared compilation cache (``with_jax_cache``)."""
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    todo, done = plan(runs, force)
    if force:
        refuse_live(todo)
    for r in done:
        print(f"[sweep] skip (finished): {r.workdir}", flush=True)
    env = with_jax_cache(dict(os.environ if env is None else env), jax_cache)
    pending, active, codes = list(todo), [], {}
    while pending or active:
        while pending and len(active) < jobs:
            run = pending.pop(0)
            try:
                active.append(_start(run, force, python, env))
            except RunDirError as e:  # went live after refuse_live: left alone, counted failed
                print(f"[sweep] FAILED (not started): {e}", flush=True)
                codes[run.workdir] = 1
        time.sleep(0.05)
        for p in [p for p in active if p.poll() is not None]:
            active.remove(p)
            codes[p._sweep[0].workdir] = _finish(p)  # type: ignore[attr-defined]
    return codes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--root", required=True, help="parent of every run directory")
    p.add_argument("--config", action="append", required=True, help="configs/X.py[:variant]")
    p.add_argument("--variant", action="append", default=[], help='variant string ("" = none)')
    p.add_argument("--seeds", default="0", help="0,1,2 or 0-2 (sets config.train.seed)")
    p.add_argument("--grid", action="append", default=[], help="key=v1,v2 (crossed)")
    p.add_argument("--set", action="append", default=[], help="key=value for every run")
    p.add_argument("--print", action="store_true", help="print one command per line, run none")
    p.add_argument("--jobs", type=int, default=1, help="local runs at a time")
    p.add_argument(
        "--order",
        choices=("seed", "config"),
        default="seed",
        help="seed: every arm of a seed before the next seed (default; the protocols' order); "
        "config: every seed of an arm before the next arm",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="rerun finished runs (moves each workdir aside to <wd>.replaced-<time>; refused "
        "while any of them is live)",
    )
    p.add_argument("--python", default=None, help="interpreter (default: python / this one)")
    p.add_argument(
        "--jax_cache",
        default=None,
        help="local runs' shared XLA compilation cache: a directory, or off (default: "
        "$JAX_COMPILATION_CACHE_DIR when set, else <root>/jax_cache)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runs = expand(
        os.path.abspath(args.root) if not args.print else args.root,
        args.config,
        args.variant,
        parse_seeds(args.seeds),
        parse_grid(args.grid),
        [parse_assignment(s, "--set") for s in args.set],
    )
    if args.order == "seed":
        runs = seed_major(runs)
    cache = args.jax_cache
    if cache is None and CACHE_ENV not in os.environ and not args.print:
        cache = os.path.join(os.path.abspath(args.root), "jax_cache")
    try:
        if args.print:
            for line in print_commands(runs, args.force, args.python or "python"):
                print(line)
            return 0
        codes = run_local(
            runs, args.jobs, args.force, args.python or sys.executable, jax_cache=cache
        )
    except RunDirError as e:
        print(f"[sweep] error: {e}", file=sys.stderr, flush=True)
        return 1
    failed = [w for w, rc in codes.items() if rc != 0]
    print(f"[sweep] {len(codes) - len(failed)} ok, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
