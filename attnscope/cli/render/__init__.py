"""What every command prints with: ``units`` (the one number formatter), ``console`` (the one
rich console set-up, tables folded to the width), ``writer`` (the one file writer) and ``html``
(self-contained pages)."""

__all__: list[str] = []
