"""A worked example: TRL's GRPOTrainer, with and without LLDS, on the nano search agent,
then the curves tool on the two logs.

    python -m llds_trl.example --out trl-runs/grpo --llds-lambda 0
    python -m llds_trl.example --out trl-runs/llds --llds-lambda 0.1
    python -m curves trl-runs/grpo trl-runs/llds --out trl.html

The model is the nano agent shipped in assets/nano-agent (4.2M parameters: a few seconds a
step on a CPU); the prompts are Search-R1 prompts of the shipped vitalqa questions; the
reward is a toy one, a tidy turn: the share of the completion that comes before the end of
its first action (`</search>` or `</answer>`). TRL generates to the token budget with no stop
strings, and the nano agent writes on after its action, so the reward has room to move. Each
generation batch is used for two updates (`num_iterations=2`), as verl's PPO mini-batches
reuse a batch: only then is there an "old" likelihood for LLDS to hold up.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agent.models import NANO, ROOT, resolve
from agent.protocol import build_prompt

QUESTIONS = ROOT / "assets" / "vitalqa" / "test.jsonl"


def tidy_turn(completions: list[str], **_) -> list[float]:
    """The toy reward: the share of the text up to the end of the first action (0 when the
    completion holds no whole action)."""
    def share(text: str) -> float:
        ends = [text.find(tag) + len(tag) for tag in ("</search>", "</answer>") if tag in text]
        return min(ends) / len(text) if ends and text else 0.0
    return [share(c) for c in completions]


def make_trainer(out: Path, llds_lambda: float, steps: int = 20, questions: int = 64,
                 model: str = NANO, seed: int = 0, trainer_class=None):
    """The example's trainer (`trainer_class`: LLDSGRPOTrainer, or TRL's own GRPOTrainer,
    which takes no `llds_lambda`, for the benchmark's plain run)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from llds_trl import LLDSGRPOTrainer

    model = resolve(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    lines = QUESTIONS.read_text(encoding="utf-8").splitlines()[:questions]
    prompts = [build_prompt(json.loads(line)["question"], tokenizer) for line in lines]
    config = GRPOConfig(
        output_dir=str(out), max_steps=steps, learning_rate=3e-4, seed=seed,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=48,
        num_iterations=2, beta=0.001, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, temperature=1.0, dataloader_num_workers=0)
    extra = {} if trainer_class is not None else {"llds_lambda": llds_lambda}
    return (trainer_class or LLDSGRPOTrainer)(
        model=model, reward_funcs=tidy_turn, args=config, processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]), **extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llds_trl.example",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the run's folder")
    parser.add_argument("--llds-lambda", type=float, default=0.1, help="0: plain GRPO")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--model", default=NANO, help="a registry id or a local directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    trainer = make_trainer(args.out, args.llds_lambda, args.steps, args.questions,
                           args.model, args.seed)
    trainer.train()
    trainer.state.save_to_json(str(args.out / "trainer_state.json"))
    print(f"wrote {args.out / 'trainer_state.json'} ({args.steps} steps, LLDS lambda "
          f"{args.llds_lambda})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
