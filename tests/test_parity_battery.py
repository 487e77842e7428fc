"""A battery of generated cases: our real loop and evaluator against Search-R1's rules.

The reference below is written here from Search-R1's rules (docs/protocol.md): generate to
EOS or the budget, cut, parse the first action, insert the observation or the
invalid-action note, a closing round without search; score the last `<answer>` over prompt +
response when there are at least two matches; normalise; EM and sub-EM. Thousands of seeded
cases (stray, unclosed, nested and mismatched tags, tags in documents, EOS without action,
several answers, answers before a search, token budgets, unicode, whitespace variants) run
through `run_agent` / `run_agent_batch` with a scripted backend and an in-test retriever
whose documents carry tags, then through `evaluator.rundir.make_record`.

Every difference must fall in a category docs/protocol.md documents:
- `prompt_example`: the model wrote no `<answer>` block; Search-R1 scores the prompt's own
  example ("Beijing"), we score no answer.
- `tag_in_documents` / `tag_in_invalid_note`: Search-R1's last match is a tag inside
  inserted text (a retrieved document, or the note's `<answer> and </answer>`).
- `spans_inserted_text`: Search-R1's last match joins an unclosed `<answer>` of the model
  with a `</answer>` after inserted text.
The trajectory itself (cuts, actions, observations, notes, rounds) must never differ.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from dataclasses import dataclass, field

from agent import protocol
from agent.events import AnswerGiven, Finished, TextDelta
from agent.loop import AgentSettings, run_agent, run_agent_batch
from evaluator.benchmarks import Question
from evaluator.rundir import make_record
from retriever.doc import Doc
from tests.scripted_backend import ScriptedBackend

CASES = 6000
DOCUMENTED = ("prompt_example", "tag_in_documents", "tag_in_invalid_note",
              "spans_inserted_text")

# ------------------------------------------------------------------ the reference rules

_PIECES = re.compile(r"\S+\s*|\s+")  # the scripted backend's tokens
_FIRST_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
NOTE = ("\nMy previous action is invalid. If I want to search, I should put the query "
        "between <search> and </search>. If I want to give the final answer, I should put "
        "the answer between <answer> and </answer>. Let me try again.\n")


def ref_cut(turn: str) -> str:
    if "</search>" in turn:
        return turn.split("</search>")[0] + "</search>"
    if "</answer>" in turn:
        return turn.split("</answer>")[0] + "</answer>"
    return turn


def ref_action(turn: str) -> tuple[str | None, str]:
    match = _FIRST_ACTION.search(turn)
    return (match.group(1), match.group(2).strip()) if match else (None, "")


def ref_documents(docs: list[str]) -> str:
    out = ""
    for i, contents in enumerate(docs):
        lines = contents.split("\n")
        out += f"Doc {i + 1}(Title: {lines[0]}) " + "\n".join(lines[1:]) + "\n"
    return out


def ref_normalise(text: str) -> str:
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def ref_prediction(solution: str) -> tuple[str | None, tuple[int, int] | None]:
    """(prediction, span of its match) over prompt + response: the last of >= 2 matches."""
    matches = list(_ANSWER_BLOCK.finditer(solution))
    if len(matches) <= 1:
        return None, None
    return matches[-1].group(1).strip(), matches[-1].span()


def ref_em(prediction: str | None, golden: list[str]) -> int:
    if prediction is None:
        return 0
    return int(any(ref_normalise(g) == ref_normalise(prediction) for g in golden))


def ref_sub_em(prediction: str | None, golden: list[str]) -> int:
    if prediction is None:
        return 0
    return int(any(ref_normalise(g) in ref_normalise(prediction) for g in golden))


@dataclass
class Reference:
    pieces: list[tuple[str, str]] = field(default_factory=list)  # (kind, text) after prompt
    stop: str = "max_turns"


def ref_run(turns: list[str], docs_for, max_turns: int, budget: int) -> Reference:
    """Search-R1's rollout of one question whose model writes `turns` (each to EOS)."""
    ref = Reference()

    def generate(n: int) -> str:
        text = turns[n] if n < len(turns) else ""
        return ref_cut("".join(_PIECES.findall(text)[:budget]))

    for step in range(max_turns):
        turn = generate(step)
        ref.pieces.append(("model", turn))
        action, content = ref_action(turn)
        if action == "answer":
            ref.stop = "answer"
            return ref
        if action == "search":
            ref.pieces.append(
                ("documents", f"\n\n<information>{ref_documents(docs_for(content)).strip()}"
                              "</information>\n\n"))
        else:
            ref.pieces.append(("note", NOTE))
    turn = generate(max_turns)  # the closing round: parsed, never searched
    ref.pieces.append(("model", turn))
    if ref_action(turn)[0] == "answer":
        ref.stop = "answer"
    return ref


