"""The JSON of the collections' WebSocket messages, on both sides: orjson where it can,
the standard library where it cannot
(``o41.core.jsontext``, which the placement service's answers and records use too).

A message is encoded and decoded once on each side of every operation; orjson does that
in a tenth of the time (an operation's message 0.3 us against 4.8, an answer 0.5 against
3.4), which took 20-50 us off an eventual get's round trip (bench/sky_hop.py, stop 27). What
orjson refuses (an integer past 64 bits, text that is not UTF-8 such as a lone surrogate;
reading: NaN, a number past 64 bits) goes to the standard library, so those messages mean
what they meant before and every refusal reads as before. One difference is left: orjson
writes a float NaN as null where the standard library wrote NaN; in this protocol only a
timeout is a float, and the service refuses null there as it refused NaN (400, "a number
of seconds >= 0"). Without orjson installed, the standard library does it all.
"""

from __future__ import annotations

from o41.core.jsontext import FAST, dumps, loads

PROTOCOL = "o41.collections.v2"  # the WebSocket subprotocol: v1 and quiet messages

__all__ = ["FAST", "PROTOCOL", "dumps", "loads"]
