"""The one error type a user sees: one line that names the file, row and column at fault."""


class ContextualBertError(Exception):
    """A problem with the user's input or configuration; the CLI prints it as one line, no traceback."""


class DataError(ContextualBertError):
    """Malformed input data. Say which file, and where known which row and column."""

    def __init__(self, message: str, *, path=None, column: str | None = None, row: int | None = None):
        where = []
        if path is not None:
            where.append(str(path))
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column '{column}'")
        super().__init__(f"{': '.join([', '.join(where), message]) if where else message}")
        self.path, self.column, self.row = path, column, row
