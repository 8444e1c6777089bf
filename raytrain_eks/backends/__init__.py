"""Where ``submit`` runs a job: EKS through ``kubectl`` (``eks.py``, with Kueue's queue read from
its Workload in ``kueue_queue.py``), or a Ray head and moto's S3 server on 127.0.0.1
(``local.py``; ``local_services.py``, with finding and stopping what they started)."""
