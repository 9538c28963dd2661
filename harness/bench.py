"""Benchmark of the rank pool: ``python -m harness.bench [--soak 1000]``.

Prints, against the project's budgets (:data:`BUDGETS`): pool start with 4 ranks (the forkserver's
imports, then the ranks joining gloo and running the warm-up step), the first job against
later ones, empty-job dispatch overhead at world sizes 1, 2 and 4, a tiny FSDP2 training job
(2 Linear layers, ``fully_shard``, 2 AdamW steps) through the pool against spawning fresh
processes per run, and resident memory growth per rank over ``--soak`` runs. Job times are
medians of many runs.

Under attach mode (``torchrun --nproc-per-node 4 -m harness.attach -- python -m harness.bench``)
it measures what such a run can: forming the process group on torchrun's ranks and the
empty-job round trip through torchrun's store at its world size.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

import harness.api as api
from harness.api import pool_for, run_on_ranks
from harness.conformance.output.provenance import commit, machine
from harness.pool.transports.pipes import forkserver_context
from harness.rank.context import RankContext
from harness.rank.warmup import tiny_fsdp2_step
from harness.wire.attach import info_from_env

__all__ = ["main", "tiny_fsdp2_step"]

BUDGETS = {
    "pool_start_s": 3.0,
    "empty_job_ms_ws4": 3.0,
    "fsdp_overhead_ms": 5.0,
    "spawn_ratio": 30.0,
    "rss_growth_mb": 200.0,
}


def _noop() -> None:
    """Target of the process that proves the forkserver is ready."""


def empty_job(ctx: RankContext) -> None:
    """Nothing: measures dispatch overhead."""


def fsdp_job(ctx: RankContext) -> float:
    """The tiny FSDP2 job inside the pool; returns its in-rank seconds."""
    return tiny_fsdp2_step()


def rss_job(ctx: RankContext) -> float:
    """This rank's resident memory in MB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _spawned_rank(rank: int, world_size: int, port: int) -> None:
    store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    tiny_fsdp2_step()
    dist.destroy_process_group()


