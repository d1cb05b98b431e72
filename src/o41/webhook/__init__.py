"""The placement service (the design card's "webhook"): what pods call.

``python -m o41.webhook`` serves begin/commit/read of artifact versions, usage, and the
distributed collections, over aiohttp. It scales out: its state lives in the state store.

One package per capability, each owning its routes and the ``web.AppKey`` of what it
holds: ``writes`` (begin, commit, read; pending writes and their sweeper), ``versions``
(listings, ``latest``, tags), ``directories``, ``retention``, ``usage`` (counters, the
usage page, prices, Location counts) and ``collections``. Below them: ``records`` (the
state store's keys), ``buckets`` and ``http`` (auth, errors, request ids, telemetry,
settings, the view of the cluster). ``app`` puts them together; ``openapi`` documents
them. pyproject.toml's import-linter contracts keep it that way.
"""
