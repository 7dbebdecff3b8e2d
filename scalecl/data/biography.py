"""Synthetic biographies and QA pairs for the SCALE knowledge-retention experiment.

A seeded generator of fictional people with six attributes (birthday, birth city, university,
major, company, company city), their biography texts ("multi5 + permute + fullname": several texts
per person, each with different templates and its own sentence order, every sentence starting with
the full name) and the six QA pairs per person.

All names, attribute values and the 50 templates per attribute are the project's own and ship in
``scalecl/data/lists/*.txt``; the lists are long enough for the ``paper`` preset (no value is
synthesised), smaller presets take the first N items of each list. The lists are ordered so that the
first 50 cities, 50 universities, 30 majors and 50 companies (the ``cpu`` pools) have a distinct first
word per value, and the first 50 companies have their headquarters among the first 50 cities.

People are indexed 0..n_people-1 and every draw for person i is made once, up front, by
:func:`generate_people`; :func:`biographies` and :func:`qa_pairs` only render index ranges, so any
slice of people gives the same strings whichever range it is requested in.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from operator import itemgetter
from typing import NamedTuple

import numpy as np

ATTRIBUTES: tuple[str, ...] = ("birthday", "birth_city", "university", "major", "company", "company_city")

# One fixed question per attribute; "{name}" is the full name.
QUESTIONS: dict[str, str] = {
    "birthday": "What is the birth date of {name}?",
    "birth_city": "What is the birth city of {name}?",
    "university": "Which university did {name} study?",
    "major": "What major did {name} study?",
    "company": "Which company did {name} work for?",
    "company_city": "Where did {name} work?",
}
ANSWER_CUE = "\nAnswer:"

MONTHS: tuple[str, ...] = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)
YEARS = (1900, 2099)  # inclusive
DAYS = (1, 28)  # inclusive: every month has these days

# Pronoun placeholders of the templates, rendered per gender (index 0 = male, 1 = female).
PRONOUNS: dict[str, tuple[str, str]] = {"{he}": ("he", "she"), "{his}": ("his", "her"), "{him}": ("him", "her")}

# Every ordering of the six sentences; a text's order is an index into this table.
PERMUTATIONS: tuple[tuple[int, ...], ...] = tuple(itertools.permutations(range(len(ATTRIBUTES))))
_ORDER_GETTERS = tuple(itemgetter(*p) for p in PERMUTATIONS)

# Independent random streams, so that e.g. changing n_texts leaves names and attributes unchanged.
_STREAM_NAMES, _STREAM_GENDER, _STREAM_BIRTHDAY, _STREAM_ATTRS, _STREAM_TEMPLATES, _STREAM_ORDERS = range(6)

_CHUNK_PEOPLE = 20_000  # render biographies in chunks to bound peak memory at paper scale


@dataclass(frozen=True)
class BioConfig:
    """Sizes and seed of one biography data set (people, pools, texts, templates)."""

    n_people: int = 1_200
    n_bio: int = 1_000  # people [0, n_bio) get biographies; the first half of them are QA-trained
    n_task1: int = 200  # new people [n_bio, n_bio + n_task1), QA only
    n_first: int = 100
    n_middle: int = 100
    n_last: int = 200
    n_cities: int = 50
    n_universities: int = 50
    n_majors: int = 30
    n_companies: int = 50
    n_texts: int = 5
    n_templates: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        """Reject sizes the protocol cannot satisfy, before any drawing starts."""
        for name, value in vars(self).items():
            if not isinstance(value, int) or value < (0 if name == "seed" else 1):
                raise ValueError(f"BioConfig.{name} must be a {'non-negative' if name == 'seed' else 'positive'} "
                                 f"int, got {value!r}")
        if self.n_bio + self.n_task1 > self.n_people:
            raise ValueError(f"n_bio + n_task1 = {self.n_bio + self.n_task1} exceeds n_people = {self.n_people}")
        if self.n_bio < 2:
            raise ValueError("n_bio must be at least 2 (it is split into QA-trained and held-out halves)")
        if self.n_texts > self.n_templates:
            raise ValueError(f"n_texts={self.n_texts} needs at least as many templates, got {self.n_templates}")
        if self.n_texts > len(PERMUTATIONS):
            raise ValueError(f"n_texts={self.n_texts} exceeds the {len(PERMUTATIONS)} sentence orders")
        if self.n_people > self.n_first * self.n_middle * self.n_last:
            raise ValueError("n_people exceeds the number of distinct first/middle/last name triples")


PRESETS: dict[str, BioConfig] = {
    "paper": BioConfig(
        n_people=200_000, n_bio=100_000, n_task1=20_000, n_first=400, n_middle=400, n_last=1_000,
        n_cities=200, n_universities=300, n_majors=100, n_companies=263, n_texts=5, n_templates=50,
    ),
    "cpu": BioConfig(),
    "tiny": BioConfig(
        n_people=250, n_bio=200, n_task1=50, n_first=30, n_middle=30, n_last=50,
        n_cities=20, n_universities=20, n_majors=15, n_companies=20, n_texts=5, n_templates=5,
    ),
}


def preset(name: str, **overrides: int) -> BioConfig:
    """Named preset (``paper``, ``cpu``, ``tiny``), optionally with some fields replaced (e.g. seed)."""
    try:
        cfg = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown biography preset {name!r}; choose from {sorted(PRESETS)}") from None
    return replace(cfg, **overrides)


@dataclass(frozen=True)
class BioRanges:
    """Half-open person-index ranges of the protocol's stages."""

    pretrain: tuple[int, int]  # biographies are pre-trained
    task0_train: tuple[int, int]  # Task 0 QA training people
    task0_heldout: tuple[int, int]  # Task 0 evaluation: biographies seen, QA never trained
    task1: tuple[int, int]  # new people: QA only, biographies never pre-trained


