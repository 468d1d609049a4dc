"""Random generators. Never the global ``np.random``.

The rule
--------
* **Privacy noise comes from a CSPRNG.** :func:`secure_rng` is a ``np.random.Generator`` over
  randomgen's ``ChaCha`` stream cipher with 20 rounds (ChaCha20), keyed with 256 bits from
  :mod:`secrets`. A statistical PRNG such as PCG64 or the Mersenne Twister is *not* enough: its
  state can be recovered from enough of its outputs, and whoever recovers it can subtract the
  noise from every release (past and future) drawn from that stream.
* **Public randomness comes from a separate generator.** :func:`public_rng` is another ChaCha20
  generator with its own independent key. Anything that is published (the JL projection matrix)
  is drawn from it, never from the stream that later draws noise: published outputs of the noise
  stream would be known plaintext about that very stream.
* **Seeded generators are for tests and the in-process simulation only.**
  ``make_rng(<int>)`` returns ``np.random.default_rng(seed)`` (PCG64) so that tests keep their
  numbers; :func:`is_cryptographic` tells the daemon whether a generator may draw noise.

Why ``ChaCha(key=...)`` and not ``ChaCha(seed=...)``: randomgen runs ``seed`` through a numpy
``SeedSequence`` (a non-cryptographic hash with a 128-bit entropy pool) before it becomes the
key, so at most 2^128 keys are reachable and the key derivation is not a cryptographic KDF.
``key=`` sets the 256-bit ChaCha key directly from the ``secrets`` bits, so the full 256 bits of
OS entropy are the key.
"""

from __future__ import annotations

import secrets

import numpy as np
from randomgen import AESCounter, ChaCha

#: Rounds of the ChaCha mixer: 20 is the cipher standardised in RFC 8439; fewer rounds trade
#: security margin for speed and are not accepted for noise.
CHACHA_ROUNDS = 20
_KEY_BITS = 256


def _chacha_generator() -> np.random.Generator:
    return np.random.Generator(ChaCha(key=secrets.randbits(_KEY_BITS), rounds=CHACHA_ROUNDS))


def secure_rng() -> np.random.Generator:
    """Generator for privacy noise: ChaCha20 keyed with 256 fresh bits from ``secrets``.

    Every call gives an independently keyed stream (counter starting at 0).
    """
    return _chacha_generator()


def public_rng() -> np.random.Generator:
    """Generator for *public* randomness (JL matrices and anything else that is published).

    Independently keyed ChaCha20 (a different 256-bit key from ``secrets``), so nothing drawn
    from it is ever an output of a stream that draws noise.
    """
    return _chacha_generator()


def make_rng(seed: int | None) -> np.random.Generator:
    """``seed=None`` → :func:`secure_rng` (production); an int → ``np.random.default_rng(seed)``
    (reproducible, NOT cryptographic: tests and the in-process simulation only)."""
    return secure_rng() if seed is None else np.random.default_rng(seed)


def is_cryptographic(rng: np.random.Generator) -> bool:
    """True when ``rng`` is backed by a CSPRNG bit generator (ChaCha with ≥ 20 rounds, or
    AESCounter); False for PCG64, MT19937, Philox, ... and for anything that is not a Generator.

    It checks the algorithm, not the key: a ChaCha keyed with a constant is still "ChaCha". The
    daemon builds its generators with :func:`secure_rng` and asserts this on them.
    """
    if not isinstance(rng, np.random.Generator):
        return False
    bg = rng.bit_generator
    if type(bg) is AESCounter:
        return True
    if type(bg) is ChaCha:
        return int(bg.state["state"]["rounds"]) >= CHACHA_ROUNDS
    return False


def testing_streams(seed: int, index: int = 0) -> tuple[np.random.Generator, np.random.Generator]:
    """(noise, public) generators for a seeded run, one pair per dataset ``index``: the same in
    the daemon (``insecure_testing``) and in the in-process simulation, so that both give the
    same numbers for a fixed seed. NOT cryptographic; every ledger entry written with them says
    ``insecure_seed``."""
    noise = np.random.default_rng(seed if index == 0 else [seed, 0, index])
    return noise, np.random.default_rng([seed, 1, index])
