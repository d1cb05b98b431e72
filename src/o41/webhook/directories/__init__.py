"""Directory versions: many files written as one version, in one location, readable only
whole (``write``), then listed and read file by file (``read``). The rules (paths,
bounds, the manifest) are ``o41.core.directories``."""
