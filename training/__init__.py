"""The training job that runs inside the AWS Ray Train DLC unmodified (only torch, ray,
transformers, pyarrow, numpy, safetensors and the standard library at run time).

Its rooms, lowest first (each imports only those below it; tests/test_layers.py ``TRAINING_ROOMS``):
the shared vocabulary (``contract``, ``config_checks``); where files live (``storage/``), what a
model is (``model_config``), its plug-ins (``model_transforms/``) and a step's loss
(``objectives/``); the job config (``config_sections``, ``config``); the inputs, the model and
what judges them (``data/``, ``model``, ``flops``, ``verdict``, ``mlflow_rest``, ``incidents``);
what a step is built from (``checkpointing/``, ``evaluation``, ``parallel``, ``optim``,
``metrics``, ``transport``, ``health_gate``); what a run leaves and what watches it
(``metric_sinks/``, ``run_logs``, ``run_record``, ``run_facts``, ``watchdog``); the worker's
``loop``, the driver (``launch``), the ``netcheck/`` job kind and the entry point (``__main__``).
"""
