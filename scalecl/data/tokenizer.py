"""Tokenizers for the biography experiment: a word-level one trained locally, or any HF tokenizer.

The local tokenizer is a ``tokenizers`` WordLevel model: every word and every punctuation run is one
token, so each attribute value's first token is its first word (first-token accuracy then measures
knowing the value, see ``tests/data/test_biography.py``). The pre-tokenizer is the byte-level splitter
(GPT-2's word/punctuation/space regex, without byte-pair merges): it splits on whitespace and
punctuation like ``Whitespace`` would, but keeps a word's leading space inside its token (" May"), so
decoding reproduces the text exactly and greedy answers can be compared as strings.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from scalecl.common.errors import ScaleclError, cause
from scalecl.common.files import (
    TMP_PREFIX,
    atomic_dir,
    os_errors_named,
    remove_temporaries,
    seal,
    usable_entry,
)
from scalecl.common.locks import locked
from scalecl.data.biography import People, biographies, qa_pairs, ranges

EOS_TOKEN = "<eos>"
PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN, UNK_TOKEN)  # ids 0, 1, 2 of a trained tokenizer
# files of which a tokenizer folder holds at least one (fast, SentencePiece, BPE vocab/merges)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")


class AnswerTokenizationError(ValueError):
    """The answer's tokens change when it follows the prompt, so its "first token" is ill-defined."""


def train_tokenizer(
    texts: Iterable[str], *, min_frequency: int = 1, model_max_length: int = 1 << 20
) -> PreTrainedTokenizerFast:
    """Word-level tokenizer over every word of texts (nothing is dropped for vocabulary size).

    The result has <eos>, <pad> and <unk> set, adds no special tokens by itself (append EOS where
    needed), saves with ``save_pretrained`` and reloads with ``AutoTokenizer.from_pretrained``.
    When every space in the texts sits between two non-space characters (generated text), the words are
    counted per distinct space-separated chunk (:func:`_word_counts`) and the vocabulary is laid out as
    ``WordLevelTrainer`` lays it out; otherwise the trainer itself counts. Both give the same tokenizer
    (``tests/data/test_tokenizer_chunks.py``); the first takes 6 s instead of 26 s for the paper preset's corpus.
    """
    backend = Tokenizer(models.WordLevel(unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    texts = list(texts)
    counts = _word_counts(backend.pre_tokenizer, texts)
    if counts is None:
        trainer = trainers.WordLevelTrainer(vocab_size=1 << 30, min_frequency=min_frequency,
                                            special_tokens=list(SPECIAL_TOKENS), show_progress=False)
        backend.train_from_iterator(texts, trainer=trainer)
    else:
        vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
        # WordLevelTrainer's layout: the special tokens, then words by falling count, ties by the word
        for word, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if n >= min_frequency and word not in vocab:
                vocab[word] = len(vocab)
        backend.model = models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN)
        backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
    )


# --------------------------------------------------------------------------- space chunks
# With GPT-2's byte-level splitting (no normaliser), a space that has a non-space character on both sides
# always starts a new piece: no piece runs across it, and the piece that starts there depends only on the
# text after it. So such a text tokenizes as its space-separated chunks (" " + chunk) tokenized one by one.
# Generated biographies repeat a few thousand chunks 30 million times: each distinct chunk is tokenized once
# and the rest is dictionary lookups and numpy.

_FIRST = "\x00"  # marks a text's first chunk when the text does not start with a space (tokenized as is)
_BAD_SPACE = re.compile(r"\s | \s| $|\x00")  # a space next to whitespace or at the end, or the marker itself
_CHUNK_BLOCK = 20_000  # texts per block: bounds the chunk strings held at once (~50 MB)


