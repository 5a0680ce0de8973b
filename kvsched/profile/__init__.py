"""``kvsched profile``: engine step times measured through the user's own vLLM.

kvsched never imports vLLM: it starts the user's vLLM server as a
subprocess (:mod:`.server`), sends it a designed set of requests
(:mod:`.design`) over HTTP, reads each engine step's batch and time from
vLLM's iteration log (:mod:`.iteration_log`), attributes each step's work
from the requests it sent (:mod:`.attribution`), sets each streamed
request's client times against its steps (:mod:`.serving`: the serving
path around vLLM's iteration clock) and writes the step profile
(:mod:`kvsched.perf.step_profile`) as it goes (:mod:`.runner`).
"""
