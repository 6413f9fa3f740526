"""Text from a saved ``gpt`` model (``syncbench sample``): a sanity check a reader can judge.

The model is rebuilt from what ``--save-model`` wrote
(:mod:`~syncbench.bench.train.saved_model`) and continues a prompt with
:meth:`syncbench.kernels.gpt.GPT.generate`, the model's own NumPy forward pass on the
last ``ctx`` tokens: greedy (the most likely next byte) at temperature 0, else a draw
from the softmax of the logits over the temperature (as GPT-2's ``src/sample.py``
divides the logits by it before it draws). Every problem is one
:class:`~syncbench.bench.train.saved_model.SavedModelError` line.
"""

from __future__ import annotations

import numpy as np

from syncbench.bench.data.text import VOCAB
from syncbench.bench.train.saved_model import BYTE_TOKENS, SavedModel, SavedModelError
from syncbench.kernels.gpt import GPT, parse_gpt_spec

#: The vocabulary of byte tokens (every text dataset's; a file with no record has it).
BYTES = VOCAB


def language_model(saved: SavedModel, path: str) -> GPT:
    """The ``gpt`` model of ``saved`` with its parameters (``path`` names it in errors)."""
    if saved.model is None:
        raise SavedModelError(f"{path}: no record {path}.json names its model (saved before "
                              "syncbench wrote one, or by another program): name it with "
                              "--model gpt:d=N,layers=N,heads=N,ctx=N")
    try:
        spec = parse_gpt_spec(saved.model)
    except ValueError as exc:
        raise SavedModelError(f"{path}: {exc}") from None
    if spec is None:
        raise SavedModelError(f"{path} is a {saved.model} model, not a language model: "
                              "sample continues text with a gpt model")
    if saved.tokens not in (None, BYTE_TOKENS):
        raise SavedModelError(f"{path}: tokens {saved.tokens!r} (this syncbench reads "
                              f"{BYTE_TOKENS!r})")
    vocab = BYTES if saved.vocab is None else saved.vocab  # a bare file: the corpus's bytes
    if not 1 <= vocab <= BYTES:
        raise SavedModelError(f"{path}: a vocabulary of {vocab} byte tokens (at most {BYTES})")
    if saved.params.dtype not in (np.float32, np.float64):
        raise SavedModelError(f"{path}: {saved.params.dtype} parameters (train saves "
                              "float32 or float64)")
    model = GPT(spec, vocab, dtype=saved.params.dtype)
    if model.params.size != saved.params.size:
        raise SavedModelError(f"{path}: its {saved.params.size:,} parameters are not a "
                              f"{spec} model's over {vocab} tokens ({model.params.size:,})")
    model.params[...] = saved.params
    return model


def encode_prompt(prompt: str, saved: SavedModel, vocab: int) -> bytes:
    """``prompt`` as byte tokens (UTF-8; bytes that were not UTF-8 in the command line
    kept as typed); a character outside the model's vocabulary (a byte >= ``vocab``, or
    one that never occurs in the training text where that is recorded) is refused."""
    allowed = set(saved.alphabet) if saved.alphabet is not None else set(range(vocab))
    allowed &= set(range(vocab))
    bad = sorted({c for c in prompt if not set(c.encode("utf-8", "surrogateescape")) <= allowed})
    if bad:
        where = (f"the {len(allowed)} characters of its training text"
                 if saved.alphabet is not None else f"byte values 0 to {vocab - 1}")
        listed = ", ".join(map(repr, bad[:5])) + (", ..." if len(bad) > 5 else "")
        raise SavedModelError(f"--prompt: {listed} {'is' if len(bad) == 1 else 'are'} "
                              f"outside the model's vocabulary ({where})")
    return prompt.encode("utf-8", "surrogateescape")


def show(data: bytes) -> str:
    """Bytes as text: printable ASCII, newlines and tabs as they are, any other byte
    ``\\xNN`` (an undertrained model's bytes cannot garble the terminal)."""
    return "".join(chr(b) if 32 <= b < 127 or b in (9, 10) else f"\\x{b:02x}" for b in data)


def sample(model: GPT, prompt: bytes, tokens: int, temperature: float, seed: int) -> bytes:
    """``tokens`` bytes continuing ``prompt`` (a newline where it is empty): greedy at
    ``temperature`` 0, else drawn from a generator seeded with ``seed``."""
    return model.generate(prompt, tokens, temperature, np.random.default_rng(seed))
