"""Keys: one canonical text per key, the same on every node and every Python version.

Map keys, set members and registry names route operations, so equal keys must give equal
bytes everywhere: ``hash()`` is salted per process and pickle output varies between
versions, so neither will do. The encoding is a tag character and a body:

======================  ==========================================================
``None``                ``N``
``True`` / ``False``    ``T`` / ``F``
``int``                 ``i`` + decimal digits (``i-12``)
``float``               ``d`` + ``repr`` (``d0.5``, ``dinf``); ``-0.0`` is ``0.0``; NaN refused
``str``                 ``s`` + the text itself
``bytes``               ``b`` + URL-safe base64
``tuple``               ``(`` + a JSON array of the elements' encodings
``frozenset``           ``{`` + a JSON array of the elements' encodings, sorted
======================  ==========================================================

Keys are compared by type and value: ``1``, ``1.0`` and ``True`` are three different
keys (a Python dict would merge them). Anything else, hashable or not, is refused with a
:class:`TypeError` that says what is accepted.

Limits: :data:`MAX_KEY` bytes encoded, and tuples and frozensets nested at most
:data:`MAX_KEY_DEPTH` levels (each level escapes the one inside it, so 4096 bytes hold 10
levels at most anyway). Both are checked before a text is decoded: the arrays inside a
text must be flat arrays of strings, measured before they are parsed, so that a text of
4,000 nested brackets is refused, not recursed into.
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

from o41.core.jsonlimits import TooDeep, check_depth

MAX_KEY = 4096  # bytes of the encoded key (UTF-8)
MAX_KEY_DEPTH = 10  # tuples and frozensets inside each other (the most 4096 bytes hold)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,126}")
NAME_RULE = "1-127 characters: letters, digits, '.', '_' or '-', starting with a letter or digit"

ACCEPTED = "None, bool, int, float, str, bytes, and tuples or frozensets of those"


def encode_key(key: object) -> str:
    """The canonical text of ``key``; :class:`TypeError` for a type that cannot be a key,
    :class:`ValueError` for a NaN or a key over :data:`MAX_KEY` bytes."""
    text = _encode(key, 0)
    size = len(text.encode())
    if size > MAX_KEY:
        raise ValueError(f"key too large: {size} bytes encoded, the limit is {MAX_KEY}")
    return text


def _encode(key: object, depth: int) -> str:
    if key is None:
        return "N"
    if key is True:
        return "T"
    if key is False:
        return "F"
    kind = type(key)
    if kind is str:
        return "s" + key  # type: ignore[operator]
    if kind is int:
        return f"i{key}"
    if kind is float:
        assert isinstance(key, float)
        if math.isnan(key):
            raise ValueError("NaN cannot be a key: it is not equal to itself")
        return "d" + repr(key + 0.0)  # -0.0 + 0.0 == 0.0
    if kind is bytes:
        assert isinstance(key, bytes)
        return "b" + base64.urlsafe_b64encode(key).decode()
    if kind is tuple or kind is frozenset:
        assert isinstance(key, tuple | frozenset)
        if depth >= MAX_KEY_DEPTH:
            raise ValueError(
                f"key nested too deep: tuples and frozensets inside each other at most "
                f"{MAX_KEY_DEPTH} levels"
            )
        texts = [_encode(k, depth + 1) for k in key]
        return "(" + _array(texts) if kind is tuple else "{" + _array(sorted(texts))
    try:
        hash(key)
    except TypeError:
        raise TypeError(
            f"unhashable key of type {kind.__name__!r}: keys must be hashable ({ACCEPTED})"
        ) from None
    raise TypeError(
        f"keys of type {kind.__name__!r} have no stable encoding across nodes; use {ACCEPTED}"
    )


def _array(items: list[str]) -> str:
    return json.dumps(items, ensure_ascii=False, separators=(",", ":"))


def decode_key(text: str) -> Any:
    """The key whose canonical text is ``text``; :class:`ValueError` if it is not one."""
    if len(text) > MAX_KEY:
        raise ValueError(f"key too large: the limit is {MAX_KEY} bytes encoded")
    try:
        return _decode(text, 0)
    except (ValueError, TypeError, IndexError) as e:
        raise ValueError(f"not an encoded key: {text[:80]!r} ({e})") from None


def _decode(text: str, depth: int) -> Any:
    tag, body = text[0], text[1:]
    if tag == "s":
        return body
    if tag == "i":
        return int(body)
    if tag == "N" and not body:
        return None
    if tag == "T" and not body:
        return True
    if tag == "F" and not body:
        return False
    if tag == "d":
        value = float(body)
        if math.isnan(value):
            raise ValueError("NaN")
        return value
    if tag == "b":
        return base64.urlsafe_b64decode(body.encode())
    if tag in "({":
        if depth >= MAX_KEY_DEPTH:
            raise TooDeep(f"nested deeper than {MAX_KEY_DEPTH} levels")
        check_depth(body, 1, "a key's array", max_containers=1)  # a flat array of texts
        items = json.loads(body)
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError("not an array of keys")
        decoded = [_decode(i, depth + 1) for i in items]
        return tuple(decoded) if tag == "(" else frozenset(decoded)
    raise ValueError(f"unknown tag {tag!r}")


def check_encoded(text: object) -> str:
    """``text`` if it is a well-formed encoded key within the size limit (the service's
    check: it never trusts a client to have encoded well)."""
    if not isinstance(text, str) or not text:
        raise ValueError("a key must be a non-empty encoded key string")
    if len(text) > MAX_KEY or len(text.encode()) > MAX_KEY:
        raise ValueError(f"key too large: the limit is {MAX_KEY} bytes encoded")
    if _encode(decode_key(text), 0) != text:
        raise ValueError(f"not the canonical encoding of its key: {text[:80]!r}")
    return text


def check_name(what: str, name: object) -> str:
    """``name`` if it can name a collection or a compute (it goes into keys and URLs)."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"bad {what} name {str(name)[:80]!r}: {NAME_RULE}")
    return name
