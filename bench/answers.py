"""What building the begin's answer costs, per way of describing it (issue 38, point 2).

The service's answers are TypedDicts (``o41.webhook.writes.answers``): a dict literal at
runtime. Against it, the same answer as a pydantic ``BaseModel`` (validated, then
``model_dump``), built with ``model_construct`` (not validated), or dumped by pydantic's
own encoder (``model_dump_json``, not the service's ``json.dumps``); each also with the
``json.dumps`` that ``web.json_response`` does. The best of alternated rounds, microseconds
an answer.

    .venv/bin/python bench/answers.py [--number 100000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from pydantic import BaseModel, ConfigDict, Field  # noqa: E402

from o41.core.placement import Rule  # noqa: E402
from o41.webhook.writes.answers import BeginOut  # noqa: E402

# a begin's answer as the S3 stand-in signs it: one PUT, its Content-Length
URL = (
    "http://127.0.0.1:9000/bucket/ckpt/0193a1b2c3d4-9f8e7d6c5b4a3f2e?X-Amz-Algorithm="
    "AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&"
    "X-Amz-Date=20260101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=content-length%3Bhost"
    "&X-Amz-Signature=" + "a" * 64
)
HEADERS = {"Content-Length": "1024"}


class Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class SignedModel(Out):
    method: str
    url: str
    headers: dict[str, str]


class UploadModel(Out):
    single: SignedModel | None = None


class BeginModel(Out):
    version: str
    location: str
    cloud: str
    region: str
    rule: Literal["region", "cloud", "fallback"]
    warning: str | None
    upload: UploadModel
    expires_in: int = Field(alias="expiresIn")


def typed_dict() -> BeginOut:
    return {
        "version": "0193a1b2c3d4-9f8e7d6c5b4a3f2e",
        "location": "east",
        "cloud": "aws",
        "region": "us-east-1",
        "rule": Rule.REGION,
        "warning": None,
        "upload": {"single": {"method": "PUT", "url": URL, "headers": dict(HEADERS)}},
        "expiresIn": 3600,
    }


def model() -> BeginModel:
    return BeginModel(
        version="0193a1b2c3d4-9f8e7d6c5b4a3f2e",
        location="east",
        cloud="aws",
        region="us-east-1",
        rule="region",
        warning=None,
        upload=UploadModel(single=SignedModel(method="PUT", url=URL, headers=dict(HEADERS))),
        expiresIn=3600,
    )


def constructed() -> BeginModel:
    return BeginModel.model_construct(
        version="0193a1b2c3d4-9f8e7d6c5b4a3f2e",
        location="east",
        cloud="aws",
        region="us-east-1",
        rule="region",
        warning=None,
        upload=UploadModel.model_construct(
            single=SignedModel.model_construct(method="PUT", url=URL, headers=dict(HEADERS))
        ),
        expires_in=3600,
    )


def dumped(build: Callable[[], BeginModel]) -> Callable[[], dict[str, Any]]:
    return lambda: build().model_dump(by_alias=True, exclude_unset=True)


def as_json(build: Callable[[], Any]) -> Callable[[], str]:
    """``build``, then the service's encoder (``web.json_response``'s ``json.dumps``)."""
    return lambda: json.dumps(build())


WAYS: dict[str, Callable[[], Any]] = {
    "TypedDict (a dict literal): the service's": typed_dict,
    "BaseModel(...) + model_dump": dumped(model),
    "model_construct(...) + model_dump": dumped(constructed),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    served = json.dumps(typed_dict())
    for way in WAYS.values():
        assert json.dumps(way()) == served, "every way answers the same bytes"
    runs: dict[str, Callable[[], Any]] = {}
    for label, way in WAYS.items():
        runs[label] = way
        runs[f"{label} + json.dumps"] = as_json(way)
    runs["BaseModel(...) + model_dump_json (its encoder)"] = lambda: model().model_dump_json(
        by_alias=True
    )
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(args.repeat):  # alternated: a busy moment costs every way alike
        for label, run in runs.items():
            best[label] = min(best[label], timeit.timeit(run, number=args.number))
    print(
        f"python {sys.version.split()[0]}, best of {args.repeat} alternated rounds of "
        f"{args.number}, microseconds an answer"
    )
    for label, seconds in best.items():
        print(f"{label:<58} {seconds / args.number * 1e6:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