def ranges(cfg: BioConfig) -> BioRanges:
    """Person ranges used by the stages: [0, N_bio), [0, N_bio/2), [N_bio/2, N_bio), [N_bio, N_bio + N_t1)."""
    half = cfg.n_bio // 2
    return BioRanges(
        pretrain=(0, cfg.n_bio),
        task0_train=(0, half),
        task0_heldout=(half, cfg.n_bio),
        task1=(cfg.n_bio, cfg.n_bio + cfg.n_task1),
    )


# --------------------------------------------------------------------------- lists and templates


@cache
def read_list(name: str) -> tuple[str, ...]:
    """Non-empty stripped lines of ``scalecl/data/lists/<name>.txt`` (shipped as package data)."""
    text = resources.files("scalecl.data").joinpath("lists", f"{name}.txt").read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def _take(name: str, n: int) -> tuple[str, ...]:
    """First n items of a list, failing loudly instead of silently using a smaller pool."""
    items = read_list(name)
    if n > len(items):
        raise ValueError(f"pool {name!r} needs {n} items but lists/{name}.txt has {len(items)}")
    return items[:n]


@dataclass(frozen=True)
class Pools:
    """The value pools of one config; company_hq[i] is the headquarters city of companies[i]."""

    first: tuple[str, ...]
    middle: tuple[str, ...]
    last: tuple[str, ...]
    cities: tuple[str, ...]
    universities: tuple[str, ...]
    majors: tuple[str, ...]
    companies: tuple[str, ...]
    company_hq: tuple[str, ...]

    def values_of(self, attribute: str) -> tuple[str, ...]:
        """Distinct possible values of a non-birthday attribute (for chance floors and token checks)."""
        by_attribute = {
            "birth_city": self.cities, "university": self.universities, "major": self.majors,
            "company": self.companies, "company_city": tuple(dict.fromkeys(self.company_hq)),
        }
        if attribute not in by_attribute:
            raise ValueError(f"no finite value pool for attribute {attribute!r}")
        return by_attribute[attribute]


