"""WebArena's full reset of a deployment, as its reset server answers (webarena-setup's ``reset_server``, what
BrowserGym's ``WA_FULL_RESET`` names): ``GET /reset`` starts it (200; 418 when one already runs), ``GET /status``
says ``Reset ongoing`` (200) until it is ready (200) or failed (500 with the reason).

Owns: ``full_reset``: start the reset, poll the status every ``POLL_S`` until ready, within ``TIMEOUT_S``; every
failure a ``ResetFailed`` naming the server and what it said.
Why urllib on a thread: two plain GETs at a time, from a suite's ``before_group``.
Must never: report a deployment ready that the server did not say was.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request

from ..suites.errors import SuiteStepFailed

POLL_S = 5.0
TIMEOUT_S = 900.0  # a full reset takes two to three minutes on WebArena's own machines
MAX_BODY = 64 << 10


class ResetFailed(SuiteStepFailed):
    """The deployment's reset did not complete: names the reset server and its answer."""


def reset_base(url: str) -> str:
    """The reset server's base URL: ``WA_FULL_RESET`` as BrowserGym reads it may name ``.../reset`` itself."""
    url = url.strip().rstrip("/")
    return url[: -len("/reset")] if url.endswith("/reset") else url


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read(MAX_BODY).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_BODY).decode(errors="replace")
    except (OSError, urllib.error.URLError) as exc:
        raise ResetFailed(f"the reset server {url} does not answer ({exc})") from exc


async def full_reset(url: str, *, poll_s: float = POLL_S, timeout_s: float = TIMEOUT_S) -> float:
    """Reset the deployment through the reset server at ``url``; the seconds it took."""
    base, started = reset_base(url), time.monotonic()
    status, body = await asyncio.to_thread(_get, f"{base}/reset")
    if status not in (200, 418):  # 418: one is already running, whose end is waited for
        raise ResetFailed(f"{base}/reset answered {status}: {body.strip()[:300]!r}")
    while True:
        await asyncio.sleep(poll_s)
        status, body = await asyncio.to_thread(_get, f"{base}/status")
        if status == 200 and "ongoing" not in body.lower():
            return time.monotonic() - started
        if status != 200:
            raise ResetFailed(f"{base}/status answered {status}: {body.strip()[:300]!r}")
        if time.monotonic() - started > timeout_s:
            raise ResetFailed(f"{base}: the reset was still ongoing after {timeout_s:g} s")
