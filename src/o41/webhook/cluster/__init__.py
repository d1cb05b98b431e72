"""What the service knows of the cluster, kept by a watch (``view``: Locations,
Organizations, TrustDomains, the operator's records, the service tokens' records), and
who may use an organization (``scope``)."""
