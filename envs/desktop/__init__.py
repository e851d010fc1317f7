"""The embedded desktop (OSWorld stand-in): home directory, terminal, editor, spreadsheet, tasks."""