def _splits_at_spaces(backend: Tokenizer) -> bool:
    """Whether the backend tokenizes every text as its space-separated chunks (see the comment above)."""
    if backend.normalizer is not None or backend.pre_tokenizer is None:
        return False
    state = json.loads(backend.pre_tokenizer.__getstate__())
    byte_level = state.get("type") == "ByteLevel" and state.get("use_regex") and not state.get("add_prefix_space")
    added = backend.get_added_tokens_decoder().values()
    return bool(byte_level) and not any(re.search(r"\s", t.content) for t in added)


def _space_chunks(texts: Sequence[str]) -> tuple[list[str], np.ndarray] | None:
    """The chunks of texts end to end (each tokenizes as " " + chunk, or as itself after `_FIRST`) and how
    many each text has; None when a space in them does not split cleanly."""
    if any(map(_BAD_SPACE.search, texts)):
        return None
    marked = [t if t.startswith(" ") else " " + _FIRST + t for t in texts]
    per_text = np.fromiter((m.count(" ") for m in marked), dtype=np.int64, count=len(marked))
    return "".join(marked).split(" ")[1:], per_text


def _chunk_blocks(texts: Sequence[str]) -> Iterator[tuple[list[str], np.ndarray] | None]:
    """`_space_chunks` of texts in blocks of `_CHUNK_BLOCK` (None for a block that does not split cleanly)."""
    for lo in range(0, len(texts), _CHUNK_BLOCK):
        yield _space_chunks(texts[lo:lo + _CHUNK_BLOCK])


def _chunk_text(chunk: str) -> str:
    return chunk[1:] if chunk.startswith(_FIRST) else " " + chunk


def _word_counts(pre_tokenizer, texts: Sequence[str]) -> Counter | None:
    """How often each pre-token (word) occurs in texts, counted per distinct chunk; None when a text does not
    split cleanly at its spaces (then the trainer must count)."""
    chunk_counts: Counter = Counter()
    for split in _chunk_blocks(texts):
        if split is None:
            return None
        chunk_counts.update(split[0])
    words: Counter = Counter()
    for chunk, n in chunk_counts.items():
        for word, _ in pre_tokenizer.pre_tokenize_str(_chunk_text(chunk)):
            words[word] += n
    return words


