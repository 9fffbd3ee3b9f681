"""Evaluation metrics for cost models (pure numpy; no torch).

All functions take `scores` (N,), higher = predicted faster, aligned with a FeatureSet's rows.

* Top-k score (Tenset / TLP), per network:

      score_k(net) = sum_t w_t * best_t / sum_t w_t * best_topk_t        (t over the tasks of net)

  where best_t is the lowest measured latency of task t in the evaluated set, best_topk_t the lowest
  true latency among the k programs the model scores highest, and w_t the occurrences of task t
  *in that network* (a task shared by two networks has a weight in each). A perfect model scores
  1; a bad one approaches 0. `top1`/`top5` are means over networks.
* Per-task top-k (`task_top1`/`task_top5`): the unweighted mean over tasks of best_t / best_topk_t.
  The network score is dominated by its few slowest tasks; this one weighs every task alike.
* Pairwise accuracy: over all pairs of programs of the same task with different latencies, the
  fraction the model orders correctly (faster one scored higher). A tie in score counts 1/2.
* Spearman: rank correlation of score with throughput (1/latency) per task, mean over the tasks
  where it is defined (>= 2 programs, not all latencies or all scores equal).

When a FeatureSet carries no network names at all (a user's own database), the per-task score
is the headline: `top1`/`top5` are then `task_top1`/`task_top5` and `per_network` is empty.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np


def _clean_scores(scores) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    return np.where(np.isfinite(s), s, -np.inf)  # a NaN/inf prediction never ranks a program first


def _task_groups(task: np.ndarray) -> dict[int, np.ndarray]:
    """task id -> row indices (in row order)."""
    task = np.asarray(task)
    order = np.argsort(task, kind="stable")
    ids, starts = np.unique(task[order], return_index=True)
    bounds = list(starts[1:]) + [len(order)]
    return {int(t): order[a:b] for t, a, b in zip(ids, starts, bounds)}


def task_best_topk(scores, latency, task, ks: Sequence[int] = (1, 5)) -> dict[int, dict]:
    """Per task present: {"best": min latency, k: min latency among the top-k scored programs}.

    Ties in score are broken by row order (stable), so results are deterministic.
    """
    s = _clean_scores(scores)
    lat = np.asarray(latency, dtype=np.float64)
    out: dict[int, dict] = {}
    for t, rows in _task_groups(task).items():
        order = rows[np.argsort(-s[rows], kind="stable")]
        entry = {"best": float(lat[rows].min())}
        for k in ks:
            entry[k] = float(lat[order[:k]].min())
        out[t] = entry
    return out


def network_tasks(task_networks: Sequence[Sequence[str]], present: Iterable[int]) -> dict[str, list[int]]:
    """network name -> task ids (among `present`) that the network contains; {} without network names."""
    nets: dict[str, list[int]] = {}
    for t in sorted(int(t) for t in present):
        names = task_networks[t] if t < len(task_networks) else []
        for name in names:
            if name:
                nets.setdefault(name, []).append(t)
    return dict(sorted(nets.items()))


def task_weight_in(t: int, net: str, task_weight, network_weights: Sequence[Mapping[str, float]] | None) -> float:
    """Task t's weight in network `net`: `network_weights[t][net]` (its occurrences there) where given,
    else `task_weight[t]` (its occurrences over all networks); 1 where neither is a positive number."""
    if network_weights is not None and t < len(network_weights) and net in network_weights[t]:
        w = float(network_weights[t][net])
    else:
        w = float(task_weight[t]) if t < len(task_weight) else 1.0
    return w if np.isfinite(w) and w > 0 else 1.0


def top_k_scores(
    scores,
    latency,
    task,
    task_weight,
    task_networks: Sequence[Sequence[str]],
    ks: Sequence[int] = (1, 5),
    network_weights: Sequence[Mapping[str, float]] | None = None,
) -> dict[str, dict[str, float]]:
    """{network: {"top1": ..., "top5": ...}} with Tenset's weighted top-k score.

    A task's weight in a network is `network_weights[task][network]` (its occurrences there);
    where that is not given, `task_weight[task]` (its occurrences over all networks).
    """
    per_task = task_best_topk(scores, latency, task, ks)
    result: dict[str, dict[str, float]] = {}
    for net, tids in network_tasks(task_networks, per_task.keys()).items():
        w = np.array([task_weight_in(t, net, task_weight, network_weights) for t in tids])
        best = np.array([per_task[t]["best"] for t in tids])
        result[net] = {}
        for k in ks:
            picked = np.array([per_task[t][k] for t in tids])
            result[net][f"top{k}"] = float(np.sum(w * best) / np.sum(w * picked))
    return result


def task_top_k_means(scores, latency, task, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """{"task_top1": ..., "task_top5": ...}: the unweighted mean over tasks of best / best-of-top-k."""
    per_task = task_best_topk(scores, latency, task, ks)
    return {f"task_top{k}": float(np.mean([e["best"] / e[k] for e in per_task.values()])) if per_task
            else float("nan") for k in ks}


def pairwise_accuracy(scores, latency, task, block: int = 2048) -> float:
    """Fraction of same-task pairs with different latency that the scores order correctly."""
    s, lat = _clean_scores(scores), np.asarray(latency, dtype=np.float64)
    correct, total = 0.0, 0
    for rows in _task_groups(task).values():
        c, t = _ordered_pairs(s[rows], lat[rows], block)
        correct, total = correct + c, total + t
    return correct / total if total else float("nan")


def pairwise_by_task(scores, latency, task, block: int = 2048) -> dict[int, float]:
    """{task: the fraction of its pairs with different latency that the scores order correctly},
    for the tasks with such a pair: each task counted once, whatever its number of programs."""
    s, lat = _clean_scores(scores), np.asarray(latency, dtype=np.float64)
    out = {}
    for t, rows in _task_groups(task).items():
        c, n = _ordered_pairs(s[rows], lat[rows], block)
        if n:
            out[int(t)] = c / n
    return out


def _ordered_pairs(ts: np.ndarray, tl: np.ndarray, block: int) -> tuple[float, int]:
    """(correctly ordered, all) pairs with different latency among one task's programs, each pair
    counted twice ((i, j) and (j, i)); a tie in the scores counts half."""
    correct, total = 0.0, 0
    for a in range(0, len(ts), block):  # blocks of rows bound the (n, n) memory
        dl = np.sign(tl[None, :] - tl[a:a + block, None])  # +1 where j slower than i
        ds = np.sign(ts[a:a + block, None] - ts[None, :])  # +1 where i scored higher
        valid = dl != 0
        agree = np.where(ds == dl, 1.0, np.where(ds == 0, 0.5, 0.0))
        correct += float(agree[valid].sum())
        total += int(valid.sum())
    return correct, total


def _rank(a: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(a, method="average")


def spearman_per_task(scores, latency, task) -> dict[int, float]:
    """task id -> Spearman correlation of score with throughput; tasks where undefined are left out."""
    s = _clean_scores(scores)
    lat = np.asarray(latency, dtype=np.float64)
    out: dict[int, float] = {}
    for t, rows in _task_groups(task).items():
        if len(rows) < 2:
            continue
        rs, rl = _rank(s[rows]), _rank(-lat[rows])  # -inf (a NaN prediction) ranks last
        if np.std(rs) == 0 or np.std(rl) == 0:
            continue
        out[t] = float(np.corrcoef(rs, rl)[0, 1])
    return out


def held_out_networks(fs) -> list[str]:
    """The networks a test split holds out ([] for any other set): only they are complete in it; a
    network that shares a task with them (resnet18 shares convolutions with resnet50) would be
    scored on a fraction of its tasks."""
    split = fs.meta.get("split") or {}
    return list(split.get("test_networks") or []) if split.get("name") == "test" else []


def evaluate(scores, fs, ks: Sequence[int] = (1, 5)) -> dict:
    """All metrics for one FeatureSet (one platform).

    Returns {"top1", "top5" (means over networks), "task_top1", "task_top5" (means over tasks),
    "top_k_over" ("networks", or "tasks" when the set names no network: top1/top5 are then the
    task means), "per_network": {net: {"top1", "top5"}}, "pairwise", "spearman", "n_programs",
    "n_tasks", "n_networks"}.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if len(scores) != len(fs):
        raise ValueError(f"{len(scores)} scores for a FeatureSet of {len(fs)} programs")
    per_network = top_k_scores(scores, fs.latency, fs.task, fs.task_weight, fs.task_networks, ks,
                               network_weights=fs.task_network_weights)
    held_out = held_out_networks(fs)
    if held_out:
        per_network = {n: m for n, m in per_network.items() if n in held_out} or per_network
    task_means = task_top_k_means(scores, fs.latency, fs.task, ks)
    result: dict = {}
    for k in ks:
        vals = [m[f"top{k}"] for m in per_network.values()]
        result[f"top{k}"] = float(np.mean(vals)) if vals else task_means[f"task_top{k}"]
    sp = spearman_per_task(scores, fs.latency, fs.task)
    result.update(
        task_means,
        top_k_over="networks" if per_network else "tasks",
        per_network=per_network,
        pairwise=pairwise_accuracy(scores, fs.latency, fs.task),
        spearman=float(np.mean(list(sp.values()))) if sp else float("nan"),
        n_programs=int(len(fs)),
        n_tasks=int(len(np.unique(fs.task))),
        n_networks=len(per_network),
    )
    return result


MEAN_KEYS = ("top1", "top5", "task_top1", "task_top5", "pairwise", "spearman")


def mean_metrics(results: Sequence[dict], keys: Sequence[str] = MEAN_KEYS) -> dict:
    """Mean of scalar metrics over several evaluations (e.g. one per platform)."""
    out = {}
    for key in keys:
        vals = [r[key] for r in results if key in r and np.isfinite(r[key])]
        out[key] = float(np.mean(vals)) if vals else float("nan")
    return out
