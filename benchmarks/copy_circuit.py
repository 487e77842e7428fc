"""What the nano agent's exact match owes to its hand-set copy circuit.

    python -m benchmarks.copy_circuit                       # the shipped model, both sets
    python -m benchmarks.copy_circuit --model DIR --sets naturalqa --limit 60

The shipped weights started from a circuit written in by hand (`nano/wire.py`): layer 0's
head 0 copies each token's predecessor, layer 1's head 0 finds where the current token stood
before and copies what followed it. Training moved those weights like any others. This
switches a head off (its slice of the attention output projection set to zero, so it writes
nothing into the residual stream) and measures EM again, greedy and batched, top-3
in-process BM25 (`--engine`: Lucene, the evaluator's default, or bm25s), as the evaluator runs
the model. A head of the same layer that was not wired is switched off as the control: a
drop that the control shows too is not the circuit's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from agent.loop import AgentSettings
from evaluator.benchmarks import LOCAL_BENCHMARKS, load_local
from nano.evaluate import fixed_sample, run_batched, score

ROOT = Path(__file__).resolve().parent.parent
# (name, layer, head): None switches nothing off.
VARIANTS = (("intact", None, None),
            ("copy head off (layer 1, head 0)", 1, 0),
            ("previous-token head off (layer 0, head 0)", 0, 0),
            ("control: layer 1, head 1 off", 1, 1))


def switch_off(model, layer: int, head: int) -> None:
    """Zero the output projection's input columns of one attention head, in place."""
    import torch

    attention = model.model.layers[layer].self_attn
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        attention.o_proj.weight[:, head * head_dim:(head + 1) * head_dim] = 0


def measure(model_dir: Path, sets: list[str], limit: int | None, threads: int,
            engine: str = "lucene") -> list[dict]:
    import torch

    from agent.backends.hf import TransformersBackend
    from retriever.client import LocalRetriever

    torch.set_num_threads(threads)
    retriever = LocalRetriever(engine)
    questions = {name: fixed_sample(load_local(LOCAL_BENCHMARKS[name], name)[0], limit)
                 for name in sets}
    rows = []
    for variant, layer, head in VARIANTS:
        backend = TransformersBackend(str(model_dir), device="cpu")
        if layer is not None:
            switch_off(backend.model, layer, head)
        for name, qs in questions.items():
            start = time.perf_counter()
            result = score(qs, run_batched(qs, backend, retriever, AgentSettings()))
            rows.append({"variant": variant, "set": name, "questions": len(qs),
                         "em": round(result["em"], 3),
                         "right": round(result["em"] * len(qs)),
                         "well_formed": round(result["well_formed"], 3),
                         "seconds": round(time.perf_counter() - start, 1)})
            print(f"{variant:44s} {name:10s} EM {result['em']:.3f} "
                  f"({rows[-1]['right']}/{len(qs)}), well-formed {result['well_formed']:.2f}",
                  flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "assets" / "nano-agent")
    parser.add_argument("--sets", nargs="+", default=["vitalqa", "naturalqa"],
                        choices=sorted(LOCAL_BENCHMARKS))
    parser.add_argument("--limit", type=int, default=None,
                        help="a fixed sample of this many questions per set (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engine", default="lucene", choices=["lucene", "bm25s"],
                        help="the in-process retriever's engine")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there; pass a nano model folder.")
    rows = measure(args.model, args.sets, args.limit, args.threads, args.engine)
    intact = {r["set"]: r["em"] for r in rows if r["variant"] == "intact"}
    print("\nEM relative to the intact model:")
    for row in rows:
        if row["variant"] != "intact" and intact[row["set"]]:
            print(f"  {row['variant']:44s} {row['set']:10s} "
                  f"{row['em'] / intact[row['set']]:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
