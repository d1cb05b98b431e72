"""The distributed collections over HTTP, one operation per request or many over a WebSocket.

``POST /v1/collections/{compute}/{kind}/{name}/{op}``: the body is a JSON object of the
operation's arguments (values base64, keys in their canonical text: see
:mod:`o41.collections.keys`); the answer is a JSON object.

``GET /v1/collections`` upgraded to a WebSocket carries the same operations without
HTTP's cost per request (half the service's CPU per operation): each text message is
``{"id", "compute", "kind", "name", "op", "args"}`` and is answered, in order, by
``{"id", "status": 200, "result"}`` or ``{"id", "status", "error"}`` with the status the
POST would have had. A message with ``"quiet": true`` is answered only when refused (a
lock's early release: the client does not wait for it, and an answer would only wake it
up); a client knows the service takes quiet messages when it chose the subprotocol
:data:`PROTOCOL` at the upgrade (a WebSocket ping is answered after every message before
it, so a client that must know reads up to its pong). The token is checked at the
upgrade and again every :data:`RECHECK` seconds; a client hands over a rotated token in
band (``{"auth": "<token>"}``, taken when it names the same caller). The service closes
a WebSocket only between operations, with :data:`RECONNECT` (idle, token no longer
accepted, shutting down): a close in place of an answer means the operation was not
run, and the client sends it again on a new connection.

The namespace is the authenticated caller's (its ServiceAccount token), never the
request's: two namespaces with the same compute and collection names share nothing.

``GET /v1/collections/usage``: the caller's namespace's bytes and entries, counted now,
and the limits (:mod:`o41.webhook.collections.quota`).

Refusals: 400 bad name, key or argument, or a body nested too deep; 409 a barrier's
parties differ; 413 a value over the limit; 429 the namespace's quota (what to do) or the
token's rate (with ``Retry-After``; over the WebSocket ``retry_after``); 503 etcd cannot
answer now (a write that failed this way may or may not have been applied) or too many
eventual writes wait for etcd. Waits (barrier, lock) are bounded
per request (``max_wait``, 25 s); the client comes back for more.

``python -m o41.webhook.collections`` serves the collections alone (tests, benchmarks),
without authentication: everyone is ``--namespace``.
"""
