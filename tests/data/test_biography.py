"""Tests of the biography generator and the local tokenizer (tiny and cpu presets: a few seconds)."""

from __future__ import annotations

import re

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from scalecl.data.biography import (
    ATTRIBUTES,
    MONTHS,
    PRONOUNS,
    BioConfig,
    People,
    biographies,
    generate_people,
    load_pools,
    preset,
    qa_pairs,
    ranges,
    read_list,
    templates,
)
from scalecl.data.tokenizer import (
    AnswerTokenizationError,
    bio_tokenizer_corpus,
    encode_plain,
    first_answer_token,
    first_answer_tokens,
    load_tokenizer,
    train_bio_tokenizer,
    train_tokenizer,
)

FIXED_QUESTIONS = (
    "What is the birth date of {}?",
    "What is the birth city of {}?",
    "Which university did {} study?",
    "What major did {} study?",
    "Which company did {} work for?",
    "Where did {} work?",
)


@pytest.fixture(scope="module")
def tiny() -> People:
    return generate_people(preset("tiny"))


@pytest.fixture(scope="module")
def cpu() -> People:
    return generate_people(preset("cpu"))


@pytest.fixture(scope="module")
def cpu_tokenizer(cpu: People):
    return train_bio_tokenizer(cpu)


def render(template: str, name: str, value: str, female: bool) -> str:
    """Independent re-implementation of a template fill, to check texts end to end."""
    for placeholder, forms in PRONOUNS.items():
        template = template.replace(placeholder, forms[int(female)])
    return template.replace("{name}", name).replace("{value}", value)


# --------------------------------------------------------------------------- config and lists


def test_presets_have_the_protocol_sizes() -> None:
    paper, cpu = preset("paper"), preset("cpu")
    assert (paper.n_people, paper.n_bio, paper.n_task1) == (200_000, 100_000, 20_000)
    assert (paper.n_first, paper.n_middle, paper.n_last) == (400, 400, 1000)
    assert (paper.n_cities, paper.n_universities, paper.n_majors, paper.n_companies) == (200, 300, 100, 263)
    assert (paper.n_texts, paper.n_templates) == (5, 50)
    assert (cpu.n_first, cpu.n_middle, cpu.n_last, cpu.n_cities, cpu.n_universities) == (100, 100, 200, 50, 50)
    assert (cpu.n_majors, cpu.n_companies, cpu.n_texts, cpu.n_templates) == (30, 50, 5, 5)
    assert 1000 <= cpu.n_people <= 1500 and 200 <= preset("tiny").n_people <= 300
    assert preset("cpu", seed=3).seed == 3
    with pytest.raises(ValueError):
        preset("huge")


@pytest.mark.parametrize(
    "bad", [dict(n_texts=6, n_templates=5), dict(n_bio=1100, n_task1=200), dict(n_people=0), dict(seed=-1), dict(n_first=1, n_middle=1, n_last=10)]
)
def test_config_rejects_impossible_sizes(bad: dict) -> None:
    with pytest.raises(ValueError):
        BioConfig(**bad)


def test_shipped_lists_cover_the_paper_preset() -> None:
    pools = load_pools(preset("paper"))  # raises if a list is too short
    assert not set(read_list("first_names")) & set(read_list("middle_names"))
    for items in (pools.first, pools.middle, pools.last, pools.cities, pools.universities, pools.majors,
                  pools.companies):
        assert len(set(items)) == len(items)
    for name in pools.first + pools.middle + pools.last:
        assert re.fullmatch(r"[A-Z][a-z]+", name), name
    for city in pools.cities + pools.company_hq:
        assert re.fullmatch(r"[A-Z][A-Za-z. ]+, [A-Z]{2}", city), city
    for small in ("cpu", "tiny"):  # small pools: companies are headquartered in birth-city pool cities
        small_pools = load_pools(preset(small))
        assert set(small_pools.company_hq) <= set(small_pools.cities)
    share = sum(u.split()[0] == "University" for u in pools.universities) / len(pools.universities)
    assert 0.35 <= share <= 0.41
    for attribute in ATTRIBUTES:
        assert len(templates(attribute)) == 50
        assert len(set(templates(attribute))) == 50


def test_ranges_follow_the_protocol() -> None:
    r = ranges(preset("cpu"))
    assert r.pretrain == (0, 1000) and r.task0_train == (0, 500)
    assert r.task0_heldout == (500, 1000) and r.task1 == (1000, 1200)
    paper = ranges(preset("paper"))
    assert paper.task0_heldout == (50_000, 100_000) and paper.task1 == (100_000, 120_000)


# --------------------------------------------------------------------------- people


