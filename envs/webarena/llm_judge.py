"""The judge model WebArena's ``fuzzy_match`` asks: a model behind an OpenAI-compatible server the user names
(``--judge URL``, e.g. ``http://host:8000/v1``), asked WebArena's two questions as its harness asks them.

Owns: ``OpenAIJudge``: ``fuzzy`` (is the answer semantically the reference? WebArena's ``llm_fuzzy_match``: a verdict
"incorrect" or "partially correct" scores 0, "correct" 1) and ``unachievable`` (does the reported reason match why
the task cannot be done? ``llm_ua_match``: "different" 0, "same" 1), each one chat completion at temperature 0 and
768 tokens at most, the model the server serves first unless one is named; every failure typed
(``JudgeUnavailable``: the server does not answer, answers an error, or gives no verdict), never a score.
Why urllib (``judge.http_json``): one request per judgement from a worker thread; the engine's aiohttp session is
the policy's.
Must never: score an answer the judge did not judge.
"""

from __future__ import annotations

from typing import Any

from .judge import EvaluationFailed, http_json

TIMEOUT_S = 120.0
SYSTEM = "You are a helpful assistant"


class JudgeUnavailable(EvaluationFailed):
    """The judge model could not judge (not answering, an error, no verdict): names the URL and why."""


class OpenAIJudge:
    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"judge {base_url!r}: an http(s) URL of an OpenAI-compatible server is needed")
        self.base_url, self.model, self.api_key = base_url.rstrip("/"), model, api_key

    def fuzzy(self, intent: str, reference: str, prediction: str) -> float:
        """WebArena's ``llm_fuzzy_match``."""
        message = ("Help a teacher to grade the answer of a student given a question. Keep in mind that the student "
                   "may use different phrasing or wording to answer the question. The goal is to evaluate whether "
                   "the answer is semantically equivalent to the reference answer.\n"
                   f"question: {intent}\nreference answer: {reference}\n"
                   "all the string 'N/A' that you see is a special sequence that means 'not achievable'\n"
                   f"student answer: {prediction}\n"
                   "Conclude the judgement by correct/incorrect/partially correct.")
        verdict = self._ask(message)
        if "partially correct" in verdict or "incorrect" in verdict:
            return 0.0
        if "correct" in verdict:
            return 1.0
        raise JudgeUnavailable(f"judge {self.base_url}: no verdict (correct/incorrect) in {verdict[:200]!r}")

    def unachievable(self, intent: str, reason: str, prediction: str) -> float:
        """WebArena's ``llm_ua_match``."""
        message = (f"task: {intent}\nactual unachievable reason: {reason}\nreported unachievable reason: "
                   f"{prediction}\n"
                   "The task described above is inherently unachievable due to the reason specified under 'actual "
                   "unachievable reason'. An individual previously attempted this task and was unable to complete "
                   "it. They provided a reason for their failure, which is listed under 'reported unachievable "
                   "reason'. Your role is to review both the actual and reported reasons. Determine if the reported "
                   "reason aligns with the actual reason, even if implicitly. If the stated reason is in line with "
                   "the actual reason, respond with 'same'. Otherwise, respond with 'different'.")
        verdict = self._ask(message)
        if "different" in verdict:
            return 0.0
        if "same" in verdict:
            return 1.0
        raise JudgeUnavailable(f"judge {self.base_url}: no verdict (same/different) in {verdict[:200]!r}")

    def _ask(self, message: str) -> str:
        model = self.model or self._first_model()
        body = {"model": model, "temperature": 0, "max_tokens": 768, "top_p": 1.0,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": message}]}
        answer = self._call("POST", "/chat/completions", body)
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise JudgeUnavailable(f"judge {self.base_url}: no message in its answer {answer!r:.200}") from exc
        return str(content or "").lower()

    def _first_model(self) -> str:
        listed = self._call("GET", "/models", None)
        try:
            self.model = str(listed["data"][0]["id"])
        except (KeyError, IndexError, TypeError) as exc:
            raise JudgeUnavailable(f"judge {self.base_url}: it serves no model ({listed!r:.200})") from exc
        return self.model

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        return http_json(method, f"{self.base_url}{path}", body, token=self.api_key, label="judge ",
                         timeout_s=TIMEOUT_S, error=JudgeUnavailable)
