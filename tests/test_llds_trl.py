"""LLDS for TRL users (llds_trl): a real TRL GRPOTrainer run on CPU with the LLDS term and
without, the term checked against the nano trainer's on the same tensors, the logged
metrics, and the curves tool reading the run's trainer_state.json."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from nano.llds import LossConfig, llds_term

pytestmark = pytest.mark.slow

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def reward_by_length(completions, **_):
    """A toy reward with spread: longer completions score higher."""
    return [float(len(c)) / 100 for c in completions]


def train(model_dir, out, llds_lambda: float, steps: int = 3, report_to="none"):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from llds_trl import LLDSGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [f"Question: who wrote book {i}?\n" for i in range(16)]
    config = GRPOConfig(output_dir=str(out), max_steps=steps, learning_rate=1e-2, seed=0,
                        per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=8, num_iterations=2, beta=0.001,
                        logging_steps=1, save_strategy="no", report_to=report_to, use_cpu=True,
                        dataloader_num_workers=0)
    trainer = LLDSGRPOTrainer(model=str(model_dir), reward_funcs=reward_by_length,
                              args=config, processing_class=tokenizer,
                              train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
                              llds_lambda=llds_lambda)
    trainer.train()
    trainer.state.save_to_json(str(out / "trainer_state.json"))
    return trainer


@pytest.fixture(scope="module")
def runs(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("trl")
    patch = pytest.MonkeyPatch()
    patch.setenv("WANDB_MODE", "offline")  # W&B's own offline run folder, no account
    patch.setenv("WANDB_DIR", str(root))
    patch.setenv("WANDB_SILENT", "true")
    patch.setenv("MLFLOW_TRACKING_URI", (root / "mlruns").as_uri())
    patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the store the curves tool reads
    try:
        grpo = train(tiny_models["random"], root / "trl-grpo", 0.0,
                     report_to=["wandb", "mlflow"])
    finally:
        patch.undo()
    return {"grpo": grpo,
            "llds": train(tiny_models["random"], root / "trl-llds", 0.1,
                          report_to="tensorboard"), "root": root}


def test_a_real_trl_run_logs_the_displacement_metrics(runs):
    for name in ("grpo", "llds"):
        state = json.loads((runs["root"] / f"trl-{name}" / "trainer_state.json").read_text())
        # A step's metrics; TRL logs the reward on the steps that generate (every second
        # one with num_iterations=2), the loss terms on every step.
        steps = [entry for entry in state["log_history"] if "loss" in entry]
        assert len(steps) == 3 and sum("reward" in entry for entry in steps) == 2
        for key in ("actor/loss_noreduce", "actor/pos_avg_old_log_prob",
                    "actor/neg_avg_old_log_prob", "displacement/ref_log_ratio"):
            assert all(key in entry for entry in steps), (name, key)
    plain = json.loads((runs["root"] / "trl-grpo" / "trainer_state.json").read_text())
    assert all(e["actor/loss_noreduce"] == 0 for e in plain["log_history"] if "loss" in e)


def inputs_for(trainer, old_shift: float):
    """A micro-batch as TRL hands it to _compute_loss: two responses, the first with
    advantage +1, the second -1; `old_shift` added to the first response's current
    log-probabilities as its "old" ones (> 0: its likelihood fell since generation)."""
    torch.manual_seed(0)
    vocab = trainer.model.config.vocab_size
    prompt = torch.randint(0, vocab, (2, 5))
    completion = torch.randint(0, vocab, (2, 6))
    batch = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt),
             "completion_ids": completion, "completion_mask": torch.ones_like(completion),
             "advantages": torch.tensor([1.0, -1.0]),
             "num_items_in_batch": torch.tensor(12.0)}
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt, completion], 1),
            torch.ones(2, 11, dtype=torch.long), 6)
    old = logps.clone()
    old[0] += old_shift
    batch["old_per_token_logps"] = old
    batch["ref_per_token_logps"] = logps.clone()
    return batch


def test_the_term_is_the_nano_trainers_zero_where_nothing_fell_positive_where_it_did(runs):
    trainer = runs["llds"]
    trainer.model.train()
    for shift, expect_positive in ((0.0, False), (0.3, True)):
        batch = inputs_for(trainer, shift)
        log_prob, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.ones(2, 11, dtype=torch.long), 6)
        penalty, metrics = trainer.llds_penalty(log_prob, batch)
        nano, _ = llds_term(log_prob, batch["old_per_token_logps"], batch["advantages"],
                            batch["completion_mask"].float(), LossConfig(llds_lambda=0.1))
        assert torch.equal(penalty, nano)  # the same function on the same tensors
        assert (penalty.item() > 0) == expect_positive
        assert metrics["actor/loss_noreduce"] == pytest.approx(penalty.item())
    # And it is what _compute_loss adds: the loss with lambda 0.1 minus with lambda 0.
    batch = inputs_for(trainer, 0.3)
    with_term = trainer._compute_loss(trainer.model, batch).item()
    trainer.llds = LossConfig(llds_lambda=0.0)
    try:
        without = trainer._compute_loss(trainer.model, batch).item()
    finally:
        trainer.llds = LossConfig(llds_lambda=0.1)
    log_prob, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
        torch.ones(2, 11, dtype=torch.long), 6)
    expected, _ = llds_term(log_prob, batch["old_per_token_logps"], batch["advantages"],
                            batch["completion_mask"].float(), LossConfig(llds_lambda=0.1))
    scale = trainer.current_gradient_accumulation_steps
    assert with_term - without == pytest.approx(expected.item() / scale, rel=1e-5)


def test_the_curves_tool_reads_the_runs_and_plots_displacement(runs, tmp_path):
    from curves import analyze_uploads

    states = [str(runs["root"] / f"trl-{name}" / "trainer_state.json")
              for name in ("grpo", "llds")]
    result = analyze_uploads(states)
    assert [r.method for r in result.runs] == ["GRPO", "LLDS"]
    assert any(panel.id == "likelihood" for panel in result.panels)
    report = tmp_path / "trl.html"
    cli = subprocess.run([sys.executable, "-m", "curves", *states, "--out", str(report)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "Likelihood" in report.read_text(encoding="utf-8")


def test_the_worked_example_as_the_docs_give_it(tmp_path):
    """docs/trl.md's three commands (two steps each here, not twenty): a GRPO and an LLDS
    run of the nano agent through TRL, then the curves tool on both folders."""
    runs = tmp_path / "trl-runs"
    for name, weight in (("grpo", "0"), ("llds", "0.1")):
        run = subprocess.run([sys.executable, "-m", "llds_trl.example", "--out",
                              str(runs / name), "--llds-lambda", weight, "--steps", "2"],
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        state = json.loads((runs / name / "trainer_state.json").read_text())
        assert any("actor/loss_noreduce" in entry for entry in state["log_history"])
    report = tmp_path / "trl.html"
    cli = subprocess.run([sys.executable, "-m", "curves", str(runs / "grpo"),
                          str(runs / "llds"), "--out", str(report)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert "grpo" in cli.stdout and "LLDS" in cli.stdout and report.is_file()


def test_the_same_run_logged_to_tensorboard_reads_as_its_trainer_state(runs):
    """TRL's names as the HF Trainer writes them to TensorBoard (`train/reward`,
    `train/actor/loss_noreduce`) map to the same metrics as in trainer_state.json."""
    from curves import analyze_uploads

    events = sorted((runs["root"] / "trl-llds").rglob("events.out.tfevents.*"))
    assert events, "TRL wrote no TensorBoard log"
    (board,) = analyze_uploads([str(events[0].parent)]).runs
    (state,) = analyze_uploads([str(runs["root"] / "trl-llds" / "trainer_state.json")]).runs
    for key in ("reward", "actor/pos_avg_old_log_prob", "actor/loss_noreduce"):
        found = [c for c in board.table.columns if c.endswith(key)]
        assert found, (key, list(board.table.columns))
        assert board.table[found[0]].dropna().to_numpy() == pytest.approx(
            state.table[key].dropna().to_numpy(), rel=1e-5)


def test_the_same_run_logged_to_wandb_and_mlflow_reads_as_its_trainer_state(runs):
    from curves import analyze_uploads

    (state,) = analyze_uploads([str(runs["root"] / "trl-grpo" / "trainer_state.json")]).runs
    wandb_runs = sorted((runs["root"] / "wandb").glob("offline-run-*"))
    assert wandb_runs, "TRL wrote no W&B run"
    for source in (wandb_runs[0], runs["root"] / "mlruns"):
        result = analyze_uploads([str(source)])
        assert result.runs, [m.text for m in result.messages]
        table = result.runs[0].table
        for key in ("reward", "actor/pos_avg_old_log_prob"):
            found = [c for c in table.columns if c.endswith(key)]
            assert found, (source.name, key, list(table.columns))
            assert table[found[0]].dropna().to_numpy() == pytest.approx(
                state.table[key].dropna().to_numpy(), rel=1e-5), (source.name, key)


def test_a_trl_user_uploads_both_runs_and_sees_grpo_against_llds_in_the_studio(runs,
                                                                             browser):
    """In Chromium, as a visitor: the two runs' trainer_state.json files (the same name, as
    TRL writes them) uploaded to the Training-curves tab: both plotted, told apart by the
    LLDS weight each logged."""
    from playwright.sync_api import expect

    from agent.testing import free_port
    from app.ui import build_app, launch_options
    from tests.browser import ARTIFACTS, open_tab, require_chromium

    require_chromium()

    class NoDocuments:
        def search(self, queries, topk=3):
            return [[] for _ in queries]

    demo = build_app(lambda model: None, NoDocuments())
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    context = browser.new_context(viewport={"width": 1400, "height": 1100})
    try:
        page = context.new_page()
        page.goto(f"http://127.0.0.1:{port}/")
        open_tab(page, "Training curves")
        files = [str(runs["root"] / f"trl-{name}" / "trainer_state.json")
                 for name in ("grpo", "llds")]
        page.locator("#curves-files input[type=file]").set_input_files(files)
        summary = page.locator("#curves-summary")
        expect(summary).to_contain_text("LLDS", timeout=120_000)
        expect(summary).to_contain_text("GRPO")
        # Named by their order, not by the server's hashed upload folders.
        expect(summary).to_contain_text("trainer_state (file 1)")
        expect(summary).to_contain_text("trainer_state (file 2)")
        likelihood = page.locator(".js-plotly-plot").filter(has_text="Likelihood").first
        expect(likelihood).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "curves-trl.png"), full_page=True)
    finally:
        context.close()
        demo.close()
