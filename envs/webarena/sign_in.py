"""Signing in to a WebArena site the way WebArena's set-up does (``browser_env/auto_login.py``): its page, its
fields, its fixed accounts, in the workspace's own Chromium.

Owns: ``RECIPES`` (per site: the sign-in page under the site's URL, the username and password fields and the button,
as CSS selectors for the elements WebArena's Playwright finds by label, placeholder or test id; the account), and
``sign_in``: open the page, fill both fields as typing would (input and change events), press the button, wait for
the page it loads; a sign-in form still there afterwards is a refusal (``SignInFailed``, with the page's message).
Shopping's recipe is checked against the embedded shop's Magento form; the others follow WebArena's auto_login and
the sites' public markup, unchecked here (no deployment of them is reachable from this machine).
Must never: report a sign-in done that the site refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..app import ToolError
from ..chromium.browser import BrowserError, Chromium


class SignInFailed(ToolError):
    """A site did not take WebArena's account (or its page had no sign-in form): names the site and its answer."""


@dataclass(frozen=True)
class Recipe:
    path: str  # the sign-in page, under the site's URL
    username: str  # CSS selectors of the fields and the button
    password: str
    button: str
    account: tuple[str, str]  # WebArena's (browser_env/env_config.py ACCOUNTS)


RECIPES = {
    "shopping": Recipe("/customer/account/login/", 'input[name="login[username]"]', 'input[name="login[password]"]',
                       "form.form-login button[type=submit]", ("emma.lopez@gmail.com", "Password.123")),
    "shopping_admin": Recipe("/admin", 'input[name="login[username]"]', 'input[name="login[password]"]',
                             "button.action-login", ("admin", "admin1234")),
    "reddit": Recipe("/login", 'input[name="_username"]', 'input[name="_password"]', "form button[type=submit]",
                     ("MarvelsGrantMan136", "test1234")),
    "gitlab": Recipe("/users/sign_in", '[data-testid="username-field"]', '[data-testid="password-field"]',
                     '[data-testid="sign-in-button"]', ("byteblaze", "hello1234")),
}

_FILL = """(() => {{
  const fill = (selector, value) => {{
    const field = document.querySelector(selector);
    if (!field) return selector;
    Object.getOwnPropertyDescriptor(Object.getPrototypeOf(field), 'value').set.call(field, value);
    field.dispatchEvent(new Event('input', {{bubbles: true}}));
    field.dispatchEvent(new Event('change', {{bubbles: true}}));
    return null;
  }};
  const missing = fill({username}, {user}) || fill({password}, {secret});
  if (missing) return 'no field ' + missing;
  const button = document.querySelector({button});
  if (!button) return 'no button ' + {button};
  button.click();
  return '';
}})()"""
_MESSAGE = ("(() => { const m = document.querySelector('.message-error, .messages, .alert, .flash-alert, "
            ".form-error'); return m ? m.innerText : document.title; })()")


def sign_in(chromium: Chromium, site: str, site_url: str, deadline: float) -> str:
    """Sign in to ``site`` at ``site_url`` with WebArena's account; the URL the site then shows."""
    recipe = RECIPES.get(site)
    if recipe is None:
        raise SignInFailed(f"{site} has no sign-in (WebArena logs in to {', '.join(RECIPES)})")
    user, secret = recipe.account
    page = site_url.rstrip("/") + recipe.path
    try:
        chromium.navigate(page, deadline)
        status = chromium.tab.status
        if status == 0 or status >= 500:  # no answer (0), or the egress proxy's 502 for a site it cannot reach
            raise SignInFailed(f"sign-in to {site}: {page} does not answer (HTTP status {status or 'none'})")
        chromium.before_input()
        trouble = chromium.evaluate(_FILL.format(username=json.dumps(recipe.username), user=json.dumps(user),
                                                 password=json.dumps(recipe.password), secret=json.dumps(secret),
                                                 button=json.dumps(recipe.button)), deadline)
        if trouble:
            raise SignInFailed(f"sign-in to {site} at {page}: the page has {trouble} (status "
                               f"{chromium.tab.status}): not the sign-in form WebArena fills")
        chromium.settle(deadline)
        if chromium.evaluate(f"!!document.querySelector({json.dumps(recipe.password)})", deadline):
            message = str(chromium.evaluate(_MESSAGE, deadline) or "").strip()
            raise SignInFailed(f"sign-in to {site} at {page} as {user} was refused: {message[:300]!r}")
        return chromium.url(deadline)
    except BrowserError as exc:
        raise SignInFailed(f"sign-in to {site} at {page}: {exc}") from exc
