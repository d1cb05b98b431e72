"""The placement service's HTTP plumbing, below every capability and importing none: the
one error map (``errors``), request ids, request bodies (``bodies``), the settings, the
state store's key (``store``) and TLS serving (``tls``)."""
