"""The offline bilingual stand-in for the paper's CPT corpora. It is NOT FineWeb-Edu or FineWeb2.

The paper continues pre-training Llama-3.2-1B on Korean web text (FineWeb2 kor_Hang) and measures English
perplexity on FineWeb-Edu. Neither corpus (nor the model) is available offline, so `scalecl train-cpt`
runs out of the box on two synthetic text domains the project generates itself:

- "English" (old domain): fictional people's biographies rendered with the English templates of
  :mod:`scalecl.data.biography` (names from its English pools: cities, universities, majors, companies);
- "Korean" (new domain): other fictional people rendered in Korean with templates, names and value pools
  written for this module (Korean surnames and given names, Korean cities and universities, made-up
  companies), with the case particles (은/는, 이/가, 을/를, (으)로, (이)다) chosen by the final consonant of
  the word they follow, as Korean grammar requires.

The two domains share the structure of the text (six facts per person, several renderings per person,
sentence order permuted) but no surface form: different scripts, vocabularies, word order and people.
The base model's pre-training corpus (``base/train.jsonl``) is the English training split plus the Korean
biographies of ``base_korean`` further people (about 5% of its tokens by default), never seen again: like
Llama-3.2-1B, whose pre-training held a little Korean, the base then knows the new language weakly (its
Korean token embeddings are trained, its Korean perplexity is high but finite) instead of not at all. With
``base_korean = 0`` the base is English only, and methods that freeze the (tied) embeddings cannot learn
the new script at all, an artefact of the stand-in rather than a property of the methods.
What the stand-in cannot show: anything about real language breadth, world knowledge or benchmark
scores; numbers from it are comparisons between methods, not estimates of the paper's perplexities.

Splits: the first ``people - heldout`` people of each language form ``train``, the last ``heldout`` people
``test`` (unseen people: held-out text of the same distribution). Documents (one biography each) are
shuffled with a fixed seed and written as ``<root>/{en,ko}/{train,test}.jsonl`` with a ``text`` column,
so they are read by the same `datasets` streaming code path as the hub corpora. A byte-level BPE trained on
both training splits (like Llama 3's multilingual vocabulary, both scripts have tokens) is saved in
``<root>/tokenizer``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from scalecl.data.biography import ATTRIBUTES, PERMUTATIONS, BioConfig, biographies, generate_people

LANGUAGES = ("en", "ko")
SPLITS = ("train", "test")
FOLDERS = {"en": SPLITS, "ko": SPLITS, "base": ("train",)}  # builtin:<folder> and its splits

KO_SURNAMES = tuple("김 이 박 최 정 강 조 윤 장 임 한 오 서 신 권 황 안 송 류 전 홍 고 문 양 손 배 백 허 남 심".split())
KO_GIVEN_MALE = tuple(
    "민준 서준 도윤 예준 시우 하준 주원 지호 지후 준우 준서 도현 건우 현우 우진 선우 서진 민재 현준 연우 "
    "유준 정우 승우 승현 시윤 준혁 은우 지환 승민 유찬 윤우 민성 준영 시후 진우 지원 수호 재윤 동현 태윤".split()
)
KO_GIVEN_FEMALE = tuple(
    "서연 서윤 지우 서현 민서 하은 하윤 윤서 지유 지민 채원 수아 지아 지윤 은서 다은 예은 수빈 소율 예린 "
    "지안 하린 시은 유나 채은 가은 윤아 소윤 예원 민지 수민 나연 혜원 유진 지현 은지 수연 다인 서영 미정".split()
)
KO_CITIES = tuple(
    "서울 부산 인천 대구 대전 광주 울산 수원 창원 고양 용인 성남 청주 전주 천안 안산 포항 김해 제주 원주 "
    "춘천 강릉 여수 순천 목포 경주 안동 군산 진주 구미".split()
)
KO_UNIVERSITIES = tuple(
    "서울대학교 고려대학교 연세대학교 한국과학기술원 포항공과대학교 성균관대학교 한양대학교 이화여자대학교 "
    "중앙대학교 경희대학교 부산대학교 경북대학교 전남대학교 충남대학교 인하대학교 아주대학교 건국대학교 "
    "동국대학교 서강대학교 숙명여자대학교".split()
)
KO_MAJORS = tuple(
    "컴퓨터공학 수학 물리학 화학 생명과학 경제학 경영학 국어국문학 영어영문학 사학 철학 심리학 사회학 "
    "정치외교학 기계공학 전자공학 건축학 의학 법학 미술학".split()
)
# made-up companies, each with its headquarters city (from KO_CITIES)
KO_COMPANIES = tuple(line.split("|") for line in (
    "한빛전자|수원 누리소프트|성남 푸른바다해운|부산 새벽건설|서울 다솜식품|대전 별빛통신|서울 가람제약|청주 "
    "한울자동차|울산 미르항공|인천 온누리은행|서울 초록에너지|광주 하늘물산|대구 바른유통|천안 나래게임즈|성남 "
    "슬기교육|전주 든든보험|서울 맑은물산업|창원 은하조선|포항 아람화학|여수 소담출판|고양"
).split())

# Eight templates per attribute. {name}/{value} may be followed by a particle placeholder resolved by josa().
KO_TEMPLATES: dict[str, tuple[str, ...]] = {
    "birthday": (
        "{name}{은} {value}에 태어났다.", "{name}의 생일은 {value}{이다}.", "{name}{은} {value}에 출생했다.",
        "{name}의 생년월일은 {value}{이다}.", "{name}{은} {value}에 세상에 나왔다.", "{name}{은} {value}생이다.",
        "{name}{이} 태어난 날은 {value}{이다}.", "{name}{은} {value}에 한 가정에서 태어났다.",
    ),
    "birth_city": (
        "{name}{은} {value}에서 태어났다.", "{name}의 고향은 {value}{이다}.", "{name}{은} {value} 출신이다.",
        "{name}{은} 어린 시절을 {value}에서 보냈다.", "{name}의 출생지는 {value}{이다}.",
        "{name}{은} {value}에서 나고 자랐다.", "{name}{이} 태어난 곳은 {value}{이다}.",
        "{name}{은} {value}에서 유년기를 보냈다.",
    ),
    "university": (
        "{name}{은} {value}에서 공부했다.", "{name}{은} {value}{을} 졸업했다.", "{name}{은} {value}에 다녔다.",
        "{name}의 모교는 {value}{이다}.", "{name}{은} {value}에서 학위를 받았다.", "{name}{은} {value}에 입학했다.",
        "{name}{이} 다닌 대학은 {value}{이다}.", "{name}{은} {value}에서 대학 생활을 했다.",
    ),
    "major": (
        "{name}{은} {value}{을} 전공했다.", "{name}{은} 대학에서 {value}{을} 공부했다.", "{name}의 전공은 {value}{이다}.",
        "{name}{은} {value} 학위를 받았다.", "{name}{은} {value} 분야를 깊이 연구했다.",
        "{name}{이} 택한 전공은 {value}{이다}.", "{name}{은} {value}{을} 배우는 데 힘썼다.",
        "{name}{은} {value}{으로} 학사 학위를 땄다.",
    ),
    "company": (
        "{name}{은} {value}에서 일했다.", "{name}{은} {value}에 근무했다.", "{name}의 직장은 {value}{이다}.",
        "{name}{은} {value}에 입사했다.", "{name}{은} {value}에서 경력을 쌓았다.", "{name}{은} {value}의 직원이었다.",
        "{name}{이} 일한 회사는 {value}{이다}.", "{name}{은} {value}에서 오랫동안 일했다.",
    ),
    "company_city": (
        "{name}{은} {value}에서 근무했다.", "{name}의 사무실은 {value}에 있었다.",
        "{name}{은} {value}에 있는 회사에 다녔다.", "{name}의 일터는 {value}에 있었다.",
        "{name}{은} 직장 때문에 {value}에서 살았다.", "{name}{은} {value}{으로} 출근했다.",
        "{name}{이} 일한 도시는 {value}{이다}.", "{name}의 회사는 {value}에 자리 잡고 있었다.",
    ),
}
N_TEMPLATES = 8

# particle -> (after a final consonant, after a vowel); (으)로 also takes 로 after the consonant ㄹ
_JOSA = {"은": ("은", "는"), "이": ("이", "가"), "을": ("을", "를"), "과": ("과", "와"), "으로": ("으로", "로"),
         "이다": ("이다", "다")}
_SLOT = re.compile(r"\{(name|value)\}(?:\{(" + "|".join(_JOSA) + r")\})?")


def josa(word: str, particle: str) -> str:
    """The form of a Korean particle after `word`, by the final consonant (batchim) of its last syllable."""
    last = word[-1]
    if not "가" <= last <= "힣":
        raise ValueError(f"cannot choose a particle after {word!r}: it does not end in a Hangul syllable")
    final = (ord(last) - 0xAC00) % 28  # 0: no final consonant; 8: ㄹ
    with_final, after_vowel = _JOSA[particle]
    if particle == "으로" and final == 8:
        return after_vowel
    return with_final if final else after_vowel


def render_korean(template: str, name: str, value: str) -> str:
    """Fill one template, resolving every particle against the word in front of it."""
    def fill(m: re.Match) -> str:
        word = name if m.group(1) == "name" else value
        return word + (josa(word, m.group(2)) if m.group(2) else "")

    return _SLOT.sub(fill, template)


@dataclass(frozen=True)
class BilingualConfig:
    people: int = 1_200  # per language
    heldout: int = 200  # the last `heldout` people of each language form the test split
    texts: int = 5  # biographies per person, each with its own templates and sentence order
    base_korean: int = 100  # further Korean people whose biographies join the base's pre-training corpus
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.heldout < self.people:
            raise ValueError(f"heldout must lie in 1..people-1, got heldout={self.heldout}, people={self.people}")
        if not 1 <= self.texts <= N_TEMPLATES:
            raise ValueError(f"texts must lie in 1..{N_TEMPLATES}, got {self.texts}")
        if self.base_korean < 0:
            raise ValueError(f"base_korean must be >= 0, got {self.base_korean}")
        cap = len(KO_SURNAMES) * min(len(KO_GIVEN_MALE), len(KO_GIVEN_FEMALE))  # distinct names per gender
        if self.people + self.base_korean > 1.8 * cap:  # genders are drawn at random: keep a margin
            raise ValueError(f"at most {int(1.8 * cap)} Korean people (distinct names), got people + base_korean = "
                             f"{self.people + self.base_korean}")


def _bio_config(cfg: BilingualConfig, seed: int, extra: int = 0, **pools: int) -> BioConfig:
    return BioConfig(n_people=cfg.people + extra, n_bio=cfg.people - cfg.heldout, n_task1=cfg.heldout + extra,
                     n_texts=cfg.texts, n_templates=N_TEMPLATES, seed=seed, **pools)


def english_biographies(cfg: BilingualConfig) -> list[str]:
    """cfg.texts English biographies per person, person-major (people 0..people-1)."""
    people = generate_people(_bio_config(cfg, cfg.seed))
    return biographies(people)


def korean_biographies(cfg: BilingualConfig) -> list[str]:
    """cfg.texts Korean biographies per person, person-major (people + base_korean of them).

    The draws (attribute indices, genders, birthdays, templates, orders) come from the biography generator;
    names and values from the Korean pools."""
    people = generate_people(_bio_config(
        cfg, cfg.seed + 1, cfg.base_korean, n_cities=len(KO_CITIES), n_universities=len(KO_UNIVERSITIES),
        n_majors=len(KO_MAJORS), n_companies=len(KO_COMPANIES)))
    rng = np.random.default_rng([cfg.seed, 7])
    names: list[str] = []
    for female, pool in ((False, KO_GIVEN_MALE), (True, KO_GIVEN_FEMALE)):
        idx = np.flatnonzero(people.female == female)
        if len(idx) > len(KO_SURNAMES) * len(pool):
            raise ValueError(f"{len(idx)} {'women' if female else 'men'} but only {len(KO_SURNAMES) * len(pool)} "
                             f"distinct Korean names: use fewer people")
        codes = rng.permutation(len(KO_SURNAMES) * len(pool))[: len(idx)]  # distinct (surname, given) pairs
        for i, c in zip(idx.tolist(), codes.tolist(), strict=True):
            names.append((i, KO_SURNAMES[c // len(pool)] + pool[c % len(pool)]))
    names = [n for _, n in sorted(names)]
    values = {
        "birthday": [f"{y}년 {m + 1}월 {d}일" for m, d, y in
                     zip(people.month.tolist(), people.day.tolist(), people.year.tolist(), strict=True)],
        "birth_city": [KO_CITIES[i] for i in people.birth_city.tolist()],
        "university": [KO_UNIVERSITIES[i] for i in people.university.tolist()],
        "major": [KO_MAJORS[i] for i in people.major.tolist()],
        "company": [KO_COMPANIES[i][0] for i in people.company.tolist()],
        "company_city": [KO_COMPANIES[i][1] for i in people.company.tolist()],
    }
    texts = []
    for p, name in enumerate(names):
        for t in range(cfg.texts):
            sentences = [render_korean(KO_TEMPLATES[a][people.template_ids[p, k, t]], name, values[a][p])
                         for k, a in enumerate(ATTRIBUTES)]
            texts.append(" ".join(sentences[i] for i in PERMUTATIONS[people.order_ids[p, t]]))
    return texts


def split_documents(texts: list[str], cfg: BilingualConfig, language: str) -> dict[str, list[str]]:
    """Person-major texts -> {"train", "test"} by person (Korean: also "base", the base_korean people), each
    shuffled with a fixed seed."""
    cut, end = (cfg.people - cfg.heldout) * cfg.texts, cfg.people * cfg.texts
    parts = [("train", texts[:cut]), ("test", texts[cut:end])] + ([("base", texts[end:])] if texts[end:] else [])
    out = {}
    for k, (split, docs) in enumerate(parts):
        order = np.random.default_rng([cfg.seed, LANGUAGES.index(language), k]).permutation(len(docs))
        out[split] = [docs[i] for i in order.tolist()]
    return out


def train_bpe_tokenizer(texts, vocab_size: int = 2048):
    """Byte-level BPE (GPT-2 style, every byte representable) with <eos> and <pad>; no BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>", "<pad>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>",
                                   model_max_length=1 << 20)


