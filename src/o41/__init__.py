"""O41 Artifacts: storage placement and shared state for ML jobs on Kubernetes.

The package root stays light on purpose: pods import it at start-up, so nothing here pulls
in the cloud SDKs, kopf or aiohttp. ``from o41 import sky`` imports the ``o41.sky`` module;
``from o41 import artifacts`` the SDK of artifact versions (``o41.artifacts``: standard
library only, like the client under it).
"""

__version__ = "0.1.0"
