"""The directory ``attnscope run`` puts first on the program's ``PYTHONPATH``.

It holds ``sitecustomize.py``, which Python's ``site`` module imports at start-up in every
interpreter of the program (ranks, workers and subprocesses included). Nothing here runs when
the package is imported under its own name.
"""

__all__: list[str] = []
