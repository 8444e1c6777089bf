"""The local services (moto's S3 server, a local Ray head) live with the CLI's local backend,
``raytrain_eks/local_services.py``: ``raytrain-eks submit --local`` starts them too. This name
stays for the demo's callers."""
from raytrain_eks.local_services import (  # noqa: F401
    LOOPBACK, PICKED_PORTS, RayHead, S3Server, free_port, processes_matching, ray_head, s3_server)