def test_same_seed_same_data_other_seed_other_data(tiny: People) -> None:
    again = generate_people(preset("tiny"))
    assert biographies(again) == biographies(tiny)
    assert qa_pairs(again).prompts == qa_pairs(tiny).prompts
    assert qa_pairs(again).answers == qa_pairs(tiny).answers
    other = generate_people(preset("tiny", seed=1))
    assert other.names != tiny.names
    assert biographies(other) != biographies(tiny)


def test_ranges_render_the_same_strings_as_the_whole(tiny: People) -> None:
    n = tiny.cfg.n_texts
    assert biographies(tiny, tiny.cfg, 10, 20) == biographies(tiny)[10 * n:20 * n]
    assert qa_pairs(tiny, 10, 20).answers == qa_pairs(tiny).answers[60:120]
    with pytest.raises(ValueError):
        biographies(tiny, preset("cpu"))
    with pytest.raises(ValueError):
        qa_pairs(tiny, 0, len(tiny) + 1)


def test_names_are_unique_triples_from_disjoint_pools(cpu: People) -> None:
    assert len(set(cpu.names)) == len(cpu)
    for name in cpu.names:
        first, middle, last = name.split(" ")
        assert first in cpu.pools.first and middle in cpu.pools.middle and last in cpu.pools.last
    assert not set(cpu.pools.first) & set(cpu.pools.middle)


def test_attributes_are_in_range_and_company_city_is_the_headquarters(cpu: People) -> None:
    assert set(cpu.day.tolist()) <= set(range(1, 29)) and cpu.year.min() >= 1900 and cpu.year.max() <= 2099
    assert 0.4 < cpu.female.mean() < 0.6
    companies, cities = cpu.values("company"), cpu.values("company_city")
    hq = dict(zip(cpu.pools.companies, cpu.pools.company_hq, strict=True))
    assert all(hq[c] == city for c, city in zip(companies, cities, strict=True))
    assert len(set(companies)) == cpu.cfg.n_companies  # every company used: uniform draws
    birthday = cpu.values("birthday", 0, 1)[0]
    assert re.fullmatch(rf"({'|'.join(MONTHS)}) \d{{1,2}}, \d{{4}}", birthday)


@pytest.mark.parametrize("preset_name", ["tiny", "cpu"])
def test_texts_are_permuted_sentences_with_distinct_templates(preset_name: str, tiny: People, cpu: People) -> None:
    people = {"tiny": tiny, "cpu": cpu}[preset_name]
    cfg = people.cfg
    texts = biographies(people)
    assert len(texts) == cfg.n_texts * len(people)
    in_use = {a: templates(a)[:cfg.n_templates] for a in ATTRIBUTES}
    for i, name in enumerate(people.names):
        female = bool(people.female[i])
        values = {a: people.values(a, i, i + 1)[0] for a in ATTRIBUTES}
        used = {a: [] for a in ATTRIBUTES}
        orders = []
        for text in texts[i * cfg.n_texts:(i + 1) * cfg.n_texts]:
            assert text.startswith(name) and text.count(name) == len(ATTRIBUTES)
            found = {}
            for a in ATTRIBUTES:
                hits = [(k, s) for k, t in enumerate(in_use[a]) if (s := render(t, name, values[a], female)) in text]
                assert len(hits) == 1, (text, a, hits)
                used[a].append(hits[0][0])
                found[a] = hits[0][1]
            order = sorted(ATTRIBUTES, key=lambda a: text.index(found[a]))
            assert text == " ".join(found[a] for a in order)  # sentences joined by single spaces
            orders.append(tuple(order))
            for sentence in found.values():
                assert sentence.startswith(name) and sentence.endswith(".")
        assert len(set(orders)) == cfg.n_texts
        for a in ATTRIBUTES:
            assert len(set(used[a])) == cfg.n_texts


def test_texts_name_no_one_by_pronoun_at_sentence_start(tiny: People) -> None:
    starts = {m.group(1) for text in biographies(tiny) for m in re.finditer(r"\. (\w+)", text)}
    assert not starts & {"He", "She", "His", "Her"}


# --------------------------------------------------------------------------- QA


