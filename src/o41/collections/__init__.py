"""Distributed collections: dict, set, counter, queue, registry, barrier and lock.

Layers, each usable alone:

- :mod:`o41.collections.keys` and :mod:`o41.collections.values`: how keys and values
  become bytes (the client does this; the service only ever sees opaque bytes);
- :mod:`o41.collections.checks`: what a request may ask (names, keys, arguments) and the
  refusals, with their HTTP status;
- :mod:`o41.collections.engine`: the semantics over a :class:`o41.state.Store`, as the
  placement service runs them (async, no HTTP), with :mod:`~o41.collections.combining`
  (strong operations that arrive together share a transaction) and
  :mod:`~o41.collections.replica` (the eventual copy and its buffered writes);
- the synchronous objects ``o41.sky`` hands out are the client's
  (:mod:`o41.client.collections`, over :mod:`o41.client.transport`: HTTP, or this engine
  embedded in the process).

This package is the engine and what both sides share: pods import its keys and values
through ``o41.sky``.
"""
