"""The placement service's HTTP plumbing, below every capability and importing none:
authentication (``auth``), the one error map (``errors``), request ids, metrics and
telemetry, settings, the state store's key (``store``), the view of the cluster
(``view``), who may use an organization (``scope``) and request bodies (``bodies``)."""
