"""A newcomer's first ten minutes, checked without a browser: degenerate output folded in
the one renderer both chat tabs use, the documents panel saying what the cut observation
left out, the reading check of a question against the picked model's tokenizer, and the
run button that is disabled while its run goes. The browser twin of each is
tests/test_ui_newcomer_browser.py."""

from __future__ import annotations

import html
import re

import gradio as gr
import pytest

from agent import protocol
from agent.backends.base import TokenizerText
from agent.events import (
    AnswerGiven,
    DocumentsReturned,
    Finished,
    InvalidAction,
    SearchCalled,
    TextDelta,
    TurnStarted,
)
from agent.loop import AgentSettings, run_agent
from agent.models import ROOT
from app.ui import controls
from app.ui import transcript as fold
from app.ui.access import Access
from app.ui.compare_tab import comparison_table
from app.ui.model_pool import ModelPool
from retriever.doc import Doc
from tests.scripted_backend import ScriptedBackend

NANO_DIR = ROOT / "assets" / "nano-agent"
ZEROS = "2" + "0" * 485  # what the nano GRPO pair writes for "when was facebook founded"
RUN_OF_20 = re.compile(r"(.)\1{19}")


def visible(markdown: str) -> str:
    """What a reader sees of a message: its Markdown rendered, tags dropped."""
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark").enable("table").render(markdown)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", rendered)).strip())


def text_of(messages) -> str:
    """Every message's title and text, as shown (titles are Markdown too)."""
    return " ".join(visible((m.get("metadata") or {}).get("title", "")) + " "
                    + visible(m["content"]) for m in messages)


# 1. Degenerate output, folded -----------------------------------------------------------
def test_a_long_run_of_one_character_shows_as_the_character_and_its_count():
    assert fold.fold_repeats("Answer: " + ZEROS) == ["Answer: 2", ("0", 485)]
    shown = fold.shown(ZEROS)
    assert visible(shown) == "2 [0 × 485]"
    assert "<strong>[0 × 485]</strong>" in visible_html(shown)


