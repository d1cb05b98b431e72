"""The operator: reconciles Locations and Organizations, and refuses what the rules forbid.

Run it with ``python -m o41.operator`` (one replica: kopf's peering is not leader election).
"""
