"""What the operator, the placement service and ``kubectl o41`` share of the cluster: the
custom resources' models (``api``) and their CRDs (``crd``), the one Location model
(``locations``), the operator's records of Locations and TrustDomains, the fetch of an
issuer's keys, and the service tokens' key and records."""