def visible_html(markdown: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").render(markdown)


@pytest.mark.parametrize("text, pieces", [
    ("0 " * 30 + "end", [("0 ", 30), "end"]),  # a token: the shortest unit that repeats
    ("the " * 25, [("the ", 25)]),
    ("ab" * 20 + "a", [("ab", 20), "a"]),
    ("\ufffd" * 60, [("\ufffd", 60)]),  # a byte-level model's broken characters
])
def test_a_repeated_token_is_folded_with_its_count(text, pieces):
    assert fold.fold_repeats(text) == pieces


@pytest.mark.parametrize("text", ["Wow!!! ... ---- -- and so on", "0" * 19,
                                  "ha" * 19, " " * 40 + "spaces", "\n" * 30,
                                  "1,000,000,000,000,000 dollars"])
def test_prose_and_short_repeats_are_left_as_written(text):
    assert fold.fold_repeats(text) == [text]
    assert fold.shown(text) == fold.escape(text)


def test_twenty_repeats_is_where_folding_starts():
    assert fold.fold_repeats("0" * 20) == [("0", 20)]


@pytest.mark.parametrize("unit", ["*", "_", "|", "[", "<", "&", "`", "#", "$", "!["])
def test_a_folded_unit_of_markdown_or_html_shows_as_itself(unit):
    rendered = visible(fold.shown("x " + unit * 30 + " y"))
    assert rendered == f"x [{unit} × 30] y", rendered


def degenerate_run() -> list:
    """A run as the nano GRPO agent writes it: zeros in a thought, an unclosed answer (an
    invalid action), a text turn of zeros, a query of repeats, then a closed answer."""
    return [TurnStarted(1, 5, False),
            TextDelta("<think> year " + "0" * 300 + " </think>\n<search> face"
                      + "book" * 25 + " </search>"),
            SearchCalled("face" + "book" * 25, 1),
            DocumentsReturned("face" + "book" * 25, [], "<information></information>", 0.1),
            TurnStarted(2, 5, False), TextDelta("<think> ok </think>\n<answer> " + ZEROS),
            InvalidAction("<answer> " + ZEROS),
            TurnStarted(3, 5, False), TextDelta("Doc 1" + "0" * 497), InvalidAction("Doc 1"),
            TurnStarted(4, 5, False), TextDelta(f"<answer> {ZEROS} </answer>"),
            AnswerGiven(ZEROS),
            Finished("answer", 4, 1, 2000, 9.0, "PROMPT" + ZEROS, "PROMPT", ZEROS)]


def test_thoughts_queries_invalid_actions_and_answers_are_folded_in_the_transcript():
    transcript = fold.Transcript(now=lambda: 0.0)
    for event in degenerate_run():
        transcript.apply(event)
    shown = text_of(transcript.messages)
    assert not RUN_OF_20.search(shown), shown
    assert "year [0 × 300]" in shown  # the thought
    assert "Search: face [book × 25]" in shown  # the query (a panel title)
    assert "Answer: 2 [0 × 485]" in shown  # the unclosed answer, then the closed one
    assert "Doc 1 [0 × 497]" in shown  # the invalid action's text
    assert shown.count("Invalid action") == 2
    # The raw text view shows the trajectory itself: every zero is still there.
    assert transcript.finished.trajectory.endswith("0" * 485)


def test_a_run_is_folded_while_it_streams():
    transcript = fold.Transcript(now=lambda: 0.0)
    transcript.apply(TurnStarted(1, 5, False))
    transcript.apply(TextDelta("<think> 2" + "0" * 30))
    assert visible(transcript.messages[-1]["content"]) == "2 [0 × 30]"
    transcript.apply(TextDelta("0" * 70))
    assert visible(transcript.messages[-1]["content"]) == "2 [0 × 100]"


def test_the_comparison_table_folds_the_answer():
    runs = [fold.Transcript(now=lambda: 0.0), fold.Transcript(now=lambda: 0.0)]
    runs[0].apply(AnswerGiven(ZEROS))
    runs[1].apply(AnswerGiven("|" * 25))
    table = visible(comparison_table(["a", "b"], runs))
    assert "Answer 2 [0 × 485] [/ × 25]" in table, table  # a "|" can't end the cell
    assert not RUN_OF_20.search(table)


# 4. The documents the model did not see -------------------------------------------------
WORDS = ("the film was directed by a man who lived in the city and wrote many books about "
         "its history").split()


def long_doc(i: int, words: int) -> Doc:
    text = " ".join(WORDS[(j + i) % len(WORDS)] for j in range(words))
    return Doc(str(i), f'"Document {i}"\n{text}', 10.0 - i)


class Retriever:
    """Three given documents for any query (a test double of the retriever)."""

    def __init__(self, docs: list[Doc]):
        self.docs = docs

    def search(self, queries, topk=3):
        return [list(self.docs[:topk]) for _ in queries]


@pytest.fixture(scope="module")
def nano_tokenizer():
    if not (NANO_DIR / "tokenizer.json").is_file():
        pytest.skip("assets/nano-agent is not in this checkout")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(NANO_DIR)


def nano_text_backend(tokenizer, script):
    """The scripted turns, with the nano tokenizer's real token counting and cut (the
    agent loop's `truncate` is `TokenizerText.truncate`, as with the real model)."""
    class NanoText(TokenizerText, ScriptedBackend):
        pass

    backend = NanoText(script)
    backend.tokenizer = tokenizer
    return backend


def search_panel(docs: list[Doc], tokenizer) -> tuple[dict, DocumentsReturned]:
    backend = nano_text_backend(tokenizer, ["<search> long documents </search>",
                                            "<answer> done </answer>"])
    events = list(run_agent("Which documents are long?", backend, Retriever(docs),
                            AgentSettings()))
    returned = next(e for e in events if isinstance(e, DocumentsReturned))
    messages = fold.render(events)
    return next(m for m in messages if m["metadata"]["title"].startswith("Search:")), returned


def test_the_panel_marks_where_the_500_token_cut_fell_and_what_came_after(nano_tokenizer):
    docs = [long_doc(1, 300), long_doc(2, 300), long_doc(3, 300)]
    panel, returned = search_panel(docs, nano_tokenizer)
    # The loop did cut the observation: the model saw doc 1, part of doc 2, none of doc 3.
    assert len(nano_tokenizer(returned.rendered)["input_ids"]) <= 500
    assert "Document 3" not in returned.rendered and "Document 2" in returned.rendered
    assert panel["metadata"]["log"] == "3 documents · the model read 1 and part of the 2nd"
    content = panel["content"]
    first, second, third = content.split("\n\n**")[1:]
    assert "not seen" not in first and "cut here" not in first
    assert second.startswith("2. Document 2** · score 8.00 · **read in part**")
    assert third.startswith("3. Document 3** · score 7.00 · **not seen by the model** (the "
                            "observation is cut at 500 tokens, as Search-R1 does)")
    # The text before the mark is exactly what the model read of doc 2, to the character.
    read, _, rest = second.partition(" **\\[cut here: the model read no further\\]** ")
    assert rest, second
    assert returned.rendered.rstrip("\ufffd").endswith(read.split("\n\n", 1)[1])
    assert (read.split("\n\n", 1)[1] + rest.removesuffix(" …")).replace(" ", "") in \
        docs[1].text.replace(" ", "")
    # Documents that fit whole: the panel claims no cut.
    docs = [long_doc(1, 40), long_doc(2, 40), long_doc(3, 40)]
    panel, returned = search_panel(docs, nano_tokenizer)
    assert returned.rendered == protocol.observation(
        protocol.render_documents([d.contents for d in docs]))
    assert panel["metadata"]["log"] == "3 documents"
    assert "not seen" not in panel["content"] and "cut here" not in panel["content"]


def test_an_observation_in_another_format_makes_no_claim():
    docs = [long_doc(1, 300), long_doc(2, 300)]
    assert fold.observation_cut(docs, "<information>...</information>") is None
    assert fold.read_summary(docs, None) == "2 documents"


def test_a_cut_before_the_second_document_leaves_it_unseen():
    docs = [long_doc(1, 50), long_doc(2, 50)]
    full = protocol.observation(protocol.render_documents([d.contents for d in docs]))
    read = fold.observation_cut(docs, full[:full.index("Doc 2(")])
    assert read == [len(docs[0].text), 0]
    assert fold.read_summary(docs, read) == "2 documents · the model read 1"
    # Half a character at the cut (a byte-level decode shows U+FFFD) is still a cut.
    read = fold.observation_cut(docs, full[:full.index("man")] + "\ufffd")
    assert 0 < read[0] < len(docs[0].text) and read[1] == 0


# 2. A question the model's vocabulary cannot read ---------------------------------------
def test_the_nano_vocabulary_cannot_read_emoji_but_reads_its_corpus_letters(nano_tokenizer):
    assert controls.alphabet_is_narrow(nano_tokenizer)

    def unreadable(text: str) -> list[str]:
        return controls.unreadable_characters(text, nano_tokenizer)

    assert unreadable("🚀🔥🌍") == ["🚀", "🔥", "🌍"]
    assert unreadable("Who wrote Pride and Prejudice?") == []
    assert unreadable("Gödel, café, Tōkyō") == []  # characters its vocabulary holds
    assert unreadable("a naïve 東京 question") == ["ï", "東", "京"]


def test_qwens_byte_level_vocabulary_reads_everything():
    from transformers import AutoTokenizer

    from agent.testing import qwen_tokenizer_files

    qwen = AutoTokenizer.from_pretrained(qwen_tokenizer_files())
    assert not controls.alphabet_is_narrow(qwen)
    assert controls.unreadable_characters("🚀🔥🌍 東京 naïve 🦩 𓀀", qwen) == []


def test_an_emoji_question_is_refused_before_any_model_loads():
    loaded = []
    pool = ModelPool(lambda model: loaded.append(model))
    reading = controls.reading_check("🚀🔥🌍", "nano", pool)
    assert reading.warning is None
    assert "This model cannot read the question." in reading.refusal
    for name in ("🚀 (U+1F680)", "🔥 (U+1F525)", "🌍 (U+1F30D)", "Please ask in words"):
        assert name in reading.refusal
    assert loaded == []  # its tokenizer alone decided: no model was loaded


def test_a_question_with_some_unreadable_characters_runs_with_a_note():
    pool = ModelPool(lambda model: None)
    reading = controls.reading_check("Who wrote naïve poems?", "nano", pool)
    assert reading.refusal is None
    assert "ï (U+00EF)" in reading.warning and "may misread" in reading.warning


def test_the_check_is_skipped_where_the_tokenizer_would_need_a_download(nano_tokenizer):
    pool = ModelPool(lambda model: None)
    assert controls._tokenizer_source("someone/not-in-the-cache") is None
    assert controls.reading_check("🚀🔥🌍", "someone/not-in-the-cache", pool) == controls.Reading()


def test_an_exposed_studio_reads_no_tokenizer_from_a_path_a_visitor_typed(nano_tokenizer,
                                                                           tmp_path):
    nano_tokenizer.save_pretrained(tmp_path)  # a local path holding a readable tokenizer
    pool = ModelPool(lambda model: None)
    assert controls.reading_check("🚀🔥🌍", str(tmp_path), pool).refusal  # on loopback: checked
    pool.check = Access(exposed=True).model_problem
    # Not checked: the run itself refuses the path, with its own message.
    assert controls.reading_check("🚀🔥🌍", str(tmp_path), pool) == controls.Reading()


# 3. The run button ----------------------------------------------------------------------
def test_the_run_button_is_disabled_with_its_reason_and_refuses_a_second_run():
    with gr.Blocks():
        button = controls.RunButton(gr.Button("Ask"), "Ask", "Running… (Stop to ask another)",
                           "A question is running.")
    assert button.busy("Ask") == gr.update(value="Running… (Stop to ask another)",
                                           interactive=False)
    with pytest.raises(gr.Error, match="A question is running."):
        button.busy("Running… (Stop to ask another)")
    assert button.idle() == gr.update(value="Ask", interactive=True)