class _ChunkIds:
    """Token ids of distinct chunks, tokenized once each by the backend, as flat arrays for numpy lookups."""

    def __init__(self, backend: Tokenizer):
        self.backend, self.index = backend, {}
        self.flat, self.length = np.zeros(0, np.int64), np.zeros(0, np.int64)

    def encode(self, chunks: list[str], per_text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The chunks' ids end to end, and each text's token count."""
        new = [c for c in dict.fromkeys(chunks) if c not in self.index]
        if new:
            encoded = [e.ids for e in self.backend.encode_batch([_chunk_text(c) for c in new],
                                                                add_special_tokens=False)]
            self.index.update(zip(new, range(len(self.index), len(self.index) + len(new)), strict=True))
            self.flat = np.concatenate([self.flat, np.fromiter((i for e in encoded for i in e), np.int64)])
            self.length = np.concatenate([self.length, np.fromiter(map(len, encoded), np.int64, len(new))])
        start = np.cumsum(self.length) - self.length
        which = np.fromiter(map(self.index.__getitem__, chunks), dtype=np.int64, count=len(chunks))
        n = self.length[which]
        ends = np.cumsum(n)
        ids = self.flat[np.arange(int(ends[-1]) if len(ends) else 0) + np.repeat(start[which] - (ends - n), n)]
        text_ends = ends[np.cumsum(per_text) - 1] if len(ends) else np.zeros(len(per_text), np.int64)
        return ids, np.diff(text_ends, prepend=0)


def encode_flat(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every text's token ids end to end (int64, no special tokens) and the offsets where each starts (len+1).

    The same ids as `encode_plain`; by space chunks (see above) when the tokenizer and the texts allow it: the
    paper preset's 500,000 biographies in 8 s instead of 50 s on two cores.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None) if tokenizer.is_fast else None
    if backend is not None and _splits_at_spaces(backend):
        chunker, parts = _ChunkIds(backend), []
        for split in _chunk_blocks(texts):
            if split is None:
                break
            parts.append(chunker.encode(*split))
        else:
            ids = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
            lengths = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
            return ids, np.concatenate([[0], np.cumsum(lengths)])
    docs = encode_plain(tokenizer, texts)
    lengths = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return np.fromiter((i for d in docs for i in d), dtype=np.int64, count=int(offsets[-1])), offsets


def bio_tokenizer_corpus(people: People) -> Iterable[str]:
    """Texts whose words cover everything the experiment tokenizes.

    The pre-training biographies plus the QA prompts and answers of every person, so that question
    words and the names of Task 1 people (who have no pre-trained biography) are in the vocabulary.
    """
    start, stop = ranges(people.cfg).pretrain
    yield from biographies(people, None, start, stop)
    qa = qa_pairs(people)
    yield from qa.prompts
    yield from qa.answers


def train_bio_tokenizer(people: People, **kwargs: int) -> PreTrainedTokenizerFast:
    """The experiment's local tokenizer: :func:`train_tokenizer` on :func:`bio_tokenizer_corpus`."""
    return train_tokenizer(bio_tokenizer_corpus(people), **kwargs)


def cached_bio_tokenizer(people: People, folder: Path, *, rebuild: bool = False,
                         check: Callable[[PreTrainedTokenizerBase], object] = lambda tokenizer: None
                         ) -> PreTrainedTokenizerBase:
    """The local tokenizer of `people` from the cache `folder` (verified first: scalecl.common.files.usable_entry;
    `rebuild`, --force: a damaged entry is set aside), or trained, passed to `check` (which raises for a
    tokenizer the run cannot use, before anything is written) and cached (one process at a time:
    scalecl.common.locks)."""
    if (folder / "tokenizer.json").exists() and usable_entry(folder, "cached tokenizer", rebuild=rebuild):
        return _load_cached_tokenizer(folder)
    tokenizer = train_bio_tokenizer(people)
    check(tokenizer)
    with locked(folder, wait=True, what=f"tokenizer cache {folder}"):
        if (folder / "tokenizer.json").exists():  # another process cached it meanwhile
            return _load_cached_tokenizer(folder)
        remove_temporaries(folder.parent, f"{TMP_PREFIX}{folder.name}-")
        with atomic_dir(folder) as tmp, os_errors_named(folder):
            tokenizer.save_pretrained(str(tmp))
            seal(tmp)
    return tokenizer


def _load_cached_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The cached local tokenizer, or one error naming the cache entry: a damaged one is deleted by hand (the
    suite never deletes what it cannot prove it wrote) and trained again on the next run."""
    try:
        return load_tokenizer(folder)
    except (OSError, ValueError) as e:
        raise ScaleclError(f"cached tokenizer {folder} is damaged ({cause(e)}); delete "
                           f"{folder} and run again to train it anew") from None


def _looks_local(name_or_path: str) -> bool:
    """Whether the argument is meant as a directory (so a miss must not fall through to the hub)."""
    return os.path.isabs(name_or_path) or name_or_path.startswith((".", "~")) or name_or_path.count("/") > 1


def open_tokenizer(source: str, hint: str = "") -> PreTrainedTokenizerBase:
    """load_tokenizer for a source a user named (hub id or folder), failing in one line: no hub retries when the
    hub cannot be reached (scalecl.common.hub), the reason, then `hint` (what to use instead)."""
    from scalecl.common.hub import before_hub_load, miss_reason

    before_hub_load(source)  # no network: one line at once instead of a minute of retries
    try:
        return load_tokenizer(source)
    except (OSError, ValueError) as e:
        raise ScaleclError(f"cannot load tokenizer {source} ({miss_reason(source) or cause(e)}){hint}") from None


def load_tokenizer(name_or_path: str | os.PathLike[str], **kwargs: object) -> PreTrainedTokenizerBase:
    """Load a tokenizer from a local directory or a hub id; give it a pad token if it has none.

    Tokenizers without a pad token (GPT-NeoX/Pythia, GPT-2) get pad = eos, since batching needs one
    and padded positions are masked anyway.
    """
    name = os.path.expanduser(os.fspath(name_or_path))
    if _looks_local(name) and not Path(name).is_dir():
        raise FileNotFoundError(f"tokenizer directory {name!r} does not exist")
    if Path(name).is_dir() and not any((Path(name) / f).exists() for f in TOKENIZER_FILES):
        # transformers would build an empty tokenizer from config.json alone (2 tokens; text encodes to nothing)
        raise FileNotFoundError(f"{name!r} has no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    from scalecl.common.remote_code import NO_REMOTE_CODE, is_refusal, refusal_line

    try:  # never the folder's own code (scalecl.common.remote_code), whatever the caller passes
        tokenizer = AutoTokenizer.from_pretrained(name, **{**kwargs, **NO_REMOTE_CODE})
        encoded = tokenizer("a b", add_special_tokens=False)["input_ids"]
    except Exception as err:  # damaged files fail anywhere in transformers/tokenizers (KeyError, TypeError, ...)
        if is_refusal(err):
            raise ScaleclError(refusal_line(name, "tokenizer")) from None
        cause = (str(err).splitlines() or [""])[0][:200] or type(err).__name__
        if Path(name).is_dir():
            raise ValueError(f"the tokenizer files in {name!r} are damaged or not a tokenizer "
                             f"({type(err).__name__}: {cause})") from None
        raise FileNotFoundError(
            f"could not load a tokenizer from {name!r}: it is neither a directory with tokenizer files "
            f"nor a hub id available here (offline? not downloaded?). Cause: {cause}"
        ) from err
    if not encoded:
        raise ValueError(f"tokenizer {name!r} encodes text to nothing: its vocabulary files are missing or empty")
    if tokenizer.eos_token is None:
        raise ValueError(f"tokenizer {name!r} has no EOS token; the QA answers need one")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_plain(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text without special tokens (via the Rust backend when there is one: faster)."""
    backend = getattr(tokenizer, "backend_tokenizer", None) if tokenizer.is_fast else None
    if backend is not None:
        encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)  # _fast: tokenizers >= 0.21
        return [e.ids for e in encode_batch(list(texts), add_special_tokens=False)]
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"]


