"""Checkpoints: sharded DCP saves to the run's storage, resume, SIGTERM, export.

Layout in storage (Ray Train's run folder; every rank's files merge into one folder)::

    <storage_path>/<run_name>/checkpoint_00000050/{.metadata, __0_0.distcp, __1_0.distcp, ...,
                                                   model_config.json, COMPLETE.json}
    <storage_path>/<run_name>/hf/{config.json, model.safetensors, tokenizer files}   (export)

A checkpoint counts only when ``COMPLETE.json`` (written last by rank 0, listing every file with
size and sha256) matches the files: :func:`is_complete` (local) / ``markers.remote_problem``.

DRIVER (before ``trainer.fit``)::

    from training.checkpointing import plan_resume, ExistingRunError, forward_driver_sigterm
    lease = Lease(run=run_uri, attempt=uuid4().hex, holder="Ray job ... on <host> (pid N)")
    lease.acquire()                                      # LeaseHeld: another live trainer, one line, exit 2
    plan = plan_resume(storage_path=cfg.checkpoint.storage_path, run_name=cfg.run_name,
                       on_existing_run=cfg.checkpoint.on_existing_run,
                       max_steps=cfg.train.max_steps, world_size=cfg.parallel.num_workers,
                       source=cfg.source)                # ExistingRunError: one line, exit 2
    loop_config["resume_from"] = plan.resume_from            # "" = fresh start
    flag = forward_driver_sigterm(cfg.run_name, cfg.checkpoint.sigterm_grace_seconds)  # after ray.init
    RunConfig(name=cfg.run_name, storage_path=cfg.checkpoint.storage_path,
              failure_config=FailureConfig(max_failures=cfg.checkpoint.max_failures),
              checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last))
    result = trainer.fit()
    # the export (cfg.checkpoint.export_hf) runs on the workers at the end: export_model

WORKER (in the train function, after ``parallelize`` and building optimizer/scheduler/stream)::

    from training.checkpointing import (CheckpointManager, TrainerState, restore,
                                        install_worker_handler, local_checkpoint_root)
    install_worker_handler(cfg.checkpoint.sigterm_grace_seconds, run_name=cfg.run_name)
    trainer = TrainerState(data=train_stream, scheduler=scheduler)  # stream: state_dict/load_state_dict
    restore(model=model, optimizer=optimizer, trainer=trainer, local_root=local_checkpoint_root(),
            resume_from=config.get("resume_from", ""), device=device)  # every rank; sets trainer.step
    ckpt = CheckpointManager(model=model, optimizer=optimizer, trainer=trainer,
                             local_root=local_checkpoint_root(), run_name=cfg.run_name,
                             every_n_steps=cfg.checkpoint.every_n_steps, device=device,
                             model_config=unwrapped_model.config.to_dict())
    for step in range(trainer.step + 1, max_steps + 1):
        ... one optimizer step ...
        trainer.step = step; trainer.tokens_seen += tokens_this_step
        if ckpt.step_end(step, {"loss": loss, ...}, max_steps=max_steps):   # every rank, every step
            break                                   # SIGTERM: a complete final checkpoint was written
    ckpt.finish(trainer.step, metrics)               # no-op save if step already saved; waits
    # ckpt.stopped_by_signal: the SIGTERM checkpoint's metrics also carry stopped_by_signal=True
    # (Ray's Result.metrics), so the driver can say "stopped at step s; resubmit to resume"
    # ckpt.timings -> [SaveTiming(step, stall_s, write_s)]: how long each checkpoint held the loop

Notes for the loop:
- ``CheckpointManager(...)`` creates a gloo process group: construct it on every rank at the
  same point. It calls ``ray.train.report(metrics, checkpoint=..., checkpoint_upload_mode=ASYNC)``
  itself; the loop's metric-only reports are separate calls (all ranks, same cadence).
- the stream must be built BEFORE ``restore`` so its position can be loaded into it; RNG states
  are restored last, so anything seeded after restore continues the same random sequence.
- tests and benchmarks outside Ray pass ``report=markers.copy_report(run_uri)``.
"""
from training.checkpointing.lease import Lease, LeaseHeld, keep_renewed
from training.checkpointing.export import export_hf, export_latest, export_local, export_model
from training.checkpointing.manager import CheckpointManager, SaveTiming, checkpoint_dir_name, local_checkpoint_root
from training.checkpointing.restore import ExistingRunError, ResumePlan, plan_resume, restore
from training.checkpointing.signals import (forward_driver_sigterm, install_worker_handler, request_stop,
                                            stop_driver_after, stop_requested, stop_was_requested,
                                            time_limit_reached)
from training.checkpointing.state import TrainerState
from training.checkpointing.markers import (MARKER_NAME, completeness_problem, copy_report, find_latest_complete,
                                            is_complete, list_checkpoints)

__all__ = [
    "CheckpointManager", "ExistingRunError", "Lease", "LeaseHeld", "keep_renewed", "MARKER_NAME", "ResumePlan", "SaveTiming", "TrainerState",
    "checkpoint_dir_name", "completeness_problem", "copy_report", "export_hf", "export_latest",
    "export_local", "export_model", "find_latest_complete", "forward_driver_sigterm", "install_worker_handler",
    "is_complete", "list_checkpoints", "local_checkpoint_root", "plan_resume", "request_stop", "restore",
    "stop_driver_after", "stop_requested", "stop_was_requested", "time_limit_reached",
]
