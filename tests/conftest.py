"""Fixtures of the test bed live in tests/fixtures/, one module a part of it."""

pytest_plugins = [
    "fixtures.stores",
    "fixtures.kube",
    "fixtures.etcd",
    "fixtures.operator",  # last: it imports the ones above
]
