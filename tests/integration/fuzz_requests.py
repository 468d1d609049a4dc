"""Hostile requests for the source daemon's RPCs, generated from the proto descriptors (issue 12).

``Generator.request(method)`` returns the wire bytes of one request for a ``SourceService``
method. It walks the method's request descriptor field by field (scalars, repeated fields, the
nested ``NDArray``) and fills each field either with a value generic to its protobuf type (edge
integers, hostile strings and bytes, arbitrary nested messages) or, for fields the protocol gives
a meaning, with a value aimed at that meaning: session ids of the honest sessions, of closed
ones and of none; ledger heads current, stale and forged; terms JSON broken, mistyped or valid
but hostile (the real ``SessionTerms`` fields); signatures good, absent, by the wrong key or over
other bytes; arrays of wrong dtypes, shapes, sizes and non-finite values; forged ledger entries.
About one request in six is not a valid protobuf message at all (random bytes, bit flips,
truncations, wrong wire types, invalid UTF-8, overlong varints, deep groups), and a few are
replays of earlier requests. Everything is drawn from one seeded ``random.Random``: the same seed
and the same daemon state give the same requests.
"""

from __future__ import annotations

import base64
import json
import math
import random
import struct
import typing
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf import descriptor as _descriptor
from google.protobuf import message_factory
from google.protobuf.message import Message

from dpda.dp.ledger import GENESIS, LedgerEntry
from dpda.pb import dpda_pb2 as pb
from dpda.service import signing
from dpda.terms import SessionTerms

SERVICE = pb.DESCRIPTOR.services_by_name["SourceService"]
METHODS = {m.name: m for m in SERVICE.methods}
FD = _descriptor.FieldDescriptor

EDGE_INTS = [
    0, 1, -1, 2, 3, 7, 19, 20, 21, 999, 1000, 1001, 4096, 100_000, 100_001,
    2**31 - 1, 2**31, -(2**31), 2**32, 2**32 + 1, 2**53 + 1, 2**62, 2**63 - 1, -(2**63),
    -(2**63) + 1,
]  # fmt: skip
SPECIAL_FLOATS = [
    math.nan, math.inf, -math.inf, 1e308, -1e308, 1.7976931348623157e308, 1e-300, 5e-324,
    -5e-324, -0.0, 0.0, 1e100, -1e100, 1e9, 1e-9, 1e10, 1e-10, 2.0**53, -1.0,
]  # fmt: skip
# bit patterns no arithmetic produces: signalling and payload NaNs
ODD_NANS = [
    struct.pack("<Q", 0x7FF0000000000001),
    struct.pack("<Q", 0xFFF8000000000001),
    struct.pack("<Q", 0x7FF4000000000000),
]
DTYPES = [
    "<f4", "<i4", "|b1", "", ">f8", ">i8", "=f8", "f8", "float64", "<f16", "<c16", "O", "|O",
    "<U8", "V8", "<M8[s]", "<F8", " <f8", "<f8\x00", "<F8", "<u8", "|u1", "ñ", "<f8<f8",
]  # fmt: skip
STRINGS = [
    "", " ", "\x00", "a\x00b", "ünïcødé ☃ 🛰", "\u202egnirts", "\ufeff", "../../etc/passwd",
    "'; DROP TABLE ledger; --", "%s%n%x{0}{}", '{"a":1}', "NaN", "null", "None", "-1", "0",
    "synthetic ", "Synthetic", "synthetic\x00", "*", "synthetic/../synthetic", "\n\r\t",
]  # fmt: skip
BROKEN_JSON = [
    "", "{", "}", "{]", "null", "[]", "1", '"synthetic"', "true", "{'dataset': 'synthetic'}",
    '{"dataset": "synthetic",}', '{"dataset": "synthetic"', "\ufeff{}", "{}", '{"": 1}',
    '{"epsilon": NaN}', '{"epsilon": Infinity}', '{"epsilon": 1e99999}', "{} {}",
    '{"dataset": "synthetic"} trailing', "\x00", '{"dataset": "\\ud800"}',
]  # fmt: skip
EXTRA_TERMS = ["attribute_bound", "min_noise_multiplier", "units", "__class__", "seed", " epsilon"]


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _wire_of(f: FD) -> int:
    if f.type in (FD.TYPE_STRING, FD.TYPE_BYTES, FD.TYPE_MESSAGE) or f.is_repeated:
        return 2
    return 0


