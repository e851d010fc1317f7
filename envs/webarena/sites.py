"""A user's WebArena deployment: which of WebArena's sites it has and where (``--site shopping=URL`` or the ``WA_*``
variables BrowserGym reads), and what the tasks call them.

Owns: WebArena's site names, their placeholders in task files (``__SHOPPING__``) and variables (``WA_SHOPPING``);
``Deployment``: the sites given, each URL checked (http or https, a host, no query or fragment) and its host and port
named, and the placeholders substituted in a task's text.
Must never: accept a URL whose host and port it cannot name, or substitute a site that was not given (a task that
needs it is refused, naming it).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..suites.errors import SuiteError

# WebArena's sites: name -> (the placeholder its task files use, the variable BrowserGym and WebArena read)
SITES: dict[str, tuple[str, str]] = {
    "shopping": ("__SHOPPING__", "WA_SHOPPING"),
    "shopping_admin": ("__SHOPPING_ADMIN__", "WA_SHOPPING_ADMIN"),
    "reddit": ("__REDDIT__", "WA_REDDIT"),
    "gitlab": ("__GITLAB__", "WA_GITLAB"),
    "wikipedia": ("__WIKIPEDIA__", "WA_WIKIPEDIA"),
    "map": ("__MAP__", "WA_MAP"),
    "homepage": ("__HOMEPAGE__", "WA_HOMEPAGE"),
}
DEFAULT_PORTS = {"http": 80, "https": 443}


class BadSite(SuiteError, ValueError):
    """A site given on the command line or in a variable that cannot be used: names it and why."""


@dataclass(frozen=True)
class Site:
    name: str
    url: str  # as given, without a trailing slash
    host: str
    port: int

    @property
    def placeholder(self) -> str:
        return SITES[self.name][0]


@dataclass(frozen=True)
class Deployment:
    """The sites of one deployment, by name."""

    sites: dict[str, Site] = field(default_factory=dict)

    @classmethod
    def parse(cls, given: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> Deployment:
        """``given``: ``name=URL`` items (``--site``); ``environ``: the ``WA_*`` variables, for sites not given
        (None: none read; pass ``os.environ`` to read them)."""
        urls: dict[str, str] = {}
        for item in given:
            name, sep, url = item.partition("=")
            if not sep or not url:
                raise BadSite(f"--site {item!r}: expected NAME=URL (NAME one of {', '.join(SITES)})")
            if name not in SITES:
                raise BadSite(f"--site {item!r}: {name!r} is not a WebArena site (known: {', '.join(SITES)})")
            if name in urls:
                raise BadSite(f"--site {name} is given twice")
            urls[name] = url
        for name, (_, variable) in SITES.items():
            if name not in urls and environ is not None and environ.get(variable):
                urls[name] = environ[variable]
        return cls({name: _site(name, url) for name, url in urls.items()})

    def missing(self, needed: Iterable[str]) -> list[str]:
        """The sites of ``needed`` this deployment lacks, in WebArena's order."""
        wanted = set(needed)
        return [name for name in SITES if name in wanted and name not in self.sites] + sorted(wanted - set(SITES))

    def substitute(self, text: str) -> str:
        """``text`` with the placeholders of the sites given replaced by their URLs."""
        for site in self.sites.values():
            text = text.replace(site.placeholder, site.url)
        return text


def _site(name: str, url: str) -> Site:
    parsed = urllib.parse.urlsplit(url.strip())
    where = f"site {name} ({url!r})"
    if parsed.scheme not in DEFAULT_PORTS:
        raise BadSite(f"{where}: the URL must start with http:// or https://")
    if not parsed.hostname:
        raise BadSite(f"{where}: the URL has no host")
    if parsed.query or parsed.fragment:
        raise BadSite(f"{where}: the URL may not have a query or a fragment (it is a site's base)")
    try:
        port = parsed.port or DEFAULT_PORTS[parsed.scheme]
    except ValueError as exc:
        raise BadSite(f"{where}: {exc}") from exc
    return Site(name=name, url=url.strip().rstrip("/"), host=parsed.hostname, port=port)

