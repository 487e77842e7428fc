"""LLDS for TRL's `GRPOTrainer`: one import, one argument.

    from llds_trl import LLDSGRPOTrainer

    trainer = LLDSGRPOTrainer(model=..., reward_funcs=..., train_dataset=...,
                              args=GRPOConfig(..., num_iterations=2), llds_lambda=0.1)

The LLDS term, lambda * max(0, old - new) on the generated tokens of responses with
advantage >= 0 whose likelihood fell, is computed by the same pure function as the nano
trainer (`nano.llds.llds_term`), and the likelihood-displacement metrics are logged under
the names the curves tool reads (`python -m curves trainer_state.json`). Needs trl
(`pip install -r requirements-trl.txt`); nothing else in the studio imports it.
"""

from llds_trl.trainer import LLDSGRPOTrainer

__all__ = ["LLDSGRPOTrainer"]
