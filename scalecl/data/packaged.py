"""Real text shipped inside PyPI wheels, read from the installed package at run time: the `pkg:<name>` corpora.

Nothing is copied into the repository or the cache: the files are located with
``importlib.util.find_spec(package).submodule_search_locations`` (which does not run the package: konlpy would
need Java and gensim scipy) and read every time the corpus is opened. Install the wheels without their
dependencies, e.g. ``python3 -m pip install --no-deps konlpy==0.6.0 gensim==4.4.0``; the exact versions are
required, so the documents and their split are always the ones stated here.

- ``pkg:konlpy-ko`` (konlpy 0.6.0, Korean): the Constitution of the Republic of Korea
  (``data/corpus/kolaw/constitution.txt``) cut into the preamble and one document per article (제N조, the
  chapter/section headings going with the article after them; the six supplementary articles included),
  then the ten National Assembly bills (``data/corpus/kobill/18098NN.txt``, in file-name order) cut into
  one document per printed page (at the ``- N -`` page-number lines); blank lines and the comparison
  tables' filler lines of dashes and dots only are dropped.
- ``pkg:gensim-lee-en`` (gensim 4.4.0, English news): the lines of ``test/test_data/lee_background.cor``
  (300) then ``lee.cor`` (50), one article per line, read as Latin-1 as gensim's own test does.
- ``pkg:gensim-wiki-en`` (gensim 4.4.0, English Wikipedia): the articles (namespace 0, no redirects) of
  ``test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2``, wiki markup
  stripped (templates, tables, references, comments, file and category links, HTML tags; link text kept).

Every corpus is the list of its documents in that order, each stripped, empty ones dropped and exact
repeats dropped (the first kept). Split rule: document i (0-based) is held out, split ``test``, when
``i % 5 == 4``; the others are ``train``. Rows have the one column ``text``, and there is no config name.
"""

from __future__ import annotations

import bz2
import functools
import html
import importlib.metadata
import importlib.util
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from scalecl.common.errors import ScaleclError

PREFIX = "pkg"
SPLITS = ("train", "test")
HELD_OUT_EVERY = 5  # document i is in the test split when i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


@dataclass(frozen=True)
class PackagedText:
    """One corpus read from an installed wheel: which package (and exact version), and how to read it."""

    package: str
    version: str
    about: str  # a few words for --help and the error lines
    read: Callable[[Path], list[str]]  # the package folder -> every document, in the corpus's fixed order

    def pip(self) -> str:
        return f"python3 -m pip install --no-deps {self.package}=={self.version}"


