"""Question families written from the embedded corpus: pure functions, deterministic.

Every question says which article(s) it is about, its golden answers, the first search a
person would make (the question itself) and reformulations a searcher can derive from the
question alone (never from the answer), for when the first search misses.

Families (the `family` field):
  definition   what the first sentence defines → the article's title
  description  a later sentence about the subject ("It was built …") → the title
  superlative  what a superlative names ("highest mountain in africa") → the title
  span         a relation stated in the text (who wrote / directed / founded, when, where,
               capital, nationality) → a span of the text
  twohop       a span question whose subject is named by a description, so the first
               search finds the bridge article and the second asks about it
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

TITLE_FAMILIES = ("definition", "description", "superlative")  # the answer is the title
HELD_OUT_PERCENT = 10  # articles whose questions are held out (by a hash of the title)

_STOP = set("""a an the of in on at to for by with from and or as is was are were be been
which that who whom whose what when where how it its this these those his her their he she
they them into than then also has had have do did does name called""".split())
_NAME = r"([A-Z][\w'’.-]*(?: (?:[A-Z][\w'’.-]*|de|von|van|da|of|the)){0,4})"
_NATIONALITIES = """American English British French German Italian Russian Chinese Japanese Indian
Greek Roman Spanish Dutch Austrian Polish Scottish Irish Swedish Norwegian Danish Belgian Swiss
Portuguese Brazilian Mexican Canadian Australian Hungarian Czech Persian Egyptian Arab Turkish
Korean Argentine Chilean Finnish Ukrainian Welsh Israeli Iranian Nigerian Flemish Venetian
Florentine Prussian Soviet Byzantine Ottoman Mongol Macedonian Athenian Scottish-American
German-born Austrian-born Polish-born""".split()


@dataclass(frozen=True)
class Article:
    id: str
    title: str  # without quotes, as in the corpus ("Leviathan (Hobbes book)")
    text: str

    @property
    def name(self) -> str:
        """The title without a disambiguation in parentheses: what a person calls it."""
        return re.sub(r"\s*\([^)]*\)$", "", self.title)


@dataclass(frozen=True)
class GeneratedQuestion:
    """A training or benchmark question written from the corpus, with what the teacher
    needs to answer it (the articles, the reformulations, a two-hop question's bridge)."""

    id: str
    question: str
    answers: tuple[str, ...]  # golden answers; the first is the one the teacher gives
    family: str
    articles: tuple[str, ...]  # titles of the articles the question is about
    relation: str = ""  # span kind (directed, founded_year, capital, ...)
    reformulations: tuple[str, ...] = ()
    bridge: str = ""  # two-hop: the title the first search should find
    second_query: str = ""  # two-hop: the search to make about the bridge


def stable_int(text: str) -> int:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest()[:12], 16)


def held_out(title: str) -> bool:
    """The split by article: a fixed hash of the title, never a random draw."""
    return stable_int("split:" + title) % 100 < HELD_OUT_PERCENT


def articles_from_records(records: list[dict]) -> list[Article]:
    out = []
    for record in records:
        title, _, text = record["contents"].partition("\n")
        out.append(Article(str(record["id"]), title.strip().strip('"'), text.strip()))
    return out


def sentences(text: str) -> list[str]:
    parts = re.split(r"(?<=[a-z0-9)\]])\. (?=[A-Z])", text.replace("\n", " "))
    return [p.strip().rstrip(".") for p in parts if p.strip()]


