"""The shop as a workspace application (first slice): the packed catalog and its search index, built once when
the workspace starts, and tools that read them. The HTTP shop, carts and orders in SQLite, and the text browser
come next (issue 3); they build on this state.
"""

from __future__ import annotations

from typing import Any

from ..app import AppContext, Tool, ToolError, WorkspaceApp
from ..records import Observation
from .catalog import Catalog
from .search import SearchIndex


class ShopApp(WorkspaceApp):
    def __init__(self, catalog_size: int = 20_000, catalog_seed: int = 0):
        if catalog_size < 1:
            raise ValueError(f"catalog_size must be >= 1, got {catalog_size}")
        self.catalog_size, self.catalog_seed = catalog_size, catalog_seed

    def setup(self, ctx: AppContext) -> None:
        self.catalog = Catalog(self.catalog_size, self.catalog_seed)
        self.index = SearchIndex(self.catalog)

    def tools(self) -> dict[str, Tool]:
        return {"search": self._search, "product": self._product}

    def _search(self, args: dict[str, Any]) -> Observation:
        query = args.get("q")
        if not isinstance(query, str) or not query.strip():
            raise ToolError("search needs a non-empty string 'q'")
        hits = self.index.search(query, limit=int(args.get("limit", 10)))
        rows = [{"id": doc, "name": self.catalog[doc].name, "price": self.catalog[doc].price} for doc, _ in hits]
        return Observation(output="\n".join(f"[{r['id']}] {r['name']} {r['price']}" for r in rows),
                           data={"results": rows})

    def _product(self, args: dict[str, Any]) -> Observation:
        try:
            p = self.catalog[int(args["id"])]
        except (KeyError, ValueError, IndexError) as exc:
            raise ToolError(f"product needs an existing integer 'id' (0..{len(self.catalog) - 1})") from exc
        return Observation(output=f"{p.name} {p.price} rating {p.rating} ({len(p.reviews)} reviews)",
                           data={"sku": p.sku, "reviews": [r.author for r in p.reviews]})

    def close(self) -> None:
        self.index.close()
        self.catalog.close()
