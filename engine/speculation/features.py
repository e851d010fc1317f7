"""What the Spec Tool Selector learns from: ``Situation`` (what the engine has seen when a sample starts reasoning
about its next call), examples cut from recorded trajectories, and the featurizer that turns a situation into a
sparse vector.

Owns: ``Situation``, ``label_of``, ``examples_of``, the feature groups (``FEATURE_GROUPS``) and ``featurize``.
Feature groups, each scaled to unit length so that no group drowns the others (a page of words must not outweigh
the one token that says which call came last):
- ``instruction``: the instruction's words, plus one token for the whole instruction (exact recall);
- ``template``: the task's template;
- ``step``: the step index (capped);
- ``calls``: the last call, the two last, the names of the last two, the whole sequence (exact recall) and the bag of
  every call so far;
- ``observation``: the first line (a page's title), the lines, the words and one token for the whole text, of the
  first ``OBSERVATION_CHARS`` characters only, plus whether it is an error.
Hashing (``FeatureHasher``, ``N_FEATURES`` columns) keeps the vector's width fixed whatever the text says.
Must never: read a task's reference solution or evaluator (a ``Situation`` is built from what the policy saw and
did, nothing else), or featurize an unbounded text: the agent and the pages it opens are adversaries, so every text
is cut before it is tokenized and the tokens of each group are capped.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from bunshin.envs.records import ToolCall, canonical

from ..records import StepObservation, Trajectory

FEATURE_GROUPS = ("instruction", "template", "step", "calls", "observation")
N_FEATURES = 1 << 18
OBSERVATION_CHARS = 8192  # what of the latest observation is featurized (and kept in an example)
INSTRUCTION_CHARS = 2048
CALL_CHARS = 512  # of each previous call, as a feature (the label itself is kept whole)
MAX_STEP = 30  # steps beyond this look alike
STEP_WEIGHT = 0.3  # weak: a state revisited after a detour is the same state at a later step
MAX_WORDS = 256  # distinct words of an observation (the first ones)
MAX_LINES = 96  # lines of an observation (the first ones)
MAX_BAG = 32  # previous calls in the bag (the latest ones)
_WORD = re.compile(r"[a-z0-9]+")


class Situation(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine has seen when a sample starts reasoning about its next call."""

    suite: str
    template: str  # the task's template ("" when the suite names none)
    instruction: str
    step: int  # calls taken so far
    calls: tuple[str, ...]  # canonical calls so far, oldest first: canonical(call).decode()
    observation: str  # the latest observation as the policy reads it (``observation_text``)

    def bounded(self) -> Situation:
        """The same situation with its texts cut to what the featurizer reads (what an example keeps)."""
        if (len(self.observation) <= OBSERVATION_CHARS and len(self.instruction) <= INSTRUCTION_CHARS
                and len(self.calls) <= MAX_BAG and all(len(c) <= CALL_CHARS for c in self.calls)):
            return self
        return msgspec.structs.replace(self, observation=self.observation[:OBSERVATION_CHARS],
                                       instruction=self.instruction[:INSTRUCTION_CHARS],
                                       calls=tuple(c[:CALL_CHARS] for c in self.calls[-MAX_BAG:]))


def label_of(call: ToolCall) -> str:
    """A call's class: its canonical form."""
    return canonical(call).decode()


def text_of(obs: StepObservation | None) -> str:
    """A recorded observation as the policy read it (``bunshin.envs.suites.base.observation_text``)."""
    if obs is None:
        return ""
    return f"ERROR: {obs.error}\n{obs.output}" if obs.error else obs.output


def examples_of(t: Trajectory, template: str) -> list[tuple[Situation, str]]:
    """One example per step (its call) and one for the final action when the trajectory has one; the situation
    before step ``i`` holds the calls before it and the observation it answered (the first observation for 0)."""
    calls = [label_of(s.call) for s in t.steps]
    out = []

    def situation(i: int) -> Situation:
        obs = t.first_observation if i == 0 else t.steps[i - 1].observation
        return Situation(suite=t.suite, template=template, instruction=t.instruction, step=i,
                         calls=tuple(calls[:i]), observation=text_of(obs))

    for i, label in enumerate(calls):
        out.append((situation(i), label))
    if t.final is not None:
        out.append((situation(len(t.steps)), label_of(t.final)))
    return out


# -- featurizing ----------------------------------------------------------------------------------------------------
def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(errors="surrogatepass"), digest_size=8).hexdigest()


def _unit(tokens: Sequence[str], out: dict[str, float], scale: float = 1.0) -> None:
    """``tokens`` (distinct) added with equal weights summing to length ``scale``."""
    if tokens:
        w = scale / math.sqrt(len(tokens))
        for tok in tokens:
            out[tok] = out.get(tok, 0.0) + w


def _first(items: Iterable[str], n: int) -> list[str]:
    """The first ``n`` distinct items, in order."""
    seen: dict[str, None] = {}
    for item in items:
        if item not in seen:
            seen[item] = None
            if len(seen) >= n:
                break
    return list(seen)


def tokens(s: Situation, groups: Sequence[str] = FEATURE_GROUPS) -> dict[str, float]:
    """The situation's weighted tokens, of ``groups`` only. Every group contributes at most unit length."""
    out: dict[str, float] = {}
    if "instruction" in groups:
        text = s.instruction[:INSTRUCTION_CHARS]
        _unit(["I:" + _digest(text)], out, 0.7)
        _unit(["i:" + w for w in _first(_WORD.findall(text.lower()), MAX_WORDS)], out, 0.7)
    if "template" in groups:
        out["t:" + s.template[:200]] = 1.0
    if "step" in groups:
        out[f"s:{min(s.step, MAX_STEP)}"] = STEP_WEIGHT
    if "calls" in groups:
        calls = [c[:CALL_CHARS] for c in s.calls[-MAX_BAG:]]
        last = calls[-1] if calls else "-"
        before = calls[-2] if len(calls) > 1 else "-"
        name = lambda c: c.rsplit('"name":', 1)[-1][:80]  # noqa: E731  (canonical JSON ends with the name)
        _unit([f"c1:{last}", f"c2:{before}|{last}", f"n1:{name(last)}", f"n2:{name(before)}|{name(last)}",
               f"C:{len(s.calls)}:" + _digest("\n".join(calls))], out, 0.8)
        _unit(["b:" + c for c in _first(reversed(calls), MAX_BAG)], out, 0.6)
    if "observation" in groups:
        text = s.observation[:OBSERVATION_CHARS]
        lines = [line.strip() for line in text.splitlines()]
        _unit(["O:" + _digest(text), "o0:" + (lines[0][:200] if lines else ""),
               "oe:" + str(text.startswith("ERROR:"))], out, 0.6)
        _unit(["ol:" + line[:200] for line in _first(filter(None, lines), MAX_LINES)], out, 0.6)
        _unit(["ow:" + w for w in _first(_WORD.findall(text.lower()), MAX_WORDS)], out, 0.5)
    return out


def hasher() -> Any:
    from sklearn.feature_extraction import FeatureHasher

    return FeatureHasher(n_features=N_FEATURES, input_type="dict", alternate_sign=False)


def featurize(situations: Iterable[Situation], groups: Sequence[str] = FEATURE_GROUPS) -> Any:
    """A CSR matrix, one row per situation (heavy for many situations: never on the event loop)."""
    return hasher().transform(tokens(s, groups) for s in situations)