def test_qa_pairs_six_per_person_in_protocol_format(cpu: People) -> None:
    r = ranges(cpu.cfg)
    qa = qa_pairs(cpu, *r.task0_heldout)
    assert len(qa) == 6 * (r.task0_heldout[1] - r.task0_heldout[0])
    assert qa.attribute_names()[:6] == list(ATTRIBUTES)
    for pair in list(qa)[:600]:
        name = cpu.names[pair.person]
        question = FIXED_QUESTIONS[ATTRIBUTES.index(pair.attribute)].format(name)
        assert pair.prompt == question + "\nAnswer:"
        assert pair.answer == " " + cpu.values(pair.attribute, pair.person, pair.person + 1)[0]
        assert pair.answer.startswith(" ") and not pair.answer.startswith("  ") and not pair.answer.endswith(".")
    spans = [r.task0_train, r.task0_heldout, r.task1]
    people_sets = [set(qa_pairs(cpu, *span).people.tolist()) for span in spans]
    assert not people_sets[0] & people_sets[1] and not people_sets[1] & people_sets[2]
    assert not people_sets[0] & people_sets[2]
    assert people_sets[2] == set(range(*r.task1)) and not people_sets[2] & set(range(*r.pretrain))
    subset = qa.select([0, 7])
    assert list(subset) == [qa[0], qa[7]]


# --------------------------------------------------------------------------- tokenizer


def test_tokenizer_round_trip_through_save_pretrained(tiny: People, tmp_path) -> None:
    tokenizer = train_bio_tokenizer(tiny)
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token) == ("<eos>", "<pad>", "<unk>")
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert load_tokenizer(tmp_path).get_vocab() == tokenizer.get_vocab()
    assert (reloaded.eos_token_id, reloaded.pad_token_id, reloaded.unk_token_id) == (
        tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
    qa = qa_pairs(tiny)
    texts = biographies(tiny, None, 0, 20) + qa.prompts[:120] + qa.answers[:120]
    ids = reloaded(texts, add_special_tokens=False)["input_ids"]
    assert ids == tokenizer(texts, add_special_tokens=False)["input_ids"] == encode_plain(reloaded, texts)
    assert all(tokenizer.unk_token_id not in row for row in ids)  # the corpus covers every word
    assert [reloaded.decode(row) for row in ids] == texts  # lossless: greedy answers compare as strings


def test_load_tokenizer_reports_a_missing_directory(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")


def test_first_answer_token_is_stable_after_the_prompt(tiny: People) -> None:
    tokenizer = train_bio_tokenizer(tiny)
    qa = qa_pairs(tiny)
    firsts = first_answer_tokens(tokenizer, qa.prompts, qa.answers)
    for prompt, answer, first in zip(qa.prompts, qa.answers, firsts, strict=True):
        alone = tokenizer(answer, add_special_tokens=False)["input_ids"]
        joint = tokenizer(prompt + answer, add_special_tokens=False)["input_ids"]
        n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert first == alone[0] == joint[n_prompt]
    assert first_answer_token(tokenizer, qa.prompts[0], qa.answers[0]) == firsts[0]
    assert first_answer_tokens(tokenizer, qa.prompts, qa.answers, check=False) == firsts


def test_first_answer_token_rejects_unstable_or_unknown_answers() -> None:
    tokenizer = train_tokenizer(["ab", "a", "b", "x: y"])
    with pytest.raises(AnswerTokenizationError, match="not the prompt's tokens"):
        first_answer_token(tokenizer, "a", "b")  # "ab" is one word: the boundary merges
    with pytest.raises(AnswerTokenizationError, match="unknown token"):
        first_answer_token(tokenizer, "x:", " zebra")


def test_bpe_hub_style_tokenizer_loads_with_a_pad_and_keeps_answers_stable(tiny: People, tmp_path) -> None:
    """A Pythia/GPT-2-like byte-level BPE without pad token: the QA format must suit it too."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(bio_tokenizer_corpus(tiny), trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|endoftext|>").save_pretrained(tmp_path)
    tokenizer = load_tokenizer(str(tmp_path))
    assert tokenizer.pad_token == tokenizer.eos_token == "<|endoftext|>"
    qa = qa_pairs(tiny)
    firsts = first_answer_tokens(tokenizer, qa.prompts, qa.answers)
    assert firsts == [row[0] for row in encode_plain(tokenizer, qa.answers)]


def test_cpu_values_start_with_a_token_unique_to_the_value(cpu: People, cpu_tokenizer) -> None:
    unk = cpu_tokenizer.unk_token_id
    for attribute in ATTRIBUTES[1:]:
        values = cpu.pools.values_of(attribute)
        firsts = [row[0] for row in encode_plain(cpu_tokenizer, [" " + v for v in values])]
        assert unk not in firsts, attribute
        assert len(set(firsts)) == len(values), attribute
    months = [row[0] for row in encode_plain(cpu_tokenizer, [f" {m} 1, 1950" for m in MONTHS])]
    assert len(set(months)) == 12 and unk not in months  # birthday: the first token is the month