def write_corpus(root: Path, cfg: BilingualConfig, vocab_size: int = 2048, *, rebuild: bool = False) -> Path:
    """Generate both languages into root (jsonl splits + tokenizer), once: an existing complete root is kept,
    after verifying its files against the seal written with it (a damaged one is an error, or with `rebuild`
    set aside and generated again). One process writes it at a time (a second one waits for the first, then
    finds it complete)."""
    from scalecl.common.files import usable_entry
    from scalecl.common.locks import locked

    root = Path(root)
    with locked(root, wait=True, what=f"corpus {root}"):
        if not ((root / "corpus.json").exists() and usable_entry(root, "stand-in corpus", rebuild=rebuild)):
            _write_corpus(root, cfg, vocab_size)
    return root


def _write_corpus(root: Path, cfg: BilingualConfig, vocab_size: int) -> None:
    from scalecl.common.files import (
        atomic_dir,
        os_errors_named,
        remove_temporaries,
        seal,
        write_atomic,
        write_json,
    )
    for folder in (root, *(root / f for f in (*LANGUAGES, "base"))):  # a killed earlier attempt's temporaries
        remove_temporaries(folder)

    def write(folder: str, split: str, docs: list[str]) -> None:
        write_atomic(root / folder / f"{split}.jsonl",
                     "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))
        stats[f"{folder}/{split}"] = {"documents": len(docs), "characters": sum(map(len, docs))}

    stats: dict[str, dict[str, int]] = {}
    parts = {lang: split_documents(texts, cfg, lang)
             for lang, texts in (("en", english_biographies(cfg)), ("ko", korean_biographies(cfg)))}
    for lang in LANGUAGES:
        for split in SPLITS:
            write(lang, split, parts[lang][split])
    mix = parts["en"]["train"] + parts["ko"].get("base", [])  # the base's pre-training corpus
    order = np.random.default_rng([cfg.seed, 3]).permutation(len(mix))
    write("base", "train", [mix[i] for i in order.tolist()])
    tok = train_bpe_tokenizer(parts["en"]["train"] + parts["ko"]["train"] + parts["ko"].get("base", []), vocab_size)
    with atomic_dir(root / "tokenizer") as tmp, os_errors_named(root / "tokenizer"):
        tok.save_pretrained(str(tmp))
    write_json(root / "corpus.json", {"config": asdict(cfg), "vocab_size": vocab_size, "splits": stats,
                                      "note": "synthetic stand-in (scalecl.data.bilingual), not FineWeb"})
    seal(root)  # last: what reading verifies
