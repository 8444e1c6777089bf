"""The training job that runs inside the AWS Ray Train DLC unmodified (only torch, ray,
transformers, pyarrow, numpy, safetensors and the standard library at run time).

Its rooms, lowest first (each imports only those below it; tests/test_layers.py ``TRAINING_ROOMS``):
the shared vocabulary (``contract``, ``config_checks``); where files live
(``storage/``), what a model is (``model_config``) and its plug-ins (``model_transforms/``); the
job config (``config_sections``, ``config``); the inputs and the model (``data/``, ``model``,
``flops``, ``verdict``, ``mlflow_rest``); what a step is built from (``checkpointing/``,
``evaluation``, ``parallel``, ``optim``, ``metrics``, ``transport``); what a run leaves
(``metric_sinks/``, ``run_record``, ``run_facts``, ``run_logs``); the worker's ``loop``, the
driver (``launch``), the ``netcheck/`` job kind and the entry point (``__main__``).
"""
