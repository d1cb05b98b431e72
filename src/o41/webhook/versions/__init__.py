"""Versions: an organization's artifacts and an artifact's versions newest first
(``listing``), what a reference names (``refs``: an id, ``latest`` or a tag) and tags
(``tags``), on the state store around the rules of ``o41.core.versions``."""
