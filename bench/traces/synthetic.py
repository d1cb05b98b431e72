"""A synthetic ML trace: jobs in several clouds and regions writing checkpoints, and the
clusters that read them, in SkyStore's CSV format (bench/traces/trace.py).

A mix is a list of job groups. Each job of a group writes a checkpoint every ``interval``
minutes (sizes drawn around ``size_gb``), keeps the last ``keep`` of them (older ones are
deleted, except every ``milestone``-th, which stays for good), and its readers read each
checkpoint ``times`` times, ``delay`` minutes after it was written (a local evaluator, a
remote evaluation cluster, fine-tuning jobs in other clouds...). Seeded: the same
arguments give the same trace.

    .venv/bin/python bench/traces/synthetic.py --mix train-local --days 14 --out FILE
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.traces.trace import Event, write

GB = 10**9


@dataclass(frozen=True)
class Reader:
    place: str  # cloud:region
    times: int = 1  # reads of each checkpoint
    delay: float = 5.0  # minutes after the write
    share: float = 1.0  # the fraction of checkpoints it reads


@dataclass(frozen=True)
class Group:
    name: str
    place: str  # cloud:region of the writers
    jobs: int = 1
    interval: float = 60.0  # minutes between checkpoints
    size_gb: float = 2.0
    keep: int = 3
    milestone: int = 24  # every n-th checkpoint is never deleted (0: none)
    readers: Sequence[Reader] = field(default_factory=tuple)


MIXES: dict[str, tuple[Group, ...]] = {
    # Training in five regions, each evaluated and resumed where it runs.
    "train-local": (
        Group("east", "aws:us-east-1", jobs=2, readers=(Reader("aws:us-east-1"),)),
        Group("west", "aws:us-west-2", jobs=3, readers=(Reader("aws:us-west-2"),)),
        Group("central", "gcp:us-central1", jobs=2, readers=(Reader("gcp:us-central1"),)),
        Group("europe", "gcp:europe-west4", jobs=3, readers=(Reader("gcp:europe-west4"),)),
        Group(
            "azure",
            "azure:eastus",
            jobs=2,
            size_gb=4.0,
            readers=(Reader("azure:eastus", times=2),),
        ),
    ),
    # Trainers in GCP and Azure; every checkpoint is evaluated twice in AWS, where the
    # organization's fallback is: a location in the trainers' regions keeps the writes
    # local but sends every read across clouds.
    "remote-eval": (
        Group(
            "gcp-train",
            "gcp:us-central1",
            jobs=3,
            readers=(Reader("aws:us-east-1", times=2, delay=10),),
        ),
        Group(
            "azure-train",
            "azure:eastus",
            jobs=2,
            readers=(Reader("aws:us-east-1", times=2, delay=10),),
        ),
        Group("aws-train", "aws:us-west-2", jobs=2, readers=(Reader("aws:us-west-2"),)),
    ),
    # One pretraining run in aws/us-west-2 with big hourly checkpoints, fine-tuned from in
    # GCP and Azure in Europe (each reads the checkpoints many times): single-copy
    # placement by the writer's place cannot put them where most reads are.
    "fan-out": (
        Group(
            "pretrain",
            "aws:us-west-2",
            jobs=1,
            interval=60,
            size_gb=20.0,
            keep=2,
            milestone=12,
            readers=(
                Reader("aws:us-west-2"),
                Reader("gcp:europe-west4", times=4, delay=30),
                Reader("azure:westeurope", times=4, delay=45, share=0.5),
            ),
        ),
        Group("eu-finetune", "gcp:europe-west4", jobs=2, readers=(Reader("gcp:europe-west4"),)),
    ),
}


def generate(groups: Sequence[Group], *, days: float, seed: int = 1) -> list[Event]:
    """The events of ``groups`` over ``days`` days from time 0, sorted by time."""
    rng = random.Random(seed)
    events: list[Event] = []
    end = days * 86400
    for g in groups:
        for job in range(g.jobs):
            events.extend(_job(g, job, end, rng))
    events = [e for e in events if e.time < end]
    events.sort(key=lambda e: (e.time, e.op != "write"))
    return events


def _job(g: Group, job: int, end: float, rng: random.Random) -> Iterator[Event]:
    cloud, region = g.place.split(":", 1)
    t = rng.uniform(0, g.interval * 60)  # jobs do not start in step
    kept: list[str] = []
    step = 0
    while t < end:
        step += 1
        key = f"{g.name}-{job}/step-{step:06d}"
        size = max(1, int(rng.lognormvariate(0, 0.25) * g.size_gb * GB))
        yield Event(t, "write", cloud, region, key, size)
        for r in g.readers:
            if rng.random() >= r.share:
                continue
            rc, rr = r.place.split(":", 1)
            for i in range(r.times):
                when = t + (r.delay + i * g.interval / (r.times + 1)) * 60 * rng.uniform(0.8, 1.2)
                yield Event(when, "read", rc, rr, key, size)
        if g.milestone and step % g.milestone == 0:
            pass  # a milestone is kept for good
        else:
            kept.append(key)
        if len(kept) > g.keep:
            # deleted once the next checkpoint is written and read (after its readers)
            yield Event(t + g.interval * 60 * 0.99, "delete", cloud, region, kept.pop(0), 0)
        t += g.interval * 60 * rng.uniform(0.95, 1.05)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mix", choices=sorted(MIXES), required=True)
    parser.add_argument("--days", type=float, default=14)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, help="the CSV file (default: standard output)")
    args = parser.parse_args(argv)
    events = generate(MIXES[args.mix], days=args.days, seed=args.seed)
    if args.out is None:
        write(events, sys.stdout)
    else:
        with args.out.open("w", newline="") as f:
            write(events, f)
        print(f"{args.out}: {len(events)} events", file=sys.stderr)


if __name__ == "__main__":
    main()