def content_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[\w'’-]+", text.lower()) if w not in _STOP]


def _clip(words: list[str], n: int) -> str:
    return " ".join(words[:n])


def _phrase(text: str) -> str:
    """A clause cut at the first comma/semicolon/parenthesis, at most 14 words."""
    text = re.split(r"[,;:(]| – | - ", text)[0].strip()
    return _clip(text.split(), 14)


# --------------------------------------------------------------------- title families

_DEF_RE = re.compile(r"^(?:The |A |An )?(.{2,80}?),? (?:\([^)]*\) )?(is|was|are|were) "
                     r"((?:a|an|the|one of the) .{8,})$")


def definition_question(article: Article, rng: random.Random) -> str | None:
    """'what is the head covering worn for various reasons' → Hat."""
    first = sentences(article.text)[:1]
    if not first:
        return None
    match = _DEF_RE.match(first[0])
    if not match:
        return None
    subject, verb, rest = match.groups()
    if content_words(article.name)[:1] and not set(content_words(article.name)) & set(
            content_words(subject)):
        return None  # the sentence is not about the article's subject
    rest = _phrase(rest)
    if len(rest.split()) < 4 or _leaks(rest, article.name):
        return None
    pattern = rng.choice(["what {v} {r}", "what {v} {r}", "which {v} {r}", "{r}",
                          "name {r}", "what is called {r}"])
    return pattern.format(v=verb if verb in ("is", "was", "are", "were") else "is", r=rest)


_PRONOUN_RE = re.compile(r"^(It|He|She|They|This) ((?:is|was|are|were|has|had|became|"
                         r"\w+ed) .{10,})$")


def description_question(article: Article) -> str | None:
    """A later sentence whose subject is the article: 'It originated …' → 'what originated …'."""
    for sentence in sentences(article.text)[1:4]:
        match = _PRONOUN_RE.match(sentence)
        if not match:
            continue
        pronoun, rest = match.groups()
        rest = _phrase(rest)
        if len(rest.split()) < 5 or _leaks(rest, article.name):
            continue
        wh = "who" if pronoun in ("He", "She") else "what"
        return f"{wh} {rest}"
    return None


# "It is the second-largest city in Nigeria", "the Andes are the longest continental mountain
# range in the world": what a superlative names, asked the way people search for it
# ("highest mountain in africa"). The answer is the article's title.
_SUPERLATIVE = (r"(?:(?:second|third|fourth|fifth|sixth)[- ](?:most |least )?)?(?:largest|"
                r"longest|highest|tallest|deepest|oldest|biggest|smallest|busiest|first|last|"
                r"fastest|heaviest|hottest|coldest|driest|wettest|richest|most populous|"
                r"most visited|most spoken|most widely used|least populous)")
# The article's own name is marked in a sentence by SUBJECT before matching, so that each
# pattern is compiled once, not once per article.
SUBJECT = "\x00"
_SUP_SUBJECT = (r"^(?:[^,]{0,80}, )?(?:[Ii]t|[Hh]e|[Ss]he|[Tt]hey|(?:[Tt]he )?\x00) "
                r"(is|was|are|were|remains) ")
_SUP_END = r"(?=[,;)]|$| and | after | by | with | as | behind | since | before )"
_SUP_RE = (  # "the largest city in Nigeria", then "the world's largest lake"
    re.compile(_SUP_SUBJECT + r"the (" + _SUPERLATIVE + r") ((?:[a-z-]+ ){0,2}?[a-z-]+) (in|of|on) "
               r"((?:the )?(?:world|[A-Z][\w'’-]*(?: (?:[A-Z][\w'’-]*|of)){0,3}))" + _SUP_END),
    # "the" before the owner: "Shakespeare's longest play" is not "longest play in Shakespeare"
    re.compile(_SUP_SUBJECT + r"the ((?:world|[A-Z][\w'’-]*(?: [A-Z][\w'’-]*){0,2}))['’]s ("
               + _SUPERLATIVE + r") ((?:[a-z-]+ ){0,2}?[a-z-]+)" + _SUP_END))
_SUP_TEMPLATES = ("{S} {N} {p} {P}", "what {V} the {S} {N} {p} {P}",
                  "which {N} {V} the {S} {p} {P}", "the {S} {N} {p} {P}", "{Ps} {S} {N}",
                  "name the {S} {N} {p} {P}")
_PERSON_NOUNS = set("""king queen emperor empress ruler monarch president pharaoh sultan leader
person man woman son daughter wife husband minister chancellor pope caliph khan tsar general
explorer author writer artist member""".split())
_KIN_TERMS = {"cousin", "lady"}


def superlative_questions(article: Article) -> tuple[str, ...]:
    """Phrasings of the first superlative an article states about its own subject, in its
    first eight sentences: "it is the largest country in Africa" → "largest country in
    africa", "what is the largest country in Africa", "Africa's largest country" … Empty when
    none names a place other than the subject itself."""
    for sentence in sentences(article.text)[:8]:
        marked = _mark_subject(sentence, article.name)
        if m := _SUP_RE[0].match(marked):
            verb, superlative, noun, prep, place = m.groups()
        elif m := _SUP_RE[1].match(marked):
            verb, place, superlative, noun = m.groups()
            prep = "in"
        else:
            continue
        place = _name_span(place)
        bare = re.sub(r"^the ", "", place)
        if (set(noun.split()) & _STOP  # "the first to write history in Latin"
                or noun.split()[0] in _KIN_TERMS  # "the first cousin of the Buddha"
                or _within(bare, article.name) or _within(article.name, bare)):
            continue
        verb = {"are": "is", "were": "was", "remains": "is"}.get(verb, verb)
        spelled = {"S": superlative.replace("-", " "), "N": noun, "p": prep, "V": verb,
                   "P": "the world" if bare == "world" else place}
        spelled["Ps"] = spelled["P"] + ("'" if spelled["P"].endswith("s") else "'s")
        out = [t.format(**spelled) for t in _SUP_TEMPLATES
               if prep != "of" or not t.startswith("which")]  # "which moon is the largest of"
        if noun.split()[-1] in _PERSON_NOUNS:
            out = [q.replace("what ", "who ", 1) for q in out]
        return tuple(out)
    return ()


def _mark_subject(sentence: str, name: str) -> str:
    """The sentence with the article's name replaced by SUBJECT wherever it is whole words."""
    parts = sentence.split(name)
    out = parts[0]
    for part in parts[1:]:
        whole = not out[-1:].isalnum() and not part[:1].isalnum()
        out += (SUBJECT if whole else name) + part
    return out


def _leaks(text: str, name: str) -> bool:
    words = set(content_words(name))
    return bool(words) and words <= set(content_words(text))


# --------------------------------------------------------------------- span families

_BY = re.compile(r"\b(directed|written|painted|founded|composed|designed|discovered|invented|"
                 r"developed|created|sculpted|authored|established|built) by " + _NAME)
_BY_Q = {"directed": "who directed {s}", "written": "who wrote {s}",
         "painted": "who painted {s}", "founded": "who founded {s}",
         "composed": "who composed {s}", "designed": "who designed {s}",
         "discovered": "who discovered {s}", "invented": "who invented {s}",
         "developed": "who developed {s}", "created": "who created {s}",
         "sculpted": "who sculpted {s}", "authored": "who wrote {s}",
         "established": "who established {s}", "built": "who built {s}"}
_IN_YEAR = re.compile(r"\b(founded|established|built|completed|published|released|written|"
                      r"formed|discovered|invented|signed|opened|constructed|premiered|"
                      r"first performed|founded) (?:in|on) (?:[\w ]{0,20}?)(\d{3,4})\b")
_IN_YEAR_Q = ["when was {s} {v}", "what year was {s} {v}", "when was {s} {v}"]
_LOCATED = re.compile(r"\b(located|situated|headquartered|based) in (?:the )?" + _NAME)
_CAPITAL = re.compile(r"\b[Cc]apital(?: and (?:the )?largest city)? is " + _NAME)
_CAPITAL_OF = re.compile(r"\bis the capital(?: and (?:the )?largest city)? of (?:the )?" + _NAME)
_NATIONALITY = re.compile(r"^(?:[^.]{0,60}) was an? (" + "|".join(_NATIONALITIES) +
                          r") ([a-z]+)")
_NOT_PEOPLE = set("dish food journal newspaper magazine company city town country river film "
                  "novel book play game sport language state breed".split())


def _name_span(span: str) -> str:
    """A captured name, trailing lowercase joiners and a sentence-final dot removed."""
    words = []
    for word in span.split():
        words.append(word)
        # A dot ends the name unless it marks an initial or an abbreviation (D. W., St.).
        if word.endswith(".") and not re.fullmatch(r"[A-Z][a-z]?\.|St\.|Jr\.", word):
            words[-1] = word.rstrip(".")
            break
    while words and words[-1] in ("de", "von", "van", "da", "of", "the"):
        words.pop()
    return " ".join(words)


def span_facts(article: Article) -> list[tuple[str, str, str]]:
    """(relation, question, answer) for each relation the article's text states."""
    s = article.name
    text = article.text
    facts = []
    if (m := _BY.search(text)) and (answer := _name_span(m.group(2))):
        facts.append((m.group(1), _BY_Q[m.group(1)].format(s=s), answer))
    if m := _IN_YEAR.search(text):
        verb = m.group(1)
        facts.append((verb + "_year", _IN_YEAR_Q[stable_int(s) % 3].format(s=s, v=verb),
                      m.group(2)))
    if (m := _LOCATED.search(text)) and (answer := _name_span(m.group(2))):
        facts.append(("located", f"where is {s} {m.group(1)}" if m.group(1) != "based"
                      else f"where is {s} based", answer))
    if (m := _CAPITAL.search(text)) and (answer := _name_span(m.group(1))):
        facts.append(("capital", f"what is the capital of {s}", answer))
    if (m := _CAPITAL_OF.search(text)) and (answer := _name_span(m.group(1))):
        facts.append(("capital_of", f"{s} is the capital of what country", answer))
    first = sentences(text)[:1]
    if (first and (m := _NATIONALITY.match(first[0])) and first[0].startswith(article.name)
            and " was " in first[0] and m.group(2) not in _NOT_PEOPLE):
        facts.append(("nationality", f"what nationality was {s}", m.group(1)))
    return [f for f in facts if f[2] and f[2].lower() not in f[1].lower()]


# ------------------------------------------------------------------- two-hop family

def description_of(article: Article) -> str | None:
    """'the dystopian novel by English author Aldous Huxley': how a question names it."""
    first = sentences(article.text)[:1]
    if not first or not (match := _DEF_RE.match(first[0])):
        return None
    rest = re.sub(r"^(a|an|one of the) ", "the ", match.group(3))
    rest = _phrase(rest)
    words = rest.split()
    if len(words) < 3 or not words[0] == "the":
        return None
    return _clip(words, 9)


# ------------------------------------------------------------------------ phrasing

def phrase(question: str, rng: random.Random) -> str:
    """As people type it: sentence case or all lowercase, with or without a question mark."""
    text = question.strip()
    style = rng.random()
    if style < 0.45:
        text = text[0].upper() + text[1:]
    elif style < 0.55:
        text = text.lower()
    if rng.random() < 0.6:
        text += "?"
    return text


def reformulations_for(question: str, subject: str | None = None) -> tuple[str, ...]:
    """Second searches derivable from the question: its subject, then its content words."""
    out = []
    if subject:
        out.append(subject)
    words = content_words(question)
    if len(words) > 3:
        out.append(" ".join(words))
        out.append(" ".join(words[:5]))
        out.append(" ".join(words[-5:]))
    return tuple(dict.fromkeys(q for q in out if q and q.lower() != question.lower()))


# ------------------------------------------------------------------- reading family
# Questions whose answer is a span of the article's text and never its title, phrased the
# many ways people ask: question word first or not, "X capital", "the author of Y".

_LOWER = r"([a-z][a-z-]+(?: [a-z][a-z-]+){0,2}?)(?=[,.;(]| and | or | with | in |$)"
# A name that starts a clause ("… while Karachi is its largest city"): no dots, no pronoun.
_CLAUSE_NAME = (r"(?:^|[.;] |, while |, and )(?!(?:It|This|The|Although|While|Its|There)\b)"
                r"([A-Z][\w'’-]*(?: [A-Z][\w'’-]*){0,3})")
_AREA = r"(?:(?:north|south|east|west|central)[a-z-]* )?"  # "in southern Siberia"
# Each relation: the ways an article states it, answer in group 1; the earliest match wins.
_READ_PATTERNS: dict[str, tuple[re.Pattern, ...]] = {
    "capital": (
        re.compile(r"\b[Cc]apital(?: city)?(?: and (?:the )?largest city)? is " + _NAME),
        re.compile(r"\b(?:hosts|has) the (?:national )?capital,? " + _NAME),
        # "the capital, X" alone also names a neighbour's capital in a city's article
        re.compile(r"\b(?:[Tt]he (?:national )?capital and largest city|[Ii]ts (?:national )?"
                   r"capital(?: and largest city)?), " + _NAME),
        re.compile(_CLAUSE_NAME + r" (?:is|became) (?:the|its|the (?:nation|country|state)['’]s|"
                   r"[A-Z][\w-]*['’]s) (?:national )?capital(?: city)?+(?! of\b)")),
    "largest_city": (
        re.compile(r"\b[Ll]argest city is " + _NAME),
        re.compile(_CLAUSE_NAME + r" is (?:its|the (?:nation|country|state)['’]s|"
                   r"[A-Z][\w-]*['’]s) largest city\b(?! of\b)")),
    "language": (re.compile(r"\b[Oo]fficial languages? (?:is|are) " + _NAME),
                 re.compile(_CLAUSE_NAME + r" is the (?:sole |only )?official language\b")),
    "currency": (re.compile(r"\b[Cc]urrency is the ((?:[A-Z][\w'-]* ){0,3}[\w'-]+)"),
                 re.compile(r"\bcommon currency,? the ((?:[A-Z][\w'-]* ){0,3}[\w'-]+)")),
    "located": (re.compile(r"\b(?:located|situated|headquartered|based) in (?:the )?" + _AREA
                           + _NAME),),
    "born": (re.compile(r"\bborn in " + _NAME),),
    "native": (re.compile(r"\bnative to (?:the )?" + _NAME),),
    "flows": (re.compile(r"\b(?:flows|empties|drains) into (?:the )?" + _NAME),),
    "named": (re.compile(r"\bnamed (?:after|for) (?:the )?" + _NAME),),
    "led": (re.compile(r"\bled by " + _NAME),),
    "member": (re.compile(r"\bmember of the " + _NAME),),
    "spoken": (re.compile(r"\bspoken (?:mainly |primarily |chiefly |mostly )?in (?:the )?"
                          + _NAME),),
    "made_of": (re.compile(r"\b(?:made|composed|built|constructed) (?:mainly |mostly |largely |"
                           r"primarily |chiefly )?(?:of|from) (?:the )?" + _LOWER),),
    "caused": (re.compile(r"\bcaused by (?:a |an |the )?" + _LOWER),),
    # only an element's: "ticker symbol F" is not a chemical symbol
    "symbol": (re.compile(r"\belement\b[^.]{0,40}\bsymbol (?:is )?([A-Z][a-z]?)\b"),),
    # won, not nominated; the subject is checked in reading_facts
    "nobel_year": (re.compile(r"\b(?:received|won|awarded) the (\d{4}) Nobel Prize"),
                   re.compile(r"\b(?:received|won|awarded) the Nobel Prize in [A-Z][a-z]+"
                              r"(?: or [A-Z][a-z]+)? in (\d{4})")),
}
_READ_TEMPLATES: dict[str, tuple[str, ...]] = {
    "capital": ("what is the capital of {s}", "capital of {s}", "{s} capital",
                "{s}'s capital city", "which city is the capital of {s}",
                "the capital city of {s} is what"),
    "largest_city": ("what is the largest city in {s}", "largest city of {s}",
                     "{s} largest city", "which is the biggest city in {s}"),
    "language": ("what is the official language of {s}", "official language of {s}",
                 "{s} official language", "what language is official in {s}"),
    "currency": ("what currency does {s} use", "currency of {s}", "{s} currency",
                 "what is the currency of {s}"),
    "located": ("where is {s}", "where is {s} located", "{s} location", "{s} is located where",
                "in which place is {s}"),
    "born": ("where was {s} born", "{s} birthplace", "{s} was born where",
             "what is the birthplace of {s}"),
    "native": ("where is {s} native to", "{s} is native to where", "{s} native range",
               "where does {s} come from"),
    "flows": ("where does {s} flow into", "{s} flows into what", "what does {s} empty into",
              "{s} drains into which"),
    "named": ("what is {s} named after", "{s} was named after whom", "who is {s} named for",
              "{s} name origin"),
    "led": ("who led {s}", "{s} was led by whom", "leader of {s}", "who was the leader of {s}"),
    "member": ("{s} is a member of what", "what is {s} a member of", "{s} member of which"),
    "spoken": ("where is {s} spoken", "{s} is spoken in which country", "{s} spoken where"),
    "made_of": ("what is {s} made of", "{s} is made of what", "what are {s} made from",
                "{s} material", "what material is {s} made of"),
    "caused": ("what causes {s}", "{s} is caused by what", "cause of {s}",
               "what is the cause of {s}"),
    "symbol": ("chemical symbol of {s}", "what is the chemical symbol for {s}", "{s} symbol",
               "{s} chemical symbol", "what is the symbol of {s}"),
    "nobel_year": ("when did {s} win the nobel prize", "what year did {s} win the Nobel Prize",
                   "{s} nobel prize year", "in which year was {s} awarded the Nobel Prize",
                   "when was {s} awarded the nobel prize"),
    "written": ("who wrote {s}", "who's the author of {s}", "{s} author", "the author of {s}",
                "{s} was written by whom", "who is the writer of {s}"),
    "authored": ("who wrote {s}", "{s} author", "who's the author of {s}"),
    "painted": ("who painted {s}", "{s} painter", "which artist painted {s}",
                "{s} was painted by who", "the painter of {s}"),
    "directed": ("who directed {s}", "{s} director", "the director of {s}",
                 "who was the director of {s}", "{s} was directed by whom"),
    "founded": ("who founded {s}", "{s} founder", "founder of {s}", "who was the founder of {s}",
                "{s} was founded by who"),
    "composed": ("who composed {s}", "{s} composer", "which composer wrote {s}",
                 "the composer of {s}"),
    "designed": ("who designed {s}", "{s} designer", "the designer of {s}",
                 "{s} was designed by whom"),
}
_NUMBER_WORDS = "two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
# Not a year, and not "72 million members" or "56,594 square kilometres" (the head alone
# would drop the unit).
_COUNT_NUMBER = (r"((?!1\d{3}\b|20\d{2}\b)\d[\d,]*|" + _NUMBER_WORDS + r") "
                 r"(?!(?:million|billion|thousand|hundred|square|cubic|per)\b)"
                 r"((?:[a-z]+ )?([a-z]+s))\b")
_NOT_COUNTED = {"years", "decades", "centuries", "months", "weeks", "days", "hours", "minutes",
                "seconds", "degrees", "kilometres", "kilometers", "miles", "metres", "meters",
                "times", "is", "its", "this", "was", "has", "as"}
_COUNT = re.compile(r"\b(?:has|have|had|contains|contained|consists of|consisting of|comprises|"
                    r"comprised|comprising|divided into|made up of|organi[sz]ed in(?:to)?|"
                    r"(?:opera|play|ballet|symphony|series|drama|musical) in|teams? of) "
                    + _COUNT_NUMBER)
_COUNT_TEMPLATES = ("how many {n} does {s} have", "how many {n} are in {s}",
                    "{s} number of {n}", "number of {n} in {s}", "how many {n} has {s}",
                    "how many {h} does {s} have", "how many {h} in {s}")  # {h}: the noun alone
_ATOMIC = re.compile(r"\batomic number (?:of )?(\d{1,3})\b")
_ATOMIC_TEMPLATES = ("atomic number of {s}", "what is the atomic number of {s}",
                     "{s} atomic number", "what's {s}'s atomic number")
_READ_BY_DEFAULT = ("who {v} {s}", "{s} was {v} by whom", "who was {s} {v} by", "{s} {v} by")
_YEAR_TEMPLATES = ("when was {s} {v}", "what year was {s} {v}", "{s} was {v} in what year",
                   "in which year was {s} {v}", "year {s} was {v}", "{s} {v} when")
_NOT_ANSWERS = set(_NATIONALITIES) | {"The", "A", "An", "It", "He", "She", "They", "This", "In"}
# "X is a novel by the Russian author Leo Tolstoy": who made a work, as a first sentence
# names it. The "who wrote X" questions people ask most are phrased on these sentences,
# and the author is preceded by a nationality and a role that the model must skip.
_WORK_VERB = {"novel": "wrote", "novella": "wrote", "book": "wrote", "poem": "wrote",
              "play": "wrote", "tragedy": "wrote", "comedy": "wrote", "epic": "wrote",
              "essay": "wrote", "treatise": "wrote", "story": "wrote", "musical": "wrote",
              "painting": "painted", "portrait": "painted", "fresco": "painted",
              "mural": "painted", "opera": "composed", "ballet": "composed",
              "symphony": "composed", "concerto": "composed", "oratorio": "composed",
              "film": "directed", "sculpture": "sculpted", "statue": "sculpted",
              "song": "sang"}
_ROLES = ("author|writer|novelist|poet|playwright|dramatist|painter|artist|composer|director|"
          "filmmaker|sculptor|philosopher|cartoonist|musician|singer|band|rock band|architect")
_MAKER = r"(?:[A-Z][\w-]* ){0,3}(?:[a-z]+ )?(?:" + _ROLES + r") "  # "the Italian artist"
# "Founded in 1976 as the Apple Computer Company by Steve Jobs": the maker after a detour,
# and "designed by the Catalan architect Antoni Gaudí": after a role.
_BY_LOOSE = re.compile(r"(?<![-\w])((?i:founded|established|designed|created|developed|"
                       r"invented|discovered)) (?:in \d{4} )?(?:as [^,.;]{3,40} )?by (?:the )?"
                       r"(?:" + _MAKER + r")?" + _NAME)
_WORK_BY = re.compile(
    r"\b(" + "|".join(_WORK_VERB) + r")s? (?:(?:first |originally )?(?:written|painted|"
    r"composed|directed|created|sculpted) )?(?:by (?:the )?(?:" + _MAKER + r")?|of (?:the )?"
    + _MAKER + r")" + _NAME)
_WORK_TEMPLATES = {
    "wrote": ("who wrote {s}", "{s} author", "who is the author of {s}", "{s} was written by whom",
              "the writer of {s}", "who wrote the {k} {s}", "{s} {k} author"),
    "painted": ("who painted {s}", "{s} painter", "which artist painted {s}",
                "who made the {k} {s}", "{s} was painted by whom", "{s} artist"),
    "composed": ("who composed {s}", "{s} composer", "who wrote the music of {s}",
                 "which composer wrote the {k} {s}", "{s} was composed by whom"),
    "directed": ("who directed {s}", "{s} director", "who made the film {s}",
                 "the director of the {k} {s}", "{s} was directed by whom"),
    "sculpted": ("who sculpted {s}", "{s} sculptor", "who made the {k} {s}",
                 "the sculptor of {s}"),
    "sang": ("who sang {s}", "{s} singer", "who performed {s}", "whose {k} is {s}",
             "{s} by whom"),
}
# "X is a landlocked country in Western Europe", "a port city in southwestern Nigeria": where X
# is, as its first sentence says. Only a town, lake, mountain … is asked "what country".
_IN_PLACE = re.compile(r"^[^.]{0,80}? (?:is|was) an? (?:[\w-]+ ){0,4}?(country|city|town|lake|"
                       r"river|island|state|region|mountain|volcano|village|province|desert|sea|"
                       r"port|capital) (?:located )?in (?:the )?" + _AREA + _NAME + r"(?! and)")
_IN_PLACE_TEMPLATES = ("where is {s}", "{s} location", "where is {s} found",
                       "in which part of the world is {s}")
_IN_COUNTRY_TEMPLATES = ("what country is {s} in", "{s} is in which country",
                         "in which country is {s}")
_REGION_WORDS = {"North", "South", "East", "West", "Central", "Baltic", "Northern", "Southern",
                 "Eastern", "Western"}
# "It was coined by Sir Thomas More", "He was assassinated by …": one of these verbs in the
# passive, in a sentence whose subject is the article's: the verbs people ask "who …" about.
# The name must end where the clause does ("owned by the New York City Department of Parks
# and Recreation" is no answer cut at five words).
_PASSIVE_VERBS = ("produced|edited|commissioned|owned|governed|conquered|launched|introduced|"
                  "proposed|executed|knighted|predicted|published|devised|coined|killed|"
                  "assassinated|ruled|captured|defeated|sired|discovered|named|formulated|"
                  "patented|financed|funded|operated|manufactured|translated|illustrated|"
                  "narrated|murdered|crowned|baptized|excommunicated|invaded|annexed")
_PASSIVE_BY = re.compile(r"^(?:It|He|She|They|\x00) (?:was|were|is|are|had been|has been) "
                         r"(?:(?:first|later|originally|also|officially|jointly) )?("
                         + _PASSIVE_VERBS + r") by "
                         r"(?:the )?(?:" + _MAKER + r")?" + _NAME
                         + r"(?=[,;(]|$| and | with | as | under | to | in | on | at | for | from "
                         r"| during | after | before )")
_STARRING = re.compile(r"\bstarring (?:the )?" + _NAME)
_STARRING_TEMPLATES = ("who starred in {s}", "{s} star", "who played the lead in {s}",
                       "{s} lead actor", "who was the star of {s}")


def reading_facts(article: Article) -> list[tuple[str, tuple[str, ...], str]]:
    """(relation, question templates with {s} for the subject, answer span) for each relation
    the text states; the answer is never the title and occurs in the text as written."""
    text = article.text
    facts: list[tuple[str, tuple[str, ...], str]] = []
    for relation, patterns in _READ_PATTERNS.items():
        if not (m := _earliest(patterns, text)):
            continue
        answer = _name_span(m.group(1)) if relation not in ("made_of", "caused") else m.group(1)
        facts.append((relation, _READ_TEMPLATES[relation], answer))
    if ((m := _earliest((_BY, _BY_LOOSE), text)) and text[m.start() - 1:m.start()] != "-"
            and (answer := _without_nationality(_name_span(m.group(2))))):  # "re-discovered"
        verb = m.group(1).lower()
        templates = _READ_TEMPLATES.get(verb) or tuple(t.replace("{v}", verb)
                                                       for t in _READ_BY_DEFAULT)
        facts.append((verb, templates, answer))
    for sentence in sentences(text)[:8]:
        if ((m := _PASSIVE_BY.match(_mark_subject(sentence, article.name)))
                and (answer := _without_nationality(_name_span(m.group(2))))
                and not set(answer.replace("-", " ").split()) <= set(_NATIONALITIES)
                and all(answer != fact[2] and fact[0] != m.group(1) for fact in facts)):
            verb = m.group(1)  # "named by" is not `named` (after)
            facts.append((verb, tuple(t.replace("{v}", verb) for t in _READ_BY_DEFAULT),
                          answer))
            break
    first = sentences(text)[:1]
    if first and (m := _WORK_BY.search(first[0])) and (answer := _without_nationality(
            _name_span(m.group(2)))):
        kind, verb = m.group(1), _WORK_VERB[m.group(1)]
        if all(answer != fact[2] for fact in facts):  # "film directed by X" is `directed`
            facts.append(("work_" + verb, tuple(t.replace("{k}", kind)
                                                for t in _WORK_TEMPLATES[verb]), answer))
    if ((m := _IN_PLACE.match(text)) and (answer := _name_span(m.group(2)))
            and answer not in _REGION_WORDS and answer not in _NATIONALITIES
            and all(answer != fact[2] and fact[0] != "located" for fact in facts)):
        country = m.group(1) not in ("country", "state", "region", "province", "sea", "desert")
        facts.append(("in_place", _IN_PLACE_TEMPLATES + (_IN_COUNTRY_TEMPLATES if country
                                                          else ()), answer))
    if (m := _STARRING.search(text)) and (answer := _name_span(m.group(1))):
        facts.append(("starring", _STARRING_TEMPLATES, answer))
    if m := _IN_YEAR.search(text):
        verb = m.group(1)
        facts.append((verb + "_year", tuple(t.replace("{v}", verb) for t in _YEAR_TEMPLATES),
                      m.group(2)))
    if (m := _COUNT.search(text)) and m.group(3) not in _NOT_COUNTED:
        noun, head = m.group(2), m.group(3)
        facts.append(("count", tuple(dict.fromkeys(t.replace("{n}", noun).replace("{h}", head)
                                                   for t in _COUNT_TEMPLATES)),
                      m.group(1)))
    if m := _ATOMIC.search(text):
        facts.append(("atomic_number", _ATOMIC_TEMPLATES, m.group(1)))
    facts = [f for f in facts if f[0] != "nobel_year" or _about_the_subject(f[2], article)]
    # A language is often named by the same word as a nationality ("Spanish").
    return [f for f in facts if _good_answer(f[2], article, f[0] == "language")]


def _about_the_subject(year: str, article: Article) -> bool:
    """The sentence stating the prize year is about the article's subject (a person): it
    starts with "He", "She" or the name, and not with the book or the experiment's author."""
    words = article.name.split()
    for sentence in sentences(article.text):
        if year in sentence and "Nobel" in sentence:
            return (re.match(r"(?:He|She|" + re.escape(words[-1]) + r")\b", sentence) is not None
                    or sentence.startswith(words[0]))  # the full name starts so too
    return False


def _earliest(patterns: tuple[re.Pattern, ...], text: str) -> re.Match | None:
    # The first statement of a relation is the lead's, about the article's own subject; a
    # later one is more often about something the article mentions.
    found = [m for pattern in patterns if (m := pattern.search(text))]
    return min(found, key=lambda m: m.start(), default=None)


def _without_nationality(name: str) -> str:
    """'French Impressionist Claude Monet' → 'Impressionist Claude Monet': a nationality
    before a maker's name is not part of it."""
    words = name.split()
    while len(words) > 1 and words[0] in _NATIONALITIES:
        words.pop(0)
    return " ".join(words)


def _good_answer(answer: str, article: Article, adjective: bool = False) -> bool:
    words = answer.split()
    return (0 < len(words) <= 6 and (adjective or answer not in _NOT_ANSWERS)
            and not _within(answer, article.name) and not _within(article.name, answer)
            and re.search(r"\b" + re.escape(answer) + r"\b", article.text) is not None)


def _within(part: str, whole: str) -> bool:
    return re.search(r"\b" + re.escape(part.lower()) + r"\b", whole.lower()) is not None


_PRONOUN_START = re.compile(r"^(It|He|She|They)\b ")
_CLOZE_YEAR = re.compile(r"\b(in|since|until|by) (\d{4})\b(?! ?[–-])")
_CLOZE_NAME = re.compile(r"\b(by|in|at|from|of|to|with|and|as|under) (?:the )?" + _NAME)
_CLOZE_WH = {"by": "by whom", "in": "where", "at": "where", "from": "from where",
             "of": "of what", "to": "to what", "with": "with what", "and": "and what",
             "as": "as what", "under": "under whom"}


def cloze_questions(article: Article) -> list[tuple[str, str, str]]:
    """(relation, question, answer): a sentence about the article with one year or name
    replaced by a question word in place ("the tower was completed in what year"), cut after
    the clause that held the answer. A pronoun subject becomes the article's name, so the
    question names what it asks about."""
    out: list[tuple[str, str, str]] = []
    name_words = set(content_words(article.name))
    for sentence in sentences(article.text)[:6]:
        sentence = _PRONOUN_START.sub(article.name + " ", sentence, count=1)
        if not name_words or not name_words <= set(content_words(sentence)):
            continue
        for relation, match in _cloze_candidates(sentence):
            answer = match.group(2) if relation == "year" else _name_span(match.group(2))
            if not _good_answer(answer, article) or answer.lower() in sentence[
                    :match.start(2)].lower():
                continue
            end = match.start(2) + len(answer)
            wh = "what year" if relation == "year" else _CLOZE_WH[match.group(1)].split()[-1]
            head = sentence[:match.start(1)] + (match.group(1) + " " if relation == "year"
                                                 and wh == "what year" else "")
            if relation != "year":
                head = sentence[:match.start(1)] + _CLOZE_WH[match.group(1)]
                wh = ""
            tail = re.split(r"[,;:(]| – ", sentence[end:])[0]
            question = " ".join((head + " " + wh + tail).split())
            if not 5 <= len(question.split()) <= 22 or not name_words <= set(
                    content_words(question)):
                continue
            out.append(("cloze_" + relation, question, answer))
            break
        if len(out) >= 2:
            break
    return out


def _cloze_candidates(sentence: str) -> list[tuple[str, re.Match]]:
    found = [("year", m) for m in _CLOZE_YEAR.finditer(sentence)]
    found += [("name", m) for m in _CLOZE_NAME.finditer(sentence) if m.start() > 8]
    return sorted(found, key=lambda item: item[1].start())
