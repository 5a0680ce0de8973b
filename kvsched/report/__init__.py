"""kvsched's HTML pages and the SVG charts on them.

Above the simulator and the tuner (the pages read their results) and below
the commands that write them (``kvsched simulate / compare / tune --report``):

* :mod:`.charts`: line, area and scatter charts as inline SVG, and the
  simulation's latency CDFs and time series drawn with them.
* :mod:`.style`: the one stylesheet every page inlines.
* :mod:`.simulate_page`: the page of one or more simulation runs
  (``kvsched simulate --report``, ``kvsched compare --report``).
* :mod:`.tune_page`: the page of a tuning search (``kvsched tune --report``).

Every page opens offline: no script, font, stylesheet or image is fetched.
"""
