"""The `read` family: questions whose answer is a span of the article's text, never its
title, asked in many phrasings; kept off the articles another benchmark is answered from;
mixed so that title answers stay a minority of the training runs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from nano.build import write_mix
from nano.data import benchmark_support, build_questions, reading_questions
from nano.questions import Article, cloze_questions, held_out, reading_facts

MONA = Article("7", "Mona Lisa", "The Mona Lisa is a half-length portrait painting by Italian "
               "artist Leonardo da Vinci. It was painted by Leonardo da Vinci between 1503 and "
               "1519. It was stolen in 1911 and recovered two years later. It has been on display "
               "at the Louvre in Paris since 1797. The painting "
               "is made of oil on a poplar panel.")
PERU = Article("8", "Peru", "Peru is a country in western South America. Its capital and "
               "largest city is Lima. The official language is Spanish. Its currency is the "
               "Peruvian sol. It was founded in 1821 by José de San Martín.")


def facts_in(name: str, text: str) -> dict[str, tuple[tuple[str, ...], str]]:
    """relation → (templates, answer) that `reading_facts` reads in a one-article text."""
    return {r: (t, a) for r, t, a in reading_facts(Article("1", name, text))}


def test_reading_facts_are_spans_of_the_text_and_never_the_title():
    facts = {relation: answer for relation, _, answer in reading_facts(PERU)}
    assert facts["capital"] == "Lima"
    assert facts["language"] == "Spanish"
    assert facts["currency"] == "Peruvian sol"
    assert facts["founded_year"] == "1821"
    for article in (PERU, MONA):
        for _, templates, answer in reading_facts(article):
            assert answer in article.text and answer.lower() != article.name.lower()
            assert all("{s}" in t for t in templates)


def test_who_made_a_work_skips_the_nationality_and_role_before_the_name():
    war = facts_in("War and Peace", "War and Peace is an epic novel by the Russian author Leo "
                   "Tolstoy. It was first published in 1869.")
    templates, answer = war["work_wrote"]
    assert answer == "Leo Tolstoy"
    assert "war and peace author" in {t.format(s="War and Peace").lower() for t in templates}
    bovary = facts_in("Madame Bovary", "Madame Bovary is the debut novel of French writer "
                      "Gustave Flaubert, published in 1856.")
    assert bovary["work_wrote"][1] == "Gustave Flaubert"  # "of" counts with a role only
    assert facts_in("Don Quixote", "Don Quixote is a Spanish novel by Miguel de Cervantes."
                    )["work_wrote"][1] == "Miguel de Cervantes"
    assert facts_in("Swan Lake", "Swan Lake is a ballet composed by Russian composer Pyotr "
                    "Ilyich Tchaikovsky in 1875.")["work_composed"][1] == "Pyotr Ilyich Tchaikovsky"
    statue = facts_in("Christ the Redeemer", "Christ the Redeemer is a statue of Jesus in Rio.")
    assert not any(r.startswith("work_") for r in statue)  # the subject, not the maker
    film = facts_in("Casablanca", "Casablanca is a 1942 American film directed by Michael Curtiz "
                    "and starring Humphrey Bogart.")
    assert film["directed"][1] == "Michael Curtiz" and film["starring"][1] == "Humphrey Bogart"
    assert "work_directed" not in film  # the same fact once, not the star as its director


def test_reading_questions_vary_their_phrasing_across_copies():
    questions = [q for q in reading_questions(PERU, 3) if q.relation == "capital"]
    assert len(questions) == 3
    assert len({q.question.lower().rstrip("?") for q in questions}) == 3
    assert all("peru" in q.question.lower() and q.answers == ("Lima",) for q in questions)
    forms = {q.question.lower().rstrip("?") for q in reading_questions(PERU, 6)
             if q.relation == "capital"}
    assert "peru capital" in forms or "capital of peru" in forms  # not only "what is ..."
    assert any(f.split()[0] not in ("what", "which", "who", "where", "when") for f in forms)


def test_cloze_puts_the_question_word_where_the_answer_stood():
    questions = {relation: (question, answer)
                 for relation, question, answer in cloze_questions(MONA)}
    question, answer = questions["cloze_year"]
    assert answer == "1911"
    assert question == "Mona Lisa was stolen in what year and recovered two years later"
    question, answer = questions["cloze_name"]
    assert (question, answer) == ("Mona Lisa was painted by whom between 1503 and 1519",
                                  "Leonardo da Vinci")  # the pronoun became the name
    for _, question, answer in cloze_questions(MONA):
        assert answer.lower() not in question.lower() and answer in MONA.text


def test_support_articles_of_another_benchmark_get_no_training_question(tmp_path):
    (tmp_path / "dev.jsonl").write_text(json.dumps(
        {"question": "capital of peru", "golden_answers": ["Lima"],
         "metadata": {"support": "Peru"}}) + "\n", encoding="utf-8")
    assert benchmark_support(tmp_path) == frozenset({"Peru"})
    records = [{"id": a.id, "contents": f'"{a.title}"\n{a.text}'} for a in (MONA, PERU)]
    train, _ = build_questions(records, 2)
    assert {q.articles[0] for q in train} == {a.title for a in (MONA, PERU)
                                              if not held_out(a.title)}
    train, _ = build_questions(records, 2, benchmark_support(tmp_path))
    assert "Peru" not in {q.articles[0] for q in train}
    assert any(q.family == "read" for q in train) or held_out("Mona Lisa")


def test_mix_keeps_title_answers_under_the_share(tmp_path: Path):
    runs = ([{"family": "definition"}] * 50 + [{"family": "description"}] * 50
            + [{"family": "read"}] * 20 + [{"family": "span"}] * 10)
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in runs), encoding="utf-8")
    counts = write_mix(source, tmp_path / "mix.jsonl", title_share=0.4)
    written = Counter(json.loads(line)["family"] for line in
                      (tmp_path / "mix.jsonl").read_text().splitlines())
    assert written == counts
    assert written["read"] == 20 and written["span"] == 10
    title = written["definition"] + written["description"]
    assert title == 20 and title / sum(written.values()) <= 0.4


def test_data_flags_that_cannot_work_are_refused_with_the_fix(tmp_path):
    import pytest

    from nano.build import DataConfig

    with pytest.raises(ValueError, match="--title-share"):
        DataConfig(out=tmp_path, title_share=1.0)
    with pytest.raises(ValueError, match="no tokenizer.json"):
        DataConfig(out=tmp_path, tokenizer=tmp_path)
    with pytest.raises(ValueError, match="--exclude-support"):
        DataConfig(out=tmp_path, exclude_support=tmp_path / "missing")
    with pytest.raises(ValueError, match="--read-copies"):
        DataConfig(out=tmp_path, read_copies=0)


def test_read_copies_sets_the_phrasings_of_each_relation_and_leaves_the_rest():
    from nano.build import COPIES, training_selection

    train = reading_questions(PERU, 7) + reading_questions(MONA, 7)
    relation = Counter(q.relation for q in training_selection(
        train, copies={**COPIES, "read": 7}) if not q.relation.startswith("cloze"))
    default = Counter(q.relation for q in training_selection(train)
                      if not q.relation.startswith("cloze"))
    assert relation["capital"] == 7 and default["capital"] == COPIES["read"]
    cloze = [q for q in training_selection(train, copies={**COPIES, "read": 7})
             if q.relation.startswith("cloze")]
    assert cloze and len(cloze) == len({q.question for q in cloze})  # still one each


def test_counts_and_atomic_numbers_are_asked_with_how_many_forms():
    japan = Article("9", "Japan", "Japan is an island country in East Asia. Japan is divided "
                    "into 47 prefectures. Its capital is Tokyo.")
    gold = Article("10", "Gold", "Gold is a chemical element; it has the symbol Au and atomic "
                   "number 79.")
    facts = {relation: (templates, answer) for relation, templates, answer
             in reading_facts(japan) + reading_facts(gold)}
    templates, answer = facts["count"]
    assert answer == "47" and "how many prefectures does {s} have" in templates
    templates, answer = facts["atomic_number"]
    assert answer == "79" and "atomic number of {s}" in templates


def test_swapped_answers_come_from_the_same_kind(tmp_path):
    """A "who" run never gets a year and a "when" run never gets a name."""
    from nano.sft import TrainConfig, answer_kind, read_trajectories

    def run(answer: str, n: int) -> dict:
        return {"answers": [answer], "family": "read", "segments": [
            [f"Question: question {n}?\n", False], ["<search> q </search>", True],
            [f"<information>Doc 1 it was {answer}.</information>", False],
            [f"<answer> {answer} </answer>", True]]}

    names = ["Leonardo da Vinci", "Fritz Lang", "Mario Puzo", "Hayao Miyazaki"]
    years = ["1889", "1687", "1813", "44 BC"]
    records = [run(a, n) for n, a in enumerate(names * 10 + years * 10)]
    data = tmp_path / "runs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = read_trajectories(TrainConfig(data=data, tokenizer=tmp_path, out=tmp_path / "o",
                                        swap_answers=1.0))
    swapped = [(old["answers"][0], new["answers"][0]) for old, new in zip(records, out, strict=True)
               if old["answers"] != new["answers"]]
    assert len(swapped) > 40
    assert all(answer_kind(old) == answer_kind(new) for old, new in swapped)
    assert [answer_kind(a) for a in ("1889", "44 BC", "47", "eleven", "Lima")] == [
        "year", "year", "number", "number", "name"]


def test_a_relation_is_read_however_and_wherever_the_text_states_it():
    turkey = facts_in("Turkey", "Turkey is a country mainly located in Anatolia. Ankara is "
                      "Turkey's capital and second-largest city. Istanbul is its largest city. "
                      "Turkish is the official language.")
    assert {r: turkey[r][1] for r in ("capital", "largest_city", "language")} == {
        "capital": "Ankara", "largest_city": "Istanbul", "language": "Turkish"}
    assert facts_in("Brazil", "Brazil is a federation of 26 states, which hosts the capital, "
                    "Brasília.")["capital"][1] == "Brasília"
    assert facts_in("Ethiopia", "Ethiopia is a country. The national capital and largest city, "
                    "Addis Ababa, lies west of the rift.")["capital"][1] == "Addis Ababa"
    # The capital *of* somewhere else, a pronoun, a name across a full stop, a neighbour's
    # capital: none of them is this article's capital.
    turin = facts_in("Turin", "Turin is a city in northern Italy. It is the capital of Piedmont.")
    assert "capital" not in turin and turin["in_place"][1] == "Italy"
    assert {"where is {s}", "what country is {s} in"} <= set(turin["in_place"][0])
    assert "capital" not in facts_in("Italy", "Italy is a country in Southern Europe. Milan is "
                                     "the capital city of Lombardy.")
    assert facts_in("Hokkaido", "Its longest river is the Ishikari River. Sapporo is its "
                    "capital.")["capital"][1] == "Sapporo"  # not "Ishikari River. Sapporo"
    assert "capital" not in facts_in("Montreal", "Montreal is a city in Quebec, east of the "
                                     "national capital, Ottawa.")
    # A country is where it is, not "in" a country; a bare region word is no answer.
    canada = facts_in("Canada", "Canada is a country in North America. Its capital is Ottawa.")
    assert canada["in_place"][1] == "North America"
    assert "what country is {s} in" not in canada["in_place"][0]
    assert "in_place" not in facts_in("White Nile", "The White Nile is a river in North and East "
                                      "Africa.")


def test_symbols_nobel_years_makers_and_counts_in_their_other_forms():
    iron = facts_in("Iron", "Iron is a chemical element; it has symbol Fe and atomic number 26.")
    assert iron["symbol"][1] == "Fe" and "chemical symbol of {s}" in iron["symbol"][0]
    assert facts_in("Albert Einstein", "Albert Einstein was a physicist. He received the 1921 "
                    "Nobel Prize in Physics.")["nobel_year"][1] == "1921"
    assert facts_in("Ernest Lawrence", "He received the Nobel Prize in Physics in 1939 for the "
                    "cyclotron.")["nobel_year"][1] == "1939"
    apple = facts_in("Apple Inc.", "Apple Inc. is a technology company. Founded in 1976 as "
                     "the Apple Computer Company by Steve Jobs, Steve Wozniak and Ronald Wayne, "
                     "it grew.")
    assert apple["founded"][1] == "Steve Jobs" and "who founded {s}" in apple["founded"][0]
    assert facts_in("Burj Khalifa", "Designed by the SOM architectural firm, it is the tallest "
                    "structure.")["designed"][1] == "SOM"
    quran = facts_in("Quran", "It is organized in 114 chapters which consist of verses.")
    assert quran["count"][1] == "114" and "how many chapters does {s} have" in quran["count"][0]
    cricket = facts_in("Cricket", "Cricket is played between two teams of eleven players.")
    assert cricket["count"][1] == "eleven"
    japan = facts_in("Japan", "Japan is divided into 47 administrative prefectures.")
    assert {"how many administrative prefectures does {s} have",
            "how many prefectures does {s} have"} <= set(japan["count"][0])
    assert "count" not in facts_in("Vienna", "The congress has 1815 delegates.")  # a year
    # not a unit dropped ("72 million members"), not a span of time, not a verb
    assert "count" not in facts_in("Church", "The church has 72 million members.")
    assert "count" not in facts_in("Alfred Hitchcock", "His career, spanning six decades, began.")
    assert "count" not in facts_in("Atom", "Every atom contains 11 protons is a sodium atom.")
    # a symbol only of an element, a Nobel year only of the article's subject, the maker
    # after a role and a nationality
    assert "symbol" not in facts_in("Ford Motor Company", "Ford is a carmaker. It trades under "
                                    "the ticker symbol F.")
    assert "nobel_year" not in facts_in("The Grapes of Wrath", "The Grapes of Wrath is a novel "
                                        "by John Steinbeck. Steinbeck won the 1962 Nobel Prize.")
    assert "nobel_year" not in facts_in("Anna Akhmatova", "She was nominated for the Nobel Prize "
                                        "in Literature in 1965.")
    assert facts_in("Sagrada Família", "Designed by the Catalan architect Antoni Gaudí, it is "
                    "a church.")["designed"][1] == "Antoni Gaudí"
    assert "discovered" not in facts_in("Mendelian inheritance", "The laws were re-discovered "
                                        "by Hugo de Vries.")


def test_superlatives_are_asked_as_people_search_and_answered_with_the_title():
    from nano.questions import superlative_questions

    kano = Article("9", "Kano (city)", "Kano is a city in northern Nigeria. It is the "
                   "second-largest city in Nigeria after Lagos.")
    asked = superlative_questions(kano)
    assert asked[0] == "second largest city in Nigeria"
    assert {"what is the second largest city in Nigeria", "Nigeria's second largest city",
            "which city is the second largest in Nigeria"} <= set(asked)
    toyota = superlative_questions(Article("10", "Toyota", "Toyota is a carmaker. Toyota is "
                                           "the world's largest automobile manufacturer."))
    assert toyota[0] == "largest automobile manufacturer in the world"
    puyi = superlative_questions(Article("11", "Puyi", "Puyi was the last emperor of China."))
    assert puyi[1] == "who was the last emperor of China"  # a person noun asks "who"
    # Not about the subject, not one of many, not a noun ("the first to write"), not the
    # article's own name as the place: no question.
    for text in ("Lagos is the largest city in Nigeria.",
                 "It is one of the largest cities in Nigeria.",
                 "He was the first to write history in Latin.",
                 "Kano is the largest city of Kano State.",
                 "He was the first cousin of the Buddha.",
                 "It is Shakespeare's longest play."):
        assert superlative_questions(Article("12", "Kano", text)) == (), text
    # The first superlative about another place; "which … of" is not asked.
    later = superlative_questions(Article("12", "Kano", "Kano is the largest city of Kano "
                                          "State. In 2020, it was the second-largest city of "
                                          "Nigeria."))
    assert later[0] == "second largest city of Nigeria"
    assert not any(q.startswith("which") for q in later)


def test_superlative_runs_are_title_answers_and_come_first_in_the_title_share(tmp_path: Path):
    from nano.data import questions_for

    nigeria = Article("13", "Nigeria", "Nigeria is a country in West Africa. It is the most "
                      "populous country in Africa.")
    superlatives = [q for q in questions_for(nigeria, 3) if q.family == "superlative"]
    assert len(superlatives) == 3 and len({q.question.lower().rstrip("?")
                                           for q in superlatives}) == 3
    assert all(q.answers[0] == "Nigeria" for q in superlatives)
    runs = ([{"family": "definition"}] * 50 + [{"family": "description"}] * 50
            + [{"family": "superlative"}] * 5 + [{"family": "read"}] * 30)
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in runs), encoding="utf-8")
    counts = write_mix(source, tmp_path / "mix.jsonl", title_share=0.25)
    assert counts["superlative"] == 5 and counts["read"] == 30
    assert counts["superlative"] + counts["description"] + counts["definition"] == 10


def test_who_questions_on_a_passive_verb_about_the_subject():
    doyle = facts_in("Arthur Conan Doyle", "Arthur Conan Doyle was a writer. He was knighted "
                     "by King Edward VII in 1902.")
    assert doyle["knighted"][1] == "King Edward VII"
    assert "who knighted {s}" in doyle["knighted"][0]
    # a nationality is no answer, and a passive about something else is not the subject's
    assert "introduced" not in facts_in("Lagrangian mechanics", "It was introduced by the "
                                        "Italian-French mathematician in 1788.")
    assert "produced" not in facts_in("Thriller", "Thriller is an album. The video was "
                                      "produced by John Landis.")
    # "named by" asks who named it, not what it is named after
    named = facts_in("Tropaeolum", "It was named by Carl Linnaeus in 1753.")
    assert named["named"] == (("who named {s}", "{s} was named by whom", "who was {s} named by",
                               "{s} named by"), "Carl Linnaeus")
    # a name longer than five words is not cut to its first five
    assert "owned" not in facts_in("Central Park", "It is owned by the New York City Department "
                                   "of Parks and Recreation.")