def package_folder(package: str) -> tuple[Path, str] | None:
    """(folder, installed version) of a package, located without importing it; None when it is not installed."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return Path(next(iter(spec.submodule_search_locations))), version


# ---------------------------------------------------------------------------------------------------------
# Readers


def _read(folder: Path, rel: str, encoding: str = "utf-8") -> str:
    path = folder / rel
    if not path.is_file():
        raise FileNotFoundError(rel)
    return path.read_text(encoding=encoding).replace("\r\n", "\n")


_ARTICLE = re.compile(r"제\d+조(의\d+)?(\s|\(|$)")
_HEADING = re.compile(r"(제\d+[장절관](\s|$))|.*부칙")


def constitution_documents(text: str) -> list[str]:
    """The preamble, then one document per article; heading lines (chapter, section, supplementary
    provisions) open the article that follows them."""
    docs: list[list[str]] = [[]]
    pending: list[str] = []
    for line in (x.strip() for x in text.split("\n")):
        if not line:
            continue
        if _ARTICLE.match(line):
            docs.append(pending + [line])
            pending = []
        elif _HEADING.match(line):
            pending.append(line)
        else:
            docs[-1].append(line)
    return ["\n".join(d) for d in docs if d]


_PAGE_NUMBER = re.compile(r"^\s*-\s*\d+\s*-\s*$", re.M)
_FILLER = re.compile(r"[-.\s]+")  # the comparison tables' "unchanged" marks: dashes and dots only


def bill_documents(text: str) -> list[str]:
    """One document per printed page of a bill; blank and filler lines dropped."""
    pages = []
    for page in _PAGE_NUMBER.split(text):
        lines = [x.strip() for x in page.split("\n")]
        pages.append("\n".join(x for x in lines if x and not _FILLER.fullmatch(x)))
    return pages


def konlpy_documents(folder: Path) -> list[str]:
    bills = sorted(p.name for p in (folder / "data/corpus/kobill").glob("*.txt"))
    if not bills:
        raise FileNotFoundError("data/corpus/kobill/*.txt")
    docs = constitution_documents(_read(folder, "data/corpus/kolaw/constitution.txt"))
    for name in bills:
        docs += bill_documents(_read(folder, f"data/corpus/kobill/{name}"))
    return docs


def lee_documents(folder: Path) -> list[str]:
    return [line for rel in ("test/test_data/lee_background.cor", "test/test_data/lee.cor")
            for line in _read(folder, rel, "latin-1").split("\n")]


WIKI = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
_WIKI_NESTED = [(re.compile(r"\{\{[^{}]*\}\}"), ""),  # templates, innermost first
                (re.compile(r"\{\|(?:(?!\{\|).)*?\|\}", re.S), ""),  # tables
                (re.compile(r"\[\[(?:File|Image|Category|[a-z-]{2,12}):[^\[\]]*\]\]", re.I), ""),  # files, interwiki
                (re.compile(r"\[\[(?![^\[\]|]*:)(?:[^\[\]|]*\|)?([^\[\]]*)\]\]"), r"\1")]  # links: their text
_WIKI_FLAT = [(re.compile(r"<!--.*?-->", re.S), ""), (re.compile(r"<ref[^>]*?/>"), ""),
              (re.compile(r"<ref[^>]*>.*?</ref>", re.S), "")]
_WIKI_LINKS = [(re.compile(r"\[\[[^\[\]|]*\|([^\[\]]*)\]\]"), r"\1"), (re.compile(r"\[\[([^\[\]]*)\]\]"), r"\1"),
               (re.compile(r"\[https?://[^\s\]]+ ([^\]]*)\]"), r"\1"), (re.compile(r"\[https?://[^\s\]]+\]"), ""),
               (re.compile(r"<[^>]+>"), ""), (re.compile(r"'{2,}"), ""),
               (re.compile(r"^=+\s*(.*?)\s*=+\s*$", re.M), r"\1")]


def wiki_plain(text: str) -> str:
    """Readable text of one article's wiki markup (a light cleaner, not a MediaWiki parser)."""
    for pattern, repl in _WIKI_FLAT:
        text = pattern.sub(repl, text)
    for _ in range(50):  # nested templates and file captions with links inside: strip from the inside out
        before = text
        for pattern, repl in _WIKI_NESTED:
            text = pattern.sub(repl, text)
        if text == before:
            break
    for pattern, repl in _WIKI_LINKS:
        text = pattern.sub(repl, text)
    lines = (x.strip() for x in html.unescape(text).split("\n"))
    return "\n".join(x for x in lines if x.strip("*#:; ") and not x.startswith(("|", "!", "{", "}", "File:", "Image:")))


def wiki_documents(folder: Path) -> list[str]:
    path = folder / WIKI
    if not path.is_file():
        raise FileNotFoundError(WIKI)
    docs = []
    with bz2.open(path) as fh:
        for _, el in ET.iterparse(fh):
            if el.tag.endswith("}page"):
                if el.findtext("{*}ns") == "0" and el.find("{*}redirect") is None:
                    docs.append(wiki_plain(el.findtext("{*}revision/{*}text") or ""))
                el.clear()
    return docs