ENCODING_FILES = ("ids.npy", "offsets.npy")  # a cached encoding: every text's ids end to end, and where each starts


def cached_encoding(
    tokenizer: PreTrainedTokenizerBase, texts: Callable[[], Sequence[str]], folder: Path, *, write: bool = True,
    rebuild: bool = False, say: Callable[[str], None] = print,
) -> list[np.ndarray]:
    """Token ids of each text (as `encode_plain`), read from `folder` when an earlier run cached them there.

    `folder` is named by a hash of everything the texts and the tokenizer depend on (scalecl.experiments.bio keys it like
    the stage caches). The texts are rendered only on a miss. A miss encodes them (`encode_flat`) and, when
    `write`, caches them (one process at a time, written to a temporary sibling and renamed). Each text comes
    back as a 1-D int64 view into one array: the paper preset's 500,000 biographies (34M tokens) load in a
    second, and take 8 bytes a token instead of a Python int's 36.
    An entry is verified before it is read (its files against the fingerprints sealed when it was written): a
    damaged one is one error naming it, or with `rebuild` (--force) set aside and encoded again.
    """
    def load() -> list[np.ndarray]:
        try:
            ids = np.load(folder / "ids.npy", allow_pickle=False)
            offsets = np.load(folder / "offsets.npy", allow_pickle=False)
            if ids.ndim != 1 or offsets.ndim != 1 or len(offsets) < 1 or offsets[-1] != len(ids) or offsets[0] != 0:
                raise ValueError("ids and offsets do not match")
        except (OSError, ValueError) as e:
            raise ScaleclError(f"cached encoding {folder} is damaged ({str(e).splitlines()[0][:200]}); delete "
                               f"{folder} and run again to encode anew") from None
        return np.split(ids.astype(np.int64, copy=False), offsets[1:-1])

    if all((folder / f).exists() for f in ENCODING_FILES) and usable_entry(folder, "cached encoding", rebuild=rebuild,
                                                                           say=say):
        return load()
    ids, offsets = encode_flat(tokenizer, texts())
    if not write:
        return np.split(ids, offsets[1:-1])
    with locked(folder, wait=True, what=f"encoding cache {folder}"):
        if all((folder / f).exists() for f in ENCODING_FILES):  # another process cached it meanwhile
            return load()
        remove_temporaries(folder.parent, f"{TMP_PREFIX}{folder.name}-")
        with atomic_dir(folder) as tmp, os_errors_named(folder):
            save_array(tmp / "ids.npy", ids.astype(np.int32) if len(tokenizer) < 2**31 else ids)
            save_array(tmp / "offsets.npy", offsets)
            seal(tmp)
    return np.split(ids, offsets[1:-1])


