"""Fixtures of the test bed live in tests/fixtures/, one module a part of it."""

pytest_plugins = [
    "fixtures.stores",
    "fixtures.kube",
    "fixtures.etcd",
    "fixtures.operator",  # after the ones it imports
    "fixtures.placement",
    "fixtures.world",
    "fixtures.node",
]
