"""A text browser for the embedded web shop: pages, tabs, history, forms, accessibility tree, screenshots."""
