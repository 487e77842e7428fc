"""Trajectories in the exact protocol, written by the project's own agent loop.

`TeacherBackend` implements the `Backend` protocol with predetermined turns: it searches the
question, and after reading the real observation that the loop inserted either answers
(with the words as they stand in the documents) or searches again with a reformulation
derived from the question (or, for a two-hop question, about the bridge article it read).
`run_agent_batch` drives it with the real retriever, so prompt, tags, observations and
truncation are the loop's own, never a copy of the format.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from agent import protocol
from agent.backends.base import Sampling, TokenizerText, TurnOutput
from agent.loop import AgentSettings, run_agent_batch
from nano.questions import TITLE_FAMILIES, GeneratedQuestion

SEARCH_FIRST = "<think> I need to search for this. </think>\n<search> {q} </search>"
ANSWER = "<think> The answer is in Doc {i}. </think>\n<answer> {a} </answer>"
# With quote=True a span answer is first read out in the think: the words before it in the
# document, then the answer. The first of those words is usually one the question shares
# with the document ("painted by"), so the model points at a word it can match, and the
# hand-set copy head carries on from there; the answer then copies from the think.
ANSWER_QUOTED = "<think> Doc {i} says: {evidence} </think>\n<answer> {a} </answer>"
EVIDENCE_WORDS = 4  # words quoted before the answer, within its sentence
SEARCH_AGAIN = ("<think> The documents do not answer it. I will search again. </think>\n"
                "<search> {q} </search>")
SEARCH_BRIDGE = "<think> Doc {i} is about {b}. </think>\n<search> {q} </search>"
GIVE_UP = "<answer> unknown </answer>"  # marks a run the teacher could not solve (dropped)

_DOC_RE = re.compile(r"Doc (\d+)\(Title: ")


def _norm(text: str) -> str:
    return " " + " ".join(re.findall(r"\w+", text.lower())) + " "


def documents_in(observation: str) -> list[tuple[int, str, str]]:
    """(index, title, text) of each document in an inserted observation (maybe truncated)."""
    parts = _DOC_RE.split(observation)
    out = []
    for i in range(1, len(parts) - 1, 2):
        title, _, text = parts[i + 1].partition(")")
        out.append((int(parts[i]), title.strip().strip('"'), text))
    return out


def find_answer(question: GeneratedQuestion, observation: str) -> int | None:
    """The document (1-based) in which the model can read the answer, else None."""
    for index, title, text in documents_in(observation):
        if question.family in TITLE_FAMILIES:
            if title == question.articles[0]:
                return index
        elif title == question.articles[0] and _norm(question.answers[0]) in _norm(text):
            return index
    return None


def evidence_for(answer: str, text: str, words: int = EVIDENCE_WORDS) -> str | None:
    """Up to `words` words that lead up to `answer` in `text` within its sentence, then the
    answer as it stands there; None when the text does not hold it exactly (case included)."""
    match = re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text)
    if match is None:
        return None
    before = re.split(r"[.;!?]\s", text[:match.start()])[-1].split()
    return " ".join(before[-words:] + [answer])


def find_title(title: str, observation: str) -> int | None:
    return next((i for i, t, _ in documents_in(observation) if t == title), None)


def as_query(question: str) -> str:
    return question.strip().rstrip("?").strip()


@dataclass
class _Plan:
    question: GeneratedQuestion
    searches: int = 0
    bridged: bool = False
    failed: bool = False


class TeacherBackend(TokenizerText):
    """A `Backend` whose turns are decided from the question and the documents it was shown."""

    name = "teacher"

    def __init__(self, tokenizer, questions: Sequence[GeneratedQuestion], retriever,
                 settings: AgentSettings, quote: bool = False):
        self.tokenizer = tokenizer
        self.quote = quote
        self.retriever = retriever
        self.settings = settings
        self.plans = {self.build_prompt(q.question): _Plan(q) for q in questions}


    # Turns -------------------------------------------------------------------------------
    def _observation(self, query: str) -> str:
        docs = self.retriever.search([query], self.settings.topk)[0]
        rendered = protocol.render_documents([doc.contents for doc in docs])
        return self.truncate(protocol.observation(rendered), self.settings.max_obs_tokens)

    def _reformulation(self, question: GeneratedQuestion) -> str | None:
        for query in question.reformulations:
            if find_answer(question, self._observation(query)) is not None:
                return query
        return None

    def _answer(self, question: GeneratedQuestion, observation: str, index: int) -> str:
        answer = question.answers[0]
        if self.quote and question.family not in TITLE_FAMILIES:
            text = next(t for i, _, t in documents_in(observation) if i == index)
            if (evidence := evidence_for(answer, text)) is not None:
                return ANSWER_QUOTED.format(i=index, evidence=evidence, a=answer)
        return ANSWER.format(i=index, a=answer)

    def turn(self, context: Sequence[str]) -> str:
        plan = self.plans[context[0]]
        q = plan.question
        if len(context) == 1:
            plan.searches = 1
            return SEARCH_FIRST.format(q=as_query(q.question))
        observation = context[-1]
        if (index := find_answer(q, observation)) is not None:
            return self._answer(q, observation, index)
        if q.family == "twohop" and not plan.bridged:
            plan.bridged = True
            if (index := find_title(q.bridge, observation)) is not None:
                plan.searches += 1
                bridge = re.sub(r"\s*\([^)]*\)$", "", q.bridge)
                return SEARCH_BRIDGE.format(i=index, b=bridge, q=q.second_query)
            plan.failed = True
            return GIVE_UP
        if plan.searches < 2 and (query := self._reformulation(q)) is not None:
            plan.searches += 1
            return SEARCH_AGAIN.format(q=query)
        plan.failed = True
        return GIVE_UP

    def generate(self, contexts: Sequence[Sequence[str]], max_new_tokens: Sequence[int],
                 sampling: Sampling) -> list[TurnOutput]:
        outputs = []
        for context in contexts:
            text = self.turn(context)
            outputs.append(TurnOutput(text, self.count_tokens(text), "stop"))
        return outputs

    def stream(self, context: Sequence[str], max_new_tokens: int, sampling: Sampling,
               cancel=None) -> Iterator[str | TurnOutput]:
        output = self.generate([context], [max_new_tokens], sampling)[0]
        yield output.text
        yield output


def trajectories(questions: Sequence[GeneratedQuestion], tokenizer, retriever,
                 settings: AgentSettings | None = None, batch_size: int = 256,
                 progress=None, quote: bool = False) -> Iterator[dict]:
    """Run the teacher through the real loop; yield each solved run as a training record
    (`quote`: span answers are read out in the think first, see ANSWER_QUOTED)."""
    settings = settings or AgentSettings()
    unique = list({q.question: q for q in questions}.values())
    for start in range(0, len(unique), batch_size):
        batch = unique[start:start + batch_size]
        teacher = TeacherBackend(tokenizer, batch, retriever, settings, quote)
        for index, finished in run_agent_batch([q.question for q in batch], teacher, retriever,
                                               settings):
            q = batch[index]
            plan = teacher.plans[finished.prompt]
            if progress is not None:
                progress.update(1)
            if plan.failed or finished.stop_reason != "answer":
                continue
            yield {"id": q.id, "question": q.question, "answers": list(q.answers),
                   "family": q.family, "searches": finished.searches,
                   "segments": [[s.text, s.generated] for s in finished.segments]}
