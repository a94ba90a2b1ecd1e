"""The only way spans leave: call spans with their children, step, request and replay spans.

:mod:`.calls` makes a call span's attributes (a :class:`.calls.Result`); :mod:`.spans` builds
spans parents before children and is the one path to the emitter (:mod:`.emit`); :mod:`.steps`
keeps the step spans, :mod:`.requests` the request spans of a ``batch()`` block,
:mod:`.replays` the captures a CUDA graph replay's spans are made from; :mod:`.summary` writes
the summaries a person reads. Worker side: never imports ``_capture``.
"""