# ------------------------------------------------------------------ the generated cases

WORDS = ["Paris", "the Eiffel Tower", "Beijing", "Stanley Kubrick", "1968", "São Paulo",
         "Zürich", "東京", "北京市", "naïve café", "🙂 ok", "Ω-3", "O'Neil", "U.S.", "an apple",
         "The Beatles", "x", "a", "Ünïcödé", "tab\tseparated", "new\nline"]
WHITESPACE = ["", " ", "  ", "\n", "\t", " \n", "\n\n"]


def _ws(rng: random.Random) -> str:
    return rng.choice(WHITESPACE)


def _words(rng: random.Random, k: int = 3) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, k)))


def _part(rng: random.Random) -> str:
    w, ws = (lambda: _words(rng)), (lambda: _ws(rng))
    choices = [
        lambda: f"<think>{ws()}{w()}{ws()}</think>",
        lambda: f"<search>{ws()}{w()}{ws()}</search>",
        lambda: f"<answer>{ws()}{w()}{ws()}</answer>",
        lambda: f"<answer>{ws()}{w()}",                       # unclosed answer
        lambda: f"<search>{ws()}{w()}",                       # unclosed search
        lambda: rng.choice(["</answer>", "</search>", "</think>", "<answer>", "<search>"]),
        lambda: f"<search> {w()} </answer>",                  # mismatched
        lambda: f"<answer> {w()} </search>",
        lambda: f"<search> {w()} <answer> {w()} </answer> </search>",   # nested
        lambda: f"<answer> {w()} <search> {w()} </search> </answer>",
        lambda: f"<answer>{w()}</answer> <answer>{w()}</answer>",       # several answers
        lambda: f"<information> {w()} </information>",        # the model imitates a block
        lambda: rng.choice(["<Answer> x </Answer>", "< answer > x </ answer >",
                            "<answer >x</answer>", "<answer></answer>", "<search></search>"]),
        lambda: w(),
        lambda: ws(),
    ]
    return rng.choice(choices)()


