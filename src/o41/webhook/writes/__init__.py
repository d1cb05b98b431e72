"""The write path: a pod begins a version, uploads it straight to the chosen bucket,
commits it, and reads it back from anywhere.

``routes`` parses and answers; ``begin``, ``pending``, ``commit`` and ``read`` orchestrate
the state store, the bucket and the counters around the rules of ``o41.core``. A begun
write is a pending record under a shared lease (put in batches: ``batching``); the
``sweeper`` cleans up after those that expire, and ``backfill`` indexes the versions
committed before the index existed.
"""
