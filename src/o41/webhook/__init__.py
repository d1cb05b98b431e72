"""The placement service (the design card's "webhook"): what pods call.

``python -m o41.webhook`` serves begin/commit/read of artifact versions, usage, and the
distributed collections, over aiohttp. It scales out: its state lives in the state store.
"""
