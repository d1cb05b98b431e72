"""The local test bed: a real control plane, etcd and cloud storage stand-ins as processes.

Development and test tooling, shipped in the package the way ``kopf.testing`` is, so that
``make dev-up``, the pytest fixtures and ``make demo`` share one implementation. Every
server listens on 127.0.0.1 and every process started here is stopped by its pid.
"""
