"""Fixtures of the test bed live in tests/fixtures/, one module a part of it."""

import os

# Every test reads from the buckets, as before issue 39 (a test that rewrites an object
# in a bucket and reads it again must not be served the copy of an earlier read), and
# prints no progress bars; the cache's and progress's own tests turn them on (a cache in
# the test's tmp path, never the user's ~/.cache). Subprocesses inherit both.
os.environ["O41_ARTIFACTS_CACHE"] = "off"
os.environ["O41_ARTIFACTS_PROGRESS"] = "0"
# A test that stops a service expects its clients to fail soon, not to wait out a
# training job's few minutes of retries; the retries' own tests set their deadline.
os.environ.setdefault("O41_ARTIFACTS_RETRY_DEADLINE", "10")

pytest_plugins = [
    "fixtures.stores",
    "fixtures.kube",
    "fixtures.etcd",
    "fixtures.operator",  # after the ones it imports
    "fixtures.placement",
    "fixtures.world",
    "fixtures.node",
]