def load_pools(cfg: BioConfig) -> Pools:
    """Pools of the sizes in cfg, each the head of its shipped list."""
    first, middle = _take("first_names", cfg.n_first), _take("middle_names", cfg.n_middle)
    if set(first) & set(middle):
        raise ValueError("first and middle name pools overlap; full names would be ambiguous")
    companies, hq = zip(*(line.split("|") for line in _take("companies", cfg.n_companies)), strict=True)
    return Pools(
        first=first, middle=middle, last=_take("last_names", cfg.n_last),
        cities=_take("cities", cfg.n_cities), universities=_take("universities", cfg.n_universities),
        majors=_take("majors", cfg.n_majors), companies=tuple(companies), company_hq=tuple(hq),
    )


def _check_template(attribute: str, template: str) -> None:
    """A template must start with the name, contain the value once after it, and end with a period."""
    rest = template.replace("{name}", "", 1).replace("{value}", "", 1)
    for placeholder in PRONOUNS:
        rest = rest.replace(placeholder, "")
    if not template.startswith("{name}") or template.count("{value}") != 1 or not template.endswith("."):
        raise ValueError(f"bad {attribute} template {template!r}")
    if "{" in rest or "}" in rest:
        raise ValueError(f"unknown placeholder in {attribute} template {template!r}")


@cache
def templates(attribute: str) -> tuple[str, ...]:
    """The shipped templates of one attribute, validated."""
    found = read_list(f"templates_{attribute}")
    for template in found:
        _check_template(attribute, template)
    return found


def _template_parts(attribute: str, n_templates: int) -> tuple[list[str], list[str]]:
    """Per (gender, template) code g * n_templates + k: the text between name and value, and after value.

    A sentence is then ``name + middle[code] + value + tail[code]``, which is much faster than format().
    """
    available = templates(attribute)
    if n_templates > len(available):
        raise ValueError(f"n_templates={n_templates} but only {len(available)} {attribute} templates ship")
    middles, tails = [], []
    for gender in (0, 1):
        for template in available[:n_templates]:
            for placeholder, forms in PRONOUNS.items():
                template = template.replace(placeholder, forms[gender])
            middle, tail = template[len("{name}"):].split("{value}")
            middles.append(middle)
            tails.append(tail)
    return middles, tails


# --------------------------------------------------------------------------- people


@dataclass(eq=False)  # identity equality: numpy columns have no truth value
class People:
    """All people of one config, column-wise; pool attributes are indices into ``pools``."""

    cfg: BioConfig
    pools: Pools
    names: list[str]
    female: np.ndarray  # bool; decides pronouns only
    month: np.ndarray  # 0..11
    day: np.ndarray
    year: np.ndarray
    birth_city: np.ndarray
    university: np.ndarray
    major: np.ndarray
    company: np.ndarray  # the company city is company_hq[company], never drawn
    template_ids: np.ndarray  # (n_people, 6, n_texts): template of attribute a in text t
    order_ids: np.ndarray  # (n_people, n_texts): index into PERMUTATIONS
    _value_cache: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.names)

    def values(self, attribute: str, start: int = 0, stop: int | None = None) -> list[str]:
        """Surface form of one attribute for people [start, stop), e.g. "May 28, 1952"."""
        if attribute not in self._value_cache:
            self._value_cache[attribute] = self._render_values(attribute)
        return self._value_cache[attribute][start:stop]

    def _render_values(self, attribute: str) -> list[str]:
        """Surface forms of one attribute for everyone (cached: each is reused by texts and QA)."""
        if attribute == "birthday":
            return [f"{MONTHS[m]} {d}, {y}" for m, d, y in
                    zip(self.month.tolist(), self.day.tolist(), self.year.tolist(), strict=True)]
        pool, index = {
            "birth_city": (self.pools.cities, self.birth_city),
            "university": (self.pools.universities, self.university),
            "major": (self.pools.majors, self.major),
            "company": (self.pools.companies, self.company),
            "company_city": (self.pools.company_hq, self.company),
        }[attribute]
        return [pool[i] for i in index.tolist()]

    def record(self, index: int) -> dict[str, str]:
        """One person as a readable dict (for debugging and examples)."""
        out = {"name": self.names[index], "gender": "female" if self.female[index] else "male"}
        out.update({a: self.values(a, index, index + 1)[0] for a in ATTRIBUTES})
        return out