def _turn(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.08:
        return ""  # EOS at once
    if kind < 0.16:
        return _words(rng, 6)  # EOS without any action
    return "".join(_part(rng) + _ws(rng) for _ in range(rng.randint(1, 5)))


def _document(rng: random.Random, i: int) -> str:
    title = rng.choice(['"Paris"', '"Beijing"', '"Tag <answer> t </answer>"', '"Zürich"',
                        '"Stanley Kubrick"', '"Open <answer> t"'])
    text = rng.choice(["Plain text about %s.", "Text with <answer> %s </answer> inside.",
                       "An unclosed <answer> %s here.", "A closer </answer> for %s.",
                       "<search> %s </search> in a document.", "</information> %s",
                       "Two lines\nfor %s.", "%s"]) % _words(rng)
    return f"{title}\n{text} ({i})"


@dataclass
class Case:
    index: int
    turns: list[str]
    docs: dict[str, list[str]]
    golden: list[str]
    max_turns: int
    budget: int

    def docs_for(self, query: str) -> list[str]:
        return self.docs.get(query, [f'"Unknown"\nNothing for {query} <answer> u </answer>'])


def make_cases(seed: int = 11, count: int = CASES) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for index in range(count):
        turns = [_turn(rng) for _ in range(rng.randint(1, 6))]
        queries = {m.group(2).strip() for t in turns for m in _FIRST_ACTION.finditer(t)}
        docs = {q: [_document(rng, i) for i in range(rng.choice([0, 1, 3, 3]))]
                for q in queries}
        golden = rng.sample(WORDS, 2) + ([rng.choice(["beijing", "and", "t", "u"])]
                                         if rng.random() < 0.3 else [])
        budget = rng.choice([500] * 9 + [3, 8])
        cases.append(Case(index, turns, docs, golden, rng.randint(1, 4), budget))
    return cases


class CaseRetriever:
    """Documents chosen by the case, tags and all (a real retriever would never be seeded
    with them; this one exists to put tags where Search-R1 would read them)."""

    def __init__(self, case: Case):
        self.case = case

    def search(self, queries, topk=3):
        return [[Doc(str(i), c) for i, c in enumerate(self.case.docs_for(q)[:topk])]
                for q in queries]


# ------------------------------------------------------------------ comparison


def classify(ref: Reference, prompt: str, ours: str | None) -> str | None:
    """None when Search-R1 and we score the same prediction, else the difference's kind
    ("undocumented" when it is none of the documented ones)."""
    solution = prompt + "".join(text for _, text in ref.pieces)
    theirs, span = ref_prediction(solution)
    if theirs == ours:
        return None
    if span is None:
        return "undocumented"
    start, end = span
    bounds, offset = [], len(prompt)
    for kind, text in ref.pieces:
        bounds.append((kind, offset, offset + len(text)))
        offset += len(text)
    if end <= len(prompt):
        return "prompt_example" if ours is None else "undocumented"
    inside = [kind for kind, a, b in bounds if a <= start and end <= b]
    if inside == ["documents"]:
        return "tag_in_documents"
    if inside == ["note"]:
        return "tag_in_invalid_note"
    if not inside:  # the match runs over a piece boundary
        kinds = {kind for kind, a, b in bounds if a < end and start < b}
        if kinds & {"documents", "note"}:
            return "spans_inserted_text"
    return "undocumented"


def run_ours(case: Case, batch: bool) -> tuple[Finished, list]:
    backend = ScriptedBackend(lambda question, n: case.turns[n] if n < len(case.turns) else "")
    settings = AgentSettings(max_turns=case.max_turns, max_new_tokens=case.budget,
                             max_obs_tokens=10**6, max_context_tokens=10**7)
    if batch:
        return dict(run_agent_batch([f"case {case.index}"], backend, CaseRetriever(case),
                                    settings))[0], []
    events = list(run_agent(f"case {case.index}", backend, CaseRetriever(case), settings))
    return events[-1], events


def test_battery_has_only_documented_differences():
    counts: Counter[str] = Counter()
    coverage: Counter[str] = Counter()
    undocumented = []
    for case in make_cases():
        done, events = run_ours(case, batch=case.index % 2 == 1)
        ref = ref_run(case.turns, case.docs_for, case.max_turns, case.budget)
        prompt = protocol.user_message(f"case {case.index}")
        # The trajectory, piece by piece, and the way the run ended: always identical.
        assert done.prompt == prompt
        assert [(s.generated, s.text) for s in done.segments[1:]] == [
            (kind == "model", text) for kind, text in ref.pieces], case
        assert (done.stop_reason == "answer") == (ref.stop == "answer"), case
        if events:  # streamed: the deltas are exactly the model's cut turns
            assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "".join(
                text for kind, text in ref.pieces if kind == "model"), case
            given = [e.answer for e in events if isinstance(e, AnswerGiven)]
            assert given == ([done.answer] if done.stop_reason == "answer" else []), case
        record = make_record(Question(str(case.index), "nq", "q", case.golden), done)
        assert record.prediction == done.answer  # scored exactly what the agent reported
        kind = classify(ref, prompt, done.answer)
        theirs = ref_prediction(prompt + "".join(t for _, t in ref.pieces))[0]
        if kind is None:
            counts["same_prediction"] += 1
            assert record.metrics["em"] == ref_em(theirs, case.golden), case
            assert record.metrics["sub_em"] == ref_sub_em(theirs, case.golden), case
        else:
            counts[kind] += 1
            if record.metrics["em"] != ref_em(theirs, case.golden):
                counts[f"{kind} (EM differs)"] += 1
            if kind == "undocumented":
                undocumented.append(case)
        # What the cases exercise (each must occur).
        model_turns = [t for k, t in ref.pieces if k == "model"]
        if any("</answer>" in t.split("</search>")[0] and "</search>" in t
               for t in model_turns):
            coverage["`</answer>` before `</search>` in one turn (stop rule)"] += 1
        if any(len(_ANSWER_BLOCK.findall(t)) > 1 for t in model_turns):
            coverage["several answers in one cut turn (last scored)"] += 1
        if any(len(_PIECES.findall(t)) >= case.budget for t in case.turns):
            coverage["turn cut by the token budget"] += 1
        if any(k == "note" for k, _ in ref.pieces):
            coverage["invalid action (note inserted)"] += 1
        if any(k == "documents" and "<answer>" in t for k, t in ref.pieces):
            coverage["answer tag inside documents"] += 1
        if any(ord(c) > 127 for t in model_turns for c in t):
            coverage["non-ASCII text"] += 1
    print(f"\nbattery: {CASES} cases")
    for name, n in sorted(counts.items()):
        print(f"  {name:<40} {n:5d}")
    print("coverage:")
    for name, n in sorted(coverage.items()):
        print(f"  {name:<56} {n:5d}")
    assert not undocumented, undocumented[:3]
    assert sum(counts[k] for k in ("same_prediction", *DOCUMENTED)) == CASES
    for name in DOCUMENTED:
        assert counts[name] > 0, f"the generator never produced a {name} case"
    assert len(coverage) == 6 and min(coverage.values()) > 0, coverage
    assert counts["same_prediction"] > CASES // 3


def test_reference_and_our_rules_on_hand_picked_cases():
    """Hand-picked cases at the rules' edges, through the same comparison."""
    paris = Case(0, ["<answer> Paris", "<answer> Paris </answer>"], {}, ["Paris"], 4, 500)
    done, _ = run_ours(paris, batch=False)
    ref = ref_run(paris.turns, paris.docs_for, 4, 500)
    prompt = protocol.user_message("case 0")
    assert done.answer == "Paris" and done.stop_reason == "answer"
    assert ref_prediction(prompt + "".join(t for _, t in ref.pieces))[0] == "Paris"
    # A stray `</answer>` before a search: a search for Search-R1, and for us.
    stray = Case(1, ["x </answer> text <search> q </search>", "<answer> y </answer>"],
                 {"q": ['"T"\nt']}, ["y"], 4, 500)
    done, _ = run_ours(stray, batch=False)
    assert done.searches == 1 and done.answer == "y"
    # Two answers in the turn cut at a search: an answer action scored as the last one.
    two = Case(2, ["<answer> x </answer> <answer> y </answer> <search> q </search>"], {},
               ["y"], 4, 500)
    done, _ = run_ours(two, batch=False)
    assert done.stop_reason == "answer" and done.answer == "y" and done.searches == 0
    # No tag at all: Search-R1 scores the prompt's "Beijing"; we score nothing.
    none = Case(3, ["I do not know."], {}, ["Beijing"], 1, 500)
    done, _ = run_ours(none, batch=False)
    ref = ref_run(none.turns, none.docs_for, 1, 500)
    assert done.answer is None
    assert classify(ref, protocol.user_message("case 3"), None) == "tag_in_invalid_note"
