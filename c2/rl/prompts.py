"""The RL stage's prompts: task sources in ledger order (generated tasks or a directory), the
single-epoch `Ledger` (each prompt trained once; the consumed ids go into every checkpoint), and
the steps they give (c2/rl/trainer.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
from pathlib import Path

import ml_collections

from c2 import distributed
from c2.envs.tasks import Task, load_tasks
from c2.train.config import ConfigError

log = logging.getLogger(__name__)


def load_task_source(spec: str, split: str, n: int, seed: int, workdir: Path) -> list[Task]:
    """Tasks in ledger order, independent of how many a run needs (so a resumed run with more
    steps keeps the order): "functions" and "notes" generate tasks 0..n-1 of (seed, split) into
    workdir/tasks/<split> (each task is its own seeded draw: index order is the order); a
    directory gives all its tasks in a seeded hash order."""
    kind, _, rest = spec.partition(":")
    if kind == "functions":
        from c2.envs.functions import LEVELS, generate_function_tasks

        level = rest or "full"
        if level not in LEVELS:
            raise ConfigError(f"config.rl.tasks={spec!r}: level {level!r} is not one of {LEVELS}")
        want = {"n": n, "seed": seed, "level": level}
        make = lambda out: generate_function_tasks(out, n, seed, split, level)  # noqa: E731
        return _generated(workdir / "tasks" / split, want, make)
    if kind == "notes":  # notes[:full|fixed|keyed][:files[:note_chars]]
        from c2.envs.notes import generate_notes_tasks, parse_spec

        try:
            level, files, chars = parse_spec(spec)
        except ValueError as e:
            raise ConfigError(f"config.rl.tasks: {e}") from None
        want = {"n": n, "seed": seed, "files": files, "note_chars": chars, "level": level}
        make = lambda out: generate_notes_tasks(out, n, seed, split, files, chars, level)  # noqa: E731
        return _generated(workdir / "tasks" / split, want, make)
    path = Path(spec)
    if not path.is_dir():
        raise ConfigError(
            f"config.rl.tasks={spec!r}: expected 'functions[:full|basic|wide]', "
            "'notes[:full|fixed|keyed][:files[:note_chars]]' or a task directory"
        )
    tasks = load_tasks(path)
    key = lambda t: hashlib.sha1(f"{seed}:{t.task_id}".encode()).hexdigest()  # noqa: E731
    return sorted(tasks, key=key)


def _generated(out: Path, want: dict, make) -> list[Task]:
    """Generated tasks in `out`, made again unless done.json says they are these (`want`)."""
    done = out / "done.json"
    if done.is_file() and json.loads(done.read_text()) == want:
        return load_tasks(out)
    if out.exists():  # another size, or half-written by a crash: make it again
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tasks = make(out)
    done.write_text(json.dumps(want))
    return tasks


@dataclasses.dataclass
class Ledger:
    """Single-epoch prompt order: a seeded permutation; `consumed` ids are persisted."""

    order: list[str]
    consumed: list[str]

    def take(self, n: int) -> list[str]:
        done = set(self.consumed)
        fresh = [p for p in self.order if p not in done][:n]
        return fresh

    def mark(self, ids) -> None:
        self.consumed.extend(ids)


def load_prompts(
    config: ml_collections.ConfigDict, workdir: Path
) -> tuple[int, list[Task], list[Task]]:
    """(steps, training tasks in ledger order, held-out tasks): process 0 loads them; the steps
    (fewer when the tasks run out: single epoch) and any problem reach every process."""
    r = config.rl
    steps = config.train.steps
    n_train = steps * r.prompts_per_step
    train_tasks, heldout, problem = [], [], None
    if distributed.is_primary():
        try:
            train_tasks = load_task_source(r.tasks, "train", n_train, r.task_seed, workdir)
            heldout = load_task_source(
                r.heldout_tasks, "eval", r.eval.tasks, r.task_seed + 1, workdir
            )
        except ConfigError as e:
            problem = str(e)
        heldout = heldout[: r.eval.tasks]
        if problem is None and len(train_tasks) < n_train:
            steps = len(train_tasks) // r.prompts_per_step
            log.warning("single epoch: %d prompts give %d steps", len(train_tasks), steps)
            if steps < 1:
                problem = (
                    f"config.rl.tasks: {len(train_tasks)} prompts; need at least "
                    f"prompts_per_step={r.prompts_per_step}"
                )
    steps, problem = distributed.share((steps, problem))
    if problem is not None:
        raise ConfigError(problem)
    return steps, train_tasks, heldout