def _rng(cfg: BioConfig, stream: int) -> np.random.Generator:
    """Generator for one independent stream of draws, fixed by (seed, stream)."""
    return np.random.default_rng([cfg.seed, stream])


def _unique_triples(rng: np.random.Generator, n: int, sizes: tuple[int, int, int]) -> np.ndarray:
    """n distinct (first, middle, last) index triples: uniform draws, repeats rejected, in draw order."""
    n_first, n_middle, n_last = sizes
    total = n_first * n_middle * n_last
    codes = np.empty(0, dtype=np.int64)
    while len(codes) < n:
        need = n - len(codes)
        stream = np.concatenate([codes, rng.integers(0, total, size=need + need // 8 + 16)])
        _, first_seen = np.unique(stream, return_index=True)
        codes = stream[np.sort(first_seen)][:n]  # keeps earlier accepted codes as the prefix
    return np.stack([codes // (n_middle * n_last), (codes // n_last) % n_middle, codes % n_last], axis=1)


def _distinct_choices(rng: np.random.Generator, rows: int, k: int, n: int) -> np.ndarray:
    """For each row, k distinct values of range(n) in random order (uniform over k-permutations)."""
    if k * k > n:  # collisions are likely: rank random keys instead of rejecting
        return np.argsort(rng.random((rows, n)), axis=1, kind="stable")[:, :k]
    out = rng.integers(0, n, size=(rows, k))
    while True:
        ordered = np.sort(out, axis=1)
        bad = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
        if bad.size == 0:
            return out
        out[bad] = rng.integers(0, n, size=(bad.size, k))


def generate_people(cfg: BioConfig) -> People:
    """Draw every person of cfg (names, gender, attributes, and their texts' templates and orders)."""
    pools = load_pools(cfg)
    n = cfg.n_people
    triples = _unique_triples(_rng(cfg, _STREAM_NAMES), n, (cfg.n_first, cfg.n_middle, cfg.n_last))
    names = [f"{pools.first[f]} {pools.middle[m]} {pools.last[la]}" for f, m, la in triples.tolist()]

    birthday_rng = _rng(cfg, _STREAM_BIRTHDAY)
    attrs_rng = _rng(cfg, _STREAM_ATTRS)
    template_rng = _rng(cfg, _STREAM_TEMPLATES)
    template_ids = np.stack(
        [_distinct_choices(template_rng, n, cfg.n_texts, cfg.n_templates) for _ in ATTRIBUTES], axis=1
    ).astype(np.int16)
    return People(
        cfg=cfg,
        pools=pools,
        names=names,
        female=_rng(cfg, _STREAM_GENDER).random(n) < 0.5,
        month=birthday_rng.integers(0, len(MONTHS), size=n),
        day=birthday_rng.integers(DAYS[0], DAYS[1] + 1, size=n),
        year=birthday_rng.integers(YEARS[0], YEARS[1] + 1, size=n),
        birth_city=attrs_rng.integers(0, cfg.n_cities, size=n),
        university=attrs_rng.integers(0, cfg.n_universities, size=n),
        major=attrs_rng.integers(0, cfg.n_majors, size=n),
        company=attrs_rng.integers(0, cfg.n_companies, size=n),
        template_ids=template_ids,
        order_ids=_distinct_choices(_rng(cfg, _STREAM_ORDERS), n, cfg.n_texts, len(PERMUTATIONS)).astype(np.int16),
    )


def _check_range(people: People, start: int, stop: int | None) -> tuple[int, int]:
    """Resolve stop=None and reject ranges outside the generated people."""
    stop = len(people) if stop is None else stop
    if not 0 <= start <= stop <= len(people):
        raise ValueError(f"person range [{start}, {stop}) outside [0, {len(people)})")
    return start, stop


# --------------------------------------------------------------------------- biographies


def _render_sentences(people: People, attribute: str, start: int, stop: int) -> list[str]:
    """Sentence of one attribute for every text of people [start, stop), person-major."""
    cfg = people.cfg
    a = ATTRIBUTES.index(attribute)
    middles, tails = _template_parts(attribute, cfg.n_templates)
    codes = people.template_ids[start:stop, a, :] + cfg.n_templates * people.female[start:stop, None]
    reps = range(cfg.n_texts)
    names = [name for name in people.names[start:stop] for _ in reps]
    values = [value for value in people.values(attribute, start, stop) for _ in reps]
    return [name + middles[c] + value + tails[c]
            for name, value, c in zip(names, values, codes.ravel().tolist(), strict=True)]


def biographies(people: People, cfg: BioConfig | None = None, start: int = 0, stop: int | None = None) -> list[str]:
    """Biography texts of people [start, stop): n_texts per person, person-major.

    ``texts[k]`` belongs to person ``start + k // n_texts``. cfg, if given, must be the config the
    people were generated with (it is stored on ``people``; the argument only guards against mix-ups).
    """
    if cfg is not None and cfg != people.cfg:
        raise ValueError("cfg differs from the config these people were generated with")
    start, stop = _check_range(people, start, stop)
    texts: list[str] = []
    for lo in range(start, stop, _CHUNK_PEOPLE):
        hi = min(lo + _CHUNK_PEOPLE, stop)
        sentences = zip(*(_render_sentences(people, a, lo, hi) for a in ATTRIBUTES), strict=True)
        orders = people.order_ids[lo:hi].ravel().tolist()
        texts.extend(" ".join(_ORDER_GETTERS[o](row)) for row, o in zip(sentences, orders, strict=True))
    return texts


def pretrain_texts(people: People, cfg: BioConfig, lo: int, hi: int) -> list[str]:
    """The pre-training biographies of people [lo, hi), each starting with a space as the reference asserts."""
    return [" " + t for t in biographies(people, cfg, lo, hi)]


# --------------------------------------------------------------------------- QA


class QAPair(NamedTuple):
    """One question: prompt ends with "\\nAnswer:", answer is " " + value (no EOS, no final period)."""

    prompt: str
    answer: str
    attribute: str
    person: int


@dataclass(frozen=True)
class QASet:
    """QA pairs column-wise, person-major with ATTRIBUTES order inside each person."""

    prompts: list[str]
    answers: list[str]
    attributes: np.ndarray  # int8 index into ATTRIBUTES
    people: np.ndarray  # int64 person index

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, i: int) -> QAPair:
        return QAPair(self.prompts[i], self.answers[i], ATTRIBUTES[self.attributes[i]], int(self.people[i]))

    def __iter__(self) -> Iterator[QAPair]:
        return (self[i] for i in range(len(self)))

    def attribute_names(self) -> list[str]:
        """Attribute name of every pair."""
        return [ATTRIBUTES[a] for a in self.attributes.tolist()]

    def select(self, indices: np.ndarray | list[int]) -> QASet:
        """Sub-set by pair indices (e.g. an evaluation slice), keeping the columns aligned."""
        idx = np.asarray(indices, dtype=np.int64)
        return QASet([self.prompts[i] for i in idx.tolist()], [self.answers[i] for i in idx.tolist()],
                     self.attributes[idx], self.people[idx])


def question(attribute: str, name: str) -> str:
    """The QA prompt of one attribute for one person: question, newline, "Answer:"."""
    return QUESTIONS[attribute].format(name=name) + ANSWER_CUE


def qa_pairs(people: People, start: int = 0, stop: int | None = None) -> QASet:
    """The six QA pairs of each person in [start, stop)."""
    start, stop = _check_range(people, start, stop)
    parts = [(head, tail + ANSWER_CUE) for head, tail in (QUESTIONS[a].split("{name}") for a in ATTRIBUTES)]
    names = people.names[start:stop]
    prompts = [head + name + tail for name in names for head, tail in parts]
    columns = [people.values(a, start, stop) for a in ATTRIBUTES]
    answers = [" " + value for row in zip(*columns, strict=True) for value in row]
    n_attr = len(ATTRIBUTES)
    return QASet(
        prompts=prompts,
        answers=answers,
        attributes=np.tile(np.arange(n_attr, dtype=np.int8), stop - start),
        people=np.repeat(np.arange(start, stop, dtype=np.int64), n_attr),
    )
