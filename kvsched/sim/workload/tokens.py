"""The token-id scheme of workload prompts.

Prompts are stored as runs of ``(token_id, count)``: a one-hour trace holds
tens of millions of prompt tokens, and the scheduler only needs the token
*content* to be right where it matters, which is prefix-cache hashing. The
scheme makes two prompts share exactly the tokens the source says they share:

* Content private to one request is one run of ``UNIQUE_TOKEN_BASE + index``,
  ``index`` being the request's position in its source (file row order, or
  generation order for the random dataset). No other request has that id.
* The random dataset's shared prefix (``prefix_len``) is one run of
  ``RANDOM_PREFIX_TOKEN``.
* Text that several requests of one of vLLM's benchmark datasets share (a
  prefix_repetition prefix, sonnet's fixed lines, a prompt that
  oversampling repeats) is one run of ``SHARED_TEXT_TOKEN_BASE + k``, ``k``
  numbering the shared texts of the workload (below ``HASH_BLOCK_TOKEN_BASE``).
* A Mooncake hash id ``h`` names a block of ``MOONCAKE_BLOCK_TOKENS`` (512)
  tokens; the block is one run of ``HASH_BLOCK_TOKEN_BASE + h``, and the last
  block of a prompt is cut to the tokens that remain of ``input_length``.
  Blocks of 512 tokens stay aligned with any KV block size that divides 512.

Id ``0`` and ``OUTPUT_TOKEN_BASE`` up are
never used in prompts, so a simulator can pick its output token ids there
(kvsched's simulator samples ``OUTPUT_TOKEN_BASE + i`` for its i-th request).
"""

from __future__ import annotations

RANDOM_PREFIX_TOKEN = 1
SHARED_TEXT_TOKEN_BASE = 2
HASH_BLOCK_TOKEN_BASE = 1_000_000
UNIQUE_TOKEN_BASE = 1_000_000_000
# How many shared texts one workload may have.
MAX_SHARED_TEXTS = 1_000_000 - SHARED_TEXT_TOKEN_BASE
# The largest Mooncake hash id whose token id stays below the request-unique range.
MAX_HASH_ID = UNIQUE_TOKEN_BASE - HASH_BLOCK_TOKEN_BASE - 1
MOONCAKE_BLOCK_TOKENS = 512
# Every prompt token id is below this; a simulator's output tokens start
# here. From 2**62 up the compiled build (mypyc) keeps an int as the Python
# object it is, so storing a token in a list costs a reference, not a new
# int object: measured (callgrind, random at 20 req/s), output ids from
# 2**61 cost about 4 % more instructions per request than from 2**62, the
# allocations outweighing the cheaper comparisons.
OUTPUT_TOKEN_BASE = 2**62
# Random prompt i starts with token UNIQUE_TOKEN_BASE + i: below OUTPUT_TOKEN_BASE.
MAX_RANDOM_PROMPTS = OUTPUT_TOKEN_BASE - UNIQUE_TOKEN_BASE

PromptRuns = tuple[tuple[int, int], ...]
