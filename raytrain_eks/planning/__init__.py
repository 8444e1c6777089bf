"""A job against the environment before any spend (``preflight.py``): its memory
(``memory_estimate.py``, checked against ``measured_plan.py``'s published plans), its step time
(``step_model.py`` on ``gpu_figures.py``'s rates), where its pods land (``fit.py`` over
``fit_inputs.py``) and the plan: the fastest that fits, or the change that makes a plan fit (``plan_search.py``)."""
