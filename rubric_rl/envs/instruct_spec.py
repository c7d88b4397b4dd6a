"""What the English instruction-following domain is made of: topics, requests and instruction
types (IFEval's families: length, case, punctuation, keywords, lists, wrappers, start / end,
sections, postscripts, highlights, placeholders), each with its prompt sentence, the regular
expression that reads it back from a prompt, its checker, weight, criterion text and skill text.

A task is one request about one topic ("Write a short note about how bees make honey.") followed
by one to three instruction sentences. Two instructions that occupy the same *slot* (two
layouts, two case rules, two things at the end, a JSON answer and anything that shapes the text
around it) never meet in one task, so every task is satisfiable; ``tests/envs`` checks that each
generated task's reference answer passes its own checkers.

Ours, labelled: the prompt wording, topics, counts, weights, slots, skill texts and the
OOD choice are this project's, written for a 135M-parameter instruction-tuned model (short
answers: every length target fits in ~200 new tokens).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rubric_rl.envs import hashed_splits

DOMAIN = "instruct"


@dataclasses.dataclass(frozen=True)
class Topic:
    phrase: str  # as the request writes it: "how bees make honey"
    word: str  # the topic's main word (the forbidden and the counted keyword draw it)
    keywords: tuple[str, ...]  # other words an on-topic answer naturally uses


# One topic a line: its phrase | its main word | five keywords.
_TOPIC_ROWS = """
how bees make honey | honey | bees flowers nectar hive sweet
the benefits of drinking water | water | health body thirst energy daily
why people keep dogs as pets | dogs | pets loyal walk friend family
how to plant a tree | tree | soil roots water sun garden
the history of the bicycle | bicycle | wheels pedals ride invented road
how rain forms | rain | clouds water drops weather sky
tips for a good night's sleep | sleep | bed rest night tired dark
why reading books is useful | books | reading learn stories words mind
how to make a cup of tea | tea | water cup leaves hot milk
the life of a butterfly | butterfly | wings caterpillar flowers eggs color
how the moon changes shape | moon | phases sun light night earth
the joy of cooking at home | cooking | food kitchen recipe meal family
how to stay safe in the sun | sun | skin hat shade water summer
why the ocean is salty | ocean | salt water rivers rocks sea
how trains changed travel | trains | travel rail cities fast people
the importance of friendship | friendship | friends trust help share kind
how to learn a new language | language | words practice speak learn listen
why leaves change color in autumn | leaves | autumn trees color red cold
how a library works | library | books borrow read shelves quiet
the benefits of walking every day | walking | health legs walk heart fresh
how to care for a houseplant | plant | water light soil leaves pot
why we celebrate birthdays | birthday | cake party friends year gift
how snow is made | snow | cold winter ice flakes clouds
the work of a farmer | farmer | crops animals farm fields food
how to save money | money | save spend bank budget plan
why music makes people happy | music | songs sound happy dance listen
how airplanes fly | airplanes | wings air fly engine sky
the benefits of eating fruit | fruit | apples healthy sweet vitamins eat
how to keep a room tidy | room | clean tidy clothes floor space
why cats sleep so much | cats | sleep energy hunt nap pets
how a volcano erupts | volcano | lava rock heat ash mountain
the fun of playing board games | games | board play friends rules win
how to write a letter to a friend | letter | friend write news dear send
why exercise is good for the heart | exercise | heart health run body strong
how bread is baked | bread | flour oven dough yeast bake
the beauty of the night sky | stars | night sky moon dark light
how to plan a picnic | picnic | food park basket friends sun
why recycling matters | recycling | waste plastic paper earth reuse
how fish breathe underwater | fish | water gills oxygen swim breathe
the job of a firefighter | firefighter | fire safe help truck brave
"""
TOPICS: tuple[Topic, ...] = tuple(
    Topic(phrase, word, tuple(keywords.split()))
    for phrase, word, keywords in (
        (part.strip() for part in row.split("|")) for row in _TOPIC_ROWS.strip().splitlines()
    )
)

# The request a task opens with; "{topic}" is the topic's phrase.
REQUESTS: tuple[str, ...] = (
    "Write a short note about {topic}.",
    "Explain {topic} to a ten-year-old.",
    "Describe {topic}.",
    "Give some advice about {topic}.",
    "Tell me about {topic}.",
)

START_PHRASES = ("Here is my answer", "In short", "Let me explain", "To begin with")
END_PHRASES = (
    "Is there anything else I can help with?",
    "That is all for now.",
    "Thank you for reading.",
)
PLACEHOLDER_EXAMPLE = "[name]"


@dataclasses.dataclass(frozen=True)
class InstructionType:
    """One instruction type: how it is drawn, stated, read back, checked and taught.

    ``sample(rng, topic)`` draws its parameters; ``sentence(params)`` states it in the prompt and
    ``pattern`` (a regular expression with named groups) reads the sentence back, ``parse(groups)``
    giving the same parameters; ``checker`` and ``args(params)`` name its rule check
    (``instruct_checkers``); ``criterion(params)`` is the rubric's text, ``skill`` the general
    advice (ARISE's skill, calibration's guided arm); ``slots`` what of the answer it shapes.
    """

    id: str
    family: str
    slots: frozenset[str]
    weight: float
    sample: Callable[[np.random.Generator, Topic], dict[str, Any]]
    sentence: Callable[[Mapping[str, Any]], str]
    pattern: str
    parse: Callable[[Mapping[str, str]], dict[str, Any]]
    checker: str
    args: Callable[[Mapping[str, Any]], dict[str, Any]]
    criterion: Callable[[Mapping[str, Any]], str]
    skill: str

    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)


def _choice(rng: np.random.Generator, options) -> Any:
    return options[int(rng.integers(len(options)))]


def _n(options) -> Callable[[np.random.Generator, Topic], dict[str, Any]]:
    return lambda rng, topic: {"n": int(_choice(rng, options))}


def _none(rng: np.random.Generator, topic: Topic) -> dict[str, Any]:
    return {}


def _int_n(g: Mapping[str, str]) -> dict[str, Any]:
    return {"n": int(g["n"])}


def _no_params(g: Mapping[str, str]) -> dict[str, Any]:
    return {}


def _n_args(p: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": int(p["n"])}


def _no_args(p: Mapping[str, Any]) -> dict[str, Any]:
    return {}


def _keywords(rng: np.random.Generator, topic: Topic) -> dict[str, Any]:
    pair = rng.permutation(len(topic.keywords))[:2]
    return {"words": [topic.keywords[int(i)] for i in sorted(pair)]}


def _type(id: str, family: str, slots: str, weight: float, **kw: Any) -> InstructionType:
    return InstructionType(
        id=id, family=family, slots=frozenset(slots.split()), weight=weight, **kw
    )


_W = r"[A-Za-z][A-Za-z'-]*"
_PHRASE = r"[^\"\n]+"

TYPES: tuple[InstructionType, ...] = (
    _type("words_max", "length", "length", 1.5, sample=_n((30, 40, 50, 60)),
          sentence=lambda p: f"Answer in at most {p['n']} words.",
          pattern=r"Answer in at most (?P<n>\d+) words\.", parse=_int_n,
          checker="if_words_max", args=_n_args,
          criterion=lambda p: f"The answer has at most {p['n']} words.",
          skill="Keep it short: write only a few short sentences, count the words before you "
                "finish, and stop well before the limit."),
    _type("words_min", "length", "length", 1.5, sample=_n((40, 60, 80)),
          sentence=lambda p: f"Write at least {p['n']} words.",
          pattern=r"Write at least (?P<n>\d+) words\.", parse=_int_n,
          checker="if_words_min", args=_n_args,
          criterion=lambda p: f"The answer has at least {p['n']} words.",
          skill="Write enough: give several full sentences with details and examples so the "
                "answer is long enough."),
    _type("sentences_max", "length", "length layout", 1.5, sample=_n((2, 3)),
          sentence=lambda p: f"Use no more than {p['n']} sentences.",
          pattern=r"Use no more than (?P<n>\d+) sentences\.", parse=_int_n,
          checker="if_sentences_max", args=_n_args,
          criterion=lambda p: f"The answer has at most {p['n']} sentences.",
          skill="Count your sentences: each one ends with a period, so write only that many "
                "periods and then stop."),
    _type("paragraphs", "length", "layout", 1.5, sample=_n((2, 3)),
          sentence=lambda p: f"Write exactly {p['n']} paragraphs separated by a blank line.",
          pattern=r"Write exactly (?P<n>\d+) paragraphs separated by a blank line\.",
          parse=_int_n, checker="if_paragraphs", args=_n_args,
          criterion=lambda p: f"The answer has exactly {p['n']} paragraphs separated by blank "
                              "lines.",
          skill="Paragraphs are blocks of text with an empty line between them: write the "
                "asked number of blocks, no more and no fewer."),
    _type("lowercase", "case", "case", 2.0, sample=_none,
          sentence=lambda p: "Write your whole answer in lowercase letters, with no capital "
                             "letters at all.",
          pattern=r"Write your whole answer in lowercase letters, with no capital letters at "
                  r"all\.", parse=_no_params,
          checker="if_lowercase", args=_no_args,
          criterion=lambda p: "The whole answer is in lowercase letters.",
          skill="For lowercase, never press shift: even the first word of a sentence and names "
                "start with a small letter."),
    _type("uppercase", "case", "case", 2.0, sample=_none,
          sentence=lambda p: "Write your whole answer in capital letters only.",
          pattern=r"Write your whole answer in capital letters only\.", parse=_no_params,
          checker="if_uppercase", args=_no_args,
          criterion=lambda p: "The whole answer is in capital letters.",
          skill="For capital letters only, write EVERY WORD LIKE THIS, from the first word to the "
                "last."),
    _type("capital_words", "case", "case", 1.0, sample=_n((2, 3)),
          sentence=lambda p: f"Write at least {p['n']} words in ALL CAPITALS for emphasis.",
          pattern=r"Write at least (?P<n>\d+) words in ALL CAPITALS for emphasis\.",
          parse=_int_n, checker="if_capital_words", args=_n_args,
          criterion=lambda p: f"At least {p['n']} words are written in all capitals.",
          skill="To emphasise, write a few important words in capitals, like VERY or ALWAYS."),
    _type("no_commas", "punctuation", "commas", 2.0, sample=_none,
          sentence=lambda p: "Do not use any commas.",
          pattern=r"Do not use any commas\.", parse=_no_params,
          checker="if_no_commas", args=_no_args,
          criterion=lambda p: "The answer contains no commas.",
          skill="Without commas, write short sentences and join ideas with 'and' or a period "
                "instead of a comma."),
    _type("keywords", "keywords", "keywords", 2.0, sample=_keywords,
          sentence=lambda p: f"Include the words \"{p['words'][0]}\" and \"{p['words'][1]}\".",
          pattern=rf"Include the words \"(?P<a>{_W})\" and \"(?P<b>{_W})\"\.",
          parse=lambda g: {"words": [g["a"], g["b"]]},
          checker="if_keywords", args=lambda p: {"words": tuple(p["words"])},
          criterion=lambda p: f"The answer uses the words \"{p['words'][0]}\" and "
                              f"\"{p['words'][1]}\".",
          skill="Before you finish, check that every word you were asked to include appears in "
                "the answer, spelled exactly as given."),
    _type("forbidden", "keywords", "main_word", 2.0, sample=lambda rng, t: {"word": t.word},
          sentence=lambda p: f"Do not use the word \"{p['word']}\".",
          pattern=rf"Do not use the word \"(?P<word>{_W})\"\.", parse=lambda g: dict(g),
          checker="if_forbidden", args=lambda p: {"word": p["word"]},
          criterion=lambda p: f"The answer never uses the word \"{p['word']}\".",
          skill="When a word is forbidden, talk around it: use another word or 'it' instead, "
                "even if it is the topic itself."),
    _type("keyword_count", "keywords", "main_word", 1.5,
          sample=lambda rng, t: {"word": t.word, "n": int(_choice(rng, (2, 3)))},
          sentence=lambda p: f"Use the word \"{p['word']}\" at least {p['n']} times.",
          pattern=rf"Use the word \"(?P<word>{_W})\" at least (?P<n>\d+) times\.",
          parse=lambda g: {"word": g["word"], "n": int(g["n"])},
          checker="if_keyword_count", args=lambda p: {"word": p["word"], "n": int(p["n"])},
          criterion=lambda p: f"The word \"{p['word']}\" appears at least {p['n']} times.",
          skill="To use a word several times, repeat it in different sentences instead of "
                "replacing it with 'it' or 'they'."),
    _type("bullets", "lists", "layout markdown", 2.0, sample=_n((2, 3, 4)),
          sentence=lambda p: f"Answer with exactly {p['n']} bullet points, each on its own line "
                             "starting with \"* \".",
          pattern=r"Answer with exactly (?P<n>\d+) bullet points, each on its own line starting "
                  r"with \"\* \"\.", parse=_int_n,
          checker="if_bullets", args=_n_args,
          criterion=lambda p: f"The answer has exactly {p['n']} bullet points starting with "
                              "\"* \".",
          skill="A bullet list puts each point on a new line that starts with '* '; write "
                "exactly the asked number of such lines and nothing else as a list."),
    _type("numbered", "lists", "layout", 2.0, sample=_n((2, 3, 4)),
          sentence=lambda p: f"Give exactly {p['n']} numbered items, one per line, as \"1.\", "
                             "\"2.\" and so on.",
          pattern=r"Give exactly (?P<n>\d+) numbered items, one per line, as \"1\.\", \"2\.\" and "
                  r"so on\.", parse=_int_n,
          checker="if_numbered", args=_n_args,
          criterion=lambda p: f"The answer has exactly {p['n']} numbered items, numbered 1 to "
                              f"{p['n']}.",
          skill="A numbered list puts each item on a new line starting with its number and a "
                "period (1. 2. 3.); stop after the last asked number."),
    _type("json", "wrappers", "wrapper layout start end commas title markdown", 3.0,
          sample=_none,
          sentence=lambda p: "Format your entire answer as valid JSON.",
          pattern=r"Format your entire answer as valid JSON\.", parse=_no_params,
          checker="if_json", args=_no_args,
          criterion=lambda p: "The entire answer is valid JSON.",
          skill="For JSON, the whole answer is one object like {\"answer\": \"...\"}: start with "
                "{ and end with }, put text in double quotes, and write nothing outside it."),
    _type("quotation", "wrappers", "wrapper start end", 2.0, sample=_none,
          sentence=lambda p: "Wrap your entire answer in double quotation marks.",
          pattern=r"Wrap your entire answer in double quotation marks\.", parse=_no_params,
          checker="if_quotation", args=_no_args,
          criterion=lambda p: "The entire answer is wrapped in double quotation marks.",
          skill="To wrap an answer in quotation marks, make \" the very first character and \" "
                "the very last one."),
    _type("title", "wrappers", "title start", 1.5, sample=_none,
          sentence=lambda p: "Give your answer a title wrapped in double angular brackets, such "
                             "as <<my title>>.",
          pattern=r"Give your answer a title wrapped in double angular brackets, such as "
                  r"<<my title>>\.", parse=_no_params,
          checker="if_title", args=_no_args,
          criterion=lambda p: "The answer has a title wrapped in double angular brackets.",
          skill="Put the title on the first line between << and >>, for example <<Why It "
                "Matters>>, then write the answer below it."),
    _type("start_phrase", "start_end", "start", 2.0,
          sample=lambda rng, t: {"phrase": _choice(rng, START_PHRASES)},
          sentence=lambda p: f"Start your answer with the words \"{p['phrase']}\".",
          pattern=rf"Start your answer with the words \"(?P<phrase>{_PHRASE})\"\.",
          parse=lambda g: dict(g),
          checker="if_start_phrase", args=lambda p: {"phrase": p["phrase"]},
          criterion=lambda p: f"The answer starts with \"{p['phrase']}\".",
          skill="When told how to start, make those exact words the first words of the answer, "
                "before any greeting."),
    _type("end_phrase", "start_end", "end", 2.0,
          sample=lambda rng, t: {"phrase": _choice(rng, END_PHRASES)},
          sentence=lambda p: f"End your answer with the exact phrase \"{p['phrase']}\", with "
                             "nothing after it.",
          pattern=rf"End your answer with the exact phrase \"(?P<phrase>{_PHRASE})\", with "
                  r"nothing after it\.", parse=lambda g: dict(g),
          checker="if_end_phrase", args=lambda p: {"phrase": p["phrase"]},
          criterion=lambda p: f"The answer ends with \"{p['phrase']}\".",
          skill="When told how to end, make the given phrase the very last words and write "
                "nothing after it."),
    _type("postscript", "content", "end", 1.5, sample=_none,
          sentence=lambda p: "At the end, add a postscript starting with \"P.S.\".",
          pattern=r"At the end, add a postscript starting with \"P\.S\.\"\.", parse=_no_params,
          checker="if_postscript", args=_no_args,
          criterion=lambda p: "The answer ends with a postscript starting with \"P.S.\".",
          skill="A postscript is a last line that starts with P.S. followed by one short extra "
                "thought."),
    _type("question_end", "start_end", "end", 1.0, sample=_none,
          sentence=lambda p: "Finish your answer with a question to the reader.",
          pattern=r"Finish your answer with a question to the reader\.", parse=_no_params,
          checker="if_question_end", args=_no_args,
          criterion=lambda p: "The answer ends with a question mark.",
          skill="To finish with a question, make the last sentence ask the reader something and "
                "end it with '?'."),
    _type("sections", "lists", "layout start", 2.0, sample=_n((2, 3)),
          sentence=lambda p: f"Split your answer into {p['n']} sections, each starting with a "
                             "line \"SECTION X\" where X is its number.",
          pattern=r"Split your answer into (?P<n>\d+) sections, each starting with a line "
                  r"\"SECTION X\" where X is its number\.", parse=_int_n,
          checker="if_sections", args=_n_args,
          criterion=lambda p: f"The answer has {p['n']} sections headed SECTION 1 to SECTION "
                              f"{p['n']}.",
          skill="Sections are headed by their own line: SECTION 1, then its text, then "
                "SECTION 2, and so on."),
    _type("highlights", "content", "markdown", 1.5, sample=_n((2, 3)),
          sentence=lambda p: f"Highlight at least {p['n']} phrases with markdown, like "
                             "*this phrase*.",
          pattern=r"Highlight at least (?P<n>\d+) phrases with markdown, like \*this phrase\*\.",
          parse=_int_n, checker="if_highlights", args=_n_args,
          criterion=lambda p: f"At least {p['n']} phrases are highlighted with *asterisks*.",
          skill="To highlight, put one asterisk right before and right after a phrase, like "
                "*fresh water*."),
    _type("placeholders", "content", "placeholders", 1.5, sample=_n((1, 2)),
          sentence=lambda p: f"Include at least {p['n']} placeholders in square brackets, such "
                             f"as {PLACEHOLDER_EXAMPLE}.",
          pattern=r"Include at least (?P<n>\d+) placeholders in square brackets, such as "
                  r"\[name\]\.", parse=_int_n,
          checker="if_placeholders", args=_n_args,
          criterion=lambda p: f"The answer has at least {p['n']} placeholders in square "
                              "brackets.",
          skill="A placeholder is a word in square brackets that the reader fills in later, like "
                "[name] or [date]."),
)  # fmt: skip

TYPE_BY_ID: dict[str, InstructionType] = {t.id: t for t in TYPES}
if len(TYPE_BY_ID) != len(TYPES):
    raise AssertionError("instruct_spec: two instruction types share an id")

# Types never in training or held-out tasks (OOD only): one per family that has a sibling in
# training, so an OOD type is new but of a kind the skills talk about.
OOD_TYPES: tuple[str, ...] = ("sections", "highlights", "placeholders", "capital_words")
TRAIN_TYPES: tuple[str, ...] = tuple(t.id for t in TYPES if t.id not in OOD_TYPES)
# Pairs of training types that meet only in OOD tasks (compatible, each trained on its own).
OOD_PAIRS: tuple[frozenset[str], ...] = (
    frozenset({"bullets", "keyword_count"}),
    frozenset({"title", "words_max"}),
    frozenset({"numbered", "no_commas"}),
    frozenset({"lowercase", "end_phrase"}),
)
# Instructions per task and their probabilities.
N_INSTRUCTIONS = (1, 2, 3)
N_INSTRUCTIONS_P = (0.3, 0.4, 0.3)
HELDOUT_PERCENT = 20
VALIDATION_PERCENT = 10
SPLITS = hashed_splits.SPLITS


def compatible(ids) -> bool:
    """Whether instruction types can share a task: no slot used twice."""
    used: set[str] = set()
    for i in ids:
        slots = TYPE_BY_ID[i].slots
        if used & slots:
            return False
        used |= slots
    return True


def has_ood_pair(ids) -> bool:
    s = set(ids)
    return any(pair <= s for pair in OOD_PAIRS)


for _pair in OOD_PAIRS:
    if not compatible(_pair) or not _pair <= set(TRAIN_TYPES):
        raise AssertionError(f"instruct_spec: OOD pair {sorted(_pair)} is not two compatible "
                             "training types")  # fmt: skip
