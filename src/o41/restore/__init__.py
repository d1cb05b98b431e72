"""Restoring the chart's etcd from a snapshot (docs/operations.md, "Backups and restore").

Two halves: ``admin`` is ``kubectl o41 admin restore`` (a platform admin's kubeconfig: it
finds the snapshot and drives the StatefulSet), ``member`` is the init container it adds
to every etcd member for the restore (``python -m o41.restore.member``), which restores
the member's data dir with ``etcdutl snapshot restore`` when asked and when empty.
"""