def save_array(path: Path, array: np.ndarray) -> None:
    """np.save, with a short write (a full disk or a file-size limit, which numpy reports without an errno) raised
    as the OS error it is, naming the file: one error line (scalecl.cli.errors), not a traceback."""
    import errno

    try:
        np.save(path, array)
    except OSError as e:
        if e.errno is not None:
            raise
        raise OSError(errno.EFBIG, f"short write ({e}): the disk is full or a file-size limit was reached",
                      str(path)) from None


def first_answer_tokens(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], answers: Sequence[str], *, check: bool = True
) -> list[int]:
    """Id of each answer's first token, checked to be the token that follows the prompt in prompt+answer.

    Raises AnswerTokenizationError when tokenizing prompt + answer is not prompt tokens followed by
    answer tokens (e.g. a tokenizer that merges across the boundary), since the metric would then
    score a token the model never has to produce; also when the first token is the unknown token.
    check=False skips the prompt + answer comparison (the costly part: ~90 s for the paper's 1.2M pairs
    on 2 cores), e.g. after checking a sample with the same tokenizer and question formats.
    """
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    distinct = list(dict.fromkeys(answers))  # answers repeat a lot (shared values): encode each once
    by_answer = dict(zip(distinct, encode_plain(tokenizer, distinct), strict=True))
    unk = tokenizer.unk_token_id
    for answer, a_ids in by_answer.items():
        if not a_ids:
            raise AnswerTokenizationError(f"answer {answer!r} tokenizes to nothing")
        if unk is not None and a_ids[0] == unk:
            raise AnswerTokenizationError(f"answer {answer!r} starts with the unknown token: vocabulary gap")
    answer_ids = [by_answer[a] for a in answers]
    if not check:
        return [a_ids[0] for a_ids in answer_ids]
    prompt_ids = encode_plain(tokenizer, prompts)
    joint = encode_plain(tokenizer, [p + a for p, a in zip(prompts, answers, strict=True)])
    for prompt, answer, p_ids, a_ids, j_ids in zip(prompts, answers, prompt_ids, answer_ids, joint, strict=True):
        if j_ids != p_ids + a_ids:
            raise AnswerTokenizationError(
                f"tokenizing prompt + answer {prompt + answer!r} gives "
                f"{tokenizer.convert_ids_to_tokens(j_ids)}, not the prompt's tokens followed by the answer's "
                f"{tokenizer.convert_ids_to_tokens(p_ids + a_ids)}"
            )
    return [a_ids[0] for a_ids in answer_ids]


def first_answer_token(tokenizer: PreTrainedTokenizerBase, prompt: str, answer: str) -> int:
    """Id of the answer's first token when it follows the prompt (see :func:`first_answer_tokens`)."""
    return first_answer_tokens(tokenizer, [prompt], [answer])[0]
