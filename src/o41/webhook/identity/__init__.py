"""Who is calling: this cluster's pods by TokenReview (``auth``), other clusters' pods by
their issuer's keys (``tokens``, fed by ``trusted``: the TrustDomains and the operator's
records of their keys), VMs by the service's own tokens (``service_tokens``). The tenant
a request acts as comes from here, never from the request."""