PACKAGED = {
    "konlpy-ko": PackagedText("konlpy", "0.6.0", "Korean: the constitution by article and ten National Assembly "
                              "bills by page", konlpy_documents),
    "gensim-lee-en": PackagedText("gensim", "4.4.0", "English news: the Lee corpus, one article per line",
                                  lee_documents),
    "gensim-wiki-en": PackagedText("gensim", "4.4.0", "English Wikipedia: 106 articles, markup stripped",
                                   wiki_documents),
}


def names_line() -> str:
    """Every packaged corpus with its source, for --help and error lines."""
    return "; ".join(f"{PREFIX}:{k} ({v.package} {v.version}, {v.about})" for k, v in PACKAGED.items())


# ---------------------------------------------------------------------------------------------------------
# The corpus: checked, located, split


def is_packaged(path: str) -> bool:
    return path.startswith(f"{PREFIX}:")


def check_packaged_spec(path: str, name: str, split: str, text_column: str, where: str = "dataset") -> PackagedText:
    """The corpus a `pkg:` path names, its split, config name and text column checked (not its installation)."""
    key = path.split(":", 1)[1]
    if key not in PACKAGED:
        raise ScaleclError(f"{where} {path!r}: no such packaged corpus; use one of {names_line()}")
    if split not in SPLITS or name or text_column != "text":
        raise ScaleclError(f"{where} {path}: a packaged corpus has the splits {'/'.join(SPLITS)}, no config name and "
                           f"the text column 'text' (got split={split!r}, name={name!r}, text_column={text_column!r})")
    return PACKAGED[key]


def locate(path: str, corpus: PackagedText) -> Path:
    """The installed package's folder; a missing package or another version is one line with the pip command."""
    found = package_folder(corpus.package)
    if found is None:
        raise ScaleclError(f"dataset {path} reads text shipped in {corpus.package} {corpus.version}, which is not "
                           f"installed: {corpus.pip()}")
    folder, version = found
    if version != corpus.version:
        raise ScaleclError(f"dataset {path} reads text shipped in {corpus.package} {corpus.version}, but "
                           f"{corpus.package} {version} is installed: {corpus.pip()}")
    return folder


@functools.lru_cache(maxsize=8)
def _documents(key: str, folder: Path) -> tuple[str, ...]:
    corpus = PACKAGED[key]
    try:
        raw = corpus.read(folder)
    except (OSError, UnicodeDecodeError, ET.ParseError, EOFError) as e:
        what = f"lacks {e}" if isinstance(e, FileNotFoundError) else f"cannot be read ({type(e).__name__}: {e})"
        raise ScaleclError(f"dataset {PREFIX}:{key}: {corpus.package} at {folder} {what}; reinstall it: "
                           f"{corpus.pip()} --force-reinstall") from None
    return tuple(dict.fromkeys(d.strip() for d in raw if d.strip()))  # stripped, empty and repeats dropped


def documents(path: str) -> list[str]:
    """Every document of a `pkg:` corpus, both splits, in its fixed order."""
    corpus = check_packaged_spec(path, "", "train", "text")
    return list(_documents(path.split(":", 1)[1], locate(path, corpus)))


def split_documents(docs: list[str], split: str) -> list[str]:
    """Document i is held out (test) when i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1; the rest is train."""
    held = [i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 for i in range(len(docs))]
    return [d for d, h in zip(docs, held, strict=True) if h == (split == "test")]


def _rows(path: str, split: str) -> Iterator[dict[str, str]]:
    for text in split_documents(documents(path), split):
        yield {"text": text}


def load_packaged(path: str, name: str, split: str, text_column: str):
    """The streaming `datasets` rows of one split of a `pkg:` corpus (read from the package when iterated)."""
    import datasets

    check_packaged_spec(path, name, split, text_column)
    documents(path)  # a missing package or file is its one error line now, not at the first row (then cached)
    return datasets.IterableDataset.from_generator(_rows, gen_kwargs={"path": path, "split": split})