def spawn_once(world_size: int) -> float:
    """Spawn fresh processes, run the tiny FSDP2 job once, join; return wall seconds."""
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    procs = [
        context.Process(target=_spawned_rank, args=(r, world_size, store.port))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        if p.exitcode != 0:
            raise RuntimeError(f"spawned rank exited with {p.exitcode}")
    return time.perf_counter() - start


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def measure(runs: int, fsdp_runs: int, spawn_runs: int, soak: int) -> dict[str, Any]:
    """Run every measurement and return the figures (times in s or ms as named)."""
    out: dict[str, Any] = {}
    start = time.perf_counter()
    api.warm_up()  # what the plugin does at start-up: the forkserver imports torch
    probe = forkserver_context().Process(target=_noop)
    probe.start()
    probe.join()
    out["forkserver_s"] = time.perf_counter() - start
    pool = pool_for(4)
    out["pool_start_s"] = pool.start()  # ranks fork, join gloo, run the warm-up step
    out["pool_start_cold_s"] = out["forkserver_s"] + out["pool_start_s"]
    out["first_job_s"], _ = _timed(lambda: run_on_ranks(fsdp_job, world_size=4))
    for ws in (1, 2, 4):
        pool_for(ws).start()
        out[f"empty_job_ms_ws{ws}"] = _empty_job_ms(ws, runs)
    trips, inside = [], []
    for _ in range(fsdp_runs):
        trip, per_rank = _timed(lambda: run_on_ranks(fsdp_job, world_size=4))
        trips.append(trip)
        inside.append(max(per_rank))
    out["later_job_s"] = statistics.median(trips)
    out["fsdp_pool_ms"] = _median_ms(trips)
    out["fsdp_in_rank_ms"] = _median_ms(inside)
    out["fsdp_overhead_ms"] = _median_ms([t - i for t, i in zip(trips, inside, strict=True)])
    pool.kill()
    out["respawn_s"] = pool.start()
    out["fsdp_spawn_s"] = statistics.median(spawn_once(4) for _ in range(spawn_runs))
    out["spawn_ratio"] = out["fsdp_spawn_s"] * 1e3 / out["fsdp_pool_ms"]
    if soak:
        before = run_on_ranks(rss_job, world_size=4)
        for _ in range(soak):
            run_on_ranks(fsdp_job, world_size=4)
        after = run_on_ranks(rss_job, world_size=4)
        out["soak_runs"] = soak
        out["rss_growth_mb"] = max(a - b for a, b in zip(after, before, strict=True))
        out["rss_mb_after"] = after
    return out


def _empty_job_ms(world_size: int, runs: int) -> float:
    """Median round trip of an empty job at ``world_size`` (after 10 unmeasured ones)."""
    for _ in range(10):
        run_on_ranks(empty_job, world_size=world_size)
    job = partial(run_on_ranks, empty_job, world_size=world_size)
    return _median_ms([_timed(job)[0] for _ in range(runs)])


def measure_attached(runs: int) -> dict[str, Any]:
    """Attach mode: form the process group on torchrun's ranks, then time empty jobs."""
    size = api.max_world_size()
    out: dict[str, Any] = {"attach_world_size": size, "pool_start_s": pool_for(size).start()}
    out[f"empty_job_ms_ws{size}"] = _empty_job_ms(size, runs)
    return out


def report(figures: dict[str, Any]) -> str:
    """The figures as lines, each with its budget and a verdict."""

    def line(
        label: str,
        value: float,
        unit: str,
        budget: float | None = None,
        higher_is_better: bool = False,
    ) -> str:
        text = f"{label:<46} {value:10.3f} {unit}"
        if budget is not None:
            ok = value >= budget if higher_is_better else value <= budget
            sign = ">=" if higher_is_better else "<="
            text += f"   (budget {sign} {budget:g} {unit}: {'ok' if ok else 'OVER'})"
        return text

    lines = [
        line("forkserver ready (imports torch + distributed)", figures["forkserver_s"], "s"),
        line("pool start, 4 ranks (join gloo + warm-up step)", figures["pool_start_s"], "s"),
        line(
            "  cold total: forkserver + pool start",
            figures["pool_start_cold_s"],
            "s",
            BUDGETS["pool_start_s"],
        ),
        line("respawn after a kill, 4 ranks (no warm-up)", figures["respawn_s"], "s"),
        line("first tiny FSDP2 job after start", figures["first_job_s"] * 1e3, "ms"),
        line("later tiny FSDP2 job (median)", figures["later_job_s"] * 1e3, "ms"),
    ]
    for ws in (1, 2, 4):
        budget = BUDGETS["empty_job_ms_ws4"] if ws == 4 else None
        lines.append(
            line(
                f"empty job round trip, world size {ws} (median)",
                figures[f"empty_job_ms_ws{ws}"],
                "ms",
                budget,
            )
        )
    lines += [
        line("tiny FSDP2 job in the ranks (median)", figures["fsdp_in_rank_ms"], "ms"),
        line("tiny FSDP2 job through the pool (median)", figures["fsdp_pool_ms"], "ms"),
        line(
            "  pool overhead over in-rank time (median)",
            figures["fsdp_overhead_ms"],
            "ms",
            BUDGETS["fsdp_overhead_ms"],
        ),
        line("tiny FSDP2 job spawning 4 processes (median)", figures["fsdp_spawn_s"] * 1e3, "ms"),
        line("  spawn / pool", figures["spawn_ratio"], "x", BUDGETS["spawn_ratio"], True),
    ]
    if "rss_growth_mb" in figures:
        lines.append(
            line(
                f"RSS growth per rank over {figures['soak_runs']} runs (max)",
                figures["rss_growth_mb"],
                "MB",
                BUDGETS["rss_growth_mb"],
            )
        )
    return "\n".join(lines)


def report_attached(figures: dict[str, Any]) -> str:
    """The attach-mode figures as lines."""
    size = figures["attach_world_size"]
    return "\n".join(
        [
            f"{'attach mode: form the process group, ' + str(size) + ' ranks':<46} "
            f"{figures['pool_start_s']:10.3f} s",
            f"{'attach mode: empty job, world size ' + str(size) + ' (median)':<46} "
            f"{figures[f'empty_job_ms_ws{size}']:10.3f} ms",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m harness.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=300, help="empty jobs per world size")
    parser.add_argument("--fsdp-runs", type=int, default=50, help="tiny FSDP2 jobs via the pool")
    parser.add_argument("--spawn-runs", type=int, default=3, help="tiny FSDP2 runs by spawning")
    parser.add_argument("--soak", type=int, default=100, help="runs for the RSS growth figure")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    for name in ("runs", "fsdp_runs", "spawn_runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if args.soak < 0:
        parser.error(f"--soak={args.soak} must be 0 (skip) or more")
    attach = info_from_env()
    if attach is not None:
        api.configure(backend="gloo", nproc=attach.world_size, transport="torchrun", attach=attach)
    else:
        api.configure(backend="gloo", nproc=max(4, api.current_config().nproc))
    try:
        if attach is not None:
            figures = measure_attached(args.runs)
        else:
            figures = measure(args.runs, args.fsdp_runs, args.spawn_runs, args.soak)
    finally:
        api.shutdown(final=True)
    print(f"shardcheck pool benchmark (torch {torch.__version__}, {os.cpu_count()} CPUs, gloo)")
    print(report_attached(figures) if attach is not None else report(figures))
    if args.json:  # with where the figures came from, for ci/results.py
        figures["run"] = {
            "command": shlex.join(["python", "-m", "harness.bench", *sys.argv[1:]]),
            "torch": torch.__version__,
            "commit": commit(),
            "machine": machine(),
        }
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    # Run the copy imported as ``harness.bench`` so rank functions are found by that name.
    sys.exit(importlib.import_module("harness.bench").main())