@dataclass
class Live:
    """What the fuzzer knows of the running daemon; the harness refreshes it between batches."""

    dataset: str
    delta: float
    k: int  # features of the source's dataset
    peer_name: str  # the pinned peer's name in the source's config
    target_key: Any  # the pinned peer's own signing key (a hostile peer holds it)
    other_key: Any  # any other Ed25519 key
    honest: dict[str, str] = field(default_factory=dict)  # role → session id (kept open)
    terms: dict[str, str] = field(default_factory=dict)  # session id → its terms JSON
    ell: dict[str, int] = field(default_factory=dict)  # session id → projection dim
    steps: dict[str, int] = field(default_factory=dict)  # session id → planned steps
    reweight_taken: int = 0  # steps the honest reweighting session has taken
    victims: list[str] = field(default_factory=list)  # open sessions CloseSession may close
    closed: list[str] = field(default_factory=list)
    heads: list[str] = field(default_factory=lambda: [GENESIS])  # current head first
    entries: list[str] = field(default_factory=list)  # the source's entries (JSON)


class Generator:
    def __init__(self, seed: int, live: Live) -> None:
        self.r = random.Random(seed)
        self.np = np.random.default_rng(seed)
        self.live = live
        self.recent: dict[str, deque[bytes]] = {}
        self.method = ""

    # ------------------------------------------------------------------------- entry point
    def request(self, method: str) -> tuple[bytes, str]:
        """(wire bytes, kind): kind is ``structured``, ``raw`` or ``replay``."""
        r = self.r
        self.method = method
        recent = self.recent.setdefault(method, deque(maxlen=64))
        x = r.random()
        if x < 0.04 and recent:
            return r.choice(recent), "replay"
        if x < 0.20:
            data, kind = self.raw(METHODS[method].input_type), "raw"
        else:
            data, kind = self.message(METHODS[method].input_type).SerializeToString(), "structured"
        if len(data) < 100_000:
            recent.append(data)
        return data, kind

    # ------------------------------------------------------------- descriptor-driven messages
    def message(self, desc: _descriptor.Descriptor, depth: int = 0) -> Message:
        r = self.r
        msg = message_factory.GetMessageClass(desc)()
        for f in desc.fields:
            if r.random() >= self.presence(desc.name, f.name, msg):
                continue  # unset (proto3 default)
            hook = getattr(self, f"f_{desc.name}_{f.name}", None) or getattr(
                self, f"f_{f.name}", None
            )
            value: Any
            if hook is not None and r.random() >= 0.15:
                value = hook(msg)  # a value aimed at what the field means
            elif f.type == FD.TYPE_MESSAGE:
                if depth > 3:
                    continue
                value = self.message(f.message_type, depth + 1)
            elif f.is_repeated:
                value = [self.generic(f) for _ in range(self.length())]
            else:
                value = self.generic(f)
            if value is None:
                continue
            if f.is_repeated:
                getattr(msg, f.name).extend(value)
            elif f.type == FD.TYPE_MESSAGE:
                getattr(msg, f.name).CopyFrom(value)
            else:
                setattr(msg, f.name, value)
        return msg

    def presence(self, message: str, name: str, msg: Message) -> float:
        """How often a field is set. The target's disclosures in OpenSession are optional: set
        each of them every time and hardly any request would reach the terms behind them."""
        if message == "OpenReweightingRequest":  # mostly fresh sessions, labels rarely
            return {"session_id": 0.1, "labels": 0.15}.get(name, 0.9)
        if message != "OpenSessionRequest":
            return 0.85
        if name == "scaling_mean":
            return 0.25
        if name == "scaling_std":
            return 0.9 if msg.HasField("scaling_mean") else 0.05
        if name == "basis":
            return 0.9 if '"target-pca"' in msg.terms_json else 0.1
        return 0.85

    def generic(self, f: FD) -> Any:
        if f.type in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64):
            return self.int64()
        if f.type == FD.TYPE_STRING:
            return self.string()
        if f.type == FD.TYPE_BYTES:
            return self.bytes_()
        if f.type in (FD.TYPE_ENUM, FD.TYPE_INT32, FD.TYPE_UINT32):  # none in dpda.v1 yet
            return self.r.choice([0, 1, -1, 2**31 - 1, -(2**31), self.r.randint(-9, 9)])
        if f.type == FD.TYPE_BOOL:
            return self.r.random() < 0.5
        if f.type == FD.TYPE_DOUBLE:
            return self.r.choice([*SPECIAL_FLOATS, 1.0, 0.5, self.r.uniform(0, 10)])
        raise AssertionError(f"no generator for field type {f.type} ({f.full_name})")

    def length(self) -> int:
        return self.r.choice([0, 1, 1, 2, 3, 5, 8, 64, 300])

    def int64(self) -> int:
        r = self.r
        x = r.random()
        if x < 0.5:
            return r.choice(EDGE_INTS)
        if x < 0.8:
            return r.randint(-5, 50)
        return r.randint(-(2**63), 2**63 - 1)

    def string(self, big: bool = True) -> str:
        r = self.r
        x = r.random()
        if x < 0.4:
            return r.choice(STRINGS)
        if x < 0.6:
            return "".join(chr(r.randint(32, 126)) for _ in range(r.randint(1, 40)))
        if x < 0.75:  # any code point but surrogates (protobuf strings are UTF-8)
            return "".join(
                chr(c if not 0xD800 <= c < 0xE000 else 0xFFFD)
                for c in (r.randint(0, 0x10FFFF) for _ in range(r.randint(1, 20)))
            )
        if x < 0.85:
            return uuid.UUID(int=r.getrandbits(128)).hex
        if x < 0.95:
            return base64.b64encode(r.randbytes(r.choice([1, 32, 63, 64, 65]))).decode()
        if big:  # past the 64 KiB limit of small messages, or just under it
            return "x" * r.choice([129, 1000, 60_000, 65_000, 70_000])
        return "y" * r.choice([129, 1000])

    def bytes_(self) -> bytes:
        r = self.r
        x = r.random()
        if x < 0.3:
            return b""
        if x < 0.9:
            return r.randbytes(r.choice([1, 7, 8, 9, 16, 40, 64, 200]))
        return r.randbytes(r.choice([4096, 70_000]))

    # ------------------------------------------------------------------------------ arrays
    def ndarray(self, shape: tuple[int, ...], positive: bool = False) -> pb.NDArray:
        """An NDArray near ``shape`` (the one the handler expects): dtype, shape, size and values
        each valid or hostile."""
        r = self.r
        if r.random() < 0.4:  # a valid array: what lets a request past serde to the handler
            a = self.np.normal(size=shape)
            a = np.abs(a) + 0.5 if positive else a
            return pb.NDArray(dtype="<f8", shape=list(shape), data=a.astype("<f8").tobytes())
        x = r.random()
        dtype = "<f8" if x < 0.75 else "<i8" if x < 0.85 else r.choice(DTYPES)
        dims = list(shape)
        y = r.random()
        if y < 0.45:
            pass
        elif y < 0.55:
            dims = dims[:-1] if dims else [1]
        elif y < 0.62:
            dims = [*dims, r.choice([1, 2])]
        elif y < 0.72 and dims:
            i = r.randrange(len(dims))
            dims[i] = r.choice([0, -1, dims[i] - 1, dims[i] + 1, 2 * dims[i], -(2**63)])
        elif y < 0.82:
            dims = r.choice(
                [
                    [2**32, 2**32],  # the element count overflows int64 to 0
                    [2**62, 4],
                    [0, 2**63 - 1],
                    [0, 2**40],
                    [2**63 - 1, 2**63 - 1],
                    [2**31, 2**31, 2**31],
                    [1, 1, 1, 1, 1],
                    [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
                    [-(2**63), -1],
                    [],
                    [0],
                ]
            )
        elif y < 0.9:
            dims = [r.randint(0, 12) for _ in range(r.randint(0, 4))]
        else:
            dims = [self.int64() for _ in range(r.randint(1, 3))]
        count = 1
        for d in dims:
            count *= max(d, 0)
        z = r.random()
        if count * 8 <= 1 << 20 and z < 0.7:
            data = self.values(dtype, count, positive)
        elif z < 0.78 and count * 8 <= 1 << 20:
            data = self.values(dtype, count, positive)
            data = data[:-1] if data and r.random() < 0.5 else data + r.randbytes(r.choice([1, 8]))
        elif z < 0.86:
            data = b""
        else:
            data = r.randbytes(r.choice([1, 7, 8, 16, 40, 80, 800]))
        return pb.NDArray(dtype=dtype, shape=dims, data=data)

    def values(self, dtype: str, count: int, positive: bool) -> bytes:
        r = self.r
        if dtype == "<i8":
            ints = self.np.integers(-(2**63), 2**63 - 1, size=count, dtype="<i8", endpoint=True)
            return ints.tobytes()
        a = self.np.normal(size=count)
        if positive:
            a = np.abs(a) + 0.5
        if count and r.random() < 0.35:
            for _ in range(r.randint(1, 3)):
                a[r.randrange(count)] = r.choice(SPECIAL_FLOATS)
        data = a.astype("<f8").tobytes()
        if count and r.random() < 0.05:
            i = r.randrange(count) * 8
            data = data[:i] + r.choice(ODD_NANS) + data[i + 8 :]
        if dtype not in ("<f8", "<i8") and r.random() < 0.5:
            return r.randbytes(count * r.choice([1, 2, 4, 16]))
        return data

    # ------------------------------------------------------------------------ session ids
    def f_session_id(self, msg: Message) -> str:
        live, r = self.live, self.r
        honest = list(live.honest.values())
        if self.method == "CloseSession":
            # never the honest sessions the other RPCs' fuzzing needs: victims opened for it
            pool, honest = list(live.victims), []
        else:
            pool = honest
        x = r.random()
        if self.method == "OpenSession":
            x = x * 2.2  # mostly a fresh session: no session_id
            if x >= 1.0:
                return ""
        if x < 0.45 and pool:
            return r.choice(pool)
        if x < 0.58 and live.closed:
            return r.choice(live.closed)
        if x < 0.68:
            return uuid.UUID(int=r.getrandbits(128)).hex  # a session that was never opened
        if x < 0.8 and pool:
            sid = r.choice(pool)
            return r.choice(
                [sid.upper(), sid[:-1], sid + "0", " " + sid, sid + "\x00", f"{sid}/0", sid * 2]
            )
        if x < 0.85:
            return ""
        return self.string()

    # -------------------------------------------------------------------- OpenSession
    def f_OpenSessionRequest_terms_json(self, msg: Message) -> str:
        r, live = self.r, self.live
        if r.random() < 0.15:
            x = r.random()
            if x < 0.6:
                return r.choice(BROKEN_JSON)
            if x < 0.8:
                depth = r.choice([50, 500, 20_000])
                return "[" * depth + "]" * depth
            return '{"dataset": ' + "{" * 300 + "}" * 300 + "}"
        if r.random() < 0.08:  # an honest session's terms (a resume, or a second session)
            terms = list(live.terms.values())
            if terms:
                return r.choice(terms)
        base: dict[str, Any] = dict(r.choice(TEMPLATES))
        base.update(dataset=live.dataset, delta=live.delta)
        for _ in range(r.choice([0, 0, 1, 1, 1, 2, 3])):
            name = r.choice(TERM_FIELDS + EXTRA_TERMS)
            if r.random() < 0.1:
                base.pop(name, None)
            else:
                base[name] = self.term_value(name)
        text = json.dumps(base, allow_nan=True)
        y = r.random()
        if y < 0.05 and base:  # a duplicated key: which one wins?
            name = r.choice(list(base))
            text = text[:-1] + f', "{name}": {json.dumps(self.term_value(name), allow_nan=True)}}}'
        elif y < 0.08:
            text = "  \n" + text + "\t"
        elif y < 0.1:
            text = json.dumps(base, ensure_ascii=True, indent=r.choice([0, 2]), allow_nan=True)
        return text

    def f_DescribeDatasetRequest_planned_terms_json(self, msg: Message) -> str:
        """The terms a target means to open under: the same mutations as OpenSession's (the
        source plans them in the background: a hostile plan must stay bounded and change
        nothing)."""
        return self.f_OpenSessionRequest_terms_json(msg)

    def term_value(self, name: str) -> Any:
        """A value for a ``SessionTerms`` field: valid for its type, at its bounds, or not."""
        r = self.r
        if name not in SessionTerms.model_fields:
            return r.choice([1.0, True, "record", ["attribute"], {"a": 1}, None, 1e308])
        ann = SessionTerms.model_fields[name].annotation
        odd = r.choice([None, "", "1", [], {}, True, "NaN", -1, 0, 2**64, "x" * 200])
        if r.random() < 0.15:
            return odd
        if typing.get_origin(ann) is typing.Literal:
            choices = list(typing.get_args(ann))
            if r.random() < 0.75:
                return r.choice(choices)
            return r.choice([c.upper() for c in choices] + ["", "both", " " + choices[0]])
        if ann is bool:
            return r.choice([True, False, 0, 1, "true", "false"])
        if ann is int:
            x = r.random()
            if x < 0.4:
                return r.choice(EDGE_INTS)
            if x < 0.7:
                return r.randint(0, 100)
            if x < 0.9:
                return r.randint(0, 100_001)
            return r.choice([1.0, 1.5, -0.0, 1e3, "5"])
        if ann is float:
            x = r.random()
            if x < 0.35:
                return r.choice(SPECIAL_FLOATS)
            if x < 0.7:
                return r.uniform(0, 10)
            if x < 0.9:
                return 10.0 ** r.uniform(-320, 308)
            return r.choice([100, 100.00000001, 99.99999999, 0.9999999999, 1, "1.0", 2**1024])
        if ann is str:
            if r.random() < 0.7:
                return r.choice(["synthetic", "other", "", "x" * 129, "x" * 128])
            return self.string(big=False)
        return odd

    def f_OpenSessionRequest_target_sig(self, msg: Message) -> str:
        r, live = self.r, self.live
        terms = msg.terms_json.encode()
        x = r.random()
        if x < 0.72:
            return signing.sign(live.target_key, terms)
        if x < 0.76:
            return ""
        if x < 0.8:
            return signing.sign(live.other_key, terms)  # badly signed
        if x < 0.84:  # the peer's key over other bytes (a signature replayed onto new terms)
            other = r.choice(list(live.terms.values()) or ["{}"]).encode()
            return signing.sign(live.target_key, other if other != terms else b"x")
        if x < 0.9:
            sig = signing.sign(live.target_key, terms)
            return r.choice(
                [
                    sig[:-4],
                    sig + "==",
                    " " + sig,
                    sig.replace("+", "-").replace("/", "_"),
                    sig[:10] + ("A" if sig[10] != "A" else "B") + sig[11:],
                    base64.b64encode(base64.b64decode(sig) + b"\x00").decode(),
                ]
            )
        if x < 0.95:
            return base64.b64encode(r.randbytes(r.choice([0, 32, 63, 64, 65, 128]))).decode()
        return self.string()

    def _terms_of(self, msg: Message) -> dict[str, Any]:
        try:
            t = json.loads(msg.terms_json)
        except (ValueError, RecursionError):
            return {}
        return t if isinstance(t, dict) else {}

    def f_scaling_mean(self, msg: Message) -> pb.NDArray:
        return self.ndarray((self.live.k,))

    def f_scaling_std(self, msg: Message) -> pb.NDArray:
        return self.ndarray((self.live.k,), positive=True)

    def f_basis(self, msg: Message) -> pb.NDArray:
        r, k = self.r, self.live.k
        dim = self._terms_of(msg).get("projection_dim", 5)
        ell = dim if type(dim) is int and 0 < dim <= k else r.randint(1, k)  # bool is no int here
        if r.random() < 0.35:  # orthonormal: a valid basis (perhaps scaled or with NaN)
            q, _ = np.linalg.qr(self.np.normal(size=(k, ell)))
            if r.random() < 0.3:
                q = q * r.choice([1.0001, 2.0, -1.0, 0.0, math.nan])
            return pb.NDArray(dtype="<f8", shape=list(q.shape), data=q.astype("<f8").tobytes())
        return self.ndarray((k, ell))

    # ------------------------------------------------------------- releases and PATE
    def _sid(self, msg: Message) -> str:
        return str(getattr(msg, "session_id", ""))

    def f_ledger_head(self, msg: Message) -> str:
        r, heads = self.r, self.live.heads
        x = r.random()
        if x < 0.6:
            return heads[0]
        if x < 0.7 and len(heads) > 1:
            return r.choice(heads[1:])
        if x < 0.75:
            return GENESIS
        if x < 0.85:
            return r.randbytes(32).hex()
        if x < 0.9:
            return heads[0].upper() if r.random() < 0.5 else heads[0][:-1]
        if x < 0.94:
            return ""
        return self.string()

    def f_ReleaseBatchesRequest_start(self, msg: Message) -> int:
        r = self.r
        steps = self.live.steps.get(self._sid(msg), 20)
        return r.randint(0, steps + 1) if r.random() < 0.75 else self.int64()

    def f_ReleaseBatchesRequest_count(self, msg: Message) -> int:
        r = self.r
        x = r.random()
        if x < 0.6:
            return 1
        if x < 0.75:
            return r.randint(2, 4)
        return r.choice([0, -1, 20, 21, 999, 1000, 1001, 2**31, 2**63 - 1, -(2**63)])

    def f_QueryTeachersRequest_index(self, msg: Message) -> int:
        r = self.r
        return r.randint(0, 10**6) if r.random() < 0.7 else self.int64()

    def f_queries(self, msg: Message) -> pb.NDArray:
        r = self.r
        ell = self.live.ell.get(self._sid(msg), 5)
        if r.random() < 0.003:  # megabytes of queries (below the 32 MiB request limit)
            n = r.choice([20_000, 100_000])
            a = self.np.normal(size=(n, ell))
            return pb.NDArray(dtype="<f8", shape=[n, ell], data=a.astype("<f8").tobytes())
        return self.ndarray((r.choice([1, 1, 2, 3, 401]), ell))

    # ------------------------------------------------------- reweighting (reverse shape)
    def f_OpenReweightingRequest_terms_json(self, msg: Message) -> str:
        r, live = self.r, self.live
        if r.random() < 0.15:
            return r.choice(BROKEN_JSON)
        t: dict[str, Any] = {"dataset": live.dataset, "epsilon": 1.0, "delta": live.delta}
        if r.random() < 0.4:
            return json.dumps({**t, "steps": r.choice([1, 10, 100])})
        for name, values in (
            ("method", ["noisy-fw", "noisy-md", "single-stage", "oracle", ""]),
            ("steps", [1, 10, 1000, 100_000, 100_001, 0, -1, 2**63 - 1]),
            ("epsilon", [1e-300, 100.0, 100.1, math.nan, math.inf, 0.0]),
            ("smoothing", [0.01, 1e4, 1e5, 1e-300, math.inf]),
            ("learning_rate", [1e-300, 100.0, 1e308]),
            ("predictor_radius", [1e-300, 1e3, 1e308]),
            ("delta", [live.delta * 2, 0.0, 1.0]),
            ("representation", ["raw", "sqrt", "l2", "log"]),
            ("dataset", ["", "other", live.dataset + "\x00"]),
            ("privacy_unit", ["attribute"]),  # not a term here
        ):
            if r.random() < 0.2:
                t[name] = r.choice(values)
        try:
            return json.dumps(t)
        except ValueError:
            return "{}"

    def f_OpenReweightingRequest_target_sig(self, msg: Message) -> str:
        return self.f_OpenSessionRequest_target_sig(msg)

    def _honest(self, a: np.ndarray) -> pb.NDArray:
        return pb.NDArray(dtype="<f8", shape=list(a.shape), data=a.astype("<f8").tobytes())

    def f_OpenReweightingRequest_scaling_mean(self, msg: Message) -> pb.NDArray:
        k = self.live.k
        return self._honest(np.zeros(k)) if self.r.random() < 0.6 else self.ndarray((k,))

    def f_OpenReweightingRequest_scaling_std(self, msg: Message) -> pb.NDArray:
        k = self.live.k
        if self.r.random() < 0.6:
            return self._honest(np.ones(k))
        return self.ndarray((k,), positive=True)

    def f_rows(self, msg: Message) -> pb.NDArray:
        r = self.r
        if r.random() < 0.5:  # an honest shape, perhaps with one hostile value
            a = self.np.normal(size=(r.choice([2, 10, 50]), 3))
            if r.random() < 0.3:
                a[0, 0] = r.choice([1e3, 1001.0, 1e308, -1e308, 1e-300])
            return self._honest(a)
        m = r.choice([2, 3, 10, 50, 1, 0, 20_001])
        ell = r.choice([1, 2, self.live.k, self.live.k + 1, 0])
        if m * max(ell, 1) > 200_000:
            return self.ndarray((m, 1)) if m <= 200_000 else self.ndarray((2, 2))
        return self.ndarray((m, ell))

    def f_labels(self, msg: Message) -> pb.NDArray:
        m = int(msg.rows.shape[0]) if msg.HasField("rows") and msg.rows.shape else 3
        m = m if 0 <= m <= 100_000 else 3  # the rows' own hostile shape is theirs to carry
        return self.ndarray((m if self.r.random() < 0.8 else m + 1,))

    def f_OpenReweightingRequest_basis(self, msg: Message) -> pb.NDArray:
        r, k = self.r, self.live.k
        ell = int(msg.rows.shape[1]) if msg.HasField("rows") and len(msg.rows.shape) == 2 else 2
        if not 0 < ell <= k:
            return self.ndarray((k, r.randint(1, k)))
        if r.random() < 0.5:
            q, _ = np.linalg.qr(self.np.normal(size=(k, ell)))
            q = q * r.choice([1.0, 1e300, 0.0, -1.0, 1e-300])
            return pb.NDArray(dtype="<f8", shape=list(q.shape), data=q.astype("<f8").tobytes())
        return self.ndarray((k, ell))

    def f_scale(self, msg: Message) -> float:
        return self.r.choice([1.0, 1.0, 1.0, 0.5, 2.0, *SPECIAL_FLOATS])

    def f_ReweightStepsRequest_start(self, msg: Message) -> int:
        r = self.r
        x = r.random()
        if x < 0.6:
            return self.live.reweight_taken
        if x < 0.8:
            return r.randint(0, self.live.reweight_taken + 2)
        return self.int64()

    def f_ReweightStepsRequest_count(self, msg: Message) -> int:
        r = self.r
        x = r.random()
        if x < 0.6:
            return r.randint(1, 3)
        return r.choice([0, -1, 1000, 10**6, 2**31, 2**63 - 1, -(2**63)])

    # ---------------------------------------------------------------- ledger sync
    def f_dataset(self, msg: Message) -> str:
        return self.live.dataset if self.r.random() < 0.7 else self.string()

    def _entry(self, seq: int) -> LedgerEntry | None:
        entries = self.live.entries
        return LedgerEntry.from_json(entries[seq]) if 0 <= seq < len(entries) else None

    def _seq(self) -> int:
        r = self.r
        n = len(self.live.entries)
        return r.randint(0, n + 1) if r.random() < 0.7 else self.int64()

    def f_CountersignRequest_seq(self, msg: Message) -> int:
        return self._seq()

    def f_GetLedgerRequest_since_seq(self, msg: Message) -> int:
        return self._seq()

    def f_CountersignRequest_target_sig(self, msg: Message) -> str:
        r, live = self.r, self.live
        entry = self._entry(msg.seq)
        x = r.random()
        if entry is not None and x < 0.5:
            return signing.sign(live.target_key, entry.signed_message())
        if entry is not None and x < 0.6:
            return signing.sign(live.other_key, entry.signed_message())
        if x < 0.7 and live.entries:
            other = LedgerEntry.from_json(r.choice(live.entries))
            return signing.sign(live.target_key, other.signed_message() + b" ")
        if x < 0.8:
            return ""
        if x < 0.9:
            return base64.b64encode(r.randbytes(64)).decode()
        return self.string()

    def f_entries_json(self, msg: Message) -> list[str]:
        r = self.r
        if r.random() < 0.002:  # a long list: the same entry (replayed or forged) 2,000 times
            return [self.entry_json()] * 2000
        return [self.entry_json() for _ in range(r.choice([0, 1, 1, 1, 2, 3, 8]))]

    def entry_json(self) -> str:
        """A ledger entry for RestoreLedger: a real one (replayed), a real one altered (and
        re-countersigned by the peer, which holds that key), a forged one, or not an entry."""
        r, live = self.r, self.live
        x = r.random()
        if x < 0.15 and live.entries:
            return r.choice(live.entries)
        if x < 0.75:
            if live.entries and r.random() < 0.7:
                d = json.loads(r.choice(live.entries))
            else:
                d = self.forged_entry()
            for _ in range(r.randint(1, 3)):
                name = r.choice([*d, "bogus"])
                d[name] = self.entry_value(name)
            if r.random() < 0.5:
                d = self.resign(d)
            return json.dumps(d, allow_nan=True)
        y = r.random()
        if y < 0.3:
            return r.choice(BROKEN_JSON)
        if y < 0.45:
            depth = r.choice([100, 5000, 200_000])
            return "[" * depth + "]" * depth
        if y < 0.6:
            d = self.forged_entry()
            d["dp_event"] = "@"
            return json.dumps(d).replace('"@"', '{"a":' * 3000 + "1" + "}" * 3000)
        if y < 0.75:
            d = self.forged_entry()
            d.pop(r.choice(list(d)))
            return json.dumps(d)
        if y < 0.9:
            return json.dumps(r.choice([[], [1, 2], 1, "entry", None, {"seq": 0}]))
        return self.string()

    def forged_entry(self) -> dict[str, Any]:
        live = self.live
        sid = next(iter(live.honest.values()), "")
        d: dict[str, Any] = {
            "seq": len(live.entries),
            "prev_hash": live.heads[0],
            "time": 1.0,
            "dataset": live.dataset,
            "session": sid,
            "peer": live.peer_name,
            "request_id": f"{sid}/0",
            "dp_event": {"name": "ZeroDpEvent"},
            "privacy_unit": "record",
            "neighbouring": "replace-one",
            "params": {},
            "spend_after": 0.0,
            "payload_sha256": "",
            "source_sig": "",
            "target_sig": "",
            "extra": {},
        }
        if live.entries:
            d["source_sig"] = json.loads(self.r.choice(live.entries)).get("source_sig", "")
        return self.resign(d)

    def resign(self, d: dict[str, Any]) -> dict[str, Any]:
        """Countersign ``d`` with the peer's real key (the source's own signature it cannot
        make: it signs with its own key there too, or keeps another entry's)."""
        try:
            msg = LedgerEntry(**d).signed_message()
        except (TypeError, ValueError, RecursionError):
            return d
        d = dict(d)
        d["target_sig"] = signing.sign(self.live.target_key, msg)
        if self.r.random() < 0.3:
            d["source_sig"] = signing.sign(self.live.target_key, msg)
        return d

    def entry_value(self, name: str) -> Any:
        r, live = self.r, self.live
        n = len(live.entries)
        b64 = base64.b64encode(r.randbytes(64)).decode()
        choices: dict[str, list[Any]] = {
            "seq": [n, n + 1, n - 1, -1, 0, 2**63, "0", 1.5, None, True],
            "prev_hash": [live.heads[0], GENESIS, "", r.randbytes(32).hex()],
            "time": [math.nan, math.inf, -1.0, 1e308, "now", None, 0],
            "dataset": ["other", "", live.dataset, None, 1],
            "peer": ["source", "", live.peer_name, "target-org", None],
            "session": ["", uuid.UUID(int=r.getrandbits(128)).hex, None],
            "request_id": ["", "x/0", None],
            "dp_event": [{}, [], None, {"name": "GaussianDpEvent", "noise_multiplier": -1.0}],
            "privacy_unit": ["attribute", "record", "", None],
            "neighbouring": ["add-remove", "replace-one", None],
            "params": [{}, [], {"batch": -1}, None, {"queries_sha256": "0" * 64}],
            "spend_after": [math.nan, -1.0, 0.0, 1e308, "0"],
            "payload_sha256": ["", "0" * 64, None],
            "source_sig": ["", b64, None],
            "target_sig": ["", b64, None],
            "extra": [{}, {"restored": True}, [], None],
        }
        return r.choice(choices.get(name, [None, 1, "x"]))

    # ---------------------------------------------------------------- undecodable bytes
    def raw(self, desc: _descriptor.Descriptor) -> bytes:
        """Bytes that are not (or only just) a message of type ``desc``."""
        r = self.r
        base = self.message(desc).SerializeToString()[:200_000]
        fields = list(desc.fields)
        op = r.randrange(15)
        if op == 0:
            return r.randbytes(r.randint(1, 64))
        if op == 1:
            return r.randbytes(r.choice([128, 1024, 4096]))
        if op == 2 and base:
            b = bytearray(base)
            for _ in range(r.randint(1, 8)):
                b[r.randrange(len(b))] ^= 1 << r.randrange(8)
            return bytes(b)
        if op == 3 and base:
            return base[: r.randrange(len(base))]
        if op == 4:
            i = r.randint(0, len(base))
            return base[:i] + r.randbytes(r.randint(1, 16)) + base[i:]
        if op == 5:  # an unknown field (parsers keep it; the handler must not care)
            number = r.choice([15, 16, 100, 2**29 - 1, r.randint(8, 2**29 - 1)])
            wire = r.choice([0, 1, 2, 5])
            body = {0: _varint(r.getrandbits(64)), 1: r.randbytes(8), 5: r.randbytes(4)}.get(
                wire, _varint(3) + b"abc"
            )
            return base + _tag(number, wire) + body
        if op == 6:  # a known field with the wrong wire type
            f = r.choice(fields)
            wire = r.choice([w for w in (0, 1, 2, 5) if w != _wire_of(f)])
            body = {0: _varint(5), 1: b"\x00" * 8, 5: b"\x00" * 4}.get(wire, _varint(1) + b"a")
            return base + _tag(f.number, wire) + body
        if op == 7:  # invalid UTF-8 in a string field
            f = r.choice([f for f in fields if f.type == FD.TYPE_STRING] or fields)
            bad = r.choice([b"\xff\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"a\x80b", b"\xf4\x90\x80"])
            return base + _tag(f.number, 2) + _varint(len(bad)) + bad
        if op == 8:  # an overlong varint
            f = r.choice(fields)
            return base + _tag(f.number, 0) + b"\xff" * r.choice([10, 11, 20])
        if op == 9:  # a length past the end
            f = r.choice(fields)
            return base + _tag(f.number, 2) + _varint(r.choice([5, 1000, 2**31, 2**62])) + b"ab"
        if op == 10:  # deep groups
            depth = r.choice([50, 101, 1000, 10_000])
            return _tag(r.choice([1, 3, 99]), 3) * depth + _tag(1, 4) * r.choice([0, depth])
        if op == 11:  # the same fields twice: merged by protobuf (the last scalar wins)
            return base + self.message(desc).SerializeToString()
        if op == 12:  # NDArray fields with garbage inside, or a bad packed shape
            arrays = [f for f in fields if f.type == FD.TYPE_MESSAGE]
            if arrays:
                f = r.choice(arrays)
                inner = r.choice(
                    [
                        _tag(2, 2) + _varint(3) + b"\xff\xff\xff",  # truncated packed varint
                        _tag(2, 0) + _varint(2**63) + _tag(2, 0) + _varint(2**64 - 1),
                        _tag(1, 2) + _varint(2) + b"\xc3\x28",
                        _tag(3, 2) + _varint(100) + b"x",
                        r.randbytes(20),
                    ]
                )
                return base + _tag(f.number, 2) + _varint(len(inner)) + inner
            return base + r.randbytes(8)
        if op == 13:
            return b""
        return _tag(r.randint(1, 2**29 - 1), r.choice([6, 7])) + base  # reserved wire types


TERM_FIELDS = list(SessionTerms.model_fields)
# valid starting points (each one the fuzz daemon's policy accepts) that mutations push around
TEMPLATES: list[dict[str, Any]] = [
    dict(
        epsilon=4.0,
        projection="jl",
        projection_dim=5,
        privacy_unit="attribute",
        release="rows",
        batch_size=50,
        noise_multiplier=1.0,
        steps=5,
    ),
    dict(epsilon=2.0, projection="jl", projection_dim=5),
    dict(epsilon=2.0, projection="jl", projection_dim=8, release="class-gaussians"),
    dict(
        epsilon=2.0,
        projection="jl",
        projection_dim=5,
        release="sinkhorn-synthetic",
        synthetic_points=3,
        sinkhorn_steps=5,
    ),
    dict(
        epsilon=4.0,
        projection="jl",
        projection_dim=5,
        pate_epsilon=1.0,
        pate_queries=100,
        pate_teachers=20,
    ),
    dict(epsilon=2.0, projection="target-pca", projection_dim=5),
    # the learned metric (seed 003): W is one more release index of the session
    dict(
        epsilon=2.0,
        projection="jl",
        projection_dim=5,
        cost="metric",
        metric_dim=3,
        metric_pairs=4,
        metric_steps=5,
    ),
    dict(
        epsilon=2.0,
        privacy_unit="attribute",
        projection="jl",
        projection_dim=4,
        batch_size=30,
        noise_multiplier=0.0,
        steps=3,
    ),
]
