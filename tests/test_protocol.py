"""The protocol strings, byte for byte as docs/protocol.md states them."""

from agent import protocol

EXPECTED_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: who wrote hamlet?\n"
)


def test_prompt_is_exact_and_single_line():
    assert protocol.user_message("  who wrote hamlet ") == EXPECTED_PROMPT
    assert protocol.user_message("who wrote hamlet?") == EXPECTED_PROMPT
    assert protocol.user_message("who wrote hamlet").count("\n") == 1
    assert "as your want" in EXPECTED_PROMPT


class _Templated:
    chat_template = "something"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt is True and tokenize is False
        return f"<user>{messages[0]['content']}</user><assistant>"


class _Plain:
    chat_template = None


def test_chat_template_wraps_the_message_when_present():
    assert protocol.build_prompt("q", _Templated()) == (
        f"<user>{protocol.user_message('q')}</user><assistant>")
    assert protocol.build_prompt("q", _Plain()) == protocol.user_message("q")
    assert protocol.build_prompt("q") == protocol.user_message("q")


def test_cut_turn_prefers_search_then_answer():
    assert protocol.cut_turn("a <search> x </search>\n\nmore <answer>y</answer>") == (
        "a <search> x </search>")
    assert protocol.cut_turn("<answer>y</answer> trailing") == "<answer>y</answer>"
    assert protocol.cut_turn("<answer>y</answer> then <search>q</search>") == (
        "<answer>y</answer> then <search>q</search>")
    assert protocol.cut_turn("no tag at all") == "no tag at all"


def test_find_stop():
    assert protocol.find_stop("abc") == -1
    assert protocol.find_stop("x </search> y") == len("x </search>")
    # `</answer>` is no stop: a later `</search>` can still move the cut past it.
    assert protocol.find_stop("<answer>a</answer><search>") == -1
    assert protocol.find_stop("<answer>a</answer><search>q</search>!") == len(
        "<answer>a</answer><search>q</search>")
    # Another rule, as benchmarks/stop_rule.py measures: the earliest of its strings.
    assert protocol.find_stop("<answer>a</answer> <search>q</search>",
                              ("</search>", "</answer>")) == len("<answer>a</answer>")


def test_parse_action():
    assert protocol.parse_action("<think>t</think><search>  paris  </search>") == (
        protocol.Action("search", "paris"))
    assert protocol.parse_action("<answer>\nBeijing\n</answer>") == (
        protocol.Action("answer", "Beijing"))
    # The first action wins, whichever kind it is.
    assert protocol.parse_action("<answer>a</answer><search>b</search>").kind == "answer"
    assert protocol.parse_action("<search>unclosed").kind == "invalid"
    assert protocol.parse_action("<search>a</answer>").kind == "invalid"


def test_invalid_action_and_observation_strings():
    assert protocol.INVALID_ACTION_MESSAGE == (
        "\nMy previous action is invalid. If I want to search, I should put the query between "
        "<search> and </search>. If I want to give the final answer, I should put the answer "
        "between <answer> and </answer>. Let me try again.\n")
    assert protocol.observation("  Doc 1(Title: \"A\") b\n") == (
        "\n\n<information>Doc 1(Title: \"A\") b</information>\n\n")


def test_render_documents_byte_exact():
    docs = ['"Paris"\nParis is the capital of France.', '"Eiffel Tower"\nA tower.\nIn Paris.']
    assert protocol.render_documents(docs) == (
        'Doc 1(Title: "Paris") Paris is the capital of France.\n'
        'Doc 2(Title: "Eiffel Tower") A tower.\nIn Paris.\n')
    assert protocol.render_documents([]) == ""


def test_extract_answer():
    assert protocol.extract_answer("<answer> a </answer> then <answer> b </answer>") == "b"
    assert protocol.extract_answer("no tag") is None


def test_answer_of_searches_each_model_turn_on_its_own():
    assert protocol.answer_of(["<answer> a </answer>", "<answer> b </answer> x"]) == "b"
    assert protocol.answer_of(["<answer> a </answer>", "no tag"]) == "a"
    assert protocol.answer_of([]) is None
    # An unclosed `<answer>` never joins a `</answer>` of a later turn.
    assert protocol.answer_of(["<answer> Paris", "x </answer>"]) is None
    assert protocol.answer_of(["<answer> Paris", "<answer> Paris </answer>"]) == "Paris"


def test_server_answers_become_docs_at_the_client():
    from retriever.client import doc_from_result
    from retriever.doc import Doc

    wrapped = {"document": {"id": 7, "contents": '"T"\nx'}, "score": 1.5}
    assert doc_from_result(wrapped) == Doc("7", '"T"\nx', 1.5)
    assert doc_from_result({"contents": '"U"\ny'}) == Doc("", '"U"\ny', 0.0)
    assert (doc_from_result(wrapped).title, doc_from_result(wrapped).text) == ("T", "x")
