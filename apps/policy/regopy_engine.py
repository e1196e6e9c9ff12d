"""In-process Rego evaluation through regopy (rego-cpp), the default engine (POLICY_ENGINE=embedded).

Loading: authz.rego, attributes.rego and filter.rego come from the policy directory, each falling back to the built-in
file of the same name (BUILTIN_POLICY_DIR, the repository's policies/) when missing. The three modules compile
together into one bundle with one entrypoint per rule, so a policy may use helpers from another file.

Threads: a regopy ``Interpreter`` holds the current input as mutable state and its ctypes calls release the GIL, so
one interpreter cannot serve two threads at once. Evaluations therefore take an interpreter, with its own bundle
built from the shared, already validated sources, from a small pool (``interpreters``, POLICY_INTERPRETERS) and give
it back: rego-cpp does not document bundles as safe for concurrent queries. A pool rather than one per thread: each
compiled pair holds ~0.8 MB of native memory (1.7 MB with glibc's default malloc settings), and a web worker's 16
request threads each built one (issue 12), while evaluation is CPU work that no more threads than cores run at once.

Reloading: at most once per ``reload_interval`` seconds the files' (path, mtime, size) are compared with the loaded
ones; on a change the sources are re-read and compiled. A failed compilation keeps the previous policies and logs an
error (once per change of the files).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.core.native import preload_before_regopy

preload_before_regopy()
import regopy  # noqa: E402

from apps.policy import _rego_io, _rego_refs  # noqa: E402
from apps.policy.engine import (  # noqa: E402
    AUTHZ,
    ENTRYPOINTS,
    POLICY_FILES,
    UNDEFINED,
    PolicyCompileError,
    PolicyEngine,
    PolicyEvaluationError,
)

logger = logging.getLogger(__name__)

_Signature = tuple[tuple[str, int, int], ...]
_generation_ids = itertools.count(1)


@dataclass(frozen=True)
class _Generation:
    """One loaded set of policy sources, already proven to compile."""

    id: int
    sources: tuple[tuple[str, str], ...]  # (path, text) per policy file
    signature: _Signature

    @functools.cached_property
    def deterministic(self) -> bool:
        """True when no module calls a built-in whose answer depends on more than the input and the policy text
        (the clock, randomness, the network, the runtime): only then may a decision be reused (see _DecisionKey)."""
        return not any(_NONDETERMINISTIC.search(text) for _, text in self.sources)

    @functools.cached_property
    def read_fields(self) -> dict[str, _rego_refs.Fields]:
        """Per rule, the top-level input fields its decision can depend on (None: all of them), so the decision
        cache keys on those alone (see _rego_refs)."""
        texts = [text for _, text in self.sources]
        return {rule: _rego_refs.rule_fields(entrypoint, texts) for rule, entrypoint in ENTRYPOINTS.items()}


# Built-ins whose result for the same input can change between calls. A policy naming any of them is never cached.
_NONDETERMINISTIC = re.compile(
    r"\b(time\.now_ns|rand\.|uuid\.|http\.send|opa\.runtime|net\.|io\.jwt\.decode_verify|trace\b|print\b)"
)
# Inputs whose key text (the fields the rule reads) is longer than this are evaluated without the cache: a write's
# whole value, when a rule reads it, is unique anyway, and the bound keeps the cache small (_DECISION_CACHE_SIZE keys
# of at most this many characters).
_CACHE_MAX_INPUT_CHARS = 4096
_DECISION_CACHE_SIZE = 2048
# Interpreters evaluating at once per process (POLICY_INTERPRETERS): more than the cores gains nothing, since an
# evaluation is CPU work; a request thread that finds them all busy waits for one.
DEFAULT_INTERPRETERS = 4


class _GenerationChanged(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__("policy generation changed during evaluation")
        self.value = value


class _DecisionKey:
    """A cache key that is provably the same decision: the same compiled policy generation, the same rule, and the
    same input as far as the rule can read it. ``text`` is the ``repr`` of the input's fields the rule can read
    (_Generation.read_fields; the whole input when the rule may read all of it). ``repr`` of JSON-shaped values
    (dict, list, tuple, str, int, float, bool, None) determines the value exactly, including types (1 vs 1.0 vs
    True, str vs int keys) and float bits; any other type is refused by the evaluation (_rego_io), which raises, and
    failures are never cached. Rego evaluation is a pure function of (policy, input) when the policy calls no
    non-deterministic built-in (_Generation.deterministic), and a rule's value cannot change with fields it never
    reads. A miss evaluates the whole input, then lets go of it: the cache keeps only the text."""

    __slots__ = ("generation", "hash", "input", "rule", "text")

    def __init__(self, generation: int, rule: str, input: dict[str, Any] | None, text: str) -> None:
        self.generation, self.rule, self.input, self.text = generation, rule, input, text
        self.hash = hash((generation, rule, text))

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _DecisionKey)
            and self.generation == other.generation
            and self.rule == other.rule
            and self.text == other.text
        )


def _quiet_interpreter() -> regopy.Interpreter:
    # rego-cpp prints its own error report to stdout by default; ours goes through logging and the exception.
    interpreter = regopy.Interpreter()
    interpreter.log_level = regopy.LogLevel.NONE
    return interpreter


def _compile(sources: tuple[tuple[str, str], ...]) -> tuple[regopy.Interpreter, regopy.Bundle]:
    builder = _quiet_interpreter()
    try:
        for path, text in sources:
            builder.add_module(path, text)
        bundle = builder.build(None, list(ENTRYPOINTS.values()))
    except regopy.RegoError as exc:
        raise PolicyCompileError(f"memory policies do not compile: {_describe(exc, sources)}") from None
    if not bundle.ok():
        raise PolicyCompileError("memory policies do not compile (rego-cpp reported a failed build)")
    # The builder stays referenced with its bundle: the bundle is not documented to outlive its interpreter.
    return builder, bundle


# rego-cpp reports errors as an s-expression: (error <n>:<file>|<byte offset>|<length> (errormsg <n>:<message>) ...)
_ERROR_RE = re.compile(r"\(error \d+:(?P<file>[^|]*)\|(?P<offset>\d+)\|\d+\s+\(errormsg \d+:(?P<message>[^)]*)\)")


def _describe(exc: regopy.RegoError, sources: tuple[tuple[str, str], ...]) -> str:
    """'file:line:col: message; ...' from a RegoError, so an operator sees where the policy is wrong."""
    texts = dict(sources)
    found = []
    for match in _ERROR_RE.finditer(str(exc)):
        where = match["file"]
        if where in texts:
            before = texts[where].encode("utf-8")[: int(match["offset"])]
            line = before.count(b"\n") + 1
            column = len(before) - (before.rfind(b"\n") + 1) + 1
            where = f"{where}:{line}:{column}"
        found.append(f"{where}: {match['message']}")
    return "; ".join(found) if found else str(exc).strip()


@dataclass
class _Slot:
    """One interpreter with the bundle it queries, compiled from one policy generation."""

    generation_id: int
    builder: regopy.Interpreter  # the bundle is not documented to outlive the interpreter that built it
    bundle: regopy.Bundle
    interpreter: regopy.Interpreter


class RegopyEngine(PolicyEngine):
    name = "embedded"

    def __init__(
        self,
        policy_dir: str | Path | None,
        builtin_dir: str | Path,
        reload_interval: float = 1.0,
        interpreters: int = DEFAULT_INTERPRETERS,
    ) -> None:
        self.policy_dir = Path(policy_dir) if policy_dir else None
        self.builtin_dir = Path(builtin_dir)
        self.reload_interval = reload_interval
        self.interpreters = max(1, interpreters)
        self._generation: _Generation | None = None
        self._reload_lock = threading.Lock()
        self._next_check = 0.0
        self._failed_signature: _Signature | None = None
        # Idle slots, the most recently used last (reused first, so a quiet process compiles only one or two).
        self._idle: list[_Slot] = []
        self._idle_lock = threading.Lock()
        self._free = threading.BoundedSemaphore(self.interpreters)
        # Per engine, so tests that rebuild the engine start empty. lru_cache is thread-safe and never caches an
        # exception; a value is stored as JSON text so no caller can mutate a cached decision.
        self._cached_value = functools.lru_cache(maxsize=_DECISION_CACHE_SIZE)(self._evaluate_as_json)

    # --- loading ------------------------------------------------------------------------------------------------

    def files(self) -> list[Path]:
        """The file used for each policy: the directory's when present, else the built-in one."""
        chosen = []
        for name in POLICY_FILES:
            custom = self.policy_dir / name if self.policy_dir else None
            chosen.append(custom if custom is not None and custom.is_file() else self.builtin_dir / name)
        return chosen

    def _signature(self) -> _Signature:
        signature = []
        for path in self.files():
            stat = path.stat()
            signature.append((str(path), stat.st_mtime_ns, stat.st_size))
        return tuple(signature)

    def _read(self) -> _Generation:
        signature = self._signature()
        sources = tuple((path, Path(path).read_text(encoding="utf-8")) for path, _, _ in signature)
        return _Generation(next(_generation_ids), sources, signature)

    def load(self) -> None:
        """Compile now; PolicyCompileError (an ImproperlyConfigured) names the files and the compiler's message."""
        if self.policy_dir is not None and not self.policy_dir.is_dir():
            raise PolicyCompileError(
                f"policy directory {self.policy_dir} (SERVICE_POLICY_DIR / --policy-dir) does not exist"
            )
        try:
            generation = self._read()
        except OSError as exc:
            raise PolicyCompileError(f"cannot read memory policies: {exc}") from None
        try:
            _compile(generation.sources)
        except PolicyCompileError as exc:
            files = ", ".join(path for path, _ in generation.sources)
            raise PolicyCompileError(f"{exc} (files: {files})") from None
        self._generation = generation
        self._next_check = time.monotonic() + self.reload_interval
        logger.info("memory policies loaded", extra={"policy_files": [path for path, _ in generation.sources]})

    def _maybe_reload(self) -> None:
        if time.monotonic() < self._next_check or not self._reload_lock.acquire(blocking=False):
            return  # checked recently, or another thread is checking right now
        try:
            self._next_check = time.monotonic() + self.reload_interval
            try:
                signature = self._signature()
            except OSError as exc:
                logger.error("memory policy files cannot be read; keeping the loaded policies: %s", exc)
                return
            current = self._generation
            if (current is not None and signature == current.signature) or signature == self._failed_signature:
                return
            try:
                generation = self._read()
                _compile(generation.sources)
            except (OSError, PolicyCompileError) as exc:
                self._failed_signature = signature
                logger.error("changed memory policies rejected; keeping the loaded policies: %s", exc)
                return
            self._generation = generation
            self._failed_signature = None
            logger.info("memory policies reloaded", extra={"policy_files": [path for path, _ in generation.sources]})
        finally:
            self._reload_lock.release()

    @contextlib.contextmanager
    def _slot(self) -> Iterator[_Slot]:
        """An interpreter and bundle of the current policies for this thread alone until the block ends; waits while
        all ``interpreters`` are in use."""
        generation = self._generation
        if generation is None:
            self.load()
            generation = self._generation
            assert generation is not None
        self._free.acquire()
        slot: _Slot | None = None
        try:
            with self._idle_lock:
                while self._idle:
                    candidate = self._idle.pop()
                    if candidate.generation_id == generation.id:
                        slot = candidate
                        break
                    # Compiled from policies since reloaded: dropped, its memory with it.
            if slot is None:
                builder, bundle = _compile(generation.sources)
                slot = _Slot(generation.id, builder, bundle, _quiet_interpreter())
            yield slot
        finally:
            if slot is not None:
                with self._idle_lock:
                    self._idle.append(slot)
            self._free.release()

    # --- evaluation ---------------------------------------------------------------------------------------------

    def _evaluate(self, rule: str, input: dict[str, Any]) -> Any:
        self._maybe_reload()
        generation = self._generation
        if generation is not None and generation.deterministic:
            fields = generation.read_fields[rule]
            text = repr(input if fields is None else {name: input[name] for name in sorted(fields) if name in input})
            if len(text) <= _CACHE_MAX_INPUT_CHARS:
                try:
                    cached = self._cached_value(_DecisionKey(generation.id, rule, input, text))
                except _GenerationChanged as changed:
                    return changed.value
                return UNDEFINED if cached is None else json.loads(cached)
        return self._evaluate_now(rule, input)[0]

    def _evaluate_as_json(self, key: _DecisionKey) -> str | None:
        value, generation_id = self._evaluate_now(key.rule, key.input)
        key.input = None  # the stored key must not hold a request's whole value
        if generation_id != key.generation:
            # The policies were reloaded between building the key and evaluating: the answer is the new policies'
            # (as it would be uncached) but must not be stored under the old generation's key.
            raise _GenerationChanged(value)
        return None if value is UNDEFINED else json.dumps(value, allow_nan=False)

    def _evaluate_now(self, rule: str, input: dict[str, Any]) -> tuple[Any, int]:
        """Evaluate in an interpreter from the pool; the value and the generation whose bundle computed it."""
        with self._slot() as slot:
            # Not regopy's Input/Output: they truncate strings at NUL and mangle escapes (see _rego_io).
            _rego_io.set_input(slot.interpreter, input)
            return _rego_io.query(slot.interpreter, slot.bundle, ENTRYPOINTS[rule]), slot.generation_id

    def check(self) -> None:
        # Exercise the real path (reload check, thread bundle, evaluation) without counting a decision in metrics.
        probe = {
            "operation": "read",
            "namespace": ["user", "readiness-probe"],
            "key": "readiness",
            "context": {"user_id": "readiness-probe", "jwt_claims": {"roles": []}},
        }
        self._maybe_reload()
        value = self._evaluate_now(AUTHZ, probe)[0]  # not cached: readiness must reach rego-cpp
        if value is not UNDEFINED and not isinstance(value, dict):
            raise PolicyEvaluationError("authz decision is not an object")
